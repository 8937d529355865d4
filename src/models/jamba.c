/*
 * jamba: JambaForCausalLM (AI21 Jamba; transformers modeling_jamba.py / modular_jamba.py,
 * mlx-lm models/jamba.py): Mamba layers and attention layers, each followed by a dense or
 * MoE SwiGLU FFN.
 *
 *   layer il = x + mixer(rms(x)); x + ffn(rms(x))      input_layernorm, pre_ff_layernorm
 *   mixer    = attention when il % attn_layer_period == attn_layer_offset (no rope, GQA,
 *              no biases, scale head_dim^-0.5), else Mamba's mixer with RMSNorms on dt, B and
 *              C (dt_layernorm, b_layernorm, c_layernorm; epsilon rms_norm_eps)
 *   ffn      = experts when il % expert_layer_period == expert_layer_offset and num_experts > 1
 *              (router: softmax over all experts, top num_experts_per_tok, weights not
 *              renormalized, as transformers' JambaSparseMoeBlock; mlx-lm renormalizes the k),
 *              else the dense SwiGLU of intermediate_size
 *   head     = lm_head(rms(x)) (final_layernorm), untied unless tie_word_embeddings
 *
 * Config (JambaConfig defaults): vocab_size 65536, hidden_size 4096, intermediate_size 14336,
 * num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8 (null: the heads),
 * head_dim hidden / heads, hidden_act silu (the FFN's and the mixer's: silu only),
 * rms_norm_eps 1e-6, max_position_embeddings 262144, num_experts 16, num_experts_per_tok 2,
 * expert_layer_period 2 / offset 1, attn_layer_period 8 / offset 4 (offset < period, as
 * transformers checks), mamba_d_state 16, mamba_d_conv 4, mamba_expand 2, mamba_dt_rank
 * "auto", mamba_conv_bias true, mamba_proj_bias false, tie_word_embeddings false.
 * sliding_window must be null (transformers' eager path has no window; older versions applied
 * one with flash attention). A stated layers_block_type (mlx-lm reads one) must list
 * num_hidden_layers entries matching the period / offset pattern; the original remote code's
 * mamba_inner_layernorms must not be false (transformers always has the norms).
 *
 * Weights: model.embed_tokens, model.layers.N.{input_layernorm, pre_ff_layernorm,
 * self_attn.{q,k,v,o}_proj | mamba.*, feed_forward.{gate,up,down}_proj |
 * feed_forward.{router, experts.E.{gate,up,down}_proj}}, model.final_layernorm, lm_head;
 * mlx-lm's stacked feed_forward.switch_mlp.* and conv1d [d_inner, d_conv, 1] load too.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/convert.h"
#include "blocks.h"
#include "hf_common.h"
#include "mamba.h"

static const struct mamba_fields jamba_fields = {
    .expand = "mamba_expand", .d_state = "mamba_d_state", .d_conv = "mamba_d_conv",
    .dt_rank = "mamba_dt_rank", .conv_bias = "mamba_conv_bias", .proj_bias = "mamba_proj_bias",
    .expand_def = 2.0f, .d_state_def = 16, .d_conv_def = 4,
    .conv_bias_def = true, .proj_bias_def = false,
};

/* A period and an offset of the layer pattern: period >= 1, 0 <= offset < period. */
static int parse_period(const cJSON *cfg, const char *period_key, int period_def, const char *offset_key,
                        int offset_def, int *period, int *offset, struct err *e)
{
    int rc;
    if ((rc = cfg_opt_int(cfg, period_key, period_def, period, e)) < 0 ||
        (rc = cfg_opt_int(cfg, offset_key, offset_def, offset, e)) < 0)
        return rc;
    if (*period < 1)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %d must be at least 1", period_key, *period);
    if (*offset < 0 || *offset >= *period)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %d must be in [0, %s = %d)", offset_key,
                        *offset, period_key, *period);
    return 0;
}

/* layers_block_type, when stated: num_hidden_layers entries, each the pattern's kind. */
static int check_block_types(const struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layers_block_type");
    if (!lt || cJSON_IsNull(lt))
        return 0;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'layers_block_type' must list num_hidden_layers "
                        "= %d layer kinds", hp->n_layer);
    int il = 0;
    for (const cJSON *it = lt->child; it; it = it->next, il++) {
        const char *want = hp->layer[il].mixer == MIXER_ATTENTION ? "attention" : "mamba";
        if (!cJSON_IsString(it) || strcmp(it->valuestring, want) != 0)
            return err_setf(e, ERR_CONFIG, "config field 'layers_block_type': layer %d is '%s' by "
                            "attn_layer_period / attn_layer_offset, not what the list says", il, want);
    }
    return 0;
}

