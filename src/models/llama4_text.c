/*
 * llama4_text: Llama4ForCausalLM (the text model of Llama 4 Scout / Maverick). The Llama block
 * with three attention kinds and interleaved MoE layers:
 *
 *   block(x) = x + attn(rms(x)); x + ffn(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-5)
 *   attn     q/k/v/o with biases when attention_bias (false); scale head_dim^-0.5
 *     RoPE layers (no_rope_layers[il] = 1): interleaved-pair rope (the complex product of
 *            transformers, mlx-lm's traditional RoPE) over the whole head, then with
 *            use_qk_norm (true) a weightless L2 norm x / sqrt(mean(x²) + rms_norm_eps) of
 *            each q and k head
 *     NoPE layers (0): no rope, no q/k norm; with attn_temperature_tuning (true) each query at
 *            position p times 1 + attn_scale (0.1) · ln(floor((p + 1) / floor_scale (8192)) + 1)
 *     layer_types: "chunked_attention" layers see only their chunk of attention_chunk_size
 *            (8192) positions, [p - p % chunk, p]; "full_attention" every position. Absent:
 *            chunked on the RoPE layers, full on the NoPE ones
 *   ffn      layers in moe_layers (absent: every interleave_moe_layer_step-th (1), from
 *            step - 1): num_local_experts (16) SwiGLU experts of intermediate_size (8192),
 *            num_experts_per_tok (1) of them by the top router logits, each expert's INPUT
 *            scaled by sigmoid(its logit) (not its output), plus a shared SwiGLU expert of
 *            intermediate_size added plain; the other layers a SwiGLU of intermediate_size_mlp
 *            (16384)
 *   rope     rope_theta 500000; llama3 scaling when stated
 *
 * no_rope_layers absent or empty: 1 except every no_rope_layer_interval-th (4) layer. A chunked
 * layer keeps its K/V in the sliding pool with a window of one chunk (ADR 0023), which holds
 * every position its queries see. router_jitter_noise acts in training only.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v,o}_proj, feed_forward.{gate,up,down}_proj
 * (dense), feed_forward.router, feed_forward.shared_expert.{gate,up,down}_proj, and the experts
 * as transformers writes them, feed_forward.experts.gate_up_proj [E, H, 2I] (gate in the first I
 * columns) and down_proj [E, I, H] (x @ W, transposed once at load into model-owned memory),
 * or as mlx-lm's sanitize does, feed_forward.experts.{gate,up,down}_proj stacked [E, out, in].
 */
#include <stdio.h>
#include <string.h>

#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Llama4TextConfig defaults of the Llama-style fields */
static const struct hf_defaults llama4_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 500000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

/* The rest of Llama4TextConfig. */
struct llama4_cfg {
    int ff_mlp;                 /* intermediate_size_mlp */
    bool use_qk_norm, temp_tuning;
    int chunk, floor_scale;
    float attn_scale;
};

/* Which layers use RoPE: no_rope_layers (1: rope), or its default by no_rope_layer_interval. */
static int parse_rope_layers(const struct hparams *hp, const cJSON *cfg, bool *rope, struct err *e)
{
    const cJSON *nr = cJSON_GetObjectItemCaseSensitive(cfg, "no_rope_layers");
    int interval, rc;
    if (nr && cJSON_IsArray(nr) && cJSON_GetArraySize(nr) > 0) {
        if (cJSON_GetArraySize(nr) < hp->n_layer)
            return err_setf(e, ERR_CONFIG, "config field 'no_rope_layers' lists %d layers, fewer "
                            "than num_hidden_layers %d", cJSON_GetArraySize(nr), hp->n_layer);
        int il = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, nr) {
            if (il >= hp->n_layer)
                break;
            if (!cJSON_IsNumber(v) || (v->valuedouble != 0 && v->valuedouble != 1))
                return err_setf(e, ERR_CONFIG, "config field 'no_rope_layers'[%d] must be 0 or 1", il);
            rope[il++] = v->valuedouble != 0;
        }
        return 0;
    }
    if (nr && !cJSON_IsNull(nr) && !cJSON_IsArray(nr))
        return err_setf(e, ERR_CONFIG, "config field 'no_rope_layers' must be a list");
    if ((rc = cfg_opt_int(cfg, "no_rope_layer_interval", 4, &interval, e)) < 0)
        return rc;
    if (interval < 1)
        return err_setf(e, ERR_CONFIG, "config field 'no_rope_layer_interval' = %d must be positive",
                        interval);
    for (int il = 0; il < hp->n_layer; il++)
        rope[il] = (il + 1) % interval != 0;
    return 0;
}

