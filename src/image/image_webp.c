/*
 * WebP through libwebp's animation decoder (libwebpdemux), as PIL reads every
 * WebP file, still or animated: the first frame on its canvas (outside the
 * frame: transparent black), alpha dropped. The canvas size is checked
 * against the limits before the decoder allocates it. The EXIF orientation
 * comes from the container's EXIF chunk.
 */
#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>
#include <webp/demux.h>

#include "image_impl.h"

int img_webp(struct image *out, int *orientation, const uint8_t *d, size_t n,
             const struct image_limits *lim, struct err *e)
{
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(d, n, &f) != VP8_STATUS_OK)
        return err_setf(e, ERR_FORMAT, "WebP: not a valid header (corrupt or truncated)");
    int rc = img_check_size("WebP", (uint64_t)(f.width > 0 ? f.width : 0),
                            (uint64_t)(f.height > 0 ? f.height : 0), lim, e);
    if (rc < 0)
        return rc;
    WebPData data = {d, n};
    WebPDemuxer *dm = WebPDemux(&data);
    if (!dm)
        return err_setf(e, ERR_FORMAT, "WebP: the container does not parse (corrupt or truncated)");
    uint32_t cw = WebPDemuxGetI(dm, WEBP_FF_CANVAS_WIDTH), ch = WebPDemuxGetI(dm, WEBP_FF_CANVAS_HEIGHT);
    rc = img_check_size("WebP", cw, ch, lim, e);
    *orientation = 1;
    WebPChunkIterator it;
    if (rc == 0 && WebPDemuxGetChunk(dm, "EXIF", 1, &it)) {
        *orientation = img_exif_orientation(it.chunk.bytes, it.chunk.size);
        WebPDemuxReleaseChunkIterator(&it);
    }
    WebPDemuxDelete(dm);
    if (rc < 0)
        return rc;
    WebPAnimDecoderOptions opt;
    if (!WebPAnimDecoderOptionsInit(&opt))
        return err_setf(e, ERR_INTERNAL, "WebP: the library's ABI does not match its headers");
    opt.color_mode = MODE_RGBA;
    opt.use_threads = 0;
    WebPAnimDecoder *ad = WebPAnimDecoderNew(&data, &opt);
    if (!ad)
        return err_setf(e, ERR_FORMAT, "WebP: cannot decode (corrupt or truncated data)");
    WebPAnimInfo ai;
    uint8_t *frame = NULL;
    int ts = 0;
    if (!WebPAnimDecoderGetInfo(ad, &ai) || ai.canvas_width != cw || ai.canvas_height != ch ||
        !WebPAnimDecoderGetNext(ad, &frame, &ts) || !frame) {
        WebPAnimDecoderDelete(ad);
        return err_setf(e, ERR_FORMAT, "WebP: the first frame does not decode (corrupt or truncated data)");
    }
    uint8_t *rgb = img_alloc_rgb(cw, ch, e);
    if (!rgb) {
        WebPAnimDecoderDelete(ad);
        return -ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)cw * ch; i++)
        memcpy(rgb + 3 * i, frame + 4 * i, 3);
    WebPAnimDecoderDelete(ad);
    out->w = cw;
    out->h = ch;
    out->rgb = rgb;
    return 0;
}
