/*
 * arcee self-test: what the Arcee family makes of its config and checkpoint.
 *  - Config: ArceeConfig's defaults (relu2 in a non-gated MLP in every layer,
 *    rms_norm_eps 1e-5, theta 1e4, untied, kv heads = heads); another stated
 *    activation reaches every layer; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely with no gate
 *    projection; up_proj / down_proj are required and named when missing.
 *  - Forward: relu instead of relu² changes the logits.
 */
#include "selftest.h"

extern const struct model_ops arcee_ops;
int arcee_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool layers_are(const struct hparams *hp, enum act_kind act)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->ffn != FFN_MLP || ls->act != act || ls->residual != RESID_SEQUENTIAL || ls->n_rot != 16 ||
            ls->qk_norm || ls->moe)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&arcee_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, ACT_RELU2) && hp.norm_eps == 1e-5f && hp.rope_theta == 1e4f &&
                              !hp.tie_embd && hp.n_kv_head == 4 && !hp.qkv_bias,
                          "defaults: relu2 MLP, eps 1e-5, theta 1e4, untied", e)) < 0 ||
        (rc = stest_parse(&arcee_ops, CFG(", \"hidden_act\": \"gelu\", \"rms_norm_eps\": null, "
                                          "\"attention_bias\": true, \"num_key_value_heads\": 2"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, ACT_GELU_ERF) && hp.norm_eps == 1e-5f && hp.qkv_bias && hp.out_bias &&
                              hp.n_kv_head == 2, "stated activation; attention_bias on q, k, v and o", e)) < 0 ||
        (rc = stest_parse(&arcee_ops, CFG(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                                          "\"original_max_position_embeddings\": 32}"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].rope == ROPE_YARN, "yarn rope scaling", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"mlp_bias\": true"), "mlp_bias"},
        {CFG(", \"hidden_act\": \"mish\""), "hidden_act"},
        {CFG(", \"hidden_act\": \"silu\""), "silu"},
        {CFG(", \"num_key_value_heads\": 3"), "num_key_value_heads"},
    };
    return stest_parse_fails_all(&arcee_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
                                           "model.layers.1.post_attention_layernorm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("arcee", required, e)) < 0 || (rc = stest_load_variant(&m, "arcee", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && !tensor_is_present(&m->layers[0].gate) &&
                         tensor_is_present(&m->layers[1].up), "every tensor bound; no gate projection", e);
    model_free(m);
    return rc;
}

static void plain_relu(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].act = ACT_RELU;
}

int arcee_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = stest_load_variant(&m, "arcee", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, plain_relu, "relu instead of relu squared", e);
    model_free(m);
    return rc;
}
