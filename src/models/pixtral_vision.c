/*
 * pixtral_vision: the image side of Mistral 3 (Mistral3ForConditionalGeneration: Mistral Small
 * 3.1 / 3.2) and of LLaVA with a Pixtral tower (Pixtral-12B), as transformers' modeling_pixtral.py
 * and modeling_mistral3.py compute it (ADR 0123), over the backend ops and blocks.c:
 *
 *   patches    each image at its own size (the processor's H x W, multiples of patch_size): the
 *              stride-p conv (no bias) as one product over the host's im2col rows, row-major
 *   ln_pre     RMSNorm (eps 1e-5)
 *   rope       2-D over (row, column): PixtralRotaryEmbedding's inv_freq, head dims paired
 *              (j, j + hd/2); the first hd/4 frequencies freqs[0::2] turn by the row, the next
 *              hd/4 freqs[1::2] by the column (freqs = theta^(-2k/hd)): two M-RoPE streams
 *   blocks     x += o(attn(rms(x))); x += down(act(gate rms(x)) * up rms(x)), no biases;
 *              attention bidirectional over the image's patches (one image per pass: the
 *              block-diagonal mask of several images is never needed)
 *   feature    hidden_states[vision_feature_layer]: later blocks are neither bound nor run
 *   projector  Mistral 3: RMSNorm (the text model's rms_norm_eps), Mistral3PatchMerger (each
 *              spatial_merge_size² block of patches, torch's unfold order, one row; odd edges
 *              dropped as unfold does) through merging_layer, linear_1, act, linear_2;
 *              LLaVA: linear_1, act, linear_2 (strategy "full": every patch)
 *   rows       the image's run in the prompt is the processor's expansion: per merged row its
 *              [IMG] tokens then [IMG_BREAK], the last break [IMG_END]; the tower writes the
 *              whole run, the break / end rows as the text model's embeddings of those tokens,
 *              so the engine places one contiguous run per image (vision_image_run)
 *
 * merging_layer's columns are permuted at load into the order a plain row gather makes
 * (patch-major, c fastest), so the unfold is one gather; a quantized merging_layer is refused.
 * Tensors: transformers 5's model.vision_tower.* / vision_tower.*, transformers 4's and mlx-vlm's
 * vision_tower.vision_model.* (mlx-vlm's patch conv channels-last: copied into torch's order);
 * multi_modal_projector.* with or without "model.".
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "blocks.h"
#include "vision.h"

/* Bounds on an untrusted vision_config (Pixtral-12B: 24 blocks of 1024, 16 heads, 1024 px at
 * patch 16; Mistral Small 3.1 1540 px at 14) */
#define PIX_MAX_EMBD    8192
#define PIX_MAX_FF      65536
#define PIX_MAX_LAYERS  128
#define PIX_MAX_SIDE    256      /* patches a side: image_size / patch_size */
#define PIX_EPS         1e-5f    /* PixtralRMSNorm(eps=1e-5) everywhere in the tower */

struct pix {
    bool llava;                /* LLaVA's MLP projector; else Mistral 3's */
    int dv, n_head, hd, n_ff, n_layer, C, p, side, merge, D;
    float theta;
    enum act_kind act, proj_act;
    float proj_eps;            /* Mistral3MultiModalProjector.norm: text_config.rms_norm_eps */
    int32_t brk, end;          /* [IMG_BREAK], [IMG_END] */
    struct tensor patch_w;     /* [dv, C p p] */
    struct tensor ln_pre;      /* [dv] */
    struct layer *layers;      /* [n_layer] (those up to the feature layer) */
    struct tensor norm;        /* [dv] (Mistral 3) */
    struct tensor merge_w;     /* [dv, m² dv], columns patch-major (Mistral 3) */
    struct tensor l1, l1_b, l2, l2_b;
};

struct pix_bufs {
    void *arena;
    int cap;                   /* patches the arena holds */
    struct ctx_bufs b;
    float *k, *v, *patches, *mg, *h2, *feat, *mrope;
    int32_t *meta;
    float *patches_host;
    int32_t *meta_host;
};

// ---- config ----

static int parse_act(const char *what, const char *name, enum act_kind *out, struct err *e)
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
        return err_setf(e, ERR_UNSUPPORTED, "%s '%s' is not supported (gelu, gelu_pytorch_tanh, silu, relu are)",
                        what, name);
    return 0;
}

