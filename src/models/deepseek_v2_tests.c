/*
 * deepseek_v2 self-test: what the DeepSeek-V2 family makes of its config and checkpoint.
 *  - Config: every layer is a latent-attention layer (head_dim nope + rope, rotary dims the
 *    rope dims, interleaved pairs, scale (nope + rope)^-0.5, times yarn's mscale(factor,
 *    mscale_all_dim)^2 under yarn); q_lora_rank null means q_proj, absent its default 1536;
 *    first_k_dense_replace dense layers of intermediate_size, the others routed experts of
 *    moe_intermediate_size with n_shared_experts plain shared experts; greedy routing has no
 *    group limit, group_limited_greedy takes n_group / topk_group; rejections name the field.
 *  - Weights: the golden checkpoint is consumed entirely; missing MLA, router and shared
 *    expert tensors are named; kv_b_proj's rows land transposed per head in wk_lat and wv_lat.
 *  - Cache: a latent layer's cache row is kv_lora_rank + qk_rope_head_dim floats serving as K
 *    and V, 4x below full K/V on the golden shape (and model_kv_bytes_per_token says so).
 *  - Forward: routed_scaling_factor and group-limited routing change the logits.
 */
#include <math.h>
#include <stdlib.h>

#include "selftest.h"

extern const struct model_ops deepseek_v2_ops;
int deepseek_v2_ops_self_test(struct err *e);

/* HEAD lacks the keys the rejections vary (a repeated JSON key would not override) */
#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 160, \"max_position_embeddings\": 256, \"n_routed_experts\": 8, " \
             "\"moe_intermediate_size\": 32, \"qk_nope_head_dim\": 16, \"v_head_dim\": 16"
#define BASE HEAD ", \"num_experts_per_tok\": 2, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 8"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&deepseek_v2_ops, "{" BASE ", \"q_lora_rank\": null, \"first_k_dense_replace\": 1}",
                          &hp, e)) < 0)
        return rc;
    bool ok = hp.q_lora_rank == 0 && hp.head_dim == 24 && hp.n_kv_head == 4 && hp.n_rot == 8 &&
              stest_near(hp.attn_scale, 1.0 / sqrt(24.0), 1e-7) && !hp.layer[0].moe &&
              hp.layer[0].n_ff == 160 && hp.layer[1].moe && hp.layer[2].moe && hp.layer[1].n_ff == 32 &&
              hp.layer[1].n_ff_shexp == 64 && hp.layer[1].shexp_plain &&
              hp.layer[1].router == ROUTER_GROUP_SOFTMAX && hp.moe_n_group == 1 && !hp.moe_norm &&
              hp.moe_scale == 1.0f && !hp.router_bias && hp.n_ff == 160;
    for (int il = 0; il < 3; il++)
        ok = ok && hp.layer[il].kv == KV_LATENT && hp.layer[il].rope_style == ROPE_STYLE_PAIRS;
    if ((rc = stest_check(ok, "latent layers, defaults, dense then MoE layers with 2 shared experts", e)) < 0)
        return rc;
    /* absent q_lora_rank: its default; group-limited routing; yarn's mscale in the scale */
    if ((rc = stest_parse(&deepseek_v2_ops, "{" BASE ", \"topk_method\": \"group_limited_greedy\", "
                          "\"n_group\": 4, \"topk_group\": 2, \"routed_scaling_factor\": 16, "
                          "\"n_shared_experts\": null, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, "
                          "\"mscale\": 0.707, \"mscale_all_dim\": 0.707, "
                          "\"original_max_position_embeddings\": 4096}}", &hp, e)) < 0)
        return rc;
    double ms = 0.1 * 0.707 * log(40.0) + 1.0;
    if ((rc = stest_check(hp.q_lora_rank == 1536 && hp.moe_n_group == 4 && hp.moe_topk_group == 2 &&
                              hp.moe_scale == 16.0f && hp.layer[0].moe && hp.layer[0].n_ff_shexp == 0 &&
                              hp.rope == ROPE_YARN && stest_near(hp.rope_attn_factor, 1.0, 1e-6) &&
                              stest_near(hp.attn_scale, ms * ms / sqrt(24.0), 1e-6),
                          "q_lora_rank default, group-limited routing, yarn softmax scale", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"topk_method\": \"noaux_tc\"}", "topk_method"},
        {"{" BASE ", \"attention_bias\": true}", "attention_bias"},
        {"{" HEAD ", \"num_experts_per_tok\": 2, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 7}",
         "qk_rope_head_dim"},
        {"{" HEAD ", \"num_experts_per_tok\": 2, \"kv_lora_rank\": 0, \"qk_rope_head_dim\": 8}",
         "kv_lora_rank"},
        {"{" BASE ", \"first_k_dense_replace\": -1}", "first_k_dense_replace"},
        {"{" HEAD ", \"num_experts_per_tok\": 9, \"kv_lora_rank\": 32, \"qk_rope_head_dim\": 8}",
         "num_experts_per_tok"},
        {"{" BASE ", \"topk_method\": \"group_limited_greedy\", \"n_group\": 3, \"topk_group\": 1}", "n_group"},
        {"{" BASE ", \"topk_method\": \"group_limited_greedy\", \"n_group\": 4, \"topk_group\": 5}", "topk_group"},
        {"{" BASE ", \"topk_method\": \"group_limited_greedy\", \"n_group\": 8, \"topk_group\": 1}",
         "num_experts_per_tok"},
        {"{" BASE ", \"sliding_window\": 8, \"use_sliding_window\": true}", "sliding"},
    };
    return stest_parse_fails_all(&deepseek_v2_ops, bad, sizeof bad / sizeof bad[0], e);
}

