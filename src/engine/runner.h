/*
 * runner: the scheduler on its own thread, for many client threads.
 *
 * The engine thread owns the model context, the KV cache and the scheduler;
 * client threads (the server's connection threads) hand it jobs and read
 * back what each job produced. One mutex (the runner's) guards every job's
 * shared fields; a client waits on its own condition variable, which the
 * engine thread signals when one of the client's jobs gets tokens or ends.
 *
 * A job is one generation: a prompt, parameters, and an output log that
 * grows by one entry per generated token (the id, and when asked its
 * log-probability and the most likely alternatives, computed on the engine
 * thread from the logits row it was sampled from). The client owns the job's
 * memory; once submitted, the job belongs to the runner until `done` is set,
 * and the client must neither free it nor touch the in/out fields without the
 * lock. runner_cancel() asks the engine to end a job (within one step).
 *
 * Admission: at most max_jobs jobs are waiting or running; runner_submit of
 * more is refused at once (-ERR_BUSY semantics: -ERR_RANGE with busy=true) so
 * the server can answer 429. Inside that bound jobs queue in the scheduler
 * (first come, first served) until a sequence and cache room are free.
 */
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "generate.h"
#include "scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RUNNER_MAX_TOP 20  /* alternatives per token a job may ask for */

struct runner_job {
    /* in (set before runner_submit, read-only after) */
    const int32_t *prompt;       /* borrowed until done */
    int n_prompt;
    struct gen_params params;    /* params.sampling.bias is borrowed until done */
    const struct sched_image *images;  /* [n_images] the prompt's images (pixels), borrowed until done */
    int n_images;
    bool logprobs;               /* record each token's log-probability */
    int n_top;                   /* and its n_top most likely alternatives, <= RUNNER_MAX_TOP */
    pthread_cond_t *cv;          /* signalled on every new token and at the end */

    /* out (under the runner lock); the arrays hold params.n_predict entries */
    int32_t *ids;
    float *lp;                   /* [cap] when logprobs */
    int32_t *top_id;             /* [cap * n_top] */
    float *top_lp;
    int n_out;
    bool done;                   /* the runner no longer touches the job */
    int rc;                      /* 0, or the error that ended it (then err) */
    struct err err;
    struct gen_stats stats;      /* when done */
    double t_first;              /* gen_now() of the first token, 0 before */

    /* runner-private */
    bool cancel;
    int sched_id;
    struct runner *owner;
    struct runner_job *next;
};

struct runner_params {
    int max_jobs;                /* waiting + running (the server: parallel + max queue) */
    int max_batch_tokens;        /* rows per step (<= 0: the context's n_batch) */
    bool no_prefix_cache;        /* true: the scheduler's prefix cache is off (default: on) */
};

struct runner_stats {
    int n_waiting, n_running;    /* jobs queued / with a sequence */
    int kv_blocks_used, kv_blocks_total;  /* used: held by running sequences */
    int kv_blocks_cached;        /* held only by the prefix cache (reclaimable, not in used) */
    int kv_snapshots;            /* recurrent states kept for the prefix cache (ADR 0129) */
    uint64_t n_steps;            /* forwards run */
    uint64_t prefix_query_tokens;   /* prompt tokens of the jobs admitted (each once) */
    uint64_t prefix_hit_tokens;     /* of them, found in the prefix cache (0 when it is off) */
    uint64_t spec_draft_tokens;     /* speculative decoding: tokens drafted */
    uint64_t spec_accepted_tokens;  /* of them, accepted */
};

/* What GET /slots shows of a job in the scheduler (runner_get_jobs): a copy, no pointers. */
struct runner_job_view {
    int n_prompt, n_out, n_predict;
    struct sampler_params sampling;   /* bias and cons cleared (n_bias kept) */
    bool ignore_eos;
    bool spec;                        /* speculative decoding asked for */
    bool running;                     /* holds a sequence (else waits in the scheduler's queue) */
};

struct runner;

/* Starts the engine thread over c and kv (borrowed; kv's sequences become the runner's). */
int runner_new(struct runner **out, struct model_ctx *c, struct kv_cache *kv, const struct runner_params *p,
               struct err *e);
/* Ends every job (not yet run: rc -ERR_ARG "shutting down"; running: as cancelled), joins the
 * thread and frees the runner. Clients still waiting see their jobs done. */
void runner_free(struct runner *r);

/* Allocates j's output arrays (params.n_predict entries) and queues it; n jobs at once, all
 * or none. -ERR_RANGE with *busy = true when the runner holds max_jobs jobs already; other
 * errors (bad parameters, out of memory) with *busy = false. */
int runner_submit(struct runner *r, struct runner_job *const *jobs, int n, bool *busy, struct err *e);
/* Asks the engine to end j (waiting or running) as stopped by the client. Lock held or not
 * (say which). The job is done within one step; wait for `done` before freeing it. */
void runner_cancel_locked(struct runner *r, struct runner_job *j);
/* Frees the output arrays of a done (or never submitted) job. */
void runner_job_release(struct runner_job *j);

void runner_lock(struct runner *r);
void runner_unlock(struct runner *r);
/* With the lock held: wait on cv until signalled or timeout_ms passed. */
void runner_wait_locked(struct runner *r, pthread_cond_t *cv, int timeout_ms);
/* A snapshot of the queue and cache (takes the lock). */
void runner_get_stats(struct runner *r, struct runner_stats *st);
/* The jobs in the scheduler, oldest first, at most cap into out (takes the lock); returns how
 * many were written. running: the job has output (it holds a sequence until done), or is
 * among the oldest n_running of the last step (the scheduler runs jobs first come, first
 * served). */
int runner_get_jobs(struct runner *r, struct runner_job_view *out, int cap);

#ifdef __cplusplus
}
#endif
