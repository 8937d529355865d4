/*
 * GIF through giflib, the first frame only, as PIL's GifImagePlugin makes it
 * (Pillow 9-11): the canvas is the logical screen, grown to hold the frame if
 * the frame reaches past it; it starts as palette index 0, or as the frame's
 * transparent index when its graphic control extension names one; the frame's
 * indices are drawn at its offset (interlaced rows put back in order); the
 * local palette, else the global one, else gray (index = value), maps indices
 * to RGB, entries past the palette's end reading as PIL's gray ramp.
 * Records after the first image are never read.
 */
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>

#include "image_impl.h"

struct gsrc {
    const uint8_t *d;
    size_t n, at;
};

static int g_read(GifFileType *g, GifByteType *buf, int len)
{
    struct gsrc *s = g->UserData;
    size_t k = len < 0 ? 0 : (size_t)len;
    if (k > s->n - s->at)
        k = s->n - s->at;
    memcpy(buf, s->d + s->at, k);
    s->at += k;
    return (int)k;
}

static int g_fail(GifFileType *g, const char *what, struct err *e)
{
    const char *why = GifErrorString(g->Error);
    int err;
    DGifCloseFile(g, &err);
    return err_setf(e, ERR_FORMAT, "GIF: %s: %s", what, why ? why : "corrupt data");
}

int img_gif(struct image *out, int *orientation, const uint8_t *d, size_t n,
            const struct image_limits *lim, struct err *e)
{
    struct gsrc s = {d, n, 0};
    int gerr = 0;
    GifFileType *g = DGifOpen(&s, g_read, &gerr);
    if (!g) {
        const char *why = GifErrorString(gerr);
        return err_setf(e, ERR_FORMAT, "GIF: %s", why ? why : "not a GIF");
    }
    *orientation = 1;
    int transparent = -1;
    for (;;) {
        GifRecordType t;
        if (DGifGetRecordType(g, &t) == GIF_ERROR)
            return g_fail(g, "reading a record", e);
        if (t == TERMINATE_RECORD_TYPE)
            return g_fail(g, "no image before the end", e);
        if (t == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext = NULL;
            if (DGifGetExtension(g, &code, &ext) == GIF_ERROR)
                return g_fail(g, "reading an extension", e);
            if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4)
                transparent = ext[1] & 1 ? ext[4] : -1;
            while (ext)
                if (DGifGetExtensionNext(g, &ext) == GIF_ERROR)
                    return g_fail(g, "reading an extension", e);
            continue;
        }
        if (t == IMAGE_DESC_RECORD_TYPE)
            break;
    }
    if (DGifGetImageDesc(g) == GIF_ERROR)
        return g_fail(g, "reading the image descriptor", e);
    const GifImageDesc *id = &g->Image;
    uint64_t x0 = (uint64_t)id->Left, y0 = (uint64_t)id->Top, fw = (uint64_t)id->Width, fh = (uint64_t)id->Height;
    uint64_t cw = g->SWidth, chh = g->SHeight;
    if (x0 + fw > cw)
        cw = x0 + fw;
    if (y0 + fh > chh)
        chh = y0 + fh;
    int rc = img_check_size("GIF", cw, chh, lim, e);
    if (rc < 0) {
        int err;
        DGifCloseFile(g, &err);
        return rc;
    }
    const ColorMapObject *cm = id->ColorMap ? id->ColorMap : g->SColorMap;
    uint8_t *idx = malloc((size_t)cw * chh), *rgb = img_alloc_rgb((uint32_t)cw, (uint32_t)chh, e);
    GifByteType *line = malloc(fw ? fw : 1);
    if (!idx || !rgb || !line) {
        free(idx);
        free(rgb);
        free(line);
        int err;
        DGifCloseFile(g, &err);
        return err_setf(e, ERR_NOMEM, "GIF: out of memory for a %llu x %llu image", (unsigned long long)cw,
                        (unsigned long long)chh);
    }
    memset(idx, transparent >= 0 ? transparent : 0, (size_t)cw * chh);
    /* the rows in file order: interlaced, the passes 0, 8, .. / 4, 12, .. / 2, 6, .. / 1, 3, .. */
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    int passes = id->Interlace ? 4 : 1;
    for (int p = 0; p < passes; p++) {
        for (uint64_t r = id->Interlace ? (uint64_t)start[p] : 0; r < fh; r += id->Interlace ? (uint64_t)step[p] : 1) {
            if (DGifGetLine(g, line, (int)fw) == GIF_ERROR) {
                free(idx);
                free(rgb);
                free(line);
                return g_fail(g, "reading the pixels (truncated or corrupt)", e);
            }
            memcpy(idx + (y0 + r) * cw + x0, line, fw);
        }
    }
    free(line);
    uint8_t pal[256][3];
    for (int i = 0; i < 256; i++) {
        bool have = cm && i < cm->ColorCount;
        pal[i][0] = have ? cm->Colors[i].Red : (uint8_t)i;
        pal[i][1] = have ? cm->Colors[i].Green : (uint8_t)i;
        pal[i][2] = have ? cm->Colors[i].Blue : (uint8_t)i;
    }
    for (size_t i = 0; i < (size_t)cw * chh; i++)
        memcpy(rgb + 3 * i, pal[idx[i]], 3);
    free(idx);
    int err;
    DGifCloseFile(g, &err);
    out->w = (uint32_t)cw;
    out->h = (uint32_t)chh;
    out->rgb = rgb;
    return 0;
}
