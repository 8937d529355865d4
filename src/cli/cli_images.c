/*
 * cli_images: pixel_values in, a prompt's image rows out (cli_images.h).
 */
#include "cli_images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/safetensors.h"
#include "../models/vision.h"

int cli_pixel_values_read(const char *path, const struct model *m, float **out, int *n_img, struct err *e)
{
    if (m->vision && m->vision->info.merge > 0)
        return err_setf(e, ERR_ARG, "--pixel-values takes images of the tower's one size; %s takes each image "
                        "at its own size: give --image FILE", m->vision->ops->model_type);
    struct st_set *st = NULL;
    struct tensor t;
    const struct vision *v = m->vision;
    int rc;
    *out = NULL;
    *n_img = 0;
    if (!v)
        return err_setf(e, ERR_ARG, "model %s does not take images", m->hp.model_type);
    if ((rc = st_set_open_file(&st, path, e)) < 0)
        return err_prefix(e, "--pixel-values");
    if ((rc = st_set_take(st, "pixel_values", &t, e)) < 0) {
        st_set_free(st);
        return err_prefix(e, "--pixel-values %s", path);
    }
    int C = v->info.n_channels, S = v->info.image_size;
    bool ok = t.ndim == 4 && t.shape[0] >= 1 && t.shape[0] <= CLI_MAX_IMAGES && t.shape[1] == C &&
              t.shape[2] == S && t.shape[3] == S && tensor_is_contiguous(&t) && !t.qbits &&
              (t.dtype == DTYPE_F32 || t.dtype == DTYPE_F16 || t.dtype == DTYPE_BF16);
    if (!ok) {
        rc = err_setf(e, ERR_FORMAT, "--pixel-values %s: pixel_values must be F32, F16 or BF16 [n, %d, %d, %d] "
                      "with 1 <= n <= %d (the model's image size), got %s of %d dims [%lld, %lld, ...]",
                      path, C, S, S, CLI_MAX_IMAGES, dtype_name(t.dtype), t.ndim, (long long)t.shape[0],
                      (long long)(t.ndim > 1 ? t.shape[1] : 0));
        st_set_free(st);
        return rc;
    }
    size_t n = (size_t)tensor_nelem(&t);
    float *px = malloc(n * sizeof *px);
    if (!px) {
        st_set_free(st);
        return err_setf(e, ERR_NOMEM, "out of memory for %zu pixel values", n);
    }
    dtype_to_f32_ref(px, t.data, t.dtype, n);
    st_set_free(st);
    *out = px;
    *n_img = (int)t.shape[0];
    return 0;
}

int cli_images_expand(const struct model *m, int32_t **ids, size_t *n, int n_img, struct err *e)
{
    const struct vision *v = m->vision;
    if (!v)
        return err_setf(e, ERR_ARG, "model %s does not take images", m->hp.model_type);
    const struct vision_info *vi = &v->info;
    size_t T = (size_t)vi->tokens_per_image, extra = 0, runs = 0;
    for (size_t i = 0; i < *n; i++)
        if ((*ids)[i] == vi->boi_token_id && !(i + 1 < *n && (*ids)[i + 1] == vi->image_token_id))
            extra += T + 1;
    int32_t *out = malloc((*n + extra) * sizeof *out);
    if (!out)
        return err_setf(e, ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        out[k++] = (*ids)[i];
        if ((*ids)[i] != vi->boi_token_id || (i + 1 < *n && (*ids)[i + 1] == vi->image_token_id))
            continue;
        for (size_t j = 0; j < T; j++)
            out[k++] = vi->image_token_id;
        out[k++] = vi->eoi_token_id;
    }
    for (size_t i = 0; i < k;) {
        if (out[i] != vi->image_token_id) {
            i++;
            continue;
        }
        size_t len = 0;
        while (i + len < k && out[i + len] == vi->image_token_id)
            len++;
        if (len != T) {
            free(out);
            return err_setf(e, ERR_ARG, "the prompt holds a run of %zu image tokens where an image takes %zu",
                            len, T);
        }
        runs++;
        i += len;
    }
    if (runs != (size_t)n_img) {
        free(out);
        return err_setf(e, ERR_ARG, "%d image%s but the prompt has %zu place%s for one: write the model's "
                        "start-of-image token (<start_of_image> for Gemma 3) where each image goes",
                        n_img, n_img == 1 ? "" : "s", runs, runs == 1 ? "" : "s");
    }
    free(*ids);
    *ids = out;
    *n = k;
    return 0;
}

