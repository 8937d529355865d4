/*
 * api_lora: llama-server's LoRA adapter routes and per-request selection (ADR 0103).
 *
 *   GET  /lora-adapters   [{"id": 0, "path": "...", "scale": 1.0, "task_name": "",
 *                         "prompt_prefix": ""}, ...] in id order
 *   POST /lora-adapters   [{"id": 0, "scale": 0.5}, ...]: the global scales (adapters not
 *                         named go to 0, as llama-server's parse_lora_request does)
 *   "lora" in a completion / chat body: the same list for that request only
 *
 * The global scales live in the serving context (model_ctx_set_lora_scales); they are read
 * when a request is submitted (under the runner's lock, as submission is), so a POST changes
 * the requests that come after it and never one in flight.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../engine/generate.h"
#include "../engine/runner.h"
#include "../models/lora.h"
#include "srv_impl.h"

_Static_assert(OAI_MAX_LORA == LORA_MAX_ADAPTERS, "a request names every adapter at most once");

/* Scales of every served adapter from a list of {id, scale} (0 for the others); -1 with *err
 * for an id out of range. */
static int scales_of(const struct server_model *m, const int *id, const float *scale, int n, float *out,
                     struct oai_error *err)
{
    for (int i = 0; i < m->n_lora; i++)
        out[i] = 0.0f;
    for (int i = 0; i < n; i++) {
        if ((id[i] < 0 || id[i] >= m->n_lora) && m->n_lora == 0)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "lora", "invalid adapter id "
                              "%d (the server has no adapters: start it with --lora)", id[i]);
        if (id[i] < 0 || id[i] >= m->n_lora)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "lora", "invalid adapter id %d "
                              "(the server has %d adapter%s: ids 0 to %d)", id[i], m->n_lora,
                              m->n_lora == 1 ? "" : "s", m->n_lora - 1);
        out[id[i]] = scale[i];
    }
    return 0;
}

int srv_lora_params(const struct server_model *m, const struct oai_request *q, struct gen_params *p,
                    struct oai_error *err)
{
    int id[OAI_MAX_LORA];
    float scale[OAI_MAX_LORA];
    if (!q->has_lora)
        return 0;
    for (int i = 0; i < q->n_lora; i++) {
        id[i] = q->lora[i].id;
        scale[i] = q->lora[i].scale;
    }
    if (scales_of(m, id, scale, q->n_lora, p->lora, err) < 0)
        return -1;
    p->n_lora = m->n_lora;
    return 0;
}

static enum MHD_Result list(const struct server_model *m, struct MHD_Connection *c, struct srv_req *r)
{
    cJSON *out = cJSON_CreateArray();
    bool ok = out != NULL;
    if (m->n_lora)
        runner_lock(m->runner);
    for (int i = 0; ok && i < m->n_lora; i++) {
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(out, o) && cJSON_AddNumberToObject(o, "id", i) &&
             cJSON_AddStringToObject(o, "path", m->lora_paths[i]) &&
             cJSON_AddNumberToObject(o, "scale", model_ctx_lora_scale(m->lora_ctx, i)) &&
             /* llama-server's GGUF adapter metadata; safetensors adapters carry none */
             cJSON_AddStringToObject(o, "task_name", "") &&
             cJSON_AddStringToObject(o, "prompt_prefix", "");
    }
    if (m->n_lora)
        runner_unlock(m->runner);
    if (!ok) {
        cJSON_Delete(out);
        out = NULL;
    }
    return srv_reply_json(c, r, 200, out);
}

/* The body: a JSON array of {id, scale} objects (llama-server's shape). */
static int parse_post(const struct srv_req *r, int *id, float *scale, int *n, struct oai_error *err)
{
    cJSON *doc = NULL, *it;
    *n = 0;
    if (r->len == 0 || memchr(r->body, 0, r->len) ||
        !(doc = cJSON_ParseWithLengthOpts(r->body, r->len, NULL, false)))
        return oai_errorf(err, 400, "invalid_request_error", NULL, NULL,
                          "the body is not valid JSON: POST /lora-adapters takes [{\"id\": 0, "
                          "\"scale\": 1.0}, ...]");
    int rc = 0;
    if (!cJSON_IsArray(doc)) {
        rc = oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON "
                        "array of {\"id\", \"scale\"} objects");
        goto out;
    }
    cJSON_ArrayForEach(it, doc) {
        const cJSON *vi = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(it, "scale");
        if (*n == OAI_MAX_LORA) {
            rc = oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "more than %d entries",
                            OAI_MAX_LORA);
            goto out;
        }
        if (!cJSON_IsObject(it) || !cJSON_IsNumber(vi) || vi->valuedouble != floor(vi->valuedouble) ||
            fabs(vi->valuedouble) > 1e6 || (vs && !cJSON_IsNumber(vs))) {
            rc = oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "entry %d must be "
                            "{\"id\": integer, \"scale\": number}", *n);
            goto out;
        }
        double sc = vs ? vs->valuedouble : 0.0;
        if (!isfinite(sc) || fabs(sc) > LORA_MAX_SCALE) {
            rc = oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "entry %d: scale %g is "
                            "not in [-%g, %g]", *n, sc, (double)LORA_MAX_SCALE, (double)LORA_MAX_SCALE);
            goto out;
        }
        id[*n] = (int)vi->valuedouble;
        scale[(*n)++] = (float)sc;
    }
out:
    cJSON_Delete(doc);
    return rc;
}

enum MHD_Result srv_lora_adapters(struct server *s, struct MHD_Connection *c, struct srv_req *r,
                                  bool post)
{
    struct oai_error err;
    (void)s;
    const struct server_model *m = &r->model->m;   /* the model answering (router mode: ?model=) */
    if (!post)
        return list(m, c, r);
    int id[OAI_MAX_LORA], n;
    float scale[OAI_MAX_LORA], all[OAI_MAX_LORA];
    if (parse_post(r, id, scale, &n, &err) < 0 || scales_of(m, id, scale, n, all, &err) < 0)
        return srv_reply_error(c, r, &err);
    struct err e = {0};
    int rc = 0;
    if (m->n_lora) {
        runner_lock(m->runner);
        rc = model_ctx_set_lora_scales(m->lora_ctx, all, m->n_lora, &e);
        runner_unlock(m->runner);
    }
    if (rc < 0) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, NULL, "%s", e.msg);
        return srv_reply_error(c, r, &err);
    }
    static const char k_ok[] = "{\"success\":true}";
    return srv_reply(c, r, 200, "application/json", k_ok, sizeof k_ok - 1, NULL, NULL);
}
