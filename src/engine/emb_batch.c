/*
 * emb_batch: cross-request batching of one embedder by flat combining (emb_batch.h,
 * ADR 0114).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emb_batch.h"

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

#define EMB_BATCH_POLL_MS 10     /* how often a queued job's caller asks gone() */

int emb_batcher_init(struct emb_batcher *b, long max_tokens, struct err *e)
{
    memset(b, 0, sizeof *b);
    b->max_tokens = max_tokens;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return err_setf(e, ERR_INTERNAL, "cannot create a condition variable");
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return err_setf(e, ERR_INTERNAL, "cannot create a condition variable");
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        pthread_cond_destroy(&b->cv);
        return err_setf(e, ERR_INTERNAL, "cannot create a mutex");
    }
    return 0;
}

void emb_batcher_destroy(struct emb_batcher *b)
{
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

int emb_batcher_queued(struct emb_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    int n = b->n_queued;
    pthread_mutex_unlock(&b->mu);
    return n;
}

static int job_call(struct embedder *em, bool score, const struct emb_item *items, int n, float *out,
                    struct err *e)
{
    return score ? embedder_score(em, items, n, out, e) : embedder_embed(em, items, n, out, e);
}

static void job_alone(struct embedder *em, struct emb_job *j)
{
    memset(&j->e, 0, sizeof j->e);
    j->rc = job_call(em, j->score, j->items, j->n, j->out, &j->e);
}

/* Run the n_jobs jobs of the list first (outside the lock): one call over all their items,
 * each job's rows copied out; when that fails (or cannot be set up), each job alone. */
static void batch_run(struct embedder *em, struct emb_job *first, int n_jobs, int n_items)
{
    if (n_jobs == 1) {
        job_alone(em, first);
        return;
    }
    bool score = first->score;
    size_t width = score ? 1 : (size_t)em->cfg.dim;
    struct emb_item *items = malloc((size_t)n_items * sizeof *items);
    float *out = malloc((size_t)n_items * width * sizeof *out);
    struct err e = {0};
    int rc = -1;
    if (items && out) {
        int k = 0;
        for (struct emb_job *j = first; j; j = j->next) {
            memcpy(items + k, j->items, (size_t)j->n * sizeof *items);   /* shallow: borrowed ids */
            k += j->n;
        }
        rc = job_call(em, score, items, n_items, out, &e);
    }
    if (rc == 0) {
        size_t k = 0;
        for (struct emb_job *j = first; j; j = j->next) {
            memcpy(j->out, out + k * width, (size_t)j->n * width * sizeof *out);
            k += (size_t)j->n;
            j->rc = 0;
        }
    } else {
        /* one job's bad input (or a forward that broke on it) must not fail the others:
         * each runs again alone and gets its own answer */
        for (struct emb_job *j = first; j; j = j->next)
            job_alone(em, j);
    }
    free(items);
    free(out);
}

/* Take the next batch off the queue (b->mu held, the queue not empty): the head job and the
 * jobs after it of the same kind while the token budget holds. */
static struct emb_job *batch_take(struct emb_batcher *b, struct emb_batch_info *info)
{
    struct emb_job *first = b->head, *last = first;
    *info = (struct emb_batch_info){1, first->n, first->tokens};
    while (last->next && last->next->score == first->score &&
           (b->max_tokens < 1 || info->n_tokens + last->next->tokens <= b->max_tokens)) {
        last = last->next;
        info->n_jobs++;
        info->n_items += last->n;
        info->n_tokens += last->tokens;
    }
    b->head = last->next;
    if (!b->head)
        b->tail = NULL;
    last->next = NULL;
    b->n_queued -= info->n_jobs;
    for (struct emb_job *j = first; j; j = j->next) {
        j->state = JOB_RUNNING;
        j->batch_jobs = info->n_jobs;
    }
    b->n_batches++;
    b->n_jobs += (uint64_t)info->n_jobs;
    b->n_items += (uint64_t)info->n_items;
    if ((uint64_t)info->n_jobs > b->max_jobs)
        b->max_jobs = (uint64_t)info->n_jobs;
    return first;
}

/* Take job out of the queue (b->mu held, job queued). */
static void queue_unlink(struct emb_batcher *b, struct emb_job *job)
{
    struct emb_job **pp = &b->head, *prev = NULL;
    while (*pp && *pp != job) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = job->next;
    if (b->tail == job)
        b->tail = prev;
    job->next = NULL;
    b->n_queued--;
}

static void wait_poll(struct emb_batcher *b)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += EMB_BATCH_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
}

int emb_batcher_run(struct emb_batcher *b, struct embedder *em, struct emb_job *job,
                    bool (*gone)(void *ud), void *ud, emb_batch_cb on_batch, void *cb_ud)
{
    job->rc = 0;
    memset(&job->e, 0, sizeof job->e);
    job->batch_jobs = 0;
    job->tokens = 0;
    for (int i = 0; i < job->n; i++)
        job->tokens += job->items[i].n;
    job->next = NULL;
    pthread_mutex_lock(&b->mu);
    job->state = JOB_QUEUED;
    if (b->tail)
        b->tail->next = job;
    else
        b->head = job;
    b->tail = job;
    b->n_queued++;
    while (job->state != JOB_DONE) {
        if (job->state == JOB_QUEUED && !b->busy) {
            /* the embedder is free and this thread has work queued: run the head batch (it may
             * be other threads' jobs only; this one then waits for the next turn) */
            struct emb_batch_info info;
            struct emb_job *first = batch_take(b, &info);
            b->busy = true;
            pthread_mutex_unlock(&b->mu);
            if (on_batch)
                on_batch(cb_ud, &info);
            batch_run(em, first, info.n_jobs, info.n_items);
            pthread_mutex_lock(&b->mu);
            for (struct emb_job *j = first, *nx; j; j = nx) {
                nx = j->next;    /* a finished job's owner may return and free it at once */
                j->next = NULL;
                j->state = JOB_DONE;
            }
            b->busy = false;
            pthread_cond_broadcast(&b->cv);
            continue;
        }
        if (job->state == JOB_QUEUED && gone && gone(ud)) {
            queue_unlink(b, job);
            pthread_mutex_unlock(&b->mu);
            return 1;
        }
        if (gone && job->state == JOB_QUEUED)
            wait_poll(b);
        else
            pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    return 0;
}
