/*
 * ssm: Mamba-2's SSD scan on the GPU (backend.h ssd_scan), with the CPU reference's
 * arithmetic (backend_cpu_ssm.c), in two forms.
 *
 * The recurrence (ssd_scan_kernel): one warp per (head, channel) pair: its lanes hold the
 * pair's d_state floats of state in registers (d_state <= 32 * SSD_PER_LANE) while
 * consecutive rows belong to the same sequence, and write them back when the sequence
 * changes or the chunk ends, so mixed batches stay correct and a one-sequence prefill
 * touches global state once. y is the lanes' sum of state * C plus the D skip. Calls of
 * fewer than REC_CHUNK_MIN rows (decode), calls recorded into a graph, and every call with
 * the chunked form off (MLXCEL_CUDA_CHUNKED=0) take it.
 *
 * The chunked form (ADR 0132; Dao & Gu 2024, section 6): runs of at least REC_CHUNK_MIN
 * consecutive rows of one sequence are cut into chunks of at most REC_CHUNK rows
 * (cu_rec_plan); with cum_t the chunk's cumulative log-decay A dt (in double, so that the
 * differences of large sums keep their digits) and S the state before the chunk,
 *   y_t  = sum_{s<=t} (C_t . B_s) e^{cum_t - cum_s} dt_s x_s + e^{cum_t} S C_t + D x_t
 *   S'   = e^{cum_last} S + sum_s e^{cum_last - cum_s} dt_s x_s B_s^T
 * in three kernels: ssd_states_kernel (parallel over chunks and heads: each chunk's own
 * state, the second sum), ssd_pass_kernel (the recurrence's warps walking the call's items
 * in row order: a chunk turns its own state into the state before it, S' = e^{cum_last} S +
 * own, and the short runs step as above) and ssd_out_kernel (parallel again: the C.B
 * products masked by the decays times x, plus the incoming state's share). Every exponent
 * is <= 0. The products are f32 FMA tiles in shared memory (ADR 0132 has the counts).
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

// ---- the chunked form ----

#define SSD_T 256       /* threads of the chunk kernels: 16 x 16 */
#define SSD_NT 64       /* d_state columns per staged tile */
#define SSD_MAX_P 128   /* head_dim the chunk kernels take (register tiles of 8 x 16) */
#define SSD_LD (SSD_NT + 1)

__device__ __forceinline__ float ssd_dt(float v, float lo, float hi)
{
    return fminf(fmaxf(ssd_softplus(v), lo), hi);
}

/* dts[t] = dt of chunk row t (head h) and cum[t] = sum_{s<=t} A dts[s] in double, for rows
 * [0, n) of the chunk starting at row0. Every thread of the block calls it. */
__device__ void ssd_chunk_decay(const float *dt, size_t lddt, int row0, int n, int h, float A,
                                float db, float lo, float hi, float *dts, double *cum)
{
    int t = threadIdx.x;
    if (t < n) {
        float d = ssd_dt(dt[(size_t)(row0 + t) * lddt + h] + db, lo, hi);
        dts[t] = d;
        cum[t] = (double)(A * d);
    }
    __syncthreads();
    if (t < 32) {  /* lane t sums rows 2t and 2t + 1, then a scan over the lanes */
        double a0 = 2 * t < n ? cum[2 * t] : 0.0, a1 = 2 * t + 1 < n ? cum[2 * t + 1] : 0.0;
        double v = a0 + a1;
        for (int o = 1; o < 32; o <<= 1) {
            double u = __shfl_up_sync(0xffffffffu, v, o);
            if (t >= o)
                v += u;
        }
        if (2 * t < n)
            cum[2 * t] = v - a1;
        if (2 * t + 1 < n)
            cum[2 * t + 1] = v;
    }
    __syncthreads();
}

/* Shared memory of ssd_states_kernel and ssd_out_kernel for head_dim padded to pp. */
static size_t ssd_states_smem(int pp)
{
    return REC_CHUNK * (sizeof(double) + sizeof(float)) + (size_t)REC_CHUNK * pp * 4 +
           (size_t)REC_CHUNK * SSD_NT * 4;
}

static size_t ssd_out_smem(int pp)
{
    int rows = pp > REC_CHUNK ? pp : REC_CHUNK;
    return REC_CHUNK * (sizeof(double) + sizeof(float)) + (size_t)REC_CHUNK * pp * 4 +
           (size_t)(2 * REC_CHUNK + rows) * SSD_LD * 4;
}

