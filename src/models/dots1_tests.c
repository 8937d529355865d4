/*
 * dots1 self-test: what the dots1 family makes of its config and checkpoint.
 *  - Config: Dots1Config's defaults (first_k_dense_replace 0, n_group / topk_group 1,
 *    norm_topk_prob false, routed_scaling_factor 1, moe_intermediate_size 1408, q/k norm on
 *    every layer); without layer_types the layers from max_window_layers on slide over
 *    sliding_window (absent: 4096; null: none), whatever use_sliding_window says; the
 *    fields without a default are required and impossible values refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely (correction bias F32 in router_b,
 *    the shared experts without a gate); a missing correction bias, shared expert or q norm
 *    is named; mlx-lm's stacked layout binds byte-identical expert views.
 *  - Forward: the golden case's norm_topk_prob, routed_scaling_factor and
 *    group limit reach the logits.
 */
#include "selftest.h"

extern const struct model_ops dots1_ops;
int dots1_ops_self_test(struct err *e);

#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 128, " \
             "\"max_position_embeddings\": 256"
#define BASE HEAD ", \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&dots1_ops, "{" BASE ", \"max_window_layers\": 2, "
                          "\"use_sliding_window\": false}", &hp, e)) < 0)
        return rc;
    bool ok = hp.n_expert == 8 && hp.router_bias && !hp.moe_norm && hp.moe_scale == 1.0f &&
              hp.moe_n_group == 1 && hp.moe_topk_group == 1 && hp.n_ff == 1408;
    for (int il = 0; il < 4; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        ok = ok && ls->moe && ls->router == ROUTER_GROUP_SIGMOID && ls->n_ff == 1408 &&
             ls->n_ff_shexp == 1408 && ls->shexp_plain && ls->qk_norm && !ls->qk_norm_full &&
             ls->n_rot == 16 && ls->n_expert_used == 2 &&
             (il < 2 ? ls->kv == KV_FULL : ls->kv == KV_SLIDING && ls->window == 4096);
    }
    if ((rc = stest_check(ok, "Dots1Config defaults; layers from max_window_layers slide over 4096", e)) < 0)
        return rc;
    if ((rc = stest_parse(&dots1_ops, "{" BASE ", \"max_window_layers\": 1, \"sliding_window\": null, "
                          "\"first_k_dense_replace\": 1, \"moe_intermediate_size\": 32, "
                          "\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"n_group\": 2}",
                          &hp, e)) < 0 ||
        (rc = stest_check(!hp.layer[0].moe && hp.layer[0].n_ff == 128 && hp.layer[0].n_ff_shexp == 0 &&
                              hp.layer[1].moe && hp.layer[1].n_ff == 32 && hp.layer[3].kv == KV_FULL &&
                              hp.moe_norm && hp.moe_scale == 2.5f && hp.moe_n_group == 2 && hp.n_ff == 128,
                          "sliding_window null: no window; first_k_dense_replace 1 dense", e)) < 0 ||
        (rc = stest_parse(&dots1_ops, "{" BASE ", \"sliding_window\": 8, \"layer_types\": [\"full_attention\", "
                          "\"sliding_attention\", \"full_attention\", \"full_attention\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].kv == KV_SLIDING && hp.layer[1].window == 8 &&
                              hp.layer[0].kv == KV_FULL && hp.layer[3].kv == KV_FULL,
                          "layer_types decide the sliding layers", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" HEAD ", \"num_experts_per_tok\": 2, \"n_shared_experts\": 1}", "n_routed_experts"},
        {"{" HEAD ", \"n_routed_experts\": 8, \"n_shared_experts\": 1}", "num_experts_per_tok"},
        {"{" HEAD ", \"n_routed_experts\": 8, \"num_experts_per_tok\": 2}", "n_shared_experts"},
        {"{" HEAD ", \"n_routed_experts\": 8, \"num_experts_per_tok\": 9, \"n_shared_experts\": 1}",
         "num_experts_per_tok"},
        {"{" BASE ", \"n_group\": 3}", "n_group"},
        {"{" BASE ", \"n_group\": 2, \"topk_group\": 3}", "topk_group"},
        {"{" BASE ", \"first_k_dense_replace\": -1}", "first_k_dense_replace"},
        {"{" BASE ", \"sliding_window\": -4}", "sliding_window"},
        {"{" BASE ", \"norm_topk_prob\": 1}", "norm_topk_prob"},
    };
    return stest_parse_fails_all(&dots1_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.gate.e_score_correction_bias",
                                           "model.layers.2.mlp.shared_experts.up_proj.weight",
                                           "model.layers.0.self_attn.q_norm.weight",
                                           "model.layers.0.mlp.gate_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "dots1", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->router_b.dtype == DTYPE_F32 &&
                         L->router_b.shape[0] == 8 && tensor_is_present(&L->shexp_up) &&
                         !tensor_is_present(&L->shexp_inp_gate) &&
                         !tensor_is_present(&m->layers[0].router_b),
                     "every tensor bound; correction bias F32; plain shared expert", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("dots1", required, e)) < 0)
        return rc;
    return stest_stacked_agrees("dots1", "model.layers.1.mlp.switch_mlp.gate_proj.weight", e);
}

static int forward_reads(struct err *e)
{
    static const char *const patches[] = {
        "{\"norm_topk_prob\": false}",
        "{\"routed_scaling_factor\": 1.0}",
        "{\"n_group\": 4, \"topk_group\": 1}",
    };
    int rc;
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++)
        if ((rc = stest_patch_changes_logits("dots1", patches[i], e)) < 0)
            return rc;
    return 0;
}

int dots1_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
