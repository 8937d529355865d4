/*
 * prefix: the prefix cache (kvcache.c's index, the scheduler's attach and
 * register; ADR 0022) on real checkpoints of the three cache kinds (full,
 * sliding-window mixed with full, latent), and its absence for recurrent layers (ADR 0057).
 *
 * A request that finds its prompt's prefix cached must produce exactly the
 * tokens generate() produces for it alone from an empty cache (greedy and
 * seeded sampling), whether the prefix was left by a finished request or is
 * being prefilled by a running one; n_cached says what it found. Eviction
 * takes the least recently used chain first; a hash that collides for every
 * block changes hits into misses, never into another prompt's KV; preemption
 * still reproduces the outputs; after every step the pool's bookkeeping holds
 * (kv_check), and clearing the index returns every block to the free list.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "test.h"

#define MAX_REQ  8
#define MAX_TOK  96
#define MAX_GEN  16
#define BLOCK    4

struct req {
    int32_t toks[MAX_TOK];
    int n;
    struct gen_params gp;
    int submit_at;              /* step before which it is submitted */
    /* results */
    int32_t ids[MAX_GEN];
    int n_out, done, rc, n_cached;
    enum gen_stop stop;
};

static int on_token(void *ud, int32_t id, const float *logits)
{
    struct req *r = ud;
    (void)logits;
    if (r->n_out < MAX_GEN)
        r->ids[r->n_out++] = id;
    return 0;
}

static void on_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct req *r = ud;
    (void)e;
    r->done++;
    r->rc = rc;
    r->stop = st->stop;
    r->n_cached = st->n_cached;
}

/* n ids of stream `which` (distinct streams differ in their first id). */
static void fill(int32_t *t, int n, int which, int n_vocab)
{
    for (int j = 0; j < n; j++)
        t[j] = (int32_t)((j * 37 + which * 101 + 3 + (j == 0 ? which : 0)) % n_vocab);
}

/* Request: prefix stream `pfx` of n_pfx ids, then n_suf ids of stream `suf`. */
static void make_req(struct req *r, int pfx, int n_pfx, int suf, int n_suf, int n_vocab, int i)
{
    memset(r, 0, sizeof *r);
    fill(r->toks, n_pfx, pfx, n_vocab);
    fill(r->toks + n_pfx, n_suf, suf + 50, n_vocab);
    r->n = n_pfx + n_suf;
    r->gp = (struct gen_params){.n_predict = 5 + i % 3 * 3, .ignore_eos = true};
    sampler_params_default(&r->gp.sampling);
    r->gp.sampling.seed = 11 + (uint64_t)i;
    r->gp.sampling.temperature = i % 2 ? 0.9f : 0.0f;   /* greedy and seeded sampling */
}

static int gen_cb(void *ud, int32_t id)
{
    return on_token(ud, id, NULL);
}

/* The reference tokens of each request: generate() alone. */
static void reference(struct test_model *f, const struct req *reqs, struct req *want, int n)
{
    struct err e = {0};
    struct kv_cache *kv = test_kv_new(f, 256, 1, BLOCK);
    for (int i = 0; i < n; i++) {
        struct gen_stats st;
        want[i] = reqs[i];
        want[i].n_out = 0;
        if (generate(f->c, kv, 0, want[i].toks, want[i].n, &want[i].gp, gen_cb, &want[i], &st, &e) < 0)
            fail_msg("%s", e.msg);
        want[i].stop = st.stop;
    }
    kv_cache_free(kv);
}

static void check_kv(const struct kv_cache *kv, const char *what)
{
    struct err e = {0};
    if (kv_check(kv, &e) < 0)
        fail_msg("%s: %s", what, e.msg);
}

/* Submits reqs[i] before step reqs[i].submit_at and steps until all are done; checks the
 * pool after every step and every output against want. */
