/*
 * gemma: GemmaForCausalLM (Gemma 1). The Llama block with four differences,
 * as transformers modeling_gemma.py computes them:
 *
 *   x      = embed(ids) * sqrt(hidden_size), the normalizer a tensor in the model dtype
 *            (torch_dtype: rounded to bf16 / f16 first; sqrt(3072) is 55.4256 but 55.5 in bf16)
 *   norm   = RMSNorm computing x / rms(x) * (1 + w): every norm weight is used with an
 *            offset of 1 (hp->norm_w_offset), applied in f32 by the norm op
 *   attn   = explicit head_dim (default 256, need not be hidden / heads), MQA / GQA,
 *            rotate-half RoPE, scale 1/sqrt(head_dim) (query_pre_attn_scalar is Gemma 2's)
 *   ffn    = down(gelu_tanh(gate(x)) * up(x)) (hidden_act, default gelu_pytorch_tanh)
 *   head   = tied to the embedding unless tie_word_embeddings is false
 *
 * Tensor names are the HF decoder's (hf_map_decoder). gemma_parse_sandwich (gemma.h) is the
 * config of Gemma 2 and Gemma 3 text built on the same scale and norm rules.
 */
#include <math.h>
#include <string.h>

#include "../core/dtype.h"
#include "../loading/config.h"
#include "blocks.h"
#include "gemma.h"
#include "hf_common.h"


/* transformers GemmaConfig defaults */
static const struct hf_defaults gemma_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "gelu_pytorch_tanh",
    .head_dim = 256, .sliding = false, .tie_embd = true,
};

/* sqrt(n_embd) as transformers holds it: a tensor of the model dtype (torch_dtype, or
 * transformers 5's dtype), so bf16 / f16 checkpoints scale by the rounded value. */
static int gemma_embd_scale(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int dt, rc;
    if ((rc = cfg_model_dtype(cfg, &dt, e)) < 0)
        return rc;
    float s = (float)sqrt((double)hp->n_embd);
    if (dt == DTYPE_BF16)
        s = bf16_to_f32(f32_to_bf16(s));
    else if (dt == DTYPE_F16)
        s = f16_to_f32(f32_to_f16(s));
    hp->embd_scale = s;
    return 0;
}

static int gemma_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &gemma_defaults, e)) < 0 ||
        (rc = gemma_embd_scale(hp, cfg, e)) < 0)
        return rc;
    hp->norm_w_offset = 1.0f;
    return hf_finish_layers(hp, cfg, &gemma_defaults, 0, e);
}

/* A soft-capping field: absent -> def, null -> 0 (none), else a positive number. */
static int gemma_softcap(const cJSON *cfg, const char *key, float def, float *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    int rc;
    if (!v || cJSON_IsNull(v)) {
        *out = v ? 0.0f : def;
        return 0;
    }
    if ((rc = cfg_float(cfg, key, out, e)) < 0)
        return rc;
    if (!(*out > 0.0f) || !isfinite(*out))
        return err_setf(e, ERR_CONFIG, "config field '%s' = %g must be positive (or null)", key,
                        (double)*out);
    return 0;
}

/* Layers without layer_types: sliding except every pattern-th (transformers: sliding when
 * (il + 1) % pattern != 0), window sliding_window. */
static int gemma_sliding_pattern(struct hparams *hp, const cJSON *cfg, const struct gemma_defaults *g,
                                 struct err *e)
{
    int rc, window, pattern;
    if ((rc = cfg_opt_int(cfg, "sliding_window", g->window, &window, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "sliding_window_pattern", g->pattern, &pattern, e)) < 0)
        return rc;
    if (window < 1)
        return err_setf(e, ERR_CONFIG, "config field 'sliding_window' = %d must be positive", window);
    if (pattern < 1)
        return err_setf(e, ERR_CONFIG, "config field 'sliding_window_pattern' = %d must be positive",
                        pattern);
    for (int il = 0; il < hp->n_layer; il++) {
        if ((il + 1) % pattern == 0)
            continue;
        hp->layer[il].kv = KV_SLIDING;
        hp->layer[il].window = window;
    }
    return 0;
}

int gemma_parse_sandwich(struct hparams *hp, const cJSON *cfg, const struct gemma_defaults *g,
                         struct err *e)
{
    int rc;
    float qpas;
    if ((rc = hf_parse_decoder(hp, cfg, &g->hf, e)) < 0 || (rc = gemma_embd_scale(hp, cfg, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "query_pre_attn_scalar", 256.0f, &qpas, e)) < 0 ||
        (rc = gemma_softcap(cfg, "attn_logit_softcapping", g->attn_softcap, &hp->attn_softcap, e)) < 0 ||
        (rc = gemma_softcap(cfg, "final_logit_softcapping", g->final_softcap, &hp->logit_softcap,
                            e)) < 0)
        return rc;
    if (!(qpas > 0.0f) || !isfinite(qpas))
        return err_setf(e, ERR_CONFIG, "config field 'query_pre_attn_scalar' = %g must be positive",
                        (double)qpas);
    hp->attn_scale = (float)(1.0 / sqrt((double)qpas));
    hp->norm_w_offset = 1.0f;
    hp->sandwich_norm = true;
    if ((rc = hf_finish_layers(hp, cfg, &g->hf, 0, e)) < 0)
        return rc;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    return lt && !cJSON_IsNull(lt) ? 0 : gemma_sliding_pattern(hp, cfg, g, e);
}

static const char *const gemma_archs[] = {"GemmaForCausalLM", NULL};

const struct model_ops gemma_ops = {
    .family = "gemma",
    .description = "Gemma: RMSNorm x*(1+w), sqrt(hidden) embedding scale, head_dim 256, GeGLU (tanh)",
    .architectures = gemma_archs,
    .parse_config = gemma_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
