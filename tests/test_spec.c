/*
 * spec: speculative decoding (engine/spec.h, generate.c's verification).
 *
 * spec_<case>: for every golden case, greedy generation with drafts gives the ids plain
 * decoding gives, and leaves the cache as long: prompt lookup; an oracle whose drafts are
 * the plain output (all accepted); a drafter that is always wrong (all rejected); one
 * wrong at a moving position (partly accepted); short drafts with draft_min; a callback
 * that stops inside an accepted run; a context that ends mid-draft; draft models (the model
 * itself: all accepted; another of the same vocabulary). Hybrid and recurrent models (their
 * states restored from a checkpoint and the kept rows fed again, ADR 0112) are among them and
 * must not say spec_off; models whose rope follows the length (dynamic NTK, LongRoPE) decode
 * plainly, saying so.
 *
 * spec_sampling: with sampling, sampler_sample_draft's results follow sampler_sample's
 * distribution (two-sample chi-square over 60000 draws each, temperature, top-k, top-p,
 * min-p, penalties and a bias on), whatever the draft: likely, unlikely, filtered out.
 *
 * spec_ngram: the prompt-lookup drafter on hand-made histories.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fscan.h"
#include "core/safetensors.h"
#include "engine/generate.h"
#include "engine/spec.h"
#include "test.h"

#define N_GEN 24

struct collect {
    int32_t ids[N_GEN + 1];
    int n;
    int stop_after;  /* > 0: the callback stops generation after this many */
};

static int on_id(void *ud, int32_t id)
{
    struct collect *c = ud;
    if (c->n < N_GEN + 1)
        c->ids[c->n] = id;
    c->n++;
    return c->stop_after > 0 && c->n >= c->stop_after;
}

/* A test drafter over the plain run's output: mode 0 the truth (all accepted), 1 always
 * wrong, 2 wrong at one position of each draft (moving with the step). */
struct oracle {
    const struct collect *want;
    int n_prompt, mode, V, step;
};

static int oracle_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    struct oracle *o = ud;
    (void)seq;
    (void)hist;
    int at = n - o->n_prompt, k = 0;
    for (; k < max && at + k < o->want->n; k++) {
        int32_t t = o->want->ids[at + k];
        bool wrong = o->mode == 1 || (o->mode == 2 && k == o->step % 4);
        out[k] = wrong ? (t + 1) % o->V : t;
    }
    o->step++;
    return k;
}

struct run {
    struct collect got;
    struct gen_stats st;
    int kv_len;
};

