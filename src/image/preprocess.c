/*
 * preprocess: one decoded image to pixel_values, as transformers 5.17's image processors
 * compute them (ADR 0085), and the prompt expansion of each processor.
 *
 * Every processor here works the same way in both transformers backends: the uint8 RGB image
 * is resized (and cropped: Gemma 3's pan-and-scan before, CLIP's center crop after) while
 * still uint8, then rescaled and normalized into float32, channels first. Only the last step
 * is float, and the two backends round it differently, each reproduced here:
 *   torchvision  mean' = f32(f32(mean) * f32(1 / rescale_factor)), std' likewise (the fused
 *                rescale+normalize of TorchvisionBackend), v = f32(f32(x - mean') / std');
 *   PIL          v = f32(f64(x) * rescale_factor) (numpy rescale), then
 *                f32(f32(v - f32(mean)) / f32(std)) (numpy normalize in float32).
 * Qwen2-VL's patchify then only moves values (see preprocess.h for the layout).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/preprocess_impl.h"

struct u8img {
    uint32_t w, h;
    uint8_t *p;  /* [h][w][3] */
};

static void u8_free(struct u8img *m)
{
    free(m->p);
    m->p = NULL;
}

static int u8_alloc(struct u8img *m, uint32_t w, uint32_t h, struct err *e)
{
    m->w = w;
    m->h = h;
    m->p = malloc((size_t)w * h * 3);
    if (!m->p)
        return err_setf(e, ERR_NOMEM, "image preprocess: no memory for %ux%u", w, h);
    return 0;
}

/* The filter the backend really runs: torchvision has no Lanczos for tensors and uses bicubic
 * (TorchvisionBackend.resize warns and does so), and refuses box and hamming. */
static int backend_filter(const struct image_proc_config *cfg, enum image_resample *f, struct err *e)
{
    *f = cfg->resample;
    if (cfg->backend == IMAGE_BACKEND_TORCHVISION) {
        if (*f == IMAGE_RESAMPLE_LANCZOS)
            *f = IMAGE_RESAMPLE_BICUBIC;
        if (*f != IMAGE_RESAMPLE_BILINEAR && *f != IMAGE_RESAMPLE_BICUBIC)
            return err_setf(e, ERR_UNSUPPORTED, "image preprocess: resample %d has no torchvision kernel",
                            (int)cfg->resample);
    }
    return 0;
}

/* A sub-rectangle of src (rows y0.., columns x0..), clipped to src as a Python slice is. */
static int u8_crop(struct u8img *out, const struct image *src, uint32_t x0, uint32_t y0, uint32_t w, uint32_t h,
                   struct err *e)
{
    if (x0 >= src->w || y0 >= src->h)
        return err_setf(e, ERR_RANGE, "image preprocess: an empty crop at (%u, %u) of a %ux%u image", x0, y0,
                        src->w, src->h);
    if (w > src->w - x0)
        w = src->w - x0;
    if (h > src->h - y0)
        h = src->h - y0;
    int rc = u8_alloc(out, w, h, e);
    if (rc < 0)
        return rc;
    for (uint32_t y = 0; y < h; y++)
        memcpy(out->p + (size_t)y * w * 3, src->rgb + ((size_t)(y0 + y) * src->w + x0) * 3, (size_t)w * 3);
    return 0;
}

static int u8_resize(struct u8img *out, const uint8_t *src, uint32_t sw, uint32_t sh, uint32_t w, uint32_t h,
                     const struct image_proc_config *cfg, struct err *e)
{
    enum image_resample f;
    int rc;
    if ((rc = backend_filter(cfg, &f, e)) < 0 || (rc = u8_alloc(out, w, h, e)) < 0)
        return rc;
    if ((rc = img_resize_u8(out->p, w, h, src, sw, sh, f, cfg->backend, e)) < 0)
        u8_free(out);
    return rc;
}

/* CLIP's center crop of in (to crop_height x crop_width), zero padding where the crop is
 * larger: torchvision pads (d // 2) before and the rest after, numpy's center_crop
 * ceil(d / 2) before. */
