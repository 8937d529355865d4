/*
 * kern_avx512: AVX-512 (F/BW/VL/DQ) + FMA + F16C kernels. Compiled with those
 * target flags (CMakeLists.txt); only called after dispatch.c has checked
 * CPUID and XCR0. Everything a 16-lane register buys is in this file and the
 * two beside it (kern_avx512.h: the matvecs in kern_avx512_mv.c, the GEMM and
 * FPAN in kern_avx512_gemm.c); the rest of the table keeps the avx2 entries
 * (dispatch.c overlays avx2 first).
 *
 * Weights are widened in registers and never rounded: bf16 -> f32 is a
 * 16-bit left shift of the zero-extended halfword, f16 -> f32 is vcvtph2ps,
 * both exact. Accumulation is f32 in several independent registers, so sums
 * differ from the scalar reference only in association order.
 *
 *   matvec   4 weight rows x 32 inputs per step (8 accumulators), masked
 *            tails; quantized rows (every MLX mode and width) in lane
 *            order: codes decoded in registers (shift + 16-entry vpermps
 *            table, AND + convert, or e4m3 bit placement) against x
 *            permuted once per call, one per-lane scale FMA per block of
 *            16 lanes, affine biases through per-group sums of x (see
 *            "quantized weights" in kern_avx512_mv.c and docs/adr/0010); float rows one
 *            token a row at a time (mv_row), 2 rows by up to 4 tokens
 *            (mv_block_t, ADR 0032) or 4 rows by up to 6 tokens (mv_block_p,
 *            ADR 0038), as the weight's plan says (linear_plan.h)
 *   ukernel  8 tokens x 32 outputs (16 zmm accumulators) over a packed panel
 *   fpan     float W repacked at load as panels of 32 rows (kern.h FPAN), every token
 *            count: up to 8 tokens x 1-4 panels a tile, x broadcast per input, each
 *            k-line widened once (BF16: one shift and one AND); docs/adr/0039
 *   exp      Cephes expf polynomial + vscalefps (rel. error ~1e-7)
 *
 * Throughput: docs/benchmarks.md ("Quantized matvec kernels" and the sections
 * after it); the measurements behind the first versions of these kernels are
 * in ADR 0055.
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include <math.h>
#include <string.h>

#include "kern_avx512.h"

// ---- vectors ----

static float a512_dot(const float *a, const float *b, int n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* The SSD recurrence (kern.h ssd_rows) with the state row in NV registers of 16 lanes for
 * the whole run of rows (N = 16 NV: Mamba-2's d_state of 64, 128, 256); per row, a multiply
 * and an FMA per vector for the state and an FMA into one of two accumulators for y. */
static inline __attribute__((always_inline)) void ssd_rows_reg(
    float *s, int NV, const float *B, const float *C, size_t ldbc, const float *x, size_t ldx,
    const float *dtd, size_t ldd, float *y, size_t ldy, float dskip, int n)
{
    __m512 st[16];
#pragma GCC unroll 16
    for (int j = 0; j < NV; j++)
        st[j] = _mm512_loadu_ps(s + 16 * j);
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float v = x[(size_t)i * ldx];
        __m512 a = _mm512_set1_ps(dtd[(size_t)i * ldd + 1]), dx = _mm512_set1_ps(dtd[(size_t)i * ldd] * v);
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) {
            st[j] = _mm512_fmadd_ps(dx, _mm512_loadu_ps(b + 16 * j), _mm512_mul_ps(a, st[j]));
            if (j & 1)
                acc1 = _mm512_fmadd_ps(st[j], _mm512_loadu_ps(c + 16 * j), acc1);
            else
                acc0 = _mm512_fmadd_ps(st[j], _mm512_loadu_ps(c + 16 * j), acc0);
        }
        y[(size_t)i * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + dskip * v;
    }
#pragma GCC unroll 16
    for (int j = 0; j < NV; j++)
        _mm512_storeu_ps(s + 16 * j, st[j]);
}

/* Any N: the state row in memory between rows, a masked last vector. The same arithmetic per
 * element and the same two accumulators as ssd_rows_reg, so N = 16 NV gives its bits. */
