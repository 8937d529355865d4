/*
 * qwen3_vl_text self-test: Qwen3's q/k norms, interleaved M-RoPE from rope_scaling (a published
 * config) and rope_parameters (transformers 5), the stream each frequency takes, and a config
 * without mrope_section refused.
 */
#include "selftest.h"

extern const struct model_ops qwen3_vl_text_ops;
int qwen3_vl_text_ops_self_test(struct err *e);

#define Q3VL_BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                  "\"head_dim\": 16, \"max_position_embeddings\": 128, "

int qwen3_vl_text_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    const char *pub = "{" Q3VL_BASE "\"rope_theta\": 5000000.0, \"rope_scaling\": {\"rope_type\": \"default\", "
                      "\"mrope_interleaved\": true, \"mrope_section\": [4, 2, 2]}}";
    const char *t5 = "{" Q3VL_BASE "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
                     "\"mrope_section\": [4, 2, 2]}}";
    const char *none = "{" Q3VL_BASE "\"rope_theta\": 10000.0}";
    /* frequencies 0..7 of [4, 2, 2] interleaved: t h w t h w t t */
    static const int want[8] = {0, 1, 2, 0, 1, 2, 0, 0};
    if ((rc = stest_parse(&qwen3_vl_text_ops, pub, &hp, e)) < 0 ||
        (rc = stest_check(hp.qk_norm && !hp.qkv_bias && hp.mrope_interleaved && hp.mrope_section[0] == 4 &&
                              hp.layer[1].rope_theta == 5e6f && hparams_has_mrope(&hp),
                          "interleaved mrope from rope_scaling, q/k norms", e)) < 0)
        return rc;
    for (int j = 0; j < 8; j++)
        if ((rc = stest_check(hparams_mrope_stream(&hp, j) == want[j], "interleaved stream of each frequency",
                              e)) < 0)
            return rc;
    if ((rc = stest_parse(&qwen3_vl_text_ops, t5, &hp, e)) < 0 ||
        (rc = stest_check(hp.mrope_interleaved && hp.layer[0].rope_theta == 1e4f, "mrope from rope_parameters",
                          e)) < 0)
        return rc;
    rc = stest_check(stest_parse(&qwen3_vl_text_ops, none, &hp, e) == -ERR_CONFIG, "no mrope_section refused", e);
    err_clear(e);
    return rc;
}