/* PixtralVisionConfig (its defaults for absent keys). */
static int parse_vision(struct pix *q, const cJSON *vc, struct err *e)
{
    char act[64];
    int rc, image_size, hd = 0;
    float theta = 10000.0f;
    if ((rc = cfg_opt_int(vc, "hidden_size", 1024, &q->dv, e)) < 0 ||
        (rc = cfg_opt_int(vc, "intermediate_size", 4096, &q->n_ff, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_hidden_layers", 24, &q->n_layer, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_attention_heads", 16, &q->n_head, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_channels", 3, &q->C, e)) < 0 ||
        (rc = cfg_opt_int(vc, "image_size", 1024, &image_size, e)) < 0 ||
        (rc = cfg_opt_int(vc, "patch_size", 16, &q->p, e)) < 0 ||
        (rc = cfg_opt_int(vc, "head_dim", 0, &hd, e)) < 0 ||
        (rc = cfg_opt_float(vc, "rope_theta", theta, &theta, e)) < 0 ||
        (rc = cfg_opt_str(vc, "hidden_act", "gelu", act, sizeof act, e)) < 0)
        return err_prefix(e, "vision_config");
    /* transformers 5 writes rope_parameters: {"rope_theta": ..., "rope_type": "default"} */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(vc, "rope_parameters");
    if (cJSON_IsObject(rp)) {
        char type[32];
        if ((rc = cfg_opt_float(rp, "rope_theta", theta, &theta, e)) < 0 ||
            (rc = cfg_opt_str(rp, "rope_type", "default", type, sizeof type, e)) < 0)
            return err_prefix(e, "vision_config.rope_parameters");
        /* transformers 5.17 names Pixtral's 2-D rope "axial"; older configs say "default" */
        if (strcmp(type, "default") && strcmp(type, "axial"))
            return err_setf(e, ERR_UNSUPPORTED, "vision_config.rope_parameters.rope_type '%s': Pixtral's rope is "
                            "\"axial\" (or \"default\") only", type);
    }
    if ((rc = parse_act("vision_config.hidden_act", act, &q->act, e)) < 0)
        return rc;
    if (q->dv < 1 || q->dv > PIX_MAX_EMBD || q->n_head < 1 || q->dv % q->n_head || q->n_ff < 1 ||
        q->n_ff > PIX_MAX_FF || q->n_layer < 1 || q->n_layer > PIX_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "vision_config: width %d, %d heads, intermediate %d, %d layers out of "
                        "range (width a multiple of the heads, at most %d wide, %d layers)", q->dv, q->n_head,
                        q->n_ff, q->n_layer, PIX_MAX_EMBD, PIX_MAX_LAYERS);
    q->hd = q->dv / q->n_head;
    if (hd && hd != q->hd)
        return err_setf(e, ERR_CONFIG, "vision_config.head_dim %d: Pixtral's attention splits hidden_size %d "
                        "into %d heads of %d", hd, q->dv, q->n_head, q->hd);
    if (q->hd % 4 || q->hd / 2 > HP_MAX_ROT_HALF)
        return err_setf(e, ERR_CONFIG, "vision_config: head dim %d must be a multiple of 4 (2-D rope), at most %d",
                        q->hd, 2 * HP_MAX_ROT_HALF);
    if (q->C < 1 || q->C > 4 || q->p < 1 || q->p > 64 || image_size < q->p || image_size / q->p > PIX_MAX_SIDE)
        return err_setf(e, ERR_CONFIG, "vision_config: num_channels %d (1-4), patch_size %d (1-64), image_size %d "
                        "(a patch to %d patches a side) out of range", q->C, q->p, image_size, PIX_MAX_SIDE);
    if (!(theta > 0 && isfinite(theta)))
        return err_setf(e, ERR_CONFIG, "vision_config.rope_theta %g must be positive", (double)theta);
    q->side = image_size / q->p;
    q->theta = theta;
    return 0;
}

/* The id of a special token's text from the checkpoint's tokenizer files: tokenizer_config.json's
 * added_tokens_decoder, else tokenizer.json's added_tokens (-1: none). */
static int32_t added_token_id(const cJSON *tc, const cJSON *tj, const char *text)
{
    const cJSON *it, *atd = tc ? cJSON_GetObjectItemCaseSensitive(tc, "added_tokens_decoder") : NULL;
    cJSON_ArrayForEach(it, atd) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        char *end = NULL;
        long id = it->string ? strtol(it->string, &end, 10) : -1;
        if (cJSON_IsString(c) && !strcmp(c->valuestring, text) && end && !*end && id >= 0 && id < INT32_MAX)
            return (int32_t)id;
    }
    const cJSON *at = tj ? cJSON_GetObjectItemCaseSensitive(tj, "added_tokens") : NULL;
    cJSON_ArrayForEach(it, at) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (cJSON_IsString(c) && !strcmp(c->valuestring, text) && cJSON_IsNumber(id) && id->valuedouble >= 0 &&
            id->valuedouble < INT32_MAX)
            return (int32_t)id->valuedouble;
    }
    return -1;
}

