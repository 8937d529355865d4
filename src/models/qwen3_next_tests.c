/*
 * qwen3_next self-test: what the Qwen3-Next family makes of its config and checkpoint.
 *  - Config: Qwen3NextConfig's defaults when fields are absent (a full-attention layer every
 *    4th, linear_* 4 / 128 / 128 / 16 / 32, head_dim 256, partial rotary 0.25, renormalized
 *    top-k), the DeltaNet layers' state sizes from them, layer_types and
 *    full_attention_interval per layer, rope_parameters' partial_rotary_factor winning, the
 *    output gate on the full-attention layers only; every rejection names its field.
 *  - Weights: a missing A_log, conv1d, dt_bias, in_proj_qkvz or q_proj is named; a config
 *    whose DeltaNet sizes disagree with the checkpoint names the tensor; the stacked expert
 *    layout binds byte-identical experts.
 *  - Row permutation (the de-interleave at load) moves an MLX-quantized row's codes, scale
 *    and bias together.
 *  - mlx-lm's layout (conv1d [ch, K, 1], the zero-centred norms stored as 1 + w): the golden
 *    checkpoint rewritten so gives the same logits (the norms are not shifted twice).
 *  - Forward: the output gate, the DeltaNet layers' recurrence and their state reach the
 *    logits (edits of the loaded golden model change them).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/st_write.h"
#include "../loading/config.h"
#include "../loading/convert.h"
#include "qwen3_next.h"
#include "selftest.h"

extern const struct model_ops qwen3_next_ops;
int qwen3_next_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, " \
             "\"max_position_embeddings\": 256, \"num_experts\": 8, \"num_experts_per_tok\": 2, " \
             "\"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 48"
/* the fixture's DeltaNet shape */
#define LIN ", \"head_dim\": 16, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 16, " \
            "\"linear_value_head_dim\": 16, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4"

static int defaults(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&qwen3_next_ops, "{" BASE "}", &hp, e)) < 0)
        return rc;
    const struct layer_spec *l0 = &hp.layer[0], *l3 = &hp.layer[3];
    /* conv: 3 rows of 2 * 16 * 128 + 32 * 128 channels; state: 32 heads of 128 x 128 */
    if ((rc = stest_check(hp.ssm.d_conv == 4 && hp.ssm.k_head_dim == 128 && hp.ssm.head_dim == 128 &&
                              hp.ssm.n_group == 16 && hp.ssm.n_head == 32 && hp.head_dim == 256 &&
                              hp.n_rot == 64 && hp.ssm.norm_eps == 1e-6f,
                          "Qwen3NextConfig's defaults", e)) < 0 ||
        (rc = stest_check(l0->mixer == MIXER_DELTANET && l0->kv == KV_RECURRENT &&
                              hp.layer[2].mixer == MIXER_DELTANET && l0->state_conv == 3 * 8192 &&
                              l0->state_rec == 32 * 128 * 128 && !l0->attn_gate,
                          "layers 0-2 DeltaNet with their state sizes", e)) < 0 ||
        (rc = stest_check(l3->mixer == MIXER_ATTENTION && l3->kv == KV_FULL && l3->attn_gate &&
                              l3->qk_norm && l3->moe && l3->router == ROUTER_SOFTMAX_TOPK &&
                              l3->n_ff_shexp == 48 && hp.norm_w_offset == 0.0f,
                          "layer 3 gated full attention, renormalized MoE with a shared expert", e)) < 0)
        return rc;
    /* the scratch holds the DeltaNet's planes and the output gate */
    return stest_check(hp.rec_scratch >= 2 * 16 * 128 + 3 * 32 * 128 + 64 &&
                           hp.rec_scratch >= 4 * 256, "the recurrent scratch", e);
}

