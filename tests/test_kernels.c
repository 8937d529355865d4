/*
 * test_kernels: every backend op of the CPU backend, for every ISA variant
 * this machine can run (scalar always, avx2, avx512) and thread counts 1 and
 * 3, against naive double-precision references written here on random data
 * with awkward shapes (odd sizes, SIMD tails, n_tok = 1, out = 1, strided
 * weights, GEMM block edges). Errors are reported as NMSE (sum of squared
 * errors over sum of squared reference values) and max abs error relative to
 * max |ref|, each against a per-dtype threshold; the worst values per test
 * are printed. No timing here: see dev/kernels/bench_linear.c.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/backend_plugin.h"
#include "test.h"

#include "kern_check.h"

/* Store v in dtype dt at p[i]. */
static void st(void *p, enum dtype dt, size_t i, float v)
{
    if (dt == DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == DTYPE_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = f32_to_bf16(v);
}

static double ld(const void *p, enum dtype dt, size_t i)
{
    if (dt == DTYPE_F32)
        return ((const float *)p)[i];
    if (dt == DTYPE_F16)
        return f16_to_f32(((const uint16_t *)p)[i]);
    return bf16_to_f32(((const uint16_t *)p)[i]);
}

/* A random float weight [out, in] with row stride ld_el >= in elements. */
static struct tensor wrand(enum dtype dt, int out, int in, int ld_el, float amp)
{
    struct tensor t;
    int64_t shape[2] = {out, in};
    void *d = calloc((size_t)out * (size_t)ld_el + 1, dtype_size(dt));
    assert_non_null(d);
    tensor_init(&t, dt, d, 2, shape);
    t.stride[0] = ld_el;
    for (int r = 0; r < out; r++)
        for (int i = 0; i < in; i++)
            st(d, dt, (size_t)r * ld_el + i, kc_frand(-amp, amp));
    return t;
}

/* A random MLX affine quantized weight: codes packed LSB-first into each row's
 * bit stream; scales of both signs, as the quantizer produces. */
static struct tensor qrand(int bits, int group, enum dtype sdt, int out, int in)
{
    struct tensor t;
    int64_t shape[2] = {out, in};
    size_t words = (size_t)in * bits / 32, ng = (size_t)in / group;
    uint32_t *d = calloc((size_t)out * words + 1, 4);
    void *s = calloc((size_t)out * ng, dtype_size(sdt));
    void *b = calloc((size_t)out * ng, dtype_size(sdt));
    assert_true(d && s && b);
    tensor_init(&t, DTYPE_U32, d, 2, shape);
    t.stride[0] = (int64_t)words;
    uint8_t *bytes = (uint8_t *)d;
    for (int r = 0; r < out; r++) {
        uint8_t *row = bytes + (size_t)r * words * 4;
        for (size_t j = 0; j < (size_t)in; j++) {
            unsigned q = kc_urand(1u << bits);
            for (int k = 0; k < bits; k++)
                if (q >> k & 1)
                    row[(j * bits + k) >> 3] |= (uint8_t)(1u << ((j * bits + k) & 7));
        }
        for (size_t g = 0; g < ng; g++) {
            st(s, sdt, (size_t)r * ng + g, kc_frand(-0.02f, 0.02f));
            st(b, sdt, (size_t)r * ng + g, kc_frand(-0.1f, 0.1f));
        }
    }
    t.qbits = bits;
    t.qgroup = group;
    t.qsdtype = sdt;
    t.qscales = s;
    t.qbiases = b;
    return t;
}

/* A random MLX fp-mode weight (mxfp4 / mxfp8 / nvfp4): every code value
 * occurs (e2m1 -0, e4m3 subnormals, 0x7f = 480 and 0xff), U8 scales. With
 * edge set, scales include e8m0 0 (2^-127) and 254 (2^127; those groups get
 * codes of magnitude < 2 so that no dequantized value overflows f32) and
 * e4m3 subnormals and 0x7f; row 0 group 0 holds the edge codes in front. */
static struct tensor qrand_fp(enum qmode mode, int out, int in, bool edge)
{
    int bits = mode == QMODE_MXFP8 ? 8 : 4, group = mode == QMODE_NVFP4 ? 16 : 32;
    struct tensor t;
    int64_t shape[2] = {out, in};
    size_t words = (size_t)in * bits / 32, ng = (size_t)in / group;
    assert_true(in % group == 0);
    uint32_t *d = calloc((size_t)out * words + 1, 4);
    uint8_t *s = calloc((size_t)out * ng, 1);
    assert_true(d && s);
    tensor_init(&t, DTYPE_U32, d, 2, shape);
    t.stride[0] = (int64_t)words;
    uint8_t *bytes = (uint8_t *)d;
    static const uint8_t e8_edge[] = {0, 254, 1, 127, 126};
    static const uint8_t e4_edge[] = {0x7f, 0x01, 0x07, 0x08, 0x30, 0x38, 0x00};
    static const uint8_t c4_edge[] = {8, 0, 7, 15, 1, 9};
    static const uint8_t c8_edge[] = {0x7f, 0xff, 0x01, 0x81, 0x07, 0x08, 0x80, 0x00};
    for (int r = 0; r < out; r++) {
        uint8_t *row = bytes + (size_t)r * words * 4;
        for (size_t g = 0; g < ng; g++) {
            unsigned sc;
            if (mode == QMODE_NVFP4)
                sc = edge && kc_urand(3) == 0 ? e4_edge[kc_urand(sizeof e4_edge)] : 0x28 + kc_urand(0x18);
            else
                sc = edge && kc_urand(3) == 0 ? e8_edge[kc_urand(sizeof e8_edge)] : 122 + kc_urand(8);
            if (r == 0 && g == 0)
                sc = mode == QMODE_NVFP4 ? 0x38 : 127;
            s[(size_t)r * ng + g] = (uint8_t)sc;
            bool small = mode != QMODE_NVFP4 && sc == 254;
            for (size_t k = 0; k < (size_t)group; k++) {
                size_t j = g * group + k;
                unsigned q = kc_urand(1u << bits);
                if (small)
                    q &= bits == 4 ? 0xb : 0xbf; /* |e2m1| <= 1.5, |e4m3| < 2 */
                if (r == 0 && g == 0 && k < (bits == 4 ? sizeof c4_edge : sizeof c8_edge))
                    q = bits == 4 ? c4_edge[k] : c8_edge[k];
                for (int b = 0; b < bits; b++)
                    if (q >> b & 1)
                        row[(j * bits + b) >> 3] |= (uint8_t)(1u << ((j * bits + b) & 7));
            }
        }
    }
    t.qbits = bits;
    t.qgroup = group;
    t.qmode = mode;
    t.qsdtype = DTYPE_U8;
    t.qscales = s;
    t.qbiases = NULL;
    return t;
}

static void tfree(struct tensor *t)
{
    free(t->data);
    free((void *)t->qscales);
    free((void *)t->qbiases);
}

/* Decoders of the fp formats, written independently of the kernels (from
 * the definitions in ../shared/docs/mlx-quantization.md section 4), in double. */
static double e2m1_d(unsigned c)
{
    unsigned e = c >> 1 & 3, m = c & 1;
    double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return c & 8 ? -v : v;
}

static double e4m3_d(unsigned b)
{
    unsigned e = b >> 3 & 15, m = b & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, (int)e - 7);
    return b & 0x80 ? -v : v;
}

static double e8m0_d(unsigned b)
{
    return b == 255 ? INFINITY : ldexp(1.0, (int)b - 127);
}

/* Code i of row r of a quantized tensor, bit by bit from the LSB-first stream. */
static unsigned qcode_d(const struct tensor *w, int r, int i)
{
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->stride[0] * 4;
    size_t o = (size_t)i * w->qbits;
    unsigned q = 0;
    for (int k = 0; k < w->qbits; k++)
        q |= (unsigned)(row[(o + k) >> 3] >> ((o + k) & 7) & 1) << k;
    return q;
}

/* Scale (*s) and bias (*b, 0 for fp modes) of the group of W[r, i], in double. */
static void qgroup_d(const struct tensor *w, int r, int i, double *s, double *b)
{
    size_t g = (size_t)r * (w->shape[1] / w->qgroup) + (size_t)i / w->qgroup;
    const uint8_t *su = w->qscales;
    switch (w->qmode) {
    case QMODE_MXFP4:
    case QMODE_MXFP8:
        *s = e8m0_d(su[g]);
        *b = 0;
        break;
    case QMODE_NVFP4:
        *s = e4m3_d(su[g]);
        *b = 0;
        break;
    default:
        *s = ld(w->qscales, w->qsdtype, g);
        *b = ld(w->qbiases, w->qsdtype, g);
    }
}

/* Element value of code q before its scale: q itself for affine. */
static double qval_d(const struct tensor *w, unsigned q)
{
    return w->qmode == QMODE_MXFP8 ? e4m3_d(q) : w->qmode == QMODE_AFFINE ? (double)q : e2m1_d(q);
}

/* W[r, i] in double, straight from storage (dequantized when quantized). */
static double wref(const struct tensor *w, int r, int i)
{
    if (!w->qbits)
        return ld(w->data, w->dtype, (size_t)r * w->stride[0] + i);
    double s, b;
    qgroup_d(w, r, i, &s, &b);
    return qval_d(w, qcode_d(w, r, i)) * s + b;
}

/* |s q| + |b| of W[r, i]: the magnitude its f32 evaluation errs relative to. */
static double wmag(const struct tensor *w, int r, int i)
{
    if (!w->qbits)
        return fabs(wref(w, r, i));
    double s, b;
    qgroup_d(w, r, i, &s, &b);
    return fabs(qval_d(w, qcode_d(w, r, i)) * s) + fabs(b);
}

// ---- linear ----

static void linear_ref(double *y, const float *x, const struct tensor *w, const struct tensor *b,
                       int n_tok)
{
    int out = (int)w->shape[0], in = (int)w->shape[1];
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < out; r++) {
            double acc = b ? ld(b->data, b->dtype, r) : 0;
            for (int i = 0; i < in; i++)
                acc += (double)x[(size_t)t * in + i] * wref(w, r, i);
            y[(size_t)t * out + r] = acc;
        }
}

static void linear_case(struct kc_bes *bs, struct kc_errstat *es, const struct tensor *w,
                        const struct tensor *b, int n_tok)
{
    int out = (int)w->shape[0], in = (int)w->shape[1];
    float *x = kc_fvec((size_t)n_tok * in, -1, 1);
    float *y = malloc((size_t)n_tok * out * sizeof *y);
    double *ref = malloc((size_t)n_tok * out * sizeof *ref);
    char what[128];
    linear_ref(ref, x, w, b, n_tok);
    snprintf(what, sizeof what, "linear %s q%d n_tok=%d in=%d out=%d", dtype_name(w->dtype),
             w->qbits, n_tok, in, out);
    for (int i = 0; i < bs->n; i++) {
        memset(y, 0xff, (size_t)n_tok * out * sizeof *y); /* NaN: catches unwritten outputs */
        bs->be[i]->ops->linear(bs->be[i], y, (int)w->shape[0], x, w, b, n_tok);
        kc_check(es, what, bs->be[i], y, ref, (size_t)n_tok * out, 1e-9, 1e-4);
    }
    free(x);
    free(y);
    free(ref);
}

static void test_linear(void **state)
{
    (void)state;
    /* n_tok, in, out, extra row padding, bias */
    static const int shapes[][5] = {
        {1, 1, 1, 0, 0},    {1, 17, 5, 0, 1},    {1, 64, 1, 0, 0},   {1, 1000, 37, 3, 1},
        {2, 33, 65, 0, 0},  {3, 129, 31, 0, 1},  {7, 300, 70, 5, 0}, {8, 256, 64, 0, 1},
        {9, 515, 97, 0, 1}, {33, 70, 40, 0, 0},  {17, 600, 33, 1, 0}, {300, 40, 45, 0, 1},
        {13, 515, 97, 0, 1}, {12, 16, 100, 0, 0}, {40, 1, 3, 0, 1},
        /* float GEMM's token blocks (ADR 0144): 3 contraction blocks, 10 panels in two groups,
         * the last panel partial, token blocks of 96, 96 and 8 */
        {200, 600, 150, 1, 1}, {250, 257, 300, 0, 0},
    };
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    for (size_t d = 0; d < 3; d++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int *sh = shapes[s];
            struct tensor w = wrand(dts[d], sh[2], sh[1], sh[1] + sh[3], 0.5f);
            struct tensor b = wrand(dts[d], 1, sh[2], sh[2], 1.0f);
            int64_t bshape[1] = {sh[2]};
            tensor_init(&b, dts[d], b.data, 1, bshape);
            linear_case(&bs, &es, &w, sh[4] ? &b : NULL, sh[0]);
            tfree(&w);
            tfree(&b);
        }
    }
    kc_report("linear", &es);
    kc_close(&bs);
}

