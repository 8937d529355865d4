/*
 * JPEG through libjpeg-turbo, with the settings PIL decodes with (the library's
 * defaults: accurate integer IDCT, fancy upsampling), so the RGB bytes equal
 * PIL's. 1 component is gray, 3 are YCbCr or RGB (libjpeg converts), 4 are
 * CMYK or YCCK, read as PIL reads them ("CMYK;I": Adobe's inverted values)
 * and converted with PIL's cmyk2rgb. Data that ends early (libjpeg's
 * "premature end of data" warning, where it would pad with gray) is an error,
 * as PIL's "image file is truncated"; other warnings are not. A progressive
 * file may hold at most MAX_SCANS scans (each one is a pass over the whole
 * coefficient buffer: thousands of tiny scans are a known way to burn CPU).
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "image_impl.h"

#define MAX_SCANS 1000

struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
};

static void j_error_exit(j_common_ptr c)
{
    struct jerr *je = (struct jerr *)c->err;
    c->err->format_message(c, je->msg);
    longjmp(je->jb, 1);
}

static void j_emit(j_common_ptr c, int level)
{
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
        struct jerr *je = (struct jerr *)c->err;
        snprintf(je->msg, sizeof je->msg, "the data ends before the image does (truncated)");
        longjmp(je->jb, 1);
    }
}

static void j_progress(j_common_ptr c)
{
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->input_scan_number > MAX_SCANS) {
        struct jerr *je = (struct jerr *)c->err;
        snprintf(je->msg, sizeof je->msg, "more than %d progressive scans", MAX_SCANS);
        longjmp(je->jb, 1);
    }
}

/* PIL's MULDIV255 and cmyk2rgb (Convert.c): the values are already un-inverted. */
static uint8_t muldiv255(unsigned a, unsigned b)
{
    unsigned t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

static uint8_t clip8(int v)
{
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

int img_jpeg(struct image *out, int *orientation, const uint8_t *d, size_t n,
             const struct image_limits *lim, struct err *e)
{
    struct jpeg_decompress_struct ci;
    struct jerr je;
    struct jpeg_progress_mgr prog = {.progress_monitor = j_progress};
    /* volatile: changed between setjmp and a longjmp back */
    uint8_t *volatile rgb = NULL;
    uint8_t *volatile row = NULL;
    volatile int own = 0;  /* our own error (limits, memory), set before jumping */
    memset(&ci, 0, sizeof ci);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = j_error_exit;
    je.pub.emit_message = j_emit;
    je.msg[0] = 0;
    if (setjmp(je.jb)) {
        jpeg_destroy_decompress(&ci);
        free(rgb);
        free(row);
        if (own < 0)
            return own;
        return err_setf(e, ERR_FORMAT, "JPEG: %s", je.msg[0] ? je.msg : "corrupt data");
    }
    jpeg_create_decompress(&ci);
    ci.progress = &prog;
    jpeg_mem_src(&ci, d, (unsigned long)n);
    jpeg_save_markers(&ci, JPEG_APP0 + 1, 0xffff);
    jpeg_read_header(&ci, TRUE);
    own = img_check_size("JPEG", ci.image_width, ci.image_height, lim, e);
    if (own < 0)
        longjmp(je.jb, 1);
    int nc = ci.num_components;
    if (nc == 1)
        ci.out_color_space = JCS_GRAYSCALE;
    else if (nc == 3)
        ci.out_color_space = JCS_RGB;
    else if (nc == 4)
        ci.out_color_space = JCS_CMYK;
    else {
        own = err_setf(e, ERR_FORMAT, "JPEG: %d color components (1, 3 or 4 are images)", nc);
        longjmp(je.jb, 1);
    }
    *orientation = 1;
    for (jpeg_saved_marker_ptr m = ci.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && memcmp(m->data, "Exif\0\0", 6) == 0) {
            *orientation = img_exif_orientation(m->data, m->data_length);
            break;  /* PIL keeps the first Exif segment */
        }
    }
    jpeg_start_decompress(&ci);
    uint32_t w = ci.output_width, h = ci.output_height;
    rgb = img_alloc_rgb(w, h, e);
    row = malloc((size_t)w * 4);
    if (!rgb || !row) {
        own = err_setf(e, ERR_NOMEM, "out of memory for a %u x %u JPEG", w, h);
        longjmp(je.jb, 1);
    }
    while (ci.output_scanline < h) {
        uint32_t y = ci.output_scanline;
        JSAMPROW rp = row;
        if (jpeg_read_scanlines(&ci, &rp, 1) != 1) {
            snprintf(je.msg, sizeof je.msg, "no scanline %u", y);
            longjmp(je.jb, 1);
        }
        uint8_t *o = rgb + (size_t)y * w * 3;
        for (uint32_t x = 0; x < w; x++) {
            if (nc == 1) {
                o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = row[x];
            } else if (nc == 3) {
                memcpy(o + 3 * x, row + 3 * x, 3);
            } else {
                /* "CMYK;I": PIL inverts what libjpeg gives */
                const uint8_t *c = row + 4 * x;
                unsigned nk = c[3];  /* 255 - (255 - k) */
                for (int j = 0; j < 3; j++)
                    o[3 * x + j] = clip8((int)nk - muldiv255(255u - c[j], nk));
            }
        }
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(row);
    out->w = w;
    out->h = h;
    out->rgb = rgb;
    return 0;
}