/* [IMG_BREAK] / [IMG_END]: their texts from processor_config.json (PixtralProcessor's defaults),
 * their ids from the tokenizer files. A checkpoint without them cannot expand an image. */
static int find_break_ids(struct pix *q, const struct model *m, struct err *e)
{
    char path[4200], brk[64] = "[IMG_BREAK]", end[64] = "[IMG_END]";
    cJSON *pc = NULL, *tc = NULL, *tj = NULL;
    struct err ig = {0};
    int rc = 0;
    snprintf(path, sizeof path, "%s/processor_config.json", m->dir);
    if (cfg_load_file(path, FILE_FOLDER, &pc, &ig) == 0 &&
        ((rc = cfg_opt_str(pc, "image_break_token", brk, brk, sizeof brk, e)) < 0 ||
         (rc = cfg_opt_str(pc, "image_end_token", end, end, sizeof end, e)) < 0)) {
        err_prefix(e, "processor_config.json");
        goto out;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", m->dir);
    (void)cfg_load_file(path, FILE_FOLDER, &tc, &ig);
    q->brk = added_token_id(tc, NULL, brk);
    q->end = added_token_id(tc, NULL, end);
    if (q->brk < 0 || q->end < 0) {
        snprintf(path, sizeof path, "%s/tokenizer.json", m->dir);
        (void)cfg_load_file(path, FILE_FOLDER, &tj, &ig);
        q->brk = added_token_id(NULL, tj, brk);
        q->end = added_token_id(NULL, tj, end);
    }
    if (q->brk < 0 || q->end < 0 || q->brk >= m->hp.n_vocab || q->end >= m->hp.n_vocab)
        rc = err_setf(e, ERR_CONFIG, "the image break / end tokens %s (id %d) and %s (id %d) must be added tokens "
                      "of the checkpoint's tokenizer inside the vocabulary [0, %d)", brk, (int)q->brk, end,
                      (int)q->end, m->hp.n_vocab);
out:
    cJSON_Delete(pc);
    cJSON_Delete(tc);
    cJSON_Delete(tj);
    return rc;
}

/* The wrapper's keys: Mistral3Config's or LlavaConfig's. */
static int parse_top(struct pix *q, struct vision *v, const struct model *m, const cJSON *cfg, struct err *e)
{
    char act[64], strat[32];
    int rc, img;
    if ((rc = vit_feature_layer(cfg, q->n_layer, q->llava ? -2 : -1, &q->n_layer, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "projector_hidden_act", "gelu", act, sizeof act, e)) < 0 ||
        (rc = parse_act("projector_hidden_act", act, &q->proj_act, e)) < 0)
        return rc;
    if (q->llava) {
        if ((rc = cfg_opt_str(cfg, "vision_feature_select_strategy", "default", strat, sizeof strat, e)) < 0)
            return err_prefix(e, "vision_feature_select_strategy");
        /* "default" drops the first row (CLIP's class row), which a Pixtral tower does not have:
         * transformers' split by image size then fails; Pixtral-12B says "full" */
        if (strcmp(strat, "full"))
            return err_setf(e, ERR_CONFIG, "vision_feature_select_strategy '%s': a Pixtral tower has no class "
                            "row to drop; LLaVA with Pixtral takes \"full\"", strat);
        q->merge = 1;
    } else if ((rc = cfg_opt_int(cfg, "spatial_merge_size", 2, &q->merge, e)) < 0) {
        return rc;
    }
    if (q->merge < 1 || q->merge > 8)
        return err_setf(e, ERR_CONFIG, "spatial_merge_size %d out of range (1-8)", q->merge);
    /* image_token_index, or image_token_id (its attribute_map alias; transformers 5 writes it) */
    if ((rc = cfg_opt_int(cfg, "image_token_index", q->llava ? 32000 : 10, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "image_token_id", img, &img, e)) < 0)
        return rc;
    if (img < 0 || img >= m->hp.n_vocab)
        return err_setf(e, ERR_CONFIG, "image_token_index %d must be inside the vocabulary [0, %d)", img,
                        m->hp.n_vocab);
    if (hparams_has_mrope(&m->hp))
        return err_setf(e, ERR_CONFIG, "the text model has M-RoPE (mrope_section): %s's image rows take 1-D "
                        "positions", v->ops->model_type);
    if ((rc = find_break_ids(q, m, e)) < 0)
        return rc;
    q->D = m->hp.n_embd;
    q->proj_eps = m->hp.norm_eps;
    v->info = (struct vision_info){.n_channels = q->C, .image_token_id = img, .boi_token_id = -1,
                                   .eoi_token_id = -1, .merge = q->merge, .patch_size = q->p,
                                   .temporal_patch_size = 1, .patch_dim = q->C * q->p * q->p,
                                   .max_patches = q->side * q->side, .row_breaks = true,
                                   .break_token_id = q->brk, .end_token_id = q->end};
    return 0;
}

// ---- weights ----

/* patch_conv.weight as the matrix [dv, C p p] in torch's (c, y, x) order: a view, or a copy of
 * mlx-vlm's channels-last [dv, p, p, C]. */
static int map_patch(struct pix *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    char name[512];
    int64_t D = q->dv, C = q->C, P = q->p, K = C * P * P, mat[2] = {D, K};
    snprintf(name, sizeof name, "%spatch_conv.weight", pre);
    const struct st_tensor *st = st_set_find(w->st, name);
    if (!st)
        return err_setf(e, ERR_MISSING, "missing tensor '%s'", name);
    bool cl = st->ndim == 4 && st->shape[3] == C && !(st->shape[1] == C && st->shape[2] == P && st->shape[3] == P);
    const int64_t torch[4] = {D, C, P, P}, mlx[4] = {D, P, P, C}, *want = cl ? mlx : torch;
    size_t es = dtype_size(st->dtype);
    bool ok = st->ndim == 4;
    for (int i = 0; ok && i < 4; i++)
        ok = st->shape[i] == want[i];
    if (!ok)
        return err_setf(e, ERR_FORMAT, "%s: shape must be [%lld, %lld, %lld, %lld] (the patch conv of "
                        "vision_config), or mlx-vlm's channels-last order", name, (long long)D, (long long)C,
                        (long long)P, (long long)P);
    if ((st->dtype != DTYPE_F32 && st->dtype != DTYPE_F16 && st->dtype != DTYPE_BF16) || !st->data ||
        st->end - st->begin != (uint64_t)(D * K) * es)
        return err_setf(e, ERR_UNSUPPORTED, "%s: the patch conv must be F32, F16 or BF16 (a quantized one is not "
                        "supported)", name);
    st_set_mark(w->st, name);
    if (!cl) {
        tensor_init(&q->patch_w, st->dtype, (void *)(uintptr_t)st->data, 2, mat);
        q->patch_w.name = st->name;
        return 0;
    }
    char *dst;
    int rc = model_alloc_owned(m, (size_t)(D * K) * es, (void **)&dst, e);
    if (rc < 0)
        return rc;
    const char *src = (const char *)st->data;
    for (int64_t o = 0; o < D; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < P; y++)
                for (int64_t x = 0; x < P; x++)
                    memcpy(dst + (size_t)(o * K + (c * P + y) * P + x) * es,
                           src + (size_t)(o * K + (y * P + x) * C + c) * es, es);
    tensor_init(&q->patch_w, st->dtype, dst, 2, mat);
    q->patch_w.name = st->name;
    return 0;
}

/* merging_layer [dv, dv m²]: torch's unfold orders a merged row (c, ki, kj); the gather makes
 * (ki, kj, c). Its columns are permuted into the gather's order (a copy). */
static int map_merger(struct pix *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    int64_t dv = q->dv, u = (int64_t)q->merge * q->merge, K = dv * u, shape[2] = {dv, K};
    int rc = wm_linear(w, &q->merge_w, WM_REQUIRED, 0, dv, K, e, "%spatch_merger.merging_layer", pre);
    if (rc < 0)
        return rc;
    if (q->merge_w.qbits || (q->merge_w.dtype != DTYPE_F32 && q->merge_w.dtype != DTYPE_F16 &&
                             q->merge_w.dtype != DTYPE_BF16))
        return err_setf(e, ERR_UNSUPPORTED, "%spatch_merger.merging_layer: a quantized merging layer is not "
                        "supported (its columns are reordered at load)", pre);
    if (u == 1)
        return 0;
    size_t es = dtype_size(q->merge_w.dtype);
    char *dst;
    if ((rc = model_alloc_owned(m, (size_t)(dv * K) * es, (void **)&dst, e)) < 0)
        return rc;
    const char *src = q->merge_w.data;
    for (int64_t o = 0; o < dv; o++)
        for (int64_t c = 0; c < dv; c++)
            for (int64_t k = 0; k < u; k++)
                memcpy(dst + (size_t)(o * K + k * dv + c) * es, src + (size_t)(o * K + c * u + k) * es, es);
    const char *name = q->merge_w.name;
    tensor_init(&q->merge_w, q->merge_w.dtype, dst, 2, shape);
    q->merge_w.name = name;
    return 0;
}

static int map_layer(struct pix *q, struct layer *L, struct wmap *w, const char *pre, int il, struct err *e)
{
    int64_t D = q->dv, F = q->n_ff;
    int rc;
    const char *t = "transformer.layers";
    if ((rc = wm_vec(w, &L->attn_norm, WM_REQUIRED, D, e, "%s%s.%d.attention_norm.weight", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, D, D, e, "%s%s.%d.attention.q_proj", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, D, D, e, "%s%s.%d.attention.k_proj", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, D, D, e, "%s%s.%d.attention.v_proj", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, D, D, e, "%s%s.%d.attention.o_proj", pre, t, il)) < 0 ||
        (rc = wm_vec(w, &L->ffn_norm, WM_REQUIRED, D, e, "%s%s.%d.ffn_norm.weight", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, F, D, e, "%s%s.%d.feed_forward.gate_proj", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, F, D, e, "%s%s.%d.feed_forward.up_proj", pre, t, il)) < 0 ||
        (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, D, F, e, "%s%s.%d.feed_forward.down_proj", pre, t, il)) < 0)
        return rc;
    return 0;
}

