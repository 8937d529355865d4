/*
 * recurrent_gemma self-test: what the RecurrentGemma family makes of its config and checkpoint.
 *  - Config: RecurrentGemmaConfig's defaults (2560 wide, 10 heads, lru_width = hidden,
 *    intermediate 3 x hidden halved in the MLP, window 2048, conv 4, cap 30, eps 1e-6, theta
 *    1e4, half-head rotary, gelu tanh, tied, block_types repeated), the embedding scale in
 *    bf16; rejections name the field.
 *  - Weights: the checkpoint is consumed entirely, the RG-LRU's tensors widened to F32; a
 *    missing conv_1d, recurrent_param or gate weight is named.
 *  - Forward: the recurrent state reaches the logits (the conv's oldest tap changes them).
 * Numerical parity with transformers lives in tests/test_golden.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "selftest.h"

extern const struct model_ops recurrent_gemma_ops;
int recurrent_gemma_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 5, " \
             "\"num_attention_heads\": 4"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&recurrent_gemma_ops, "{}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_vocab == 256000 && hp.n_embd == 2560 && hp.n_layer == 26 &&
                              hp.n_head == 10 && hp.n_kv_head == 10 && hp.head_dim == 256 &&
                              hp.n_ff == 3840 && hp.ssm.d_inner == 2560 && hp.ssm.d_conv == 4 &&
                              hp.logit_softcap == 30.0f && hp.norm_eps == 1e-6f &&
                              hp.rope_theta == 1e4f && hp.layer[2].n_rot == 128 && hp.tie_embd &&
                              hp.act == ACT_GELU_TANH && hp.norm_w_offset == 1.0f &&
                              hp.layer[0].mixer == MIXER_RGLRU && hp.layer[1].kv == KV_RECURRENT &&
                              hp.layer[2].kv == KV_SLIDING && hp.layer[2].window == 2048 &&
                              hp.layer[5].kv == KV_SLIDING && hp.layer[25].mixer == MIXER_RGLRU &&
                              hp.embd_scale == 50.5f && hp.layer[0].state_conv == 3 * 2560 &&
                              hp.layer[0].state_rec == 2560 && hp.ffn == FFN_GLU,
                          "RecurrentGemmaConfig's defaults (sqrt(2560) = 50.596 is 50.5 in bf16)",
                          e)) < 0)
        return rc;
    if ((rc = stest_parse(&recurrent_gemma_ops, "{" BASE ", \"num_key_value_heads\": 1, "
                          "\"intermediate_size\": 96, \"lru_width\": 32, \"conv1d_width\": 3, "
                          "\"attention_window_size\": 5, \"logits_soft_cap\": 10.0, "
                          "\"hidden_activation\": \"gelu\", \"block_types\": [\"attention\", "
                          "\"recurrent\"], \"rope_parameters\": {\"rope_type\": \"default\", "
                          "\"rope_theta\": 500.0, \"partial_rotary_factor\": 0.5}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_ff == 48 && hp.ssm.d_inner == 32 && hp.ssm.d_conv == 3 &&
                              hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 5 &&
                              hp.layer[1].mixer == MIXER_RGLRU && hp.layer[4].kv == KV_SLIDING &&
                              hp.layer[3].state_conv == 2 * 32 && hp.rope_theta == 500.0f &&
                              hp.logit_softcap == 10.0f && hp.act == ACT_GELU_ERF &&
                              hp.rec_scratch >= 3 * 32 && hp.embd_scale == 8.0f && hp.out_bias,
                          "stated fields; block_types repeated over 5 layers", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"block_types\": [\"recurrent\", \"mlp\"]}", "block_types"},
        {"{" BASE ", \"block_types\": []}", "block_types"},
        {"{" BASE ", \"lru_width\": 30}", "lru_width"},
        {"{" BASE ", \"conv1d_width\": 0}", "conv1d_width"},
        {"{" BASE ", \"attention_window_size\": 0}", "attention_window_size"},
        {"{" BASE ", \"partial_rotary_factor\": 0.25}", "partial_rotary_factor"},
        {"{" BASE ", \"logits_soft_cap\": 0}", "logits_soft_cap"},
        {"{" BASE ", \"hidden_activation\": \"tanh\"}", "hidden_activation"},
        {"{" BASE ", \"hidden_activation\": 3}", "hidden_activation"},
        {"{" BASE ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2.0}}", "rope"},
    };
    return stest_parse_fails_all(&recurrent_gemma_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {
        "model.layers.0.temporal_block.conv_1d.weight",
        "model.layers.1.temporal_block.rg_lru.recurrent_param",
        "model.layers.0.temporal_block.rg_lru.input_gate_weight",
        "model.layers.2.temporal_block.o_proj.bias",
        "model.layers.1.mlp_block.gate_proj.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("recurrent_gemma", required, e)) < 0 ||
        (rc = stest_load_variant(&m, "recurrent_gemma", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[0];
    rc = stest_check(st_set_n_unused(m->st) == 0 && L->ssm_conv.dtype == DTYPE_F32 &&
                         L->ssm_conv.ndim == 2 && L->ssm_conv.shape[1] == 4 &&
                         L->rg_wi.dtype == DTYPE_F32 && L->rg_a.dtype == DTYPE_F32 &&
                         m->lm_head.data == m->tok_embd.data,
                     "every tensor bound; conv and RG-LRU tensors F32; tied head", e);
    model_free(m);
    return rc;
}

int recurrent_gemma_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_conv_state_reaches_logits("recurrent_gemma", e)) < 0)
        return rc;
    return 0;
}