/* Which layers are MoE: moe_layers, or every interleave_moe_layer_step-th from step - 1. */
static int parse_moe_layers(const struct hparams *hp, const cJSON *cfg, bool *moe, struct err *e)
{
    int32_t ids[HP_MAX_LAYERS];
    int n, step, rc;
    if (cfg_has(cfg, "moe_layers")) {
        if ((rc = cfg_opt_ids(cfg, "moe_layers", ids, HP_MAX_LAYERS, &n, e)) < 0)
            return rc;
        for (int i = 0; i < n; i++) {
            if ((rc = hparams_check_dim(ids[i], "moe_layers", 0, hp->n_layer - 1, e)) < 0)
                return rc;
            moe[ids[i]] = true;
        }
        return 0;
    }
    if ((rc = cfg_opt_int(cfg, "interleave_moe_layer_step", 1, &step, e)) < 0 ||
        (rc = hparams_check_dim(step, "interleave_moe_layer_step", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    for (int il = step - 1; il < hp->n_layer; il += step)
        moe[il] = true;
    return 0;
}

/* layer_types, or chunked on the RoPE layers and full on the others. */
static int parse_layer_types(const struct hparams *hp, const cJSON *cfg, const bool *rope,
                             bool *chunked, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        for (int il = 0; il < hp->n_layer; il++)
            chunked[il] = rope[il];
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'layer_types' must list %d layer types",
                        hp->n_layer);
    int il = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, lt) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "";
        if (strcmp(s, "chunked_attention") != 0 && strcmp(s, "full_attention") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'layer_types'[%d] = '%s' is not "
                            "supported (chunked_attention, full_attention)", il, s);
        chunked[il++] = s[0] == 'c';
    }
    return 0;
}

