/*
 * kern_avx2: AVX2 + FMA + F16C kernels (8 f32 lanes). Compiled with those
 * target flags (CMakeLists.txt); only called after dispatch.c has checked
 * CPUID and XCR0. The avx512 variant overlays this table, so any entry it
 * does not implement runs these.
 *
 * Same designs as kern_avx512.c at half the width: weights widened exactly
 * in registers (bf16: zero-extend + shift 16; f16: vcvtph2ps), f32
 * accumulation in independent registers. AVX2 has no 16-bit masked loads
 * and masked stores are slow on AMD, so tails run scalar.
 *
 *   matvec   4 weight rows x 16 inputs per step (8 accumulators); quantized
 *            rows of every MLX mode in the lane order of kern_avx512.c at
 *            8 lanes, s*sum(v(q) x) per lane-group + b*sum(x) per group;
 *            float rows for 2 to 7 tokens 2 rows x 2 tokens at a time, each
 *            piece widened once (docs/adr/0032)
 *   ukernel  6 tokens x 16 outputs (12 ymm accumulators), packed panel
 *   exp      Cephes expf polynomial, 2^n built in the exponent field
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 elements p[i..i+8) of a float dtype widened to f32. */
AI __m256 ld8(const void *p, enum dtype dt, size_t i)
{
    if (dt == DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

// ---- weights ----

AI void to_f32_t(float *dst, const void *src, enum dtype dt, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = ld8(src, dt, i), v1 = ld8(src, dt, i + 8);
        _mm256_storeu_ps(dst + i, v0);
        _mm256_storeu_ps(dst + i + 8, v1);
    }
    for (; i < n; i++)
        dst[i] = kern_ld(src, dt, i);
}

static void a2_to_f32(float *dst, const void *src, enum dtype dt, size_t n)
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

// ---- matvec ----

/* Bytes ahead prefetched in each weight row: the same offset of the next
 * block of 4 rows, at most 16 KiB (as kern_qi.h measured for quantized rows). */
#ifndef MV_PF_MAX
#define MV_PF_MAX 16384
#endif

/* Row r for one token, one row at a time: the matrix is then one sequential stream, which
 * the hardware prefetcher follows across rows; four rows side by side were four streams a
 * page apart, and slower (ADR 0036). Two accumulators (even and odd pieces of 8), hsum,
 * then the scalar tail. */
AI void mv_row(float *y, const float *x, const struct wmat *w, int r, enum dtype dt)
{
    const void *wr = w->data + (size_t)r * w->row_bytes;
    const int in = w->in;
    const size_t es = dt == DTYPE_F32 ? 4 : 2;
    const size_t pfd = 4 * w->row_bytes < MV_PF_MAX ? 4 * w->row_bytes : MV_PF_MAX;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= in; i += 16) {
        if (!((size_t)i * es & 63))
            _mm_prefetch((const char *)wr + (size_t)i * es + pfd, _MM_HINT_T0);
        a0 = _mm256_fmadd_ps(ld8(wr, dt, (size_t)i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(ld8(wr, dt, (size_t)i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float v = hsum(_mm256_add_ps(a0, a1));
    for (int k = i; k < in; k++)
        v += kern_ld(wr, dt, (size_t)k) * x[k];
    y[r] = v;
}

/* Row r0 for T (<= MV_T) tokens at once: each 8-input piece of the row is
 * widened once for all T; x is read from L1 by the FMAs themselves. Every
 * token's sum is formed exactly as mv_row forms it (two accumulators, hsum,
 * the scalar tail), so a token's outputs do not depend on the tokens beside it.
 * One row by 4 tokens (8 accumulators) beat two rows by two and 6 tokens a pass
 * (ADR 0055, "Measurements moved out of the kernels"). */
#define MV_T 4
AI void mv_block_t(float *y, size_t ldy, const float *x, size_t ldx, const struct wmat *w, int r0,
                   enum dtype dt, bool pf, const int T)
{
    const void *wr = w->data + (size_t)r0 * w->row_bytes;
    int in = w->in;
    size_t es = dt == DTYPE_F32 ? 4 : 2;
    const size_t pfd = w->row_bytes < MV_PF_MAX ? w->row_bytes : MV_PF_MAX;
    __m256 a[MV_T][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        a[t][0] = a[t][1] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= in; i += 16) {
        if (pf && !((size_t)i * es & 63))
            _mm_prefetch((const char *)wr + (size_t)i * es + pfd, _MM_HINT_T0);
        __m256 w0 = ld8(wr, dt, (size_t)i), w1 = ld8(wr, dt, (size_t)i + 8);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx + i;
            a[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][0]);
            a[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), a[t][1]);
        }
    }
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * ldx;
        float v = hsum(_mm256_add_ps(a[t][0], a[t][1]));
        for (int k = i; k < in; k++)
            v += kern_ld(wr, dt, (size_t)k) * xt[k];
        y[(size_t)t * ldy + (size_t)r0] = v;
    }
}

/* Float rows [r0, r1), by the kernel the plan named (w->kid): one token a row at a time
 * (mv_row, which streams them); or up to MV_T tokens per pass over one row, which stays in
 * L1 for the next pass (mv_block_t). Only the first pass prefetches the next row. */
AI void mv_rows(float *y, size_t ldy, const float *x, size_t ldx, int n_tok, const struct wmat *w,
                int r0, int r1, enum dtype dt)
{
    if (w->kid == LK_A2_MV_ROW) {
        for (int r = r0; r < r1; r++)
            mv_row(y, x, w, r, dt);
        return;
    }
    for (int r = r0; r < r1; r++) {
        for (int t = 0; t < n_tok; t += MV_T) {
            float *yt = y + (size_t)t * ldy;
            const float *xt = x + (size_t)t * ldx;
            bool pf = t == 0;
            switch (n_tok - t < MV_T ? n_tok - t : MV_T) {
            case 1: mv_block_t(yt, ldy, xt, ldx, w, r, dt, pf, 1); break;
            case 2: mv_block_t(yt, ldy, xt, ldx, w, r, dt, pf, 2); break;
            case 3: mv_block_t(yt, ldy, xt, ldx, w, r, dt, pf, 3); break;
            default: mv_block_t(yt, ldy, xt, ldx, w, r, dt, pf, MV_T); break;
            }
        }
    }
}

AI float dot_t(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float v = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        v += a[i] * b[i];
    return v;
}

// ---- quantized weights ----

/*
 * The same two unpack orders as kern_avx512.c, at 8 lanes.
 *
 * Natural order (wrow_f32): the 8 codes c .. c+7 (c a multiple of 8) fill
 * `bits` bytes, read exactly (memcpy into a u64) and broadcast; vpshufb
 * moves the one or two bytes code i straddles into dword i, vpsrlvd aligns
 * it, an AND keeps its bits.
 *
 * Lane order (matvec): a block is 8 dword lanes of cpl consecutive codes
 * each (2/4/8-bit: one 32-byte load; 3/6-bit: 3 bytes per lane, 5-bit: 5
 * bytes per lane pair, two 16-byte loads and one vpshufb). Blocks whose
 * loads could run past the row are copied to a zeroed buffer first.
 * Extraction j gives code cpl*i + j of every lane; x comes permuted to
 * match (a2_qxperm); lanes are weighted by a per-lane scale vector (vpermps).
 */

/* Codes per lane of the lane order. */
static inline int q_cpl(int bits)
{
    return bits == 2 ? 16 : bits == 3 || bits == 4 ? 8 : 4;
}

/* Lane-order matvec applies when every lane lies in one group (and groups
 * are powers of two, as MLX's all are). */
/* x permuted to lane order: block of B = 8 cpl codes, dst[b + 8 j + i] =
 * x[b + cpl i + j]; lanes past `in` and the padding to QX_PAD are 0. */
static void a2_qxperm(float *dst, const float *x, const struct wmat *w)
{
    int in = w->in, bits = w->qbits, group = w->qgroup;
    size_t len = kern_qx_len(in);
    if (w->qmode == QMODE_MXFP8 && !(group % 16 || (group & (group - 1)) || in % 16)) {
        /* natural order, times 2^8, which the f16 decode leaves out */
        for (int i = 0; i < in; i++)
            dst[i] = x[i] * 256.0f;
        memset(dst + in, 0, (len - (size_t)in) * sizeof *dst);
        return;
    }
    if (group % 16 || (group & (group - 1)) || in % 16) {
        memcpy(dst, x, (size_t)in * sizeof *x);
        memset(dst + in, 0, (len - (size_t)in) * sizeof *dst);
        return;
    }
    int cpl = q_cpl(bits), bc = 8 * cpl;
    for (size_t b = 0; b < len; b += (size_t)bc)
        for (int j = 0; j < cpl; j++)
            for (int i = 0; i < 8; i++) {
                size_t src = b + (size_t)(cpl * i + j);
                dst[b + (size_t)(8 * j + i)] = src < (size_t)in ? x[src] : 0.0f;
            }
}

/* One lane-order block: nb valid bytes at p, avail bytes readable from p.
 * Reads at most 32 bytes from p; from a zeroed copy of the nb bytes when
 * that would pass avail or the block is partial. */
AI __m256i qload_lanes(const uint8_t *p, const int bits, int nb, size_t avail)
{
    const int full = bits == 2 || bits == 4 || bits == 8 ? 32 : bits == 5 ? 20 : 24;
    uint8_t tmp[32] __attribute__((aligned(32)));
    if (nb < full || avail < 32) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, p, (size_t)nb);
        p = tmp;
    }
    if (bits == 2 || bits == 4 || bits == 8)
        return _mm256_loadu_si256((const __m256i *)p);
    const int sb = bits == 5 ? 10 : 12;
    __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(p + sb)),
                                 _mm_loadu_si128((const __m128i *)p));
    if (bits == 5) {
        const __m256i pat5 = _mm256_setr_epi8(0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1,
                                              0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1);
        return _mm256_srlv_epi32(_mm256_shuffle_epi8(v, pat5), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    }
    const __m256i pat3 = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                          0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    return _mm256_shuffle_epi8(v, pat3);
}

