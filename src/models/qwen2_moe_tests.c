/*
 * qwen2_moe self-test: what the Qwen2-MoE family makes of its config and
 * checkpoint.
 *  - Config: q/k/v biases (qkv_bias, default true) and none on o; MoE layers carry a
 *    shared expert of shared_expert_intermediate_size, dense layers (decoder_sparse_step,
 *    mlp_only_layers) none and the width intermediate_size; norm_topk_prob absent means
 *    no renormalization; rejections name the field.
 *  - Weights: the golden checkpoint (layer 0 dense, layer 1 MoE) is consumed entirely;
 *    a missing shared expert, shared-expert gate, router or dense tensor is named.
 *  - Forward: dropping the layers' shared expert, and norm_topk_prob true, change the
 *    golden checkpoint's logits.
 */
#include "selftest.h"

extern const struct model_ops qwen2_moe_ops;
int qwen2_moe_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 160, \"max_position_embeddings\": 256, " \
             "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&qwen2_moe_ops, "{" BASE ", \"shared_expert_intermediate_size\": 200, "
                          "\"decoder_sparse_step\": 2}", &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && !hp.out_bias && !hp.layer[0].moe && hp.layer[0].n_ff == 160 &&
                              hp.layer[0].n_ff_shexp == 0 && hp.layer[1].moe && hp.layer[1].n_ff == 32 &&
                              hp.layer[1].n_ff_shexp == 200 && hp.layer[1].router == ROUTER_SOFTMAX_TOPK_RAW &&
                              !hp.layer[2].moe && hp.n_ff == 200,
                          "q/k/v biases; shared expert on the MoE layer only; n_ff the widest", e)) < 0 ||
        (rc = stest_parse(&qwen2_moe_ops, "{" BASE ", \"shared_expert_intermediate_size\": 96, "
                          "\"qkv_bias\": false, \"norm_topk_prob\": true, \"mlp_only_layers\": [0, 2]}", &hp, e)) < 0 ||
        (rc = stest_check(!hp.qkv_bias && !hp.layer[0].moe && hp.layer[1].moe && !hp.layer[2].moe &&
                              hp.layer[1].router == ROUTER_SOFTMAX_TOPK && hp.n_ff == 160,
                          "qkv_bias false, norm_topk_prob true, mlp_only_layers", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE "}", "shared_expert_intermediate_size"},
        {"{" BASE ", \"shared_expert_intermediate_size\": 0}", "shared_expert_intermediate_size"},
        {"{" BASE ", \"shared_expert_intermediate_size\": 96, \"mlp_only_layers\": [-1]}", "mlp_only_layers"},
        {"{" BASE ", \"shared_expert_intermediate_size\": 96, \"qkv_bias\": \"yes\"}", "qkv_bias"},
        /* found by fuzz_config: every layer dense (step 4 > 3 layers) used to let top-k 0 through */
        {"{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 160, \"max_position_embeddings\": 256, \"num_experts\": 8, "
         "\"num_experts_per_tok\": 0, \"moe_intermediate_size\": 32, \"decoder_sparse_step\": 4, "
         "\"shared_expert_intermediate_size\": 96}", "num_experts_per_tok"},
    };
    return stest_parse_fails_all(&qwen2_moe_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.shared_expert_gate.weight",
                                           "model.layers.1.mlp.shared_expert.down_proj.weight",
                                           "model.layers.1.mlp.experts.7.up_proj.weight",
                                           "model.layers.1.mlp.gate.weight",
                                           "model.layers.0.mlp.gate_proj.weight",
                                           "model.layers.0.self_attn.v_proj.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "qwen2_moe", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[1].shexp_inp_gate.shape[0] == 1 &&
                         m->layers[1].shexp_up.shape[0] == 96, "every tensor bound; shared expert shapes", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("qwen2_moe", required, e);
}

static void no_shared_expert(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].n_ff_shexp = 0;
}

static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "qwen2_moe", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, no_shared_expert, "dropping the shared expert", e);
    model_free(m);
    return rc < 0 ? rc : stest_patch_changes_logits("qwen2_moe", "{\"norm_topk_prob\": true}", e);
}

int qwen2_moe_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
