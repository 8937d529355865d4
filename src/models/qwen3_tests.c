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
 *  - yarn rope scaling (transformers _compute_yarn_parameters): defaults
 *    (beta_fast 32, beta_slow 1, truncate, attention factor 0.1 ln(factor) + 1,
 *    original context = max_position_embeddings), the mscale / mscale_all_dim
 *    ratio, the blended inverse frequencies of the golden case, and dropping
 *    rope_scaling changes the golden logits.
 */
#include <math.h>

#include "blocks.h"
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

#define YARN(extra) ", \"head_dim\": 32, \"rope_theta\": 1000000.0, \"rope_scaling\": {\"rope_type\": \"yarn\", " \
                    "\"factor\": 4.0" extra "}"

/* the golden qwen3_yarn context */
#define CFG64(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, " \
                     "\"max_position_embeddings\": 64" extra "}"

static int yarn(struct err *e)
{
    struct hparams hp;
    int rc;
    double af = 0.1 * log(4.0) + 1.0;
    if ((rc = stest_parse(&qwen3_ops, CFG(2, YARN("")), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].rope == ROPE_YARN && hp.layer[1].rope == ROPE_YARN && hp.rope_factor == 4.0f &&
                              hp.rope_orig_ctx == 128 && hp.rope_beta_fast == 32.0f && hp.rope_beta_slow == 1.0f &&
                              hp.rope_truncate && stest_near(hp.rope_attn_factor, af, 1e-6),
                          "yarn defaults", e)) < 0)
        return rc;
    /* a stated original context makes the factor max_position_embeddings / original
     * (transformers _compute_yarn_parameters): 128 / 16, whatever factor says */
    if ((rc = stest_parse(&qwen3_ops, CFG(2, YARN(", \"original_max_position_embeddings\": 16")), &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_factor == 8.0f && stest_near(hp.rope_attn_factor, 0.1 * log(8.0) + 1.0, 1e-6),
                          "yarn factor from the original context", e)) < 0)
        return rc;
    /* the golden case (context 64 over an original 16): transformers' inv_freq */
    static const double want[4][2] = {{0, 1.0}, {1, 0.26356032490730286}, {2, 0.04445698484778404},
                                      {15, 5.928434347879374e-07}};
    float inv[16];
    if ((rc = stest_parse(&qwen3_ops, CFG64(YARN(", \"original_max_position_embeddings\": 16")), &hp, e)) < 0)
        return rc;
    blk_rope_freqs(&hp, &hp.layer[0], inv, NULL);
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = stest_check(fabs(inv[(int)want[i][0]] / want[i][1] - 1.0) < 1e-6, "yarn inverse frequencies", e);
    if (rc < 0)
        return rc;
    /* without truncation the ramp ends at the unrounded correction dim 1.08...: j = 1 nearly interpolated */
    double hi = 32.0 * log(16.0 / (2.0 * M_PI)) / (2.0 * log(1e6)), e1 = pow(1e6, -2.0 / 32.0);
    double r1 = 1.0 / hi, inv1 = e1 / 4.0 * r1 + e1 * (1.0 - r1);
    if ((rc = stest_parse(&qwen3_ops, CFG64(YARN(", \"original_max_position_embeddings\": 16, \"truncate\": false")),
                          &hp, e)) < 0)
        return rc;
    blk_rope_freqs(&hp, &hp.layer[0], inv, NULL);
    if ((rc = stest_check(fabs(inv[1] / inv1 - 1.0) < 1e-6, "yarn truncate false", e)) < 0)
        return rc;
    /* mscale / mscale_all_dim ratio; an explicit attention_factor wins */
    double ratio = (0.1 * 2.0 * log(4.0) + 1.0) / (0.1 * log(4.0) + 1.0);
    if ((rc = stest_parse(&qwen3_ops, CFG(2, YARN(", \"mscale\": 2.0, \"mscale_all_dim\": 1.0")), &hp, e)) < 0 ||
        (rc = stest_check(stest_near(hp.rope_attn_factor, ratio, 1e-6), "yarn mscale ratio", e)) < 0 ||
        (rc = stest_parse(&qwen3_ops, CFG(2, YARN(", \"attention_factor\": 1.5, \"beta_fast\": 16")), &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_attn_factor == 1.5f && hp.rope_beta_fast == 16.0f, "yarn explicit values", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(2, ", \"rope_scaling\": {\"rope_type\": \"yarn\"}"), "factor"},
        {CFG(2, YARN(", \"beta_fast\": \"fast\"")), "beta_fast"},
        {CFG(2, YARN(", \"truncate\": 1")), "truncate"},
    };
    if ((rc = stest_parse_fails_all(&qwen3_ops, bad, sizeof bad / sizeof bad[0], e)) < 0)
        return rc;
    return stest_patch_changes_logits("qwen3_yarn", "{\"rope_scaling\": null}", e);
}

int qwen3_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = qk_norm_honoured(e)) < 0 ||
        (rc = yarn(e)) < 0)
        return rc;
    return 0;
}
