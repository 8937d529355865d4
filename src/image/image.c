/*
 * image: format sniffing, limits, EXIF orientation and the transposes of
 * PIL's ImageOps.exif_transpose; the decoding is per format (image_*.c).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "image_impl.h"

struct image_limits image_limits_default(void)
{
    return (struct image_limits){IMAGE_MAX_BYTES_DEFAULT, IMAGE_MAX_SIDE_DEFAULT, IMAGE_MAX_PIXELS_DEFAULT};
}

enum image_format image_sniff(const void *data, size_t n)
{
    const uint8_t *p = data;
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff)
        return IMAGE_JPEG;
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0)
        return IMAGE_PNG;
    if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0)
        return IMAGE_WEBP;
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
        return IMAGE_GIF;
    return IMAGE_UNKNOWN;
}

const char *image_format_name(enum image_format f)
{
    switch (f) {
    case IMAGE_JPEG: return "JPEG";
    case IMAGE_PNG: return "PNG";
    case IMAGE_WEBP: return "WebP";
    case IMAGE_GIF: return "GIF";
    default: return "unknown";
    }
}

int img_check_size(const char *fmt, uint64_t w, uint64_t h, const struct image_limits *lim,
                   struct err *e)
{
    if (w == 0 || h == 0)
        return err_setf(e, ERR_FORMAT, "%s: an empty image (%llu x %llu)", fmt, (unsigned long long)w,
                        (unsigned long long)h);
    if (w > lim->max_side || h > lim->max_side)
        return err_setf(e, ERR_RANGE, "%s: %llu x %llu pixels: a side over the limit of %u", fmt,
                        (unsigned long long)w, (unsigned long long)h, lim->max_side);
    if (w * h > lim->max_pixels)
        return err_setf(e, ERR_RANGE, "%s: %llu x %llu = %llu pixels, over the limit of %llu", fmt,
                        (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h),
                        (unsigned long long)lim->max_pixels);
    return 0;
}

uint8_t *img_alloc_rgb(uint32_t w, uint32_t h, struct err *e)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    if (!p)
        err_setf(e, ERR_NOMEM, "out of memory for a %u x %u image", w, h);
    return p;
}

// ---- EXIF ----

static unsigned rd16(const uint8_t *p, bool le)
{
    return le ? (unsigned)p[0] | (unsigned)p[1] << 8 : (unsigned)p[0] << 8 | p[1];
}

static uint32_t rd32(const uint8_t *p, bool le)
{
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
              : (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int img_exif_orientation(const uint8_t *p, size_t n)
{
    if (n >= 6 && memcmp(p, "Exif\0\0", 6) == 0) {
        p += 6;
        n -= 6;
    }
    if (n < 8)
        return 1;
    bool le;
    if (p[0] == 'I' && p[1] == 'I')
        le = true;
    else if (p[0] == 'M' && p[1] == 'M')
        le = false;
    else
        return 1;
    if (rd16(p + 2, le) != 42)
        return 1;
    uint32_t ifd = rd32(p + 4, le);
    if (ifd > n - 2)
        return 1;
    unsigned count = rd16(p + ifd, le);
    for (unsigned i = 0; i < count; i++) {
        size_t at = (size_t)ifd + 2 + (size_t)i * 12;
        if (at + 12 > n)
            return 1;
        const uint8_t *t = p + at;
        if (rd16(t, le) != 0x0112)
            continue;
        unsigned type = rd16(t + 2, le);
        uint32_t cnt = rd32(t + 4, le);
        uint32_t v = type == 3 ? rd16(t + 8, le) : type == 4 ? rd32(t + 8, le) : 0;
        return cnt == 1 && v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

/* PIL's Image.transpose for orientations 2..8 (exif_transpose's table: 2 FLIP_LEFT_RIGHT,
 * 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90).
 * Output pixel (x, y) reads input pixel (sx, sy). */
static int orient(struct image *im, int o, const struct image_limits *lim, struct err *e)
{
    if (o <= 1 || o > 8)
        return 0;
    uint32_t w = im->w, h = im->h;
    bool swap = o >= 5;
    uint32_t ow = swap ? h : w, oh = swap ? w : h;
    int rc = img_check_size(image_format_name(im->format), ow, oh, lim, e);
    if (rc < 0)
        return rc;
    uint8_t *out = img_alloc_rgb(ow, oh, e);
    if (!out)
        return -ERR_NOMEM;
    for (uint32_t y = 0; y < oh; y++) {
        for (uint32_t x = 0; x < ow; x++) {
            uint32_t sx, sy;
            switch (o) {
            case 2: sx = w - 1 - x, sy = y; break;
            case 3: sx = w - 1 - x, sy = h - 1 - y; break;
            case 4: sx = x, sy = h - 1 - y; break;
            case 5: sx = y, sy = x; break;
            case 6: sx = y, sy = h - 1 - x; break;
            case 7: sx = w - 1 - y, sy = h - 1 - x; break;
            default: sx = w - 1 - y, sy = x; break;
            }
            memcpy(out + ((size_t)y * ow + x) * 3, im->rgb + ((size_t)sy * w + sx) * 3, 3);
        }
    }
    free(im->rgb);
    im->rgb = out;
    im->w = ow;
    im->h = oh;
    return 0;
}

// ---- decoding ----

int image_decode(struct image *out, const void *data, size_t n, const struct image_limits *lim,
                 struct err *e)
{
    memset(out, 0, sizeof *out);
    struct image_limits def = image_limits_default();
    if (!lim)
        lim = &def;
    if (n == 0)
        return err_setf(e, ERR_FORMAT, "an empty image (0 bytes)");
    if (n > lim->max_bytes)
        return err_setf(e, ERR_RANGE, "an image of %zu bytes, over the limit of %zu", n, lim->max_bytes);
    enum image_format f = image_sniff(data, n);
    static const img_decoder dec[] = {[IMAGE_JPEG] = img_jpeg, [IMAGE_PNG] = img_png,
                                      [IMAGE_WEBP] = img_webp, [IMAGE_GIF] = img_gif};
    if (f == IMAGE_UNKNOWN)
        return err_setf(e, ERR_FORMAT, "not an image this program reads (JPEG, PNG, WebP, GIF): "
                                       "the first bytes are no such signature");
    out->format = f;
    int o = 1;
    int rc = dec[f](out, &o, data, n, lim, e);
    if (rc == 0)
        rc = orient(out, o, lim, e);
    if (rc < 0)
        image_free(out);
    return rc;
}

int image_load(struct image *out, const char *path, const struct image_limits *lim, struct err *e)
{
    memset(out, 0, sizeof *out);
    struct image_limits def = image_limits_default();
    if (!lim)
        lim = &def;
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(path, lim->max_bytes, &buf, &len, e);
    if (rc == 0) {
        rc = image_decode(out, buf, len, lim, e);
        if (rc < 0)
            err_prefix(e, "%s", path);
    }
    free(buf);
    return rc;
}

void image_free(struct image *im)
{
    if (!im)
        return;
    free(im->rgb);
    im->rgb = NULL;
    im->w = im->h = 0;
}