static int u8_center_crop(struct u8img *out, const struct u8img *in, const struct image_proc_config *cfg,
                          struct err *e)
{
    uint32_t ch = cfg->crop_height, cw = cfg->crop_width;
    int rc = u8_alloc(out, cw, ch, e);
    if (rc < 0)
        return rc;
    memset(out->p, 0, (size_t)cw * ch * 3);
    /* offset of in's origin inside out (may be negative: in is cropped) */
    int64_t oy, ox;
    bool pil = cfg->backend == IMAGE_BACKEND_PIL;
    if (ch > in->h)
        oy = pil ? (ch - in->h + 1) / 2 : (ch - in->h) / 2;
    else
        oy = -(int64_t)((in->h - ch) / 2);
    if (cw > in->w)
        ox = pil ? (cw - in->w + 1) / 2 : (cw - in->w) / 2;
    else
        ox = -(int64_t)((in->w - cw) / 2);
    for (uint32_t y = 0; y < ch; y++) {
        int64_t sy = (int64_t)y - oy;
        if (sy < 0 || sy >= in->h)
            continue;
        for (uint32_t x = 0; x < cw; x++) {
            int64_t sx = (int64_t)x - ox;
            if (sx < 0 || sx >= in->w)
                continue;
            memcpy(out->p + ((size_t)y * cw + x) * 3, in->p + ((size_t)sy * in->w + sx) * 3, 3);
        }
    }
    return 0;
}

/* [h][w][3] uint8 -> [3][h][w] float32, rescaled and normalized as the backend does. */
static void to_float_chw(float *dst, const struct u8img *m, const struct image_proc_config *cfg)
{
    size_t hw = (size_t)m->w * m->h;
    float mean[3], std[3];
    float rf32 = (float)cfg->rescale_factor;
    bool tv = cfg->backend == IMAGE_BACKEND_TORCHVISION;
    for (int c = 0; c < 3; c++) {
        mean[c] = (float)cfg->image_mean[c];
        std[c] = (float)cfg->image_std[c];
        if (tv && cfg->do_rescale && cfg->do_normalize) {
            float inv = (float)(1.0 / cfg->rescale_factor);
            mean[c] = mean[c] * inv;
            std[c] = std[c] * inv;
        }
    }
    for (int c = 0; c < 3; c++)
        for (size_t i = 0; i < hw; i++) {
            float x = (float)m->p[i * 3 + c];
            float v;
            if (tv) {
                if (cfg->do_normalize)
                    v = (x - mean[c]) / std[c];
                else if (cfg->do_rescale)
                    v = x * rf32;
                else
                    v = x;
            } else {
                v = cfg->do_rescale ? (float)((double)m->p[i * 3 + c] * cfg->rescale_factor) : x;
                if (cfg->do_normalize)
                    v = (v - mean[c]) / std[c];
            }
            dst[(size_t)c * hw + i] = v;
        }
}

/* ---- fixed-size processors: Gemma 3, CLIP, SigLIP ---- */

/* Gemma3ImageProcessor.pan_and_scan: the crop grid of a w x h image (0 crops: none). */
static void pas_grid(const struct image_proc_config *cfg, uint32_t w, uint32_t h, uint32_t *nw, uint32_t *nh,
                     uint32_t *cw, uint32_t *ch)
{
    double W = w, H = h;
    int64_t n;
    *nw = *nh = 0;
    if (w >= h) {
        if (W / H < cfg->pas_min_ratio)
            return;
        n = (int64_t)floor(W / H + 0.5);
        if ((int64_t)floor(W / cfg->pas_min_crop_size) < n)
            n = (int64_t)floor(W / cfg->pas_min_crop_size);
        n = n < 2 ? 2 : n;
        n = n > cfg->pas_max_num_crops ? cfg->pas_max_num_crops : n;
        *nw = (uint32_t)n;
        *nh = 1;
    } else {
        if (H / W < cfg->pas_min_ratio)
            return;
        n = (int64_t)floor(H / W + 0.5);
        if ((int64_t)floor(H / cfg->pas_min_crop_size) < n)
            n = (int64_t)floor(H / cfg->pas_min_crop_size);
        n = n < 2 ? 2 : n;
        n = n > cfg->pas_max_num_crops ? cfg->pas_max_num_crops : n;
        *nw = 1;
        *nh = (uint32_t)n;
    }
    *cw = (uint32_t)ceil(W / *nw);
    *ch = (uint32_t)ceil(H / *nh);
    if ((*cw < *ch ? *cw : *ch) < cfg->pas_min_crop_size)
        *nw = *nh = 0;
}

