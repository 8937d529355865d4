/*
 * kern_avx2_qi: the integer quantized matvec (kern.h, "qi") at AVX2, for
 * affine 4-bit and 8-bit weights in groups of 32, 64 or 128, and mxfp4.
 *
 * The f32 matvec of kern_avx2.c spends about four vector ops per 8 weights
 * (unpack, convert, FMA); at 2 threads on a Zen 4 host that made 4-bit decode
 * compute-bound at a third of the memory bandwidth. Here x arrives as 16-bit
 * integers per group (qi_prep), and the products are integer:
 *
 *   4-bit  32 bytes of codes per step (64 codes). AND and shift+AND split
 *          the low and high nibbles (codes 2b and 2b+1 of byte b) into two
 *          vectors of 32 unsigned bytes; x comes as two int8 limbs per
 *          element (q = 256 hi + lo) in the same even/odd order, so
 *          vpmaddubsw forms code * limb pair sums (at most 2 * 15 * 128, no
 *          saturation), two of which are added in 16 bits before vpmaddwd
 *          widens them with the limb weights 256 and 1.
 *   8-bit  vpmovzxbw widens 16 codes to words and vpmaddwd multiplies them
 *          by q (natural order) into 32-bit pair sums.
 *   mxfp4  the 4-bit split, then a vpshufb table turns each e2m1 code into
 *          its value doubled plus 12 (0..24, exact unsigned bytes), against
 *          the same limbs as 4-bit affine; the offset comes back as a bias
 *          term, -12 x the group's sum of x as rounded (qi4_step). The
 *          e8m0 scale is applied after x's.
 *
 * Per group the exact int32 sum becomes f32 once: acc += cvt(I) ws_g xs_g;
 * the bias term b_g sum(x_g) is one dot per row at the end. Four rows share
 * each load of x; with several tokens the four rows' chunk of codes is read
 * again from L1 per token.
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern_qi.h"

static bool a2_qi_ok(const struct wmat *w)
{
    if (w->qmode == QMODE_MXFP4)
        return w->qbits == 4 && w->qgroup == 32 && w->in % 32 == 0;
    return w->qmode == QMODE_AFFINE && (w->qbits == 4 || w->qbits == 8) &&
           (w->qgroup == 32 || w->qgroup == 64 || w->qgroup == 128) && w->in % w->qgroup == 0;
}

// ---- preparing x ----

/* Group g's scale, sum and 16-bit codes (natural order into q16[0 .. G)). */
static void qi_group(float *xs, float *xsum, int16_t *q16, const float *x, int G)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
    for (int i = 0; i < G; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        mx = _mm256_max_ps(mx, _mm256_and_ps(v, absm));
        sm = _mm256_add_ps(sm, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float m = _mm_cvtss_f32(m4), s = qi_hsum(sm);
    *xsum = s;
    /* a NaN or infinity anywhere makes the sum non-finite (max_ps drops NaN); a
     * group below 2^-100 counts as zero (its scale would leave the f32 range,
     * and its products are far below any output's rounding) */
    if (!(fabsf(s) <= FLT_MAX) || m < 0x1p-100f) {
        *xs = fabsf(s) <= FLT_MAX ? 0.0f : NAN;
        memset(q16, 0, (size_t)G * sizeof *q16);
        return;
    }
    *xs = m / (float)KERN_QI_QMAX;
    const __m256 inv = _mm256_set1_ps((float)KERN_QI_QMAX / m);
    for (int i = 0; i < G; i += 16) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), inv));
        /* packs interleaves 128-bit halves: restore natural order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(q16 + i), p);
    }
}

/* 64 codes q16 (natural order) as the 4-bit step reads them: 32 int8 each
 * of [hi even | hi odd | lo even | lo odd], q = 256 hi + lo. */
