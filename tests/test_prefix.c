/*
 * prefix: the prefix cache (kvcache.c's index, the scheduler's attach and
 * register; ADR 0022) on real checkpoints of the three cache kinds (full,
 * sliding-window mixed with full, latent), and on every recurrent family, whose hits
 * restore snapshots of the states kept at chosen block boundaries (ADR 0129).
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
#include <math.h>
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
    float *lg;                  /* non-NULL: the logits of its first token go here */
    int n_vocab;
};

static int on_token(void *ud, int32_t id, const float *logits)
{
    struct req *r = ud;
    if (r->lg && r->n_out == 0 && logits)
        memcpy(r->lg, logits, (size_t)r->n_vocab * sizeof *logits);
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
    r->n_vocab = n_vocab;
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

/* The models with recurrent layers (ADR 0057): every family's golden case. */
static const char *const k_rec_dirs[] = {
    "tests/fixtures/golden/lfm2", "tests/fixtures/golden/mamba", "tests/fixtures/golden/mamba2",
    "tests/fixtures/golden/falcon_h1", "tests/fixtures/golden/granitemoehybrid",
    "tests/fixtures/golden/nemotron_h", "tests/fixtures/golden/qwen3_next",
    "tests/fixtures/golden/qwen3_5_text", "tests/fixtures/golden/jamba", "tests/fixtures/golden/bamba",
    "tests/fixtures/golden/recurrent_gemma"};
#define N_REC (sizeof k_rec_dirs / sizeof k_rec_dirs[0])

/* A cache for f keeping at most n_snap snapshots of recurrent states (0: the default). */
static struct kv_cache *snap_kv_new(const struct test_model *f, int n_tokens, int max_seqs, int n_snap)
{
    struct err e = {0};
    struct kv_cache *kv = NULL;
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = max_seqs, .block_size = BLOCK,
                           .dtype = DTYPE_F32, .n_batch = f->c->n_batch, .n_snap = n_snap};
    if (kv_cache_new(&kv, f->m, f->be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
    return kv;
}

/* Largest |a - b| over n floats, and whether every pair is bitwise equal. */
static float max_diff(const float *a, const float *b, size_t n, bool *same)
{
    float d = 0;
    *same = memcmp(a, b, n * sizeof *a) == 0;
    for (size_t i = 0; i < n; i++)
        d = fabsf(a[i] - b[i]) > d ? fabsf(a[i] - b[i]) : d;
    return d;
}

/* Prefix cache on models with recurrent layers (ADR 0129): a hit restores the snapshot of the
 * states at its last block, so every request produces exactly what it produces alone from an
 * empty cache (ids; the logits of its first token equal those of a run without the cache:
 * bitwise but for the gated delta rule's blocked form, ADR 0071, within 1e-4 x max |logit|).
 * One after another: X + S0 computes all and keeps its last full block (48); X + S1 matches
 * X's 9 blocks without a snapshot there, so it computes all too and keeps one at 36, where it
 * parts from X + S0; X + S2 then hits 36 of 42 (a hit that ends mid-prompt); X + S0 again
 * hits 48, and X + S0 + S4 48; X + S0, its answer and more (the next turn of a chat) hits 52,
 * where X + S0's answer kept its states as it decoded past that boundary. Concurrently (some submitted while others
 * prefill) the outputs are the same. With one snapshot slot, Y's evict X + S0's: X + S0 again
 * matches its cached blocks but finds no snapshot, computes everything, and is right. */
static void prefix_recurrent(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_REC; d++) {
        const char *dir = k_rec_dirs[d];
        struct test_model f;
        struct req reqs[7], want[7];
        test_model_open(&f, dir);
        int V = f.m->hp.n_vocab;
        make_req(&reqs[0], 0, 37, 0, 12, V, 0);
        make_req(&reqs[1], 0, 37, 1, 12, V, 1);
        make_req(&reqs[2], 0, 37, 2, 5, V, 2);
        reqs[3] = reqs[0];
        reqs[4] = reqs[0];
        fill(reqs[4].toks + reqs[4].n, 6, 54, V);
        reqs[4].n += 6;
        make_req(&reqs[5], 9, 20, 5, 3, V, 5);   /* another prefix: Y */
        reference(&f, reqs, want, 6);
        /* the next turn: X + S0, its greedy answer (5 ids, 4 of them fed), 6 more */
        reqs[6] = reqs[0];
        memcpy(reqs[6].toks + reqs[6].n, want[0].ids, (size_t)want[0].n_out * sizeof(int32_t));
        reqs[6].n += want[0].n_out;
        fill(reqs[6].toks + reqs[6].n, 6, 56, V);
        reqs[6].n += 6;
        reference(&f, &reqs[6], &want[6], 1);
        static const int expect[7] = {0, 0, 36, 48, 48, -1, 52};

        struct kv_cache *kv = snap_kv_new(&f, 512, 4, 0);
        struct sched *s = sched_open(&f, kv, 16, false);
        float *lg = malloc((size_t)2 * V * sizeof *lg);
        assert_non_null(lg);
        for (int i = 0; i < 7; i++) {
            if (i == 5)
                continue;
            reqs[i].submit_at = 0;
            reqs[i].lg = lg;
            run_sched(&f, s, kv, &reqs[i], 1, &want[i], dir);
            if (reqs[i].n_cached != expect[i])
                fail_msg("%s: request %d found %d cached, expected %d", dir, i, reqs[i].n_cached, expect[i]);
            /* the first token's logits equal those of a run without the cache */
            struct kv_cache *cold = snap_kv_new(&f, 512, 1, 0);
            struct sched *c = sched_open(&f, cold, 16, true);
            reqs[i].lg = lg + V;
            run_sched(&f, c, cold, &reqs[i], 1, &want[i], dir);
            sched_free(c);
            kv_cache_free(cold);
            bool same;
            float md = max_diff(lg, lg + V, (size_t)V, &same), mx = 0;
            for (int j = 0; j < V; j++)
                mx = fabsf(lg[V + j]) > mx ? fabsf(lg[V + j]) : mx;
            printf("prefix snapshot %-40s request %d: %2d cached, logits %s (max diff %.3g of %.3g)\n", dir, i,
                   expect[i], same ? "bitwise equal" : "differ", (double)md, (double)mx);
            if (md > 1e-4f * mx)
                fail_msg("%s: request %d's logits differ from a cold run by %g (max |logit| %g)", dir, i,
                         (double)md, (double)mx);
            reqs[i].lg = NULL;
        }
        assert_true(kv_n_snapshots(kv) >= 2);
        sched_done(s, kv, dir);
        assert_int_equal(kv_n_snapshots(kv), 0);   /* cleared with their entries */

        /* concurrently: together at step 0, while others prefill, at the end */
        s = sched_open(&f, kv, 16, false);
        static const int at[5] = {0, 0, 2, 3, 12};
        for (int i = 0; i < 5; i++)
            reqs[i].submit_at = at[i];
        run_sched(&f, s, kv, reqs, 5, want, dir);
        assert_int_equal(reqs[4].n_cached, 48);
        sched_done(s, kv, dir);
        kv_cache_free(kv);

        /* one snapshot slot: Y's evict X + S0's; its blocks still match, but nothing is attached */
        kv = snap_kv_new(&f, 512, 2, 1);
        s = sched_open(&f, kv, 16, false);
        struct req *order[3] = {&reqs[0], &reqs[5], &reqs[3]};
        const struct req *ref[3] = {&want[0], &want[5], &want[3]};
        for (int k = 0; k < 3; k++) {
            order[k]->submit_at = 0;
            run_sched(&f, s, kv, order[k], 1, ref[k], dir);
            assert_int_equal(order[k]->n_cached, 0);
            assert_int_equal(kv_n_snapshots(kv), 1);
        }
        assert_int_equal(kv_prefix_match(kv, reqs[3].toks, reqs[3].n - 1), 48);
        assert_true(kv->snap.n_evicted >= 2);
        sched_done(s, kv, dir);
        kv_cache_free(kv);
        free(lg);
        test_model_close(&f);
    }
}

/* A long shared prefix (ADR 0129's tail snapshot, 16 blocks before a prompt's last full
 * block): X (90 ids) + S0 keeps its states at 28 and 92; X + S1 matches 88 ids and hits 28 (the
 * second request already finds most of what it shares); X + S2 hits 88, where X + S1 parted. */
static void prefix_recurrent_tail(void **state)
{
    (void)state;
    static const char *const dirs[] = {"tests/fixtures/golden/lfm2", "tests/fixtures/golden/mamba2",
                                       "tests/fixtures/golden/qwen3_next", "tests/fixtures/golden/recurrent_gemma"};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        struct test_model f;
        struct req reqs[3], want[3];
        test_model_open(&f, dirs[d]);
        int V = f.m->hp.n_vocab;
        for (int i = 0; i < 3; i++)
            make_req(&reqs[i], 1, 90, i, 5, V, i);
        reference(&f, reqs, want, 3);
        struct kv_cache *kv = snap_kv_new(&f, 1024, 4, 0);
        struct sched *s = sched_open(&f, kv, 16, false);
        static const int expect[3] = {0, 28, 88};
        for (int i = 0; i < 3; i++) {
            reqs[i].submit_at = 0;
            run_sched(&f, s, kv, &reqs[i], 1, &want[i], dirs[d]);
            if (reqs[i].n_cached != expect[i])
                fail_msg("%s: request %d found %d cached, expected %d", dirs[d], i, reqs[i].n_cached, expect[i]);
        }
        sched_done(s, kv, dirs[d]);
        kv_cache_free(kv);
        test_model_close(&f);
    }
}