/* Float W repacked as FPAN (kern.h; the AVX-512 variant) against the double reference on
 * awkward shapes: rows not a multiple of the 32-row panel, inputs across and off the
 * 256-input blocks, padded row strides, every tile's token count (1-9; from 12 tiles of 2
 * panels by 6, the last 1-5 tokens on the others: 12-15, 17, 40; across the passes of 96
 * tokens: 97, 200), with and without a bias, with y's row stride wider than out (the columns
 * past out stay as they were). Each token's outputs are the same bits alone and in any batch
 * and through linear_batch (one summation order for every token count and row split); the rows
 * of an FPAN table through embed are the stored values, bit for bit. Skipped where no backend
 * repacks (no AVX-512). */
static void test_linear_fpan(void **state)
{
    (void)state;
    enum { NT = 200, PAD = 5 };
    /* in, out, extra row padding, bias */
    static const int shapes[][4] = {
        {1, 32, 0, 1}, {7, 33, 0, 0}, {256, 47, 3, 1}, {257, 100, 0, 1}, {600, 130, 1, 0},
        {16, 64, 0, 1}, {513, 161, 0, 0},
    };
    static const int toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 17, 40, 97, NT};
    static const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    struct kc_bes bs;
    struct kc_errstat es = {0};
    bool any = false;
    kc_open(&bs);
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int in = shapes[s][0], out = shapes[s][1], ldy = out + PAD;
            struct tensor w = wrand(dts[d], out, in, in + shapes[s][2], 0.5f);
            struct tensor b = wrand(dts[d], 1, out, out, 1.0f);
            int64_t bshape[1] = {out};
            tensor_init(&b, dts[d], b.data, 1, bshape);
            const struct tensor *bp = shapes[s][3] ? &b : NULL;
            float *x = kc_fvec((size_t)NT * in, -1, 1);
            float *y = malloc((size_t)NT * ldy * sizeof *y), *yn = malloc((size_t)NT * ldy * sizeof *yn);
            double *ref = malloc((size_t)NT * out * sizeof *ref);
            float *emb = malloc((size_t)out * in * sizeof *emb);
            int32_t *ids = malloc((size_t)out * sizeof *ids);
            assert_true(x && y && yn && ref && emb && ids);
            linear_ref(ref, x, &w, bp, NT);
            for (int r = 0; r < out; r++)
                ids[r] = (r * 7) % out;
            for (int i = 0; i < bs.n; i++) {
                struct backend *be = bs.be[i];
                struct tensor wp = w;
                struct err e = {0};
                char what[128];
                assert_int_equal(be->ops->prepare_weight(be, &wp, PREP_REPACK_BESIDE | PREP_MATRIX, &e), 0);
                if (!wp.packed)
                    continue;
                any = true;
                memset(y, 0xff, (size_t)NT * ldy * sizeof *y);
                be->ops->linear(be, y, ldy, x, &wp, bp, NT);
                for (int t = 0; t < NT; t++) {
                    for (int c = out; c < ldy; c++)
                        if (!isnan(y[(size_t)t * ldy + c]))
                            fail_msg("%s fpan %dx%d on %s: y[%d][%d] past out was written",
                                     dtype_name(dts[d]), out, in, be->name, t, c);
                    for (int r = 0; r < out; r++)
                        yn[(size_t)t * out + r] = y[(size_t)t * ldy + r];
                }
                snprintf(what, sizeof what, "linear fpan %s n_tok=%d in=%d out=%d", dtype_name(dts[d]),
                         NT, in, out);
                kc_check(&es, what, be, yn, ref, (size_t)NT * out, 1e-9, 1e-4);
                /* tokens 3 .. 3+n as batches of n, and through linear_batch beside a second
                 * product: the same bits as among all NT */
                for (size_t k = 0; k < sizeof toks / sizeof toks[0] && toks[k] + 3 <= NT; k++) {
                    const int n = toks[k];
                    memset(yn, 0xff, (size_t)n * ldy * sizeof *yn);
                    be->ops->linear(be, yn, ldy, x + (size_t)3 * in, &wp, bp, n);
                    for (int t = 0; t < n; t++)
                        if (memcmp(yn + (size_t)t * ldy, y + (size_t)(t + 3) * ldy, (size_t)out * sizeof *y))
                            fail_msg("%s fpan %dx%d on %s: token %d of a batch of %d differs",
                                     dtype_name(dts[d]), out, in, be->name, t + 3, n);
                    float *y2 = malloc((size_t)n * out * sizeof *y2);
                    assert_non_null(y2);
                    memset(yn, 0xff, (size_t)n * ldy * sizeof *yn);
                    struct linear_job jobs[2] = {{yn, ldy, x + (size_t)3 * in, &wp, bp, n},
                                                 {y2, out, x, &wp, NULL, n}};
                    be->ops->linear_batch(be, jobs, 2);
                    for (int t = 0; t < n; t++) {
                        if (memcmp(yn + (size_t)t * ldy, y + (size_t)(t + 3) * ldy, (size_t)out * sizeof *y))
                            fail_msg("%s fpan %dx%d on %s: linear_batch token %d of %d differs",
                                     dtype_name(dts[d]), out, in, be->name, t + 3, n);
                        /* the second product (tokens 0 .. n, no bias) as linear gave them */
                        if (!bp && memcmp(y2 + (size_t)t * out, y + (size_t)t * ldy, (size_t)out * sizeof *y))
                            fail_msg("%s fpan %dx%d on %s: linear_batch's second product, token %d",
                                     dtype_name(dts[d]), out, in, be->name, t);
                    }
                    free(y2);
                }
                be->ops->embed(be, emb, &wp, ids, out);
                for (int r = 0; r < out; r++)
                    for (int c = 0; c < in; c++)
                        if (emb[(size_t)r * in + c] != (float)wref(&w, ids[r], c))
                            fail_msg("%s fpan %dx%d on %s: embedding row %d col %d differs",
                                     dtype_name(dts[d]), out, in, be->name, ids[r], c);
            }
            free(x);
            free(y);
            free(yn);
            free(ref);
            free(emb);
            free(ids);
            tfree(&w);
            tfree(&b);
        }
    kc_report("linear fpan", &es);
    kc_close(&bs);
    if (!any)
        skip();
}

/*
 * Quantized linear: every ISA against the double-precision reference, and
 * every SIMD variant against the scalar one, per output. Tolerance: the
 * kernels evaluate sum_i x_i (s q_i + b) in f32, the SIMD ones regrouped as
 * sum_g (s_g sum q x + b_g sum x); every term is exact or one rounding from
 * exact and a sum of n terms in any order errs by at most about n u times
 * the sum of the magnitudes involved (u = 2^-24; Higham, Accuracy and
 * Stability, 2nd ed., section 4.2). So each output may differ from the
 * exact value by (in + 16) u sum_i |x_i| (|s q_i| + |b|), plus in * 2^-140
 * for products that underflow into f32 subnormals (e8m0 scale 2^-127);
 * two f32 results by twice that. Nothing here depends on the summation
 * order, so the bound holds for every ISA and thread split.
 *
 * SIMD variants with an integer matvec (kern.h "qi": affine 4/8-bit, groups
 * 32/64/128, and mxfp4) round x per group to xs_g q_i with xs_g = max_g |x| / 32639,
 * |x_i - xs_g q_i| <= xs_g / 2 (plus an ulp or two of x_i from the f32
 * scale), while the bias term keeps the exact sum of x: their outputs may
 * differ further by sum_i |s q_i| (xs_g / 2 (1 + 2^-16) + 2^-22 |x_i|).
 */
struct qstat {
    double worst[3]; /* largest |err| / bound per ISA */
};

/* True when an ISA variant (not the scalar reference) runs W through the
 * integer matvec: the rule of kern_avx2_qi.c's qi_ok. */
static bool qi_applies(const struct backend *be, const struct tensor *w)
{
    int g = w->qgroup;
    if (kc_isa_index(be) > 0 && w->qmode == QMODE_MXFP4)
        return g == 32;
    return kc_isa_index(be) > 0 && w->qmode == QMODE_AFFINE && (w->qbits == 4 || w->qbits == 8) &&
           (g == 32 || g == 64 || g == 128);
}

static void qlinear_case(struct kc_bes *bs, struct qstat *qs, const struct tensor *w, int n_tok,
                         float xamp)
{
    int out = (int)w->shape[0], in = (int)w->shape[1];
    size_t n = (size_t)n_tok * out;
    float *x = kc_fvec((size_t)n_tok * in, -xamp, xamp);
    float *y = malloc(n * sizeof *y), *y0 = malloc(n * sizeof *y0);
    double *ref = malloc(n * sizeof *ref), *bnd = malloc(n * sizeof *bnd);
    double *bqi = malloc(n * sizeof *bqi);
    assert_true(y && y0 && ref && bnd && bqi);
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < out; r++) {
            double acc = 0, mag = 0, eqi = 0, xmax = 0;
            for (int i = 0; i < in; i++) {
                double xi = x[(size_t)t * in + i], s, b;
                if (i % w->qgroup == 0) {
                    xmax = 0;
                    for (int k = i; k < i + w->qgroup && k < in; k++)
                        xmax = fmax(xmax, fabs(x[(size_t)t * in + k]));
                }
                acc += xi * wref(w, r, i);
                mag += fabs(xi) * wmag(w, r, i);
                qgroup_d(w, r, i, &s, &b);
                eqi += fabs(s * qval_d(w, qcode_d(w, r, i))) *
                       (xmax / 32639 / 2 * (1 + ldexp(1, -16)) + ldexp(fabs(xi), -22));
            }
            ref[(size_t)t * out + r] = acc;
            bnd[(size_t)t * out + r] = (in + 16) * ldexp(mag, -24) + in * ldexp(1.0, -140);
            bqi[(size_t)t * out + r] = eqi;
        }
    /* every backend on the weights as stored, then those a backend repacks when it
     * prepares them (QG16 on VNNI hosts) once more on its own copy */
    for (int run = 0; run < 2 * bs->n; run++) {
        const int i = run % bs->n;
        struct backend *be = bs->be[i];
        bool qi = qi_applies(be, w);
        struct tensor wp = *w;
        if (run >= bs->n) {
            struct err e = {0};
            assert_int_equal(be->ops->prepare_weight(be, &wp, PREP_REPACK_BESIDE, &e), 0);
            if (!wp.packed)
                continue;
        }
        memset(y, 0xff, n * sizeof *y); /* NaN: catches unwritten outputs */
        be->ops->linear(be, y, (int)w->shape[0], x, &wp, NULL, n_tok);
        if (run == 0)
            memcpy(y0, y, n * sizeof *y); /* bs->be[0] is the scalar reference */
        for (size_t k = 0; k < n; k++) {
            double bk = bnd[k] + (qi ? bqi[k] : 0);
            double e = fabs((double)y[k] - ref[k]), e0 = fabs((double)y[k] - (double)y0[k]);
            double rel = isfinite(e) ? e / bk : INFINITY;
            int ix = kc_isa_index(be);
            qs->worst[ix] = rel > qs->worst[ix] ? rel : qs->worst[ix];
            if (!(e <= bk && e0 <= bk + bnd[k])) {
                print_error("linear mode %d q%d g%d %s n_tok=%d in=%d out=%d on %s (%d threads%s): "
                            "y[%zu] = %.9g, exact %.9g, scalar %.9g, bound %.3g\n",
                            (int)w->qmode, w->qbits, w->qgroup, dtype_name(w->qsdtype), n_tok, in,
                            out, be->name, be->n_threads, wp.packed ? ", repacked" : "", k,
                            (double)y[k], ref[k], (double)y0[k], bk);
                fail();
            }
        }
    }
    free(x);
    free(y);
    free(y0);
    free(ref);
    free(bnd);
    free(bqi);
}

static void qreport(const char *test, const struct qstat *qs)
{
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    printf("    %-12s worst |err|/bound:", test);
    for (int i = 0; i < 3; i++)
        printf("  %s %.2g", names[i], qs->worst[i]);
    printf("\n");
}

/* n_tok, groups per row, out: one group, many groups, partial SIMD blocks,
 * rows not a multiple of the 4-row unroll or of the VNNI GEMM's 16-row
 * panels, > 2048 codes (several scale chunks, with tokens past one 8-token
 * tile), n_tok 1..9 and past the GEMM threshold. */
static const int k_qshapes[][3] = {
    {1, 1, 7}, {3, 2, 1}, {1, 3, 33}, {20, 4, 40}, {6, 3, 33}, {9, 17, 9},
    {2, 70, 5}, {4, 5, 3}, {5, 2, 4}, {7, 1, 6}, {8, 3, 12},
    {11, 40, 21}, {17, 9, 35},
    {33, 2, 19}, {64, 3, 24},   /* past every gemm_min_tok_q: the quantized GEMM path */
    {32, 17, 200},              /* enough rows and tokens for three VNNI panels at a time */
};

