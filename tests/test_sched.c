/*
 * sched: continuous batching (src/engine/scheduler.c) on real checkpoints.
 *
 * Every request served by the scheduler, whatever else runs beside it, must
 * produce exactly the tokens generate() produces for it alone (greedy and
 * seeded sampling): requests submitted at different steps, prompts longer
 * than one step's row budget (prefilled over several steps), a pool too
 * small for all of them at once (preemption by recomputation), cancellation,
 * and refused submissions. on_done is called exactly once per request.
 * With speculative decoding (prompt lookup on prompts that repeat), each
 * request equals generate() alone with the same parameters (greedy and
 * sampled), and the greedy ones equal plain decoding, while requests without
 * drafts and prefills share the steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "test.h"

#define N_REQ   6
#define MAX_GEN 24

struct out {
    int32_t ids[MAX_GEN];
    int n, done, rc;
    enum gen_stop stop;
    int cancel_after;       /* > 0: stop from the callback after this many tokens */
};

static int on_token(void *ud, int32_t id)
{
    struct out *o = ud;
    if (o->n < MAX_GEN)
        o->ids[o->n++] = id;
    return o->cancel_after > 0 && o->n >= o->cancel_after;
}

static void on_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct out *o = ud;
    (void)e;
    o->done++;
    o->rc = rc;
    o->stop = st->stop;
}

static int on_token_row(void *ud, int32_t id, const float *logits)
{
    (void)logits;
    return on_token(ud, id);
}

/* The callbacks of one request writing to o (sched_submit copies them). */
static const struct sched_cb *cbs(struct out *o)
{
    static struct sched_cb cb;
    cb = (struct sched_cb){.on_token = on_token_row, .on_done = on_done, .ud = o};
    return &cb;
}

/* 0: plain; 1: speculative decoding for even requests (prompt lookup, drafts of up to 4);
 * 2: the same parameters, drafts turned off (the plain reference of spec mode 1) */
static int g_spec;
/* compare only the greedy (even) requests: a step's row budget or a short pool cuts drafts,
 * so sampled requests draw differently than alone (in distribution, the same) */
static bool g_greedy_only;
/* tokens drafted and rejected by the last run_sched in spec mode 1 */
static uint64_t g_drafted, g_rejected;

/* Request i: a prompt of 3 + 7 i tokens (the longest spans several 16-row steps); with
 * g_spec, a phrase of 5 repeated, so that prompt lookup drafts. */
static int g_vocab;  /* the vocabulary of the last prompt_of */

static int prompt_of(int i, int n_vocab, int32_t *p)
{
    g_vocab = n_vocab;
    int n = 3 + 7 * i;
    for (int j = 0; j < n; j++)
        p[j] = (int32_t)(((g_spec ? j % 5 : j) * 31 + i * 17 + 5) % n_vocab);
    return n;
}

/* spec_params.prefill in spec mode 1: the calls, and those whose history was not a whole
 * prompt of prompt_of (the scheduler feeds the drafter the prompt once it is in) */
static int g_prefills, g_prefills_bad;

static void count_prefill(void *ud, int seq, const int32_t *hist, int n)
{
    (void)ud;
    (void)seq;
    int32_t want[3 + 7 * N_REQ];
    int i = (n - 3) / 7, ok = n >= 3 && (n - 3) % 7 == 0 && i < N_REQ;
    if (ok) {
        prompt_of(i, g_vocab, want);
        ok = memcmp(hist, want, (size_t)n * sizeof *hist) == 0;
    }
    g_prefills++;
    g_prefills_bad += !ok;
}

static struct gen_params params_of(int i)
{
    struct gen_params gp = {.n_predict = 6 + i % 3 * 4, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    gp.sampling.seed = 7 + (uint64_t)i;
    gp.sampling.temperature = i % 2 ? 0.8f : 0.0f;   /* greedy and seeded sampling */
    if (g_spec) {
        gp.n_predict += 8;
        spec_params_default(&gp.spec);
        gp.spec.mode = g_spec == 1 && i % 3 != 2 ? SPEC_NGRAM : SPEC_NONE;
        gp.spec.draft_max = 4;
        gp.spec.prefill = g_spec == 1 ? count_prefill : NULL;
    }
    return gp;
}

/* Each request alone through generate(). */
static void run_alone(struct test_model *f, struct out *want)
{
    struct err e = {0};
    struct kv_cache *kv = test_kv_new(f, 256, 1, 4);
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[64];
        int n = prompt_of(i, f->m->hp.n_vocab, p);
        struct gen_params gp = params_of(i);
        struct gen_stats st;
        memset(&want[i], 0, sizeof want[i]);
        if (generate(f->c, kv, 0, p, n, &gp, on_token, &want[i], &st, &e) < 0)
            fail_msg("%s", e.msg);
        want[i].stop = st.stop;
    }
    kv_cache_free(kv);
}