static void run_sched(struct test_model *f, struct sched *s, struct kv_cache *kv, struct req *reqs, int n,
                      const struct req *want, const char *what)
{
    struct err e = {0};
    int steps = 0, rc, submitted = 0;
    do {
        for (int i = 0; i < n; i++)
            if (reqs[i].submit_at == steps) {
                struct sched_cb cb = {.on_token = on_token, .on_done = on_done, .ud = &reqs[i]};
                reqs[i].n_out = reqs[i].done = 0;
                assert_int_equal(sched_submit(s, reqs[i].toks, reqs[i].n, &reqs[i].gp, &cb, NULL, &e), 0);
                submitted++;
            }
        if ((rc = sched_step(s, &e)) < 0)
            fail_msg("%s: %s", what, e.msg);
        check_kv(kv, what);
        steps++;
        assert_true(steps < 1000);
    } while (rc > 0 || submitted < n);
    for (int i = 0; i < n; i++) {
        const struct req *g = &reqs[i], *w = &want[i];
        assert_int_equal(g->done, 1);
        assert_int_equal(g->rc, 0);
        if (g->n_out != w->n_out || memcmp(g->ids, w->ids, (size_t)g->n_out * 4) != 0 || g->stop != w->stop)
            fail_msg("%s: request %d (%d cached): %d tokens differ from %d alone", what, i, g->n_cached,
                     g->n_out, w->n_out);
    }
    (void)f;
}

static struct sched *sched_open(struct test_model *f, struct kv_cache *kv, int budget, bool off)
{
    struct err e = {0};
    struct sched *s = NULL;
    struct sched_params sp = {.max_batch_tokens = budget, .no_prefix_cache = off};
    if (sched_new(&s, f->c, kv, &sp, &e) < 0)
        fail_msg("%s", e.msg);
    return s;
}

/* Frees s, checks that only the cache holds blocks, clears it: every block free. */
static void sched_done(struct sched *s, struct kv_cache *kv, const char *what)
{
    sched_free(s);
    check_kv(kv, what);
    assert_int_equal(kv_n_free_blocks(kv), kv->n_blocks);
    kv_prefix_clear(kv);
    check_kv(kv, what);
    assert_int_equal(kv_n_cached_blocks(kv), 0);
    assert_int_equal(kv->blk.n_free, kv->n_blocks);
    assert_int_equal(kv->px.n_indexed, 0);
}

/* A shared prefix of 37 ids (9 full blocks) and six suffixes; sequential, then concurrent. */
static void prefix_equals_cold(void **state)
{
    (void)state;
    static const char *const dirs[] = {"models/llama-tiny", "tests/fixtures/golden/gemma3_text",
                                       "tests/fixtures/golden/deepseek_v2"};
    for (size_t d = 0; d < 3; d++) {
        struct test_model f;
        struct req reqs[6], want[6];
        int P = 37, full = P / BLOCK * BLOCK;
        test_model_open(&f, dirs[d]);
        int V = f.m->hp.n_vocab;
        for (int i = 0; i < 6; i++)
            make_req(&reqs[i], 0, P, i, i == 5 ? 0 : 1 + 3 * i, V, i);
        reference(&f, reqs, want, 6);

        /* one after another: every request after the first finds the prefix */
        struct kv_cache *kv = test_kv_new(&f, 512, 4, BLOCK);
        struct sched *s = sched_open(&f, kv, 16, false);
        for (int i = 0; i < 6; i++) {
            reqs[i].submit_at = 0;
            run_sched(&f, s, kv, &reqs[i], 1, &want[i], dirs[d]);
            int expect = i == 0 ? 0 : (reqs[i].n - 1) / BLOCK * BLOCK < full ? (reqs[i].n - 1) / BLOCK * BLOCK : full;
            if (reqs[i].n_cached < expect)
                fail_msg("%s: request %d found %d tokens cached, expected >= %d", dirs[d], i,
                         reqs[i].n_cached, expect);
        }
        uint64_t q, h;
        sched_prefix_stats(s, &q, &h);
        assert_true(h > 0 && h < q);
        sched_done(s, kv, dirs[d]);

        /* concurrently: three together at step 0 (none can hit: nothing is computed yet),
         * two while the first ones are prefilling (16 rows a step, so part of the prefix
         * is registered), one at the end */
        s = sched_open(&f, kv, 16, false);
        static const int at[6] = {0, 0, 0, 2, 2, 12};
        for (int i = 0; i < 6; i++)
            reqs[i].submit_at = at[i];
        run_sched(&f, s, kv, reqs, 6, want, dirs[d]);
        assert_int_equal(reqs[0].n_cached, 0);
        assert_true(reqs[3].n_cached >= 2 * BLOCK);
        assert_int_equal(reqs[5].n_cached, full);     /* its last id is computed: 36 of 37 */
        printf("prefix %-36s cached %d %d %d %d %d %d of 37+\n", dirs[d], reqs[0].n_cached,
               reqs[1].n_cached, reqs[2].n_cached, reqs[3].n_cached, reqs[4].n_cached, reqs[5].n_cached);
        sched_done(s, kv, dirs[d]);

        /* the cache off: no hit, same outputs */
        s = sched_open(&f, kv, 16, true);
        run_sched(&f, s, kv, reqs, 6, want, "prefix cache off");
        for (int i = 0; i < 6; i++)
            assert_int_equal(reqs[i].n_cached, 0);
        assert_int_equal(kv_n_cached_blocks(kv), 0);
        sched_done(s, kv, "prefix cache off");
        kv_cache_free(kv);
        test_model_close(&f);
    }
}

