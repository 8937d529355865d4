/*
 * image_impl: what the per-format decoders (image_jpeg.c, image_png.c,
 * image_webp.c, image_gif.c) share with image.c. Not a public header.
 */
#pragma once
#include <stdbool.h>

#include "image.h"

/* A decoder fills out->w, out->h, out->rgb (from img_alloc_rgb) and *orientation (the
 * EXIF orientation, 1 when none), or returns an error and leaves out->rgb NULL. */
typedef int (*img_decoder)(struct image *out, int *orientation, const uint8_t *d, size_t n,
                           const struct image_limits *lim, struct err *e);

int img_jpeg(struct image *out, int *orientation, const uint8_t *d, size_t n,
             const struct image_limits *lim, struct err *e);
int img_png(struct image *out, int *orientation, const uint8_t *d, size_t n,
            const struct image_limits *lim, struct err *e);
int img_webp(struct image *out, int *orientation, const uint8_t *d, size_t n,
             const struct image_limits *lim, struct err *e);
int img_gif(struct image *out, int *orientation, const uint8_t *d, size_t n,
            const struct image_limits *lim, struct err *e);

/* w x h against the limits: ERR_FORMAT for an empty image, ERR_RANGE past a limit (the
 * message names the format and the size). */
int img_check_size(const char *fmt, uint64_t w, uint64_t h, const struct image_limits *lim,
                   struct err *e);

/* [h][w][3] bytes, or NULL with ERR_NOMEM set (sizes already checked). */
uint8_t *img_alloc_rgb(uint32_t w, uint32_t h, struct err *e);

/* The Orientation tag (0x0112) of an EXIF block (a TIFF structure, with or without the
 * "Exif\0\0" prefix): 1..8, or 1 when absent or malformed (as PIL: no transpose). */
int img_exif_orientation(const uint8_t *p, size_t n);