static void run_gen(struct test_eng *g, const int32_t *prompt, int n_prompt, const struct spec_params *sp,
                    int stop_after, struct run *r)
{
    struct gen_params gp = {.n_predict = N_GEN, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    if (sp)
        gp.spec = *sp;
    memset(r, 0, sizeof *r);
    r->got.stop_after = stop_after;
    struct err e = {0};
    if (generate(g->c, g->kv, 0, prompt, n_prompt, &gp, on_id, &r->got, &r->st, &e) < 0)
        fail_msg("generate: %s", e.msg);
    r->kv_len = kv_seq_len(g->kv, 0);
}

static void same(const char *name, const char *what, const struct run *plain, const struct run *r)
{
    if (r->got.n != plain->got.n)
        fail_msg("%s, %s: %d ids, plain decoding %d", name, what, r->got.n, plain->got.n);
    for (int i = 0; i < r->got.n && i <= N_GEN; i++)
        if (r->got.ids[i] != plain->got.ids[i])
            fail_msg("%s, %s: id %d is %d, plain decoding %d", name, what, i, r->got.ids[i], plain->got.ids[i]);
    if (r->kv_len != plain->kv_len)
        fail_msg("%s, %s: the cache holds %d positions, plain decoding %d", name, what, r->kv_len, plain->kv_len);
    if (r->st.stop != plain->st.stop)
        fail_msg("%s, %s: stop %d, plain decoding %d", name, what, (int)r->st.stop, (int)plain->st.stop);
}

/* g's cache replaced by one with a context of ctx (max_seq_len) in a pool with room to spare,
 * its sliding-window layers keeping 16 positions of slack (speculative decoding's rollback, as
 * the CLI asks for --draft-max). */
static void with_context(struct test_eng *g, int ctx)
{
    struct kv_params kp = {.n_tokens = 256, .max_seqs = 1, .max_seq_len = ctx, .block_size = 4,
                           .dtype = test_kv_dtype, .n_batch = g->c->n_batch, .swa_slack = 16};
    struct err e = {0};
    kv_cache_free(g->kv);
    if (kv_cache_new(&g->kv, g->m, g->be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
}

/* All drafters against plain decoding on one engine (ctx: the context's size). */
static void check_drafters(const char *name, const char *dir, const int32_t *prompt, int L, int ctx)
{
    struct test_eng g;
    struct err e = {0};
    test_eng_open(&g, dir, NULL, 0, 256, 1, 4);
    with_context(&g, ctx);
    int V = g.m->hp.n_vocab;
    bool can = kv_spec_back_max(g.kv) > 0;  /* recurrent layers too: checkpoints (ADR 0112) */
    for (int il = 0; il < g.m->hp.n_layer; il++)  /* generate.c's rope_follows_length */
        can &= g.m->hp.layer[il].n_rot == 0 ||
               (g.m->hp.layer[il].rope != ROPE_DYNAMIC && g.m->hp.layer[il].rope != ROPE_LONGROPE);
    struct run plain, r;
    run_gen(&g, prompt, L, NULL, 0, &plain);

    struct spec_params sp;
    spec_params_default(&sp);
    sp.mode = SPEC_NGRAM;
    run_gen(&g, prompt, L, &sp, 0, &r);
    same(name, "prompt lookup", &plain, &r);
    assert_true(r.st.spec_off == !can);
    for (int il = 0; il < g.m->hp.n_layer; il++)
        if (g.m->hp.layer[il].kv == KV_RECURRENT && r.st.spec_off)
            fail_msg("%s: recurrent layers, yet speculation was switched off", name);

    struct oracle o = {&plain.got, L, 0, V, 0};
    spec_params_default(&sp);
    sp.draft = oracle_draft;
    sp.draft_ud = &o;
    static const char *const what[] = {"all accepted", "all rejected", "partly accepted"};
    for (int mode = 0; mode < 3; mode++) {
        o.mode = mode;
        o.step = 0;
        run_gen(&g, prompt, L, &sp, 0, &r);
        same(name, what[mode], &plain, &r);
        if (!can) {
            assert_true(r.st.spec_off && r.st.n_drafted == 0);
            continue;
        }
        assert_true(r.st.n_drafted > 0);
        if (mode == 0 && r.st.n_accepted != r.st.n_drafted)
            fail_msg("%s, oracle: %d of %d drafted accepted", name, r.st.n_accepted, r.st.n_drafted);
        if (mode == 1 && r.st.n_accepted != 0)
            fail_msg("%s, always wrong: %d accepted", name, r.st.n_accepted);
        if (mode == 2 && (r.st.n_accepted == 0 || r.st.n_accepted == r.st.n_drafted))
            fail_msg("%s, wrong at one position: %d of %d accepted", name, r.st.n_accepted, r.st.n_drafted);
    }
    /* short drafts, and drafts below draft_min not sent */
    o.mode = 0;
    sp.draft_max = 3;
    sp.draft_min = 3;
    run_gen(&g, prompt, L, &sp, 0, &r);
    same(name, "drafts of 3", &plain, &r);
    /* draft models: the model itself (greedy: every draft accepted) and golden llama where the
     * vocabularies agree (most drafts rejected); each in its own cache on the same backend */
    const char *drafts[] = {dir, golden_case_dir("llama")};
    struct run plain_b;
    run_gen(&g, prompt + 1, L - 1, NULL, 0, &plain_b);
    for (int d = 0; d < 2 && can; d++) {
        struct test_eng dg;
        test_eng_open(&dg, drafts[d], g.be, 0, 256, 1, 4);
        with_context(&dg, 0);  /* the model's own context */
        struct spec_model *sm = NULL;
        if (spec_model_check(g.m, dg.m, dg.kv, &e) < 0) {
            assert_int_equal(d, 1);  /* only the other model may differ */
            test_eng_close(&dg);
            continue;
        }
        assert_int_equal(spec_model_new(&sm, dg.c, dg.kv, &e), 0);
        struct spec_params dp;
        spec_params_default(&dp);
        dp.mode = SPEC_DRAFT;
        dp.draft = spec_model_draft;
        dp.draft_ud = sm;
        dp.prefill = d == 1 ? spec_model_prefill : NULL;  /* with and without the prompt fed ahead */
        run_gen(&g, prompt, L, &dp, 0, &r);
        same(name, d ? "draft model llama" : "itself as the draft model", &plain, &r);
        assert_null(spec_model_error(sm));
        assert_true(r.st.n_drafted > 0);
        if (d == 0 && r.st.n_accepted != r.st.n_drafted)
            fail_msg("%s, itself as the draft model: %d of %d accepted", name, r.st.n_accepted, r.st.n_drafted);
        /* again on the same drafter: its cache follows the new history (truncated back) */
        run_gen(&g, prompt + 1, L - 1, &dp, 0, &r);
        same(name, "the draft model on a second prompt", &plain_b, &r);
        if (d == 0 && r.st.n_accepted != r.st.n_drafted)  /* a stale draft cache would draft wrong */
            fail_msg("%s, itself as the draft model, second prompt: %d of %d accepted", name, r.st.n_accepted,
                     r.st.n_drafted);
        spec_model_free(sm);
        test_eng_close(&dg);
    }
    /* a callback (a stop string) that stops inside an accepted run: the cache as plain's */
    struct run plain7;
    run_gen(&g, prompt, L, NULL, 7, &plain7);
    sp.draft_max = 16;
    sp.draft_min = 1;
    run_gen(&g, prompt, L, &sp, 7, &r);
    same(name, "stopped by the callback after 7", &plain7, &r);
    test_eng_close(&g);
}

static void spec_case(void **state)
{
    const char *name = *state;
    char dir[512];
    struct st_set *gs = NULL;
    struct tensor ids;
    snprintf(dir, sizeof dir, "%s", golden_case_dir(name));
    golden_case_input_ids(name, &gs, &ids);
    int L = (int)ids.shape[0];
    /* the prompt twice over, so that prompt lookup finds n-grams to draft from */
    int32_t prompt[128];
    for (int i = 0; i < 2 * L; i++)
        prompt[i] = ((const int32_t *)ids.data)[i % L];
    check_drafters(name, dir, prompt, 2 * L, 2 * L + N_GEN + 8);
    /* a context that ends 9 positions after the prompt: drafts are cut at its end */
    check_drafters(name, dir, prompt, 2 * L, 2 * L + 9);
    printf("spec %-22s greedy ids and cache equal plain decoding with every drafter\n", name);
    st_set_free(gs);
}

// ---- sampling ----

/* Counts of n draws of id over V ids, plain (draft < 0) or drafted. */
static void draws(const struct sampler_params *p, const float *logits, int V, int32_t draft, int n, long *count)
{
    struct sampler *s = NULL;
    struct err e = {0};
    assert_int_equal(sampler_new(&s, p, V, &e), 0);
    sampler_accept(s, 2);  /* context for the repetition penalty */
    sampler_accept_output(s, 5);
    memset(count, 0, (size_t)V * sizeof *count);
    for (int i = 0; i < n; i++) {
        bool acc = false;
        int32_t id = draft < 0 ? sampler_sample(s, logits) : sampler_sample_draft(s, logits, draft, &acc);
        assert_true(id >= 0 && id < V);
        assert_true(draft < 0 || acc == (id == draft));
        count[id]++;
    }
    sampler_free(s);
}

static void spec_sampling(void **state)
{
    (void)state;
    enum { V = 12, N = 60000 };
    const float logits[V] = {2.0f, 1.5f, 1.4f, 0.2f, -0.5f, 1.0f, 0.9f, -3.0f, 0.0f, 0.3f, 1.45f, -1.0f};
    static const struct sampler_bias bias[] = {{8, 0.7f}};
    struct sampler_params cases[3];
    for (int c = 0; c < 3; c++)
        sampler_params_default(&cases[c]);
    cases[0].temperature = 1.0f;
    cases[1].temperature = 0.7f, cases[1].top_k = 6, cases[1].top_p = 0.9f;
    cases[2].temperature = 1.3f, cases[2].min_p = 0.1f, cases[2].repeat_penalty = 1.3f,
    cases[2].presence_penalty = 0.4f, cases[2].bias = bias, cases[2].n_bias = 1;
    for (int c = 0; c < 3; c++) {
        cases[c].seed = 100 + (uint64_t)c;
        long ref[V], got[V];
        draws(&cases[c], logits, V, -1, N, ref);
        /* a likely draft, a middling one, one the filters drop (7: lowest logit) */
        static const int32_t drafts[] = {0, 6, 7};
        for (size_t d = 0; d < sizeof drafts / sizeof drafts[0]; d++) {
            struct sampler_params p = cases[c];
            p.seed += 1000;
            draws(&p, logits, V, drafts[d], N, got);
            /* two-sample chi-square over the ids either side drew; df = cells - 1 */
            double chi = 0;
            int cells = 0;
            for (int i = 0; i < V; i++) {
                if (ref[i] + got[i] == 0)
                    continue;
                if ((ref[i] == 0) != (got[i] == 0) && ref[i] + got[i] > 10)
                    fail_msg("case %d, draft %d: id %d drawn %ld vs %ld times", c, drafts[d], i, ref[i], got[i]);
                double diff = (double)ref[i] - (double)got[i];
                chi += diff * diff / (double)(ref[i] + got[i]);
                cells++;
            }
            /* p = 0.001 critical values of chi-square for df 1..11 */
            static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59,
                                          31.26};
            int df = cells - 1;
            printf("spec sampling case %d draft %d: chi-square %.2f, df %d (critical %.2f)\n", c, drafts[d], chi, df,
                   crit[df]);
            assert_true(df >= 1 && chi < crit[df]);
        }
    }
    /* greedy: the argmax, accepted only when it is the draft */
    struct sampler_params gp;
    sampler_params_default(&gp);
    struct sampler *s = NULL;
    struct err e = {0};
    assert_int_equal(sampler_new(&s, &gp, V, &e), 0);
    bool acc = true;
    assert_int_equal(sampler_sample_draft(s, logits, 3, &acc), 0);
    assert_false(acc);
    assert_int_equal(sampler_sample_draft(s, logits, 0, &acc), 0);
    assert_true(acc);
    sampler_free(s);
}

/* A seeded sequence sampled with drafts gives the tokens plain sampling gives with the same
 * seed, whatever the drafts (right, wrong, filtered out) and however long the runs verified
 * together: the scheduler cuts a request's draft to its step's row budget, so a run's length
 * depends on the other requests, and the output must not (ADR 0116). Before, a draft's
 * acceptance took a uniform of its own and a rejection another for the draw: other tokens. */
static void spec_sampling_same_tokens(void **state)
{
    (void)state;
    enum { V = 12, N = 400 };
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.9f, p.top_k = 8, p.top_p = 0.95f, p.repeat_penalty = 1.1f, p.seed = 77;
    struct sampler *plain = NULL, *drafted = NULL;
    struct err e = {0};
    assert_int_equal(sampler_new(&plain, &p, V, &e), 0);
    assert_int_equal(sampler_new(&drafted, &p, V, &e), 0);
    float logits[V];
    uint64_t x = 12345;
    int n_acc = 0, n_rej = 0;
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < V; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            logits[i] = (float)((x >> 40) % 4000) / 1000.0f - 2.0f;
        }
        int32_t want = sampler_sample(plain, logits);
        int32_t got;
        bool acc = false;
        if (t % 5 == 4) {
            got = sampler_sample(drafted, logits);  /* a plain step between drafted runs */
        } else {
            /* a right draft, one wrong, one the filters drop */
            int32_t draft = t % 3 == 0 ? want : t % 3 == 1 ? (want + 1) % V : fscan_argmax(logits, V) ^ 1;
            got = sampler_sample_draft(drafted, logits, draft, &acc);
            assert_true(acc == (got == draft));
            n_acc += acc;
            n_rej += !acc;
        }
        if (got != want)
            fail_msg("token %d: drafted %d, plain %d", t, got, want);
        sampler_accept_output(plain, want);
        sampler_accept_output(drafted, got);
    }
    assert_true(n_acc > 0 && n_rej > 0);
    sampler_free(plain);
    sampler_free(drafted);
}

