/*
 * window: sliding-window layers keep at most their window in the cache
 * (ADR 0023).
 *
 * Golden fixtures with sliding layers (gemma3_text: sliding + full,
 * mistral_swa: every layer sliding, gpt_oss: sliding + full with sinks) get
 * a window of 5 and run in blocks of 2 through a context of 3-row chunks,
 * to 24 positions (more than 3x beyond the window): a 7-token prompt, then
 * one token at a time, two sequences batched. Every logit row must equal
 * the unbounded path's: the same positions computed in one chunk, where
 * nothing is released. After every forward the pool's bookkeeping checks
 * out (kv_check) and each sequence holds at most the window plus a chunk of
 * sliding blocks; the sliding pool itself is that bound times the sequences
 * (plus one block), below the full pool. Then the prefix cache: registered
 * after every forward as the scheduler does, a new sequence attaches the
 * history (its window's sliding blocks are still cached) and continues with
 * the same logits; a truncation below what the sliding layers still hold is
 * refused and changes nothing. A chunk longer than the pool was sized for
 * fails naming the sliding layers and leaves the sequence as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/batch.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/selftest.h"
#include "test.h"

#define W        5    /* the window every sliding layer gets */
#define BS       2    /* block size */
#define NB       3    /* rows per forward chunk */
#define T        24   /* positions per sequence */
#define PROMPT   7
#define TOL      1e-5

struct wrun {
    struct backend *be;
    struct model *m;
    struct model_ctx *c;
    struct kv_cache *kv;
    struct batch b;
    int V;
    int32_t toks[2][T];
    float *ref[2];   /* [T][V] the unbounded path */
    float *out;      /* [NB * 2 + T][V] */
};

static void wrun_open(struct wrun *r, const char *fixture)
{
    struct err e = {0};
    char patch[64];
    memset(r, 0, sizeof *r);
    snprintf(patch, sizeof patch, "{\"sliding_window\": %d}", W);
    if (test_backend_new(&r->be, 2, &e) < 0 || stest_load_variant(&r->m, fixture, patch, NULL, &e) < 0 ||
        model_prepare(r->m, r->be, &e) < 0 || batch_init(&r->b, 2 * T, &e) < 0)
        fail_msg("%s: %s", fixture, e.msg);
    r->V = r->m->hp.n_vocab;
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < T; i++)
            r->toks[q][i] = (int32_t)((7 + 31 * i + 101 * q + i * i) % r->V);
    r->out = malloc((size_t)2 * T * r->V * sizeof(float));
    assert_non_null(r->out);
}

static void wrun_close(struct wrun *r)
{
    kv_cache_free(r->kv);
    model_ctx_free(r->c);
    model_free(r->m);
    backend_free(r->be);
    batch_free(&r->b);
    free(r->ref[0]);
    free(r->ref[1]);
    free(r->out);
}