static void qi_limbs(uint8_t *dst, const int16_t *q16)
{
    /* within each 128-bit lane: even bytes to the low 8, odd to the high 8 */
    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                        4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i h8[2], l8[2];
    for (int u = 0; u < 2; u++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(q16 + 32 * u)),
                b = _mm256_loadu_si256((const __m256i *)(q16 + 32 * u + 16));
        __m256i ha = _mm256_srai_epi16(_mm256_add_epi16(a, _mm256_set1_epi16(128)), 8),
                hb = _mm256_srai_epi16(_mm256_add_epi16(b, _mm256_set1_epi16(128)), 8);
        __m256i la = _mm256_sub_epi16(a, _mm256_slli_epi16(ha, 8)),
                lb = _mm256_sub_epi16(b, _mm256_slli_epi16(hb, 8));
        /* packs interleaves 128-bit halves; 0xd8 restores natural order, then
         * the byte shuffle and a second 0xd8 give [even 16 | odd 16] */
        h8[u] = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(ha, hb), 0xd8), eo), 0xd8);
        l8[u] = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_permute4x64_epi64(_mm256_packs_epi16(la, lb), 0xd8), eo), 0xd8);
    }
    _mm256_storeu_si256((__m256i *)dst, _mm256_permute2x128_si256(h8[0], h8[1], 0x20));
    _mm256_storeu_si256((__m256i *)(dst + 32), _mm256_permute2x128_si256(h8[0], h8[1], 0x31));
    _mm256_storeu_si256((__m256i *)(dst + 64), _mm256_permute2x128_si256(l8[0], l8[1], 0x20));
    _mm256_storeu_si256((__m256i *)(dst + 96), _mm256_permute2x128_si256(l8[0], l8[1], 0x31));
}

/* The integer sum of G 16-bit codes (|sum| <= 128 x 32639: exact in f32). */
static int qi_sum16(const int16_t *q16, int G)
{
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < G; i += 16)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(q16 + i)),
                                                  _mm256_set1_epi16(1)));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

/* One token's x as kern.h lays it out: 8-bit W takes q16 in natural order;
 * 4-bit W takes per 64 elements the limbs of qi_limbs (element 2b + parity
 * of the chunk at byte b of the even / odd part). */
static void a2_qi_prep(uint8_t *dst, const float *x, const struct wmat *w)
{
    const int in = w->in, G = w->qgroup, ng = in / G;
    const size_t hdr = kern_qi_hdr(w), in_pad = ((size_t)in + 127) / 128 * 128;
    float *xs = (float *)dst, *xsum = (float *)(dst + hdr);
    uint8_t *q = dst + 2 * hdr;
    memset(xs + ng, 0, hdr - (size_t)ng * sizeof *xs);
    memset(xsum + ng, 0, hdr - (size_t)ng * sizeof *xsum);
    if (w->qbits == 8) {
        for (int g = 0; g < ng; g++)
            qi_group(xs + g, xsum + g, (int16_t *)q + (size_t)g * G, x + (size_t)g * G, G);
        memset(q + 2 * (size_t)in, 0, 2 * (in_pad - (size_t)in));
        return;
    }
    /* 4-bit: spans of max(G, 64) elements (two groups of 32 fill one step) */
    int16_t tmp[128] __attribute__((aligned(32)));
    const int span = G < 64 ? 64 : G;
    for (int e0 = 0; e0 < in; e0 += span) {
        int n = in - e0 < span ? in - e0 : span;
        for (int k = 0; k < n; k += G) {
            const int g = (e0 + k) / G;
            qi_group(xs + g, xsum + g, tmp + k, x + e0 + k, G);
            if (w->qmode == QMODE_MXFP4) /* the offset term's sum: x as rounded */
                xsum[g] = xs[g] * (float)qi_sum16(tmp + k, G);
        }
        if (n < 64) /* a lone group of 32 closes the row: zero the step's other half */
            memset(tmp + 32, 0, 32 * sizeof *tmp);
        for (int k = 0; k < n; k += 64)
            qi_limbs(q + 2 * (size_t)(e0 + k), tmp + k);
    }
    size_t done = ((size_t)in + 63) / 64 * 64;
    memset(q + 2 * done, 0, 2 * (in_pad - done));
}

// ---- the matvec ----

/* The multiplier of the 8 int32 lanes of a step starting at code k: one
 * group's ws xs, or for groups of 32 at 4 bits [m_g x4, m_g+1 x4]. */
AI __m256 qi_mul(const float *m, int k, const int G, const int bits)
{
    if (bits == 4 && G == 32)
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(m + k / 32),
                                        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    return _mm256_set1_ps(m[k / G]);
}

