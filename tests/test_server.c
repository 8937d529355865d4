/*
 * server pieces below HTTP:
 * - textout: stop strings are found across token boundaries and cut the text
 *   before their first occurrence; the held-back tail is exactly what could
 *   still become a stop string, so what textout_ready() releases is never
 *   taken back and the releases concatenate to the final text; multi-byte
 *   characters are never split.
 * - runner: jobs from several client threads run together on the engine
 *   thread and equal generate() alone; admission refuses beyond max_jobs
 *   (busy, for a 429); a cancelled job ends within a step with its cache
 *   released; freeing the runner ends the jobs still queued.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/runner.h"
#include "kernels/backend.h"
#include "server/textout.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define MODEL "models/llama-tiny"

static struct tokenizer *load_tok(void)
{
    struct tokenizer *t = NULL;
    struct err e = {0};
    if (tok_load(&t, test_path(MODEL), &e) < 0)
        fail_msg("%s", e.msg);
    return t;
}

static int32_t *encode(const struct tokenizer *t, const char *s, size_t *n)
{
    int32_t *ids = NULL;
    struct err e = {0};
    if (tok_encode(t, s, strlen(s), false, &ids, n, &e) < 0)
        fail_msg("%s", e.msg);
    return ids;
}

/* Pushes the ids of text one by one with stops; checks that each release extends the
 * previous one and returns the final text (malloc'd) and whether a stop matched. */
static char *run_text(const struct tokenizer *t, const char *text, const char *const *stop, int n_stop,
                      bool *stopped, int *n_used)
{
    size_t n, len[8];
    for (int i = 0; i < n_stop; i++)
        len[i] = strlen(stop[i]);
    int32_t *ids = encode(t, text, &n);
    struct textout o;
    struct err e = {0};
    assert_int_equal(textout_init(&o, t, true, stop, len, n_stop, &e), 0);
    char released[4096] = "";
    size_t rel = 0;
    int rc = 0;
    size_t i = 0;
    for (; i < n && rc == 0; i++) {
        rc = textout_push(&o, ids[i], NULL, NULL, &e);
        assert_true(rc >= 0);
        size_t ready = textout_ready(&o);
        assert_true(ready >= rel);                       /* never taken back */
        assert_memory_equal(o.text, released, rel);      /* released bytes unchanged */
        memcpy(released + rel, o.text + rel, ready - rel);
        rel = ready;
        for (int s = 0; s < n_stop; s++)                 /* a stop string is never released */
            assert_null(memmem(released, rel, stop[s], len[s]));
    }
    if (rc == 0)
        assert_true(textout_finish(&o, &e) >= 0);
    *stopped = o.stopped;
    *n_used = (int)i;
    assert_int_equal(textout_ready(&o), o.len);
    char *out = strdup(o.text);
    textout_free(&o);
    free(ids);
    return out;
}

static void stop_strings(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    bool stopped;
    int used;
    const char *text = "ROMEO:\nBut soft, what light through yonder window breaks?";
    /* no stop: the text round-trips */
    char *got = run_text(t, text, NULL, 0, &stopped, &used);
    assert_string_equal(got, text);
    assert_false(stopped);
    free(got);
    /* a stop spanning tokens: cut before its first occurrence */
    const char *s1[] = {"ght thr"};
    got = run_text(t, text, s1, 1, &stopped, &used);
    assert_string_equal(got, "ROMEO:\nBut soft, what li");
    assert_true(stopped);
    free(got);
    /* the earliest of several wins, whatever their order */
    const char *s2[] = {"window", "soft,", "zzz"};
    got = run_text(t, text, s2, 3, &stopped, &used);
    assert_string_equal(got, "ROMEO:\nBut ");
    free(got);
    /* a prefix that never completes is held back and then released at the end */
    const char *s3[] = {"breaks!"};
    got = run_text(t, text, s3, 1, &stopped, &used);
    assert_string_equal(got, text);
    assert_false(stopped);
    free(got);
    /* a stop at the very start gives empty text */
    const char *s4[] = {"RO"};
    got = run_text(t, text, s4, 1, &stopped, &used);
    assert_string_equal(got, "");
    assert_true(stopped);
    free(got);
    tok_free(t);
}

