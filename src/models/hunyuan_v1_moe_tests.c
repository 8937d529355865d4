/*
 * hunyuan_v1_moe self-test: what the Hunyuan-A13B family makes of its config and checkpoint.
 *  - Config: HunYuanMoEV1Config's defaults (1 expert top-1, rms_norm_eps 1e-5, head_dim
 *    hidden / heads, kv heads = heads, no biases); every layer MoE with a plain shared MLP of
 *    intermediate_size and the q/k norm after RoPE; NTK-alpha rope (dynamic with alpha) as a
 *    fixed base theta * alpha^(hd / (hd - 2)); attention_bias puts biases on q, k, v and o;
 *    per-layer lists, use_cla and impossible values are refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely; a missing query_layernorm, router
 *    or shared MLP tensor is named; mlx-lm's stacked layout binds byte-identical expert views.
 *  - Forward: the norm placement (before RoPE instead) and the router (not renormalized)
 *    reach the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops hunyuan_v1_moe_ops;
int hunyuan_v1_moe_ops_self_test(struct err *e);

#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
#define BASE HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 4"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&hunyuan_v1_moe_ops, "{" HEAD "}", &hp, e)) < 0)
        return rc;
    const struct layer_spec *ls = &hp.layer[1];
    bool ok = hp.n_expert == 1 && hp.n_expert_used == 1 && hp.head_dim == 16 && hp.n_kv_head == 4 &&
              hp.norm_eps == 1e-5f && !hp.qkv_bias && !hp.out_bias && ls->moe && ls->qk_norm &&
              ls->qk_norm_post_rope && !ls->qk_norm_full && ls->n_ff == 128 && ls->n_ff_shexp == 128 &&
              ls->shexp_plain && ls->router == ROUTER_SOFTMAX_TOPK && ls->rope == ROPE_DEFAULT;
    if ((rc = stest_check(ok, "HunYuanMoEV1Config defaults; norm after rope; plain shared MLP", e)) < 0)
        return rc;
    if ((rc = stest_parse(&hunyuan_v1_moe_ops, "{" BASE ", \"moe_topk\": 2, \"attention_bias\": true, "
                          "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 1.0, \"alpha\": 1000.0}}",
                          &hp, e)) < 0)
        return rc;
    double base = 10000.0 * pow(1000.0, 16.0 / 14.0);
    ok = hp.qkv_bias && hp.out_bias && hp.layer[0].n_expert_used == 2 && hp.layer[0].rope == ROPE_DEFAULT &&
         stest_near(hp.layer[0].rope_theta, base, base * 1e-6) && hparams_ctx_limit(&hp) == 256;
    if ((rc = stest_check(ok, "attention_bias on q/k/v/o; NTK-alpha rope base", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"moe_topk\": [2, 2]}", "moe_topk"},
        {"{" HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": [4, 4]}", "num_experts"},
        {"{" BASE ", \"moe_topk\": 5}", "moe_topk"},
        {"{" BASE ", \"use_cla\": true}", "use_cla"},
        {"{" BASE ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 1.0, \"alpha\": -2.0}}", "alpha"},
        {"{" HEAD ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 0}", "num_experts"},
    };
    return stest_parse_fails_all(&hunyuan_v1_moe_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.query_layernorm.weight",
                                           "model.layers.0.mlp.gate.wg.weight",
                                           "model.layers.1.mlp.shared_mlp.down_proj.weight",
                                           "model.layers.0.mlp.experts.3.up_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "hunyuan_v1_moe", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && tensor_is_present(&m->layers[1].shexp_down) &&
                         !tensor_is_present(&m->layers[1].shexp_inp_gate),
                     "every tensor bound; plain shared MLP", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("hunyuan_v1_moe", required, e)) < 0)
        return rc;
    return stest_stacked_agrees("hunyuan_v1_moe", "model.layers.1.mlp.switch_mlp.gate_proj.weight", e);
}

static void norm_before_rope(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm_post_rope = false;
}

static void raw_router(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].router = ROUTER_SOFTMAX_TOPK_RAW;
}

static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "hunyuan_v1_moe", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, norm_before_rope, "q/k norm before RoPE", e)) == 0)
        rc = stest_edit_changes_logits(m, raw_router, "weights not renormalized", e);
    model_free(m);
    return rc;
}

int hunyuan_v1_moe_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
