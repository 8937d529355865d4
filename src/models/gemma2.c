/*
 * gemma2: Gemma2ForCausalLM (Gemma 2). Gemma's block (gemma.c: norm weights w + 1,
 * sqrt(hidden) embedding scale in the model dtype, head_dim 256, GeGLU tanh) with, as
 * transformers modeling_gemma2.py computes them:
 *
 *   h   = x + post_attention_layernorm(attn(input_layernorm(x)))         sandwich norms
 *   out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))  (RESID_SANDWICH)
 *   attn: scale query_pre_attn_scalar^-0.5; scores = cap * tanh(scores / cap) after the scale,
 *         before the mask (attn_logit_softcapping, default 50; null: none)
 *   layers: sliding_window (default 4096) on even layers, full on odd ones, unless
 *         layer_types lists them
 *   logits = cap * tanh(logits / cap) (final_logit_softcapping, default 30; null: none)
 *
 * Tensors: hf_map_decoder's names with the four norms of a sandwich layer.
 */
#include "blocks.h"
#include "gemma.h"

/* transformers Gemma2Config defaults */
static const struct gemma_defaults gemma2_defaults = {
    .hf = {
        .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
        .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "gelu_pytorch_tanh",
        .head_dim = 256, .sliding = false, .tie_embd = true,
    },
    .window = 4096, .pattern = 2, .attn_softcap = 50.0f, .final_softcap = 30.0f,
};

static int gemma2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    return gemma_parse_sandwich(hp, cfg, &gemma2_defaults, e);
}

static const char *const gemma2_archs[] = {"Gemma2ForCausalLM", NULL};

const struct model_ops gemma2_ops = {
    .family = "gemma2",
    .description = "Gemma 2: sandwich RMSNorms (1+w), attention and final logit soft-capping, "
                   "alternating sliding / full layers",
    .architectures = gemma2_archs,
    .parse_config = gemma2_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
