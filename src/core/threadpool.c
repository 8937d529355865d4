/*
 * threadpool: fork-join pool whose job is nth parts that any thread may claim
 * (see threadpool.h).
 *
 * The caller publishes (fn, ctx) and bumps `gen`; each thread then claims the
 * parts it can, its own index first and then the others in turn, with a
 * compare-and-swap on the part's slot (claimed[k] goes from gen - 1 to gen),
 * and runs fn(ctx, k, nth) for each part it claimed. The caller claims too and
 * waits only for parts that another thread has claimed and not finished: a
 * worker the host has descheduled, or that is still waking up, claims nothing
 * and its part is run by whoever gets there first, so one busy CPU no longer
 * holds every job until the host runs that worker again (issue 39; ADR 0052).
 * A part is always fn(ctx, k, nth) with the pool's nth, so the result is the
 * same bits whichever thread runs which part.
 *
 * Waiting workers spin (SPIN_US) and then sleep on `cv`; the caller takes the
 * mutex to wake them only when one sleeps (`sleepers`). When the caller has run
 * every part of nearly every job of a window (the workers keep arriving late:
 * the machine is oversubscribed), it runs a stretch of jobs alone, part by part,
 * without waking anyone, and then looks again; the idle workers sleep.
 * Memory ordering: release on publish, acquire on observe.
 */
/* sched_getaffinity and CPU_COUNT need _GNU_SOURCE, which the build defines */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
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
/* Oversubscription: in a window of SOLO_WINDOW shared jobs, when the caller ran all the
 * parts of at least SOLO_ALONE of them (no worker claimed one in time), the next jobs run
 * in the caller alone, SOLO_MIN of them, twice as many after each window that ends the
 * same way (at most SOLO_MAX); then a window is shared again. On a quiet machine a
 * spinning worker claims its part within a fraction of a microsecond, so a window of
 * nearly all lone jobs means the workers are not getting a CPU. A window costs, on a busy
 * machine, SOLO_WINDOW wake-ups of sleeping workers (a few microseconds each) and a worker
 * that spins beside the caller; the doubling makes that a per cent or less of the jobs
 * while the machine stays busy (ADR 0052). Decode runs a few hundred jobs per token: a
 * stretch is a few tokens to a few hundred. */
#define SOLO_WINDOW 64
#define SOLO_ALONE  56
#define SOLO_MIN    1024
#define SOLO_MAX    65536

/* A part's claim slot, alone on its cache line: the threads claim their own parts at once. */
struct claim_slot {
    atomic_uint gen;           /* the last generation that claimed the part */
    char pad[64 - sizeof(atomic_uint)];
};
_Static_assert(sizeof(struct claim_slot) == 64, "a claim slot is one cache line");

