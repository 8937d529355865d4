/*
 * arcee: ArceeForCausalLM (Arcee AFM). The Llama block with a non-gated MLP
 * (transformers' NemotronMLP):
 *
 *   mlp(x) = down_proj(act(up_proj(x)))      act: hidden_act, default "relu2" = relu(x)²
 *
 * Config: ArceeConfig is LlamaConfig's with hidden_act "relu2" and rms_norm_eps
 * 1e-5 (rope_theta 1e4, untied head, head_dim = hidden / heads unless stated,
 * attention_bias on q, k, v and o). mlp_bias = true is refused; silu in a
 * non-gated MLP is refused (hparams_validate). Tensors: hf_map_decoder's
 * names, mlp.up_proj / mlp.down_proj.
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers ArceeConfig defaults */
static const struct hf_defaults arcee_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "relu2",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int arcee_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &arcee_defaults, e);
    hp->ffn = FFN_MLP;
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &arcee_defaults, 0, e);
}

static const char *const arcee_archs[] = {"ArceeForCausalLM", NULL};

const struct model_ops arcee_ops = {
    .family = "arcee",
    .description = "Arcee AFM: Llama block with a non-gated ReLU² MLP (up, down)",
    .architectures = arcee_archs,
    .parse_config = arcee_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
