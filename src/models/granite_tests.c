/*
 * granite self-test: what the Granite family makes of its config and checkpoint.
 *  - Config: GraniteConfig's defaults (every multiplier 1, so the attention
 *    scale is 1 and not 1/sqrt(head_dim); eps 1e-6; untied head); stated
 *    multipliers become the model-wide scales and every layer's attention
 *    scale, logits_scaling its reciprocal; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely with a tied head; a
 *    missing tensor is named; untied, lm_head.weight is required.
 *  - Forward: each of the four multipliers changes the golden logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops granite_ops;
int granite_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool attn_scales_are(const struct hparams *hp, double scale)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (!stest_near(hp->layer[il].attn_scale, scale, 1e-7))
            return false;
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&granite_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.embd_scale == 1.0f && hp.residual_scale == 1.0f && hp.logit_scale == 1.0f &&
                              attn_scales_are(&hp, 1.0) && hp.norm_eps == 1e-6f && !hp.tie_embd &&
                              hp.n_kv_head == 4 && hp.layer[2].n_rot == 16 && hp.layer[0].rope_theta == 1e4f,
                          "defaults: multipliers 1 (attention scale 1), eps 1e-6, untied", e)) < 0 ||
        (rc = stest_parse(&granite_ops, CFG(", \"embedding_multiplier\": 12, \"residual_multiplier\": 0.22, "
                                            "\"attention_multiplier\": 0.0078125, \"logits_scaling\": 8, "
                                            "\"tie_word_embeddings\": true"), &hp, e)) < 0 ||
        (rc = stest_check(hp.embd_scale == 12.0f && hp.residual_scale == 0.22f && hp.logit_scale == 0.125f &&
                              attn_scales_are(&hp, 0.0078125) && hp.tie_embd,
                          "multipliers reach the scales and every layer's attention scale", e)) < 0 ||
        (rc = stest_parse(&granite_ops, CFG(", \"embedding_multiplier\": null, \"logits_scaling\": null"), &hp, e)) < 0 ||
        (rc = stest_check(hp.embd_scale == 1.0f && hp.logit_scale == 1.0f, "null multipliers are 1", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"logits_scaling\": 0"), "logits_scaling"},
        {CFG(", \"logits_scaling\": 1e-45"), "logits_scaling"},
        {CFG(", \"embedding_multiplier\": 0"), "embedding_multiplier"},
        {CFG(", \"residual_multiplier\": 1e99"), "residual_multiplier"},
        {CFG(", \"attention_multiplier\": \"small\""), "attention_multiplier"},
        {CFG(", \"mlp_bias\": true"), "mlp_bias"},
    };
    return stest_parse_fails_all(&granite_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.self_attn.o_proj.weight",
                                           "model.layers.1.post_attention_layernorm.weight",
                                           "model.embed_tokens.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "granite", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; tied head", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("granite", required, e)) < 0)
        return rc;
    return stest_load_fails("granite", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

/* Each multiplier, set back to 1, changes the golden checkpoint's logits. */
static int multipliers_reach_forward(struct err *e)
{
    static const char *const patches[] = {"{\"embedding_multiplier\": 1}", "{\"residual_multiplier\": 1}",
                                          "{\"attention_multiplier\": 1}", "{\"logits_scaling\": 1}", NULL};
    int rc = 0;
    for (int i = 0; patches[i] && rc == 0; i++)
        rc = stest_patch_changes_logits("granite", patches[i], e);
    return rc;
}

int granite_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return multipliers_reach_forward(e);
}
