/*
 * qwen2_vl_text self-test: mrope_section from rope_scaling (a published config's "mrope"
 * type) and from rope_parameters; sections that do not fill half the rotary dims, or a
 * config without them, are refused.
 */
#include "selftest.h"

extern const struct model_ops qwen2_vl_text_ops;
int qwen2_vl_text_ops_self_test(struct err *e);

#define QVL_BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                 "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                 "\"max_position_embeddings\": 128, "

int qwen2_vl_text_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    const char *t4 = "{" QVL_BASE "\"rope_theta\": 1000000.0, \"rope_scaling\": {\"type\": \"mrope\", "
                     "\"mrope_section\": [2, 3, 3]}}";
    const char *t5 = "{" QVL_BASE "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, "
                     "\"mrope_section\": [4, 2, 2]}}";
    const char *bad = "{" QVL_BASE "\"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 4]}}";
    const char *none = "{" QVL_BASE "\"rope_theta\": 10000.0}";
    if ((rc = stest_parse(&qwen2_vl_text_ops, t4, &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && !hp.out_bias && hp.mrope_section[0] == 2 && hp.mrope_section[2] == 3 &&
                              hp.layer[1].rope_theta == 1e6f && hparams_has_mrope(&hp), "mrope from rope_scaling",
                          e)) < 0)
        return rc;
    if ((rc = stest_parse(&qwen2_vl_text_ops, t5, &hp, e)) < 0 ||
        (rc = stest_check(hp.mrope_section[0] == 4 && hp.layer[0].rope_theta == 1e4f, "mrope from rope_parameters",
                          e)) < 0)
        return rc;
    if ((rc = stest_check(stest_parse(&qwen2_vl_text_ops, bad, &hp, e) == -ERR_CONFIG,
                          "sections summing past half the rotary dims refused", e)) < 0)
        return rc;
    err_clear(e);
    rc = stest_check(stest_parse(&qwen2_vl_text_ops, none, &hp, e) == -ERR_CONFIG, "no mrope_section refused", e);
    err_clear(e);
    return rc;
}
