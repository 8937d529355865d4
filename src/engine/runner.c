/*
 * runner: the scheduler on its own thread (runner.h).
 *
 * Jobs flow: runner_submit appends to `incoming` (lock held) and wakes the
 * engine thread; the thread, between steps, moves incoming jobs into the
 * scheduler and applies cancellations, then runs one sched_step without the
 * lock. The scheduler's callbacks (on the engine thread) take the lock only
 * to append a token or mark a job done, and signal the job's client.
 */
#include "runner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct runner {
    struct model_ctx *c;
    struct kv_cache *kv;
    struct sched *s;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t wake;           /* the engine thread waits here when idle */
    struct runner_job *incoming;   /* submitted, not yet in the scheduler (FIFO) */
    struct runner_job **tail;
    struct runner_job *active;     /* in the scheduler */
    int n_jobs, max_jobs, n_cancel;
    bool stopping;
    uint64_t n_steps;
    int mirror_waiting, mirror_running, mirror_kv_used, mirror_kv_cached;  /* after a step */
    int mirror_snapshots;                /* kv_n_snapshots after a step */
    uint64_t mirror_query, mirror_hit;   /* the scheduler's prefix counts after a step */
    uint64_t mirror_drafted, mirror_accepted;  /* and its speculative counts */
};

// ---- callbacks (engine thread) ----

static int on_token(void *ud, int32_t id, const float *logits)
{
    struct runner_job *j = ud;
    struct runner *r = j->owner;
    int V = r->c->m->hp.n_vocab;
    float lp = 0.0f, top_lp[RUNNER_MAX_TOP];
    int32_t top_id[RUNNER_MAX_TOP];
    if (j->logprobs)
        sampler_logprobs(logits, V, id, j->n_top, &lp, top_id, top_lp);
    pthread_mutex_lock(&r->mu);
    int at = j->n_out;
    if (at < j->params.n_predict) {
        j->ids[at] = id;
        if (j->logprobs) {
            j->lp[at] = lp;
            memcpy(j->top_id + (size_t)at * j->n_top, top_id, (size_t)j->n_top * sizeof *top_id);
            memcpy(j->top_lp + (size_t)at * j->n_top, top_lp, (size_t)j->n_top * sizeof *top_lp);
        }
        j->n_out++;
    }
    if (j->t_first == 0)
        j->t_first = gen_now();
    bool stop = j->cancel;
    pthread_cond_broadcast(j->cv);
    pthread_mutex_unlock(&r->mu);
    return stop;
}

/* Marks j done; lock held. */
static void finish_locked(struct runner *r, struct runner_job *j, const struct gen_stats *st, int rc,
                          const struct err *e)
{
    if (st)
        j->stats = *st;
    j->rc = rc;
    if (rc < 0 && e)
        j->err = *e;
    if (j->cancel)
        r->n_cancel--;
    j->done = true;
    r->n_jobs--;
    pthread_cond_broadcast(j->cv);
}

static void on_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct runner_job *j = ud;
    struct runner *r = j->owner;
    pthread_mutex_lock(&r->mu);
    /* unlink from the active list */
    for (struct runner_job **p = &r->active; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    finish_locked(r, j, st, rc, e);
    pthread_mutex_unlock(&r->mu);
}

// ---- the engine thread ----

/* Moves incoming jobs into the scheduler; lock held (sched_submit does not call back). */
static void admit_locked(struct runner *r)
{
    while (r->incoming) {
        struct runner_job *j = r->incoming;
        r->incoming = j->next;
        if (!r->incoming)
            r->tail = &r->incoming;
        struct err e = {0};
        struct sched_cb cb = {.on_token = on_token, .on_done = on_done, .ud = j};
        int rc;
        if (j->cancel) {
            struct gen_stats st = {.n_prompt = j->n_prompt, .stop = GEN_STOP_CALLBACK};
            finish_locked(r, j, &st, 0, NULL);
            continue;
        }
        j->next = r->active;
        r->active = j;
        if ((rc = sched_submit_images(r->s, j->prompt, j->n_prompt, &j->params, j->images, j->n_images, &cb,
                                       &j->sched_id, &e)) < 0) {
            r->active = j->next;
            finish_locked(r, j, NULL, rc, &e);
        }
    }
}

/* Applies cancellations of jobs in the scheduler. sched_cancel calls on_done, which takes
 * the lock: called without it, over a snapshot of ids taken with it. */
