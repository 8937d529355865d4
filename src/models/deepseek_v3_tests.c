/*
 * deepseek_v3 self-test: what the DeepSeek-V3 family adds to DeepSeek-V2's (deepseek_v2_tests.c).
 *  - Config: the noaux_tc router (sigmoid scores, correction bias, groups, norm_topk_prob
 *    default true, routed_scaling_factor default 2.5, n_group 8 / topk_group 4 by default);
 *    rope_interleave absent means interleaved pairs, false rotate-half; q LoRA; yarn's cos/sin
 *    factor mscale / mscale_all_dim and the softmax scale times mscale(factor,
 *    mscale_all_dim)^2; other topk_methods and impossible groups are refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely (the correction bias F32 into
 *    router_b); a missing correction bias or q_a_layernorm is named.
 *  - Routing with the golden checkpoint's correction bias: equal scores leave the choice to the
 *    bias (group-limited), which changes the chosen experts but not their weights (the scores'
 *    own, renormalized, x 2.5).
 *  - Cache: the latent row (kv_lora_rank + rope = 48 floats) is 4x below full K/V (192).
 *  - Forward: the golden case's ablations (rope_interleave false, no yarn; a stricter group
 *    limit, topk_group 1, and norm_topk_prob false)
 *    change the logits.
 */
#include <math.h>
#include <stdlib.h>

#include "selftest.h"

extern const struct model_ops deepseek_v3_ops;
int deepseek_v3_ops_self_test(struct err *e);

/* HEAD lacks the keys the rejections vary (a repeated JSON key would not override) */
#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 160, \"max_position_embeddings\": 128, \"n_routed_experts\": 8, " \
             "\"moe_intermediate_size\": 32, \"kv_lora_rank\": 32, " \
             "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 16, \"v_head_dim\": 16"
#define BASE HEAD ", \"num_experts_per_tok\": 2, \"q_lora_rank\": 48"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* n_group 8 (default) of 8 experts leaves one expert per group: state 4 */
    if ((rc = stest_parse(&deepseek_v3_ops, "{" BASE ", \"n_group\": 4, \"first_k_dense_replace\": 1, "
                          "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0, "
                          "\"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 32}}", &hp, e)) < 0)
        return rc;
    double m1 = 0.1 * log(4.0) + 1.0, ma = 0.1 * 0.707 * log(4.0) + 1.0;
    bool ok = hp.layer[1].router == ROUTER_GROUP_SIGMOID && hp.router_bias && hp.moe_norm &&
              hp.moe_scale == 2.5f && hp.moe_n_group == 4 && hp.moe_topk_group == 4 &&
              hp.q_lora_rank == 48 && hp.layer[0].kv == KV_LATENT && !hp.layer[0].moe &&
              hp.layer[1].n_ff_shexp == 32 && hp.layer[0].rope_style == ROPE_STYLE_PAIRS &&
              stest_near(hp.rope_attn_factor, m1 / ma, 1e-6) &&
              stest_near(hp.attn_scale, ma * ma / sqrt(32.0), 1e-6);
    if ((rc = stest_check(ok, "noaux_tc defaults, interleaved rope, yarn factors", e)) < 0)
        return rc;
    if ((rc = stest_parse(&deepseek_v3_ops, "{" BASE ", \"n_group\": 1, \"topk_group\": 1, "
                          "\"rope_interleave\": false, \"norm_topk_prob\": false, "
                          "\"first_k_dense_replace\": 0}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].rope_style == ROPE_STYLE_HALF && !hp.moe_norm && hp.layer[0].moe &&
                              stest_near(hp.attn_scale, 1.0 / sqrt(32.0), 1e-7),
                          "rope_interleave false, norm_topk_prob false, no yarn", e)) < 0)
        return rc;
    /* (layer 0 a MoE layer, so that the per-layer routing rules apply) */
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"first_k_dense_replace\": 0, \"n_group\": 4, \"topk_method\": \"greedy\"}", "topk_method"},
        {"{" BASE ", \"first_k_dense_replace\": 0}", "n_group"},  /* default 8 groups of one expert: no top-2 sum */
        {"{" BASE ", \"first_k_dense_replace\": 0, \"n_group\": 3}", "n_group"},
        {"{" BASE ", \"first_k_dense_replace\": 0, \"n_group\": 2, \"topk_group\": 3}", "topk_group"},
        {"{" HEAD ", \"first_k_dense_replace\": 0, \"q_lora_rank\": 48, \"n_group\": 4, \"topk_group\": 1, \"num_experts_per_tok\": 3}",
         "num_experts_per_tok"},
        {"{" BASE ", \"first_k_dense_replace\": 0, \"n_group\": 4, \"rope_interleave\": 1}", "rope_interleave"},
        {"{" HEAD ", \"first_k_dense_replace\": 0, \"num_experts_per_tok\": 2, \"n_group\": 4, \"q_lora_rank\": -1}", "q_lora_rank"},
    };
    return stest_parse_fails_all(&deepseek_v3_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.gate.e_score_correction_bias",
                                           "model.layers.1.self_attn.q_a_layernorm.weight",
                                           "model.layers.0.self_attn.q_b_proj.weight",
                                           "model.layers.1.self_attn.q_a_proj.weight",
                                           "model.layers.1.mlp.shared_experts.gate_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "deepseek_v3", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->router_b.dtype == DTYPE_F32 &&
                         L->router_b.shape[0] == 8 && L->wq_a.shape[0] == 48 &&
                         L->wq.shape[1] == 48 && !tensor_is_present(&m->layers[0].router_b),
                     "every tensor bound; correction bias F32; q LoRA", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("deepseek_v3", required, e);
}

