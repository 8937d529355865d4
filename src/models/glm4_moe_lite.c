/*
 * glm4_moe_lite: Glm4MoeLiteForCausalLM (GLM-4.7-Flash). DeepSeek-V3's multi-head latent
 * attention (deepseek.h: the latent KV cache, the absorbed form) with GLM-4.5's experts
 * (hf_parse_v3_moe, as glm4_moe and dots1):
 *
 *   block(x) = x + mla(rms(x)); x + ffn(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-5)
 *   mla      deepseek_v2.c's: q = q_b(rms(q_a(x))) with q_lora_rank (768; null: q_proj),
 *            [c | k_pe] = kv_a_proj_with_mqa(x), kv_b_proj(rms(c)) per head; the q_a / kv_a
 *            norms at eps 1e-6 (Glm4MoeLiteRMSNorm's default); rope over all qk_rope_head_dim
 *            (64) dims on interleaved pairs (rope_interleave true; false: rotate-half), scale
 *            (qk_nope_head_dim (192) + qk_rope_head_dim)^-0.5 (x yarn's mscale^2 when scaled);
 *            kv_lora_rank 512, v_head_dim 256
 *   ffn      mlp_layer_types[il] "sparse": n_routed_experts (64) SwiGLU experts of
 *            moe_intermediate_size (1536) + n_shared_experts (1) shared ones added plain;
 *            "dense": a SwiGLU of intermediate_size. Without mlp_layer_types transformers
 *            makes layer 0 dense and the rest sparse; we read first_k_dense_replace (1, as
 *            GLM-4.7-Flash's config and mlx-lm do), which gives that pattern at its value 1.
 *   router   noaux_tc (Glm4MoeLiteTopkRouter): sigmoid scores, the choice on score +
 *            e_score_correction_bias (F32) in the topk_group (1) best of n_group (1) groups
 *            (top-2 sums), num_experts_per_tok (4) of them; weights the scores, / their sum
 *            with norm_topk_prob (true), x routed_scaling_factor (1.8)
 *
 * Rope: transformers 5 maps head_dim to qk_rope_head_dim and takes head_dim x
 * partial_rotary_factor dims for its inverse frequencies. GLM-4.7-Flash states
 * partial_rotary_factor 1.0; any other value gives fewer frequencies than the rope dims and
 * transformers fails (5.17 also fills in 0.5 when the factor is absent, and fails too), so
 * only 1.0 is accepted and an absent one means the whole of qk_rope_head_dim, as in
 * mlx-lm and vLLM. The golden case's generator states 1.0 (rope_parameters) for that reason.
 * topk_method is not read by transformers (always noaux_tc); anything else is refused, as
 * deepseek_v3 and mlx-lm do. num_nextn_predict_layers: the multi-token-prediction layer past
 * num_hidden_layers is not part of the causal LM: model_load leaves its tensors unbound,
 * model_load_mtp loads it for --spec mtp (models/mtp.c, ADR 0108).
 *
 * Checkpoint names: DeepSeek-V3's (deepseek_v2.c), mlx-lm's too (stacked switch_mlp experts,
 * kv_b_proj split into embed_q / unembed_out).
 */
#include <string.h>

#include "blocks.h"
#include "deepseek.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Glm4MoeLiteConfig defaults of the Llama-style fields */
static const struct hf_defaults glm4_moe_lite_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static const struct deepseek_mla_defaults glm4_moe_lite_mla = {
    .q_lora_rank = 768, .kv_lora_rank = 512, .qk_nope_dim = 192, .qk_rope_dim = 64,
    .v_head_dim = 256, .rope_interleave = true,
};

static const struct hf_v3_moe_defaults glm4_moe_lite_moe = {
    .n_routed = 64, .k = 4, .moe_ff = 1536, .n_shared = 1, .first_dense = 1,
    .n_group = 1, .topk_group = 1, .norm_topk = true, .scale = 1.8f, .mlp_layer_types = true,
};

static int glm4_moe_lite_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    char method[32];
    int rc;
    if ((rc = deepseek_parse_mla(hp, cfg, &glm4_moe_lite_defaults, &glm4_moe_lite_mla, e)) < 0 ||
        (rc = hf_check_full_rotary(cfg, "latent attention rotates all of qk_rope_head_dim", e)) < 0 ||
        (rc = cfg_opt_str(cfg, "topk_method", "noaux_tc", method, sizeof method, e)) < 0)
        return rc;
    if (strcmp(method, "noaux_tc") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'topk_method' = '%s' is not supported "
                        "(noaux_tc)", method);
    if ((rc = deepseek_latent_layers(hp, cfg, &glm4_moe_lite_defaults, e)) < 0)
        return rc;
    return hf_parse_v3_moe(hp, cfg, &glm4_moe_lite_moe, e);
}

static const char *const glm4_moe_lite_archs[] = {"Glm4MoeLiteForCausalLM", NULL};

const struct model_ops glm4_moe_lite_ops = {
    .family = "glm4_moe_lite",
    .description = "GLM-4.7-Flash: DeepSeek-V3 latent attention (latent KV cache) + GLM-4.5 "
                   "experts (sigmoid, correction bias, shared experts, mlp_layer_types)",
    .architectures = glm4_moe_lite_archs,
    .parse_config = glm4_moe_lite_parse_config,
    .map_weights = deepseek_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_float,
    .mtp = MTP_DEEPSEEK,  /* model_load_mtp: the layer past num_hidden_layers (ADR 0108) */
    .convert_views = deepseek_convert_views,  /* mlx-lm's sanitize splits kv_b_proj alike */
};
