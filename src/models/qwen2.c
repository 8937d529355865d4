/*
 * qwen2: Qwen2ForCausalLM. The Llama block with biases on the q, k and v
 * projections (always, regardless of attention_bias) and none on o.
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers Qwen2Config defaults */
static const struct hf_defaults qwen2_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int qwen2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen2_defaults, e);
    hp->qkv_bias = true;
    hp->out_bias = false;
    /* transformers Qwen2Config: max_window_layers defaults to 28 */
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &qwen2_defaults, 28, e);
}

static const char *const qwen2_archs[] = {"Qwen2ForCausalLM", NULL};

const struct model_ops qwen2_ops = {
    .family = "qwen2",
    .description = "Qwen2 / Qwen2.5: Llama block with q/k/v biases",
    .architectures = qwen2_archs,
    .parse_config = qwen2_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