static int layer_patterns(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&qwen3_next_ops, "{" BASE LIN ", \"full_attention_interval\": 2}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].mixer == MIXER_DELTANET && hp.layer[1].attn_gate &&
                              hp.layer[2].mixer == MIXER_DELTANET && hp.layer[3].attn_gate,
                          "full_attention_interval 2: layers 1 and 3 attend", e)) < 0 ||
        (rc = stest_parse(&qwen3_next_ops, "{" BASE LIN ", \"full_attention_interval\": 2, \"layer_types\": "
                          "[\"full_attention\", \"linear_attention\", \"linear_attention\", "
                          "\"linear_attention\"]}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[0].attn_gate && hp.layer[0].kv == KV_FULL &&
                              hp.layer[1].mixer == MIXER_DELTANET && hp.layer[3].mixer == MIXER_DELTANET,
                          "layer_types wins over full_attention_interval", e)) < 0 ||
        (rc = stest_parse(&qwen3_next_ops, "{" BASE LIN ", \"partial_rotary_factor\": 0.25, "
                          "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5000, "
                          "\"partial_rotary_factor\": 0.5}, \"norm_topk_prob\": false}", &hp, e)) < 0 ||
        (rc = stest_check(hp.layer[3].n_rot == 8 && hp.layer[3].rope_theta == 5000.0f &&
                              hp.layer[3].router == ROUTER_SOFTMAX_TOPK_RAW,
                          "rope_parameters' partial_rotary_factor and rope_theta, norm_topk_prob "
                          "false", e)) < 0)
        return rc;
    return 0;
}

static int rejections(struct err *e)
{
    static const struct stest_bad bad[] = {
        {"{" BASE LIN ", \"layer_types\": [\"linear_attention\", \"full_attention\"]}", "layer_types"},
        {"{" BASE LIN ", \"layer_types\": [\"linear_attention\", \"full_attention\", \"sliding_attention\", "
         "\"full_attention\"]}", "layer_types"},
        {"{" BASE LIN ", \"layer_types\": \"full_attention\"}", "layer_types"},
        {"{" BASE LIN ", \"full_attention_interval\": 0}", "full_attention_interval"},
        {"{" BASE ", \"linear_num_key_heads\": 3, \"linear_num_value_heads\": 4}", "linear_num_value_heads"},
        {"{" BASE ", \"linear_num_key_heads\": 0}", "linear_num_key_heads"},
        {"{" BASE ", \"linear_conv_kernel_dim\": 0}", "linear_conv_kernel_dim"},
        {"{" BASE ", \"linear_key_head_dim\": 4096, \"linear_value_head_dim\": 4096}",
         "linear_num_value_heads x linear_key_head_dim"},
        {"{" BASE ", \"linear_value_head_dim\": 1.5}", "linear_value_head_dim"},
        {"{" BASE LIN ", \"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{" BASE LIN ", \"attention_bias\": true}", "attention_bias"},
        {"{" BASE LIN ", \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0}}",
         "partial_rotary_factor"},
        {"{\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"num_experts\": 8, "
         "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32}", "shared_expert_intermediate_size"},
    };
    return stest_parse_fails_all(&qwen3_next_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    static const char *const required[] = {
        "model.layers.0.linear_attn.A_log", "model.layers.1.linear_attn.conv1d.weight",
        "model.layers.3.linear_attn.dt_bias", "model.layers.0.linear_attn.in_proj_qkvz.weight",
        "model.layers.1.linear_attn.in_proj_ba.weight", "model.layers.0.linear_attn.norm.weight",
        "model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.q_norm.weight",
        "model.layers.0.mlp.shared_expert_gate.weight", NULL};
    int rc;
    if ((rc = stest_missing_named("qwen3_next", required, e)) < 0 ||
        /* state sizes the checkpoint does not have: the tensor that disagrees is named */
        (rc = stest_load_fails("qwen3_next", "{\"linear_conv_kernel_dim\": 3}", NULL, "conv1d", e)) < 0 ||
        (rc = stest_load_fails("qwen3_next", "{\"linear_num_value_heads\": 2}", NULL, "in_proj_qkvz", e)) < 0 ||
        (rc = stest_load_fails("qwen3_next", "{\"linear_value_head_dim\": 8}", NULL, "in_proj_qkvz", e)) < 0 ||
        (rc = stest_load_fails("qwen3_next", "{\"layer_types\": [\"linear_attention\", \"linear_attention\", "
                               "\"linear_attention\", \"linear_attention\"]}", NULL, "linear_attn", e)) < 0)
        return rc;
    return stest_stacked_agrees("qwen3_next", "model.layers.1.mlp.switch_mlp.gate_proj.weight", e);
}

/* edits of the loaded model that the logits must see */
static void no_gate(struct model *m)
{
    m->hp.layer[2].attn_gate = false;
}

static void no_decay(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        float *a = m->layers[il].ssm_a.data;
        if (m->hp.layer[il].mixer == MIXER_DELTANET)
            for (int h = 0; h < m->hp.ssm.n_head; h++)
                a[h] = -30.0f;  /* exp(g) = 1: no decay */
    }
}

