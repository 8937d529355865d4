/*
 * smollm3: SmolLM3ForCausalLM. The Llama block (RMSNorm, GQA, SwiGLU, tied
 * head by default) in which some layers leave out rotary embeddings (NoPE):
 *
 *   block(x) = x + attn(rms(x)); x + mlp(rms(x))       as Llama
 *   attn     = rope on q and k only where no_rope_layers[il] = 1; NoPE layers
 *              attend by content alone (per-layer n_rot = 0)
 *
 * Config (transformers SmolLM3Config): no_rope_layers lists one 0/1 per layer
 * (at least n_layer entries); when absent it is derived from
 * no_rope_layer_interval (default 4): layer il uses rope unless
 * (il + 1) % interval == 0. rope_theta defaults to 2e6, tie_word_embeddings
 * to true, num_key_value_heads to 4 when absent (null: num_attention_heads).
 * Without layer_types, use_sliding_window with a sliding_window makes the
 * NoPE layers sliding and leaves the rope layers full.
 */
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers SmolLM3Config defaults */
static const struct hf_defaults smollm3_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 2000000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = true,
};

/* no_rope_layers (a list of 0/1, at least n_layer long) or its derivation from
 * no_rope_layer_interval: layer il without rope gets n_rot = 0. */
static int parse_nope_layers(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(cfg, "no_rope_layers");
    int interval, rc;
    if ((rc = cfg_opt_int(cfg, "no_rope_layer_interval", 4, &interval, e)) < 0)
        return rc;
    if (!list || cJSON_IsNull(list)) {
        if (interval < 1)
            return err_setf(e, ERR_CONFIG, "config field 'no_rope_layer_interval' = %d must be at least 1",
                            interval);
        for (int il = 0; il < hp->n_layer; il++)
            if ((il + 1) % interval == 0)
                hp->layer[il].n_rot = 0;
        return 0;
    }
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'no_rope_layers' must list at least %d entries",
                        hp->n_layer);
    for (int il = 0; il < hp->n_layer; il++) {
        const cJSON *v = cJSON_GetArrayItem(list, il);
        if (!cJSON_IsNumber(v) || (v->valuedouble != 0.0 && v->valuedouble != 1.0))
            return err_setf(e, ERR_CONFIG, "config field 'no_rope_layers'[%d] must be 0 or 1", il);
        if (v->valuedouble == 0.0)
            hp->layer[il].n_rot = 0;
    }
    return 0;
}

/* Without layer_types, SmolLM3Config slides exactly the NoPE layers when
 * use_sliding_window is true and sliding_window is set. */
static int smollm3_windows(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    bool use;
    int window, rc;
    if (lt && !cJSON_IsNull(lt))
        return 0;  /* hf_finish_layers read the list */
    if ((rc = cfg_opt_bool(cfg, "use_sliding_window", false, &use, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "sliding_window", 0, &window, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        bool slide = use && window > 0 && hp->layer[il].n_rot == 0;
        hp->layer[il].kv = slide ? KV_SLIDING : KV_FULL;
        hp->layer[il].window = slide ? window : 0;
    }
    return 0;
}

static int smollm3_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, &smollm3_defaults, e)) < 0)
        return rc;
    /* absent: SmolLM3Config's 4; null: num_attention_heads (hf_parse_decoder) */
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads"))
        hp->n_kv_head = 4;
    if ((rc = hf_finish_layers(hp, cfg, &smollm3_defaults, 0, e)) < 0 ||
        (rc = parse_nope_layers(hp, cfg, e)) < 0)
        return rc;
    return smollm3_windows(hp, cfg, e);
}

static const char *const smollm3_archs[] = {"SmolLM3ForCausalLM", NULL};

const struct model_ops smollm3_ops = {
    .family = "smollm3",
    .description = "SmolLM3: Llama block with NoPE layers (no_rope_layers), tied head",
    .architectures = smollm3_archs,
    .parse_config = smollm3_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
