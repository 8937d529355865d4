/*
 * embed_dec: decoder embedding models and the LM reranker (ADR 0097 / 0098) against the
 * float64 references of tests/fixtures/gen/gen_embed_dec.py (tests/fixtures/golden/<case>/
 * embed.json), run as `run_tests embed` runs the encoders' (test_embed.c):
 *   qwen3_emb  Qwen3-Embedding's shape: a causal Qwen3Model saved by sentence-transformers
 *              (no "model." prefix), last-token pooling of the <|endoftext|> the tokenizer
 *              appends, Normalize, prompts; bfloat16
 *   embgemma   EmbeddingGemma's shape: gemma3_text with use_bidirectional_attention (full
 *              layers bidirectional, sliding layers a band of sliding_window // 2 each side),
 *              mean pooling, two Dense layers, Normalize, prompts; bfloat16
 *   qwen3_rr   Qwen3-Reranker's shape: a Qwen3ForCausalLM scored by P(yes) in the model card's
 *              prompt, with `--reranker qwen3` (model_set_lm_reranker) and with vLLM's
 *              classifier_from_token in config.json; converted to Qwen3ForSequenceClassification
 *              here as vLLM's convert_model_to_seq_cls.py does (score = the "yes" row less the
 *              "no" row): sigmoid of its one logit is the same P(yes) (ADR 0136)
 *   qwen3_seqcls  a Qwen3ForSequenceClassification saved by transformers with a random score
 *              head (gen_qwen3_seqcls.py): the model card's prompt, sigmoid of the head's logit
 * Bounds as test_embed.c: cosine >= 0.99999 and max |got - ref| <= 1e-4 max |ref| per vector,
 * batched equal to alone within 1e-5 of the row on the CPU (1e-4 on a GPU); scores within
 * 1e-4 relative. Texts and pairs go through the tokenizer and must give the reference ids.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/embedder.h"
#include "st_build.h"
#include "kernels/backend.h"
#include "core/dtype.h"
#include "core/safetensors.h"
#include "loading/config.h"
#include "models/model.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define REL_TOL 1e-4
#define COS_MIN 0.99999

struct dcase {
    cJSON *ref;
    struct model *m;
    struct backend *be;
    struct tokenizer *tok;
    struct embedder *em;
};

/* dir's model (as an LM reranker with rerank), its tokenizer, an embedder; ref from refdir;
 * on the test backend ($MLXCEL_DEVICE), or the CPU for a test that spies on what reaches a
 * backend op (a device backend's kv_rows live in device memory). */
static void dcase_open_on(struct dcase *c, const char *dir, const char *refdir, bool rerank, bool cpu)
{
    char path[4096];
    struct err e = {0};
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/embed.json", refdir);
    if (cfg_load_file(path, FILE_USER, &c->ref, &e) < 0 || model_load(&c->m, dir, &e) < 0 ||
        (rerank && model_set_lm_reranker(c->m, &e) < 0) || tok_load(&c->tok, dir, &e) < 0 ||
        (cpu ? backend_new(&c->be, "cpu", 2, test_backend_opts(), &e) : test_backend_new(&c->be, 2, &e)) < 0 ||
        model_prepare(c->m, c->be, &e) < 0 || embedder_new(&c->em, c->m, c->be, c->tok, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
}

static void dcase_open_dir(struct dcase *c, const char *dir, const char *refdir, bool rerank)
{
    dcase_open_on(c, dir, refdir, rerank, false);
}

static void dcase_open(struct dcase *c, const char *name, bool rerank)
{
    const char *dir = golden_case_dir(name);
    dcase_open_dir(c, dir, dir, rerank);
}

static void dcase_close(struct dcase *c)
{
    embedder_free(c->em);
    backend_free(c->be);
    model_free(c->m);
    tok_free(c->tok);
    cJSON_Delete(c->ref);
}

static int json_floats(const cJSON *a, float *v, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (cJSON_IsArray(it)) {
            n += json_floats(it, v + n, cap - n);
            continue;
        }
        assert_true(cJSON_IsNumber(it) && n < cap);
        v[n++] = (float)it->valuedouble;
    }
    return n;
}

static bool ids_equal(const struct emb_item *it, const cJSON *ids)
{
    const cJSON *x;
    int n = 0;
    cJSON_ArrayForEach(x, ids) {
        if (n >= it->n || it->ids[n] != (int32_t)x->valuedouble)
            return false;
        n++;
    }
    return n == it->n;
}

static double check_vec(const char *what, const float *got, const float *ref, int n)
{
    double dot = 0, ng = 0, nr = 0, md = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        dot += (double)got[i] * ref[i];
        ng += (double)got[i] * got[i];
        nr += (double)ref[i] * ref[i];
        md = fmax(md, fabs((double)got[i] - ref[i]));
        mr = fmax(mr, fabs((double)ref[i]));
    }
    double cos = dot / (sqrt(ng) * sqrt(nr) + 1e-300), rel = md / (mr > 0 ? mr : 1);
    if (!(cos >= COS_MIN) || !(rel <= REL_TOL))
        fail_msg("%s: cosine %.9f, relative error %.3g", what, cos, rel);
    return rel;
}

static double batched_bound(const struct backend *be)
{
    return backend_is_cpu(be) ? 1e-5 : 1e-4;
}

