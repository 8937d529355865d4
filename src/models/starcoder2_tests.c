/*
 * starcoder2 self-test: what the StarCoder2 family makes of its config and
 * checkpoint.
 *  - Config: Starcoder2Config's defaults when a field is absent or null
 *    (norm_epsilon 1e-5, not rms_norm_eps; use_bias true; tied head;
 *    gelu_pytorch_tanh; theta 1e4), LayerNorm and the plain MLP in every
 *    layer's spec, sliding_window (null: none) on every layer, and every
 *    rejection naming its field.
 *  - Weights: the published checkpoint is consumed entirely; the biases
 *    use_bias asks for (q/k/v/o, c_fc/c_proj) and the LayerNorm biases are
 *    required and a missing one is named; untied, lm_head.weight is needed.
 *  - Forward: use_bias false changes the logits (the biases reach it).
 * Numerical parity with transformers lives in tests/test_golden.c.
 */
#include "selftest.h"

extern const struct model_ops starcoder2_ops;
int starcoder2_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"intermediate_size\": 256, \"max_position_embeddings\": 256"

/* Every layer: full attention unless window > 0, full rotary of head_dim 16, the plain
 * gelu_tanh MLP of 256. */
static bool layers_are(const struct hparams *hp, int window)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->kv != (window > 0 ? KV_SLIDING : KV_FULL) || (window > 0 && ls->window != window) ||
            ls->n_rot != 16 || ls->ffn != FFN_MLP || ls->act != ACT_GELU_TANH || ls->n_ff != 256 ||
            ls->residual != RESID_SEQUENTIAL || ls->qk_norm)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* absent and null alike take Starcoder2Config's defaults; rms_norm_eps is not its epsilon */
    if ((rc = stest_parse(&starcoder2_ops, "{" BASE "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm == NORM_LAYER && hp.norm_eps == 1e-5f && hp.rope_theta == 1e4f &&
                              hp.qkv_bias && hp.out_bias && hp.ffn_bias && hp.tie_embd && layers_are(&hp, 0),
                          "defaults: LayerNorm eps 1e-5, biases, tied, gelu_tanh MLP, no window", e)) < 0 ||
        (rc = stest_parse(&starcoder2_ops, "{" BASE ", \"norm_epsilon\": null, \"use_bias\": null, "
                          "\"tie_word_embeddings\": null, \"hidden_act\": null, \"sliding_window\": null, "
                          "\"rms_norm_eps\": 0.1}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-5f && hp.qkv_bias && hp.ffn_bias && hp.tie_embd && layers_are(&hp, 0),
                          "null fields take the defaults, rms_norm_eps is ignored", e)) < 0)
        return rc;
    /* stated values: no biases anywhere, untied, a window on every layer */
    if ((rc = stest_parse(&starcoder2_ops, "{" BASE ", \"norm_epsilon\": 1e-6, \"use_bias\": false, "
                          "\"tie_word_embeddings\": false, \"sliding_window\": 8}", &hp, e)) < 0 ||
        (rc = stest_check(hp.norm_eps == 1e-6f && !hp.qkv_bias && !hp.out_bias && !hp.ffn_bias && !hp.tie_embd &&
                              layers_are(&hp, 8), "use_bias false, untied, sliding_window on every layer", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"use_bias\": 1}", "use_bias"},
        {"{" BASE ", \"norm_epsilon\": \"small\"}", "norm_epsilon"},
        {"{" BASE ", \"norm_epsilon\": 0}", "epsilon"},
        {"{" BASE ", \"tie_word_embeddings\": \"yes\"}", "tie_word_embeddings"},
        {"{" BASE ", \"hidden_act\": \"mish\"}", "hidden_act"},
        {"{" BASE ", \"hidden_act\": \"silu\"}", "silu"},
        {"{" BASE ", \"sliding_window\": -1}", "sliding_window"},
    };
    return stest_parse_fails_all(&starcoder2_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.mlp.c_fc.bias", "model.layers.0.mlp.c_proj.weight",
                                           "model.layers.0.self_attn.o_proj.bias", "model.layers.1.self_attn.k_proj.bias",
                                           "model.layers.0.post_attention_layernorm.bias", "model.norm.bias", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_missing_named("starcoder2", required, e)) < 0 ||
        (rc = stest_load_variant(&m, "starcoder2", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->lm_head.data == m->tok_embd.data &&
                         m->layers[1].up_b.shape[0] == 256 && tensor_is_present(&m->out_norm_b),
                     "every tensor bound; c_fc bias of intermediate_size; tied head; final norm bias", e);
    model_free(m);
    if (rc < 0)
        return rc;
    /* untied, the head is a tensor of its own, which the golden checkpoint lacks */
    return stest_load_fails("starcoder2", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

int starcoder2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return stest_patch_changes_logits("starcoder2", "{\"use_bias\": false}", e);
}