/* Equal logits: every score is sigmoid(0) = 0.5, so the choice is the bias's alone. */
static int bias_routing(struct err *e)
{
    struct model *m = NULL;
    struct backend *be = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "deepseek_v3", NULL, NULL, e)) < 0)
        return rc;
    const struct hparams *hp = &m->hp;
    const float *bias = m->layers[1].router_b.data;
    float logits[8] = {0};
    int32_t with[2], without[2];
    float ww[2], wo[2];
    struct moe_group_params p = {.bias = &m->layers[1].router_b, .n_group = hp->moe_n_group,
                                 .topk_group = hp->moe_topk_group, .norm = hp->moe_norm,
                                 .scale = hp->moe_scale};
    struct moe_group_params q = p;
    q.bias = NULL;
    if ((rc = backend_cpu_new(&be, 1, "scalar", NULL, e)) == 0) {
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SIGMOID, with, ww, logits, 1, 8, 2, &p);
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SIGMOID, without, wo, logits, 1, 8, 2, &q);
        rc = backend_sync(be, e);
    }
    backend_free(be);
    if (rc == 0) {
        /* the reference choice: the best 2 groups of 2 by their bias sums, then the best 2
         * biases inside them */
        double g[4];
        int best[2] = {-1, -1}, pick[2] = {-1, -1};
        for (int i = 0; i < 4; i++)
            g[i] = bias[2 * i] + bias[2 * i + 1];
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 4; i++)
                if (i != best[0] && (best[s] < 0 || g[i] > g[best[s]]))
                    best[s] = i;
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 8; i++)
                if ((i / 2 == best[0] || i / 2 == best[1]) && i != pick[0] &&
                    (pick[s] < 0 || bias[i] > bias[pick[s]]))
                    pick[s] = i;
        bool ok = hp->moe_n_group == 4 && hp->moe_topk_group == 2 && with[0] == pick[0] &&
                  with[1] == pick[1] && without[0] == 0 && without[1] == 1 &&
                  (with[0] != 0 || with[1] != 1);
        for (int j = 0; j < 2; j++)
            ok = ok && stest_near(ww[j], 1.25, 1e-6) && stest_near(wo[j], 1.25, 1e-6);
        rc = stest_check(ok, "the correction bias picks the experts, the weights stay the scores'", e);
    }
    model_free(m);
    return rc;
}

static int latent_cache(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "deepseek_v3", NULL, NULL, e)) < 0)
        return rc;
    const struct hparams *hp = &m->hp;
    /* full K/V: per head a key of nope + rope and a value of v_head_dim */
    uint64_t full = (uint64_t)hp->n_layer * hp->n_head *
                    (hp->qk_nope_dim + hp->qk_rope_dim + hp->v_head_dim) * sizeof(float);
    rc = stest_check(model_kv_bytes_per_token(m, DTYPE_F32) == 2ull * 48 * sizeof(float) &&
                         4 * model_kv_bytes_per_token(m, DTYPE_F32) == full,
                     "latent cache of 48 floats per layer and token, 4x below full K/V", e);
    model_free(m);
    return rc;
}

static int forward_reads(struct err *e)
{
    static const char *const patches[] = {
        "{\"rope_interleave\": false}",
        "{\"topk_group\": 1}",
        "{\"rope_scaling\": null}",
        "{\"norm_topk_prob\": false}",
    };
    int rc;
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++)
        if ((rc = stest_patch_changes_logits("deepseek_v3", patches[i], e)) < 0)
            return rc;
    return 0;
}

int deepseek_v3_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = bias_routing(e)) < 0 ||
        (rc = latent_cache(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
