/*
 * api_llama_props: llama-server's error body, its generation-settings
 * ("params") object, GET/POST /props and GET /slots (api_llama.h).
 *
 * The shapes follow llama-server's handlers (tools/server: get_props,
 * post_props, get_slots, task_params::to_json, format_error_response).
 * /slots maps the scheduler's jobs onto --parallel slots: the scheduler
 * runs jobs first come, first served, so the oldest running jobs fill the
 * slots from id 0 and the remaining slots are idle. Slot ids are therefore
 * positions, not pinned sequences (the engine pins no request to a slot).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/runner.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"
#include "api_llama.h"
#include "gen.h"

// ---- the error body ----

/* llama-server's error type for status (and our code, for the context case). */
static const char *llama_type(const struct oai_error *err)
{
    if (err->code && strcmp(err->code, "context_length_exceeded") == 0)
        return "exceed_context_size_error";
    switch (err->status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    case 500: return "server_error";
    default: return err->type ? err->type : "server_error";
    }
}

char *llama_error_json(const struct oai_error *err)
{
    cJSON *doc = cJSON_CreateObject(), *e;
    char *out = NULL;
    if (doc && (e = cJSON_AddObjectToObject(doc, "error")) && cJSON_AddNumberToObject(e, "code", err->status) &&
        cJSON_AddStringToObject(e, "message", err->message) && cJSON_AddStringToObject(e, "type", llama_type(err)))
        out = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    return out;
}

// ---- the params object ----

/* Number members in order; false when out of memory. */
static bool add_nums(cJSON *o, const char *const *names, const double *v, int n)
{
    for (int i = 0; i < n; i++)
        if (!cJSON_AddNumberToObject(o, names[i], v[i]))
            return false;
    return true;
}

static bool add_strings(cJSON *o, const char *name, const char *const *s, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, name);
    for (int i = 0; a && i < n; i++)
        if (!cJSON_AddItemToArray(a, cJSON_CreateString(s[i])))
            return false;
    return a != NULL;
}