/* E4M3 byte in bits 8j .. 8j+7 of each dword -> f32 (kern_e4m3: sign to bit
 * 31, magnitude to bits 20-26, times 2^120). */
AI __m256 e4m3_ps(__m256i v, const int j)
{
    const __m256i sm = _mm256_set1_epi32((int)0x80000000u);
    __m256i sgn = _mm256_and_si256(24 - 8 * j > 0 ? _mm256_slli_epi32(v, 24 - 8 * j) : v, sm);
    __m256i mag = 20 - 8 * j > 0 ? _mm256_slli_epi32(v, 20 - 8 * j) : _mm256_srli_epi32(v, 8 * j - 20);
    mag = _mm256_and_si256(mag, _mm256_set1_epi32(0x07f00000));
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(sgn, mag)), _mm256_set1_ps(0x1p120f));
}

/* E2M1 code in bits 0-3 of each dword (higher bits ignored) -> f32: the
 * magnitude from an 8-entry vpermps table (index bits 0-2), the sign bit 3
 * moved to bit 31. */
AI __m256 e2m1_ps(__m256i t)
{
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    __m256i sgn = _mm256_and_si256(_mm256_slli_epi32(t, 28), _mm256_set1_epi32((int)0x80000000u));
    return _mm256_or_ps(_mm256_permutevar8x32_ps(mag, t), _mm256_castsi256_ps(sgn));
}

/* Values of extraction j of a lane-order block, before the group scale. */
AI __m256 qdec_lanes(__m256i v, const int bits, const int j, const enum qmode mode)
{
    if (mode == QMODE_MXFP8)
        return e4m3_ps(v, j);
    __m256i t = j ? _mm256_srli_epi32(v, bits * j) : v;
    if (mode != QMODE_AFFINE)
        return e2m1_ps(t);
    const int lane_bits = bits == 5 ? 0 : bits == 3 || bits == 6 ? 24 : 32;
    if (bits * (j + 1) != lane_bits)
        t = _mm256_and_si256(t, _mm256_set1_epi32((1 << bits) - 1));
    return _mm256_cvtepi32_ps(t);
}

