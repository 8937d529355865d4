/*
 * bamba self-test: BambaConfig's layer pattern and mixer fields.
 *  - Config: attn_layer_indices picks the attention layers, every other one is Mamba-2
 *    with the state sizes of the mamba_* fields ("auto" head dim = inner / heads);
 *    indices outside the layers and inconsistent mixer sizes are rejected naming the field.
 *  - Weights: the golden checkpoint is consumed entirely; missing A_log / conv1d named.
 *  - Forward: the attention layers' rope (partial_rotary_factor) reaches the logits.
 */
#include "selftest.h"

extern const struct model_ops bamba_ops;
int bamba_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128, \"mamba_n_heads\": 8" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&bamba_ops, CFG(", \"attn_layer_indices\": [2], \"mamba_d_state\": 16"),
                          &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.layer[2].mixer == MIXER_ATTENTION && hp.layer[2].kv == KV_FULL &&
                          hp.layer[0].mixer == MIXER_MAMBA2 && hp.layer[3].kv == KV_RECURRENT &&
                          hp.ssm.head_dim == 16 && hp.ssm.d_inner == 128 &&
                          hp.layer[1].state_rec == 128 * 16 && hp.layer[1].ffn == FFN_GLU &&
                          hp.n_rot == 8, "attn_layer_indices and the mixer sizes", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"attn_layer_indices\": [4]"), "attn_layer_indices"},
        {CFG(", \"attn_layer_indices\": [-1]"), "attn_layer_indices"},
        {CFG(", \"mamba_d_head\": 32"), "mamba_n_heads"},
        {CFG(", \"mamba_n_groups\": 3"), "mamba_n_groups"},
        {CFG(", \"mamba_d_conv\": 0"), "mamba_d_conv"},
        {CFG(", \"hidden_act\": \"gelu\""), "hidden_act"},
    };
    return stest_parse_fails_all(&bamba_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const names[] = {"model.layers.0.mamba.A_log",
                                        "model.layers.2.mamba.conv1d.weight",
                                        "model.layers.1.self_attn.q_proj.weight",
                                        "model.layers.0.pre_ff_layernorm.weight", NULL};
    return stest_all_bound("bamba", names, e);
}

int bamba_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("bamba", "{\"partial_rotary_factor\": 1.0, "
                                      "\"rope_parameters\": {\"rope_theta\": 10000.0, "
                                      "\"rope_type\": \"default\", \"partial_rotary_factor\": 1.0}}", e);
}
