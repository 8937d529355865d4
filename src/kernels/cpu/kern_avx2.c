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
 *            4/8-bit rows unpacked in registers against deinterleaved x
 *            (4-bit), s*sum(qx) + b*sum(x) per group
 *   ukernel  6 tokens x 16 outputs (12 ymm accumulators), packed panel
 *   exp      Cephes expf polynomial, 2^n built in the exponent field
 */
#include "kern.h"

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

/* 32 4-bit codes from 16 bytes in stream order (byte k: codes 2k low, 2k+1 high). */
AI void q4_unpack32(const uint8_t *p, __m256 q[4])
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    __m128i a = _mm_unpacklo_epi8(lo, hi), b = _mm_unpackhi_epi8(lo, hi);
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(a));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(a, a)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b)));
}

AI __m256 q8_unpack8(const uint8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 32 codes (4- or 8-bit) starting at code j of the row. */
AI void q_unpack32(const uint8_t *row, int bits, size_t j, __m256 q[4])
{
    if (bits == 4) {
        q4_unpack32(row + j / 2, q);
    } else {
        for (int i = 0; i < 4; i++)
            q[i] = q8_unpack8(row + j + 8 * i);
    }
}

static void a2_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n)
{
    if (!w->qbits) {
        a2_to_f32(dst, w->data + (size_t)r * w->row_bytes + (size_t)k0 * dtype_size(w->dt), w->dt,
                  (size_t)n);
        return;
    }
    if ((w->qbits != 4 && w->qbits != 8) || (n & 31)) {
        kern_ref_wrow_f32(dst, w, r, k0, n);
        return;
    }
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->qs + (size_t)r * w->qrow_bytes, *b = w->qb + (size_t)r * w->qrow_bytes;
    for (int i = 0; i < n; i += 32) {
        int j = k0 + i, g = j / w->qgroup;
        __m256 vs = _mm256_set1_ps(kern_ld(s, w->qsdt, (size_t)g));
        __m256 vb = _mm256_set1_ps(kern_ld(b, w->qsdt, (size_t)g));
        __m256 q[4];
        q_unpack32(row, w->qbits, (size_t)j, q);
        for (int u = 0; u < 4; u++)
            _mm256_storeu_ps(dst + i + 8 * u, _mm256_fmadd_ps(q[u], vs, vb));
    }
}

// ---- matvec ----

/* Bytes ahead prefetched in each weight row (see kern_avx512.c). */
#define MV_PF 1024

/* Rows r0 .. r0+nr (nr <= 4) for every token; a missing row repeats the last. */
AI void mv_block(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                 const struct wmat *w, int r0, int nr, enum dtype dt)
{
    const void *wr[4];
    int in = w->in;
    size_t es = dt == DTYPE_F32 ? 4 : 2;
    for (int j = 0; j < 4; j++)
        wr[j] = w->data + (size_t)(r0 + (j < nr ? j : nr - 1)) * w->row_bytes;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * ldx;
        __m256 a[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            a[j][0] = a[j][1] = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= in; i += 16) {
            __m256 x0 = _mm256_loadu_ps(xt + i), x1 = _mm256_loadu_ps(xt + i + 8);
            if (t == 0)
                for (int j = 0; j < 4; j++)
                    _mm_prefetch((const char *)wr[j] + (size_t)i * es + MV_PF, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                a[j][0] = _mm256_fmadd_ps(ld8(wr[j], dt, (size_t)i), x0, a[j][0]);
                a[j][1] = _mm256_fmadd_ps(ld8(wr[j], dt, (size_t)i + 8), x1, a[j][1]);
            }
        }
        for (int j = 0; j < nr; j++) {
            float v = hsum(_mm256_add_ps(a[j][0], a[j][1]));
            for (int k = i; k < in; k++)
                v += kern_ld(wr[j], dt, (size_t)k) * xt[k];
            y[(size_t)t * ldy + (size_t)(r0 + j)] = v;
        }
    }
}

/* Deinterleave x in blocks of 16: [x0 x2 .. x14 x1 x3 .. x15], the order of
 * (low nibbles, high nibbles) of 8 bytes zero-extended to 8 lanes. */
