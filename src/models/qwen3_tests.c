/*
 * qwen3 self-test: what the Qwen3 family makes of its config and checkpoint.
 *  - Config: an explicit head_dim that differs from hidden / heads sets the
 *    rotary dims and the attention scale of every layer; rms_norm_eps
 *    defaults to Qwen3Config's 1e-6; sliding layers follow transformers'
 *    Qwen3 rule (use_sliding_window, from max_window_layers on, default 28;
 *    layer_types when listed); rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; q_norm / k_norm of
 *    head_dim are required (a missing one is named); tie_word_embeddings
 *    decides whether lm_head.weight is needed.
 *  - Forward: turning the layers' q/k norm off changes the logits, so the
 *    forward reads the spec the family sets.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops qwen3_ops;
int qwen3_ops_self_test(struct err *e);

#define CFG(layers, extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": " #layers ", " \
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                           "\"max_position_embeddings\": 128" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* head_dim 32 although 64 / 4 = 16: full rotary of 32 dims, scale 1/sqrt(32), in every layer */
    if ((rc = stest_parse(&qwen3_ops, CFG(2, ", \"head_dim\": 32, \"rms_norm_eps\": null"), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 32 && hp.layer[0].n_rot == 32 && hp.layer[1].n_rot == 32 &&
                              stest_near(hp.layer[1].attn_scale, 1.0 / sqrt(32.0), 1e-7) && hp.norm_eps == 1e-6f,
                          "head_dim sets rotary dims and scale; eps defaults to 1e-6", e)) < 0)
        return rc;
    /* use_sliding_window: sliding from max_window_layers on, 28 when absent (Qwen3Config) */
    if ((rc = stest_parse(&qwen3_ops, CFG(30, ", \"use_sliding_window\": true, \"sliding_window\": 16"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[27].kv == KV_FULL && hp.layer[28].kv == KV_SLIDING && hp.layer[29].window == 16,
                          "sliding from max_window_layers = 28 on", e)) < 0 ||
        (rc = stest_parse(&qwen3_ops, CFG(3, ", \"use_sliding_window\": true, \"sliding_window\": 16, "
                                              "\"max_window_layers\": 1"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_SLIDING && hp.layer[2].kv == KV_SLIDING,
                          "sliding from max_window_layers on", e)) < 0 ||
        (rc = stest_parse(&qwen3_ops, CFG(3, ", \"use_sliding_window\": false, \"sliding_window\": 16, "
                                              "\"max_window_layers\": 1"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].kv == KV_FULL && hp.layer[2].kv == KV_FULL, "use_sliding_window false", e)) < 0 ||
        (rc = stest_parse(&qwen3_ops, CFG(3, ", \"sliding_window\": 16, \"layer_types\": [\"sliding_attention\", "
                                              "\"full_attention\", \"sliding_attention\"]"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[1].kv == KV_FULL && hp.layer[2].window == 16,
                          "layer_types wins over max_window_layers", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(3, ", \"sliding_window\": 16, \"layer_types\": [\"full_attention\"]"), "layer_types"},
        {CFG(1, ", \"sliding_window\": 16, \"layer_types\": [\"chunked_attention\"]"), "layer_types"},
        {CFG(2, ", \"head_dim\": \"wide\""), "head_dim"},
        {CFG(2, ", \"use_sliding_window\": 1"), "use_sliding_window"},
    };
    return stest_parse_fails_all(&qwen3_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.k_norm.weight",
                                           "model.layers.0.self_attn.q_norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "qwen3", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[1].k_norm.shape[0] == 32 &&
                         m->lm_head.data == m->tok_embd.data, "every tensor bound; k_norm of head_dim; tied head", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("qwen3", required, e)) < 0)
        return rc;
    /* untied, the head is a tensor of its own, which the golden checkpoint lacks */
    return stest_load_fails("qwen3", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

static void no_qk_norm(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm = false;
}

/* The golden checkpoint's prompt logits change when its layers' q/k norm is turned off. */
static int qk_norm_honoured(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "qwen3", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, no_qk_norm, "turning the layers' q/k norm off", e);
    model_free(m);
    return rc;
}

int qwen3_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = qk_norm_honoured(e)) < 0)
        return rc;
    return 0;
}
