/*
 * cohere: CohereForCausalLM (Command-R), as transformers modeling_cohere.py
 * computes it:
 *
 *   block  = x + attn(ln(x)) + mlp(ln(x))     one input_layernorm, parallel residual
 *   ln     = LayerNorm without a bias: (x - mean) / sqrt(var + eps) * w (layer_norm_eps)
 *   attn   = q/k/v/o projections (biases with attention_bias), GQA, scale 1/sqrt(head_dim);
 *            use_qk_norm: per-head LayerNorm of q and k with a weight per head
 *            ([n_head, head_dim] / [n_kv_head, head_dim]), before RoPE;
 *            RoPE on interleaved pairs (2j, 2j + 1) (Cohere's rotate_half and
 *            repeat_interleave'd cos/sin), not on halves
 *   mlp    = down(silu(gate(x)) * up(x))
 *   head   = logit_scale * lm_head(ln(x)), lm_head tied to the embedding by default
 *
 * Tensor names are the HF decoder's (hf_map_decoder: no post_attention_layernorm with a
 * parallel residual, per-head q/k norm weights).
 */
#include <math.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers CohereConfig defaults */
static const struct hf_defaults cohere_defaults = {
    .eps_key = "layer_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = true,
};

static int cohere_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &cohere_defaults, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "logit_scale", 0.0625f, &hp->logit_scale, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "use_qk_norm", false, &hp->qk_norm, e)) < 0)
        return rc;
    if (!isfinite(hp->logit_scale) || hp->logit_scale == 0.0f)
        return err_setf(e, ERR_CONFIG, "config field 'logit_scale' = %g must be finite and non-zero",
                        (double)hp->logit_scale);
    hp->norm = NORM_LAYER;
    hp->norm_bias = false;
    hp->parallel_residual = true;
    hp->qk_norm_per_head = true;
    hp->rope_style = ROPE_STYLE_PAIRS;
    return hf_finish_layers(hp, cfg, &cohere_defaults, 0, e);
}

static const char *const cohere_archs[] = {"CohereForCausalLM", NULL};

const struct model_ops cohere_ops = {
    .family = "cohere",
    .description = "Cohere Command-R: bias-free LayerNorm, parallel block, per-head q/k LayerNorm, "
                   "interleaved rope, logit_scale",
    .architectures = cohere_archs,
    .parse_config = cohere_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
