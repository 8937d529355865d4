/*
 * vision: the image side of a multimodal checkpoint (ADR 0087). A family of image-text
 * models (vision.def: one line per wrapper model_type, e.g. "gemma3") loads its vision tower
 * and projector beside the text model ADR 0080 loads, into struct vision (owned by struct
 * model: m->vision, NULL for a text model), and encodes images into rows of the text
 * model's embedding space: pixel_values (what the image processor gives) in, for each
 * image tokens_per_image rows of n_embd floats out, in backend memory. The engine then
 * puts those rows in place of the image placeholder tokens' embeddings (batch.h, struct
 * batch_image) during the prompt's prefill.
 *
 *   vision_load    model_load calls it for a wrapper with a vision family: parses the
 *                  whole config.json (vision_config, projector keys, image token ids) and
 *                  binds the tower's tensors; a checkpoint without them (a text-only
 *                  extraction) loads as text (m->vision stays NULL, a warning says so)
 *   vision_ctx     the activations of one image on a backend (its own allocation: encoding
 *                  runs between forward calls, never inside one)
 *   vision_encode  n images -> n * tokens_per_image rows
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model.h"
#include "vision_blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What prompt building and the engine need to know about a model's images. */
struct vision_info {
    int tokens_per_image;       /* embedding rows per image (Gemma 3: mm_tokens_per_image) */
    int image_size;             /* pixel_values of one image: [n_channels, image_size, image_size] */
    int n_channels;
    int32_t image_token_id;     /* the placeholder each image row replaces */
    int32_t boi_token_id, eoi_token_id;  /* tokens around an image's rows (-1: none) */
    bool bidirectional;         /* the text model attends bidirectionally among one image's
                                 * rows during prefill (Gemma 3's token_type_ids mask) */
    /* Images of their own size (Qwen2-VL, Qwen2.5-VL; ADR 0095): merge > 0, and each image comes
     * as the processor's patch rows with its grid (t, h, w) in patches: t h w / merge² rows out,
     * turned by M-RoPE (the text model's mrope_section). tokens_per_image and image_size are 0. */
    int merge;                  /* spatial_merge_size; 0: fixed-size images */
    int patch_dim;              /* values of one patch row: channels x temporal_patch_size x p² */
    int patch_size, temporal_patch_size;
    int max_patches;            /* the most patches of one image the tower takes */
    /* DeepStack (Qwen3-VL, ADR 0120): the tower also gives each image row n_deepstack more rows
     * of n_embd, added to the row's hidden state after decoder layers 0 .. n_deepstack - 1;
     * 0: none */
    int n_deepstack;
    /* Pixtral / Mistral 3 (ADR 0123): an image's run of rows holds, besides its image tokens, a
     * break token ending each row of merged patches and the end token last ([IMG_BREAK],
     * [IMG_END]); the tower writes the whole run, those rows as the text model's embeddings of
     * them (vision_image_run). false: a run is image tokens only (the ids below unused). */
    bool row_breaks;
    int32_t break_token_id, end_token_id;
};

struct vision;
struct vision_ctx;

struct vision_ops {
    const char *model_type;     /* the wrapper's config.json model_type */
    const char *description;    /* one line */
    /* The text family `mlxcel arch` shows where no "<model_type>_text" one is registered (LLaVA:
     * text_config's model_type, llama by default); NULL: that one. */
    const char *text_family;
    /* Parse cfg (the whole config.json) and bind the tower and projector from m->st (with
     * m->hp.quant), filling v->info, v->vh, v->vw and v->family: 0, or 1 (e->msg saying what
     * is absent) when the checkpoint holds no vision tower at all; any error of a tower that
     * is there (a missing tensor among them) is returned as it is. */
    int (*load)(struct vision *v, struct model *m, const cJSON *cfg, struct err *e);
    void (*free_family)(struct vision *v);
    /* Every weight view besides the ViT's (projector) for model_prepare. */
    void (*each_weight)(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear), void *ud);
    /* The family's buffers of one image in vc (vc->fam), and their release. */
    int (*ctx_new)(struct vision_ctx *vc, struct err *e);
    void (*ctx_free)(struct vision_ctx *vc);
    /* One image: pixels [C, S, S] host -> out [tokens_per_image, n_embd] backend memory. */
    void (*encode_one)(struct vision_ctx *vc, float *out, const float *pixels);
    /* info.merge > 0: one image of grid_thw patches, pixels [t h w, patch_dim] host -> out
     * [1 + n_deepstack][t h w / merge², n_embd] backend memory: the rows that replace the
     * image tokens, then each deepstack plane (its buffers grown to the image in vc->fam). */
    int (*encode_grid)(struct vision_ctx *vc, float *out, const float *pixels, const int32_t *grid_thw,
                       struct err *e);
    /* info.merge > 0, optional: the rows one image of grid_thw makes, or -ERR_ARG (e says why);
     * NULL: h w / merge² with the sides multiples of merge (Qwen). */
    int (*grid_tokens)(const struct vision *v, const int32_t *grid_thw, struct err *e);
};

