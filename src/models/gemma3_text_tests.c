/*
 * gemma3_text self-test: what the Gemma 3 text family makes of its config and checkpoint.
 *  - Config: Gemma3TextConfig's defaults (rope_theta 1e6, local base 1e4, window 4096 with
 *    every 6th layer full, no soft-capping, per-head q/k norm); sliding layers take the
 *    local base unscaled and full layers rope_theta with rope_scaling; layer_types and
 *    sliding_window_pattern decide the kinds; use_bidirectional_attention (EmbeddingGemma) makes
 *    an encoder whose sliding layers attend a band; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; a missing q/k norm or sandwich
 *    norm is named.
 *  - Forward: the q/k norm, the local rope base and the full layers' scaling reach the logits.
 */
#include <stdlib.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops gemma3_text_ops;
int gemma3_text_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 7, " \
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&gemma3_text_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 256 && hp.layer[0].qk_norm && !hp.layer[0].qk_norm_full &&
                              hp.layer[3].softcap == 0.0f && hp.logit_softcap == 0.0f &&
                              hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 4096 &&
                              hp.layer[0].rope_theta == 1e4f && hp.layer[4].kv == KV_SLIDING &&
                              hp.layer[5].kv == KV_FULL && hp.layer[5].rope_theta == 1e6f &&
                              hp.layer[6].kv == KV_SLIDING && hp.layer[1].residual == RESID_SANDWICH,
                          "Gemma3TextConfig defaults: pattern 6, local base 1e4, no caps, q/k norm", e)) < 0)
        return rc;
    if ((rc = stest_parse(&gemma3_text_ops, CFG(", \"sliding_window\": 8, \"sliding_window_pattern\": 2, "
                                                "\"rope_local_base_freq\": 500, \"rope_scaling\": "
                                                "{\"rope_type\": \"linear\", \"factor\": 8}"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 8 &&
                              hp.layer[0].rope_theta == 500.0f && hp.layer[0].rope == ROPE_DEFAULT &&
                              hp.layer[1].kv == KV_FULL && hp.layer[1].rope == ROPE_LINEAR &&
                              hp.layer[1].rope_theta == 1e6f && hp.rope_factor == 8.0f,
                          "pattern 2; sliding layers unscaled local base, full layers linear x8", e)) < 0)
        return rc;
    if ((rc = stest_parse(&gemma3_text_ops,
                          CFG(", \"sliding_window\": 8, \"layer_types\": [\"full_attention\", "
                              "\"sliding_attention\", \"full_attention\", \"full_attention\", "
                              "\"full_attention\", \"full_attention\", \"full_attention\"]"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[0].rope_theta == 1e6f &&
                              hp.layer[1].kv == KV_SLIDING && hp.layer[1].rope_theta == 1e4f,
                          "layer_types names each layer's kind and rope base", e)) < 0)
        return rc;
    /* transformers 5: rope_parameters per layer type, the flat fields absent */
    if ((rc = stest_parse(&gemma3_text_ops,
                          CFG(", \"sliding_window\": 8, \"sliding_window_pattern\": 2, \"rope_parameters\": "
                              "{\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 4, \"rope_theta\": 2e5}, "
                              "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 300}}"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[0].rope_theta == 300.0f &&
                              hp.layer[0].rope == ROPE_DEFAULT && hp.layer[1].kv == KV_FULL &&
                              hp.layer[1].rope == ROPE_LINEAR && hp.layer[1].rope_theta == 2e5f &&
                              hp.rope_factor == 4.0f,
                          "rope_parameters per layer type: local base 300, full layers linear x4 on 2e5", e)) < 0)
        return rc;
    /* EmbeddingGemma: bidirectional, sliding layers a band of sliding_window // 2 each side
     * (window 2 (W // 2) + 1); false and null are the causal LM */
    if ((rc = stest_parse(&gemma3_text_ops, CFG(", \"sliding_window\": 512, \"use_bidirectional_attention\": true"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.encoder && !hp.causal && hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 513 &&
                              hp.layer[5].kv == KV_FULL,
                          "use_bidirectional_attention: an encoder, sliding band 256 each side", e)) < 0 ||
        (rc = stest_parse(&gemma3_text_ops, CFG(", \"sliding_window\": 7, \"use_bidirectional_attention\": true"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].window == 7, "an odd sliding_window: 3 each side (7 // 2 + 1 exclusive)",
                          e)) < 0 ||
        (rc = stest_parse(&gemma3_text_ops, CFG(", \"sliding_window\": 8, \"use_bidirectional_attention\": null"),
                          &hp, e)) < 0 ||
        (rc = stest_check(!hp.encoder && hp.layer[0].window == 8, "use_bidirectional_attention null: causal", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"use_bidirectional_attention\": \"vision\""), "use_bidirectional_attention"},
        {CFG(", \"sliding_window_pattern\": 0"), "sliding_window_pattern"},
        {CFG(", \"rope_local_base_freq\": \"fast\""), "rope_local_base_freq"},
        {CFG(", \"query_pre_attn_scalar\": -4"), "query_pre_attn_scalar"},
        {CFG(", \"rope_parameters\": {\"chunked_attention\": {\"rope_type\": \"default\"}}"),
         "layer type 'chunked_attention'"},
        {CFG(", \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2}}"),
         "rope_parameters.sliding_attention: rope_type 'linear'"},
        {CFG(", \"rope_parameters\": {\"full_attention\": 7}"), "must be an object"},
        {CFG(", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"ntk\"}}"), "'ntk'"},
    };
    return stest_parse_fails_all(&gemma3_text_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.self_attn.q_norm.weight",
                                           "model.layers.1.self_attn.k_norm.weight",
                                           "model.layers.1.pre_feedforward_layernorm.weight",
                                           "model.layers.0.post_attention_layernorm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma3_text", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].q_norm.shape[0] == 32 &&
                         m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; per-head q norm; tied head", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("gemma3_text", required, e);
}

static void no_qk_norm(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm = false;
}

/* The golden config rewritten as transformers 5 writes it (rope_parameters per layer type)
 * gives the golden logits, bit for bit; stale flat fields beside it are not read. */
static int same_as_transformers5(struct err *e)
{
    static const char *const patch =
        "{\"rope_scaling\": null, \"rope_theta\": 5.0, \"rope_local_base_freq\": 1.0, "
        "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0, "
        "\"rope_theta\": 1000000.0}, \"sliding_attention\": {\"rope_type\": \"default\", "
        "\"rope_theta\": 10000.0}}}";
    struct model *a = NULL, *b = NULL;
    float *l = NULL;
    int rc;
    if ((rc = stest_load_variant(&a, "gemma3_text", NULL, NULL, e)) < 0 ||
        (rc = stest_load_variant(&b, "gemma3_text", patch, NULL, e)) < 0)
        goto out;
    int nv = a->hp.n_vocab;
    if (!(l = malloc(2 * (size_t)nv * sizeof *l))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = stest_prompt_logits(a, l, e)) < 0 || (rc = stest_prompt_logits(b, l + nv, e)) < 0)
        goto out;
    rc = stest_check(memcmp(l, l + nv, (size_t)nv * sizeof *l) == 0,
                     "transformers 5's rope_parameters give the flat form's logits", e);
out:
    free(l);
    model_free(a);
    model_free(b);
    return rc;
}

/* rope bases and scaling are read when the context is prepared: change them through config */
static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma3_text", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, no_qk_norm, "no q/k norm", e);
    model_free(m);
    if (rc < 0 || (rc = stest_patch_changes_logits("gemma3_text", "{\"rope_local_base_freq\": 1e6}", e)) < 0)
        return rc;
    if ((rc = stest_patch_changes_logits("gemma3_text", "{\"rope_scaling\": null}", e)) < 0)
        return rc;
    return same_as_transformers5(e);
}

int gemma3_text_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
