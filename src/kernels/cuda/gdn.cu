/*
 * gdn: the gated delta rule on the GPU (backend_ops.gated_delta; Qwen3-Next's linear
 * attention), with the CPU reference's arithmetic (backend_cpu_gdn.c), in two forms.
 *
 * The recurrence (gdn_kernel): every column j of a head's state S [k_dim][v_dim] evolves on
 * its own given the row's k, q, decay and beta, so a block owns one value head and up to
 * 128 columns of it, one thread per column, and walks the chunk's rows in order (a
 * sequence's rows see the state its earlier rows left, other sequences' rows between
 * them). The block stages the row's q and k in shared memory; each thread reads their sums
 * of squares from there. Grid: (n_v_head, ceil(v_dim / 128)). Calls of fewer than
 * REC_CHUNK_MIN rows (decode), calls recorded into a graph, key heads of other than a
 * multiple of 8 up to 256 dims, and every call with MLXCEL_CUDA_CHUNKED=0 take it.
 *
 * The chunked form (ADR 0132; the WY / UT form of transformers' torch_chunk_gated_delta_rule
 * and FLA): runs of at least REC_CHUNK_MIN consecutive rows of one sequence are cut into
 * chunks of at most REC_CHUNK rows (cu_rec_plan). With G_t the chunk's cumulative log-decay
 * (double), A[t][s] = beta_t e^{G_t - G_s} k_t . k_s (s < t) and S the state before the
 * chunk, u_t = U0_t - W_t^T S where (I + A) U0 = beta v and (I + A) W = beta e^{G} k (the
 * triangular solve, by forward substitution, in double sums), and
 *   y_t = e^{G_t} S^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s
 *   S'  = e^{G_last} S + sum_s e^{G_last - G_s} k_s u_s^T
 * gdn_prep_kernel (parallel over chunks and value heads) normalizes q and k and writes each
 * chunk's U0, W, e^{G} q, e^{G_last - G} k and the masked q.k decays; gdn_pass_kernel
 * (blocks of one value head and 32 state columns, walking the call's items in row order,
 * the state tile in shared memory) applies them to the state chunk after chunk, writing the
 * outputs, and steps the short runs row by row. Every exponent is <= 0.
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

// ---- the chunked form ----

#define GDN_T 256    /* threads of the chunk kernels */
#define GDN_BV 32    /* state columns of a pass block */
#define GDN_SUB 256  /* right-hand sides solved at a time */

/* A chunk's record: e^{G} q [64][dk] | e^{G_last - G} k [64][dk] | W [64][dk] | U0 [64][dv] |
 * masked decayed q.k [64][64] | e^{G_last} (4 floats, 16-byte multiples throughout). */
__host__ __device__ static inline size_t gdn_rec_floats(int dk, int dv)
{
    return (size_t)REC_CHUNK * (3 * (size_t)dk + dv + REC_CHUNK) + 4;
}

static size_t gdn_prep_smem(int dk)
{
    return REC_CHUNK * (sizeof(double) + 3 * sizeof(float)) +
           (size_t)2 * REC_CHUNK * (dk + 1) * 4 + (size_t)REC_CHUNK * (REC_CHUNK + 1) * 4 +
           (size_t)REC_CHUNK * GDN_SUB * 4;
}

static size_t gdn_pass_smem(int dk)
{
    return ((size_t)dk * GDN_BV + (size_t)REC_CHUNK * dk + REC_CHUNK * GDN_BV +
            REC_CHUNK * REC_CHUNK + GDN_T + 2 * (size_t)dk) * 4;
}

