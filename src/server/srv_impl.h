/*
 * srv_impl: what the server's files share (server.c: HTTP, routing, auth,
 * access log, small endpoints; gen.c and the api_*.c dialects: generation).
 */
#pragma once
#include <microhttpd.h>
#include <stdatomic.h>

#include "metrics.h"
#include "oai_request.h"
#include "server.h"

struct server {
    struct server_opts o;
    char host[64];
    struct MHD_Daemon *d;
    MHD_socket listen_fd;        /* the listening socket once quiesced (MHD_INVALID_SOCKET before) */
    int port;
    atomic_int ready;            /* model set */
    atomic_int stopping;
    atomic_int n_active;         /* requests between their first call and their completion */
    struct server_model m;       /* valid once ready */
    char model_id[256];
    long created;
    struct metrics metrics;
    atomic_uint_least64_t next_id;
    pthread_mutex_t log_mu;
};

/* One HTTP request (MHD's per-request context). */
struct srv_req {
    char method[16];
    char path[256];              /* escaped for the log, truncated */
    int endpoint_ok;
    char *body;
    size_t len, cap;
    bool too_big;
    bool queued;                 /* a response is queued */
    double t_start;
    int status;
    int n_prompt, n_gen;         /* for the log and metrics (-1: none) */
    bool tokens_counted;         /* n_prompt and n_gen are in the metrics (count_usage, gen.c) */
    double ttft, itl;            /* seconds (-1: none) */
    struct gen *stream;          /* the streaming generation answering it, if any */
    /* the error body of its route's dialect (set from the path with the headers, so even a
     * 401 or 413 has the route's shape); NULL: OpenAI's */
    char *(*error_json)(const struct oai_error *err);
};

/* Queue a response: a JSON body (copied) with status; extra header (name, value) or NULLs. */
enum MHD_Result srv_reply(struct MHD_Connection *c, struct srv_req *r, int status, const char *content_type,
                          const char *body, size_t len, const char *hname, const char *hvalue);
enum MHD_Result srv_reply_error(struct MHD_Connection *c, struct srv_req *r, const struct oai_error *err);
/* The cJSON document as the response body (deleted; NULL -> 500). */
enum MHD_Result srv_reply_json(struct MHD_Connection *c, struct srv_req *r, int status, struct cJSON *doc);
/* Whether the client closed its side of the connection. */
bool srv_client_gone(struct MHD_Connection *c);

/* POST /v1/chat/completions and /v1/completions (api_openai.c). */
enum MHD_Result srv_generate(struct server *s, struct MHD_Connection *c, struct srv_req *r, enum oai_endpoint ep);
/* POST /v1/responses (api_responses.c). */
enum MHD_Result srv_responses(struct server *s, struct MHD_Connection *c, struct srv_req *r);
/* POST /v1/messages and /v1/messages/count_tokens, the Anthropic dialect (api_anthropic.c). */
enum MHD_Result srv_anthropic_messages(struct server *s, struct MHD_Connection *c, struct srv_req *r);
enum MHD_Result srv_anthropic_count_tokens(struct server *s, struct MHD_Connection *c, struct srv_req *r);
/* Called when the request ends (access log time): a stream's generation is torn down. */
void srv_generate_end(struct server *s, struct srv_req *r);