/* The output side of CLIP's shortest-edge resize (get_resize_output_image_size). */
static void shortest_edge_size(uint32_t w, uint32_t h, uint32_t se, uint32_t *ow, uint32_t *oh)
{
    uint32_t s = w <= h ? w : h, l = w <= h ? h : w;
    uint32_t nl = (uint32_t)((double)((uint64_t)se * l) / s);
    if (w <= h) {
        *ow = se;
        *oh = nl;
    } else {
        *ow = nl;
        *oh = se;
    }
}

/* One image (or crop) through resize / center crop into dst [3][H][W]. */
static int fixed_one(float *dst, const struct u8img *in, const struct image_proc_config *cfg, uint32_t ow,
                     uint32_t oh, struct err *e)
{
    struct u8img r = {0}, c = {0};
    const struct u8img *cur = in;
    int rc = 0;
    if (cfg->do_resize || (cfg->kind == IMAGE_PROC_GEMMA3 && cfg->do_pan_and_scan)) {
        if ((rc = u8_resize(&r, in->p, in->w, in->h, ow, oh, cfg, e)) < 0)
            return rc;
        cur = &r;
    }
    if (cfg->kind == IMAGE_PROC_CLIP && cfg->do_center_crop) {
        if ((rc = u8_center_crop(&c, cur, cfg, e)) < 0)
            goto out;
        cur = &c;
    }
    to_float_chw(dst, cur, cfg);
out:
    u8_free(&r);
    u8_free(&c);
    return rc;
}

static int fixed_size(struct image_pixels *px, const struct image_proc_config *cfg, const struct image *im,
                      struct err *e)
{
    uint32_t ow = im->w, oh = im->h, nw = 0, nh = 0, cw = 0, ch = 0;
    int rc;
    if (cfg->do_resize || cfg->kind == IMAGE_PROC_GEMMA3) {
        if (cfg->kind == IMAGE_PROC_CLIP && cfg->shortest_edge)
            shortest_edge_size(im->w, im->h, cfg->shortest_edge, &ow, &oh);
        else if (cfg->do_resize || cfg->do_pan_and_scan) {
            ow = cfg->width;
            oh = cfg->height;
        }
    }
    if (!ow || !oh || ow > 4 * IMAGE_PROC_MAX_SIDE || oh > 4 * IMAGE_PROC_MAX_SIDE)
        return err_setf(e, ERR_RANGE, "image preprocess: a %ux%u image resizes to %ux%u", im->w, im->h, ow, oh);
    if (cfg->kind == IMAGE_PROC_GEMMA3 && cfg->do_pan_and_scan)
        pas_grid(cfg, im->w, im->h, &nw, &nh, &cw, &ch);
    uint32_t fw = ow, fh = oh;
    if (cfg->kind == IMAGE_PROC_CLIP && cfg->do_center_crop) {
        fw = cfg->crop_width;
        fh = cfg->crop_height;
    }
    /* with pan-and-scan every image is resized to (height, width); without resize, the
     * crops would keep their own sizes, which one tensor cannot hold: transformers' torchvision
     * path resizes them anyway, as here */
    px->num_crops = nw * nh;
    px->n_images = 1 + px->num_crops;
    px->channels = 3;
    px->height = fh;
    px->width = fw;
    size_t per = (size_t)3 * fw * fh;
    px->n_values = per * px->n_images;
    if (px->n_values > IMAGE_PROC_MAX_VALUES)
        return err_setf(e, ERR_RANGE, "image preprocess: %zu values (%u images of 3x%ux%u) is over the limit %zu",
                        px->n_values, px->n_images, fh, fw, IMAGE_PROC_MAX_VALUES);
    px->pixel_values = malloc(px->n_values * sizeof(float));
    if (!px->pixel_values)
        return err_setf(e, ERR_NOMEM, "image preprocess: no memory for %zu values", px->n_values);
    struct u8img whole = {im->w, im->h, im->rgb};
    if ((rc = fixed_one(px->pixel_values, &whole, cfg, ow, oh, e)) < 0)
        return rc;
    for (uint32_t i = 0; i < px->num_crops; i++) {
        struct u8img crop = {0};
        uint32_t x0 = (i % nw) * cw, y0 = (i / nw) * ch;
        if ((rc = u8_crop(&crop, im, x0, y0, cw, ch, e)) < 0)
            return rc;
        rc = fixed_one(px->pixel_values + per * (1 + i), &crop, cfg, ow, oh, e);
        u8_free(&crop);
        if (rc < 0)
            return rc;
    }
    if (cfg->kind == IMAGE_PROC_GEMMA3)
        px->n_image_tokens = cfg->image_seq_length * px->n_images;
    else if (cfg->image_seq_length)
        px->n_image_tokens = cfg->image_seq_length;
    else if (cfg->patch_size) {
        /* LlavaProcessor: (h // patch) * (w // patch) + num_additional_image_tokens, one
         * fewer for the "default" feature strategy (the CLS token dropped) */
        uint64_t t = (uint64_t)(fh / cfg->patch_size) * (fw / cfg->patch_size) + cfg->num_additional_image_tokens;
        px->n_image_tokens = (uint32_t)(t > 0 && cfg->drop_cls ? t - 1 : t);
    }
    return 0;
}

