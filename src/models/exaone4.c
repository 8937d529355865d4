/*
 * exaone4: Exaone4ForCausalLM (EXAONE 4.0). OLMo 2's post-norm block
 * (RESID_POST) with a per-head q/k RMSNorm, and local / global layers:
 *
 *   h   = x + post_attention_layernorm(attn(x))
 *   out = h + post_feedforward_layernorm(mlp(h))
 *   attn: q = q_norm(q_proj(x)), k = k_norm(k_proj(x)) per head (head_dim), before
 *         RoPE; sliding layers attend a window of sliding_window positions
 *   rope: when sliding_window is set, only on the sliding layers (the global ones
 *         are NoPE, n_rot 0); with sliding_window null, on every layer
 *
 * Config (transformers Exaone4Config): layer_types, else layer il slides unless
 * (il + 1) % sliding_window_pattern == 0 (pattern 4, window 4096 when absent;
 * sliding_window null: no sliding layer); a string pattern ("LLLG") needs
 * layer_types (transformers' derivation takes an int). num_key_value_heads 32
 * when absent, rms_norm_eps 1e-5, rope_theta 1e4, untied head. The projections
 * have no biases whatever attention_bias says (as in transformers). Tensors:
 * hf_map_decoder's names for a post-norm layer.
 */
#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers Exaone4Config defaults */
static const struct hf_defaults exaone4_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* The derivation's period: sliding_window_pattern (absent: 4); 0 when sliding_window is null
 * (no sliding layer) or layer_types lists the layers. */
static int exaone4_pattern(const cJSON *cfg, int *pattern, struct err *e)
{
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window_pattern");
    *pattern = 0;
    if (cJSON_IsNull(sw) || (lt && !cJSON_IsNull(lt)))
        return 0;
    if (!p) {
        *pattern = 4;
        return 0;
    }
    if (!cJSON_IsNumber(p))
        return err_setf(e, ERR_UNSUPPORTED, "config field 'sliding_window_pattern' must be an integer "
                        "unless 'layer_types' lists the layers");
    int rc = cfg_int(cfg, "sliding_window_pattern", pattern, e);
    if (rc < 0)
        return rc;
    return hparams_check_dim(*pattern, "sliding_window_pattern", 1, HP_MAX_LAYERS, e);
}

static int exaone4_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, pattern;
    if ((rc = hf_parse_decoder(hp, cfg, &exaone4_defaults, e)) < 0)
        return rc;
    /* absent: Exaone4Config's 32; null: num_attention_heads (hf_parse_decoder) */
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads"))
        hp->n_kv_head = 32;
    hp->qkv_bias = hp->out_bias = false;
    hp->qk_norm = true;
    hp->post_norm = true;
    if ((rc = exaone4_pattern(cfg, &pattern, e)) < 0 ||
        (rc = hf_hybrid_layers(hp, cfg, 4096, pattern, e)) < 0)
        return rc;
    /* global NoPE: with a sliding window configured, rope only on the sliding layers */
    bool hybrid = !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window"));
    for (int il = 0; hybrid && il < hp->n_layer; il++)
        if (hp->layer[il].kv != KV_SLIDING)
            hp->layer[il].n_rot = 0;
    return 0;
}

static const char *const exaone4_archs[] = {"Exaone4ForCausalLM", NULL};

const struct model_ops exaone4_ops = {
    .family = "exaone4",
    .description = "EXAONE 4.0: post-norm block, per-head q/k RMSNorm, sliding layers with rope, NoPE global layers",
    .architectures = exaone4_archs,
    .parse_config = exaone4_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
