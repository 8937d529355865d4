/*
 * qwen2 self-test: q/k/v biases are on whatever attention_bias says, o has none.
 */
#include "selftest.h"

extern const struct model_ops qwen2_ops;
int qwen2_ops_self_test(struct err *e);

int qwen2_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    const char *cfg = "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, "
                      "\"max_position_embeddings\": 128, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true}";
    if ((rc = stest_parse(&qwen2_ops, cfg, &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && !hp.out_bias && hp.tie_embd && hp.n_kv_head == 2 &&
                              hp.layer[1].rope_theta == 1e6f && hp.layer[1].kv == KV_FULL, "qwen2 fields", e)) < 0)
        return rc;
    /* use_sliding_window: the window applies from max_window_layers on (transformers'
     * Qwen2 rule), so one model mixes full and sliding layers */
    const char *swa = "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"max_position_embeddings\": 128, "
                      "\"use_sliding_window\": true, \"sliding_window\": 16, \"max_window_layers\": 3}";
    /* Qwen2Config: use_sliding_window defaults to false, so sliding_window alone changes nothing */
    const char *off = "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"max_position_embeddings\": 128, "
                      "\"sliding_window\": 16, \"max_window_layers\": 0}";
    if ((rc = stest_parse(&qwen2_ops, off, &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_FULL,
                          "use_sliding_window absent is false", e)) < 0)
        return rc;
    if ((rc = stest_parse(&qwen2_ops, swa, &hp, e)) < 0)
        return rc;
    return stest_check(hp.layer[0].kv == KV_FULL && hp.layer[2].kv == KV_FULL && hp.layer[3].kv == KV_SLIDING &&
                           hp.layer[3].window == 16, "sliding layers from max_window_layers", e);
}
