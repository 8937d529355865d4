/*
 * api_embed: POST /v1/embeddings (OpenAI) and POST /v1/rerank, /rerank (llama-server, Jina,
 * Cohere) for a served encoder (server_model.embedder). docs/server.md has the shapes.
 *
 * A server serves one model: an encoder answers these two and refuses generation (server.c),
 * a generation model refuses these. The embedder runs under
 * srv_model.embed_b, its batcher: the inputs of the requests of the moment go through it
 * together, packed without padding (ADR 0083, 0114), each request getting its own rows.
 * Tokenizing happens before (the tokenizer is immutable).
 *
 * Bounds (OpenAI's for embeddings): at most SRV_EMBED_MAX_INPUTS inputs (documents) and
 * SRV_EMBED_MAX_TOKENS tokens in all per request; an empty string or token array is a 400;
 * a text longer than the model's limit is truncated as sentence-transformers truncates it,
 * or answered 400 with "truncate": false.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/base64.h"
#include "../engine/embedder.h"
#include "srv_impl.h"

#define SRV_EMBED_MAX_INPUTS 2048
#define SRV_EMBED_MAX_TOKENS 300000

static int embed_status(const struct err *e)
{
    return e->code == ERR_NOMEM || e->code == ERR_FORMAT || e->code == ERR_INTERNAL ? 500 : 400;
}

static int fail_from(struct oai_error *err, const struct err *e, const char *param)
{
    int st = embed_status(e);
    return oai_errorf(err, st, st == 500 ? "server_error" : "invalid_request_error",
                      e->code == ERR_RANGE && strstr(e->msg, "more than the model") ? "context_length_exceeded" : NULL,
                      param, "%s", e->msg);
}

/* The optional boolean key (default def). */
static int opt_bool(const cJSON *in, const char *key, bool def, bool *out, struct oai_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, key);
    *out = def;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return oai_errorf(err, 400, "invalid_request_error", NULL, key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* "model", when given, names the served model (as the generation endpoints require): 404
 * model_not_found otherwise. */
static int check_model(const struct srv_model *sm, const cJSON *in, struct oai_error *err)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(in, "model");
    if (!m || cJSON_IsNull(m))
        return 0;
    if (!cJSON_IsString(m))
        return oai_errorf(err, 400, "invalid_request_error", NULL, "model", "'model' must be a string");
    if (strcmp(m->valuestring, sm->id) != 0)
        return oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model", "the model '%.64s' "
                          "does not exist; this server serves '%s'", m->valuestring, sm->id);
    return 0;
}

/* A token-id array into an item. */
static int ids_item(const struct embedder *em, const cJSON *a, bool truncate, struct emb_item *it,
                    const char *param, struct oai_error *err)
{
    int n = cJSON_GetArraySize(a);
    struct err e = {0};
    if (n < 1 || n > SRV_EMBED_MAX_TOKENS)
        return oai_errorf(err, 400, "invalid_request_error", NULL, param, "a token array must hold 1 to %d ids",
                          SRV_EMBED_MAX_TOKENS);
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= em->m->hp.n_vocab) {
            free(v);
            return oai_errorf(err, 400, "invalid_request_error", NULL, param, "token %d must be an integer "
                              "id in [0, %d)", i, em->m->hp.n_vocab);
        }
        v[i++] = (int32_t)x->valuedouble;
    }
    int rc = embedder_ids(em, v, n, truncate, it, &e);
    free(v);
    return rc < 0 ? fail_from(err, &e, param) : 0;
}

static int text_item(const struct embedder *em, const char *prompt, const char *s, bool truncate,
                     struct emb_item *it, const char *param, struct oai_error *err)
{
    struct err e = {0};
    if (!s[0])
        return oai_errorf(err, 400, "invalid_request_error", NULL, param, "an input must not be empty");
    if (!em->tok)
        return oai_errorf(err, 400, "invalid_request_error", NULL, param, "this model's tokenizer could not "
                          "be loaded: send token ids");
    if (embedder_tokenize(em, prompt, s, strlen(s), truncate, it, &e) < 0)
        return fail_from(err, &e, param);
    return 0;
}

