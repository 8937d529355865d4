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
#include "test.h"

// ---- fixtures ----

#define N_BE_MAX 6

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

struct bes {
    struct backend *be[N_BE_MAX];
    int n;
};

/* Every ISA the machine supports x threads {1, 3}. */
static void bes_open(struct bes *b)
{
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    static const int threads[] = {1, 3};
    g_rng = 0x9e3779b97f4a7c15ull; /* each test's data independent of the others */
    b->n = 0;
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 2; t++) {
            struct err e = {0};
            struct backend *be;
            if (backend_cpu_new(&be, threads[t], isas[i], &e) == 0)
                b->be[b->n++] = be;
        }
    }
    assert_true(b->n >= 2);
}

static void bes_close(struct bes *b)
{
    for (int i = 0; i < b->n; i++)
        backend_free(b->be[i]);
}

static float frand(float lo, float hi)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((g_rng >> 40) / 16777216.0);
}

static unsigned urand(unsigned n)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)((g_rng >> 33) % n);
}

static float *fvec(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof *p + 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand(lo, hi);
    return p;
}

/* Worst errors seen by one test per ISA (scalar, avx2, avx512), printed at its end. */
struct errstat {
    double nmse[3], maxrel[3];
};

static int isa_index(const struct backend *be)
{
    return strstr(be->name, "avx512") ? 2 : strstr(be->name, "avx2") ? 1 : 0;
}

/* Compare got against ref (n values); fail above the thresholds. */
static void check(struct errstat *st, const char *what, const struct backend *be,
                  const float *got, const double *ref, size_t n, double thr_nmse, double thr_rel)
{
    double se = 0, sr = 0, maxabs = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        if (!isfinite(got[i]))
            d = INFINITY;
        se += d * d;
        sr += ref[i] * ref[i];
        maxabs = fabs(d) > maxabs ? fabs(d) : maxabs;
        maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
    }
    /* Floors (RMS and max 1e-2): a reference that is all but zero must not
     * turn an f32 absolute error into 100% (gelu_tanh(-5.84) is -3.5e-10,
     * where f32 1 + tanh() is exactly 0; 1 + erf() likewise loses all its
     * digits). Every test's data is O(1). */
    double nmse = se / fmax(sr, (double)n * 1e-4);
    double rel = maxabs / fmax(maxref, 1e-2);
    int ix = isa_index(be);
    if (nmse > st->nmse[ix])
        st->nmse[ix] = nmse;
    if (rel > st->maxrel[ix])
        st->maxrel[ix] = rel;
    if (!(nmse <= thr_nmse && rel <= thr_rel)) {
        print_error("%s on %s (%d threads): nmse %.3g (max %.3g), max rel %.3g (max %.3g)\n", what,
                    be->name, be->n_threads, nmse, thr_nmse, rel, thr_rel);
        fail();
    }
}