struct vision {
    const struct vision_ops *ops;
    struct vision_info info;
    struct vit_hparams vh;
    struct vit_weights vw;
    void *family;               /* the family's weights (Gemma 3's projector), owned */
};

struct vision_ctx {
    const struct model *m;      /* borrowed */
    struct backend *be;         /* borrowed */
    struct vit_ctx *vit;        /* the tower's activations (vit->b.x: the last image's
                                 * last_hidden_state after vision_encode), owned */
    void *fam;                  /* the family's buffers, owned through ops->ctx_free */
    /* info.merge > 0: the last image's last ViT block output [n_hidden, Dv] (backend memory in
     * fam; Qwen2.5-VL: in its window order), for tests */
    const float *hidden;
    int n_hidden;
};

/* The vision family of a wrapper model_type, or NULL. A family's load may hand v to the ops of
 * a variant (LLaVA whose vision_config is pixtral: v->ops becomes llava_pixtral_vision_ops);
 * every later call goes through v->ops. */
const struct vision_ops *vision_find(const char *model_type);
/* The vision families of vision.def, in order (for `mlxcel arch`). */
size_t vision_count(void);
const struct vision_ops *vision_at(size_t i);

/* model_load's step for a multimodal checkpoint whose wrapper has a vision family:
 * m->vision loaded, or left NULL (with a warning) when the checkpoint has no tower. */
int vision_load(struct model *m, const cJSON *cfg, struct err *e);
void vision_free(struct vision *v);

/* Every weight view of v for model_prepare (fn once per present tensor). */
void vision_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear), void *ud);

int vision_ctx_new(struct vision_ctx **out, const struct model *m, struct backend *be, struct err *e);
void vision_ctx_free(struct vision_ctx *vc);

/* n_img images, pixels [n_img, C, S, S] (host, float32 as the processor gives them) ->
 * out [n_img * tokens_per_image, n_embd] (backend memory the caller owns). Synchronizes
 * the backend (its error is returned). -ERR_ARG for a model without vision. */
int vision_encode(struct vision_ctx *vc, float *out, const float *pixels, int n_img, struct err *e);

/* M-RoPE positions of a prompt (ADR 0094), as transformers' get_rope_index computes them for
 * images: a text row at rope position p takes (p, p, p) and the next p + 1; image k's run of
 * grid[2k] x grid[2k+1] image tokens (its merged rows and columns; the prompt's k-th run of
 * image_token_id), starting at p, takes (p, p + r, p + c) row-major, and the text after it
 * p + max(rows, columns). pos3 [n][3]; *delta = the next rope position minus n (what a later
 * text row adds to its position). ERR_ARG when the image tokens are not exactly the images'
 * runs in order. */
int vision_mrope_positions(int32_t *pos3, int32_t *delta, const int32_t *ids, int n, int32_t image_token_id,
                           const int32_t *grid, int n_img, struct err *e);

/* Images of their own size (info.merge > 0): the rows one image of grid_thw (t, h, w patches)
 * makes, or -ERR_ARG (e says why) when the grid does not fit the tower: h and w multiples of
 * merge, at most max_patches, t 1 (a still image). */
int vision_grid_tokens(const struct vision *v, const int32_t *grid_thw, struct err *e);
/* One such image: pixels [t h w, patch_dim] (host, as the processor gives them) -> out
 * [1 + n_deepstack][vision_grid_tokens, n_embd] (backend memory the caller owns,
 * vision_image_floats of it): the image's rows, then its deepstack planes (ADR 0120).
 * Synchronizes the backend. */
int vision_encode_grid(struct vision_ctx *vc, float *out, const float *pixels, const int32_t *grid_thw,
                       struct err *e);

/* Whether id is a row of an image's run: the image token, or with row_breaks the break and end
 * tokens. */
bool vision_is_image_row(const struct vision_info *vi, int32_t id);
/* The length of the image run starting at ids[0] (0 when ids[0] is not the image token): the
 * image tokens that follow; with row_breaks, image and break tokens up to and including the
 * first end token (a run without its end token stops at the last image row). */
size_t vision_image_run(const struct vision_info *vi, const int32_t *ids, size_t n);

/* Bytes of one image's pixel_values, and of its rows of embeddings. */
size_t vision_pixel_bytes(const struct vision *v);
size_t vision_embd_bytes(const struct model *m);
/* Floats of an encoded image of n_tok rows: its rows and its deepstack planes, (1 +
 * info.n_deepstack) n_tok n_embd (what vision_encode_grid writes). */
size_t vision_image_floats(const struct model *m, int n_tok);

#ifdef __cplusplus
}
#endif
