/*
 * kern_avx512.h: what the AVX-512 kernel files share (internal to src/kernels/cpu/; include
 * only from files compiled with the AVX-512 target flags, CMakeLists.txt):
 *   kern_avx512.c       the table (cpu_kernels_avx512_init), vectors, attention, activations
 *   kern_avx512_mv.c    the matvecs: float rows, quantized rows in lane order, wrow_f32
 *   kern_avx512_gemm.c  the GEMM's panel packing and microkernel, and FPAN
 */
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __mmask16 tail_mask(int n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* 16 elements p[i..i+16) of a float dtype widened to f32; masked lanes read 0. */
AI __m512 ld16(const void *p, enum dtype dt, size_t i, __mmask16 m)
{
    if (dt == DTYPE_BF16) {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* Unmasked ld16 for the main loops. */
AI __m512 ld16f(const void *p, enum dtype dt, size_t i)
{
    if (dt == DTYPE_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

// ---- weights ----

AI void to_f32_t(float *dst, const void *src, enum dtype dt, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 v0 = ld16f(src, dt, i), v1 = ld16f(src, dt, i + 16);
        _mm512_storeu_ps(dst + i, v0);
        _mm512_storeu_ps(dst + i + 16, v1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        _mm512_mask_storeu_ps(dst + i, m, ld16(src, dt, i, m));
    }
}

/* The table's to_f32, also read by the quantized matvec (its scales). */
static inline void a512_to_f32(float *dst, const void *src, enum dtype dt, size_t n)
{
    switch (dt) {
    case DTYPE_BF16:
        to_f32_t(dst, src, DTYPE_BF16, n);
        break;
    case DTYPE_F16:
        to_f32_t(dst, src, DTYPE_F16, n);
        break;
    default:
        to_f32_t(dst, src, DTYPE_F32, n);
        break;
    }
}

/* ---- kern_avx512_mv.c ---- */
void a512_qxperm(float *dst, const float *x, const struct wmat *w);
void a512_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n);
void a512_matvec(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                 const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs);

/* ---- kern_avx512_gemm.c ---- */
void a512_pack_t(float *bp, int nr, const float *rows, size_t ldr, int nv, int kc);
void a512_pack_w(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc);
void a512_ukernel(float *y, size_t ldy, const float *x, size_t ldx, int mr, const float *bp,
                  int kc, int nv, bool acc);
void a512_fpan_linear(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                      const struct wmat *w, int r0, int r1);

#endif