/* 4-bit step: codes k .. k+64 of 4 rows against prepared x chunk xc.
 * mxfp4 (fp4; xs: x's group scales; G = 32): a vpshufb table between the nibbles and
 * vpmaddubsw makes each e2m1 code 2 e2m1 + 12 (0..24, unsigned), so the int32 sums carry
 * 12 x the codes' x sum, which the bias term takes back (qi_row_terms_fp4). Those sums meet
 * x's scales (lanes 0-3 group g, 4-7 group g+1) and then the rows' e8m0 / 2 (m): the power
 * of two last, so a subnormal scale rounds once, as in the f32 path. */
AI void qi4_step(__m256 acc[4], const uint8_t *const rw[4], int k, const int nv, const uint8_t *xc,
                 const float *const m[4], const size_t pf, const int G, const bool fp4,
                 const float *xs, const int L)
{
    const __m256i m0f = _mm256_set1_epi8(0x0f), c256 = _mm256_set1_epi16(256),
                  one = _mm256_set1_epi16(1),
                  tv = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12,
                                        13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i xhe = _mm256_loadu_si256((const __m256i *)xc),
                  xho = _mm256_loadu_si256((const __m256i *)(xc + 32)),
                  xle = L == 2 ? _mm256_loadu_si256((const __m256i *)(xc + 64)) : xhe,
                  xlo = L == 2 ? _mm256_loadu_si256((const __m256i *)(xc + 96)) : xho;
    __m256 xsm = _mm256_setzero_ps();
    if (fp4)
        xsm = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(xs + k / 32)),
                                   _mm_broadcast_ss(xs + k / 32 + (nv == 64)), 1);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const uint8_t *p = rw[j] + k / 2;
        if (pf)
            _mm_prefetch((const char *)p + pf, _MM_HINT_T1);
        __m256i v = nv == 64 ? _mm256_loadu_si256((const __m256i *)p)
                             : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)p));
        __m256i lo = _mm256_and_si256(v, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
        if (fp4) {
            lo = _mm256_shuffle_epi8(tv, lo);
            hi = _mm256_shuffle_epi8(tv, hi);
        }
        __m256i a1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xhe), _mm256_maddubs_epi16(hi, xho));
        __m256i i32 = _mm256_madd_epi16(a1, c256);
        if (L == 2) { /* the low limb; --fast (L 1) takes the high limb alone */
            __m256i a2 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xle), _mm256_maddubs_epi16(hi, xlo));
            i32 = _mm256_add_epi32(i32, _mm256_madd_epi16(a2, one));
        }
        __m256 f = _mm256_cvtepi32_ps(i32);
        acc[j] = _mm256_fmadd_ps(fp4 ? _mm256_mul_ps(f, xsm) : f, qi_mul(m[j], k, G, 4), acc[j]);
    }
}

/* 8-bit group: codes k .. k+G of 4 rows against q16 (natural order). */
AI void qi8_step(__m256 acc[4], const uint8_t *const rw[4], int k, const int16_t *q16,
                 const float *const m[4], const size_t pf, const int G)
{
    __m256i s[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        s[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int kk = 0; kk < G; kk += 16) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(q16 + k + kk));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const uint8_t *p = rw[j] + k + kk;
            if (pf && !(kk & 63))
                _mm_prefetch((const char *)p + pf, _MM_HINT_T1);
            __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
            s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(wv, xv));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), qi_mul(m[j], k, G, 8), acc[j]);
}

/* One 8-bit row's sum over the chunk (cn codes at rw) for one token (q16), one row at a
 * time: the rows are then one sequential stream (as the float matvec's mv_row); the same
 * integers and f32 order as qi8_step gives the row among 4 (llama-1b 8-bit tg128 on these
 * kernels, whole-process pairs: 0.91, 0.90 and 0.95x the time, medians of 6-8). Not for
 * several tokens, whose rows come from L1 where 4 rows share each load of x (this function
 * for them took 1.09-1.10x the time at 8 and 24 tokens), nor for 4-bit, which is bound by
 * its instructions once each row reloads x (1.05x). */
AI float qi8_row(const uint8_t *rw, int cn, const int16_t *q16, const float *m, const size_t pf,
                 const int G)
{
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < cn; k += G) {
        __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int kk = 0; kk < G; kk += 16) {
            const uint8_t *p = rw + k + kk;
            if (!(kk & 63))
                _mm_prefetch((const char *)p + pf, _MM_HINT_T1);
            __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(q16 + k + kk))));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), qi_mul(m, k, G, 8), acc);
    }
    return qi_hsum(acc);
}