static void test_linear_quant(void **state)
{
    (void)state;
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const enum dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    size_t ns = sizeof k_qshapes / sizeof k_qshapes[0];
    struct kc_bes bs;
    struct qstat qs = {{0}};
    kc_open(&bs);
    for (int bi = 0; bi < 6; bi++)
        for (int gi = 0; gi < 3; gi++)
            for (size_t s = 0; s < ns; s++) {
                enum dtype sdt = sdts[(bi + gi + s) % 3];
                const int *sh = k_qshapes[s];
                struct tensor w = qrand(bits[bi], groups[gi], sdt, sh[2], sh[1] * groups[gi]);
                qlinear_case(&bs, &qs, &w, sh[0], 1.0f);
                tfree(&w);
            }
    /* a group size MLX never writes (48: not a power of two) takes the
     * kernels' generic path */
    for (int bi = 0; bi < 6; bi++) {
        struct tensor w = qrand(bits[bi], 48, sdts[bi % 3], 5, 480);
        qlinear_case(&bs, &qs, &w, 1 + bi, 1.0f);
        tfree(&w);
    }
    qreport("linear_q", &qs);
    kc_close(&bs);
}

/* A NaN or infinity in x reaches every output of its token on every ISA, as
 * in f32 arithmetic (the integer path must not round it away), and the other
 * tokens stay finite: affine 4 and 8 bits, and mxfp4 (bits[] 0). */
static void test_linear_quant_nonfinite(void **state)
{
    (void)state;
    static const int bits[] = {4, 8, 0};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    struct kc_bes bs;
    kc_open(&bs);
    for (int bi = 0; bi < 3; bi++)
        for (int k = 0; k < 6; k++) { /* 2 tokens (matvec), then 4 (the VNNI 4-bit GEMM) */
            const int nt = k < 3 ? 2 : 4;
            struct tensor w = bits[bi] ? qrand(bits[bi], 64, DTYPE_BF16, 9, 192)
                                       : qrand_fp(QMODE_MXFP4, 9, 192, false);
            float *x = kc_fvec((size_t)nt * 192, -1.0f, 1.0f), y[36];
            x[70 + k % 3] = bad[k % 3]; /* token 0, second group */
            for (int i = 0; i < bs.n; i++) {
                bs.be[i]->ops->linear(bs.be[i], y, 9, x, &w, NULL, nt);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < 9; r++)
                        if (isfinite(y[9 * t + r]) != (t > 0))
                            fail_msg("q%d x=%g, %d tokens on %s: y[%d][%d] = %g", bits[bi],
                                     (double)bad[k % 3], nt, bs.be[i]->name, t, r,
                                     (double)y[9 * t + r]);
            }
            free(x);
            tfree(&w);
        }
    /* a group of tiny x (its integer scale would leave the f32 range) adds nothing
     * visible: every ISA agrees with the scalar reference (affine 4-bit, mxfp4) */
    for (int c = 0; c < 4; c++) { /* q4 and mxfp4, 1 token and 4 */
        const int fp = c & 1, nt = c < 2 ? 1 : 4;
        struct tensor w = fp ? qrand_fp(QMODE_MXFP4, 9, 128, false) : qrand(4, 64, DTYPE_BF16, 9, 128);
        float *x = kc_fvec((size_t)nt * 128, -1.0f, 1.0f), y[36], y0[36];
        for (int i = 64; i < 128; i++)
            x[i] = 1e-39f * (float)(i - 96);
        for (int t = 1; t < nt; t++) /* the same x: the 1-token check for every token */
            memcpy(x + 128 * t, x, 128 * sizeof *x);
        for (int i = 0; i < bs.n; i++) {
            bs.be[i]->ops->linear(bs.be[i], i ? y : y0, 9, x, &w, NULL, nt);
            for (int r = 0; r < 9 * nt && i; r++)
                if (!(fabsf(y[r] - y0[r]) <= 1e-4f * (1.0f + fabsf(y0[r]))))
                    fail_msg("tiny x (%s, %d tokens) on %s: y[%d] = %g, scalar %g", fp ? "mxfp4" : "q4",
                             nt, bs.be[i]->name, r, (double)y[r], (double)y0[r]);
        }
        free(x);
        tfree(&w);
    }
    kc_close(&bs);
}

static void test_linear_fp(void **state)
{
    (void)state;
    static const enum qmode modes[] = {QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4};
    size_t ns = sizeof k_qshapes / sizeof k_qshapes[0];
    struct kc_bes bs;
    struct qstat qs = {{0}};
    kc_open(&bs);
    for (int m = 0; m < 3; m++) {
        int group = modes[m] == QMODE_NVFP4 ? 16 : 32;
        for (size_t s = 0; s < ns; s++)
            for (int edge = 0; edge < 2; edge++) {
                const int *sh = k_qshapes[s];
                struct tensor w = qrand_fp(modes[m], sh[2], sh[1] * group, edge);
                /* small x keeps the sums of 2^127-scaled groups finite */
                qlinear_case(&bs, &qs, &w, sh[0], edge ? 0x1p-10f : 1.0f);
                tfree(&w);
            }
    }
    qreport("linear_fp", &qs);
    kc_close(&bs);
}

/* Dequantization (embedding rows, the GEMM panels' wrow_f32) of every mode
 * on every ISA against the double decoders: fp-mode values are products of
 * at most 4- and 4-significant-bit numbers, exact in f32 (also as
 * subnormals down to 2^-136), so they must match bit for bit; affine
 * s q + b rounds at most twice (s q is exact unless s is F32): within
 * 2u (|s q| + |b|). */
static void test_dequant(void **state)
{
    (void)state;
    struct kc_bes bs;
    kc_open(&bs);
    enum { OUT = 6 };
    struct tensor ws[6 * 3 + 3 * 2];
    int nw = 0;
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const enum dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    for (int bi = 0; bi < 6; bi++)
        for (int d = 0; d < 3; d++)
            ws[nw++] = qrand(bits[bi], 32 << d, sdts[(bi + d) % 3], OUT, 384 + (32 << d));
    static const enum qmode modes[] = {QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4};
    for (int m = 0; m < 3; m++)
        for (int edge = 0; edge < 2; edge++)
            ws[nw++] = qrand_fp(modes[m], OUT, 32 * 19, edge); /* 608: every fp group size divides it */
    int32_t ids[OUT];
    for (int r = 0; r < OUT; r++)
        ids[r] = OUT - 1 - r;
    for (int k = 0; k < nw; k++) {
        const struct tensor *w = &ws[k];
        int in = (int)w->shape[1];
        float *y = malloc((size_t)OUT * in * sizeof *y);
        assert_non_null(y);
        for (int i = 0; i < bs.n; i++) {
            memset(y, 0xff, (size_t)OUT * in * sizeof *y);
            bs.be[i]->ops->embed(bs.be[i], y, w, ids, OUT);
            for (int t = 0; t < OUT; t++)
                for (int c = 0; c < in; c++) {
                    double ref = wref(w, ids[t], c), got = y[(size_t)t * in + c];
                    double tol = w->qmode == QMODE_AFFINE ? ldexp(wmag(w, ids[t], c), -23) : 0;
                    if (!(fabs(got - ref) <= tol)) {
                        print_error("dequant mode %d q%d g%d row %d col %d on %s: %.9g, exact %.9g\n",
                                    (int)w->qmode, w->qbits, w->qgroup, ids[t], c, bs.be[i]->name,
                                    got, ref);
                        fail();
                    }
                }
            /* a table the backend repacks (QG16: a head tied to the embedding) gives the
             * same rows, bit for bit */
            struct tensor wp = *w;
            struct err e = {0};
            assert_int_equal(bs.be[i]->ops->prepare_weight(bs.be[i], &wp, PREP_REPACK_BESIDE, &e), 0);
            if (wp.packed) {
                float *yp = malloc((size_t)OUT * in * sizeof *yp);
                assert_non_null(yp);
                bs.be[i]->ops->embed(bs.be[i], yp, &wp, ids, OUT);
                if (memcmp(yp, y, (size_t)OUT * in * sizeof *y) != 0)
                    fail_msg("repacked q%d g%d embedding rows differ on %s", w->qbits, w->qgroup,
                             bs.be[i]->name);
                free(yp);
            }
        }
        free(y);
    }
    for (int k = 0; k < nw; k++)
        tfree(&ws[k]);
    kc_close(&bs);
}

/* Repacked 4/8-bit weights (QG16) give each token the same bits whatever batch it is in,
 * wherever in it, and whatever the thread count: one kernel and one summation order
 * for every token count (the greedy output of a request beside others is its own). */
static void test_linear_batch_invariant(void **state)
{
    (void)state;
    enum { NT = 35 };
    struct kc_bes bs;
    kc_open(&bs);
    /* 601 rows: 38 panels, read three at a time (VNNI 4-bit), with 3 threads in pieces of
     * three panels, the last piece two; two chunks of codes */
    static const int shapes[][2] = {{37, 2048 + 256}, {16, 64}, {5, 192}, {601, 2048 + 128}};
    for (int s = 0; s < 8; s++) { /* 4-bit, then 8-bit */
        const int out = shapes[s % 4][0], in = shapes[s % 4][1];
        struct tensor w = qrand(s < 4 ? 4 : 8, 64, s % 4 == 1 ? DTYPE_F16 : DTYPE_BF16, out, in);
        float *x = kc_fvec((size_t)NT * in, -1.0f, 1.0f);
        float *ya = malloc((size_t)NT * out * sizeof *ya), *y1 = malloc((size_t)out * sizeof *y1);
        float *yr = malloc((size_t)NT * out * sizeof *yr);
        assert_true(ya && y1 && yr);
        bool have_ref = false;
        for (int i = 0; i < bs.n; i++) {
            struct backend *be = bs.be[i];
            struct tensor wp = w;
            struct err e = {0};
            assert_int_equal(be->ops->prepare_weight(be, &wp, PREP_REPACK_BESIDE, &e), 0);
            if (!wp.packed)
                continue;
            be->ops->linear(be, ya, out, x, &wp, NULL, NT);
            if (!have_ref) /* the first repacking backend: the others (threads) must agree */
                memcpy(yr, ya, (size_t)NT * out * sizeof *ya);
            have_ref = true;
            if (memcmp(yr, ya, (size_t)NT * out * sizeof *ya) != 0)
                fail_msg("%d x %d: %s (%d threads) differs from the first", out, in, be->name,
                         be->n_threads);
            for (int t = 0; t < NT; t++) {
                be->ops->linear(be, y1, out, x + (size_t)t * in, &wp, NULL, 1);
                if (memcmp(y1, ya + (size_t)t * out, (size_t)out * sizeof *y1) != 0)
                    fail_msg("%d x %d on %s: token %d alone differs from it among %d", out, in,
                             be->name, t, NT);
            }
            /* and in batches of 2-31 from token 3: with VNNI, below 8 tokens two panels are
             * read together, tokens in pairs; from 8 the one-panel tiles of 8 and their tails
             * of 4, 2 and 1 */
            static const int nbs[] = {2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 31};
            float *yb = malloc((size_t)31 * out * sizeof *yb);
            assert_non_null(yb);
            for (size_t b = 0; b < sizeof nbs / sizeof nbs[0]; b++) {
                const int nb = nbs[b];
                be->ops->linear(be, yb, out, x + (size_t)3 * in, &wp, NULL, nb);
                if (memcmp(yb, ya + (size_t)3 * out, (size_t)nb * out * sizeof *yb) != 0)
                    fail_msg("%d x %d on %s: tokens 3-%d as a batch of %d differ", out, in,
                             be->name, 2 + nb, nb);
            }
            free(yb);
        }
        free(x);
        free(ya);
        free(y1);
        free(yr);
        tfree(&w);
        if (!have_ref) { /* no backend here repacks (no AVX-512 VNNI): nothing was checked */
            kc_close(&bs);
            skip();
        }
    }
    kc_close(&bs);
}

/* Float weights below the GEMM threshold (16 tokens with AVX2, 24 with AVX-512): the
 * multi-token matvec forms every token's sums as the one-token matvec does, so each token
 * of a batch equals it alone, on every backend and thread count (batched decode of bf16
 * models gives each sequence its own greedy output). */