/* Speculative decoding (prompt lookup, ADR 0112: checkpoint, restore, feed again) beside the
 * snapshots on Mamba-2 and Qwen3-Next: three prompts of a repeated phrase that share 30 ids,
 * one after another; the third hits where the second parted from the first (28), drafts are
 * made and rejected, and every output equals generate() alone with the same parameters. */
static void prefix_recurrent_spec(void **state)
{
    (void)state;
    static const char *const dirs[] = {"tests/fixtures/golden/mamba2", "tests/fixtures/golden/qwen3_next"};
    for (size_t d = 0; d < 2; d++) {
        struct test_model f;
        struct req reqs[3], want[3];
        test_model_open(&f, dirs[d]);
        int V = f.m->hp.n_vocab;
        for (int i = 0; i < 3; i++) {
            make_req(&reqs[i], 0, 30, i, 3, V, 0);
            for (int j = 0; j < 30; j++)
                reqs[i].toks[j] = (int32_t)((j % 5 * 31 + 5) % V);
            reqs[i].gp.n_predict = 12;
            spec_params_default(&reqs[i].gp.spec);
            reqs[i].gp.spec.mode = SPEC_NGRAM;
            reqs[i].gp.spec.draft_max = 4;
        }
        reference(&f, reqs, want, 3);
        struct kv_cache *kv = snap_kv_new(&f, 512, 4, 0);
        struct sched *s = sched_open(&f, kv, 16, false);
        static const int expect[3] = {0, 0, 28};
        for (int i = 0; i < 3; i++) {
            reqs[i].submit_at = 0;
            run_sched(&f, s, kv, &reqs[i], 1, &want[i], dirs[d]);
            if (reqs[i].n_cached != expect[i])
                fail_msg("%s: request %d found %d cached, expected %d", dirs[d], i, reqs[i].n_cached, expect[i]);
        }
        uint64_t drafted, accepted;
        sched_spec_stats(s, &drafted, &accepted);
        printf("prefix snapshot + speculation %-28s %llu drafted, %llu accepted\n", dirs[d],
               (unsigned long long)drafted, (unsigned long long)accepted);
        assert_true(drafted > 0);
        sched_done(s, kv, dirs[d]);
        kv_cache_free(kv);
        test_model_close(&f);
    }
}

