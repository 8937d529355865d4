/*
 * idefics3_vision: the image side of Idefics3 (Idefics3ForConditionalGeneration) and SmolVLM
 * (SmolVLMForConditionalGeneration), as transformers' modeling_idefics3.py / modeling_smolvlm.py
 * compute it (ADR 0126):
 *
 *   tiles      the processor splits an image into tiles of image_size (rows x cols, then the whole
 *              image at one tile; Idefics3ImageProcessor, src/image/preprocess.c); each tile is one
 *              tower image here, in that order, as the prompt's runs of <image> tokens are
 *   tower      SigLIP-like (vision_blocks.c): patch conv with bias, + position_embedding at the
 *              bucketed position ids of Idefics3VisionEmbeddings (the tile's patch grid mapped onto
 *              the side x side table through float32 fractional coordinates: not 0..n-1 for
 *              every side), pre-LN blocks, post_layernorm (last_hidden_state)
 *   connector  Idefics3Connector: pixel_shuffle by scale_factor s (each s x s block of patches
 *              becomes one row of s² Dv values, the block's patches row-major), then
 *              modality_projection.proj, a Linear without bias -> (side / s)² rows of n_embd
 *   language   the rows replace the <image> tokens' embeddings in order (inputs_merger); causal
 *              attention throughout
 *
 * A tile the processor padded (all zeros, pixel_attention_mask 0) only appears when transformers
 * pads a batch of images to its largest tile count; images come here one at a time, so every
 * tile is a real one with every patch valid (ADR 0126 on the all-zero tile).
 *
 * Tensors: transformers' model.vision_model.* / model.connector.* (text: model.text_model.*,
 * lm_head.*), or mlx-vlm's vision_model.* (patch conv channels-last) / connector.* (text:
 * language_model.*).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "vision.h"

struct idefics3_conn {
    struct tensor proj;        /* modality_projection.proj.weight [n_embd, Dv s²] */
    int scale;                 /* scale_factor s */
};

struct idefics3_bufs {
    void *arena;
    float *shuf;               /* [T s², Dv] = [T, Dv s²]: the pixel-shuffled rows */
    int32_t *idx;              /* [T s²]: the patch of each shuffled row piece */
    int32_t *pos;              /* [n_patch]: the bucketed position ids */
};

/* transformers Idefics3Config / SmolVLMConfig defaults */
#define I3_IMAGE_TOKEN 128257
#define I3_SCALE 2
/* aten's CPU arange writes vectors of 8 floats (measured on the AVX-512 machine the references
 * came from: every grid of sides 1..96 equal with 8, not with 16); the published towers (sides
 * 26, 27, 32) give the same ids with any width (ADR 0126) */
#define I3_ARANGE_LANES 8

/* The tower, where transformers (model.vision_model.) or mlx-vlm (vision_model.) keep it. */
static const char *find_tower(struct wmap *w, const char **conn)
{
    if (wm_has(w, "model.vision_model.embeddings.patch_embedding.weight")) {
        *conn = "model.connector.";
        return "model.vision_model.";
    }
    if (wm_has(w, "vision_model.embeddings.patch_embedding.weight")) {
        *conn = "connector.";
        return "vision_model.";
    }
    return NULL;
}

static int parse_top(struct vision *v, struct idefics3_conn *ic, const struct model *m, const cJSON *cfg,
                     struct err *e)
{
    int rc, img, s;
    /* image_token_id (image_token_index: mlx-vlm's alias) */
    if ((rc = cfg_opt_int(cfg, "image_token_id", I3_IMAGE_TOKEN, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "image_token_index", img, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "scale_factor", I3_SCALE, &s, e)) < 0)
        return rc;
    if (img < 0 || img >= m->hp.n_vocab)
        return err_setf(e, ERR_CONFIG, "image_token_id %d must be inside the vocabulary [0, %d)", img,
                        m->hp.n_vocab);
    /* pixel_shuffle reshapes the side x side grid into (side / s)² rows of s² patches */
    if (s < 1 || s > v->vh.side || v->vh.side % s)
        return err_setf(e, ERR_CONFIG, "scale_factor %d must divide the tower's %d x %d patch grid", s,
                        v->vh.side, v->vh.side);
    ic->scale = s;
    v->info.image_token_id = img;
    v->info.boi_token_id = v->info.eoi_token_id = -1;
    v->info.tokens_per_image = (v->vh.side / s) * (v->vh.side / s);
    v->info.image_size = v->vh.image_size;
    v->info.n_channels = v->vh.n_channels;
    v->info.bidirectional = false;
    return 0;
}

static int idefics3_vision_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    struct wmap w = {m->st, &m->hp.quant};
    const char *conn = NULL, *tower = find_tower(&w, &conn);
    int rc;
    if (!tower) {
        err_setf(e, ERR_MISSING, "no vision_model.embeddings.patch_embedding.weight");
        return 1;
    }
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
    if (!cJSON_IsObject(vc))
        return err_setf(e, ERR_CONFIG, "the vision tower's tensors are there but config.json has no "
                        "vision_config object");
    struct idefics3_conn *ic = calloc(1, sizeof *ic);
    if (!ic)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->family = ic;
    if ((rc = vit_parse_idefics3(&v->vh, vc, e)) < 0 || (rc = parse_top(v, ic, m, cfg, e)) < 0)
        return rc;
    int64_t D = m->hp.n_embd, in = (int64_t)v->vh.n_embd * ic->scale * ic->scale;
    if ((rc = vit_map_siglip(&v->vw, &w, &v->vh, tower, e)) < 0 ||
        (rc = wm_linear(&w, &ic->proj, WM_REQUIRED, 0, D, in, e, "%smodality_projection.proj", conn)) < 0)
        return rc;
    return 0;
}

