/*
 * attn_prefill: prefill attention on tensor cores with scores, probabilities and outputs in
 * registers (the flash-attention-2 layout, ADR 0146), for F16 and BF16 caches at head widths
 * up to 128 and F32 caches from 64 to 128 (run at 64, 80 or 128, zeros past the head).
 * attn.cu's attn_fa_kernel (ADR 0054) keeps any call this kernel declines.
 *
 * F32 caches: K and V are not exact in a 16-bit type, so a tile is loaded through registers and
 * split into bf16 hi + lo planes in shared memory (one stage, the bytes of a 16-bit cache's
 * two), and each product takes a third mma against the lo plane: q K = qh Kh + ql Kh + qh Kl and
 * P V = Ph Vh + Pl Vh + Ph Vl (the lo x lo term, about 2^-16 of the product, dropped as in ADR
 * 0054's three products).
 *
 * A block of FP_WARPS warps takes FP_ROWS query rows of one head that share one block table
 * and walks their keys FP_KEYS at a time through two cp.async stages of shared memory (K and V
 * tiles as the cache stores them). Warp w owns rows 16 w .. 16 w + 15 and keeps in registers:
 *   q as two parts of the cache's type, hi + lo (A fragments of m16n8k16, 22 significant bits
 *     in f16, 16 in bf16), so q.k = qh.k + ql.k in f32 with k exact (the cache's own value);
 *     f16 parts hold q scaled by a power of two per row (its largest element near 2^14: no
 *     overflow, no lost low bits), undone on the score (exactly);
 *   the tile's scores S (C fragments), turned in place into the online softmax's P and split
 *     into hi + lo A fragments for P V (C layout of two n8 tiles = A layout of one k16: FA2's
 *     reuse); in f16, P times 2^14 (so the lo part stays normal; undone in the final division);
 *   the output O (C fragments) with its per-row running max and sum.
 * So every product is two mma (hi, lo) against K and V read once per tile for 64 rows, and
 * shared memory holds only the K / V stages (70 KB at width 128): two blocks an SM where
 * attn_fa_kernel ran one (175 KB) at 6.25 % occupancy.
 *
 * Fragments (g = lane / 4, c = lane % 4): A (16 x 16) a0 (row g, k 2c, 2c+1), a1 (row g+8),
 * a2 (row g, k 2c+8, 2c+9), a3 (row g+8, k 2c+8..); B (16 x 8) b0 (k 2c, 2c+1, col g), b1
 * (k 2c+8, 2c+9); C (16 x 8) c0, c1 (row g, cols 2c, 2c+1), c2, c3 (row g+8). K's B fragments
 * come from ldmatrix on K [key][dim] (a key's dims are B's k), V's from ldmatrix.trans on V
 * [key][dim] (there the keys are B's k).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#include "affine_frag.cuh"
#include "attn_common.cuh"
#include "ptx.cuh"

#define FP_ROWS 64
#define FP_KEYS 64
#define FP_WARPS 4

/* What differs between the two cache types: the mma, pairs of values to and from them, and
 * the scalings of q (per row) and P that f16's range needs. */
template <class T>
struct fp_type;

template <>
struct fp_type<__half> {
    static constexpr bool SPLIT = false;
    static constexpr bool QSCALE = true;
    static constexpr float PS = 16384.0f;
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u)
    {
        return __half22float2(*reinterpret_cast<__half2 *>(&u));
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1)
    {
        mma_f16(c, a, b0, b1);
    }
};

template <>
struct fp_type<__nv_bfloat16> {
    static constexpr bool SPLIT = false;
    static constexpr bool QSCALE = false;
    static constexpr float PS = 1.0f;
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        return bf162_bits(__floats2bfloat162_rn(a, b));
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u)
    {
        __nv_bfloat162 h;
        h.x = __ushort_as_bfloat16((unsigned short)(u & 0xffffu));
        h.y = __ushort_as_bfloat16((unsigned short)(u >> 16));
        return __bfloat1622float2(h);
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1)
    {
        mma_bf16(c, a, b0, b1);
    }
};

