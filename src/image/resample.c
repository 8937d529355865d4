/*
 * resample: PIL's antialiased resize of 8-bit RGB, as transformers' two backends run it.
 *
 * Both backends resize the uint8 image before any float appears: torchvision's resize on a
 * uint8 CPU tensor (BILINEAR or BICUBIC, antialias=True, as TorchvisionBackend.resize calls
 * it) runs torch's separable uint8 kernel (aten UpSampleKernel.cpp and its AVX2 twin, both
 * ported from Pillow-SIMD), and the PIL backend calls Image.resize (Pillow's Resample.c).
 * The two share the geometry (support = filter support x max(scale, 1), taps centred on
 * (i + 0.5) x scale, weights normalised to sum 1) and the order (horizontal pass, uint8
 * rounding, vertical pass) and differ in two places only, kept here:
 *   - fixed point: Pillow scales weights by 2^22 into int32; torch by 2^p into int16, p the
 *     largest precision (< 22) at which round(max_weight x 2^(p+1)) stays under 2^15;
 *   - the cubic (Keys, a = -0.5): Pillow evaluates the outer lobe as (((x-5)x+8)x-4)a, torch
 *     as ((ax-5a)x+8a)x-4a, which can round differently in the last bit.
 * Each output is (sum_k w_k x_k + 2^(p-1)) >> p, clamped to [0, 255]: integer arithmetic,
 * so the bytes equal transformers' exactly (tests/test_preprocess.c compares them).
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "image/preprocess_impl.h"

struct taps {
    int ksize;       /* coefficients per output sample */
    int prec;        /* fixed-point bits */
    int32_t *xmin;   /* [n_out] first input sample */
    int32_t *xsize;  /* [n_out] number of input samples */
    int32_t *k;      /* [n_out][ksize] fixed-point weights */
};

static double filter_support(enum image_resample f)
{
    switch (f) {
    case IMAGE_RESAMPLE_BOX: return 0.5;
    case IMAGE_RESAMPLE_BILINEAR: return 1.0;
    case IMAGE_RESAMPLE_HAMMING: return 1.0;
    case IMAGE_RESAMPLE_BICUBIC: return 2.0;
    case IMAGE_RESAMPLE_LANCZOS: return 3.0;
    default: return 0.0;
    }
}

static double sinc(double x)
{
    if (x == 0.0)
        return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

/* Pillow's filters (Resample.c), the cubic in torch's form when torch_cubic. */
static double filter_eval(enum image_resample f, double x, bool torch_cubic)
{
    const double a = -0.5;
    switch (f) {
    case IMAGE_RESAMPLE_BOX:
        return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0;
    case IMAGE_RESAMPLE_BILINEAR:
        x = fabs(x);
        return x < 1.0 ? 1.0 - x : 0.0;
    case IMAGE_RESAMPLE_HAMMING:
        x = fabs(x);
        if (x == 0.0)
            return 1.0;
        if (x >= 1.0)
            return 0.0;
        x *= M_PI;
        return sin(x) / x * (0.54 + 0.46 * cos(x));
    case IMAGE_RESAMPLE_BICUBIC:
        x = fabs(x);
        if (x < 1.0)
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
        if (x < 2.0)
            return torch_cubic ? ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
                               : (((x - 5) * x + 8) * x - 4) * a;
        return 0.0;
    case IMAGE_RESAMPLE_LANCZOS:
        return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
    default:
        return 0.0;
    }
}

static void taps_free(struct taps *t)
{
    free(t->xmin);
    free(t->xsize);
    free(t->k);
    memset(t, 0, sizeof *t);
}

/* Rounds half away from zero, as both libraries convert their weights. */
static int32_t fixed(double v)
{
    return (int32_t)(v < 0 ? -0.5 + v : 0.5 + v);
}

static int taps_make(struct taps *t, uint32_t in, uint32_t out, enum image_resample f,
                     enum image_backend b, struct err *e)
{
    double scale = (double)in / out;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = filter_support(f) * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    bool torch = b == IMAGE_BACKEND_TORCHVISION;
    double *w = calloc((size_t)out * ksize, sizeof *w);
    memset(t, 0, sizeof *t);
    t->ksize = ksize;
    t->xmin = calloc(out, sizeof *t->xmin);
    t->xsize = calloc(out, sizeof *t->xsize);
    t->k = calloc((size_t)out * ksize, sizeof *t->k);
    if (!w || !t->xmin || !t->xsize || !t->k) {
        free(w);
        taps_free(t);
        return err_setf(e, ERR_NOMEM, "image resize: no memory for %u x %d weights", out, ksize);
    }
    double wmax = 0.0;
    for (uint32_t i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        double ss = 1.0 / filterscale;
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > in)
            xmax = in;
        int64_t xsize = xmax - xmin;
        if (xsize < 0)
            xsize = 0;
        if (xsize > ksize)
            xsize = ksize;
        double *wi = w + (size_t)i * ksize, total = 0.0;
        for (int64_t j = 0; j < xsize; j++) {
            wi[j] = filter_eval(f, ((double)(j + xmin) - center + 0.5) * ss, torch);
            total += wi[j];
        }
        if (total != 0.0)
            for (int64_t j = 0; j < xsize; j++) {
                wi[j] /= total;
                if (wi[j] > wmax)
                    wmax = wi[j];
            }
        t->xmin[i] = (int32_t)xmin;
        t->xsize[i] = (int32_t)xsize;
    }
    if (torch) {
        /* torch's _compute_index_ranges_int16_weights */
        int p;
        for (p = 0; p < 22; p++)
            if ((int)(0.5 + wmax * (1 << (p + 1))) >= (1 << 15))
                break;
        t->prec = p;
    } else {
        t->prec = 22;  /* Pillow's PRECISION_BITS = 32 - 8 - 2 */
    }
    for (size_t j = 0; j < (size_t)out * ksize; j++) {
        int32_t v = fixed(w[j] * (double)(1 << t->prec));
        t->k[j] = torch ? (int16_t)v : v;
    }
    free(w);
    if (t->prec < 1) {
        taps_free(t);
        return err_setf(e, ERR_INTERNAL, "image resize: no fixed-point precision left");
    }
    return 0;
}