/* Held back: exactly the longest tail that is a proper prefix of a stop string. */
static void holdback(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    const char *stop[] = {"abc", "bd"};
    size_t len[] = {3, 2};
    struct textout o;
    struct err e = {0};
    assert_int_equal(textout_init(&o, t, true, stop, len, 2, &e), 0);
    static const struct {
        const char *text;
        size_t ready;
    } k_cases[] = {{"xxab", 2}, {"xxa", 2}, {"xxb", 2}, {"xxc", 3}, {"ab", 0}, {"", 0}};
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        o.len = strlen(k_cases[i].text);
        memcpy(o.text, k_cases[i].text, o.len + 1);
        assert_int_equal(textout_ready(&o), k_cases[i].ready);
    }
    textout_free(&o);
    /* an id outside the tokenizer (a padded model vocabulary) adds no text and is no error */
    assert_int_equal(textout_init(&o, t, true, NULL, NULL, 0, &e), 0);
    const char *piece;
    size_t plen;
    assert_int_equal(textout_push(&o, tok_vocab_size(t) + 5, &piece, &plen, &e), 0);
    assert_int_equal(o.len, 0);
    assert_int_equal(plen, 0);
    char buf[TOK_STREAM_CAP];
    assert_int_equal(textout_peek(&o, -1, buf, sizeof buf), 0);
    textout_free(&o);
    tok_free(t);
}

/* Multi-byte characters arrive whole even when the tokenizer splits their bytes. */
static void utf8_whole(void **state)
{
    (void)state;
    struct tokenizer *t = load_tok();
    bool stopped;
    int used;
    const char *text = "caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve \xf0\x9f\x98\x80!";
    const char *stop[] = {"\xf0\x9f\x98\x80"};
    char *got = run_text(t, text, stop, 1, &stopped, &used);
    assert_string_equal(got, "caf\xc3\xa9 \xe2\x80\x94 na\xc3\xafve ");
    assert_true(stopped);
    free(got);
    tok_free(t);
}

// ---- runner ----

#define N_JOBS 6

struct client {
    struct runner *r;
    struct runner_job job;
    pthread_cond_t cv;
    int32_t prompt[32];
};

static void job_init(struct client *cl, struct runner *r, int i, int n_vocab, int n_predict)
{
    memset(cl, 0, sizeof *cl);
    cl->r = r;
    pthread_cond_init(&cl->cv, NULL);
    int n = 3 + 5 * i;
    for (int j = 0; j < n; j++)
        cl->prompt[j] = (int32_t)((j * 37 + i * 11 + 3) % n_vocab);
    cl->job.prompt = cl->prompt;
    cl->job.n_prompt = n;
    cl->job.params = (struct gen_params){.n_predict = n_predict, .ignore_eos = true};
    sampler_params_default(&cl->job.params.sampling);
    cl->job.logprobs = true;
    cl->job.n_top = 2;
    cl->job.cv = &cl->cv;
}

static void wait_done(struct client *cl)
{
    runner_lock(cl->r);
    while (!cl->job.done)
        runner_wait_locked(cl->r, &cl->cv, 100);
    runner_unlock(cl->r);
}

static void *client_main(void *arg)
{
    struct client *cl = arg;
    struct runner_job *j = &cl->job;
    struct err e = {0};
    bool busy;
    if (runner_submit(cl->r, &j, 1, &busy, &e) < 0)
        return (void *)1;
    wait_done(cl);
    return NULL;
}

static int collect(void *ud, int32_t id)
{
    struct runner_job *want = ud;
    want->ids[want->n_out++] = id;
    return 0;
}

