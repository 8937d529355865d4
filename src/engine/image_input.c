/*
 * image_input: a prompt's images through the processor, and their placeholders
 * (image_input.h).
 */
#include "image_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../models/vision.h"

/* The tokenizer's piece of id into buf (ERR_FORMAT when it has none). */
static int piece(const struct tokenizer *tok, int32_t id, const char *what, char *buf, size_t cap, struct err *e)
{
    const char *p = id >= 0 ? tok_id_to_piece(tok, id) : NULL;
    if (!p || !*p || strlen(p) >= cap)
        return err_setf(e, ERR_FORMAT, "the tokenizer has no %s token (id %d)", what, (int)id);
    snprintf(buf, cap, "%s", p);
    return 0;
}

int image_setup_init(struct image_setup *su, const char *dir, const struct model *m, const struct tokenizer *tok,
                     struct err *e)
{
    int rc;
    memset(su, 0, sizeof *su);
    su->m = m;
    if (!m->vision)
        return err_setf(e, ERR_ARG, "model %s (%s) does not take images", dir, m->hp.model_type);
    const struct vision_info *vi = &m->vision->info;
    if ((rc = image_proc_config_load(&su->cfg, dir, m->hp.model_type, e)) < 0)
        return rc;
    /* a model without start/end-of-image tokens (LLaVA: boi_token_id -1) leaves them empty */
    if (tok && ((vi->boi_token_id >= 0 &&
                 (rc = piece(tok, vi->boi_token_id, "start-of-image", su->boi, sizeof su->boi, e)) < 0) ||
                (rc = piece(tok, vi->image_token_id, "image", su->image, sizeof su->image, e)) < 0 ||
                (vi->eoi_token_id >= 0 &&
                 (rc = piece(tok, vi->eoi_token_id, "end-of-image", su->eoi, sizeof su->eoi, e)) < 0)))
        return rc;
    /* Pixtral's run also holds its row breaks and end token (ADR 0123) */
    if (tok && vi->row_breaks &&
        ((rc = piece(tok, vi->break_token_id, "image break", su->img_break, sizeof su->img_break, e)) < 0 ||
         (rc = piece(tok, vi->end_token_id, "image end", su->img_end, sizeof su->img_end, e)) < 0))
        return rc;
    su->has_text = tok != NULL;
    /* Idefics3Processor's and SmolVLMProcessor's own strings around each tile; transformers writes
     * them as text, so they are tokenized with the prompt as there */
    if (su->cfg.kind == IMAGE_PROC_IDEFICS3) {
        snprintf(su->fake_around, sizeof su->fake_around, "%s", "<fake_token_around_image>");
        snprintf(su->global_img, sizeof su->global_img, "%s", "<global-img>");
    }
    /* the image token itself is the placeholder the processor expands: Qwen's <|image_pad|>,
     * LLaVA's <image> (no start-of-image token); Gemma 3's is its <start_of_image> */
    if (su->has_text && (vi->merge > 0 || vi->boi_token_id < 0)) {
        snprintf(su->placeholder, sizeof su->placeholder, "%s", su->image);
        snprintf(su->bare, sizeof su->bare, "%s%s%s", su->boi, su->image, su->eoi);
    } else {
        snprintf(su->placeholder, sizeof su->placeholder, "%s", su->boi);
        snprintf(su->bare, sizeof su->bare, "%s", su->boi);
    }
    return 0;
}

/* Whether n more pixel values stay within the prompt's bound; else the error. */
static int values_fit(const struct image_input *in, size_t n, struct err *e)
{
    if (n > in->max_values || in->n_values > in->max_values - n)
        return err_setf(e, ERR_RANGE, "the prompt's images take more than %zu pixel values (%zu MiB)",
                        in->max_values, in->max_values * sizeof(float) >> 20);
    return 0;
}

