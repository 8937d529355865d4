/*
 * emb_batch: cross-request batching of one embedder (ADR 0114). Requests (jobs: tokenized
 * items and an output buffer) submitted from several threads at once are gathered and their
 * items packed into the same embedder_embed / embedder_score call (so into the same
 * padding-free forwards, ADR 0083), each job getting exactly its own rows, in its order.
 *
 * There is no thread of its own: the submitting threads take turns (flat combining). When
 * the embedder is free, a waiting thread whose job is still queued takes the queue's head
 * jobs, in arrival order, up to a token budget (the first job always, whatever its size),
 * runs them outside the lock and hands every job its rows; the others wait on a condition
 * variable. A lone request runs at once (no waiting for company); requests that arrive while
 * a batch runs form the next one. When a batch of several jobs fails, each of its jobs is run
 * again alone, so one bad job's error stays its own and the others succeed. A job whose
 * caller gives up (gone() true, e.g. the client disconnected) while it is still queued is
 * taken out of the queue; one already running finishes and its rows are dropped by the caller.
 */
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "embedder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one batch holds (for metrics and tests). */
struct emb_batch_info {
    int n_jobs;                  /* requests in it */
    int n_items;                 /* their sequences */
    long n_tokens;               /* their tokens */
};

/* Called by the thread running a batch, before its forward and outside the lock. */
typedef void (*emb_batch_cb)(void *ud, const struct emb_batch_info *info);

/* One request: n items in (borrowed while it runs); out: [n, cfg.dim] vectors, or [n] scores
 * for score. The batcher fills rc (0 or -ERR_*) and e. */
struct emb_job {
    const struct emb_item *items;
    int n;
    bool score;
    float *out;
    int rc;
    struct err e;
    int batch_jobs;              /* how many jobs its batch held (1: alone) */
    /* private */
    long tokens;
    int state;
    struct emb_job *next;
};

struct emb_batcher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct emb_job *head, *tail; /* queued, in arrival order */
    int n_queued;
    bool busy;                   /* a batch is running */
    long max_tokens;             /* a batch's token budget (its first job may exceed it) */
    /* totals since init */
    uint64_t n_batches, n_jobs, n_items, max_jobs;
};

/* max_tokens < 1: every queued job goes into one batch. */
int emb_batcher_init(struct emb_batcher *b, long max_tokens, struct err *e);
/* After every job has returned. */
void emb_batcher_destroy(struct emb_batcher *b);

/* Run job through em with the jobs of other threads. Returns 0 when the job ran (job->rc and
 * job->e say how), 1 when gone(ud) became true while it was queued (it did not run; gone is
 * polled every few milliseconds, NULL: never). on_batch (may be NULL) sees each batch this
 * thread runs. Every job of one batcher must use the same em. */
int emb_batcher_run(struct emb_batcher *b, struct embedder *em, struct emb_job *job,
                    bool (*gone)(void *ud), void *ud, emb_batch_cb on_batch, void *cb_ud);

/* Jobs queued now (waiting for the embedder). */
int emb_batcher_queued(struct emb_batcher *b);

#ifdef __cplusplus
}
#endif