int cli_images_encode(struct cli_images *ci, const struct model *m, struct backend *be, const int32_t *ids,
                      size_t n_ids, const float *pixels, int n_img, struct err *e)
{
    struct vision_ctx *vc = NULL;
    int rc;
    memset(ci, 0, sizeof *ci);
    ci->be = be;
    if (n_img < 1 || n_img > CLI_MAX_IMAGES)
        return err_setf(e, ERR_ARG, "%d images (1 to %d)", n_img, CLI_MAX_IMAGES);
    if ((rc = vision_ctx_new(&vc, m, be, e)) < 0)
        return rc;
    size_t rows = vision_embd_bytes(m);
    if ((rc = be->ops->buf_alloc(be, rows * (size_t)n_img, (void **)&ci->embd, e)) < 0 ||
        (rc = vision_encode(vc, ci->embd, pixels, n_img, e)) < 0) {
        vision_ctx_free(vc);
        cli_images_free(ci);
        return rc;
    }
    vision_ctx_free(vc);
    /* the runs cli_images_expand checked, in order */
    int T = m->vision->info.tokens_per_image;
    for (size_t i = 0; i < n_ids && ci->n < n_img;) {
        if (ids[i] != m->vision->info.image_token_id) {
            i++;
            continue;
        }
        ci->img[ci->n] = (struct batch_image){0, (int32_t)i, T,
                                              ci->embd + (size_t)ci->n * rows / sizeof(float), 0, 0, 0};
        ci->n++;
        i += (size_t)T;
    }
    if (ci->n != n_img) {
        cli_images_free(ci);
        return err_setf(e, ERR_ARG, "the prompt has places for %d of the %d images", ci->n, n_img);
    }
    return 0;
}

int cli_images_encode_input(struct cli_images *ci, const struct model *m, struct backend *be, const int32_t *ids,
                            size_t n_ids, const struct image_input *in, struct err *e)
{
    struct vision_ctx *vc = NULL;
    int32_t pos[IMAGE_INPUT_MAX];
    int rc, D = m->hp.n_embd, merge = m->vision->info.merge;
    size_t rows = 0;
    memset(ci, 0, sizeof *ci);
    ci->be = be;
    if (in->n_img < 1 || in->n_img > CLI_MAX_IMAGES)
        return err_setf(e, ERR_ARG, "%d images (1 to %d)", in->n_img, CLI_MAX_IMAGES);
    if ((rc = image_input_runs(in, ids, n_ids, pos, e)) < 0)
        return rc;
    for (int k = 0; k < in->n_img; k++)
        rows += vision_image_floats(m, in->n_tok[k]);
    if ((rc = vision_ctx_new(&vc, m, be, e)) < 0)
        return rc;
    if ((rc = be->ops->buf_alloc(be, rows * sizeof(float), (void **)&ci->embd, e)) < 0)
        goto fail;
    size_t at = 0;   /* floats */
    for (int k = 0; k < in->n_img; k++) {
        if ((rc = vision_encode_grid(vc, ci->embd + at, in->pixels + in->off[k], in->grid[k], e)) < 0) {
            err_prefix(e, "image %d", k + 1);
            goto fail;
        }
        ci->img[k] = (struct batch_image){0, pos[k], in->n_tok[k], ci->embd + at, in->grid[k][1] / merge,
                                          in->grid[k][2] / merge, (size_t)in->n_tok[k] * D};
        at += vision_image_floats(m, in->n_tok[k]);
    }
    ci->n = in->n_img;
    vision_ctx_free(vc);
    return 0;
fail:
    vision_ctx_free(vc);
    cli_images_free(ci);
    return rc;
}

void cli_images_free(struct cli_images *ci)
{
    if (ci->embd)
        ci->be->ops->buf_free(ci->be, ci->embd);
    ci->embd = NULL;
    ci->n = 0;
}