static void ssd_rows_mem(float *s, int N, const float *B, const float *C, size_t ldbc,
                         const float *x, size_t ldx, const float *dtd, size_t ldd, float *y,
                         size_t ldy, float dskip, int n)
{
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float v = x[(size_t)i * ldx];
        __m512 a = _mm512_set1_ps(dtd[(size_t)i * ldd + 1]), dx = _mm512_set1_ps(dtd[(size_t)i * ldd] * v);
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int m = 0, j = 0; m < N; m += 16, j++) {
            __mmask16 k = tail_mask(N - m < 16 ? N - m : 16);
            __m512 sv = _mm512_fmadd_ps(dx, _mm512_maskz_loadu_ps(k, b + m),
                                        _mm512_mul_ps(a, _mm512_maskz_loadu_ps(k, s + m)));
            _mm512_mask_storeu_ps(s + m, k, sv);
            acc[j & 1] = _mm512_fmadd_ps(sv, _mm512_maskz_loadu_ps(k, c + m), acc[j & 1]);
        }
        y[(size_t)i * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + dskip * v;
    }
}

static void a512_ssd_rows(float *s, int N, const float *B, const float *C, size_t ldbc,
                          const float *x, size_t ldx, const float *dtd, size_t ldd, float *y,
                          size_t ldy, float dskip, int n)
{
    if (N == 128)
        ssd_rows_reg(s, 8, B, C, ldbc, x, ldx, dtd, ldd, y, ldy, dskip, n);
    else if (N == 64)
        ssd_rows_reg(s, 4, B, C, ldbc, x, ldx, dtd, ldd, y, ldy, dskip, n);
    else if (N == 256)
        ssd_rows_reg(s, 16, B, C, ldbc, x, ldx, dtd, ldd, y, ldy, dskip, n);
    else
        ssd_rows_mem(s, N, B, C, ldbc, x, ldx, dtd, ldd, y, ldy, dskip, n);
}

static void a512_axpy(float *y, float a, const float *x, size_t n)
{
    __m512 va = _mm512_set1_ps(a);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        __m512 v = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static void a512_scale(float *y, float a, size_t n)
{
    __m512 va = _mm512_set1_ps(a);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static float a512_sum(const float *x, int n)
{
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16)
        s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    return _mm512_reduce_add_ps(s);
}

static float a512_sumsq(const float *x, float c, int n)
{
    __m512 s = _mm512_setzero_ps(), vc = _mm512_set1_ps(c);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), vc);
        s = _mm512_fmadd_ps(d, d, s);
    }
    return _mm512_reduce_add_ps(s);
}

AI void norm_apply_t(float *y, const float *x, float c, float a, const void *w, enum dtype wdt,
                     float w_off, const void *b, enum dtype bdt, int n)
{
    __m512 vc = _mm512_set1_ps(c), va = _mm512_set1_ps(a), vo = _mm512_set1_ps(w_off);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vc), va);
        v = _mm512_mul_ps(v, _mm512_add_ps(ld16(w, wdt, (size_t)i, m), vo));
        if (b)
            v = _mm512_add_ps(v, ld16(b, bdt, (size_t)i, m));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static void a512_norm_apply(float *y, const float *x, float c, float a, const void *w,
                            enum dtype wdt, float w_off, const void *b, enum dtype bdt, int n)
{
    if (wdt == DTYPE_BF16 && (!b || bdt == DTYPE_BF16))
        norm_apply_t(y, x, c, a, w, DTYPE_BF16, w_off, b, DTYPE_BF16, n);
    else if (wdt == DTYPE_F32 && (!b || bdt == DTYPE_F32))
        norm_apply_t(y, x, c, a, w, DTYPE_F32, w_off, b, DTYPE_F32, n);
    else
        norm_apply_t(y, x, c, a, w, wdt, w_off, b, bdt, n);
}

static float a512_max(const float *x, int n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16)
        m = _mm512_mask_max_ps(m, tail_mask(n - i), m, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(m);
}

/* e^x: n = round(x log2 e), r = x - n ln2 (two-part ln2), Cephes degree-7
 * polynomial, times 2^n by vscalefps (which also handles underflow to 0).
 * Clamped to [-104, 88.7]; NaN passes through (min/max return the second
 * operand when either is NaN). */
AI __m512 exp512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* The selective scan (kern.h scan_rows): 16 states a vector with exp512; Mamba's 16 states
 * stay in one register over the run of rows, other sizes go through memory (masked last
 * vector), with the same arithmetic per element. */
