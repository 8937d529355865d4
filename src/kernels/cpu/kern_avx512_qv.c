/*
 * kern_avx512_qv: the VNNI integer matvec of rows in their stored layout, four rows a
 * block for every token (the plan's vnni.qv_block: decode, and 8-bit or unrepacked W at
 * a few tokens), from the x kern_avx2_qi.c prepares.
 *
 *   4-bit  64 bytes of codes per step (128 codes, two of kern_avx2_qi's
 *          64-code chunks side by side in the two 256-bit halves). The low
 *          and high nibbles go straight into vpdpbusd (unsigned code times
 *          signed limb, four products summed into each int32 lane), one
 *          accumulator per limb: I = (hi << 8) + lo per lane, exact.
 *   8-bit  vpmovzxbw widens 32 codes to words and vpdpwssd multiplies them
 *          by q and accumulates, per group.
 *
 * Lane l of a 4-bit step holds codes of one group: bytes 4l .. 4l+3 of its
 * half, so the per-lane multiplier vector repeats m_g over 4, 8 or 16 lanes.
 */
#include "kern.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kern_qi.h"

/* The prepared x of 128 codes at xc (two 64-code chunks of 128 bytes):
 * limb part o (0 hi even, 1 hi odd, 2 lo even, 3 lo odd) of both chunks. */
AI __m512i qx_pair(const uint8_t *xc, int o)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)(xc + 32 * o)),
            b = _mm256_loadu_si256((const __m256i *)(xc + 128 + 32 * o));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* The multiplier of each int32 lane of a 4-bit step at code k. */
AI __m512 qv_mul4(const float *m, int k, const int G)
{
    if (G == 32)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                     _mm512_loadu_ps(m + k / 32));
    if (G == 64)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                     _mm512_loadu_ps(m + k / 64));
    return _mm512_set1_ps(m[k / 128]);
}

/* 4-bit step: codes k .. k+nc (nc <= 128, a multiple of 32) of 4 rows. */
AI void qv4_step(__m512 acc[4], const uint8_t *const rw[4], int k, int nc, const uint8_t *xc,
                 const float *const m[4], const size_t pf, const int G, const int L)
{
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i xhe = qx_pair(xc, 0), xho = qx_pair(xc, 1);
    const __m512i xle = L == 2 ? qx_pair(xc, 2) : xhe, xlo = L == 2 ? qx_pair(xc, 3) : xho;
    const __mmask64 ld = nc == 128 ? ~0ull : (1ull << (nc / 2)) - 1;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const uint8_t *p = rw[j] + k / 2;
        if (pf)
            _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
        __m512i v = nc == 128 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(ld, p);
        __m512i lo = _mm512_and_si512(v, m0f), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
        __m512i ih = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xhe), hi, xho);
        __m512i i32 = _mm512_slli_epi32(ih, 8);
        if (L == 2) /* the low limb; --fast (L 1) takes the high limb alone */
            i32 = _mm512_add_epi32(i32, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xle),
                                                            hi, xlo));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32), qv_mul4(m[j], k, G), acc[j]);
    }
}

/* 8-bit group: codes k .. k+G of 4 rows against q16 (natural order). */
AI void qv8_step(__m512 acc[4], const uint8_t *const rw[4], int k, const int16_t *q16,
                 const float *const m[4], const size_t pf, const int G)
{
    __m512i s[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        s[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int kk = 0; kk < G; kk += 32) {
        __m512i xv = _mm512_loadu_si512(q16 + k + kk);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const uint8_t *p = rw[j] + k + kk;
            if (pf && !(kk & 63))
                _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
            __m512i wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
            s[j] = _mm512_dpwssd_epi32(s[j], wv, xv);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), _mm512_set1_ps(m[j][k / G]), acc[j]);
}

/* Rows r0 .. r0+nr (nr <= 4) for every token (see kern_avx2_qi.c qi_block). */
AI void qv_block(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                 const struct wmat *w, int r0, int nr, const int bits, const int G, const int L)
{
    const int in = w->in;
    const size_t pfd = qi_pf_dist(w);
    const uint8_t *rw[4], *rs[4], *rb[4];
    float mb[4][QI_NG];
    const float *const m[4] = {mb[0], mb[1], mb[2], mb[3]};
    for (int c0 = 0; c0 < in; c0 += QI_CH) {
        const int cn = in - c0 < QI_CH ? in - c0 : QI_CH, g0 = c0 / G, gn = cn / G;
        qi_rows(rw, rs, rb, w, r0, nr, c0);
        for (int t = 0; t < n_tok; t++) {
            float bias[4];
            const uint8_t *xc = qi_token(mb, bias, rs, rb, w, xq, ldxq, t, c0, g0, gn);
            __m512 acc[4];
            for (int j = 0; j < 4; j++)
                acc[j] = _mm512_setzero_ps();
            if (bits == 4) {
                const int kf = cn & ~127;
                if (t == 0)
                    for (int k = 0; k < kf; k += 128)
                        qv4_step(acc, rw, k, 128, xc + 2 * (size_t)k, m, pfd, G, L);
                else
                    for (int k = 0; k < kf; k += 128)
                        qv4_step(acc, rw, k, 128, xc + 2 * (size_t)k, m, 0, G, L);
                if (kf < cn)
                    qv4_step(acc, rw, kf, cn - kf, xc + 2 * (size_t)kf, m, 0, G, L);
            } else if (t == 0) {
                for (int k = 0; k < cn; k += G)
                    qv8_step(acc, rw, k, (const int16_t *)xc, m, pfd, G);
            } else {
                for (int k = 0; k < cn; k += G)
                    qv8_step(acc, rw, k, (const int16_t *)xc, m, 0, G);
            }
            float v[4];
            for (int j = 0; j < 4; j++)
                v[j] = _mm512_reduce_add_ps(acc[j]);
            qi_store(y, ldy, t, r0, nr, c0, v, bias);
        }
    }
}

QI_NOSAN void kern_avx512_qv_rows(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                                  const struct wmat *w, int r0, int r1, int L)
{
#define QV_BLOCK(B, G, L) qv_block(y, ldy, xq, ldxq, n_tok, w, r, nr, B, G, L)
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        if (L == 1) /* --fast, 4-bit only */
            switch (w->qgroup) {
            case 32: QV_BLOCK(4, 32, 1); break;
            case 64: QV_BLOCK(4, 64, 1); break;
            default: QV_BLOCK(4, 128, 1); break;
            }
        else
            switch (w->qbits * 1000 + w->qgroup) {
            case 4032: QV_BLOCK(4, 32, 2); break;
            case 4064: QV_BLOCK(4, 64, 2); break;
            case 4128: QV_BLOCK(4, 128, 2); break;
            case 8032: QV_BLOCK(8, 32, 2); break;
            case 8064: QV_BLOCK(8, 64, 2); break;
            default: QV_BLOCK(8, 128, 2); break;
            }
    }
#undef QV_BLOCK
}

#endif
