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
 *         rope_theta (default 1e6) with rope_scaling (e.g. linear); transformers 5 writes
 *         both as rope_parameters per layer type (full_attention / sliding_attention)
 *
 * Tensors: hf_map_decoder's names (sandwich norms, q_norm / k_norm).
 *
 * use_bidirectional_attention true (EmbeddingGemma, ADR 0097) makes it an embedding model
 * run by the encoder path: full layers attend the whole sequence, and sliding layers the
 * band |i - j| < W' around each row, where W' = sliding_window // 2 + 1 is what
 * Gemma3TextConfig turns config.json's sliding_window into for bidirectional attention
 * (the causal sliding mask OR'ed with _bidirectional_window_overlay(W') in
 * modeling_gemma3.py): a band of h = W' - 1 = sliding_window // 2 each side, kept as
 * window 2h + 1 (the positions a row attends), ModernBERT's convention (encode.c).
 * The base model's tensors (Gemma3TextModel as sentence-transformers saves it, no
 * "model." prefix) load too (model.c).
 */
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "gemma.h"

/* transformers Gemma3TextConfig defaults */
static const struct gemma_defaults gemma3_text_defaults = {
    .hf = {
        .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
        .rope_theta = 1000000.0f, .partial_rotary = 1.0f, .act = "gelu_pytorch_tanh",
        .head_dim = 256, .sliding = false, .tie_embd = true,
    },
    .window = 4096, .pattern = 6, .attn_softcap = 0.0f, .final_softcap = 0.0f,
};

/* transformers 5's form: rope_parameters per layer type, {"full_attention": {rope_type,
 * rope_theta, factor...}, "sliding_attention": {rope_type: default, rope_theta}}. *flat gets a
 * copy of cfg whose rope_parameters is the full layers' object (what the flat form's
 * rope_theta + rope_scaling say), and *local the sliding layers' base; NULL *flat: cfg has
 * the flat form. */
static int split_rope_parameters(const cJSON *cfg, cJSON **flat, float *local, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *full = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "full_attention") : NULL;
    const cJSON *slide = cJSON_IsObject(rp) ? cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention") : NULL;
    char type[32];
    int rc;
    bool nested = cJSON_IsObject(rp) && rp->child;
    for (const cJSON *it = nested ? rp->child : NULL; it; it = it->next)
        nested = nested && (cJSON_IsObject(it) || !strcmp(it->string, "full_attention") ||
                            !strcmp(it->string, "sliding_attention"));
    *flat = NULL;
    if (!nested)
        return 0;
    for (const cJSON *it = rp->child; it; it = it->next)
        if (strcmp(it->string, "full_attention") != 0 && strcmp(it->string, "sliding_attention") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "rope_parameters: layer type '%s' is not supported",
                            it->string);
    if ((full && !cJSON_IsObject(full)) || (slide && !cJSON_IsObject(slide)))
        return err_setf(e, ERR_CONFIG, "rope_parameters: each layer type's entry must be an object");
    if (slide) {
        if ((rc = cfg_opt_str(slide, "rope_type", "default", type, sizeof type, e)) < 0 ||
            (rc = cfg_opt_float(slide, "rope_theta", *local, local, e)) < 0)
            return err_prefix(e, "rope_parameters.sliding_attention");
        if (strcmp(type, "default") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "rope_parameters.sliding_attention: rope_type '%s' is "
                            "not supported (sliding layers take an unscaled base)", type);
    }
    cJSON *c = cJSON_Duplicate(cfg, true), *f = full ? cJSON_Duplicate(full, true) : cJSON_CreateNull();
    if (!c || !f) {
        cJSON_Delete(c);
        cJSON_Delete(f);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "rope_parameters");
    /* the key's copy may fail: the config would then silently lose its rope */
    if (!cJSON_AddItemToObject(c, "rope_parameters", f)) {
        cJSON_Delete(c);
        cJSON_Delete(f);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    *flat = c;
    return 0;
}

/* use_bidirectional_attention: false / null / absent is the causal LM; true an embedding
 * model whose sliding layers attend a band of sliding_window // 2 each side (above). */
static int gemma3_bidirectional(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(cfg, "use_bidirectional_attention");
    if (!b || cJSON_IsNull(b) || cJSON_IsFalse(b))
        return 0;
    if (!cJSON_IsTrue(b))
        return err_setf(e, ERR_UNSUPPORTED, "config field 'use_bidirectional_attention' must be true, "
                        "false or null for gemma3_text");
    hp->encoder = true;
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].kv == KV_SLIDING)
            hp->layer[il].window = 2 * (hp->layer[il].window / 2) + 1;
    return 0;
}

static int gemma3_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    float local_theta;
    cJSON *flat = NULL;
    int rc;
    hp->qk_norm = true;
    if ((rc = cfg_opt_float(cfg, "rope_local_base_freq", 10000.0f, &local_theta, e)) < 0 ||
        (rc = split_rope_parameters(cfg, &flat, &local_theta, e)) < 0)
        return rc;
    rc = gemma_parse_sandwich(hp, flat ? flat : cfg, &gemma3_text_defaults, e);
    cJSON_Delete(flat);
    if (rc < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->layer[il].kv != KV_SLIDING)
            continue;
        hp->layer[il].rope_theta = local_theta;
        hp->layer[il].rope = ROPE_DEFAULT;
    }
    return gemma3_bidirectional(hp, cfg, e);
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