static void a512_scan_rows(float *h, int ds, const float *a, const float *B, const float *C,
                           size_t ldbc, const float *x, size_t ldx, const float *delta, size_t ldd,
                           float *acc, size_t lda, int n)
{
    if (ds == 16) {
        __m512 hv = _mm512_loadu_ps(h), av = _mm512_loadu_ps(a);
        for (int i = 0; i < n; i++) {
            const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
            float d = delta[(size_t)i * ldd];
            __m512 e = exp512(_mm512_mul_ps(_mm512_set1_ps(d), av));
            hv = _mm512_fmadd_ps(_mm512_set1_ps(d * x[(size_t)i * ldx]), _mm512_loadu_ps(b), _mm512_mul_ps(e, hv));
            acc[(size_t)i * lda] = _mm512_reduce_add_ps(_mm512_mul_ps(hv, _mm512_loadu_ps(c)));
        }
        _mm512_storeu_ps(h, hv);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float d = delta[(size_t)i * ldd];
        __m512 vd = _mm512_set1_ps(d), dx = _mm512_set1_ps(d * x[(size_t)i * ldx]);
        __m512 sv = _mm512_setzero_ps();
        for (int s = 0; s < ds; s += 16) {
            __mmask16 m = tail_mask(ds - s < 16 ? ds - s : 16);
            __m512 e = exp512(_mm512_mul_ps(vd, _mm512_maskz_loadu_ps(m, a + s)));
            __m512 hv = _mm512_fmadd_ps(dx, _mm512_maskz_loadu_ps(m, b + s),
                                        _mm512_mul_ps(e, _mm512_maskz_loadu_ps(m, h + s)));
            _mm512_mask_storeu_ps(h + s, m, hv);
            sv = _mm512_fmadd_ps(hv, _mm512_maskz_loadu_ps(m, c + s), sv);
        }
        acc[(size_t)i * lda] = _mm512_reduce_add_ps(sv);
    }
}

/* log(w) for w in [1, 2] (Cephes logf: w or w / 2 around sqrt 2, degree-8 polynomial of
 * f = m - 1, ln 2 in two parts). */
AI __m512 log512_1to2(__m512 w)
{
    __mmask16 big = _mm512_cmp_ps_mask(w, _mm512_set1_ps(1.41421356237f), _CMP_GT_OQ);
    __m512 m = _mm512_mask_mul_ps(w, big, w, _mm512_set1_ps(0.5f));
    __m512 e = _mm512_maskz_mov_ps(big, _mm512_set1_ps(1.0f));
    __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f)), z = _mm512_mul_ps(f, f);
    __m512 p = _mm512_set1_ps(7.0376836292e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.1514610310e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.1676998740e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.2420140846e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.4249322787e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.6668057665e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.0000714765e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-2.4999993993e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(3.3333331174e-1f));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, f), z);
    y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
    y = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), y);
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
}

/* softplus (kern.h): max(x, 0) + log1p(u), u = exp(-|x|) in (0, 1], log1p(u) = log(1 + u) u /
 * ((1 + u) - 1) (exact where 1 + u rounds to 1: u itself); x above 20 passes. */
static void a512_softplus(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        __m512 u = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
        __m512 w = _mm512_add_ps(_mm512_set1_ps(1.0f), u), d = _mm512_sub_ps(w, _mm512_set1_ps(1.0f));
        __mmask16 one = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_EQ_OQ);
        __m512 l = _mm512_mul_ps(log512_1to2(w), _mm512_div_ps(u, _mm512_mask_blend_ps(one, d, u)));
        l = _mm512_mask_mov_ps(l, one, u);
        __m512 r = _mm512_add_ps(_mm512_max_ps(v, _mm512_setzero_ps()), l);
        r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(v, _mm512_set1_ps(20.0f), _CMP_GT_OQ), v);
        _mm512_mask_storeu_ps(y + i, k, r);
    }
}

static float a512_exp_sum(float *y, const float *x, float mx, int n)
{
    __m512 s = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(y + i, m, e);
        s = _mm512_add_ps(s, e);
    }
    return _mm512_reduce_add_ps(s);
}

// ---- attention ----

