/*
 * vision_blocks: the vision transformer (ViT) every image tower is made of, over the
 * backend ops and the decoder's blocks (blocks.h), so a GPU backend runs it unchanged.
 *
 *   patches  the image cut into p x p patches on the host (im2col, in the order the
 *            stored conv weight reads them), one row of C p p values per patch
 *   embed    x = patches · W_patchᵀ + b (the stride-p convolution as one product)
 *            + the learned position embedding of each patch
 *   layers   pre-LN blocks with biases: x += wo(attn(ln1(x))); x += fc2(act(fc1(ln2(x))))
 *            attention bidirectional over the image's patches (kv_rows.span covers them)
 *   post     post_layernorm (SigLIP's last_hidden_state)
 *
 * A layer is a struct layer (model.h) bound as a decoder layer would be: attn_norm(_b) the
 * first LayerNorm, wq/wk/wv/wo with bq/bk/bv/bo, ffn_norm(_b) the second, up/up_b = fc1,
 * down/down_b = fc2; blk_attention and blk_mlp run it. SigLIP (Gemma 3, Idefics3, PaliGemma)
 * is what binds today; CLIP (LLaVA: pre_layrnorm, quick_gelu), Qwen2-VL (2-D rope, window
 * attention) and Pixtral (2-D rope) towers reuse the same layer walk with their own
 * embedding and attention options.
 */
#pragma once
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../loading/wmap.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tower's shape. */
struct vit_hparams {
    int n_embd, n_head, head_dim, n_ff, n_layer;
    int image_size, patch_size, n_channels;
    int side;                 /* patches per side: image_size / patch_size */
    int n_patch;              /* side * side */
    float norm_eps;           /* layer_norm_eps */
    enum act_kind act;        /* hidden_act (unused when quick_gelu) */
    bool quick_gelu;          /* hidden_act "quick_gelu": x sigmoid(1.702 x) (CLIP) */
    bool cls;                 /* a class-embedding row before the patches (CLIP) */
    int n_pos;                /* rows through the tower: n_patch + cls */
};

/* How the patch embedding's conv weight is stored: torch's [out, C, p, p], or MLX's
 * [out, p, p, C] (mlx-vlm transposes conv weights to channels-last). */
enum vit_patch_layout { VIT_PATCH_CHW = 0, VIT_PATCH_HWC = 1 };

struct vit_weights {
    struct tensor patch_w;    /* [n_embd, C p p]: the conv weight as a matrix (a view) */
    struct tensor patch_b;    /* [n_embd] */
    struct tensor pos_embd;   /* [n_pos, n_embd] */
    struct tensor class_embd; /* [1, n_embd] (CLIP; absent: no class row) */
    struct tensor pre_norm, pre_norm_b;    /* [n_embd] CLIP's pre_layrnorm (absent: none) */
    struct layer *layers;     /* [n_layer], owned */
    struct tensor post_norm, post_norm_b;  /* [n_embd] (absent: none) */
    enum vit_patch_layout layout;
};

/* Where a checkpoint keeps its ViT and the projector beside it, as transformers 4 / mlx-vlm
 * (vision_tower.vision_model.*, the CLIP / SigLIP VisionModel wrapper) and transformers 5.17
 * (vision_tower.* the transformer itself) name them, with or without "model.": the index of
 * the layout whose embeddings.patch_embedding.weight is there and its two prefixes
 * (*tower, *proj: "...multi_modal_projector."), or -1 (no tower: not an image-text checkpoint
 * of this layout). */
int vit_find_tower(struct wmap *w, const char **tower, const char **proj);

/* SigLIP's vision_config (SiglipVisionConfig defaults for absent keys): hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads, num_channels, image_size,
 * patch_size, layer_norm_eps, hidden_act. Sizes are bounded (an untrusted config). */
int vit_parse_siglip(struct vit_hparams *vh, const cJSON *vc, struct err *e);

/* Idefics3's / SmolVLM's vision_config: SigLIP's keys with Idefics3VisionConfig's defaults
 * (hidden 1152, intermediate 3072, 12 layers, 16 heads, image 224, patch 32). */
int vit_parse_idefics3(struct vit_hparams *vh, const cJSON *vc, struct err *e);

