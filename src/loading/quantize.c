/*
 * quantize: MLX's quantizer reproduced bit for bit (quantize.h).
 *
 * Every step is one IEEE float32 operation with one rounding, in the order of
 * the spec (mlx-quantization.md §2.2-§2.3, §4), written as separate
 * statements so no compiler can fuse or reorder them (the build has no
 * -ffast-math and ISO C mode keeps FP contraction off). A row is widened to
 * float32 once, then each group gets its scale (and bias), its codes, and the
 * codes go into the row's little-endian bit stream through a 64-bit
 * accumulator that emits a u32 word whenever it holds 32 bits.
 *
 * Non-finite inputs are not meaningful to MLX either; here they give
 * well-defined (clamped) codes instead of undefined float -> int casts
 * (convert refuses them before they get here). A finite group can still
 * give a scale or bias that is not finite in the stored dtype (weights
 * spanning more than FLT_MAX, or a scale past f16's 65504): quant_rows
 * refuses that, naming the row and group, rather than write inf.
 */
#include "quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* §2.2 step 2: the floor of the affine scale (float32 1e-7). */
#define QUANT_EPS 1e-7f

int quant_params_check(const struct quant_params *p, struct err *e)
{
    if (p->variant != QUANT_GPU && p->variant != QUANT_CPU)
        return err_setf(e, ERR_ARG, "quantizer variant %d is not gpu or cpu", (int)p->variant);
    /* the loader's rule (quant.c), reported as a bad argument */
    struct qparams q = {p->mode, p->bits, p->group};
    if (qparams_validate(&q, e) < 0) {
        if (e)
            e->code = ERR_ARG;
        return -ERR_ARG;
    }
    return 0;
}

bool quant_shape_ok(const struct quant_params *p, int ndim, const int64_t *shape)
{
    if (ndim < 2 || p->group <= 0)
        return false;
    for (int i = 0; i < ndim; i++)
        if (shape[i] <= 0)
            return false;
    return shape[ndim - 1] % p->group == 0;
}

enum dtype quant_scale_dtype(const struct quant_params *p, enum dtype dt)
{
    return p->mode == QMODE_AFFINE ? dt : DTYPE_U8;
}

/* ---- rounding ---- */

/* Ties away from zero without double rounding: trunc and x - trunc(x) are exact. */
static float round_half_away(float x)
{
    float t = truncf(x);
    float frac = x - t;
    if (fabsf(frac) >= 0.5f)
        t = t + (x > 0.0f ? 1.0f : -1.0f);
    return t;
}

static float round_variant(float x, enum quant_variant v)
{
    return v == QUANT_GPU ? round_half_away(x) : rintf(x);
}

/* ---- small floats (§4) ---- */

uint8_t quant_e2m1_encode(float x)
{
    if (isnan(x))
        return 7;
    float a = fabsf(x);
    uint8_t m = a > 5.0f    ? 7
                : a >= 3.5f  ? 6
                : a > 2.5f   ? 5
                : a >= 1.75f ? 4
                : a > 1.25f  ? 3
                : a >= 0.75f ? 2
                : a > 0.25f  ? 1
                             : 0;
    return (uint8_t)(m | (signbit(x) ? 8 : 0));
}

/* Nearest with ties to even; |x| >= 448, inf and NaN saturate to 448 (0x7E). */
uint8_t quant_e4m3_encode(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (!(a < 448.0))
        return (uint8_t)(0x7E | sign);
    if (a < 0x1p-6)  /* subnormals: multiples of 2^-9; 8 is the smallest normal */
        return (uint8_t)((int)rint(a * 512.0) | sign);
    int e;
    double m = frexp(a, &e);  /* a = m 2^e, m in [0.5, 1) */
    e -= 1;
    int mq = (int)rint((m * 2.0 - 1.0) * 8.0);
    if (mq == 8) {
        e += 1;
        mq = 0;
    }
    return (uint8_t)(((e + 7) * 8 + mq) | sign);
}

float quant_e4m3_decode(uint8_t b)
{
    int e = (b >> 3) & 0xF, m = b & 7;
    double v = e == 0 ? m / 8.0 * 0x1p-6 : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (float)((b & 0x80) ? -v : v);
}

/* round_half_away(float32 log2(s)) + 127, clamped; log2 is the float32 rounding of the
 * double log2, as mlxq takes it. 0 -> 0, negative -> 0, inf/NaN -> 255. */
uint8_t quant_e8m0_encode(float s)
{
    if (!isfinite(s))
        return 0xFF;
    if (s < 0.0f)
        return 0;
    double l = (double)(float)log2((double)s);
    if (isinf(l))
        return 0;
    double t = trunc(l);
    double n = fabs(l - t) >= 0.5 ? t + (l > 0 ? 1.0 : -1.0) : t;
    if (n < -127.0)
        n = -127.0;
    if (n > 127.0)
        n = 127.0;
    return (uint8_t)((int)n + 127);
}

float quant_e8m0_decode(uint8_t b)
{
    return b == 255 ? INFINITY : ldexpf(1.0f, (int)b - 127);
}

/* ---- packing ---- */

struct bitpack {
    uint32_t *out;
    uint64_t acc;
    int n;
};

static void pack_put(struct bitpack *bp, uint32_t code, int bits)
{
    bp->acc |= (uint64_t)code << bp->n;
    bp->n += bits;
    if (bp->n >= 32) {
        *bp->out++ = (uint32_t)bp->acc;
        bp->acc >>= 32;
        bp->n -= 32;
    }
}