/* "input" into items (*n of them, allocated). */
static int parse_inputs(const struct embedder *em, const cJSON *in, const char *prompt, bool truncate,
                        struct emb_item **items, int *n, struct oai_error *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(in, "input");
    *items = NULL;
    *n = 0;
    bool one = cJSON_IsString(a) || (cJSON_IsArray(a) && cJSON_IsNumber(cJSON_GetArrayItem(a, 0)));
    int k = one ? 1 : cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (k < 0)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "input", "'input' must be a string, an "
                          "array of strings, an array of token ids or an array of such arrays");
    if (k < 1 || k > SRV_EMBED_MAX_INPUTS)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "input", "'input' must hold 1 to %d inputs, "
                          "got %d", SRV_EMBED_MAX_INPUTS, k);
    if (!(*items = calloc((size_t)k, sizeof **items)))
        return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
    long total = 0;
    for (int i = 0; i < k; i++) {
        const cJSON *x = one ? a : cJSON_GetArrayItem(a, i);
        char param[32];
        snprintf(param, sizeof param, one ? "input" : "input[%d]", i);
        int rc = cJSON_IsString(x) ? text_item(em, prompt, x->valuestring, truncate, &(*items)[i], param, err)
                 : cJSON_IsArray(x) ? ids_item(em, x, truncate, &(*items)[i], param, err)
                 : oai_errorf(err, 400, "invalid_request_error", NULL, param, "'%s' must be a string or an "
                              "array of token ids", param);
        *n = i + (rc == 0);
        if (rc < 0)
            return rc;
        total += (*items)[i].n;
        if (total > SRV_EMBED_MAX_TOKENS)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "input", "the inputs hold more than "
                              "%d tokens in all", SRV_EMBED_MAX_TOKENS);
    }
    return 0;
}

static void items_free(struct emb_item *items, int n)
{
    for (int i = 0; items && i < n; i++)
        emb_item_deinit(&items[i]);
    free(items);
}

static char *base64_floats(const float *v, int n)
{
    size_t len = (size_t)n * 4;
    unsigned char *b = malloc(len ? len : 1);
    char *out = malloc(b64_encoded_len(len) + 1);
    if (!b || !out) {
        free(b);
        free(out);
        return NULL;
    }
    for (int i = 0; i < n; i++) {   /* little-endian float32, as numpy's frombuffer reads it */
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int j = 0; j < 4; j++)
            b[4 * i + j] = (unsigned char)(u >> (8 * j));
    }
    b64_encode(b, len, out);
    free(b);
    return out;
}

struct embed_ctx {
    struct server *s;
    struct MHD_Connection *c;
};

/* A queued request gives up when its client closed the connection or the server stops. */
static bool embed_gone(void *ud)
{
    const struct embed_ctx *x = ud;
    return atomic_load(&x->s->stopping) || srv_client_gone(x->c);
}

static void embed_batch_seen(void *ud, const struct emb_batch_info *info)
{
    struct server *s = ud;
    metrics_embed_batch(&s->metrics, info->n_jobs, info->n_items);
}

/* Run items through the model's batcher with the requests of the moment (ADR 0114). 1 when
 * the request gave up while queued (client gone: *err unset; server stopping: *err a 503). */
static int run_batched(struct server *s, struct MHD_Connection *c, struct srv_model *sm,
                       const struct emb_item *items, int n, float *out, bool score, struct oai_error *err)
{
    struct embed_ctx x = {s, c};
    struct emb_job job = {.items = items, .n = n, .score = score, .out = out};
    if (emb_batcher_run(&sm->embed_b, sm->m.embedder, &job, embed_gone, &x, embed_batch_seen, s) != 0) {
        if (!atomic_load(&s->stopping))
            return 1;
        oai_errorf(err, 503, "server_error", NULL, NULL, "the server is shutting down");
        return -1;
    }
    return job.rc < 0 ? fail_from(err, &job.e, NULL) : 0;
}

static cJSON *usage_json(cJSON *root, long tokens)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    if (u) {
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
        cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    }
    return u;
}

