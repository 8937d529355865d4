/*
 * threadpool: fork-join pool with a generation counter (see threadpool.h).
 *
 * The caller publishes (fn, ctx) and bumps `gen`; workers waiting on the
 * previous generation spin for a while (cheap for back-to-back decode
 * kernels) and then block on `cv`. Completion is an atomic countdown that the
 * caller spins on. Memory ordering: release on publish, acquire on observe.
 */
/* sched_getaffinity and CPU_COUNT need _GNU_SOURCE, which the build defines */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* How long a waiting worker spins before it sleeps on `cv`, in microseconds. It is a time,
 * not a count of pauses: a pause takes 18 ns on the Zen 5 hosts and up to 140 cycles
 * elsewhere. Decode leaves gaps between jobs (the caller's own small ops, sampling, the
 * next token's embedding) that 4096 pauses (73 us here) did not cover, and a worker that
 * fell asleep cost a futex wake-up (ADR 0041). An idle pool burns at most this much CPU per
 * worker after its last job. */
#define SPIN_US 2000
/* A wait yields its CPU (sched_yield) between pauses once it has lasted this long, so that a
 * thread the host preempted, whose share the waiter needs, gets to run on a busy machine;
 * from the start when the pool has more threads than CPUs. Yielding from the start cost
 * decode a syscall every microsecond of every wait (ADR 0041). */
#define SPIN_YIELD_US 50
/* Pauses between clock reads while spinning (a read is 24 ns through the vDSO). */
#define SPIN_CHECK_EVERY 64

struct tpool {
    int n;                     /* total threads including the caller */
    bool yield;                /* more threads than CPUs: spinners give up their CPU */
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

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* One step of a wait: a pause, and every SPIN_CHECK_EVERY of them a look at the clock (*t0
 * is set at the first look) and, past SPIN_YIELD_US or on an oversubscribed pool, a yield.
 * False once the wait has lasted SPIN_US. */
static bool spin_more(const struct tpool *p, unsigned *spins, uint64_t *t0)
{
    cpu_relax();
    if (++*spins % SPIN_CHECK_EVERY)
        return true;
    uint64_t t = now_us();
    if (!*t0)
        *t0 = t;
    if (p->yield || t - *t0 >= SPIN_YIELD_US)
        sched_yield();
    return t - *t0 < SPIN_US;
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct tpool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        unsigned spins = 0;
        uint64_t t0 = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_acquire)) {
            if (spin_more(p, &spins, &t0))
                continue;
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

/* CPUs this process may run on (its affinity mask), else the online ones. */
static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    return tpool_default_threads();
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
    p->yield = n_threads > usable_cpus();
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
    /* The workers' share is about the caller's, so this wait is short: it spins without a
     * time limit, yielding as a worker's wait does. */
    unsigned spins = 0;
    uint64_t t0 = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        (void)spin_more(p, &spins, &t0);
}