/* ---- Pixtral ---- */

static int pixtral(struct image_pixels *px, const struct image_proc_config *cfg, const struct image *im,
                   struct err *e)
{
    uint32_t oh = im->h, ow = im->w, ps = cfg->patch_size;
    if (cfg->do_resize) {
        /* pixtral get_resize_output_image_size: shrink (floor) to fit longest_edge, then round
         * each side up to whole patches */
        double H = im->h, W = im->w, le = cfg->longest_edge;
        double ratio = fmax(H / le, W / le);
        int64_t h = im->h, w = im->w;
        if (ratio > 1) {
            h = (int64_t)floor(H / ratio);
            w = (int64_t)floor(W / ratio);
        }
        int64_t nh = h > 0 ? (h - 1) / ps + 1 : 0, nw = w > 0 ? (w - 1) / ps + 1 : 0;
        if (!nh || !nw)
            return err_setf(e, ERR_RANGE, "image preprocess: a %ux%u image shrinks to nothing within %u", im->w,
                            im->h, cfg->longest_edge);
        oh = (uint32_t)(nh * ps);
        ow = (uint32_t)(nw * ps);
    }
    px->n_images = 1;
    px->channels = 3;
    px->height = oh;
    px->width = ow;
    px->n_values = (size_t)3 * oh * ow;
    if (px->n_values > IMAGE_PROC_MAX_VALUES)
        return err_setf(e, ERR_RANGE, "image preprocess: %ux%u is over the limit of %zu values", ow, oh,
                        IMAGE_PROC_MAX_VALUES);
    px->pixel_values = malloc(px->n_values * sizeof(float));
    if (!px->pixel_values)
        return err_setf(e, ERR_NOMEM, "image preprocess: no memory for %zu values", px->n_values);
    struct u8img whole = {im->w, im->h, im->rgb};
    int rc = fixed_one(px->pixel_values, &whole, cfg, ow, oh, e);
    if (rc < 0)
        return rc;
    /* PixtralProcessor: rows of [IMG] x cols then [IMG_BREAK], the last break [IMG_END] */
    uint32_t unit = ps * (cfg->spatial_merge_size ? cfg->spatial_merge_size : 1);
    px->rows = oh / unit;
    px->cols = ow / unit;
    px->n_image_tokens = px->rows * (px->cols + 1);
    /* the tower's patch grid (one still image; pixel_values stay [3, H, W]) */
    px->grid_t = 1;
    px->grid_h = oh / ps;
    px->grid_w = ow / ps;
    return 0;
}

/* ---- Idefics3 / SmolVLM ---- */

