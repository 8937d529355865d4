/*
 * phimoe: PhimoeForCausalLM (Phi-3.5-MoE). Mixtral's layout with LayerNorm
 * (weight and bias, epsilon from rms_norm_eps) instead of RMSNorm, biases on
 * q/k/v/o when attention_bias, an lm_head bias when lm_head_bias, and
 * sparsemixer top-2 routing (inference form; router_jitter_noise is its
 * epsilon, see blocks.c).
 */
#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers PhimoeConfig defaults */
static const struct hf_defaults phimoe_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 1e6f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int phimoe_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &phimoe_defaults, e)) < 0 ||
        (rc = hf_parse_moe(hp, cfg, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "lm_head_bias", false, &hp->head_bias, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "router_jitter_noise", 0.01f, &hp->router_jitter, e)) < 0)
        return rc;
    hp->norm = NORM_LAYER;
    hp->router = ROUTER_SPARSEMIXER;
    return hf_finish_layers(hp, cfg, &phimoe_defaults, 0, e);
}

static const char *const phimoe_archs[] = {"PhimoeForCausalLM", NULL};

const struct model_ops phimoe_ops = {
    .family = "phimoe",
    .description = "Phi-3.5-MoE: LayerNorm, biased attention, sparsemixer top-2 experts",
    .architectures = phimoe_archs,
    .parse_config = phimoe_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
    .expert_stacking = hf_moe_stacking,
};