static void spec_ngram_lookup(void **state)
{
    (void)state;
    int32_t out[8];
    /* "a b c d x a b c" -> the 3-gram "a b c" occurred at 0: draft "d x a b c" (up to max) */
    static const int32_t h1[] = {1, 2, 3, 4, 9, 1, 2, 3};
    assert_int_equal(spec_ngram(h1, 8, 1, 3, out, 8), 5);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 9);
    assert_int_equal(spec_ngram(h1, 8, 1, 3, out, 2), 2);
    /* the most recent occurrence wins: "7 5 ... 7 6 ... 7" drafts 6 */
    static const int32_t h2[] = {7, 5, 0, 7, 6, 0, 7};
    assert_int_equal(spec_ngram(h2, 7, 1, 1, out, 1), 1);
    assert_int_equal(out[0], 6);
    /* the longest n-gram first: "1 2" occurred before "3 2"'s 2 */
    static const int32_t h3[] = {1, 2, 8, 3, 2, 9, 1, 2};
    assert_int_equal(spec_ngram(h3, 8, 1, 2, out, 1), 1);
    assert_int_equal(out[0], 8);
    assert_int_equal(spec_ngram(h3, 8, 2, 2, out, 1), 1);
    /* nothing to match, too short, no room */
    static const int32_t h4[] = {1, 2, 3};
    assert_int_equal(spec_ngram(h4, 3, 1, 3, out, 4), 0);
    assert_int_equal(spec_ngram(h4, 1, 1, 3, out, 4), 0);
    assert_int_equal(spec_ngram(h1, 8, 1, 3, out, 0), 0);
    /* a run of one token drafts more of it */
    static const int32_t h5[] = {4, 4, 4};
    assert_int_equal(spec_ngram(h5, 3, 1, 3, out, 4), 1);
    assert_int_equal(out[0], 4);
    /* parameter bounds */
    struct spec_params p;
    struct err e = {0};
    spec_params_default(&p);
    p.mode = SPEC_NGRAM;
    assert_int_equal(spec_params_check(&p, &e), 0);
    p.draft_max = 0;
    assert_int_equal(spec_params_check(&p, &e), -ERR_ARG);
    p.draft_max = 4;
    p.draft_min = 5;
    assert_int_equal(spec_params_check(&p, &e), -ERR_ARG);
    p.draft_min = 1;
    p.ngram_min = 4;
    p.ngram_max = 3;
    assert_int_equal(spec_params_check(&p, &e), -ERR_ARG);
}

