/*
 * glm4 self-test: what the GLM-4 family makes of its config and checkpoint.
 *  - Config: Glm4Config's defaults (rms_norm_eps 1.5625e-7, head_dim 128,
 *    2 kv heads, partial rotary 0.5, q/k/v biases, untied); every layer is a
 *    sandwich layer with interleaved-pair rope on head_dim * factor dims;
 *    rope_parameters' partial_rotary_factor wins over the top-level one;
 *    attention_bias never adds an o bias; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; each of the four
 *    norms, the fused gate_up_proj and a q bias is required and named when
 *    missing.
 *  - Forward: rotate-half instead of interleaved pairs, and pre-norm-only
 *    (sequential) instead of sandwich residuals, each change the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops glm4_ops;
int glm4_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool layers_are(const struct hparams *hp, int n_rot)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->residual != RESID_SANDWICH || ls->rope_style != ROPE_STYLE_PAIRS || ls->n_rot != n_rot ||
            ls->ffn != FFN_GLU || ls->act != ACT_SILU || ls->qk_norm || ls->kv != KV_FULL)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&glm4_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1.5625e-7f && hp.head_dim == 128 && hp.n_kv_head == 2 && hp.qkv_bias &&
                              !hp.out_bias && !hp.tie_embd && hp.rope_theta == 1e4f && layers_are(&hp, 64) &&
                              stest_near(hp.layer[0].attn_scale, 1.0 / sqrt(128.0), 1e-7),
                          "defaults: eps 1.5625e-7, head_dim 128, 2 kv heads, rotary 64 of 128 in pairs", e)) < 0 ||
        (rc = stest_parse(&glm4_ops, CFG(", \"head_dim\": 16, \"num_key_value_heads\": 4, \"partial_rotary_factor\": 1.0, "
                                         "\"attention_bias\": false, \"rms_norm_eps\": 1e-5"), &hp, e)) < 0 ||
        (rc = stest_check(hp.n_kv_head == 4 && !hp.qkv_bias && !hp.out_bias && hp.norm_eps == 1e-5f &&
                              layers_are(&hp, 16), "stated factor 1, no biases, eps", e)) < 0 ||
        (rc = stest_parse(&glm4_ops, CFG(", \"head_dim\": 16, \"partial_rotary_factor\": 1.0, \"rope_parameters\": "
                                         "{\"rope_type\": \"default\", \"rope_theta\": 500.0, "
                                         "\"partial_rotary_factor\": 0.25}"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 4) && hp.layer[1].rope_theta == 500.0f,
                          "rope_parameters' factor and theta win", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"partial_rotary_factor\": 0"), "partial_rotary_factor"},
        {CFG(", \"rope_parameters\": {\"partial_rotary_factor\": 1.5}"), "partial_rotary_factor"},
        {CFG(", \"rope_parameters\": {\"partial_rotary_factor\": \"half\"}"), "partial_rotary_factor"},
        {CFG(", \"attention_bias\": 1"), "attention_bias"},
        {CFG(", \"num_key_value_heads\": 3"), "num_key_value_heads"},
        {CFG(", \"hidden_act\": \"mish\""), "hidden_act"},
    };
    return stest_parse_fails_all(&glm4_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.input_layernorm.weight",
                                           "model.layers.1.post_self_attn_layernorm.weight",
                                           "model.layers.0.post_attention_layernorm.weight",
                                           "model.layers.1.post_mlp_layernorm.weight",
                                           "model.layers.0.mlp.gate_up_proj.weight",
                                           "model.layers.1.self_attn.q_proj.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "glm4", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && tensor_is_present(&m->layers[1].gate_up) &&
                         !tensor_is_present(&m->layers[0].bo) && m->hp.layer[0].n_rot == 8,
                     "every tensor bound; fused gate_up; no o bias; 8 rotary dims of 16", e);
    model_free(m);
    if (rc < 0)
        return rc;
    return stest_missing_named("glm4", required, e);
}

static void rotate_half(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].rope_style = ROPE_STYLE_HALF;
}

static void sequential(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].residual = RESID_SEQUENTIAL;
}

int glm4_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "glm4", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, rotate_half, "rotate-half instead of interleaved pairs", e)) == 0)
        rc = stest_edit_changes_logits(m, sequential, "pre-norms only instead of sandwich norms", e);
    model_free(m);
    return rc;
}
