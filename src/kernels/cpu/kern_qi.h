/*
 * kern_qi: pieces the integer matvec (kern.h, "qi") shares between
 * kern_avx2_qi.c and kern_avx512_qi.c. Included only by files compiled with
 * at least AVX2 + FMA + F16C: the functions are AVX2 intrinsics inlined into
 * each variant.
 */
#pragma once
#include <immintrin.h>
#include <string.h>

#include "kern.h"

/* UBSan's pointer-overflow checks are off in these kernels: on the unrolled loops of
 * the VNNI GEMM they took clang over 10 minutes to compile one file. ASan (every access)
 * and the other UBSan checks stay on. */
#define QI_NOSAN __attribute__((no_sanitize("pointer-overflow")))
#define AI static inline __attribute__((always_inline)) QI_NOSAN

/* Codes per column chunk: the group multipliers of 4 rows live on the stack. */
#define QI_CH 2048
/* Multipliers per row and chunk, with room for the zero padding read past the last group. */
#define QI_NG (QI_CH / 32 + 16)
/* Bytes ahead prefetched in each weight row (first token only): the same
 * offset of the next block of 4 rows, at most 16 KiB (ADR 0055, "Measurements
 * moved out of the kernels"). */
#define QI_PF_MAX 16384
AI size_t qi_pf_dist(const struct wmat *w)
{
    return 4 * w->row_bytes < QI_PF_MAX ? 4 * w->row_bytes : QI_PF_MAX;
}

AI float qi_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Groups i .. i+8 of a row's scales or biases (from group g0) as f32. */
AI __m256 qi_ld8(const uint8_t *s, enum dtype dt, int g0, int i)
{
    if (dt == DTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + g0 + i))), 16));
    if (dt == DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)s + g0 + i)));
    return _mm256_loadu_ps((const float *)s + g0 + i);
}

/* Groups i .. i+8 of an mxfp4 row's e8m0 scales (from group g0) as f32 halved: 2^(e - 128),
 * 0 -> 2^-128, 255 -> +inf (kern_e8m0 / 2, exact: the kernels multiply the codes' values
 * doubled, 2 e2m1, offset by 12). */
AI __m256 qi_ld8_e8m0h(const uint8_t *s, int g0, int i)
{
    __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + g0 + i)));
    __m256i z = _mm256_cmpeq_epi32(d, _mm256_setzero_si256());
    __m256 v = _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(d, 23),
                                                      _mm256_set1_epi32(0x00400000), z));
    return _mm256_mul_ps(v, _mm256_set1_ps(0.5f));
}

/* mxfp4 rows for 4 rows of one chunk: m[j][g] = e8m0(s_j[g0 + g]) / 2 for g < n (then 16
 * zeros), and bias[j] = sum_g (-12 xsq[g]) m[j][g], which takes back the +12 of each code in
 * qi4_step (xsq: the groups' sums of x as rounded, from the preparation). */
AI void qi_row_terms_fp4(float m[4][QI_NG], float bias[4], const uint8_t *const rs[4],
                         const float *xsq, int g0, int n)
{
    for (int j = 0; j < 4; j++) {
        __m256 b = _mm256_setzero_ps();
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 mv = qi_ld8_e8m0h(rs[j], g0, i);
            _mm256_storeu_ps(m[j] + i, mv);
            b = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(xsq + i), _mm256_set1_ps(-12.0f)), mv, b);
        }
        bias[j] = qi_hsum(b);
        for (; i < n; i++) {
            m[j][i] = kern_e8m0(rs[j][g0 + i]) * 0.5f;
            bias[j] += xsq[i] * -12.0f * m[j][i];
        }
        _mm256_storeu_ps(m[j] + n, _mm256_setzero_ps());
        _mm256_storeu_ps(m[j] + n + 8, _mm256_setzero_ps());
    }
}

/* For 4 rows of one chunk and one token: m[j][g] = ws_j[g0 + g] xs[g] for
 * g < n (then 16 zeros) and bias[j] = sum_g b_j[g0 + g] xsum[g], in one pass
 * that loads each x-side vector once for the 4 rows. */
