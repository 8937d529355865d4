/*
 * cohere self-test: what the Cohere family makes of its config and checkpoint.
 *  - Config: CohereConfig's defaults (layer_norm_eps 1e-5, logit_scale 0.0625, no q/k
 *    norm, tied head); every layer is a parallel block with interleaved-pair rope and
 *    q/k norm as use_qk_norm says; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely with no LayerNorm biases and
 *    no post_attention_layernorm; q/k norm weights are [heads, head_dim]; a missing
 *    tensor is named.
 *  - Forward: logit_scale, the q/k norm and the pair rope style reach the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops cohere_ops;
int cohere_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&cohere_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && hp.logit_scale == 0.0625f && hp.tie_embd &&
                              !hp.layer[0].qk_norm && hp.layer[1].residual == RESID_PARALLEL &&
                              hp.layer[1].rope_style == ROPE_STYLE_PAIRS && hp.layer[0].n_rot == 16 &&
                              stest_near(hp.layer[0].attn_scale, 0.25, 1e-7) &&
                              hp.layer[1].act == ACT_SILU,
                          "CohereConfig defaults in every layer", e)) < 0)
        return rc;
    if ((rc = stest_parse(&cohere_ops, CFG(", \"use_qk_norm\": true, \"logit_scale\": 0.5, "
                                           "\"tie_word_embeddings\": false"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].qk_norm && hp.layer[1].qk_norm && hp.logit_scale == 0.5f &&
                              !hp.tie_embd, "use_qk_norm in every layer; logit_scale; untied", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"logit_scale\": 0"), "logit_scale"},
        {CFG(", \"logit_scale\": \"big\""), "logit_scale"},
        {CFG(", \"use_qk_norm\": 1"), "use_qk_norm"},
        {CFG(", \"hidden_act\": \"tanh\""), "hidden_act"},
    };
    return stest_parse_fails_all(&cohere_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.k_norm.weight",
                                           "model.layers.0.self_attn.q_norm.weight",
                                           "model.layers.0.input_layernorm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "cohere", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].q_norm.shape[0] == 4 &&
                         m->layers[0].k_norm.shape[0] == 2 && m->layers[1].k_norm.shape[1] == 16 &&
                         !tensor_is_present(&m->layers[0].attn_norm_b) &&
                         m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; per-head q/k norms; no norm bias; tied head", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("cohere", required, e)) < 0)
        return rc;
    return stest_load_fails("cohere", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

static void no_qk_norm(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm = false;
}

static void rope_halves(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].rope_style = ROPE_STYLE_HALF;
}

/* The golden checkpoint's logits change with logit_scale, without q/k norm and with
 * rotate-half rope. */
static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_patch_changes_logits("cohere", "{\"logit_scale\": 1.0}", e)) < 0 ||
        (rc = stest_load_variant(&m, "cohere", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, no_qk_norm, "turning the layers' q/k norm off", e)) == 0)
        rc = stest_edit_changes_logits(m, rope_halves, "rope on halves instead of pairs", e);
    model_free(m);
    return rc;
}

int cohere_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