static void test_linear_fp_batch_invariant(void **state)
{
    (void)state;
    struct kc_bes bs;
    kc_open(&bs);
    /* AVX-512 from 5 tokens: rows by 4 (37 leaves one), inputs in blocks of 512 (2088 ends
     * in a block of 552: 17 steps of 32 and a masked 8; 1024 in two whole blocks) */
    static const int shapes[][2] = {{37, 2048 + 40}, {5, 33}, {64, 512}, {9, 1024}};
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < 4; s++) {
            const int out = shapes[s][0], in = shapes[s][1];
            struct tensor w = wrand(dts[d], out, in, in, 0.5f);
            float *x = kc_fvec((size_t)23 * in, -1.0f, 1.0f);
            float *ya = malloc((size_t)23 * out * sizeof *ya), *y1 = malloc((size_t)out * sizeof *y1);
            assert_true(ya && y1);
            for (int i = 0; i < bs.n; i++) {
                struct backend *be = bs.be[i];
                /* 23: AVX-512 carries 16 tokens' chains at a time, then the other 7 */
                const int nts[] = {2, 3, 4, 5, 7, 12, 15, 23};
                for (int k = 0; k < 8; k++) {
                    const int nt = nts[k];
                    if (nt >= 16 && strcmp(be->name, "cpu-avx512") != 0)
                        continue;
                    be->ops->linear(be, ya, out, x, &w, NULL, nt);
                    for (int t = 0; t < nt; t++) {
                        be->ops->linear(be, y1, out, x + (size_t)t * in, &w, NULL, 1);
                        if (memcmp(y1, ya + (size_t)t * out, (size_t)out * sizeof *y1) != 0)
                            fail_msg("%s %d x %d on %s (%d threads): token %d alone differs from "
                                     "it among %d", dtype_name(dts[d]), out, in, be->name,
                                     be->n_threads, t, nt);
                    }
                }
            }
            free(x);
            free(ya);
            free(y1);
            tfree(&w);
        }
    kc_close(&bs);
}

/* Quantized weights in their stored layout on the integer matvec (AVX2; the scalar reference
 * runs every linear as its matvec): a token's outputs are the same bits among 1 .. 30 others
 * as alone (below 32 tokens, where 8-bit W would take the GEMM), with a row count that leaves
 * a block of 4 rows short, 4-bit rows ending in half a step and two chunks of codes (AVX-512
 * takes such weights into its QG tiles from 4 tokens, whose f32 order differs: not checked
 * here; repacked weights are test_linear_batch_invariant's). */
static void test_linear_qi_batch_invariant(void **state)
{
    (void)state;
    enum { NT = 31 };
    struct kc_bes bs;
    kc_open(&bs);
    static const int nts[] = {2, 3, 5, 9, NT};
    /* out, in: 4-bit g64 over two chunks; g32 over two chunks ending in half a step; g32 in
     * one chunk ending so, with f32 scales; 8-bit g64 over two chunks; mxfp4 */
    static const int shapes[][2] = {{9, 2048 + 192}, {37, 2048 + 160}, {9, 160}, {37, 160},
                                    {37, 2048 + 192}, {9, 192}};
    for (int c = 0; c < 6; c++) {
        const int out = shapes[c][0], in = shapes[c][1];
        struct tensor w = c == 5   ? qrand_fp(QMODE_MXFP4, out, in, false)
                          : c == 4 ? qrand(8, 64, DTYPE_F16, out, in)
                          : c == 3 ? qrand(4, 32, DTYPE_F32, out, in)
                                   : qrand(4, c == 0 ? 64 : 32, DTYPE_BF16, out, in);
        float *x = kc_fvec((size_t)NT * in, -1.0f, 1.0f);
        float *ya = malloc((size_t)NT * out * sizeof *ya), *y1 = malloc((size_t)out * sizeof *y1);
        assert_true(ya && y1);
        for (int i = 0; i < bs.n; i++) {
            struct backend *be = bs.be[i];
            if (strstr(be->name, "avx512"))
                continue;
            for (int k = 0; k < 5; k++) {
                be->ops->linear(be, ya, out, x, &w, NULL, nts[k]);
                for (int t = 0; t < nts[k]; t++) {
                    be->ops->linear(be, y1, out, x + (size_t)t * in, &w, NULL, 1);
                    if (memcmp(y1, ya + (size_t)t * out, (size_t)out * sizeof *y1) != 0)
                        fail_msg("case %d (%d x %d) on %s (%d threads): token %d alone differs "
                                 "from it among %d", c, out, in, be->name, be->n_threads, t, nts[k]);
                }
            }
        }
        free(x);
        free(ya);
        free(y1);
        tfree(&w);
    }
    kc_close(&bs);
}

/* x as --fast rounds it for 4-bit W (kern.h "qi", then the high limb alone): per group of G,
 * xs = max |x| / 32639 and q = rint(x 32639 / max) in f32 as the preparation computes them,
 * then 256 ((q + 128) >> 8) xs, an int8 per element. */
static void fast_x(double *xf, const float *x, int in, int G)
{
    for (int g0 = 0; g0 < in; g0 += G) {
        float m = 0;
        for (int i = g0; i < g0 + G; i++)
            m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
        const float xs = m / 32639.0f, inv = 32639.0f / m;
        for (int i = g0; i < g0 + G; i++) {
            int q = (int)rintf(x[i] * inv);
            xf[i] = 256.0 * (double)((q + 128) >> 8) * (double)xs;
        }
    }
}

/* --fast (MLXCEL_FAST) on the backends that have it (AVX2, AVX-512): affine 4-bit W, stored
 * and repacked, against the products of x rounded as fast_x says (the codes times x's high
 * limb; the bias term keeps the exact sum of x), to the f32 bound of test_linear_quant; one
 * token alone equal to it in a batch; and every other W exactly as without --fast. The
 * integer kernels take 4-bit W at every token count with AVX2 and on VNNI hosts (they repack);
 * on AVX-512 without VNNI the f32 GEMM, which has no fast form, takes larger batches, whose
 * outputs must then be the exact backend's bits. */
static void test_linear_quant_fast(void **state)
{
    (void)state;
    struct kc_bes bs, fs;
    kc_open(&bs);
    struct backend_opts fo = *test_backend_opts();
    fo.fast = true;
    kc_open_opts(&fs, &fo);
    static const int shapes[][3] = {{1, 1, 7},    {3, 2, 33},  {4, 5, 3},    {4, 3, 200},
                                    {9, 17, 9},   {17, 40, 21}, {33, 2, 19}, {300, 4, 20},
                                    {32, 9, 200}};
    static const int groups[] = {32, 64, 128};
    static const enum dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    int n_fast = 0;
    double worst = 0, worst_exact = 0;
    bool vnni[N_BE_MAX];
    for (int i = 0; i < fs.n; i++) { /* the backends that repack run every batch on integers */
        struct tensor probe = qrand(4, 64, DTYPE_BF16, 16, 64);
        struct tensor pp = probe;
        struct err e = {0};
        assert_int_equal(fs.be[i]->ops->prepare_weight(fs.be[i], &pp, PREP_REPACK_BESIDE, &e), 0);
        vnni[i] = pp.packed;
        tfree(&probe);
    }
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int gi = 0; gi < 3; gi++)
            for (int bits = 4; bits <= 8; bits += 4) {
                const int n_tok = shapes[sh][0], G = groups[gi], in = shapes[sh][1] * G,
                          out = shapes[sh][2];
                struct tensor w = qrand(bits, G, sdts[(sh + gi) % 3], out, in);
                const size_t n = (size_t)n_tok * out;
                float *x = kc_fvec((size_t)n_tok * in, -1, 1), *y = malloc(n * sizeof *y),
                      *y0 = malloc(n * sizeof *y0), *y1 = malloc((size_t)out * sizeof *y1);
                double *xf = malloc((size_t)in * sizeof *xf), *ref = malloc(n * sizeof *ref),
                       *bnd = malloc(n * sizeof *bnd), *ex = malloc(n * sizeof *ex);
                assert_true(x && y && y0 && y1 && xf && ref && bnd && ex);
                for (int t = 0; t < n_tok; t++) {
                    fast_x(xf, x + (size_t)t * in, in, G);
                    for (int r = 0; r < out; r++) {
                        double acc = 0, mag = 0, e = 0;
                        for (int i = 0; i < in; i++) {
                            double s, b, xi = x[(size_t)t * in + i], c = qcode_d(&w, r, i);
                            qgroup_d(&w, r, i, &s, &b);
                            acc += xf[i] * s * c + xi * b;
                            e += xi * (s * c + b);
                            mag += fabs(xf[i] * s * c) + fabs(xi * b);
                        }
                        ref[(size_t)t * out + r] = acc;
                        ex[(size_t)t * out + r] = e;
                        bnd[(size_t)t * out + r] = (in + 16) * ldexp(mag, -24);
                    }
                }
                for (int i = 0; i < fs.n; i++) {
                    struct backend *be = fs.be[i], *ref_be = bs.be[i];
                    assert_string_equal(be->name, ref_be->name);
                    for (int packed = 0; packed < 2; packed++) {
                        struct tensor wp = w, wq = w;
                        struct err e = {0};
                        if (packed) {
                            assert_int_equal(be->ops->prepare_weight(be, &wp, PREP_REPACK_BESIDE, &e), 0);
                            assert_int_equal(ref_be->ops->prepare_weight(ref_be, &wq, PREP_REPACK_BESIDE, &e), 0);
                            if (!wp.packed)
                                continue;
                        }
                        memset(y, 0xff, n * sizeof *y);
                        be->ops->linear(be, y, out, x, &wp, NULL, n_tok);
                        ref_be->ops->linear(ref_be, y0, out, x, &wq, NULL, n_tok);
                        if (!be->fast || bits == 8) { /* --fast leaves these as they were */
                            if (memcmp(y, y0, n * sizeof *y) != 0)
                                fail_msg("q%d g%d %d x %d x %d on %s: --fast changed a product it "
                                         "has no fast form for", bits, G, n_tok, out, in, be->name);
                        } else {
                            n_fast++;
                            const bool must = vnni[i] || kc_isa_index(be) == 1 || n_tok < 4;
                            for (size_t k = 0; k < n; k++) {
                                double d = fabs((double)y[k] - ref[k]);
                                if (!must && y[k] == y0[k]) /* the f32 GEMM's exact product */
                                    continue;
                                worst = fmax(worst, d / bnd[k]);
                                worst_exact = fmax(worst_exact, fabs((double)y[k] - ex[k]) / bnd[k]);
                                if (!(d <= bnd[k]))
                                    fail_msg("q4 g%d %d x %d x %d on %s (%d threads%s): y[%zu] = %.9g, "
                                             "fast reference %.9g, bound %.3g", G, n_tok, out, in,
                                             be->name, be->n_threads, packed ? ", repacked" : "", k,
                                             (double)y[k], ref[k], bnd[k]);
                            }
                            if (packed) /* one kernel for every token count: a token's own bits */
                                for (int t = 0; t < n_tok; t++) {
                                    be->ops->linear(be, y1, out, x + (size_t)t * in, &wp, NULL, 1);
                                    if (memcmp(y1, y + (size_t)t * out, (size_t)out * sizeof *y1) != 0)
                                        fail_msg("q4 g%d on %s: token %d alone differs from it among %d",
                                                 G, be->name, t, n_tok);
                                }
                        }
                    }
                }
                free(x), free(y), free(y0), free(y1), free(xf), free(ref), free(bnd), free(ex);
                tfree(&w);
            }
    printf("    linear_fast  %d checks, worst |err|/bound %.2g against --fast's rounding, %.3g "
           "against exact x\n", n_fast, worst, worst_exact);
    kc_close(&fs);
    kc_close(&bs);
    if (!n_fast) /* no backend here has a fast form (no AVX2): nothing was checked */
        skip();
}

static void test_linear_batch(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    enum { NJ = 5 };
    struct tensor w[NJ], b;
    int64_t bshape[1] = {19};
    w[0] = wrand(DTYPE_BF16, 19, 70, 70, 0.5f);
    w[1] = qrand(4, 64, DTYPE_BF16, 45, 256);
    w[2] = wrand(DTYPE_F16, 1, 33, 33, 0.5f);
    w[3] = qrand(8, 32, DTYPE_F16, 30, 96);
    w[4] = wrand(DTYPE_F32, 64, 16, 16, 0.5f);
    b = wrand(DTYPE_F32, 1, 19, 19, 1.0f);
    tensor_init(&b, DTYPE_F32, b.data, 1, bshape);
    kc_open(&bs);
    struct linear_job jobs[NJ];
    float *x[NJ], *y[NJ];
    double *ref[NJ];
    for (int j = 0; j < NJ; j++) {
        int in = (int)w[j].shape[1], out = (int)w[j].shape[0];
        x[j] = kc_fvec((size_t)in, -1, 1);
        y[j] = malloc((size_t)out * sizeof(float));
        ref[j] = malloc((size_t)out * sizeof(double));
        jobs[j] = (struct linear_job){y[j], (int)w[j].shape[0], x[j], &w[j], j == 0 ? &b : NULL, 1};
        linear_ref(ref[j], x[j], &w[j], j == 0 ? &b : NULL, 1);
    }
    for (int i = 0; i < bs.n; i++) {
        for (int j = 0; j < NJ; j++)
            memset(y[j], 0xff, (size_t)w[j].shape[0] * sizeof(float));
        bs.be[i]->ops->linear_batch(bs.be[i], jobs, NJ);
        for (int j = 0; j < NJ; j++)
            kc_check(&es, "linear_batch", bs.be[i], y[j], ref[j], (size_t)w[j].shape[0], 1e-9, 1e-4);
    }
    for (int j = 0; j < NJ; j++) {
        free(x[j]);
        free(y[j]);
        free(ref[j]);
        tfree(&w[j]);
    }
    tfree(&b);
    kc_report("linear_batch", &es);
    kc_close(&bs);
}