/* F32 caches: K and V split into bf16 hi + lo planes as a tile is loaded, the products in bf16
 * (the pairs and the mma of bf16). */
template <>
struct fp_type<float> : fp_type<__nv_bfloat16> {
    static constexpr bool SPLIT = true;
};

/* The pair (x, y) as hi + lo parts of type T. */
template <class T>
__device__ __forceinline__ void fp_split(float x, float y, uint32_t &hi, uint32_t &lo)
{
    hi = fp_type<T>::pack(x, y);
    float2 h = fp_type<T>::unpack(hi);
    lo = fp_type<T>::pack(x - h.x, y - h.y);
}

template <class T, int HD>
struct fp_smem {
    T k[2][FP_KEYS][HD + 8];    /* [stage]; + 8: ldmatrix's 8 rows in different banks */
    T v[2][FP_KEYS][HD + 8];
};

/* F32 caches: one stage, [0] the hi plane and [1] the lo plane (the same bytes as two stages of
 * a 16-bit cache). */
template <int HD>
struct fp_smem<float, HD> {
    __nv_bfloat16 k[2][FP_KEYS][HD + 8];
    __nv_bfloat16 v[2][FP_KEYS][HD + 8];
};

/* Stage st <- the keys kt .. kt + FP_KEYS of KV group g (zeros past khi and past the head's
 * hd columns): thread i copies key i / 2's 16-byte pieces i % 2, i % 2 + 2, ... */
template <class T, int HD>
__device__ __forceinline__ void fp_load(const attn_args<T> &a, fp_smem<T, HD> &S, int st,
                                        const int32_t *tab, int kt, int khi, int g)
{
    const int r = threadIdx.x / 2, j = kt + r;
    const bool ok = j < khi;
    const size_t slot = ok ? (size_t)tab[j / a.bs] * a.bs + j % a.bs : 0;
    const T *kr = a.kc + slot * a.k_dim + (size_t)g * a.hd;
    const T *vr = a.vc + slot * a.v_dim + (size_t)g * a.hd;
#pragma unroll
    for (int p = threadIdx.x % 2; p < HD / 8; p += 2) {
        const bool in = ok && 8 * p < a.hd;
        cp_async16(smem_u32(&S.k[st][r][8 * p]), in ? kr + 8 * p : a.kc, in);
        cp_async16(smem_u32(&S.v[st][r][8 * p]), in ? vr + 8 * p : a.vc, in);
    }
}

/* F32 caches: the keys kt .. kt + FP_KEYS of KV group g into the hi and lo planes (zeros past khi
 * and past hd), by the whole block: 4 elements a thread at a time, loaded, split and stored. */
template <int HD>
__device__ __forceinline__ void fp_load_split(const attn_args<float> &a, fp_smem<float, HD> &S,
                                              const int32_t *tab, int kt, int khi, int g)
{
    constexpr int P = HD / 4;   /* float4 pieces a row */
    for (int i = threadIdx.x; i < FP_KEYS * P; i += 32 * FP_WARPS) {
        const int r = i / P, d = 4 * (i % P), j = kt + r;
        float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
        if (j < khi && d < a.hd) {  /* hd % 8 == 0: the piece lies inside the head */
            const size_t slot = (size_t)tab[j / a.bs] * a.bs + j % a.bs;
            kv = __ldg((const float4 *)(a.kc + slot * a.k_dim + (size_t)g * a.hd + d));
            vv = __ldg((const float4 *)(a.vc + slot * a.v_dim + (size_t)g * a.hd + d));
        }
        uint32_t h0, l0, h1, l1;
        fp_split<float>(kv.x, kv.y, h0, l0);
        fp_split<float>(kv.z, kv.w, h1, l1);
        *(uint2 *)&S.k[0][r][d] = make_uint2(h0, h1);
        *(uint2 *)&S.k[1][r][d] = make_uint2(l0, l1);
        fp_split<float>(vv.x, vv.y, h0, l0);
        fp_split<float>(vv.z, vv.w, h1, l1);
        *(uint2 *)&S.v[0][r][d] = make_uint2(h0, h1);
        *(uint2 *)&S.v[1][r][d] = make_uint2(l0, l1);
    }
}