/* Block (chunk, head): the chunk's own state sb[chunk][h][p][n] = sum_s e^{cum_last - cum_s}
 * dt_s x_s[p] B_s[n] and its decay dec[chunk][h] = e^{cum_last}. */
__global__ void ssd_states_kernel(const float *x, const float *B, size_t ldx, const float *dt,
                                  size_t lddt, const float *a_log, const float *dt_bias,
                                  const int32_t *cnt, const int2 *chunks, float *sb, float *dec,
                                  struct ssd_params p, int pp)
{
    extern __shared__ double ssd_sh[];
    cu_pdl_trigger();
    cu_pdl_wait();
    int ci = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (ci >= cnt[1])
        return;
    int2 ch = chunks[ci];
    int row0 = ch.x, n = ch.y, P = p.head_dim, N = p.d_state, H = p.n_head;
    int g = h / (H / p.n_group), np = pp / 16, tx = tid % 16, ty = tid / 16;
    double *cum = ssd_sh;
    float *dts = (float *)(cum + REC_CHUNK), *xw = dts + REC_CHUNK, *bt = xw + REC_CHUNK * pp;
    ssd_chunk_decay(dt, lddt, row0, n, h, -expf(a_log[h]), dt_bias[h], p.dt_min, p.dt_max, dts, cum);
    double last = cum[n - 1];
    for (int e = tid; e < n * pp; e += SSD_T) {
        int t = e / pp, q = e % pp;
        xw[e] = q < P ? x[(size_t)(row0 + t) * ldx + (size_t)h * P + q] *
                            (expf((float)(last - cum[t])) * dts[t])
                      : 0.0f;
    }
    if (tid == 0)
        dec[(size_t)ci * H + h] = expf((float)last);
    float *out = sb + ((size_t)ci * H + h) * P * N;
    const float *Bg = B + (size_t)g * N;
    for (int n0 = 0; n0 < N; n0 += SSD_NT) {
        __syncthreads();  /* xw written; the previous tile consumed */
        for (int e = tid; e < n * SSD_NT; e += SSD_T) {
            int t = e / SSD_NT, m = n0 + e % SSD_NT;
            bt[e] = m < N ? Bg[(size_t)(row0 + t) * ldx + m] : 0.0f;
        }
        __syncthreads();
        float acc[8][4] = {};
        for (int t = 0; t < n; t++) {
            float4 b = *(const float4 *)(bt + t * SSD_NT + tx * 4);
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (i < np) {
                    float xv = xw[t * pp + ty + 16 * i];
                    acc[i][0] += xv * b.x;
                    acc[i][1] += xv * b.y;
                    acc[i][2] += xv * b.z;
                    acc[i][3] += xv * b.w;
                }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int q = ty + 16 * i;
            if (i < np && q < P)
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    int m = n0 + tx * 4 + k;
                    if (m < N)
                        out[(size_t)q * N + m] = acc[i][k];
                }
        }
    }
}

/* The recurrence's warps over the call's items (cu_rec_plan) in row order: a run of
 * fewer than REC_CHUNK_MIN rows steps row by row as ssd_scan_kernel does; a chunk swaps its
 * own state in sb for the state before it, S <- dec S + own. */
__global__ void ssd_pass_kernel(float *y, size_t ldy, const float *x, const float *B,
                                const float *C, size_t ldx, const float *dt, size_t lddt,
                                const float *a_log, const float *dsk, const float *dt_bias,
                                float *st, const int32_t *pos, const int32_t *seq,
                                const int32_t *cnt, const int4 *items, float *sb,
                                const float *dec, struct ssd_params p)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    int P = p.head_dim, N = p.d_state, H = p.n_head;
    if (u >= H * P)
        return;
    int h = u / P, g = h / (H / p.n_group), n_items = cnt[0];
    size_t sd = (size_t)H * P * N;
    float A = -expf(a_log[h]), db = dt_bias[h], dh = dsk ? dsk[h] : 0.0f;
    float s[SSD_PER_LANE];
    int cur = -1;
    for (int it = 0; it < n_items; it++) {
        int4 w = items[it];
        int q = seq[w.x];
        if (q != cur || pos[w.x] == 0) {
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
                s[k] = pos[w.x] != 0 && lane + 32 * k < N ? in[lane + 32 * k] : 0.0f;
            cur = q;
        }
        if (w.z >= 0) {
            float a = dec[(size_t)w.z * H + h];
            float *o = sb + ((size_t)w.z * H + h) * P * N + (size_t)(u - h * P) * N;
#pragma unroll
            for (int k = 0; k < SSD_PER_LANE; k++) {
                int n = lane + 32 * k;
                if (n < N) {
                    float own = o[n];
                    o[n] = s[k];
                    s[k] = a * s[k] + own;
                }
            }
            continue;
        }
        for (int i = w.x; i < w.x + w.y; i++) {
            float d = ssd_dt(dt[(size_t)i * lddt + h] + db, p.dt_min, p.dt_max);
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
            acc = cu_warp_sum(acc);
            if (lane == 0)
                y[(size_t)i * ldy + u] = acc + dh * xv;
        }
    }
    if (cur >= 0) {
        float *o = st + (size_t)cur * sd + (size_t)u * N;
#pragma unroll
        for (int k = 0; k < SSD_PER_LANE; k++)
            if (lane + 32 * k < N)
                o[lane + 32 * k] = s[k];
    }
}

