/*
 * rglru: Griffin's RG-LRU on the GPU (backend.h rglru), with the CPU reference's arithmetic
 * (backend_cpu_rglru.c): one thread per channel walks the chunk's rows in order (a
 * sequence's rows see the state its earlier rows left), its gates read its head's block
 * of the row's inputs.
 */
#include <math.h>

#include "cuda_impl.h"

__global__ void rglru_kernel(float *y, size_t ldy, const float *x, size_t ldx, const float *wi,
                             const float *bi, const float *wa, const float *ba, const float *ap,
                             float *st, const int32_t *pos, const int32_t *seq, int n_tok,
                             int width, int bw)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width)
        return;
    int h = c / bw, j = c % bw;
    const float *wic = wi + (size_t)h * bw * bw + j, *wac = wa + (size_t)h * bw * bw + j;
    float apc = ap[c], sp = apc > 20.0f ? apc : log1pf(expf(apc));
    for (int i = 0; i < n_tok; i++) {
        const float *xr = x + (size_t)i * ldx, *xh = xr + (size_t)h * bw;
        float gi = bi[c], ga = ba[c];
        for (int k = 0; k < bw; k++) {
            gi += xh[k] * wic[(size_t)k * bw];
            ga += xh[k] * wac[(size_t)k * bw];
        }
        gi = 1.0f / (1.0f + expf(-gi));
        ga = 1.0f / (1.0f + expf(-ga));
        float log_a = -8.0f * ga * sp;
        float u = xr[c] * gi;
        float *s = st + (size_t)seq[i] * width + c;
        float hv = pos[i] == 0 ? u : expf(log_a) * *s + u * sqrtf(1.0f - expf(2.0f * log_a));
        *s = hv;
        y[(size_t)i * ldy + c] = hv;
    }
}

static bool f32_n(const struct tensor *t, int64_t n)
{
    return t && tensor_is_present(t) && t->dtype == DTYPE_F32 && tensor_nelem(t) == n;
}

void cu_rglru(struct backend *be, float *y, int ldy, const float *x, int ldx,
              const struct rglru_params *p, const struct kv_layer *st, const struct kv_rows *rows,
              int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    int64_t w = p->width, bw = p->n_head > 0 ? w / p->n_head : 0;
    if (p->n_head < 1 || w < 1 || w % p->n_head != 0 || !f32_n(p->wi, p->n_head * bw * bw) ||
        !f32_n(p->wa, p->n_head * bw * bw) || !f32_n(p->bi, w) || !f32_n(p->ba, w) ||
        !f32_n(p->a_param, w) || (int64_t)st->v_dim != w) {
        cu_fail(c, "rglru: F32 [n_head, bw, bw] gates, [width] biases and a_param, and a "
                   "state of width floats", cudaErrorInvalidValue);
        return;
    }
    cu_launch(c, rglru_kernel, dim3((unsigned)((w + 127) / 128)), dim3(128), y, (size_t)ldy, x,
              (size_t)ldx, (const float *)p->wi->data, (const float *)p->bi->data,
              (const float *)p->wa->data, (const float *)p->ba->data,
              (const float *)p->a_param->data, (float *)st->v, rows->pos, rows->state, n_tok,
              (int)w, (int)bw);
    cu_check(c, "rglru");
}