static void runner_together(void **state)
{
    (void)state;
    struct test_eng g;
    test_eng_open(&g, test_path(MODEL), NULL, 0, 256, N_JOBS, 16);
    int V = g.m->hp.n_vocab;
    /* each job alone through generate() */
    int32_t want[N_JOBS][12];
    for (int i = 0; i < N_JOBS; i++) {
        struct client cl;
        job_init(&cl, NULL, i, V, 12);
        struct runner_job w = {.ids = want[i]};
        struct gen_stats st;
        struct err e = {0};
        if (generate(g.c, g.kv, 0, cl.prompt, cl.job.n_prompt, &cl.job.params, collect, &w, &st, &e) < 0)
            fail_msg("%s", e.msg);
        assert_int_equal(w.n_out, 12);
        kv_seq_remove(g.kv, 0);
        pthread_cond_destroy(&cl.cv);
    }
    struct runner *r = NULL;
    struct err e = {0};
    struct runner_params rp = {.max_jobs = N_JOBS};
    assert_int_equal(runner_new(&r, g.c, g.kv, &rp, &e), 0);
    struct client cl[N_JOBS];
    pthread_t th[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        job_init(&cl[i], r, i, V, 12);
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    for (int i = 0; i < N_JOBS; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
        assert_int_equal(cl[i].job.rc, 0);
        assert_int_equal(cl[i].job.n_out, 12);
        assert_memory_equal(cl[i].job.ids, want[i], sizeof want[i]);
        /* greedy: the chosen id is the most likely, its logprob the top one */
        for (int k = 0; k < 12; k++) {
            assert_int_equal(cl[i].job.top_id[k * 2], cl[i].job.ids[k]);
            assert_float_equal(cl[i].job.top_lp[k * 2], cl[i].job.lp[k], 1e-6);
            assert_true(cl[i].job.lp[k] <= 0.0f && cl[i].job.top_lp[k * 2 + 1] <= cl[i].job.lp[k]);
        }
        runner_job_release(&cl[i].job);
        pthread_cond_destroy(&cl[i].cv);
    }
    struct runner_stats st;
    runner_get_stats(r, &st);
    assert_int_equal(st.n_waiting + st.n_running, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_true(st.n_steps < N_JOBS * 12);  /* batched: fewer steps than tokens */
    runner_free(r);
    test_eng_close(&g);
}

static void runner_busy_cancel(void **state)
{
    (void)state;
    struct test_eng g;
    test_eng_open(&g, test_path(MODEL), NULL, 0, 256, 2, 16);
    int V = g.m->hp.n_vocab;
    struct runner *r = NULL;
    struct err e = {0};
    struct runner_params rp = {.max_jobs = 2};
    assert_int_equal(runner_new(&r, g.c, g.kv, &rp, &e), 0);
    struct client a, b, c;
    job_init(&a, r, 0, V, 400);
    job_init(&b, r, 1, V, 400);
    job_init(&c, r, 2, V, 4);
    struct runner_job *ja = &a.job, *jb = &b.job, *jc = &c.job;
    bool busy;
    assert_int_equal(runner_submit(r, &ja, 1, &busy, &e), 0);
    assert_int_equal(runner_submit(r, &jb, 1, &busy, &e), 0);
    assert_int_equal(runner_submit(r, &jc, 1, &busy, &e), -ERR_RANGE);
    assert_true(busy);
    /* cancel a once it produced something: it ends early, as stopped by the client */
    runner_lock(r);
    while (a.job.n_out < 2)
        runner_wait_locked(r, &a.cv, 100);
    runner_cancel_locked(r, &a.job);
    runner_unlock(r);
    wait_done(&a);
    assert_int_equal(a.job.rc, 0);
    assert_int_equal(a.job.stats.stop, GEN_STOP_CALLBACK);
    assert_true(a.job.n_out < 400);
    /* now there is room */
    assert_int_equal(runner_submit(r, &jc, 1, &busy, &e), 0);
    wait_done(&c);
    assert_int_equal(c.job.n_out, 4);
    /* freeing the runner ends b */
    runner_free(r);
    assert_true(b.job.done);
    runner_job_release(&a.job);
    runner_job_release(&b.job);
    runner_job_release(&c.job);
    pthread_cond_destroy(&a.cv);
    pthread_cond_destroy(&b.cv);
    pthread_cond_destroy(&c.cv);
    assert_int_equal(kv_n_free_blocks(g.kv), g.kv->n_blocks);
    test_eng_close(&g);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(stop_strings),
    cmocka_unit_test(holdback),
    cmocka_unit_test(utf8_whole),
    cmocka_unit_test(runner_together),
    cmocka_unit_test(runner_busy_cancel),
};

TEST_SUITE(server, tests);