static void a2_q4_xperm(float *dst, const float *x, size_t n)
{
    for (size_t b = 0; b < n; b += 16)
        for (int i = 0; i < 8; i++) {
            dst[b + i] = x[b + 2 * i];
            dst[b + 8 + i] = x[b + 2 * i + 1];
        }
}

/* One quantized row (4 or 8 bits) dotted with one token's x, per group
 * s * sum(q x) + b * sum(x) with sum(x) precomputed (xs). For 4 bits x is
 * deinterleaved (a2_q4_xperm): 8 bytes zero-extend to 8 lanes whose low
 * nibbles are the even codes and high nibbles the odd ones. */
AI float qdot(const uint8_t *row, const uint8_t *s, const uint8_t *b, enum dtype sdt,
              const float *x, const float *xs, int in, int group, int bits)
{
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float bacc = 0.0f;
    int ng = in / group;
    for (int g = 0; g < ng; g++) {
        const float *xg = x + (size_t)g * group;
        const uint8_t *p = row + (size_t)g * group * bits / 8;
        __m256 g0 = _mm256_setzero_ps(), g1 = g0, g2 = g0, g3 = g0;
        for (int c = 0; c < group; c += 32) {
            if (bits == 4) {
                __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + c / 2)));
                __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + c / 2 + 8)));
                g0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m4)),
                                     _mm256_loadu_ps(xg + c), g0);
                g1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)),
                                     _mm256_loadu_ps(xg + c + 8), g1);
                g2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m4)),
                                     _mm256_loadu_ps(xg + c + 16), g2);
                g3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)),
                                     _mm256_loadu_ps(xg + c + 24), g3);
            } else {
                g0 = _mm256_fmadd_ps(q8_unpack8(p + c), _mm256_loadu_ps(xg + c), g0);
                g1 = _mm256_fmadd_ps(q8_unpack8(p + c + 8), _mm256_loadu_ps(xg + c + 8), g1);
                g2 = _mm256_fmadd_ps(q8_unpack8(p + c + 16), _mm256_loadu_ps(xg + c + 16), g2);
                g3 = _mm256_fmadd_ps(q8_unpack8(p + c + 24), _mm256_loadu_ps(xg + c + 24), g3);
            }
        }
        __m256 gs = _mm256_add_ps(_mm256_add_ps(g0, g1), _mm256_add_ps(g2, g3));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(kern_ld(s, sdt, (size_t)g)), gs, acc);
        bacc += kern_ld(b, sdt, (size_t)g) * xs[g];
    }
    return hsum(acc) + bacc;
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

/* Quantized rows of widths other than 4/8: dequantize 256 at a time, then dot. */
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

static void mv_quant(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                     const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
    if ((w->qbits != 4 && w->qbits != 8) || (w->qgroup & 31) || !xsum) {
        mv_qgeneric(y, ldy, x, ldx, n_tok, w, r0, r1);
        return;
    }
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        const uint8_t *s = w->qs + (size_t)r * w->qrow_bytes, *b = w->qb + (size_t)r * w->qrow_bytes;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx, *xs = xsum + (size_t)t * ldxs;
            float v = w->qbits == 4 ? qdot(row, s, b, w->qsdt, xt, xs, w->in, w->qgroup, 4)
                                    : qdot(row, s, b, w->qsdt, xt, xs, w->in, w->qgroup, 8);
            y[(size_t)t * ldy + (size_t)r] = v;
        }
    }
}