/* Bytes ahead prefetched (into L2) in each weight row by the first token: the same offset
 * 8 rows on, at most 32 KiB; faster than 4 rows into L1 (kern_qi.h's qi_pf_dist), and L2
 * keeps the lines out of a 32 KiB L1 (ADR 0055, "Measurements moved out of the kernels"). */
#define QI2_PF_MAX 32768
AI size_t qi2_pf_dist(const struct wmat *w)
{
    return 8 * w->row_bytes < QI2_PF_MAX ? 8 * w->row_bytes : QI2_PF_MAX;
}

/* The scales and biases of the next block of 4 rows for the chunk from group g0 (gn groups),
 * asked for while this block's codes stream: each block's first token widens them before
 * reading a code. */
AI void qi_pf_next_sb(const struct wmat *w, int r0, int g0, int gn)
{
    const size_t ssz = dtype_size(w->qsdt), o = (size_t)g0 * ssz, len = (size_t)gn * ssz;
    for (int j = 4; j < 8 && r0 + j < w->out; j++) {
        const size_t r = (size_t)(r0 + j) * w->qrow_bytes + o;
        for (size_t l = 0; l < len; l += 64) {
            _mm_prefetch((const char *)w->qs + r + l, _MM_HINT_T0);
            if (w->qb)
                _mm_prefetch((const char *)w->qb + r + l, _MM_HINT_T0);
        }
    }
}

/* Rows r0 .. r0+nr (nr <= 4; a missing row repeats the last) for every token. */
AI void qi_block(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                 const struct wmat *w, int r0, int nr, const int bits, const int G, const bool fp4,
                 const int L)
{
    const int in = w->in;
    const size_t pfd = qi2_pf_dist(w);
    const uint8_t *rw[4], *rs[4], *rb[4];
    float mb[4][QI_NG];
    const float *const m[4] = {mb[0], mb[1], mb[2], mb[3]};
    for (int c0 = 0; c0 < in; c0 += QI_CH) {
        const int cn = in - c0 < QI_CH ? in - c0 : QI_CH, g0 = c0 / G, gn = cn / G;
        qi_rows(rw, rs, rb, w, r0, nr, c0);
        qi_pf_next_sb(w, r0, g0, gn);
        for (int t = 0; t < n_tok; t++) {
            float bias[4], v[4];
            const uint8_t *xc = qi_token(mb, bias, rs, rb, w, xq, ldxq, t, c0, g0, gn);
            if (bits == 8 && n_tok == 1) { /* one row at a time: one stream (qi8_row) */
                for (int j = 0; j < nr; j++)
                    v[j] = qi8_row(rw[j], cn, (const int16_t *)xc, m[j], pfd, G);
                qi_store(y, ldy, t, r0, nr, c0, v, bias);
                continue;
            }
            __m256 acc[4];
            for (int j = 0; j < 4; j++)
                acc[j] = _mm256_setzero_ps();
            /* the first token streams the rows from memory (prefetching), the rest
             * re-read them from L1; a 4-bit row may end in half a step (32 codes) */
            if (bits == 4) {
                const int kf = cn & ~63;
                const float *xs = fp4 ? (const float *)(xq + (size_t)t * ldxq) + g0 : NULL;
                if (t == 0)
                    for (int k = 0; k < kf; k += 64)
                        qi4_step(acc, rw, k, 64, xc + 2 * (size_t)k, m, pfd, G, fp4, xs, L);
                else
                    for (int k = 0; k < kf; k += 64)
                        qi4_step(acc, rw, k, 64, xc + 2 * (size_t)k, m, 0, G, fp4, xs, L);
                if (kf < cn)
                    qi4_step(acc, rw, kf, 32, xc + 2 * (size_t)kf, m, 0, G, fp4, xs, L);
            } else if (t == 0) {
                for (int k = 0; k < cn; k += G)
                    qi8_step(acc, rw, k, (const int16_t *)xc, m, pfd, G);
            } else {
                for (int k = 0; k < cn; k += G)
                    qi8_step(acc, rw, k, (const int16_t *)xc, m, 0, G);
            }
            for (int j = 0; j < 4; j++)
                v[j] = qi_hsum(acc[j]);
            qi_store(y, ldy, t, r0, nr, c0, v, bias);
        }
    }
}

