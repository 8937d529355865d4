/*
 * llava_vision: LLaVA's image side (LlavaForConditionalGeneration), as transformers'
 * modeling_llava.py computes it (ADR 0110):
 *
 *   tower      CLIP (vision_blocks.c, vit_parse_clip / vit_map_clip): the class row, the patch
 *              rows, + position embeddings, pre_layrnorm, pre-LN blocks with quick_gelu;
 *              run only up to hidden_states[vision_feature_layer] (-2: the output of the last
 *              layer but one; post_layernorm is never applied to hidden_states), so later
 *              layers are neither bound nor run
 *   select     vision_feature_select_strategy "default" drops the class row (side² rows),
 *              "full" keeps it (side² + 1)
 *   projector  LlavaMultiModalProjector: linear_1 (Dv -> D), projector_hidden_act (gelu),
 *              linear_2 (D -> D), biases unless multimodal_projector_bias is false
 *   language   the rows replace the embeddings of the image_token_index tokens (masked_scatter),
 *              causal attention throughout (no image mask)
 *
 * Tensors: transformers 5.17's vision_tower.* (the CLIP transformer itself) /
 * multi_modal_projector.*, or transformers 4's and mlx-vlm's vision_tower.vision_model.*, each
 * also under "model."
 * (mlx-vlm stores the patch conv channels-last; vision_blocks reads either).
 * A list of feature layers (features of several layers concatenated, as VipLlava-style configs
 * give) is refused. A vision_config of model_type "pixtral" (Pixtral-12B) is pixtral_vision.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "vision.h"

struct llava_proj {
    struct tensor l1, l1_b, l2, l2_b;   /* linear_1 [D, Dv], linear_2 [D, D] and biases */
    enum act_kind act;
    bool drop_cls;                      /* strategy "default" */
    int feature_layer;                  /* hidden_states index, 0..n_layer (as configured) */
};

struct llava_bufs {
    void *arena;
    float *h;                           /* [T, D] */
};

/* transformers LlavaConfig defaults */
#define LLAVA_IMAGE_TOKEN 32000
#define LLAVA_FEATURE_LAYER (-2)

static int parse_proj_act(const char *name, enum act_kind *out, struct err *e)
{
    if (!strcmp(name, "gelu"))
        *out = ACT_GELU_ERF;
    else if (!strcmp(name, "gelu_pytorch_tanh") || !strcmp(name, "gelu_new") || !strcmp(name, "gelu_fast"))
        *out = ACT_GELU_TANH;
    else if (!strcmp(name, "silu") || !strcmp(name, "swish"))
        *out = ACT_SILU;
    else if (!strcmp(name, "relu"))
        *out = ACT_RELU;
    else
        return err_setf(e, ERR_UNSUPPORTED, "projector_hidden_act '%s' is not supported (gelu, "
                        "gelu_pytorch_tanh, silu, relu are)", name);
    return 0;
}

/* vision_feature_layer, vision_feature_select_strategy, projector_hidden_act, image_token_index. */
static int parse_top(struct vision *v, struct llava_proj *lp, const struct model *m, const cJSON *cfg,
                     struct err *e)
{
    int rc, img;
    if ((rc = vit_feature_layer(cfg, v->vh.n_layer, LLAVA_FEATURE_LAYER, &lp->feature_layer, e)) < 0)
        return rc;

    char strat[32], act[64];
    if ((rc = cfg_opt_str(cfg, "vision_feature_select_strategy", "default", strat, sizeof strat, e)) < 0)
        return err_prefix(e, "vision_feature_select_strategy");
    if (strcmp(strat, "default") && strcmp(strat, "full"))
        return err_setf(e, ERR_CONFIG, "vision_feature_select_strategy '%s' must be \"default\" or \"full\"",
                        strat);
    lp->drop_cls = strcmp(strat, "default") == 0;
    if ((rc = cfg_opt_str(cfg, "projector_hidden_act", "gelu", act, sizeof act, e)) < 0 ||
        (rc = parse_proj_act(act, &lp->act, e)) < 0)
        return rc;

    /* image_token_index, or image_token_id (its attribute_map alias; transformers 5 writes it) */
    if ((rc = cfg_opt_int(cfg, "image_token_index", LLAVA_IMAGE_TOKEN, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "image_token_id", img, &img, e)) < 0)
        return rc;
    if (img < 0 || img >= m->hp.n_vocab)
        return err_setf(e, ERR_CONFIG, "image_token_index %d must be inside the vocabulary [0, %d)", img,
                        m->hp.n_vocab);
    v->info.image_token_id = img;
    v->info.boi_token_id = v->info.eoi_token_id = -1;
    v->info.tokens_per_image = v->vh.n_patch + (lp->drop_cls ? 0 : 1);
    v->info.image_size = v->vh.image_size;
    v->info.n_channels = v->vh.n_channels;
    v->info.bidirectional = false;
    return 0;
}

/* LLaVA whose vision_config is pixtral (Pixtral-12B; pixtral_vision.c, ADR 0123) */
extern const struct vision_ops llava_pixtral_vision_ops;

