/*
 * mixtral self-test: what the Mixtral family makes of its config and
 * checkpoint, and its routing.
 *  - Config: MixtralConfig's rope_theta default 1e6 (not Llama's 1e4) and a
 *    stated one, in every layer; every layer a MoE layer of
 *    intermediate_size experts taking num_experts_per_tok; sliding_window
 *    (null: none) on every layer; rejections naming the field.
 *  - Routing: softmax over all experts, kept for the top-k and renormalized
 *    (computed here independently in double).
 *  - Weights: the published per-expert layout is consumed entirely, a
 *    missing expert or router tensor is named, and mlx-lm's stacked layout
 *    (`mlxcel convert`) binds byte-identical expert views.
 *  - Forward: num_experts_per_tok changes the golden checkpoint's logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops mixtral_ops;
int mixtral_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 128, \"max_position_embeddings\": 256, " \
             "\"num_local_experts\": 8"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&mixtral_ops, "{" BASE ", \"num_experts_per_tok\": 2, \"sliding_window\": null}", &hp, e)) < 0)
        return rc;
    for (int il = 0; il < 2 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        rc = stest_check(ls->rope_theta == 1e6f && ls->moe && ls->n_ff == 128 && ls->n_expert_used == 2 &&
                             ls->kv == KV_FULL, "theta 1e6 by default; MoE layers of intermediate_size, top-2", e);
    }
    if (rc < 0 ||
        (rc = stest_parse(&mixtral_ops, "{" BASE ", \"num_experts_per_tok\": 3, \"rope_theta\": 1e4, "
                          "\"sliding_window\": 4096}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].rope_theta == 1e4f && hp.layer[1].n_expert_used == 3 && hp.layer[0].kv == KV_SLIDING &&
                              hp.layer[1].kv == KV_SLIDING && hp.layer[1].window == 4096,
                          "rope_theta, num_experts_per_tok, sliding_window on every layer", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"num_experts_per_tok\": 9}", "num_experts_per_tok"},
        {"{" BASE ", \"num_experts_per_tok\": 0}", "num_experts_per_tok"},
        {"{" BASE "}", "num_experts_per_tok"},
        {"{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"num_local_experts\": 0, "
         "\"num_experts_per_tok\": 1}", "num_local_experts"},
    };
    return stest_parse_fails_all(&mixtral_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int routing(const struct hparams *hp, struct err *e)
{
    return stest_route_softmax_top2(hp, true, e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.block_sparse_moe.experts.3.w2.weight",
                                           "model.layers.0.block_sparse_moe.gate.weight", NULL};
    int rc;
    if ((rc = stest_stacked_agrees("mixtral", "model.layers.1.block_sparse_moe.switch_mlp.gate_proj.weight", e)) < 0)
        return rc;
    return stest_missing_named("mixtral", required, e);
}

int mixtral_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = config_rules(e)) < 0 ||
        (rc = stest_parse(&mixtral_ops, "{" BASE ", \"num_experts_per_tok\": 2}", &hp, e)) < 0 ||
        (rc = routing(&hp, e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("mixtral", "{\"num_experts_per_tok\": 1}", e);
}