/* A draft model drafting for two sequences in a pool too small for both histories: the
 * other sequence is dropped and rebuilt on demand, never an error. */
static void spec_draft_pool(void **state)
{
    (void)state;
    struct test_eng g;
    struct err e = {0};
    test_eng_open(&g, golden_case_dir("llama"), NULL, 0, 64, 2, 4);
    struct spec_model *sm = NULL;
    assert_int_equal(spec_model_new(&sm, g.c, g.kv, &e), 0);
    int32_t h0[40], h1[40], out[4], again[4];
    for (int i = 0; i < 40; i++) {
        h0[i] = (i * 7 + 3) % g.m->hp.n_vocab;
        h1[i] = (i * 11 + 5) % g.m->hp.n_vocab;
    }
    /* the prompt fed ahead: all but its last token, which the first draft feeds */
    spec_model_prefill(sm, 0, h0, 40);
    assert_int_equal(kv_seq_len(g.kv, 0), 39);
    spec_model_prefill(sm, 0, h0, 40);  /* holding it already: nothing more */
    assert_int_equal(kv_seq_len(g.kv, 0), 39);
    assert_int_equal(spec_model_draft(sm, 0, h0, 40, out, 4), 4);
    assert_int_equal(kv_seq_len(g.kv, 0), 43);
    assert_int_equal(spec_model_draft(sm, 1, h1, 40, again, 4), 4);  /* 43 + 43 > 64 slots */
    assert_null(spec_model_error(sm));
    assert_int_equal(spec_model_draft(sm, 0, h0, 40, again, 4), 4);  /* rebuilt: the same draft */
    assert_memory_equal(out, again, sizeof out);
    assert_null(spec_model_error(sm));
    spec_model_free(sm);
    test_eng_close(&g);
}