static int jamba_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, n_kv, n_exp, attn_p, attn_o, exp_p, exp_o;
    char act[32];
    bool inner_norms, b;
    if ((rc = cfg_opt_int(cfg, "vocab_size", 65536, &hp->n_vocab, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "hidden_size", 4096, &hp->n_embd, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "intermediate_size", 14336, &hp->n_ff, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_hidden_layers", 32, &hp->n_layer, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_attention_heads", 32, &hp->n_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", 8, &n_kv, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "hidden_act", "silu", act, sizeof act, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "rms_norm_eps", 1e-6f, &hp->norm_eps, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "max_position_embeddings", 262144, &hp->n_ctx, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", false, &hp->tie_embd, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts", 16, &n_exp, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts_per_tok", 2, &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mamba_inner_layernorms", true, &inner_norms, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_mamba_kernels", true, &b, e)) < 0 ||
        (rc = parse_period(cfg, "attn_layer_period", 8, "attn_layer_offset", 4, &attn_p, &attn_o, e)) < 0 ||
        (rc = parse_period(cfg, "expert_layer_period", 2, "expert_layer_offset", 1, &exp_p, &exp_o, e)) < 0 ||
        (rc = mamba_parse_ssm(hp, cfg, &jamba_fields, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_head, "num_attention_heads", 1, HP_MAX_HEADS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(n_exp, "num_experts", 1, HP_MAX_EXPERTS, e)) < 0)
        return rc;
    /* null (not absent): as many as the query heads (JambaConfig's backward compatibility) */
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads");
    hp->n_kv_head = kv && cJSON_IsNull(kv) ? hp->n_head : n_kv;
    if ((rc = cfg_opt_int(cfg, "head_dim", hp->n_embd / hp->n_head, &hp->head_dim, e)) < 0)
        return rc;
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'hidden_act' = '%s': Jamba's FFN and "
                        "Mamba mixer are implemented with silu only", act);
    if (cfg_has(cfg, "sliding_window"))
        return err_setf(e, ERR_UNSUPPORTED, "config field 'sliding_window': Jamba's attention with "
                        "a window is not supported (transformers 5 attends every position)");
    if (!inner_norms)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'mamba_inner_layernorms' = false: "
                        "transformers' Jamba always normalizes dt, B and C");
    if (hp->head_dim > 0 && hp->head_dim <= HP_MAX_HEAD_DIM)
        hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->norm = NORM_RMS;
    hp->ssm.norm_eps = hp->norm_eps;
    hp->ffn = FFN_GLU;
    hp->act = ACT_SILU;
    hp->n_expert = n_exp > 1 ? n_exp : 0;  /* one expert is the dense MLP (JambaMLP) */
    hp->router = ROUTER_SOFTMAX_TOPK_RAW;
    hp->n_rot = 0;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->moe = hp->n_expert > 0 && il % exp_p == exp_o;
        if (!ls->moe)
            ls->router = ROUTER_NONE;
        if (il % attn_p != attn_o)
            mamba_layer(hp, il);
    }
    return check_block_types(hp, cfg, e);
}

/* mlx-lm's sanitize: per-expert linears stacked into feed_forward.switch_mlp */
static const struct expert_stack_rule jamba_stacking[] = {
    {"model.layers.%d.feed_forward.experts.%d.gate_proj", "model.layers.%d.feed_forward.switch_mlp.gate_proj"},
    {"model.layers.%d.feed_forward.experts.%d.down_proj", "model.layers.%d.feed_forward.switch_mlp.down_proj"},
    {"model.layers.%d.feed_forward.experts.%d.up_proj", "model.layers.%d.feed_forward.switch_mlp.up_proj"},
    {NULL, NULL},
};

static int map_ffn(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, ff = hp->n_ff;
    const char *p = "model.layers.%d.feed_forward";
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, p, il);
    if (!hp->layer[il].moe) {
        if ((rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
            return rc;
        return 0;
    }
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, hp->n_expert, d, e, "%s.router", pre)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, false, jamba_stacking[0].per_expert,
                                   jamba_stacking[0].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, false, jamba_stacking[1].per_expert,
                                   jamba_stacking[1].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, false, jamba_stacking[2].per_expert,
                                   jamba_stacking[2].stacked, e)) < 0)
        return rc;
    return 0;
}

static int jamba_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    char n1[96], n2[96];
    int rc;
    if ((hp->n_expert > 0 && (rc = hf_experts_alloc(m, e)) < 0) ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.final_layernorm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(n1, sizeof n1, "model.layers.%d.input_layernorm", il);
        snprintf(n2, sizeof n2, "model.layers.%d.pre_ff_layernorm", il);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = hp->layer[il].mixer == MIXER_MAMBA
                      ? mamba_map_mixer(m, &w, L, il, "model.layers.%d.mamba", true, e)
                      : hf_map_attention(&w, hp, L, il, e)) < 0 ||
            (rc = map_ffn(m, &w, L, il, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's quant_predicate: the router at 8 bits, group 64 */
static int jamba_quant_predicate(const char *module, const struct quant_params *base,
                                 struct quant_params *qp)
{
    size_t n = strlen(module);
    if (n < 7 || strcmp(module + n - 7, ".router") != 0)
        return CK_Q_DEFAULT;
    *qp = (struct quant_params){QMODE_AFFINE, 8, 64, base->variant};
    return CK_Q_OVERRIDE;
}

/* mlx-lm's sanitize: conv1d.weight [d_inner, 1, d_conv] moves its axes to [d_inner, d_conv, 1] */
static const struct ck_view_rule jamba_views[] = {
    {"model.layers.%d.mamba.conv1d.weight", "model.layers.%d.mamba.conv1d.weight", CK_VIEW_T, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void jamba_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, jamba_views, sizeof jamba_views);
}

static const char *const jamba_archs[] = {"JambaForCausalLM", NULL};

const struct model_ops jamba_ops = {
    .family = "jamba",
    .description = "Jamba: Mamba layers (dt/B/C RMSNorms) and rope-free attention layers by period, "
                   "dense or MoE SwiGLU FFNs (softmax top-k, not renormalized)",
    .architectures = jamba_archs,
    .parse_config = jamba_parse_config,
    .map_weights = jamba_map_weights,
    .forward = decoder_forward,
    .expert_stacking = jamba_stacking,
    .quant_predicate = jamba_quant_predicate,
    .convert_views = jamba_convert_views,
};