/* Block (chunk, value head h): the chunk's record (gdn_rec_floats). */
__global__ void gdn_prep_kernel(const float *x, size_t ldx, const float *ab, size_t ldab,
                                const float *a_log, const float *dt_bias, const int32_t *cnt,
                                const int2 *chunks, float *recs, int nk, int nv, int dk, int dv)
{
    extern __shared__ double gdn_sh[];
    cu_pdl_trigger();
    cu_pdl_wait();
    int ci = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    if (ci >= cnt[1])
        return;
    int2 ch = chunks[ci];
    int row0 = ch.x, n = ch.y, kh = h / (nv / nk), dkp = dk + 1, tx = tid % 16, ty = tid / 16;
    double *G = gdn_sh;
    float *beta = (float *)(G + REC_CHUNK), *eg = beta + REC_CHUNK, *egl = eg + REC_CHUNK;
    float *qn = egl + REC_CHUNK, *kn = qn + REC_CHUNK * dkp, *A = kn + REC_CHUNK * dkp;
    float *X = A + REC_CHUNK * (REC_CHUNK + 1);
    float *R = recs + ((size_t)ci * nv + h) * gdn_rec_floats(dk, dv);
    float *Qe = R, *Kd = R + REC_CHUNK * dk, *W = R + 2 * REC_CHUNK * dk;
    float *U0 = R + 3 * REC_CHUNK * dk, *Aq = U0 + REC_CHUNK * dv;
    for (int e = tid; e < n * dk; e += GDN_T) {
        int t = e / dk, r = e % dk;
        const float *xr = x + (size_t)(row0 + t) * ldx;
        qn[t * dkp + r] = xr[(size_t)kh * dk + r];
        kn[t * dkp + r] = xr[(size_t)(nk + kh) * dk + r];
    }
    if (tid < n) {
        const float *abr = ab + (size_t)(row0 + tid) * ldab;
        float av = abr[nv + h] + dt_bias[h];
        float sp = av > 20.0f ? av : log1pf(expf(av));
        G[tid] = (double)(-expf(a_log[h]) * sp);
        beta[tid] = 1.0f / (1.0f + expf(-abr[h]));
    }
    __syncthreads();
    /* l2norm of q (times 1 / sqrt(dk)) and k, a warp per row */
    for (int t = wp; t < n; t += GDN_T / 32) {
        float qq = 0.0f, kk = 0.0f;
        for (int r = lane; r < dk; r += 32) {
            qq += qn[t * dkp + r] * qn[t * dkp + r];
            kk += kn[t * dkp + r] * kn[t * dkp + r];
        }
        qq = cu_warp_sum(qq);
        kk = cu_warp_sum(kk);
        float qs = rsqrtf((float)dk) / sqrtf(qq + GDN_L2_EPS), ks = 1.0f / sqrtf(kk + GDN_L2_EPS);
        for (int r = lane; r < dk; r += 32) {
            qn[t * dkp + r] *= qs;
            kn[t * dkp + r] *= ks;
        }
    }
    if (tid < 32) {  /* G: the inclusive sums, lane t over rows 2t and 2t + 1 */
        double a0 = 2 * tid < n ? G[2 * tid] : 0.0, a1 = 2 * tid + 1 < n ? G[2 * tid + 1] : 0.0;
        double v = a0 + a1;
        for (int o = 1; o < 32; o <<= 1) {
            double u = __shfl_up_sync(0xffffffffu, v, o);
            if (tid >= o)
                v += u;
        }
        if (2 * tid < n)
            G[2 * tid] = v - a1;
        if (2 * tid + 1 < n)
            G[2 * tid + 1] = v;
    }
    __syncthreads();
    if (tid < n) {
        eg[tid] = expf((float)G[tid]);
        egl[tid] = expf((float)(G[n - 1] - G[tid]));
    }
    /* k.k and q.k: rows t = ty + 16 i, columns s = tx + 16 j */
    float kk[4][4] = {}, qk[4][4] = {};
    for (int r = 0; r < dk; r++) {
        float qv[4], kv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            qv[i] = qn[(ty + 16 * i) * dkp + r];
            kv[i] = kn[(ty + 16 * i) * dkp + r];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float ks = kn[(tx + 16 * j) * dkp + r];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                kk[i][j] += kv[i] * ks;
                qk[i][j] += qv[i] * ks;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int s = tx + 16 * j;
            float d = t < n && s <= t ? expf((float)(G[t] - G[s])) : 0.0f;
            A[t * (REC_CHUNK + 1) + s] = s < t && t < n ? beta[t] * d * kk[i][j] : 0.0f;
            Aq[t * REC_CHUNK + s] = s <= t && t < n ? d * qk[i][j] : 0.0f;
        }
    }
    __syncthreads();
    /* (I + A) X = rhs, a thread per right-hand side: U0 (beta v), then W (beta e^{G} k) */
    for (int c0 = 0; c0 < dv + dk; c0 += GDN_SUB) {
        int col = c0 + tid;
        if (col >= dv + dk)
            continue;
        float *xc = X + tid;
        if (col < dv) {
            const float *v = x + (size_t)row0 * ldx + (size_t)2 * nk * dk + (size_t)h * dv + col;
            for (int t = 0; t < n; t++)
                xc[t * GDN_SUB] = beta[t] * v[(size_t)t * ldx];
        } else {
            for (int t = 0; t < n; t++)
                xc[t * GDN_SUB] = beta[t] * eg[t] * kn[t * dkp + col - dv];
        }
        for (int t = 0; t < n; t++) {
            double a = xc[t * GDN_SUB];
            const float *At = A + t * (REC_CHUNK + 1);
            for (int s = 0; s < t; s++)
                a -= (double)At[s] * xc[s * GDN_SUB];
            xc[t * GDN_SUB] = (float)a;
            if (col < dv)
                U0[t * dv + col] = (float)a;
            else
                W[t * dk + col - dv] = (float)a;
        }
    }
    for (int e = tid; e < n * dk; e += GDN_T) {
        int t = e / dk, r = e % dk;
        Qe[e] = qn[t * dkp + r] * eg[t];
        Kd[e] = kn[t * dkp + r] * egl[t];
    }
    if (tid == 0)
        Aq[REC_CHUNK * REC_CHUNK] = expf((float)G[n - 1]);
}

