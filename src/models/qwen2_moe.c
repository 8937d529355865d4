/*
 * qwen2_moe: Qwen2MoeForCausalLM. The Qwen2 block (q/k/v biases from qkv_bias, default
 * true; none on o) with a sparse MoE FFN and a shared expert on its MoE layers:
 *
 *   moe(x)  = sum over the top num_experts_per_tok of softmax(mlp.gate x) (over all
 *             num_experts; renormalized over the k only with norm_topk_prob, default
 *             false) of down(silu(gate(x)) * up(x)), experts of moe_intermediate_size
 *           + sigmoid(mlp.shared_expert_gate x) * shared_expert(x), a SwiGLU of
 *             shared_expert_intermediate_size
 *   layers  il has experts unless il is in mlp_only_layers or (il + 1) % decoder_sparse_step
 *             != 0; those have the dense GLU of intermediate_size (mlp.{gate,up,down}_proj)
 *
 * Checkpoint names: mlp.gate, mlp.experts.E.{gate,up,down}_proj (or mlx-lm's stacked
 * mlp.switch_mlp.*), mlp.shared_expert.{gate,up,down}_proj, mlp.shared_expert_gate.
 */
#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Qwen2MoeConfig defaults */
static const struct hf_defaults qwen2_moe_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int qwen2_moe_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen2_moe_defaults, e);
    if (rc < 0 || (rc = cfg_opt_bool(cfg, "qkv_bias", true, &hp->qkv_bias, e)) < 0)
        return rc;
    hp->out_bias = false;
    /* Qwen2MoeConfig: max_window_layers defaults to 28 */
    if ((rc = hf_finish_layers(hp, cfg, &qwen2_moe_defaults, 28, e)) < 0)
        return rc;
    return hf_parse_sparse_moe(hp, cfg, "shared_expert_intermediate_size", e);
}

static const struct hf_moe_names qwen2_moe_names = {
    "model.layers.%d.mlp.gate", hf_mlp_experts_stacking, "model.layers.%d.mlp.shared_expert",
    "model.layers.%d.mlp.shared_expert_gate", NULL,
};

static int qwen2_moe_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &qwen2_moe_names, e);
}

static const char *const qwen2_moe_archs[] = {"Qwen2MoeForCausalLM", NULL};

const struct model_ops qwen2_moe_ops = {
    .family = "qwen2_moe",
    .description = "Qwen2-MoE: Qwen2 block + sparse SwiGLU experts and a sigmoid-gated shared expert",
    .architectures = qwen2_moe_archs,
    .parse_config = qwen2_moe_parse_config,
    .map_weights = qwen2_moe_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
};
