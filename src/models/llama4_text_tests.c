/*
 * llama4_text self-test: what the Llama 4 text family makes of its config and checkpoint.
 *  - Config: Llama4TextConfig's defaults (16 experts top-1 on every layer, head_dim 128, 8 kv
 *    heads, rope_theta 5e5 on interleaved pairs, a NoPE layer every 4th, chunked attention of
 *    8192 on the RoPE layers and full on the NoPE ones, L2 q/k norm on the RoPE layers,
 *    temperature tuning (floor 8192, scale 0.1) on the NoPE ones, dense layers of
 *    intermediate_size_mlp 16384); explicit no_rope_layers, moe_layers /
 *    interleave_moe_layer_step, layer_types and attention_chunk_size; every rejection names
 *    the field.
 *  - Weights: the golden checkpoint (transformers' fused, transposed experts) is consumed
 *    entirely, its L2 norms weightless ones; a missing router, shared expert or expert tensor
 *    is named.
 *  - Forward: the chunk mask, the temperature, the weighted expert inputs and the L2 norm each
 *    change the golden prompt's logits.
 */
#include "selftest.h"

extern const struct model_ops llama4_text_ops;
int llama4_text_ops_self_test(struct err *e);

#define HEAD "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 64, \"max_position_embeddings\": 256, \"head_dim\": 16, " \
             "\"num_key_value_heads\": 2"
#define BASE HEAD ", \"num_local_experts\": 4"