/* _resize_output_size_rescale_to_max_len then _resize_output_size_scale_below_upper_bound */
static void idefics3_size(uint32_t h0, uint32_t w0, uint32_t max_len, uint32_t *oh, uint32_t *ow)
{
    double aspect = (double)w0 / h0;
    int64_t h = h0, w = w0;
    if (w >= h) {
        w = max_len;
        h = (int64_t)((double)w / aspect);
        h += h % 2;
    } else {
        h = max_len;
        w = (int64_t)((double)h * aspect);
        w += w % 2;
    }
    h = h < 1 ? 1 : h;
    w = w < 1 ? 1 : w;
    const int64_t upper = 4096;  /* MAX_IMAGE_SIZE */
    aspect = (double)w / h;
    if (w >= h && w > upper) {
        w = upper;
        h = (int64_t)((double)w / aspect);
    } else if (h > w && h > upper) {
        h = upper;
        w = (int64_t)((double)h * aspect);
    }
    *oh = (uint32_t)(h < 1 ? 1 : h);
    *ow = (uint32_t)(w < 1 ? 1 : w);
}

/* resize_for_vision_encoder: each side up to a multiple of the tile side, the aspect kept */
static void idefics3_tile_size(uint32_t h0, uint32_t w0, uint32_t m, uint32_t *oh, uint32_t *ow)
{
    double aspect = (double)w0 / h0;
    int64_t h, w;
    if (w0 >= h0) {
        w = (int64_t)ceil((double)w0 / m) * m;
        h = (int64_t)((double)w / aspect);
        h = (int64_t)ceil((double)h / m) * m;
    } else {
        h = (int64_t)ceil((double)h0 / m) * m;
        w = (int64_t)((double)h * aspect);
        w = (int64_t)ceil((double)w / m) * m;
    }
    *oh = (uint32_t)h;
    *ow = (uint32_t)w;
}

static int idefics3(struct image_pixels *px, const struct image_proc_config *cfg, const struct image *im,
                    struct err *e)
{
    struct u8img a = {0}, b = {0}, g = {0};
    struct u8img cur = {im->w, im->h, im->rgb};
    uint32_t m = cfg->max_image_size, h, w;
    int rc = 0;
    if (cfg->do_resize) {
        idefics3_size(cur.h, cur.w, cfg->longest_edge, &h, &w);
        if ((rc = u8_resize(&a, cur.p, cur.w, cur.h, w, h, cfg, e)) < 0)
            goto out;
        cur = a;
    }
    if (cfg->do_image_splitting) {
        idefics3_tile_size(cur.h, cur.w, m, &h, &w);
        if ((uint64_t)h * w > IMAGE_PROC_MAX_VALUES / 3) {
            rc = err_setf(e, ERR_RANGE, "image preprocess: %ux%u tiles of %u are over the limit", w, h, m);
            goto out;
        }
        if ((rc = u8_resize(&b, cur.p, cur.w, cur.h, w, h, cfg, e)) < 0)
            goto out;
        cur = b;
        if (cur.h > m || cur.w > m) {
            px->rows = (cur.h - m) / m + 1;
            px->cols = (cur.w - m) / m + 1;
        }
    }
    if (px->rows || !cfg->do_image_splitting) {
        /* the whole image at the tile size (the global image, or the only one) */
        if ((rc = u8_resize(&g, cur.p, cur.w, cur.h, m, m, cfg, e)) < 0)
            goto out;
    } else if (cur.w != m || cur.h != m) {
        rc = err_setf(e, ERR_RANGE, "image preprocess: a %ux%u frame is not %u square", cur.w, cur.h, m);
        goto out;
    }
    px->n_images = px->rows * px->cols + 1;
    px->channels = 3;
    px->height = px->width = m;
    size_t per = (size_t)3 * m * m;
    px->n_values = per * px->n_images;
    if (px->n_values > IMAGE_PROC_MAX_VALUES) {
        rc = err_setf(e, ERR_RANGE, "image preprocess: %u tiles of %u are over the limit", px->n_images, m);
        goto out;
    }
    px->pixel_values = malloc(px->n_values * sizeof(float));
    if (!px->pixel_values) {
        rc = err_setf(e, ERR_NOMEM, "image preprocess: no memory for %zu values", px->n_values);
        goto out;
    }
    for (uint32_t r = 0; r < px->rows; r++)
        for (uint32_t c = 0; c < px->cols; c++) {
            struct u8img t = {0};
            struct image src = {cur.w, cur.h, cur.p, IMAGE_UNKNOWN};
            if ((rc = u8_crop(&t, &src, c * m, r * m, m, m, e)) < 0)
                goto out;
            to_float_chw(px->pixel_values + per * (r * px->cols + c), &t, cfg);
            u8_free(&t);
        }
    to_float_chw(px->pixel_values + per * (px->n_images - 1), g.p ? &g : &cur, cfg);
    px->n_image_tokens = cfg->image_seq_length * px->n_images;
out:
    u8_free(&a);
    u8_free(&b);
    u8_free(&g);
    return rc;
}

