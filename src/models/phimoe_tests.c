/*
 * phimoe self-test: config flags (LayerNorm, biases, sparsemixer with
 * router_jitter_noise as epsilon) and sparsemixer routing on a worked
 * example: experts whose logit lies within the relative band 2*eps of the
 * winner share its softmax; the second pick repeats with the winner masked.
 */
#include <math.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops phimoe_ops;
int phimoe_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 128, \"max_position_embeddings\": 256, " \
             "\"num_local_experts\": 4"

int phimoe_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phimoe_ops, "{" BASE ", \"num_experts_per_tok\": 2, \"attention_bias\": true, "
                                       "\"lm_head_bias\": true, \"router_jitter_noise\": 0.01}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm == NORM_LAYER && hp.qkv_bias && hp.out_bias && hp.head_bias &&
                              hp.router == ROUTER_SPARSEMIXER && hp.router_jitter == 0.01f,
                          "phimoe flags", e)) < 0)
        return rc;
    if ((rc = stest_parse_fails(&phimoe_ops, "{" BASE ", \"num_experts_per_tok\": 3}", "sparsemixer", e)) < 0)
        return rc;
    /* winner 0 (2.0); 1.99 is within (2 - 1.99) / 2 = 0.005 <= 0.02 so it shares the softmax */
    float logits[4] = {2.0f, 1.99f, 0.0f, -1.0f};
    int32_t sel[2];
    float w[2];
    if ((rc = stest_route(&hp, logits, sel, w, e)) < 0)
        return rc;
    double w0 = 1.0 / (1.0 + exp(1.99 - 2.0));
    return stest_check(sel[0] == 0 && sel[1] == 1 && stest_near(w[0], w0, 1e-6) && stest_near(w[1], 1.0, 1e-6),
                       "sparsemixer worked example", e);
}