static void report(const char *test, const struct errstat *st)
{
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    printf("    %-12s", test);
    if (st->nmse[0] == 0 && st->maxrel[0] == 0 && st->maxrel[2] == 0)
        printf("  exact on every ISA");
    for (int i = 0; i < 3; i++)
        if (st->nmse[i] > 0 || st->maxrel[i] > 0)
            printf("  %s: nmse %.2g rel %.2g", names[i], st->nmse[i], st->maxrel[i]);
    printf("\n");
}

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
            st(d, dt, (size_t)r * ld_el + i, frand(-amp, amp));
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
            unsigned q = urand(1u << bits);
            for (int k = 0; k < bits; k++)
                if (q >> k & 1)
                    row[(j * bits + k) >> 3] |= (uint8_t)(1u << ((j * bits + k) & 7));
        }
        for (size_t g = 0; g < ng; g++) {
            st(s, sdt, (size_t)r * ng + g, frand(-0.02f, 0.02f));
            st(b, sdt, (size_t)r * ng + g, frand(-0.1f, 0.1f));
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
                sc = edge && urand(3) == 0 ? e4_edge[urand(sizeof e4_edge)] : 0x28 + urand(0x18);
            else
                sc = edge && urand(3) == 0 ? e8_edge[urand(sizeof e8_edge)] : 122 + urand(8);
            if (r == 0 && g == 0)
                sc = mode == QMODE_NVFP4 ? 0x38 : 127;
            s[(size_t)r * ng + g] = (uint8_t)sc;
            bool small = mode != QMODE_NVFP4 && sc == 254;
            for (size_t k = 0; k < (size_t)group; k++) {
                size_t j = g * group + k;
                unsigned q = urand(1u << bits);
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

static void linear_case(struct bes *bs, struct errstat *es, const struct tensor *w,
                        const struct tensor *b, int n_tok)
{
    int out = (int)w->shape[0], in = (int)w->shape[1];
    float *x = fvec((size_t)n_tok * in, -1, 1);
    float *y = malloc((size_t)n_tok * out * sizeof *y);
    double *ref = malloc((size_t)n_tok * out * sizeof *ref);
    char what[128];
    linear_ref(ref, x, w, b, n_tok);
    snprintf(what, sizeof what, "linear %s q%d n_tok=%d in=%d out=%d", dtype_name(w->dtype),
             w->qbits, n_tok, in, out);
    for (int i = 0; i < bs->n; i++) {
        memset(y, 0xff, (size_t)n_tok * out * sizeof *y); /* NaN: catches unwritten outputs */
        bs->be[i]->ops->linear(bs->be[i], y, (int)w->shape[0], x, w, b, n_tok);
        check(es, what, bs->be[i], y, ref, (size_t)n_tok * out, 1e-9, 1e-4);
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
    };
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    struct bes bs;
    struct errstat es = {0};
    bes_open(&bs);
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
    report("linear", &es);
    bes_close(&bs);
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
 */
struct qstat {
    double worst[3]; /* largest |err| / bound per ISA */
};

static void qlinear_case(struct bes *bs, struct qstat *qs, const struct tensor *w, int n_tok,
                         float xamp)
{
    int out = (int)w->shape[0], in = (int)w->shape[1];
    size_t n = (size_t)n_tok * out;
    float *x = fvec((size_t)n_tok * in, -xamp, xamp);
    float *y = malloc(n * sizeof *y), *y0 = malloc(n * sizeof *y0);
    double *ref = malloc(n * sizeof *ref), *bnd = malloc(n * sizeof *bnd);
    assert_true(y && y0 && ref && bnd);
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < out; r++) {
            double acc = 0, mag = 0;
            for (int i = 0; i < in; i++) {
                double xi = x[(size_t)t * in + i];
                acc += xi * wref(w, r, i);
                mag += fabs(xi) * wmag(w, r, i);
            }
            ref[(size_t)t * out + r] = acc;
            bnd[(size_t)t * out + r] = (in + 16) * ldexp(mag, -24) + in * ldexp(1.0, -140);
        }
    for (int i = 0; i < bs->n; i++) {
        struct backend *be = bs->be[i];
        memset(y, 0xff, n * sizeof *y); /* NaN: catches unwritten outputs */
        be->ops->linear(be, y, (int)w->shape[0], x, w, NULL, n_tok);
        if (i == 0)
            memcpy(y0, y, n * sizeof *y); /* bs->be[0] is the scalar reference */
        for (size_t k = 0; k < n; k++) {
            double e = fabs((double)y[k] - ref[k]), e0 = fabs((double)y[k] - (double)y0[k]);
            double rel = isfinite(e) ? e / bnd[k] : INFINITY;
            int ix = isa_index(be);
            qs->worst[ix] = rel > qs->worst[ix] ? rel : qs->worst[ix];
            if (!(e <= bnd[k] && e0 <= 2 * bnd[k])) {
                print_error("linear mode %d q%d g%d %s n_tok=%d in=%d out=%d on %s (%d threads): "
                            "y[%zu] = %.9g, exact %.9g, scalar %.9g, bound %.3g\n",
                            (int)w->qmode, w->qbits, w->qgroup, dtype_name(w->qsdtype), n_tok, in,
                            out, be->name, be->n_threads, k, (double)y[k], ref[k], (double)y0[k],
                            bnd[k]);
                fail();
            }
        }
    }
    free(x);
    free(y);
    free(y0);
    free(ref);
    free(bnd);
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
 * rows not a multiple of the 4-row unroll, > 2048 codes (several scale
 * chunks), n_tok 1..9 and past the GEMM threshold. */
static const int k_qshapes[][3] = {
    {1, 1, 7}, {3, 2, 1}, {1, 3, 33}, {20, 4, 40}, {6, 3, 33}, {9, 17, 9},
    {2, 70, 5}, {4, 5, 3}, {5, 2, 4}, {7, 1, 6}, {8, 3, 12},
    {33, 2, 19}, {64, 3, 24},   /* past every gemm_min_tok_q: the quantized GEMM path */
};

static void test_linear_quant(void **state)
{
    (void)state;
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const enum dtype sdts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    size_t ns = sizeof k_qshapes / sizeof k_qshapes[0];
    struct bes bs;
    struct qstat qs = {{0}};
    bes_open(&bs);
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
    bes_close(&bs);
}

static void test_linear_fp(void **state)
{
    (void)state;
    static const enum qmode modes[] = {QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4};
    size_t ns = sizeof k_qshapes / sizeof k_qshapes[0];
    struct bes bs;
    struct qstat qs = {{0}};
    bes_open(&bs);
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
    bes_close(&bs);
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
    struct bes bs;
    bes_open(&bs);
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
        }
        free(y);
    }
    for (int k = 0; k < nw; k++)
        tfree(&ws[k]);
    bes_close(&bs);
}

static void test_linear_batch(void **state)
{
    (void)state;
    struct bes bs;
    struct errstat es = {0};
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
    bes_open(&bs);
    struct linear_job jobs[NJ];
    float *x[NJ], *y[NJ];
    double *ref[NJ];
    for (int j = 0; j < NJ; j++) {
        int in = (int)w[j].shape[1], out = (int)w[j].shape[0];
        x[j] = fvec((size_t)in, -1, 1);
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
            check(&es, "linear_batch", bs.be[i], y[j], ref[j], (size_t)w[j].shape[0], 1e-9, 1e-4);
    }
    for (int j = 0; j < NJ; j++) {
        free(x[j]);
        free(y[j]);
        free(ref[j]);
        tfree(&w[j]);
    }
    tfree(&b);
    report("linear_batch", &es);
    bes_close(&bs);
}

// ---- embed ----

static void embed_case(struct bes *bs, struct errstat *es, const struct tensor *w)
{
    enum { N_TOK = 5 };
    int32_t ids[N_TOK];
    int n = (int)w->shape[1];
    float *y = malloc((size_t)N_TOK * n * sizeof *y);
    double *ref = malloc((size_t)N_TOK * n * sizeof *ref);
    for (int t = 0; t < N_TOK; t++) {
        ids[t] = (int32_t)urand((unsigned)w->shape[0]);
        for (int i = 0; i < n; i++)
            ref[(size_t)t * n + i] = wref(w, ids[t], i);
    }
    for (int i = 0; i < bs->n; i++) {
        for (int nt = 1; nt <= N_TOK; nt += N_TOK - 1) {
            memset(y, 0xff, (size_t)N_TOK * n * sizeof *y);
            bs->be[i]->ops->embed(bs->be[i], y, w, ids, nt);
            check(es, "embed", bs->be[i], y, ref, (size_t)nt * n, 1e-12, 1e-6);
        }
    }
    free(y);
    free(ref);
}

static void test_embed(void **state)
{
    (void)state;
    struct bes bs;
    struct errstat es = {0};
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    bes_open(&bs);
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
    report("embed", &es);
    bes_close(&bs);
}

// ---- norms ----

static void norm_case(struct bes *bs, struct errstat *es, bool layer, enum dtype wdt, int rows,
                      int n, bool inplace)
{
    float eps = 1e-5f;
    float *x = fvec((size_t)rows * n, -2, 3);
    float *y = malloc((size_t)rows * n * sizeof *y);
    double *ref = malloc((size_t)rows * n * sizeof *ref);
    struct tensor w = wrand(wdt, 1, n, n, 1.5f), b = wrand(wdt, 1, n, n, 0.5f);
    int64_t shape[1] = {n};
    tensor_init(&w, wdt, w.data, 1, shape);
    tensor_init(&b, wdt, b.data, 1, shape);
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
            ref[(size_t)r * n + i] = (xr[i] - mean) * inv * ld(w.data, wdt, i) +
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
            bs->be[i]->ops->layernorm(bs->be[i], dst, src, n, &w, &b, eps, rows, 1, n);
        else
            bs->be[i]->ops->rmsnorm(bs->be[i], dst, src, n, &w, eps, rows, 1, n);
        check(es, layer ? "layernorm" : "rmsnorm", bs->be[i], y, ref, (size_t)rows * n, 1e-11,
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
    struct bes bs;
    struct errstat es = {0};
    static const int shapes[][2] = {{1, 1}, {1, 7}, {5, 33}, {3, 4096}, {40, 1000}, {2, 2049}};
    bes_open(&bs);
    for (int layer = 0; layer < 2; layer++)
        for (size_t s = 0; s < 6; s++)
            for (int d = 0; d < 3; d++)
                norm_case(&bs, &es, layer, (enum dtype)d, shapes[s][0], shapes[s][1], s & 1);
    report("norms", &es);
    bes_close(&bs);
}

// ---- rope ----

static void rope_case(struct bes *bs, struct errstat *es, int n_tok, int n_head, int head_dim,
                      int n_rot, int pad, int pos0, float mscale)
{
    int rs = n_head * head_dim + pad;
    size_t n = (size_t)n_tok * rs;
    float *x0 = fvec(n, -1, 1), *x = malloc(n * sizeof *x), inv_freq[256];
    double *ref = malloc(n * sizeof *ref);
    for (int j = 0; j < n_rot / 2; j++)
        inv_freq[j] = (float)pow(10000.0, -2.0 * j / n_rot);
    for (size_t i = 0; i < n; i++)
        ref[i] = x0[i];
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            double *r = ref + (size_t)t * rs + (size_t)h * head_dim;
            for (int j = 0; j < n_rot / 2; j++) {
                double a = (double)(pos0 + t) * inv_freq[j], c = cos(a) * mscale,
                       s = sin(a) * mscale;
                double x1 = r[j], x2 = r[j + n_rot / 2];
                r[j] = x1 * c - x2 * s;
                r[j + n_rot / 2] = x2 * c + x1 * s;
            }
        }
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos), *end = malloc((size_t)n_tok * sizeof *end);
    for (int t = 0; t < n_tok; t++) {
        pos[t] = pos0 + t;
        end[t] = pos0 + n_tok;
    }
    struct kv_rows rows = {.pos = pos, .seq_end = end};
    struct rope_params rp = {n_rot, inv_freq, NULL, 0, mscale};
    for (int i = 0; i < bs->n; i++) {
        memcpy(x, x0, n * sizeof *x);
        bs->be[i]->ops->rope(bs->be[i], x, rs, n_tok, n_head, head_dim, &rp, &rows);
        check(es, "rope", bs->be[i], x, ref, n, 1e-12, 1e-6);
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
    struct bes bs;
    struct errstat es = {0};
    bes_open(&bs);
    rope_case(&bs, &es, 1, 3, 64, 64, 0, 0, 1.0f);
    rope_case(&bs, &es, 1, 4, 128, 128, 0, 12345, 1.0f);
    rope_case(&bs, &es, 5, 3, 64, 32, 7, 1000, 1.2f);   /* partial rotary, padded rows */
    rope_case(&bs, &es, 9, 2, 80, 80, 0, 3, 1.0f);
    rope_case(&bs, &es, 2, 5, 6, 4, 1, 100000, 0.9f);
    report("rope", &es);
    bes_close(&bs);
}

// ---- attention ----

/* Brute-force causal attention over positions [0, pos0 + n_tok) in dense k/v [n_ctx][n_kv*hd]
 * with every mask and option applied the textbook way: scores, softcap, -inf outside the
 * window, softmax with an optional sink logit per head. */
static void attn_ref(double *out, const float *q, const float *k, const float *v, int n_tok,
                     int pos0, int n_head, int n_kv, int hd, const struct attn_params *ap)
{
    size_t qs = (size_t)n_head * hd, kvs = (size_t)n_kv * hd;
    double *s = malloc((size_t)(pos0 + n_tok) * sizeof *s);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            int g = h / (n_head / n_kv), p = pos0 + t, n_ctx = p + 1;
            double m = ap->sinks ? ap->sinks[h] : -INFINITY, sum = 0;
            for (int j = 0; j < n_ctx; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[t * qs + h * hd + i] * k[j * kvs + g * hd + i];
                d *= ap->scale;
                if (ap->softcap > 0)
                    d = ap->softcap * tanh(d / ap->softcap);
                if (ap->window > 0 && p - j >= ap->window)
                    d = -INFINITY;
                s[j] = d;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < n_ctx; j++)
                sum += (s[j] = exp(s[j] - m));
            if (ap->sinks)
                sum += exp(ap->sinks[h] - m);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int j = 0; j < n_ctx; j++)
                    acc += s[j] * v[j * kvs + g * hd + i];
                out[t * qs + h * hd + i] = acc / sum;
            }
        }
    free(s);
}

