/*
 * embed_batch: cross-request batching of an embedder (src/engine/emb_batch.c, ADR 0114) on
 * the bert_st (embeddings) and bert_ce (rerank) goldens. Requests submitted from threads while
 * a batch runs are run together in the next batch (one embedder call over every request's
 * sequences), and each request gets exactly what it gets alone, in its order; a request with a
 * bad sequence among them fails alone and the others still succeed; a request whose caller
 * gives up while queued leaves the queue without running; a token budget splits batches.
 *
 * The first request's batch is held in the on_batch callback until the others are queued, so
 * what gathers is decided, not left to the scheduler's timing.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "engine/emb_batch.h"
#include "kernels/backend.h"
#include "loading/config.h"
#include "models/model.h"
#include "test.h"

#define MAX_REQ 8
#define MAX_BATCHES 32

struct bcase {
    cJSON *ref;
    struct model *m;
    struct backend *be;
    struct embedder *em;
    struct emb_item *items;       /* the reference's sequences */
    int n_items;
    bool score;
};

static void bcase_open(struct bcase *c, const char *name)
{
    char path[4096];
    struct err e = {0};
    memset(c, 0, sizeof *c);
    const char *dir = golden_case_dir(name);
    snprintf(path, sizeof path, "%s/embed.json", dir);
    if (cfg_load_file(path, FILE_USER, &c->ref, &e) < 0 || model_load(&c->m, dir, &e) < 0 ||
        test_backend_new(&c->be, 2, &e) < 0 || model_prepare(c->m, c->be, &e) < 0 ||
        embedder_new(&c->em, c->m, c->be, NULL, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    c->score = embedder_is_reranker(c->em);
    /* embeddings: texts[].ids; rerank: ids[] with token_type_ids[] */
    const cJSON *texts = cJSON_GetObjectItem(c->ref, "texts");
    const cJSON *ids = cJSON_GetObjectItem(c->ref, "ids"), *types = cJSON_GetObjectItem(c->ref, "token_type_ids");
    c->n_items = c->score ? cJSON_GetArraySize(ids) : cJSON_GetArraySize(texts);
    assert_true(c->n_items >= 5);
    c->items = calloc((size_t)c->n_items, sizeof *c->items);
    for (int i = 0; i < c->n_items; i++) {
        const cJSON *a = c->score ? cJSON_GetArrayItem(ids, i) : cJSON_GetObjectItem(cJSON_GetArrayItem(texts, i), "ids");
        const cJSON *t = c->score ? cJSON_GetArrayItem(types, i) : NULL;
        int n = cJSON_GetArraySize(a);
        int32_t *v = malloc((size_t)n * sizeof *v);
        for (int k = 0; k < n; k++)
            v[k] = (int32_t)cJSON_GetArrayItem(a, k)->valuedouble;
        if (embedder_ids(c->em, v, n, false, &c->items[i], &e) < 0)
            fail_msg("%s: %s", name, e.msg);
        for (int k = 0; cJSON_IsArray(t) && k < n; k++)
            c->items[i].types[k] = (int32_t)cJSON_GetArrayItem(t, k)->valuedouble;
        free(v);
    }
}

static void bcase_close(struct bcase *c)
{
    for (int i = 0; i < c->n_items; i++)
        emb_item_deinit(&c->items[i]);
    free(c->items);
    embedder_free(c->em);
    backend_free(c->be);
    model_free(c->m);
    cJSON_Delete(c->ref);
}

/* The batches seen, and the hold on the first one. */
struct blog {
    pthread_mutex_t mu;
    struct emb_batch_info v[MAX_BATCHES];
    int n;
    struct emb_batcher *b;
    bool hold;                    /* the next batch waits until `want` jobs are queued */
    int want;
    atomic_int entered;
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void on_batch(void *ud, const struct emb_batch_info *info)
{
    struct blog *l = ud;
    pthread_mutex_lock(&l->mu);
    if (l->n < MAX_BATCHES)
        l->v[l->n++] = *info;
    bool hold = l->hold;
    l->hold = false;
    pthread_mutex_unlock(&l->mu);
    atomic_store(&l->entered, 1);
    for (int i = 0; hold && i < 10000 && emb_batcher_queued(l->b) < l->want; i++)
        sleep_ms(1);
}

struct req {
    struct emb_batcher *b;
    struct embedder *em;
    struct blog *log;
    struct emb_job job;
    struct emb_item *items;       /* owned copies of the case's (one may be made bad) */
    int n;
    float *out, *alone;
    bool give_up;
    int ret;
};

static bool always_gone(void *ud)
{
    (void)ud;
    return true;
}

static void *req_main(void *p)
{
    struct req *r = p;
    r->job = (struct emb_job){.items = r->items, .n = r->n, .score = r->job.score, .out = r->out};
    r->ret = emb_batcher_run(r->b, r->em, &r->job, r->give_up ? always_gone : NULL, NULL, on_batch, r->log);
    return NULL;
}

static void item_copy(struct emb_item *dst, const struct emb_item *src)
{
    dst->n = src->n;
    dst->skip = src->skip;
    dst->ids = malloc((size_t)src->n * sizeof *dst->ids);
    dst->types = malloc((size_t)src->n * sizeof *dst->types);
    memcpy(dst->ids, src->ids, (size_t)src->n * sizeof *dst->ids);
    if (src->types)
        memcpy(dst->types, src->types, (size_t)src->n * sizeof *dst->types);
    else
        memset(dst->types, 0, (size_t)src->n * sizeof *dst->types);
}

/* Request j: items j, j+1, ... (j % 3 + 1 of them, wrapping), each request a different mix. */
static void req_init(struct req *r, struct bcase *c, struct emb_batcher *b, struct blog *l, int j)
{
    struct err e = {0};
    memset(r, 0, sizeof *r);
    r->b = b;
    r->em = c->em;
    r->log = l;
    r->n = j % 3 + 1;
    r->job.score = c->score;
    int w = c->score ? 1 : c->em->cfg.dim;
    r->items = calloc((size_t)r->n, sizeof *r->items);
    r->out = calloc((size_t)r->n * w, sizeof *r->out);
    r->alone = calloc((size_t)r->n * w, sizeof *r->alone);
    for (int i = 0; i < r->n; i++)
        item_copy(&r->items[i], &c->items[(j + i) % c->n_items]);
    /* the request alone: the reference for what batching gives it */
    int rc = c->score ? embedder_score(c->em, r->items, r->n, r->alone, &e)
                      : embedder_embed(c->em, r->items, r->n, r->alone, &e);
    if (rc < 0)
        fail_msg("alone: %s", e.msg);
}

static void req_free(struct req *r)
{
    for (int i = 0; i < r->n; i++)
        emb_item_deinit(&r->items[i]);
    free(r->items);
    free(r->out);
    free(r->alone);
}

static void req_check(const struct req *r, const struct bcase *c, const char *what)
{
    int w = c->score ? 1 : c->em->cfg.dim;
    double tol = backend_is_cpu(c->be) ? 1e-5 : 1e-4;   /* test_embed.c's batched vs alone */
    assert_int_equal(r->ret, 0);
    if (r->job.rc < 0)
        fail_msg("%s: %s", what, r->job.e.msg);
    for (int i = 0; i < r->n; i++) {
        double err = c->score ? fabs(r->out[i] - r->alone[i]) / fmax(fabs(r->alone[i]), 1e-3)
                              : test_row_rel_err(r->out + (size_t)i * w, r->alone + (size_t)i * w, w);
        if (!(err <= tol))
            fail_msg("%s: sequence %d differs from the request alone by %.3g", what, i, err);
    }
}

/* Request 0 runs alone and holds its batch; meanwhile requests 1..n_req-1 queue (one of them,
 * bad, with an out-of-range token id; give_up: one more that gives up while queued). */
static void gather(struct bcase *c, int n_req, int bad, bool give_up, long budget, struct blog *l,
                   struct req *rq)
{
    struct emb_batcher b;
    struct err e = {0};
    pthread_t th[MAX_REQ + 1];
    assert_true(n_req <= MAX_REQ);
    if (emb_batcher_init(&b, budget, &e) < 0)
        fail_msg("%s", e.msg);
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->b = &b;
    l->hold = true;
    l->want = n_req - 1;
    for (int j = 0; j < n_req + give_up; j++) {
        req_init(&rq[j], c, &b, l, j);
        if (j == bad)   /* past the vocabulary: enc_run refuses the sequence */
            rq[j].items[0].ids[0] = c->m->hp.n_vocab;
    }
    assert_int_equal(pthread_create(&th[0], NULL, req_main, &rq[0]), 0);
    for (int i = 0; i < 10000 && !atomic_load(&l->entered); i++)
        sleep_ms(1);
    assert_true(atomic_load(&l->entered));
    if (give_up) {   /* queued behind the held batch, it gives up at once */
        rq[n_req].give_up = true;
        assert_int_equal(pthread_create(&th[n_req], NULL, req_main, &rq[n_req]), 0);
        pthread_join(th[n_req], NULL);
        assert_int_equal(rq[n_req].ret, 1);
        assert_int_equal(emb_batcher_queued(&b), 0);
    }
    for (int j = 1; j < n_req; j++)
        assert_int_equal(pthread_create(&th[j], NULL, req_main, &rq[j]), 0);
    for (int j = 0; j < n_req; j++)
        pthread_join(th[j], NULL);
    assert_int_equal(emb_batcher_queued(&b), 0);
    assert_int_equal((int)b.n_jobs, n_req);
    emb_batcher_destroy(&b);
    pthread_mutex_destroy(&l->mu);
}

static void batch_case(void **state)
{
    const char *name = *state;
    struct bcase c;
    struct blog l;
    struct req rq[MAX_REQ + 1];
    char what[128];
    bcase_open(&c, name);
    int n_req = 5;

    /* all good: the first alone, the four others in one batch */
    gather(&c, n_req, -1, true, 0, &l, rq);
    assert_int_equal(l.n, 2);
    assert_int_equal(l.v[0].n_jobs, 1);
    assert_int_equal(l.v[1].n_jobs, n_req - 1);
    int seqs = 0;
    long toks = 0;
    for (int j = 1; j < n_req; j++) {
        seqs += rq[j].n;
        for (int i = 0; i < rq[j].n; i++)
            toks += rq[j].items[i].n;
    }
    assert_int_equal(l.v[1].n_items, seqs);
    assert_int_equal(l.v[1].n_tokens, toks);
    for (int j = 0; j < n_req; j++) {
        snprintf(what, sizeof what, "%s request %d", name, j);
        req_check(&rq[j], &c, what);
        assert_int_equal(rq[j].job.batch_jobs, j ? n_req - 1 : 1);
    }
    for (int j = 0; j <= n_req; j++)
        req_free(&rq[j]);

    /* a bad request among them: it fails alone (its own error), the others succeed */
    int bad = 2;
    gather(&c, n_req, bad, false, 0, &l, rq);
    assert_int_equal(l.v[1].n_jobs, n_req - 1);
    for (int j = 0; j < n_req; j++) {
        snprintf(what, sizeof what, "%s request %d (with a bad one)", name, j);
        if (j == bad) {
            assert_int_equal(rq[j].ret, 0);
            assert_int_equal(rq[j].job.rc, -ERR_RANGE);
            assert_non_null(strstr(rq[j].job.e.msg, "outside"));
        } else {
            req_check(&rq[j], &c, what);
        }
    }
    for (int j = 0; j < n_req; j++)
        req_free(&rq[j]);

    /* a budget of the largest queued request's tokens: the queued four split into batches
     * (two or more), in order, none over the budget */
    long budget = 0;
    for (int j = 1; j < n_req; j++) {
        long t = 0;
        for (int i = 0; i < j % 3 + 1; i++)   /* req_init's items */
            t += c.items[(j + i) % c.n_items].n;
        budget = t > budget ? t : budget;
    }
    gather(&c, n_req, -1, false, budget, &l, rq);
    assert_true(l.n >= 3);
    int jobs = 0;
    for (int k = 0; k < l.n; k++) {
        assert_true(k == 0 || l.v[k].n_tokens <= budget);
        jobs += l.v[k].n_jobs;
    }
    assert_int_equal(jobs, n_req);
    for (int j = 0; j < n_req; j++) {
        snprintf(what, sizeof what, "%s request %d (budget %ld)", name, j, budget);
        req_check(&rq[j], &c, what);
    }
    for (int j = 0; j < n_req; j++)
        req_free(&rq[j]);
    printf("  %s: %d requests gathered into one batch, equal to each alone\n", name, n_req - 1);
    bcase_close(&c);
}

static void batch_bert_st(void **s) { *s = (void *)"bert_st"; batch_case(s); }
static void batch_bert_ce(void **s) { *s = (void *)"bert_ce"; batch_case(s); }

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(batch_bert_st),
    cmocka_unit_test(batch_bert_ce),
};

TEST_SUITE(embed_batch, tests);