// ---- embed ----

static void embed_case(struct kc_bes *bs, struct kc_errstat *es, const struct tensor *w)
{
    enum { N_TOK = 5 };
    int32_t ids[N_TOK];
    int n = (int)w->shape[1];
    float *y = malloc((size_t)N_TOK * n * sizeof *y);
    double *ref = malloc((size_t)N_TOK * n * sizeof *ref);
    for (int t = 0; t < N_TOK; t++) {
        ids[t] = (int32_t)kc_urand((unsigned)w->shape[0]);
        for (int i = 0; i < n; i++)
            ref[(size_t)t * n + i] = wref(w, ids[t], i);
    }
    for (int i = 0; i < bs->n; i++) {
        for (int nt = 1; nt <= N_TOK; nt += N_TOK - 1) {
            memset(y, 0xff, (size_t)N_TOK * n * sizeof *y);
            bs->be[i]->ops->embed(bs->be[i], y, w, ids, nt);
            kc_check(es, "embed", bs->be[i], y, ref, (size_t)nt * n, 1e-12, 1e-6);
        }
    }
    free(y);
    free(ref);
}

static void test_embed(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    kc_open(&bs);
    for (int d = 0; d < 3; d++) {
        struct tensor w = wrand(dts[d], 11, 37, 37, 1.0f);
        embed_case(&bs, &es, &w);
        tfree(&w);
    }
    static const int q[][2] = {{4, 64}, {8, 32}, {3, 32}, {6, 128}, {2, 64}, {5, 32}};
    for (int i = 0; i < 6; i++) {
        struct tensor w = qrand(q[i][0], q[i][1], i % 2 ? DTYPE_F16 : DTYPE_BF16, 9, 384);
        embed_case(&bs, &es, &w);
        tfree(&w);
    }
    kc_report("embed", &es);
    kc_close(&bs);
}

// ---- norms ----

/* rows of n, grouped heads to a token (heads > 1: one weight row per head, [heads, n], as
 * Cohere's q/k norms); the weight used is w + w_off (Gemma's 1 + w). */
static void norm_case(struct kc_bes *bs, struct kc_errstat *es, bool layer, enum dtype wdt, int rows,
                      int n, bool inplace, float w_off, int heads)
{
    float eps = 1e-5f;
    float *x = kc_fvec((size_t)rows * n, -2, 3);
    float *y = malloc((size_t)rows * n * sizeof *y);
    double *ref = malloc((size_t)rows * n * sizeof *ref);
    struct tensor w = wrand(wdt, 1, heads * n, heads * n, 1.5f), b = wrand(wdt, 1, n, n, 0.5f);
    int64_t shape[2] = {heads, n};
    if (heads > 1)
        tensor_init(&w, wdt, w.data, 2, shape);
    else
        tensor_init(&w, wdt, w.data, 1, shape + 1);
    tensor_init(&b, wdt, b.data, 1, shape + 1);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        double mean = 0, var = 0;
        for (int i = 0; i < n; i++)
            mean += layer ? xr[i] : 0;
        mean /= n;
        for (int i = 0; i < n; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        double inv = 1 / sqrt(var / n + eps);
        for (int i = 0; i < n; i++)
            ref[(size_t)r * n + i] = (xr[i] - mean) * inv *
                                         ((double)ld(w.data, wdt, (r % heads) * n + i) + w_off) +
                                     (layer ? ld(b.data, wdt, i) : 0);
    }
    for (int i = 0; i < bs->n; i++) {
        float *dst = y;
        if (inplace)
            memcpy(y, x, (size_t)rows * n * sizeof *y);
        else
            memset(y, 0xff, (size_t)rows * n * sizeof *y);
        const float *src = inplace ? y : x;
        if (layer)
            bs->be[i]->ops->layernorm(bs->be[i], dst, src, heads * n, &w, w_off, &b, eps,
                                      rows / heads, heads, n);
        else
            bs->be[i]->ops->rmsnorm(bs->be[i], dst, src, heads * n, &w, w_off, eps, rows / heads,
                                    heads, n);
        kc_check(es, layer ? "layernorm" : "rmsnorm", bs->be[i], y, ref, (size_t)rows * n, 1e-11,
              1e-5);
    }
    free(x);
    free(y);
    free(ref);
    tfree(&w);
    tfree(&b);
}

static void test_norms(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    static const int shapes[][2] = {{1, 1}, {1, 7}, {5, 33}, {3, 4096}, {40, 1000}, {2, 2049}};
    kc_open(&bs);
    for (int layer = 0; layer < 2; layer++)
        for (size_t s = 0; s < 6; s++)
            for (int d = 0; d < 3; d++)
                norm_case(&bs, &es, layer, (enum dtype)d, shapes[s][0], shapes[s][1], s & 1,
                          0.0f, 1);
    /* weight offset (Gemma) and per-head weights (Cohere q/k norm), odd widths and tails */
    for (int layer = 0; layer < 2; layer++)
        for (int d = 0; d < 3; d++) {
            norm_case(&bs, &es, layer, (enum dtype)d, 5, 33, false, 1.0f, 1);
            norm_case(&bs, &es, layer, (enum dtype)d, 12, 16, true, 0.0f, 4);
            norm_case(&bs, &es, layer, (enum dtype)d, 6, 37, false, 1.0f, 3);
        }
    kc_report("norms", &es);
    kc_close(&bs);
}

// ---- rope ----

static void rope_case(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int n_head, int head_dim,
                      int n_rot, int pad, int pos0, float mscale, enum rope_style style, float ntk,
                      int orig)
{
    /* frequency j rotates dims (a, a + step): rotate-half or interleaved pairs */
    int pairs = style == ROPE_STYLE_PAIRS, step = pairs ? 1 : n_rot / 2;
    int rs = n_head * head_dim + pad;
    size_t n = (size_t)n_tok * rs;
    float *x0 = kc_fvec(n, -1, 1), *x = malloc(n * sizeof *x), inv_freq[256];
    double *ref = malloc(n * sizeof *ref);
    for (int j = 0; j < n_rot / 2; j++)
        inv_freq[j] = (float)pow(10000.0, -2.0 * j / n_rot);
    for (size_t i = 0; i < n; i++)
        ref[i] = x0[i];
    /* dynamic NTK (ntk > 0) past orig: transformers' base * s^(d / (d - 2)), s from the
     * sequence's length after the call */
    double ntk_base = 10000.0;
    if (ntk > 0.0f && pos0 + n_tok > orig)
        ntk_base *= pow((double)ntk * (pos0 + n_tok) / orig - (ntk - 1.0), (double)n_rot / (n_rot - 2));
    double ntk_scale = ntk_base / 10000.0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            double *r = ref + (size_t)t * rs + (size_t)h * head_dim;
            for (int j = 0; j < n_rot / 2; j++) {
                double a = (double)(pos0 + t) * inv_freq[j] * pow(ntk_scale, -2.0 * j / n_rot),
                       c = cos(a) * mscale,
                       s = sin(a) * mscale;
                int a0 = pairs ? 2 * j : j;
                double x1 = r[a0], x2 = r[a0 + step];
                r[a0] = x1 * c - x2 * s;
                r[a0 + step] = x2 * c + x1 * s;
            }
        }
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *end = malloc((size_t)n_tok * sizeof *end);
    for (int t = 0; t < n_tok; t++) {
        pos[t] = pos0 + t;
        end[t] = pos0 + n_tok;
    }
    struct kv_rows rows = {.pos = pos, .seq_end = end};
    struct rope_params rp = {.n_rot = n_rot, .inv_freq = inv_freq, .long_after = orig, .ntk_factor = ntk,
                             .mscale = mscale, .style = style};
    for (int i = 0; i < bs->n; i++) {
        memcpy(x, x0, n * sizeof *x);
        bs->be[i]->ops->rope(bs->be[i], x, rs, n_tok, n_head, head_dim, &rp, &rows);
        kc_check(es, "rope", bs->be[i], x, ref, n, 1e-12, 1e-6);
    }
    free(pos);
    free(end);
    free(x0);
    free(x);
    free(ref);
}

static void test_rope(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    rope_case(&bs, &es, 1, 3, 64, 64, 0, 0, 1.0f, ROPE_STYLE_HALF, 0.0f, 0);
    rope_case(&bs, &es, 1, 4, 128, 128, 0, 12345, 1.0f, ROPE_STYLE_HALF, 0.0f, 0);
    rope_case(&bs, &es, 5, 3, 64, 32, 7, 1000, 1.2f, ROPE_STYLE_HALF, 0.0f, 0);   /* partial rotary, padded rows */
    rope_case(&bs, &es, 9, 2, 80, 80, 0, 3, 1.0f, ROPE_STYLE_HALF, 0.0f, 0);
    rope_case(&bs, &es, 2, 5, 6, 4, 1, 100000, 0.9f, ROPE_STYLE_HALF, 0.0f, 0);
    /* interleaved pairs (Cohere): full and partial rotary, padded rows */
    rope_case(&bs, &es, 3, 4, 16, 16, 0, 5, 1.0f, ROPE_STYLE_PAIRS, 0.0f, 0);
    rope_case(&bs, &es, 5, 3, 64, 32, 7, 1000, 1.2f, ROPE_STYLE_PAIRS, 0.0f, 0);
    /* dynamic NTK: rows past the original context (8) rescale, rows within it do not */
    rope_case(&bs, &es, 12, 4, 16, 16, 0, 0, 1.0f, ROPE_STYLE_HALF, 2.0f, 8);
    rope_case(&bs, &es, 1, 4, 16, 16, 0, 20, 1.0f, ROPE_STYLE_HALF, 2.0f, 8);
    rope_case(&bs, &es, 5, 3, 64, 32, 7, 1, 1.0f, ROPE_STYLE_PAIRS, 4.0f, 4);
    rope_case(&bs, &es, 4, 2, 16, 16, 0, 0, 1.0f, ROPE_STYLE_HALF, 2.0f, 8);
    kc_report("rope", &es);
    kc_close(&bs);
}

// ---- gated delta rule ----

/* One gated-delta case: n_seq sequences whose rows interleave (run 0: row r belongs to
 * sequence r % n_seq, except that sequence 0 takes two rows in a row at the start; else
 * runs of `run` rows per sequence in turn, which the CPU takes as blocks), sequence s
 * starting at position s % 2 (position 0: from zero, over a slot holding garbage; else
 * from a random state). Checked against a double-precision reference of the recurrence,
 * outputs and final states: in one chunk, split at the rows cuts[0..n_cuts), and one row
 * per call (every row a recurrent step: the block form is held to the same reference). */
struct gdn_case {
    int nk, nv, dk, dv, n_tok, n_seq;
    int cuts[4], n_cuts;
    int run;
};

static double gdn_softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

/* The reference: y [n_tok][nv * dv], S [n_seq][nv][dk][dv] (starting states in S). */
static void gdn_ref(const struct gdn_case *gc, double *y, double *S, const float *x,
                    const float *ab, const float *a_log, const float *dt_bias,
                    const int32_t *pos, const int32_t *seq)
{
    int nk = gc->nk, nv = gc->nv, dk = gc->dk, dv = gc->dv, ldx = 2 * nk * dk + nv * dv;
    double q[64], k[64], kv[64];  /* dk, dv <= 64 */
    for (int i = 0; i < gc->n_tok; i++)
        for (int h = 0; h < nv; h++) {
            const float *xr = x + (size_t)i * ldx, *abr = ab + (size_t)i * 2 * nv;
            int kh = h / (nv / nk);
            double *Sh = S + ((size_t)seq[i] * nv + h) * dk * dv, qq = 0, kk = 0;
            if (pos[i] == 0)
                memset(Sh, 0, (size_t)dk * dv * sizeof *Sh);
            for (int r = 0; r < dk; r++) {
                q[r] = xr[kh * dk + r];
                k[r] = xr[(nk + kh) * dk + r];
                qq += q[r] * q[r];
                kk += k[r] * k[r];
            }
            for (int r = 0; r < dk; r++) {
                q[r] /= sqrt(qq + 1e-6) * sqrt((double)dk);
                k[r] /= sqrt(kk + 1e-6);
            }
            double g = -exp((double)a_log[h]) * gdn_softplus((double)abr[nv + h] + dt_bias[h]);
            double beta = 1.0 / (1.0 + exp(-(double)abr[h]));
            for (int j = 0; j < dv; j++) {
                kv[j] = 0;
                for (int r = 0; r < dk; r++) {
                    Sh[r * dv + j] *= exp(g);
                    kv[j] += Sh[r * dv + j] * k[r];
                }
                double d = beta * (xr[2 * nk * dk + h * dv + j] - kv[j]), o = 0;
                for (int r = 0; r < dk; r++) {
                    Sh[r * dv + j] += k[r] * d;
                    o += Sh[r * dv + j] * q[r];
                }
                y[(size_t)i * nv * dv + h * dv + j] = o;
            }
        }
}

