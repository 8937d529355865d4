/*
 * seed_oss self-test: what the Seed-OSS family makes of its config and checkpoint.
 *  - Config: SeedOssConfig's defaults when a field is absent (head_dim 128,
 *    8 kv heads, q/k/v biases on, no o bias, rms_norm_eps 1e-6, theta 1e4,
 *    untied) and when it is null (head_dim = hidden / heads, kv heads = heads);
 *    attention_bias and attention_out_bias each reach their own projections;
 *    rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; the q/k/v biases are
 *    required and a missing one is named; attention_out_bias requires
 *    o_proj.bias.
 *  - Forward: dropping the q/k/v biases changes the logits.
 */
#include <math.h>

#include "selftest.h"

extern const struct model_ops seed_oss_ops;
int seed_oss_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 8, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&seed_oss_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 128 && hp.n_kv_head == 8 && hp.qkv_bias && !hp.out_bias &&
                              hp.norm_eps == 1e-6f && hp.rope_theta == 1e4f && !hp.tie_embd &&
                              hp.layer[1].n_rot == 128 && hp.layer[0].kv == KV_FULL &&
                              stest_near(hp.layer[0].attn_scale, 1.0 / sqrt(128.0), 1e-7),
                          "defaults: head_dim 128, 8 kv heads, q/k/v biases, no o bias, eps 1e-6", e)) < 0 ||
        (rc = stest_parse(&seed_oss_ops, CFG(", \"head_dim\": null, \"num_key_value_heads\": null, "
                                             "\"attention_bias\": null, \"rms_norm_eps\": null"), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 8 && hp.n_kv_head == 8 && hp.qkv_bias && hp.layer[0].n_rot == 8 &&
                              hp.norm_eps == 1e-6f, "null: head_dim = hidden / heads, kv heads = heads", e)) < 0 ||
        (rc = stest_parse(&seed_oss_ops, CFG(", \"head_dim\": 16, \"num_key_value_heads\": 2, "
                                             "\"attention_bias\": false, \"attention_out_bias\": true"), &hp, e)) < 0 ||
        (rc = stest_check(hp.head_dim == 16 && hp.n_kv_head == 2 && !hp.qkv_bias && hp.out_bias,
                          "stated head_dim, kv heads; o bias without q/k/v biases", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"mlp_bias\": true"), "mlp_bias"},
        {CFG(", \"attention_bias\": 1"), "attention_bias"},
        {CFG(", \"attention_out_bias\": \"yes\""), "attention_out_bias"},
        {CFG(", \"head_dim\": \"wide\""), "head_dim"},
        {CFG(", \"num_key_value_heads\": 3"), "num_key_value_heads"},
        {CFG(", \"hidden_act\": \"mish\""), "hidden_act"},
    };
    return stest_parse_fails_all(&seed_oss_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.self_attn.q_proj.bias",
                                           "model.layers.1.self_attn.k_proj.bias",
                                           "model.layers.1.self_attn.v_proj.bias", "lm_head.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "seed_oss", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && tensor_is_present(&m->layers[1].bq) &&
                         !tensor_is_present(&m->layers[0].bo) && m->lm_head.data != m->tok_embd.data,
                     "every tensor bound; q bias, no o bias; untied head", e);
    model_free(m);
    if (rc < 0 || (rc = stest_missing_named("seed_oss", required, e)) < 0)
        return rc;
    return stest_load_fails("seed_oss", "{\"attention_out_bias\": true}", NULL, "o_proj.bias", e);
}

static void no_qkv_bias(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        L->bq = L->bk = L->bv = (struct tensor){0};
    }
}

int seed_oss_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "seed_oss", NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, no_qkv_bias, "no q/k/v biases", e);
    model_free(m);
    return rc;
}