/* All requests through one scheduler: half submitted up front, the rest after two steps. */
static void run_sched(struct test_model *f, int pool_tokens, int budget, struct out *got, const struct out *want,
                      const char *what)
{
    struct err e = {0};
    struct kv_cache *kv = test_kv_new(f, pool_tokens, N_REQ, 4);
    struct sched *s = NULL;
    struct sched_params sp = {.max_batch_tokens = budget};
    assert_int_equal(sched_new(&s, f->c, kv, &sp, &e), 0);
    int submitted = 0, steps = 0, rc;
    memset(got, 0, sizeof(struct out) * N_REQ);
    do {
        if (steps == 0 || steps == 2)
            for (int k = 0; k < N_REQ / 2; k++, submitted++) {
                int32_t p[64];
                int n = prompt_of(submitted, f->m->hp.n_vocab, p);
                struct gen_params gp = params_of(submitted);
                assert_int_equal(sched_submit(s, p, n, &gp, cbs(&got[submitted]), NULL, &e), 0);
            }
        rc = sched_step(s, &e);
        if (rc < 0)
            fail_msg("%s: %s", what, e.msg);
        steps++;
        assert_true(steps < 500);
    } while (rc > 0 || submitted < N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(got[i].done, 1);
        assert_int_equal(got[i].rc, 0);
        if (g_greedy_only && i % 2)
            continue;
        if (got[i].n != want[i].n || memcmp(got[i].ids, want[i].ids, (size_t)got[i].n * 4) != 0 ||
            got[i].stop != want[i].stop)
            fail_msg("%s: request %d: %d tokens (stop %d) differ from %d alone (stop %d)", what, i,
                     got[i].n, got[i].stop, want[i].n, want[i].stop);
    }
    assert_int_equal(kv_n_free_blocks(kv), kv->n_blocks);
    printf("sched %-28s %d requests in %d steps, %s identical to each alone\n", what, N_REQ, steps,
           g_greedy_only ? "the greedy ones" : "all");
    if (g_spec == 1) {
        uint64_t drafted, accepted;
        sched_spec_stats(s, &drafted, &accepted);
        printf("sched %-28s %llu tokens drafted, %llu accepted\n", what, (unsigned long long)drafted,
               (unsigned long long)accepted);
        assert_true(accepted <= drafted);
        g_drafted = drafted;
        g_rejected = drafted - accepted;
    }
    sched_free(s);
    kv_cache_free(kv);
}

static void sched_equals_alone(void **state)
{
    (void)state;
    static const char *const dirs[] = {"models/llama-tiny", "tests/fixtures/golden/phixtral_mlx_q4"};
    for (size_t d = 0; d < 2; d++) {
        struct test_model f;
        struct out want[N_REQ], got[N_REQ];
        test_model_open(&f, dirs[d]);
        run_alone(&f, want);
        run_sched(&f, 512, 16, got, want, dirs[d]);
        /* 64 slots hold the largest request (52 tokens) but not all of them (183): preemption */
        run_sched(&f, 64, 16, got, want, "small pool (preemption)");
        test_model_close(&f);
    }
}