/* Feeds toks[0 .. n) to seq 0 of a fresh cache in chunks of `chunk` rows, registers them,
 * takes the snapshot and returns a copy of it (host, [per] floats; caller frees). */
static float *snapshot_of(struct test_model *f, const int32_t *toks, int n, int chunk, size_t *per)
{
    struct err e = {0};
    struct batch b;
    struct kv_cache *kv = snap_kv_new(f, 256, 1, 0);
    float *lg = malloc((size_t)f->m->hp.n_vocab * sizeof *lg);
    assert_non_null(lg);
    assert_int_equal(batch_init(&b, 64, &e), 0);
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    for (int p = 0; p < n; p += chunk) {
        int k = n - p < chunk ? n - p : chunk;
        batch_clear(&b);
        batch_add_seq(&b, toks + p, k, p, 0, p + k == n, &e);
        if (model_forward(f->c, &b, kv, lg, &e) < 0)
            fail_msg("%s", e.msg);
    }
    assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 0);   /* nothing registered yet */
    kv_prefix_register(kv, 0, toks, n);
    assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 1);
    assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 0);   /* the entry has one */
    *per = kv->snap.per;
    float *out = malloc(*per * sizeof *out);
    assert_non_null(out);
    f->be->ops->download(f->be, out, kv->snap.buf, *per * sizeof *out);
    check_kv(kv, "snapshot");
    batch_free(&b);
    free(lg);
    kv_cache_free(kv);
    return out;
}