static int llava_vision_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    const cJSON *vmt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"),
                                                        "model_type");
    if (cJSON_IsString(vmt) && !strcmp(vmt->valuestring, "pixtral")) {
        v->ops = &llava_pixtral_vision_ops;
        return v->ops->load(v, m, cfg, e);
    }
    /* the layouts of transformers 4 / mlx-vlm and 5.17 (vit_find_tower) */
    struct wmap w = {m->st, &m->hp.quant};
    const char *tower = NULL, *proj = NULL;
    int rc;
    if (vit_find_tower(&w, &tower, &proj) < 0) {
        err_setf(e, ERR_MISSING, "no vision_tower.vision_model.embeddings.patch_embedding.weight");
        return 1;
    }
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
    if (!cJSON_IsObject(vc))
        return err_setf(e, ERR_CONFIG, "the vision tower's tensors are there but config.json has no "
                        "vision_config object");
    struct llava_proj *lp = calloc(1, sizeof *lp);
    if (!lp)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->family = lp;
    if ((rc = vit_parse_clip(&v->vh, vc, e)) < 0 || (rc = parse_top(v, lp, m, cfg, e)) < 0)
        return rc;
    /* only the layers up to the selected hidden state run (and are bound) */
    v->vh.n_layer = lp->feature_layer;
    bool bias = true;
    if ((rc = cfg_opt_bool(cfg, "multimodal_projector_bias", true, &bias, e)) < 0)
        return rc;
    int64_t D = m->hp.n_embd, dv = v->vh.n_embd;
    const char *p = proj;
    if ((rc = vit_map_clip(&v->vw, &w, &v->vh, tower, e)) < 0 ||
        (rc = wm_linear(&w, &lp->l1, WM_REQUIRED, 0, D, dv, e, "%slinear_1", p)) < 0 ||
        (rc = wm_vec(&w, &lp->l1_b, bias, D, e, "%slinear_1.bias", p)) < 0 ||
        (rc = wm_linear(&w, &lp->l2, WM_REQUIRED, 0, D, D, e, "%slinear_2", p)) < 0 ||
        (rc = wm_vec(&w, &lp->l2_b, bias, D, e, "%slinear_2.bias", p)) < 0)
        return rc;
    return 0;
}

static void llava_vision_free_family(struct vision *v)
{
    free(v->family);
    v->family = NULL;
}

static void llava_vision_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear),
                                     void *ud)
{
    struct llava_proj *lp = v->family;
    fn(ud, &lp->l1, true);
    fn(ud, &lp->l2, true);
    if (tensor_is_present(&lp->l1_b))
        fn(ud, &lp->l1_b, false);
    if (tensor_is_present(&lp->l2_b))
        fn(ud, &lp->l2_b, false);
}

static int llava_vision_ctx_new(struct vision_ctx *vc, struct err *e)
{
    const struct vision *v = vc->m->vision;
    size_t T = (size_t)v->info.tokens_per_image, D = (size_t)vc->m->hp.n_embd;
    struct llava_bufs *lb = calloc(1, sizeof *lb);
    if (!lb)
        return err_setf(e, ERR_NOMEM, "out of memory");
    vc->fam = lb;
    int rc = vc->be->ops->buf_alloc(vc->be, T * D * sizeof(float), &lb->arena, e);
    if (rc < 0)
        return rc;
    lb->h = lb->arena;
    return 0;
}

static void llava_vision_ctx_free(struct vision_ctx *vc)
{
    struct llava_bufs *lb = vc->fam;
    if (lb->arena)
        vc->be->ops->buf_free(vc->be, lb->arena);
    free(lb);
    vc->fam = NULL;
}

static void llava_vision_encode_one(struct vision_ctx *vc, float *out, const float *pixels)
{
    const struct vision *v = vc->m->vision;
    const struct llava_proj *lp = v->family;
    const struct llava_bufs *lb = vc->fam;
    const struct backend_ops *op = vc->be->ops;
    int T = v->info.tokens_per_image, D = vc->m->hp.n_embd, dv = v->vh.n_embd;

    /* 1. the tower up to hidden_states[vision_feature_layer]: [1 + side², Dv] in vit->b.x */
    vit_forward(vc->vit, pixels);
    /* 2. "default": the patch rows only (the class row is row 0) */
    const float *x = vc->vit->b.x + (lp->drop_cls ? dv : 0);
    /* 3. linear_1, act, linear_2 */
    op->linear(vc->be, lb->h, D, x, &lp->l1, tensor_is_present(&lp->l1_b) ? &lp->l1_b : NULL, T);
    op->act(vc->be, lp->act, lb->h, D, T, D);
    op->linear(vc->be, out, D, lb->h, &lp->l2, tensor_is_present(&lp->l2_b) ? &lp->l2_b : NULL, T);
}

const struct vision_ops llava_vision_ops = {
    .model_type = "llava",
    .description = "LLaVA: CLIP tower to vision_feature_layer (class row dropped or kept), MLP "
                   "projector (linear, gelu, linear); text_config's language model, causal; a pixtral "
                   "vision_config (Pixtral-12B): the Pixtral tower at each image's own size",
    .text_family = "llama",
    .load = llava_vision_load,
    .free_family = llava_vision_free_family,
    .each_weight = llava_vision_each_weight,
    .ctx_new = llava_vision_ctx_new,
    .ctx_free = llava_vision_ctx_free,
    .encode_one = llava_vision_encode_one,
};