/* n scales of a row (starting at group g0) as f32 into dst, and 8 zeros after. */
static void qscales_f32(float *dst, const struct wmat *w, const uint8_t *s, int g0, int n)
{
    if (w->qmode == QMODE_AFFINE) {
        a2_to_f32(dst, s + (size_t)g0 * dtype_size(w->qsdt), w->qsdt, (size_t)n);
    } else {
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + g0 + i)));
            __m256 v;
            if (w->qmode == QMODE_NVFP4) {
                v = e4m3_ps(d, 0);
            } else { /* e8m0: s << 23; 0 -> 2^-127; 255 << 23 is +inf already */
                __m256i z = _mm256_cmpeq_epi32(d, _mm256_setzero_si256());
                v = _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_slli_epi32(d, 23),
                                                           _mm256_set1_epi32(0x00400000), z));
            }
            _mm256_storeu_ps(dst + i, v);
        }
        for (; i < n; i++)
            dst[i] = kern_qscale(w, s, (size_t)(g0 + i));
    }
    _mm256_storeu_ps(dst + n, _mm256_setzero_ps());
}

/* Codes per matvec chunk (scales of 4 rows widened to the stack at a time). */
#define QCH 2048

/* Prefetch distance in each of the 4 quantized rows (t == 0 only): the same offset of the
 * next block of 4 rows, at most 16 KiB. */
AI size_t mvq_pf(const struct wmat *w)
{
    return 4 * w->row_bytes < MV_PF_MAX ? 4 * w->row_bytes : MV_PF_MAX;
}

/* mxfp8 rows go in natural order: vector jj of a 32-code block is codes
 * 8 jj .. 8 jj + 7, decoded through f16 as in kern_avx512.c (x prescaled
 * by 2^8, not permuted); 2x the lane-order bit placement in L2. (Affine
 * 8-bit stays in lane order: there natural order was slower at 8 lanes.)
 * nb valid bytes from p. */
AI __m256 qdec_e4m3_nat(const uint8_t *p, int nb)
{
    __m128i b;
    if (nb >= 8) {
        b = _mm_loadl_epi64((const __m128i *)p);
    } else {
        uint64_t u = 0;
        memcpy(&u, p, nb > 0 ? (size_t)nb : 0);
        b = _mm_cvtsi64_si128((long long)u);
    }
    __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16((short)0xbf80));
    return _mm256_cvtph_ps(h);
}

/* One lane-order block of 4 rows (see kern_avx512.c mvq_step); nb valid
 * bytes at each p[j], avail readable. */
