/*
 * gemma3_vision: Gemma 3's image side (Gemma3ForConditionalGeneration), as transformers'
 * modeling_gemma3.py computes it:
 *
 *   tower      SigLIP (vision_blocks.c): last_hidden_state [side², Dv], side = image/patch
 *   projector  Gemma3MultiModalProjector: the patch grid average-pooled k x k (k = side /
 *              tokens_per_side, tokens_per_side = sqrt(mm_tokens_per_image)) into
 *              mm_tokens_per_image rows (row-major over the pooled grid); mm_soft_emb_norm,
 *              an RMSNorm with Gemma's (1 + w) weight and the tower's layer_norm_eps; then
 *              x · mm_input_projection_weight [Dv, n_embd] (a Parameter, not a Linear: stored
 *              [in, out], kept here as an owned transposed copy for the linear op)
 *   language   the rows replace the embeddings of the image_token_index tokens as they are:
 *              Gemma's sqrt(hidden) scaling is in its embedding module, which image rows never
 *              pass (Gemma3Model.forward's masked_scatter); during prefill the image's tokens
 *              attend to each other bidirectionally in every layer, sliding or full
 *              (token_type_ids: create_causal_mask_mapping's or_mask_function)
 *
 * Tensors: transformers 5's model.vision_tower[.vision_model].* / model.multi_modal_projector.*,
 * or transformers 4's and mlx-vlm's vision_tower.vision_model.* / multi_modal_projector.*
 * (mlx-vlm keeps them float beside a quantized text model and stores the patch conv
 * channels-last).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "vision.h"

struct gemma3_proj {
    struct tensor norm;        /* mm_soft_emb_norm.weight [Dv] */
    struct tensor proj_t;      /* [n_embd, Dv]: mm_input_projection_weight transposed, owned */
    int tokens_side, kernel;   /* pooled grid side, pooling window */
};

struct gemma3_bufs {
    void *arena;
    float *pooled, *tmp;       /* [T, Dv] */
    int32_t *idx;              /* [k², T]: the patch of each token at each window offset */
};

/* transformers Gemma3Config defaults */
#define G3_MM_TOKENS 256
#define G3_IMAGE_TOKEN 262144
#define G3_BOI 255999
#define G3_EOI 256000

static int parse_ids(struct vision *v, const struct model *m, const cJSON *cfg, struct err *e)
{
    int img, boi, eoi, rc;
    /* image_token_index, or image_token_id (its attribute_map alias) where a config spells it so */
    if ((rc = cfg_opt_int(cfg, "image_token_id", G3_IMAGE_TOKEN, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "image_token_index", img, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "boi_token_index", G3_BOI, &boi, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "eoi_token_index", G3_EOI, &eoi, e)) < 0)
        return rc;
    int V = m->hp.n_vocab;
    if (img < 0 || img >= V || boi < 0 || boi >= V || eoi < 0 || eoi >= V)
        return err_setf(e, ERR_CONFIG, "image_token_index %d, boi_token_index %d, eoi_token_index %d "
                        "must be inside the vocabulary [0, %d)", img, boi, eoi, V);
    v->info.image_token_id = img;
    v->info.boi_token_id = boi;
    v->info.eoi_token_id = eoi;
    return 0;
}

static int parse_pool(struct vision *v, struct gemma3_proj *gp, const cJSON *cfg, struct err *e)
{
    int mm, rc;
    if ((rc = cfg_opt_int(cfg, "mm_tokens_per_image", G3_MM_TOKENS, &mm, e)) < 0)
        return rc;
    int ts = mm > 0 ? (int)floor(sqrt((double)mm)) : 0;
    /* AvgPool2d(k, stride k) over the side x side grid gives (side / k)² rows: the config
     * must make that mm_tokens_per_image exactly, or the rows would not fill the placeholders */
    if (mm < 1 || ts * ts != mm || v->vh.side % ts != 0)
        return err_setf(e, ERR_CONFIG, "mm_tokens_per_image %d must be a square whose side divides the "
                        "%d x %d patch grid", mm, v->vh.side, v->vh.side);
    gp->tokens_side = ts;
    gp->kernel = v->vh.side / ts;
    v->info.tokens_per_image = mm;
    return 0;
}

