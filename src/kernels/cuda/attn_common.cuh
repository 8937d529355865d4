/*
 * attn_common: what attn.cu (rope, KV store, prefill and the per-head decode kernels) and
 * attn_decode.cu (flash-decoding, ADR 0105) share: the cache element loads and stores, the
 * arguments of an attention call and the key range a query row attends (backend.h).
 */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_impl.h"

/* A cache element from / to f32 (F32, F16 or BF16 caches; rounding to nearest even). */
__device__ __forceinline__ float kv_ld(const float *p) { return *p; }
__device__ __forceinline__ float kv_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float kv_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void kv_st(float *p, float x) { *p = x; }
__device__ __forceinline__ void kv_st(__half *p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void kv_st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }

template <class T>
struct attn_args {
    float *out;
    const float *q;
    int ldo, ldq;
    const T *kc, *vc;
    int k_dim, v_dim;
    const int32_t *pos, *table, *tables;
    int bs;
    int n_head, n_rep, hd;
    float scale, softcap;
    int window;
    const float *sinks;
    int chunk;
    const int32_t *span;     /* [n_tok][2] bidirectional blocks, or NULL (kv_rows.span) */
};

/* The first key a query at position p attends: past the window and the chunk (backend.h). */
template <class T>
__device__ __forceinline__ int attn_lo(const attn_args<T> &a, int p)
{
    int lo = a.window > 0 && p + 1 > a.window ? p + 1 - a.window : 0;
    int c0 = a.chunk > 0 ? p - p % a.chunk : 0;
    return c0 > lo ? c0 : lo;
}

/* Keys [lo, hi) of query row t at position p: the causal range, widened to the row's
 * bidirectional block where the rows have them (kv_rows.span). */
template <class T>
__device__ __forceinline__ void attn_range(const attn_args<T> &a, int t, int p, int &lo, int &hi)
{
    hi = p + 1;
    lo = attn_lo(a, p);
    if (a.span) {
        int s0 = a.span[2 * t], s1 = a.span[2 * t + 1] + 1;
        lo = s0 < lo ? s0 : lo;
        hi = s1 > hi ? s1 : hi;
    }
}

/* One warp over keys j0, j0 + STEP, ... below j1, one key at a time (q and the output o over
 * PL dims a lane): a warp reduction for its score, then the online softmax (m, l) and o. */
template <class T, int PL, int STEP>
__device__ __forceinline__ void attn_keys_pl(const attn_args<T> &a, const int32_t *tab, int g,
                                             int lane, const float *qv, float *o, float &m,
                                             float &l, int j0, int j1)
{
    for (int j = j0; j < j1; j += STEP) {
        size_t slot = (size_t)tab[j / a.bs] * a.bs + j % a.bs;
        const T *kr = a.kc + slot * a.k_dim + (size_t)g * a.hd;
        const T *vr = a.vc + slot * a.v_dim + (size_t)g * a.hd;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int d = lane + 32 * i;
            if (d < a.hd)
                s += qv[i] * kv_ld(&kr[d]);
        }
        s = cu_warp_sum(s) * a.scale;
        if (a.softcap > 0.0f)
            s = a.softcap * tanhf(s / a.softcap);
        float mn = fmaxf(m, s), corr = expf(m - mn), pj = expf(s - mn);
        l = l * corr + pj;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int d = lane + 32 * i;
            o[i] = o[i] * corr + (d < a.hd ? pj * kv_ld(&vr[d]) : 0.0f);
        }
        m = mn;
    }
}

/* Row t, head h by one warp, a key at a time (attn.cu's attn_keys arithmetic): the prefill
 * kernels' rows of a block whose rows have different block tables (a batch mixing sequences). */
template <class T, int HD>
__device__ void attn_row_plain(const attn_args<T> &a, int t, int h, int lane)
{
    constexpr int PL = HD / 32 > 0 ? (HD + 31) / 32 : 1;
    int g = h / a.n_rep, p = a.pos[t];
    int hi, lo;
    attn_range(a, t, p, lo, hi);
    const int32_t *tab = a.tables + a.table[t];
    const int hd = a.hd; /* <= HD: the flash kernel's width, padded to whole 16-column steps */
    const float *qh = a.q + (size_t)t * a.ldq + (size_t)h * hd;
    float qv[PL], o[PL], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qh[d] : 0.0f;
        o[i] = 0.0f;
    }
    attn_keys_pl<T, PL, 1>(a, tab, g, lane, qv, o, m, l, lo, hi);
    float L = l, f = 1.0f;
    if (a.sinks) {
        float sk = a.sinks[h], M = fmaxf(m, sk);
        f = expf(m - M);
        L = l * f + expf(sk - M);
    }
    float *oh = a.out + (size_t)t * a.ldo + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        int d = lane + 32 * i;
        if (d < hd)
            oh[d] = o[i] * f / L;
    }
}

/* attn_prefill.cu: prefill attention in the flash-attention-2 layout (ADR 0146) for F16 and
 * BF16 caches at head_dim <= 128; false where it declines (F32 caches, other head sizes,
 * backend_opts.cuda_attn_fa2 off), and attn.cu's kernels take the call. */
bool cu_attn_prefill(struct cuda_backend *c, const attn_args<float> &a, int n_head, int n_tok);
bool cu_attn_prefill(struct cuda_backend *c, const attn_args<__half> &a, int n_head, int n_tok);
bool cu_attn_prefill(struct cuda_backend *c, const attn_args<__nv_bfloat16> &a, int n_head,
                     int n_tok);