static void a2_matvec(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                      const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
    if (w->qbits) {
        mv_quant(y, ldy, x, ldx, n_tok, w, r0, r1, xsum, ldxs);
        return;
    }
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        switch (w->dt) {
        case DTYPE_BF16:
            mv_block(y, ldy, x, ldx, n_tok, w, r, nr, DTYPE_BF16);
            break;
        case DTYPE_F16:
            mv_block(y, ldy, x, ldx, n_tok, w, r, nr, DTYPE_F16);
            break;
        default:
            mv_block(y, ldy, x, ldx, n_tok, w, r, nr, DTYPE_F32);
            break;
        }
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
                 int kc_next, enum dtype dt)
{
    size_t es = dt == DTYPE_F32 ? 4 : 2;
    const uint8_t *base = w->data + (size_t)r0 * w->row_bytes;
    for (int j = 0; j < nv && kc_next > 0; j++) {
        const char *p = (const char *)(base + (size_t)j * w->row_bytes + (size_t)(k0 + kc) * es);
        for (size_t b = 0; b < (size_t)kc_next * es; b += 64)
            _mm_prefetch(p + b, _MM_HINT_T0);
    }
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

static void a2_pack_w(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc,
                      int kc_next)
{
    switch (w->dt) {
    case DTYPE_BF16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, kc_next, DTYPE_BF16);
        break;
    case DTYPE_F16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, kc_next, DTYPE_F16);
        break;
    default:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, kc_next, DTYPE_F32);
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
                     const void *b, enum dtype bdt, int n)
{
    __m256 vc = _mm256_set1_ps(c), va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc), va);
        v = _mm256_mul_ps(v, ld8(w, wdt, (size_t)i));
        if (b)
            v = _mm256_add_ps(v, ld8(b, bdt, (size_t)i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) {
        float v = (x[i] - c) * a * kern_ld(w, wdt, (size_t)i);
        y[i] = b ? v + kern_ld(b, bdt, (size_t)i) : v;
    }
}

static void a2_norm_apply(float *y, const float *x, float c, float a, const void *w, enum dtype wdt,
                          const void *b, enum dtype bdt, int n)
{
    if (wdt == DTYPE_BF16 && (!b || bdt == DTYPE_BF16))
        norm_apply_t(y, x, c, a, w, DTYPE_BF16, b, DTYPE_BF16, n);
    else if (wdt == DTYPE_F32 && (!b || bdt == DTYPE_F32))
        norm_apply_t(y, x, c, a, w, DTYPE_F32, b, DTYPE_F32, n);
    else
        norm_apply_t(y, x, c, a, w, wdt, b, bdt, n);
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
static void a2_attn_scores(float *s, const float *q, const float *k, int n, int hd, float scale)
{
    int j = 0, hd8 = hd & ~7;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + d), a3);
        }
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float t[4];
        _mm_storeu_ps(t, r);
        for (int u = 0; u < 4; u++) {
            for (int d = hd8; d < hd; d++)
                t[u] += q[d] * k0[(size_t)u * hd + d];
            s[j + u] = t[u] * scale;
        }
    }
    for (; j < n; j++)
        s[j] = dot_t(q, k + (size_t)j * hd, hd) * scale;
}

/* o[0 .. 8 nv) (+)= sum_j p_j v_j[...] with the nv output vectors in registers. */
AI void accum_chunk(float *o, const float *p, const float *v, int ld, int n, const int nv, bool acc)
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
static void a2_attn_accum(float *o, const float *p, const float *v, int n, int hd, bool acc)
{
    for (int c0 = 0; c0 + 8 <= hd; c0 += 64) {
        int nv = (hd - c0) / 8 < 8 ? (hd - c0) / 8 : 8;
        switch (nv) {
        case 1: accum_chunk(o + c0, p, v + c0, hd, n, 1, acc); break;
        case 2: accum_chunk(o + c0, p, v + c0, hd, n, 2, acc); break;
        case 3: accum_chunk(o + c0, p, v + c0, hd, n, 3, acc); break;
        case 4: accum_chunk(o + c0, p, v + c0, hd, n, 4, acc); break;
        case 5: accum_chunk(o + c0, p, v + c0, hd, n, 5, acc); break;
        case 6: accum_chunk(o + c0, p, v + c0, hd, n, 6, acc); break;
        case 7: accum_chunk(o + c0, p, v + c0, hd, n, 7, acc); break;
        default: accum_chunk(o + c0, p, v + c0, hd, n, 8, acc); break;
        }
    }
    for (int d = hd & ~7; d < hd; d++) {
        float a = acc ? o[d] : 0.0f;
        for (int j = 0; j < n; j++)
            a += p[j] * v[(size_t)j * hd + d];
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
    k->q4_xperm = a2_q4_xperm;
    k->ukernel = a2_ukernel;
    k->pack_t = a2_pack_t;
    k->pack_w = a2_pack_w;
    k->gemm_nr = 16;
    k->gemm_mr = 6;
    k->gemm_min_tok = 4;
    k->gemm_min_tok_q = 6;
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
    return true;
}

#else

bool cpu_kernels_avx2_init(struct cpu_kernels *k)
{
    (void)k;
    return false;
}

#endif
