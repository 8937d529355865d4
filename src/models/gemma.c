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
 * Tensor names are the HF decoder's (hf_map_decoder).
 */
#include <math.h>
#include <string.h>

#include "../core/dtype.h"
#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers GemmaConfig defaults */
static const struct hf_defaults gemma_defaults = {"rms_norm_eps", 1e-6f, 10000.0f, 1.0f,
                                                  "gelu_pytorch_tanh", 256, false, true};

/* sqrt(n_embd) as transformers holds it: a tensor of the model dtype (torch_dtype, or
 * transformers 5's dtype), so bf16 / f16 checkpoints scale by the rounded value. */
static int gemma_embd_scale(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    char dt[32];
    int rc;
    if ((rc = cfg_opt_str(cfg, "dtype", "", dt, sizeof dt, e)) < 0 ||
        (!dt[0] && (rc = cfg_opt_str(cfg, "torch_dtype", "float32", dt, sizeof dt, e)) < 0))
        return rc;
    float s = (float)sqrt((double)hp->n_embd);
    if (strcmp(dt, "bfloat16") == 0)
        s = bf16_to_f32(f32_to_bf16(s));
    else if (strcmp(dt, "float16") == 0)
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

static const char *const gemma_archs[] = {"GemmaForCausalLM", NULL};

const struct model_ops gemma_ops = {
    .family = "gemma",
    .description = "Gemma: RMSNorm x*(1+w), sqrt(hidden) embedding scale, head_dim 256, GeGLU (tanh)",
    .architectures = gemma_archs,
    .parse_config = gemma_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