static int parse_llama4_fields(const cJSON *cfg, struct llama4_cfg *l, struct err *e)
{
    int rc;
    if ((rc = cfg_opt_int(cfg, "intermediate_size_mlp", 16384, &l->ff_mlp, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_qk_norm", true, &l->use_qk_norm, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "attn_temperature_tuning", true, &l->temp_tuning, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "floor_scale", 8192, &l->floor_scale, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "attn_scale", 0.1f, &l->attn_scale, e)) < 0)
        return rc;
    /* attention_chunk_size: null means no chunk (refused below where a layer is chunked) */
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cfg, "attention_chunk_size");
    l->chunk = 0;
    if (!c && (rc = cfg_opt_int(cfg, "attention_chunk_size", 8192, &l->chunk, e)) < 0)
        return rc;
    if (c && !cJSON_IsNull(c) && (rc = cfg_int(cfg, "attention_chunk_size", &l->chunk, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(l->ff_mlp, "intermediate_size_mlp", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(l->floor_scale, "floor_scale", 1, HP_MAX_CTX, e)) < 0 ||
        (rc = hparams_check_dim(l->chunk, "attention_chunk_size", 0, HP_MAX_CTX, e)) < 0)
        return rc;
    return 0;
}

static int llama4_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    bool rope[HP_MAX_LAYERS], moe[HP_MAX_LAYERS], chunked[HP_MAX_LAYERS];
    struct llama4_cfg l;
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &llama4_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", 8, &hp->n_kv_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_local_experts", 16, &hp->n_expert, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts_per_tok", 1, &hp->n_expert_used, e)) < 0 ||
        (rc = parse_llama4_fields(cfg, &l, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_expert, "num_local_experts", 1, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, hp->n_expert, e)) < 0)
        return rc;
    memset(moe, 0, sizeof moe);
    if ((rc = parse_rope_layers(hp, cfg, rope, e)) < 0 || (rc = parse_moe_layers(hp, cfg, moe, e)) < 0 ||
        (rc = parse_layer_types(hp, cfg, rope, chunked, e)) < 0)
        return rc;
    hp->rope_style = ROPE_STYLE_PAIRS;
    hp->router = ROUTER_TOPK_SIGMOID;
    int ff = hp->n_ff;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        if (chunked[il] && l.chunk <= 0)
            return err_setf(e, ERR_UNSUPPORTED, "layer %d is chunked_attention but "
                            "'attention_chunk_size' is null", il);
        if (chunked[il]) {
            ls->kv = KV_SLIDING;
            ls->window = ls->chunk = l.chunk;
        }
        ls->n_rot = rope[il] ? hp->head_dim : 0;
        ls->qk_norm = rope[il] && l.use_qk_norm;
        ls->qk_norm_post_rope = true;
        ls->attn_temp_floor = !rope[il] && l.temp_tuning ? l.floor_scale : 0;
        ls->attn_temp_scale = l.attn_scale;
        ls->moe = moe[il];
        ls->router = moe[il] ? ROUTER_TOPK_SIGMOID : ROUTER_NONE;
        ls->n_ff = moe[il] ? ff : l.ff_mlp;
        ls->n_ff_shexp = moe[il] ? ff : 0;
        ls->shexp_plain = true;
        ls->moe_weight_input = moe[il];
    }
    hp->n_ff = ff > l.ff_mlp ? ff : l.ff_mlp;
    return 0;
}

/* ---- weights ---- */

#define FF "model.layers.%d.feed_forward"

/* transformers' FF.experts.NAME [E, n_in, n_out] (x @ W) transposed into owned [E, n_out, n_in]. */
static int take_transposed(struct model *m, struct wmap *w, struct tensor *all, int il,
                           int64_t n_out, int64_t n_in, const char *name, struct err *e)
{
    char full[160];
    snprintf(full, sizeof full, FF ".experts.%s", il, name);
    return hf_take_transposed(m, w, all, n_out, n_in, full, e);
}

static int map_experts(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    int64_t d = m->hp.n_embd, ff = m->hp.layer[il].n_ff, E = m->hp.n_expert;
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, FF ".experts", il);
    if (wm_has(w, "%s.gate_proj.weight", pre) || wm_has(w, "%s.gate_proj.scales", pre)) {
        /* mlx-lm: stacked gate / up / down */
        char gate[160], up[160], down[160];
        snprintf(gate, sizeof gate, "%s.gate_proj", pre);
        snprintf(up, sizeof up, "%s.up_proj", pre);
        snprintf(down, sizeof down, "%s.down_proj", pre);
        if ((rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, false, gate, gate, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, false, up, up, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, false, down, down, e)) < 0)
            return rc;
        return 0;
    }
    /* transformers: gate_up_proj's first ff columns are the gate, the rest the up */
    struct tensor gu, dn;
    if ((rc = hf_expert_views(m, &L->ex.gate, false, e)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.up, false, e)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.down, false, e)) < 0 ||
        (rc = take_transposed(m, w, &gu, il, 2 * ff, d, "gate_up_proj", e)) < 0 ||
        (rc = take_transposed(m, w, &dn, il, d, ff, "down_proj", e)) < 0)
        return rc;
    for (int64_t x = 0; x < E; x++) {
        struct tensor ex = tensor_slice0(&gu, x);
        L->ex.gate.w[x] = tensor_rows(&ex, 0, ff);
        L->ex.up.w[x] = tensor_rows(&ex, ff, ff);
        L->ex.down.w[x] = tensor_slice0(&dn, x);
    }
    return 0;
}