enum MHD_Result srv_embeddings(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct embedder *em = r->model->m.embedder;
    struct emb_item *items = NULL;
    float *vec = NULL;
    cJSON *out = NULL;
    int n = 0, dims = 0;
    bool truncate, b64 = false;
    cJSON *in = oai_parse_object(r->body, r->len, &err);
    if (!in)
        return srv_reply_error(c, r, &err);
    if (check_model(r->model, in, &err) < 0)
        goto fail;
    if (em && embedder_is_reranker(em)) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "model", "model '%s' is a reranker (cross-encoder): "
                   "use /v1/rerank", r->model->id);
        goto fail;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(in, "encoding_format");
    const cJSON *dm = cJSON_GetObjectItemCaseSensitive(in, "dimensions");
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))) {
            oai_errorf(&err, 400, "invalid_request_error", NULL, "encoding_format",
                       "'encoding_format' must be \"float\" or \"base64\"");
            goto fail;
        }
        b64 = strcmp(fmt->valuestring, "base64") == 0;
    }
    if (dm && !cJSON_IsNull(dm)) {
        if (!cJSON_IsNumber(dm) || dm->valuedouble != floor(dm->valuedouble) || dm->valuedouble < 1 ||
            dm->valuedouble > em->cfg.dim) {
            oai_errorf(&err, 400, "invalid_request_error", NULL, "dimensions", "'dimensions' must be an integer "
                       "in [1, %d]", em->cfg.dim);
            goto fail;
        }
        dims = (int)dm->valuedouble;
    }
    if (opt_bool(in, "truncate", true, &truncate, &err) < 0)
        goto fail;
    const char *prompt = em->cfg.default_prompt[0] ? emb_prompt_find(&em->cfg, em->cfg.default_prompt) : NULL;
    if (parse_inputs(em, in, prompt, truncate, &items, &n, &err) < 0)
        goto fail;
    int dim = em->cfg.dim, k = dims ? dims : dim;
    long tokens = 0;
    for (int i = 0; i < n; i++)
        tokens += items[i].n;
    if (!(vec = malloc((size_t)n * dim * sizeof *vec))) {
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    int brc = run_batched(s, c, r->model, items, n, vec, false, &err);
    if (brc < 0)
        goto fail;
    if (brc > 0)
        goto gone;
    cJSON *data;
    bool ok = (out = cJSON_CreateObject()) && cJSON_AddStringToObject(out, "object", "list") &&
              (data = cJSON_AddArrayToObject(out, "data"));
    for (int i = 0; ok && i < n; i++) {
        float *v = vec + (size_t)i * dim;
        if (k < dim)   /* Matryoshka: the first k dimensions, unit length again */
            emb_renormalize(v, k);
        cJSON *d = cJSON_CreateObject();
        ok = d && cJSON_AddItemToArray(data, d) && cJSON_AddStringToObject(d, "object", "embedding") &&
             cJSON_AddNumberToObject(d, "index", i);
        if (ok && b64) {
            char *t = base64_floats(v, k);
            ok = t && cJSON_AddStringToObject(d, "embedding", t);
            free(t);
        } else if (ok) {
            cJSON *a = cJSON_AddArrayToObject(d, "embedding");
            for (int j = 0; a && j < k; j++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[j]));
            ok = a != NULL;
        }
    }
    ok = ok && cJSON_AddStringToObject(out, "model", r->model->id) && usage_json(out, tokens);
    if (!ok) {
        cJSON_Delete(out);
        out = NULL;
    }
    r->n_prompt = (int)tokens;
    items_free(items, n);
    free(vec);
    cJSON_Delete(in);
    return srv_reply_json(c, r, 200, out);
gone:    /* the client closed its side while queued: nobody to answer (gen.c does the same) */
    items_free(items, n);
    free(vec);
    cJSON_Delete(in);
    r->status = 499;
    return MHD_NO;
fail:
    items_free(items, n);
    free(vec);
    cJSON_Delete(in);
    return srv_reply_error(c, r, &err);
}

/* documents[i] as text: a string, or {"text": string} (Cohere's older shape). */
static const char *doc_text(const cJSON *d)
{
    if (cJSON_IsString(d))
        return d->valuestring;
    const cJSON *t = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "text") : NULL;
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

