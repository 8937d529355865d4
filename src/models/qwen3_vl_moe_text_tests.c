/*
 * qwen3_vl_moe_text self-test: the sparse layers of num_experts / num_experts_per_tok /
 * moe_intermediate_size (mlp_only_layers dense), the top k always renormalized (transformers'
 * Qwen3VLMoeTextTopKRouter, even with norm_topk_prob false), interleaved M-RoPE, q/k norms; a
 * config without num_experts refused.
 */
#include "selftest.h"

extern const struct model_ops qwen3_vl_moe_text_ops;
int qwen3_vl_moe_text_ops_self_test(struct err *e);

#define Q3VLM_BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                   "\"head_dim\": 16, \"max_position_embeddings\": 128, " \
                   "\"rope_scaling\": {\"rope_type\": \"default\", \"mrope_interleaved\": true, " \
                   "\"mrope_section\": [4, 2, 2]}, "

int qwen3_vl_moe_text_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    const char *ok = "{" Q3VLM_BASE "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
                     "\"norm_topk_prob\": false, \"mlp_only_layers\": [1]}";
    const char *none = "{" Q3VLM_BASE "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32}";
    if ((rc = stest_parse(&qwen3_vl_moe_text_ops, ok, &hp, e)) < 0 ||
        (rc = stest_check(hp.qk_norm && hp.mrope_interleaved && hp.n_expert == 8 && hp.layer[0].moe &&
                              hp.layer[0].n_ff == 32 && hp.layer[0].router == ROUTER_SOFTMAX_TOPK &&
                              !hp.layer[1].moe && hp.layer[1].n_ff == 96,
                          "experts on layer 0, dense layer 1, renormalized top k, interleaved mrope", e)) < 0)
        return rc;
    rc = stest_check(stest_parse(&qwen3_vl_moe_text_ops, none, &hp, e) < 0, "no num_experts refused", e);
    err_clear(e);
    return rc;
}