/* Block (chunk, head): the chunk's outputs from the state before it (sb, after the pass):
 * y_t = sum_{s<=t} (C_t . B_s) e^{cum_t - cum_s} dt_s x_s + e^{cum_t} S C_t + D x_t.
 * Thread (ty, tx) of 16 x 16 holds rows t = ty + 16 i (i < 4) and, for the C.B products,
 * columns s = tx + 16 j (j < 4), for y channels q = tx + 16 j (j < pp / 16). */
__global__ void ssd_out_kernel(float *y, size_t ldy, const float *x, const float *B,
                               const float *C, size_t ldx, const float *dt, size_t lddt,
                               const float *a_log, const float *dsk, const float *dt_bias,
                               const int32_t *cnt, const int2 *chunks, const float *sb,
                               struct ssd_params p, int pp)
{
    extern __shared__ double ssd_sh[];
    cu_pdl_trigger();
    cu_pdl_wait();
    int ci = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    if (ci >= cnt[1])
        return;
    int2 ch = chunks[ci];
    int row0 = ch.x, n = ch.y, P = p.head_dim, N = p.d_state, H = p.n_head;
    int g = h / (H / p.n_group), np = pp / 16, tx = tid % 16, ty = tid / 16;
    double *cum = ssd_sh;
    float *dts = (float *)(cum + REC_CHUNK), *xs = dts + REC_CHUNK, *ct = xs + REC_CHUNK * pp;
    float *bt = ct + REC_CHUNK * SSD_LD, *sv = bt + REC_CHUNK * SSD_LD, *mm = bt;
    ssd_chunk_decay(dt, lddt, row0, n, h, -expf(a_log[h]), dt_bias[h], p.dt_min, p.dt_max, dts, cum);
    for (int e = tid; e < REC_CHUNK * pp; e += SSD_T) {
        int t = e / pp, q = e % pp;
        xs[e] = t < n && q < P ? x[(size_t)(row0 + t) * ldx + (size_t)h * P + q] : 0.0f;
    }
    const float *Bg = B + (size_t)g * N, *Cg = C + (size_t)g * N;
    const float *S = sb + ((size_t)ci * H + h) * P * N;
    float gm[4][4] = {}, acc[4][8] = {};
    for (int n0 = 0; n0 < N; n0 += SSD_NT) {
        __syncthreads();  /* the previous tile consumed */
        for (int e = tid; e < REC_CHUNK * SSD_NT; e += SSD_T) {
            int t = e / SSD_NT, m = e % SSD_NT;
            bool in = t < n && n0 + m < N;
            ct[t * SSD_LD + m] = in ? Cg[(size_t)(row0 + t) * ldx + n0 + m] : 0.0f;
            bt[t * SSD_LD + m] = in ? Bg[(size_t)(row0 + t) * ldx + n0 + m] : 0.0f;
        }
        for (int e = tid; e < pp * SSD_NT; e += SSD_T) {
            int q = e / SSD_NT, m = e % SSD_NT;
            sv[q * SSD_LD + m] = q < P && n0 + m < N ? S[(size_t)q * N + n0 + m] : 0.0f;
        }
        __syncthreads();
        for (int m = 0; m < SSD_NT; m++) {
            float cv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                cv[i] = ct[(ty + 16 * i) * SSD_LD + m];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float bv = bt[(tx + 16 * j) * SSD_LD + m];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    gm[i][j] += cv[i] * bv;
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < np) {
                    float s = sv[(tx + 16 * j) * SSD_LD + m];
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[i][j] += cv[i] * s;
                }
        }
    }
    __syncthreads();  /* bt is read no more: mm takes its place */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = ty + 16 * i;
        float et = t < n ? expf((float)cum[t]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] *= et;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int s = tx + 16 * j;
            mm[t * SSD_LD + s] =
                s <= t && t < n ? gm[i][j] * expf((float)(cum[t] - cum[s])) * dts[s] : 0.0f;
        }
    }
    __syncthreads();
    for (int s = 0; s < n; s++) {
        float mv[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            mv[i] = mm[(ty + 16 * i) * SSD_LD + s];
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < np) {
                float xv = xs[s * pp + tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[i][j] += mv[i] * xv;
            }
    }
    float dh = dsk ? dsk[h] : 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int q = tx + 16 * j;
            if (j < np && t < n && q < P)
                y[(size_t)(row0 + t) * ldy + (size_t)h * P + q] = acc[i][j] + dh * xs[t * pp + q];
        }
    }
}