/* The four horizontal sums of a0..a3, in order. */
AI __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m512 a[4] = {a0, a1, a2, a3};
    __m128 c[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a[i]), _mm512_extractf32x8_ps(a[i], 1));
        c[i] = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    }
    return _mm_hadd_ps(_mm_hadd_ps(c[0], c[1]), _mm_hadd_ps(c[2], c[3]));
}

/* Four keys at a time share each load of q. */
static void a512_attn_scores(float *s, const float *q, const float *k, size_t ld, int n, int hd,
                             float scale)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = tail_mask(hd - d);
            __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
            a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + d), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + ld + d), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + 2 * ld + d), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k0 + 3 * ld + d), a3);
        }
        _mm_storeu_ps(s + j, _mm_mul_ps(hsum4(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
    for (; j < n; j++)
        s[j] = a512_dot(q, k + (size_t)j * ld, hd) * scale;
}

/* The horizontal sums of a[0 .. 16) as one vector: lane 4 i + l holds a[4 l + i]'s. Each sum is
 * formed as hsum4 forms it (lane i + i+8, then + i+4, then adjacent pairs, then those pairs), so
 * the results are hsum4's, bit for bit; the four-way transposes share the shuffles. */
AI __m512 hsum16(const __m512 a[16])
{
    __m512 c[8], e[4];
#pragma GCC unroll 8
    for (int m = 0; m < 8; m++) /* 128-bit lanes: a[2m]'s q0+q2, q1+q3, a[2m+1]'s q0+q2, q1+q3 */
        c[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xee));
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) /* lane l: a[4m + l]'s four-lane partial */
        e[m] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0xdd));
    __m512 f01 = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88),
                               _mm512_shuffle_ps(e[0], e[1], 0xdd)),
           f23 = _mm512_add_ps(_mm512_shuffle_ps(e[2], e[3], 0x88),
                               _mm512_shuffle_ps(e[2], e[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_ps(f01, f23, 0x88), _mm512_shuffle_ps(f01, f23, 0xdd));
}

/* One piece of 16 dims (lanes past m zero) of scores_group's four keys by four heads. */
AI void scores_piece(__m512 a[16], const float *const q[4], const float *k0, size_t ld, int d,
                     __mmask16 m)
{
    __m512 kv[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        kv[i] = _mm512_maskz_loadu_ps(m, k0 + (size_t)i * ld + d);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512 qv = _mm512_maskz_loadu_ps(m, q[r] + d);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            a[4 * i + r] = _mm512_fmadd_ps(qv, kv[i], a[4 * i + r]);
    }
}

/* Scores of up to four query heads (rows q[0 .. nr), nr in 2..4) over n keys, four keys at a
 * time: each key's row loaded once for the heads, the 16 sums reduced together; a missing fourth
 * (third) head repeats the last one and its sums are dropped. Per head and key the products and
 * sums are a512_attn_scores', in the same order, the last piece of a head_dim that is not a
 * multiple of 16 masked as there: the same bits. */
static void scores_group(float *sh, size_t lds, const float *const q[4], int nr, const float *k,
                         size_t ld, int n, int hd, float scale)
{
    const int hf = hd & ~15; /* the whole pieces; a tail of hd - hf dims after them */
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * ld;
        __m512 a[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            a[i] = _mm512_setzero_ps();
        for (int d = 0; d < hf; d += 16)
            scores_piece(a, q, k0, ld, d, (__mmask16)0xffff);
        if (hf < hd)
            scores_piece(a, q, k0, ld, hf, tail_mask(hd - hf));
        __m512 v = _mm512_mul_ps(hsum16(a), _mm512_set1_ps(scale));
        _mm_storeu_ps(sh + j, _mm512_castps512_ps128(v));
        _mm_storeu_ps(sh + lds + j, _mm512_extractf32x4_ps(v, 1));
        if (nr > 2)
            _mm_storeu_ps(sh + 2 * lds + j, _mm512_extractf32x4_ps(v, 2));
        if (nr > 3)
            _mm_storeu_ps(sh + 3 * lds + j, _mm512_extractf32x4_ps(v, 3));
    }
    for (int r = 0; r < nr && j < n; r++) /* the last n % 4 keys, as that kernel does */
        a512_attn_scores(sh + (size_t)r * lds + j, q[r], k + (size_t)j * ld, ld, n - j, hd, scale);
}

/* attn_scores of nq query heads over the same keys: groups of four heads, and the two or three
 * left (GQA groups of 3, 6, 7 ...) as one group too, so a kv head's keys are read once per
 * group rather than once per head; a last single head alone. The same bits as one head at a
 * time, at any head_dim (SigLIP's 72 too: a vision tower's query rows take this path). */
static void a512_attn_scores_heads(float *s, size_t lds, const float *q, int nq, const float *k,
                                   size_t ld, int n, int hd, float scale)
{
    int h = 0;
    for (; h + 2 <= nq; h += 4) {
        int nr = nq - h < 4 ? nq - h : 4;
        const float *qr[4];
        for (int r = 0; r < 4; r++)
            qr[r] = q + (size_t)(h + (r < nr ? r : nr - 1)) * (size_t)hd;
        scores_group(s + (size_t)h * lds, lds, qr, nr, k, ld, n, hd, scale);
    }
    for (; h < nq; h++)
        a512_attn_scores(s + (size_t)h * lds, q + (size_t)h * (size_t)hd, k, ld, n, hd, scale);
}

/* o_r[0 .. nc) (+)= sum_j p_r[j] v_j[0 .. nc) for NH heads r (head r's output at o + r ldo,
 * its probabilities at p + r ldp; nc <= 16 nv <= 128), the NH x nv output vectors in
 * registers and each key's nv vectors of V loaded once for the heads; lanes past nc masked
 * off. Per head and column the products are summed over j in order, whatever NH is. */
AI void accum_chunk(float *o, size_t ldo, const float *p, size_t ldp, const float *v, size_t ld,
                    int n, int nc, const int nv, const int NH, bool acc)
{
    __m512 a[4][8];
    __mmask16 m[8];
#pragma GCC unroll 8
    for (int u = 0; u < nv; u++)
        m[u] = tail_mask(nc - 16 * u > 0 ? nc - 16 * u : 0);
#pragma GCC unroll 4
    for (int r = 0; r < NH; r++)
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            a[r][u] = acc ? _mm512_maskz_loadu_ps(m[u], o + (size_t)r * ldo + 16 * u)
                          : _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const float *vj = v + (size_t)j * ld;
        __m512 vv[8];
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            vv[u] = _mm512_maskz_loadu_ps(m[u], vj + 16 * u);
#pragma GCC unroll 4
        for (int r = 0; r < NH; r++) {
            __m512 pj = _mm512_set1_ps(p[(size_t)r * ldp + (size_t)j]);
#pragma GCC unroll 8
            for (int u = 0; u < nv; u++)
                a[r][u] = _mm512_fmadd_ps(pj, vv[u], a[r][u]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NH; r++)
#pragma GCC unroll 8
        for (int u = 0; u < nv; u++)
            _mm512_mask_storeu_ps(o + (size_t)r * ldo + 16 * u, m[u], a[r][u]);
}

/* NH heads' outputs over all hd columns, in chunks of 128 (NH x 8 vectors at most: NH 4 only
 * for head_dims up to 96, which the callers keep to). */
AI void accum_heads(float *o, size_t ldo, const float *p, size_t ldp, const float *v, size_t ld,
                    int n, int hd, const int NH, bool acc)
{
    for (int c0 = 0; c0 < hd; c0 += 128) {
        const int nc = hd - c0 < 128 ? hd - c0 : 128;
        float *oc = o + c0;
        const float *vc = v + c0;
        switch ((nc + 15) / 16) {
        case 1: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 1, NH, acc); break;
        case 2: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 2, NH, acc); break;
        case 3: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 3, NH, acc); break;
        case 4: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 4, NH, acc); break;
        case 5: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 5, NH, acc); break;
        case 6: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 6, NH, acc); break;
        case 7: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 7, NH, acc); break;
        default: accum_chunk(oc, ldo, p, ldp, vc, ld, n, nc, 8, NH, acc); break;
        }
    }
}

