/*
 * glm4_moe self-test: what the GLM-4.5 family makes of its config and checkpoint.
 *  - Config: Glm4MoeConfig's defaults (128 experts top-8 renormalized, 1 shared expert,
 *    first_k_dense_replace 1, routed_scaling_factor 1, partial_rotary_factor 0.5, head_dim 128,
 *    8 kv heads, no q/k norm, no biases); attention_bias gives q/k/v biases and never an
 *    o_proj one; rope_parameters.partial_rotary_factor wins over the top-level field;
 *    impossible values and sliding windows are refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely (q/k/v biases, q/k norms, F32
 *    correction bias, plain shared experts); a missing bias, norm or correction bias is named;
 *    mlx-lm's stacked layout binds byte-identical expert views.
 *  - Forward: use_qk_norm, the partial rotary factor and the group limit reach the logits.
 */
#include "selftest.h"

extern const struct model_ops glm4_moe_ops;
int glm4_moe_ops_self_test(struct err *e);

#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
#define BASE HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"n_routed_experts\": 8, " \
             "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&glm4_moe_ops, "{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, "
                          "\"num_attention_heads\": 16, \"intermediate_size\": 128, "
                          "\"max_position_embeddings\": 256}", &hp, e)) < 0)
        return rc;
    bool ok = hp.n_expert == 128 && hp.n_expert_used == 8 && hp.moe_norm && hp.moe_scale == 1.0f &&
              hp.moe_n_group == 1 && hp.head_dim == 128 && hp.n_kv_head == 8 && hp.n_rot == 64 &&
              !hp.qkv_bias && !hp.out_bias && hp.router_bias && !hp.layer[0].moe &&
              hp.layer[0].n_ff == 128 && hp.layer[1].moe && hp.layer[1].n_ff == 1408 &&
              hp.layer[1].n_ff_shexp == 1408 && hp.layer[1].shexp_plain && !hp.layer[1].qk_norm &&
              hp.layer[1].router == ROUTER_GROUP_SIGMOID && hp.norm_eps == 1e-5f;
    if ((rc = stest_check(ok, "Glm4MoeConfig defaults", e)) < 0)
        return rc;
    if ((rc = stest_parse(&glm4_moe_ops, "{" BASE ", \"attention_bias\": true, \"use_qk_norm\": true, "
                          "\"partial_rotary_factor\": 0.5, \"rope_parameters\": {\"rope_theta\": 1e6, "
                          "\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}, "
                          "\"first_k_dense_replace\": 0, \"n_shared_experts\": 2}", &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && !hp.out_bias && hp.layer[0].qk_norm && hp.layer[0].n_rot == 4 &&
                              hp.layer[0].rope_theta == 1e6f && hp.layer[0].moe &&
                              hp.layer[0].n_ff_shexp == 64,
                          "q/k/v biases only; rope_parameters' partial factor; 2 shared experts", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"n_group\": 3}", "n_group"},
        {"{" HEAD ", \"num_key_value_heads\": 2, \"n_routed_experts\": 8, \"num_experts_per_tok\": 9}",
         "num_experts_per_tok"},
        {"{" BASE ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0}}",
         "partial_rotary_factor"},
        {"{" BASE ", \"partial_rotary_factor\": 1.5}", "partial_rotary_factor"},
        {"{" BASE ", \"sliding_window\": 8, \"use_sliding_window\": true}", "sliding_window"},
        {"{" BASE ", \"use_qk_norm\": 1}", "use_qk_norm"},
        {"{" BASE ", \"n_shared_experts\": -1}", "n_shared_experts"},
    };
    return stest_parse_fails_all(&glm4_moe_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.gate.e_score_correction_bias",
                                           "model.layers.0.self_attn.k_proj.bias",
                                           "model.layers.2.self_attn.q_norm.weight",
                                           "model.layers.1.mlp.shared_experts.down_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "glm4_moe", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->router_b.dtype == DTYPE_F32 &&
                         tensor_is_present(&L->bq) && !tensor_is_present(&L->bo) &&
                         m->hp.layer[1].n_rot == 8,
                     "every tensor bound; q/k/v biases, no o bias; 8 of 16 dims rotated", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("glm4_moe", required, e)) < 0)
        return rc;
    return stest_stacked_agrees("glm4_moe", "model.layers.2.mlp.switch_mlp.down_proj.weight", e);
}

static int forward_reads(struct err *e)
{
    static const char *const patches[] = {
        "{\"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\", "
        "\"partial_rotary_factor\": 1.0}}",
        "{\"topk_group\": 2}",
        "{\"routed_scaling_factor\": 1.0}",
    };
    int rc;
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++)
        if ((rc = stest_patch_changes_logits("glm4_moe", patches[i], e)) < 0)
            return rc;
    /* attention_bias false: the fixture's q/k/v biases stay unbound, and use_qk_norm false its
     * norms: both change the logits (the biases and norms reach the forward) */
    if ((rc = stest_patch_changes_logits("glm4_moe", "{\"use_qk_norm\": false}", e)) < 0 ||
        (rc = stest_patch_changes_logits("glm4_moe", "{\"attention_bias\": false}", e)) < 0)
        return rc;
    return stest_load_fails("glm4_moe", NULL, "model.layers.1.self_attn.v_proj.bias", "v_proj.bias", e);
}

int glm4_moe_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
