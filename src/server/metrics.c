/*
 * metrics: counters and histograms in Prometheus text format (metrics.h).
 */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_endpoints[METRICS_N_ENDPOINTS] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
    "/tokenize", "/detokenize", "/apply-template", "/v1/responses", "/v1/messages",
    "/v1/messages/count_tokens", "/v1/models/{id}", "other",
};
static const int k_status[METRICS_N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 408, 431, 499, 0};
static const double k_buckets[METRICS_N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1.0,  2.5,   5.0,  10.0, 30.0};

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_destroy(struct metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

static int endpoint_index(const char *path)
{
    for (int i = 0; i < METRICS_N_ENDPOINTS - 2; i++)
        if (strcmp(path, k_endpoints[i]) == 0)
            return i;
    if (strncmp(path, "/v1/models/", 11) == 0)
        return METRICS_N_ENDPOINTS - 2;
    return METRICS_N_ENDPOINTS - 1;
}

static int status_index(int status)
{
    for (int i = 0; i < METRICS_N_STATUS - 1; i++)
        if (k_status[i] == status)
            return i;
    return METRICS_N_STATUS - 1;  /* "other" */
}

static void observe(struct histogram *h, double v)
{
    int b = 0;
    while (b < METRICS_N_BUCKETS && v > k_buckets[b])
        b++;
    h->count[b]++;
    h->sum += v;
    h->n++;
}

void metrics_embed_batch(struct metrics *m, int n_requests, int n_sequences)
{
    pthread_mutex_lock(&m->mu);
    m->embed_batches++;
    m->embed_batch_requests += (uint64_t)(n_requests > 0 ? n_requests : 0);
    m->embed_batch_sequences += (uint64_t)(n_sequences > 0 ? n_sequences : 0);
    if (n_requests > 0 && (uint64_t)n_requests > m->embed_batch_max_requests)
        m->embed_batch_max_requests = (uint64_t)n_requests;
    pthread_mutex_unlock(&m->mu);
}

void metrics_tokens(struct metrics *m, int n_prompt, int n_gen)
{
    pthread_mutex_lock(&m->mu);
    if (n_prompt > 0)
        m->prompt_tokens += (uint64_t)n_prompt;
    if (n_gen > 0)
        m->generated_tokens += (uint64_t)n_gen;
    pthread_mutex_unlock(&m->mu);
}

void metrics_request(struct metrics *m, const char *path, int status, double ttft_s, double itl_s,
                     double duration_s)
{
    pthread_mutex_lock(&m->mu);
    m->requests[endpoint_index(path)][status_index(status)]++;
    if (ttft_s >= 0)
        observe(&m->ttft, ttft_s);
    if (itl_s >= 0)
        observe(&m->itl, itl_s);
    if (duration_s >= 0)
        observe(&m->duration, duration_s);
    pthread_mutex_unlock(&m->mu);
}

struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)w < b->cap - b->len) {
            b->len += (size_t)w;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)w;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void histogram_render(struct sbuf *b, const char *name, const char *help, const struct histogram *h)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < METRICS_N_BUCKETS; i++) {
        cum += h->count[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, k_buckets[i], (unsigned long long)cum);
    }
    cum += h->count[METRICS_N_BUCKETS];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum,
              name, h->sum, name, (unsigned long long)h->n);
}

