/*
 * image_input: a prompt's images as the model's processor and tokenizer make them (issue 43
 * item 4; shared by `mlxcel generate --image` and the server's image parts). Decoded images
 * (src/image) go through the checkpoint's image processor into the pixels the vision tower
 * takes, and each image's placeholder in the prompt text (what the chat template writes:
 * Gemma 3's <start_of_image>) is replaced by the processor's expansion (image_prompt_text)
 * before the whole prompt is tokenized, as transformers' processors do; image_input_runs then
 * finds each image's run of image tokens in the ids.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../image/image.h"
#include "../image/preprocess.h"
#include "../models/model.h"
#include "../tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tower images (pan-and-scan crops and Idefics3 tiles count: one published Idefics3 / SmolVLM
 * image is up to 4 x 4 tiles + the global one) in one prompt: the scheduler's SCHED_MAX_IMAGES. */
#define IMAGE_INPUT_MAX 64
/* Pixel values (floats) of one prompt's tower images together, by default: 256 MiB. One image
 * at Qwen2-VL's default max_pixels (3 x 12845056), 64 Idefics3 tiles of 364² or 16 Gemma 3
 * images of 896² fit; more is a clear error, so that 64 tower images cannot hold 64 times the
 * largest. */
#define IMAGE_INPUT_MAX_FLOATS ((size_t)64 << 20)

/* What a model's images need, made once per model. */
struct image_setup {
    const struct model *m;           /* borrowed */
    struct image_proc_config cfg;    /* the checkpoint's processor */
    bool has_text;                   /* the pieces below are known (a tokenizer was given) */
    char boi[64], image[64], eoi[64];  /* e.g. "<start_of_image>", "<image_soft_token>", ... */
    char img_break[64], img_end[64];   /* Pixtral's "[IMG_BREAK]", "[IMG_END]" (vision_info.row_breaks) */
    /* the text the chat template writes for an image, which the processor replaces: Gemma 3's
     * boi; Qwen's image piece (<|image_pad|>, between <|vision_start|> and <|vision_end|>) */
    char placeholder[64];
    char fake_around[64], global_img[64];  /* Idefics3 / SmolVLM: <fake_token_around_image>,
                                            * <global-img> (the processor's strings) */
    char bare[200];                  /* what stands for an image in a prompt without a template
                                      * or a placeholder (Gemma 3: boi; Qwen: start, pad, end) */
};

/* m's setup from checkpoint folder dir (preprocessor_config.json / processor_config.json) and
 * tok (NULL: no text, for prompts given as ids). ERR_ARG naming the model when it has no vision
 * tower; the processor's load errors (ERR_MISSING when there is none). */
int image_setup_init(struct image_setup *su, const char *dir, const struct model *m, const struct tokenizer *tok,
                     struct err *e);

/* One prompt's images. */
struct image_input {
    const struct image_setup *su;    /* borrowed */
    float *pixels;                   /* [n_img, C, S, S] malloc'd; images of their own size
                                      * (vision_info.merge > 0): each its patch rows, at off[k] */
    int n_img;
    /* per tower image: its image tokens, its grid (t, h, w patches; merge > 0) and where its
     * pixels start in pixels */
    int n_tok[IMAGE_INPUT_MAX];
    int32_t grid[IMAGE_INPUT_MAX][3];
    size_t off[IMAGE_INPUT_MAX];
    size_t n_values;
    size_t max_values;               /* the bound of n_values (IMAGE_INPUT_MAX_FLOATS) */
    char *text[IMAGE_INPUT_MAX];     /* per image added: its placeholder's expansion (has_text) */
    int n_added;
};

void image_input_init(struct image_input *in, const struct image_setup *su);
/* im through the processor, appended (ERR_CONFIG when the processor's output does not fit the
 * tower; ERR_RANGE past IMAGE_INPUT_MAX). */
int image_input_add(struct image_input *in, const struct image *im, struct err *e);
void image_input_free(struct image_input *in);

/* text[0, len) with its k-th placeholder (su->placeholder) replaced by text[k] (*out malloc'd, NUL-
 * terminated). Placeholders past the images are left as they are. */
int image_input_substitute(const struct image_input *in, const char *text, size_t len, char **out,
                           size_t *out_len, struct err *e);

/* The first row of each image's run of image tokens (n_tok[k] of them) in ids, in order, into
 * pos[n_img]. ERR_ARG when the runs are not exactly n_img whole runs (a placeholder missing,
 * one too many, or image tokens written as text). */
int image_input_runs(const struct image_input *in, const int32_t *ids, size_t n, int32_t *pos, struct err *e);

#ifdef __cplusplus
}
#endif
