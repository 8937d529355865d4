/*
 * preprocess_impl: the resampler preprocess.c builds on (resample.c). Not a public header.
 */
#pragma once
#include <stdint.h>

#include "core/err.h"
#include "image/preprocess.h"

/* Resize src [sh][sw][3] to dst [dh][dw][3] (uint8, interleaved) with PIL's separable
 * antialiased convolution in fixed point, as the backend computes it: torchvision's uint8
 * kernel (int16 coefficients, precision chosen per dimension from the largest weight, Keys'
 * cubic written as torch writes it) or Pillow's ImagingResample (22-bit coefficients).
 * Horizontal pass first, each pass rounded to uint8; a side of equal size is not resampled.
 * filter: BILINEAR or BICUBIC (both backends), LANCZOS / BOX / HAMMING (PIL only). Sizes must
 * be non-zero and already bounded by the caller. */
int img_resize_u8(uint8_t *dst, uint32_t dw, uint32_t dh, const uint8_t *src, uint32_t sw, uint32_t sh,
                  enum image_resample filter, enum image_backend backend, struct err *e);