static int map_weights(struct pix *q, struct model *m, struct wmap *w, const char *tower, const char *proj,
                       const cJSON *cfg, struct err *e)
{
    int rc;
    bool bias = q->llava;
    if ((rc = cfg_opt_bool(cfg, "multimodal_projector_bias", bias, &bias, e)) < 0)
        return rc;
    if (q->n_layer && !(q->layers = calloc((size_t)q->n_layer, sizeof *q->layers)))
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = map_patch(q, m, w, tower, e)) < 0 ||
        (rc = wm_vec(w, &q->ln_pre, WM_REQUIRED, q->dv, e, "%sln_pre.weight", tower)) < 0)
        return rc;
    for (int il = 0; il < q->n_layer; il++)
        if ((rc = map_layer(q, &q->layers[il], w, tower, il, e)) < 0)
            return rc;
    if (!q->llava && ((rc = wm_vec(w, &q->norm, WM_REQUIRED, q->dv, e, "%snorm.weight", proj)) < 0 ||
                      (rc = map_merger(q, m, w, proj, e)) < 0))
        return rc;
    int64_t D = q->D, dv = q->dv;
    if ((rc = wm_linear(w, &q->l1, WM_REQUIRED, 0, D, dv, e, "%slinear_1", proj)) < 0 ||
        (rc = wm_vec(w, &q->l1_b, bias, D, e, "%slinear_1.bias", proj)) < 0 ||
        (rc = wm_linear(w, &q->l2, WM_REQUIRED, 0, D, D, e, "%slinear_2", proj)) < 0 ||
        (rc = wm_vec(w, &q->l2_b, bias, D, e, "%slinear_2.bias", proj)) < 0)
        return rc;
    return 0;
}