static void cancel_pending(struct runner *r)
{
    int ids[64], n = 0;
    pthread_mutex_lock(&r->mu);
    for (struct runner_job *j = r->active; j && n < 64; j = j->next)
        if (j->cancel)
            ids[n++] = j->sched_id;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n; i++)
        sched_cancel(r->s, ids[i]);
}

static void *engine_main(void *arg)
{
    struct runner *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        while (!r->stopping && !r->incoming && sched_n_waiting(r->s) + sched_n_running(r->s) == 0)
            pthread_cond_wait(&r->wake, &r->mu);
        if (r->stopping) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        admit_locked(r);
        bool cancels = r->n_cancel > 0;
        pthread_mutex_unlock(&r->mu);
        if (cancels)
            cancel_pending(r);
        struct err e = {0};
        /* a failing forward ends the running jobs with its error (their on_done) */
        sched_step(r->s, &e);
        int nw = sched_n_waiting(r->s), nr = sched_n_running(r->s);
        int used = r->kv->n_blocks - kv_n_free_blocks(r->kv), cached = kv_n_cached_blocks(r->kv);
        int snaps = kv_n_snapshots(r->kv);
        uint64_t query, hit, drafted, accepted;
        sched_prefix_stats(r->s, &query, &hit);
        sched_spec_stats(r->s, &drafted, &accepted);
        pthread_mutex_lock(&r->mu);
        r->n_steps++;
        r->mirror_waiting = nw;
        r->mirror_running = nr;
        r->mirror_kv_used = used;
        r->mirror_kv_cached = cached;
        r->mirror_snapshots = snaps;
        r->mirror_query = query;
        r->mirror_hit = hit;
        r->mirror_drafted = drafted;
        r->mirror_accepted = accepted;
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

// ---- lifetime ----

int runner_new(struct runner **out, struct model_ctx *c, struct kv_cache *kv, const struct runner_params *p,
               struct err *e)
{
    int rc;
    *out = NULL;
    struct runner *r = calloc(1, sizeof *r);
    if (!r)
        return err_setf(e, ERR_NOMEM, "runner: out of memory");
    r->c = c;
    r->kv = kv;
    r->max_jobs = p->max_jobs > 0 ? p->max_jobs : 1;
    r->tail = &r->incoming;
    struct sched_params sp = {.max_batch_tokens = p->max_batch_tokens, .max_requests = r->max_jobs,
                              .no_prefix_cache = p->no_prefix_cache};
    if ((rc = sched_new(&r->s, c, kv, &sp, e)) < 0) {
        free(r);
        return rc;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_create(&r->thread, NULL, engine_main, r)) != 0) {
        runner_free(r);
        return err_setf(e, ERR_NOMEM, "runner: cannot start the engine thread: %s", strerror(rc));
    }
    r->started = true;
    *out = r;
    return 0;
}