static int config_defaults(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&llama4_text_ops, "{\"vocab_size\": 384, \"hidden_size\": 64, "
                          "\"num_hidden_layers\": 4, \"num_attention_heads\": 8, \"intermediate_size\": 64, "
                          "\"max_position_embeddings\": 256}", &hp, e)) < 0)
        return rc;
    bool ok = hp.n_expert == 16 && hp.n_expert_used == 1 && hp.head_dim == 128 && hp.n_kv_head == 8 &&
              hp.rope_theta == 5e5f && hp.n_ff == 16384 && hp.norm_eps == 1e-5f;
    for (int il = 0; il < 4; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        bool rope = il != 3;
        ok = ok && ls->moe && ls->router == ROUTER_TOPK_SIGMOID && ls->moe_weight_input &&
             ls->n_ff == 64 && ls->n_ff_shexp == 64 && ls->shexp_plain &&
             ls->rope_style == ROPE_STYLE_PAIRS && ls->n_rot == (rope ? 128 : 0) &&
             ls->qk_norm == rope && ls->qk_norm_post_rope &&
             ls->kv == (rope ? KV_SLIDING : KV_FULL) && ls->chunk == (rope ? 8192 : 0) &&
             ls->window == (rope ? 8192 : 0) && ls->attn_temp_floor == (rope ? 0 : 8192) &&
             ls->attn_temp_scale == 0.1f;
    }
    return stest_check(ok, "Llama4TextConfig defaults: NoPE every 4th, chunked RoPE layers, all MoE", e);
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = config_defaults(e)) < 0 ||
        (rc = stest_parse(&llama4_text_ops, "{" BASE ", \"interleave_moe_layer_step\": 2, "
                          "\"no_rope_layers\": [1, 0, 1, 1], \"attention_chunk_size\": 16, "
                          "\"attn_temperature_tuning\": false, \"use_qk_norm\": false, "
                          "\"intermediate_size_mlp\": 128, \"layer_types\": [\"full_attention\", "
                          "\"chunked_attention\", \"chunked_attention\", \"full_attention\"]}", &hp, e)) < 0)
        return rc;
    bool ok = !hp.layer[0].moe && hp.layer[0].n_ff == 128 && hp.layer[1].moe && !hp.layer[2].moe &&
              hp.layer[3].moe && hp.layer[1].n_rot == 0 && hp.layer[2].n_rot == 16 &&
              hp.layer[0].kv == KV_FULL && hp.layer[1].kv == KV_SLIDING && hp.layer[1].chunk == 16 &&
              hp.layer[1].attn_temp_floor == 0 && !hp.layer[2].qk_norm && hp.n_ff == 128;
    if ((rc = stest_check(ok, "interleave step 2, explicit no_rope_layers and layer_types", e)) < 0 ||
        (rc = stest_parse(&llama4_text_ops, "{" BASE ", \"moe_layers\": [2], \"floor_scale\": 4, "
                          "\"attn_scale\": 0.5}", &hp, e)) < 0 ||
        (rc = stest_check(!hp.layer[1].moe && hp.layer[2].moe && hp.layer[3].attn_temp_floor == 4 &&
                              hp.layer[3].attn_temp_scale == 0.5f,
                          "moe_layers [2]; floor_scale and attn_scale", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{" BASE ", \"no_rope_layers\": [1, 1, 0]}", "no_rope_layers"},
        {"{" BASE ", \"no_rope_layers\": [1, 2, 1, 0]}", "no_rope_layers"},
        {"{" BASE ", \"no_rope_layer_interval\": 0}", "no_rope_layer_interval"},
        {"{" BASE ", \"moe_layers\": [4]}", "moe_layers"},
        {"{" BASE ", \"interleave_moe_layer_step\": 0}", "interleave_moe_layer_step"},
        {"{" BASE ", \"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\", "
         "\"full_attention\"]}", "layer_types"},
        {"{" BASE ", \"attention_chunk_size\": null}", "attention_chunk_size"},
        {"{" BASE ", \"attention_chunk_size\": -1}", "attention_chunk_size"},
        {"{" BASE ", \"floor_scale\": 0}", "floor_scale"},
        {"{" HEAD ", \"num_local_experts\": 4, \"num_experts_per_tok\": 5}", "num_experts_per_tok"},
        {"{" BASE ", \"intermediate_size_mlp\": 0}", "intermediate_size_mlp"},
    };
    return stest_parse_fails_all(&llama4_text_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.1.feed_forward.router.weight",
                                           "model.layers.3.feed_forward.shared_expert.up_proj.weight",
                                           "model.layers.1.feed_forward.experts.gate_up_proj",
                                           "model.layers.3.feed_forward.experts.down_proj",
                                           "model.layers.2.feed_forward.gate_proj.weight", NULL};
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "llama4_text", NULL, NULL, e)) < 0)
        return rc;
    const struct layer *L = &m->layers[1];
    bool ok = st_set_n_unused(m->st) == 0 && L->ex.gate.w[0].shape[0] == 64 &&
              L->ex.gate.w[0].shape[1] == 64 && L->ex.down.w[3].shape[0] == 64 &&
              L->q_norm.dtype == DTYPE_F32 && ((const float *)L->q_norm.data)[5] == 1.0f &&
              !tensor_is_present(&m->layers[3].q_norm);
    rc = stest_check(ok, "every tensor bound; experts transposed; weightless L2 norms", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named("llama4_text", required, e);
}

static void no_chunk(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer_spec *ls = &m->hp.layer[il];
        if (ls->chunk > 0) {
            ls->kv = KV_FULL;
            ls->window = ls->chunk = 0;
        }
    }
}

static void no_temperature(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].attn_temp_floor = 0;
}

static void output_weighted(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].moe_weight_input = false;
}

static void no_l2(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++)
        m->hp.layer[il].qk_norm = false;
}

static int forward_reads(struct err *e)
{
    static void (*const edits[])(struct model *) = {no_chunk, no_temperature, output_weighted, no_l2};
    static const char *const what[] = {"full attention instead of chunks of 8",
                                       "no attention temperature", "weights on the expert outputs",
                                       "no L2 q/k norm"};
    struct model *m = NULL;
    int rc = 0;
    for (size_t i = 0; i < sizeof edits / sizeof edits[0] && rc == 0; i++) {
        if ((rc = stest_load_variant(&m, "llama4_text", NULL, NULL, e)) < 0)
            return rc;
        rc = stest_edit_changes_logits(m, edits[i], what[i], e);
        model_free(m);
        m = NULL;
    }
    return rc;
}

int llama4_text_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = forward_reads(e)) < 0)
        return rc;
    return 0;
}