/* A model with recurrent layers (LFM2: short convolutions, ADR 0057): its states cannot be
 * rebuilt from cached blocks, so nothing is found cached and every output equals the cold
 * reference, one after another and concurrently; the cache's other rules hold for it: a
 * sequence truncates only to 0 or its length, and a fork continues exactly as its source. */
static void prefix_recurrent(void **state)
{
    (void)state;
    const char *dir = "tests/fixtures/golden/lfm2";
    struct test_model f;
    struct req reqs[4], want[4];
    test_model_open(&f, dir);
    int V = f.m->hp.n_vocab;
    for (int i = 0; i < 4; i++)
        make_req(&reqs[i], 0, 37, i, 1 + 2 * i, V, i);
    reference(&f, reqs, want, 4);
    struct kv_cache *kv = test_kv_new(&f, 512, 4, BLOCK);
    struct sched *s = sched_open(&f, kv, 16, false);
    for (int i = 0; i < 4; i++) {
        reqs[i].submit_at = 0;
        run_sched(&f, s, kv, &reqs[i], 1, &want[i], dir);
        assert_int_equal(reqs[i].n_cached, 0);
    }
    static const int at[4] = {0, 0, 2, 6};
    for (int i = 0; i < 4; i++)
        reqs[i].submit_at = at[i];
    run_sched(&f, s, kv, reqs, 4, want, dir);
    for (int i = 0; i < 4; i++)
        assert_int_equal(reqs[i].n_cached, 0);
    assert_int_equal(kv_n_cached_blocks(kv), 0);
    sched_done(s, kv, dir);

    /* truncate: only to 0 or the current length; fork: the copy continues as the source */
    struct err e = {0};
    struct batch b;
    float *la = malloc((size_t)2 * V * sizeof *la);
    assert_non_null(la);
    assert_int_equal(batch_init(&b, 64, &e), 0);
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    batch_add_seq(&b, reqs[0].toks, 10, 0, 0, true, &e);
    assert_int_equal(model_forward(f.c, &b, kv, la, &e), 0);
    assert_true(kv_seq_truncate(kv, 0, 5, &e) < 0);
    assert_non_null(strstr(e.msg, "recurrent"));
    assert_int_equal(kv_seq_truncate(kv, 0, 10, &e), 0);
    assert_int_equal(kv_seq_fork(kv, 0, 1, &e), 0);
    batch_clear(&b);
    batch_add(&b, 7, 10, 0, true, &e);
    batch_add(&b, 7, 10, 1, true, &e);
    assert_int_equal(model_forward(f.c, &b, kv, la, &e), 0);
    assert_memory_equal(la, la + V, (size_t)V * sizeof *la);
    assert_int_equal(kv_seq_truncate(kv, 1, 0, &e), 0);
    kv_seq_remove(kv, 0);
    kv_seq_remove(kv, 1);
    batch_free(&b);
    free(la);
    kv_cache_free(kv);
    test_model_close(&f);
}

/* A pool of 16 blocks: prefixes A, B (24 ids + 2 each, 7 full blocks cached per run), A
 * again (A becomes the most recently used), then C: its blocks are taken from the least
 * recently used chain, B's, so A is still found whole and B only in part. */
