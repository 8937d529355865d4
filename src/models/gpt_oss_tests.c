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

#include <stdio.h>
#include <stdlib.h>

#include "../core/safetensors.h"
#include "../core/st_write.h"
#include "../loading/config.h"
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

/* ---- openai's published MXFP4 layout, made from the gpt_oss_mlx fixture ---- */

#define MLX_DIR STEST_GOLDEN "gpt_oss_mlx"

struct pub_tensor {
    char name[160];
    enum dtype dt;
    int ndim;
    int64_t shape[4];
    void *data;
    size_t bytes;
};

static struct pub_tensor *pub_add(struct pub_tensor *t, size_t *n, const char *name, enum dtype dt, int ndim,
                                  const int64_t *shape)
{
    struct pub_tensor *p = &t[(*n)++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->dt = dt;
    p->ndim = ndim;
    p->bytes = dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->bytes *= (size_t)shape[i];
    }
    p->data = calloc(1, p->bytes);
    return p;
}

/* rows [E][rows][rb] of a and b interleaved into dst [E][2 rows][rb] (a in the even rows) */
static void interleave_rows(char *dst, const char *a, const char *b, int64_t E, int64_t rows, size_t rb)
{
    for (int64_t x = 0; x < E; x++)
        for (int64_t r = 0; r < rows; r++) {
            memcpy(dst + ((size_t)(x * 2 * rows + 2 * r)) * rb, a + (size_t)(x * rows + r) * rb, rb);
            memcpy(dst + ((size_t)(x * 2 * rows + 2 * r + 1)) * rb, b + (size_t)(x * rows + r) * rb, rb);
        }
}

/* Every non-expert tensor of s into t: floats as they are, affine 8-bit (group 64) linears
 * dequantized to F32 (w = scale * q + bias). */
static void pub_linears(struct pub_tensor *t, size_t *n, const struct st_set *s)
{
    for (size_t i = 0; i < st_set_count(s); i++) {
        const struct st_tensor *st = st_set_at(s, i);
        size_t len = strlen(st->name);
        char pre[160], nm[200];
        if (strstr(st->name, ".mlp.experts."))
            continue;  /* pub_experts */
        if (len > 7 && (!strcmp(st->name + len - 7, ".scales") || !strcmp(st->name + len - 7, ".biases")))
            continue;
        snprintf(pre, sizeof pre, "%.*s", (int)(len > 7 ? len - 7 : 0), st->name);
        if (st->dtype != DTYPE_U32) {
            struct pub_tensor *p = pub_add(t, n, st->name, st->dtype, st->ndim, st->shape);
            memcpy(p->data, st->data, p->bytes);
            continue;
        }
        /* affine 8-bit, group 64: four codes a word, low byte first */
        snprintf(nm, sizeof nm, "%s.scales", pre);
        const struct st_tensor *sc = st_set_find(s, nm);
        snprintf(nm, sizeof nm, "%s.biases", pre);
        const struct st_tensor *bi = st_set_find(s, nm);
        int64_t out = st->shape[0], in = st->shape[1] * 4, shape[2] = {out, in};
        struct pub_tensor *p = pub_add(t, n, st->name, DTYPE_F32, 2, shape);
        const uint32_t *q = st->data;
        for (int64_t r = 0; sc && bi && r < out; r++)
            for (int64_t c = 0; c < in; c++) {
                float scale = bf16_to_f32(((const uint16_t *)sc->data)[r * (in / 64) + c / 64]);
                float bias = bf16_to_f32(((const uint16_t *)bi->data)[r * (in / 64) + c / 64]);
                uint32_t code = (q[r * (in / 4) + c / 4] >> (8 * (c % 4))) & 0xffu;
                ((float *)p->data)[r * in + c] = scale * (float)code + bias;
            }
    }
}

/* Layer il's experts into t as openai publishes them: gate_up_proj_blocks / _scales / _bias
 * (gate and up rows interleaved) and down_proj_blocks / _scales / _bias. */