/* Block (value head h, state columns [32 y, 32 y + 32)): the call's items in row order
 * (cu_rec_plan), the state tile S [dk][32] in shared memory. Thread (ty, tx) of 8 x 32 owns
 * column tx and state rows [ty dk / 8, (ty + 1) dk / 8). */
__global__ void gdn_pass_kernel(float *y, size_t ldy, const float *x, size_t ldx, const float *ab,
                                size_t ldab, const float *a_log, const float *dt_bias, float *st,
                                const int32_t *pos, const int32_t *seq, const int32_t *cnt,
                                const int4 *items, const float *recs, int nk, int nv, int dk,
                                int dv)
{
    extern __shared__ float4 gdn_ps[];
    cu_pdl_trigger();
    cu_pdl_wait();
    int h = blockIdx.x, tid = threadIdx.x, tx = tid % GDN_BV, ty = tid / GDN_BV;
    int j = blockIdx.y * GDN_BV + tx, kh = h / (nv / nk), rpt = dk / 8, r0 = ty * rpt;
    float *S = (float *)gdn_ps, *buf = S + dk * GDN_BV, *V = buf + REC_CHUNK * dk;
    float *Aq = V + REC_CHUNK * GDN_BV, *red = Aq + REC_CHUNK * REC_CHUNK, *qr = red + GDN_T;
    float *kr = qr + dk;
    size_t hs = (size_t)dk * dv, rsz = gdn_rec_floats(dk, dv);
    float al = -expf(a_log[h]), db = dt_bias[h];
    int cur = -1, n_items = cnt[0];
    for (int it = 0; it < n_items; it++) {
        int4 w = items[it];
        int q = seq[w.x], row0 = w.x, n = w.y;
        if (q != cur || pos[row0] == 0) {
            __syncthreads();  /* the tile is read no more */
            if (cur >= 0 && q != cur && j < dv) {
                float *o = st + ((size_t)cur * nv + h) * hs + j;
                for (int i = 0; i < rpt; i++)
                    o[(size_t)(r0 + i) * dv] = S[(r0 + i) * GDN_BV + tx];
            }
            const float *in = st + ((size_t)q * nv + h) * hs + j;
            for (int i = 0; i < rpt; i++)
                S[(r0 + i) * GDN_BV + tx] = pos[row0] != 0 && j < dv ? in[(size_t)(r0 + i) * dv] : 0.0f;
            cur = q;
        }
        if (w.z >= 0) {
            const float *R = recs + ((size_t)w.z * nv + h) * rsz;
            const float *Qe = R, *Kd = R + REC_CHUNK * dk, *W = R + 2 * REC_CHUNK * dk;
            const float *U0 = R + 3 * REC_CHUNK * dk, *Ar = U0 + REC_CHUNK * dv;
            float acc[8];
            __syncthreads();  /* buf, V and Aq are free; S is loaded */
            for (int e = tid * 4; e < n * dk; e += GDN_T * 4)
                *(float4 *)(buf + e) = *(const float4 *)(W + e);
            for (int e = tid; e < n * REC_CHUNK; e += GDN_T)
                Aq[e] = Ar[e];
            __syncthreads();
            /* V = U0 - W S over rows t = ty + 8 i */
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = 0.0f;
            for (int r = 0; r < dk; r += 4) {
                float s0 = S[r * GDN_BV + tx], s1 = S[(r + 1) * GDN_BV + tx];
                float s2 = S[(r + 2) * GDN_BV + tx], s3 = S[(r + 3) * GDN_BV + tx];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (ty + 8 * i < n) {
                        float4 wv = *(const float4 *)(buf + (ty + 8 * i) * dk + r);
                        acc[i] += wv.x * s0 + wv.y * s1 + wv.z * s2 + wv.w * s3;
                    }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int t = ty + 8 * i;
                if (t < n)
                    V[t * GDN_BV + tx] = (j < dv ? U0[(size_t)t * dv + j] : 0.0f) - acc[i];
            }
            __syncthreads();  /* buf consumed, V written */
            for (int e = tid * 4; e < n * dk; e += GDN_T * 4)
                *(float4 *)(buf + e) = *(const float4 *)(Qe + e);
            __syncthreads();
            /* y = e^{G} q^T S + (masked q.k decays) V */
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[i] = 0.0f;
            for (int r = 0; r < dk; r += 4) {
                float s0 = S[r * GDN_BV + tx], s1 = S[(r + 1) * GDN_BV + tx];
                float s2 = S[(r + 2) * GDN_BV + tx], s3 = S[(r + 3) * GDN_BV + tx];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (ty + 8 * i < n) {
                        float4 qv = *(const float4 *)(buf + (ty + 8 * i) * dk + r);
                        acc[i] += qv.x * s0 + qv.y * s1 + qv.z * s2 + qv.w * s3;
                    }
            }
            for (int s = 0; s < n; s++) {
                float v = V[s * GDN_BV + tx];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (ty + 8 * i < n)
                        acc[i] += Aq[(ty + 8 * i) * REC_CHUNK + s] * v;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int t = ty + 8 * i;
                if (t < n && j < dv)
                    y[(size_t)(row0 + t) * ldy + (size_t)h * dv + j] = acc[i];
            }
            __syncthreads();  /* buf and S read */
            for (int e = tid * 4; e < n * dk; e += GDN_T * 4)
                *(float4 *)(buf + e) = *(const float4 *)(Kd + e);
            __syncthreads();
            /* S = e^{G_last} S + (e^{G_last - G} k)^T V, over the thread's own rows */
            float egl = Ar[REC_CHUNK * REC_CHUNK], sa[32];
#pragma unroll
            for (int i = 0; i < 32; i++)
                if (i < rpt)
                    sa[i] = egl * S[(r0 + i) * GDN_BV + tx];
            for (int t = 0; t < n; t++) {
                float v = V[t * GDN_BV + tx];
                const float *kd = buf + t * dk + r0;
                if (rpt % 4 == 0) {  /* 16-byte aligned: dk and rpt multiples of 4 */
#pragma unroll
                    for (int i = 0; i < 32; i += 4)
                        if (i < rpt) {
                            float4 k4 = *(const float4 *)(kd + i);
                            sa[i] += k4.x * v;
                            sa[i + 1] += k4.y * v;
                            sa[i + 2] += k4.z * v;
                            sa[i + 3] += k4.w * v;
                        }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; i++)
                        if (i < rpt)
                            sa[i] += kd[i] * v;
                }
            }
#pragma unroll
            for (int i = 0; i < 32; i++)
                if (i < rpt)
                    S[(r0 + i) * GDN_BV + tx] = sa[i];
            continue;
        }
        /* a short run: the recurrence, row by row, on the tile */
        for (int i = row0; i < row0 + n; i++) {
            const float *xr = x + (size_t)i * ldx;
            __syncthreads();  /* the previous row is done with qr, kr, red; S loaded */
            for (int r = tid; r < dk; r += GDN_T) {
                qr[r] = xr[(size_t)kh * dk + r];
                kr[r] = xr[(size_t)(nk + kh) * dk + r];
            }
            __syncthreads();
            float qq = 0.0f, kq = 0.0f;
            for (int r = 0; r < dk; r++) {
                qq += qr[r] * qr[r];
                kq += kr[r] * kr[r];
            }
            float qs = rsqrtf((float)dk) / sqrtf(qq + GDN_L2_EPS), ks = 1.0f / sqrtf(kq + GDN_L2_EPS);
            const float *abr = ab + (size_t)i * ldab;
            float av = abr[nv + h] + db;
            float sp = av > 20.0f ? av : log1pf(expf(av));
            float decay = expf(al * sp), beta = 1.0f / (1.0f + expf(-abr[h]));
            float part = 0.0f;
            for (int k = 0; k < rpt; k++) {
                float sv = S[(r0 + k) * GDN_BV + tx] * decay;
                S[(r0 + k) * GDN_BV + tx] = sv;
                part += sv * (kr[r0 + k] * ks);
            }
            red[tid] = part;
            __syncthreads();
            float kv = 0.0f;
            for (int k = 0; k < 8; k++)
                kv += red[k * GDN_BV + tx];
            float d = beta * ((j < dv ? xr[(size_t)2 * nk * dk + (size_t)h * dv + j] : 0.0f) - kv);
            part = 0.0f;
            for (int k = 0; k < rpt; k++) {
                float sv = S[(r0 + k) * GDN_BV + tx] + kr[r0 + k] * ks * d;
                S[(r0 + k) * GDN_BV + tx] = sv;
                part += sv * (qr[r0 + k] * qs);
            }
            __syncthreads();  /* red read */
            red[tid] = part;
            __syncthreads();
            if (ty == 0 && j < dv) {
                float o = 0.0f;
                for (int k = 0; k < 8; k++)
                    o += red[k * GDN_BV + tx];
                y[(size_t)i * ldy + (size_t)h * dv + j] = o;
            }
        }
    }
    __syncthreads();  /* the tile's last writes */
    if (cur >= 0 && j < dv) {
        float *o = st + ((size_t)cur * nv + h) * hs + j;
        for (int i = 0; i < rpt; i++)
            o[(size_t)(r0 + i) * dv] = S[(r0 + i) * GDN_BV + tx];
    }
}

