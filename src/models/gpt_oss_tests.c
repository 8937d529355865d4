/*
 * gpt_oss self-test: what the gpt-oss family makes of its config and
 * checkpoint, and that each of its mechanisms reaches the forward.
 *  - Config: transformers' resolution of absent fields: rope_scaling absent or null is
 *    GptOssConfig's yarn (factor max_position_embeddings / 4096, beta 32 / 1, no truncation,
 *    attention factor 0.1 ln(factor) + 1), never plain rope; layer_types absent alternates
 *    sliding (even layers, window sliding_window, 128 by default) and full; attention_bias
 *    defaults to true; sinks, the biased top-k-then-softmax router and the clamped SwiGLU
 *    (swiglu_limit, swiglu_alpha) on every layer; rejections name the field.
 *  - Rope: the golden checkpoint's yarn tables equal transformers' inv_freq and
 *    attention_scaling (golden.json).
 *  - Routing: top-k of the logits with the softmax over the chosen k only.
 *  - Weights: transformers' [E, H, 2I] gate_up_proj (x @ W) is bound transposed, row j of
 *    expert x holding stored column j; missing sinks / router bias / expert biases are named,
 *    in both layouts.
 *  - Forward: sinks, the sliding window, the clamp, the router bias and the rope scaling each
 *    change the golden checkpoint's logits.
 */
#include <math.h>
#include <string.h>

#include "../core/safetensors.h"
#include "blocks.h"
#include "selftest.h"

extern const struct model_ops gpt_oss_ops;
int gpt_oss_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
             "\"num_key_value_heads\": 2, \"head_dim\": 16, \"intermediate_size\": 96, " \
             "\"num_local_experts\": 4, \"num_experts_per_tok\": 2"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* everything optional left out: GptOssConfig's defaults */
    if ((rc = stest_parse(&gpt_oss_ops, "{" BASE "}", &hp, e)) < 0)
        return rc;
    double mscale = 0.1 * log(32.0) + 1.0;
    if ((rc = stest_check(hp.rope == ROPE_YARN && hp.rope_factor == 32.0f && hp.rope_orig_ctx == 4096 &&
                              hp.n_ctx == 131072 && !hp.rope_truncate && hp.rope_beta_fast == 32.0f &&
                              hp.rope_beta_slow == 1.0f && stest_near(hp.rope_attn_factor, mscale, 1e-6) &&
                              hp.rope_theta == 150000.0f,
                          "no rope_scaling: transformers' default yarn x32 over 4096", e)) < 0)
        return rc;
    for (int il = 0; il < 4 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        bool sliding = il % 2 == 0;
        rc = stest_check(ls->kv == (sliding ? KV_SLIDING : KV_FULL) && ls->window == (sliding ? 128 : 0) &&
                             ls->sinks && ls->moe && ls->ffn == FFN_GLU_CLAMPED && ls->glu_limit == 7.0f &&
                             ls->glu_alpha == 1.702f && ls->router == ROUTER_TOPK_SOFTMAX &&
                             ls->n_expert_used == 2 && ls->rope == ROPE_YARN && ls->n_rot == 16,
                         "layer_types absent: even layers slide (window 128); sinks, clamped GLU, router", e);
    }
    if (rc < 0 || (rc = stest_check(hp.qkv_bias && hp.out_bias && hp.router_bias && !hp.tie_embd,
                                    "attention_bias defaults to true; router bias; untied head", e)) < 0)
        return rc;
    /* null is absent too, and the factor follows the context over the stated original */
    if ((rc = stest_parse(&gpt_oss_ops, "{" BASE ", \"rope_scaling\": null, \"max_position_embeddings\": 8192}",
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.rope == ROPE_YARN && hp.rope_factor == 2.0f && hp.rope_orig_ctx == 4096,
                          "rope_scaling null: default yarn, factor 8192 / 4096", e)) < 0)
        return rc;
    /* stated values */
    if ((rc = stest_parse(&gpt_oss_ops, "{" BASE ", \"rope_scaling\": {\"rope_type\": \"default\"}, "
                          "\"sliding_window\": 5, \"swiglu_limit\": 3.5, \"swiglu_alpha\": 2.0, "
                          "\"attention_bias\": false, \"layer_types\": [\"full_attention\", \"sliding_attention\", "
                          "\"sliding_attention\", \"full_attention\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope == ROPE_DEFAULT && hp.layer[0].kv == KV_FULL && hp.layer[1].window == 5 &&
                              hp.layer[2].kv == KV_SLIDING && hp.layer[3].kv == KV_FULL &&
                              hp.layer[2].glu_limit == 3.5f && hp.layer[2].glu_alpha == 2.0f && !hp.qkv_bias &&
                              !hp.out_bias,
                          "stated rope type, layer_types, window, swiglu and attention_bias", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"swiglu_limit\": 0}", "swiglu_limit"},
        {"{" BASE ", \"swiglu_limit\": \"7\"}", "swiglu_limit"},
        {"{\"num_experts_per_tok\": 5, " BASE "}", "num_experts_per_tok"},
        {"{\"num_local_experts\": 0, " BASE "}", "num_local_experts"},
        {"{" BASE ", \"layer_types\": [\"full_attention\"]}", "layer_types"},
        {"{" BASE ", \"sliding_window\": -1}", "sliding_window"},
        {"{" BASE ", \"rope_scaling\": {\"rope_type\": \"ntk-by-parts\"}}", "ntk-by-parts"},
    };
    return stest_parse_fails_all(&gpt_oss_ops, bad, sizeof bad / sizeof bad[0], e);
}

