/*
 * api_router: the HTTP side of router mode (router_impl.h): which model a request names,
 * the model list with each model's status, and POST /models/load and /models/unload, as
 * llama-server's router mode names them (docs/server.md, ADR 0099).
 */
#include <stdlib.h>
#include <string.h>

#include "router_impl.h"
#include "srv_impl.h"

int server_set_router(struct server *s, const struct router_list *l, const struct router_opts *o,
                      const struct router_loader *ld, struct err *e)
{
    int rc = router_new(&s->router, l, o, ld, e);
    if (rc == 0)
        atomic_store(&s->ready, 1);
    return rc;
}

/* The "model" member of the body, copied into name (cap bytes). */
static int body_model(const struct srv_req *r, char *name, size_t cap, struct oai_error *err)
{
    cJSON *in = oai_parse_object(r->body ? r->body : "", r->len, err);
    if (!in)
        return -1;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(in, "model");
    int rc = 0;
    if (!m || cJSON_IsNull(m))
        rc = oai_errorf(err, 400, "invalid_request_error", NULL, "model", "'model' is required: this server "
                        "serves several models (GET /v1/models lists them)");
    else if (!cJSON_IsString(m) || !*m->valuestring)
        rc = oai_errorf(err, 400, "invalid_request_error", NULL, "model", "'model' must be a non-empty string");
    else if (strlen(m->valuestring) >= cap)
        rc = oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.64s...' does not exist", m->valuestring);
    else
        memcpy(name, m->valuestring, strlen(m->valuestring) + 1);
    cJSON_Delete(in);
    return rc;
}

int srv_router_resolve_name(struct server *s, struct srv_req *r, const char *name, struct oai_error *err)
{
    if (!name || !*name)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "model", "this server serves several models: "
                          "name one as ?model=NAME (GET /models lists them)");
    if (strlen(name) >= ROUTER_NAME_MAX)
        return oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model",
                          "the model '%.64s...' does not exist", name);
    return router_acquire(s->router, name, &s->stopping, &r->model, err);
}

int srv_router_resolve(struct server *s, struct srv_req *r, struct oai_error *err)
{
    char name[ROUTER_NAME_MAX];
    if (body_model(r, name, sizeof name, err) < 0)
        return -1;
    return router_acquire(s->router, name, &s->stopping, &r->model, err);
}

enum MHD_Result srv_router_models(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *id)
{
    bool found;
    cJSON *doc = router_models_json(s->router, id, s->created, &found);
    if (!found) {
        struct oai_error err;
        oai_errorf(&err, 404, "invalid_request_error", "model_not_found", "model",
                   "the model '%.64s' does not exist; GET /v1/models lists the models served", id);
        return srv_reply_error(c, r, &err);
    }
    return srv_reply_json(c, r, 200, doc);
}

enum MHD_Result srv_router_load(struct server *s, struct MHD_Connection *c, struct srv_req *r, bool load)
{
    struct oai_error err;
    char name[ROUTER_NAME_MAX];
    if (!s->router) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, NULL, "this server serves one model (-m): start it "
                   "with --models-dir or several -m to load and unload models");
        return srv_reply_error(c, r, &err);
    }
    if (body_model(r, name, sizeof name, &err) < 0 || router_request(s->router, name, load, &err) < 0)
        return srv_reply_error(c, r, &err);
    cJSON *doc = cJSON_CreateObject();
    if (doc && !cJSON_AddTrueToObject(doc, "success")) {
        cJSON_Delete(doc);
        doc = NULL;
    }
    return srv_reply_json(c, r, 200, doc);
}