static void gdn_case_run(struct kc_bes *bs, struct kc_errstat *es, const struct gdn_case *gc)
{
    int nk = gc->nk, nv = gc->nv, dk = gc->dk, dv = gc->dv, n = gc->n_tok;
    int ldx = 2 * nk * dk + nv * dv, vdim = nv * dk * dv, ldy = nv * dv + 3;
    size_t n_st = (size_t)gc->n_seq * vdim;
    float *x = kc_fvec((size_t)n * ldx, -1, 1), *ab = kc_fvec((size_t)n * 2 * nv, -3, 3);
    float *a_log = kc_fvec((size_t)nv, -1, 1), *dt_b = kc_fvec((size_t)nv, -1, 1);
    float *st0 = kc_fvec(n_st, -0.5f, 0.5f), *st = malloc(n_st * sizeof *st);
    float *y = malloc((size_t)n * ldy * sizeof *y), *yd = malloc((size_t)n * nv * dv * sizeof *yd);
    double *yr = malloc((size_t)n * nv * dv * sizeof *yr), *sr = malloc(n_st * sizeof *sr);
    int32_t pos[256], seq[256], next[8];
    assert_true(n <= 256 && gc->n_seq <= 8 && dk <= 64 && dv <= 64);
    for (int s = 0; s < gc->n_seq; s++)
        next[s] = s % 2;
    for (int i = 0; i < n; i++) {
        seq[i] = gc->run ? (i / gc->run) % gc->n_seq : i < 2 ? 0 : i % gc->n_seq;
        pos[i] = next[seq[i]]++;
    }
    for (size_t i = 0; i < n_st; i++)
        sr[i] = st0[i];
    gdn_ref(gc, yr, sr, x, ab, a_log, dt_b, pos, seq);

    struct tensor ta, td;
    int64_t shape[1] = {nv};
    tensor_init(&ta, DTYPE_F32, a_log, 1, shape);
    tensor_init(&td, DTYPE_F32, dt_b, 1, shape);
    struct gdn_params p = {.n_k_head = nk, .n_v_head = nv, .k_dim = dk, .v_dim = dv,
                           .a_log = &ta, .dt_bias = &td};
    struct kv_layer kv = {.k = NULL, .v = st, .k_dim = 0, .v_dim = vdim, .dtype = DTYPE_F32};
    double *srd = malloc(n_st * sizeof *srd);
    for (size_t i = 0; i < n_st; i++)
        srd[i] = sr[i];
    for (int b = 0; b < bs->n; b++) {
        struct backend *be = bs->be[b];
        struct err e = {0};
        /* split 0: one chunk; 1: at the cuts; 2: one row per call */
        static const char *const what_y[] = {"gated_delta y", "gated_delta y (split)",
                                             "gated_delta y (by rows)"};
        static const char *const what_s[] = {"gated_delta state", "gated_delta state (split)",
                                             "gated_delta state (by rows)"};
        for (int split = 0; split < 3; split++) {
            int bounds[258] = {0}, nb = 0;
            if (split == 1)
                for (int c = 0; c < gc->n_cuts; c++)
                    bounds[++nb] = gc->cuts[c];
            if (split == 2)
                for (int r = 1; r < n; r++)
                    bounds[++nb] = r;
            bounds[++nb] = n;
            memcpy(st, st0, n_st * sizeof *st);
            for (int c = 0; c < nb; c++) {
                int r0 = bounds[c], m = bounds[c + 1] - r0;
                struct kv_rows rows = {.pos = pos + r0, .state = seq + r0};
                be->ops->gated_delta(be, y + (size_t)r0 * ldy, ldy, x + (size_t)r0 * ldx, ldx,
                                     ab + (size_t)r0 * 2 * nv, 2 * nv, &p, &kv, &rows, m);
            }
            assert_int_equal(backend_sync(be, &e), 0);
            for (int i = 0; i < n; i++)
                memcpy(yd + (size_t)i * nv * dv, y + (size_t)i * ldy, (size_t)nv * dv * sizeof *yd);
            kc_check(es, what_y[split], be, yd, yr, (size_t)n * nv * dv, 1e-10, 1e-4);
            kc_check(es, what_s[split], be, st, srd, n_st, 1e-10, 1e-4);
        }
    }
    free(x), free(ab), free(a_log), free(dt_b), free(st0), free(st), free(y), free(yd);
    free(yr), free(sr), free(srd);
}