enum MHD_Result srv_rerank(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct embedder *em = r->model->m.embedder;
    struct emb_item *items = NULL;
    float *scores = NULL;
    struct emb_ranked *rk = NULL;
    cJSON *out = NULL;
    int n = 0, top;
    bool truncate, ret_docs;
    struct err e = {0};
    cJSON *in = oai_parse_object(r->body, r->len, &err);
    if (!in)
        return srv_reply_error(c, r, &err);
    if (check_model(r->model, in, &err) < 0)
        goto fail;
    if (!embedder_is_reranker(em)) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "model", "model '%s' embeds texts; reranking needs "
                   "a cross-encoder (a *ForSequenceClassification checkpoint)", r->model->id);
        goto fail;
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(in, "query");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(in, "documents");
    const cJSON *tn = cJSON_GetObjectItemCaseSensitive(in, "top_n");
    int nd = cJSON_IsArray(docs) ? cJSON_GetArraySize(docs) : -1;
    if (!cJSON_IsString(q) || !q->valuestring[0]) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "query", "'query' must be a non-empty string");
        goto fail;
    }
    if (nd < 1 || nd > SRV_EMBED_MAX_INPUTS) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "documents", "'documents' must be an array of 1 to "
                   "%d documents", SRV_EMBED_MAX_INPUTS);
        goto fail;
    }
    top = nd;
    if (tn && !cJSON_IsNull(tn)) {
        if (!cJSON_IsNumber(tn) || tn->valuedouble != floor(tn->valuedouble) || tn->valuedouble < 1) {
            oai_errorf(&err, 400, "invalid_request_error", NULL, "top_n", "'top_n' must be a positive integer");
            goto fail;
        }
        top = tn->valuedouble < nd ? (int)tn->valuedouble : nd;
    }
    if (opt_bool(in, "truncate", true, &truncate, &err) < 0 || opt_bool(in, "return_documents", true, &ret_docs, &err) < 0)
        goto fail;
    if (!em->tok) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "query", "this model's tokenizer could not be loaded");
        goto fail;
    }
    items = calloc((size_t)nd, sizeof *items);
    scores = malloc((size_t)nd * sizeof *scores);
    rk = malloc((size_t)nd * sizeof *rk);
    if (!items || !scores || !rk) {
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    long tokens = 0;
    for (; n < nd; n++) {
        const char *t = doc_text(cJSON_GetArrayItem(docs, n));
        char param[32];
        snprintf(param, sizeof param, "documents[%d]", n);
        if (!t) {
            oai_errorf(&err, 400, "invalid_request_error", NULL, param, "'%s' must be a string or {\"text\": "
                       "string}", param);
            goto fail;
        }
        if (embedder_tokenize_pair(em, q->valuestring, strlen(q->valuestring), t, strlen(t), truncate,
                                   &items[n], &e) < 0) {
            fail_from(&err, &e, param);
            goto fail;
        }
        tokens += items[n].n;
        if (tokens > SRV_EMBED_MAX_TOKENS) {
            n++;
            oai_errorf(&err, 400, "invalid_request_error", NULL, "documents", "the pairs hold more than %d "
                       "tokens in all", SRV_EMBED_MAX_TOKENS);
            goto fail;
        }
    }
    int brc = run_batched(s, c, r->model, items, n, scores, true, &err);
    if (brc < 0)
        goto fail;
    if (brc > 0)
        goto gone;
    for (int i = 0; i < n; i++)
        rk[i] = (struct emb_ranked){i, scores[i]};
    emb_rank_sort(rk, n);
    cJSON *res;
    bool ok = (out = cJSON_CreateObject()) && cJSON_AddStringToObject(out, "object", "list") &&
              cJSON_AddStringToObject(out, "model", r->model->id) && (res = cJSON_AddArrayToObject(out, "results"));
    for (int i = 0; ok && i < top; i++) {
        cJSON *it = cJSON_CreateObject();
        ok = it && cJSON_AddItemToArray(res, it) && cJSON_AddNumberToObject(it, "index", rk[i].index) &&
             cJSON_AddNumberToObject(it, "relevance_score", (double)rk[i].score);
        if (ok && ret_docs) {
            cJSON *d = cJSON_AddObjectToObject(it, "document");
            ok = d && cJSON_AddStringToObject(d, "text", doc_text(cJSON_GetArrayItem(docs, rk[i].index)));
        }
    }
    ok = ok && usage_json(out, tokens);
    if (!ok) {
        cJSON_Delete(out);
        out = NULL;
    }
    r->n_prompt = (int)tokens;
    items_free(items, n);
    free(scores);
    free(rk);
    cJSON_Delete(in);
    return srv_reply_json(c, r, 200, out);
gone:
    items_free(items, n);
    free(scores);
    free(rk);
    cJSON_Delete(in);
    r->status = 499;
    return MHD_NO;
fail:
    items_free(items, n);
    free(scores);
    free(rk);
    cJSON_Delete(in);
    return srv_reply_error(c, r, &err);
}
