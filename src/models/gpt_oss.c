/*
 * gpt_oss: GptOssForCausalLM (OpenAI gpt-oss). A Llama-shaped decoder with
 *
 *   block(x) = x + attn(rms(x)); x + moe(rms(x))     RMSNorm, pre-norm, sequential
 *   attn     = o_proj(attend(rope(q_proj x), rope(k_proj x), v_proj x))   all four with biases;
 *              rotate-half rope of the whole head, yarn; scale 1/sqrt(head_dim); one learned
 *              sink logit per head (self_attn.sinks) joins each query's softmax and is dropped
 *              after (it takes probability mass, adds no value row)
 *   layers   alternate sliding (window sliding_window, the query's own position included) and
 *              full attention per layer_types; absent: layer i slides when i is even
 *   moe      router = mlp.router linear with bias; top experts_per_token of its logits, softmax
 *              over those k; each expert: gate_up = gate_up_proj x + bias, gate / up its even /
 *              odd columns, g = min(gate, limit), u = clamp(up, -limit, limit),
 *              h = (u + 1) * g * sigmoid(alpha * g), out = down_proj h + bias
 *              (swiglu_limit 7, swiglu_alpha 1.702; hidden_act is not used)
 *   head     lm_head(rms(x)), untied by default
 *
 * Config (transformers GptOssConfig, defaults where a field is absent): the dims of
 * gpt-oss-120b's shape, attention_bias true, sliding_window 128, rope_theta 150000, and when
 * neither rope_scaling nor rope_parameters is given (or both are null) transformers' own yarn
 * {factor 32, beta_fast 32, beta_slow 1, truncate false, original_max_position_embeddings
 * 4096}; with original_max_position_embeddings stated, the yarn factor becomes
 * max_position_embeddings / original (hf_common's yarn rule).
 *
 * Checkpoint layouts of the experts (model.layers.N.mlp.experts.*):
 *   transformers  gate_up_proj [E, H, 2I] (x @ W: stored transposed to nn.Linear), gate in the
 *                 even columns, gate_up_proj_bias [E, 2I], down_proj [E, I, H], down_proj_bias
 *                 [E, H]: the only layout the kernels cannot read in place; the matrices are
 *                 transposed once at load into model-owned memory ([E, 2I, H] interleaved rows,
 *                 [E, H, I]), the biases stay views
 *   openai MXFP4  gate_up_proj_blocks [E, 2I, H/32, 16] U8 (two E2M1 codes a byte, low nibble
 *                 first), gate_up_proj_scales [E, 2I, H/32] U8 (E8M0), down_proj_blocks /
 *                 _scales, the same biases; quantization_config {quant_method: mxfp4}. The
 *                 bytes are MLX's mxfp4 packing, so they are bound as views of our mxfp4
 *                 kernels' [E, out, in] U32 codes, rows interleaved as above
 *   mlx-lm        gate_proj / up_proj / down_proj .{weight, scales, bias} [E, out, in] (its
 *                 sanitize splits the interleaved rows), experts mxfp4, the rest affine
 *                 through per-module quantization entries (the router's without a mode:
 *                 affine)
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"

/* transformers GptOssConfig defaults of the fields hf_common reads */
static const struct hf_defaults gpt_oss_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 150000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 64, .sliding = false, .tie_embd = false,
};

/* GptOssConfig's defaults of required-elsewhere fields, filled in when absent */
static const struct {
    const char *key;
    double value;
} gpt_oss_numbers[] = {
    {"vocab_size", 201088},      {"hidden_size", 2880},           {"num_hidden_layers", 36},
    {"num_attention_heads", 64}, {"num_key_value_heads", 8},      {"intermediate_size", 2880},
    {"max_position_embeddings", 131072}, {"num_experts_per_tok", 4}, {"sliding_window", 128},
};