static int pub_experts(struct pub_tensor *t, size_t *n, const struct st_set *s, int il, struct err *e)
{
    char nm[6][160], name[160];
    const char *part[6] = {"gate_proj.weight", "up_proj.weight", "gate_proj.scales", "up_proj.scales",
                           "gate_proj.bias", "up_proj.bias"};
    const struct st_tensor *g[6];
    for (int k = 0; k < 6; k++) {
        snprintf(nm[k], sizeof nm[k], "model.layers.%d.mlp.experts.%s", il, part[k]);
        if (!(g[k] = st_set_find(s, nm[k])))
            return err_setf(e, ERR_MISSING, "%s", nm[k]);
    }
    int64_t E = g[0]->shape[0], I = g[0]->shape[1], H = g[0]->shape[2] * 8;
    int64_t bsh[4] = {E, 2 * I, H / 32, 16}, ssh[3] = {E, 2 * I, H / 32}, bish[2] = {E, 2 * I};
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_blocks", il);
    interleave_rows(pub_add(t, n, name, DTYPE_U8, 4, bsh)->data, g[0]->data, g[1]->data, E, I, (size_t)H / 2);
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_scales", il);
    interleave_rows(pub_add(t, n, name, DTYPE_U8, 3, ssh)->data, g[2]->data, g[3]->data, E, I, (size_t)H / 32);
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_bias", il);
    interleave_rows(pub_add(t, n, name, g[4]->dtype, 2, bish)->data, g[4]->data, g[5]->data, E, I,
                    dtype_size(g[4]->dtype));
    const struct st_tensor *dw, *ds, *db;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj.weight", il);
    dw = st_set_find(s, name);
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj.scales", il);
    ds = st_set_find(s, name);
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj.bias", il);
    db = st_set_find(s, name);
    if (!dw || !ds || !db)
        return err_setf(e, ERR_MISSING, "down_proj of layer %d", il);
    int64_t dbs[4] = {E, H, I / 32, 16};
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_blocks", il);
    memcpy(pub_add(t, n, name, DTYPE_U8, 4, dbs)->data, dw->data, (size_t)(E * H * I / 2));
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_scales", il);
    memcpy(pub_add(t, n, name, DTYPE_U8, 3, ds->shape)->data, ds->data, (size_t)(E * H * I / 32));
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_bias", il);
    struct pub_tensor *p = pub_add(t, n, name, db->dtype, 2, db->shape);
    memcpy(p->data, db->data, p->bytes);
    return 0;
}

