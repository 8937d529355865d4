/*
 * qwen2_vl_vision: the image side of Qwen2-VL, Qwen2.5-VL (ADR 0095) and Qwen3-VL (ADR 0120),
 * as transformers' Qwen2VisionTransformerPretrainedModel / Qwen2_5_VisionTransformerPretrainedModel
 * / Qwen3VLVisionModel compute it, over the backend ops and blocks.c (so the GPU backend runs
 * it as it is):
 *
 *   patches   the processor's rows (t h w of them, ordered by merge unit: 2 x 2 neighbours
 *             consecutive), each C x temporal x p x p values in the Conv3d weight's order
 *   embed     x = patches · W_patchᵀ (the stride-sized Conv3d as one product, no bias)
 *   rope      2-D: head dims [0, hd/2) turn in pairs (j, j + hd/2) by the patch's row for the
 *             first hd/4 frequencies and by its column for the rest (VisionRotaryEmbedding(hd/2)
 *             of theta 10000): the M-RoPE passes of blk_attention with two streams (ADR 0094)
 *   blocks    pre-norm: x += proj(attn(norm1(x))); x += mlp(norm2(x)), q|k|v fused with biases;
 *             Qwen2-VL: LayerNorm, fc2(quick_gelu(fc1 x)) (quick_gelu from the scale, sigmoid
 *             and mul ops); Qwen2.5-VL: RMSNorm, down(silu(gate x) * up x) with biases
 *   attention bidirectional over the whole image (one image per pass: cu_seqlens), or, in
 *             Qwen2.5-VL's blocks not in fullatt_block_indexes, within windows of
 *             window_size / patch / merge merged tokens a side: the rows run in window order
 *             (get_vision_window_index's permutation, applied to the patch rows on the host),
 *             each window a sequence of its own in the tower's K/V (one block of the largest
 *             window's slots each)
 *   merger    ln_q (LayerNorm; Qwen2.5-VL RMSNorm) per patch, each merge unit's merge² rows as
 *             one row, Linear + GELU + Linear into the text model's width; Qwen2.5-VL's rows
 *             gathered back from window order (the inverse permutation)
 *   Qwen3-VL  the embedding with its bias plus the learned pos_embed table (n_side x n_side)
 *             interpolated bilinearly to the image's grid on the host (fast_pos_embed_interpolate);
 *             LayerNorm + gelu(tanh) blocks with biases (mlp.linear_fc1 / linear_fc2); the merger
 *             named merger.{norm, linear_fc1, linear_fc2}; after each block of
 *             deepstack_visual_indexes, a merger of its own (deepstack_merger_list.K, LayerNorm
 *             after the merge units are joined) writes one more plane of the image's rows
 *             (vision_encode_grid's out: [1 + n_deep][U, n_embd]), added by the text model's
 *             decoder after its layer K (ADR 0120)
 *
 * Tensors: transformers 5's model.visual.*, a published checkpoint's visual.*, mlx-vlm's
 * vision_tower.* (its Conv3d weight channels-last [out, t, p, p, C]: copied here into torch's
 * order). Names under the prefix: patch_embed.proj.weight, blocks.N.{norm1, norm2, attn.qkv,
 * attn.proj, mlp.fc1, mlp.fc2 | mlp.gate_proj, mlp.up_proj, mlp.down_proj}, merger.{ln_q,
 * mlp.0, mlp.2}.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "blocks.h"
#include "vision.h"

/* Bounds on an untrusted vision_config: far above the published towers (32 blocks of 1280,
 * 16 heads), low enough that no size overflows. 65536 patches: Qwen2-VL's max_pixels
 * 12845056 / 14². */
#define QVL_MAX_EMBD    8192
#define QVL_MAX_FF      65536
#define QVL_MAX_LAYERS  128
#define QVL_MAX_PATCHES 65536
#define QVL_EPS         1e-6f
#define QVL_MAX_POS     (1 << 24)  /* pos_embed values (Qwen3-VL: 2304 x 1152) */
#define QVL_MAX_DEEP    16         /* deepstack_visual_indexes (Qwen3-VL: 3) */

/* A Qwen3-VL merger: LayerNorm (over dv, or, post-shuffle, over merge² dv), Linear, GELU,
 * Linear. */
struct qvl_merger {
    struct tensor norm, norm_b, fc1, fc1_b, fc2, fc2_b;
};

struct qvl {
    bool v25;                  /* Qwen2.5-VL: RMSNorm, SwiGLU, windows */
    bool v3;                   /* Qwen3-VL: patch bias, learned position table, deepstack */
    int dv, n_head, hd, n_ff, n_layer, out_dim;
    int C, p, tp, merge;
    int win;                   /* merged tokens per window side; 0: none */
    enum act_kind act;         /* the MLP's hidden_act ... */
    bool quick;                /* ... or quick_gelu: x sigmoid(1.702 x) from scale, sigmoid, mul */
    bool *full;                /* [n_layer] the block attends over the whole image */
    struct tensor patch_w;     /* [dv, C tp p p] */
    struct layer *layers;      /* [n_layer] */
    struct tensor ln_q, ln_q_b, mlp0, mlp0_b, mlp2, mlp2_b;
    /* Qwen3-VL */
    struct tensor patch_b;     /* [dv] */
    float *pos;                /* [n_side², dv] pos_embed in f32 (host, owned by the model) */
    int n_side;                /* sqrt(num_position_embeddings) */
    int n_deep;                /* deepstack mergers */
    int deep_at[QVL_MAX_DEEP]; /* the block after which merger k reads */
    struct qvl_merger deep[QVL_MAX_DEEP];
};

/* The activations of one image of up to cap patches, grown on demand. */
struct qvl_bufs {
    void *arena;
    int cap, cap_kv, cap_win;  /* patches, K/V slots, windows the arena holds */
    struct ctx_bufs b;         /* x, xn, qkv, att, o, f, h, h1 */
    float *k, *v, *patches, *tmp;
    int32_t *meta;             /* full rows, window rows, 3 position streams, tables, gather */
    float *patches_host;       /* [cap, patch_dim] */
    int32_t *meta_host;
    struct kv_rows full, win;
    int32_t *mpos, *gather;
    float *mrope;              /* [3][HP_MAX_ROT_HALF] the 2-D rope tables */
    float *pos_host;           /* [cap, dv] Qwen3-VL: the image's interpolated position rows */
};

// ---- config ----

static int parse_act(const char *name, enum act_kind *out, bool *quick, struct err *e)
{
    *quick = false;
    if (!strcmp(name, "quick_gelu")) {
        *quick = true;
        *out = ACT_SIGMOID;   /* unused: the flag composes it */
    } else if (!strcmp(name, "silu") || !strcmp(name, "swish")) {
        *out = ACT_SILU;
    } else if (!strcmp(name, "gelu")) {
        *out = ACT_GELU_ERF;
    } else if (!strcmp(name, "gelu_pytorch_tanh") || !strcmp(name, "gelu_new")) {
        *out = ACT_GELU_TANH;
    } else {
        return err_setf(e, ERR_UNSUPPORTED, "vision_config.hidden_act '%s' is not supported", name);
    }
    return 0;
}