/* The projection [Dv, n_embd] as stored, copied transposed into memory m owns, in its
 * dtype (a 2- or 4-byte float). */
static int map_projection(struct gemma3_proj *gp, struct model *m, struct wmap *w, const char *pre,
                          int64_t dv, struct err *e)
{
    struct tensor t;
    int64_t D = m->hp.n_embd, shape[2] = {dv, D};
    int rc = wm_tensor(w, &t, WM_REQUIRED, 2, shape, e, "%smm_input_projection_weight", pre);
    if (rc < 0)
        return rc;
    size_t es = dtype_size(t.dtype);
    if (t.qbits || (es != 2 && es != 4) || !tensor_is_contiguous(&t))
        return err_setf(e, ERR_UNSUPPORTED, "%smm_input_projection_weight: a quantized or strided "
                        "projection is not supported", pre);
    if (st_set_is_recording(w->st))  /* synth: the shape is recorded, there are no values to copy */
        return 0;
    char *dst;
    if ((rc = model_alloc_owned(m, (size_t)(dv * D) * es, (void **)&dst, e)) < 0)
        return rc;
    const char *src = t.data;
    for (int64_t i = 0; i < dv; i++)
        for (int64_t j = 0; j < D; j++)
            memcpy(dst + ((size_t)j * dv + i) * es, src + ((size_t)i * D + j) * es, es);
    int64_t ts[2] = {D, dv};
    tensor_init(&gp->proj_t, t.dtype, dst, 2, ts);
    gp->proj_t.name = t.name;
    return 0;
}

static int gemma3_vision_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    /* the layouts of transformers 4 / mlx-vlm and 5.17 (vit_find_tower) */
    struct wmap w = {m->st, &m->hp.quant};
    const char *tower = NULL, *proj = NULL;
    int rc;
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
    if (vit_find_tower(&w, &tower, &proj) < 0) {
        err_setf(e, ERR_MISSING, "no vision_tower.embeddings.patch_embedding.weight");
        return 1;
    }
    if (!cJSON_IsObject(vc))
        return err_setf(e, ERR_CONFIG, "the vision tower's tensors are there but config.json has no "
                        "vision_config object");
    struct gemma3_proj *gp = calloc(1, sizeof *gp);
    if (!gp)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->family = gp;
    if ((rc = vit_parse_siglip(&v->vh, vc, e)) < 0 || (rc = parse_pool(v, gp, cfg, e)) < 0 ||
        (rc = parse_ids(v, m, cfg, e)) < 0)
        return rc;
    v->info.image_size = v->vh.image_size;
    v->info.n_channels = v->vh.n_channels;
    v->info.bidirectional = true;
    if ((rc = vit_map_siglip(&v->vw, &w, &v->vh, tower, e)) < 0 ||
        (rc = wm_vec(&w, &gp->norm, WM_REQUIRED, v->vh.n_embd, e, "%smm_soft_emb_norm.weight",
                     proj)) < 0 ||
        (rc = map_projection(gp, m, &w, proj, v->vh.n_embd, e)) < 0)
        return rc;
    return 0;
}

static void gemma3_vision_free_family(struct vision *v)
{
    free(v->family);
    v->family = NULL;
}

static void gemma3_vision_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear),
                                      void *ud)
{
    struct gemma3_proj *gp = v->family;
    fn(ud, &gp->norm, false);
    fn(ud, &gp->proj_t, true);
}