static int pix_load(struct vision *v, struct model *m, const cJSON *cfg, bool llava, struct err *e)
{
    static const char *const towers[] = {"vision_tower.vision_model.", "model.vision_tower.vision_model.",
                                         "vision_tower.", "model.vision_tower."};
    static const char *const projs[] = {"multi_modal_projector.", "model.multi_modal_projector."};
    struct wmap w = {m->st, &m->hp.quant};
    int tw = -1, pj = 0, rc;
    for (int i = 0; i < 4 && tw < 0; i++)
        if (wm_has(&w, "%spatch_conv.weight", towers[i]))
            tw = i;
    if (tw < 0) {
        err_setf(e, ERR_MISSING, "no vision_tower.patch_conv.weight");
        return 1;
    }
    if (wm_has(&w, "%slinear_1.weight", projs[1]))
        pj = 1;
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
    if (!cJSON_IsObject(vc))
        return err_setf(e, ERR_CONFIG, "the vision tower's tensors are there but config.json has no vision_config "
                        "object");
    struct pix *q = calloc(1, sizeof *q);
    if (!q)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->family = q;
    q->llava = llava;
    if ((rc = parse_vision(q, vc, e)) < 0 || (rc = parse_top(q, v, m, cfg, e)) < 0)
        return rc;
    return map_weights(q, m, &w, towers[tw], projs[pj], cfg, e);
}

static int mistral3_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    return pix_load(v, m, cfg, false, e);
}

static int llava_pixtral_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    return pix_load(v, m, cfg, true, e);
}

static void pix_free_family(struct vision *v)
{
    struct pix *q = v->family;
    if (q)
        free(q->layers);
    free(q);
    v->family = NULL;
}

static void pix_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear), void *ud)
{
    struct pix *q = v->family;
    struct tensor *mats[] = {&q->patch_w, &q->merge_w, &q->l1, &q->l2};
    struct tensor *vals[] = {&q->ln_pre, &q->norm, &q->l1_b, &q->l2_b};
    for (size_t i = 0; i < 4; i++) {
        if (tensor_is_present(mats[i]))
            fn(ud, mats[i], true);
        if (tensor_is_present(vals[i]))
            fn(ud, vals[i], false);
    }
    for (int il = 0; q->layers && il < q->n_layer; il++) {
        struct layer *L = &q->layers[il];
        struct tensor *lm[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++)
            fn(ud, lm[i], true);
        fn(ud, &L->attn_norm, false);
        fn(ud, &L->ffn_norm, false);
    }
}

