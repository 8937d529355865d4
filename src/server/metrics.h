/*
 * metrics: the server's counters and histograms, rendered as Prometheus text
 * (GET /metrics). Thread-safe (one mutex); every series is fixed-size, so
 * hostile traffic (random paths) cannot grow it: unknown paths count as
 * endpoint "other".
 */
#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define METRICS_N_ENDPOINTS 13
#define METRICS_N_STATUS 13
#define METRICS_N_BUCKETS 12

struct histogram {
    uint64_t count[METRICS_N_BUCKETS + 1];  /* per bucket, the last is +Inf */
    double sum;
    uint64_t n;
};

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[METRICS_N_ENDPOINTS][METRICS_N_STATUS];
    uint64_t prompt_tokens, generated_tokens;
    struct histogram ttft, itl, duration;   /* seconds */
    /* embedding / rerank batches (ADR 0114): batches run, the requests and sequences they
     * held, the most requests one batch held */
    uint64_t embed_batches, embed_batch_requests, embed_batch_sequences, embed_batch_max_requests;
};

/* Gauges read at render time. */
struct metrics_gauges {
    int queue_depth, busy_slots, slots;
    int kv_blocks_used, kv_blocks_total;
    int kv_blocks_cached;                   /* kept for the prefix cache, reclaimable */
    int kv_snapshots;                       /* recurrent states kept for the prefix cache (ADR 0129) */
    uint64_t prefix_query_tokens, prefix_hit_tokens;
    uint64_t spec_draft_tokens, spec_accepted_tokens;  /* speculative decoding */
};

void metrics_init(struct metrics *m);
void metrics_destroy(struct metrics *m);
/* One finished request: endpoint path (any string), HTTP status and timings (< 0: none). */
void metrics_request(struct metrics *m, const char *path, int status, double ttft_s, double itl_s,
                     double duration_s);
/* A request's prompt and generated tokens (<= 0: none), counted once its generation is over,
 * before the client can read the end of its answer. */
void metrics_tokens(struct metrics *m, int n_prompt, int n_gen);
/* One embedding / rerank batch of n_requests requests holding n_sequences sequences. */
void metrics_embed_batch(struct metrics *m, int n_requests, int n_sequences);
/* The Prometheus text exposition (malloc'd, NUL-terminated; NULL when out of memory). */
char *metrics_render(struct metrics *m, const struct metrics_gauges *g);

#ifdef __cplusplus
}
#endif