/* The per-block attention kind of Qwen2.5-VL: fullatt_block_indexes. */
static int parse_full(struct qvl *q, const cJSON *vc, struct err *e)
{
    q->full = calloc((size_t)q->n_layer, sizeof *q->full);
    if (!q->full)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if (!q->v25) {
        for (int i = 0; i < q->n_layer; i++)
            q->full[i] = true;
        return 0;
    }
    const cJSON *fi = cJSON_GetObjectItemCaseSensitive(vc, "fullatt_block_indexes"), *it;
    if (!fi) {   /* Qwen2_5_VLVisionConfig's default */
        for (int i = 7; i < q->n_layer; i += 8)
            q->full[i] = true;
        return 0;
    }
    if (!cJSON_IsArray(fi))
        return err_setf(e, ERR_CONFIG, "vision_config.fullatt_block_indexes must be an array");
    cJSON_ArrayForEach(it, fi) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= q->n_layer ||
            it->valuedouble != (double)(int)it->valuedouble)
            return err_setf(e, ERR_CONFIG, "vision_config.fullatt_block_indexes: each an integer in [0, %d)",
                            q->n_layer);
        q->full[(int)it->valuedouble] = true;
    }
    return 0;
}

/* Qwen3-VL's num_position_embeddings (a square: the learned table's side) and
 * deepstack_visual_indexes (distinct blocks, each a merger of its own). */
static int parse_qwen3(struct qvl *q, const cJSON *vc, struct err *e)
{
    int n_pos, rc;
    if ((rc = cfg_opt_int(vc, "num_position_embeddings", 2304, &n_pos, e)) < 0)
        return rc;
    q->n_side = (int)lround(sqrt((double)(n_pos > 0 ? n_pos : 0)));
    if (n_pos < 1 || q->n_side * q->n_side != n_pos || (int64_t)n_pos * (q->dv > 0 ? q->dv : 1) > QVL_MAX_POS)
        return err_setf(e, ERR_CONFIG, "num_position_embeddings %d must be a square (the learned position table's "
                        "side squared), at most %d values", n_pos, QVL_MAX_POS);
    const cJSON *di = cJSON_GetObjectItemCaseSensitive(vc, "deepstack_visual_indexes"), *it;
    if (!di) {   /* Qwen3VLVisionConfig's default */
        static const int def[3] = {8, 16, 24};
        for (int k = 0; k < 3; k++)
            q->deep_at[q->n_deep++] = def[k];
    } else if (!cJSON_IsArray(di) || cJSON_GetArraySize(di) > QVL_MAX_DEEP) {
        return err_setf(e, ERR_CONFIG, "deepstack_visual_indexes must be an array of at most %d block indexes",
                        QVL_MAX_DEEP);
    } else {
        cJSON_ArrayForEach(it, di) {
            if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble)
                return err_setf(e, ERR_CONFIG, "deepstack_visual_indexes: each an integer");
            q->deep_at[q->n_deep++] = (int)it->valuedouble;
        }
    }
    for (int k = 0; k < q->n_deep; k++) {
        if (q->deep_at[k] < 0 || q->deep_at[k] >= q->n_layer)
            return err_setf(e, ERR_CONFIG, "deepstack_visual_indexes[%d] = %d is not a block of the %d", k,
                            q->deep_at[k], q->n_layer);
        for (int j = 0; j < k; j++)
            if (q->deep_at[j] == q->deep_at[k])
                return err_setf(e, ERR_CONFIG, "deepstack_visual_indexes names block %d twice", q->deep_at[k]);
    }
    return 0;
}

