/*
 * apertus self-test: what the Apertus family makes of its config and checkpoint.
 *  - Config: ApertusConfig's defaults (xIELU in a non-gated MLP, per-head q/k
 *    RMSNorm, rms_norm_eps 1e-5, untied, kv heads = heads) and its llama3 rope
 *    when neither rope_scaling nor rope_parameters is given, whatever the
 *    top-level rope_theta; a stated rope replaces it; another hidden_act goes
 *    through the MLP as it is; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; each layer's xIELU
 *    constants are softplus(alpha_p), beta + softplus(alpha_n), beta and eps of
 *    its stored parameters (the golden values, computed in double); every
 *    parameter, both renamed norms and the q/k norms are required and named
 *    when missing.
 *  - Forward: other xIELU constants, and relu² instead of xIELU, each change
 *    the logits.
 */
#include <math.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops apertus_ops;
int apertus_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool layers_are(const struct hparams *hp, enum act_kind act, enum rope_kind rope, float theta)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->ffn != FFN_MLP || ls->act != act || !ls->qk_norm || ls->qk_norm_full || ls->rope != rope ||
            ls->rope_theta != theta || ls->residual != RESID_SEQUENTIAL || ls->n_rot != 16)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&apertus_ops, CFG(", \"rope_theta\": 1e4"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, ACT_XIELU, ROPE_LLAMA3, 1.2e7f) && hp.rope_factor == 8.0f &&
                              hp.rope_orig_ctx == 8192 && hp.rope_low_freq_factor == 1.0f &&
                              hp.rope_high_freq_factor == 4.0f && hp.norm_eps == 1e-5f && !hp.tie_embd &&
                              hp.n_kv_head == 4 && !hp.qkv_bias,
                          "defaults: xIELU MLP, q/k norm, llama3 rope 1.2e7 x8 over 8192", e)) < 0 ||
        (rc = stest_parse(&apertus_ops, CFG(", \"rope_theta\": 5e5, \"rope_scaling\": null, \"rope_parameters\": "
                                            "{\"rope_type\": \"default\"}, \"hidden_act\": \"gelu\", "
                                            "\"qk_norm\": false, \"post_norm\": true"), &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, ACT_GELU_ERF, ROPE_DEFAULT, 5e5f),
                          "stated rope and activation; qk_norm / post_norm not read", e)) < 0)
        return rc;
    /* hparams_validate keeps xIELU to dense non-gated MLPs (its constants are bound there) */
    struct err ve = {0};
    if ((rc = stest_parse(&apertus_ops, CFG(""), &hp, e)) < 0)
        return rc;
    hp.layer[1].ffn = FFN_GLU;
    if ((rc = stest_check(hparams_validate(&hp, &ve) < 0 && strstr(ve.msg, "xIELU"), "xIELU in a GLU refused",
                          e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"mlp_bias\": true"), "mlp_bias"},
        {CFG(", \"hidden_act\": \"mish\""), "hidden_act"},
        {CFG(", \"hidden_act\": 7"), "hidden_act"},
        {CFG(", \"hidden_act\": \"silu\""), "silu"},
        {CFG(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"), "low_freq_factor"},
        {CFG(", \"num_key_value_heads\": 3"), "num_key_value_heads"},
    };
    return stest_parse_fails_all(&apertus_ops, bad, sizeof bad / sizeof bad[0], e);
}

static double softplus(double x)
{
    return log1p(exp(x));
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.mlp.act_fn.alpha_p", "model.layers.1.mlp.act_fn.alpha_n",
                                           "model.layers.0.mlp.act_fn.beta", "model.layers.1.mlp.act_fn.eps",
                                           "model.layers.1.attention_layernorm.weight",
                                           "model.layers.0.feedforward_layernorm.weight",
                                           "model.layers.1.self_attn.k_norm.weight", "model.layers.0.mlp.up_proj.weight",
                                           NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("apertus", required, e)) < 0 ||
        (rc = stest_load_variant(&m, "apertus", NULL, NULL, e)) < 0)
        return rc;
    /* the golden's stored bf16 parameters: layer 0 alpha_p -0.06494140625, alpha_n
     * -0.0380859375; layer 1 alpha_p -0.1455078125; beta 0.5, eps -9.98377799987793e-07 */
    const struct xielu_params *x0 = &m->layers[0].xielu, *x1 = &m->layers[1].xielu;
    rc = stest_check(st_set_n_unused(m->st) == 0 && !tensor_is_present(&m->layers[0].gate) &&
                         stest_near(x0->alpha_p, softplus(-0.06494140625), 1e-7) &&
                         stest_near(x0->alpha_n, 0.5 + softplus(-0.0380859375), 1e-7) &&
                         stest_near(x1->alpha_p, softplus(-0.1455078125), 1e-7) && x0->beta == 0.5f &&
                         stest_near(x1->eps, -9.98377799987793e-07, 1e-13),
                     "every tensor bound; xIELU constants from softplus of the stored parameters", e);
    model_free(m);
    return rc;
}

static void other_constants(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->layers[il].xielu.alpha_n *= 3.0f;
}

static void relu2(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].act = ACT_RELU2;
}

int apertus_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "apertus", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, other_constants, "xIELU with another alpha_n", e)) == 0)
        rc = stest_edit_changes_logits(m, relu2, "relu squared instead of xIELU", e);
    model_free(m);
    return rc;
}