int cli_image_input_load(struct cli_image_input *in, const char *dir, const struct model *m,
                         const struct tokenizer *tok, const char *const *paths, int n_paths, struct err *e)
{
    int rc;
    memset(in, 0, sizeof *in);
    if (n_paths < 1 || n_paths > CLI_MAX_IMAGES)
        return err_setf(e, ERR_ARG, "%d images (1 to %d)", n_paths, CLI_MAX_IMAGES);
    if ((rc = image_setup_init(&in->su, dir, m, tok, e)) < 0)
        return m->vision ? err_prefix(e, "--image needs the checkpoint's image processor") : rc;
    image_input_init(&in->in, &in->su);
    for (int i = 0; i < n_paths; i++) {
        struct image im = {0};
        if ((rc = image_load(&im, paths[i], NULL, e)) < 0) {
            cli_image_input_free(in);
            return err_prefix(e, "--image");  /* the message names the file */
        }
        rc = image_input_add(&in->in, &im, e);
        image_free(&im);
        if (rc < 0) {
            cli_image_input_free(in);
            return err_prefix(e, "--image %s", paths[i]);
        }
    }
    return 0;
}

void cli_image_input_free(struct cli_image_input *in)
{
    image_input_free(&in->in);
}

/* One F32 tensor `name` of shape[0..ndim) as a safetensors file at path (flag names the
 * option in errors); the parts of the data in order, n_parts of them, parts[i] bytes[i] long. */
static int write_f32_tensor(const char *flag, const char *path, const char *name, const long long *shape, int ndim,
                            const void *const *parts, const size_t *bytes, int n_parts, struct err *e)
{
    char hdr[256], dims[128] = "";
    size_t nb = 0;
    for (int i = 0; i < n_parts; i++)
        nb += bytes[i];
    for (int i = 0, k = 0; i < ndim; i++)
        k += snprintf(dims + k, sizeof dims - (size_t)k, "%s%lld", i ? "," : "", shape[i]);
    int h = snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[0,%zu]}}",
                     name, dims, nb);
    while (h % 8)
        hdr[h++] = ' ';
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h >> (8 * i));
    FILE *f = fopen(path, "wb");
    if (!f)
        return err_setf(e, ERR_IO, "%s %s: cannot create it", flag, path);
    /* the data little-endian as the format says (this host's floats are: x86-64, aarch64) */
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, (size_t)h, f) == (size_t)h;
    for (int i = 0; ok && i < n_parts; i++)
        ok = fwrite(parts[i], 1, bytes[i], f) == bytes[i];
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(path);
        return err_setf(e, ERR_IO, "%s %s: write failed", flag, path);
    }
    return 0;
}

int cli_pixel_values_write(const char *path, const struct model *m, const float *pixels, int n_img,
                           struct err *e)
{
    if (m->vision && m->vision->info.merge > 0)
        return err_setf(e, ERR_ARG, "--pixel-values-out writes images of the tower's one size; %s takes each "
                        "image at its own size", m->vision->ops->model_type);
    int C = m->vision->info.n_channels, S = m->vision->info.image_size;
    long long shape[4] = {n_img, C, S, S};
    size_t nb = (size_t)n_img * (size_t)C * (size_t)S * (size_t)S * sizeof(float);
    const void *part = pixels;
    return write_f32_tensor("--pixel-values-out", path, "pixel_values", shape, 4, &part, &nb, 1, e);
}

int cli_image_embeds_write(const char *path, const struct model *m, const struct cli_images *ci, struct err *e)
{
    const void *parts[CLI_MAX_IMAGES];
    size_t bytes[CLI_MAX_IMAGES];
    float *host = NULL;
    long long rows = 0, D = m->hp.n_embd;
    size_t total = 0;
    for (int i = 0; i < ci->n; i++) {
        rows += ci->img[i].n_tok;
        total += (size_t)ci->img[i].n_tok * (size_t)D * sizeof(float);
    }
    if (ci->n < 1 || !(host = malloc(total)))
        return ci->n < 1 ? err_setf(e, ERR_ARG, "--image-embd-out: no image was encoded")
                         : err_setf(e, ERR_NOMEM, "out of memory for %zu bytes of image embeddings", total);
    /* each image's main rows (a deepstack model's extra planes follow them in backend memory) */
    size_t at = 0;
    for (int i = 0; i < ci->n; i++) {
        bytes[i] = (size_t)ci->img[i].n_tok * (size_t)D * sizeof(float);
        ci->be->ops->download(ci->be, (char *)host + at, ci->img[i].embd, bytes[i]);
        parts[i] = (char *)host + at;
        at += bytes[i];
    }
    long long shape[2] = {rows, D};
    int rc = write_f32_tensor("--image-embd-out", path, "image_embeds", shape, 2, parts, bytes, ci->n, e);
    free(host);
    return rc;
}
