/*
 * glm4_moe: Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6). GLM-4's attention with
 * DeepSeek-V3's mixture of experts:
 *
 *   block(x) = x + attn(rms(x)); x + ffn(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-5)
 *   attn     q/k/v with biases when attention_bias (false), o_proj never; with use_qk_norm
 *            (false) per-head q/k RMSNorm before RoPE; rotate-half RoPE on the first
 *            head_dim * partial_rotary_factor (0.5) dims of each head, the rest passed
 *            through; scale head_dim^-0.5; head_dim 128 when absent
 *   ffn      layers il < first_k_dense_replace (1): SwiGLU of intermediate_size; the others:
 *            n_routed_experts (128) SwiGLU experts of moe_intermediate_size (1408) +
 *            n_shared_experts (1) shared ones added plain
 *   router   noaux_tc (Glm4MoeTopkRouter is DeepseekV3TopkRouter): sigmoid scores, the choice
 *            on score + e_score_correction_bias (F32) in the topk_group (1) best of n_group
 *            (1) groups (top-2 sums), num_experts_per_tok (8) of them; weights the scores,
 *            / their sum with norm_topk_prob (true), x routed_scaling_factor (1.0)
 *
 * partial_rotary_factor is read from rope_parameters (transformers 5) or the top level.
 * num_nextn_predict_layers: the multi-token-prediction layer past num_hidden_layers is not
 * part of the causal LM (transformers does not build it): model_load leaves its tensors
 * unbound, model_load_mtp loads it for --spec mtp (models/mtp.c, ADR 0108).
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v}_proj(.bias), self_attn.o_proj,
 * self_attn.{q,k}_norm, mlp.{gate,up,down}_proj (dense), mlp.gate (+ .e_score_correction_bias),
 * mlp.experts.E.{gate,up,down}_proj or mlx-lm's stacked mlp.switch_mlp.*,
 * mlp.shared_experts.{gate,up,down}_proj.
 */
#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Glm4MoeConfig defaults of the Llama-style fields */
static const struct hf_defaults glm4_moe_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 0.5f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static const struct hf_v3_moe_defaults glm4_moe_moe_defaults = {
    .n_routed = 128, .k = 8, .moe_ff = 1408, .n_shared = 1, .first_dense = 1,
    .n_group = 1, .topk_group = 1, .norm_topk = true, .scale = 1.0f,
};

/* rope_parameters.partial_rotary_factor (transformers 5) over the top-level field */
static int glm4_moe_rotary(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    float partial;
    int rc;
    if (!rp || !cJSON_IsObject(rp) || !cfg_has(rp, "partial_rotary_factor"))
        return 0;
    if ((rc = cfg_opt_float(rp, "partial_rotary_factor", 0.5f, &partial, e)) < 0)
        return err_prefix(e, "rope_parameters");
    if (!(partial > 0.0f && partial <= 1.0f))
        return err_setf(e, ERR_CONFIG, "config field 'rope_parameters.partial_rotary_factor' = %g "
                        "must be in (0, 1]", (double)partial);
    hp->n_rot = (int)((double)hp->head_dim * partial);
    return 0;
}

static int glm4_moe_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &glm4_moe_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", 8, &hp->n_kv_head, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_qk_norm", false, &hp->qk_norm, e)) < 0 ||
        (rc = glm4_moe_rotary(hp, cfg, e)) < 0)
        return rc;
    /* Glm4MoeAttention: attention_bias covers q, k and v; o_proj has none */
    hp->out_bias = false;
    if ((rc = hf_finish_layers(hp, cfg, &glm4_moe_defaults, 0, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].kv != KV_FULL)
            return err_setf(e, ERR_UNSUPPORTED, "layer %d: Glm4Moe has no sliding window "
                            "(config field 'sliding_window' / 'layer_types')", il);
    return hf_parse_v3_moe(hp, cfg, &glm4_moe_moe_defaults, e);
}

static const struct hf_moe_names glm4_moe_names = {
    "model.layers.%d.mlp.gate", hf_mlp_experts_stacking, "model.layers.%d.mlp.shared_experts", NULL,
    "model.layers.%d.mlp.gate.e_score_correction_bias",
};

static int glm4_moe_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &glm4_moe_names, e);
}

static const char *const glm4_moe_archs[] = {"Glm4MoeForCausalLM", NULL};

const struct model_ops glm4_moe_ops = {
    .family = "glm4_moe",
    .description = "GLM-4.5 / 4.6: partial rotary, q/k/v biases, optional q/k norm + DeepSeek-V3 "
                   "experts (sigmoid, correction bias, shared experts)",
    .architectures = glm4_moe_archs,
    .parse_config = glm4_moe_parse_config,
    .map_weights = glm4_moe_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_float,
    .mtp = MTP_DEEPSEEK,  /* model_load_mtp: the layer past num_hidden_layers (ADR 0108) */
};