/* ---- Qwen2-VL ---- */

/* Qwen2VLImageProcessor's smart_resize (Python's round: half to even, as nearbyint). */
static int smart_resize(uint32_t h, uint32_t w, uint32_t factor, uint64_t min_pixels, uint64_t max_pixels,
                        uint32_t *oh, uint32_t *ow, struct err *e)
{
    double H = h, W = w;
    if ((H > W ? H / W : W / H) > 200)
        return err_setf(e, ERR_RANGE, "image preprocess: absolute aspect ratio must be smaller than 200, got %g",
                        H > W ? H / W : W / H);
    double hb = nearbyint(H / factor) * factor, wb = nearbyint(W / factor) * factor;
    if (hb * wb > (double)max_pixels) {
        double beta = sqrt(H * W / (double)max_pixels);
        hb = fmax(factor, floor(H / beta / factor) * factor);
        wb = fmax(factor, floor(W / beta / factor) * factor);
    } else if (hb * wb < (double)min_pixels) {
        double beta = sqrt((double)min_pixels / (H * W));
        hb = ceil(H * beta / factor) * factor;
        wb = ceil(W * beta / factor) * factor;
    }
    if (hb < factor || wb < factor || hb > 65536 || wb > 65536)
        return err_setf(e, ERR_RANGE, "image preprocess: a %ux%u image resizes to %gx%g", w, h, wb, hb);
    *oh = (uint32_t)hb;
    *ow = (uint32_t)wb;
    return 0;
}

static int qwen2vl(struct image_pixels *px, const struct image_proc_config *cfg, const struct image *im,
                   struct err *e)
{
    uint32_t ps = cfg->patch_size, m = cfg->merge_size, tp = cfg->temporal_patch_size;
    uint32_t rh = im->h, rw = im->w;
    int rc;
    if (cfg->do_resize && (rc = smart_resize(im->h, im->w, ps * m, cfg->min_pixels, cfg->max_pixels, &rh, &rw, e)) < 0)
        return rc;
    if (rh % (ps * m) || rw % (ps * m))
        return err_setf(e, ERR_RANGE, "image preprocess: %ux%u is not a multiple of patch_size * merge_size = %u",
                        rw, rh, ps * m);
    px->grid_t = 1;
    px->grid_h = rh / ps;
    px->grid_w = rw / ps;
    px->n_patches = px->grid_h * px->grid_w;
    px->patch_dim = 3 * tp * ps * ps;
    px->n_values = (size_t)px->n_patches * px->patch_dim;
    if ((uint64_t)rh * rw > IMAGE_PROC_MAX_VALUES || px->n_values > IMAGE_PROC_MAX_VALUES)
        return err_setf(e, ERR_RANGE, "image preprocess: %ux%u in patches of %u is over the limit of %zu values",
                        rw, rh, ps, IMAGE_PROC_MAX_VALUES);
    struct u8img r = {0};
    float *chw = NULL;
    if ((rc = u8_resize(&r, im->rgb, im->w, im->h, rw, rh, cfg, e)) < 0)
        return rc;
    chw = malloc((size_t)3 * rw * rh * sizeof *chw);
    px->pixel_values = malloc(px->n_values * sizeof(float));
    if (!chw || !px->pixel_values) {
        rc = err_setf(e, ERR_NOMEM, "image preprocess: no memory for %zu values", px->n_values);
        goto out;
    }
    to_float_chw(chw, &r, cfg);
    /* rows (bh, bw, mh, mw), columns (c, t, py, px) */
    float *o = px->pixel_values;
    size_t hw = (size_t)rw * rh;
    for (uint32_t bh = 0; bh < px->grid_h / m; bh++)
        for (uint32_t bw = 0; bw < px->grid_w / m; bw++)
            for (uint32_t mh = 0; mh < m; mh++)
                for (uint32_t mw = 0; mw < m; mw++) {
                    size_t y0 = (size_t)(bh * m + mh) * ps, x0 = (size_t)(bw * m + mw) * ps;
                    for (uint32_t c = 0; c < 3; c++)
                        for (uint32_t t = 0; t < tp; t++)
                            for (uint32_t py = 0; py < ps; py++) {
                                memcpy(o, chw + c * hw + (y0 + py) * rw + x0, ps * sizeof *o);
                                o += ps;
                            }
                }
    px->n_image_tokens = px->n_patches / (m * m);
out:
    free(chw);
    u8_free(&r);
    return rc;
}

