/*
 * cli_images: a prompt's images for `mlxcel generate` (ADR 0087, issue 43 item 4), from the
 * processed pixel_values the image processor gives (what transformers' processor returns,
 * [n_images, C, S, S] float): the prompt's image placeholders expanded, the images encoded
 * by the model's vision tower on the engine's backend, and each image matched to its run of
 * image tokens for generate() (gen_params.images).
 *
 * Pixels come in two ways: --image FILE (decoded by src/image, then the checkpoint's image
 * processor, preprocess.h: cli_image_input_load) or --pixel-values FILE (a safetensors file
 * holding a tensor "pixel_values", as transformers' processor returns it).
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../engine/batch.h"
#include "../models/model.h"
#include "../engine/image_input.h"
#include "../tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many images in one prompt (each is tokens_per_image rows of the context). */
#define CLI_MAX_IMAGES 16

/* The tensor "pixel_values" of the safetensors file at path: F32, F16 or BF16 [n, C, S, S]
 * with C and S the model's vision_info, 1 <= n <= CLI_MAX_IMAGES; widened into *out
 * (malloc'd, the caller frees) with *n_img. Errors name the file and the expected shape. */
int cli_pixel_values_read(const char *path, const struct model *m, float **out, int *n_img, struct err *e);

/* Gemma 3's processor expands each start-of-image token of the text into boi, image x T,
 * eoi (T the model's tokens_per_image; it also writes "\n\n" around them, text a prompt
 * given as text carries itself). Here at token level: every boi id of *ids not already
 * followed by the image token is expanded (*ids reallocated, *n grown). The prompt must then
 * hold exactly n_img runs of T image tokens: transformers' "Image features and image tokens
 * do not match" otherwise, and a prompt without a <start_of_image> where the images go is
 * that error (the message says to write one). */
int cli_images_expand(const struct model *m, int32_t **ids, size_t *n, int n_img, struct err *e);

/* The images encoded (pixels [n_img, C, S, S]) on be into backend memory, and their runs in
 * ids as struct batch_image (seq 0) for gen_params.images. */
struct cli_images {
    struct backend *be;        /* borrowed */
    float *embd;               /* [n * T, n_embd] backend memory, owned */
    struct batch_image img[CLI_MAX_IMAGES];
    int n;
};
int cli_images_encode(struct cli_images *ci, const struct model *m, struct backend *be, const int32_t *ids,
                      size_t n_ids, const float *pixels, int n_img, struct err *e);
/* Images of their own size (Qwen: vision_info.merge > 0), in->pixels by their grids: each
 * encoded (vision_encode_grid) and matched to its run of in->n_tok[k] image tokens in ids,
 * with its merged grid for M-RoPE. */
int cli_images_encode_input(struct cli_images *ci, const struct model *m, struct backend *be, const int32_t *ids,
                            size_t n_ids, const struct image_input *in, struct err *e);
void cli_images_free(struct cli_images *ci);

/* --image FILE...: each file decoded (image_load, the default limits) and run through the
 * checkpoint's processor (image_input.h): in.pixels [in.n_img, C, S, S] for the tower, and the
 * text each placeholder becomes (tok NULL, for a prompt given as ids: no text). A model without
 * a vision tower: ERR_ARG naming it. */
struct cli_image_input {
    struct image_setup su;
    struct image_input in;
};
int cli_image_input_load(struct cli_image_input *in, const char *dir, const struct model *m,
                         const struct tokenizer *tok, const char *const *paths, int n_paths,
                         struct err *e);
void cli_image_input_free(struct cli_image_input *in);

/* pixels [n_img, C, S, S] (C, S: m's tower's) written as a safetensors file with one F32 tensor "pixel_values"
 * (what --pixel-values reads). */
int cli_pixel_values_write(const char *path, const struct model *m, const float *pixels, int n_img,
                           struct err *e);

/* The encoded images' rows (the projector's output, what the prompt's image tokens take) as a
 * safetensors file with one F32 tensor "image_embeds" [sum of n_tok, n_embd], images in order. */
int cli_image_embeds_write(const char *path, const struct model *m, const struct cli_images *ci, struct err *e);

#ifdef __cplusplus
}
#endif