/* Every position of both token rows in one chunk of an unbounded cache. */
static void reference(struct wrun *r)
{
    struct err e = {0};
    struct model_ctx *c = NULL;
    struct kv_cache *kv = NULL;
    struct kv_params kp = {.n_tokens = 2 * T, .max_seqs = 1, .block_size = BS, .dtype = DTYPE_F32};
    if (model_ctx_new(&c, r->m, r->be, T, &e) < 0 || kv_cache_new(&kv, r->m, r->be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
    for (int q = 0; q < 2; q++) {
        r->ref[q] = malloc((size_t)T * r->V * sizeof(float));
        assert_non_null(r->ref[q]);
        kv_seq_remove(kv, 0);
        assert_int_equal(kv_seq_add(kv, 0, &e), 0);
        batch_clear(&r->b);
        for (int i = 0; i < T; i++)
            assert_int_equal(batch_add(&r->b, r->toks[q][i], i, 0, true, &e), 0);
        if (model_forward(c, &r->b, kv, r->ref[q], &e) < 0)
            fail_msg("%s", e.msg);
    }
    kv_cache_free(kv);
    model_ctx_free(c);
}

/* The logit rows of the last forward (rows of seqs in order, positions pos[]) against
 * the reference, then the pool's bookkeeping and the bound on held sliding blocks. */
static void check_step(struct wrun *r, const char *name, int n_rows, int max_rows)
{
    struct err e = {0};
    for (int i = 0; i < n_rows; i++) {
        int q = r->b.seq[i] % 2, p = r->b.pos[i];
        double rr = test_row_rel_err(r->out + (size_t)i * r->V, r->ref[q] + (size_t)p * r->V, r->V);
        if (rr > TOL)
            fail_msg("%s: sequence %d position %d: relative error %.3g against the unbounded cache",
                     name, r->b.seq[i], p, rr);
    }
    if (kv_check(r->kv, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    int n_seq = 0;
    for (int q = 0; q < r->kv->max_seqs; q++)
        n_seq += kv_seq_len(r->kv, q) >= 0;
    int bound = n_seq * kv_window_seq_blocks(W, max_rows, BS);
    if (kv_window_blocks_held(r->kv) > bound)
        fail_msg("%s: %d sliding blocks held, at most %d", name, kv_window_blocks_held(r->kv), bound);
}

static void feed(struct wrun *r, const int *seqs, const int *from, int n_seq, int n, const char *name)
{
    struct err e = {0};
    batch_clear(&r->b);
    for (int s = 0; s < n_seq; s++)
        for (int i = from[s]; i < from[s] + n; i++)
            assert_int_equal(batch_add(&r->b, r->toks[seqs[s] % 2][i], i, seqs[s], true, &e), 0);
    if (model_forward(r->c, &r->b, r->kv, r->out, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    check_step(r, name, r->b.n_tok, n > NB ? NB : n);
}

static void run_fixture(const char *fixture)
{
    struct wrun r;
    struct err e = {0};
    wrun_open(&r, fixture);
    reference(&r);
    struct kv_params kp = {.n_tokens = 4 * T, .max_seqs = 3, .block_size = BS, .dtype = DTYPE_F32,
                           .n_batch = NB};
    if (model_ctx_new(&r.c, r.m, r.be, NB, &e) < 0 || kv_cache_new(&r.kv, r.m, r.be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
    int per = kv_window_seq_blocks(W, NB, BS);
    assert_int_equal(r.kv->swa.blk.n_blocks, 3 * per + 1);
    assert_true(r.kv->swa.blk.n_blocks < r.kv->n_blocks);

    /* two sequences: a prompt in chunks, then one token each per forward, batched */
    int seqs[2] = {0, 1}, from[2] = {0, 0};
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    assert_int_equal(kv_seq_add(r.kv, 1, &e), 0);
    feed(&r, seqs, from, 2, PROMPT, fixture);
    for (int p = PROMPT; p < T; p++) {
        from[0] = from[1] = p;
        feed(&r, seqs, from, 2, 1, fixture);
        kv_prefix_register(r.kv, 0, r.toks[0], p + 1);
    }
    /* a truncation below the sliding layers' holding is refused, one step back is not */
    int held = kv_window_blocks_held(r.kv);
    assert_int_equal(kv_seq_truncate(r.kv, 1, 3, &e), -ERR_RANGE);
    assert_int_equal(kv_seq_len(r.kv, 1), T);
    assert_int_equal(kv_window_blocks_held(r.kv), held);
    assert_int_equal(kv_seq_truncate(r.kv, 1, T - 1, &e), 0);
    seqs[0] = 1;
    from[0] = T - 1;
    feed(&r, seqs, from, 1, 1, fixture);

    /* the prefix cache: a new sequence attaches sequence 0's history and goes on */
    kv_seq_remove(r.kv, 0);
    assert_int_equal(kv_check(r.kv, &e), 0);
    assert_int_equal(kv_seq_add(r.kv, 2, &e), 0);
    int hit = kv_prefix_attach(r.kv, 2, r.toks[0], T - 2);
    assert_true(hit > W);
    assert_int_equal(kv_check(r.kv, &e), 0);
    seqs[0] = 2;
    for (int p = hit; p < T; p++) {
        from[0] = p;
        feed(&r, seqs, from, 1, 1, fixture);
    }
    printf("window %-12s window %d, blocks of %d: %d sliding blocks for 3 sequences (full pool %d), "
           "prefix hit %d of %d\n", fixture, W, BS, r.kv->swa.blk.n_blocks, r.kv->n_blocks, hit, T - 2);
    wrun_close(&r);
}

static void window_gemma3(void **state)
{
    (void)state;
    run_fixture("gemma3_text");
}

static void window_mistral_swa(void **state)
{
    (void)state;
    run_fixture("mistral_swa");
}

static void window_gpt_oss(void **state)
{
    (void)state;
    run_fixture("gpt_oss");
}

/* A context whose chunks are longer than the cache was sized for: the sliding pool runs out,
 * the call fails naming it, and the sequence is back where it was. */
static void window_chunk_too_long(void **state)
{
    (void)state;
    struct wrun r;
    struct err e = {0};
    wrun_open(&r, "gemma3_text");
    struct kv_params kp = {.n_tokens = 2 * T, .max_seqs = 1, .block_size = BS, .dtype = DTYPE_F32,
                           .n_batch = NB};
    if (model_ctx_new(&r.c, r.m, r.be, T, &e) < 0 || kv_cache_new(&r.kv, r.m, r.be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    for (int i = 0; i < T; i++)
        assert_int_equal(batch_add(&r.b, r.toks[0][i], i, 0, true, &e), 0);
    assert_int_equal(model_forward(r.c, &r.b, r.kv, r.out, &e), -ERR_NOMEM);
    assert_non_null(strstr(e.msg, "sliding-window layers"));
    assert_int_equal(kv_seq_len(r.kv, 0), 0);
    assert_int_equal(kv_window_blocks_held(r.kv), 0);
    assert_int_equal(kv_check(r.kv, &e), 0);
    wrun_close(&r);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(window_chunk_too_long),
    cmocka_unit_test(window_gemma3),
    cmocka_unit_test(window_mistral_swa),
    cmocka_unit_test(window_gpt_oss),
};

TEST_SUITE(window, tests);
