/*
 * srv_impl: what the server's files share (server.c: HTTP, routing, auth,
 * access log, small endpoints; gen.c and the api_*.c dialects: generation).
 */
#pragma once
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "../engine/emb_batch.h"
#include "metrics.h"
#include "oai_request.h"
#include "server.h"

/* Connections accepted beyond --max-connections to answer their requests 503 (GET /health
 * normally), and beyond those, connections answered 503 as soon as they open; past both,
 * libmicrohttpd closes new connections without an answer (guard.c). */
#define SRV_CONN_RESERVE 64
#define SRV_CONN_REFUSE 256

/* Where a connection's current request stands (guard.c's watchdog reads it). */
enum srv_conn_phase {
    CONN_HEAD,                   /* request line and headers arriving */
    CONN_BODY,                   /* headers in, the body arriving */
    CONN_SERVING,                /* the request is whole: being answered */
    CONN_IDLE,                   /* kept alive after an answer, no byte of the next request yet */
    CONN_EXPIRED,                /* over a deadline: answered 408 by the watchdog, socket shut */
};

/* The token budget of one embedding / rerank batch (emb_batch.h): the embedder's host group
 * (one encoder call); a request over it runs alone. */
#define SRV_EMBED_BATCH_TOKENS 8192

/* One model the server answers for: the model of a single-model server (server.single), or one
 * of the router's (router.c), whose requests each hold a reference while they use it
 * (srv_model_retain / srv_model_release; a no-op without a router). */
struct router;
struct srv_model {
    struct server_model m;       /* what it serves (borrowed from the loader), valid while referenced */
    char id[256];                /* its name in the API */
    struct emb_batcher embed_b;  /* runs m.embedder: the embedding / rerank requests of the moment
                                  * packed into shared forwards (ADR 0114) */
    struct router *rt;           /* its router, NULL for a single-model server */
};
void srv_model_retain(struct srv_model *sm);
void srv_model_release(struct srv_model *sm);

/* One TCP connection (libmicrohttpd's socket context), from its opening to its closing. */
struct server;
struct srv_conn {
    struct server *s;
    struct srv_conn *prev, *next;  /* in server.conns */
    MHD_socket fd;
    bool overflow;               /* opened while --max-connections were open */
    enum srv_conn_phase phase;
    double t_begin;              /* the current request's start: the opening, or its first byte */
    uint64_t rx_mark;            /* bytes received when the previous answer ended (CONN_IDLE) */
    /* the error body of the request's route (its dialect), for the watchdog's 408 */
    char *(*error_json)(const struct oai_error *err);
};

struct server {
    struct server_opts o;
    char host[64];
    struct MHD_Daemon *d;
    MHD_socket listen_fd;        /* the listening socket once quiesced (MHD_INVALID_SOCKET before) */
    int port;
    atomic_int ready;            /* model set */
    atomic_int stopping;
    atomic_int n_active;         /* requests between their first call and their completion */
    struct srv_model single;     /* the model of a single-model server, valid once ready */
    struct router *router;       /* several models (router.c), owned; NULL: single */
    long created;
    struct metrics metrics;
    atomic_uint_least64_t next_id;
    pthread_mutex_t log_mu;
    pthread_mutex_t conn_mu;     /* guards conns, n_conns and every srv_conn's phase */
    struct srv_conn *conns;
    int n_conns;
    pthread_t watchdog;          /* guard.c: the deadlines */
    bool watchdog_started;
    atomic_int watchdog_stop;
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
    struct srv_conn *conn;       /* its connection (NULL: unknown) */
    struct srv_model *model;     /* the model answering it, referenced until its completion (NULL: none) */
    bool must_close;             /* answer with Connection: close (broken framing) */
    char cors_origin[256];       /* Access-Control-Allow-Origin for its answers ("": none) */
    /* the error body of its route's dialect (set from the path with the headers, so even a
     * 401 or 413 has the route's shape); NULL: OpenAI's */
    char *(*error_json)(const struct oai_error *err);
};

/* Queue resp with status, adding the request's CORS and Connection headers; sets r->status and
 * r->queued. The caller still destroys resp. */
enum MHD_Result srv_queue(struct MHD_Connection *c, struct srv_req *r, int status, struct MHD_Response *resp);
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
/* POST /v1/embeddings and /v1/rerank, /rerank for an encoder (api_embed.c). */
enum MHD_Result srv_embeddings(struct server *s, struct MHD_Connection *c, struct srv_req *r);
enum MHD_Result srv_rerank(struct server *s, struct MHD_Connection *c, struct srv_req *r);
/* GET and POST /lora-adapters, llama-server's (api_lora.c): the list [{id, path, scale}] of
 * the served adapters with their global scales; POST [{id, scale}] sets them (the adapters it
 * does not name to 0). */
enum MHD_Result srv_lora_adapters(struct server *s, struct MHD_Connection *c, struct srv_req *r,
                                  bool post);
struct gen_params;
/* A request's "lora" into p (nothing when it has none: the global scales apply); -1 with *err
 * (400, "invalid adapter id") for an id the server does not serve. */
int srv_lora_params(const struct server_model *m, const struct oai_request *q, struct gen_params *p,
                    struct oai_error *err);
/* Called when the request ends (access log time): a stream's generation is torn down. */
void srv_generate_end(struct server *s, struct srv_req *r);

// ---- guard.c: connections, deadlines, the request head ----

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the server): registers each
 * connection (overflow beyond --max-connections) and unregisters it when closed. */
void guard_notify_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode code);
/* Starts and stops the watchdog thread that answers 408 past --header-timeout /
 * --request-timeout. guard_start: 0 or -ERR_*; guard_stop joins it (idempotent). */
int guard_start(struct server *s, struct err *e);
void guard_stop(struct server *s);

/* What server.c knows of a route, for guard_head. */
enum srv_route_kind { ROUTE_KIND_NONE, ROUTE_KIND_GET, ROUTE_KIND_POST };

/* The checks on a request's head once its headers are in, before any body byte: RFC 9112
 * framing, sizes, Host, Origin / CORS, the connection limit, Content-Type. authority: an
 * absolute-form target's (RFC 9112 3.2.2), checked in place of Host; NULL for the
 * origin-form. Returns 0 to go on, 1 when it answered (a CORS preflight), -1 with *err the
 * answer to send (r->must_close set when the connection must close after it). */
int guard_head(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *url, const char *authority,
               const char *method, const char *version, enum srv_route_kind kind, bool health,
               struct oai_error *err);
/* The request's phase moves on (first call: CONN_BODY; final call or an early answer:
 * CONN_SERVING; completion: CONN_IDLE). False when the watchdog expired it first: the
 * handler then answers MHD_NO. */
bool guard_advance(struct srv_req *r, enum srv_conn_phase to);
