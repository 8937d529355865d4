/*
 * phimoe self-test: what the PhiMoE family makes of its config and
 * checkpoint, and its sparsemixer routing.
 *  - Config: router_jitter_noise (PhimoeConfig default 0.01) is every
 *    layer's sparsemixer epsilon; the LayerNorm epsilon comes from
 *    rms_norm_eps; attention_bias and lm_head_bias (both false by default)
 *    decide the biases; sparsemixer needs top-2 and says so.
 *  - Routing on a worked example: experts whose logit lies within the
 *    relative band 2*eps of the winner share its softmax; the second pick
 *    repeats with the winner masked.
 *  - Weights: the published layout is consumed entirely; the LayerNorm,
 *    attention and head biases the config asks for are required (a missing
 *    one is named) and left unbound when it does not; mlx-lm's stacked
 *    expert layout binds byte-identical views.
 *  - Forward: router_jitter_noise changes the golden checkpoint's logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops phimoe_ops;
int phimoe_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 128, \"max_position_embeddings\": 256, " \
             "\"num_local_experts\": 4"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phimoe_ops, "{" BASE ", \"num_experts_per_tok\": 2, \"router_jitter_noise\": null}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].router_jitter == 0.01f && hp.layer[1].router_jitter == 0.01f &&
                              hp.norm_eps == 1e-5f && !hp.qkv_bias && !hp.out_bias && !hp.head_bias,
                          "defaults: jitter 0.01 per layer, eps 1e-5, no biases", e)) < 0 ||
        (rc = stest_parse(&phimoe_ops, "{" BASE ", \"num_experts_per_tok\": 2, \"router_jitter_noise\": 0.2, "
                          "\"rms_norm_eps\": 1e-6, \"attention_bias\": true, \"lm_head_bias\": true}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].router_jitter == 0.2f && hp.norm_eps == 1e-6f && hp.qkv_bias && hp.out_bias &&
                              hp.head_bias, "router_jitter_noise per layer, rms_norm_eps, biases", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"num_experts_per_tok\": 3}", "sparsemixer"},
        {"{" BASE ", \"num_experts_per_tok\": 2, \"lm_head_bias\": \"yes\"}", "lm_head_bias"},
        {"{" BASE ", \"num_experts_per_tok\": 2, \"router_jitter_noise\": [0.1]}", "router_jitter_noise"},
    };
    if ((rc = stest_parse_fails_all(&phimoe_ops, bad, sizeof bad / sizeof bad[0], e)) < 0)
        return rc;
    /* winner 0 (2.0); 1.99 is within (2 - 1.99) / 2 = 0.005 <= 2 * 0.01 so it shares the softmax */
    if ((rc = stest_parse(&phimoe_ops, "{" BASE ", \"num_experts_per_tok\": 2}", &hp, e)) < 0)
        return rc;
    float logits[4] = {2.0f, 1.99f, 0.0f, -1.0f};
    int32_t sel[2];
    float w[2];
    if ((rc = stest_route(&hp, logits, sel, w, e)) < 0)
        return rc;
    double w0 = 1.0 / (1.0 + exp(1.99 - 2.0));
    return stest_check(sel[0] == 0 && sel[1] == 1 && stest_near(w[0], w0, 1e-6) && stest_near(w[1], 1.0, 1e-6),
                       "sparsemixer worked example", e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.post_attention_layernorm.bias",
                                           "model.layers.0.self_attn.o_proj.bias", "model.norm.bias",
                                           "lm_head.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_stacked_agrees("phimoe", "model.layers.1.block_sparse_moe.switch_mlp.up_proj.weight", e)) < 0 ||
        (rc = stest_missing_named("phimoe", required, e)) < 0)
        return rc;
    /* without attention_bias / lm_head_bias the checkpoint's biases stay unbound: 4 per layer + head */
    if ((rc = stest_load_variant(&m, "phimoe", "{\"attention_bias\": false, \"lm_head_bias\": false}", NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 9 && !tensor_is_present(&m->layers[0].bq) &&
                         !tensor_is_present(&m->lm_head_b), "biases only when the config asks", e);
    model_free(m);
    return rc;
}

int phimoe_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    /* a wide band lets more experts share the winner's softmax */
    return stest_patch_changes_logits("phimoe", "{\"router_jitter_noise\": 0.9}", e);
}