static int parse_config(struct qvl *q, struct vision *v, const struct model *m, const cJSON *cfg,
                        const cJSON *vc, struct err *e)
{
    char act[64];
    int rc, mlp_ratio_i = 0, window = 0;
    double mlp_ratio = 4.0;
    const char *def_act = q->v3 ? "gelu_pytorch_tanh" : q->v25 ? "silu" : "quick_gelu";
    if ((rc = cfg_opt_int(vc, "depth", q->v3 ? 27 : 32, &q->n_layer, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_heads", 16, &q->n_head, e)) < 0 ||
        (rc = cfg_opt_int(vc, "in_channels", 3, &q->C, e)) < 0 ||
        (rc = cfg_opt_int(vc, "patch_size", q->v3 ? 16 : 14, &q->p, e)) < 0 ||
        (rc = cfg_opt_int(vc, "temporal_patch_size", 2, &q->tp, e)) < 0 ||
        (rc = cfg_opt_int(vc, "spatial_merge_size", 2, &q->merge, e)) < 0 ||
        (rc = cfg_opt_str(vc, "hidden_act", def_act, act, sizeof act, e)) < 0)
        return err_prefix(e, "vision_config");
    if (q->v3) {
        if ((rc = cfg_opt_int(vc, "hidden_size", 1152, &q->dv, e)) < 0 ||
            (rc = cfg_opt_int(vc, "intermediate_size", 4304, &q->n_ff, e)) < 0 ||
            (rc = cfg_opt_int(vc, "out_hidden_size", 3584, &q->out_dim, e)) < 0 ||
            (rc = parse_qwen3(q, vc, e)) < 0)
            return err_prefix(e, "vision_config");
    } else if (q->v25) {
        if ((rc = cfg_opt_int(vc, "hidden_size", 3584, &q->dv, e)) < 0 ||
            (rc = cfg_opt_int(vc, "intermediate_size", 3420, &q->n_ff, e)) < 0 ||
            (rc = cfg_opt_int(vc, "out_hidden_size", 3584, &q->out_dim, e)) < 0 ||
            (rc = cfg_opt_int(vc, "window_size", 112, &window, e)) < 0)
            return err_prefix(e, "vision_config");
    } else {
        const cJSON *mr = cJSON_GetObjectItemCaseSensitive(vc, "mlp_ratio");
        if (mr && !cJSON_IsNumber(mr))
            return err_setf(e, ERR_CONFIG, "vision_config.mlp_ratio must be a number");
        mlp_ratio = mr ? mr->valuedouble : 4.0;
        if ((rc = cfg_opt_int(vc, "embed_dim", 1280, &q->dv, e)) < 0 ||
            (rc = cfg_opt_int(vc, "hidden_size", 3584, &q->out_dim, e)) < 0)
            return err_prefix(e, "vision_config");
        if (!(mlp_ratio > 0 && mlp_ratio <= 64))
            return err_setf(e, ERR_CONFIG, "vision_config.mlp_ratio %g out of (0, 64]", mlp_ratio);
        mlp_ratio_i = (int)(q->dv * mlp_ratio);   /* int(embed_dim * mlp_ratio), as transformers */
        q->n_ff = mlp_ratio_i;
    }
    if ((rc = parse_act(act, &q->act, &q->quick, e)) < 0)
        return rc;
    if (q->dv < 1 || q->dv > QVL_MAX_EMBD || q->n_head < 1 || q->dv % q->n_head || q->n_ff < 1 ||
        q->n_ff > QVL_MAX_FF || q->n_layer < 1 || q->n_layer > QVL_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "vision_config: width %d, %d heads, intermediate %d, depth %d out of "
                        "range (width a multiple of the heads, at most %d wide, %d blocks)", q->dv, q->n_head,
                        q->n_ff, q->n_layer, QVL_MAX_EMBD, QVL_MAX_LAYERS);
    q->hd = q->dv / q->n_head;
    if (q->hd % 4 || q->hd / 2 > HP_MAX_ROT_HALF)
        return err_setf(e, ERR_CONFIG, "vision_config: head dim %d must be a multiple of 4 (2-D rope), at most "
                        "%d", q->hd, 2 * HP_MAX_ROT_HALF);
    if (q->C < 1 || q->C > 4 || q->p < 1 || q->p > 64 || q->tp < 1 || q->tp > 8 || q->merge < 1 || q->merge > 8)
        return err_setf(e, ERR_CONFIG, "vision_config: in_channels %d (1-4), patch_size %d (1-64), "
                        "temporal_patch_size %d and spatial_merge_size %d (1-8) out of range", q->C, q->p,
                        q->tp, q->merge);
    if (q->out_dim != m->hp.n_embd)
        return err_setf(e, ERR_CONFIG, "vision_config: the merger writes %d wide rows, the text model is %d "
                        "wide", q->out_dim, m->hp.n_embd);
    if (q->v25) {
        int unit = q->merge * q->p;
        if (window < unit || window % unit || window / unit > 64)
            return err_setf(e, ERR_CONFIG, "vision_config.window_size %d must be a multiple of patch_size x "
                            "spatial_merge_size (%d), at most 64 of them", window, unit);
        q->win = window / unit;
    }
    if (!hparams_has_mrope(&m->hp))
        return err_setf(e, ERR_CONFIG, "the text model has no mrope_section: %s's images need M-RoPE",
                        v->ops->model_type);
    int img, vs, ve;
    if ((rc = cfg_opt_int(cfg, "image_token_id", 151655, &img, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "vision_start_token_id", 151652, &vs, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "vision_end_token_id", 151653, &ve, e)) < 0)
        return rc;
    int V = m->hp.n_vocab;
    if (img < 0 || img >= V || vs < 0 || vs >= V || ve < 0 || ve >= V)
        return err_setf(e, ERR_CONFIG, "image_token_id %d, vision_start_token_id %d, vision_end_token_id %d "
                        "must be inside the vocabulary [0, %d)", img, vs, ve, V);
    if (q->n_deep > m->hp.n_layer)
        return err_setf(e, ERR_CONFIG, "vision_config.deepstack_visual_indexes: %d deepstack features for a "
                        "text model of %d layers", q->n_deep, m->hp.n_layer);
    v->info = (struct vision_info){.n_channels = q->C, .image_token_id = img, .boi_token_id = vs,
                                   .eoi_token_id = ve, .merge = q->merge, .patch_size = q->p,
                                   .temporal_patch_size = q->tp, .patch_dim = q->C * q->tp * q->p * q->p,
                                   .max_patches = QVL_MAX_PATCHES, .n_deepstack = q->n_deep};
    return parse_full(q, vc, e);
}

// ---- weights ----

/* The Conv3d weight as the matrix [dv, C tp p p] in torch's (c, t, y, x) order: a view of
 * torch's layout, or a copy of mlx-vlm's channels-last [dv, tp, p, p, C] reordered. */
static int map_patch(struct qvl *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    char name[512];
    int64_t D = q->dv, C = q->C, T = q->tp, P = q->p, K = C * T * P * P;
    snprintf(name, sizeof name, "%spatch_embed.proj.weight", pre);
    /* five dims, past struct tensor's four: checked and viewed here from the stored entry
     * (synth's recording set is told torch's layout first, as wmap tells it the others) */
    const int64_t conv[5] = {D, C, T, P, P};
    int rc0 = st_set_is_recording(w->st) ? st_set_record(w->st, name, DTYPE_F32, 5, conv, e) : 0;
    if (rc0 < 0)
        return rc0;
    const struct st_tensor *st = st_set_find(w->st, name);
    if (!st)
        return err_setf(e, ERR_MISSING, "missing tensor '%s'", name);
    bool cl = st->ndim == 5 && st->shape[4] == C && st->shape[1] == T && !(st->shape[1] == C && st->shape[2] == T);
    const int64_t torch[5] = {D, C, T, P, P}, mlx[5] = {D, T, P, P, C}, *want = cl ? mlx : torch;
    int64_t mat[2] = {D, K};
    size_t es = dtype_size(st->dtype);
    bool shape_ok = st->ndim == 5;
    for (int i = 0; shape_ok && i < 5; i++)
        shape_ok = st->shape[i] == want[i];
    if (!shape_ok)
        return err_setf(e, ERR_FORMAT, "%s: shape must be [%lld, %lld, %lld, %lld, %lld] (the Conv3d of "
                        "vision_config), or mlx-vlm's channels-last order", name, (long long)D, (long long)C,
                        (long long)T, (long long)P, (long long)P);
    if ((st->dtype != DTYPE_F32 && st->dtype != DTYPE_F16 && st->dtype != DTYPE_BF16) || !st->data ||
        st->end - st->begin != (uint64_t)(D * K) * es)
        return err_setf(e, ERR_UNSUPPORTED, "%s: the patch embedding must be F32, F16 or BF16 (a quantized one is "
                        "not supported)", name);
    struct tensor t;
    tensor_init(&t, st->dtype, (void *)(uintptr_t)st->data, 2, mat);
    t.name = st->name;
    st_set_mark(w->st, name);
    int rc;
    if (!cl) {
        q->patch_w = t;
        return 0;
    }
    char *dst;
    if ((rc = model_alloc_owned(m, (size_t)(D * K) * es, (void **)&dst, e)) < 0)
        return rc;
    const char *src = t.data;
    for (int64_t o = 0; o < D; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t tt = 0; tt < T; tt++)
                for (int64_t y = 0; y < P; y++)
                    for (int64_t x = 0; x < P; x++)
                        memcpy(dst + (size_t)(o * K + ((c * T + tt) * P + y) * P + x) * es,
                               src + (size_t)(o * K + ((tt * P + y) * P + x) * C + c) * es, es);
    tensor_init(&q->patch_w, t.dtype, dst, 2, mat);
    q->patch_w.name = t.name;
    return 0;
}

static int map_block(struct qvl *q, struct layer *L, struct wmap *w, const char *pre, int il, struct err *e)
{
    int64_t D = q->dv, F = q->n_ff;
    int rc;
    bool ln = !q->v25;
    const char *fc1 = q->v3 ? "linear_fc1" : "fc1", *fc2 = q->v3 ? "linear_fc2" : "fc2";
    /* Qwen2.5-VL's RMSNorm has no bias: not asked for (synth would write one) */
    if ((rc = wm_vec(w, &L->attn_norm, WM_REQUIRED, D, e, "%sblocks.%d.norm1.weight", pre, il)) < 0 ||
        (ln && (rc = wm_vec(w, &L->attn_norm_b, WM_REQUIRED, D, e, "%sblocks.%d.norm1.bias", pre, il)) < 0) ||
        (rc = wm_vec(w, &L->ffn_norm, WM_REQUIRED, D, e, "%sblocks.%d.norm2.weight", pre, il)) < 0 ||
        (ln && (rc = wm_vec(w, &L->ffn_norm_b, WM_REQUIRED, D, e, "%sblocks.%d.norm2.bias", pre, il)) < 0) ||
        (rc = wm_linear(w, &L->wqkv, WM_REQUIRED, 0, 3 * D, D, e, "%sblocks.%d.attn.qkv", pre, il)) < 0 ||
        (rc = wm_vec(w, &L->bqkv, WM_REQUIRED, 3 * D, e, "%sblocks.%d.attn.qkv.bias", pre, il)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, D, D, e, "%sblocks.%d.attn.proj", pre, il)) < 0 ||
        (rc = wm_vec(w, &L->bo, WM_REQUIRED, D, e, "%sblocks.%d.attn.proj.bias", pre, il)) < 0)
        return rc;
    if (!q->v25) {
        if ((rc = wm_linear(w, &L->up, WM_REQUIRED, 0, F, D, e, "%sblocks.%d.mlp.%s", pre, il, fc1)) < 0 ||
            (rc = wm_vec(w, &L->up_b, WM_REQUIRED, F, e, "%sblocks.%d.mlp.%s.bias", pre, il, fc1)) < 0 ||
            (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, D, F, e, "%sblocks.%d.mlp.%s", pre, il, fc2)) < 0 ||
            (rc = wm_vec(w, &L->down_b, WM_REQUIRED, D, e, "%sblocks.%d.mlp.%s.bias", pre, il, fc2)) < 0)
            return rc;
        return 0;
    }
    if ((rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, F, D, e, "%sblocks.%d.mlp.gate_proj", pre, il)) < 0 ||
        (rc = wm_vec(w, &L->gate_b, WM_REQUIRED, F, e, "%sblocks.%d.mlp.gate_proj.bias", pre, il)) < 0 ||
        (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, F, D, e, "%sblocks.%d.mlp.up_proj", pre, il)) < 0 ||
        (rc = wm_vec(w, &L->up_b, WM_REQUIRED, F, e, "%sblocks.%d.mlp.up_proj.bias", pre, il)) < 0 ||
        (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, D, F, e, "%sblocks.%d.mlp.down_proj", pre, il)) < 0 ||
        (rc = wm_vec(w, &L->down_b, WM_REQUIRED, D, e, "%sblocks.%d.mlp.down_proj.bias", pre, il)) < 0)
        return rc;
    return 0;
}

