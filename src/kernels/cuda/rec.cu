/*
 * rec: the ops of recurrent layers on the GPU (backend.h, ADR 0057), with the CPU
 * reference's arithmetic (backend_cpu_rec.c). conv1d: one thread per channel walks the
 * chunk's rows in order (a sequence's rows see the state its earlier rows left), the
 * state in registers between rows of the same sequence is not worth it at K <= 4.
 */
#include <math.h>

#include "cuda_impl.h"

__global__ void conv1d_kernel(float *y, size_t ldy, const float *x, size_t ldx, const float *w,
                              const float *b, float *st, const int32_t *pos, const int32_t *seq,
                              int n_tok, int n_ch, int K, bool silu)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_ch)
        return;
    int km = K - 1;
    size_t sd = (size_t)km * n_ch;
    for (int i = 0; i < n_tok; i++) {
        float *s = st + (size_t)seq[i] * sd;
        if (pos[i] == 0)
            for (int j = 0; j < km; j++)
                s[(size_t)j * n_ch + c] = 0.0f;
        float xc = x[(size_t)i * ldx + c], acc = b ? b[c] : 0.0f;
        const float *wc = w + (size_t)c * K;
        for (int j = 0; j < km; j++)
            acc += wc[j] * s[(size_t)j * n_ch + c];
        acc += wc[km] * xc;
        for (int j = 0; j + 1 < km; j++)
            s[(size_t)j * n_ch + c] = s[(size_t)(j + 1) * n_ch + c];
        if (km > 0)
            s[(size_t)(km - 1) * n_ch + c] = xc;
        y[(size_t)i * ldy + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
    }
}

void cu_conv1d(struct backend *be, float *y, int ldy, const float *x, int ldx,
               const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
               const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0 || n_ch <= 0)
        return;
    bool has_b = b && tensor_is_present(b);
    if (w->dtype != DTYPE_F32 || (has_b && b->dtype != DTYPE_F32) || K < 1 ||
        st->k_dim != (K - 1) * n_ch) {
        cu_fail(c, "conv1d: F32 weights and a state of (K - 1) * channels floats",
                cudaErrorInvalidValue);
        return;
    }
    cu_launch(c, conv1d_kernel, dim3((n_ch + 127) / 128), dim3(128), y, (size_t)ldy, x,
              (size_t)ldx, (const float *)w->data, has_b ? (const float *)b->data : (const float *)NULL,
              (float *)st->k, rows->pos, rows->state, n_tok, n_ch, K, silu);
    cu_check(c, "conv1d");
}