/* rows (h / m) x (w / m + 1): the merged rows, each with its break (the last: the end). */
static int pix_grid_tokens(const struct vision *v, const int32_t *grid, struct err *e)
{
    const struct pix *q = v->family;
    int64_t t = grid[0], h = grid[1], w = grid[2];
    if (t != 1 || h < q->merge || w < q->merge || h > q->side || w > q->side)
        return err_setf(e, ERR_ARG, "an image of %lld x %lld x %lld patches: the tower takes one still image of "
                        "%d to %d patches a side (vision_config.image_size / patch_size)", (long long)t,
                        (long long)h, (long long)w, q->merge, q->side);
    return (int)((h / q->merge) * (w / q->merge + 1));
}

// ---- context ----

static void *carve(char *base, size_t *off, size_t n)
{
    void *p = base ? base + *off : NULL;
    *off += ((n + 15) & ~(size_t)15) * sizeof(float);
    return p;
}

/* meta ints for P patches: pos, slot, table, seq_end, span (2P), tables (1), the rope streams
 * (3P), the merge gather (P), the output gather (2P + 2), the break / end ids (2) */
static size_t meta_ints(int P)
{
    return 12 * (size_t)P + 8;
}

static size_t layout(struct pix_bufs *pb, const struct pix *q, int P, char *base)
{
    size_t off = 0, n = (size_t)P, dv = (size_t)q->dv, F = (size_t)q->n_ff, D = (size_t)q->D;
    size_t pd = (size_t)q->C * q->p * q->p;
    struct ctx_bufs b = {0};
    b.x = carve(base, &off, n * dv);
    b.xn = carve(base, &off, n * dv);
    b.qkv = carve(base, &off, n * 3 * dv);
    b.att = carve(base, &off, n * dv);
    b.o = carve(base, &off, n * dv);
    b.f = carve(base, &off, n * dv);
    b.h = carve(base, &off, n * (2 * F > D ? 2 * F : D));
    b.h1 = carve(base, &off, n * (F > D ? F : D));
    float *k = carve(base, &off, n * dv), *v = carve(base, &off, n * dv);
    float *patches = carve(base, &off, n * pd), *mg = carve(base, &off, n * dv);
    float *h2 = carve(base, &off, n * (D > dv ? D : dv)), *feat = carve(base, &off, (n + 2) * D);
    float *mrope = carve(base, &off, 3 * HP_MAX_ROT_HALF);
    int32_t *meta = carve(base, &off, meta_ints(P));
    if (base) {
        pb->b = b;
        pb->k = k;
        pb->v = v;
        pb->patches = patches;
        pb->mg = mg;
        pb->h2 = h2;
        pb->feat = feat;
        pb->mrope = mrope;
        pb->meta = meta;
    }
    return off;
}

/* Room for an image of P patches (the arena grows to the largest image seen). */
static int pix_reserve(struct vision_ctx *vc, int P, struct err *e)
{
    struct pix_bufs *pb = vc->fam;
    const struct pix *q = vc->m->vision->family;
    if (P <= pb->cap)
        return 0;
    size_t pd = (size_t)q->C * q->p * q->p;
    float *ph = malloc((size_t)P * pd * sizeof *ph);
    int32_t *mh = malloc(meta_ints(P) * sizeof *mh);
    if (!ph || !mh) {
        free(ph);
        free(mh);
        return err_setf(e, ERR_NOMEM, "out of memory for an image of %d patches", P);
    }
    if (pb->arena)
        vc->be->ops->buf_free(vc->be, pb->arena);
    pb->arena = NULL;
    pb->cap = 0;
    free(pb->patches_host);
    free(pb->meta_host);
    pb->patches_host = ph;
    pb->meta_host = mh;
    size_t bytes = layout(pb, q, P, NULL);
    int rc = vc->be->ops->buf_alloc(vc->be, bytes, &pb->arena, e);
    if (rc < 0)
        return err_prefix(e, "vision tower activations of %d patches (%zu MiB)", P, bytes >> 20);
    layout(pb, q, P, pb->arena);
    pb->cap = P;
    /* PixtralRotaryEmbedding: freqs = theta^(-2k/hd), k < hd/2; the row turns the first hd/4
     * dims by freqs[0::2], the column the next hd/4 by freqs[1::2] (float32, as transformers) */
    float mr[3 * HP_MAX_ROT_HALF] = {0};
    int q4 = q->hd / 4;
    for (int j = 0; j < q4; j++) {
        mr[j] = (float)(1.0 / pow((double)q->theta, (4.0 * j) / q->hd));
        mr[HP_MAX_ROT_HALF + q4 + j] = (float)(1.0 / pow((double)q->theta, (4.0 * j + 2.0) / q->hd));
    }
    vc->be->ops->upload(vc->be, pb->mrope, mr, sizeof mr);
    return backend_sync(vc->be, e);
}