/* A Qwen3-VL merger under name (merger., deepstack_merger_list.K.): its norm over nw values. */
static int map_merger(const struct qvl *q, struct qvl_merger *g, struct wmap *w, const char *pre,
                      const char *name, int64_t nw, struct err *e)
{
    int64_t M = (int64_t)q->dv * q->merge * q->merge;
    int rc;
    if ((rc = wm_vec(w, &g->norm, WM_REQUIRED, nw, e, "%s%snorm.weight", pre, name)) < 0 ||
        (rc = wm_vec(w, &g->norm_b, WM_REQUIRED, nw, e, "%s%snorm.bias", pre, name)) < 0 ||
        (rc = wm_linear(w, &g->fc1, WM_REQUIRED, 0, M, M, e, "%s%slinear_fc1", pre, name)) < 0 ||
        (rc = wm_vec(w, &g->fc1_b, WM_REQUIRED, M, e, "%s%slinear_fc1.bias", pre, name)) < 0 ||
        (rc = wm_linear(w, &g->fc2, WM_REQUIRED, 0, q->out_dim, M, e, "%s%slinear_fc2", pre, name)) < 0 ||
        (rc = wm_vec(w, &g->fc2_b, WM_REQUIRED, q->out_dim, e, "%s%slinear_fc2.bias", pre, name)) < 0)
        return rc;
    return 0;
}

/* Qwen3-VL's learned position table pos_embed [n_side², dv], widened to f32 on the host
 * once: fast_pos_embed_interpolate reads it per image there (bilinear weights per patch). */
static int map_pos_embed(struct qvl *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    char name[512];
    int64_t n = (int64_t)q->n_side * q->n_side, D = q->dv;
    snprintf(name, sizeof name, "%spos_embed.weight", pre);
    if (st_set_is_recording(w->st)) {  /* synth: the table's shape, no values to widen */
        const int64_t shape[2] = {n, D};
        return st_set_record(w->st, name, DTYPE_F32, 2, shape, e);
    }
    const struct st_tensor *st = st_set_find(w->st, name);
    if (!st)
        return err_setf(e, ERR_MISSING, "missing tensor '%s'", name);
    if (st->ndim != 2 || st->shape[0] != n || st->shape[1] != D)
        return err_setf(e, ERR_FORMAT, "%s: shape must be [%lld, %lld] (num_position_embeddings, hidden_size)",
                        name, (long long)n, (long long)D);
    if ((st->dtype != DTYPE_F32 && st->dtype != DTYPE_F16 && st->dtype != DTYPE_BF16) || !st->data ||
        st->end - st->begin != (uint64_t)(n * D) * dtype_size(st->dtype))
        return err_setf(e, ERR_UNSUPPORTED, "%s must be F32, F16 or BF16 (a quantized position table is not "
                        "supported)", name);
    int rc = model_alloc_owned(m, (size_t)(n * D) * sizeof(float), (void **)&q->pos, e);
    if (rc < 0)
        return rc;
    dtype_to_f32_ref(q->pos, st->data, st->dtype, (size_t)(n * D));
    st_set_mark(w->st, name);
    return 0;
}

