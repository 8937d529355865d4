/*
 * prefix_ttft: time to first token with and without a prefix-cache hit
 * (ADR 0022), measured back to back through the scheduler.
 *
 *   cmake --build build --target mlxcel_lib
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc dev/prefix_ttft.c build/libmlxcel_lib.a -o /tmp/prefix_ttft \
 *       $(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd libcurl) -lpthread -lm
 *   /tmp/prefix_ttft MODEL_DIR [system_tokens=1500] [rounds=3] [threads=all]
 *
 * Each round: (1) cold: the prefix index cleared, a request of S "system"
 * ids plus a 24-id user turn; (2) hit: the same system ids and another user
 * turn, right after (1), so the S ids (in whole blocks) come from the cache;
 * (3) cold again on (2)'s exact prompt, whose greedy tokens must equal (2)'s.
 * TTFT is the wall time from sched_submit to the first on_token, and the
 * process CPU time over the same span (steadier on a shared machine).
 * Printed: each run, and the ratio of the two colds' mean to the hit per round. The ids are
 * a fixed pseudo-random stream (the model's numbers do not depend on them).
 *
 * Not linked into anything (dev/ is the lab); compiled by hand as above.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "models/model.h"

#define N_USER 24
#define N_GEN  4

/* Process CPU seconds: on a shared machine the wall clock counts other tenants' work. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct run {
    double t0, ttft, c0, cpu;
    int32_t ids[N_GEN];
    int n, n_cached, done;
};

static int on_token(void *ud, int32_t id, const float *logits)
{
    struct run *r = ud;
    (void)logits;
    if (r->n == 0) {
        r->ttft = gen_now() - r->t0;
        r->cpu = cpu_now() - r->c0;
    }
    if (r->n < N_GEN)
        r->ids[r->n++] = id;
    return 0;
}

static void on_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct run *r = ud;
    if (rc < 0)
        fprintf(stderr, "request failed: %s\n", e->msg);
    r->n_cached = st->n_cached;
    r->done = 1;
}

static void fill(int32_t *t, int n, uint64_t seed, int n_vocab)
{
    for (int i = 0; i < n; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        t[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)n_vocab);
    }
}

static int one(struct sched *s, const int32_t *p, int n, struct run *r)
{
    struct err e = {0};
    struct gen_params gp = {.n_predict = N_GEN, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0.0f;
    struct sched_cb cb = {.on_token = on_token, .on_done = on_done, .ud = r};
    memset(r, 0, sizeof *r);
    r->t0 = gen_now();
    r->c0 = cpu_now();
    if (sched_submit(s, p, n, &gp, &cb, NULL, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    while (sched_step(s, &e) > 0)
        ;
    return r->done ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [system_tokens] [rounds] [threads]\n", argv[0]);
        return 2;
    }
    int S = argc > 2 ? atoi(argv[2]) : 1500, R = argc > 3 ? atoi(argv[3]) : 3;
    int T = argc > 4 ? atoi(argv[4]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    struct err e = {0};
    struct backend *be = NULL;
    struct model *m = NULL;
    struct model_ctx *c = NULL;
    struct kv_cache *kv = NULL;
    struct sched *s = NULL;
    struct kv_params kp = {.n_tokens = 2 * (S + N_USER + N_GEN) + 64, .max_seqs = 2, .dtype = DTYPE_F32};
    if (backend_new(&be, NULL, T, NULL, &e) < 0 || model_load(&m, argv[1], &e) < 0 ||
        model_prepare(m, be, &e) < 0 || model_ctx_new(&c, m, be, 0, &e) < 0 ||
        kv_cache_new(&kv, m, be, &kp, &e) < 0 || sched_new(&s, c, kv, NULL, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int V = m->hp.n_vocab, n = S + N_USER, bad = 0;
    int32_t *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    fill(a, S, 1, V);
    memcpy(b, a, (size_t)S * sizeof *a);
    printf("model %s, %d threads, system %d ids + user %d, block %d\n", argv[1], T, S, N_USER,
           kv->block_size);
    struct run warm;
    fill(a + S, N_USER, 999, V);
    if (one(s, a + S, N_USER, &warm) < 0)   /* warm-up: pages the weights in */
        return 1;
    printf("warm-up: %.3f s wall, %.2f s cpu\n", warm.ttft, warm.cpu);
    fflush(stdout);
    for (int k = 0; k < R; k++) {
        struct run cold, hit, cold2;
        fill(a + S, N_USER, 1000 + 2 * (uint64_t)k, V);
        fill(b + S, N_USER, 1001 + 2 * (uint64_t)k, V);
        kv_prefix_clear(kv);
        if (one(s, a, n, &cold) < 0 || one(s, b, n, &hit) < 0)
            return 1;
        kv_prefix_clear(kv);
        if (one(s, b, n, &cold2) < 0)
            return 1;
        bool same = hit.n == cold2.n && memcmp(hit.ids, cold2.ids, sizeof hit.ids) == 0;
        bad += !same;
        double mean = (cold.ttft + cold2.ttft) / 2, cmean = (cold.cpu + cold2.cpu) / 2;
        printf("round %d: wall: cold %.3f s (cached %d), hit %.3f s (cached %d), cold %.3f s (cached %d): "
               "%.1fx; cpu: cold %.2f s, hit %.2f s, cold %.2f s: %.1fx; tokens %s\n", k, cold.ttft,
               cold.n_cached, hit.ttft, hit.n_cached, cold2.ttft, cold2.n_cached, mean / hit.ttft,
               cold.cpu, hit.cpu, cold2.cpu, cmean / hit.cpu, same ? "identical" : "DIFFER");
        fflush(stdout);
    }
    free(a);
    free(b);
    sched_free(s);
    kv_cache_free(kv);
    model_ctx_free(c);
    model_free(m);
    backend_free(be);
    return bad ? 1 : 0;
}
