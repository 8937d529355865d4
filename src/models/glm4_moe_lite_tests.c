/*
 * glm4_moe_lite self-test: what the GLM-4.7-Flash family makes of its config and checkpoint.
 *  - Config: Glm4MoeLiteConfig's defaults (q LoRA 768, kv LoRA 512, 192 + 64 query dims, 256
 *    value dims, 64 experts top-4 renormalized x 1.8, 1 shared expert, layer 0 dense, latent
 *    cache, interleaved-pair rope over all 64 rope dims); mlp_layer_types decides the dense /
 *    sparse layers over first_k_dense_replace, which decides without it; a
 *    partial_rotary_factor other than 1 (transformers cannot run it), a bad mlp_layer_types,
 *    other topk_methods, attention biases and sliding windows are refused, naming the field.
 *  - Weights: the golden checkpoint is consumed entirely (F32 correction bias, q LoRA);
 *    missing tensors are named; mlx-lm's layout (stacked experts, kv_b_proj split into
 *    embed_q / unembed_out) binds byte-identical experts.
 *  - Cache: the latent row is kv_lora_rank + qk_rope_head_dim = 40 floats per layer.
 *  - Forward: rope_interleave, routed_scaling_factor, norm_topk_prob reach the logits; an
 *    mlp_layer_types that calls a sparse layer dense makes its dense MLP required.
 *  - Golden case (`glm4_moe_lite`): ../shared/tools/golden/gen_golden3.py, transformers 5.17,
 *    with rope_parameters stating partial_rotary_factor 1.0 (5.17's default glm rope takes half of qk_rope_head_dim, and
 *    transformers itself then fails: see glm4_moe_lite.c).
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops glm4_moe_lite_ops;
int glm4_moe_lite_ops_self_test(struct err *e);

/* HEAD lacks the keys the rejections vary (a repeated JSON key would not override) */
#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
#define BASE HEAD ", \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, " \
             "\"kv_lora_rank\": 32, \"q_lora_rank\": 48, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, " \
             "\"v_head_dim\": 16"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&glm4_moe_lite_ops, "{" HEAD "}", &hp, e)) < 0)
        return rc;
    const struct layer_spec *l0 = &hp.layer[0], *l1 = &hp.layer[1];
    bool ok = hp.q_lora_rank == 768 && hp.kv_lora_rank == 512 && hp.qk_nope_dim == 192 &&
              hp.qk_rope_dim == 64 && hp.v_head_dim == 256 && hp.n_expert == 64 &&
              hp.n_expert_used == 4 && hp.moe_norm && stest_near(hp.moe_scale, 1.8, 1e-7) &&
              hp.moe_n_group == 1 && hp.router_bias && hp.norm_eps == 1e-5f && !hp.tie_embd &&
              stest_near(hp.attn_scale, 1.0 / 16.0, 1e-7) && l0->kv == KV_LATENT && !l0->moe &&
              l0->n_ff == 128 && l1->moe && l1->n_ff == 1536 && l1->n_ff_shexp == 1536 &&
              l1->shexp_plain && l1->router == ROUTER_GROUP_SIGMOID && l1->n_rot == 64 &&
              l1->rope_style == ROPE_STYLE_PAIRS && l1->rope_theta == 10000.0f;
    if ((rc = stest_check(ok, "Glm4MoeLiteConfig defaults", e)) < 0)
        return rc;
    /* mlp_layer_types over first_k_dense_replace; the rope factor 1.0 either place */
    if ((rc = stest_parse(&glm4_moe_lite_ops, "{" BASE ", \"first_k_dense_replace\": 2, "
                          "\"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\"], "
                          "\"partial_rotary_factor\": 1.0, \"rope_interleave\": false}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].moe && !hp.layer[1].moe && hp.layer[2].moe &&
                              hp.layer[1].n_ff == 128 && hp.layer[0].n_ff == 32 &&
                              hp.layer[0].rope_style == ROPE_STYLE_HALF && hp.layer[0].n_rot == 8,
                          "mlp_layer_types decides; rope_interleave false", e)) < 0)
        return rc;
    if ((rc = stest_parse(&glm4_moe_lite_ops, "{" BASE ", \"first_k_dense_replace\": 2, "
                          "\"mlp_layer_types\": null, \"rope_parameters\": {\"rope_type\": \"default\", "
                          "\"rope_theta\": 1e6, \"partial_rotary_factor\": 1.0}}", &hp, e)) < 0 ||
        (rc = stest_check(!hp.layer[0].moe && !hp.layer[1].moe && hp.layer[2].moe &&
                              hp.layer[2].rope_theta == 1e6f,
                          "first_k_dense_replace without mlp_layer_types", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}}",
         "partial_rotary_factor"},
        {"{" BASE ", \"partial_rotary_factor\": 0.5}", "partial_rotary_factor"},
        {"{" BASE ", \"mlp_layer_types\": [\"dense\", \"sparse\"]}", "mlp_layer_types"},
        {"{" BASE ", \"mlp_layer_types\": [\"dense\", \"moe\", \"sparse\"]}", "mlp_layer_types"},
        {"{" BASE ", \"mlp_layer_types\": \"dense\"}", "mlp_layer_types"},
        {"{" BASE ", \"topk_method\": \"greedy\"}", "topk_method"},
        {"{" BASE ", \"attention_bias\": true}", "attention_bias"},
        {"{" BASE ", \"sliding_window\": 8, \"use_sliding_window\": true}", "sliding"},
        {"{" BASE ", \"n_group\": 3}", "n_group"},
        {"{" HEAD ", \"n_routed_experts\": 8, \"num_experts_per_tok\": 9}", "num_experts_per_tok"},
    };
    return stest_parse_fails_all(&glm4_moe_lite_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.gate.e_score_correction_bias",
                                           "model.layers.2.self_attn.q_a_layernorm.weight",
                                           "model.layers.0.self_attn.kv_b_proj.weight",
                                           "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                                           "model.layers.2.mlp.shared_experts.gate_proj.weight",
                                           "model.layers.0.mlp.down_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "glm4_moe_lite", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->router_b.dtype == DTYPE_F32 &&
                         L->router_b.shape[0] == 8 && L->wq_a.shape[0] == 48 &&
                         !tensor_is_present(&m->layers[0].router_b),
                     "every tensor bound; correction bias F32; q LoRA", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("glm4_moe_lite", required, e)) < 0)
        return rc;
    return stest_stacked_agrees("glm4_moe_lite", "model.layers.2.mlp.switch_mlp.down_proj.weight", e);
}

static int latent_cache(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "glm4_moe_lite", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(model_kv_bytes_per_token(m, DTYPE_F32) == 3ull * (32 + 8) * sizeof(float),
                     "latent cache of kv_lora_rank + qk_rope_head_dim floats per layer", e);
    model_free(m);
    return rc;
}

static int forward_reads(struct err *e)
{
    static const char *const patches[] = {
        "{\"rope_interleave\": false}",
        "{\"routed_scaling_factor\": 1.0}",
        "{\"norm_topk_prob\": false}",
    };
    int rc;
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++)
        if ((rc = stest_patch_changes_logits("glm4_moe_lite", patches[i], e)) < 0)
            return rc;
    return stest_load_fails("glm4_moe_lite", "{\"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\"]}",
                            NULL, "model.layers.1.mlp.gate_proj", e);
}

int glm4_moe_lite_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = latent_cache(e)) < 0 ||
        (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