/* The pace: halves to 1, then pauses 1, 2, 4 ... 64 steps, a kept draft ends the pauses,
 * all kept doubles back up. */
static void spec_pacing(void **state)
{
    (void)state;
    struct spec_pace a;
    spec_pace_init(&a, 16);
    assert_int_equal(spec_pace_len(&a), 16);
    for (int want = 8; want >= 1; want /= 2) {
        spec_pace_update(&a, 0, spec_pace_len(&a));
        assert_int_equal(spec_pace_len(&a), want);
    }
    /* at length 1, nothing kept: pauses of 1, 2, 4 ... 64, 64 plain steps */
    for (int pause = 1, n = 0; n < 9; n++, pause = pause * 2 < SPEC_PAUSE_MAX ? pause * 2 : SPEC_PAUSE_MAX) {
        spec_pace_update(&a, 0, 1);
        for (int i = 0; i < pause; i++) {
            assert_int_equal(spec_pace_len(&a), 0);
            spec_pace_update(&a, 0, 0);
        }
        assert_int_equal(spec_pace_len(&a), 1);
    }
    /* one kept ends the pauses (the next rejection pauses 1 step), all kept doubles */
    spec_pace_update(&a, 1, 1);
    assert_int_equal(spec_pace_len(&a), 2);
    spec_pace_update(&a, 1, 2);
    assert_int_equal(spec_pace_len(&a), 2);
    spec_pace_update(&a, 0, 2);
    spec_pace_update(&a, 0, 1);
    assert_int_equal(spec_pace_len(&a), 0);
    spec_pace_update(&a, 0, 0);
    assert_int_equal(spec_pace_len(&a), 1);
    for (int i = 0; i < 8; i++)
        spec_pace_update(&a, spec_pace_len(&a), spec_pace_len(&a));
    assert_int_equal(spec_pace_len(&a), 16);
}

