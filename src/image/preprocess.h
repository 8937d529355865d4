/*
 * preprocess: decoded RGB images to a vision tower's pixel_values, as transformers 5.17's
 * image processors compute them (ADR 0085), and the prompt expansion of each processor (one
 * image placeholder -> the model's image tokens).
 *
 * A checkpoint's preprocessor_config.json (or processor_config.json's "image_processor"
 * object) is parsed into struct image_proc_config; every number is bounded there, so
 * image_preprocess never sizes an allocation from an unchecked value. Processors:
 *   GEMMA3   Gemma3ImageProcessor: resize to size.height x size.width (bilinear), rescale,
 *            normalize; optional pan-and-scan crops (each crop is one more image).
 *   QWEN2VL  Qwen2VLImageProcessor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): smart_resize to multiples
 *            of patch_size * merge_size within [min_pixels, max_pixels], bicubic, patchified.
 *   CLIP     CLIPImageProcessor (LLaVA): resize the shortest edge, center crop.
 *   SIGLIP   SiglipImageProcessor: resize to size.height x size.width (bicubic).
 *   PIXTRAL  PixtralImageProcessor (Pixtral, Mistral 3): longest edge within size.longest_edge,
 *            each side rounded up to whole patches (variable resolution).
 *   IDEFICS3 Idefics3ImageProcessor / SmolVLMImageProcessor: longest edge to size.longest_edge,
 *            then to multiples of max_image_size, split into max_image_size tiles plus the
 *            whole image at max_image_size (Lanczos; transformers defaults these two to PIL).
 * transformers 5 has two backends per processor: torchvision (the default, and what
 * AutoImageProcessor picks when torchvision is installed) and PIL; both are implemented
 * (their resize kernels differ in fixed-point precision, their normalizations in float
 * rounding), torchvision by default.
 *
 * pixel_values layout (float32, row-major):
 *   GEMMA3, CLIP, SIGLIP, PIXTRAL, IDEFICS3: [n_images][3][height][width], n_images =
 *     1 + num_crops for Gemma 3 (pan-and-scan: the whole image first, then its crops,
 *     row-major), rows * cols + 1 for Idefics3 (the tiles row-major, then the whole image; 1
 *     when the image is not split), 1 otherwise; PIXTRAL's height x width is the image's own
 *     (image_sizes).
 *   QWEN2VL: [n_patches][patch_dim], n_patches = grid_t * grid_h * grid_w, patch_dim =
 *     3 * temporal_patch_size * patch_size^2; rows ordered (t, h / merge, w / merge, merge_h,
 *     merge_w), each row (channel, temporal, py, px): the image is repeated temporal_patch_size
 *     times, as transformers does for a still image.
 * n_image_tokens is what the prompt expansion inserts for this image: Gemma 3 image_seq_length
 * per image (crops included), Qwen grid_t * grid_h * grid_w / merge_size^2, LLaVA
 * (crop / patch)^2 (+ 1 for the "full" feature strategy), SigLIP (height / patch)^2, Pixtral
 * rows * (cols + 1) (a break after each row, the last one the end token), Idefics3
 * image_seq_len per tile and for the whole image.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "image/image.h"

#ifdef __cplusplus
extern "C" {
#endif

enum image_proc_kind {
    IMAGE_PROC_NONE = 0,
    IMAGE_PROC_GEMMA3 = 1,
    IMAGE_PROC_QWEN2VL = 2,
    IMAGE_PROC_CLIP = 3,
    IMAGE_PROC_SIGLIP = 4,
    IMAGE_PROC_PIXTRAL = 5,
    IMAGE_PROC_IDEFICS3 = 6,
};

enum image_backend {
    IMAGE_BACKEND_TORCHVISION = 0,  /* transformers 5's default */
    IMAGE_BACKEND_PIL = 1,
};