char *metrics_render(struct metrics *m, const struct metrics_gauges *g)
{
    struct sbuf b = {.p = malloc(4096), .cap = 4096};
    if (!b.p)
        return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    sb_printf(&b, "# HELP mlxcel_requests_total HTTP requests by endpoint and status.\n"
                  "# TYPE mlxcel_requests_total counter\n");
    for (int i = 0; i < METRICS_N_ENDPOINTS; i++)
        for (int s = 0; s < METRICS_N_STATUS; s++)
            if (m->requests[i][s]) {
                char st[16];
                snprintf(st, sizeof st, k_status[s] ? "%d" : "other", k_status[s]);
                sb_printf(&b, "mlxcel_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", k_endpoints[i], st,
                          (unsigned long long)m->requests[i][s]);
            }
    sb_printf(&b, "# HELP mlxcel_prompt_tokens_total Prompt tokens processed.\n"
                  "# TYPE mlxcel_prompt_tokens_total counter\nmlxcel_prompt_tokens_total %llu\n"
                  "# HELP mlxcel_generated_tokens_total Tokens generated.\n"
                  "# TYPE mlxcel_generated_tokens_total counter\nmlxcel_generated_tokens_total %llu\n",
              (unsigned long long)m->prompt_tokens, (unsigned long long)m->generated_tokens);
    sb_printf(&b, "# HELP mlxcel_queue_depth Requests waiting for a slot.\n# TYPE mlxcel_queue_depth gauge\n"
                  "mlxcel_queue_depth %d\n"
                  "# HELP mlxcel_busy_slots Sequences decoding now.\n# TYPE mlxcel_busy_slots gauge\n"
                  "mlxcel_busy_slots %d\n"
                  "# HELP mlxcel_slots Sequences that can run together (--parallel).\n# TYPE mlxcel_slots gauge\n"
                  "mlxcel_slots %d\n"
                  "# HELP mlxcel_kv_cache_usage_ratio Fraction of the KV cache blocks in use.\n"
                  "# TYPE mlxcel_kv_cache_usage_ratio gauge\nmlxcel_kv_cache_usage_ratio %.6f\n"
                  "# HELP mlxcel_kv_cache_blocks KV cache blocks in use.\n# TYPE mlxcel_kv_cache_blocks gauge\n"
                  "mlxcel_kv_cache_blocks %d\n",
              g->queue_depth, g->busy_slots, g->slots,
              g->kv_blocks_total > 0 ? (double)g->kv_blocks_used / g->kv_blocks_total : 0.0, g->kv_blocks_used);
    sb_printf(&b, "# HELP mlxcel_kv_cache_cached_blocks KV cache blocks kept for the prefix cache (reclaimable).\n"
                  "# TYPE mlxcel_kv_cache_cached_blocks gauge\nmlxcel_kv_cache_cached_blocks %d\n"
                  "# HELP mlxcel_prefix_cache_snapshots Recurrent states kept for the prefix cache (ADR 0129).\n"
                  "# TYPE mlxcel_prefix_cache_snapshots gauge\nmlxcel_prefix_cache_snapshots %d\n"
                  "# HELP mlxcel_prefix_cache_query_tokens_total Prompt tokens looked up in the prefix cache.\n"
                  "# TYPE mlxcel_prefix_cache_query_tokens_total counter\nmlxcel_prefix_cache_query_tokens_total %llu\n"
                  "# HELP mlxcel_prefix_cache_hit_tokens_total Prompt tokens found in the prefix cache.\n"
                  "# TYPE mlxcel_prefix_cache_hit_tokens_total counter\nmlxcel_prefix_cache_hit_tokens_total %llu\n",
              g->kv_blocks_cached, g->kv_snapshots, (unsigned long long)g->prefix_query_tokens,
              (unsigned long long)g->prefix_hit_tokens);
    sb_printf(&b, "# HELP mlxcel_spec_draft_tokens_total Tokens drafted by speculative decoding.\n"
                  "# TYPE mlxcel_spec_draft_tokens_total counter\nmlxcel_spec_draft_tokens_total %llu\n"
                  "# HELP mlxcel_spec_accepted_tokens_total Drafted tokens accepted.\n"
                  "# TYPE mlxcel_spec_accepted_tokens_total counter\nmlxcel_spec_accepted_tokens_total %llu\n",
              (unsigned long long)g->spec_draft_tokens, (unsigned long long)g->spec_accepted_tokens);
    sb_printf(&b, "# HELP mlxcel_embed_batches_total Embedding and rerank batches run (ADR 0114).\n"
                  "# TYPE mlxcel_embed_batches_total counter\nmlxcel_embed_batches_total %llu\n"
                  "# HELP mlxcel_embed_batch_requests_total Requests in those batches.\n"
                  "# TYPE mlxcel_embed_batch_requests_total counter\nmlxcel_embed_batch_requests_total %llu\n"
                  "# HELP mlxcel_embed_batch_sequences_total Sequences in those batches.\n"
                  "# TYPE mlxcel_embed_batch_sequences_total counter\nmlxcel_embed_batch_sequences_total %llu\n"
                  "# HELP mlxcel_embed_batch_max_requests The most requests one batch held.\n"
                  "# TYPE mlxcel_embed_batch_max_requests gauge\nmlxcel_embed_batch_max_requests %llu\n",
              (unsigned long long)m->embed_batches, (unsigned long long)m->embed_batch_requests,
              (unsigned long long)m->embed_batch_sequences, (unsigned long long)m->embed_batch_max_requests);
    histogram_render(&b, "mlxcel_time_to_first_token_seconds", "Time from request to first generated token.",
                     &m->ttft);
    histogram_render(&b, "mlxcel_inter_token_latency_seconds", "Mean time between generated tokens, per request.",
                     &m->itl);
    histogram_render(&b, "mlxcel_request_duration_seconds", "Time to answer a generation request.",
                     &m->duration);
    pthread_mutex_unlock(&m->mu);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
