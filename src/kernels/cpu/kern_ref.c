/*
 * kern_ref: scalar reference kernels, always built. They are the fallback on
 * CPUs without AVX2 and the oracle the ISA variants are tested against, so
 * they stay simple: one loop per op, f32 accumulation in index order, weights
 * widened exactly (bf16 by a 16-bit shift, f16 by the bit-exact dtype.c
 * conversion), quantized weights dequantized element by element in f32:
 * affine w = scale * q + bias (one multiply, one add), fp modes
 * w = value(q) * scale (kern.h; ../shared/docs/mlx-quantization.md 2.4, 4).
 */
#include <math.h>
#include <string.h>

#include "kern.h"

// ---- weights ----

static void ref_to_f32(float *dst, const void *src, enum dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kern_ld(src, dt, i);
}

/* Dequantize W[r, k0 .. k0+n): element j of group g is s_g * q_j + b_g
 * (affine) or value(q_j) * scale_g (fp modes). */
static void ref_wrow_q(float *dst, const struct wmat *w, int r, int k0, int n)
{
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->qs + (size_t)r * w->qrow_bytes;
    const uint8_t *b = w->qb ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    for (int i = 0; i < n; i++) {
        size_t j = (size_t)k0 + (size_t)i;
        size_t g = j / (size_t)w->qgroup;
        unsigned q = kern_qcode(row, w->qbits, j);
        if (w->qmode == QMODE_AFFINE)
            dst[i] = kern_ld(s, w->qsdt, g) * (float)q + kern_ld(b, w->qsdt, g);
        else
            dst[i] = kern_qval(w, q) * kern_qscale(w, s, g);
    }
}

void kern_ref_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n)
{
    if (w->qbits) {
        ref_wrow_q(dst, w, r, k0, n);
        return;
    }
    const uint8_t *row = w->data + (size_t)r * w->row_bytes + (size_t)k0 * dtype_size(w->dt);
    ref_to_f32(dst, row, w->dt, (size_t)n);
}

/* Row by row, token by token; W is widened in 256-element chunks (a multiple
 * of 32, as wrow_f32 requires for quantized rows) and summed in index order. */
static void ref_matvec(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                       const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
    float buf[256];
    (void)xsum;
    (void)ldxs;
    for (int r = r0; r < r1; r++) {
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx;
            float acc = 0.0f;
            for (int c = 0; c < w->in; c += 256) {
                int len = w->in - c < 256 ? w->in - c : 256;
                kern_ref_wrow_f32(buf, w, r, c, len);
                for (int i = 0; i < len; i++)
                    acc += xt[c + i] * buf[i];
            }
            y[(size_t)t * ldy + (size_t)r] = acc;
        }
    }
}

static void ref_pack_t(float *bp, int nr, const float *rows, size_t ldr, int nv, int kc)
{
    for (int k = 0; k < kc; k++)
        for (int j = 0; j < nr; j++)
            bp[(size_t)k * nr + j] = j < nv ? rows[(size_t)j * ldr + k] : 0.0f;
}

// ---- vectors ----

static float ref_dot(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void ref_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void ref_scale(float *y, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] *= a;
}

static float ref_sum(const float *x, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += x[i];
    return acc;
}

static float ref_sumsq(const float *x, float c, int n)
{
    float acc = 0.0f;
    for (int i = 0; i < n; i++)
        acc += (x[i] - c) * (x[i] - c);
    return acc;
}

static void ref_norm_apply(float *y, const float *x, float c, float a, const void *w,
                           enum dtype wdt, float w_off, const void *b, enum dtype bdt, int n)
{
    for (int i = 0; i < n; i++) {
        float v = (x[i] - c) * a * (kern_ld(w, wdt, (size_t)i) + w_off);
        y[i] = b ? v + kern_ld(b, bdt, (size_t)i) : v;
    }
}

