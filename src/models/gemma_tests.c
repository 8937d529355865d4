/*
 * gemma self-test: what the Gemma family makes of its config and checkpoint.
 *  - Config: GemmaConfig's defaults (head_dim 256, rms_norm_eps 1e-6, tied head,
 *    gelu_pytorch_tanh); an explicit head_dim sets every layer's rotary dims and
 *    attention scale 1/sqrt(head_dim); the embedding scale is sqrt(hidden_size)
 *    rounded to the checkpoint dtype; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely with a tied head; a
 *    missing tensor is named; untied, lm_head.weight is required.
 *  - Forward: the norm weight offset (x * (1 + w)) and the embedding scale reach
 *    the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops gemma_ops;
int gemma_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 3072, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    /* absent fields: GemmaConfig's defaults; bf16 rounds sqrt(3072) = 55.43 to 55.5 */
    if ((rc = stest_parse(&gemma_ops, CFG(", \"torch_dtype\": \"bfloat16\""), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 256 && hp.layer[1].n_rot == 256 &&
                              stest_near(hp.layer[0].attn_scale, 1.0 / 16.0, 1e-7) &&
                              hp.norm_eps == 1e-6f && hp.tie_embd && hp.layer[1].act == ACT_GELU_TANH &&
                              hp.layer[0].ffn == FFN_GLU && hp.embd_scale == 55.5f,
                          "GemmaConfig defaults; bf16-rounded embedding scale", e)) < 0)
        return rc;
    /* explicit head_dim in every layer; a float32 checkpoint scales by sqrt exactly */
    if ((rc = stest_parse(&gemma_ops, CFG(", \"head_dim\": 32, \"dtype\": \"float32\", "
                                          "\"tie_word_embeddings\": false"), &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].n_rot == 32 && hp.layer[1].n_rot == 32 &&
                              stest_near(hp.layer[1].attn_scale, 1.0 / sqrt(32.0), 1e-7) &&
                              stest_near(hp.embd_scale, sqrt(3072.0), 1e-5) && !hp.tie_embd,
                          "head_dim 32 in every layer; f32 embedding scale; untied", e)) < 0)
        return rc;
    if ((rc = stest_parse(&gemma_ops, CFG(", \"torch_dtype\": \"float16\""), &hp, e)) < 0 ||
        (rc = stest_check(hp.embd_scale == 55.4375f, "f16-rounded embedding scale", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"hidden_act\": \"tanh\""), "hidden_act"},
        {CFG(", \"head_dim\": \"wide\""), "head_dim"},
        {CFG(", \"torch_dtype\": 16"), "torch_dtype"},
        {CFG(", \"head_dim\": 33"), "head_dim"},
    };
    return stest_parse_fails_all(&gemma_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.post_attention_layernorm.weight",
                                           "model.layers.0.self_attn.k_proj.weight",
                                           "model.norm.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->layers[0].wk.shape[0] == 32 &&
                         m->lm_head.data == m->tok_embd.data, "every tensor bound; MQA k_proj; tied head", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("gemma", required, e)) < 0)
        return rc;
    return stest_load_fails("gemma", "{\"tie_word_embeddings\": false}", NULL, "lm_head.weight", e);
}

static void no_norm_offset(struct model *m) { m->hp.norm_w_offset = 0.0f; }
static void no_embd_scale(struct model *m) { m->hp.embd_scale = 1.0f; }

/* The golden checkpoint's logits change without the 1 + w norm or the embedding scale. */
static int forward_reads(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "gemma", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, no_norm_offset, "norm weights without the 1 + w offset", e)) == 0)
        rc = stest_edit_changes_logits(m, no_embd_scale, "embeddings unscaled", e);
    model_free(m);
    return rc;
}

int gemma_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
