/*
 * qwen3_moe: Qwen3MoeForCausalLM. The Qwen3 block (per-head q/k RMSNorm before
 * RoPE, no attention biases, explicit head_dim) with sparse SwiGLU experts:
 *
 *   moe(x)  = sum over the top num_experts_per_tok of softmax(mlp.gate x) (over all
 *             num_experts; renormalized over the k only with norm_topk_prob) of
 *             down(silu(gate(x)) * up(x)), experts of moe_intermediate_size
 *   layers  il has experts unless il is in mlp_only_layers or (il + 1) % decoder_sparse_step
 *             != 0; those have the dense GLU of intermediate_size (mlp.{gate,up,down}_proj)
 *
 * Checkpoint names: mlp.gate (router), mlp.experts.E.{gate,up,down}_proj, or mlx-lm's
 * stacked mlp.switch_mlp.{gate,up,down}_proj [E, out, in] (quantized router entries
 * per module in the quantization block).
 */
#include "blocks.h"
#include "hf_common.h"

/* transformers Qwen3MoeConfig defaults (head_dim: hidden_size / num_attention_heads) */
static const struct hf_defaults qwen3_moe_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int qwen3_moe_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen3_moe_defaults, e);
    if (rc < 0)
        return rc;
    hp->qk_norm = true;
    /* Qwen3MoeConfig: max_window_layers defaults to 28 */
    if ((rc = hf_finish_layers(hp, cfg, &qwen3_moe_defaults, 28, e)) < 0)
        return rc;
    return hf_parse_sparse_moe(hp, cfg, NULL, e);
}

static const struct hf_moe_names qwen3_moe_names = {"model.layers.%d.mlp.gate", hf_mlp_experts_stacking,
                                                    NULL, NULL, NULL};

static int qwen3_moe_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &qwen3_moe_names, e);
}

static const char *const qwen3_moe_archs[] = {"Qwen3MoeForCausalLM", NULL};

const struct model_ops qwen3_moe_ops = {
    .family = "qwen3_moe",
    .description = "Qwen3-MoE: Qwen3 block + sparse SwiGLU experts (softmax, top-k, norm_topk_prob)",
    .architectures = qwen3_moe_archs,
    .parse_config = qwen3_moe_parse_config,
    .map_weights = qwen3_moe_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_8bit,
};