static void prefix_lru_eviction(void **state)
{
    (void)state;
    struct test_model f;
    test_model_open(&f, "models/llama-tiny");
    int V = f.m->hp.n_vocab;
    struct req a, b, c, want;
    make_req(&a, 1, 24, 1, 2, V, 0);
    make_req(&b, 2, 24, 2, 2, V, 2);
    make_req(&c, 3, 24, 3, 2, V, 4);
    a.gp.n_predict = b.gp.n_predict = c.gp.n_predict = 4;
    struct kv_cache *kv = test_kv_new(&f, 16 * BLOCK, 2, BLOCK);
    struct sched *s = sched_open(&f, kv, 16, false);
    struct req *order[6] = {&a, &b, &a, &c, &a, &b};
    static const int expect_min[6] = {0, 0, 24, 0, 24, 0}, expect_max[6] = {0, 0, 24, 0, 24, 20};
    for (int k = 0; k < 6; k++) {
        struct req *r = order[k];
        reference(&f, r, &want, 1);
        r->submit_at = 0;
        run_sched(&f, s, kv, r, 1, &want, "lru");
        if (r->n_cached < expect_min[k] || r->n_cached > expect_max[k])
            fail_msg("lru: run %d found %d cached, expected [%d, %d]", k, r->n_cached, expect_min[k],
                     expect_max[k]);
        assert_true(kv_n_cached_blocks(kv) > 0);
    }
    printf("prefix lru: A and B cached, A reused, C evicts B's chain first: B finds %d of 24\n", b.n_cached);
    sched_done(s, kv, "lru");
    kv_cache_free(kv);
    test_model_close(&f);
}

/* Every block hashes to the same value: lookups must still compare tokens and the parent
 * entry. X+Y1 cached; X+Y2 finds X only; Z+Y1 (Y1's ids after another head) finds nothing;
 * Y1 at position 0 finds nothing; X+Y1 again finds all of it. */
static void prefix_hash_collision(void **state)
{
    (void)state;
    struct test_model f;
    test_model_open(&f, "models/llama-tiny");
    int V = f.m->hp.n_vocab;
    struct req r[5], want[5];
    make_req(&r[0], 4, 12, 1, 13, V, 0);      /* X (3 blocks) + Y1 */
    make_req(&r[1], 4, 12, 2, 13, V, 1);      /* X + Y2 */
    make_req(&r[2], 5, 12, 1, 13, V, 2);      /* Z + Y1 */
    make_req(&r[3], 1 + 50, 13, 0, 0, V, 3);  /* Y1's ids alone, at position 0 */
    r[4] = r[0];
    reference(&f, r, want, 5);
    struct kv_cache *kv = test_kv_new(&f, 512, 2, BLOCK);
    kv->px.hash_mask = 0;
    struct sched *s = sched_open(&f, kv, 16, false);
    static const int expect[5] = {0, 12, 0, 0, 24};
    for (int i = 0; i < 5; i++) {
        r[i].submit_at = 0;
        run_sched(&f, s, kv, &r[i], 1, &want[i], "collision");
        if (r[i].n_cached != expect[i])
            fail_msg("collision: request %d found %d cached, expected %d", i, r[i].n_cached, expect[i]);
    }
    sched_done(s, kv, "collision");
    kv_cache_free(kv);
    test_model_close(&f);
}

/* Six requests sharing a 20-id prefix in a pool that cannot hold them all: preemption by
 * recomputation over shared blocks, outputs unchanged; the readmitted find their blocks. */
static void prefix_preemption(void **state)
{
    (void)state;
    struct test_model f;
    test_model_open(&f, "models/llama-tiny");
    int V = f.m->hp.n_vocab;
    struct req reqs[6], want[6];
    for (int i = 0; i < 6; i++) {
        make_req(&reqs[i], 6, 20, i, 2 + 5 * i, V, i);
        reqs[i].gp.n_predict = 12;
        reqs[i].submit_at = i < 3 ? 0 : 3;
    }
    reference(&f, reqs, want, 6);
    struct kv_cache *kv = test_kv_new(&f, 20 * BLOCK, 6, BLOCK);
    struct sched *s = sched_open(&f, kv, 16, false);
    run_sched(&f, s, kv, reqs, 6, want, "prefix + preemption");
    int hits = 0;
    for (int i = 0; i < 6; i++)
        hits += reqs[i].n_cached > 0;
    assert_true(hits >= 3);
    sched_done(s, kv, "prefix + preemption");
    kv_cache_free(kv);
    test_model_close(&f);
}