/* Idefics3VisionEmbeddings' position ids of an image of nb_h x nb_w patches on a table of
 * side x side positions (NaViT-style: fractional coordinates bucketed into the side's grid),
 * out [nb_h * nb_w] row-major, computed in the float32 arithmetic of transformers' torch
 * expression (arange, 1 / nb, bucketize right=True), with aten's vectorized arange of `lanes`
 * floats (8: what torch 2.11 runs on AVX2 and AVX-512 CPUs; 0: scalar only). For some sides a full grid is not 0..n-1.
 * -ERR_ARG when sizes are out of range (side at most 128, nb within side). */
int vit_bucket_positions(int32_t *out, int nb_h, int nb_w, int side, int lanes);

/* CLIP's vision_config (CLIPVisionConfig defaults: hidden 768, intermediate 3072, 12 layers,
 * 12 heads, image 224, patch 32, quick_gelu, layer_norm_eps 1e-5), with the class row. */
int vit_parse_clip(struct vit_hparams *vh, const cJSON *vc, struct err *e);
/* The wrapper config's vision_feature_layer (LLaVA, Mistral 3): hidden_states[k] of a tower of
 * n_layer blocks (0: the embeddings; negative from the end), def when absent or null, as the
 * number of blocks to run, into *blocks. A list of layers is refused (-ERR_UNSUPPORTED), a
 * non-integer or an index outside [-(n_layer + 1), n_layer] is -ERR_CONFIG. */
int vit_feature_layer(const cJSON *cfg, int n_layer, int def, int *blocks, struct err *e);

/* CLIPVisionTransformer's tensors under prefix (e.g. "vision_tower.vision_model."):
 * embeddings.{class_embedding, patch_embedding (no bias), position_embedding [n_pos, D]},
 * pre_layrnorm, encoder.layers.N (as SigLIP's) for N < vh->n_layer. post_layernorm is not
 * bound: callers of CLIP take hidden_states[k] (LLaVA's vision_feature_layer), which it never
 * touches; a family that keeps fewer layers sets vh->n_layer before mapping. */
int vit_map_clip(struct vit_weights *vw, struct wmap *w, const struct vit_hparams *vh, const char *prefix,
                 struct err *e);

/* SiglipVisionTransformer's tensors under prefix (e.g. "vision_tower.vision_model."):
 * embeddings.{patch_embedding, position_embedding}, encoder.layers.N.{layer_norm1,
 * self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}, post_layernorm. The layers
 * array is allocated here (vit_weights_free). */
int vit_map_siglip(struct vit_weights *vw, struct wmap *w, const struct vit_hparams *vh,
                   const char *prefix, struct err *e);
void vit_weights_free(struct vit_weights *vw);

/* Every weight view of the tower for model_prepare (fn called once per present tensor,
 * linear: read by linear products only). */
void vit_each_weight(struct vit_weights *vw, const struct vit_hparams *vh,
                     void (*fn)(void *ud, struct tensor *t, bool linear), void *ud);

/* Activations of one image through the tower, in one backend allocation. */
struct vit_ctx {
    const struct vit_hparams *vh;     /* borrowed */
    const struct vit_weights *vw;     /* borrowed */
    struct backend *be;               /* borrowed */
    void *arena;                      /* owned backend memory */
    struct ctx_bufs b;                /* x, xn, qkv, att, o, f, h, h1: [n_pos, ...] */
    struct kv_layer kv;               /* the image's K/V of the layer being run (F32) */
    struct kv_rows rows;              /* positions, slots, one table, spans of every patch */
    float *patches;                   /* [n_patch, C p p] backend */
    float *patches_host;              /* [n_patch, C p p] host staging, owned */
    const int32_t *pos_ids;           /* backend [n_pos]: each row's position-embedding row, set
                                       * by a family that has its own (Idefics3); NULL: 0..n_pos-1 */
};

int vit_ctx_new(struct vit_ctx **out, const struct vit_hparams *vh, const struct vit_weights *vw,
                struct backend *be, struct err *e);
void vit_ctx_free(struct vit_ctx *vc);

/* One image through the tower: pixels [C, S, S] (host, as the image processor gives
 * pixel_values) -> vc->b.x [n_pos, n_embd] (backend memory, post_layernorm applied where
 * bound; CLIP: the class row first).
 * Ops may fail asynchronously (backend_sync). */
void vit_forward(struct vit_ctx *vc, const float *pixels);

#ifdef __cplusplus
}
#endif