AI void mvq_step(__m256 acc[4], const uint8_t *const p[4], int nb, size_t avail, const float *xb,
                 const float *sf[4], int gb, __m256i sidx, bool lanes, const int bits,
                 const enum qmode mode)
{
    const int cpl = q_cpl(bits);
    __m256i v[4];
    const bool nat = mode == QMODE_MXFP8;
    if (!nat)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            v[j] = qload_lanes(p[j], bits, nb, avail);
    /* one chain per row: AVX2 has 16 ymm registers (4 codes, 4 partial sums,
     * 4 accumulators, x and temporaries); two chains per row spilled */
    __m256 ga[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        ga[j] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int jj = 0; jj < cpl; jj++) {
        __m256 xj = _mm256_loadu_ps(xb + 8 * jj);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            ga[j] = _mm256_fmadd_ps(nat ? qdec_e4m3_nat(p[j] + 8 * jj, nb - 8 * jj)
                                        : qdec_lanes(v[j], bits, jj, mode),
                                    xj, ga[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256 sv = lanes ? _mm256_permutevar8x32_ps(_mm256_loadu_ps(sf[j] + gb), sidx)
                          : _mm256_set1_ps(sf[j][gb]);
        acc[j] = _mm256_fmadd_ps(sv, ga[j], acc[j]);
    }
}


/* What mvq_step multiplies with x, stored instead: the decoded codes of one block of the 4
 * rows times their lane scales, at wd[j] + 8 jj (lane order, as x is permuted). */
AI void mvq_decode(float *const wd[4], const uint8_t *const p[4], int nb, size_t avail, const float *sf[4],
                   int gb, __m256i sidx, bool lanes, const int bits, const enum qmode mode)
{
    const int cpl = q_cpl(bits);
    __m256i v[4];
    __m256 sv[4];
    const bool nat = mode == QMODE_MXFP8;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (!nat)
            v[j] = qload_lanes(p[j], bits, nb, avail);
        sv[j] = lanes ? _mm256_permutevar8x32_ps(_mm256_loadu_ps(sf[j] + gb), sidx) : _mm256_set1_ps(sf[j][gb]);
    }
#pragma GCC unroll 16
    for (int jj = 0; jj < cpl; jj++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(wd[j] + 8 * jj, _mm256_mul_ps(nat ? qdec_e4m3_nat(p[j] + 8 * jj, nb - 8 * jj)
                                                                : qdec_lanes(v[j], bits, jj, mode),
                                                            sv[j]));
}

/* Rows r0 .. r0+nr (nr <= 4) for every token; see kern_avx512.c mvq_block. With several
 * tokens (batched decode) each block is decoded once into wd and every token's products read
 * it from L1/L2: decoding, not memory, bounds this kernel at a few rows. */
AI void mvq_block(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                  const struct wmat *w, int r0, int nr, const float *xsum, size_t ldxs,
                  const int bits, const enum qmode mode)
{
    const int cpl = q_cpl(bits), bc = 8 * cpl, bb = bc * bits / 8;
    const int in = w->in, g = w->qgroup;
    const size_t rowlen = (size_t)in * bits / 8;
    const bool aff = mode == QMODE_AFFINE, lanes = bc > g;
    const int gshift = __builtin_ctz((unsigned)g); /* g is a power of two (kern_q_lanes_ok) */
    const size_t pfd = mvq_pf(w);
    const uint8_t *rw[4], *rs[4], *rb[4];
    float sfb[4][QCH / 16 + 8], bf[4][QCH / 16 + 8];
    const float *sf[4] = {sfb[0], sfb[1], sfb[2], sfb[3]};
    float wdb[4][QCH] __attribute__((aligned(32))); /* multi-token: the decoded chunk (32 KiB) */
    float *const wd[4] = {wdb[0], wdb[1], wdb[2], wdb[3]};
    __m256i sidx = _mm256_setzero_si256();
    if (lanes) {
        int ix[8];
        for (int i = 0; i < 8; i++)
            ix[i] = cpl * i / g;
        sidx = _mm256_loadu_si256((const __m256i *)ix);
    }
    for (int j = 0; j < 4; j++) {
        int r = r0 + (j < nr ? j : nr - 1);
        rw[j] = w->data + (size_t)r * w->row_bytes;
        rs[j] = w->qs + (size_t)r * w->qrow_bytes;
        rb[j] = aff ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    }
    for (int c0 = 0; c0 < in; c0 += QCH) {
        int cn = in - c0 < QCH ? in - c0 : QCH, g0 = c0 / g, gn = cn / g;
        for (int j = 0; j < 4; j++) {
            qscales_f32(sfb[j], w, rs[j], g0, gn);
            if (aff)
                qscales_f32(bf[j], w, rb[j], g0, gn);
        }
        int nblk = (cn + bc - 1) / bc;
        if (w->kid == LK_A2_MV_QUANT_M) { /* each block decoded once, reused by every token */
            for (int b = 0; b < nblk; b++) {
                size_t off = (size_t)(c0 + b * bc) * bits / 8;
                int nb = (b + 1) * bc <= cn ? bb : (cn - b * bc) * bits / 8;
                const uint8_t *p[4];
                float *wp[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    p[j] = rw[j] + off;
                    wp[j] = wd[j] + b * bc;
                    _mm_prefetch((const char *)p[j] + pfd, _MM_HINT_T0);
                }
                mvq_decode(wp, p, nb, rowlen - off, sf, (b * bc) >> gshift, sidx, lanes, bits, mode);
            }
            const int kn = nblk * bc; /* a multiple of 32: every bc is */
            /* two tokens at a time: each weight vector loaded once feeds both (4 rows x 2 tokens
             * = 8 independent FMA chains, 14 of the 16 ymm registers) */
            for (int t = 0; t < n_tok; t += 2) {
                const int nt = n_tok - t < 2 ? 1 : 2;
                const float *x0 = x + (size_t)t * ldx + c0, *x1 = x + (size_t)(t + nt - 1) * ldx + c0;
                __m256 a[4][2];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    a[j][0] = a[j][1] = _mm256_setzero_ps();
                for (int k = 0; k < kn; k += 8) {
                    __m256 xa = _mm256_loadu_ps(x0 + k), xb = _mm256_loadu_ps(x1 + k);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        __m256 wv = _mm256_loadu_ps(wd[j] + k);
                        a[j][0] = _mm256_fmadd_ps(wv, xa, a[j][0]);
                        a[j][1] = _mm256_fmadd_ps(wv, xb, a[j][1]);
                    }
                }
                for (int u = 0; u < nt; u++)
                    for (int j = 0; j < nr; j++) {
                        float v = hsum(a[j][u]);
                        if (aff)
                            v += dot_t(bf[j], xsum + (size_t)(t + u) * ldxs + g0, gn);
                        float *yo = y + (size_t)(t + u) * ldy + (size_t)(r0 + j);
                        *yo = c0 ? *yo + v : v;
                    }
            }
            continue;
        }
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx + c0;
            __m256 acc[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[j] = _mm256_setzero_ps();
            for (int b = 0; b < nblk; b++) {
                size_t off = (size_t)(c0 + b * bc) * bits / 8;
                int nb = (b + 1) * bc <= cn ? bb : (cn - b * bc) * bits / 8;
                const uint8_t *p[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    p[j] = rw[j] + off;
                    if (t == 0)
                        _mm_prefetch((const char *)p[j] + pfd, _MM_HINT_T0);
                }
                mvq_step(acc, p, nb, rowlen - off, xt + b * bc, sf, (b * bc) >> gshift, sidx, lanes,
                         bits, mode);
            }
            for (int j = 0; j < nr; j++) {
                float v = hsum(acc[j]);
                if (aff)
                    v += dot_t(bf[j], xsum + (size_t)t * ldxs + g0, gn);
                float *yo = y + (size_t)t * ldy + (size_t)(r0 + j);
                *yo = c0 ? *yo + v : v;
            }
        }
    }
}

/* Quantized rows on the lane-order path, one instantiation per (bits, mode). */
static void mv_quant(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                     const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
#define MVQ(B, M) mvq_block(y, ldy, x, ldx, n_tok, w, r, nr, xsum, ldxs, B, M)
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        switch (w->qmode) {
        case QMODE_MXFP4:
        case QMODE_NVFP4:
            MVQ(4, QMODE_MXFP4);
            break;
        case QMODE_MXFP8:
            MVQ(8, QMODE_MXFP8);
            break;
        default:
            switch (w->qbits) {
            case 2: MVQ(2, QMODE_AFFINE); break;
            case 3: MVQ(3, QMODE_AFFINE); break;
            case 4: MVQ(4, QMODE_AFFINE); break;
            case 5: MVQ(5, QMODE_AFFINE); break;
            case 6: MVQ(6, QMODE_AFFINE); break;
            default: MVQ(8, QMODE_AFFINE); break;
            }
        }
    }
#undef MVQ
}

/* Quantized rows the lane path cannot take (group not a multiple of 16):
 * dequantize 256 at a time (natural order, x not permuted), then dot. */