void runner_free(struct runner *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stopping = true;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    if (r->started)
        pthread_join(r->thread, NULL);
    /* jobs never admitted end with an error; sched_free ends the admitted ones (on_done) */
    pthread_mutex_lock(&r->mu);
    while (r->incoming) {
        struct runner_job *j = r->incoming;
        r->incoming = j->next;
        struct err e;
        err_setf(&e, ERR_ARG, "the server is shutting down");
        finish_locked(r, j, NULL, -ERR_ARG, &e);
    }
    pthread_mutex_unlock(&r->mu);
    sched_free(r->s);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

// ---- client side ----

void runner_job_release(struct runner_job *j)
{
    free(j->ids);
    free(j->lp);
    free(j->top_id);
    free(j->top_lp);
    j->ids = NULL;
    j->lp = NULL;
    j->top_id = NULL;
    j->top_lp = NULL;
}

static int job_prepare(struct runner *r, struct runner_job *j, struct err *e)
{
    int cap = j->params.n_predict > 0 ? j->params.n_predict : 1;
    if (j->n_top < 0 || j->n_top > RUNNER_MAX_TOP)
        return err_setf(e, ERR_ARG, "at most %d alternatives per token", RUNNER_MAX_TOP);
    if (!j->cv)
        return err_setf(e, ERR_ARG, "runner: a job needs a condition variable");
    j->ids = malloc((size_t)cap * sizeof *j->ids);
    if (j->logprobs) {
        size_t nt = (size_t)cap * (size_t)(j->n_top > 0 ? j->n_top : 1);
        j->lp = malloc((size_t)cap * sizeof *j->lp);
        j->top_id = malloc(nt * sizeof *j->top_id);
        j->top_lp = malloc(nt * sizeof *j->top_lp);
    }
    if (!j->ids || (j->logprobs && (!j->lp || !j->top_id || !j->top_lp))) {
        runner_job_release(j);
        return err_setf(e, ERR_NOMEM, "runner: out of memory for a job of %d tokens", cap);
    }
    j->n_out = 0;
    j->done = j->cancel = false;
    j->rc = 0;
    j->t_first = 0;
    j->sched_id = 0;
    j->owner = r;
    j->next = NULL;
    memset(&j->stats, 0, sizeof j->stats);
    return 0;
}

int runner_submit(struct runner *r, struct runner_job *const *jobs, int n, bool *busy, struct err *e)
{
    int rc;
    *busy = false;
    for (int i = 0; i < n; i++)
        if ((rc = job_prepare(r, jobs[i], e)) < 0) {
            for (int k = 0; k < i; k++)
                runner_job_release(jobs[k]);
            return rc;
        }
    pthread_mutex_lock(&r->mu);
    if (r->stopping || r->n_jobs + n > r->max_jobs) {
        bool stopping = r->stopping;
        pthread_mutex_unlock(&r->mu);
        for (int k = 0; k < n; k++)
            runner_job_release(jobs[k]);
        *busy = !stopping;
        return err_setf(e, ERR_RANGE, stopping ? "the server is shutting down"
                                               : "the server is busy: %d requests are queued or running",
                        r->max_jobs);
    }
    for (int i = 0; i < n; i++) {
        *r->tail = jobs[i];
        r->tail = &jobs[i]->next;
    }
    r->n_jobs += n;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void runner_cancel_locked(struct runner *r, struct runner_job *j)
{
    if (j->done || j->cancel)
        return;
    j->cancel = true;
    r->n_cancel++;
    pthread_cond_broadcast(&r->wake);
}

void runner_lock(struct runner *r)
{
    pthread_mutex_lock(&r->mu);
}

void runner_unlock(struct runner *r)
{
    pthread_mutex_unlock(&r->mu);
}

void runner_wait_locked(struct runner *r, pthread_cond_t *cv, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, &r->mu, &ts);
}

void runner_get_stats(struct runner *r, struct runner_stats *st)
{
    pthread_mutex_lock(&r->mu);
    st->n_waiting = r->mirror_waiting;
    for (struct runner_job *j = r->incoming; j; j = j->next)
        st->n_waiting++;
    st->n_running = r->mirror_running;
    st->kv_blocks_used = r->mirror_kv_used;
    st->kv_blocks_total = r->kv->n_blocks;
    st->kv_blocks_cached = r->mirror_kv_cached;
    st->kv_snapshots = r->mirror_snapshots;
    st->n_steps = r->n_steps;
    st->prefix_query_tokens = r->mirror_query;
    st->prefix_hit_tokens = r->mirror_hit;
    st->spec_draft_tokens = r->mirror_drafted;
    st->spec_accepted_tokens = r->mirror_accepted;
    pthread_mutex_unlock(&r->mu);
}

int runner_get_jobs(struct runner *r, struct runner_job_view *out, int cap)
{
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (const struct runner_job *j = r->active; j; j = j->next)
        n++;
    int skip = n > cap ? n - cap : 0, k = n - skip;  /* the newest beyond cap are left out */
    int i = n;
    for (const struct runner_job *j = r->active; j; j = j->next) {
        i--;  /* j is the i-th oldest */
        if (i >= k)
            continue;
        struct runner_job_view *v = &out[i];
        v->n_prompt = j->n_prompt;
        v->n_out = j->n_out;
        v->n_predict = j->params.n_predict;
        v->sampling = j->params.sampling;
        v->sampling.bias = NULL;
        v->sampling.cons = (struct constraint){0};
        v->ignore_eos = j->params.ignore_eos;
        v->spec = j->params.spec.mode != SPEC_NONE;
        /* a job with output holds its sequence until done; of the others, the oldest are
         * the ones the last step counted running (prefilling) */
        v->running = j->n_out > 0 || i < r->mirror_running;
    }
    pthread_mutex_unlock(&r->mu);
    return k;
}
