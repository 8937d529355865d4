/*
 * smollm3 self-test: what the SmolLM3 family makes of its config and checkpoint.
 *  - Config: SmolLM3Config's defaults (NoPE every 4th layer from
 *    no_rope_layer_interval, rope_theta 2e6, tied head, 4 kv heads when the
 *    field is absent, all heads when it is null); an explicit no_rope_layers
 *    list sets the rotary dims of each layer; use_sliding_window slides the
 *    NoPE layers only; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely with a tied head; a
 *    missing tensor is named; untied, lm_head.weight is required.
 *  - Forward: putting rope back on the NoPE layer changes the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops smollm3_ops;
int smollm3_ops_self_test(struct err *e);

#define CFG(layers, extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": " #layers ", " \
                           "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                           "\"max_position_embeddings\": 128" extra "}"

/* Layer il has rope (16 dims, theta) exactly where mask bit il is set. */
static bool rope_layers_are(const struct hparams *hp, unsigned mask, float theta)
{
    for (int il = 0; il < hp->n_layer; il++) {
        bool rope = (mask >> il) & 1u;
        if (hp->layer[il].n_rot != (rope ? 16 : 0) || hp->layer[il].rope_theta != theta)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* defaults: interval 4 -> layers 3 and 7 are NoPE; theta 2e6; tied; 4 kv heads */
    if ((rc = stest_parse(&smollm3_ops, CFG(8, ""), &hp, e)) < 0 ||
        (rc = stest_check(rope_layers_are(&hp, 0x77u, 2e6f) && hp.tie_embd && hp.n_kv_head == 4 &&
                              hp.norm_eps == 1e-6f && stest_near(hp.layer[3].attn_scale, 0.25, 1e-7),
                          "defaults: NoPE every 4th layer, theta 2e6, tied, 4 kv heads", e)) < 0 ||
        (rc = stest_parse(&smollm3_ops, CFG(4, ", \"num_key_value_heads\": null, \"no_rope_layer_interval\": 2, "
                                              "\"tie_word_embeddings\": false"), &hp, e)) < 0 ||
        (rc = stest_check(rope_layers_are(&hp, 0x5u, 2e6f) && !hp.tie_embd && hp.n_kv_head == 4 &&
                              hp.n_head == 4, "interval 2; null kv heads = heads; untied", e)) < 0)
        return rc;
    /* an explicit list (longer than the layers is allowed) wins over the interval */
    if ((rc = stest_parse(&smollm3_ops, CFG(3, ", \"no_rope_layers\": [0, 1, 1, 0], \"no_rope_layer_interval\": 1, "
                                              "\"rope_theta\": 5e4, \"num_key_value_heads\": 2"), &hp, e)) < 0 ||
        (rc = stest_check(rope_layers_are(&hp, 0x6u, 5e4f) && hp.n_kv_head == 2,
                          "no_rope_layers sets each layer's rotary dims", e)) < 0)
        return rc;
    /* use_sliding_window slides the NoPE layers; layer_types states each layer itself */
    if ((rc = stest_parse(&smollm3_ops, CFG(4, ", \"no_rope_layers\": [1, 0, 1, 0], \"use_sliding_window\": true, "
                                              "\"sliding_window\": 8"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_SLIDING && hp.layer[1].window == 8 &&
                              hp.layer[2].kv == KV_FULL && hp.layer[3].kv == KV_SLIDING,
                          "NoPE layers slide", e)) < 0 ||
        (rc = stest_parse(&smollm3_ops, CFG(4, ", \"no_rope_layers\": [1, 0, 1, 0], \"sliding_window\": 8"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].kv == KV_FULL && hp.layer[3].kv == KV_FULL,
                          "no sliding without use_sliding_window", e)) < 0 ||
        (rc = stest_parse(&smollm3_ops, CFG(2, ", \"sliding_window\": 8, \"use_sliding_window\": true, "
                                              "\"layer_types\": [\"sliding_attention\", \"full_attention\"]"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[1].kv == KV_FULL, "layer_types wins", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(3, ", \"no_rope_layers\": [1, 0]"), "no_rope_layers"},
        {CFG(2, ", \"no_rope_layers\": [1, 2]"), "no_rope_layers"},
        {CFG(2, ", \"no_rope_layers\": [1, \"0\"]"), "no_rope_layers"},
        {CFG(2, ", \"no_rope_layers\": 1"), "no_rope_layers"},
        {CFG(2, ", \"no_rope_layer_interval\": 0"), "no_rope_layer_interval"},
        {CFG(2, ", \"mlp_bias\": true"), "mlp_bias"},
        {CFG(2, ", \"num_key_value_heads\": 3"), "num_key_value_heads"},
    };
    return stest_parse_fails_all(&smollm3_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.k_proj.weight",
                                           "model.layers.0.mlp.gate_proj.weight", "model.norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "smollm3", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->lm_head.data == m->tok_embd.data &&
                         m->hp.layer[0].n_rot == 16 && m->hp.layer[1].n_rot == 0,
                     "every tensor bound; tied head; layer 1 NoPE", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("smollm3", required, e)) < 0)
        return rc;
    return stest_load_fails("smollm3", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

int smollm3_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    /* rope on the NoPE layer reaches the forward */
    return stest_patch_changes_logits("smollm3", "{\"no_rope_layers\": [1, 1]}", e);
}