/* The text through the tokenizer (with the prompt), checked against the reference ids. */
static void tokenize_checked(struct dcase *c, const char *prompt, const cJSON *text, const cJSON *ids,
                             struct emb_item *it, const char *what)
{
    struct err e = {0};
    if (embedder_tokenize(c->em, prompt, text->valuestring, strlen(text->valuestring), true, it, &e) < 0)
        fail_msg("%s: %s", what, e.msg);
    if (!ids_equal(it, ids))
        fail_msg("%s: %d ids differ from the reference's %d", what, it->n, cJSON_GetArraySize(ids));
}

static void embed_dec_case(void **state)
{
    const char *name = *state;
    struct dcase c;
    struct err e = {0};
    dcase_open(&c, name, false);
    assert_true(c.m->hp.encoder && !embedder_is_reranker(c.em));
    const cJSON *texts = cJSON_GetObjectItem(c.ref, "texts");
    int nt = cJSON_GetArraySize(texts), d = c.m->hp.n_embd, dim = c.em->cfg.dim;
    assert_true(nt >= 6);
    assert_int_equal(c.em->max_len, (int)cJSON_GetObjectItem(c.ref, "max_seq_length")->valuedouble);
    struct emb_item *items = calloc((size_t)nt, sizeof *items);
    float *alone = calloc((size_t)nt * dim, sizeof *alone), *batched = calloc((size_t)nt * dim, sizeof *batched);
    float *ref = calloc(1 << 16, sizeof *ref), *hid = calloc(1 << 16, sizeof *hid);
    double worst = 0, worst_ba = 0;
    for (int i = 0; i < nt; i++) {
        const cJSON *t = cJSON_GetArrayItem(texts, i);
        char what[128];
        snprintf(what, sizeof what, "%s text %d", name, i);
        tokenize_checked(&c, NULL, cJSON_GetObjectItem(t, "text"), cJSON_GetObjectItem(t, "ids"), &items[i], what);
        int n = items[i].n;
        const cJSON *h = cJSON_GetObjectItem(t, "hidden");
        if (h) {   /* every row's last hidden state (the final norm applied) */
            struct enc_seq s = {items[i].ids, NULL, n};
            assert_true((size_t)n * d <= (1 << 16));
            if (enc_run(c.em->enc, &s, 1, hid, NULL, &e) < 0)
                fail_msg("%s", e.msg);
            for (int r = 0; r < n; r++) {
                assert_int_equal(json_floats(cJSON_GetArrayItem(h, r), ref, d), d);
                snprintf(what, sizeof what, "%s text %d hidden row %d", name, i, r);
                worst = fmax(worst, check_vec(what, hid + (size_t)r * d, ref, d));
            }
        }
        if (embedder_embed(c.em, &items[i], 1, alone + (size_t)i * dim, &e) < 0)
            fail_msg("%s", e.msg);
        assert_int_equal(json_floats(cJSON_GetObjectItem(t, "embedding"), ref, dim), dim);
        snprintf(what, sizeof what, "%s text %d embedding", name, i);
        worst = fmax(worst, check_vec(what, alone + (size_t)i * dim, ref, dim));
    }
    /* one padding-free batch of every text: the batched reference, and equal to alone */
    if (embedder_embed(c.em, items, nt, batched, &e) < 0)
        fail_msg("%s", e.msg);
    for (int i = 0; i < nt; i++) {
        char what[128];
        const cJSON *t = cJSON_GetArrayItem(texts, i), *eb = cJSON_GetObjectItem(t, "embedding_batched");
        /* the reference alone; its own padded batch where it is not null (gen_embed_dec.py) */
        assert_int_equal(json_floats(cJSON_GetObjectItem(t, "embedding"), ref, dim), dim);
        snprintf(what, sizeof what, "%s text %d batched", name, i);
        worst = fmax(worst, check_vec(what, batched + (size_t)i * dim, ref, dim));
        if (cJSON_IsArray(eb)) {
            assert_int_equal(json_floats(eb, ref, dim), dim);
            worst = fmax(worst, check_vec(what, batched + (size_t)i * dim, ref, dim));
        }
        double err = test_row_rel_err(batched + (size_t)i * dim, alone + (size_t)i * dim, dim);
        if (err > batched_bound(c.be))
            fail_msg("%s text %d: batched differs from alone by %.3g of the row", name, i, err);
        worst_ba = fmax(worst_ba, err);
    }
    /* the prompts ("query", "document"): prompt + text through the tokenizer, embedded */
    const cJSON *p;
    int np = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(c.ref, "prompts")) {
        const char *pname = cJSON_GetObjectItem(p, "name")->valuestring;
        const char *ptext = emb_prompt_find(&c.em->cfg, pname);
        if (!ptext || strcmp(ptext, cJSON_GetObjectItem(p, "prompt")->valuestring) != 0)
            fail_msg("%s: prompt '%s' is not the reference's", name, pname);
        for (int i = 0; i < cJSON_GetArraySize(cJSON_GetObjectItem(p, "texts")); i++) {
            struct emb_item it;
            char what[128];
            float v[4096];
            snprintf(what, sizeof what, "%s prompt %s text %d", name, pname, i);
            tokenize_checked(&c, ptext, cJSON_GetArrayItem(cJSON_GetObjectItem(p, "texts"), i),
                             cJSON_GetArrayItem(cJSON_GetObjectItem(p, "ids"), i), &it, what);
            const cJSON *pe = cJSON_GetArrayItem(cJSON_GetObjectItem(p, "embedding"), i);
            if (cJSON_IsArray(pe)) {   /* null: the reference's padded batch gave NaN */
                if (embedder_embed(c.em, &it, 1, v, &e) < 0)
                    fail_msg("%s", e.msg);
                assert_int_equal(json_floats(pe, ref, dim), dim);
                worst = fmax(worst, check_vec(what, v, ref, dim));
                np++;
            }
            emb_item_deinit(&it);
        }
    }
    assert_true(np >= 2);
    printf("  %s: %d texts, %d prompted, worst relative error %.3g, batched vs alone %.3g\n", name, nt, np,
           worst, worst_ba);
    for (int i = 0; i < nt; i++)
        emb_item_deinit(&items[i]);
    free(items);
    free(alone);
    free(batched);
    free(ref);
    free(hid);
    dcase_close(&c);
}