/* Images of their own size (Qwen): px's patch rows appended with their grid. */
static int add_grid(struct image_input *in, const struct image_pixels *px, struct err *e)
{
    const struct vision *v = in->su->m->vision;
    const struct vision_info *vi = &v->info;
    int32_t grid[3] = {(int32_t)px->grid_t, (int32_t)px->grid_h, (int32_t)px->grid_w};
    int rc;
    /* Qwen's rows of patch_dim values, or Pixtral's [3, H, W]: the same count a patch */
    size_t n_patches = (size_t)px->grid_t * px->grid_h * px->grid_w;
    size_t per = n_patches ? px->n_values / n_patches : 0;
    if (per != (size_t)vi->patch_dim || per * n_patches != px->n_values)
        return err_setf(e, ERR_CONFIG, "the image processor makes patches of %zu values where the model's vision "
                        "tower takes %d (preprocessor_config.json's patch_size / temporal_patch_size)", per,
                        vi->patch_dim);
    if ((rc = vision_grid_tokens(v, grid, e)) < 0)
        return err_prefix(e, "the image processor's output");
    if ((uint32_t)rc != px->n_image_tokens)
        return err_setf(e, ERR_CONFIG, "the processor writes %u image tokens where the tower's merge of %d makes "
                        "%d (preprocessor_config.json's merge_size)", px->n_image_tokens, vi->merge, rc);
    if (in->n_img >= IMAGE_INPUT_MAX)
        return err_setf(e, ERR_RANGE, "more than %d images in one prompt", IMAGE_INPUT_MAX);
    int fit = values_fit(in, px->n_values, e);   /* rc holds the image's tokens */
    if (fit < 0)
        return fit;
    float *grown = realloc(in->pixels, (in->n_values + px->n_values) * sizeof *grown);
    if (!grown)
        return err_setf(e, ERR_NOMEM, "out of memory for an image's pixels");
    in->pixels = grown;
    memcpy(grown + in->n_values, px->pixel_values, px->n_values * sizeof *grown);
    in->off[in->n_img] = in->n_values;
    memcpy(in->grid[in->n_img], grid, sizeof grid);
    in->n_tok[in->n_img] = rc;
    in->n_values += px->n_values;
    in->n_img++;
    return 0;
}

void image_input_init(struct image_input *in, const struct image_setup *su)
{
    memset(in, 0, sizeof *in);
    in->su = su;
    in->max_values = IMAGE_INPUT_MAX_FLOATS;
}

