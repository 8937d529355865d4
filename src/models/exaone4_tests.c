/*
 * exaone4 self-test: what the EXAONE 4 family makes of its config and checkpoint.
 *  - Config: Exaone4Config's defaults (pattern 4, window 4096: three sliding
 *    layers with rope, then a global NoPE one; 32 kv heads when absent,
 *    rms_norm_eps 1e-5, theta 1e4, untied); every layer post-norm with a
 *    per-head q/k norm and no biases; sliding_window_pattern and layer_types
 *    place the layers; sliding_window null puts rope on every layer and slides
 *    none; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; q/k norms of
 *    head_dim; the post norms are required and named when missing.
 *  - Forward: rope on the global layer, and all layers full, each change the
 *    logits.
 */
#include "selftest.h"

extern const struct model_ops exaone4_ops;
int exaone4_ops_self_test(struct err *e);

#define CFG(layers, extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": " #layers ", " \
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                           "\"max_position_embeddings\": 128" extra "}"

/* Post-norm, per-head q/k norm; layer il slides (window w) where bit il of swa is set and has
 * rope (16 dims) where bit il of rope is set. */
static bool layers_are(const struct hparams *hp, unsigned swa, unsigned rope, int w)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        bool s = (swa >> il) & 1u, r = (rope >> il) & 1u;
        if (ls->residual != RESID_POST || !ls->qk_norm || ls->qk_norm_full || ls->ffn != FFN_GLU ||
            ls->kv != (s ? KV_SLIDING : KV_FULL) || ls->window != (s ? w : 0) || ls->n_rot != (r ? 16 : 0))
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&exaone4_ops, CFG(8, ""), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x77u, 0x77u, 4096) && hp.norm_eps == 1e-5f && hp.rope_theta == 1e4f &&
                              !hp.tie_embd && !hp.qkv_bias && !hp.out_bias,
                          "defaults: LLLG, window 4096, NoPE global layers", e)) < 0 ||
        (rc = stest_parse(&exaone4_ops, "{\"vocab_size\": 100, \"hidden_size\": 512, \"num_hidden_layers\": 2, "
                                        "\"num_attention_heads\": 32, \"intermediate_size\": 96, "
                                        "\"max_position_embeddings\": 128}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_kv_head == 32, "32 kv heads when absent", e)) < 0 ||
        (rc = stest_parse(&exaone4_ops, CFG(4, ", \"sliding_window\": 8, \"sliding_window_pattern\": 2, "
                                               "\"attention_bias\": true"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x5u, 0x5u, 8) && !hp.qkv_bias && !hp.out_bias,
                          "pattern 2; no biases whatever attention_bias says", e)) < 0 ||
        (rc = stest_parse(&exaone4_ops, CFG(3, ", \"sliding_window\": 8, \"sliding_window_pattern\": \"LLG\", "
                                               "\"layer_types\": [\"full_attention\", \"sliding_attention\", "
                                               "\"full_attention\"]"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x2u, 0x2u, 8), "layer_types (with a string pattern)", e)) < 0 ||
        (rc = stest_parse(&exaone4_ops, CFG(3, ", \"sliding_window\": null, \"sliding_window_pattern\": null"),
                          &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 0x0u, 0x7u, 0), "sliding_window null: rope everywhere, none slides", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(4, ", \"sliding_window_pattern\": \"LLLG\""), "sliding_window_pattern"},
        {CFG(4, ", \"sliding_window_pattern\": null"), "sliding_window_pattern"},
        {CFG(4, ", \"sliding_window_pattern\": 0"), "sliding_window_pattern"},
        {CFG(2, ", \"sliding_window\": null, \"layer_types\": [\"sliding_attention\", \"full_attention\"]"),
         "sliding_window"},
        {CFG(3, ", \"layer_types\": [\"full_attention\"]"), "layer_types"},
        {CFG(2, ", \"hidden_act\": \"mish\""), "hidden_act"},
    };
    return stest_parse_fails_all(&exaone4_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.3.post_feedforward_layernorm.weight",
                                           "model.layers.1.post_attention_layernorm.weight",
                                           "model.layers.0.self_attn.k_norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("exaone4", required, e)) < 0 ||
        (rc = stest_load_variant(&m, "exaone4", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].q_norm.shape[0] == 16 &&
                         m->hp.layer[2].n_rot == 16 && m->hp.layer[3].n_rot == 0 && m->hp.layer[3].kv == KV_FULL,
                     "every tensor bound; per-head q/k norms; NoPE global layer 3", e);
    model_free(m);
    return rc;
}

static void rope_everywhere(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].n_rot = m->hp.head_dim;
}

static void all_full(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].kv = KV_FULL;
}

int exaone4_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "exaone4", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, all_full, "full attention instead of sliding windows", e)) == 0)
        rc = stest_edit_changes_logits(m, rope_everywhere, "rope on the global layer", e);
    model_free(m);
    return rc;
}