/* The runner mirrors the scheduler's counts: two jobs with one prompt, one after the other. */
static void prefix_runner_stats(void **state)
{
    (void)state;
    struct test_model f;
    struct err e = {0};
    test_model_open(&f, "models/llama-tiny");
    struct kv_cache *kv = test_kv_new(&f, 512, 2, BLOCK);
    struct runner *run = NULL;
    struct runner_params rp = {.max_jobs = 2};
    assert_int_equal(runner_new(&run, f.c, kv, &rp, &e), 0);
    struct req src;
    make_req(&src, 7, 30, 0, 3, f.m->hp.n_vocab, 0);
    pthread_cond_t cv;
    pthread_cond_init(&cv, NULL);
    int32_t first[MAX_GEN];
    for (int k = 0; k < 2; k++) {
        struct runner_job j = {.prompt = src.toks, .n_prompt = src.n, .params = src.gp, .cv = &cv};
        struct runner_job *jp = &j;
        bool busy;
        assert_int_equal(runner_submit(run, &jp, 1, &busy, &e), 0);
        runner_lock(run);
        while (!j.done)
            runner_wait_locked(run, &cv, 100);
        runner_unlock(run);
        assert_int_equal(j.rc, 0);
        assert_int_equal(j.stats.n_cached, k == 0 ? 0 : 32);
        if (k == 0)
            memcpy(first, j.ids, (size_t)j.n_out * sizeof *first);
        else
            assert_memory_equal(first, j.ids, (size_t)j.n_out * sizeof *first);
        runner_job_release(&j);
    }
    struct runner_stats st;
    /* the mirror is written after the step that ended the job (the job is done, and
     * its waiter may wake, inside that step): wait for the one that shows nothing running */
    for (int t = 0; t < 1000; t++) {
        runner_get_stats(run, &st);
        if (st.prefix_query_tokens == 66 && st.n_running == 0 && st.n_waiting == 0)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(st.prefix_query_tokens, 66);
    assert_int_equal(st.prefix_hit_tokens, 32);
    assert_true(st.kv_blocks_cached > 0);
    runner_free(run);
    pthread_cond_destroy(&cv);
    kv_cache_free(kv);
    test_model_close(&f);
}


/* Bookkeeping without a forward: two sequences that computed the same blocks share them
 * after registering; an indexed block outlives its sequences as cached and is attached
 * again; a write into an indexed block (after a truncation into it) copies it first. */
static void prefix_kv_blocks(void **state)
{
    (void)state;
    struct test_model f;
    struct err e = {0};
    test_model_open(&f, "models/llama-tiny");
    struct kv_cache *kv = test_kv_new(&f, 16 * BLOCK, 3, BLOCK);
    int32_t toks[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, want[3] = {10, 10, -1};
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    assert_int_equal(kv_seq_add(kv, 1, &e), 0);
    assert_int_equal(kv_reserve(kv, want, &e), 0);
    assert_int_equal(kv_n_free_blocks(kv), 10);
    kv_prefix_register(kv, 0, toks, 10);
    kv_prefix_register(kv, 1, toks, 10);         /* its two full blocks become seq 0's */
    assert_int_equal(kv_n_free_blocks(kv), 12);
    assert_int_equal(kv_slot(kv, 1, 7), kv_slot(kv, 0, 7));
    assert_true(kv_slot(kv, 1, 9) != kv_slot(kv, 0, 9));
    check_kv(kv, "dedup");
    kv_seq_remove(kv, 0);
    assert_int_equal(kv_n_cached_blocks(kv), 0);  /* seq 1 still holds them */
    kv_seq_remove(kv, 1);
    assert_int_equal(kv_n_cached_blocks(kv), 2);
    assert_int_equal(kv_n_free_blocks(kv), kv->n_blocks);
    assert_int_equal(kv_seq_add(kv, 2, &e), 0);
    assert_int_equal(kv_prefix_attach(kv, 2, toks, 10), 8);
    assert_int_equal(kv_n_cached_blocks(kv), 0);
    int32_t old = kv_slot(kv, 2, 5);
    assert_int_equal(kv_seq_truncate(kv, 2, 6, &e), 0);
    want[0] = want[1] = -1;
    want[2] = 8;
    assert_int_equal(kv_reserve(kv, want, &e), 0);
    assert_true(kv_slot(kv, 2, 5) != old);         /* copied before the write */
    assert_int_equal(kv_n_cached_blocks(kv), 1);   /* the indexed original stays cached */
    check_kv(kv, "copy on write of an indexed block");
    kv_seq_remove(kv, 2);
    kv_prefix_clear(kv);
    check_kv(kv, "clear");
    assert_int_equal(kv->blk.n_free, kv->n_blocks);
    kv_cache_free(kv);
    test_model_close(&f);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(prefix_kv_blocks),
    cmocka_unit_test(prefix_equals_cold),
    cmocka_unit_test(prefix_recurrent),
    cmocka_unit_test(prefix_lru_eviction),
    cmocka_unit_test(prefix_hash_collision),
    cmocka_unit_test(prefix_preemption),
    cmocka_unit_test(prefix_runner_stats),
};

TEST_SUITE(prefix, tests);
