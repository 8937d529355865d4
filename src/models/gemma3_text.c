/*
 * gemma3_text: Gemma3ForCausalLM (Gemma 3, text only). Gemma 2's block (gemma.c:
 * sandwich norms, w + 1 norm weights, sqrt(hidden) embedding scale, query_pre_attn_scalar)
 * with, as transformers modeling_gemma3.py computes them:
 *
 *   attn: q = q_norm(q_proj(x)), k = k_norm(k_proj(x)): per-head RMSNorm ([head_dim],
 *         weights w + 1) before RoPE; no soft-capping unless configured (defaults null)
 *   layers: sliding_window (default 4096) except every sliding_window_pattern-th layer
 *         (default 6), unless layer_types lists them
 *   rope: sliding layers rope_local_base_freq (default 1e4), unscaled; full layers
 *         rope_theta (default 1e6) with rope_scaling (e.g. linear)
 *
 * Tensors: hf_map_decoder's names (sandwich norms, q_norm / k_norm).
 */
#include "../loading/config.h"
#include "blocks.h"
#include "gemma.h"

/* transformers Gemma3TextConfig defaults */
static const struct gemma_defaults gemma3_text_defaults = {
    {"rms_norm_eps", 1e-6f, 1000000.0f, 1.0f, "gelu_pytorch_tanh", 256, false, true},
    4096, 6, 0.0f, 0.0f,
};

static int gemma3_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    /* transformers 5 nests rope_parameters per layer type; only the flat form is read */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (cJSON_IsObject(rp) && (cJSON_GetObjectItemCaseSensitive(rp, "full_attention") ||
                               cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention")))
        return err_setf(e, ERR_UNSUPPORTED,
                        "config field 'rope_parameters' per layer type is not supported");
    float local_theta;
    int rc;
    hp->qk_norm = true;
    if ((rc = cfg_opt_float(cfg, "rope_local_base_freq", 10000.0f, &local_theta, e)) < 0 ||
        (rc = gemma_parse_sandwich(hp, cfg, &gemma3_text_defaults, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->layer[il].kv != KV_SLIDING)
            continue;
        hp->layer[il].rope_theta = local_theta;
        hp->layer[il].rope = ROPE_DEFAULT;
    }
    return 0;
}

static const char *const gemma3_text_archs[] = {"Gemma3ForCausalLM", NULL};

const struct model_ops gemma3_text_ops = {
    .family = "gemma3_text",
    .description = "Gemma 3 (text): sandwich RMSNorms (1+w), per-head q/k norm, sliding layers "
                   "with a local rope base, scaled rope on full layers",
    .architectures = gemma3_text_archs,
    .parse_config = gemma3_text_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