static void mv_qgeneric(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                        const struct wmat *w, int r0, int r1)
{
    float buf[256];
    for (int r = r0; r < r1; r++) {
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx;
            float acc = 0.0f;
            for (int c = 0; c < w->in; c += 256) {
                int len = w->in - c < 256 ? w->in - c : 256;
                kern_ref_wrow_f32(buf, w, r, c, len);
                acc += dot_t(buf, xt + c, len);
            }
            y[(size_t)t * ldy + (size_t)r] = acc;
        }
    }
}

/* Dequantize W[r, k0 .. k0+n) (k0 a multiple of 8) in natural order, 8
 * codes per step; the last step is partial. */
AI void wrow_q_t(float *dst, const struct wmat *w, int r, int k0, int n, const int bits,
                 const enum qmode mode)
{
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->qs + (size_t)r * w->qrow_bytes;
    const uint8_t *bq = w->qb ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    uint8_t pat[32];
    int sh[8];
    for (int i = 0; i < 8; i++) {
        int o = i * bits, b0 = o >> 3;
        sh[i] = o & 7;
        for (int k = 0; k < 4; k++)
            pat[4 * i + k] = k == 0 ? (uint8_t)b0 : k == 1 && b0 + 1 < 8 ? (uint8_t)(b0 + 1) : 0x80;
    }
    const __m256i vpat = _mm256_loadu_si256((const __m256i *)pat);
    const __m256i vsh = _mm256_loadu_si256((const __m256i *)sh);
    const __m256i vmask = _mm256_set1_epi32((1 << bits) - 1);
    for (int i = 0; i < n; i += 8) {
        int c = k0 + i, nc = n - i < 8 ? n - i : 8, grp = c / w->qgroup;
        uint64_t raw = 0;
        memcpy(&raw, row + (size_t)c * bits / 8, (size_t)(nc * bits + 7) / 8);
        __m256i q = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_shuffle_epi8(_mm256_set1_epi64x((long long)raw), vpat), vsh), vmask);
        __m256 v;
        if (mode == QMODE_AFFINE)
            v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(kern_ld(s, w->qsdt, (size_t)grp)),
                                _mm256_set1_ps(kern_ld(bq, w->qsdt, (size_t)grp)));
        else
            v = _mm256_mul_ps(mode == QMODE_MXFP8 ? e4m3_ps(q, 0) : e2m1_ps(q),
                              _mm256_set1_ps(kern_qscale(w, s, (size_t)grp)));
        if (nc == 8) {
            _mm256_storeu_ps(dst + i, v);
        } else {
            float t8[8];
            _mm256_storeu_ps(t8, v);
            memcpy(dst + i, t8, (size_t)nc * sizeof *dst);
        }
    }
}

/* Dequantize W[r, k0 .. k0+n) (k0 a multiple of 16). */
static void a2_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n)
{
    if (!w->qbits) {
        a2_to_f32(dst, w->data + (size_t)r * w->row_bytes + (size_t)k0 * dtype_size(w->dt), w->dt,
                  (size_t)n);
        return;
    }
    if ((k0 & 7) || w->qgroup % 8) {
        kern_ref_wrow_f32(dst, w, r, k0, n);
        return;
    }
    switch (w->qmode) {
    case QMODE_MXFP4:
    case QMODE_NVFP4:
        wrow_q_t(dst, w, r, k0, n, 4, QMODE_MXFP4);
        break;
    case QMODE_MXFP8:
        wrow_q_t(dst, w, r, k0, n, 8, QMODE_MXFP8);
        break;
    default:
        switch (w->qbits) {
        case 2: wrow_q_t(dst, w, r, k0, n, 2, QMODE_AFFINE); break;
        case 3: wrow_q_t(dst, w, r, k0, n, 3, QMODE_AFFINE); break;
        case 4: wrow_q_t(dst, w, r, k0, n, 4, QMODE_AFFINE); break;
        case 5: wrow_q_t(dst, w, r, k0, n, 5, QMODE_AFFINE); break;
        case 6: wrow_q_t(dst, w, r, k0, n, 6, QMODE_AFFINE); break;
        default: wrow_q_t(dst, w, r, k0, n, 8, QMODE_AFFINE); break;
        }
    }
}

static void a2_matvec(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                      const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
    if (w->qbits) {
        if (w->kid != LK_A2_MV_QGENERIC)
            mv_quant(y, ldy, x, ldx, n_tok, w, r0, r1, xsum, ldxs);
        else
            mv_qgeneric(y, ldy, x, ldx, n_tok, w, r0, r1);
        return;
    }
    switch (w->dt) {
    case DTYPE_BF16: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_BF16); break;
    case DTYPE_F16: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F16); break;
    default: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F32); break;
    }
}

// ---- GEMM panel ----

/* In-register 8x8 transpose: r[i] lane j <- r[j] lane i. */
AI void tr8(__m256 r[8])
{
    __m256 t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        r[i] = t[i];
}

AI void pack8(float *bp, int nr, const float *rows, size_t ldr)
{
    __m256 r[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        r[j] = _mm256_loadu_ps(rows + (size_t)j * ldr);
    tr8(r);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        _mm256_store_ps(bp + (size_t)i * nr, r[i]);
}

static void a2_pack_t(float *bp, int nr, const float *rows, size_t ldr, int nv, int kc)
{
    for (int h = 0; h < nr; h += 8) {
        int k = 0;
        if (h + 8 <= nv)
            for (; k + 8 <= kc; k += 8)
                pack8(bp + (size_t)k * nr + h, nr, rows + (size_t)h * ldr + k, ldr);
        for (; k < kc; k++)
            for (int j = h; j < h + 8; j++)
                bp[(size_t)k * nr + j] = j < nv ? rows[(size_t)j * ldr + k] : 0.0f;
    }
}

/* Panel block straight from float weights (see kern_avx512.c pack_w_t). */
AI void pack_w_t(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc,
                 enum dtype dt)
{
    const uint8_t *base = w->data + (size_t)r0 * w->row_bytes;
    for (int h = 0; h < nr; h += 8) {
        int k = 0;
        if (h + 8 <= nv) {
            for (; k + 8 <= kc; k += 8) {
                __m256 r[8];
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    r[j] = ld8(base + (size_t)(h + j) * w->row_bytes, dt, (size_t)(k0 + k));
                tr8(r);
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    _mm256_store_ps(bp + (size_t)(k + i) * nr + h, r[i]);
            }
        }
        for (; k < kc; k++)
            for (int j = h; j < h + 8; j++)
                bp[(size_t)k * nr + j] =
                    j < nv ? kern_ld(base + (size_t)j * w->row_bytes, dt, (size_t)(k0 + k)) : 0.0f;
    }
}

static void a2_pack_w(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc)
{
    switch (w->dt) {
    case DTYPE_BF16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_BF16);
        break;
    case DTYPE_F16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_F16);
        break;
    default:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_F32);
        break;
    }
}

