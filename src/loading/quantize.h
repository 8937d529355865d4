/*
 * quantize: MLX's weight quantizer in C, bit for bit (../shared/docs/
 * mlx-quantization.md §2-§4; the oracle is ../shared/tools/mlxq.py).
 *
 * A weight [.., n_in] is quantized row by row along its last axis in groups
 * of `group` elements:
 *   affine  bits 2/3/4/5/6/8, group 32/64/128: per group a float32 scale and
 *           bias (edge-snapped so 0 is exact), stored in the input's dtype
 *   mxfp4   (32, 4): E2M1 codes, E8M0 scale byte, no biases
 *   mxfp8   (32, 8): E4M3 codes, E8M0 scale byte, no biases
 *   nvfp4   (16, 4): E2M1 codes, E4M3 scale byte, no biases
 * Codes are packed per row as one little-endian bit stream of u32 words
 * (code j at stream bits [j*bits, (j+1)*bits)).
 *
 * Two affine variants exist in MLX (§2.5): QUANT_GPU (Metal/CUDA, which made
 * the mlx-community uploads: ties away from zero, group max starts at 0) is
 * the default; QUANT_CPU is MLX's CPU kernel (ties to even, true max).
 * The fp modes follow the Metal kernel.
 */
#pragma once
#include <stdint.h>

#include "../core/dtype.h"
#include "../core/err.h"
#include "../core/tensor.h"
#include "quant.h"

#ifdef __cplusplus
extern "C" {
#endif

enum quant_variant { QUANT_GPU = 0, QUANT_CPU = 1 };

struct quant_params {
    enum qmode mode;
    int bits;
    int group;
    enum quant_variant variant;
};

/* Mode names and defaults: qmode_parse / qmode_name / qmode_defaults (quant.h). */

/* The (mode, group, bits) combinations MLX accepts (§6, qparams_validate); -ERR_ARG naming
 * the bad value. */
int quant_params_check(const struct quant_params *p, struct err *e);
/* Whether a tensor of this shape can be quantized with p: ndim >= 2 and the last dim a
 * positive multiple of the group. */
bool quant_shape_ok(const struct quant_params *p, int ndim, const int64_t *shape);

/* u32 words per row and groups per row for a row of n_in elements. */
static inline int64_t quant_row_words(const struct quant_params *p, int64_t n_in)
{
    return n_in * p->bits / 32;
}
static inline int64_t quant_row_groups(const struct quant_params *p, int64_t n_in)
{
    return n_in / p->group;
}
/* Storage dtype of scales (and biases) for input dtype dt: dt for affine, U8 otherwise. */
enum dtype quant_scale_dtype(const struct quant_params *p, enum dtype dt);

/* Quantize n_rows rows of n_in elements of src (dtype F32, F16 or BF16, contiguous).
 * Outputs (caller-allocated, contiguous): wq [n_rows, n_in*bits/32] u32;
 * scales [n_rows, n_in/group] of quant_scale_dtype; biases likewise for affine, ignored
 * (may be NULL) for the fp modes. Parameters or shape not accepted -> -ERR_ARG. */
int quant_rows(const struct quant_params *p, enum dtype dt, const void *src, int64_t n_rows,
               int64_t n_in, uint32_t *wq, void *scales, void *biases, struct err *e);

/* The small-float codecs of the fp modes (exposed for tests). */
uint8_t quant_e2m1_encode(float x);
uint8_t quant_e4m3_encode(float x);
float quant_e4m3_decode(uint8_t b);
uint8_t quant_e8m0_encode(float s);
float quant_e8m0_decode(uint8_t b);

#ifdef __cplusplus
}
#endif
