/*
 * mixtral: MixtralForCausalLM. The Llama block with a sparse MoE FFN:
 * block_sparse_moe.gate routes each token to num_experts_per_tok of
 * num_local_experts SwiGLU experts (w1 gate, w3 up, w2 down); weights are the
 * softmax over all gate logits, kept for the top-k and renormalized.
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers MixtralConfig defaults */
static const struct hf_defaults mixtral_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 1e6f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int mixtral_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &mixtral_defaults, e)) < 0 ||
        (rc = hf_parse_moe(hp, cfg, e)) < 0)
        return rc;
    hp->qkv_bias = hp->out_bias = false;
    hp->router = ROUTER_SOFTMAX_TOPK;
    return hf_finish_layers(hp, cfg, &mixtral_defaults, 0, e);
}

static const char *const mixtral_archs[] = {"MixtralForCausalLM", NULL};

const struct model_ops mixtral_ops = {
    .family = "mixtral",
    .description = "Mixtral: Llama block + sparse SwiGLU experts (softmax, top-k, renormalize)",
    .architectures = mixtral_archs,
    .parse_config = mixtral_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
    .expert_stacking = hf_moe_stacking,
};