static float ref_max(const float *x, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

static float ref_exp_sum(float *y, const float *x, float m, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        y[i] = expf(x[i] - m);
        s += y[i];
    }
    return s;
}

static void ref_attn_scores(float *s, const float *q, const float *k, size_t ld, int n, int hd,
                            float scale)
{
    for (int j = 0; j < n; j++)
        s[j] = ref_dot(q, k + (size_t)j * ld, hd) * scale;
}

static void ref_attn_accum(float *o, const float *p, const float *v, size_t ld, int n, int hd,
                           bool acc)
{
    if (!acc)
        memset(o, 0, (size_t)hd * sizeof *o);
    for (int j = 0; j < n; j++)
        ref_axpy(o, p[j], v + (size_t)j * ld, (size_t)hd);
}

static void ref_silu_mul(float *y, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2 gelu_new). */
static void ref_gelu_tanh(float *x, size_t n)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
}

/* gelu(x) = 0.5 x (1 + erf(x / sqrt 2)). */
static void ref_gelu_erf(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

/* The order of the recurrence as first written: one element of the state at a time, the
 * output summed in element order. */
static void ref_ssd_rows(float *s, int N, const float *B, const float *C, size_t ldbc,
                         const float *x, size_t ldx, const float *dtd, size_t ldd, float *y,
                         size_t ldy, float dskip, int n)
{
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float v = x[(size_t)i * ldx], dx = dtd[(size_t)i * ldd] * v, a = dtd[(size_t)i * ldd + 1];
        float acc = 0.0f;
        for (int m = 0; m < N; m++) {
            s[m] = a * s[m] + dx * b[m];
            acc += s[m] * c[m];
        }
        y[(size_t)i * ldy] = acc + dskip * v;
    }
}

static void ref_scan_rows(float *h, int ds, const float *a, const float *B, const float *C,
                          size_t ldbc, const float *x, size_t ldx, const float *delta, size_t ldd,
                          float *acc, size_t lda, int n)
{
    for (int i = 0; i < n; i++) {
        const float *b = B + (size_t)i * ldbc, *c = C + (size_t)i * ldbc;
        float d = delta[(size_t)i * ldd], dx = d * x[(size_t)i * ldx], sum = 0.0f;
        for (int s = 0; s < ds; s++) {
            h[s] = expf(d * a[s]) * h[s] + dx * b[s];
            sum += h[s] * c[s];
        }
        acc[(size_t)i * lda] = sum;
    }
}

static void ref_softplus(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] = x[i] > 20.0f ? x[i] : log1pf(expf(x[i]));
}

void cpu_kernels_ref_init(struct cpu_kernels *k)
{
    memset(k, 0, sizeof *k);
    k->name = "scalar";
    k->wrow_f32 = kern_ref_wrow_f32;
    k->to_f32 = ref_to_f32;
    k->matvec = ref_matvec;
    k->ukernel = NULL; /* the scalar backend runs every linear as matvec */
    k->pack_t = ref_pack_t;
    k->gemm_nr = 0;
    k->gemm_min_tok = 0;
    k->gemm_min_tok_q = 0;
    k->dot = ref_dot;
    k->axpy = ref_axpy;
    k->scale = ref_scale;
    k->sum = ref_sum;
    k->sumsq = ref_sumsq;
    k->norm_apply = ref_norm_apply;
    k->max = ref_max;
    k->exp_sum = ref_exp_sum;
    k->attn_scores = ref_attn_scores;
    k->attn_accum = ref_attn_accum;
    k->silu_mul = ref_silu_mul;
    k->gelu_tanh = ref_gelu_tanh;
    k->gelu_erf = ref_gelu_erf;
    k->ssd_rows = ref_ssd_rows;
    k->scan_rows = ref_scan_rows;
    k->softplus = ref_softplus;
    k->gdn_rows = kern_gdn_rows_ref;
    k->conv_rows = kern_conv_rows_ref;
    k->rglru_rows = kern_rglru_rows_ref;
}
