/*
 * phi3 self-test: what the Phi-3 family makes of its config and checkpoint.
 *  - longrope: factor arrays of n_rot / 2 (so their length follows
 *    partial_rotary_factor), original_max_position_embeddings from the top
 *    level unless rope_scaling states its own, the attention factor
 *    sqrt(1 + ln(max / original) / ln(original)) as transformers computes it
 *    (1 without extension, an explicit attention_factor wins), the short and
 *    long inverse frequencies, and every layer's spec taking the scaling kind;
 *  - sliding_window: null keeps every layer full, a value makes every layer
 *    sliding (Phi-3 has no max_window_layers); a negative one is named;
 *  - weights: the published fused layout (qkv_proj, gate_up_proj) is consumed
 *    entirely; without a fused tensor the loader asks for the split names
 *    and says which; attention_bias never adds biases (Phi-3 has none);
 *  - forward: sliding_window changes the golden checkpoint's logits on a
 *    prompt longer than the window.
 */
#include <math.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops phi3_ops;
int phi3_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
#define SHORT "[1.0, 1.05, 1.1, 1.2, 1.4, 1.8, 2.5, 3.0]"
#define LONG "[1.0, 1.3, 1.9, 2.8, 4.0, 6.0, 9.0, 12.0]"
#define LONGROPE(s, l, extra) "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": " s ", \"long_factor\": " l extra "}"
#define ORIG8 "\"original_max_position_embeddings\": 8, "

static int longrope(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", " ORIG8 LONGROPE(SHORT, LONG, "") "}", &hp, e)) < 0)
        return rc;
    double af = sqrt(1.0 + log(256.0 / 8.0) / log(8.0));
    if ((rc = stest_check(hp.rope_orig_ctx == 8 && hp.rope_short[7] == 3.0f && hp.rope_long[7] == 12.0f &&
                              hp.layer[0].rope == ROPE_LONGROPE && hp.layer[1].rope == ROPE_LONGROPE,
                          "longrope factors, original context and every layer's scaling kind", e)) < 0 ||
        (rc = stest_check(stest_near(hp.rope_attn_factor, af, 1e-6), "longrope attention factor", e)) < 0)
        return rc;
    float inv[8], inv_long[8];
    blk_rope_freqs(&hp, &hp.layer[0], inv, inv_long);
    for (int j = 0; j < 8 && rc == 0; j++) {
        double base = pow(10000.0, 2.0 * j / 16);
        rc = stest_check(stest_near(inv[j], 1.0 / (hp.rope_short[j] * base), 1e-7) &&
                             stest_near(inv_long[j], 1.0 / (hp.rope_long[j] * base), 1e-7),
                         "longrope short/long inverse frequencies", e);
    }
    if (rc < 0)
        return rc;
    /* rope_scaling's own original context wins over the top level's */
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", " ORIG8 LONGROPE(SHORT, LONG, ", \"original_max_position_embeddings\": 16") "}",
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_orig_ctx == 16 && stest_near(hp.rope_attn_factor, sqrt(2.0), 1e-6),
                          "rope_scaling.original_max_position_embeddings wins", e)) < 0)
        return rc;
    /* no extension (max == original): no cos/sin scaling; an explicit attention_factor wins */
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", \"original_max_position_embeddings\": 256, " LONGROPE(SHORT, LONG, "") "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_attn_factor == 1.0f, "attention factor 1 without extension", e)) < 0 ||
        (rc = stest_parse(&phi3_ops, "{" BASE ", " ORIG8 LONGROPE(SHORT, LONG, ", \"attention_factor\": 1.25") "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_attn_factor == 1.25f, "explicit attention_factor", e)) < 0)
        return rc;
    /* partial rotary (Phi-4-mini): half of 16 dims rotated, so 4 factors each */
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", " ORIG8 "\"partial_rotary_factor\": 0.5, "
                          LONGROPE("[1.0, 1.1, 1.2, 1.3]", "[2.0, 2.1, 2.2, 2.3]", "") "}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[1].n_rot == 8 && hp.rope_long[3] == 2.3f, "factor arrays follow partial_rotary_factor", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", " ORIG8 "\"partial_rotary_factor\": 0.5, " LONGROPE(SHORT, LONG, "") "}", "short_factor"},
        {"{" BASE ", " ORIG8 LONGROPE(SHORT, "[1.0]", "") "}", "long_factor"},
        {"{" BASE ", " ORIG8 "\"rope_scaling\": {\"type\": \"ntk\", \"factor\": 2.0}}", "rope_scaling type 'ntk'"},
    };
    return stest_parse_fails_all(&phi3_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int sliding(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", \"sliding_window\": null}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_FULL, "sliding_window null: full", e)) < 0 ||
        (rc = stest_parse(&phi3_ops, "{" BASE ", \"sliding_window\": 8}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[0].window == 8 && hp.layer[1].kv == KV_SLIDING &&
                              hp.layer[1].window == 8, "sliding_window on every layer", e)) < 0)
        return rc;
    return stest_parse_fails(&phi3_ops, "{" BASE ", \"sliding_window\": -1}", "sliding_window", e);
}

static int weights(struct err *e)
{
    struct model *m = NULL;
    int rc;
    /* attention_bias does not add biases to Phi-3's projections: this loads without any */
    if ((rc = stest_load_variant(&m, "phi3", "{\"attention_bias\": true}", NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && tensor_is_present(&m->layers[1].wqkv) &&
                         tensor_is_present(&m->layers[1].gate_up) && !tensor_is_present(&m->layers[1].bqkv),
                     "fused layout bound entirely, no biases", e);
    model_free(m);
    /* without a fused tensor the loader falls back to the split names and says which */
    if (rc < 0 ||
        (rc = stest_load_fails("phi3", NULL, "model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.self_attn.q_proj.weight", e)) < 0 ||
        (rc = stest_load_fails("phi3", NULL, "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.gate_proj.weight", e)) < 0)
        return rc;
    return 0;
}

int phi3_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = longrope(e)) < 0 || (rc = sliding(e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    /* the 12-token prompt is longer than the window */
    return stest_patch_changes_logits("phi3", "{\"sliding_window\": 4}", e);
}