int image_input_add(struct image_input *in, const struct image *im, struct err *e)
{
    const struct image_setup *su = in->su;
    const struct vision_info *vi = &su->m->vision->info;
    struct image_pixels px = {0};
    int rc;
    if (in->n_added >= IMAGE_INPUT_MAX)
        return err_setf(e, ERR_RANGE, "more than %d images in one prompt", IMAGE_INPUT_MAX);
    if ((rc = image_preprocess(&px, &su->cfg, im, e)) < 0)
        return rc;
    if (vi->merge > 0) {
        if ((rc = add_grid(in, &px, e)) < 0)
            goto out;
        if (su->has_text) {
            struct image_prompt_strings ps = {.image = su->image, .boi = su->boi, .eoi = su->eoi,
                                              .fake_around = su->fake_around, .global_img = su->global_img,
                                              .img_break = su->img_break, .img_end = su->img_end};
            if ((rc = image_prompt_text(&in->text[in->n_added], &su->cfg, &px, &ps, e)) < 0)
                goto out;
        }
        in->n_added++;
        goto out;
    }
    size_t one = (size_t)vi->n_channels * (size_t)vi->image_size * (size_t)vi->image_size;
    if (px.channels != (uint32_t)vi->n_channels || px.height != (uint32_t)vi->image_size ||
        px.width != (uint32_t)vi->image_size || px.n_values != one * px.n_images) {
        rc = err_setf(e, ERR_CONFIG, "the image processor makes %u x %u x %u pixels where the model's vision "
                      "tower takes %d x %d x %d (preprocessor_config.json's size)", px.channels, px.height,
                      px.width, vi->n_channels, vi->image_size, vi->image_size);
        goto out;
    }
    if (px.n_image_tokens != (uint32_t)vi->tokens_per_image * px.n_images) {
        rc = err_setf(e, ERR_CONFIG, "the processor writes %u image tokens for %u image%s where the model takes "
                      "%d each (processor_config.json's image_seq_length)", px.n_image_tokens, px.n_images,
                      px.n_images == 1 ? "" : "s", vi->tokens_per_image);
        goto out;
    }
    if ((rc = values_fit(in, px.n_values, e)) < 0)
        goto out;
    if (in->n_img + (int)px.n_images > IMAGE_INPUT_MAX) {
        rc = err_setf(e, ERR_RANGE, "more than %d images for the tower in one prompt (pan-and-scan crops count)",
                      IMAGE_INPUT_MAX);
        goto out;
    }
    float *grown = realloc(in->pixels, (size_t)(in->n_img + (int)px.n_images) * one * sizeof *grown);
    if (!grown) {
        rc = err_setf(e, ERR_NOMEM, "out of memory for an image's pixels");
        goto out;
    }
    in->pixels = grown;
    if (su->has_text) {
        struct image_prompt_strings ps = {.image = su->image, .boi = su->boi, .eoi = su->eoi,
                                              .fake_around = su->fake_around, .global_img = su->global_img,
                                              .img_break = su->img_break, .img_end = su->img_end};
        if ((rc = image_prompt_text(&in->text[in->n_added], &su->cfg, &px, &ps, e)) < 0)
            goto out;
    }
    memcpy(grown + (size_t)in->n_img * one, px.pixel_values, px.n_values * sizeof *grown);
    for (uint32_t k = 0; k < px.n_images; k++) {
        in->n_tok[in->n_img + (int)k] = vi->tokens_per_image;
        in->off[in->n_img + (int)k] = (size_t)(in->n_img + (int)k) * one;
    }
    in->n_values += px.n_values;
    in->n_img += (int)px.n_images;
    in->n_added++;
out:
    image_pixels_free(&px);
    return rc;
}

void image_input_free(struct image_input *in)
{
    free(in->pixels);
    for (int i = 0; i < IMAGE_INPUT_MAX; i++)
        free(in->text[i]);
    image_input_init(in, in->su);
}

int image_input_substitute(const struct image_input *in, const char *text, size_t len, char **out,
                           size_t *out_len, struct err *e)
{
    const char *boi = in->su->placeholder;
    size_t nb = strlen(boi), total = len, at = 0, n = 0;
    int k = 0;
    if (!in->su->has_text)
        return err_setf(e, ERR_ARG, "images in a text prompt need the tokenizer");
    /* sizes first: every placeholder matched by an image grows by its text less the boi */
    for (size_t i = 0; nb && i + nb <= len && k < in->n_added;) {
        if (memcmp(text + i, boi, nb) == 0) {
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
        if (nb && k < in->n_added && at + nb <= len && memcmp(text + at, boi, nb) == 0) {
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

int image_input_runs(const struct image_input *in, const int32_t *ids, size_t n, int32_t *pos, struct err *e)
{
    const struct vision_info *vi = &in->su->m->vision->info;
    int runs = 0;
    for (size_t i = 0; i < n;) {
        if (ids[i] != vi->image_token_id) {
            i++;
            continue;
        }
        size_t len = vision_image_run(vi, ids + i, n - i);
        /* each image its own count (Qwen's grids), else the model's */
        size_t T = vi->merge > 0 ? (runs < in->n_img ? (size_t)in->n_tok[runs] : 0) : (size_t)vi->tokens_per_image;
        if (len != T && (vi->merge == 0 || runs < in->n_img))
            return err_setf(e, ERR_ARG, "the prompt holds a run of %zu image tokens where an image takes %zu",
                            len, T);
        if (runs < in->n_img)
            pos[runs] = (int32_t)i;
        runs++;
        i += len;
    }
    if (runs != in->n_img)
        return err_setf(e, ERR_ARG, "%d image%s but the prompt has %d place%s for one", in->n_img,
                        in->n_img == 1 ? "" : "s", runs, runs == 1 ? "" : "s");
    return 0;
}