static void test_gated_delta(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    static const struct gdn_case cases[] = {
        {1, 1, 16, 33, 1, 1, {0}, 0, 0},               /* one decode row from a state */
        {2, 4, 5, 7, 11, 3, {3, 4, 9}, 3, 0},          /* grouped value heads, odd dims */
        {2, 2, 32, 16, 9, 2, {1, 5}, 2, 0},
        {2, 8, 32, 32, 12, 3, {7}, 1, 0},              /* large enough for the threads */
        /* blocks: a 150-row prefill (blocks of 64, 64, 22; cut into 37 + 64 + 49), and runs
         * of 7 rows of three sequences (blocks of 7, of 3 and 4 at cuts, steps below 4) */
        {1, 2, 16, 24, 150, 1, {37, 101}, 2, 150},
        {2, 4, 9, 12, 60, 3, {10, 25, 33}, 3, 7},
        {2, 2, 64, 64, 70, 1, {0}, 0, 70},             /* the widest heads, one block + 6 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        gdn_case_run(&bs, &es, &cases[c]);
    /* a state that does not match the shape is an error, not a write past it */
    struct backend *be = bs.be[0];
    float a1 = 0, d1 = 0, xs[8] = {0}, abs_[2] = {0}, ys[1], sts[4];
    struct tensor ta, td;
    int64_t shape[1] = {1};
    tensor_init(&ta, DTYPE_F32, &a1, 1, shape);
    tensor_init(&td, DTYPE_F32, &d1, 1, shape);
    struct gdn_params p = {.n_k_head = 1, .n_v_head = 1, .k_dim = 2, .v_dim = 2, .a_log = &ta,
                           .dt_bias = &td};
    struct kv_layer kv = {.v = sts, .v_dim = 3, .dtype = DTYPE_F32};
    int32_t pos0 = 0, seq0 = 0;
    struct kv_rows rows = {.pos = &pos0, .state = &seq0};
    struct err e = {0};
    be->ops->gated_delta(be, ys, 2, xs, 6, abs_, 2, &p, &kv, &rows, 1);
    assert_true(backend_sync(be, &e) < 0);
    assert_non_null(strstr(e.msg, "gated_delta"));
    kc_report("gated_delta", &es);
    kc_close(&bs);
}

// ---- ssd scan (Mamba-2) ----

/* One ssd_scan case: n_seq sequences' rows interleaved at random (blocked: in runs of one
 * sequence, every 9th row another's, as a prefill beside decodes), each sequence either
 * starting at position 0 or continuing from a random state, against the recurrence in
 * double precision; then the same rows split into chunks of 1 to 6 rows at random must
 * give the same state and outputs as one call (within float rounding: a backend may
 * evaluate a long run another way). alias: y written over x. */
static void ssd_case(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int n_seq, int H, int P,
                     int N, int G, float dt_lo, float dt_hi, bool skip, bool alias, bool blocked)
{
    int di = H * P, ldx = di + 2 * G * N + 3, lddt = H + 1, ldy = alias ? ldx : di + 2;
    size_t sd = (size_t)H * P * N;
    float *x0 = kc_fvec((size_t)n_tok * ldx, -1, 1), *dt = kc_fvec((size_t)n_tok * lddt, -4, 3);
    float *alog = kc_fvec(H, -2, 1.5f), *dv = kc_fvec(H, -1, 1), *dtb = kc_fvec(H, -1, 1);
    float *st0 = kc_fvec(sd * n_seq, -1, 1), *stv = malloc(sd * n_seq * sizeof *stv);
    float *x = malloc((size_t)n_tok * ldx * sizeof *x), *y = malloc((size_t)n_tok * ldy * sizeof *y);
    float *y1 = malloc((size_t)n_tok * ldy * sizeof *y1), *st1 = malloc(sd * n_seq * sizeof *st1);
    double *ref = calloc((size_t)n_tok * di, sizeof *ref), *S = malloc(sd * n_seq * sizeof *S);
    float *yr = malloc((size_t)n_tok * di * sizeof *yr);
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *seq = malloc((size_t)n_tok * sizeof *seq);
    int next[8];
    assert_true(n_seq <= 8 && x && y && y1 && st1 && ref && S && yr && pos && seq && stv);
    for (int q = 0; q < n_seq; q++)
        next[q] = q % 2 ? 3 + q : 0;   /* odd sequences continue from their random state */
    for (int i = 0; i < n_tok; i++) {
        seq[i] = blocked && i % 9 != 4 ? (int32_t)((int64_t)i * n_seq / n_tok)
                                       : (int32_t)kc_urand((unsigned)n_seq);
        pos[i] = next[seq[i]]++;
    }
    for (size_t k = 0; k < sd * n_seq; k++)
        S[k] = st0[k];
    for (int i = 0; i < n_tok; i++) {
        double *Sq = S + (size_t)seq[i] * sd;
        const float *xr = x0 + (size_t)i * ldx, *B = xr + di, *C = xr + di + G * N;
        if (pos[i] == 0)
            memset(Sq, 0, sd * sizeof *Sq);
        for (int h = 0; h < H; h++) {
            double v = (double)dt[(size_t)i * lddt + h] + dtb[h];
            double d = v > 20.0 ? v : log1p(exp(v));
            d = fmin(fmax(d, dt_lo), dt_hi);
            double a = exp(-exp((double)alog[h]) * d);
            int g = h / (H / G);
            for (int p = 0; p < P; p++) {
                double *sr = Sq + ((size_t)h * P + p) * N, acc = 0.0, xv = xr[h * P + p];
                for (int n = 0; n < N; n++) {
                    sr[n] = a * sr[n] + d * xv * B[g * N + n];
                    acc += sr[n] * C[g * N + n];
                }
                ref[(size_t)i * di + h * P + p] = acc + (skip ? dv[h] * xv : 0.0);
            }
        }
    }
    int64_t one[1] = {H};
    struct tensor ta, td, tb;
    tensor_init(&ta, DTYPE_F32, alog, 1, one);
    tensor_init(&td, DTYPE_F32, dv, 1, one);
    tensor_init(&tb, DTYPE_F32, dtb, 1, one);
    struct kv_layer kv = {.v = stv, .v_dim = (int)sd, .dtype = DTYPE_F32};
    struct ssd_params sp = {.n_head = H, .head_dim = P, .d_state = N, .n_group = G,
                            .dt_min = dt_lo, .dt_max = dt_hi};
    double *sref = malloc(sd * n_seq * sizeof *sref);
    double *y1d = malloc((size_t)n_tok * di * sizeof *y1d), *st1d = malloc(sd * n_seq * sizeof *st1d);
    assert_true(sref && y1d && st1d);
    for (size_t k = 0; k < sd * n_seq; k++)
        sref[k] = S[k];
    for (int ib = 0; ib < bs->n; ib++) {
        struct backend *be = bs->be[ib];
        struct err e = {0};
        /* one call */
        memcpy(x, x0, (size_t)n_tok * ldx * sizeof *x);
        memcpy(stv, st0, sd * n_seq * sizeof *stv);
        struct kv_rows rows = {.pos = pos, .state = seq};
        float *out = alias ? x : y;
        be->ops->ssd_scan(be, out, ldy, x, x + di, x + di + G * N, ldx, dt, lddt, &ta,
                          skip ? &td : NULL, &tb, &kv, &rows, n_tok, &sp);
        assert_int_equal(backend_sync(be, &e), 0);
        for (int i = 0; i < n_tok; i++)
            memcpy(yr + (size_t)i * di, out + (size_t)i * ldy, (size_t)di * sizeof *yr);
        kc_check(es, "ssd_scan y", be, yr, ref, (size_t)n_tok * di, 1e-10, 1e-4);
        kc_check(es, "ssd_scan state", be, stv, sref, sd * n_seq, 1e-10, 1e-4);
        memcpy(y1, out, (size_t)n_tok * ldy * sizeof *y1);
        memcpy(st1, stv, sd * n_seq * sizeof *st1);
        /* the same rows in chunks cut at random rows: the same outputs and state, exactly */
        memcpy(x, x0, (size_t)n_tok * ldx * sizeof *x);
        memcpy(stv, st0, sd * n_seq * sizeof *stv);
        for (int i0 = 0; i0 < n_tok;) {
            int len = 1 + (int)kc_urand((unsigned)(n_tok - i0 < 6 ? n_tok - i0 : 6));
            struct kv_rows r = {.pos = pos + i0, .state = seq + i0};
            float *xi = x + (size_t)i0 * ldx;
            be->ops->ssd_scan(be, (alias ? x : y) + (size_t)i0 * ldy, ldy, xi, xi + di,
                              xi + di + G * N, ldx, dt + (size_t)i0 * lddt, lddt, &ta,
                              skip ? &td : NULL, &tb, &kv, &r, len, &sp);
            i0 += len;
        }
        assert_int_equal(backend_sync(be, &e), 0);
        for (int i = 0; i < n_tok; i++)
            for (int k = 0; k < di; k++) {
                yr[(size_t)i * di + k] = out[(size_t)i * ldy + k];
                y1d[(size_t)i * di + k] = y1[(size_t)i * ldy + k];
            }
        for (size_t k = 0; k < sd * n_seq; k++)
            st1d[k] = st1[k];
        kc_check(es, "ssd_scan y split vs whole", be, yr, y1d, (size_t)n_tok * di, 1e-10, 5e-5);
        kc_check(es, "ssd_scan state split vs whole", be, stv, st1d, sd * n_seq, 1e-10, 5e-5);
    }
    free(y1d);
    free(st1d);
    free(sref);
    free(x0);
    free(dt);
    free(alog);
    free(dv);
    free(dtb);
    free(st0);
    free(stv);
    free(x);
    free(y);
    free(y1);
    free(st1);
    free(ref);
    free(S);
    free(yr);
    free(pos);
    free(seq);
}

static void test_ssd_scan(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    ssd_case(&bs, &es, 1, 1, 1, 1, 1, 1, 0.0f, INFINITY, true, false, false);
    ssd_case(&bs, &es, 13, 3, 6, 5, 7, 3, 0.0f, INFINITY, true, false, false);
    ssd_case(&bs, &es, 17, 4, 4, 3, 33, 2, 0.01f, 0.5f, false, true, false); /* clamp, no D, y over x */
    ssd_case(&bs, &es, 40, 5, 8, 16, 64, 1, 0.0f, INFINITY, true, false, false); /* threaded */
    ssd_case(&bs, &es, 9, 2, 2, 4, 130, 2, 0.0f, INFINITY, true, true, false);
    /* prefill-like runs of 8 to 64+ rows of one sequence, beside decode rows */
    ssd_case(&bs, &es, 150, 2, 4, 8, 16, 2, 0.0f, INFINITY, true, false, true);
    ssd_case(&bs, &es, 70, 3, 6, 5, 33, 3, 0.01f, 0.5f, false, true, true);   /* y over x */
    ssd_case(&bs, &es, 200, 1, 3, 16, 64, 1, 0.0f, INFINITY, true, false, true);
    /* the state sizes AVX-512 keeps in registers (128: Mamba-2, Granite 4, Nemotron-H; 256) */
    ssd_case(&bs, &es, 120, 2, 4, 4, 128, 1, 0.0f, INFINITY, true, false, true);
    ssd_case(&bs, &es, 60, 3, 2, 4, 256, 2, 0.01f, 0.5f, false, true, true);  /* y over x */
    kc_report("ssd_scan", &es);
    kc_close(&bs);
}

// ---- RG-LRU (RecurrentGemma) ----

/* One rglru case: n_seq sequences' rows interleaved at random, even sequences starting at
 * position 0 (a zero state: the random state they hold must not leak), odd ones continuing
 * from a random state, against the recurrence in double precision; then the same rows in
 * chunks cut at random (1 to 6 rows) give the same outputs and state as one call. */
static void rglru_case(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int n_seq, int H, int bw)
{
    int w = H * bw, ldx = w + 3, ldy = w + 1;
    size_t nw = (size_t)H * bw * bw;
    float *x = kc_fvec((size_t)n_tok * ldx, -2, 2), *wi = kc_fvec(nw, -0.5f, 0.5f);
    float *wa = kc_fvec(nw, -0.5f, 0.5f), *bi = kc_fvec(w, -1, 1), *ba = kc_fvec(w, -1, 1);
    float *ap = kc_fvec(w, -3, 3), *st0 = kc_fvec((size_t)w * n_seq, -1, 1);
    float *stv = malloc((size_t)w * n_seq * sizeof *stv), *y = malloc((size_t)n_tok * ldy * sizeof *y);
    float *yr = malloc((size_t)n_tok * w * sizeof *yr), *st1 = malloc((size_t)w * n_seq * sizeof *st1);
    double *ref = malloc((size_t)n_tok * w * sizeof *ref), *S = malloc((size_t)w * n_seq * sizeof *S);
    double *y1d = malloc((size_t)n_tok * w * sizeof *y1d), *st1d = malloc((size_t)w * n_seq * sizeof *st1d);
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *seq = malloc((size_t)n_tok * sizeof *seq);
    int next[8];
    assert_true(n_seq <= 8 && stv && y && yr && st1 && ref && S && y1d && st1d && pos && seq);
    ap[0] = 25.0f;  /* softplus passes it through */
    for (int q = 0; q < n_seq; q++)
        next[q] = q % 2 ? 3 + q : 0;
    for (int i = 0; i < n_tok; i++) {
        seq[i] = (int32_t)kc_urand((unsigned)n_seq);
        pos[i] = next[seq[i]]++;
    }
    for (size_t k = 0; k < (size_t)w * n_seq; k++)
        S[k] = st0[k];
    for (int i = 0; i < n_tok; i++) {
        double *Sq = S + (size_t)seq[i] * w;
        const float *xr = x + (size_t)i * ldx;
        for (int c = 0; c < w; c++) {
            int h = c / bw, j = c % bw;
            double gi = bi[c], ga = ba[c];
            for (int k = 0; k < bw; k++) {
                gi += (double)xr[h * bw + k] * wi[((size_t)h * bw + k) * bw + j];
                ga += (double)xr[h * bw + k] * wa[((size_t)h * bw + k) * bw + j];
            }
            gi = 1.0 / (1.0 + exp(-gi));
            ga = 1.0 / (1.0 + exp(-ga));
            double sp = ap[c] > 20.0f ? ap[c] : log1p(exp((double)ap[c]));
            double la = -8.0 * ga * sp, u = xr[c] * gi;
            Sq[c] = pos[i] == 0 ? u : exp(la) * Sq[c] + u * sqrt(1.0 - exp(2.0 * la));
            ref[(size_t)i * w + c] = Sq[c];
        }
    }
    int64_t s3[3] = {H, bw, bw}, s1[1] = {w};
    struct tensor twi, twa, tbi, tba, tap;
    tensor_init(&twi, DTYPE_F32, wi, 3, s3);
    tensor_init(&twa, DTYPE_F32, wa, 3, s3);
    tensor_init(&tbi, DTYPE_F32, bi, 1, s1);
    tensor_init(&tba, DTYPE_F32, ba, 1, s1);
    tensor_init(&tap, DTYPE_F32, ap, 1, s1);
    struct rglru_params p = {.wi = &twi, .bi = &tbi, .wa = &twa, .ba = &tba, .a_param = &tap,
                             .width = w, .n_head = H};
    struct kv_layer kv = {.v = stv, .v_dim = w, .dtype = DTYPE_F32};
    for (int ib = 0; ib < bs->n; ib++) {
        struct backend *be = bs->be[ib];
        struct err e = {0};
        memcpy(stv, st0, (size_t)w * n_seq * sizeof *stv);
        struct kv_rows rows = {.pos = pos, .state = seq};
        be->ops->rglru(be, y, ldy, x, ldx, &p, &kv, &rows, n_tok);
        assert_int_equal(backend_sync(be, &e), 0);
        for (int i = 0; i < n_tok; i++)
            memcpy(yr + (size_t)i * w, y + (size_t)i * ldy, (size_t)w * sizeof *yr);
        kc_check(es, "rglru y", be, yr, ref, (size_t)n_tok * w, 1e-10, 1e-4);
        kc_check(es, "rglru state", be, stv, S, (size_t)w * n_seq, 1e-10, 1e-4);
        for (size_t k = 0; k < (size_t)n_tok * w; k++)
            y1d[k] = yr[k];
        for (size_t k = 0; k < (size_t)w * n_seq; k++)
            st1d[k] = stv[k];
        memcpy(stv, st0, (size_t)w * n_seq * sizeof *stv);
        for (int i0 = 0; i0 < n_tok;) {
            int len = 1 + (int)kc_urand((unsigned)(n_tok - i0 < 6 ? n_tok - i0 : 6));
            struct kv_rows r = {.pos = pos + i0, .state = seq + i0};
            be->ops->rglru(be, y + (size_t)i0 * ldy, ldy, x + (size_t)i0 * ldx, ldx, &p, &kv, &r, len);
            i0 += len;
        }
        assert_int_equal(backend_sync(be, &e), 0);
        for (int i = 0; i < n_tok; i++)
            memcpy(yr + (size_t)i * w, y + (size_t)i * ldy, (size_t)w * sizeof *yr);
        kc_check(es, "rglru y split vs whole", be, yr, y1d, (size_t)n_tok * w, 1e-10, 1e-6);
        kc_check(es, "rglru state split vs whole", be, stv, st1d, (size_t)w * n_seq, 1e-10, 1e-6);
    }
    free(x); free(wi); free(wa); free(bi); free(ba); free(ap); free(st0); free(stv); free(y);
    free(yr); free(st1); free(ref); free(S); free(y1d); free(st1d); free(pos); free(seq);
}

static void test_rglru(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    rglru_case(&bs, &es, 1, 1, 1, 1);
    rglru_case(&bs, &es, 13, 3, 4, 5);
    rglru_case(&bs, &es, 40, 5, 8, 16);    /* threaded */
    rglru_case(&bs, &es, 70, 4, 10, 12);
    rglru_case(&bs, &es, 30, 2, 2, 40);    /* a head wider than the kernels' 16 channels */
    rglru_case(&bs, &es, 20, 3, 3, 7);     /* 16-channel blocks across heads of 7 */
    /* a state that does not match the width is an error, not a write past it */
    struct backend *be = bs.be[0];
    float v1 = 0, xs[2] = {0}, ys[2], sts[4];
    struct tensor t1;
    int64_t shape[1] = {1};
    tensor_init(&t1, DTYPE_F32, &v1, 1, shape);
    struct rglru_params p = {.wi = &t1, .bi = &t1, .wa = &t1, .ba = &t1, .a_param = &t1,
                             .width = 1, .n_head = 1};
    struct kv_layer kv = {.v = sts, .v_dim = 3, .dtype = DTYPE_F32};
    int32_t pos0 = 0, seq0 = 0;
    struct kv_rows rows = {.pos = &pos0, .state = &seq0};
    struct err e = {0};
    be->ops->rglru(be, ys, 1, xs, 1, &p, &kv, &rows, 1);
    assert_true(backend_sync(be, &e) < 0);
    assert_non_null(strstr(e.msg, "rglru"));
    kc_report("rglru", &es);
    kc_close(&bs);
}

// ---- dispatch ----

/* The best ISA this CPU and OS can run, worked out without dispatch.c: from
 * the compiler runtime's CPU model (__builtin_cpu_supports, which also checks
 * that the OS saves the YMM / ZMM state) plus CPUID leaf 1 for F16C, which
 * clang's builtin does not name. The requirements are dispatch.c's. */
static const char *isa_best_expected(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return avx2 && avx512 ? "avx512" : avx2 ? "avx2" : "scalar";
#else
    return "scalar";
#endif
}

/* A plugin table is refused unless both its ABI and the size of the options it was built
 * with are this build's (ADR 0056): the loader hands the plugin a struct backend_opts. */
static void test_plugin_check(void **state)
{
    (void)state;
    struct err e = {0};
    struct backend_plugin p = {.abi = BACKEND_PLUGIN_ABI, .opts_size = sizeof(struct backend_opts),
                               .name = "cuda"};
    assert_int_equal(backend_plugin_check(&p, "x.so", &e), 0);
    p.opts_size = sizeof(struct backend_opts) - sizeof(bool);
    assert_int_equal(backend_plugin_check(&p, "x.so", &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "options of"));
    p.opts_size = sizeof(struct backend_opts);
    p.abi = BACKEND_PLUGIN_ABI - 1;
    assert_int_equal(backend_plugin_check(&p, "x.so", &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "abi"));
    assert_int_equal(backend_plugin_check(NULL, "x.so", &e), -ERR_UNSUPPORTED);
}

/* "auto" (and the isa option) resolve to the best ISA the CPU supports, every ISA up
 * to that one opens and those above are refused, and the auto-selected kernels
 * compute what the scalar references compute. */
static void test_isa_select(void **state)
{
    (void)state;
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    struct backend *be;
    struct err e = {0};
    char want[32];
    assert_true(backend_cpu_new(&be, 1, "bogus", test_backend_opts(), &e) < 0);
    assert_non_null(strstr(e.msg, "bogus"));
    assert_int_equal(backend_cpu_new(&be, 2, "scalar", test_backend_opts(), &e), 0);
    assert_string_equal(be->name, "cpu-scalar");
    assert_int_equal(be->n_threads, 2);
    backend_free(be);

    const char *best = isa_best_expected();
    snprintf(want, sizeof want, "cpu-%s", best);
    assert_int_equal(backend_cpu_new(&be, 1, "auto", test_backend_opts(), &e), 0);
    printf("    auto ISA: %s (the CPU supports up to %s)\n", be->name, best);
    assert_string_equal(be->name, want);

    /* auto against scalar: float and quantized linear, decode and prefill */
    struct kc_bes bs = {.n = 2};
    struct kc_errstat es = {0};
    struct qstat qs = {{0}};
    assert_int_equal(backend_cpu_new(&bs.be[0], 1, "scalar", test_backend_opts(), &e), 0); /* qlinear_case's reference */
    bs.be[1] = be;
    struct tensor w = wrand(DTYPE_BF16, 37, 300, 300, 0.5f);
    struct tensor q = qrand(4, 64, DTYPE_BF16, 37, 256);
    for (int n_tok = 1; n_tok <= 5; n_tok += 4) {
        linear_case(&bs, &es, &w, NULL, n_tok);
        qlinear_case(&bs, &qs, &q, n_tok, 1.0f);
    }
    tfree(&w);
    tfree(&q);
    kc_close(&bs);
    kc_report("auto", &es);
    qreport("auto_q", &qs);

    /* the options' isa when the argument is NULL; the argument (a cpu-<isa> device) wins */
    struct backend_opts so = BACKEND_OPTS_DEFAULT;
    so.isa = "scalar";
    assert_int_equal(backend_cpu_new(&be, 1, NULL, &so, &e), 0);
    assert_string_equal(be->name, "cpu-scalar");
    backend_free(be);
    assert_int_equal(backend_new(&be, "cpu-scalar", 1, NULL, &e), 0);
    assert_string_equal(be->name, "cpu-scalar");
    backend_free(be);
    so.isa = "bogus";
    assert_true(backend_new(&be, "cpu", 1, &so, &e) < 0);
    assert_non_null(strstr(e.msg, "bogus"));

    bool above = false;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        int rc = backend_cpu_new(&be, 1, isas[i], test_backend_opts(), &e);
        snprintf(want, sizeof want, "cpu-%s", isas[i]);
        if (above) {
            if (rc != -ERR_UNSUPPORTED)
                fail_msg("isa %s above the best (%s): rc %d, want %d", isas[i], best, rc,
                         -ERR_UNSUPPORTED);
            continue;
        }
        if (rc != 0)
            fail_msg("isa %s (best %s): %s", isas[i], best, e.msg);
        assert_string_equal(be->name, want);
        backend_free(be);
        above = strcmp(isas[i], best) == 0;
    }
    backend_free(NULL);
}

