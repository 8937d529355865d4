/*
 * hunyuan_v1_moe: HunYuanMoEV1ForCausalLM (Tencent Hunyuan-A13B). The Llama block with the
 * q/k RMSNorm after RoPE and a softmax-routed MoE beside a plain shared MLP on every layer:
 *
 *   block(x) = x + attn(rms(x)); x + moe(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-5)
 *   attn     q/k/v/o with biases when attention_bias (false); rotate-half RoPE over the whole
 *            head, then per-head RMSNorm of q and k (query_layernorm / key_layernorm, eps
 *            rms_norm_eps) after it; scale head_dim^-0.5; head_dim hidden / heads when absent
 *   moe      num_experts (1) SwiGLU experts of intermediate_size, moe_topk (1) of them by
 *            softmax(mlp.gate.wg x) over all, renormalized over the k; plus shared_mlp, a
 *            SwiGLU of intermediate_size added plain
 *   rope     rope_scaling / rope_parameters of type dynamic with `alpha` (Hunyuan's NTK-alpha):
 *            a fixed base rope_theta * alpha^(head_dim / (head_dim - 2)), attention factor 1,
 *            no per-length rescaling within max_position_embeddings (transformers' dynamic
 *            update only acts past it, where a cache here never goes); the other rope types as
 *            for Llama
 *
 * transformers' HunYuanMoEV1 reads neither use_qk_norm (the norms are always there) nor
 * sliding_window, moe_intermediate_size or num_shared_expert (experts and shared MLP both take
 * intermediate_size); they are not read here either. Per-layer lists for num_experts /
 * moe_topk and use_cla (cross-layer KV sharing, which transformers does not build) are
 * refused, naming the field.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v,o}_proj(.bias),
 * self_attn.{query,key}_layernorm, mlp.gate.wg, mlp.experts.E.{gate,up,down}_proj or mlx-lm's
 * stacked mlp.switch_mlp.*, mlp.shared_mlp.{gate,up,down}_proj.
 */
#include <math.h>
#include <stdio.h>

#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers HunYuanMoEV1Config defaults of the Llama-style fields */
static const struct hf_defaults hunyuan_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* An int field that transformers also takes as a per-layer list: only the int form. */
static int int_not_list(const cJSON *cfg, const char *key, int def, int *out, struct err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (it && cJSON_IsArray(it))
        return err_setf(e, ERR_UNSUPPORTED, "config field '%s': per-layer lists are not supported",
                        key);
    return cfg_opt_int(cfg, key, def, out, e);
}

/* Hunyuan's NTK-alpha rope: dynamic with `alpha` becomes a fixed larger base. */
static int hunyuan_rope_alpha(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!rs || !cJSON_IsObject(rs) || !cfg_has(rs, "alpha") || hp->rope != ROPE_DYNAMIC)
        return 0;
    float alpha;
    int rc;
    if ((rc = cfg_opt_float(rs, "alpha", 0.0f, &alpha, e)) < 0)
        return err_prefix(e, "rope_scaling");
    if (alpha == 0.0f)  /* transformers: a falsy alpha leaves plain dynamic NTK */
        return 0;
    if (!(alpha > 0.0f) || !isfinite(alpha) || hp->head_dim < 3)
        return err_setf(e, ERR_CONFIG, "config field 'rope_scaling.alpha' = %g must be positive "
                        "(with head_dim > 2)", (double)alpha);
    double base = hp->rope_theta * pow((double)alpha, hp->head_dim / (hp->head_dim - 2.0));
    if (!(base < 3.0e38))
        return err_setf(e, ERR_CONFIG, "config field 'rope_scaling.alpha' = %g overflows the "
                        "rope base", (double)alpha);
    hp->rope_theta = (float)base;
    hp->rope = ROPE_DEFAULT;
    hp->rope_factor = 1.0f;
    hp->n_ctx_max = 0;
    return 0;
}

