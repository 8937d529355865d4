/*
 * mixtral self-test: MoE config fields and routing weights equal to
 * softmax over all experts, kept for the top-k and renormalized (computed
 * here independently in double).
 */
#include <math.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops mixtral_ops;
int mixtral_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 128, \"max_position_embeddings\": 256, " \
             "\"num_local_experts\": 8"

int mixtral_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&mixtral_ops, "{" BASE ", \"num_experts_per_tok\": 2}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_expert == 8 && hp.n_expert_used == 2 && hp.router == ROUTER_SOFTMAX_TOPK &&
                              hp.rope_theta == 1e6f && hp.ffn == FFN_GLU, "mixtral fields", e)) < 0)
        return rc;
    if ((rc = stest_parse_fails(&mixtral_ops, "{" BASE ", \"num_experts_per_tok\": 9}", "num_experts_per_tok", e)) < 0 ||
        (rc = stest_parse_fails(&mixtral_ops, "{" BASE "}", "num_experts_per_tok", e)) < 0)
        return rc;
    float logits[8] = {0.3f, -1.2f, 2.2f, 0.9f, 1.7f, -0.4f, 0.0f, 1.1f};
    int32_t sel[2];
    float w[2];
    if ((rc = stest_route(&hp, logits, sel, w, e)) < 0)
        return rc;
    double z = 0.0;
    for (int i = 0; i < 8; i++)
        z += exp(logits[i]);
    double p2 = exp(2.2) / z, p4 = exp(1.7) / z;
    return stest_check(sel[0] == 2 && sel[1] == 4 && stest_near(w[0], p2 / (p2 + p4), 1e-6) &&
                           stest_near(w[1], p4 / (p2 + p4), 1e-6),
                       "softmax, top-k, renormalize", e);
}