/* How each kind was recognised: Qwen3-Embedding causal, EmbeddingGemma bidirectional with
 * transformers' effective window (config_effective.sliding_window W' = W // 2 + 1: a band of
 * W' - 1 each side, window 2 (W' - 1) + 1 on the sliding layers). */
static void recognised_kinds(void **state)
{
    (void)state;
    struct dcase c;
    dcase_open(&c, "qwen3_emb", false);
    assert_true(c.m->hp.encoder && c.m->hp.causal && !c.m->hp.lm_rerank);
    dcase_close(&c);
    dcase_open(&c, "embgemma", false);
    assert_true(c.m->hp.encoder && !c.m->hp.causal);
    const cJSON *eff = cJSON_GetObjectItem(c.ref, "config_effective");
    int w = (int)cJSON_GetObjectItem(eff, "sliding_window")->valuedouble, n_slide = 0;
    for (int il = 0; il < c.m->hp.n_layer; il++)
        if (c.m->hp.layer[il].kv == KV_SLIDING) {
            assert_int_equal(c.m->hp.layer[il].window, 2 * (w - 1) + 1);
            n_slide++;
        }
    assert_true(n_slide >= 1 && n_slide < c.m->hp.n_layer);
    dcase_close(&c);
}

/* The rows reach the attention op as the kind needs them: Qwen3-Embedding's at their own
 * positions with no span (causal); EmbeddingGemma's full layers with the whole sequence as
 * span and no window, its sliding layers with the band and a causal window of one. */
static const struct backend_ops *g_real_ops;
static int g_bad, g_calls[2], g_band;
static const int *g_lens;
static int g_nseq;
static bool g_causal;

static void attn_spy(struct backend *be, float *out, int ldo, const float *q, int ldq,
                     const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                     const struct attn_params *ap)
{
    bool local = ap->window == 1;
    int r = 0;
    g_calls[local]++;
    if (g_causal && (rows->span || ap->window != 0))
        g_bad++;
    for (int s = 0; s < g_nseq; s++)
        for (int i = 0; i < g_lens[s]; i++, r++) {
            int h = local ? g_band : 1 << 20, n = g_lens[s];
            int lo = i - h > 0 ? i - h : 0, hi = i + h < n - 1 ? i + h : n - 1;
            if (r >= n_tok || rows->pos[r] != i ||
                (!g_causal && (!rows->span || rows->span[2 * r] != lo || rows->span[2 * r + 1] != hi)))
                g_bad++;
        }
    if (r != n_tok)
        g_bad++;
    g_real_ops->attention(be, out, ldo, q, ldq, kv, rows, n_tok, ap);
}

/* band: the sliding layers' half-width (the reference's effective sliding_window less one) */
static void rows_of(const char *name, bool causal)
{
    struct dcase c;
    struct err e = {0};
    dcase_open_on(&c, golden_case_dir(name), golden_case_dir(name), false, true);   /* the spy reads rows */
    const cJSON *sw = cJSON_GetObjectItem(cJSON_GetObjectItem(c.ref, "config_effective"), "sliding_window");
    int band = cJSON_IsNumber(sw) ? (int)sw->valuedouble - 1 : 0, want_local = 0;
    for (int il = 0; !causal && il < c.m->hp.n_layer; il++)
        want_local += c.m->hp.layer[il].kv == KV_SLIDING;
    static const int lens[3] = {17, 1, 11};
    int32_t ids[29];
    for (int i = 0; i < 29; i++)
        ids[i] = 5 + (i * 37) % 200;
    struct enc_seq seqs[3] = {{ids, NULL, 17}, {ids + 17, NULL, 1}, {ids + 18, NULL, 11}};
    float *h = malloc(29 * (size_t)c.m->hp.n_embd * sizeof *h);
    assert_non_null(h);
    struct backend_ops spy = *c.be->ops;
    g_real_ops = c.be->ops;
    spy.attention = attn_spy;
    c.be->ops = &spy;
    g_lens = lens, g_nseq = 3, g_causal = causal, g_band = band;
    g_bad = g_calls[0] = g_calls[1] = 0;
    if (enc_run(c.em->enc, seqs, 3, h, NULL, &e) < 0)
        fail_msg("%s", e.msg);
    c.be->ops = g_real_ops;
    assert_int_equal(g_calls[0] + g_calls[1], c.m->hp.n_layer);
    assert_int_equal(g_calls[1], want_local);
    if (g_bad)
        fail_msg("%s: %d rows reached the attention op with the wrong position, span or window", name, g_bad);
    free(h);
    dcase_close(&c);
}

