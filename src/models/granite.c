/*
 * granite: GraniteForCausalLM (IBM Granite 3.x dense). The Llama block with
 * four multipliers, all model-wide scales of struct hparams applied by the
 * shared decoder:
 *
 *   x      = embedding_multiplier * embed(ids)                 (embd_scale)
 *   block  : x += residual_multiplier * attn(rms(x));
 *            x += residual_multiplier * mlp(rms(x))            (residual_scale)
 *   attn   = softmax(attention_multiplier * q k^T) v           (every layer's attn_scale,
 *            in place of 1/sqrt(head_dim))
 *   logits = lm_head(rms(x)) / logits_scaling                  (logit_scale = 1 / logits_scaling)
 *
 * Config defaults (transformers GraniteConfig): every multiplier and
 * logits_scaling 1, rms_norm_eps 1e-6, rope_theta 1e4, untied head.
 * Multiplying by the reciprocal of logits_scaling instead of dividing changes a
 * logit by at most one float32 rounding, far inside the golden tolerance.
 */
#include <math.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers GraniteConfig defaults */
static const struct hf_defaults granite_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* A multiplier read with default 1 that must be finite and non-zero. */
static int parse_multiplier(const cJSON *cfg, const char *key, float *out, struct err *e)
{
    int rc = cfg_opt_float(cfg, key, 1.0f, out, e);
    if (rc < 0)
        return rc;
    if (!isfinite(*out) || *out == 0.0f)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %g must be finite and non-zero", key,
                        (double)*out);
    return 0;
}

static int granite_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    float attn_mult, logits_scaling;
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &granite_defaults, e)) < 0 ||
        (rc = parse_multiplier(cfg, "embedding_multiplier", &hp->embd_scale, e)) < 0 ||
        (rc = parse_multiplier(cfg, "residual_multiplier", &hp->residual_scale, e)) < 0 ||
        (rc = parse_multiplier(cfg, "attention_multiplier", &attn_mult, e)) < 0 ||
        (rc = parse_multiplier(cfg, "logits_scaling", &logits_scaling, e)) < 0)
        return rc;
    hp->logit_scale = 1.0f / logits_scaling;
    if (!isfinite(hp->logit_scale) || hp->logit_scale == 0.0f)
        return err_setf(e, ERR_CONFIG, "config field 'logits_scaling' = %g has no float reciprocal",
                        (double)logits_scaling);
    hp->attn_scale = attn_mult;  /* before hparams_fill_layers copies it into every layer */
    return hf_finish_layers(hp, cfg, &granite_defaults, 0, e);
}

static const char *const granite_archs[] = {"GraniteForCausalLM", NULL};

const struct model_ops granite_ops = {
    .family = "granite",
    .description = "Granite: Llama block with embedding, residual, attention and logit multipliers",
    .architectures = granite_archs,
    .parse_config = granite_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