static int map_qwen3(struct qvl *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    int64_t M = (int64_t)q->dv * q->merge * q->merge;
    char name[64];
    int rc;
    if ((rc = wm_vec(w, &q->patch_b, WM_REQUIRED, q->dv, e, "%spatch_embed.proj.bias", pre)) < 0 ||
        (rc = map_pos_embed(q, m, w, pre, e)) < 0)
        return rc;
    struct qvl_merger g;
    if ((rc = map_merger(q, &g, w, pre, "merger.", q->dv, e)) < 0)
        return rc;
    q->ln_q = g.norm;
    q->ln_q_b = g.norm_b;
    q->mlp0 = g.fc1;
    q->mlp0_b = g.fc1_b;
    q->mlp2 = g.fc2;
    q->mlp2_b = g.fc2_b;
    for (int k = 0; k < q->n_deep; k++) {
        snprintf(name, sizeof name, "deepstack_merger_list.%d.", k);
        if ((rc = map_merger(q, &q->deep[k], w, pre, name, M, e)) < 0)
            return rc;
    }
    return 0;
}

static int map_weights(struct qvl *q, struct model *m, struct wmap *w, const char *pre, struct err *e)
{
    int rc;
    int64_t M = (int64_t)q->dv * q->merge * q->merge;
    q->layers = calloc((size_t)q->n_layer, sizeof *q->layers);
    if (!q->layers)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = map_patch(q, m, w, pre, e)) < 0)
        return rc;
    for (int il = 0; il < q->n_layer; il++)
        if ((rc = map_block(q, &q->layers[il], w, pre, il, e)) < 0)
            return rc;
    if (q->v3)
        return map_qwen3(q, m, w, pre, e);
    if ((rc = wm_vec(w, &q->ln_q, WM_REQUIRED, q->dv, e, "%smerger.ln_q.weight", pre)) < 0 ||
        (!q->v25 && (rc = wm_vec(w, &q->ln_q_b, WM_REQUIRED, q->dv, e, "%smerger.ln_q.bias", pre)) < 0) ||
        (rc = wm_linear(w, &q->mlp0, WM_REQUIRED, 0, M, M, e, "%smerger.mlp.0", pre)) < 0 ||
        (rc = wm_vec(w, &q->mlp0_b, WM_REQUIRED, M, e, "%smerger.mlp.0.bias", pre)) < 0 ||
        (rc = wm_linear(w, &q->mlp2, WM_REQUIRED, 0, q->out_dim, M, e, "%smerger.mlp.2", pre)) < 0 ||
        (rc = wm_vec(w, &q->mlp2_b, WM_REQUIRED, q->out_dim, e, "%smerger.mlp.2.bias", pre)) < 0)
        return rc;
    return 0;
}

static int qvl_load(struct vision *v, struct model *m, const cJSON *cfg, bool v25, bool v3, struct err *e)
{
    static const char *const towers[] = {"model.visual.", "visual.", "vision_tower.", "model.vision_tower."};
    struct wmap w = {m->st, &m->hp.quant};
    int which = -1;
    for (int i = 0; i < 4 && which < 0; i++)
        if (wm_has(&w, "%spatch_embed.proj.weight", towers[i]))
            which = i;
    if (which < 0) {
        err_setf(e, ERR_MISSING, "no visual.patch_embed.proj.weight");
        return 1;
    }
    const cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
    if (!cJSON_IsObject(vc))
        return err_setf(e, ERR_CONFIG, "the vision tower's tensors are there but config.json has no "
                        "vision_config object");
    struct qvl *q = calloc(1, sizeof *q);
    if (!q)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->family = q;
    q->v25 = v25;
    q->v3 = v3;
    int rc = parse_config(q, v, m, cfg, vc, e);
    return rc < 0 ? rc : map_weights(q, m, &w, towers[which], e);
}

static int qwen2_vl_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    return qvl_load(v, m, cfg, false, false, e);
}

static int qwen2_5_vl_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    return qvl_load(v, m, cfg, true, false, e);
}

static int qwen3_vl_load(struct vision *v, struct model *m, const cJSON *cfg, struct err *e)
{
    return qvl_load(v, m, cfg, false, true, e);
}

static void qvl_free_family(struct vision *v)
{
    struct qvl *q = v->family;
    if (q) {
        free(q->layers);
        free(q->full);
    }
    free(q);
    v->family = NULL;
}

static void qvl_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear), void *ud)
{
    struct qvl *q = v->family;
    struct tensor *mats[] = {&q->patch_w, &q->mlp0, &q->mlp2};
    struct tensor *vals[] = {&q->ln_q, &q->ln_q_b, &q->mlp0_b, &q->mlp2_b};
    for (size_t i = 0; i < 3; i++)
        fn(ud, mats[i], true);
    for (size_t i = 0; i < 4; i++)
        if (tensor_is_present(vals[i]))
            fn(ud, vals[i], false);
    if (tensor_is_present(&q->patch_b))
        fn(ud, &q->patch_b, false);
    for (int k = 0; k < q->n_deep; k++) {
        struct qvl_merger *g = &q->deep[k];
        struct tensor *gm[] = {&g->fc1, &g->fc2}, *gv[] = {&g->norm, &g->norm_b, &g->fc1_b, &g->fc2_b};
        for (size_t i = 0; i < 2; i++)
            if (tensor_is_present(gm[i]))
                fn(ud, gm[i], true);
        for (size_t i = 0; i < 4; i++)
            if (tensor_is_present(gv[i]))
                fn(ud, gv[i], false);
    }
    for (int il = 0; q->layers && il < q->n_layer; il++) {
        struct layer *L = &q->layers[il];
        struct tensor *lm[] = {&L->wqkv, &L->wo, &L->gate, &L->up, &L->down};
        struct tensor *lv[] = {&L->attn_norm, &L->attn_norm_b, &L->ffn_norm, &L->ffn_norm_b, &L->bqkv,
                               &L->bo, &L->gate_b, &L->up_b, &L->down_b};
        for (size_t i = 0; i < sizeof lm / sizeof lm[0]; i++)
            if (tensor_is_present(lm[i]))
                fn(ud, lm[i], true);
        for (size_t i = 0; i < sizeof lv / sizeof lv[0]; i++)
            if (tensor_is_present(lv[i]))
                fn(ud, lv[i], false);
    }
}

// ---- context ----

static void *carve(char *base, size_t *off, size_t n)
{
    void *p = base ? base + *off : NULL;
    *off += ((n + 15) & ~(size_t)15) * sizeof(float);
    return p;
}

/* Meta ints: full rows (pos, slot, table, end, span 2P), window rows (the same), three
 * position streams, the window tables, the gather of merged rows. */
static size_t meta_ints(int P, int W)
{
    return 6 * (size_t)P + 6 * (size_t)P + 3 * (size_t)P + (size_t)W + 1 + (size_t)P;
}