static void sched_cancel_and_refuse(void **state)
{
    (void)state;
    struct test_model f;
    struct err e = {0};
    test_model_open(&f, "models/llama-tiny");
    struct kv_cache *kv = test_kv_new(&f, 64, 2, 4);
    struct sched *s = NULL;
    assert_int_equal(sched_new(&s, f.c, kv, NULL, &e), 0);
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct gen_params gp = params_of(0);
    struct out a = {.cancel_after = 2}, b = {0}, c = {0};
    int id_b;
    assert_int_equal(sched_submit(s, p, 8, &gp, cbs(&a), NULL, &e), 0);
    assert_int_equal(sched_submit(s, p, 4, &gp, cbs(&b), &id_b, &e), 0);
    assert_int_equal(sched_submit(s, p, 3, &gp, cbs(&c), NULL, &e), 0);
    assert_int_equal(sched_n_waiting(s), 3);
    assert_int_equal(sched_step(s, &e), 1);                 /* a and b run, c waits for a sequence */
    assert_int_equal(sched_n_running(s), 2);
    assert_true(sched_cancel(s, id_b));
    assert_false(sched_cancel(s, id_b));
    assert_int_equal(b.done, 1);
    assert_int_equal(b.stop, GEN_STOP_CALLBACK);
    while (sched_step(s, &e) > 0)
        ;
    assert_int_equal(a.done, 1);
    assert_int_equal(a.n, 2);                               /* its callback stopped it */
    assert_int_equal(a.stop, GEN_STOP_CALLBACK);
    assert_int_equal(c.done, 1);
    assert_int_equal(c.n, gp.n_predict);
    /* refused: empty, too long for the context, ids outside the vocabulary */
    int32_t bad = f.m->hp.n_vocab, *big = calloc(600, sizeof *big);
    assert_int_equal(sched_submit(s, p, 0, &gp, cbs(&a), NULL, &e), -ERR_ARG);
    assert_int_equal(sched_submit(s, big, 600, &gp, cbs(&a), NULL, &e), -ERR_RANGE);
    assert_int_equal(sched_submit(s, &bad, 1, &gp, cbs(&a), NULL, &e), -ERR_RANGE);
    assert_int_equal(a.done, 1);
    free(big);
    /* requests still queued when the scheduler is freed end once */
    struct out d = {0};
    assert_int_equal(sched_submit(s, p, 3, &gp, cbs(&d), NULL, &e), 0);
    sched_free(s);
    assert_int_equal(d.done, 1);
    assert_int_equal(kv_n_free_blocks(kv), kv->n_blocks);
    kv_cache_free(kv);
    test_model_close(&f);
}

static void sched_spec_equals_alone(void **state)
{
    (void)state;
    static const char *const dirs[] = {"models/llama-tiny", "tests/fixtures/golden/phixtral_mlx_q4",
                                       "tests/fixtures/golden/qwen3_moe",
                                       /* recurrent and hybrid: rejected drafts roll back to a
                                        * checkpoint, the kept rows fed again (ADR 0112) */
                                       "tests/fixtures/golden/mamba2", "tests/fixtures/golden/falcon_h1",
                                       "tests/fixtures/golden/qwen3_next", "tests/fixtures/golden/granitemoehybrid",
                                       "tests/fixtures/golden/jamba", "tests/fixtures/golden/nemotron_h"};
    bool rec_mixed = false;
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        struct test_model f;
        struct out want[N_REQ], got[N_REQ], plain[N_REQ];
        test_model_open(&f, dirs[d]);
        g_spec = 2;
        run_alone(&f, plain);
        g_spec = 1;
        run_alone(&f, want);
        for (int i = 0; i < N_REQ; i += 2)  /* greedy: speculation changes nothing */
            if (want[i].n != plain[i].n || memcmp(want[i].ids, plain[i].ids, (size_t)want[i].n * 4) != 0)
                fail_msg("%s: request %d with drafts differs from plain decoding", dirs[d], i);
        /* a budget of 64 rows never cuts a draft (6 x 5 rows), so sampled requests draw as alone */
        g_prefills = g_prefills_bad = 0;
        run_sched(&f, 512, 64, got, want, "speculative");
        /* the drafting requests (i % 3 != 2: 4 of 6) each fed their prompt to the drafter once */
        if (g_prefills != 4 || g_prefills_bad)
            fail_msg("%s: spec_params.prefill called %d times (%d not with the prompt), not 4", dirs[d],
                     g_prefills, g_prefills_bad);
        printf("sched %-28s %s: %llu drafted, %llu rejected\n", "speculative", dirs[d],
               (unsigned long long)g_drafted, (unsigned long long)g_rejected);
        /* drafts accepted and rejected both; the recurrent models drafting, and between them
         * all accepted (mamba2), all rejected (falcon_h1...) and some of each: rolled back */
        assert_true(g_drafted > 0);
        if (d < 3)
            assert_true(g_rejected > 0 && g_rejected < g_drafted);
        else
            rec_mixed |= g_rejected > 0 && g_rejected < g_drafted;
        /* 16 rows a step and a pool too small for all: drafts cut, dropped, preemption */
        g_greedy_only = true;
        run_sched(&f, 64, 16, got, want, "speculative, small pool");
        g_greedy_only = false;
        g_spec = 0;
        test_model_close(&f);
    }
    assert_true(rec_mixed);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sched_equals_alone),
    cmocka_unit_test(sched_spec_equals_alone),
    cmocka_unit_test(sched_cancel_and_refuse),
};

TEST_SUITE(sched, tests);