// ---- GEMM microkernel ----

/* mr x 16 tile: c[m] (2 ymm each) += x[m, k] * bp[k, 0..16). */
AI void uk(float *y, size_t ldy, const float *x, size_t ldx, const int mr, const float *bp,
           int kc, int nv, bool acc)
{
    __m256 c[6][2];
#pragma GCC unroll 6
    for (int m = 0; m < mr; m++)
        c[m][0] = c[m][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp + (size_t)k * 16), b1 = _mm256_load_ps(bp + (size_t)k * 16 + 8);
#pragma GCC unroll 6
        for (int m = 0; m < mr; m++) {
            __m256 a = _mm256_broadcast_ss(x + (size_t)m * ldx + k);
            c[m][0] = _mm256_fmadd_ps(a, b0, c[m][0]);
            c[m][1] = _mm256_fmadd_ps(a, b1, c[m][1]);
        }
    }
#pragma GCC unroll 6
    for (int m = 0; m < mr; m++) {
        float *ym = y + (size_t)m * ldy;
        if (nv == 16) {
            if (acc) {
                c[m][0] = _mm256_add_ps(c[m][0], _mm256_loadu_ps(ym));
                c[m][1] = _mm256_add_ps(c[m][1], _mm256_loadu_ps(ym + 8));
            }
            _mm256_storeu_ps(ym, c[m][0]);
            _mm256_storeu_ps(ym + 8, c[m][1]);
        } else {
            float t[16];
            _mm256_storeu_ps(t, c[m][0]);
            _mm256_storeu_ps(t + 8, c[m][1]);
            for (int j = 0; j < nv; j++)
                ym[j] = acc ? ym[j] + t[j] : t[j];
        }
    }
}

static void a2_ukernel(float *y, size_t ldy, const float *x, size_t ldx, int mr, const float *bp,
                       int kc, int nv, bool acc)
{
    switch (mr) {
    case 6: uk(y, ldy, x, ldx, 6, bp, kc, nv, acc); break;
    case 5: uk(y, ldy, x, ldx, 5, bp, kc, nv, acc); break;
    case 4: uk(y, ldy, x, ldx, 4, bp, kc, nv, acc); break;
    case 3: uk(y, ldy, x, ldx, 3, bp, kc, nv, acc); break;
    case 2: uk(y, ldy, x, ldx, 2, bp, kc, nv, acc); break;
    default: uk(y, ldy, x, ldx, 1, bp, kc, nv, acc); break;
    }
}

// ---- vectors ----

static float a2_dot(const float *a, const float *b, int n)
{
    return dot_t(a, b, n);
}

/* The SSD recurrence (kern.h ssd_rows): 8 state elements per vector, the state row in
 * memory (L1) between rows, two accumulators for the output; a tail of N % 8 elements in
 * scalar, summed after the vectors. */
static void a2_ssd_rows(float *s, int N, const float *B, const float *C, size_t ldbc,
                        const float *x, size_t ldx, const float *dtd, size_t ldd, float *y,
                        size_t ldy, float dskip, int n)
{
    int nv = N & ~7;
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float v = x[(size_t)i * ldx], dxs = dtd[(size_t)i * ldd] * v, as = dtd[(size_t)i * ldd + 1];
        __m256 a = _mm256_set1_ps(as), dx = _mm256_set1_ps(dxs);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int m = 0;
        for (; m + 16 <= nv; m += 16) {
            __m256 s0 = _mm256_fmadd_ps(dx, _mm256_loadu_ps(b + m), _mm256_mul_ps(a, _mm256_loadu_ps(s + m)));
            __m256 s1 = _mm256_fmadd_ps(dx, _mm256_loadu_ps(b + m + 8),
                                        _mm256_mul_ps(a, _mm256_loadu_ps(s + m + 8)));
            _mm256_storeu_ps(s + m, s0);
            _mm256_storeu_ps(s + m + 8, s1);
            acc0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(c + m), acc0);
            acc1 = _mm256_fmadd_ps(s1, _mm256_loadu_ps(c + m + 8), acc1);
        }
        for (; m < nv; m += 8) {
            __m256 s0 = _mm256_fmadd_ps(dx, _mm256_loadu_ps(b + m), _mm256_mul_ps(a, _mm256_loadu_ps(s + m)));
            _mm256_storeu_ps(s + m, s0);
            acc0 = _mm256_fmadd_ps(s0, _mm256_loadu_ps(c + m), acc0);
        }
        float acc = hsum(_mm256_add_ps(acc0, acc1));
        for (; m < N; m++) {
            s[m] = as * s[m] + dxs * b[m];
            acc += s[m] * c[m];
        }
        y[(size_t)i * ldy] = acc + dskip * v;
    }
}

static void a2_axpy(float *y, float a, const float *x, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static void a2_scale(float *y, float a, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] *= a;
}

static float a2_sum(const float *x, int n)
{
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        s = _mm256_add_ps(s, _mm256_loadu_ps(x + i));
    float v = hsum(s);
    for (; i < n; i++)
        v += x[i];
    return v;
}