static void a512_attn_accum(float *o, const float *p, const float *v, size_t ld, int n, int hd,
                            bool acc)
{
    accum_heads(o, 0, p, 0, v, ld, n, hd, 1, acc);
}

/* attn_accum of nq query heads over the same rows of V: four heads at a time (head_dims up to
 * 96), then two, each row loaded once for them. Per head the products are summed in
 * a512_attn_accum's order: the same bits. */
static void a512_attn_accum_heads(float *o, size_t ldo, const float *p, size_t ldp, int nq,
                                  const float *v, size_t ld, int n, int hd, bool acc)
{
    int h = 0;
    if (hd <= 96)
        for (; h + 4 <= nq; h += 4)
            accum_heads(o + (size_t)h * ldo, ldo, p + (size_t)h * ldp, ldp, v, ld, n, hd, 4, acc);
    for (; h + 2 <= nq; h += 2)
        accum_heads(o + (size_t)h * ldo, ldo, p + (size_t)h * ldp, ldp, v, ld, n, hd, 2, acc);
    if (h < nq)
        a512_attn_accum(o + (size_t)h * ldo, p + (size_t)h * ldp, v, ld, n, hd, acc);
}

static void a512_silu_mul(float *y, const float *g, const float *u, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        __m512 vg = _mm512_maskz_loadu_ps(m, g + i), vu = _mm512_maskz_loadu_ps(m, u + i);
        __m512 d = _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), vg)));
        _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(_mm512_mul_ps(vg, vu), d));
    }
}

