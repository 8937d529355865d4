/*
 * llama self-test: config normalization (defaults, GQA, rope scaling kinds,
 * errors that name the field). Numerical parity lives in tests/test_golden.c.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops llama_ops;
int llama_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"model_type\": \"llama\""

int llama_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    /* defaults: kv heads = heads, head_dim = hidden / heads, full rotary, theta 1e4, eps 1e-6 */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4}", &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_kv_head == 4 && hp.head_dim == 16 && hp.n_rot == 16, "llama dims", e)) < 0 ||
        (rc = stest_check(hp.rope_theta == 10000.0f && hp.norm_eps == 1e-6f, "llama defaults", e)) < 0 ||
        (rc = stest_check(!hp.tie_embd && !hp.qkv_bias && hp.norm == NORM_RMS && hp.ffn == FFN_GLU, "llama flags", e)) < 0 ||
        (rc = stest_check(stest_near(hp.attn_scale, 0.25, 1e-7), "attention scale 1/sqrt(16)", e)) < 0)
        return rc;
    /* attention_bias covers q, k, v and o */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"attention_bias\": true}", &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && hp.out_bias, "attention_bias", e)) < 0)
        return rc;
    /* llama3 rope scaling */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                          "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                          "\"original_max_position_embeddings\": 64}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope == ROPE_LLAMA3 && hp.rope_factor == 8.0f && hp.rope_orig_ctx == 64, "llama3 rope", e)) < 0)
        return rc;
    /* errors name the field */
    if ((rc = stest_parse_fails(&llama_ops, "{" BASE "}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 0}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 6}", "divisible", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"num_key_value_heads\": 3}", "multiple", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"hidden_act\": \"relu2\"}", "hidden_act", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2}}", "yarn", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4.5}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{\"vocab_size\": -5, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                "\"intermediate_size\": 128, \"max_position_embeddings\": 256}", "vocab_size", e)) < 0)
        return rc;
    return 0;
}
