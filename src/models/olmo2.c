/*
 * olmo2: Olmo2ForCausalLM (OLMo 2). The Llama layout (RMSNorm, RoPE, GQA,
 * SwiGLU, separate q/k/v/o) with two differences, both layer-spec fields:
 *
 *   h   = x + post_attention_layernorm(attn(x))       no pre-norms (RESID_POST)
 *   out = h + post_feedforward_layernorm(mlp(h))
 *   attn: q = q_norm(q_proj(x)), k = k_norm(k_proj(x)): RMSNorm over the full q / k
 *         width (n_head * head_dim, n_kv_head * head_dim) before the head split and
 *         RoPE (qk_norm_full)
 *
 * Config: OlmoConfig's names and defaults (rms_norm_eps 1e-5, rope_theta 1e4, silu,
 * untied head); tensors: hf_map_decoder's names, the norms of a post-norm layer.
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers Olmo2Config (OlmoConfig) defaults */
static const struct hf_defaults olmo2_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int olmo2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &olmo2_defaults, e);
    hp->qk_norm = hp->qk_norm_full = true;
    hp->post_norm = true;
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &olmo2_defaults, 0, e);
}

static const char *const olmo2_archs[] = {"Olmo2ForCausalLM", NULL};

const struct model_ops olmo2_ops = {
    .family = "olmo2",
    .description = "OLMo 2: post-norm blocks, RMSNorm q/k norm over the full width, SwiGLU",
    .architectures = olmo2_archs,
    .parse_config = olmo2_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