/* Dense k/v scattered into a paged pool of 4-slot blocks in reverse block order
 * (a table that is not the identity), the n_tok query rows at positions
 * pos0.. of one sequence. */
struct paged {
    struct kv_layer kv;
    int32_t *pos, *slot, *table, *tables, *end;
    struct kv_rows rows;
};

static void paged_open(struct paged *pg, const float *k, const float *v, int n_ctx, int kvd,
                       int pos0, int n_tok)
{
    int bs = 4, nb = (n_ctx + bs - 1) / bs;
    pg->kv = (struct kv_layer){calloc((size_t)nb * bs * kvd, sizeof(float)),
                               calloc((size_t)nb * bs * kvd, sizeof(float)), kvd, kvd};
    pg->tables = malloc((size_t)nb * sizeof *pg->tables);
    for (int b = 0; b < nb; b++)
        pg->tables[b] = nb - 1 - b;
    for (int j = 0; j < n_ctx; j++) {
        size_t sl = (size_t)pg->tables[j / bs] * bs + j % bs;
        memcpy(pg->kv.k + sl * kvd, k + (size_t)j * kvd, (size_t)kvd * sizeof(float));
        memcpy(pg->kv.v + sl * kvd, v + (size_t)j * kvd, (size_t)kvd * sizeof(float));
    }
    pg->pos = malloc((size_t)n_tok * sizeof(int32_t));
    pg->slot = malloc((size_t)n_tok * sizeof(int32_t));
    pg->table = calloc((size_t)n_tok, sizeof(int32_t));
    pg->end = malloc((size_t)n_tok * sizeof(int32_t));
    for (int t = 0; t < n_tok; t++) {
        pg->pos[t] = pos0 + t;
        pg->slot[t] = pg->tables[(pos0 + t) / bs] * bs + (pos0 + t) % bs;
        pg->end[t] = n_ctx;
    }
    pg->rows = (struct kv_rows){pg->pos, pg->slot, pg->table, pg->tables, pg->end, bs};
}

