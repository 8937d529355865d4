/*
 * qwen3 self-test: qk-norm on, explicit head_dim honoured even when it differs
 * from hidden_size / num_attention_heads.
 */
#include "selftest.h"

extern const struct model_ops qwen3_ops;
int qwen3_ops_self_test(struct err *e);

int qwen3_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    const char *cfg = "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
                      "\"intermediate_size\": 96, \"max_position_embeddings\": 128}";
    if ((rc = stest_parse(&qwen3_ops, cfg, &hp, e)) < 0)
        return rc;
    return stest_check(hp.qk_norm && hp.head_dim == 32 && hp.n_rot == 32 && !hp.qkv_bias,
                       "qwen3 flags", e);
}