// ---- Mamba's selective scan ----

/* The rows of one scan case: N_SEQ sequences interleaved in one chunk (each in position order),
 * sequence 1 continuing from a carried state (its first row past position 0), the others
 * starting at 0 over a state full of garbage. */
#define SCAN_SEQS 3
struct scan_case {
    int di, ds, n, ldx, lddt, ldbc, ldz;
    bool has_d, has_z;
    float *x, *dt, *bc, *z, *a_log, *d, *st0;  /* st0: the states before the chunk */
    int32_t pos[64], seq[64];
};

static void scan_case_init(struct scan_case *sc, int di, int ds, int n, bool has_d, bool has_z)
{
    int start[SCAN_SEQS] = {0, 7, 0}, next[SCAN_SEQS];
    *sc = (struct scan_case){.di = di, .ds = ds, .n = n, .ldx = di + 3, .lddt = di + 1,
                             .ldbc = 2 * ds + 5, .ldz = 2 * di, .has_d = has_d, .has_z = has_z};
    memcpy(next, start, sizeof next);
    sc->x = kc_fvec((size_t)n * sc->ldx, -2, 2);
    sc->dt = kc_fvec((size_t)n * sc->lddt, -4, 3);
    sc->dt[0] = 25.0f;  /* past softplus' threshold: dt itself */
    sc->bc = kc_fvec((size_t)n * sc->ldbc, -1.5f, 1.5f);
    sc->z = kc_fvec((size_t)n * sc->ldz, -3, 3);
    sc->a_log = kc_fvec((size_t)di * ds, -1.0f, 2.8f);
    sc->d = kc_fvec((size_t)di, -1, 1);
    sc->st0 = kc_fvec((size_t)SCAN_SEQS * di * ds, -1, 1);
    for (int i = 0; i < n; i++) { /* a random interleaving, each sequence in order */
        int q = (int)kc_urand(SCAN_SEQS);
        sc->seq[i] = q;
        sc->pos[i] = next[q]++;
    }
}

static void scan_case_free(struct scan_case *sc)
{
    free(sc->x);
    free(sc->dt);
    free(sc->bc);
    free(sc->z);
    free(sc->a_log);
    free(sc->d);
    free(sc->st0);
}

/* The scan in double: y [n, di] and the states after the chunk [SCAN_SEQS][di][ds]. */
static void scan_ref(const struct scan_case *sc, double *y, double *h)
{
    int di = sc->di, ds = sc->ds;
    for (size_t k = 0; k < (size_t)SCAN_SEQS * di * ds; k++)
        h[k] = sc->st0[k];
    for (int i = 0; i < sc->n; i++) {
        double *hq = h + (size_t)sc->seq[i] * di * ds;
        const float *B = sc->bc + (size_t)i * sc->ldbc, *C = B + ds;
        if (sc->pos[i] == 0)
            memset(hq, 0, (size_t)di * ds * sizeof *hq);
        for (int c = 0; c < di; c++) {
            double xc = sc->x[(size_t)i * sc->ldx + c], v = sc->dt[(size_t)i * sc->lddt + c];
            double delta = v > 20.0 ? v : log1p(exp(v)), acc = 0.0;
            for (int s = 0; s < ds; s++) {
                double *hs = &hq[(size_t)c * ds + s];
                *hs = exp(-delta * exp((double)sc->a_log[(size_t)c * ds + s])) * *hs + delta * B[s] * xc;
                acc += *hs * C[s];
            }
            if (sc->has_d)
                acc += sc->d[c] * xc;
            if (sc->has_z) {
                double g = sc->z[(size_t)i * sc->ldz + c];
                acc *= g / (1.0 + exp(-g));
            }
            y[(size_t)i * di + c] = acc;
        }
    }
}

/* Rows [r0, r1) of the case through be's scan, into y (stride ldx: in place over a copy of x
 * when inplace) and the states st. */
static void scan_run(struct backend *be, const struct scan_case *sc, float *y, bool inplace,
                     float *st, int r0, int r1)
{
    int di = sc->di, ds = sc->ds;
    int64_t ashape[2] = {di, ds}, dshape[1] = {di};
    struct tensor a, d;
    tensor_init(&a, DTYPE_F32, sc->a_log, 2, ashape);
    tensor_init(&d, DTYPE_F32, sc->d, 1, dshape);
    struct kv_layer kv = {.v = st, .v_dim = di * ds, .dtype = DTYPE_F32};
    struct kv_rows rows = {.pos = sc->pos + r0, .state = sc->seq + r0};
    float *yo = y + (size_t)r0 * sc->ldx;
    const float *x = inplace ? yo : sc->x + (size_t)r0 * sc->ldx;
    const float *B = sc->bc + (size_t)r0 * sc->ldbc;
    be->ops->selective_scan(be, yo, sc->ldx, x, sc->ldx, sc->dt + (size_t)r0 * sc->lddt, sc->lddt,
                            B, B + ds, sc->ldbc, sc->has_z ? sc->z + (size_t)r0 * sc->ldz + di : NULL,
                            sc->ldz, &a, sc->has_d ? &d : NULL, &kv, &rows, r1 - r0, di, ds);
}

static void scan_case_check(struct kc_bes *bs, struct kc_errstat *es, struct scan_case *sc)
{
    int di = sc->di, ds = sc->ds, n = sc->n;
    size_t ny = (size_t)n * di, nst = (size_t)SCAN_SEQS * di * ds;
    double *yr = malloc(ny * sizeof *yr), *hr = malloc(nst * sizeof *hr);
    float *y = malloc((size_t)n * sc->ldx * sizeof *y), *y1 = malloc(ny * sizeof *y1);
    float *st = malloc(nst * sizeof *st), *st1 = malloc(nst * sizeof *st1);
    struct err e = {0};
    /* the gate z is the second half of an in_proj row: shift the reference's view of it */
    float *zs = sc->z;
    sc->z = zs + di;
    scan_ref(sc, yr, hr);
    sc->z = zs;
    for (int b = 0; b < bs->n; b++) {
        struct backend *be = bs->be[b];
        for (int inplace = 0; inplace < 2; inplace++) {
            /* one chunk */
            memcpy(st, sc->st0, nst * sizeof *st);
            memcpy(y, sc->x, (size_t)n * sc->ldx * sizeof *y);
            scan_run(be, sc, y, inplace, st, 0, n);
            assert_int_equal(backend_sync(be, &e), 0);
            for (int i = 0; i < n; i++)
                memcpy(y1 + (size_t)i * di, y + (size_t)i * sc->ldx, (size_t)di * sizeof *y1);
            kc_check(es, "selective_scan y", be, y1, yr, ny, 1e-10, 2e-4);
            kc_check(es, "selective_scan state", be, st, hr, nst, 1e-10, 2e-4);
            memcpy(st1, st, nst * sizeof *st);
            /* the same rows in chunks cut at arbitrary rows: the same bits */
            memcpy(st, sc->st0, nst * sizeof *st);
            memcpy(y, sc->x, (size_t)n * sc->ldx * sizeof *y);
            for (int r0 = 0, r1; r0 < n; r0 = r1) {
                r1 = r0 + 1 + (int)kc_urand(5);
                r1 = r1 < n ? r1 : n;
                scan_run(be, sc, y, inplace, st, r0, r1);
            }
            assert_int_equal(backend_sync(be, &e), 0);
            assert_memory_equal(st, st1, nst * sizeof *st);
            for (int i = 0; i < n; i++)
                assert_memory_equal(y + (size_t)i * sc->ldx, y1 + (size_t)i * di, (size_t)di * sizeof *y);
        }
    }
    free(yr);
    free(hr);
    free(y);
    free(y1);
    free(st);
    free(st1);
}

static void test_selective_scan(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    static const int shapes[][3] = {{5, 1, 1}, {37, 16, 23}, {130, 33, 40}, {9, 256, 17}, {600, 16, 64}};
    kc_open(&bs);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        struct scan_case sc;
        scan_case_init(&sc, shapes[k][0], shapes[k][1], shapes[k][2], k != 1, k != 2);
        scan_case_check(&bs, &es, &sc);
        scan_case_free(&sc);
    }
    /* what the op refuses: more states than it takes, a state of the wrong size */
    struct backend *be = bs.be[0];
    struct err e = {0};
    float v[4] = {0}, st[4] = {0};
    int32_t pos[1] = {0}, seq[1] = {0};
    int64_t shape[2] = {1, 4};
    struct tensor a;
    tensor_init(&a, DTYPE_F32, v, 2, shape);
    struct kv_layer kv = {.v = st, .v_dim = 3, .dtype = DTYPE_F32};
    struct kv_rows rows = {.pos = pos, .state = seq};
    be->ops->selective_scan(be, v, 1, v, 1, v, 1, v, v, 1, NULL, 0, &a, NULL, &kv, &rows, 1, 1, 4);
    assert_int_not_equal(backend_sync(be, &e), 0);
    be->ops->selective_scan(be, v, 1, v, 1, v, 1, v, v, 1, NULL, 0, &a, NULL, &kv, &rows, 1, 1,
                            BACKEND_SCAN_MAX_STATE + 1);
    assert_int_not_equal(backend_sync(be, &e), 0);
    kc_report("selective_scan", &es);
    kc_close(&bs);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_isa_select),   cmocka_unit_test(test_plugin_check),   cmocka_unit_test(test_linear),
    cmocka_unit_test(test_linear_quant), cmocka_unit_test(test_linear_quant_nonfinite), cmocka_unit_test(test_linear_fp),
    cmocka_unit_test(test_dequant),      cmocka_unit_test(test_linear_batch),
    cmocka_unit_test(test_linear_batch_invariant),
    cmocka_unit_test(test_linear_fpan),
    cmocka_unit_test(test_linear_fp_batch_invariant),
    cmocka_unit_test(test_linear_qi_batch_invariant),
    cmocka_unit_test(test_linear_quant_fast),
    cmocka_unit_test(test_embed),        cmocka_unit_test(test_norms),
    cmocka_unit_test(test_rope),          
    cmocka_unit_test(test_selective_scan),
    cmocka_unit_test(test_gated_delta),
    cmocka_unit_test(test_ssd_scan),
    cmocka_unit_test(test_rglru),
    
};

TEST_SUITE(kernels, k_tests);
