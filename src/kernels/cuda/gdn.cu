/*
 * gdn: the gated delta rule on the GPU (backend_ops.gated_delta; Qwen3-Next's linear
 * attention), with the CPU reference's arithmetic (backend_cpu_gdn.c). Every column j of a
 * head's state S [k_dim][v_dim] evolves on its own given the row's k, q, decay and beta, so
 * a block owns one value head and up to 128 columns of it, one thread per column, and walks
 * the chunk's rows in order (a sequence's rows see the state its earlier rows left, other
 * sequences' rows between them). The block stages the row's q and k in shared memory; each
 * thread reads their sums of squares from there. Grid: (n_v_head, ceil(v_dim / 128)).
 */
#include <math.h>

#include "cuda_impl.h"

#define GDN_THREADS 128
#define GDN_L2_EPS 1e-6f  /* transformers' l2norm epsilon */

__global__ void gdn_kernel(float *y, size_t ldy, const float *x, size_t ldx, const float *ab,
                           size_t ldab, const float *a_log, const float *dt_bias, float *st,
                           const int32_t *pos, const int32_t *seq, int n_tok, int nk, int nv,
                           int dk, int dv)
{
    extern __shared__ float sh[];  /* q | k of the current row, dk each */
    cu_pdl_trigger();
    cu_pdl_wait();
    int h = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x, kh = h / (nv / nk);
    float *q = sh, *k = sh + dk;
    for (int i = 0; i < n_tok; i++) {
        const float *xr = x + (size_t)i * ldx;
        __syncthreads();  /* the previous row is done with q, k */
        for (int r = threadIdx.x; r < dk; r += blockDim.x) {
            q[r] = xr[(size_t)kh * dk + r];
            k[r] = xr[(size_t)(nk + kh) * dk + r];
        }
        __syncthreads();
        if (j >= dv)
            continue;
        float qq = 0.0f, kk = 0.0f;
        for (int r = 0; r < dk; r++) {
            qq += q[r] * q[r];
            kk += k[r] * k[r];
        }
        float qs = rsqrtf((float)dk) / sqrtf(qq + GDN_L2_EPS), ks = 1.0f / sqrtf(kk + GDN_L2_EPS);
        const float *abr = ab + (size_t)i * ldab;
        float av = abr[nv + h] + dt_bias[h];
        float sp = av > 20.0f ? av : log1pf(expf(av));
        float decay = expf(-expf(a_log[h]) * sp), beta = 1.0f / (1.0f + expf(-abr[h]));
        float *S = st + ((size_t)seq[i] * nv + h) * (size_t)dk * dv + j;
        if (pos[i] == 0)
            for (int r = 0; r < dk; r++)
                S[(size_t)r * dv] = 0.0f;
        float kv = 0.0f;
        for (int r = 0; r < dk; r++) {
            float s = S[(size_t)r * dv] * decay;
            S[(size_t)r * dv] = s;
            kv += s * (k[r] * ks);
        }
        float d = beta * (xr[(size_t)2 * nk * dk + (size_t)h * dv + j] - kv), out = 0.0f;
        for (int r = 0; r < dk; r++) {
            float s = S[(size_t)r * dv] + k[r] * ks * d;
            S[(size_t)r * dv] = s;
            out += s * (q[r] * qs);
        }
        y[(size_t)i * ldy + (size_t)h * dv + j] = out;
    }
}

void cu_gated_delta(struct backend *be, float *y, int ldy, const float *x, int ldx,
                    const float *ab, int ldab, const struct gdn_params *p,
                    const struct kv_layer *st, const struct kv_rows *rows, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    int nk = p->n_k_head, nv = p->n_v_head, dk = p->k_dim, dv = p->v_dim;
    if (nk < 1 || nv < 1 || nv % nk || dk < 1 || dv < 1 || dk > 4096 ||
        p->a_log->dtype != DTYPE_F32 || p->dt_bias->dtype != DTYPE_F32 ||
        tensor_nelem(p->a_log) != nv || tensor_nelem(p->dt_bias) != nv ||
        st->dtype != DTYPE_F32 || (int64_t)st->v_dim != (int64_t)nv * dk * dv) {
        cu_fail(c, "gated_delta: value heads a multiple of the key heads, F32 A_log and dt_bias "
                "of one per value head, a state of value heads * k_dim * v_dim floats",
                cudaErrorInvalidValue);
        return;
    }
    cu_launch_smem(c, gdn_kernel, dim3(nv, (dv + GDN_THREADS - 1) / GDN_THREADS),
                   dim3(GDN_THREADS), (size_t)2 * dk * sizeof(float), y, (size_t)ldy, x,
                   (size_t)ldx, ab, (size_t)ldab, (const float *)p->a_log->data,
                   (const float *)p->dt_bias->data, (float *)st->v, rows->pos, rows->state,
                   n_tok, nk, nv, dk, dv);
    cu_check(c, "gated_delta");
}