/* cfg with transformers' resolution of the absent fields applied (owned by the caller). */
static int resolved_config(const cJSON *cfg, cJSON **out, struct err *e)
{
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c)
        return err_setf(e, ERR_NOMEM, "gpt_oss: out of memory");
    bool ok = true;
    for (size_t i = 0; i < sizeof gpt_oss_numbers / sizeof gpt_oss_numbers[0]; i++)
        if (!cJSON_GetObjectItemCaseSensitive(c, gpt_oss_numbers[i].key))
            ok = ok && cJSON_AddNumberToObject(c, gpt_oss_numbers[i].key, gpt_oss_numbers[i].value);
    /* num_experts is an alias of num_local_experts (attribute_map) */
    if (!cJSON_GetObjectItemCaseSensitive(c, "num_local_experts")) {
        const cJSON *ne = cJSON_GetObjectItemCaseSensitive(c, "num_experts");
        ok = ok && (ne ? cJSON_AddItemToObject(c, "num_local_experts", cJSON_Duplicate(ne, true))
                       : cJSON_AddNumberToObject(c, "num_local_experts", 128) != NULL);
    }
    if (!cJSON_GetObjectItemCaseSensitive(c, "attention_bias"))
        ok = ok && cJSON_AddBoolToObject(c, "attention_bias", true);
    /* the trap: no rope scaling stated means transformers' default yarn, not plain rope */
    if (!cfg_has(c, "rope_scaling") && !cfg_has(c, "rope_parameters")) {
        cJSON *rp = cJSON_CreateObject();
        ok = ok && rp && cJSON_AddStringToObject(rp, "rope_type", "yarn") &&
             cJSON_AddNumberToObject(rp, "factor", 32.0) &&
             cJSON_AddNumberToObject(rp, "beta_fast", 32.0) &&
             cJSON_AddNumberToObject(rp, "beta_slow", 1.0) &&
             cJSON_AddBoolToObject(rp, "truncate", false) &&
             cJSON_AddNumberToObject(rp, "original_max_position_embeddings", 4096);
        cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_scaling");
        cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_parameters");
        ok = ok && rp && cJSON_AddItemToObject(c, "rope_parameters", rp);
        if (!ok && rp && !cJSON_GetObjectItemCaseSensitive(c, "rope_parameters"))
            cJSON_Delete(rp);
    }
    /* layer_types absent: sliding on even layers, full on odd ones */
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(c, "num_hidden_layers");
    if (ok && !cfg_has(c, "layer_types") && cJSON_IsNumber(nl) && nl->valuedouble >= 1 &&
        nl->valuedouble <= HP_MAX_LAYERS) {
        cJSON *lt = cJSON_CreateArray();
        for (int il = 0; ok && lt && il < (int)nl->valuedouble; il++)
            ok = cJSON_AddItemToArray(lt, cJSON_CreateString((il + 1) % 2 ? "sliding_attention"
                                                                           : "full_attention"));
        cJSON_DeleteItemFromObjectCaseSensitive(c, "layer_types");
        ok = ok && lt && cJSON_AddItemToObject(c, "layer_types", lt);
        if (!ok && lt && !cJSON_GetObjectItemCaseSensitive(c, "layer_types"))
            cJSON_Delete(lt);
    }
    if (!ok) {
        cJSON_Delete(c);
        return err_setf(e, ERR_NOMEM, "gpt_oss: out of memory");
    }
    *out = c;
    return 0;
}

static int gpt_oss_parse_config(struct hparams *hp, const cJSON *cfg_in, struct err *e)
{
    cJSON *cfg = NULL;
    int rc = resolved_config(cfg_in, &cfg, e);
    if (rc < 0)
        return rc;
    if ((rc = hf_parse_decoder(hp, cfg, &gpt_oss_defaults, e)) < 0 ||
        (rc = hf_parse_moe(hp, cfg, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "swiglu_limit", 7.0f, &hp->glu_limit, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "swiglu_alpha", 1.702f, &hp->glu_alpha, e)) < 0)
        goto out;
    if ((rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, hp->n_expert, e)) < 0)
        goto out;
    if (!(hp->glu_limit > 0.0f)) {
        rc = err_setf(e, ERR_CONFIG, "config field 'swiglu_limit' = %g must be positive",
                      (double)hp->glu_limit);
        goto out;
    }
    hp->ffn = FFN_GLU_CLAMPED;
    hp->ffn_bias = true;
    hp->router = ROUTER_TOPK_SOFTMAX;
    hp->router_bias = true;
    hp->attn_sinks = true;
    rc = hf_finish_layers(hp, cfg, &gpt_oss_defaults, 0, e);
out:
    cJSON_Delete(cfg);
    return rc;
}

/* ---- weights ---- */

#define EXPERTS "model.layers.%d.mlp.experts"

/* The bias [E, n_out] of an expert linear, sliced per expert into el->b. */
static int map_expert_bias(struct model *m, struct wmap *w, struct expert_linear *el, int il,
                           int64_t n_out, const char *name, struct err *e)
{
    int64_t shape[2] = {m->hp.n_expert, n_out};
    struct tensor all;
    int rc = wm_tensor(w, &all, WM_REQUIRED, 2, shape, e, EXPERTS ".%s", il, name);
    for (int x = 0; rc == 0 && x < m->hp.n_expert; x++)
        el->b[x] = tensor_slice0(&all, x);
    return rc;
}