static int map_ffn(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    const struct layer_spec *ls = &m->hp.layer[il];
    int64_t d = m->hp.n_embd, ff = ls->n_ff, sff = ls->n_ff_shexp;
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, FF, il);
    if (!ls->moe) {
        if ((rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
            return rc;
        return 0;
    }
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, m->hp.n_expert, d, e, "%s.router", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_gate, WM_REQUIRED, 0, sff, d, e, "%s.shared_expert.gate_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_up, WM_REQUIRED, 0, sff, d, e, "%s.shared_expert.up_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_down, WM_REQUIRED, 0, d, sff, e, "%s.shared_expert.down_proj", pre)) < 0)
        return rc;
    return map_experts(m, w, L, il, e);
}

/* A weightless norm's weight: head_dim ones (F32), owned by the model, one per use (a backend
 * may give a prepared weight's pages back). */
static int ones(struct model *m, struct tensor *t, struct err *e)
{
    int64_t n = m->hp.head_dim;
    float *buf;
    int rc = model_alloc_owned(m, (size_t)n * sizeof *buf, (void **)&buf, e);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < n; i++)
        buf[i] = 1.0f;
    tensor_init(t, DTYPE_F32, buf, 1, &n);
    t->name = "L2 norm (no weight)";
    return 0;
}

static int map_attention(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_kv_head * hd;
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.self_attn", il);
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, d, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.o_proj", pre)) < 0)
        return rc;
    if (hp->qkv_bias && ((rc = wm_vec(w, &L->bq, WM_REQUIRED, qd, e, "%s.q_proj.bias", pre)) < 0 ||
                         (rc = wm_vec(w, &L->bk, WM_REQUIRED, kvd, e, "%s.k_proj.bias", pre)) < 0 ||
                         (rc = wm_vec(w, &L->bv, WM_REQUIRED, kvd, e, "%s.v_proj.bias", pre)) < 0 ||
                         (rc = wm_vec(w, &L->bo, WM_REQUIRED, d, e, "%s.o_proj.bias", pre)) < 0))
        return rc;
    if (hp->layer[il].qk_norm && ((rc = ones(m, &L->q_norm, e)) < 0 || (rc = ones(m, &L->k_norm, e)) < 0))
        return rc;
    return 0;
}

static int llama4_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int rc;
    if ((rc = hf_experts_alloc(m, e)) < 0 ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        char n1[128], n2[128];
        snprintf(n1, sizeof n1, "model.layers.%d.input_layernorm", il);
        snprintf(n2, sizeof n2, "model.layers.%d.post_attention_layernorm", il);
        if ((rc = hf_map_norm(&w, &m->hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, &m->hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = map_attention(m, &w, L, il, e)) < 0 || (rc = map_ffn(m, &w, L, il, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's llama4 sanitize: gate_up_proj [E, H, 2I] split in halves and transposed into the
 * stacked gate_proj / up_proj [E, I, H], down_proj [E, I, H] transposed to [E, H, I] */
static const struct ck_view_rule llama4_views[] = {
    {FF ".experts.gate_up_proj", FF ".experts.gate_proj.weight", CK_VIEW_T_LO, 0, 0},
    {FF ".experts.gate_up_proj", FF ".experts.up_proj.weight", CK_VIEW_T_HI, 0, 0},
    {FF ".experts.down_proj", FF ".experts.down_proj.weight", CK_VIEW_T, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void llama4_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, llama4_views, sizeof llama4_views);
}

static const char *const llama4_archs[] = {"Llama4ForCausalLM", NULL};

const struct model_ops llama4_text_ops = {
    .family = "llama4_text",
    .description = "Llama 4 text: chunked local / NoPE global attention (temperature tuning, L2 "
                   "q/k norm) + interleaved top-k sigmoid experts with a shared expert",
    .architectures = llama4_archs,
    .parse_config = llama4_parse_config,
    .map_weights = llama4_map_weights,
    .forward = decoder_forward,
    .convert_views = llama4_convert_views,
};
