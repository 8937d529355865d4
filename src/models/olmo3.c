/*
 * olmo3: Olmo3ForCausalLM (OLMo 3). OLMo 2's block (olmo2.c: post-norm
 * residuals, RMSNorm q/k norm over the full q / k width before the head split)
 * with sliding-window layers:
 *
 *   layers: layer_types, else three sliding layers to one full one (layer il
 *           slides unless (il + 1) % 4 == 0); sliding_window 4096 when absent
 *   rope:   per layer type (transformers 5's rope_parameters
 *           {"full_attention": {...}, "sliding_attention": {...}}): the full
 *           layers take any supported rope type, the sliding ones plain rope
 *
 * Olmo3Config's conversion of the flat form: rope_scaling and the top-level
 * rope_theta go to the full layers only; the sliding layers keep their own
 * rope_theta, else 500000 (default_theta). A flat rope_parameters object
 * without layer types is refused. Defaults otherwise Olmo2Config's (rms_norm_eps
 * 1e-5, silu, untied; attention_bias covers q, k, v and o). Tensors:
 * hf_map_decoder's names for a post-norm layer.
 */
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


#define OLMO3_THETA 500000.0f

/* transformers Olmo3Config defaults */
static const struct hf_defaults olmo3_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = OLMO3_THETA, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* The full layers' rope as one object for the shared parser: rope_parameters.full_attention
 * updated with rope_scaling (transformers' order), written into c as its rope_parameters. */
static int full_rope(cJSON *c, const cJSON *cfg, const cJSON *rp, struct err *e)
{
    const cJSON *full = rp ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (full && !cJSON_IsNull(full) && !cJSON_IsObject(full))
        return err_setf(e, ERR_CONFIG, "config field 'rope_parameters.full_attention' must be an object");
    if (rs && !cJSON_IsNull(rs) && !cJSON_IsObject(rs))
        return err_setf(e, ERR_CONFIG, "config field 'rope_scaling' must be an object");
    cJSON *f = cJSON_IsObject(full) ? cJSON_Duplicate(full, true) : cJSON_CreateObject();
    if (!f)
        return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
    const cJSON *it, *from = cJSON_IsObject(rs) ? rs : NULL;
    cJSON_ArrayForEach(it, from) {
        /* the same (case-sensitive) test as the replacement: a key differing only in case is
         * added, and a value that could not be placed is freed (a fuzz-found leak) */
        cJSON *v = cJSON_Duplicate(it, true);
        if (!v || (cJSON_GetObjectItemCaseSensitive(f, it->string)
                       ? !cJSON_ReplaceItemInObjectCaseSensitive(f, it->string, v)
                       : !cJSON_AddItemToObject(f, it->string, v))) {
            cJSON_Delete(v);
            cJSON_Delete(f);
            return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
        }
    }
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_parameters");
    if (!cJSON_AddItemToObject(c, "rope_parameters", f)) {
        cJSON_Delete(f);
        return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
    }
    return 0;
}

/* The sliding layers' rope theta: plain rope only. */
static int sliding_rope(const cJSON *rp, float *theta, struct err *e)
{
    const cJSON *s = rp ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
    char type[32];
    int rc;
    *theta = OLMO3_THETA;
    if (!s || cJSON_IsNull(s))
        return 0;
    if (!cJSON_IsObject(s))
        return err_setf(e, ERR_CONFIG, "config field 'rope_parameters.sliding_attention' must be an object");
    if ((rc = cfg_opt_str(s, "rope_type", "default", type, sizeof type, e)) < 0 ||
        (rc = cfg_opt_float(s, "rope_theta", OLMO3_THETA, theta, e)) < 0)
        return err_prefix(e, "rope_parameters.sliding_attention");
    if (strcmp(type, "default") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'rope_parameters.sliding_attention': rope_type "
                        "'%s' is not supported (plain rope only)", type);
    return 0;
}

static int olmo3_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    float theta_swa;
    int rc;
    if (rp && !cJSON_IsNull(rp) &&
        (!cJSON_IsObject(rp) || (!cJSON_HasObjectItem(rp, "full_attention") &&
                                 !cJSON_HasObjectItem(rp, "sliding_attention"))))
        return err_setf(e, ERR_CONFIG, "config field 'rope_parameters' must be an object per layer type "
                        "('full_attention', 'sliding_attention')");
    if (cJSON_IsNull(rp))
        rp = NULL;
    if ((rc = sliding_rope(rp, &theta_swa, e)) < 0)
        return rc;
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c)
        return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
    if ((rc = full_rope(c, cfg, rp, e)) == 0)
        rc = hf_parse_decoder(hp, c, &olmo3_defaults, e);
    cJSON_Delete(c);
    if (rc < 0)
        return rc;
    hp->qk_norm = hp->qk_norm_full = true;
    hp->post_norm = true;
    if ((rc = hf_hybrid_layers(hp, cfg, 4096, 4, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->layer[il].kv != KV_SLIDING)
            continue;
        hp->layer[il].rope = ROPE_DEFAULT;
        hp->layer[il].rope_theta = theta_swa;
    }
    return 0;
}

static const char *const olmo3_archs[] = {"Olmo3ForCausalLM", NULL};

const struct model_ops olmo3_ops = {
    .family = "olmo3",
    .description = "OLMo 3: OLMo 2's post-norm block with 3:1 sliding / full layers, rope per layer type",
    .architectures = olmo3_archs,
    .parse_config = olmo3_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
