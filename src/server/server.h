/*
 * server: the OpenAI-compatible HTTP server (`mlxcel serve`).
 *
 * libmicrohttpd runs one thread per connection (plus its listening thread);
 * a connection thread parses the request, turns it into engine jobs
 * (runner.h) and waits for their tokens, which the engine thread produces
 * for every running request together. No model work happens on an HTTP
 * thread. The server starts listening before the model is loaded (GET
 * /health answers 503 until server_set_model), and stops in two phases:
 * server_begin_stop() stops accepting and makes every in-flight request end
 * (cancelling its jobs), server_free() joins the connection threads.
 *
 * Endpoints, fields, limits and errors: docs/server.md.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../engine/spec.h"
#include "../models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct server_opts {
    const char *host;            /* an IPv4 or IPv6 literal; default 127.0.0.1 */
    int port;                    /* 0: an ephemeral port (server_port tells which) */
    const char *api_key;         /* NULL: no authentication */
    int parallel;                /* sequences decoding together (for /metrics) */
    int max_queue;               /* requests waiting beyond them (for /metrics) */
    size_t max_body;             /* request body bytes */
    int timeout_s;               /* idle connection timeout */
    int header_timeout_s;        /* request line + headers must arrive within this (0: 60) */
    int request_timeout_s;       /* the whole request, body included (0: 300) */
    int max_connections;         /* served at once; SRV_CONN_RESERVE more are answered 503 */
    bool log_json;               /* access log lines as JSON */
    bool allow_image_urls;       /* fetch image parts' http(s) URLs (image_fetch.h); else 400 */
    /* Host names accepted besides IP literals and localhost ("*": any; ".x.org": x.org and its
     * subdomains) and origins allowed cross-origin requests ("*": any); borrowed, they outlive
     * the server */
    const char *const *allowed_hosts;
    int n_allowed_hosts;
    const char *const *cors_origins;
    int n_cors_origins;
    /* llama-server's native routes (api_llama.h): POST /props accepted (--props), GET /slots
     * answered 501 (--no-slots) */
    bool endpoint_props;
    bool no_slots;
    const char *build_info;      /* GET /props build_info (borrowed; NULL: "mlxcel") */
};

/* What the server serves, once loaded (all borrowed; they outlive the server). */
struct tokenizer;
struct chat_tmpl;
struct runner;
struct grammar_vocab;
struct server_model {
    const char *id;                      /* the model's name in the API */
    const char *path;                    /* the checkpoint folder (GET /props), NULL: unknown */
    struct tokenizer *tok;
    const struct chat_tmpl *tmpl;        /* NULL: the model has no chat template */
    struct runner *runner;
    int n_vocab;
    int n_ctx;                           /* tokens one request may hold (prompt + output) */
    const struct hparams *hp;            /* EOS ids */
    struct generation_defaults gen;      /* sampling defaults of generation_config.json */
    const struct grammar_vocab *gvocab;  /* the tokenizer's byte trie for structured output */
    int tool_format;                     /* enum outparse_format the chat template teaches */
    bool reasoning;                      /* the template emits <think> reasoning */
    struct spec_params spec;             /* speculative decoding of every request (serve --spec) */
    /* image parts: the model's image setup (processor and placeholder text), NULL when it takes
     * none; then images_error says why (NULL: it has no vision tower) */
    const struct image_setup *images;
    const char *images_error;
    /* an encoder (embeddings, reranking) instead of a generating model: runner, tmpl and
     * gvocab are NULL, tok may be (token-id inputs only); borrowed */
    struct embedder *embedder;
};

struct embedder;
struct image_setup;
struct server;

/* Binds and starts answering (503 for everything but /health until the model is set). */
int server_start(struct server **out, const struct server_opts *o, struct err *e);
int server_port(const struct server *s);
void server_set_model(struct server *s, const struct server_model *m);
/* Stop accepting connections; in-flight requests end (their jobs are cancelled). */
void server_begin_stop(struct server *s);
/* Joins every connection thread and frees the server (after server_begin_stop). */
void server_free(struct server *s);

#ifdef __cplusplus
}
#endif