static size_t layout(struct qvl_bufs *qb, const struct qvl *q, int P, int KV, int W, char *base)
{
    size_t off = 0, D = (size_t)q->dv, n = (size_t)P, M = D * q->merge * q->merge;
    size_t pd = (size_t)q->C * q->tp * q->p * q->p;
    struct ctx_bufs b = {0};
    b.x = carve(base, &off, n * D);
    b.xn = carve(base, &off, n * D);
    b.qkv = carve(base, &off, n * 3 * D);
    b.att = carve(base, &off, n * D);
    b.o = carve(base, &off, n * D);
    b.f = carve(base, &off, n * D);
    b.h = carve(base, &off, n * 2 * (size_t)q->n_ff > n * D ? n * 2 * (size_t)q->n_ff : n * D);
    b.h1 = carve(base, &off, n * (size_t)q->n_ff > n * D ? n * (size_t)q->n_ff : n * D);
    float *k = carve(base, &off, (size_t)KV * D), *v = carve(base, &off, (size_t)KV * D);
    float *patches = carve(base, &off, n * pd);
    float *tmp = carve(base, &off, n / (q->merge * q->merge) * (M > (size_t)q->out_dim ? M : (size_t)q->out_dim));
    float *mrope = carve(base, &off, 3 * HP_MAX_ROT_HALF);
    int32_t *meta = carve(base, &off, meta_ints(P, W));
    if (base) {
        qb->b = b;
        qb->k = k;
        qb->v = v;
        qb->patches = patches;
        qb->tmp = tmp;
        qb->mrope = mrope;
        qb->meta = meta;
    }
    return off;
}

/* Room for an image of P patches whose windows need KV slots in W windows. */
static int qvl_reserve(struct vision_ctx *vc, int P, int KV, int W, struct err *e)
{
    struct qvl_bufs *qb = vc->fam;
    const struct qvl *q = vc->m->vision->family;
    if (P <= qb->cap && KV <= qb->cap_kv && W <= qb->cap_win)
        return 0;
    P = P > qb->cap ? P : qb->cap;
    KV = KV > qb->cap_kv ? KV : qb->cap_kv;
    W = W > qb->cap_win ? W : qb->cap_win;
    KV = KV > P ? KV : P;
    size_t pd = (size_t)q->C * q->tp * q->p * q->p;
    float *ph = malloc((size_t)P * pd * sizeof *ph);
    int32_t *mh = malloc(meta_ints(P, W) * sizeof *mh);
    float *pos = q->v3 ? malloc((size_t)P * q->dv * sizeof *pos) : NULL;
    if (!ph || !mh || (q->v3 && !pos)) {
        free(ph);
        free(mh);
        free(pos);
        return err_setf(e, ERR_NOMEM, "out of memory for an image of %d patches", P);
    }
    free(qb->pos_host);
    qb->pos_host = pos;
    if (qb->arena)
        vc->be->ops->buf_free(vc->be, qb->arena);
    qb->arena = NULL;
    qb->cap = qb->cap_kv = qb->cap_win = 0;
    free(qb->patches_host);
    free(qb->meta_host);
    qb->patches_host = ph;
    qb->meta_host = mh;
    size_t bytes = layout(qb, q, P, KV, W, NULL);
    int rc = vc->be->ops->buf_alloc(vc->be, bytes, &qb->arena, e);
    if (rc < 0)
        return err_prefix(e, "vision tower activations of %d patches (%zu MiB)", P, bytes >> 20);
    layout(qb, q, P, KV, W, qb->arena);
    qb->cap = P;
    qb->cap_kv = KV;
    qb->cap_win = W;
    /* the 2-D rope: VisionRotaryEmbedding(hd / 2) frequencies, the first hd/4 by row, the
     * rest by column; the third stream turns nothing */
    float m[3 * HP_MAX_ROT_HALF] = {0};
    int q4 = q->hd / 4;
    for (int j = 0; j < q4; j++) {
        float f = (float)(1.0 / pow(10000.0, (2.0 * j) / (q->hd / 2)));
        m[j] = f;
        m[HP_MAX_ROT_HALF + q4 + j] = f;
    }
    vc->be->ops->upload(vc->be, qb->mrope, m, sizeof m);
    return backend_sync(vc->be, e);
}

static int qvl_ctx_new(struct vision_ctx *vc, struct err *e)
{
    struct qvl_bufs *qb = calloc(1, sizeof *qb);
    if (!qb)
        return err_setf(e, ERR_NOMEM, "out of memory");
    vc->fam = qb;
    return 0;
}

static void qvl_ctx_free(struct vision_ctx *vc)
{
    struct qvl_bufs *qb = vc->fam;
    if (qb->arena)
        vc->be->ops->buf_free(vc->be, qb->arena);
    free(qb->patches_host);
    free(qb->meta_host);
    free(qb->pos_host);
    free(qb);
    vc->fam = NULL;
}

// ---- forward ----

/* get_vision_window_index for one image of gh x gw merged tokens (t = 1): order[j] = the
 * merge unit at window-order place j; the windows (ws x ws units, the last row and column
 * of windows cut by the grid) row-major, the units in each row-major; wlen[w] its units
 * (windows left empty by the padding skipped). Returns the windows. */
static int window_order(int32_t *order, int32_t *wlen, int gh, int gw, int ws)
{
    int nwh = (gh + ws - 1) / ws, nww = (gw + ws - 1) / ws, j = 0, nw = 0;
    for (int wy = 0; wy < nwh; wy++)
        for (int wx = 0; wx < nww; wx++) {
            int n = 0;
            for (int y = wy * ws; y < (wy + 1) * ws && y < gh; y++)
                for (int x = wx * ws; x < (wx + 1) * ws && x < gw; x++) {
                    order[j++] = y * gw + x;
                    n++;
                }
            if (n)
                wlen[nw++] = n;
        }
    return nw;
}

/* Host metadata for P patches (window order when windows): positions, slots, spans for the
 * full and window attention, the three rope streams, the gather back to processor order. */
