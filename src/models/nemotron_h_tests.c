/*
 * nemotron_h self-test: NemotronHConfig's layer pattern and mixer fields.
 *  - Config: layers_block_type / hybrid_override_pattern give each layer's kind (Mamba-2
 *    without FFN, rope-free attention without FFN, relu² MLP without mixer), the count
 *    comes from the pattern; a num_hidden_layers that disagrees, an unknown layer kind, moe
 *    layers, a sliding window and inconsistent mixer sizes are rejected naming the field;
 *    the gated norm is per group.
 *  - Weights: the golden checkpoint is consumed entirely; missing A_log / conv1d named.
 *  - Forward: mlp_hidden_act reaches the logits.
 */
#include "selftest.h"

extern const struct model_ops nemotron_h_ops;
int nemotron_h_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_attention_heads\": 4, " \
                   "\"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 96, " \
                   "\"mamba_num_heads\": 8, \"mamba_head_dim\": 16, \"n_groups\": 2, " \
                   "\"ssm_state_size\": 16" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&nemotron_h_ops, CFG(", \"hybrid_override_pattern\": \"M*-M\""), &hp,
                          e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_layer == 4 && hp.layer[0].mixer == MIXER_MAMBA2 &&
                          hp.layer[0].ffn == FFN_NONE && hp.layer[1].mixer == MIXER_ATTENTION &&
                          hp.layer[1].ffn == FFN_NONE && hp.layer[1].n_rot == 0 &&
                          hp.layer[2].mixer == MIXER_NONE && hp.layer[2].ffn == FFN_MLP &&
                          hp.layer[2].act == ACT_RELU2 && hp.layer[3].kv == KV_RECURRENT &&
                          hp.ssm.norm_groups == 2 && hp.ssm.chunk == 128,
                          "hybrid_override_pattern M*-M", e)) < 0)
        return rc;
    if ((rc = stest_parse(&nemotron_h_ops, CFG(", \"layers_block_type\": [\"mlp\", \"mamba\"], "
                                               "\"mamba_d_conv\": 3"), &hp, e)) < 0 ||
        (rc = stest_check(hp.n_layer == 2 && hp.layer[1].mixer == MIXER_MAMBA2 &&
                          hp.ssm.d_conv == 3, "legacy names", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"layers_block_type\": [\"mlp\", \"mamba\"], \"num_hidden_layers\": 3"),
         "num_hidden_layers"},
        {CFG(", \"layers_block_type\": [\"mlp\", \"conv\"]"), "layers_block_type"},
        {CFG(", \"hybrid_override_pattern\": \"M?\""), "hybrid_override_pattern"},
        {CFG(", \"hybrid_override_pattern\": \"ME\""), "moe"},
        {CFG(""), "moe"},  /* the default pattern has a moe layer */
        {CFG(", \"hybrid_override_pattern\": \"M\", \"sliding_window\": 8"), "sliding_window"},
        {CFG(", \"hybrid_override_pattern\": \"M\", \"expand\": 1"), "mamba_num_heads"},
        {CFG(", \"hybrid_override_pattern\": \"M\", \"mamba_n_groups\": 3"), "n_groups"},
        {CFG(", \"hybrid_override_pattern\": \"-\", \"mlp_hidden_act\": \"silu\""), "mlp_hidden_act"},
    };
    return stest_parse_fails_all(&nemotron_h_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const names[] = {"backbone.layers.0.mixer.A_log",
                                        "backbone.layers.2.mixer.conv1d.weight",
                                        "backbone.layers.1.mixer.k_proj.weight",
                                        "backbone.layers.3.mixer.up_proj.weight",
                                        "backbone.layers.3.norm.weight", NULL};
    return stest_all_bound("nemotron_h", names, e);
}

int nemotron_h_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("nemotron_h", "{\"mlp_hidden_act\": \"relu\"}", e);
}
