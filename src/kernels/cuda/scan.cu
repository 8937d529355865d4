/*
 * scan: Mamba's selective scan on the GPU (backend.h selective_scan), with the CPU
 * reference's arithmetic (backend_cpu_scan.c). One warp per channel, its 32 lanes over the
 * states (lane l holds states l, l + 32, ... in registers, at most BACKEND_SCAN_MAX_STATE / 32
 * each): the warp walks the chunk's rows in order, keeps the state in registers while rows of
 * one sequence follow each other, and writes it back when the sequence changes (another
 * sequence's row between, in a mixed batch) and at the end. y sums over the states with a
 * warp reduction. Block: 4 warps (4 channels); grid: d_inner / 4 blocks.
 */
#include <math.h>

#include "cuda_impl.h"

#define SCAN_WARPS 4
#define SCAN_PER_LANE (BACKEND_SCAN_MAX_STATE / 32)

__global__ void selective_scan_kernel(float *y, size_t ldy, const float *x, size_t ldx,
                                      const float *dt, size_t lddt, const float *B, const float *C,
                                      size_t ldbc, const float *z, size_t ldz, const float *A_log,
                                      const float *D, float *st, const int32_t *pos,
                                      const int32_t *seq, int n_tok, int d_inner, int d_state)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int c = blockIdx.x * SCAN_WARPS + threadIdx.y, lane = threadIdx.x;
    if (c >= d_inner)
        return;
    float a[SCAN_PER_LANE], h[SCAN_PER_LANE];
#pragma unroll
    for (int k = 0; k < SCAN_PER_LANE; k++) {
        int s = lane + 32 * k;
        a[k] = s < d_state ? -expf(A_log[(size_t)c * d_state + s]) : 0.0f;
        h[k] = 0.0f;
    }
    size_t sd = (size_t)d_inner * d_state;
    int cur = -1;
    for (int i = 0; i < n_tok; i++) {
        int q = seq[i];
        if (q != cur || pos[i] == 0) {
            if (cur >= 0) {  /* the state of the sequence left */
                float *hl = st + (size_t)cur * sd + (size_t)c * d_state;
#pragma unroll
                for (int k = 0; k < SCAN_PER_LANE; k++)
                    if (lane + 32 * k < d_state)
                        hl[lane + 32 * k] = h[k];
            }
            const float *hs = st + (size_t)q * sd + (size_t)c * d_state;
#pragma unroll
            for (int k = 0; k < SCAN_PER_LANE; k++)  /* the state of the one entered */
                h[k] = pos[i] != 0 && lane + 32 * k < d_state ? hs[lane + 32 * k] : 0.0f;
            cur = q;
        }
        float xc = x[(size_t)i * ldx + c], v = dt[(size_t)i * lddt + c];
        float delta = v > 20.0f ? v : log1pf(expf(v)), dx = delta * xc, acc = 0.0f;
        const float *Bi = B + (size_t)i * ldbc, *Ci = C + (size_t)i * ldbc;
#pragma unroll
        for (int k = 0; k < SCAN_PER_LANE; k++) {
            int s = lane + 32 * k;
            if (s < d_state) {
                h[k] = expf(delta * a[k]) * h[k] + dx * Bi[s];
                acc += h[k] * Ci[s];
            }
        }
        acc = cu_warp_sum(acc);
        if (lane == 0) {
            if (D)
                acc += D[c] * xc;
            if (z) {
                float g = z[(size_t)i * ldz + c];
                acc *= g / (1.0f + expf(-g));
            }
            y[(size_t)i * ldy + c] = acc;
        }
    }
    if (cur >= 0) {
        float *hs = st + (size_t)cur * sd + (size_t)c * d_state;
#pragma unroll
        for (int k = 0; k < SCAN_PER_LANE; k++)
            if (lane + 32 * k < d_state)
                hs[lane + 32 * k] = h[k];
    }
}

void cu_selective_scan(struct backend *be, float *y, int ldy, const float *x, int ldx,
                       const float *dt, int lddt, const float *B, const float *C, int ldbc,
                       const float *z, int ldz, const struct tensor *A_log, const struct tensor *D,
                       const struct kv_layer *st, const struct kv_rows *rows, int n_tok,
                       int d_inner, int d_state)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0 || d_inner <= 0)
        return;
    bool has_d = D && tensor_is_present(D);
    if (A_log->dtype != DTYPE_F32 || (has_d && D->dtype != DTYPE_F32) || d_state < 1 ||
        d_state > BACKEND_SCAN_MAX_STATE || st->v_dim != d_inner * d_state) {
        cu_fail(c, "selective_scan: F32 A_log / D, 1..256 states and a state of d_inner * "
                "d_state floats", cudaErrorInvalidValue);
        return;
    }
    cu_launch(c, selective_scan_kernel, dim3((d_inner + SCAN_WARPS - 1) / SCAN_WARPS),
              dim3(32, SCAN_WARPS), y, (size_t)ldy, x, (size_t)ldx, dt, (size_t)lddt, B, C,
              (size_t)ldbc, z, (size_t)ldz, (const float *)A_log->data,
              has_d ? (const float *)D->data : (const float *)NULL, (float *)st->v, rows->pos,
              rows->state, n_tok, d_inner, d_state);
    cu_check(c, "selective_scan");
}