static void attention_rows(void **state)
{
    (void)state;
    rows_of("qwen3_emb", true);
    rows_of("embgemma", false);   /* sliding_window 8: W' = 5, a band of 4 */
}

/* ---- the LM reranker ---- */

/* Each pair through the reranker's prompt gives the reference's ids, P(yes) within 1e-4 of
 * the model card's, batched equal to alone; a second instruction likewise. */
static void rerank_check(struct dcase *c, const char *what)
{
    struct err e = {0};
    const cJSON *pairs = cJSON_GetObjectItem(c->ref, "pairs"), *x;
    int n = cJSON_GetArraySize(pairs), i = 0;
    float scores[32], ref[32], alone;
    struct emb_item items[32];
    assert_true(n >= 5 && n <= 32 && embedder_is_reranker(c->em));
    /* the model card's max_length for the tiny model (8192 for the real one, its default here) */
    c->em->max_len = (int)cJSON_GetObjectItem(c->ref, "max_length")->valuedouble;
    if (c->m->hp.n_cls == 0) {   /* the LM head's rows (a converted one has a score head) */
        assert_int_equal(c->em->rr_yes, (int)cJSON_GetObjectItem(c->ref, "yes_id")->valuedouble);
        assert_int_equal(c->em->rr_no, (int)cJSON_GetObjectItem(c->ref, "no_id")->valuedouble);
    }
    for (int pass = 0; pass < 2; pass++) {
        const char *rkey = pass ? "scores_instruction2" : "scores";
        if (pass && embedder_set_instruction(c->em, cJSON_GetObjectItem(c->ref, "instruction2")->valuestring, &e) < 0)
            fail_msg("%s", e.msg);
        i = 0;
        cJSON_ArrayForEach(x, pairs) {
            const char *q = cJSON_GetArrayItem(x, 0)->valuestring, *d = cJSON_GetArrayItem(x, 1)->valuestring;
            if (embedder_tokenize_pair(c->em, q, strlen(q), d, strlen(d), true, &items[i], &e) < 0)
                fail_msg("%s pair %d: %s", what, i, e.msg);
            if (!pass && !ids_equal(&items[i], cJSON_GetArrayItem(cJSON_GetObjectItem(c->ref, "ids"), i)))
                fail_msg("%s pair %d: %d ids differ from the model card's", what, i, items[i].n);
            i++;
        }
        if (embedder_score(c->em, items, n, scores, &e) < 0)
            fail_msg("%s", e.msg);
        const cJSON *rs = cJSON_GetObjectItem(c->ref, rkey);
        assert_int_equal(cJSON_GetArraySize(rs), n);
        double worst = 0;
        int n_ref = 0;
        for (i = 0; i < n; i++) {
            if (embedder_score(c->em, &items[i], 1, &alone, &e) < 0)
                fail_msg("%s", e.msg);
            /* alone equals batched; the reference where it is not null (gen_embed_dec.py) */
            const cJSON *x = cJSON_GetArrayItem(rs, i);
            ref[i] = cJSON_IsNumber(x) ? (float)x->valuedouble : scores[i];
            n_ref += cJSON_IsNumber(x);
            double err = fabs(scores[i] - ref[i]) / fmax(fabs(ref[i]), 1e-12);
            if (err > REL_TOL || fabsf(alone - scores[i]) > 1e-5f * fabsf(alone))
                fail_msg("%s %s pair %d: score %.9g vs %.9g, alone %.9g", what, rkey, i, (double)scores[i],
                         (double)ref[i], (double)alone);
            worst = fmax(worst, err);
            emb_item_deinit(&items[i]);
        }
        assert_true(n_ref >= 1);
        printf("  %s %s: %d pairs (%d with a reference), worst relative error %.3g\n", what, rkey, n, n_ref,
               worst);
    }
    /* a pair over the limit is refused when asked not to cut it */
    const cJSON *last = cJSON_GetArrayItem(pairs, n - 1);
    const char *q = cJSON_GetArrayItem(last, 0)->valuestring, *d = cJSON_GetArrayItem(last, 1)->valuestring;
    e = (struct err){0};
    assert_int_equal(embedder_tokenize_pair(c->em, q, strlen(q), d, strlen(d), false, &items[0], &e), -ERR_RANGE);
}