static float a2_sumsq(const float *x, float c, int n)
{
    __m256 s = _mm256_setzero_ps(), vc = _mm256_set1_ps(c);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc);
        s = _mm256_fmadd_ps(d, d, s);
    }
    float v = hsum(s);
    for (; i < n; i++)
        v += (x[i] - c) * (x[i] - c);
    return v;
}

AI void norm_apply_t(float *y, const float *x, float c, float a, const void *w, enum dtype wdt,
                     float w_off, const void *b, enum dtype bdt, int n)
{
    __m256 vc = _mm256_set1_ps(c), va = _mm256_set1_ps(a), vo = _mm256_set1_ps(w_off);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), va);
        v = _mm256_mul_ps(v, _mm256_add_ps(ld8(w, wdt, (size_t)i), vo));
        if (b)
            v = _mm256_add_ps(v, ld8(b, bdt, (size_t)i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) {
        float v = (x[i] - c) * a * (kern_ld(w, wdt, (size_t)i) + w_off);
        y[i] = b ? v + kern_ld(b, bdt, (size_t)i) : v;
    }
}

static void a2_norm_apply(float *y, const float *x, float c, float a, const void *w, enum dtype wdt,
                          float w_off, const void *b, enum dtype bdt, int n)
{
    if (wdt == DTYPE_BF16 && (!b || bdt == DTYPE_BF16))
        norm_apply_t(y, x, c, a, w, DTYPE_BF16, w_off, b, DTYPE_BF16, n);
    else if (wdt == DTYPE_F32 && (!b || bdt == DTYPE_F32))
        norm_apply_t(y, x, c, a, w, DTYPE_F32, w_off, b, DTYPE_F32, n);
    else
        norm_apply_t(y, x, c, a, w, wdt, w_off, b, bdt, n);
}

static float a2_max(const float *x, int n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float v = _mm_cvtss_f32(h);
    for (; i < n; i++)
        v = x[i] > v ? x[i] : v;
    return v;
}

/* e^x as in kern_avx512.c, but 2^n is built in the exponent field, so x is
 * clamped to [-87.34, 88.38] (n in [-126, 127]): results below ~1.2e-38
 * come out as ~1.2e-38 instead of 0, harmless for softmax and silu. NaN
 * passes through the clamps (max/min return the second operand on NaN). */
AI __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-87.3365447505f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* log(w) for w in [1, 2] (Cephes logf as in kern_avx512.c). */
AI __m256 log256_1to2(__m256 w)
{
    __m256 big = _mm256_cmp_ps(w, _mm256_set1_ps(1.41421356237f), _CMP_GT_OQ);
    __m256 m = _mm256_blendv_ps(w, _mm256_mul_ps(w, _mm256_set1_ps(0.5f)), big);
    __m256 e = _mm256_and_ps(big, _mm256_set1_ps(1.0f));
    __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.0f)), z = _mm256_mul_ps(f, f);
    __m256 p = _mm256_set1_ps(7.0376836292e-2f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.1514610310e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.1676998740e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.2420140846e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.4249322787e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.6668057665e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0000714765e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-2.4999993993e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(3.3333331174e-1f));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f), z);
    y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
    return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

/* softplus (kern.h) as a512_softplus, 8 lanes; a tail of n % 8 in scalar. */
static void a2_softplus(float *y, const float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 av = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
        __m256 u = exp256(_mm256_sub_ps(_mm256_setzero_ps(), av));
        __m256 w = _mm256_add_ps(_mm256_set1_ps(1.0f), u), d = _mm256_sub_ps(w, _mm256_set1_ps(1.0f));
        __m256 one = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_EQ_OQ);
        __m256 l = _mm256_mul_ps(log256_1to2(w), _mm256_div_ps(u, _mm256_blendv_ps(d, u, one)));
        l = _mm256_blendv_ps(l, u, one);
        __m256 r = _mm256_add_ps(_mm256_max_ps(v, _mm256_setzero_ps()), l);
        r = _mm256_blendv_ps(r, v, _mm256_cmp_ps(v, _mm256_set1_ps(20.0f), _CMP_GT_OQ));
        _mm256_storeu_ps(y + i, r);
    }
    for (; i < n; i++)
        y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
}

/* The selective scan (kern.h scan_rows): 8 states a vector with exp256, the state in memory
 * between rows (L1), one accumulator; states past the last multiple of 8 in scalar. */
static void a2_scan_rows(float *h, int ds, const float *a, const float *B, const float *C,
                         size_t ldbc, const float *x, size_t ldx, const float *delta, size_t ldd,
                         float *acc, size_t lda, int n)
{
    int nv = ds & ~7;
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float d = delta[(size_t)i * ldd], dxs = d * x[(size_t)i * ldx];
        __m256 vd = _mm256_set1_ps(d), dx = _mm256_set1_ps(dxs), sv = _mm256_setzero_ps();
        int s = 0;
        for (; s < nv; s += 8) {
            __m256 e = exp256(_mm256_mul_ps(vd, _mm256_loadu_ps(a + s)));
            __m256 hv = _mm256_fmadd_ps(dx, _mm256_loadu_ps(b + s), _mm256_mul_ps(e, _mm256_loadu_ps(h + s)));
            _mm256_storeu_ps(h + s, hv);
            sv = _mm256_fmadd_ps(hv, _mm256_loadu_ps(c + s), sv);
        }
        float sum = hsum(sv);
        for (; s < ds; s++) {
            h[s] = expf(d * a[s]) * h[s] + dxs * b[s];
            sum += h[s] * c[s];
        }
        acc[(size_t)i * lda] = sum;
    }
}

static float a2_exp_sum(float *y, const float *x, float mx, int n)
{
    __m256 s = _mm256_setzero_ps(), vm = _mm256_set1_ps(mx);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(y + i, e);
        s = _mm256_add_ps(s, e);
    }
    float v = hsum(s);
    for (; i < n; i++) {
        y[i] = expf(x[i] - mx);
        v += y[i];
    }
    return v;
}