/* Runs the gate for tokens of output in steps of `step` tokens, a drafting step taking
 * sd seconds a token and a plain one sp; the tokens output by drafting steps returned. */
static int gate_run(struct spec_gate *g, int tokens, int step, double sd, double sp)
{
    int drafted = 0;
    for (int out = 0; out < tokens; out += step) {
        bool d = spec_gate_drafts(g);
        drafted += d ? step : 0;
        spec_gate_update(g, step, step * (d ? sd : sp));
    }
    return drafted;
}

/* The gate (ADR 0148): drafting timed against plain steps, the faster held, holds doubling
 * while the same mode wins, both timed again after each; a draft model stays plain. */
static void spec_gating(void **state)
{
    (void)state;
    struct spec_gate g;
    /* drafting twice as fast: it drafts but for the 16 plain tokens of each round */
    spec_gate_init(&g, false);
    assert_true(spec_gate_drafts(&g));
    assert_int_equal(gate_run(&g, SPEC_GATE_SPEC, 4, 0.5, 1.0), SPEC_GATE_SPEC);
    assert_false(spec_gate_drafts(&g));                 /* the plain window */
    assert_int_equal(gate_run(&g, SPEC_GATE_PLAIN, 1, 0.5, 1.0), 0);
    assert_true(spec_gate_drafts(&g) && g.hold == SPEC_GATE_HOLD);
    assert_int_equal(gate_run(&g, SPEC_GATE_HOLD, 4, 0.5, 1.0), SPEC_GATE_HOLD);
    /* the next round: drafting wins again, twice the hold */
    gate_run(&g, SPEC_GATE_SPEC + SPEC_GATE_PLAIN, 1, 0.5, 1.0);
    assert_true(spec_gate_drafts(&g) && g.phase == 2 && g.hold == 2 * SPEC_GATE_HOLD);
    for (int i = 0; i < 8; i++)     /* up to the longest hold */
        gate_run(&g, g.left + SPEC_GATE_SPEC + SPEC_GATE_PLAIN, 1, 0.5, 1.0);
    assert_int_equal(g.hold, SPEC_GATE_HOLD_MAX);

    /* plain steps faster: plain holds, then drafting is timed again, and wins back when it
     * turns faster (the hold back to its first length) */
    spec_gate_init(&g, false);
    gate_run(&g, SPEC_GATE_SPEC + SPEC_GATE_PLAIN, 2, 1.5, 1.0);
    assert_true(!spec_gate_drafts(&g) && g.plain && g.hold == SPEC_GATE_HOLD);
    assert_int_equal(gate_run(&g, SPEC_GATE_HOLD, 1, 1.5, 1.0), 0);
    assert_true(spec_gate_drafts(&g) && g.phase == 0);
    gate_run(&g, SPEC_GATE_SPEC + SPEC_GATE_PLAIN, 1, 0.9, 1.0);
    assert_true(spec_gate_drafts(&g) && !g.plain && g.hold == SPEC_GATE_HOLD);

    /* a draft model: once plain wins, it stays plain */
    spec_gate_init(&g, true);
    gate_run(&g, SPEC_GATE_SPEC + SPEC_GATE_PLAIN, 1, 1.5, 1.0);
    assert_false(spec_gate_drafts(&g));
    assert_int_equal(gate_run(&g, 20 * SPEC_GATE_HOLD_MAX, 8, 0.1, 1.0), 0);
    /* ... but a winning draft model is timed again like any drafter */
    spec_gate_init(&g, true);
    gate_run(&g, SPEC_GATE_SPEC + SPEC_GATE_PLAIN + SPEC_GATE_HOLD, 1, 0.5, 1.0);
    assert_true(spec_gate_drafts(&g) && g.phase == 0);
}

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static struct CMUnitTest *t;
    static size_t n;
    if (!t) {
        static const struct CMUnitTest extra[] = {
            cmocka_unit_test(spec_sampling),
            cmocka_unit_test(spec_sampling_same_tokens),
            cmocka_unit_test(spec_ngram_lookup),
            cmocka_unit_test(spec_pacing),
            cmocka_unit_test(spec_gating),
            cmocka_unit_test(spec_draft_pool),
        };
        golden_case_tests("spec_", spec_case, extra, sizeof extra / sizeof extra[0], &t, &n);
    }
    *tests = t;
    *n_tests = n;
}

TEST_SUITE_BUILT(spec, build_tests);