/* PIL's numbering, as configs spell "resample" */
enum image_resample {
    IMAGE_RESAMPLE_NEAREST = 0,
    IMAGE_RESAMPLE_LANCZOS = 1,
    IMAGE_RESAMPLE_BILINEAR = 2,
    IMAGE_RESAMPLE_BICUBIC = 3,
    IMAGE_RESAMPLE_BOX = 4,
    IMAGE_RESAMPLE_HAMMING = 5,
};

/* Bounds on what a config may ask for (ERR_CONFIG beyond them). */
#define IMAGE_PROC_MAX_SIDE 4096u            /* a fixed output side, a crop side, shortest_edge */
#define IMAGE_PROC_MAX_PIXELS (16u << 20)    /* Qwen max_pixels / longest_edge (16 M, Qwen3-VL's) */
#define IMAGE_PROC_MAX_PATCH 64u             /* patch_size */
#define IMAGE_PROC_MAX_MERGE 8u              /* merge_size, temporal_patch_size */
#define IMAGE_PROC_MAX_CROPS 16u             /* pan_and_scan_max_num_crops */
#define IMAGE_PROC_MAX_SEQ 65536u            /* image_seq_length */
#define IMAGE_PROC_MAX_VALUES ((size_t)64 << 20)  /* floats in one image's pixel_values (256 MB) */

struct image_proc_config {
    enum image_proc_kind kind;
    enum image_backend backend;
    enum image_resample resample;
    bool do_resize, do_rescale, do_normalize, do_center_crop;
    double rescale_factor;
    double image_mean[3], image_std[3];
    uint32_t height, width;            /* GEMMA3, SIGLIP: size.height / size.width */
    uint32_t shortest_edge;            /* CLIP: size.shortest_edge */
    uint32_t crop_height, crop_width;  /* CLIP: crop_size */
    uint64_t min_pixels, max_pixels;   /* QWEN2VL: min_pixels / size.shortest_edge, ... */
    uint32_t patch_size, temporal_patch_size, merge_size;  /* QWEN2VL; patch_size also LLaVA */
    bool do_pan_and_scan;              /* GEMMA3 (Gemma3Processor's defaults below) */
    uint32_t pas_min_crop_size, pas_max_num_crops;
    double pas_min_ratio;
    uint32_t image_seq_length;         /* GEMMA3: tokens per image (processor_config.json) */
    uint32_t num_additional_image_tokens;  /* CLIP/LLaVA: processor_config.json's (1: CLS) */
    bool drop_cls;                     /* LLaVA: vision_feature_select_strategy "default" */
    uint32_t longest_edge;             /* PIXTRAL, IDEFICS3: size.longest_edge */
    uint32_t spatial_merge_size;       /* PIXTRAL: processor_config.json's (1 for Pixtral-12B) */
    uint32_t max_image_size;           /* IDEFICS3: max_image_size.longest_edge (tile side) */
    bool do_image_splitting;           /* IDEFICS3 */
};

/* The processor's output for one image (caller-owned; image_pixels_free releases it). */
struct image_pixels {
    float *pixel_values;     /* malloc'd, layout above */
    size_t n_values;
    uint32_t n_images;       /* fixed-size processors: 1 + num_crops */
    uint32_t channels, height, width;  /* fixed-size processors: one image's shape */
    uint32_t n_patches, patch_dim;     /* QWEN2VL */
    uint32_t grid_t, grid_h, grid_w;   /* QWEN2VL: image_grid_thw; PIXTRAL: 1, H / patch, W / patch */
    uint32_t num_crops;      /* GEMMA3 pan-and-scan */
    uint32_t rows, cols;     /* IDEFICS3: the tile grid (0, 0: not split) */
    uint32_t n_image_tokens; /* image tokens the prompt expansion inserts for this image */
};

/* Defaults for kind (the processor class's own defaults), backend torchvision. */
void image_proc_config_default(struct image_proc_config *cfg, enum image_proc_kind kind);