/* The chunked form of the call (ADR 0132); false when it does not take the call (the
 * recurrence does). */
static bool ssd_chunked(struct cuda_backend *c, float *y, int ldy, const float *x, const float *B,
                        const float *C, int ldx, const float *dt, int lddt, const float *a_log,
                        const float *dsk, const float *dt_bias, float *st,
                        const struct kv_rows *rows, int n_tok, const struct ssd_params *p)
{
    if (!c->chunked || c->capturing || n_tok < REC_CHUNK_MIN || p->head_dim > SSD_MAX_P)
        return false;
    int H = p->n_head, P = p->head_dim, N = p->d_state, pp = (P + 15) / 16 * 16;
    int maxc = n_tok / REC_CHUNK_MIN;
    size_t own = (size_t)maxc * H * P * N;
    struct rec_plan pl;
    if (!cu_rec_plan(c, rows, n_tok, own + (size_t)maxc * H, &pl))
        return true;  /* the failure is recorded */
    float *sb = pl.f, *dec = pl.f + own;
    size_t s1 = ssd_states_smem(pp), s3 = ssd_out_smem(pp);
    if (!cu_rec_smem(c, 0, (const void *)ssd_states_kernel, s1) ||
        !cu_rec_smem(c, 1, (const void *)ssd_out_kernel, s3))
        return true;
    cu_launch_smem(c, ssd_states_kernel, dim3(maxc, H), dim3(SSD_T), s1, x, B, (size_t)ldx, dt,
                   (size_t)lddt, a_log, dt_bias, pl.cnt, pl.chunks, sb, dec, *p, pp);
    int units = H * P, warps = 4;
    cu_launch(c, ssd_pass_kernel, dim3((units + warps - 1) / warps), dim3(32 * warps), y,
              (size_t)ldy, x, B, C, (size_t)ldx, dt, (size_t)lddt, a_log, dsk, dt_bias, st,
              rows->pos, rows->state, pl.cnt, pl.items, sb, (const float *)dec, *p);
    cu_launch_smem(c, ssd_out_kernel, dim3(maxc, H), dim3(SSD_T), s3, y, (size_t)ldy, x, B, C,
                   (size_t)ldx, dt, (size_t)lddt, a_log, dsk, dt_bias, pl.cnt, pl.chunks,
                   (const float *)sb, *p, pp);
    return true;
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
    if (ssd_chunked(c, y, ldy, x, B, C, ldx, dt, lddt, (const float *)a_log->data,
                    has_d ? (const float *)d->data : (const float *)NULL,
                    (const float *)dt_bias->data, (float *)st->v, rows, n_tok, p)) {
        cu_check(c, "ssd_scan");
        return;
    }
    int units = p->n_head * p->head_dim, warps = 4;
    cu_launch(c, ssd_scan_kernel, dim3((units + warps - 1) / warps), dim3(32 * warps), y,
              (size_t)ldy, x, B, C, (size_t)ldx, dt, (size_t)lddt, (const float *)a_log->data,
              has_d ? (const float *)d->data : (const float *)NULL, (const float *)dt_bias->data,
              (float *)st->v, rows->pos, rows->state, n_tok, *p);
    cu_check(c, "ssd_scan");
}
