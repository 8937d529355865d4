/*
 * ernie4_5_moe self-test: what the ERNIE 4.5 MoE family makes of its config and checkpoint.
 *  - Config: Ernie4_5_MoeConfig's defaults (64 experts top-6, 2 shared experts of 1536, MoE
 *    from layer 1 to the last, rope_theta 500000 on interleaved pairs, tied head, moe_norm_min
 *    1e-12, the softmax router with the correction bias); the layer rule (il + 1) % interval
 *    == 0 within [start, end]; attention_bias is not Ernie's (ignored); use_bias, a partial
 *    rotary factor and impossible values are refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely, its [1, E] correction bias bound as
 *    [E] F32; a missing correction bias, router or shared expert is named; mlx-lm's stacked
 *    layout binds byte-identical experts, and without the bias (mlx-lm's sanitize drops it)
 *    it loads with none.
 *  - Routing: the bias chooses, the weights are the chosen probabilities over their sum.
 *  - Forward: moe_norm_min, the correction bias, the rope style and the layer pattern reach
 *    the logits.
 *  - Golden case (`ernie4_5_moe`): ../shared/tools/golden/gen_golden3.py, transformers 5.17,
 *    with its correction-bias cast to float64 made through m._parameters (Ernie's bias is an
 *    nn.Parameter of Ernie4_5_MoeStatics, not a buffer as in DeepSeek's router).
 */
#include <math.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops ernie4_5_moe_ops;
int ernie4_5_moe_ops_self_test(struct err *e);

/* HEAD lacks the keys the rejections vary (a repeated JSON key would not override) */
#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
#define BASE HEAD ", \"num_hidden_layers\": 4, \"moe_num_experts\": 8, \"moe_intermediate_size\": 32"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&ernie4_5_moe_ops, "{" HEAD ", \"num_hidden_layers\": 3}", &hp, e)) < 0)
        return rc;
    const struct layer_spec *l0 = &hp.layer[0], *l2 = &hp.layer[2];
    bool ok = hp.n_expert == 64 && hp.n_expert_used == 6 && hp.router_bias && hp.moe_norm &&
              hp.moe_scale == 1.0f && hp.moe_n_group == 1 && hp.moe_topk_group == 1 &&
              hp.moe_norm_min == 1e-12f && hp.tie_embd && hp.norm_eps == 1e-5f &&
              !hp.qkv_bias && !hp.out_bias && hp.n_kv_head == 4 && hp.head_dim == 16 &&
              !l0->moe && l0->n_ff == 128 && l0->router == ROUTER_NONE && l2->moe &&
              l2->n_ff == 1536 && l2->n_ff_shexp == 3072 && l2->shexp_plain &&
              l2->router == ROUTER_GROUP_SOFTMAX && l2->rope_theta == 500000.0f &&
              l2->rope_style == ROPE_STYLE_PAIRS && l2->n_rot == 16;
    if ((rc = stest_check(ok, "Ernie4_5_MoeConfig defaults", e)) < 0)
        return rc;
    /* (il + 1) % 2 == 0 within [0, 2]: layer 1 only (3 is past the end); attention_bias is
     * not read by Ernie's attention */
    if ((rc = stest_parse(&ernie4_5_moe_ops, "{" BASE ", \"moe_layer_interval\": 2, "
                          "\"moe_layer_start_index\": 0, \"moe_layer_end_index\": 2, \"moe_k\": 2, "
                          "\"moe_num_shared_experts\": 0, \"attention_bias\": true, "
                          "\"moe_norm_min\": 0.5, \"tie_word_embeddings\": false}", &hp, e)) < 0)
        return rc;
    ok = !hp.layer[0].moe && hp.layer[1].moe && !hp.layer[2].moe && !hp.layer[3].moe &&
         hp.layer[1].n_ff_shexp == 0 && !hp.qkv_bias && hp.moe_norm_min == 0.5f && !hp.tie_embd;
    if ((rc = stest_check(ok, "MoE layers by interval and end index; attention_bias ignored", e)) < 0)
        return rc;
    /* moe_norm_min 0: clamp(sum, 0) is the sum; 0 in the router would mean sum + 1e-20 */
    if ((rc = stest_parse(&ernie4_5_moe_ops, "{" BASE ", \"moe_norm_min\": 0}", &hp, e)) < 0 ||
        (rc = stest_check(hp.moe_norm_min > 0.0f && hp.moe_norm_min < 1e-40f,
                          "moe_norm_min 0 divides by the sum", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"use_bias\": true}", "use_bias"},
        {"{" BASE ", \"partial_rotary_factor\": 0.5}", "partial_rotary_factor"},
        {"{" BASE ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}}",
         "partial_rotary_factor"},
        {"{" BASE ", \"moe_k\": 9}", "moe_k"},
        {"{" HEAD ", \"num_hidden_layers\": 4, \"moe_num_experts\": 0}", "moe_num_experts"},
        {"{" BASE ", \"moe_layer_interval\": 0}", "moe_layer_interval"},
        {"{" BASE ", \"moe_layer_start_index\": -1}", "moe_layer_start_index"},
        {"{" BASE ", \"moe_layer_end_index\": -2}", "moe_layer_end_index"},
        {"{" BASE ", \"moe_norm_min\": -1}", "moe_norm_min"},
        {"{" BASE ", \"moe_num_shared_experts\": -1}", "moe_num_shared_experts"},
        {"{" BASE ", \"moe_layer_start_index\": [1]}", "moe_layer_start_index"},
        {"{" BASE ", \"sliding_window\": 8, \"use_sliding_window\": true}", "sliding_window"},
    };
    return stest_parse_fails_all(&ernie4_5_moe_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.moe_statics.e_score_correction_bias",
                                           "model.layers.2.mlp.gate.weight",
                                           "model.layers.1.mlp.shared_experts.up_proj.weight",
                                           "model.layers.2.mlp.experts.7.down_proj.weight",
                                           "model.layers.0.mlp.gate_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "ernie4_5_moe", NULL, NULL, e)) < 0)
        return rc;
    const struct tensor *b = &m->layers[1].router_b;
    rc = stest_check(st_set_n_unused(m->st) == 0 && b->dtype == DTYPE_F32 && b->ndim == 1 &&
                         b->shape[0] == 8 && fabsf(((const float *)b->data)[1] - 0.16015625f) < 1e-7f &&
                         !tensor_is_present(&m->layers[0].router_b),
                     "every tensor bound; the [1, 8] correction bias as [8] F32", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("ernie4_5_moe", required, e)) < 0 ||
        (rc = stest_stacked_agrees("ernie4_5_moe", "model.layers.2.mlp.switch_mlp.down_proj.weight", e)) < 0)
        return rc;
    /* mlx-lm's layout without the bias: no correction, as mlx-lm routes */
    if ((rc = stest_load_stacked_without(&m, "ernie4_5_moe",
                                         "model.layers.1.mlp.moe_statics.e_score_correction_bias", e)) < 0)
        return rc;
    rc = stest_check(!tensor_is_present(&m->layers[1].router_b) &&
                         tensor_is_present(&m->layers[2].router_b) && st_set_n_unused(m->st) == 0,
                     "stacked experts without the correction bias route without it", e);
    model_free(m);
    return rc;
}