static int pix_ctx_new(struct vision_ctx *vc, struct err *e)
{
    struct pix_bufs *pb = calloc(1, sizeof *pb);
    if (!pb)
        return err_setf(e, ERR_NOMEM, "out of memory");
    vc->fam = pb;
    return 0;
}

static void pix_ctx_free(struct vision_ctx *vc)
{
    struct pix_bufs *pb = vc->fam;
    if (pb->arena)
        vc->be->ops->buf_free(vc->be, pb->arena);
    free(pb->patches_host);
    free(pb->meta_host);
    free(pb);
    vc->fam = NULL;
}

// ---- forward ----

/* Host staging: the im2col rows of pixels [C, h p, w p] (row-major patches, each (c, y, x)) and
 * the metadata (one bidirectional sequence of P rows, the rope streams, the gathers, the ids). */
static void stage(struct pix_bufs *pb, const struct pix *q, const float *pixels, int gh, int gw, int T_feat)
{
    int P = gh * gw, p = q->p, C = q->C, W = gw * p, H = gh * p, m = q->merge;
    size_t pd = (size_t)C * p * p;
    for (int py = 0; py < gh; py++)
        for (int px = 0; px < gw; px++) {
            float *row = pb->patches_host + (size_t)(py * gw + px) * pd;
            for (int c = 0; c < C; c++)
                for (int y = 0; y < p; y++)
                    memcpy(row + ((size_t)c * p + y) * p,
                           pixels + ((size_t)c * H + (size_t)py * p + y) * W + (size_t)px * p, p * sizeof(float));
        }
    int32_t *h = pb->meta_host;
    int32_t *pos = h, *slot = h + P, *tab = h + 2 * P, *end = h + 3 * P, *span = h + 4 * P;
    int32_t *tables = h + 6 * P, *mp = tables + 1, *mgather = mp + 3 * P, *og = mgather + P, *ids = og + 2 * P + 2;
    for (int i = 0; i < P; i++) {
        pos[i] = slot[i] = i;
        tab[i] = 0;
        end[i] = P;
        span[2 * i] = 0;
        span[2 * i + 1] = P - 1;
        mp[i] = i / gw;
        mp[P + i] = i % gw;
        mp[2 * P + i] = 0;
    }
    tables[0] = 0;
    /* Mistral3PatchMerger: unit (r, c) row-major, its patches (ki, kj) row-major */
    int rows = gh / m, cols = gw / m, j = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            for (int ki = 0; ki < m; ki++)
                for (int kj = 0; kj < m; kj++)
                    mgather[j++] = (r * m + ki) * gw + c * m + kj;
    /* the run: feature rows, each merged row followed by the break (row T_feat of feat) or,
     * last, the end (row T_feat + 1) */
    int o = 0;
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++)
            og[o++] = r * cols + c;
        og[o++] = r + 1 < rows ? T_feat : T_feat + 1;
    }
    ids[0] = q->brk;
    ids[1] = q->end;
}

static int pix_encode_grid(struct vision_ctx *vc, float *out, const float *pixels, const int32_t *grid,
                           struct err *e)
{
    const struct vision *v = vc->m->vision;
    const struct pix *q = v->family;
    struct pix_bufs *pb = vc->fam;
    struct backend *be = vc->be;
    const struct backend_ops *op = be->ops;
    int gh = grid[1], gw = grid[2], P = gh * gw, dv = q->dv, D = q->D, m = q->merge, rc;
    int rows = gh / m, cols = gw / m, U = rows * cols, n_out = rows * (cols + 1);
    int T_feat = q->llava ? P : U;
    size_t pd = (size_t)q->C * q->p * q->p;
    if ((rc = pix_reserve(vc, P, e)) < 0)
        return rc;
    stage(pb, q, pixels, gh, gw, T_feat);
    op->upload(be, pb->patches, pb->patches_host, (size_t)P * pd * sizeof(float));
    op->upload(be, pb->meta, pb->meta_host, meta_ints(P) * sizeof(int32_t));
    const int32_t *d = pb->meta;
    const int32_t *mp = d + 6 * P + 1, *mgather = mp + 3 * P, *og = mgather + P, *ids = og + 2 * P + 2;
    struct kv_rows kr = {.pos = d, .slot = d + P, .table = d + 2 * P, .seq_end = d + 3 * P, .span = d + 4 * P,
                         .tables = d + 6 * P, .block_size = P};
    const struct ctx_bufs *b = &pb->b;

