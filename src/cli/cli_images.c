/*
 * cli_images: pixel_values in, a prompt's image rows out (cli_images.h).
 */
#include "cli_images.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/safetensors.h"
#include "../image/image.h"
#include "../image/preprocess.h"
#include "../models/vision.h"

int cli_pixel_values_read(const char *path, const struct model *m, float **out, int *n_img, struct err *e)
{
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
                                              ci->embd + (size_t)ci->n * rows / sizeof(float)};
        ci->n++;
        i += (size_t)T;
    }
    if (ci->n != n_img) {
        cli_images_free(ci);
        return err_setf(e, ERR_ARG, "the prompt has places for %d of the %d images", ci->n, n_img);
    }
    return 0;
}

void cli_images_free(struct cli_images *ci)
{
    if (ci->embd)
        ci->be->ops->buf_free(ci->be, ci->embd);
    ci->embd = NULL;
    ci->n = 0;
}

/* The tokenizer's piece of id into buf (ERR_FORMAT when it has none). */
static int piece(const struct tokenizer *tok, int32_t id, const char *what, char *buf, size_t cap, struct err *e)
{
    const char *p = id >= 0 ? tok_id_to_piece(tok, id) : NULL;
    if (!p || !*p || strlen(p) >= cap)
        return err_setf(e, ERR_FORMAT, "the tokenizer has no %s token (id %d)", what, (int)id);
    snprintf(buf, cap, "%s", p);
    return 0;
}

/* One file through the decoder and the processor: its pixels appended to in->pixels. */
static int load_one(struct cli_image_input *in, const struct image_proc_config *cfg, const struct vision_info *vi,
                    const struct image_prompt_strings *ps, const char *path, struct err *e)
{
    struct image im = {0};
    struct image_pixels px = {0};
    int rc;
    if ((rc = image_load(&im, path, NULL, e)) < 0)
        return err_prefix(e, "--image");  /* the message names the file */
    rc = image_preprocess(&px, cfg, &im, e);
    image_free(&im);
    if (rc < 0)
        return err_prefix(e, "--image %s", path);
    size_t one = (size_t)vi->n_channels * (size_t)vi->image_size * (size_t)vi->image_size;
    if (px.channels != (uint32_t)vi->n_channels || px.height != (uint32_t)vi->image_size ||
        px.width != (uint32_t)vi->image_size || px.n_values != one * px.n_images) {
        rc = err_setf(e, ERR_CONFIG, "--image %s: the image processor makes %u x %u x %u pixels where the "
                      "model's vision tower takes %d x %d x %d (preprocessor_config.json's size)",
                      path, px.channels, px.height, px.width, vi->n_channels, vi->image_size, vi->image_size);
        goto out;
    }
    if (px.n_image_tokens != (uint32_t)vi->tokens_per_image * px.n_images) {
        rc = err_setf(e, ERR_CONFIG, "--image %s: the processor writes %u image tokens for %u image%s where the "
                      "model takes %d each (processor_config.json's image_seq_length)", path,
                      px.n_image_tokens, px.n_images, px.n_images == 1 ? "" : "s", vi->tokens_per_image);
        goto out;
    }
    if (in->n_img + (int)px.n_images > CLI_MAX_IMAGES) {
        rc = err_setf(e, ERR_RANGE, "--image %s: more than %d images for the tower in one prompt (pan-and-scan "
                      "crops count)", path, CLI_MAX_IMAGES);
        goto out;
    }
    float *grown = realloc(in->pixels, (size_t)(in->n_img + (int)px.n_images) * one * sizeof *grown);
    if (!grown) {
        rc = err_setf(e, ERR_NOMEM, "out of memory for the pixels of %s", path);
        goto out;
    }
    in->pixels = grown;
    memcpy(grown + (size_t)in->n_img * one, px.pixel_values, px.n_values * sizeof *grown);
    in->n_img += (int)px.n_images;
    if (ps && (rc = image_prompt_text(&in->text[in->n_files], cfg, &px, ps, e)) < 0)
        goto out;
    in->n_files++;
out:
    image_pixels_free(&px);
    return rc;
}