static void stage_rows(struct qvl_bufs *qb, const struct qvl *q, const int32_t *unit_of, const int32_t *wlen,
                       int nw, int P, int gw_units, int Wmax, int W)
{
    int u = q->merge * q->merge;
    int32_t *h = qb->meta_host, *d = qb->meta;
    /* full: one sequence of P */
    int32_t *fpos = h, *fslot = h + P, *ftab = h + 2 * P, *fend = h + 3 * P, *fspan = h + 4 * P;
    int32_t *wpos = h + 6 * P, *wslot = h + 7 * P, *wtab = h + 8 * P, *wend = h + 9 * P, *wspan = h + 10 * P;
    int32_t *mp = h + 12 * P, *tables = h + 15 * P, *gather = tables + W + 1;
    for (int i = 0; i < P; i++) {
        fpos[i] = fslot[i] = i;
        ftab[i] = W;     /* tables[W] = 0: one block of P slots */
        fend[i] = P;
        fspan[2 * i] = 0;
        fspan[2 * i + 1] = P - 1;
    }
    tables[W] = 0;
    /* windows: each its own sequence in block w (Wmax slots) */
    for (int w = 0, i = 0; w < nw; w++) {
        int len = wlen[w] * u;
        tables[w] = w;
        for (int r = 0; r < len; r++, i++) {
            wpos[i] = r;
            wslot[i] = w * Wmax + r;
            wtab[i] = w;
            wend[i] = len;
            wspan[2 * i] = 0;
            wspan[2 * i + 1] = len - 1;
        }
    }
    /* row i is patch (unit_of[i / u], i % u): its row and column in the patch grid */
    for (int i = 0; i < P; i++) {
        int unit = unit_of[i / u], k = i % u;
        int uy = unit / gw_units, ux = unit % gw_units;
        mp[i] = uy * q->merge + k / q->merge;
        mp[P + i] = ux * q->merge + k % q->merge;
        mp[2 * P + i] = 0;
    }
    for (int j = 0; j < P / u; j++)
        gather[unit_of[j]] = j;
    qb->full = (struct kv_rows){.pos = d, .slot = d + P, .table = d + 2 * P, .seq_end = d + 3 * P,
                                .span = d + 4 * P, .tables = d + 15 * P, .block_size = P};
    qb->win = (struct kv_rows){.pos = d + 6 * P, .slot = d + 7 * P, .table = d + 8 * P, .seq_end = d + 9 * P,
                               .span = d + 10 * P, .tables = d + 15 * P, .block_size = Wmax};
    qb->mpos = d + 12 * P;
    qb->gather = d + 15 * P + W + 1;
}

/* x = fc2(act(fc1 x)) or down(act(gate x) * up x) with biases. */
static void qvl_mlp(struct backend *be, const struct qvl *q, const struct layer *L, const struct ctx_bufs *b,
                    int P)
{
    const struct backend_ops *op = be->ops;
    enum act_kind act = q->act;
    if (q->v25) {
        blk_glu(be, b->f, b->xn, L, act, q->n_ff, b, P);
        return;
    }
    op->linear(be, b->h, q->n_ff, b->xn, &L->up, &L->up_b, P);
    if (q->quick) {   /* quick_gelu: x * sigmoid(1.702 x) */
        op->copy(be, b->h1, b->h, (size_t)P * q->n_ff * sizeof(float));
        op->scale(be, b->h1, q->n_ff, 1.702f, P, q->n_ff);
        op->act(be, ACT_SIGMOID, b->h1, q->n_ff, P, q->n_ff);
        op->mul(be, b->h, q->n_ff, b->h, q->n_ff, b->h1, q->n_ff, P, q->n_ff);
    } else {
        op->act(be, act, b->h, q->n_ff, P, q->n_ff);
    }
    op->linear(be, b->f, q->dv, b->h, &L->down, &L->down_b, P);
}

/* torch.linspace(0, side - 1, n) in float32, as its CPU kernel steps: from the start for the
 * first half, back from the end for the rest. */
static float linspace_at(int side, int n, int i)
{
    if (n == 1)
        return 0.0f;
    float end = (float)(side - 1), step = end / (float)(n - 1);
    return i < n / 2 ? step * (float)i : end - step * (float)(n - 1 - i);
}

/* Qwen3-VL's fast_pos_embed_interpolate for one image of gh x gw patches: each patch's row of
 * the learned n_side x n_side table, bilinear at (linspace(0, n_side - 1, gh)[r],
 * linspace(..., gw)[c]) with the weights in float32 as transformers makes them, written in
 * the processor's order (merge units of merge x merge patches, row-major). */
