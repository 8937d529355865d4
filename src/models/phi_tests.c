/*
 * phi self-test: Phi-2 config normalization (layer_norm_eps, partial rotary
 * default 0.5, parallel residual, biases everywhere) and rejection of
 * qk_layernorm, which this family does not implement.
 */
#include "selftest.h"

extern const struct model_ops phi_ops;
int phi_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 256, \"max_position_embeddings\": 256"

int phi_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phi_ops, "{" BASE ", \"layer_norm_eps\": 1e-6}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_rot == 8 && hp.head_dim == 16 && hp.norm_eps == 1e-6f, "partial rotary 0.5 default", e)) < 0 ||
        (rc = stest_check(hp.norm == NORM_LAYER && hp.parallel_residual && hp.qkv_bias && hp.out_bias &&
                              hp.ffn == FFN_MLP && hp.act == ACT_GELU_TANH && hp.head_bias,
                          "phi-2 block flags", e)) < 0)
        return rc;
    if ((rc = stest_parse(&phi_ops, "{" BASE ", \"partial_rotary_factor\": 0.25}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_rot == 4, "partial_rotary_factor honoured", e)) < 0)
        return rc;
    if ((rc = stest_parse_fails(&phi_ops, "{" BASE ", \"qk_layernorm\": true}", "qk_layernorm", e)) < 0 ||
        (rc = stest_parse_fails(&phi_ops, "{" BASE ", \"partial_rotary_factor\": 1.5}", "partial_rotary_factor", e)) < 0)
        return rc;
    return 0;
}
