/*
 * qwen3: Qwen3ForCausalLM. The Llama block with per-head RMSNorm on q and k
 * (before RoPE) and an explicit head_dim that need not equal
 * hidden_size / num_attention_heads.
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers Qwen3Config defaults */
static const struct hf_defaults qwen3_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static int qwen3_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen3_defaults, e);
    hp->qk_norm = true;
    /* transformers Qwen3Config: max_window_layers defaults to 28 */
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &qwen3_defaults, 28, e);
}

static const char *const qwen3_archs[] = {"Qwen3ForCausalLM", NULL};

const struct model_ops qwen3_ops = {
    .family = "qwen3",
    .description = "Qwen3: Llama block with per-head q/k RMSNorm, explicit head_dim",
    .architectures = qwen3_archs,
    .parse_config = qwen3_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