/* transformers layout: NAME [E, n_in, n_out] (x @ W), transposed into owned [E, n_out, n_in]. */
static int map_transposed(struct model *m, struct wmap *w, struct expert_linear *el, int il,
                          int64_t n_out, int64_t n_in, const char *name, struct err *e)
{
    struct tensor all;
    int rc;
    char full[160], bias[64];
    snprintf(full, sizeof full, EXPERTS ".%s", il, name);
    if ((rc = hf_expert_views(m, el, true, e)) < 0 ||
        (rc = hf_take_transposed(m, w, &all, n_out, n_in, full, e)) < 0)
        return rc;
    for (int x = 0; x < m->hp.n_expert; x++)
        el->w[x] = tensor_slice0(&all, x);
    snprintf(bias, sizeof bias, "%s_bias", name);
    return map_expert_bias(m, w, el, il, n_out, bias, e);
}

/* The U8 tensor EXPERTS.NAME_KIND of layer il with the given shape. */
static int take_u8(struct wmap *w, struct tensor *t, int ndim, const int64_t *shape, int il,
                   const char *name, const char *kind, struct err *e)
{
    char full[192];
    snprintf(full, sizeof full, EXPERTS ".%s_%s", il, name, kind);
    int rc = st_set_take(w->st, full, t, e);
    if (rc < 0)
        return rc;
    bool ok = t->dtype == DTYPE_U8 && t->ndim == ndim && tensor_is_contiguous(t);
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (!ok)
        return err_setf(e, ERR_FORMAT, "tensor '%s' must be contiguous U8 [%lld, %lld, %lld%s] (%s)",
                        full, (long long)shape[0], (long long)shape[1], (long long)shape[2],
                        ndim == 4 ? ", 16" : "", dtype_name(t->dtype));
    return 0;
}

/* openai MXFP4 layout: NAME_blocks [E, n_out, n_in / 32, 16] U8 and NAME_scales
 * [E, n_out, n_in / 32] U8 bound as an mxfp4 [E, n_out, n_in] tensor without copying. */
static int map_blocks(struct model *m, struct wmap *w, struct expert_linear *el, int il,
                      int64_t n_out, int64_t n_in, const char *name, struct err *e)
{
    int64_t E = m->hp.n_expert;
    struct tensor bl, sc;
    int rc;
    char bias[64];
    if (n_in % 32 != 0)
        return err_setf(e, ERR_FORMAT, "tensor '" EXPERTS ".%s_blocks': input width %lld is not a "
                        "multiple of 32", il, name, (long long)n_in);
    int64_t bshape[4] = {E, n_out, n_in / 32, 16}, sshape[3] = {E, n_out, n_in / 32};
    if ((rc = hf_expert_views(m, el, true, e)) < 0 ||
        (rc = take_u8(w, &bl, 4, bshape, il, name, "blocks", e)) < 0 ||
        (rc = take_u8(w, &sc, 3, sshape, il, name, "scales", e)) < 0)
        return rc;
    if ((uintptr_t)bl.data % 4 != 0)
        return err_setf(e, ERR_FORMAT, "tensor '" EXPERTS ".%s_blocks' is not 4-byte aligned in "
                        "the file", il, name);
    /* the same bytes as MLX's U32 words of eight codes, low nibble first */
    struct tensor all;
    int64_t wshape[3] = {E, n_out, n_in / 8};
    tensor_init(&all, DTYPE_U32, bl.data, 3, wshape);
    all.shape[2] = n_in;
    all.name = bl.name;
    all.qbits = 4;
    all.qgroup = 32;
    all.qmode = QMODE_MXFP4;
    all.qsdtype = DTYPE_U8;
    all.qscales = sc.data;
    all.qbiases = NULL;
    for (int x = 0; x < E; x++)
        el->w[x] = tensor_slice0(&all, x);
    snprintf(bias, sizeof bias, "%s_bias", name);
    return map_expert_bias(m, w, el, il, n_out, bias, e);
}