/* Chunked prefill keeps the same snapshot as one chunk: 36 ids in one forward, in chunks
 * of 5 rows and one row at a time give the same states at the boundary: bitwise for LFM2,
 * Mamba-2, Falcon-H1, Nemotron-H, Bamba and RecurrentGemma, within 1e-4 of the largest state
 * value for the others (measured on AVX-512: at most 2.8e-6 relative, the gated delta rule,
 * whose blocked form groups rows by chunk, ADR 0071; Mamba's scan and Granite's products
 * 5e-7; the golden bound is 1e-3). A length that is not a registered block boundary keeps
 * nothing. */
static void prefix_snapshot_chunked(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_REC; d++) {
        struct test_model f;
        int32_t toks[36];
        size_t per = 0;
        test_model_open(&f, k_rec_dirs[d]);
        fill(toks, 36, 3, f.m->hp.n_vocab);
        float *one = snapshot_of(&f, toks, 36, 36, &per);
        for (int chunk = 5; chunk > 0; chunk -= 4) {
            float *ch = snapshot_of(&f, toks, 36, chunk, &per);
            bool same;
            float md = max_diff(one, ch, per, &same), mx = 0;
            for (size_t i = 0; i < per; i++)
                mx = fabsf(one[i]) > mx ? fabsf(one[i]) : mx;
            printf("prefix snapshot %-40s chunks of %d: %zu floats %s (max diff %.3g of %.3g)\n", k_rec_dirs[d],
                   chunk, per, same ? "bitwise equal" : "differ", (double)md, (double)mx);
            assert_true(mx > 0);
            if (md > 1e-4f * mx)
                fail_msg("%s: the snapshot after chunks of %d differs by %g", k_rec_dirs[d], chunk, (double)md);
            free(ch);
        }
        free(one);

        /* 35 positions: no block ends there, nothing is kept */
        struct err e = {0};
        struct batch b;
        struct kv_cache *kv = snap_kv_new(&f, 256, 1, 0);
        float *lg = malloc((size_t)f.m->hp.n_vocab * sizeof *lg);
        assert_int_equal(batch_init(&b, 64, &e), 0);
        assert_int_equal(kv_seq_add(kv, 0, &e), 0);
        batch_add_seq(&b, toks, 35, 0, 0, true, &e);
        assert_int_equal(model_forward(f.c, &b, kv, lg, &e), 0);
        kv_prefix_register(kv, 0, toks, 35);
        assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 0);
        assert_int_equal(kv_n_snapshots(kv), 0);
        batch_free(&b);
        free(lg);
        kv_cache_free(kv);
        test_model_close(&f);
    }
}

/* The kv-level rules with recurrent layers (LFM2): a hit needs a snapshot exactly at its
 * boundary (an entry past it without one is not attached); kv_prefix_unsnap drops one; a
 * snapshot goes with its entry when
 * the block is reclaimed; snapshots off (n_snap < 0): nothing is kept or attached; truncate
 * only to 0 or the current length; a fork continues exactly as its source. */