int image_preprocess(struct image_pixels *out, const struct image_proc_config *cfg, const struct image *im,
                     struct err *e)
{
    int rc;
    memset(out, 0, sizeof *out);
    if (!im || !im->rgb || !im->w || !im->h)
        return err_setf(e, ERR_ARG, "image preprocess: no image");
    switch (cfg->kind) {
    case IMAGE_PROC_GEMMA3:
    case IMAGE_PROC_CLIP:
    case IMAGE_PROC_SIGLIP:
        rc = fixed_size(out, cfg, im, e);
        break;
    case IMAGE_PROC_QWEN2VL:
        rc = qwen2vl(out, cfg, im, e);
        break;
    case IMAGE_PROC_PIXTRAL:
        rc = pixtral(out, cfg, im, e);
        break;
    case IMAGE_PROC_IDEFICS3:
        rc = idefics3(out, cfg, im, e);
        break;
    default:
        rc = err_setf(e, ERR_UNSUPPORTED, "image preprocess: no processor");
    }
    if (rc < 0)
        image_pixels_free(out);
    return rc;
}

void image_pixels_free(struct image_pixels *px)
{
    if (!px)
        return;
    free(px->pixel_values);
    memset(px, 0, sizeof *px);
}

/* ---- prompt expansion ---- */

struct idbuf {
    int32_t *out;
    size_t cap, n;
};

static void put(struct idbuf *b, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++, b->n++)
        if (b->n < b->cap)
            b->out[b->n] = ids[i];
}

static void put_run(struct idbuf *b, int32_t id, size_t n)
{
    for (size_t i = 0; i < n; i++, b->n++)
        if (b->n < b->cap)
            b->out[b->n] = id;
}

/* Gemma3Processor.full_image_sequence: "\n\n" boi image*seq eoi "\n\n" */
static void gemma_full(struct idbuf *b, const struct image_proc_config *cfg, const struct image_prompt_ids *ids)
{
    put(b, ids->nl2, ids->n_nl2);
    put_run(b, ids->boi, 1);
    put_run(b, ids->image, cfg->image_seq_length);
    put_run(b, ids->eoi, 1);
    put(b, ids->nl2, ids->n_nl2);
}

