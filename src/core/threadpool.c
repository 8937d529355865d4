/*
 * threadpool: fork-join pool with a generation counter (see threadpool.h).
 *
 * The caller publishes (fn, ctx) and bumps `gen`; workers waiting on the
 * previous generation spin for a short while (cheap for back-to-back decode
 * kernels) and then block on `cv`. Completion is an atomic countdown that the
 * caller spins on. Memory ordering: release on publish, acquire on observe.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Busy-wait budget before a waiter gives up its CPU. A pause costs 10-140
 * cycles depending on the microarchitecture, so 4096 of them are roughly
 * 15-200 us: long enough to catch back-to-back decode kernels, short enough
 * that idle workers do not burn a core for milliseconds after the last job.
 * (It was 200000, i.e. 5-10 ms of spinning per worker per job.) */
#define SPIN_ITERS 4096
/* While spinning, yield every this many pauses: when the pool has more
 * threads than free cores, a spinner must let the threads that still have
 * work run, or each job waits for a scheduler tick (milliseconds). */
#define SPIN_YIELD_EVERY 64

struct tpool {
    int n;                     /* total threads including the caller */
    pthread_t *threads;        /* n - 1 workers */
    pthread_mutex_t mu;        /* guards sleeping on cv */
    pthread_cond_t cv;
    atomic_uint gen;           /* job generation */
    atomic_int pending;        /* workers still running the current job */
    atomic_int stop;
    tpool_fn fn;
    void *ctx;
};

struct worker_arg {
    struct tpool *p;
    int ith;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct tpool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                if (spins % SPIN_YIELD_EVERY == 0)
                    sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_acquire))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = g;
        p->fn(p->ctx, wa.ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

int tpool_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int tpool_new(struct tpool **out, int n_threads, struct err *e)
{
    *out = NULL;
    if (n_threads <= 0)
        n_threads = tpool_default_threads();
    if (n_threads > 1024)
        return err_setf(e, ERR_ARG, "thread count %d is too large (max 1024)", n_threads);
    struct tpool *p = calloc(1, sizeof *p);
    if (!p)
        return err_setf(e, ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads)
        goto fail_free;
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->p = p;
            wa->ith = i;
        }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i; /* only i - 1 workers exist */
            tpool_free(p);
            return err_setf(e, ERR_NOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return 0;
fail_free:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return err_setf(e, ERR_NOMEM, "thread pool: out of memory");
}

void tpool_free(struct tpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int tpool_size(const struct tpool *p)
{
    return p ? p->n : 1;
}

void tpool_run(struct tpool *p, tpool_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (unsigned spins = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        cpu_relax();
        if (spins % SPIN_YIELD_EVERY == 0)
            sched_yield();
    }
}
