/*
 * olmo2 self-test: what the OLMo 2 family makes of its config and checkpoint.
 *  - Config: Olmo2Config's defaults when a field is absent or null
 *    (rms_norm_eps 1e-5, theta 1e4, silu, untied head); every layer is a
 *    post-norm layer with a q/k norm over the full q / k width; rejections
 *    name the field.
 *  - Weights: the published checkpoint is consumed entirely; q_norm / k_norm
 *    are of the full q / k width (64 and 32 here, not head_dim 16); the post
 *    norms are required and a missing one is named; no input_layernorm.
 *  - Forward: per-head instead of full-width q/k norm, and pre-norm instead
 *    of post-norm residuals, each change the logits, so the forward reads
 *    both spec fields.
 * Numerical parity with transformers lives in tests/test_golden.c.
 */
#include "selftest.h"

extern const struct model_ops olmo2_ops;
int olmo2_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 176, \"max_position_embeddings\": 256"

/* Every layer post-norm, full-width q/k norm, SwiGLU silu, full rotary of head_dim 16. */
static bool layers_are_olmo2(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->residual != RESID_POST || !ls->qk_norm || !ls->qk_norm_full || ls->ffn != FFN_GLU ||
            ls->act != ACT_SILU || ls->n_rot != 16 || ls->kv != KV_FULL)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&olmo2_ops, "{" BASE "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm == NORM_RMS && hp.norm_eps == 1e-5f && hp.rope_theta == 1e4f && !hp.tie_embd &&
                              !hp.qkv_bias && layers_are_olmo2(&hp),
                          "defaults: RMSNorm eps 1e-5, theta 1e4, untied; post-norm, full q/k norm", e)) < 0 ||
        (rc = stest_parse(&olmo2_ops, "{" BASE ", \"rms_norm_eps\": null, \"rope_theta\": null, "
                          "\"hidden_act\": null, \"tie_word_embeddings\": null}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && hp.rope_theta == 1e4f && !hp.tie_embd && layers_are_olmo2(&hp),
                          "null fields take the defaults", e)) < 0 ||
        (rc = stest_parse(&olmo2_ops, "{" BASE ", \"rms_norm_eps\": 1e-6, \"rope_theta\": 5e5, "
                          "\"attention_bias\": true}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-6f && hp.layer[2].rope_theta == 5e5f && hp.qkv_bias && hp.out_bias &&
                              layers_are_olmo2(&hp), "stated eps, theta per layer, attention_bias", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"rms_norm_eps\": \"small\"}", "rms_norm_eps"},
        {"{" BASE ", \"hidden_act\": \"mish\"}", "hidden_act"},
        {"{" BASE ", \"attention_bias\": 1}", "attention_bias"},
        {"{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
         "\"max_position_embeddings\": 256}", "intermediate_size"},
    };
    return stest_parse_fails_all(&olmo2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.post_feedforward_layernorm.weight",
                                           "model.layers.1.post_attention_layernorm.weight",
                                           "model.layers.1.self_attn.q_norm.weight",
                                           "model.layers.0.self_attn.k_norm.weight", "lm_head.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("olmo2", required, e)) < 0 || (rc = stest_load_variant(&m, "olmo2", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].q_norm.shape[0] == 64 &&
                         m->layers[1].k_norm.shape[0] == 32 && m->lm_head.data != m->tok_embd.data,
                     "every tensor bound; q/k norms of the full q / k width; untied head", e);
    model_free(m);
    return rc;
}

static void per_head_qk_norm(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm_full = false;
}

static void pre_norm(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].residual = RESID_SEQUENTIAL;
}

static int forward_reads_specs(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "olmo2", NULL, NULL, e)) < 0)
        return rc;
    /* the edits accumulate: the second changes the residuals of the per-head variant */
    if ((rc = stest_edit_changes_logits(m, per_head_qk_norm, "a per-head instead of full-width q/k norm", e)) == 0)
        rc = stest_edit_changes_logits(m, pre_norm, "pre-norm instead of post-norm residuals", e);
    model_free(m);
    return rc;
}

int olmo2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads_specs(e)) < 0)
        return rc;
    return 0;
}
