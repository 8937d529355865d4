/*
 * lfm2 self-test: what the LFM2 family makes of its config and checkpoint.
 *  - Config: Lfm2Config's defaults (norm_eps 1e-5, theta 1e6, tied, conv_L_cache 3, the FFN
 *    width adjusted by block_auto_adjust_ff_dim), the original names (block_ff_dim, theta,
 *    tie_embedding), layer kinds from layer_types or full_attn_idxs (neither: all attention),
 *    each conv layer a recurrent layer with a state of (L - 1) * hidden floats; rejections
 *    name the field (a layer_types list of the wrong length, an unknown kind, a bad index).
 *  - Weights: the published checkpoint is consumed entirely, the conv weight widened to F32
 *    [hidden, L]; a missing conv weight, in_proj or q_layernorm is named; `convert` writes
 *    mlx-lm's [hidden, L, 1] conv, which loads to the same taps and logits.
 *  - Forward: the conv layers' state reaches the logits (a conv weight tap other than the
 *    current position changes them).
 * Numerical parity with transformers lives in tests/test_golden.c.
 */
#include <stdlib.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops lfm2_ops;
int lfm2_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
             "\"num_attention_heads\": 4, \"max_position_embeddings\": 256"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* defaults: every layer attends (the kv heads stated: their default 8 exceeds 4 heads) */
    if ((rc = stest_parse(&lfm2_ops, "{" BASE ", \"num_key_value_heads\": 2, "
                          "\"intermediate_size\": 384}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && hp.rope_theta == 1e6f && hp.tie_embd &&
                              hp.ssm.d_conv == 3 && hp.n_ff == 256 && hp.layer[0].kv == KV_FULL &&
                              hp.layer[3].mixer == MIXER_ATTENTION && hp.layer[0].qk_norm,
                          "defaults: eps 1e-5, theta 1e6, tied, L 3, ff 384 -> 256, all attention",
                          e)) < 0)
        return rc;
    if ((rc = stest_parse(&lfm2_ops, "{" BASE ", \"num_key_value_heads\": 2, \"block_ff_dim\": 200, "
                          "\"block_auto_adjust_ff_dim\": false, \"theta\": 5e5, \"tie_embedding\": false, "
                          "\"conv_L_cache\": 4, \"full_attn_idxs\": [1, 3]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_ff == 200 && hp.rope_theta == 5e5f && !hp.tie_embd &&
                              hp.layer[0].mixer == MIXER_SHORTCONV && hp.layer[0].kv == KV_RECURRENT &&
                              hp.layer[0].state_conv == 3 * 64 && hp.layer[0].n_rot == 0 &&
                              hp.layer[1].mixer == MIXER_ATTENTION && hp.layer[2].kv == KV_RECURRENT &&
                              hp.rec_scratch >= 4 * 64,
                          "original names, full_attn_idxs, conv layers recurrent with (L - 1) * "
                          "hidden floats of state", e)) < 0)
        return rc;
    if ((rc = stest_parse(&lfm2_ops, "{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, "
                          "\"block_ffn_dim_multiplier\": null, \"layer_types\": [\"conv\", "
                          "\"full_attention\", \"conv\", \"conv\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_ff == 256 && hp.layer[3].mixer == MIXER_SHORTCONV &&
                              hp.layer[1].mixer == MIXER_ATTENTION,
                          "layer_types; no multiplier: 2/3 of the width, not rounded", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, \"layer_types\": "
         "[\"conv\", \"full_attention\"]}", "layer_types"},
        {"{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, \"layer_types\": "
         "[\"conv\", \"mamba\", \"conv\", \"conv\"]}", "layer_types"},
        {"{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, \"full_attn_idxs\": [4]}",
         "full_attn_idxs"},
        {"{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, \"conv_L_cache\": 1}",
         "conv_L_cache"},
        {"{" BASE ", \"num_key_value_heads\": 2, \"intermediate_size\": 384, \"block_multiple_of\": 0}",
         "block_multiple_of"},
        {"{" BASE ", \"num_key_value_heads\": 2}", "intermediate_size"},
    };
    return stest_parse_fails_all(&lfm2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.conv.conv.weight",
                                           "model.layers.2.conv.in_proj.weight",
                                           "model.layers.1.self_attn.q_layernorm.weight",
                                           "model.embedding_norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("lfm2", required, e)) < 0 ||
        (rc = stest_load_variant(&m, "lfm2", NULL, NULL, e)) < 0)
        return rc;
    const struct tensor *cw = &m->layers[0].ssm_conv;
    rc = stest_check(st_set_n_unused(m->st) == 0 && cw->dtype == DTYPE_F32 && cw->ndim == 2 &&
                         cw->shape[0] == 64 && cw->shape[1] == 3 && m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; conv weight F32 [64, 3]; tied head", e);
    model_free(m);
    return rc;
}

/* `mlxcel convert`'s MLX layout (mlx-lm's sanitize: the conv as [hidden, L, 1]) loads to the
 * same conv taps and the same logits as the published one. */
static int mlx_layout(struct err *e)
{
    struct model *a = NULL, *b = NULL;
    float *la = NULL, *lb = NULL;
    int rc;
    if ((rc = stest_load_variant(&a, "lfm2", NULL, NULL, e)) < 0 ||
        (rc = stest_load_stacked(&b, "lfm2", e)) < 0)
        goto out;
    const struct st_tensor *t = st_set_find(b->st, "model.layers.2.conv.conv.weight");
    size_t V = (size_t)a->hp.n_vocab;
    la = malloc(V * sizeof *la);
    lb = malloc(V * sizeof *lb);
    if (!la || !lb) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = stest_check(t && t->ndim == 3 && t->shape[1] == 3 && t->shape[2] == 1,
                          "the converted conv weight is [64, 3, 1]", e)) < 0 ||
        (rc = stest_check(memcmp(a->layers[2].ssm_conv.data, b->layers[2].ssm_conv.data,
                                 64 * 3 * sizeof(float)) == 0, "the same taps in both layouts", e)) < 0 ||
        (rc = stest_prompt_logits(a, la, e)) < 0 || (rc = stest_prompt_logits(b, lb, e)) < 0)
        goto out;
    rc = stest_check(memcmp(la, lb, V * sizeof *la) == 0, "the same logits in both layouts", e);
out:
    free(la);
    free(lb);
    model_free(a);
    model_free(b);
    return rc;
}

int lfm2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = mlx_layout(e)) < 0 ||
        (rc = stest_conv_state_reaches_logits("lfm2", e)) < 0)
        return rc;
    return 0;
}
