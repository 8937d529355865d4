/*
 * image: untrusted image bytes (JPEG, PNG, WebP, GIF) to 8-bit RGB, as
 * transformers' load_image makes them with PIL: the first frame,
 * ImageOps.exif_transpose, then convert("RGB") (alpha dropped, not blended;
 * palettes looked up; CMYK through PIL's formula). ADR 0078 says why these
 * libraries and what "as PIL" means where PIL and the format disagree.
 *
 * Every size is bounded before any pixel is decoded: the encoded bytes, each
 * side and the pixel count (a decompression bomb is an ERR_RANGE error, not
 * an allocation). Errors are ERR_FORMAT (not an image we read, truncated or
 * corrupt data), ERR_RANGE (over a limit) or ERR_NOMEM, with a message that
 * names the format and what was wrong.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

enum image_format {
    IMAGE_UNKNOWN = 0,
    IMAGE_JPEG,
    IMAGE_PNG,
    IMAGE_WEBP,
    IMAGE_GIF,
};

struct image_limits {
    size_t max_bytes;     /* encoded size */
    uint32_t max_side;    /* width and height, after any EXIF rotation alike */
    uint64_t max_pixels;  /* width * height */
};

/* 20 MiB (OpenAI's limit on one image), 16384 a side, 40 M pixels (an 8K x 5K
 * photo; 120 MB of RGB) */
#define IMAGE_MAX_BYTES_DEFAULT ((size_t)20 << 20)
#define IMAGE_MAX_SIDE_DEFAULT 16384u
#define IMAGE_MAX_PIXELS_DEFAULT ((uint64_t)40 << 20)

struct image {
    uint32_t w, h;
    uint8_t *rgb;              /* [h][w][3] */
    enum image_format format;  /* what it was decoded from */
};

/* The limits above. */
struct image_limits image_limits_default(void);

/* The format the first bytes announce (IMAGE_UNKNOWN for none we read). */
enum image_format image_sniff(const void *data, size_t n);

const char *image_format_name(enum image_format f);

/* Decode data[0, n) into out (out->rgb malloc'd; image_free releases it). lim
 * NULL: the defaults. On failure out is left empty. */
int image_decode(struct image *out, const void *data, size_t n, const struct image_limits *lim,
                 struct err *e);

/* A whole file through image_decode (read bounded by lim->max_bytes). */
int image_load(struct image *out, const char *path, const struct image_limits *lim, struct err *e);

void image_free(struct image *im);
