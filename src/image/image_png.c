/*
 * PNG through libpng's low-level reader (the simplified png_image API blends
 * alpha onto a background; PIL's convert("RGB") drops it). Transforms, as
 * PIL's modes convert: palettes looked up (tRNS ignored), gray of 1, 2 or 4
 * bits scaled to 8 (x255, x85, x17), alpha dropped, 16-bit samples to their
 * high byte ("RGB;16B", "LA;16B"), except 16-bit gray without alpha, which
 * PIL opens as a 32-bit integer image and converts to 8 bits by clipping at
 * 255. Interlaced files are read whole (libpng's Adam7 handling).
 *
 * Bounds: libpng's user limits stop an IHDR over max_side before any pixel
 * buffer exists (then our pixel limit); ancillary chunks (iCCP, zTXt, eXIf,
 * ...) are capped at CHUNK_MAX bytes decompressed and CHUNK_COUNT in number;
 * a bad CRC on any chunk is an error, as PIL's "broken PNG file". The EXIF
 * orientation comes from an eXIf chunk before or after the image data (PIL
 * reads both).
 */
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "image_impl.h"

#define CHUNK_MAX ((png_alloc_size_t)8 << 20)
#define CHUNK_COUNT 1000

struct src {
    const uint8_t *d;
    size_t n, at;
    char msg[160];
};

static void p_read(png_structp p, png_bytep out, size_t len)
{
    struct src *s = png_get_io_ptr(p);
    if (len > s->n - s->at)
        png_error(p, "the data ends before the image does (truncated)");
    memcpy(out, s->d + s->at, len);
    s->at += len;
}

static void p_error(png_structp p, png_const_charp msg)
{
    struct src *s = png_get_error_ptr(p);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(p, 1);
}

static void p_warn(png_structp p, png_const_charp msg)
{
    (void)p;
    (void)msg;
}

static int exif_of(png_structp p, png_infop info)
{
    png_uint_32 n = 0;
    png_bytep x = NULL;
    if (png_get_eXIf_1(p, info, &n, &x) && x && n)
        return img_exif_orientation(x, n);
    return 0;
}

int img_png(struct image *out, int *orientation, const uint8_t *d, size_t n,
            const struct image_limits *lim, struct err *e)
{
    /* the size from IHDR (the first chunk) before libpng sees it: a clear error for a bomb */
    if (n >= 24 && memcmp(d + 12, "IHDR", 4) == 0) {
        uint64_t hw = (uint64_t)d[16] << 24 | (uint64_t)d[17] << 16 | (uint64_t)d[18] << 8 | d[19];
        uint64_t hh = (uint64_t)d[20] << 24 | (uint64_t)d[21] << 16 | (uint64_t)d[22] << 8 | d[23];
        int rc = img_check_size("PNG", hw, hh, lim, e);
        if (rc < 0)
            return rc;
    }
    struct src s = {.d = d, .n = n};
    png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, p_error, p_warn);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    uint8_t *volatile rgb = NULL;
    uint8_t **volatile rows = NULL;
    uint16_t *volatile wide = NULL;
    volatile int own = 0, done = 0;
    if (!info) {
        png_destroy_read_struct(p ? &p : NULL, NULL, NULL);
        return err_setf(e, ERR_NOMEM, "PNG: out of memory for the reader");
    }
    if (setjmp(png_jmpbuf(p))) {
        if (done) {  /* an error past the image (in chunks after it): the image stands */
            png_destroy_read_struct(&p, &info, NULL);
            free(rows);
            return 0;
        }
        png_destroy_read_struct(&p, &info, NULL);
        free(rgb);
        free(rows);
        free(wide);
        if (own < 0)
            return own;
        return err_setf(e, ERR_FORMAT, "PNG: %s", s.msg[0] ? s.msg : "corrupt data");
    }
    png_set_read_fn(p, &s, p_read);
    png_set_user_limits(p, lim->max_side, lim->max_side);
    png_set_chunk_malloc_max(p, CHUNK_MAX);
    png_set_chunk_cache_max(p, CHUNK_COUNT);
    png_set_crc_action(p, PNG_CRC_ERROR_QUIT, PNG_CRC_ERROR_QUIT);
    png_read_info(p, info);
    png_uint_32 w = png_get_image_width(p, info), h = png_get_image_height(p, info);
    int depth = png_get_bit_depth(p, info), ct = png_get_color_type(p, info);
    own = img_check_size("PNG", w, h, lim, e);
    if (own < 0)
        png_longjmp(p, 1);
    int o = exif_of(p, info);
    bool gray16 = depth == 16 && ct == PNG_COLOR_TYPE_GRAY;
    if (ct == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(p);
    if (ct == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(p);
    if (depth == 16 && !gray16)
        png_set_strip_16(p);
    png_set_strip_alpha(p);  /* an alpha channel, or the one png_set_expand makes of tRNS */
    if (!gray16 && (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA))
        png_set_gray_to_rgb(p);
    if (gray16)
        png_set_swap(p);  /* host order: read as uint16 */
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    size_t rb = png_get_rowbytes(p, info), want = (size_t)w * (gray16 ? 2 : 3);
    if (rb != want) {
        snprintf(s.msg, sizeof s.msg, "unexpected row size %zu (want %zu)", rb, want);
        png_longjmp(p, 1);
    }
    rgb = img_alloc_rgb(w, h, e);
    rows = malloc((size_t)h * sizeof *rows);
    if (gray16)
        wide = malloc((size_t)w * h * 2);
    if (!rgb || !rows || (gray16 && !wide)) {
        own = err_setf(e, ERR_NOMEM, "PNG: out of memory for a %u x %u image", (unsigned)w, (unsigned)h);
        png_longjmp(p, 1);
    }
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = gray16 ? (uint8_t *)(wide + (size_t)y * w) : rgb + (size_t)y * w * 3;
    png_read_image(p, rows);
    if (gray16) {
        for (size_t i = 0; i < (size_t)w * h; i++)
            rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = (uint8_t)(wide[i] > 255 ? 255 : wide[i]);
        free(wide);
        wide = NULL;
    }
    out->w = w;
    out->h = h;
    out->rgb = rgb;
    *orientation = o ? o : 1;
    if (!o) {  /* an eXIf chunk may follow the image data */
        done = 1;
        png_read_end(p, info);
        o = exif_of(p, info);
        *orientation = o ? o : 1;
    }
    png_destroy_read_struct(&p, &info, NULL);
    free(rows);
    return 0;
}