static int hunyuan_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    bool cla;
    if ((rc = hf_parse_decoder(hp, cfg, &hunyuan_defaults, e)) < 0 ||
        (rc = int_not_list(cfg, "num_experts", 1, &hp->n_expert, e)) < 0 ||
        (rc = int_not_list(cfg, "moe_topk", 1, &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_cla", false, &cla, e)) < 0 ||
        (rc = hunyuan_rope_alpha(hp, cfg, e)) < 0)
        return rc;
    if (cla)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'use_cla' = true (cross-layer attention) "
                        "is not supported");
    if ((rc = hparams_check_dim(hp->n_expert, "num_experts", 1, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_expert_used, "moe_topk", 1, hp->n_expert, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    hp->qk_norm = true;
    hp->router = ROUTER_SOFTMAX_TOPK;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        hp->layer[il].qk_norm_post_rope = true;
        hp->layer[il].n_ff_shexp = hp->n_ff;
        hp->layer[il].shexp_plain = true;
    }
    return 0;
}

/* ---- weights ---- */

static int map_attention(struct wmap *w, const struct hparams *hp, struct layer *L, const char *pre,
                         struct err *e)
{
    int64_t d = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_kv_head * hd;
    bool b = hp->qkv_bias;
    int rc;
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, d, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.o_proj", pre)) < 0 ||
        (rc = wm_vec(w, &L->q_norm, WM_REQUIRED, hd, e, "%s.query_layernorm.weight", pre)) < 0 ||
        (rc = wm_vec(w, &L->k_norm, WM_REQUIRED, hd, e, "%s.key_layernorm.weight", pre)) < 0)
        return rc;
    if (b && ((rc = wm_vec(w, &L->bq, WM_REQUIRED, qd, e, "%s.q_proj.bias", pre)) < 0 ||
              (rc = wm_vec(w, &L->bk, WM_REQUIRED, kvd, e, "%s.k_proj.bias", pre)) < 0 ||
              (rc = wm_vec(w, &L->bv, WM_REQUIRED, kvd, e, "%s.v_proj.bias", pre)) < 0 ||
              (rc = wm_vec(w, &L->bo, WM_REQUIRED, d, e, "%s.o_proj.bias", pre)) < 0))
        return rc;
    return 0;
}

static int map_moe(struct model *m, struct wmap *w, struct layer *L, int il, const char *pre,
                   struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, ff = hp->layer[il].n_ff, sff = hp->layer[il].n_ff_shexp;
    const struct expert_stack_rule *r = hf_mlp_experts_stacking;
    int rc;
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, hp->n_expert, d, e, "%s.gate.wg", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_gate, WM_REQUIRED, 0, sff, d, e, "%s.shared_mlp.gate_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_up, WM_REQUIRED, 0, sff, d, e, "%s.shared_mlp.up_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_down, WM_REQUIRED, 0, d, sff, e, "%s.shared_mlp.down_proj", pre)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, false, r[0].per_expert, r[0].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, false, r[1].per_expert, r[1].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, false, r[2].per_expert, r[2].stacked, e)) < 0)
        return rc;
    return 0;
}

static int hunyuan_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int rc;
    if ((rc = hf_experts_alloc(m, e)) < 0 ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        char pre[256], n1[300], n2[300], at[300], mlp[300];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(n1, sizeof n1, "%s.input_layernorm", pre);
        snprintf(n2, sizeof n2, "%s.post_attention_layernorm", pre);
        snprintf(at, sizeof at, "%s.self_attn", pre);
        snprintf(mlp, sizeof mlp, "%s.mlp", pre);
        if ((rc = hf_map_norm(&w, &m->hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, &m->hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = map_attention(&w, &m->hp, L, at, e)) < 0 || (rc = map_moe(m, &w, L, il, mlp, e)) < 0)
            return rc;
    }
    return 0;
}

static const char *const hunyuan_archs[] = {"HunYuanMoEV1ForCausalLM", NULL};

const struct model_ops hunyuan_v1_moe_ops = {
    .family = "hunyuan_v1_moe",
    .description = "Hunyuan-A13B: q/k RMSNorm after RoPE + softmax-routed experts beside a "
                   "shared MLP on every layer",
    .architectures = hunyuan_archs,
    .parse_config = hunyuan_parse_config,
    .map_weights = hunyuan_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
};