static uint8_t clip8(int64_t ss, int prec)
{
    if (ss < 0)
        return 0;
    ss >>= prec;
    return ss > 255 ? 255 : (uint8_t)ss;
}

/* One pass: out sample i of a line takes taps from in samples at stride step (3 bytes
 * horizontally, a row vertically). */
static void pass(uint8_t *dst, const uint8_t *src, uint32_t n_lines, size_t src_line, size_t dst_line,
                 size_t step, size_t line_step_out, uint32_t n_out, const struct taps *t)
{
    int64_t half = (int64_t)1 << (t->prec - 1);
    for (uint32_t y = 0; y < n_lines; y++) {
        const uint8_t *s = src + (size_t)y * src_line;
        uint8_t *d = dst + (size_t)y * dst_line;
        for (uint32_t i = 0; i < n_out; i++) {
            const int32_t *k = t->k + (size_t)i * t->ksize;
            const uint8_t *p = s + (size_t)t->xmin[i] * step;
            for (int c = 0; c < 3; c++) {
                int64_t ss = half;
                for (int32_t j = 0; j < t->xsize[i]; j++)
                    ss += (int64_t)p[(size_t)j * step + c] * k[j];
                d[(size_t)i * line_step_out + c] = clip8(ss, t->prec);
            }
        }
    }
}

int img_resize_u8(uint8_t *dst, uint32_t dw, uint32_t dh, const uint8_t *src, uint32_t sw, uint32_t sh,
                  enum image_resample filter, enum image_backend backend, struct err *e)
{
    if (filter_support(filter) == 0.0)
        return err_setf(e, ERR_UNSUPPORTED, "image resize: resample filter %d is not supported", (int)filter);
    if (!dw || !dh || !sw || !sh)
        return err_setf(e, ERR_RANGE, "image resize: empty image (%ux%u to %ux%u)", sw, sh, dw, dh);
    if (dw == sw && dh == sh) {
        memcpy(dst, src, (size_t)sw * sh * 3);
        return 0;
    }
    struct taps t;
    int rc;
    const uint8_t *cur = src;
    uint8_t *tmp = NULL;
    if (dw != sw) {
        if ((rc = taps_make(&t, sw, dw, filter, backend, e)) < 0)
            return rc;
        uint8_t *out = dst;
        if (dh != sh) {
            tmp = malloc((size_t)dw * sh * 3);
            if (!tmp) {
                taps_free(&t);
                return err_setf(e, ERR_NOMEM, "image resize: no memory for %ux%u", dw, sh);
            }
            out = tmp;
        }
        /* lines are rows; samples 3 bytes apart */
        pass(out, src, sh, (size_t)sw * 3, (size_t)dw * 3, 3, 3, dw, &t);
        taps_free(&t);
        cur = out;
    }
    if (dh != sh) {
        if ((rc = taps_make(&t, sh, dh, filter, backend, e)) < 0) {
            free(tmp);
            return rc;
        }
        /* lines are columns (one byte triple apart); samples a row apart */
        pass(dst, cur, dw, 3, 3, (size_t)dw * 3, (size_t)dw * 3, dh, &t);
        taps_free(&t);
    }
    free(tmp);
    return 0;
}