cJSON *llama_params_json(const struct sampler_params *sp, const struct llama_settings *x, bool full)
{
    /* the sampler chain in the order sampler.c applies it */
    static const char *const k_samplers[] = {"penalties", "temperature", "top_k", "top_p", "min_p"};
    static const char *const k_breakers[] = {"\n", ":", "\"", "*"};
    static const char *const k_head[] = {"seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k",
                                         "top_p", "min_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
                                         "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
                                         "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
                                         "dry_penalty_last_n"};
    /* what runs: top_k 0, top_p 1, min_p 0 are off as in llama-server; samplers this engine
     * lacks are reported with their off values */
    const double head[] = {(double)sp->seed, sp->temperature, 0.0, 1.0, sp->top_k, sp->top_p, sp->min_p, -1.0,
                           0.0, 0.1, 1.0, sp->repeat_last_n, sp->repeat_penalty, sp->presence_penalty,
                           sp->frequency_penalty, 0.0, 1.75, 2, -1};
    static const char *const k_miro[] = {"mirostat", "mirostat_tau", "mirostat_eta"};
    const double miro[] = {0, 5.0, 0.1};
    cJSON *o = cJSON_CreateObject(), *lb;
    bool ok = o && add_nums(o, k_head, head, (int)(sizeof head / sizeof head[0]));
    if (ok && full)
        ok = add_strings(o, "dry_sequence_breakers", k_breakers, 4);
    ok = ok && add_nums(o, k_miro, miro, 3);
    if (ok && full)
        ok = add_strings(o, "stop", x->stop, x->n_stop);
    ok = ok && cJSON_AddNumberToObject(o, "max_tokens", x->n_predict) &&
         cJSON_AddNumberToObject(o, "n_predict", x->n_predict) && cJSON_AddNumberToObject(o, "n_keep", 0) &&
         cJSON_AddNumberToObject(o, "n_discard", 0) && cJSON_AddBoolToObject(o, "ignore_eos", x->ignore_eos) &&
         cJSON_AddBoolToObject(o, "stream", x->stream);
    if (ok && full) {
        ok = (lb = cJSON_AddArrayToObject(o, "logit_bias")) != NULL;
        for (int i = 0; ok && i < x->n_bias; i++) {
            cJSON *b = cJSON_CreateObject();
            ok = b && cJSON_AddItemToArray(lb, b) && cJSON_AddNumberToObject(b, "bias", x->bias[i].bias) &&
                 cJSON_AddNumberToObject(b, "token", x->bias[i].id);
        }
    }
    ok = ok && cJSON_AddNumberToObject(o, "n_probs", x->n_probs) && cJSON_AddNumberToObject(o, "min_keep", 0);
    if (ok && full)
        ok = cJSON_AddStringToObject(o, "grammar", "") && cJSON_AddBoolToObject(o, "grammar_lazy", false) &&
             cJSON_AddArrayToObject(o, "grammar_triggers") && cJSON_AddArrayToObject(o, "preserved_tokens");
    ok = ok && cJSON_AddStringToObject(o, "chat_format", "Content-only") &&
         cJSON_AddStringToObject(o, "reasoning_format", "none") &&
         cJSON_AddBoolToObject(o, "reasoning_in_content", false) &&
         cJSON_AddBoolToObject(o, "thinking_forced_open", false) && add_strings(o, "samplers", k_samplers, 5) &&
         cJSON_AddBoolToObject(o, "timings_per_token", false) && cJSON_AddBoolToObject(o, "post_sampling_probs", false) &&
         cJSON_AddArrayToObject(o, "lora");
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

void llama_default_sampling(const struct server_model *m, struct sampler_params *sp)
{
    const struct generation_defaults *d = &m->gen;
    sampler_params_default(sp);
    /* generation_config.json's values, else llama-server's own defaults (common_params_sampling) */
    sp->temperature = d->temperature >= 0 ? d->temperature : 0.8f;
    sp->top_k = d->top_k >= 0 ? d->top_k : 40;
    sp->top_p = d->top_p >= 0 ? d->top_p : 0.95f;
    sp->min_p = d->min_p >= 0 ? d->min_p : 0.05f;
    sp->repeat_penalty = d->repeat_penalty >= 0 ? d->repeat_penalty : 1.0f;
    sp->seed = LLAMA_SEED_RANDOM;
}

// ---- GET / POST /props ----

/* A special token's text ("" when the tokenizer has none). */
static const char *piece_or_empty(const struct tokenizer *tok, int32_t id)
{
    const char *p = tok && id >= 0 ? tok_id_to_piece(tok, id) : NULL;
    return p ? p : "";
}

enum MHD_Result srv_llama_props(struct server *s, struct MHD_Connection *c, struct srv_req *r, bool post)
{
    const struct srv_model *sm = r->model;   /* the model answering (router mode: ?model=) */
    struct oai_error err;
    if (post) {
        /* llama-server: nothing to change yet; refused unless started with --props */
        if (!s->o.endpoint_props) {
            oai_errorf(&err, 501, "not_supported_error", NULL, NULL,
                       "This server does not support changing global properties. Start it with `--props`");
            return srv_reply_error(c, r, &err);
        }
        cJSON *in = oai_parse_object(r->body ? r->body : "", r->len, &err);
        if (!in)
            return srv_reply_error(c, r, &err);
        cJSON_Delete(in);
        cJSON *ok = cJSON_CreateObject();
        if (ok && !cJSON_AddTrueToObject(ok, "success")) {
            cJSON_Delete(ok);
            ok = NULL;
        }
        return srv_reply_json(c, r, 200, ok);
    }
    struct sampler_params sp;
    llama_default_sampling(&sm->m, &sp);
    struct llama_settings x = {.n_predict = -1, .spec = sm->m.spec.mode != SPEC_NONE};
    const char *tmpl = sm->m.tmpl ? chat_tmpl_source(sm->m.tmpl) : "";
    cJSON *doc = cJSON_CreateObject(), *dgs, *mod, *params = llama_params_json(&sp, &x, false);
    bool ok = doc && params && (dgs = cJSON_AddObjectToObject(doc, "default_generation_settings")) &&
              cJSON_AddItemToObject(dgs, "params", params);
    if (!ok)
        cJSON_Delete(params);
    ok = ok && cJSON_AddNumberToObject(dgs, "n_ctx", sm->m.n_ctx) &&
         cJSON_AddNumberToObject(doc, "total_slots", s->o.parallel) &&
         cJSON_AddStringToObject(doc, "model_alias", sm->id) &&
         cJSON_AddStringToObject(doc, "model_path", sm->m.path ? sm->m.path : "") &&
         (mod = cJSON_AddObjectToObject(doc, "modalities")) &&
         cJSON_AddBoolToObject(mod, "vision", sm->m.images != NULL) && cJSON_AddBoolToObject(mod, "audio", false) &&
         cJSON_AddBoolToObject(doc, "endpoint_slots", !s->o.no_slots) &&
         cJSON_AddBoolToObject(doc, "endpoint_props", s->o.endpoint_props) &&
         cJSON_AddBoolToObject(doc, "endpoint_metrics", true) && cJSON_AddBoolToObject(doc, "webui", true) &&
         cJSON_AddStringToObject(doc, "chat_template", tmpl ? tmpl : "") &&
         cJSON_AddStringToObject(doc, "bos_token", piece_or_empty(sm->m.tok, sm->m.tok ? tok_bos_id(sm->m.tok) : -1)) &&
         cJSON_AddStringToObject(doc, "eos_token", piece_or_empty(sm->m.tok, sm->m.tok ? tok_eos_id(sm->m.tok) : -1)) &&
         cJSON_AddStringToObject(doc, "build_info", s->o.build_info ? s->o.build_info : "mlxcel") &&
         cJSON_AddBoolToObject(doc, "is_sleeping", false);
    if (!ok) {
        cJSON_Delete(doc);
        doc = NULL;
    }
    return srv_reply_json(c, r, 200, doc);
}

// ---- GET /slots ----

#define LLAMA_MAX_SLOTS 256  /* serve --parallel's bound */

/* One slot: a running job (v) or an idle one (v NULL, the default settings). */
static cJSON *slot_json(const struct srv_model *sm, int id, const struct runner_job_view *v)
{
    struct sampler_params sp;
    struct llama_settings x = {.n_predict = -1, .spec = sm->m.spec.mode != SPEC_NONE};
    if (v) {
        sp = v->sampling;
        x.n_predict = v->n_predict;
        x.ignore_eos = v->ignore_eos;
        x.spec = v->spec;
    } else {
        llama_default_sampling(&sm->m, &sp);
    }
    cJSON *o = cJSON_CreateObject(), *nt, *params = llama_params_json(&sp, &x, false);
    bool ok = o && params && cJSON_AddNumberToObject(o, "id", id) &&
              cJSON_AddNumberToObject(o, "id_task", v ? id : -1) && cJSON_AddNumberToObject(o, "n_ctx", sm->m.n_ctx) &&
              cJSON_AddBoolToObject(o, "speculative", x.spec) && cJSON_AddBoolToObject(o, "is_processing", v != NULL) &&
              cJSON_AddItemToObject(o, "params", params);
    if (!ok)
        cJSON_Delete(params);
    ok = ok && (nt = cJSON_AddObjectToObject(o, "next_token")) && cJSON_AddBoolToObject(nt, "has_next_token", v != NULL) &&
         cJSON_AddBoolToObject(nt, "has_new_line", false) &&
         cJSON_AddNumberToObject(nt, "n_remain", v ? v->n_predict - v->n_out : -1) &&
         cJSON_AddNumberToObject(nt, "n_decoded", v ? v->n_out : 0);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

enum MHD_Result srv_llama_slots(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    const struct srv_model *sm = r->model;   /* the model answering (router mode: ?model=) */
    struct oai_error err;
    if (s->o.no_slots) {
        oai_errorf(&err, 501, "not_supported_error", NULL, NULL,
                   "This server does not support slots endpoint. Start it with `--slots`");
        return srv_reply_error(c, r, &err);
    }
    int n_slots = s->o.parallel > 0 && s->o.parallel <= LLAMA_MAX_SLOTS ? s->o.parallel : 1;
    struct runner_job_view *v = calloc(LLAMA_MAX_SLOTS, sizeof *v);
    if (!v) {
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_reply_error(c, r, &err);
    }
    int n = sm->m.runner ? runner_get_jobs(sm->m.runner, v, n_slots) : 0, busy = 0;
    for (int i = 0; i < n; i++)
        busy += v[i].running;
    const char *fail = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
    if (fail && *fail && busy >= n_slots) {
        free(v);
        oai_errorf(&err, 503, "unavailable_error", NULL, NULL, "no slot available");
        return srv_reply_error(c, r, &err);
    }
    cJSON *arr = cJSON_CreateArray();
    bool ok = arr != NULL;
    for (int i = 0, k = 0; ok && i < n_slots; i++) {
        while (k < n && !v[k].running)
            k++;
        cJSON *one = slot_json(sm, i, k < n ? &v[k] : NULL);
        ok = one && cJSON_AddItemToArray(arr, one);
        k++;
    }
    free(v);
    if (!ok) {
        cJSON_Delete(arr);
        arr = NULL;
    }
    return srv_reply_json(c, r, 200, arr);
}