/* tanh(u) = 1 - 2 / (e^{2u} + 1): saturates cleanly at both ends. */
static void a512_gelu_tanh(float *x, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f), half = _mm512_set1_ps(0.5f);
    const __m512 k0 = _mm512_set1_ps(0.7978845608028654f), k1 = _mm512_set1_ps(0.044715f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 u = _mm512_mul_ps(k0, _mm512_fmadd_ps(_mm512_mul_ps(k1, v), _mm512_mul_ps(v, v), v));
        __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(exp512(_mm512_add_ps(u, u)), one)));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t)));
    }
}

/* erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension. */
AI __m512 erf512(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 ax = _mm512_abs_ps(x);
    __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), ax, one));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    p = _mm512_mul_ps(p, t);
    __m512 e = exp512(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), ax), ax));
    __m512 y = _mm512_fnmadd_ps(p, e, one);
    /* copy the sign of x */
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), sign));
}

static void a512_gelu_erf(float *x, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
    const __m512 rs2 = _mm512_set1_ps(0.70710678118654752f);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask((int)(n - i < 16 ? n - i : 16));
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 e = erf512(_mm512_mul_ps(v, rs2));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e)));
    }
}

bool cpu_kernels_avx512_init(struct cpu_kernels *k)
{
    k->name = "avx512";
    k->wrow_f32 = a512_wrow_f32;
    k->to_f32 = a512_to_f32;
    k->matvec = a512_matvec;
    k->qxperm = a512_qxperm;
    k->ukernel = a512_ukernel;
    k->pack_t = a512_pack_t;
    k->pack_w = a512_pack_w;
    k->fpan_linear = a512_fpan_linear;
    k->gemm_nr = 32;
    k->gemm_mr = 8;
    k->gemm_min_tok = LP_A512_GEMM_F;
    k->gemm_min_tok_q = LP_A512_GEMM_Q;
    k->dot = a512_dot;
    k->axpy = a512_axpy;
    k->scale = a512_scale;
    k->sum = a512_sum;
    k->sumsq = a512_sumsq;
    k->norm_apply = a512_norm_apply;
    k->max = a512_max;
    k->exp_sum = a512_exp_sum;
    k->attn_scores = a512_attn_scores;
    k->attn_accum = a512_attn_accum;
    k->attn_scores_heads = a512_attn_scores_heads;
    k->attn_accum_heads = a512_attn_accum_heads;
    k->silu_mul = a512_silu_mul;
    k->gelu_tanh = a512_gelu_tanh;
    k->gelu_erf = a512_gelu_erf;
    k->ssd_rows = a512_ssd_rows;
    k->scan_rows = a512_scan_rows;
    k->softplus = a512_softplus;
    k->gdn_rows = kern_gdn_rows_avx512;
    k->conv_rows = kern_conv_rows_avx512;
    k->rglru_rows = kern_rglru_rows_avx512;
    return true;
}

#else

bool cpu_kernels_avx512_init(struct cpu_kernels *k)
{
    (void)k;
    return false;
}

#endif