/* kv_b_proj row j of head h, element i, as f32 */
static float kvb_at(const struct model *m, int h, int j, int i)
{
    const struct hparams *hp = &m->hp;
    const struct st_tensor *t = NULL;
    for (size_t k = 0; k < st_set_count(m->st); k++)
        if (strcmp(st_set_at(m->st, k)->name, "model.layers.1.self_attn.kv_b_proj.weight") == 0)
            t = st_set_at(m->st, k);
    if (!t)
        return NAN;
    const uint16_t *d = t->data;
    return bf16_to_f32(d[((size_t)h * (hp->qk_nope_dim + hp->v_head_dim) + j) * hp->kv_lora_rank + i]);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.self_attn.kv_b_proj.weight",
                                           "model.layers.1.self_attn.kv_a_layernorm.weight",
                                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                                           "model.layers.0.self_attn.q_proj.weight",
                                           "model.layers.1.mlp.shared_experts.up_proj.weight",
                                           "model.layers.1.mlp.experts.7.down_proj.weight",
                                           "model.layers.1.mlp.gate.weight",
                                           "model.layers.0.mlp.gate_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "deepseek_v2", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    const float *wk = L->wk_lat.data, *wv = L->wv_lat.data;
    int r = m->hp.kv_lora_rank, lr = r + m->hp.qk_rope_dim, nope = m->hp.qk_nope_dim;
    /* head 2: k row 5, latent 7 -> wk_lat[2][7][5]; v row 3, latent 9 -> wv_lat[2][3][9];
     * the rope columns of wv_lat are zero */
    bool ok = st_set_n_unused(m->st) == 0 && L->mla_heads && !tensor_is_present(&L->wq_a) &&
              wk[((size_t)2 * r + 7) * nope + 5] == kvb_at(m, 2, 5, 7) &&
              wv[((size_t)2 * m->hp.v_head_dim + 3) * lr + 9] == kvb_at(m, 2, nope + 3, 9) &&
              wv[((size_t)2 * m->hp.v_head_dim + 3) * lr + r] == 0.0f &&
              L->mla_heads[4 * 2].shape[0] == nope && L->mla_heads[4 * 2 + 1].shape[0] == m->hp.qk_rope_dim;
    rc = stest_check(ok, "every tensor bound; kv_b_proj split per head", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("deepseek_v2", required, e);
}

static int latent_cache(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "deepseek_v2", NULL, NULL, e)) < 0)
        return rc;
    const struct hparams *hp = &m->hp;
    int *k_dim = calloc((size_t)hp->n_layer, sizeof *k_dim);
    bool *v_is_k = calloc((size_t)hp->n_layer, sizeof *v_is_k);
    if (!k_dim || !v_is_k)
        rc = err_setf(e, ERR_NOMEM, "out of memory");
    else if ((rc = stest_kv_rows(m, k_dim, v_is_k, e)) == 0) {
        int row = hp->kv_lora_rank + hp->qk_rope_dim;
        int full = hp->n_head * (hp->qk_nope_dim + hp->qk_rope_dim) + hp->n_head * hp->v_head_dim;
        bool ok = true;
        for (int il = 0; il < hp->n_layer; il++)
            ok = ok && k_dim[il] == row && v_is_k[il];
        rc = stest_check(ok && row == 40 && full == 160 &&
                             model_kv_bytes_per_token(m, DTYPE_F32) == (uint64_t)hp->n_layer * row * sizeof(float),
                         "one latent row of kv_lora_rank + rope per layer and token, 4x below K/V", e);
    }
    free(k_dim);
    free(v_is_k);
    model_free(m);
    return rc;
}

static int forward_reads(struct err *e)
{
    int rc;
    if ((rc = stest_patch_changes_logits("deepseek_v2", "{\"routed_scaling_factor\": 1.0}", e)) < 0)
        return rc;
    return stest_patch_changes_logits("deepseek_v2", "{\"topk_method\": \"group_limited_greedy\", "
                                      "\"n_group\": 4, \"topk_group\": 1}", e);
}

int deepseek_v2_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = latent_cache(e)) < 0 ||
        (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