static int gemma3_vision_ctx_new(struct vision_ctx *vc, struct err *e)
{
    const struct vision *v = vc->m->vision;
    const struct gemma3_proj *gp = v->family;
    int T = v->info.tokens_per_image, k = gp->kernel, ts = gp->tokens_side, side = v->vh.side;
    size_t dv = (size_t)v->vh.n_embd, kk = (size_t)k * k;
    size_t rows = (((size_t)T * dv + 15) & ~(size_t)15) * sizeof(float);
    size_t bytes = 2 * rows + kk * T * sizeof(int32_t);
    struct gemma3_bufs *gb = calloc(1, sizeof *gb);
    int32_t *idx = malloc(kk * T * sizeof *idx);
    int rc;
    if (!gb || !idx) {
        free(gb);
        free(idx);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    vc->fam = gb;
    if ((rc = vc->be->ops->buf_alloc(vc->be, bytes, &gb->arena, e)) < 0) {
        free(idx);
        return rc;
    }
    gb->pooled = gb->arena;
    gb->tmp = (float *)((char *)gb->arena + rows);
    gb->idx = (int32_t *)((char *)gb->arena + 2 * rows);
    /* window offset (dy, dx) of pooled token (ty, tx): patch (ty k + dy) side + tx k + dx */
    for (int dy = 0; dy < k; dy++)
        for (int dx = 0; dx < k; dx++)
            for (int ty = 0; ty < ts; ty++)
                for (int tx = 0; tx < ts; tx++)
                    idx[((size_t)dy * k + dx) * T + (size_t)ty * ts + tx] = (ty * k + dy) * side + tx * k + dx;
    vc->be->ops->upload(vc->be, gb->idx, idx, kk * T * sizeof *idx);
    rc = backend_sync(vc->be, e);
    free(idx);
    return rc;
}

static void gemma3_vision_ctx_free(struct vision_ctx *vc)
{
    struct gemma3_bufs *gb = vc->fam;
    if (gb->arena)
        vc->be->ops->buf_free(vc->be, gb->arena);
    free(gb);
    vc->fam = NULL;
}

static void gemma3_vision_encode_one(struct vision_ctx *vc, float *out, const float *pixels)
{
    const struct vision *v = vc->m->vision;
    const struct gemma3_proj *gp = v->family;
    const struct gemma3_bufs *gb = vc->fam;
    const struct backend_ops *op = vc->be->ops;
    int T = v->info.tokens_per_image, dv = v->vh.n_embd, kk = gp->kernel * gp->kernel;

    /* 1. the tower: [side², Dv] in vit->b.x */
    vit_forward(vc->vit, pixels);
    const float *x = vc->vit->b.x;
    /* 2. average pooling: the k² patches of each token summed, then divided (AvgPool2d) */
    op->gather(vc->be, gb->pooled, x, dv, gb->idx, 1, T, dv);
    for (int j = 1; j < kk; j++) {
        op->gather(vc->be, gb->tmp, x, dv, gb->idx + (size_t)j * T, 1, T, dv);
        op->axpy(vc->be, gb->pooled, dv, 1.0f, gb->tmp, dv, T, dv);
    }
    if (kk > 1)
        op->scale(vc->be, gb->pooled, dv, 1.0f / (float)kk, T, dv);
    /* 3. mm_soft_emb_norm: RMSNorm, weight 1 + w, the tower's epsilon */
    op->rmsnorm(vc->be, gb->pooled, gb->pooled, dv, &gp->norm, 1.0f, v->vh.norm_eps, T, 1, dv);
    /* 4. into the text model's width */
    op->linear(vc->be, out, vc->m->hp.n_embd, gb->pooled, &gp->proj_t, NULL, T);
}

const struct vision_ops gemma3_vision_ops = {
    .model_type = "gemma3",
    .description = "Gemma 3: SigLIP tower, average-pooled to mm_tokens_per_image, soft-embedding "
                   "RMSNorm, projection; bidirectional attention within each image",
    .load = gemma3_vision_load,
    .free_family = gemma3_vision_free_family,
    .each_weight = gemma3_vision_each_weight,
    .ctx_new = gemma3_vision_ctx_new,
    .ctx_free = gemma3_vision_ctx_free,
    .encode_one = gemma3_vision_encode_one,
};