static void pos_interpolate(float *dst, const struct qvl *q, int gh, int gw)
{
    int S = q->n_side, D = q->dv, m = q->merge;
    for (int r = 0; r < gh; r++) {
        float hy = linspace_at(S, gh, r);
        int h0 = (int)hy, h1 = h0 + 1 < S ? h0 + 1 : S - 1;
        float dh = hy - (float)h0;
        for (int c = 0; c < gw; c++) {
            float wx = linspace_at(S, gw, c);
            int w0 = (int)wx, w1 = w0 + 1 < S ? w0 + 1 : S - 1;
            float dw = wx - (float)w0;
            const float wt[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
            const float *src[4] = {q->pos + ((size_t)h0 * S + w0) * D, q->pos + ((size_t)h0 * S + w1) * D,
                                   q->pos + ((size_t)h1 * S + w0) * D, q->pos + ((size_t)h1 * S + w1) * D};
            /* raster (r, c) -> unit (r / m, c / m), place (r % m, c % m) within it */
            size_t row = (((size_t)(r / m) * (gw / m) + c / m) * m + r % m) * m + c % m;
            float *o = dst + row * D;
            for (int k = 0; k < D; k++)
                o[k] = wt[0] * src[0][k] + wt[1] * src[1][k] + wt[2] * src[2][k] + wt[3] * src[3][k];
        }
    }
}

/* A Qwen3-VL deepstack merger over the tower's current rows: each merge unit's merge² rows as
 * one of M values, LayerNorm over M (post-shuffle), Linear, GELU, Linear -> out [U, out_dim]. */
static void deep_merge(struct backend *be, const struct qvl *q, const struct qvl_merger *g,
                       const struct ctx_bufs *b, float *out, int U)
{
    int M = q->dv * q->merge * q->merge;
    struct blk_norm_w n = {NORM_LAYER, QVL_EPS, &g->norm, &g->norm_b, 0.0f};
    blk_norm(be, b->xn, b->x, &n, U, M);
    be->ops->linear(be, b->h, M, b->xn, &g->fc1, &g->fc1_b, U);
    be->ops->act(be, ACT_GELU_ERF, b->h, M, U, M);
    be->ops->linear(be, out, q->out_dim, b->h, &g->fc2, &g->fc2_b, U);
}

static int qvl_encode_grid(struct vision_ctx *vc, float *out, const float *pixels, const int32_t *grid,
                           struct err *e)
{
    const struct vision *v = vc->m->vision;
    const struct qvl *q = v->family;
    struct qvl_bufs *qb = vc->fam;
    struct backend *be = vc->be;
    const struct backend_ops *op = be->ops;
    int gh = grid[1], gw = grid[2], P = gh * gw, u = q->merge * q->merge, U = P / u;
    int guh = gh / q->merge, guw = gw / q->merge, D = q->dv, rc;
    size_t pd = (size_t)v->info.patch_dim;
    /* 1. the window order of the merge units (Qwen2.5-VL), else processor order */
    int32_t *unit_of = malloc((size_t)U * sizeof *unit_of), *wlen = malloc((size_t)U * sizeof *wlen);
    if (!unit_of || !wlen) {
        free(unit_of);
        free(wlen);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    int nw = 0, wmax = 0;
    if (q->win > 0) {
        nw = window_order(unit_of, wlen, guh, guw, q->win);
        for (int w = 0; w < nw; w++)
            wmax = wlen[w] * u > wmax ? wlen[w] * u : wmax;
    } else {
        for (int j = 0; j < U; j++)
            unit_of[j] = j;
    }
    if ((rc = qvl_reserve(vc, P, nw * wmax, nw, e)) < 0)
        goto out;
    /* 2. the patch rows in that order (the embedding is per row: permuting its input permutes
     *    its output), and the rows' metadata */
    for (int j = 0; j < U; j++)
        memcpy(qb->patches_host + (size_t)j * u * pd, pixels + (size_t)unit_of[j] * u * pd, u * pd * sizeof(float));
    stage_rows(qb, q, unit_of, wlen, nw, P, guw, wmax, nw);
    op->upload(be, qb->patches, qb->patches_host, (size_t)P * pd * sizeof(float));
    op->upload(be, qb->meta, qb->meta_host, meta_ints(P, nw) * sizeof(int32_t));
    const struct ctx_bufs *b = &qb->b;
    /* 3. patch embedding (Qwen3-VL: with its bias, plus the learned positions interpolated
     *    to the grid) */
    op->linear(be, b->x, D, qb->patches, &q->patch_w, q->v3 ? &q->patch_b : NULL, P);
    if (q->v3) {
        pos_interpolate(qb->pos_host, q, gh, gw);
        op->upload(be, b->xn, qb->pos_host, (size_t)P * D * sizeof(float));
        op->axpy(be, b->x, D, 1.0f, b->xn, D, P, D);
    }
    /* 4. the blocks */
    struct rope_params rp[3];
    for (int s = 0; s < 3; s++)
        rp[s] = (struct rope_params){.n_rot = q->hd, .inv_freq = qb->mrope + (size_t)s * HP_MAX_ROT_HALF,
                                     .mscale = 1.0f, .style = ROPE_STYLE_HALF};
    struct blk_attn_cfg ac = {
        .ap = {.n_head = q->n_head, .n_kv_head = q->n_head, .head_dim = q->hd,
               .scale = 1.0f / sqrtf((float)q->hd)},
        .n_embd = D,
        .mrope = rp,
        .mpos = qb->mpos,
        .mpos_ld = P,
    };
    struct kv_layer kv = {qb->k, qb->v, D, D, DTYPE_F32};
    enum norm_kind nk = q->v25 ? NORM_RMS : NORM_LAYER;
    int n_feat = 0;   /* deepstack planes written, in block order as transformers appends them */
    for (int il = 0; il < q->n_layer; il++) {
        const struct layer *L = &q->layers[il];
        struct blk_norm_w n1 = {nk, QVL_EPS, &L->attn_norm, &L->attn_norm_b, 0.0f};
        struct blk_norm_w n2 = {nk, QVL_EPS, &L->ffn_norm, &L->ffn_norm_b, 0.0f};
        blk_norm(be, b->xn, b->x, &n1, P, D);
        blk_attention(be, b->o, b->xn, L, &ac, &kv, q->full[il] || q->win == 0 ? &qb->full : &qb->win, b, P);
        op->axpy(be, b->x, D, 1.0f, b->o, D, P, D);
        blk_norm(be, b->xn, b->x, &n2, P, D);
        qvl_mlp(be, q, L, b, P);
        op->axpy(be, b->x, D, 1.0f, b->f, D, P, D);
        for (int k = 0; k < q->n_deep; k++)
            if (q->deep_at[k] == il)
                deep_merge(be, q, &q->deep[k], b, out + (size_t)(1 + n_feat++) * U * q->out_dim, U);
    }
    vc->hidden = b->x;
    vc->n_hidden = P;
    /* 5. the merger: ln_q per patch, merge² consecutive rows as one, Linear, GELU, Linear */
    struct blk_norm_w nq = {nk, QVL_EPS, &q->ln_q, &q->ln_q_b, 0.0f};
    int M = D * u;
    blk_norm(be, b->xn, b->x, &nq, P, D);
    op->linear(be, b->h, M, b->xn, &q->mlp0, &q->mlp0_b, U);
    op->act(be, ACT_GELU_ERF, b->h, M, U, M);
    if (q->win > 0) {
        /* back from window order: output row r is window-order row gather[r] */
        op->linear(be, qb->tmp, q->out_dim, b->h, &q->mlp2, &q->mlp2_b, U);
        op->gather(be, out, qb->tmp, q->out_dim, qb->gather, 1, U, q->out_dim);
    } else {
        op->linear(be, out, q->out_dim, b->h, &q->mlp2, &q->mlp2_b, U);
    }
    rc = 0;
out:
    free(unit_of);
    free(wlen);
    return rc;
}

const struct vision_ops qwen2_vl_vision_ops = {
    .model_type = "qwen2_vl",
    .description = "Qwen2-VL: ViT of 2-D rope over each image's own patch grid, LayerNorm + quick_gelu "
                   "blocks, 2 x 2 patch merger; M-RoPE in the text model",
    .load = qwen2_vl_load,
    .free_family = qvl_free_family,
    .each_weight = qvl_each_weight,
    .ctx_new = qvl_ctx_new,
    .ctx_free = qvl_ctx_free,
    .encode_grid = qvl_encode_grid,
};

const struct vision_ops qwen3_vl_vision_ops = {
    .model_type = "qwen3_vl",
    .description = "Qwen3-VL: ViT of 2-D rope plus a learned position table interpolated to each image's "
                   "grid, LayerNorm + gelu(tanh) blocks, 2 x 2 patch merger and DeepStack mergers whose "
                   "rows join the text model's first layers; interleaved M-RoPE in the text model",
    .load = qwen3_vl_load,
    .free_family = qvl_free_family,
    .each_weight = qvl_each_weight,
    .ctx_new = qvl_ctx_new,
    .ctx_free = qvl_ctx_free,
    .encode_grid = qvl_encode_grid,
};

/* Qwen3-VL-MoE: the same tower; its text model is qwen3_vl_moe_text */
const struct vision_ops qwen3_vl_moe_vision_ops = {
    .model_type = "qwen3_vl_moe",
    .description = "Qwen3-VL-MoE: Qwen3-VL's tower (learned positions, DeepStack mergers) before a Qwen3-MoE "
                   "text model with interleaved M-RoPE",
    .load = qwen3_vl_load,
    .free_family = qvl_free_family,
    .each_weight = qvl_each_weight,
    .ctx_new = qvl_ctx_new,
    .ctx_free = qvl_ctx_free,
    .encode_grid = qvl_encode_grid,
};

const struct vision_ops qwen2_5_vl_vision_ops = {
    .model_type = "qwen2_5_vl",
    .description = "Qwen2.5-VL: the Qwen2-VL ViT with RMSNorm + SwiGLU blocks and window attention "
                   "(fullatt_block_indexes full), RMSNorm merger; M-RoPE in the text model",
    .load = qwen2_5_vl_load,
    .free_family = qvl_free_family,
    .each_weight = qvl_each_weight,
    .ctx_new = qvl_ctx_new,
    .ctx_free = qvl_ctx_free,
    .encode_grid = qvl_encode_grid,
};