/* golden.json's model.rotary_emb (transformers, float64) */
static int rope_tables(const struct model *m, struct err *e)
{
    static const double inv_ref[8] = {1.0, 0.11690013855695724, 0.012703318148851395, 0.0028635566122829914,
                                      0.0006454972317442298, 0.00014550669584423304, 3.2799827749840915e-05,
                                      7.3936716944444925e-06};
    float inv[HP_MAX_ROT_HALF], inv_long[HP_MAX_ROT_HALF];
    blk_rope_freqs(&m->hp, &m->hp.layer[0], inv, inv_long);
    bool ok = stest_near(m->hp.rope_attn_factor, 1.138629436111989, 1e-6);
    for (int j = 0; j < 8; j++)
        ok = ok && fabs(inv[j] - inv_ref[j]) <= 1e-6 * inv_ref[j];
    return stest_check(ok, "yarn (factor 4, original 64, truncate false) tables equal transformers'", e);
}

static int routing(struct err *e)
{
    struct hparams hp;
    int rc = stest_parse(&gpt_oss_ops, "{" BASE "}", &hp, e);
    if (rc < 0)
        return rc;
    /* top 2 of the logits (1 and 3), softmax over those two only */
    float logits[4] = {0.5f, 2.0f, -1.0f, 1.25f};
    int32_t sel[2];
    float w[2];
    if ((rc = stest_route(&hp, logits, sel, w, e)) < 0)
        return rc;
    double w0 = 1.0 / (1.0 + exp(1.25 - 2.0));
    return stest_check(sel[0] == 1 && sel[1] == 3 && stest_near(w[0], w0, 1e-6) && stest_near(w[1], 1.0 - w0, 1e-6),
                       "top-2 of the logits, softmax over the two", e);
}

static float bf16_at(const void *p, size_t i)
{
    return bf16_to_f32(((const uint16_t *)p)[i]);
}

/* expert x's bound gate_up row j, column c is the stored [x][c][j] (x @ W layout) */
static int transposed_binding(const struct model *m, struct err *e)
{
    const struct st_tensor *st = st_set_find(m->st, "model.layers.1.mlp.experts.gate_up_proj");
    const struct st_tensor *sd = st_set_find(m->st, "model.layers.1.mlp.experts.down_proj");
    const struct experts *ex = &m->layers[1].ex;
    int H = m->hp.n_embd, I2 = 2 * m->hp.n_ff, I = m->hp.n_ff;
    if (!st || !sd || !ex->gate_up.w || st->dtype != DTYPE_BF16)
        return stest_check(false, "gate_up_proj present (bf16) and bound", e);
    bool ok = ex->gate_up.w[0].shape[0] == I2 && ex->gate_up.w[0].shape[1] == H &&
              ex->down.w[0].shape[0] == H && ex->down.w[0].shape[1] == I;
    for (int x = 0; ok && x < m->hp.n_expert; x++)
        for (int j = 0; j < I2; j += 7)
            for (int c = 0; c < H; c += 5) {
                float got = bf16_at(ex->gate_up.w[x].data, (size_t)j * H + c);
                float want = bf16_at(st->data, ((size_t)x * H + c) * I2 + j);
                ok = ok && got == want;
                if (j < H && c < I) {
                    got = bf16_at(ex->down.w[x].data, (size_t)j * I + c);
                    want = bf16_at(sd->data, ((size_t)x * I + c) * H + j);
                    ok = ok && got == want;
                }
            }
    return stest_check(ok, "transformers' experts bound transposed ([E, 2I, H] rows, [E, H, I])", e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.self_attn.sinks", "model.layers.1.mlp.router.bias",
                                           "model.layers.0.mlp.experts.gate_up_proj_bias",
                                           "model.layers.1.mlp.experts.down_proj",
                                           "model.layers.0.self_attn.o_proj.bias", NULL};
    static const char *const required_mlx[] = {"model.layers.0.mlp.experts.gate_proj.bias",
                                               "model.layers.1.mlp.experts.down_proj.scales",
                                               "model.layers.0.mlp.router.scales", NULL};
    int rc;
    if ((rc = stest_missing_named("gpt_oss", required, e)) < 0)
        return rc;
    return stest_missing_named("gpt_oss_mlx", required_mlx, e);
}

static void no_sinks(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].sinks = false;
}

static void all_full(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].kv = KV_FULL;
}

static void no_clamp(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].glu_limit = INFINITY;
}

static void no_router_bias(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->layers[il].router_b.ndim = 0;
}

static int forward_reads_everything(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gpt_oss", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = rope_tables(m, e)) < 0 || (rc = transposed_binding(m, e)) < 0 ||
        (rc = stest_edit_changes_logits(m, no_sinks, "attention sinks", e)) < 0 ||
        (rc = stest_edit_changes_logits(m, all_full, "the sliding window", e)) < 0 ||
        (rc = stest_edit_changes_logits(m, no_clamp, "the swiglu clamp", e)) < 0 ||
        (rc = stest_edit_changes_logits(m, no_router_bias, "the router bias", e)) < 0) {
        model_free(m);
        return rc;
    }
    model_free(m);
    /* transformers' default yarn when rope_scaling is null is not the stated one */
    if ((rc = stest_patch_changes_logits("gpt_oss", "{\"rope_scaling\": null}", e)) < 0 ||
        (rc = stest_patch_changes_logits("gpt_oss", "{\"swiglu_alpha\": 1.0}", e)) < 0)
        return rc;
    return 0;
}

int gpt_oss_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = routing(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = forward_reads_everything(e)) < 0)
        return rc;
    return 0;
}
