/*
 * minimax_m2 self-test: what the MiniMax-M2 family makes of its config and checkpoint.
 *  - Config: MiniMaxM2Config's defaults (256 experts top-8, head_dim 128, 8 kv heads,
 *    rope_theta 5e6, full rotary, rms_norm_eps 1e-6); q/k norm over the full projections on
 *    every layer; the sigmoid router with a correction bias, one group, renormalized, scale
 *    1; no sliding window even when the config states one; partial_rotary_factor from
 *    rope_parameters; rotary_dim must agree; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely (full-width q/k norms, F32 correction
 *    bias); a missing correction bias or norm is named; mlx-lm's stacked layout binds
 *    byte-identical expert views.
 *  - Forward: the correction bias (zeroed) and the partial rotary factor reach the logits.
 */
#include "selftest.h"

extern const struct model_ops minimax_m2_ops;
int minimax_m2_ops_self_test(struct err *e);

#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 64, \"max_position_embeddings\": 256"
#define BASE HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_local_experts\": 4, " \
             "\"num_experts_per_tok\": 2"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&minimax_m2_ops, "{\"vocab_size\": 384, \"hidden_size\": 64, "
                          "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"intermediate_size\": 64, "
                          "\"max_position_embeddings\": 256, \"sliding_window\": 4, "
                          "\"use_sliding_window\": true}", &hp, e)) < 0)
        return rc;
    const struct layer_spec *ls = &hp.layer[1];
    bool ok = hp.n_expert == 256 && hp.n_expert_used == 8 && hp.head_dim == 128 && hp.n_kv_head == 8 &&
              hp.rope_theta == 5e6f && hp.norm_eps == 1e-6f && hp.router_bias && hp.moe_norm &&
              hp.moe_scale == 1.0f && hp.moe_n_group == 1 && ls->moe && ls->qk_norm && ls->qk_norm_full &&
              ls->router == ROUTER_GROUP_SIGMOID && ls->n_rot == 128 && ls->kv == KV_FULL &&
              ls->n_ff_shexp == 0 && !hp.qkv_bias;
    if ((rc = stest_check(ok, "MiniMaxM2Config defaults, full-width q/k norm, no window", e)) < 0)
        return rc;
    if ((rc = stest_parse(&minimax_m2_ops, "{" BASE ", \"rotary_dim\": 8, "
                          "\"rope_parameters\": {\"rope_theta\": 5e6, \"rope_type\": \"default\", "
                          "\"partial_rotary_factor\": 0.5}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].n_rot == 8 && hp.n_expert == 4 && hp.layer[0].n_expert_used == 2,
                          "partial_rotary_factor 0.5 of 16 in rope_parameters, rotary_dim agreeing", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"rotary_dim\": 4}", "rotary_dim"},
        {"{" HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_local_experts\": 4, "
         "\"num_experts_per_tok\": 5}", "num_experts_per_tok"},
        {"{" HEAD ", \"head_dim\": 16, \"num_local_experts\": 0}", "num_local_experts"},
        {"{" BASE ", \"partial_rotary_factor\": 0}", "partial_rotary_factor"},
        {"{" BASE ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 2}}",
         "partial_rotary_factor"},
        {"{" HEAD ", \"num_key_value_heads\": 3, \"head_dim\": 16, \"num_local_experts\": 4, "
         "\"num_experts_per_tok\": 2}", "num_key_value_heads"},
    };
    return stest_parse_fails_all(&minimax_m2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.block_sparse_moe.e_score_correction_bias",
                                           "model.layers.0.self_attn.q_norm.weight",
                                           "model.layers.1.block_sparse_moe.experts.2.w3.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "minimax_m2", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[0];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->router_b.dtype == DTYPE_F32 &&
                         L->q_norm.shape[0] == 64 && L->k_norm.shape[0] == 32,
                     "every tensor bound; full-width q/k norms; correction bias F32", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("minimax_m2", required, e)) < 0)
        return rc;
    return stest_stacked_agrees("minimax_m2", "model.layers.1.block_sparse_moe.switch_mlp.up_proj.weight", e);
}

static void no_bias(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].router = ROUTER_SOFTMAX_TOPK;
}

static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_patch_changes_logits("minimax_m2", "{\"rope_parameters\": {\"rope_theta\": 5e6, "
                                         "\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}}", e)) < 0 ||
        (rc = stest_load_variant(&m, "minimax_m2", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, no_bias, "softmax routing instead of the sigmoid one", e);
    model_free(m);
    return rc;
}

int minimax_m2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