/* ---- one group ---- */

/* §2.2 scale and bias, §2.3 codes. */
static void affine_group(const struct quant_params *p, const float *w, struct bitpack *bp,
                         float *scale, float *bias)
{
    const float n_bins = (float)((1 << p->bits) - 1);
    float hi = p->variant == QUANT_GPU ? 0.0f : -INFINITY, lo = INFINITY;
    for (int i = 0; i < p->group; i++) {
        hi = w[i] > hi ? w[i] : hi;
        lo = w[i] < lo ? w[i] : lo;
    }
    float range = hi - lo;
    float s = range / n_bins;
    s = s < QUANT_EPS ? QUANT_EPS : s;
    bool min_is_far = fabsf(lo) > fabsf(hi);
    float edge = min_is_far ? lo : hi;
    if (!min_is_far)
        s = -s;
    float r = edge / s;
    float q0 = round_variant(r, p->variant);
    float b = 0.0f;
    if (q0 != 0.0f) {
        s = edge / q0;
        b = edge;
    }
    for (int i = 0; i < p->group; i++) {
        float d = w[i] - b;
        float x = d / s;
        float c = round_variant(x, p->variant);
        uint32_t code = c >= n_bins ? (uint32_t)n_bins : c > 0.0f ? (uint32_t)c : 0u;
        pack_put(bp, code, p->bits);
    }
    *scale = s;
    *bias = b;
}

/* §4: amax -> scale byte -> codes of w * (1 / scale value). */
static uint8_t fp_group(const struct quant_params *p, const float *w, struct bitpack *bp)
{
    float amax = 0.0f;
    for (int i = 0; i < p->group; i++) {
        float a = fabsf(w[i]);
        amax = (a > amax || isnan(a)) ? a : amax;
    }
    uint8_t code;
    float sdec;
    if (p->mode == QMODE_NVFP4) {
        float t = amax / 6.0f;
        code = quant_e4m3_encode(t);
        sdec = quant_e4m3_decode(code);
    } else {
        float t = amax / (p->mode == QMODE_MXFP4 ? 6.0f : 448.0f);
        code = quant_e8m0_encode(t);
        sdec = quant_e8m0_decode(code);
    }
    float inv = sdec == 0.0f ? 0.0f : 1.0f / sdec;
    for (int i = 0; i < p->group; i++) {
        float x = w[i] * inv;
        uint32_t c = p->bits == 4 ? quant_e2m1_encode(x) : quant_e4m3_encode(x);
        pack_put(bp, c, p->bits);
    }
    return code;
}

int quant_rows(const struct quant_params *p, enum dtype dt, const void *src, int64_t n_rows,
               int64_t n_in, uint32_t *wq, void *scales, void *biases, struct err *e)
{
    int rc;
    if ((rc = quant_params_check(p, e)) < 0)
        return rc;
    if (!dtype_is_float(dt))
        return err_setf(e, ERR_ARG, "cannot quantize %s data (F32, F16 or BF16 only)", dtype_name(dt));
    if (n_in <= 0 || n_in % p->group != 0)
        return err_setf(e, ERR_ARG, "row length %lld is not a positive multiple of group %d",
                        (long long)n_in, p->group);
    if (n_rows < 0)
        return err_setf(e, ERR_ARG, "negative row count %lld", (long long)n_rows);
    if (n_rows == 0)
        return 0;
    if (p->mode == QMODE_AFFINE && !biases)
        return err_setf(e, ERR_ARG, "affine quantization needs a biases buffer");
    float *row = malloc((size_t)n_in * sizeof *row);
    if (!row)
        return err_setf(e, ERR_NOMEM, "out of memory for a %lld-element row", (long long)n_in);
    const size_t esz = dtype_size(dt);
    const int64_t n_groups = quant_row_groups(p, n_in), n_words = quant_row_words(p, n_in);
    for (int64_t r = 0; r < n_rows; r++) {
        dtype_to_f32_ref(row, (const uint8_t *)src + (size_t)(r * n_in) * esz, dt, (size_t)n_in);
        struct bitpack bp = {wq + r * n_words, 0, 0};
        for (int64_t g = 0; g < n_groups; g++) {
            int64_t gi = r * n_groups + g;
            if (p->mode == QMODE_AFFINE) {
                float s, b;
                affine_group(p, row + g * p->group, &bp, &s, &b);
                dtype_store_f32(dt, scales, gi, s);
                dtype_store_f32(dt, biases, gi, b);
                float sv, bv;
                dtype_to_f32_ref(&sv, (const uint8_t *)scales + (size_t)gi * esz, dt, 1);
                dtype_to_f32_ref(&bv, (const uint8_t *)biases + (size_t)gi * esz, dt, 1);
                if (!isfinite(sv) || !isfinite(bv)) {
                    free(row);
                    return err_setf(e, ERR_RANGE, "row %lld, group %lld: the %s scale or bias overflows "
                                    "(the group's weights span too wide a range for %d bits in %s)",
                                    (long long)r, (long long)g, dtype_name(dt), p->bits, dtype_name(dt));
                }
            } else {
                ((uint8_t *)scales)[gi] = fp_group(p, row + g * p->group, &bp);
            }
        }
    }
    free(row);
    return 0;
}
