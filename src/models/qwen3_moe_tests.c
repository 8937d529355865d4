/*
 * qwen3_moe self-test: what the Qwen3-MoE family makes of its config and
 * checkpoint, and its routing.
 *  - Config: norm_topk_prob absent means no renormalization (Qwen3MoeConfig's false),
 *    true renormalizes; decoder_sparse_step and mlp_only_layers decide per layer
 *    between experts of moe_intermediate_size and the dense GLU of intermediate_size,
 *    and the model-wide width is the widest; q/k norm on every layer; rejections
 *    name the field.
 *  - Routing: without norm_topk_prob each chosen weight is its softmax over all
 *    experts (computed here in double).
 *  - Weights: the per-expert layout is consumed entirely, a missing expert or
 *    router tensor is named, and mlx-lm's stacked layout (`mlxcel convert`) binds
 *    byte-identical expert views.
 *  - Forward: norm_topk_prob false changes the golden checkpoint's logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops qwen3_moe_ops;
int qwen3_moe_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"head_dim\": 32, \"intermediate_size\": 160, " \
             "\"max_position_embeddings\": 256"
/* the experts' fields, each overridable (cJSON reads the first of duplicate keys) */
#define MOE(n, k, ff) ", \"num_experts\": " #n ", \"num_experts_per_tok\": " #k ", \"moe_intermediate_size\": " #ff
#define STD MOE(8, 2, 32)

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&qwen3_moe_ops, "{" BASE STD "}", &hp, e)) < 0)
        return rc;
    for (int il = 0; il < 4 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        rc = stest_check(ls->moe && ls->n_ff == 32 && ls->router == ROUTER_SOFTMAX_TOPK_RAW &&
                             ls->n_expert_used == 2 && ls->qk_norm && ls->n_ff_shexp == 0 && ls->n_rot == 32,
                         "every layer MoE of moe_intermediate_size, not renormalized by default, q/k norm", e);
    }
    if (rc < 0 ||
        (rc = stest_parse(&qwen3_moe_ops, "{" BASE STD ", \"norm_topk_prob\": true, \"decoder_sparse_step\": 2, "
                          "\"mlp_only_layers\": [3]}", &hp, e)) < 0 ||
        (rc = stest_check(!hp.layer[0].moe && hp.layer[0].n_ff == 160 && hp.layer[1].moe &&
                              hp.layer[1].n_ff == 32 && hp.layer[1].router == ROUTER_SOFTMAX_TOPK &&
                              !hp.layer[2].moe && !hp.layer[3].moe && hp.n_ff == 160,
                          "decoder_sparse_step 2 and mlp_only_layers [3]: only layer 1 MoE, renormalized", e)) < 0 ||
        (rc = stest_parse(&qwen3_moe_ops, "{" BASE MOE(8, 2, 200) "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_ff == 200 && hp.layer[2].n_ff == 200, "n_ff is the widest layer FFN", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE MOE(8, 9, 32) "}", "num_experts_per_tok"},
        {"{" BASE STD ", \"decoder_sparse_step\": 0}", "decoder_sparse_step"},
        {"{" BASE STD ", \"mlp_only_layers\": [4]}", "mlp_only_layers"},
        {"{" BASE MOE(8, 2, 0) "}", "moe_intermediate_size"},
        {"{" BASE MOE(257, 2, 32) "}", "num_experts"},
        {"{" BASE STD ", \"norm_topk_prob\": 1}", "norm_topk_prob"},
    };
    return stest_parse_fails_all(&qwen3_moe_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int routing(const struct hparams *hp, struct err *e)
{
    return stest_route_softmax_top2(hp, false, e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.experts.3.down_proj.weight",
                                           "model.layers.0.mlp.gate.weight",
                                           "model.layers.0.self_attn.q_norm.weight", NULL};
    int rc;
    if ((rc = stest_stacked_agrees("qwen3_moe", "model.layers.1.mlp.switch_mlp.gate_proj.weight", e)) < 0)
        return rc;
    return stest_missing_named("qwen3_moe", required, e);
}

int qwen3_moe_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = stest_parse(&qwen3_moe_ops, "{" BASE STD "}", &hp, e)) < 0 ||
        (rc = routing(&hp, e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("qwen3_moe", "{\"norm_topk_prob\": false}", e);
}
