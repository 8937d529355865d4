/*
 * olmo3 self-test: what the OLMo 3 family makes of its config and checkpoint.
 *  - Config: Olmo3Config's defaults (three sliding layers to one full one,
 *    window 4096, theta 5e5 on both layer types, rms_norm_eps 1e-5, untied);
 *    every layer post-norm with a full-width q/k norm; layer_types states each
 *    layer; rope_parameters per layer type gives each type its theta and the
 *    full layers their scaling; the flat form sends rope_scaling and rope_theta
 *    to the full layers only; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; q/k norms of the
 *    full q / k width; the post norms are required and named when missing.
 *  - Forward: all layers full instead of sliding changes the logits (the
 *    golden prompt outruns the window of 8).
 */
#include "selftest.h"

extern const struct model_ops olmo3_ops;
int olmo3_ops_self_test(struct err *e);

#define CFG(layers, extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": " #layers ", " \
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                           "\"max_position_embeddings\": 128" extra "}"

/* Every layer post-norm with a full-width q/k norm; layer il slides (window w) exactly where
 * mask bit il is set, with theta_swa there and theta_full elsewhere. */
static bool layers_are(const struct hparams *hp, unsigned mask, int w, float theta_swa, float theta_full)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        bool swa = (mask >> il) & 1u;
        if (ls->residual != RESID_POST || !ls->qk_norm || !ls->qk_norm_full || ls->n_rot != 16 ||
            ls->kv != (swa ? KV_SLIDING : KV_FULL) || ls->window != (swa ? w : 0) ||
            ls->rope_theta != (swa ? theta_swa : theta_full) || (swa && ls->rope != ROPE_DEFAULT))
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&olmo3_ops, CFG(8, ""), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x77u, 4096, 5e5f, 5e5f) && hp.norm_eps == 1e-5f && !hp.tie_embd &&
                              !hp.qkv_bias, "defaults: 3:1 sliding, window 4096, theta 5e5", e)) < 0 ||
        (rc = stest_parse(&olmo3_ops, CFG(3, ", \"sliding_window\": 8, \"layer_types\": [\"full_attention\", "
                                             "\"sliding_attention\", \"full_attention\"], \"attention_bias\": true"),
                          &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x2u, 8, 5e5f, 5e5f) && hp.qkv_bias && hp.out_bias,
                          "layer_types; attention_bias on q, k, v and o", e)) < 0)
        return rc;
    /* per layer type: each its theta; yarn on the full layers only */
    if ((rc = stest_parse(&olmo3_ops, CFG(4, ", \"sliding_window\": 8, \"rope_parameters\": {\"sliding_attention\": "
                                             "{\"rope_type\": \"default\", \"rope_theta\": 1e4}, \"full_attention\": "
                                             "{\"rope_type\": \"yarn\", \"rope_theta\": 2e5, \"factor\": 4.0, "
                                             "\"original_max_position_embeddings\": 32}}"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x7u, 8, 1e4f, 2e5f) && hp.layer[3].rope == ROPE_YARN &&
                              hp.rope_factor == 4.0f, "rope per layer type", e)) < 0)
        return rc;
    /* the flat form: rope_theta and rope_scaling go to the full layers; the sliding ones keep 5e5 */
    if ((rc = stest_parse(&olmo3_ops, CFG(4, ", \"sliding_window\": 8, \"rope_theta\": 1e4, \"rope_scaling\": "
                                             "{\"rope_type\": \"linear\", \"factor\": 2.0}"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x7u, 8, 5e5f, 1e4f) && hp.layer[3].rope == ROPE_LINEAR,
                          "flat rope_theta / rope_scaling: full layers only", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(4, ", \"sliding_window\": null"), "sliding_window"},
        {CFG(4, ", \"sliding_window\": -1"), "sliding_window"},
        {CFG(3, ", \"layer_types\": [\"full_attention\"]"), "layer_types"},
        {CFG(2, ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}"), "rope_parameters"},
        {CFG(2, ", \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}"),
         "sliding_attention"},
        {CFG(2, ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"su2\"}}"), "su2"},
        {CFG(2, ", \"hidden_act\": \"mish\""), "hidden_act"},
    };
    return stest_parse_fails_all(&olmo3_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.3.post_feedforward_layernorm.weight",
                                           "model.layers.0.post_attention_layernorm.weight",
                                           "model.layers.2.self_attn.q_norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("olmo3", required, e)) < 0 || (rc = stest_load_variant(&m, "olmo3", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].q_norm.shape[0] == 64 &&
                         m->layers[1].k_norm.shape[0] == 32 && m->hp.layer[2].kv == KV_SLIDING &&
                         m->hp.layer[3].kv == KV_FULL,
                     "every tensor bound; full-width q/k norms; 3 sliding layers, then a full one", e);
    model_free(m);
    return rc;
}

static void all_full(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].kv = KV_FULL;
}

int olmo3_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "olmo3", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, all_full, "full attention instead of sliding windows", e);
    model_free(m);
    return rc;
}