static void paged_close(struct paged *pg)
{
    free(pg->kv.k);
    free(pg->kv.v);
    free(pg->pos);
    free(pg->slot);
    free(pg->table);
    free(pg->tables);
    free(pg->end);
}

static void attn_case_opts(struct bes *bs, struct errstat *es, int n_tok, int pos0, int n_head,
                           int n_kv, int hd, float amp, int window, float softcap, bool sinks)
{
    int n_ctx = pos0 + n_tok;
    size_t nq = (size_t)n_tok * n_head * hd, nkv = (size_t)n_ctx * n_kv * hd;
    float *q = fvec(nq, -amp, amp), *k = fvec(nkv, -amp, amp), *v = fvec(nkv, -1, 1);
    float *sk = sinks ? fvec((size_t)n_head, -2, 2) : NULL;
    float *out = malloc(nq * sizeof *out);
    double *ref = malloc(nq * sizeof *ref);
    struct attn_params ap = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd), softcap, window, sk};
    struct paged pg;
    attn_ref(ref, q, k, v, n_tok, pos0, n_head, n_kv, hd, &ap);
    paged_open(&pg, k, v, n_ctx, n_kv * hd, pos0, n_tok);
    for (int i = 0; i < bs->n; i++) {
        memset(out, 0xff, nq * sizeof *out);
        bs->be[i]->ops->attention(bs->be[i], out, n_head * hd, q, n_head * hd, &pg.kv, &pg.rows,
                                  n_tok, &ap);
        check(es, "attention", bs->be[i], out, ref, nq, 1e-10, 1e-4);
    }
    paged_close(&pg);
    free(q);
    free(k);
    free(v);
    free(sk);
    free(out);
    free(ref);
}

