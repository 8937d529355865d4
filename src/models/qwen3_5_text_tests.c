/*
 * qwen3_5_text self-test: Qwen3.5's text model on Qwen3-Next's parser (qwen3_next_tests.c
 * covers the shared rules: layer patterns, state sizes, rejections).
 *  - Config: dense SwiGLU of intermediate_size on every layer (the MoE fields of
 *    Qwen3-Next are not Qwen3_5TextConfig's: present, they change nothing), the
 *    DeltaNet / gated attention pattern and defaults; mrope's rope_parameters read as rope.
 *  - Weights: each of the four plain input projections, A_log and conv1d is named when
 *    missing; sizes the checkpoint does not have name the tensor.
 *  - Forward: the output gate and the DeltaNet's gated norm reach the logits.
 */
#include "selftest.h"

extern const struct model_ops qwen3_5_text_ops;
int qwen3_5_text_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, " \
             "\"max_position_embeddings\": 256"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&qwen3_5_text_ops, "{" BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 2, "
                          "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e7, "
                          "\"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}}", &hp, e)) < 0)
        return rc;
    for (int il = 0; il < 4 && rc == 0; il++) {
        const struct layer_spec *ls = &hp.layer[il];
        bool full = il == 3;
        rc = stest_check(!ls->moe && ls->ffn == FFN_GLU && ls->n_ff == 128 && ls->attn_gate == full &&
                             (ls->mixer == MIXER_DELTANET) == !full && ls->n_rot == 64 &&
                             ls->rope_theta == 1e7f,
                         "dense GLU everywhere, DeltaNet on layers 0-2, mrope read as rope", e);
    }
    if (rc < 0)
        return rc;
    return stest_parse_fails(&qwen3_5_text_ops, "{" BASE ", \"layer_types\": [\"linear_attention\"]}",
                             "layer_types", e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {
        "model.layers.0.linear_attn.in_proj_qkv.weight", "model.layers.1.linear_attn.in_proj_z.weight",
        "model.layers.3.linear_attn.in_proj_b.weight", "model.layers.0.linear_attn.in_proj_a.weight",
        "model.layers.0.linear_attn.A_log", "model.layers.1.linear_attn.conv1d.weight",
        "model.layers.2.self_attn.q_proj.weight", "model.layers.2.mlp.up_proj.weight", NULL};
    int rc;
    if ((rc = stest_missing_named("qwen3_5_text", required, e)) < 0)
        return rc;
    return stest_load_fails("qwen3_5_text", "{\"linear_num_key_heads\": 1}", NULL, "in_proj_qkv", e);
}

static void no_gate(struct model *m)
{
    m->hp.layer[2].attn_gate = false;
}

static void no_gated_norm(struct model *m)
{
    m->hp.ssm.norm_eps = 10.0f;  /* the gated norm's epsilon swamps its input */
}

int qwen3_5_text_ops_self_test(struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = stest_load_variant(&m, "qwen3_5_text", NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_edit_changes_logits(m, no_gate, "the attention output gate", e)) == 0)
        rc = stest_edit_changes_logits(m, no_gated_norm, "the DeltaNet's gated norm epsilon", e);
    model_free(m);
    return rc;
}