/* Rows r0 .. r1 for every token, 4 rows at a time, each 4 over all the tokens. */
static void qi_rows_all(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                        const struct wmat *w, int r0, int r1)
{
#define QI_BLOCK(B, G) qi_block(y, ldy, xq, ldxq, n_tok, w, r, nr, B, G, false, 2)
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        if (w->qmode == QMODE_MXFP4) {
            qi_block(y, ldy, xq, ldxq, n_tok, w, r, nr, 4, 32, true, 2);
            continue;
        }
        switch (w->qbits * 1000 + w->qgroup) {
        case 4032: QI_BLOCK(4, 32); break;
        case 4064: QI_BLOCK(4, 64); break;
        case 4128: QI_BLOCK(4, 128); break;
        case 8032: QI_BLOCK(8, 32); break;
        case 8064: QI_BLOCK(8, 64); break;
        default: QI_BLOCK(8, 128); break;
        }
    }
#undef QI_BLOCK
}

/* 4-bit rows against many tokens (ADR 0145): the rows in stretches of QI_RS, each stretch over
 * the tokens in blocks of QI_TB, so that a block's x (QI_TB x in x 2 bytes) serves every 4-row
 * block of the stretch from L2 and the stretch's codes (QI_RS x in / 2 bytes) serve every token
 * block from L2, instead of all the tokens' x streaming from L3 or memory once per 4 rows.
 * Every output is the same qi_block sum as before, so the results are the same to the bit. */
#define QI_TB 32
#define QI_RS 64
void kern_avx2_matvec_qi(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                         const struct wmat *w, int r0, int r1)
{
    if (w->qbits != 4 || n_tok <= QI_TB) {
        qi_rows_all(y, ldy, xq, ldxq, n_tok, w, r0, r1);
        return;
    }
    for (int rs = r0; rs < r1; rs += QI_RS) {
        const int re = r1 - rs < QI_RS ? r1 : rs + QI_RS;
        for (int tb = 0; tb < n_tok; tb += QI_TB)
            qi_rows_all(y + (size_t)tb * ldy, ldy, xq + (size_t)tb * ldxq, ldxq,
                        n_tok - tb < QI_TB ? n_tok - tb : QI_TB, w, rs, re);
    }
}

/* --fast (ADR 0031): affine 4-bit W by x's high limb alone (q = 256 hi: an int8 per code
 * and group), half the byte products; every other W as kern_avx2_matvec_qi. */
static void a2_matvec_qi_fast(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                              const struct wmat *w, int r0, int r1)
{
    if (w->qmode != QMODE_AFFINE || w->qbits != 4) {
        kern_avx2_matvec_qi(y, ldy, xq, ldxq, n_tok, w, r0, r1);
        return;
    }
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        switch (w->qgroup) {
        case 32: qi_block(y, ldy, xq, ldxq, n_tok, w, r, nr, 4, 32, false, 1); break;
        case 64: qi_block(y, ldy, xq, ldxq, n_tok, w, r, nr, 4, 64, false, 1); break;
        default: qi_block(y, ldy, xq, ldxq, n_tok, w, r, nr, 4, 128, false, 1); break;
        }
    }
}

/* Affine 4-bit W stays on this matvec at every token count, prefill included: faster than
 * the f32 GEMM on panels widened from the codes (ADR 0025 item 8; 8-bit was even, so it
 * keeps the GEMM), and a token's outputs then do not depend on how many share its call. */
static bool a2_qi_any_tok(const struct wmat *w)
{
    return w->qmode == QMODE_AFFINE && w->qbits == 4;
}

void kern_avx2_qi_init(struct cpu_kernels *k)
{
    k->qi_any_tok = a2_qi_any_tok;
    k->qi_ok = a2_qi_ok;
    k->qi_prep = a2_qi_prep;
    k->matvec_qi = kern_avx2_matvec_qi;
    k->matvec_qi_fast = a2_matvec_qi_fast;
    k->gemm_min_tok_qi = LP_A2_GEMM_QI;
}

#else

void kern_avx2_qi_init(struct cpu_kernels *k)
{
    (void)k;
}

#endif