int cli_image_input_load(struct cli_image_input *in, const char *dir, const struct model *m,
                         const struct tokenizer *tok, const char *const *paths, int n_paths, struct err *e)
{
    struct image_proc_config cfg;
    char image[64], eoi[64];
    int rc;
    memset(in, 0, sizeof *in);
    if (!m->vision)
        return err_setf(e, ERR_ARG, "model %s (%s) does not take images", dir, m->hp.model_type);
    if (n_paths < 1 || n_paths > CLI_MAX_IMAGES)
        return err_setf(e, ERR_ARG, "%d images (1 to %d)", n_paths, CLI_MAX_IMAGES);
    const struct vision_info *vi = &m->vision->info;
    if ((rc = image_proc_config_load(&cfg, dir, m->hp.model_type, e)) < 0)
        return err_prefix(e, "--image needs the checkpoint's image processor");
    /* the placeholders' text (for a text prompt; ids given as ids are expanded as ids) */
    if (tok && ((rc = piece(tok, vi->boi_token_id, "start-of-image", in->boi, sizeof in->boi, e)) < 0 ||
        (rc = piece(tok, vi->image_token_id, "image", image, sizeof image, e)) < 0 ||
        (rc = piece(tok, vi->eoi_token_id, "end-of-image", eoi, sizeof eoi, e)) < 0))
        return rc;
    struct image_prompt_strings ps = {.image = image, .boi = in->boi, .eoi = eoi};
    for (int i = 0; i < n_paths; i++)
        if ((rc = load_one(in, &cfg, vi, tok ? &ps : NULL, paths[i], e)) < 0) {
            cli_image_input_free(in);
            return rc;
        }
    return 0;
}

void cli_image_input_free(struct cli_image_input *in)
{
    free(in->pixels);
    for (int i = 0; i < CLI_MAX_IMAGES; i++)
        free(in->text[i]);
    memset(in, 0, sizeof *in);
}

int cli_image_input_substitute(const struct cli_image_input *in, const char *text, size_t len, char **out,
                               size_t *out_len, struct err *e)
{
    size_t nb = strlen(in->boi), total = len, at = 0, n = 0;
    int k = 0;
    /* sizes first: every placeholder matched by a file grows by its text less the boi */
    for (size_t i = 0; nb && i + nb <= len && k < in->n_files;) {
        if (memcmp(text + i, in->boi, nb) == 0) {
            total += strlen(in->text[k++]) - nb;
            i += nb;
        } else {
            i++;
        }
    }
    char *o = malloc(total + 1);
    if (!o)
        return err_setf(e, ERR_NOMEM, "out of memory for the prompt");
    k = 0;
    while (at < len) {
        if (nb && k < in->n_files && at + nb <= len && memcmp(text + at, in->boi, nb) == 0) {
            size_t t = strlen(in->text[k]);
            memcpy(o + n, in->text[k++], t);
            n += t;
            at += nb;
        } else {
            o[n++] = text[at++];
        }
    }
    o[n] = 0;
    *out = o;
    *out_len = n;
    return 0;
}

int cli_pixel_values_write(const char *path, const struct model *m, const float *pixels, int n_img,
                           struct err *e)
{
    int C = m->vision->info.n_channels, S = m->vision->info.image_size;
    char hdr[256];
    size_t nb = (size_t)n_img * (size_t)C * (size_t)S * (size_t)S * sizeof(float);
    int h = snprintf(hdr, sizeof hdr, "{\"pixel_values\":{\"dtype\":\"F32\",\"shape\":[%d,%d,%d,%d],"
                     "\"data_offsets\":[0,%zu]}}", n_img, C, S, S, nb);
    while (h % 8)
        hdr[h++] = ' ';
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h >> (8 * i));
    FILE *f = fopen(path, "wb");
    if (!f)
        return err_setf(e, ERR_IO, "--pixel-values-out %s: cannot create it", path);
    /* the data little-endian as the format says (this host's floats are: x86-64, aarch64) */
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, (size_t)h, f) == (size_t)h &&
              fwrite(pixels, 1, nb, f) == nb;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        remove(path);
        return err_setf(e, ERR_IO, "--pixel-values-out %s: write failed", path);
    }
    return 0;
}
