/*
 * ssm: Mamba-2's SSD scan on the GPU (backend.h ssd_scan), with the CPU reference's
 * arithmetic (backend_cpu_ssm.c). One warp per (head, channel) pair: its lanes hold the
 * pair's d_state floats of state in registers (d_state <= 32 * SSD_PER_LANE) while
 * consecutive rows belong to the same sequence, and write them back when the sequence
 * changes or the chunk ends, so mixed batches stay correct and a one-sequence prefill
 * touches global state once. y is the lanes' sum of state * C plus the D skip.
 */
#include <math.h>

#include "cuda_impl.h"

#define SSD_PER_LANE 8

__device__ __forceinline__ float ssd_softplus(float v)
{
    return v > 20.0f ? v : log1pf(expf(v));
}

__global__ void ssd_scan_kernel(float *y, size_t ldy, const float *x, const float *B,
                                const float *C, size_t ldx, const float *dt, size_t lddt,
                                const float *a_log, const float *dsk, const float *dt_bias,
                                float *st, const int32_t *pos, const int32_t *seq, int n_tok,
                                struct ssd_params p)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    int P = p.head_dim, N = p.d_state;
    if (u >= p.n_head * P)
        return;
    int h = u / P, g = h / (p.n_head / p.n_group);
    size_t sd = (size_t)p.n_head * P * N;
    float A = -expf(a_log[h]), db = dt_bias[h], dh = dsk ? dsk[h] : 0.0f;
    float s[SSD_PER_LANE];
    int cur = -1;
    for (int i = 0; i < n_tok; i++) {
        int q = seq[i];
        if (q != cur || pos[i] == 0) {
            if (cur >= 0 && q != cur) {
                float *o = st + (size_t)cur * sd + (size_t)u * N;
#pragma unroll
                for (int k = 0; k < SSD_PER_LANE; k++)
                    if (lane + 32 * k < N)
                        o[lane + 32 * k] = s[k];
            }
            const float *in = st + (size_t)q * sd + (size_t)u * N;
#pragma unroll
            for (int k = 0; k < SSD_PER_LANE; k++)
                s[k] = pos[i] != 0 && lane + 32 * k < N ? in[lane + 32 * k] : 0.0f;
            cur = q;
        }
        float d = fminf(fmaxf(ssd_softplus(dt[(size_t)i * lddt + h] + db), p.dt_min), p.dt_max);
        float a = expf(A * d), xv = x[(size_t)i * ldx + u], dx = d * xv, acc = 0.0f;
        const float *b = B + (size_t)i * ldx + (size_t)g * N, *c = C + (size_t)i * ldx + (size_t)g * N;
#pragma unroll
        for (int k = 0; k < SSD_PER_LANE; k++) {
            int n = lane + 32 * k;
            if (n < N) {
                s[k] = a * s[k] + dx * b[n];
                acc += s[k] * c[n];
            }
        }
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0)
            y[(size_t)i * ldy + u] = acc + dh * xv;
    }
    if (cur >= 0) {
        float *o = st + (size_t)cur * sd + (size_t)u * N;
#pragma unroll
        for (int k = 0; k < SSD_PER_LANE; k++)
            if (lane + 32 * k < N)
                o[lane + 32 * k] = s[k];
    }
}

static bool f32_vec(const struct tensor *t, int n)
{
    return t && tensor_is_present(t) && t->dtype == DTYPE_F32 && tensor_nelem(t) == n;
}

void cu_ssd_scan(struct backend *be, float *y, int ldy, const float *x, const float *B,
                 const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                 const struct tensor *d, const struct tensor *dt_bias, const struct kv_layer *st,
                 const struct kv_rows *rows, int n_tok, const struct ssd_params *p)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    bool has_d = d && tensor_is_present(d);
    if (p->n_head < 1 || p->head_dim < 1 || p->d_state < 1 || p->d_state > 32 * SSD_PER_LANE ||
        p->n_group < 1 || p->n_head % p->n_group != 0 || !f32_vec(a_log, p->n_head) ||
        !f32_vec(dt_bias, p->n_head) || (has_d && !f32_vec(d, p->n_head)) ||
        (int64_t)st->v_dim != (int64_t)p->n_head * p->head_dim * p->d_state) {
        cu_fail(c, "ssd_scan: F32 [n_head] A_log / D / dt_bias, d_state <= 256 and a state of "
                   "n_head * head_dim * d_state floats", cudaErrorInvalidValue);
        return;
    }
    int units = p->n_head * p->head_dim, warps = 4;
    cu_launch(c, ssd_scan_kernel, dim3((units + warps - 1) / warps), dim3(32 * warps), y,
              (size_t)ldy, x, B, C, (size_t)ldx, dt, (size_t)lddt, (const float *)a_log->data,
              has_d ? (const float *)d->data : (const float *)NULL, (const float *)dt_bias->data,
              (float *)st->v, rows->pos, rows->state, n_tok, *p);
    cu_check(c, "ssd_scan");
}
