/*
 * llama self-test: config normalization (defaults, GQA, rope scaling kinds,
 * sliding windows per layer, errors that name the field), and that the
 * activation a config names is what the forward runs. Numerical parity lives
 * in tests/test_golden.c.
 */
#include <math.h>
#include <stdlib.h>

#include "../kernels/backend.h"
#include "selftest.h"

extern const struct model_ops llama_ops;
int llama_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"model_type\": \"llama\""

/* The golden llama checkpoint's last-token logits over 3 tokens, with every layer's
 * activation forced to act. */
static int logits_with_act(enum act_kind act, float *out, struct err *e)
{
    struct backend *be = NULL;
    struct stest_run r;
    const int32_t ids[3] = {5, 17, 42};
    int rc;
    if ((rc = backend_cpu_new(&be, 1, NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_run_open(&r, "tests/fixtures/golden/llama", NULL, be, 8, e)) == 0) {
        for (int il = 0; il < r.m->hp.n_layer; il++)
            r.m->hp.layer[il].act = act;
        rc = stest_run_feed(&r, ids, 3, false, out, e);
        stest_run_close(&r);
    }
    backend_free(be);
    return rc;
}

/* hidden_act reaches the GLU: gelu is parsed (it used to parse and then run SiLU) and the
 * forward's output changes with the activation. */
static int activation_honoured(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"hidden_act\": \"gelu\"}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].act == ACT_GELU_ERF && hp.layer[1].act == ACT_GELU_ERF, "gelu in every layer", e)) < 0)
        return rc;
    float *a = calloc(2 * 512, sizeof *a);   /* the fixture's vocabulary is 384 */
    if (!a)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = logits_with_act(ACT_SILU, a, e)) == 0 && (rc = logits_with_act(ACT_GELU_ERF, a + 512, e)) == 0) {
        double d = 0;
        for (int i = 0; i < 512; i++)
            d = fmax(d, fabs((double)a[i] - a[512 + i]));
        rc = stest_check(d > 1e-3 && isfinite(d), "the forward runs the layer's activation", e);
    }
    free(a);
    return rc;
}

/* sliding windows per layer: sliding_window on every layer (Mistral), layer_types, and
 * use_sliding_window false switching them off. */
static int sliding_layers(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"sliding_window\": 8}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_SLIDING && hp.layer[1].kv == KV_SLIDING && hp.layer[1].window == 8,
                          "sliding_window on every layer", e)) < 0 ||
        (rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"sliding_window\": 8, "
                          "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_SLIDING, "layer_types", e)) < 0 ||
        (rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"sliding_window\": 8, "
                          "\"use_sliding_window\": false}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_FULL, "use_sliding_window false", e)) < 0)
        return rc;
    /* the per-layer specs are bounded before they are written (5000 layers used to write past
     * the spec array before hparams_validate saw the count) */
    if ((rc = stest_parse_fails(&llama_ops, "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 5000, "
                                "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"num_attention_heads\": 4, "
                                "\"sliding_window\": 8}", "num_hidden_layers", e)) < 0)
        return rc;
    return stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"layer_types\": "
                             "[\"full_attention\", \"sliding_attention\"]}", "sliding_window", e);
}

int llama_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = activation_honoured(e)) < 0 || (rc = sliding_layers(e)) < 0)
        return rc;
    /* defaults: kv heads = heads, head_dim = hidden / heads, full rotary, theta 1e4, eps 1e-6 */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4}", &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_kv_head == 4 && hp.head_dim == 16 && hp.n_rot == 16, "llama dims", e)) < 0 ||
        (rc = stest_check(hp.rope_theta == 10000.0f && hp.norm_eps == 1e-6f, "llama defaults", e)) < 0 ||
        (rc = stest_check(!hp.tie_embd && !hp.qkv_bias && hp.norm == NORM_RMS && hp.ffn == FFN_GLU, "llama flags", e)) < 0 ||
        (rc = stest_check(stest_near(hp.attn_scale, 0.25, 1e-7), "attention scale 1/sqrt(16)", e)) < 0)
        return rc;
    /* attention_bias covers q, k, v and o */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"attention_bias\": true}", &hp, e)) < 0 ||
        (rc = stest_check(hp.qkv_bias && hp.out_bias, "attention_bias", e)) < 0)
        return rc;
    /* llama3 rope scaling */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                          "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                          "\"original_max_position_embeddings\": 64}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope == ROPE_LLAMA3 && hp.rope_factor == 8.0f && hp.rope_orig_ctx == 64, "llama3 rope", e)) < 0)
        return rc;
    /* dynamic NTK: the original context is max_position_embeddings and a cache may
     * outgrow it; the base frequencies stay plain (the rope op rescales them) */
    if ((rc = stest_parse(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"type\": \"dynamic\", "
                                      "\"factor\": 2.0}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].rope == ROPE_DYNAMIC && hp.rope_factor == 2.0f && hp.rope_orig_ctx == hp.n_ctx &&
                              hp.n_ctx_max > hp.n_ctx, "dynamic rope", e)) < 0 ||
        (rc = stest_patch_changes_logits("llama_dynamic", "{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 4.0}}", e)) < 0)
        return rc;
    /* errors name the field */
    if ((rc = stest_parse_fails(&llama_ops, "{" BASE "}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 0}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 6}", "divisible", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"num_key_value_heads\": 3}", "multiple", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"hidden_act\": \"mish\"}", "hidden_act", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"mlp_bias\": true}", "mlp_bias", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"type\": \"ntk\", \"factor\": 2}}", "ntk", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"type\": \"dynamic\"}}", "factor", e)) < 0 ||
        /* a stated original context of 0 divides by zero in transformers; it was read as
         * max_position_embeddings, turning factor 4 into 1 without a word */
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"yarn\", "
                                "\"factor\": 4, \"original_max_position_embeddings\": 0}}", "original_max_position_embeddings", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{" BASE ", \"num_attention_heads\": 4.5}", "num_attention_heads", e)) < 0 ||
        (rc = stest_parse_fails(&llama_ops, "{\"vocab_size\": -5, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                "\"intermediate_size\": 128, \"max_position_embeddings\": 256}", "vocab_size", e)) < 0)
        return rc;
    return 0;
}