static void attn_case(struct bes *bs, struct errstat *es, int n_tok, int pos0, int n_head,
                      int n_kv, int hd, float amp)
{
    attn_case_opts(bs, es, n_tok, pos0, n_head, n_kv, hd, amp, 0, 0.0f, false);
}

static void test_attention(void **state)
{
    (void)state;
    struct bes bs;
    struct errstat es = {0};
    bes_open(&bs);
    attn_case(&bs, &es, 1, 0, 1, 1, 8, 1.0f);
    attn_case(&bs, &es, 1, 17, 4, 2, 64, 1.0f);      /* decode, GQA */
    attn_case(&bs, &es, 7, 0, 4, 4, 64, 1.0f);       /* prefill, MHA */
    attn_case(&bs, &es, 9, 5, 6, 1, 80, 2.0f);       /* chunked prefill, MQA */
    attn_case(&bs, &es, 13, 3, 8, 2, 7, 3.0f);       /* odd head_dim */
    attn_case(&bs, &es, 40, 100, 4, 2, 128, 4.0f);   /* peaked softmax */
    attn_case(&bs, &es, 1, 300, 2, 1, 96, 1.0f);
    attn_case(&bs, &es, 3, 2, 130, 1, 8, 1.0f);      /* more query heads per kv head than a tile */
    report("attention", &es);
    bes_close(&bs);
}

