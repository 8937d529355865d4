/*
 * granitemoehybrid self-test: GraniteMoeHybridConfig's layer types, experts and multipliers.
 *  - Config: layer_types picks Mamba-2 / attention per layer (its length must be
 *    num_hidden_layers, unknown kinds named); experts top-k softmax with a plain shared
 *    expert of shared_intermediate_size, or the shared MLP alone without experts;
 *    position_embedding_type rope rotates, nope / null / absent do not, the head is untied
 *    unless tie_word_embeddings (transformers' defaults); the multipliers become the scales.
 *  - Weights: the golden checkpoint is consumed entirely (input_linear split into gate / up
 *    views); missing A_log / conv1d / router named.
 *  - Forward: the multipliers and the shared expert reach the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops granitemoehybrid_ops;
int granitemoehybrid_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128, \"mamba_n_heads\": 8, " \
                   "\"mamba_d_state\": 16, \"shared_intermediate_size\": 32" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&granitemoehybrid_ops,
                          CFG(", \"layer_types\": [\"mamba\", \"attention\", \"mamba\"], "
                              "\"num_local_experts\": 4, \"attention_multiplier\": 0.5, "
                              "\"position_embedding_type\": \"rope\", \"tie_word_embeddings\": true"),
                          &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.layer[0].mixer == MIXER_MAMBA2 && hp.layer[1].mixer == MIXER_ATTENTION &&
                          hp.layer[1].n_rot == 16 && hp.layer[1].attn_scale == 0.5f &&
                          hp.layer[2].moe && hp.layer[2].router == ROUTER_TOPK_SOFTMAX &&
                          hp.layer[2].n_ff == 96 && hp.layer[2].n_ff_shexp == 32 &&
                          hp.layer[2].shexp_plain && hp.tie_embd, "layer types and experts", e)) < 0)
        return rc;
    if ((rc = stest_parse(&granitemoehybrid_ops,
                          CFG(", \"num_local_experts\": 0, \"position_embedding_type\": \"nope\", "
                              "\"layer_types\": [\"attention\", \"mamba\", \"mamba\"]"), &hp, e)) < 0 ||
        (rc = stest_check(!hp.layer[0].moe && hp.layer[0].n_ff == 32 && hp.layer[0].n_rot == 0 &&
                          hp.layer[1].kv == KV_RECURRENT, "dense, nope", e)) < 0)
        return rc;
    /* transformers' defaults: no position_embedding_type (or null) is no rope, and the head is
     * not tied */
    if ((rc = stest_parse(&granitemoehybrid_ops, CFG(", \"layer_types\": [\"attention\", \"mamba\", \"mamba\"]"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].n_rot == 0 && !hp.tie_embd, "defaults: no rope, untied", e)) < 0 ||
        (rc = stest_parse(&granitemoehybrid_ops,
                          CFG(", \"layer_types\": [\"attention\", \"mamba\", \"mamba\"], "
                              "\"position_embedding_type\": null"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].n_rot == 0, "null position_embedding_type: no rope", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"layer_types\": [\"mamba\", \"attention\"]"), "layer_types"},
        {CFG(", \"layer_types\": [\"mamba\", \"conv\", \"mamba\"]"), "layer_types"},
        {CFG(", \"position_embedding_type\": \"alibi\""), "position_embedding_type"},
        {CFG(", \"mamba_d_head\": 4"), "mamba_n_heads"},
        {CFG(", \"logits_scaling\": 0"), "logits_scaling"},
        {CFG(", \"num_local_experts\": 4, \"num_experts_per_tok\": 5"), "num_experts_per_tok"},
    };
    return stest_parse_fails_all(&granitemoehybrid_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, "granitemoehybrid", NULL, NULL, e);
    if (rc < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[1].ex.up.w[2].shape[0] == 128 &&
                     (char *)m->layers[1].ex.up.w[2].data - (char *)m->layers[1].ex.gate.w[2].data ==
                         128 * 64 * 2, "every tensor consumed, input_linear split", e);
    model_free(m);
    if (rc < 0)
        return rc;
    static const char *const names[] = {"model.layers.0.mamba.A_log",
                                        "model.layers.2.mamba.conv1d.weight",
                                        "model.layers.1.block_sparse_moe.router.layer.weight",
                                        "model.layers.3.shared_mlp.input_linear.weight", NULL};
    return stest_missing_named("granitemoehybrid", names, e);
}

int granitemoehybrid_ops_self_test(struct err *e)
{
    static const char *const patches[] = {"{\"embedding_multiplier\": 1}", "{\"residual_multiplier\": 1}",
                                          "{\"attention_multiplier\": 1}", "{\"logits_scaling\": 1}",
                                          "{\"position_embedding_type\": \"nope\"}", NULL};
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    for (int i = 0; patches[i] && rc == 0; i++)
        rc = stest_patch_changes_logits("granitemoehybrid", patches[i], e);
    return rc;
}