static int forward(struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, "qwen3_next", NULL, NULL, e);
    if (rc == 0)
        rc = stest_check(st_set_n_unused(m->st) == 0, "every tensor of the golden checkpoint bound", e);
    if (rc == 0 && (rc = stest_edit_changes_logits(m, no_gate, "the attention output gate", e)) == 0)
        rc = stest_edit_changes_logits(m, no_decay, "the DeltaNet decay (A_log)", e);
    model_free(m);
    return rc;
}

// ---- the de-interleave ----

/* A 4-bit affine [5, 64] tensor (group 32) of distinct words, scales and biases, permuted. */
static int permute_quantized(struct err *e)
{
    uint32_t words[5 * 8];
    float sc[5 * 2], bi[5 * 2];
    int32_t perm[5] = {3, 0, 4, 1, 2};
    int64_t shape[2] = {5, 64};
    struct tensor t;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (int i = 0; i < 40; i++)
        words[i] = 1000u + (uint32_t)i;
    for (int i = 0; i < 10; i++) {
        sc[i] = (float)i;
        bi[i] = -(float)i;
    }
    tensor_init(&t, DTYPE_U32, words, 2, shape);
    t.shape[1] = 64;
    t.stride[0] = 8;
    t.qbits = 4;
    t.qgroup = 32;
    t.qmode = QMODE_AFFINE;
    t.qsdtype = DTYPE_F32;
    t.qscales = sc;
    t.qbiases = bi;
    int rc = qwen3_next_permute_rows(m, NULL, &t, perm, e);
    bool ok = rc == 0 && t.data != (void *)words;
    for (int r = 0; r < 5 && ok; r++) {
        const uint32_t *w = (const uint32_t *)t.data + r * 8;
        const float *s2 = (const float *)t.qscales + r * 2, *b2 = (const float *)t.qbiases + r * 2;
        ok = w[0] == 1000u + (uint32_t)(perm[r] * 8) && w[7] == 1000u + (uint32_t)(perm[r] * 8 + 7) &&
             s2[1] == (float)(perm[r] * 2 + 1) && b2[0] == -(float)(perm[r] * 2);
    }
    model_free(m);
    return rc < 0 ? rc : stest_check(ok, "row r of the permuted tensor is row perm[r]: codes, "
                                     "scales and biases", e);
}

// ---- mlx-lm's layout ----