static void prefix_recurrent_kv(void **state)
{
    (void)state;
    const char *dir = "tests/fixtures/golden/lfm2";
    struct test_model f;
    struct err e = {0};
    struct batch b;
    test_model_open(&f, dir);
    int V = f.m->hp.n_vocab;
    int32_t toks[24];
    fill(toks, 24, 4, V);
    float *la = malloc((size_t)2 * V * sizeof *la);
    assert_non_null(la);
    assert_int_equal(batch_init(&b, 64, &e), 0);
    /* a pool of 6 blocks: 16 positions with a snapshot at 8 and none at 16 */
    struct kv_cache *kv = snap_kv_new(&f, 6 * BLOCK, 2, 0);
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    for (int p = 0; p < 16; p += 8) {
        batch_clear(&b);
        batch_add_seq(&b, toks + p, 8, p, 0, true, &e);
        assert_int_equal(model_forward(f.c, &b, kv, la, &e), 0);
        kv_prefix_register(kv, 0, toks, p + 8);
        if (p == 0) {
            assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 1);
            kv_prefix_unsnap(kv, 0, 8);     /* dropped, and taken again */
            assert_int_equal(kv_n_snapshots(kv), 0);
            assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 1);
        }
    }
    check_kv(kv, "snapshot at 8");
    kv_seq_remove(kv, 0);
    assert_int_equal(kv_prefix_match(kv, toks, 20), 16);
    assert_int_equal(kv_seq_add(kv, 1, &e), 0);
    assert_int_equal(kv_prefix_attach(kv, 1, toks, 20), 8);  /* not 16: no snapshot there */
    kv_seq_remove(kv, 1);
    /* another 24 positions take every block: the cached ones are reclaimed, the snapshot goes */
    int32_t other[24];
    fill(other, 24, 5, V);
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    batch_clear(&b);
    batch_add_seq(&b, other, 24, 0, 0, true, &e);
    assert_int_equal(model_forward(f.c, &b, kv, la, &e), 0);
    assert_int_equal(kv_n_snapshots(kv), 0);
    check_kv(kv, "reclaimed");
    kv_seq_remove(kv, 0);
    assert_int_equal(kv_seq_add(kv, 1, &e), 0);
    assert_int_equal(kv_prefix_attach(kv, 1, toks, 20), 0);
    kv_seq_remove(kv, 1);
    kv_cache_free(kv);

    /* snapshots off */
    kv = snap_kv_new(&f, 256, 2, -1);
    assert_false(kv_can_snapshot(kv));
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    batch_clear(&b);
    batch_add_seq(&b, toks, 8, 0, 0, true, &e);
    assert_int_equal(model_forward(f.c, &b, kv, la, &e), 0);
    kv_prefix_register(kv, 0, toks, 8);
    assert_int_equal(kv_prefix_snapshot(kv, 0, &e), 0);
    kv_seq_remove(kv, 0);
    assert_int_equal(kv_seq_add(kv, 1, &e), 0);
    assert_int_equal(kv_prefix_attach(kv, 1, toks, 12), 0);
    kv_seq_remove(kv, 1);

    /* truncate: only to 0 or the current length; fork: the copy continues as the source */
    assert_int_equal(kv_seq_add(kv, 0, &e), 0);
    batch_clear(&b);
    batch_add_seq(&b, toks, 10, 0, 0, true, &e);
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
 * recomputation over shared blocks, outputs unchanged; the readmitted find their blocks
 * (with recurrent layers: where their snapshots are). */
static void prefix_preemption(void **state)
{
    (void)state;
    /* and on recurrent models, whose hits end at snapshots (ADR 0129) */
    static const char *const dirs[] = {"models/llama-tiny", "tests/fixtures/golden/lfm2",
                                       "tests/fixtures/golden/mamba2", "tests/fixtures/golden/qwen3_next"};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        struct test_model f;
        test_model_open(&f, dirs[d]);
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
        run_sched(&f, s, kv, reqs, 6, want, dirs[d]);
        int hits = 0;
        for (int i = 0; i < 6; i++)
            hits += reqs[i].n_cached > 0;
        printf("prefix + preemption %-36s %d of 6 hit\n", dirs[d], hits);
        assert_true(hits >= 3);
        sched_done(s, kv, dirs[d]);
        kv_cache_free(kv);
        test_model_close(&f);
    }
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
    cmocka_unit_test(prefix_recurrent_tail),
    cmocka_unit_test(prefix_recurrent_spec),
    cmocka_unit_test(prefix_snapshot_chunked),
    cmocka_unit_test(prefix_recurrent_kv),
    cmocka_unit_test(prefix_lru_eviction),
    cmocka_unit_test(prefix_hash_collision),
    cmocka_unit_test(prefix_preemption),
    cmocka_unit_test(prefix_runner_stats),
};

TEST_SUITE(prefix, tests);