static int map_experts(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    int64_t d = m->hp.n_embd, ff = m->hp.layer[il].n_ff;
    int rc;
    char pre[128];
    snprintf(pre, sizeof pre, EXPERTS, il);
    if (wm_has(w, "%s.gate_proj.weight", pre) || wm_has(w, "%s.gate_proj.scales", pre)) {
        /* mlx-lm: stacked, split gate / up */
        char gate[160], up[160], down[160];
        snprintf(gate, sizeof gate, "%s.gate_proj", pre);
        snprintf(up, sizeof up, "%s.up_proj", pre);
        snprintf(down, sizeof down, "%s.down_proj", pre);
        if ((rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, true, gate, gate, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, true, up, up, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, true, down, down, e)) < 0)
            return rc;
        return 0;
    }
    if (wm_has(w, "%s.gate_up_proj_blocks", pre)) {
        if (!m->hp.quant.hf_mxfp4)
            return err_setf(e, ERR_CONFIG, "'%s.gate_up_proj_blocks' needs quantization_config "
                            "{\"quant_method\": \"mxfp4\"} in config.json", pre);
        if ((rc = map_blocks(m, w, &L->ex.gate_up, il, 2 * ff, d, "gate_up_proj", e)) < 0 ||
            (rc = map_blocks(m, w, &L->ex.down, il, d, ff, "down_proj", e)) < 0)
            return rc;
        return 0;
    }
    if ((rc = map_transposed(m, w, &L->ex.gate_up, il, 2 * ff, d, "gate_up_proj", e)) < 0 ||
        (rc = map_transposed(m, w, &L->ex.down, il, d, ff, "down_proj", e)) < 0)
        return rc;
    return 0;
}

static int gpt_oss_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    const struct hparams *hp = &m->hp;
    int rc;
    char pre[128];
    if ((rc = hf_experts_alloc(m, e)) < 0 ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        char n1[160], n2[160];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(n1, sizeof n1, "%s.input_layernorm", pre);
        snprintf(n2, sizeof n2, "%s.post_attention_layernorm", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = hf_map_attention(&w, hp, L, il, e)) < 0 ||
            (rc = wm_vec(&w, &L->sinks, WM_REQUIRED, hp->n_head, e, "%s.self_attn.sinks", pre)) < 0 ||
            (rc = wm_linear(&w, &L->router, WM_REQUIRED, 0, hp->n_expert, hp->n_embd, e,
                            "%s.mlp.router", pre)) < 0 ||
            (rc = wm_vec(&w, &L->router_b, WM_REQUIRED, hp->n_expert, e, "%s.mlp.router.bias",
                         pre)) < 0 ||
            (rc = map_experts(m, &w, L, il, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize of transformers' expert layout: gate_up_proj [E, H, 2I] (gate in the even
 * columns) becomes gate_proj / up_proj [E, I, H], down_proj [E, I, H] becomes [E, H, I], the
 * biases split and renamed to the stacked linears' .bias */
static const struct ck_view_rule gpt_oss_views[] = {
    {"model.layers.%d.mlp.experts.gate_up_proj", "model.layers.%d.mlp.experts.gate_proj.weight", CK_VIEW_T_EVEN, 0, 0},
    {"model.layers.%d.mlp.experts.gate_up_proj", "model.layers.%d.mlp.experts.up_proj.weight", CK_VIEW_T_ODD, 0, 0},
    {"model.layers.%d.mlp.experts.down_proj", "model.layers.%d.mlp.experts.down_proj.weight", CK_VIEW_T, 0, 0},
    {"model.layers.%d.mlp.experts.gate_up_proj_bias", "model.layers.%d.mlp.experts.gate_proj.bias", CK_VIEW_EVEN, 0, 0},
    {"model.layers.%d.mlp.experts.gate_up_proj_bias", "model.layers.%d.mlp.experts.up_proj.bias", CK_VIEW_ODD, 0, 0},
    {"model.layers.%d.mlp.experts.down_proj_bias", "model.layers.%d.mlp.experts.down_proj.bias", CK_VIEW_RENAME, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void gpt_oss_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, gpt_oss_views, sizeof gpt_oss_views);
}

static const char *const gpt_oss_archs[] = {"GptOssForCausalLM", NULL};

const struct model_ops gpt_oss_ops = {
    .family = "gpt_oss",
    .description = "gpt-oss: attention sinks, sliding/full layers, biased router, clamped SwiGLU experts (mxfp4)",
    .architectures = gpt_oss_archs,
    .parse_config = gpt_oss_parse_config,
    .map_weights = gpt_oss_map_weights,
    .forward = decoder_forward,
    .quant_predicate = hf_quant_router_8bit,
    .convert_views = gpt_oss_convert_views,
};
