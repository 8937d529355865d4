/*
 * threadpool: the one pool of worker threads. tpool_run() runs fn(ctx, ith,
 * nth) once for every ith in [0, nth) and returns when all are done. The
 * parts are claimed: each thread takes its own ith first and then any left,
 * so a part may run on any thread (the caller included), and a worker the
 * host has descheduled does not hold up the job. fn must therefore depend on
 * ith only, never on the calling thread, and must not wait for another part
 * (no barrier inside a job). Workers spin briefly between jobs (decode issues
 * hundreds of small jobs per token) and then sleep on a condition variable;
 * on an oversubscribed machine the caller runs stretches of jobs alone.
 * Kernels split their work by (ith, nth) or claim it in pieces
 * (tpool_claim_guided); they never create threads themselves.
 *
 * A pool is used by one caller thread at a time (one request context).
 * Workers start with SIGINT, SIGTERM, SIGHUP and SIGQUIT blocked: those
 * signals' handlers run on the program's own threads.
 */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tpool;

typedef void (*tpool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0 means the number of online CPUs. */
int tpool_new(struct tpool **out, int n_threads, struct err *e);
void tpool_free(struct tpool *p);
int tpool_size(const struct tpool *p);
void tpool_run(struct tpool *p, tpool_fn fn, void *ctx);
/* Online CPUs (>= 1). */
int tpool_default_threads(void);

/* What the pool did, for tests and -v: jobs shared with the workers, jobs the caller ran
 * alone (oversubscribed), parts of shared jobs the caller ran in place of a late worker,
 * and how many stretches of lone jobs began. */
struct tpool_stats {
    uint64_t shared_jobs, solo_jobs, parts_stolen, solo_stretches;
};
/* p may be NULL (all zero). Read by the caller thread only. */
void tpool_get_stats(const struct tpool *p, struct tpool_stats *out);

/* Split [0, n) into nth contiguous chunks; chunk ith is [*lo, *hi). */
static inline void tpool_range(long n, int ith, int nth, long *lo, long *hi)
{
    long chunk = (n + nth - 1) / nth;
    long a = chunk * ith, b = a + chunk;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* Work shared by claiming instead of a fixed split: [0, n) in pieces that the threads take in
 * order from *next (zeroed by the caller before tpool_run), so a thread the host preempts
 * does less of it and the others more. The pieces shrink as the work drains (guided
 * scheduling): each is what is left over 2 * nth, at least 1 unit. The first are long (few
 * claims, long sequential reads), the last one unit, so the threads finish within about a
 * unit of each other. 1 with the piece in [*lo, *hi); 0 when none is left. */
static inline int tpool_claim_guided(atomic_long *next, long n, int nth, long *lo, long *hi)
{
    long a = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (a >= n)
            return 0;
        const long s = (n - a) / (2L * nth), b = a + (s > 1 ? s : 1);
        if (atomic_compare_exchange_weak_explicit(next, &a, b, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = a;
            *hi = b;
            return 1;
        }
    }
}

#ifdef __cplusplus
}
#endif
