/*
 * phi self-test: what the Phi-1.5 / Phi-2 family makes of its config and its
 * checkpoint.
 *  - Config: PhiConfig's defaults when a field is absent or null (epsilon
 *    from layer_norm_eps only, half of each head rotated, gelu_new), config
 *    values reaching every layer's spec (rotary dims from
 *    partial_rotary_factor, activation, rope_theta), and every rejection
 *    naming its field.
 *  - Weights: the published layout is consumed entirely; the biases Phi
 *    needs (attention `dense`, final LayerNorm, head) are required and a
 *    missing one is named; a tied head keeps its own bias.
 *  - Forward: partial_rotary_factor changes the logits of the golden
 *    checkpoint, so the rotary share of each head reaches the forward.
 * Numerical parity with transformers lives in tests/test_golden.c.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops phi_ops;
int phi_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 256, \"max_position_embeddings\": 256"

/* Every layer rotates n_rot dims with base theta and runs act. */
static bool layers_are(const struct hparams *hp, int n_rot, float theta, enum act_kind act)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].n_rot != n_rot || hp->layer[il].rope_theta != theta || hp->layer[il].act != act)
            return false;
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* absent and null alike take PhiConfig's defaults; rms_norm_eps is not Phi's epsilon */
    if ((rc = stest_parse(&phi_ops, "{" BASE "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && layers_are(&hp, 8, 1e4f, ACT_GELU_TANH),
                          "defaults: eps 1e-5, 8 of 16 dims rotated, theta 1e4, gelu_new", e)) < 0 ||
        (rc = stest_parse(&phi_ops, "{" BASE ", \"layer_norm_eps\": null, \"partial_rotary_factor\": null, "
                          "\"hidden_act\": null, \"rope_theta\": null, \"rms_norm_eps\": 0.1}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && layers_are(&hp, 8, 1e4f, ACT_GELU_TANH),
                          "null fields take the defaults, rms_norm_eps is ignored", e)) < 0)
        return rc;
    /* stated values reach every layer; the rotary share is of head_dim (128 / 4 = 32 here) */
    if ((rc = stest_parse(&phi_ops, "{" BASE ", \"layer_norm_eps\": 1e-6, \"partial_rotary_factor\": 0.25, "
                          "\"hidden_act\": \"gelu\", \"rope_theta\": 500.0}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-6f && layers_are(&hp, 4, 500.0f, ACT_GELU_ERF),
                          "layer_norm_eps, partial_rotary_factor, hidden_act, rope_theta per layer", e)) < 0 ||
        (rc = stest_parse(&phi_ops, "{\"vocab_size\": 384, \"hidden_size\": 128, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"max_position_embeddings\": 256}",
                          &hp, e)) < 0 ||
        (rc = stest_check(layers_are(&hp, 16, 1e4f, ACT_GELU_TANH), "half of head_dim 32 rotated", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"qk_layernorm\": true}", "qk_layernorm"},
        {"{" BASE ", \"partial_rotary_factor\": 1.5}", "partial_rotary_factor"},
        {"{" BASE ", \"partial_rotary_factor\": 0}", "partial_rotary_factor"},
        {"{" BASE ", \"hidden_act\": \"mish\"}", "hidden_act"},
        {"{" BASE ", \"layer_norm_eps\": \"small\"}", "layer_norm_eps"},
        {"{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"max_position_embeddings\": 256}", "intermediate_size"},
    };
    return stest_parse_fails_all(&phi_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.dense.bias", "model.layers.0.input_layernorm.bias",
                                           "model.final_layernorm.bias", "lm_head.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("phi", required, e)) < 0 || (rc = stest_load_variant(&m, "phi", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0, "every tensor of the published checkpoint bound", e);
    model_free(m);
    if (rc < 0)
        return rc;
    /* tied: the head is the embedding, the checkpoint's lm_head.weight is dropped, its bias kept */
    if ((rc = stest_load_variant(&m, "phi", "{\"tie_word_embeddings\": true}", NULL, e)) < 0)
        return rc;
    rc = stest_check(m->lm_head.data == m->tok_embd.data && tensor_is_present(&m->lm_head_b) &&
                         st_set_n_unused(m->st) == 0, "tied head with its own bias", e);
    model_free(m);
    return rc;
}

int phi_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("phi", "{\"partial_rotary_factor\": 1.0}", e);
}