/* The n tensors of t as dir/model.safetensors. */
static int pub_write_weights(const struct pub_tensor *t, size_t n, const char *dir, struct err *e)
{
    struct st_wentry *ents = calloc(n, sizeof *ents);
    struct st_writer *w = NULL;
    char path[600];
    int rc;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    for (size_t i = 0; ents && i < n; i++) {
        ents[i] = (struct st_wentry){t[i].name, t[i].dt, t[i].ndim, {0}};
        memcpy(ents[i].shape, t[i].shape, sizeof t[i].shape);
    }
    rc = ents ? st_writer_open(&w, path, ents, n, e) : err_setf(e, ERR_NOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = st_writer_write(w, t[i].data, t[i].bytes, e);
    if (w)
        rc = rc == 0 ? st_writer_close(w, e) : (st_writer_abort(w), rc);
    free(ents);
    return rc;
}

/* gpt_oss_mlx's config.json with quantization_config {quant_method: mxfp4}, into dir. */
static int pub_write_config(const char *dir, struct err *e)
{
    cJSON *cfg = NULL;
    char path[600];
    int rc;
    if ((rc = cfg_load_file(MLX_DIR "/config.json", FILE_FOLDER, &cfg, e)) < 0)
        return rc;
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    cJSON_AddItemToObject(cfg, "quantization_config", cJSON_Parse("{\"quant_method\": \"mxfp4\"}"));
    char *text = cJSON_PrintUnformatted(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = text ? fopen(path, "w") : NULL;
    rc = f && fputs(text, f) >= 0 ? 0 : -1;
    if (f && fclose(f) != 0)
        rc = -1;
    if (rc < 0)
        rc = err_setf(e, ERR_IO, "cannot write %s", path);
    free(text);
    cJSON_Delete(cfg);
    return rc;
}

/* The gpt_oss_mlx checkpoint rewritten as openai publishes gpt-oss: experts as gate_up_proj_blocks /
 * _scales (gate and up rows interleaved, the same MXFP4 codes and E8M0 scales) and down_proj_blocks /
 * _scales with [E, out] biases; every other linear dequantized to F32 (w = scale * q + bias);
 * quantization_config {quant_method: mxfp4}. Written to dir. */
static int write_published(const char *dir, struct err *e)
{
    struct st_set *s = NULL;
    struct pub_tensor *t = NULL;
    size_t n = 0;
    int rc;
    if ((rc = st_set_open(&s, MLX_DIR, e)) < 0)
        return rc;
    if (!(t = calloc(st_set_count(s) + 8, sizeof *t))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    pub_linears(t, &n, s);
    for (int il = 0; rc == 0 && il < 2; il++)
        rc = pub_experts(t, &n, s, il, e);
    if (rc == 0 && (rc = pub_write_weights(t, n, dir, e)) == 0)
        rc = pub_write_config(dir, e);
out:
    for (size_t i = 0; t && i < n; i++)
        free(t[i].data);
    free(t);
    st_set_free(s);
    return rc;
}

/* the published layout binds the MXFP4 blocks as mxfp4 views and matches gpt_oss_mlx's golden */
static int published_mxfp4(struct err *e)
{
    char *tmp = stest_tmpdir();
    struct model *m = NULL;
    struct st_set *g = NULL;
    struct stest_run r = {0};
    struct backend *be = NULL;
    float *logits = NULL;
    int rc;
    if (!tmp)
        return err_setf(e, ERR_IO, "cannot make a temporary folder");
    if ((rc = write_published(tmp, e)) < 0 || (rc = model_load(&m, tmp, e)) < 0)
        goto out;
    const struct tensor *gu = &m->layers[1].ex.gate_up.w[3];
    if ((rc = stest_check(gu->qbits == 4 && gu->qmode == QMODE_MXFP4 && gu->shape[0] == 2 * m->hp.n_ff &&
                              gu->shape[1] == m->hp.n_embd && !m->hp.quant.present && m->hp.quant.hf_mxfp4,
                          "openai MXFP4 blocks bound as mxfp4 [2I, H] views", e)) < 0)
        goto out;
    struct tensor ids, ref;
    if ((rc = st_set_open_file(&g, MLX_DIR "/golden.safetensors", e)) < 0 ||
        (rc = st_set_take(g, "input_ids", &ids, e)) < 0 || (rc = st_set_take(g, "prefill_logits", &ref, e)) < 0 ||
        (rc = backend_cpu_new(&be, 1, NULL, NULL, e)) < 0)
        goto out;
    int L = (int)ids.shape[0], V = m->hp.n_vocab;
    logits = malloc((size_t)L * V * sizeof *logits);
    if ((rc = stest_run_open(&r, NULL, m, be, L, e)) < 0 ||
        (rc = stest_run_feed(&r, ids.data, L, true, logits, e)) < 0)
        goto out;
    double worst = 0;
    for (int i = 0; i < L; i++) {
        const float *a = logits + (size_t)i * V, *b = (const float *)ref.data + (size_t)i * V;
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) {
            mx = fabs(b[v]) > mx ? fabs(b[v]) : mx;
            d = fabs((double)a[v] - b[v]) > d ? fabs((double)a[v] - b[v]) : d;
        }
        worst = d / mx > worst ? d / mx : worst;
    }
    rc = stest_check(worst <= 1e-3, "openai MXFP4 layout within 1e-3 of the gpt_oss_mlx golden", e);
out:
    stest_run_close(&r);
    backend_free(be);
    free(logits);
    st_set_free(g);
    model_free(m);
    stest_rmtree(tmp);
    return rc;
}

int gpt_oss_ops_self_test(struct err *e)
{
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = routing(e)) < 0 || (rc = weights(e)) < 0 ||
        (rc = forward_reads_everything(e)) < 0 || (rc = published_mxfp4(e)) < 0)
        return rc;
    return 0;
}
