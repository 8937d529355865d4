/*
 * router_impl: what server.c calls of the router (router.c); the CLI's side is router.h.
 */
#pragma once
#include <stdatomic.h>
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "oai_request.h"
#include "router.h"

struct router;
struct srv_model;
struct runner_stats;

/* The router over the models of l (copied), loading through ld; its thread started. */
int router_new(struct router **out, const struct router_list *l, const struct router_opts *o,
               const struct router_loader *ld, struct err *e);
/* Stops the thread and unloads every model (no references may remain). NULL: no-op. */
void router_free(struct router *rt);

/* A reference to model name, loaded: at once if it is, else after its load (queued here
 * when autoload is on), waiting at most the load timeout. 0 with *out, or -1 with *err:
 * 404 model_not_found, 500 model_load_failed (its error), 400 model_not_loaded (autoload
 * off), 503 (still loading, no room, shutting down). *out is released with
 * srv_model_release. */
int router_acquire(struct router *rt, const char *name, const atomic_int *stopping, struct srv_model **out,
                   struct oai_error *err);
void router_release(struct router *rt, struct srv_model *sm);

/* POST /models/load (load) and /models/unload: queue the load (a failed model is tried
 * again), or mark the model to go once idle. 0, or -1 with *err (404). */
int router_request(struct router *rt, const char *name, bool load, struct oai_error *err);

/* GET /v1/models, /models: the list (one NULL), or model one's object (*found false: no
 * such model). NULL: out of memory, or not found. */
cJSON *router_models_json(struct router *rt, const char *one, long created, bool *found);

/* The loaded models' runner statistics summed, and their parallel slots. */
void router_stats(struct router *rt, struct runner_stats *sum, int *slots);

// ---- the HTTP side (api_router.c) ----

#include <microhttpd.h>
struct server;
struct srv_req;
/* r->model: the model the body's "model" names, referenced (router_acquire); 0, or -1 with
 * *err (400: no "model", or the body is not a JSON object; router_acquire's errors). */
int srv_router_resolve(struct server *s, struct srv_req *r, struct oai_error *err);
/* The same for a model named elsewhere (the query of GET /props and /slots); NULL or "": a 400. */
int srv_router_resolve_name(struct server *s, struct srv_req *r, const char *name, struct oai_error *err);
/* GET /v1/models, /models, /v1/models/{id} in router mode: every model with its status. */
enum MHD_Result srv_router_models(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *id);
/* POST /models/load and /models/unload {"model": NAME} -> {"success": true}. */
enum MHD_Result srv_router_load(struct server *s, struct MHD_Connection *c, struct srv_req *r, bool load);
