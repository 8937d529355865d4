/*
 * mamba self-test: what the Mamba family makes of its config and checkpoint.
 *  - Config: an empty config is MambaConfig's defaults (768 wide, 32 layers, state 16, conv 4,
 *    time_step_rank "auto" = 48, tied head, no projection biases); every layer is a Mamba
 *    layer with a conv state of (d_conv - 1) * d_inner and a scan state of d_inner * d_state
 *    floats and no FFN; rejections name the field (state sizes out of range or disagreeing,
 *    a bad time_step_rank, another activation).
 *  - Weights: a missing A_log, conv1d, D or x_proj is named; a config whose state_size or
 *    time_step_rank disagrees with the checkpoint fails naming the tensor; MLX's conv1d layout
 *    ([d_inner, d_conv, 1], from `mlxcel convert`) loads to the same logits.
 *  - Forward: D and the conv bias reach the logits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/safetensors.h"
#include "selftest.h"

extern const struct model_ops mamba_ops;
int mamba_ops_self_test(struct err *e);

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&mamba_ops, "{}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_vocab == 50280 && hp.n_embd == 768 && hp.n_layer == 32 &&
                              hp.ssm.d_inner == 1536 && hp.ssm.d_state == 16 && hp.ssm.d_conv == 4 &&
                              hp.ssm.dt_rank == 48 && hp.tie_embd && !hp.ssm.proj_bias &&
                              hp.ssm.conv_bias && hp.norm_eps == 1e-5f,
                          "MambaConfig's defaults", e)) < 0)
        return rc;
    for (int il = 0; il < 32 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        rc = stest_check(ls->mixer == MIXER_MAMBA && ls->kv == KV_RECURRENT && ls->ffn == FFN_NONE &&
                             !ls->moe && ls->state_conv == 3 * 1536 && ls->state_rec == 1536 * 16,
                         "every layer a Mamba layer with its states, no FFN", e);
    }
    if (rc < 0 ||
        (rc = stest_parse(&mamba_ops, "{\"hidden_size\": 40, \"expand\": 3, \"time_step_rank\": 7, "
                          "\"use_bias\": true, \"tie_word_embeddings\": false, \"conv_kernel\": 1}",
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.ssm.d_inner == 120 && hp.ssm.dt_rank == 7 && hp.ssm.proj_bias &&
                              !hp.tie_embd && hp.layer[0].state_conv == 0 &&
                              hp.rec_scratch == 4 * 120 + 7 + 2 * 16,
                          "stated values, a conv of width 1 keeping no state", e)) < 0 ||
        (rc = stest_parse(&mamba_ops, "{\"hidden_size\": 40, \"time_step_rank\": \"auto\"}", &hp, e)) < 0 ||
        (rc = stest_check(hp.ssm.dt_rank == 3, "time_step_rank auto = ceil(hidden / 16)", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{\"state_size\": 0}", "state_size"},
        {"{\"state_size\": 257}", "state_size"},
        {"{\"conv_kernel\": 0}", "conv_kernel"},
        {"{\"expand\": 0}", "expand"},
        {"{\"expand\": 100000}", "expand"},
        {"{\"hidden_size\": 64, \"intermediate_size\": 100}", "intermediate_size"},
        {"{\"time_step_rank\": \"big\"}", "time_step_rank"},
        {"{\"time_step_rank\": 0}", "time_step_rank"},
        {"{\"time_step_rank\": 2.5}", "time_step_rank"},
        {"{\"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{\"residual_in_fp32\": \"yes\"}", "residual_in_fp32"},
        {"{\"num_hidden_layers\": 0}", "num_hidden_layers"},
        {"{\"hidden_size\": 65536, \"expand\": 16, \"state_size\": 256}", "state_size"},
    };
    return stest_parse_fails_all(&mamba_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"backbone.layers.1.mixer.A_log",
                                           "backbone.layers.0.mixer.conv1d.weight",
                                           "backbone.layers.0.mixer.conv1d.bias",
                                           "backbone.layers.1.mixer.D",
                                           "backbone.layers.0.mixer.x_proj.weight",
                                           "backbone.layers.1.mixer.dt_proj.bias", NULL};
    int rc;
    if ((rc = stest_missing_named("mamba", required, e)) < 0 ||
        (rc = stest_load_fails("mamba", "{\"state_size\": 8}", NULL, "A_log", e)) < 0 ||
        (rc = stest_load_fails("mamba", "{\"time_step_rank\": 3}", NULL, "x_proj", e)) < 0 ||
        (rc = stest_load_fails("mamba", "{\"conv_kernel\": 3}", NULL, "conv1d", e)) < 0)
        return rc;
    /* MLX's conv layout: the same logits */
    struct model *a = NULL, *b = NULL;
    int nv = 0;
    float *l = NULL;
    if ((rc = stest_load_variant(&a, "mamba", NULL, NULL, e)) < 0 ||
        (rc = stest_load_stacked(&b, "mamba", e)) < 0)
        goto out;
    const struct st_tensor *conv = st_set_find(b->st, "backbone.layers.0.mixer.conv1d.weight");
    if ((rc = stest_check(conv && conv->ndim == 3 && conv->shape[1] == 4 && conv->shape[2] == 1,
                          "convert writes MLX's conv1d layout [d_inner, d_conv, 1]", e)) < 0)
        goto out;
    nv = a->hp.n_vocab;
    if (!(l = malloc(2 * (size_t)nv * sizeof *l))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = stest_prompt_logits(a, l, e)) < 0 || (rc = stest_prompt_logits(b, l + nv, e)) < 0)
        goto out;
    rc = stest_check(memcmp(l, l + nv, (size_t)nv * sizeof *l) == 0,
                     "MLX's conv1d layout gives the published layout's logits", e);
out:
    free(l);
    model_free(a);
    model_free(b);
    return rc;
}

static void drop_d(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->layers[il].ssm_d.ndim = 0;
}

static void drop_conv_bias(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->layers[il].ssm_conv_b.ndim = 0;
}

static int forward(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "mamba", NULL, NULL, e)) == 0 &&
        (rc = stest_edit_changes_logits(m, drop_d, "the D skip", e)) == 0)
        rc = stest_edit_changes_logits(m, drop_conv_bias, "the conv bias", e);
    model_free(m);
    return rc;
}

int mamba_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return forward(e);
}