struct tpool {
    int n;                     /* total threads including the caller */
    bool yield;                /* more threads than CPUs: spinners give up their CPU */
    pthread_t *threads;        /* n - 1 workers */
    struct claim_slot *claimed;/* per part (n) */
    pthread_mutex_t mu;        /* guards sleeping on cv */
    pthread_cond_t cv;
    atomic_uint gen;           /* job generation */
    atomic_int done;           /* parts of the current job finished */
    atomic_int sleepers;       /* workers asleep (or about to be) on cv */
    atomic_int stop;
    tpool_fn fn;
    void *ctx;
    /* the caller's own (one caller at a time) */
    unsigned last_gen;         /* the last generation published */
    int win_jobs, win_alone;   /* shared jobs of this window, and those the caller ran alone */
    int solo_left;             /* jobs still to run alone */
    int solo_next;             /* the length of the next stretch */
    struct tpool_stats stats;
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

/* Claim and run the parts of job g still unclaimed, part `first` first and then the others
 * in turn; the number run. A thread that comes late (g is over, or a newer job is out)
 * finds every slot past g - 1 and claims nothing. */
static int run_parts(struct tpool *p, unsigned g, int first)
{
    int n = p->n, ran = 0;
    for (int i = 0, k = first; i < n; i++, k = k + 1 < n ? k + 1 : 0) {
        unsigned expect = g - 1;
        atomic_uint *slot = &p->claimed[k].gen;
        if (atomic_load_explicit(slot, memory_order_relaxed) != expect ||
            !atomic_compare_exchange_strong_explicit(slot, &expect, g, memory_order_acq_rel, memory_order_relaxed))
            continue;
        p->fn(p->ctx, k, n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        ran++;
    }
    return ran;
}

/* Sleep on cv until gen moves past seen or the pool stops. */
static void worker_sleep(struct tpool *p, unsigned seen)
{
    pthread_mutex_lock(&p->mu);
    /* counted before the last look at gen (seq_cst both sides, see tpool_run): either the
     * caller sees a sleeper and broadcasts under mu, or this look sees the new gen */
    atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&p->gen, memory_order_seq_cst) == seen &&
           !atomic_load_explicit(&p->stop, memory_order_acquire))
        pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
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
            if (!spin_more(p, &spins, &t0))
                worker_sleep(p, seen);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        seen = g;
        run_parts(p, g, wa.ith);
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
    p->solo_next = SOLO_MIN;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    /* one cache line per slot: aligned, and a whole number of lines */
    p->claimed = aligned_alloc(64, (size_t)n_threads * sizeof *p->claimed);
    for (int k = 0; p->claimed && k < n_threads; k++)
        atomic_init(&p->claimed[k].gen, 0u);
    if (!p->threads || !p->claimed)
        goto fail_free;
    /* The process's termination signals go to the threads that run the program, never to a
     * worker: a handler such as outdir's cleanup (which removes a half-written folder) run on
     * a worker would race the caller thread, which goes on writing files meanwhile. The
     * workers are started with them blocked (a thread inherits its creator's mask). */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->p = p;
            wa->ith = i;
        }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            p->n = i; /* only i - 1 workers exist */
            tpool_free(p);
            return err_setf(e, ERR_NOMEM, "thread pool: cannot start thread %d", i);
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    *out = p;
    return 0;
fail_free:
    free(p->threads);
    free(p->claimed);
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
    free(p->claimed);
    free(p);
}

int tpool_size(const struct tpool *p)
{
    return p ? p->n : 1;
}

/* After a shared job the caller ran `ran` parts of: count the window, and start a solo
 * stretch when the workers came late to nearly all of it. */
static void note_shared_job(struct tpool *p, int ran)
{
    p->win_alone += ran == p->n;
    if (++p->win_jobs < SOLO_WINDOW)
        return;
    if (p->win_alone >= SOLO_ALONE) {
        p->solo_left = p->solo_next;
        p->solo_next = p->solo_next < SOLO_MAX ? 2 * p->solo_next : SOLO_MAX;
        p->stats.solo_stretches++;
    } else {
        p->solo_next = SOLO_MIN;
    }
    p->win_jobs = p->win_alone = 0;
}

void tpool_run(struct tpool *p, tpool_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (p->solo_left > 0) {
        /* the same parts as a shared job, so the same bits */
        p->solo_left--;
        p->stats.solo_jobs++;
        for (int k = 0; k < p->n; k++)
            fn(ctx, k, p->n);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    unsigned g = ++p->last_gen;
    atomic_store_explicit(&p->gen, g, memory_order_seq_cst);
    if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    int ran = run_parts(p, g, 0);
    /* only parts other threads claimed and are running remain: short unless the host
     * preempted one of them, whom the yields let run */
    unsigned spins = 0;
    uint64_t t0 = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n)
        (void)spin_more(p, &spins, &t0);
    p->stats.shared_jobs++;
    p->stats.parts_stolen += (uint64_t)(ran > 1 ? ran - 1 : 0);
    note_shared_job(p, ran);
}

void tpool_get_stats(const struct tpool *p, struct tpool_stats *out)
{
    static const struct tpool_stats none;
    *out = p ? p->stats : none;
}
