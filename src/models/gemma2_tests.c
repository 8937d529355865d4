/*
 * gemma2 self-test: what the Gemma 2 family makes of its config and checkpoint.
 *  - Config: Gemma2Config's defaults (query_pre_attn_scalar 256, attention soft-cap 50,
 *    final soft-cap 30, window 4096 on even layers); null soft-caps are none;
 *    query_pre_attn_scalar sets every layer's scale; layer_types overrides the
 *    alternation; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely (four norms per layer); a
 *    missing sandwich norm is named.
 *  - Forward: the sandwich post norms, the attention and the final soft-capping reach
 *    the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops gemma2_ops;
int gemma2_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3, " \
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool sandwich_layers(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].residual != RESID_SANDWICH)
            return false;
    return hp->norm_w_offset == 1.0f;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&gemma2_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 256 && stest_near(hp.layer[1].attn_scale, 1.0 / 16.0, 1e-7) &&
                              hp.layer[0].softcap == 50.0f && hp.layer[2].softcap == 50.0f &&
                              hp.logit_softcap == 30.0f && sandwich_layers(&hp) &&
                              hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 4096 &&
                              hp.layer[1].kv == KV_FULL && hp.layer[2].kv == KV_SLIDING,
                          "Gemma2Config defaults: scale 256^-0.5, caps 50 / 30, sliding even layers", e)) < 0)
        return rc;
    if ((rc = stest_parse(&gemma2_ops, CFG(", \"head_dim\": 32, \"query_pre_attn_scalar\": 24, "
                                           "\"attn_logit_softcapping\": null, \"final_logit_softcapping\": null, "
                                           "\"sliding_window\": 8"), &hp, e)) < 0 ||
        (rc = stest_check(stest_near(hp.layer[2].attn_scale, 1.0 / sqrt(24.0), 1e-7) &&
                              hp.layer[1].softcap == 0.0f && hp.logit_softcap == 0.0f &&
                              hp.layer[2].window == 8 && hp.layer[1].kv == KV_FULL,
                          "query_pre_attn_scalar 24; null caps are none; window 8", e)) < 0)
        return rc;
    if ((rc = stest_parse(&gemma2_ops, CFG(", \"sliding_window\": 8, \"layer_types\": [\"full_attention\", "
                                           "\"sliding_attention\", \"full_attention\"]"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_SLIDING &&
                              hp.layer[1].window == 8 && hp.layer[2].kv == KV_FULL,
                          "layer_types names each layer's kind", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"query_pre_attn_scalar\": 0"), "query_pre_attn_scalar"},
        {CFG(", \"attn_logit_softcapping\": -1"), "attn_logit_softcapping"},
        {CFG(", \"final_logit_softcapping\": \"high\""), "final_logit_softcapping"},
        {CFG(", \"sliding_window\": 0"), "sliding_window"},
        {CFG(", \"layer_types\": [\"full_attention\"]"), "layer_types"},
    };
    return stest_parse_fails_all(&gemma2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.pre_feedforward_layernorm.weight",
                                           "model.layers.1.post_feedforward_layernorm.weight",
                                           "model.layers.1.post_attention_layernorm.weight",
                                           "model.layers.0.input_layernorm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma2", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[1].ffn_post_norm.shape[0] == 64 &&
                         m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; sandwich norms; tied head", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("gemma2", required, e);
}

static void no_post_norms(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].residual = RESID_SEQUENTIAL;
}
static void no_attn_softcap(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].softcap = 0.0f;
}
static void no_final_softcap(struct model *m) { m->hp.logit_softcap = 0.0f; }

static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma2", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, no_post_norms, "sequential instead of sandwich norms", e)) == 0 &&
        (rc = stest_edit_changes_logits(m, no_attn_softcap, "no attention soft-capping", e)) == 0)
        rc = stest_edit_changes_logits(m, no_final_softcap, "no final logit soft-capping", e);
    model_free(m);
    return rc;
}

int gemma2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