int image_prompt_expand(int32_t *out, size_t cap, size_t *n_out, const struct image_proc_config *cfg,
                        const struct image_pixels *px, const struct image_prompt_ids *ids, struct err *e)
{
    struct idbuf b = {out, cap, 0};
    if (cfg->kind == IMAGE_PROC_GEMMA3) {
        if (px->num_crops) {
            /* replace_image_token: "Here is the original image {full} and here are some crops to
             * help you see better " + " ".join([full] * num_crops) */
            put(&b, ids->pas_intro, ids->n_pas_intro);
            gemma_full(&b, cfg, ids);
            put(&b, ids->pas_crops, ids->n_pas_crops);
            for (uint32_t i = 0; i < px->num_crops; i++) {
                if (i)
                    put(&b, ids->space, ids->n_space);
                gemma_full(&b, cfg, ids);
            }
        } else {
            gemma_full(&b, cfg, ids);
        }
    } else if (cfg->kind == IMAGE_PROC_PIXTRAL) {
        for (uint32_t r = 0; r < px->rows; r++) {
            put_run(&b, ids->image, px->cols);
            put_run(&b, r + 1 < px->rows ? ids->img_break : ids->img_end, 1);
        }
    } else if (cfg->kind == IMAGE_PROC_IDEFICS3) {
        /* Idefics3Processor's _prompt_split_image / _prompt_single_image */
        if (px->rows && (px->rows > ids->row_col_dim || px->cols > ids->row_col_dim || !ids->row_col))
            return err_setf(e, ERR_RANGE, "image prompt: no <row_%u_col_%u> token id given", px->rows, px->cols);
        for (uint32_t r = 0; r < px->rows; r++) {
            for (uint32_t c = 0; c < px->cols; c++) {
                put_run(&b, ids->fake_around, 1);
                put_run(&b, ids->row_col[r * ids->row_col_dim + c], 1);
                put_run(&b, ids->image, cfg->image_seq_length);
            }
            put(&b, r + 1 < px->rows ? ids->nl : ids->nl2, r + 1 < px->rows ? ids->n_nl : ids->n_nl2);
        }
        put_run(&b, ids->fake_around, 1);
        put_run(&b, ids->global_img, 1);
        put_run(&b, ids->image, cfg->image_seq_length);
        put_run(&b, ids->fake_around, 1);
    } else {
        /* Qwen: <|image_pad|> * n, LLaVA: <image> * n (the template already wrote the
         * <|vision_start|> / <|vision_end|> around Qwen's) */
        put_run(&b, ids->image, px->n_image_tokens);
    }
    *n_out = b.n;
    if (b.n > cap)
        return err_setf(e, ERR_RANGE, "image prompt: %zu ids do not fit in %zu", b.n, cap);
    return 0;
}

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static void sput(struct sbuf *s, const char *t, size_t reps)
{
    size_t n = strlen(t);
    for (size_t r = 0; r < reps && !s->oom; r++) {
        if (s->n + n + 1 > s->cap) {
            size_t cap = (s->n + n + 1) * 2;
            char *q = realloc(s->p, cap);
            if (!q) {
                s->oom = true;
                return;
            }
            s->p = q;
            s->cap = cap;
        }
        memcpy(s->p + s->n, t, n);
        s->n += n;
        s->p[s->n] = 0;
    }
}

static void gemma_full_text(struct sbuf *s, const struct image_proc_config *cfg, const struct image_prompt_strings *t)
{
    sput(s, "\n\n", 1);
    sput(s, t->boi, 1);
    sput(s, t->image, cfg->image_seq_length);
    sput(s, t->eoi, 1);
    sput(s, "\n\n", 1);
}

int image_prompt_text(char **out, const struct image_proc_config *cfg, const struct image_pixels *px,
                      const struct image_prompt_strings *t, struct err *e)
{
    struct sbuf s = {0};
    *out = NULL;
    sput(&s, "", 1);
    if (cfg->kind == IMAGE_PROC_GEMMA3) {
        if (px->num_crops) {
            sput(&s, "Here is the original image ", 1);
            gemma_full_text(&s, cfg, t);
            sput(&s, " and here are some crops to help you see better ", 1);
            for (uint32_t i = 0; i < px->num_crops; i++) {
                if (i)
                    sput(&s, " ", 1);
                gemma_full_text(&s, cfg, t);
            }
        } else {
            gemma_full_text(&s, cfg, t);
        }
    } else if (cfg->kind == IMAGE_PROC_PIXTRAL) {
        for (uint32_t r = 0; r < px->rows; r++) {
            sput(&s, t->image, px->cols);
            sput(&s, r + 1 < px->rows ? t->img_break : t->img_end, 1);
        }
    } else if (cfg->kind == IMAGE_PROC_IDEFICS3) {
        char rc[48];
        for (uint32_t r = 0; r < px->rows; r++) {
            for (uint32_t c = 0; c < px->cols; c++) {
                snprintf(rc, sizeof rc, "<row_%u_col_%u>", r + 1, c + 1);
                sput(&s, t->fake_around, 1);
                sput(&s, rc, 1);
                sput(&s, t->image, cfg->image_seq_length);
            }
            sput(&s, "\n", 1);
        }
        if (px->rows)
            sput(&s, "\n", 1);
        sput(&s, t->fake_around, 1);
        sput(&s, t->global_img, 1);
        sput(&s, t->image, cfg->image_seq_length);
        sput(&s, t->fake_around, 1);
    } else {
        sput(&s, t->image, px->n_image_tokens);
    }
    if (s.oom || !s.p) {
        free(s.p);
        return err_setf(e, ERR_NOMEM, "image prompt: no memory for the expansion");
    }
    *out = s.p;
    return 0;
}