template <class T, int HD>
__global__ void __launch_bounds__(32 * FP_WARPS, 2) attn_prefill_kernel(attn_args<T> a, int n_tok)
{
    using F = fp_type<T>;
    constexpr int KS = HD / 16;        /* k16 steps over the head */
    constexpr int NT = FP_KEYS / 8;    /* n8 tiles of scores */
    constexpr int DT = HD / 8;         /* n8 tiles of the output */
    extern __shared__ __align__(128) unsigned char fp_raw[];
    fp_smem<T, HD> &S = *reinterpret_cast<fp_smem<T, HD> *>(fp_raw);
    __shared__ int s_klo, s_khi;
    cu_pdl_trigger();
    cu_pdl_wait();
    const int h = blockIdx.x, t0 = blockIdx.y * FP_ROWS, tid = threadIdx.x;
    const int lane = tid % 32, w = tid / 32, g = h / a.n_rep, qg = lane / 4, qc = lane % 4;
    const int nr = n_tok - t0 < FP_ROWS ? n_tok - t0 : FP_ROWS;
    const int tab0 = a.table[t0];
    if (tid == 0) {
        s_klo = INT_MAX;
        s_khi = 0;
    }
    __syncthreads();
    /* this thread's two rows (ri 0: 16 w + g, ri 1: + 8): key ranges, the block's union, and
     * whether the block's rows have different tables */
    int rlo[2], rhi[2], mixed = 0;
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        const int r = 16 * w + qg + 8 * ri;
        rlo[ri] = INT_MAX;
        rhi[ri] = 0;
        if (r < nr) {
            attn_range(a, t0 + r, a.pos[t0 + r], rlo[ri], rhi[ri]);
            mixed |= a.table[t0 + r] != tab0;
            if (qc == 0) {
                atomicMin(&s_klo, rlo[ri]);
                atomicMax(&s_khi, rhi[ri]);
            }
        }
    }
    if (__syncthreads_or(mixed)) {
        for (int r = w; r < nr; r += FP_WARPS)
            attn_row_plain<T, HD>(a, t0 + r, h, lane);
        return;
    }
    const int klo = s_klo, khi = s_khi;
    const int wlo = __reduce_min_sync(0xffffffffu, min(rlo[0], rlo[1]));
    const int whi = __reduce_max_sync(0xffffffffu, max(rhi[0], rhi[1]));
    const int32_t *tab = a.tables + tab0;
    /* the first tile's copies go out before q is read (F32: each tile is loaded in the loop) */
    if constexpr (!F::SPLIT)
        if (klo < khi)
            fp_load(a, S, 0, tab, klo, khi, g);
    cp_async_commit();

    /* q: rows 16 w + qg (+ 8), columns 16 s + 2 qc (+ 1) and + 8, f16 scaled per row */
    float qv[2][KS][4];
    float qinv[2] = {1.0f, 1.0f};
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        const int r = 16 * w + qg + 8 * ri;
        const float *qr = a.q + (size_t)(t0 + (r < nr ? r : 0)) * a.ldq + (size_t)h * a.hd;
        float mx = 0.0f;
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int d = 16 * s + 2 * qc + (e & 1) + 8 * (e >> 1);
                qv[ri][s][e] = r < nr && d < a.hd ? qr[d] : 0.0f;
                mx = fmaxf(mx, fabsf(qv[ri][s][e]));
            }
        if (F::QSCALE) {
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            int ex = 0;
            if (mx > 0.0f && mx <= 3.0e38f) {
                frexpf(mx, &ex);
                ex = 14 - ex;
                ex = ex > 120 ? 120 : ex < -120 ? -120 : ex;
            }
            const float sc = ldexpf(1.0f, ex);
            qinv[ri] = ldexpf(1.0f, -ex);
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    qv[ri][s][e] *= sc;
        }
    }
    uint32_t qh[KS][4], ql[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) {
        fp_split<T>(qv[0][s][0], qv[0][s][1], qh[s][0], ql[s][0]);
        fp_split<T>(qv[1][s][0], qv[1][s][1], qh[s][1], ql[s][1]);
        fp_split<T>(qv[0][s][2], qv[0][s][3], qh[s][2], ql[s][2]);
        fp_split<T>(qv[1][s][2], qv[1][s][3], qh[s][3], ql[s][3]);
    }

    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int d = 0; d < DT; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    /* ldmatrix addresses within a stage: lane l gives row l % 8 of matrix l / 8 */
    const int mi = lane / 8, mr = lane % 8;
    const int k_key = (mi / 2) * 8 + mr, k_dim = (mi % 2) * 8;   /* K: [keys 0-7 | 8-15] x [dims] */
    const int v_key = (mi % 2) * 8 + mr, v_dim = (mi / 2) * 8;   /* V: [keys] x [dims 0-7 | 8-15] */

    for (int kt = klo, it = 0; kt < khi; kt += FP_KEYS, it++) {
        const int st = F::SPLIT ? 0 : it & 1;
        if constexpr (F::SPLIT) {
            /* one stage: the last iteration's closing barrier freed it */
            fp_load_split(a, S, tab, kt, khi, g);
        } else {
            if (kt + FP_KEYS < khi)
                fp_load(a, S, st ^ 1, tab, kt + FP_KEYS, khi, g);
            cp_async_commit();
            cp_async_wait<1>();
        }
        __syncthreads();
        if (kt < whi && kt + FP_KEYS > wlo) {
            /* S = q Kᵀ over the tile */
            float sc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t b[4];
                    ldsm_x4(b, smem_u32(&S.k[st][16 * np + k_key][16 * s + k_dim]));
                    F::mma(sc[2 * np], qh[s], b[0], b[1]);
                    F::mma(sc[2 * np], ql[s], b[0], b[1]);
                    F::mma(sc[2 * np + 1], qh[s], b[2], b[3]);
                    F::mma(sc[2 * np + 1], ql[s], b[2], b[3]);
                    if constexpr (F::SPLIT) { /* F32: + qh K's lo plane (ql x lo dropped) */
                        ldsm_x4(b, smem_u32(&S.k[1][16 * np + k_key][16 * s + k_dim]));
                        F::mma(sc[2 * np], qh[s], b[0], b[1]);
                        F::mma(sc[2 * np + 1], qh[s], b[2], b[3]);
                    }
                }
            /* the online softmax of the thread's two rows over its 16 keys of each */
            float corr[2];
#pragma unroll
            for (int ri = 0; ri < 2; ri++) {
                const float f = qinv[ri] * a.scale; /* a power of two times the scale */
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int j = kt + 8 * n + 2 * qc + e;
                        float x = sc[n][2 * ri + e] * f;
                        if (a.softcap > 0.0f)
                            x = a.softcap * tanhf(x / a.softcap);
                        x = j >= rlo[ri] && j < rhi[ri] ? x : -INFINITY;
                        sc[n][2 * ri + e] = x;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mn = fmaxf(m[ri], mx);
                float sum = 0.0f;
                if (mn == -INFINITY) { /* no key of this row yet */
                    corr[ri] = 1.0f;
#pragma unroll
                    for (int n = 0; n < NT; n++)
                        sc[n][2 * ri] = sc[n][2 * ri + 1] = 0.0f;
                } else {
                    corr[ri] = expf(m[ri] - mn);
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float p = expf(sc[n][2 * ri + e] - mn);
                            sum += p;
                            sc[n][2 * ri + e] = p * F::PS;
                        }
                }
                l[ri] = l[ri] * corr[ri] + sum;
                m[ri] = mn;
            }
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][0] *= corr[0];
                o[d][1] *= corr[0];
                o[d][2] *= corr[1];
                o[d][3] *= corr[1];
            }
            /* O += P V: the scores' tiles 2 s, 2 s + 1 are P's A fragment of keys 16 s.. */