// ---- attention ----

/* Four keys at a time share each load of q; four horizontal sums at once. */
static void a2_attn_scores(float *s, const float *q, const float *k, size_t ld, int n, int hd,
                           float scale)
{
    int j = 0, hd8 = hd & ~7;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * ld;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ld + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ld + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ld + d), a3);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float t[4];
        _mm_storeu_ps(t, r);
        for (int u = 0; u < 4; u++) {
            for (int d = hd8; d < hd; d++)
                t[u] += q[d] * k0[(size_t)u * ld + d];
            s[j + u] = t[u] * scale;
        }
    }
    for (; j < n; j++)
        s[j] = dot_t(q, k + (size_t)j * ld, hd) * scale;
}

/* o[0 .. 8 nv) (+)= sum_j p_j v_j[...] with the nv output vectors in registers. */
AI void accum_chunk(float *o, const float *p, const float *v, size_t ld, int n, const int nv,
                    bool acc)
{
    __m256 a[8];
#pragma GCC unroll 8
    for (int u = 0; u < nv; u++)
        a[u] = acc ? _mm256_loadu_ps(o + 8 * u) : _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m256 pj = _mm256_set1_ps(p[j]);
        const float *vj = v + (size_t)j * ld;
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * u), a[u]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < nv; u++)
        _mm256_storeu_ps(o + 8 * u, a[u]);
}

/* Columns in chunks of 64 (8 ymm accumulators); a last partial vector scalar. */
static void a2_attn_accum(float *o, const float *p, const float *v, size_t ld, int n, int hd,
                          bool acc)
{
    for (int c0 = 0; c0 + 8 <= hd; c0 += 64) {
        int nv = (hd - c0) / 8 < 8 ? (hd - c0) / 8 : 8;
        switch (nv) {
        case 1: accum_chunk(o + c0, p, v + c0, ld, n, 1, acc); break;
        case 2: accum_chunk(o + c0, p, v + c0, ld, n, 2, acc); break;
        case 3: accum_chunk(o + c0, p, v + c0, ld, n, 3, acc); break;
        case 4: accum_chunk(o + c0, p, v + c0, ld, n, 4, acc); break;
        case 5: accum_chunk(o + c0, p, v + c0, ld, n, 5, acc); break;
        case 6: accum_chunk(o + c0, p, v + c0, ld, n, 6, acc); break;
        case 7: accum_chunk(o + c0, p, v + c0, ld, n, 7, acc); break;
        default: accum_chunk(o + c0, p, v + c0, ld, n, 8, acc); break;
        }
    }
    for (int d = hd & ~7; d < hd; d++) {
        float a = acc ? o[d] : 0.0f;
        for (int j = 0; j < n; j++)
            a += p[j] * v[(size_t)j * ld + d];
        o[d] = a;
    }
}

static void a2_silu_mul(float *y, const float *g, const float *u, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vg = _mm256_loadu_ps(g + i), vu = _mm256_loadu_ps(u + i);
        __m256 d = _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), vg)));
        _mm256_storeu_ps(y + i, _mm256_div_ps(_mm256_mul_ps(vg, vu), d));
    }
    for (; i < n; i++)
        y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* tanh(u) = 1 - 2 / (e^{2u} + 1). */
static void a2_gelu_tanh(float *x, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
    const __m256 k0 = _mm256_set1_ps(0.7978845608028654f), k1 = _mm256_set1_ps(0.044715f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 u = _mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, v), _mm256_mul_ps(v, v), v));
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp256(_mm256_add_ps(u, u)), one)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
    }
    for (; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}

/* erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension. */
AI __m256 erf256(__m256 x)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sgn, x);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    __m256 e = exp256(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), ax), ax));
    __m256 y = _mm256_fnmadd_ps(p, e, one);
    return _mm256_or_ps(y, _mm256_and_ps(sgn, x));
}

static void a2_gelu_erf(float *x, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256 rs2 = _mm256_set1_ps(0.70710678118654752f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = erf256(_mm256_mul_ps(v, rs2));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e)));
    }
    for (; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

bool cpu_kernels_avx2_init(struct cpu_kernels *k)
{
    k->name = "avx2";
    k->wrow_f32 = a2_wrow_f32;
    k->to_f32 = a2_to_f32;
    k->matvec = a2_matvec;
    k->qxperm = a2_qxperm;
    k->ukernel = a2_ukernel;
    k->pack_t = a2_pack_t;
    k->pack_w = a2_pack_w;
    k->gemm_nr = 16;
    k->gemm_mr = 6;
    /* Quantized W: the GEMM dequantizes and transposes every panel, a fixed cost the
     * matvec (one dequantized row reused from L1 by every token) avoids; the crossovers
     * and their measurements are in linear_plan.h. */
    k->gemm_min_tok = LP_A2_GEMM_F;
    k->gemm_min_tok_q = LP_A2_GEMM_Q;
    k->dot = a2_dot;
    k->axpy = a2_axpy;
    k->scale = a2_scale;
    k->sum = a2_sum;
    k->sumsq = a2_sumsq;
    k->norm_apply = a2_norm_apply;
    k->max = a2_max;
    k->exp_sum = a2_exp_sum;
    k->attn_scores = a2_attn_scores;
    k->attn_accum = a2_attn_accum;
    k->silu_mul = a2_silu_mul;
    k->gelu_tanh = a2_gelu_tanh;
    k->gelu_erf = a2_gelu_erf;
    k->ssd_rows = a2_ssd_rows;
    k->scan_rows = a2_scan_rows;
    k->softplus = a2_softplus;
    k->gdn_rows = kern_gdn_rows_avx2;
    k->conv_rows = kern_conv_rows_avx2;
    k->rglru_rows = kern_rglru_rows_avx2;
    kern_avx2_qi_init(k);
    return true;
}

#else

bool cpu_kernels_avx2_init(struct cpu_kernels *k)
{
    (void)k;
    return false;
}

#endif