/* Softmax over {0, 0, 0, 0, -1, -1, -1, -1} with the bias +1 on experts 6 and 7: the bias
 * picks them, their weights are their probabilities over their sum (1/2 each). */
static int bias_routing(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&ernie4_5_moe_ops, "{" BASE ", \"moe_k\": 2}", &hp, e)) < 0)
        return rc;
    float logits[8] = {0, 0, 0, 0, -1, -1, -1, -1}, bv[8] = {0, 0, 0, 0, 0, 0, 1, 1};
    struct tensor bias;
    int64_t shape[1] = {8};
    tensor_init(&bias, DTYPE_F32, bv, 1, shape);
    struct moe_group_params p = {.bias = &bias, .n_group = hp.moe_n_group, .topk_group = hp.moe_topk_group,
                                 .norm = hp.moe_norm, .scale = hp.moe_scale, .norm_min = hp.moe_norm_min};
    struct backend *be = NULL;
    int32_t sel[2];
    float w[2];
    if ((rc = backend_cpu_new(&be, 1, "scalar", NULL, e)) == 0) {
        be->ops->moe_route_grouped(be, hp.layer[1].router, sel, w, logits, 1, 8, 2, &p);
        rc = backend_sync(be, e);
    }
    backend_free(be);
    if (rc < 0)
        return rc;
    return stest_check(sel[0] == 6 && sel[1] == 7 && stest_near(w[0], 0.5, 1e-6) &&
                           stest_near(w[1], 0.5, 1e-6),
                       "the correction bias chooses, the weights are the renormalized probabilities", e);
}

static void no_bias(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        memset(&m->layers[il].router_b, 0, sizeof m->layers[il].router_b);
}

static void half_rope(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].rope_style = ROPE_STYLE_HALF;
}

static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    /* a clamp above the chosen probabilities' sum (at most 1) stops the renormalization */
    if ((rc = stest_patch_changes_logits("ernie4_5_moe", "{\"moe_norm_min\": 1.0}", e)) < 0 ||
        (rc = stest_load_variant(&m, "ernie4_5_moe", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, no_bias, "the correction bias", e)) == 0)
        rc = stest_edit_changes_logits(m, half_rope, "interleaved-pair rope", e);
    model_free(m);
    if (rc < 0)
        return rc;
    /* layer 2 dense (end index 1): its experts stay unbound and its dense MLP is missing */
    return stest_load_fails("ernie4_5_moe", "{\"moe_layer_end_index\": 1}", NULL,
                            "model.layers.2.mlp.gate_proj", e);
}

int ernie4_5_moe_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = bias_routing(e)) < 0 ||
        (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