static void rerank_flag(void **state)
{
    (void)state;
    struct dcase c;
    dcase_open(&c, "qwen3_rr", true);
    rerank_check(&c, "qwen3_rr --reranker qwen3");
    dcase_close(&c);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A copy of case name's folder whose config.json gets field = value (JSON), and
 * is_original_qwen3_reranker: true with orig. */
static void case_copy(char *dir, const char *name, const char *field, const char *value, bool orig)
{
    char cmd[8400], path[4200];
    struct err e = {0};
    cJSON *j = NULL;
    const char *src = golden_case_dir(name);
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", src, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(cfg_load_file(path, FILE_USER, &j, &e), 0);
    cJSON_AddItemToObject(j, field, cJSON_Parse(value));
    if (orig)
        cJSON_AddTrueToObject(j, "is_original_qwen3_reranker");
    char *text = cJSON_PrintUnformatted(j);
    write_text(path, text);
    free(text);
    cJSON_Delete(j);
}

static void rr_copy(char *dir, const char *field, const char *value, bool orig)
{
    case_copy(dir, "qwen3_rr", field, value, orig);
}

static void rm_dir(const char *dir)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A model whose own maximum length is past what one chunk holds (Qwen3-Embedding ships
 * max_position_embeddings 32768, ModernBERT 8192) loads (it was refused: "a chunk of 4096
 * rows cannot hold a sequence of 8192") and embeds as the same model with a short maximum;
 * past its limit an input is refused, or cut when asked. */
static void long_max_length(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-embmax-XXXXXX";
    struct dcase a, b;
    struct err e = {0};
    case_copy(dir, "qwen3_emb", "max_position_embeddings", "32768", false);
    dcase_open_dir(&a, dir, golden_case_dir("qwen3_emb"), false);
    dcase_open(&b, "qwen3_emb", false);
    /* the tokenizer's model_max_length (96) is the limit of both */
    assert_int_equal(a.em->max_len, b.em->max_len);
    assert_true(a.em->max_len <= CTX_MAX_ROWS);
    int dim = a.em->cfg.dim;
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = 3 + i * 7 % 200;
    struct emb_item ia = {0}, ib = {0};
    assert_int_equal(embedder_ids(a.em, ids, 40, false, &ia, &e), 0);
    assert_int_equal(embedder_ids(b.em, ids, 40, false, &ib, &e), 0);
    float *va = calloc((size_t)dim, sizeof *va), *vb = calloc((size_t)dim, sizeof *vb);
    if (embedder_embed(a.em, &ia, 1, va, &e) < 0 || embedder_embed(b.em, &ib, 1, vb, &e) < 0)
        fail_msg("%s", e.msg);
    assert_true(test_row_rel_err(va, vb, dim) <= 1e-6);
    emb_item_deinit(&ia);
    emb_item_deinit(&ib);
    /* one past the limit: refused by name, or cut to the limit */
    int n = a.em->max_len + 1;
    int32_t *many = calloc((size_t)n, sizeof *many);
    for (int i = 0; i < n; i++)
        many[i] = 3 + i % 200;
    assert_int_equal(embedder_ids(a.em, many, n, false, &ia, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "tokens"));
    assert_int_equal(embedder_ids(a.em, many, n, true, &ia, &e), 0);
    assert_int_equal(ia.n, a.em->max_len);
    emb_item_deinit(&ia);
    free(many);
    free(va);
    free(vb);
    dcase_close(&a);
    dcase_close(&b);
    rm_dir(dir);
}

/* vLLM's fields in config.json make the same reranker without a flag; other tokens, or
 * one field alone, are refused naming the fields. */
static void rerank_config_field(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-rr-XXXXXX";
    struct dcase c;
    rr_copy(dir, "classifier_from_token", "[\"no\", \"yes\"]", true);
    dcase_open_dir(&c, dir, golden_case_dir("qwen3_rr"), false);
    assert_true(c.m->hp.lm_rerank);
    rerank_check(&c, "qwen3_rr classifier_from_token");
    dcase_close(&c);
    rm_dir(dir);
    static const struct { const char *v; bool orig; } bad[] = {
        {"[\"yes\", \"no\"]", true}, {"[\"no\", \"yes\"]", false}, {"\"yes\"", true},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char b[] = "/tmp/mlxcel-rrbad-XXXXXX";
        struct model *m = NULL;
        struct err e = {0};
        rr_copy(b, "classifier_from_token", bad[i].v, bad[i].orig);
        int rc = model_load(&m, b, &e);
        model_free(m);
        rm_dir(b);
        if (rc != -ERR_UNSUPPORTED || !strstr(e.msg, "classifier_from_token"))
            fail_msg("case %zu: expected a refusal naming classifier_from_token, got %d '%s'", i, rc, e.msg);
    }
}

/* Without the flag the causal LM is a generator; the flag on an encoder or an embedding
 * model is refused; a text embedding call on the reranker and a score call on an embedding
 * model are refused. */
static void rerank_refusals(void **state)
{
    (void)state;
    struct model *m = NULL;
    struct err e = {0};
    assert_int_equal(model_load(&m, golden_case_dir("qwen3_rr"), &e), 0);
    assert_false(m->hp.encoder);
    model_free(m);
    m = NULL;
    assert_int_equal(model_load(&m, golden_case_dir("bert_st"), &e), 0);
    assert_int_equal(model_set_lm_reranker(m, &e), -ERR_ARG);
    model_free(m);
    m = NULL;
    assert_int_equal(model_load(&m, golden_case_dir("qwen3_emb"), &e), 0);
    e = (struct err){0};
    assert_int_equal(model_set_lm_reranker(m, &e), -ERR_ARG);   /* an embedding model already */
    model_free(m);

    struct dcase c;
    float v[256];
    struct emb_item it;
    dcase_open(&c, "qwen3_rr", true);
    assert_int_equal(embedder_tokenize(c.em, NULL, "hello", 5, true, &it, &e), 0);
    assert_true(embedder_embed(c.em, &it, 1, v, &e) < 0);
    emb_item_deinit(&it);
    e = (struct err){0};
    assert_int_equal(embedder_set_instruction(c.em, "x", &e), 0);
    dcase_close(&c);
    dcase_open(&c, "qwen3_emb", false);
    e = (struct err){0};
    assert_int_equal(embedder_set_instruction(c.em, "x", &e), -ERR_ARG);
    assert_int_equal(embedder_tokenize(c.em, NULL, "hello", 5, true, &it, &e), 0);
    assert_true(embedder_score(c.em, &it, 1, v, &e) < 0);
    emb_item_deinit(&it);
    dcase_close(&c);
}

/* ---- converted rerankers: Qwen3ForSequenceClassification (ADR 0136) ---- */

/* A copy of qwen3_rr converted as vLLM's convert_model_to_seq_cls.py (method "from_2_way_softmax")
 * does: config.json naming Qwen3ForSequenceClassification with n_labels labels, the causal LM's
 * weights, and score.weight [n_labels, d] in score.safetensors whose row 0 is the tied head's
 * "yes" row less its "no" row (further rows random); extra (JSON, may be NULL) merged into
 * config.json. */
static void seqcls_copy(char *dir, int n_labels, const char *extra)
{
    char cmd[8400], path[4200];
    struct err e = {0};
    cJSON *j = NULL, *ref = NULL;
    const char *src = golden_case_dir("qwen3_rr");
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp %s/*.json %s/*.safetensors %s/ && rm -f %s/embed.json", src, src, dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(cfg_load_file(path, FILE_USER, &j, &e), 0);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "architectures", cJSON_Parse("[\"Qwen3ForSequenceClassification\"]"));
    cJSON *labels = cJSON_CreateObject();
    for (int i = 0; i < n_labels; i++) {
        char k[16], v[32];
        snprintf(k, sizeof k, "%d", i);
        snprintf(v, sizeof v, "LABEL_%d", i);
        cJSON_AddStringToObject(labels, k, v);
    }
    cJSON_DeleteItemFromObject(j, "id2label");
    cJSON_AddItemToObject(j, "id2label", labels);
    cJSON *x = extra ? cJSON_Parse(extra) : NULL, *it;
    cJSON_ArrayForEach(it, x)
        cJSON_AddItemToObject(j, it->string, cJSON_Duplicate(it, true));
    cJSON_Delete(x);
    int d = cJSON_GetObjectItem(j, "hidden_size")->valueint, V = cJSON_GetObjectItem(j, "vocab_size")->valueint;
    char *text = cJSON_PrintUnformatted(j);
    write_text(path, text);
    free(text);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/embed.json", src);
    assert_int_equal(cfg_load_file(path, FILE_USER, &ref, &e), 0);
    int yes = (int)cJSON_GetObjectItem(ref, "yes_id")->valuedouble, no = (int)cJSON_GetObjectItem(ref, "no_id")->valuedouble;
    cJSON_Delete(ref);
    struct st_set *st = NULL;
    assert_int_equal(st_set_open(&st, src, &e), 0);
    const struct st_tensor *emb = st_set_find(st, "model.embed_tokens.weight");
    assert_true(emb && emb->ndim == 2 && emb->shape[0] == V && emb->shape[1] == d);
    float *all = malloc((size_t)V * d * sizeof *all), *score = calloc((size_t)n_labels * d, sizeof *score);
    assert_true(all && score);
    dtype_to_f32_ref(all, emb->data, emb->dtype, (size_t)V * d);
    for (int k = 0; k < d; k++) {
        score[k] = all[(size_t)yes * d + k] - all[(size_t)no * d + k];
        for (int r = 1; r < n_labels; r++)
            score[(size_t)r * d + k] = all[(size_t)(r + 7) * d + k];
    }
    st_set_free(st);
    struct stb_tensor t = {"score.weight", "F32", 2, {n_labels, d}, score, (size_t)n_labels * d * sizeof *score};
    assert_int_equal(stb_write(stb_path(dir, "score.safetensors"), &t, 1), 0);
    free(all);
    free(score);
}

/* The converted qwen3_rr scores pairs as the original: the model card's ids, sigmoid(score)
 * = its P(yes) within 1e-4, batched equal to alone, with a second instruction; it loads as a
 * reranker without a flag. */
static void rerank_seqcls_converted(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-seqcls-XXXXXX";
    struct dcase c;
    seqcls_copy(dir, 1, NULL);
    dcase_open_dir(&c, dir, golden_case_dir("qwen3_rr"), false);
    assert_true(c.m->hp.lm_rerank && c.m->hp.n_cls == 1 && c.m->hp.causal);
    assert_int_equal(c.m->lm_head.shape[0], 1);
    rerank_check(&c, "qwen3_rr as Qwen3ForSequenceClassification");
    dcase_close(&c);
    rm_dir(dir);
}

/* sentence-transformers' activation_fn in config.json (Identity): the raw logit, which is
 * log(p / (1 - p)) of the original's P(yes); two labels, or another family's head, refused. */
static void rerank_seqcls_activation_and_refusals(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-seqcls-XXXXXX";
    struct dcase c;
    struct err e = {0};
    struct emb_item it;
    float v = 0.0f;
    seqcls_copy(dir, 1, "{\"sentence_transformers\": {\"activation_fn\": \"torch.nn.modules.linear.Identity\"}}");
    dcase_open_dir(&c, dir, golden_case_dir("qwen3_rr"), false);
    c.em->max_len = (int)cJSON_GetObjectItem(c.ref, "max_length")->valuedouble;
    const cJSON *pair = cJSON_GetArrayItem(cJSON_GetObjectItem(c.ref, "pairs"), 0);
    const char *q = cJSON_GetArrayItem(pair, 0)->valuestring, *d = cJSON_GetArrayItem(pair, 1)->valuestring;
    double p = cJSON_GetArrayItem(cJSON_GetObjectItem(c.ref, "scores"), 0)->valuedouble, want = log(p / (1 - p));
    if (embedder_tokenize_pair(c.em, q, strlen(q), d, strlen(d), true, &it, &e) < 0 ||
        embedder_score(c.em, &it, 1, &v, &e) < 0)
        fail_msg("%s", e.msg);
    emb_item_deinit(&it);
    if (fabs(v - want) > 1e-3 * fmax(1.0, fabs(want)))
        fail_msg("Identity activation: %.9g, the logit %.9g", (double)v, want);
    dcase_close(&c);
    rm_dir(dir);

    /* two labels: loaded, but reranking needs one */
    char two[] = "/tmp/mlxcel-seqcls-XXXXXX";
    seqcls_copy(two, 2, NULL);
    dcase_open_dir(&c, two, golden_case_dir("qwen3_rr"), false);
    assert_int_equal(c.m->hp.n_cls, 2);
    assert_int_equal(embedder_tokenize_pair(c.em, "a", 1, "b", 1, true, &it, &e), 0);
    e = (struct err){0};
    assert_int_equal(embedder_score(c.em, &it, 1, &v, &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "one label"));
    emb_item_deinit(&it);
    dcase_close(&c);
    rm_dir(two);

    /* no score tensor: refused naming it; another family's head: refused naming it */
    char bad[] = "/tmp/mlxcel-seqcls-XXXXXX";
    struct model *m = NULL;
    seqcls_copy(bad, 1, NULL);
    assert_int_equal(unlink(stb_path(bad, "score.safetensors")), 0);
    e = (struct err){0};
    assert_true(model_load(&m, bad, &e) < 0);
    if (!strstr(e.msg, "score"))
        fail_msg("no score tensor: '%s'", e.msg);
    rm_dir(bad);
    char other[] = "/tmp/mlxcel-seqcls-XXXXXX";
    seqcls_copy(other, 1, "{\"architectures\": [\"LlamaForSequenceClassification\"], \"model_type\": \"llama\"}");
    e = (struct err){0};
    assert_int_equal(model_load(&m, other, &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "LlamaForSequenceClassification"));
    rm_dir(other);
}

/* gen_qwen3_seqcls.py's checkpoint as transformers saved it (a random score head): the model
 * card's ids, sigmoid of the head's logit within 1e-4 of transformers' float64, as
 * sentence-transformers' CrossEncoder computes it. */
static void rerank_qwen3_seqcls(void **state)
{
    (void)state;
    struct dcase c;
    dcase_open(&c, "qwen3_seqcls", false);
    assert_true(c.m->hp.lm_rerank && c.m->hp.n_cls == 1);
    rerank_check(&c, "qwen3_seqcls");
    /* CrossEncoder.predict (sigmoid for one label) gave the same scores, for the pairs the
     * model card's truncation leaves whole (CrossEncoder cuts at the tokenizer's limit) */
    const cJSON *ce = cJSON_GetObjectItem(c.ref, "scores_ce"), *sc = cJSON_GetObjectItem(c.ref, "scores");
    const cJSON *ids = cJSON_GetObjectItem(c.ref, "ids");
    int max_len = (int)cJSON_GetObjectItem(c.ref, "max_length")->valuedouble, n_ce = 0;
    assert_true(cJSON_IsArray(ce));
    for (int i = 0; i < cJSON_GetArraySize(ce); i++) {
        if (cJSON_GetArraySize(cJSON_GetArrayItem(ids, i)) >= max_len)
            continue;
        assert_true(fabs(cJSON_GetArrayItem(ce, i)->valuedouble - cJSON_GetArrayItem(sc, i)->valuedouble) < 1e-6);
        n_ce++;
    }
    assert_true(n_ce >= 4);
    dcase_close(&c);
}

/* ---- ModernBERT's classifier_pooling "mean" ---- */

/* v[n] as float from a stored tensor of m's checkpoint (any float dtype). */
static float *st_floats(const struct model *m, const char *name, size_t n)
{
    const struct st_tensor *t = st_set_find(m->st, name);
    if (!t)
        fail_msg("no tensor %s", name);
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    dtype_to_f32_ref(v, t->data, t->dtype, n);
    return v;
}

/* modernbert_ce with classifier_pooling "mean" (its config so patched): each pair's logit is
 * transformers' head on the mean of the sequence's last hidden states, computed here on the
 * host in double from the same hidden states and the stored head weights
 * (classifier(LN(gelu(dense(mean))))); batched equals alone. */
static void modernbert_mean_head(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-mbmean-XXXXXX", cmd[8400], path[4200];
    const char *src = golden_case_dir("modernbert_ce");
    struct err e = {0};
    struct model *m = NULL;
    struct backend *be = NULL;
    struct embedder *em = NULL;
    cJSON *j = NULL, *ref = NULL;
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp %s/*.json %s/*.safetensors %s/", src, src, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(cfg_load_file(path, FILE_USER, &j, &e), 0);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "classifier_pooling", cJSON_CreateString("mean"));
    char *text = cJSON_PrintUnformatted(j);
    write_text(path, text);
    free(text);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/embed.json", src);
    if (cfg_load_file(path, FILE_USER, &ref, &e) < 0 || model_load(&m, dir, &e) < 0 ||
        test_backend_new(&be, 2, &e) < 0 || model_prepare(m, be, &e) < 0 || embedder_new(&em, m, be, NULL, &e) < 0)
        fail_msg("%s", e.msg);
    assert_true(m->hp.cls_mean && m->hp.n_cls == 1);
    int d = m->hp.n_embd, n = cJSON_GetArraySize(cJSON_GetObjectItem(ref, "ids")), rows = 0;
    assert_true(n >= 5 && n <= 16);
    struct enc_seq seqs[16];
    int32_t *ids = malloc(16 * 256 * sizeof *ids);
    assert_non_null(ids);
    for (int i = 0; i < n; i++) {
        const cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "ids"), i), *x;
        seqs[i] = (struct enc_seq){ids + rows, NULL, 0};
        cJSON_ArrayForEach(x, a) {
            assert_true(rows < 16 * 256);
            ids[rows++] = (int32_t)x->valuedouble;
            seqs[i].n++;
        }
    }
    float *hid = malloc((size_t)rows * d * sizeof *hid), logits[16], alone;
    assert_non_null(hid);
    if (enc_run(em->enc, seqs, n, hid, logits, &e) < 0)
        fail_msg("%s", e.msg);
    float *wd = st_floats(m, "head.dense.weight", (size_t)d * d), *wn = st_floats(m, "head.norm.weight", d);
    float *wc = st_floats(m, "classifier.weight", d), *bc = st_floats(m, "classifier.bias", 1);
    double mean[1024], h[1024], worst = 0;
    assert_true(d <= 1024 && !st_set_find(m->st, "head.dense.bias") && !st_set_find(m->st, "head.norm.bias"));
    for (int i = 0, r = 0; i < n; r += seqs[i++].n) {
        for (int k = 0; k < d; k++) {
            mean[k] = 0;
            for (int t = 0; t < seqs[i].n; t++)
                mean[k] += hid[(size_t)(r + t) * d + k];
            mean[k] /= seqs[i].n;
        }
        double mu = 0, var = 0, logit = bc[0];
        for (int o = 0; o < d; o++) {   /* gelu(dense(mean)), exact erf */
            double acc = 0;
            for (int k = 0; k < d; k++)
                acc += (double)wd[(size_t)o * d + k] * mean[k];
            h[o] = 0.5 * acc * (1.0 + erf(acc / sqrt(2.0)));
            mu += h[o] / d;
        }
        for (int o = 0; o < d; o++)
            var += (h[o] - mu) * (h[o] - mu) / d;
        for (int o = 0; o < d; o++)
            logit += (double)wc[o] * (h[o] - mu) / sqrt(var + m->hp.norm_eps) * wn[o];
        double err = fabs(logits[i] - logit) / fmax(fabs(logit), 1.0);
        if (err > REL_TOL)
            fail_msg("pair %d: logit %.9g, the head on the mean row gives %.9g", i, (double)logits[i], logit);
        worst = fmax(worst, err);
        if (enc_run(em->enc, &seqs[i], 1, NULL, &alone, &e) < 0)
            fail_msg("%s", e.msg);
        if (fabsf(alone - logits[i]) > 1e-5f * fmaxf(fabsf(alone), 1.0f))
            fail_msg("pair %d: alone %.9g, batched %.9g", i, (double)alone, (double)logits[i]);
    }
    printf("  modernbert mean head: %d pairs, worst relative error %.3g against the host head\n", n, worst);
    free(wd), free(wn), free(wc), free(bc), free(hid), free(ids);
    embedder_free(em);
    backend_free(be);
    model_free(m);
    cJSON_Delete(ref);
    rm_dir(dir);
}

static void embed_qwen3_emb(void **s) { *s = (void *)"qwen3_emb"; embed_dec_case(s); }
static void embed_embgemma(void **s) { *s = (void *)"embgemma"; embed_dec_case(s); }

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(recognised_kinds),
    cmocka_unit_test(embed_qwen3_emb),
    cmocka_unit_test(embed_embgemma),
    cmocka_unit_test(long_max_length),
    cmocka_unit_test(attention_rows),
    cmocka_unit_test(rerank_flag),
    cmocka_unit_test(rerank_config_field),
    cmocka_unit_test(rerank_refusals),
    cmocka_unit_test(rerank_seqcls_converted),
    cmocka_unit_test(rerank_seqcls_activation_and_refusals),
    cmocka_unit_test(rerank_qwen3_seqcls),
    cmocka_unit_test(modernbert_mean_head),
};

TEST_SUITE(embed_dec, tests);