static void idefics3_vision_free_family(struct vision *v)
{
    free(v->family);
    v->family = NULL;
}

static void idefics3_vision_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear),
                                        void *ud)
{
    struct idefics3_conn *ic = v->family;
    fn(ud, &ic->proj, true);
}

/* pixel_shuffle as one gather: shuffled row t = (h2, w2) of the (side / s)² grid holds, at piece
 * j = dy s + dx, the patch (h2 s + dy, w2 s + dx) (x.view(h, w/s, s D), permute, reshape, permute,
 * reshape in Idefics3Connector.pixel_shuffle). */
static void shuffle_index(int32_t *idx, int side, int s)
{
    int so = side / s;
    for (int h2 = 0; h2 < so; h2++)
        for (int w2 = 0; w2 < so; w2++)
            for (int dy = 0; dy < s; dy++)
                for (int dx = 0; dx < s; dx++)
                    idx[((h2 * so + w2) * s + dy) * s + dx] = (h2 * s + dy) * side + w2 * s + dx;
}

static int idefics3_vision_ctx_new(struct vision_ctx *vc, struct err *e)
{
    const struct vision *v = vc->m->vision;
    const struct idefics3_conn *ic = v->family;
    int side = v->vh.side, P = v->vh.n_patch, s = ic->scale;
    size_t T = (size_t)v->info.tokens_per_image, dv = (size_t)v->vh.n_embd, n_idx = T * s * s;
    size_t rows = ((T * s * s * dv + 15) & ~(size_t)15) * sizeof(float);
    size_t idx_bytes = ((n_idx + 15) & ~(size_t)15) * sizeof(int32_t);
    struct idefics3_bufs *ib = calloc(1, sizeof *ib);
    int32_t *host = malloc((n_idx + (size_t)P) * sizeof *host);
    int rc;
    if (!ib || !host) {
        free(ib);
        free(host);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    vc->fam = ib;
    shuffle_index(host, side, s);
    /* every tile is whole: side x side patches on the side x side table */
    if (vit_bucket_positions(host + n_idx, side, side, side, I3_ARANGE_LANES) < 0) {
        free(host);
        return err_setf(e, ERR_CONFIG, "vision tower: %d patches a side is over the %d the position ids take",
                        side, 128);
    }
    if ((rc = vc->be->ops->buf_alloc(vc->be, rows + idx_bytes + (size_t)P * sizeof(int32_t), &ib->arena, e)) < 0) {
        free(host);
        return rc;
    }
    ib->shuf = ib->arena;
    ib->idx = (int32_t *)((char *)ib->arena + rows);
    ib->pos = (int32_t *)((char *)ib->arena + rows + idx_bytes);
    vc->be->ops->upload(vc->be, ib->idx, host, n_idx * sizeof *host);
    vc->be->ops->upload(vc->be, ib->pos, host + n_idx, (size_t)P * sizeof *host);
    rc = backend_sync(vc->be, e);
    free(host);
    vc->vit->pos_ids = ib->pos;
    return rc;
}

static void idefics3_vision_ctx_free(struct vision_ctx *vc)
{
    struct idefics3_bufs *ib = vc->fam;
    if (vc->vit)
        vc->vit->pos_ids = NULL;
    if (ib->arena)
        vc->be->ops->buf_free(vc->be, ib->arena);
    free(ib);
    vc->fam = NULL;
}

static void idefics3_vision_encode_one(struct vision_ctx *vc, float *out, const float *pixels)
{
    const struct vision *v = vc->m->vision;
    const struct idefics3_conn *ic = v->family;
    const struct idefics3_bufs *ib = vc->fam;
    const struct backend_ops *op = vc->be->ops;
    int T = v->info.tokens_per_image, dv = v->vh.n_embd, ss = ic->scale * ic->scale;

    /* 1. the tower over one tile: last_hidden_state [side², Dv] in vit->b.x */
    vit_forward(vc->vit, pixels);
    /* 2. pixel shuffle: [T s², Dv] rows gathered from the patches = [T, Dv s²] */
    op->gather(vc->be, ib->shuf, vc->vit->b.x, dv, ib->idx, 1, T * ss, dv);
    /* 3. modality_projection (no bias) into the text model's width */
    op->linear(vc->be, out, vc->m->hp.n_embd, ib->shuf, &ic->proj, NULL, T);
}

const struct vision_ops idefics3_vision_ops = {
    .model_type = "idefics3",
    .description = "Idefics3: image tiles through a SigLIP-like tower (bucketed position ids), "
                   "pixel-shuffle connector; text_config's language model, causal",
    .text_family = "llama",
    .load = idefics3_vision_load,
    .free_family = idefics3_vision_free_family,
    .each_weight = idefics3_vision_each_weight,
    .ctx_new = idefics3_vision_ctx_new,
    .ctx_free = idefics3_vision_ctx_free,
    .encode_one = idefics3_vision_encode_one,
};

/* SmolVLM is Idefics3's architecture under its own model_type (SmolVLMVisionTransformer,
 * SmolVLMConnector: the same modules and names). */
const struct vision_ops smolvlm_vision_ops = {
    .model_type = "smolvlm",
    .description = "SmolVLM: Idefics3's tower and pixel-shuffle connector (scale_factor 4 in the "
                   "published ones); text_config's language model, causal",
    .text_family = "llama",
    .load = idefics3_vision_load,
    .free_family = idefics3_vision_free_family,
    .each_weight = idefics3_vision_each_weight,
    .ctx_new = idefics3_vision_ctx_new,
    .ctx_free = idefics3_vision_ctx_free,
    .encode_one = idefics3_vision_encode_one,
};