/* A norm mlx-lm's sanitize stores as 1 + w (the attention's gated norm is not one). */
static bool is_centred_norm(const char *name)
{
    static const char *const sfx[] = {".input_layernorm.weight", ".post_attention_layernorm.weight",
                                      "model.norm.weight", ".q_norm.weight", ".k_norm.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (n >= strlen(sfx[i]) && strcmp(name + n - strlen(sfx[i]), sfx[i]) == 0)
            return true;
    return false;
}

/* src's tensors as mlx-lm's sanitize leaves them, into dst/model.safetensors: every conv1d
 * weight [ch, 1, K] as [ch, K, 1] (the same bytes), every centred norm as F32 1 + w; plus a
 * multi-token-prediction tensor (published checkpoints have them; the loader drops them). */
static int write_mlx_layout(const struct st_set *s, const char *dst, struct err *e)
{
    char path[600];
    size_t n = st_set_count(s);
    struct st_wentry *ents = calloc(n + 1, sizeof *ents);
    struct st_writer *w = NULL;
    float buf[256];
    int rc = 0;
    if (!ents)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        ents[i] = (struct st_wentry){t->name, t->dtype, t->ndim, {0}};
        memcpy(ents[i].shape, t->shape, sizeof t->shape);
        if (strstr(t->name, "conv1d.weight")) {
            ents[i].shape[1] = t->shape[2];
            ents[i].shape[2] = 1;
        } else if (is_centred_norm(t->name)) {
            ents[i].dtype = DTYPE_F32;
        }
    }
    ents[n] = (struct st_wentry){"mtp.norm.weight", DTYPE_F32, 1, {64}};
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if ((rc = st_writer_open(&w, path, ents, n + 1, e)) < 0)
        goto out;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        if (!is_centred_norm(t->name)) {
            rc = st_writer_write(w, t->data, (size_t)(t->end - t->begin), e);
        } else if (t->ndim != 1 || t->shape[0] > 256) {
            rc = err_setf(e, ERR_INTERNAL, "norm %s wider than the test's buffer", t->name);
        } else {
            dtype_to_f32_ref(buf, t->data, t->dtype, (size_t)t->shape[0]);
            for (int64_t j = 0; j < t->shape[0]; j++)
                buf[j] += 1.0f;
            rc = st_writer_write(w, buf, (size_t)t->shape[0] * sizeof *buf, e);
        }
    }
    memset(buf, 0, sizeof buf);
    if (rc == 0)
        rc = st_writer_write(w, buf, 64 * sizeof *buf, e);
    rc = rc == 0 ? st_writer_close(w, e) : (st_writer_abort(w), rc);
out:
    free(ents);
    return rc;
}

static int mlx_layout(struct err *e)
{
    const char *src = STEST_GOLDEN "qwen3_next";
    char path[600], *tmp = stest_tmpdir();
    struct st_set *s = NULL;
    struct model *a = NULL, *b = NULL;
    cJSON *cfg = NULL;
    float *la = NULL, *lb = NULL;
    int rc;
    if (!tmp)
        return err_setf(e, ERR_IO, "cannot make a temporary folder");
    snprintf(path, sizeof path, "%s/config.json", src);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0 || (rc = ck_config_write(tmp, cfg, NULL, e)) < 0 ||
        (rc = st_set_open(&s, src, e)) < 0 || (rc = write_mlx_layout(s, tmp, e)) < 0 ||
        (rc = model_load(&a, src, e)) < 0 || (rc = model_load(&b, tmp, e)) < 0)
        goto out;
    int nv = a->hp.n_vocab;
    la = malloc((size_t)nv * sizeof *la);
    lb = malloc((size_t)nv * sizeof *lb);
    if (!la || !lb) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = stest_prompt_logits(a, la, e)) < 0 || (rc = stest_prompt_logits(b, lb, e)) < 0)
        goto out;
    double d = 0.0, mx = 0.0;
    for (int i = 0; i < nv; i++) {
        d = fmax(d, fabs((double)la[i] - lb[i]));
        mx = fmax(mx, fabs((double)la[i]));
    }
    rc = stest_check(d <= 1e-4 * mx, "mlx-lm's layout (conv [ch, K, 1], norms 1 + w) gives the "
                     "published layout's logits", e);
    if (rc == 0)
        rc = stest_check(st_set_n_unused(b->st) == 0, "the mtp.* tensors dropped", e);
out:
    free(la);
    free(lb);
    model_free(a);
    model_free(b);
    st_set_free(s);
    cJSON_Delete(cfg);
    stest_rmtree(tmp);
    return rc;
}

int qwen3_next_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = defaults(e)) < 0 || (rc = layer_patterns(e)) < 0 || (rc = rejections(e)) < 0 ||
        (rc = weights(e)) < 0 || (rc = permute_quantized(e)) < 0 || (rc = mlx_layout(e)) < 0)
        return rc;
    return forward(e);
}