/* The sliding-window kind, soft-capping and sinks against the brute-force masked reference:
 * windows shorter than, equal to and longer than the context, across block boundaries. */
static void test_attention_window(void **state)
{
    (void)state;
    struct bes bs;
    struct errstat es = {0};
    bes_open(&bs);
    attn_case_opts(&bs, &es, 1, 40, 4, 2, 16, 1.0f, 8, 0.0f, false);     /* decode, window 8 */
    attn_case_opts(&bs, &es, 20, 0, 4, 1, 16, 1.0f, 8, 0.0f, false);     /* prefill past it */
    attn_case_opts(&bs, &es, 70, 30, 2, 2, 32, 2.0f, 5, 0.0f, false);    /* keys > one gather block */
    attn_case_opts(&bs, &es, 6, 3, 4, 4, 8, 1.0f, 9, 0.0f, false);       /* window = context */
    attn_case_opts(&bs, &es, 5, 0, 4, 4, 8, 1.0f, 1, 0.0f, false);       /* only itself */
    attn_case_opts(&bs, &es, 9, 7, 4, 2, 16, 6.0f, 0, 3.0f, false);      /* softcap */
    attn_case_opts(&bs, &es, 9, 7, 4, 2, 16, 1.0f, 4, 0.0f, true);       /* sinks + window */
    report("attention_window", &es);
    bes_close(&bs);
}

// ---- elementwise ----

static double gelu_tanh_d(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_erf_d(double x)
{
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

static void test_elementwise(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 15, 16, 1000, 40007};
    struct bes bs;
    struct errstat es = {0};
    bes_open(&bs);
    for (size_t si = 0; si < 5; si++) {
        size_t n = sizes[si];
        float *a = fvec(n, -9, 9), *b = fvec(n, -2, 2), *y = malloc(n * sizeof *y);
        float *gu = malloc(2 * n * sizeof *gu);
        double *r1 = malloc(n * sizeof *r1), *r2 = malloc(n * sizeof *r2),
               *r3 = malloc(n * sizeof *r3), *r4 = malloc(n * sizeof *r4),
               *r5 = malloc(n * sizeof *r5);
        for (size_t i = 0; i < n; i++) {
            r1[i] = gelu_tanh_d(a[i]);
            r2[i] = gelu_erf_d(a[i]);
            r3[i] = a[i] / (1 + exp(-(double)a[i])) * b[i];
            r4[i] = b[i] + 0.37 * (double)a[i];
            r5[i] = gelu_erf_d(a[i]) * b[i];
        }
        for (int i = 0; i < bs.n; i++) {
            struct backend *be = bs.be[i];
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_GELU_TANH, y, (int)n, 1, (int)n);
            check(&es, "gelu_tanh", be, y, r1, n, 1e-11, 1e-5);
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_GELU_ERF, y, (int)n, 1, (int)n);
            check(&es, "gelu_erf", be, y, r2, n, 1e-11, 1e-5);
            /* glu: one row [gate | up], written over the gate half */
            memcpy(gu, a, n * sizeof *gu);
            memcpy(gu + n, b, n * sizeof *gu);
            be->ops->glu(be, ACT_SILU, gu, (int)(2 * n), gu, (int)(2 * n), 1, (int)n);
            check(&es, "glu silu", be, gu, r3, n, 1e-11, 1e-5);
            memcpy(gu, a, n * sizeof *gu);
            memcpy(gu + n, b, n * sizeof *gu);
            be->ops->glu(be, ACT_GELU_ERF, y, (int)n, gu, (int)(2 * n), 1, (int)n);
            check(&es, "glu gelu", be, y, r5, n, 1e-11, 1e-5);
            memcpy(y, b, n * sizeof *y);
            be->ops->axpy(be, y, (int)n, 0.37f, a, (int)n, 1, (int)n);
            check(&es, "axpy", be, y, r4, n, 1e-12, 1e-6);
        }
        free(a);
        free(b);
        free(y);
        free(r1);
        free(r2);
        free(r3);
        free(r4);
        free(r5);
        free(gu);
    }
    report("elementwise", &es);
    bes_close(&bs);
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