#pragma unroll
            for (int s = 0; s < FP_KEYS / 16; s++) {
                uint32_t ph[4], pl[4];
                fp_split<T>(sc[2 * s][0], sc[2 * s][1], ph[0], pl[0]);
                fp_split<T>(sc[2 * s][2], sc[2 * s][3], ph[1], pl[1]);
                fp_split<T>(sc[2 * s + 1][0], sc[2 * s + 1][1], ph[2], pl[2]);
                fp_split<T>(sc[2 * s + 1][2], sc[2 * s + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, smem_u32(&S.v[st][16 * s + v_key][16 * dp + v_dim]));
                    F::mma(o[2 * dp], ph, b[0], b[1]);
                    F::mma(o[2 * dp], pl, b[0], b[1]);
                    F::mma(o[2 * dp + 1], ph, b[2], b[3]);
                    F::mma(o[2 * dp + 1], pl, b[2], b[3]);
                    if constexpr (F::SPLIT) { /* F32: + ph V's lo plane */
                        ldsm_x4_t(b, smem_u32(&S.v[1][16 * s + v_key][16 * dp + v_dim]));
                        F::mma(o[2 * dp], ph, b[0], b[1]);
                        F::mma(o[2 * dp + 1], ph, b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the stage is read: the next iteration's copies may overwrite it */
    }
    cp_async_wait<0>();

    /* O / L (the sink logit in L), P's scale undone */
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
        const int r = 16 * w + qg + 8 * ri;
        float L = l[ri];
        L += __shfl_xor_sync(0xffffffffu, L, 1);
        L += __shfl_xor_sync(0xffffffffu, L, 2);
        float f = 1.0f;
        if (a.sinks) {
            const float sk = a.sinks[h], M = fmaxf(m[ri], sk);
            f = expf(m[ri] - M);
            L = L * f + expf(sk - M);
        }
        const float inv = f / (L * F::PS);
        if (r >= nr)
            continue;
        float *oh = a.out + (size_t)(t0 + r) * a.ldo + (size_t)h * a.hd;
#pragma unroll
        for (int d = 0; d < DT; d++) {
            const int c0 = 8 * d + 2 * qc;
            if (c0 < a.hd)
                oh[c0] = o[d][2 * ri] * inv;
            if (c0 + 1 < a.hd)
                oh[c0 + 1] = o[d][2 * ri + 1] * inv;
        }
    }
}

template <class T, int HD>
static bool fp_launch(struct cuda_backend *c, const attn_args<T> &a, int n_head, int n_tok)
{
    const size_t smem = sizeof(fp_smem<T, HD>);
    cudaError_t rc = cudaFuncSetAttribute(attn_prefill_kernel<T, HD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess) {
        cu_fail(c, "attention: shared memory", rc);
        return true;
    }
    cu_launch_smem(c, attn_prefill_kernel<T, HD>, dim3(n_head, (n_tok + FP_ROWS - 1) / FP_ROWS),
                   dim3(32 * FP_WARPS), smem, a, n_tok);
    return true;
}

/* The call on this kernel when it can take it (see the header); false: attn.cu's kernels. */
template <class T>
static bool fp_try(struct cuda_backend *c, const attn_args<T> &a, int n_head, int n_tok)
{
    if (!c->attn_fa2 || a.hd > 128 || a.hd % 8 || a.k_dim % 8 || a.v_dim % 8 ||
        (uintptr_t)a.kc % 16 || (uintptr_t)a.vc % 16)
        return false;
    if (a.hd <= 64)
        return fp_launch<T, 64>(c, a, n_head, n_tok);
    if (a.hd <= 80)
        return fp_launch<T, 80>(c, a, n_head, n_tok);
    return fp_launch<T, 128>(c, a, n_head, n_tok);
}

/* F32 caches from head size 64 (smaller heads keep the per-row kernel: see attn.cu) */
bool cu_attn_prefill(struct cuda_backend *c, const attn_args<float> &a, int n_head, int n_tok)
{
    return a.hd >= 64 && fp_try(c, a, n_head, n_tok);
}

bool cu_attn_prefill(struct cuda_backend *c, const attn_args<__half> &a, int n_head, int n_tok)
{
    return fp_try(c, a, n_head, n_tok);
}

bool cu_attn_prefill(struct cuda_backend *c, const attn_args<__nv_bfloat16> &a, int n_head,
                     int n_tok)
{
    return fp_try(c, a, n_head, n_tok);
}