/* The chunked form of the call (ADR 0132); false when it does not take the call. */
static bool gdn_chunked(struct cuda_backend *c, float *y, int ldy, const float *x, int ldx,
                        const float *ab, int ldab, const float *a_log, const float *dt_bias,
                        float *st, const struct kv_rows *rows, int n_tok, int nk, int nv, int dk,
                        int dv)
{
    if (!c->chunked || c->capturing || n_tok < REC_CHUNK_MIN || dk % 8 || dk > 256)
        return false;
    struct rec_plan pl;
    size_t rsz = gdn_rec_floats(dk, dv);
    if (!cu_rec_plan(c, rows, n_tok, (size_t)(n_tok / REC_CHUNK_MIN) * nv * rsz, &pl))
        return true;  /* the failure is recorded */
    size_t s1 = gdn_prep_smem(dk), s2 = gdn_pass_smem(dk);
    if (!cu_rec_smem(c, 2, (const void *)gdn_prep_kernel, s1) ||
        !cu_rec_smem(c, 3, (const void *)gdn_pass_kernel, s2))
        return true;
    cu_launch_smem(c, gdn_prep_kernel, dim3(pl.max_chunks, nv), dim3(GDN_T), s1, x, (size_t)ldx,
                   ab, (size_t)ldab, a_log, dt_bias, pl.cnt, pl.chunks, pl.f, nk, nv, dk, dv);
    cu_launch_smem(c, gdn_pass_kernel, dim3(nv, (dv + GDN_BV - 1) / GDN_BV), dim3(GDN_T), s2, y,
                   (size_t)ldy, x, (size_t)ldx, ab, (size_t)ldab, a_log, dt_bias, st, rows->pos,
                   rows->state, pl.cnt, pl.items, (const float *)pl.f, nk, nv, dk, dv);
    return true;
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
    if (gdn_chunked(c, y, ldy, x, ldx, ab, ldab, (const float *)p->a_log->data,
                    (const float *)p->dt_bias->data, (float *)st->v, rows, n_tok, nk, nv, dk, dv)) {
        cu_check(c, "gated_delta");
        return;
    }
    cu_launch_smem(c, gdn_kernel, dim3(nv, (dv + GDN_THREADS - 1) / GDN_THREADS),
                   dim3(GDN_THREADS), (size_t)2 * dk * sizeof(float), y, (size_t)ldy, x,
                   (size_t)ldx, ab, (size_t)ldab, (const float *)p->a_log->data,
                   (const float *)p->dt_bias->data, (float *)st->v, rows->pos, rows->state,
                   n_tok, nk, nv, dk, dv);
    cu_check(c, "gated_delta");
}