/* Parse a preprocessor_config.json document (or processor_config.json: its "image_processor"
 * object is read, its top-level image_seq_length / patch_size / num_additional_image_tokens /
 * vision_feature_select_strategy too). The class comes from "image_processor_type" (a
 * "Fast"/"Pil" suffix ignored), else from model_type ("gemma3", "qwen2_vl", "qwen2_5_vl",
 * "qwen3_vl", "llava", "siglip"; NULL: none). Unknown class -> ERR_UNSUPPORTED; a number out
 * of its bounds or of the wrong type -> ERR_CONFIG naming the key. */
int image_proc_config_parse(struct image_proc_config *cfg, const char *json, size_t n,
                            const char *model_type, struct err *e);

/* A checkpoint folder: processor_config.json's "image_processor" when present, else
 * preprocessor_config.json, each merged as transformers does (the processor's own keys from
 * processor_config.json too). ERR_MISSING when neither file exists. */
int image_proc_config_load(struct image_proc_config *cfg, const char *dir, const char *model_type,
                           struct err *e);

/* Run cfg's processor on one decoded image (RGB bytes as image_decode makes them: EXIF
 * orientation applied, alpha dropped). On failure out is left empty. */
int image_preprocess(struct image_pixels *out, const struct image_proc_config *cfg,
                     const struct image *im, struct err *e);

void image_pixels_free(struct image_pixels *px);

/* ---- prompt expansion ----
 * What one image placeholder of the chat template's output becomes, as token ids. The ids come
 * from the tokenizer (this layer has none); text pieces the processor inserts ("\n\n" around a
 * Gemma 3 image, its pan-and-scan sentences) are passed already encoded. transformers builds
 * the expansion as text and tokenizes the whole prompt: a text piece at the edge of the span
 * can merge with the user's neighbouring text there, so a caller that needs transformers' ids
 * exactly tokenizes image_prompt_text's output instead. */
struct image_prompt_ids {
    int32_t image;         /* Gemma <image_soft_token>, Qwen <|image_pad|>, LLaVA <image> */
    int32_t boi, eoi;      /* Gemma <start_of_image> / <end_of_image>; -1 where unused */
    const int32_t *nl2;    /* Gemma: the ids of "\n\n" */
    size_t n_nl2;
    const int32_t *pas_intro, *pas_crops, *space;  /* Gemma pan-and-scan: "Here is the original
                                                    * image ", " and here are some crops to help
                                                    * you see better ", " " */
    size_t n_pas_intro, n_pas_crops, n_space;
    int32_t img_break, img_end;        /* Pixtral [IMG_BREAK] / [IMG_END] */
    int32_t fake_around, global_img;   /* Idefics3 <fake_token_around_image> / <global-img> */
    const int32_t *row_col;            /* Idefics3: id of <row_{r+1}_col_{c+1}> at [r * dim + c] */
    uint32_t row_col_dim;
    const int32_t *nl;                 /* Idefics3: the ids of "\n" (nl2: of "\n\n") */
    size_t n_nl;
};

/* The strings of the same pieces, for image_prompt_text. */
struct image_prompt_strings {
    const char *image, *boi, *eoi;  /* e.g. "<image_soft_token>", "<start_of_image>", ... */
    const char *img_break, *img_end;    /* Pixtral */
    const char *fake_around, *global_img;  /* Idefics3 (rows and columns: "<row_R_col_C>") */
};

/* Write the ids for one placeholder into out[cap], *n_out = their count (ERR_RANGE when cap is
 * too small: *n_out then says how many are needed). */
int image_prompt_expand(int32_t *out, size_t cap, size_t *n_out, const struct image_proc_config *cfg,
                        const struct image_pixels *px, const struct image_prompt_ids *ids,
                        struct err *e);

/* The replacement text of one placeholder as transformers' processor writes it (malloc'd NUL-
 * terminated *out). */
int image_prompt_text(char **out, const struct image_proc_config *cfg, const struct image_pixels *px,
                      const struct image_prompt_strings *s, struct err *e);

#ifdef __cplusplus
}
#endif
