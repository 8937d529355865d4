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