    /* 1. patch conv, ln_pre */
    op->linear(be, b->x, dv, pb->patches, &q->patch_w, NULL, P);
    struct blk_norm_w pre = {NORM_RMS, PIX_EPS, &q->ln_pre, NULL, 0.0f};
    blk_norm(be, b->x, b->x, &pre, P, dv);
    /* 2. the blocks up to the feature layer, 2-D rope as two M-RoPE streams (row, column) */
    struct rope_params rp[3];
    for (int s = 0; s < 3; s++)
        rp[s] = (struct rope_params){.n_rot = q->hd, .inv_freq = pb->mrope + (size_t)s * HP_MAX_ROT_HALF,
                                     .mscale = 1.0f, .style = ROPE_STYLE_HALF};
    struct blk_attn_cfg ac = {
        .ap = {.n_head = q->n_head, .n_kv_head = q->n_head, .head_dim = q->hd, .scale = 1.0f / sqrtf((float)q->hd)},
        .n_embd = dv,
        .mrope = rp,
        .mpos = mp,
        .mpos_ld = P,
    };
    struct kv_layer kv = {pb->k, pb->v, dv, dv, DTYPE_F32};
    for (int il = 0; il < q->n_layer; il++) {
        const struct layer *L = &q->layers[il];
        struct blk_norm_w n1 = {NORM_RMS, PIX_EPS, &L->attn_norm, NULL, 0.0f};
        struct blk_norm_w n2 = {NORM_RMS, PIX_EPS, &L->ffn_norm, NULL, 0.0f};
        blk_norm(be, b->xn, b->x, &n1, P, dv);
        blk_attention(be, b->o, b->xn, L, &ac, &kv, &kr, b, P);
        op->axpy(be, b->x, dv, 1.0f, b->o, dv, P, dv);
        blk_norm(be, b->xn, b->x, &n2, P, dv);
        blk_glu(be, b->f, b->xn, L, q->act, q->n_ff, b, P);
        op->axpy(be, b->x, dv, 1.0f, b->f, dv, P, dv);
    }
    vc->hidden = b->x;
    vc->n_hidden = P;
    /* 3. the projector into feat [T_feat, D] */
    const float *x1 = b->x;
    if (!q->llava) {
        struct blk_norm_w nn = {NORM_RMS, q->proj_eps, &q->norm, NULL, 0.0f};
        blk_norm(be, b->xn, b->x, &nn, P, dv);
        op->gather(be, pb->mg, b->xn, dv, mgather, 1, U * m * m, dv);
        op->linear(be, pb->h2, dv, pb->mg, &q->merge_w, NULL, U);
        x1 = pb->h2;
    }
    op->linear(be, b->h, D, x1, &q->l1, tensor_is_present(&q->l1_b) ? &q->l1_b : NULL, T_feat);
    op->act(be, q->proj_act, b->h, D, T_feat, D);
    op->linear(be, pb->feat, D, b->h, &q->l2, tensor_is_present(&q->l2_b) ? &q->l2_b : NULL, T_feat);
    /* 4. the break and end rows as the text model embeds them, then the run in prompt order */
    op->embed(be, pb->feat + (size_t)T_feat * D, &vc->m->tok_embd, ids, 2);
    if (vc->m->hp.embd_scale != 1.0f)
        op->scale(be, pb->feat + (size_t)T_feat * D, D, vc->m->hp.embd_scale, 2, D);
    op->gather(be, out, pb->feat, D, og, 1, n_out, D);
    return 0;
}

const struct vision_ops mistral3_vision_ops = {
    .model_type = "mistral3",
    .description = "Mistral 3: Pixtral tower (2-D rope over each image's own patch grid, RMSNorm + SwiGLU "
                   "blocks), RMSNorm + patch merger + MLP projector; [IMG_BREAK] after each row",
    .text_family = "mistral",
    .load = mistral3_load,
    .free_family = pix_free_family,
    .each_weight = pix_each_weight,
    .ctx_new = pix_ctx_new,
    .ctx_free = pix_ctx_free,
    .encode_grid = pix_encode_grid,
    .grid_tokens = pix_grid_tokens,
};

/* LLaVA whose vision_config is pixtral (Pixtral-12B): llava_vision_ops' load hands over to it. */
const struct vision_ops llava_pixtral_vision_ops = {
    .model_type = "llava",
    .description = "LLaVA with a Pixtral tower (Pixtral-12B): images at their own size, MLP projector",
    .text_family = "llama",
    .load = llava_pixtral_load,
    .free_family = pix_free_family,
    .each_weight = pix_each_weight,
    .ctx_new = pix_ctx_new,
    .ctx_free = pix_ctx_free,
    .encode_grid = pix_encode_grid,
    .grid_tokens = pix_grid_tokens,
};