/* "auto" (and MLXCEL_ISA) resolve to the best ISA the CPU supports, every ISA up
 * to that one opens and those above are refused, and the auto-selected kernels
 * compute what the scalar references compute. */
static void test_isa_select(void **state)
{
    (void)state;
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    struct backend *be;
    struct err e = {0};
    char want[32];
    assert_true(backend_cpu_new(&be, 1, "bogus", &e) < 0);
    assert_non_null(strstr(e.msg, "bogus"));
    assert_int_equal(backend_cpu_new(&be, 2, "scalar", &e), 0);
    assert_string_equal(be->name, "cpu-scalar");
    assert_int_equal(be->n_threads, 2);
    backend_free(be);

    const char *best = isa_best_expected();
    snprintf(want, sizeof want, "cpu-%s", best);
    assert_int_equal(backend_cpu_new(&be, 1, "auto", &e), 0);
    printf("    auto ISA: %s (the CPU supports up to %s)\n", be->name, best);
    assert_string_equal(be->name, want);

    /* auto against scalar: float and quantized linear, decode and prefill */
    struct bes bs = {.n = 2};
    struct errstat es = {0};
    struct qstat qs = {{0}};
    assert_int_equal(backend_cpu_new(&bs.be[0], 1, "scalar", &e), 0); /* qlinear_case's reference */
    bs.be[1] = be;
    struct tensor w = wrand(DTYPE_BF16, 37, 300, 300, 0.5f);
    struct tensor q = qrand(4, 64, DTYPE_BF16, 37, 256);
    for (int n_tok = 1; n_tok <= 5; n_tok += 4) {
        linear_case(&bs, &es, &w, NULL, n_tok);
        qlinear_case(&bs, &qs, &q, n_tok, 1.0f);
    }
    tfree(&w);
    tfree(&q);
    bes_close(&bs);
    report("auto", &es);
    qreport("auto_q", &qs);

    char *old = getenv("MLXCEL_ISA") ? strdup(getenv("MLXCEL_ISA")) : NULL;
    setenv("MLXCEL_ISA", "scalar", 1);
    assert_int_equal(backend_cpu_new(&be, 1, NULL, &e), 0);
    assert_string_equal(be->name, "cpu-scalar");
    backend_free(be);
    if (old) {
        setenv("MLXCEL_ISA", old, 1);
        free(old);
    } else {
        unsetenv("MLXCEL_ISA");
    }

    bool above = false;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        int rc = backend_cpu_new(&be, 1, isas[i], &e);
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

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_isa_select),   cmocka_unit_test(test_linear),
    cmocka_unit_test(test_linear_quant), cmocka_unit_test(test_linear_fp),
    cmocka_unit_test(test_dequant),      cmocka_unit_test(test_linear_batch),
    cmocka_unit_test(test_embed),        cmocka_unit_test(test_norms),
    cmocka_unit_test(test_rope),         cmocka_unit_test(test_attention), cmocka_unit_test(test_attention_window),
    cmocka_unit_test(test_elementwise),
};

TEST_SUITE(kernels, k_tests);
