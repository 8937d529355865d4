/*
 * falcon_h1 self-test: FalconH1Config's layers and multipliers.
 *  - Config: each config layer becomes an attention + MLP layer and a Mamba-2 layer
 *    (2 hp layers), the multipliers land where the forward reads them (key_multiplier in
 *    the softmax scale), the gated-norm options follow mamba_rms_norm /
 *    mamba_norm_before_gate; bad fields are rejected naming them.
 *  - Weights: the golden checkpoint is consumed entirely; missing A_log / conv1d named;
 *    mlx-lm's folded layout refused.
 *  - Forward: every multiplier and the norm options change the golden logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops falcon_h1_ops;
int falcon_h1_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"head_dim\": 16, " \
                   "\"max_position_embeddings\": 128, \"mamba_n_heads\": 8, " \
                   "\"mamba_d_state\": 16" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&falcon_h1_ops, CFG(", \"key_multiplier\": 0.5, \"mlp_multipliers\": "
                                              "[0.25, 2.0], \"ssm_multipliers\": [1, 2, 3, 4, 5], "
                                              "\"mamba_rms_norm\": true"), &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_layer == 6 && hp.layer[4].mixer == MIXER_ATTENTION &&
                          hp.layer[4].ffn == FFN_GLU && hp.layer[5].mixer == MIXER_MAMBA2 &&
                          hp.layer[5].ffn == FFN_NONE && hp.layer[5].kv == KV_RECURRENT &&
                          stest_near(hp.layer[0].attn_scale, 0.5 / 4.0, 1e-7) &&
                          hp.mup.mlp_gate == 0.25f && hp.mup.mlp_down == 2.0f &&
                          hp.ssm.mup && hp.ssm.mup_mult[4] == 5.0f && !hp.ssm.norm_off &&
                          hp.ssm.norm_before_gate && hp.ssm.norm_groups == 1 &&
                          hp.ssm.d_inner == 128 && hp.ssm.head_dim == 16,
                          "pairs of layers and multipliers", e)) < 0)
        return rc;
    if ((rc = stest_parse(&falcon_h1_ops, CFG(", \"mamba_d_ssm\": 64"), &hp, e)) < 0 ||
        (rc = stest_check(hp.ssm.d_inner == 64 && hp.ssm.head_dim == 8 && hp.ssm.norm_off &&
                          hp.mup.ssm_in == 1.0f, "mamba_d_ssm, defaults", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"mamba_d_ssm\": 100"), "mamba_d_ssm"},
        {CFG(", \"mamba_d_head\": 8"), "mamba_n_heads"},
        {CFG(", \"ssm_multipliers\": [1, 2]"), "ssm_multipliers"},
        {CFG(", \"mlp_multipliers\": 3"), "mlp_multipliers"},
        {CFG(", \"projectors_bias\": true"), "projectors_bias"},
        {CFG(", \"lm_head_multiplier\": 0"), "lm_head_multiplier"},
        {CFG(", \"mamba_n_groups\": 3"), "mamba_n_groups"},
    };
    return stest_parse_fails_all(&falcon_h1_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, "falcon_h1", NULL, NULL, e);
    if (rc < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->hp.n_layer == 8, "every tensor consumed", e);
    model_free(m);
    if (rc < 0)
        return rc;
    static const char *const names[] = {"model.layers.0.mamba.A_log",
                                        "model.layers.2.mamba.conv1d.weight",
                                        "model.layers.1.self_attn.k_proj.weight",
                                        "model.layers.3.feed_forward.gate_proj.weight",
                                        "model.layers.3.mamba.norm.weight", NULL};
    return stest_missing_named("falcon_h1", names, e);
}

int falcon_h1_ops_self_test(struct err *e)
{
    static const char *const patches[] = {
        "{\"embedding_multiplier\": 2}", "{\"lm_head_multiplier\": 0.5}", "{\"key_multiplier\": 3}",
        "{\"attention_in_multiplier\": 2}", "{\"attention_out_multiplier\": 2}",
        "{\"ssm_in_multiplier\": 2}", "{\"ssm_out_multiplier\": 2}", "{\"mlp_multipliers\": [2, 1]}",
        "{\"mlp_multipliers\": [1, 2]}", "{\"ssm_multipliers\": [2, 1, 1, 1, 1]}",
        "{\"ssm_multipliers\": [1, 1, 1, 1, 3]}", "{\"mamba_norm_before_gate\": false}",
        "{\"mamba_rms_norm\": false}", NULL};
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    for (int i = 0; patches[i] && rc == 0; i++)
        rc = stest_patch_changes_logits("falcon_h1", patches[i], e);
    return rc;
}