AI void qi_row_terms(float m[4][QI_NG], float bias[4], const uint8_t *const rs[4],
                     const uint8_t *const rb[4], const enum dtype dt, int g0, const float *xs,
                     const float *xsum, int n)
{
    __m256 bacc[4];
    for (int j = 0; j < 4; j++)
        bacc[j] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(xs + i), sv = _mm256_loadu_ps(xsum + i);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            _mm256_storeu_ps(m[j] + i, _mm256_mul_ps(qi_ld8(rs[j], dt, g0, i), xv));
            bacc[j] = _mm256_fmadd_ps(qi_ld8(rb[j], dt, g0, i), sv, bacc[j]);
        }
    }
    for (int j = 0; j < 4; j++) {
        bias[j] = qi_hsum(bacc[j]);
        for (int g = i; g < n; g++) {
            m[j][g] = kern_ld(rs[j], dt, (size_t)(g0 + g)) * xs[g];
            bias[j] += kern_ld(rb[j], dt, (size_t)(g0 + g)) * xsum[g];
        }
        _mm256_storeu_ps(m[j] + n, _mm256_setzero_ps());
        _mm256_storeu_ps(m[j] + n + 8, _mm256_setzero_ps());
    }
}

/* The 4 rows of a block starting at r0 (nr <= 4 real rows; the missing ones
 * repeat the last): their code rows at column c0, scales and biases. */
AI void qi_rows(const uint8_t *rw[4], const uint8_t *rs[4], const uint8_t *rb[4],
                const struct wmat *w, int r0, int nr, int c0)
{
    for (int j = 0; j < 4; j++) {
        int r = r0 + (j < nr ? j : nr - 1);
        rw[j] = w->data + (size_t)r * w->row_bytes + (size_t)c0 * w->qbits / 8;
        rs[j] = w->qs + (size_t)r * w->qrow_bytes;
        rb[j] = w->qb ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    }
}

/* Token t's prepared x for the chunk of codes from c0 (groups g0 .. g0 + gn):
 * the 4 rows' multipliers m[j][g] = ws xs and bias terms (qi_row_terms; for
 * mxfp4 m = ws / 2 alone and the offset's bias, qi_row_terms_fp4), and the
 * returned pointer to the chunk's codes of x. */
AI const uint8_t *qi_token(float m[4][QI_NG], float bias[4], const uint8_t *const rs[4],
                           const uint8_t *const rb[4], const struct wmat *w, const uint8_t *xq,
                           size_t ldxq, int t, int c0, int g0, int gn)
{
    const size_t hdr = kern_qi_hdr(w);
    const uint8_t *xt = xq + (size_t)t * ldxq;
    const float *xs = (const float *)xt + g0, *xsum = (const float *)(xt + hdr) + g0;
    if (w->qmode == QMODE_MXFP4) {
        qi_row_terms_fp4(m, bias, rs, xsum, g0, gn);
        return xt + 2 * hdr + 2 * (size_t)c0;
    }
    switch (w->qsdt) {
    case DTYPE_BF16: qi_row_terms(m, bias, rs, rb, DTYPE_BF16, g0, xs, xsum, gn); break;
    case DTYPE_F16: qi_row_terms(m, bias, rs, rb, DTYPE_F16, g0, xs, xsum, gn); break;
    default: qi_row_terms(m, bias, rs, rb, DTYPE_F32, g0, xs, xsum, gn); break;
    }
    return xt + 2 * hdr + 2 * (size_t)c0;
}

/* y[t][r0 + j] for the block's nr real rows: v[j] plus the bias term, added to
 * what earlier chunks of codes left there (c0 > 0) or written (c0 == 0). */
AI void qi_store(float *y, size_t ldy, int t, int r0, int nr, int c0, const float v[4],
                 const float bias[4])
{
    for (int j = 0; j < nr; j++) {
        float *yo = y + (size_t)t * ldy + (size_t)(r0 + j);
        *yo = c0 ? *yo + v[j] + bias[j] : v[j] + bias[j];
    }
}
