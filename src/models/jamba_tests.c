/*
 * jamba self-test: what the Jamba family makes of its config and checkpoint, and its routing.
 *  - Config: an empty config is JambaConfig's defaults: 32 layers, attention on il % 8 == 4
 *    (no rope), Mamba elsewhere (d_inner 8192, dt rank "auto" = 256, state 16, conv 4), experts
 *    (16, top 2, softmax over all, not renormalized) on odd layers, dense SwiGLU on the others;
 *    num_experts 1 makes every FFN dense; a stated layers_block_type must match; rejections
 *    name the field (offsets past their period, a window, mamba_inner_layernorms false, another
 *    activation, state sizes out of range).
 *  - Routing: the chosen weights are softmax over all experts.
 *  - Weights: a missing A_log, conv1d, dt/B/C norm, router, expert or attention tensor is named;
 *    a state size or layer pattern that disagrees with the checkpoint fails naming the tensor;
 *    mlx-lm's layout from `mlxcel convert` (stacked switch_mlp, conv1d [d_inner, d_conv, 1])
 *    binds byte-identical experts and every tensor.
 *  - Forward: the dt/B/C norms and num_experts_per_tok reach the logits.
 */
#include "selftest.h"

extern const struct model_ops jamba_ops;
int jamba_ops_self_test(struct err *e);

#define SMALL "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 4, " \
              "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_experts\": 4, " \
              "\"attn_layer_period\": 2, \"attn_layer_offset\": 1"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&jamba_ops, "{}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_layer == 32 && hp.n_embd == 4096 && hp.n_head == 32 && hp.n_kv_head == 8 &&
                              hp.head_dim == 128 && hp.n_ff == 14336 && hp.n_ctx == 262144 &&
                              !hp.tie_embd && hp.n_expert == 16 && hp.ssm.d_inner == 8192 &&
                              hp.ssm.dt_rank == 256 && hp.ssm.d_state == 16 && hp.ssm.d_conv == 4 &&
                              hp.ssm.conv_bias && !hp.ssm.proj_bias && hp.norm_eps == 1e-6f,
                          "JambaConfig's defaults", e)) < 0)
        return rc;
    for (int il = 0; il < 32 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        bool attn = il % 8 == 4, moe = il % 2 == 1;
        rc = stest_check(ls->n_rot == 0 && (attn ? ls->mixer == MIXER_ATTENTION && ls->kv == KV_FULL
                                                 : ls->mixer == MIXER_MAMBA && ls->kv == KV_RECURRENT &&
                                                       ls->state_rec == 8192 * 16 &&
                                                       ls->state_conv == 3 * 8192) &&
                             ls->moe == moe && ls->ffn == FFN_GLU && ls->n_ff == 14336 &&
                             (!moe || (ls->router == ROUTER_SOFTMAX_TOPK_RAW && ls->n_expert_used == 2)),
                         "attention every 8th layer from 4, experts on odd layers, no rope", e);
    }
    if (rc < 0 ||
        (rc = stest_parse(&jamba_ops, "{\"num_key_value_heads\": null, \"num_experts\": 1, " SMALL ", "
                          "\"mamba_dt_rank\": 5, \"layers_block_type\": [\"mamba\", \"attention\", "
                          "\"mamba\", \"attention\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.n_expert == 0 && !hp.layer[1].moe && !hp.layer[3].moe && hp.n_kv_head == 4 &&
                              hp.ssm.dt_rank == 5 && hp.layer[1].mixer == MIXER_ATTENTION &&
                              hp.layer[2].mixer == MIXER_MAMBA,
                          "one expert is the dense MLP; a matching layers_block_type", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{\"attn_layer_offset\": 2, " SMALL "}", "attn_layer_offset"},
        {"{\"attn_layer_period\": 0, " SMALL "}", "attn_layer_period"},
        {"{\"expert_layer_offset\": 2, " SMALL "}", "expert_layer_offset"},
        {"{\"expert_layer_offset\": -1, " SMALL "}", "expert_layer_offset"},
        {"{\"sliding_window\": 4096, " SMALL "}", "sliding_window"},
        {"{\"mamba_inner_layernorms\": false, " SMALL "}", "mamba_inner_layernorms"},
        {"{\"hidden_act\": \"gelu\", " SMALL "}", "hidden_act"},
        {"{\"mamba_d_state\": 0, " SMALL "}", "mamba_d_state"},
        {"{\"mamba_d_conv\": 0, " SMALL "}", "mamba_d_conv"},
        {"{\"mamba_dt_rank\": \"x\", " SMALL "}", "mamba_dt_rank"},
        {"{\"mamba_expand\": 0, " SMALL "}", "mamba_expand"},
        {"{\"num_experts_per_tok\": 5, " SMALL "}", "num_experts_per_tok"},
        {"{\"num_experts\": 0, " SMALL "}", "num_experts"},
        {"{\"num_attention_heads\": 0, " SMALL "}", "num_attention_heads"},
        {"{\"layers_block_type\": [\"mamba\", \"attention\", \"mamba\"], " SMALL "}", "layers_block_type"},
        {"{\"layers_block_type\": [\"attention\", \"mamba\", \"mamba\", \"attention\"], " SMALL "}",
         "layers_block_type"},
        {"{\"layers_block_type\": \"mamba\", " SMALL "}", "layers_block_type"},
    };
    return stest_parse_fails_all(&jamba_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {"model.layers.0.mamba.A_log",
                                           "model.layers.2.mamba.conv1d.weight",
                                           "model.layers.0.mamba.dt_layernorm.weight",
                                           "model.layers.2.mamba.b_layernorm.weight",
                                           "model.layers.0.mamba.c_layernorm.weight",
                                           "model.layers.2.mamba.D",
                                           "model.layers.1.feed_forward.router.weight",
                                           "model.layers.3.feed_forward.experts.2.up_proj.weight",
                                           "model.layers.1.self_attn.k_proj.weight",
                                           "model.layers.0.feed_forward.gate_proj.weight",
                                           "model.layers.2.pre_ff_layernorm.weight", NULL};
    int rc;
    if ((rc = stest_missing_named("jamba", required, e)) < 0 ||
        (rc = stest_load_fails("jamba", "{\"mamba_d_state\": 8}", NULL, "A_log", e)) < 0 ||
        (rc = stest_load_fails("jamba", "{\"attn_layer_offset\": 0}", NULL, "self_attn", e)) < 0 ||
        (rc = stest_load_fails("jamba", "{\"expert_layer_offset\": 0}", NULL, "feed_forward", e)) < 0)
        return rc;
    return stest_stacked_agrees("jamba", "model.layers.1.feed_forward.switch_mlp.gate_proj.weight", e);
}

static void drop_bcdt_norms(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        m->layers[il].ssm_dt_norm.ndim = 0;
        m->layers[il].ssm_b_norm.ndim = 0;
        m->layers[il].ssm_c_norm.ndim = 0;
    }
}

static int forward(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, "jamba", NULL, NULL, e)) == 0)
        rc = stest_edit_changes_logits(m, drop_bcdt_norms, "the dt / B / C norms", e);
    model_free(m);
    if (rc < 0)
        return rc;
    return stest_patch_changes_logits("jamba", "{\"num_experts_per_tok\": 1}", e);
}

int jamba_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = stest_parse(&jamba_ops, "{\"num_experts\": 8, " SMALL "}", &hp, e)) < 0 ||
        (rc = stest_route_softmax_top2(&hp, false, e)) < 0 || (rc = weights(e)) < 0)
        return rc;
    return forward(e);
}
