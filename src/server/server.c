/*
 * server: HTTP, routing, authentication, the access log and the small
 * endpoints (server.h). Generation is gen.c under the dialects api_openai.c, api_responses.c,
 * api_anthropic.c.
 *
 * A request's life in libmicrohttpd: the access handler is called once with
 * the headers (guard.c checks the head there: framing, sizes, Host, Origin,
 * the connection limit, Content-Type; and a Content-Length over --max-body is
 * answered 413, before any byte of the body is read), then with each piece of
 * the body (kept up to --max-body; more marks it too big), then once more
 * with no data: the request is complete and is routed. Each step first moves
 * the connection's phase (guard_advance), which fails when guard.c's watchdog
 * has already answered 408. The completion callback writes the access-log
 * line, counts the request in the metrics and frees the request state.
 */
#include "srv_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/log.h"
#include "../engine/generate.h"
#include "../engine/runner.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"
#include "api_anthropic.h"
#include "api_llama.h"
#include "outparse.h"
#include "router_impl.h"

/* libmicrohttpd's memory per connection, for the request line and headers among other things:
 * well above guard.c's 64 KiB limit on them, so that a head over that limit reaches the access
 * handler and is answered 431 JSON there (one over this, libmicrohttpd answers itself, in
 * HTML). Allocated as it is used. */
#define SRV_MHD_POOL_BYTES (512u << 10)

// ---- responses ----

enum MHD_Result srv_queue(struct MHD_Connection *c, struct srv_req *r, int status, struct MHD_Response *resp)
{
    bool ok = true;
    if (r->cors_origin[0])
        ok = MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors_origin) == MHD_YES &&
             MHD_add_response_header(resp, "Vary", "Origin") == MHD_YES;
    if (r->must_close)
        ok = ok && MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close") == MHD_YES;
    enum MHD_Result q = ok ? MHD_queue_response(c, (unsigned)status, resp) : MHD_NO;
    r->status = status;
    r->queued = q == MHD_YES;
    if (r->queued)
        guard_advance(r, CONN_SERVING);
    return q;
}

enum MHD_Result srv_reply(struct MHD_Connection *c, struct srv_req *r, int status, const char *content_type,
                          const char *body, size_t len, const char *hname, const char *hvalue)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (hname)
        MHD_add_response_header(resp, hname, hvalue);
    enum MHD_Result ok = srv_queue(c, r, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

enum MHD_Result srv_reply_error(struct MHD_Connection *c, struct srv_req *r, const struct oai_error *err)
{
    char *body = r->error_json ? r->error_json(err) : oai_error_json(err);
    static const char k_oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                "\"param\":null,\"code\":null}}";
    /* the header a status carries (429, 503: when to retry, 401: the scheme, 405: the method) */
    bool retry = err->status == 429 || err->status == 503;
    const char *hname = retry                ? "Retry-After"
                        : err->status == 401 ? "WWW-Authenticate"
                        : err->status == 405 ? "Allow"
                                             : NULL;
    const char *hvalue = retry                ? "1"
                         : err->status == 401 ? "Bearer"
                                              : r->endpoint_ok == 1 ? "GET" : "POST";
    enum MHD_Result ok = srv_reply(c, r, body ? err->status : 500, "application/json", body ? body : k_oom,
                                   body ? strlen(body) : sizeof k_oom - 1, hname, hvalue);
    free(body);
    return ok;
}

enum MHD_Result srv_reply_json(struct MHD_Connection *c, struct srv_req *r, int status, cJSON *doc)
{
    char *body = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!body) {
        struct oai_error err;
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_reply_error(c, r, &err);
    }
    enum MHD_Result ok = srv_reply(c, r, status, "application/json", body, strlen(body), NULL, NULL);
    free(body);
    return ok;
}

bool srv_client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// ---- authentication ----

/* Constant-time comparison of the presented key with the configured one: the time
 * depends on the lengths only. */
static bool key_equal(const char *got, size_t got_len, const char *want)
{
    size_t want_len = strlen(want);
    unsigned char diff = (unsigned char)(got_len != want_len);
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < got_len ? got[i] : 0);
    return diff == 0;
}

/* The length of a field value without the whitespace after it, which is not part of the
 * value (RFC 9110 5.5) and which libmicrohttpd 0.9.75 keeps. */
static size_t value_len(const char *v)
{
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return n;
}

static bool authorized(const struct server *s, struct MHD_Connection *c)
{
    if (!s->o.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && strncasecmp(h, "Bearer ", 7) == 0) {
        h += 7;
        while (*h == ' ')
            h++;
        return key_equal(h, value_len(h), s->o.api_key);
    }
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    return h && key_equal(h, value_len(h), s->o.api_key);
}

// ---- small endpoints ----

static cJSON *model_object(const struct server *s)
{
    cJSON *m = cJSON_CreateObject();
    if (m && (!cJSON_AddStringToObject(m, "id", s->single.id) || !cJSON_AddStringToObject(m, "object", "model") ||
              !cJSON_AddNumberToObject(m, "created", (double)s->created) ||
              !cJSON_AddStringToObject(m, "owned_by", "mlxcel"))) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static enum MHD_Result ep_models(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *id)
{
    if (s->router)
        return srv_router_models(s, c, r, id);
    if (id) {
        if (strcmp(id, s->single.id) != 0) {
            struct oai_error err;
            oai_errorf(&err, 404, "invalid_request_error", "model_not_found", "model",
                       "the model '%.64s' does not exist; this server serves '%s'", id, s->single.id);
            return srv_reply_error(c, r, &err);
        }
        return srv_reply_json(c, r, 200, model_object(s));
    }
    cJSON *list = cJSON_CreateObject(), *data = NULL, *m = model_object(s);
    bool ok = list && m && cJSON_AddStringToObject(list, "object", "list") &&
              (data = cJSON_AddArrayToObject(list, "data")) && cJSON_AddItemToArray(data, m);
    if (!ok) {
        cJSON_Delete(m);
        cJSON_Delete(list);
        list = NULL;
    }
    return srv_reply_json(c, r, 200, list);
}

static enum MHD_Result ep_metrics(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct runner_stats st = {0};
    int slots = s->o.parallel;
    if (s->router)
        router_stats(s->router, &st, &slots);
    else if (s->single.m.runner)
        runner_get_stats(s->single.m.runner, &st);
    struct metrics_gauges g = {.queue_depth = st.n_waiting, .busy_slots = st.n_running, .slots = slots,
                               .kv_blocks_used = st.kv_blocks_used, .kv_blocks_total = st.kv_blocks_total,
                               .kv_blocks_cached = st.kv_blocks_cached, .kv_snapshots = st.kv_snapshots,
                               .prefix_query_tokens = st.prefix_query_tokens,
                               .prefix_hit_tokens = st.prefix_hit_tokens,
                               .spec_draft_tokens = st.spec_draft_tokens,
                               .spec_accepted_tokens = st.spec_accepted_tokens};
    char *text = metrics_render(&s->metrics, &g);
    if (!text) {
        struct oai_error err;
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_reply_error(c, r, &err);
    }
    enum MHD_Result ok = srv_reply(c, r, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                                   NULL, NULL);
    free(text);
    return ok;
}

/* A boolean member (absent: dflt); -1 with *err when it is not a boolean. */
static int get_bool(const cJSON *o, const char *name, bool dflt, bool *out, struct oai_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return oai_errorf(err, 400, "invalid_request_error", NULL, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* POST /tokenize {"content", "add_special", "with_pieces"} -> {"tokens": [...]} (llama-server). */
static enum MHD_Result ep_tokenize(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    (void)s;  /* the model is the request's (r->model) */
    struct oai_error err;
    cJSON *in = oai_parse_object(r->body, r->len, &err), *out = NULL, *toks = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    bool special, pieces;
    if (!in)
        return srv_reply_error(c, r, &err);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(in, "content");
    if (!cJSON_IsString(content)) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "content", "'content' must be a string");
        goto fail;
    }
    if (get_bool(in, "add_special", false, &special, &err) < 0 || get_bool(in, "with_pieces", false, &pieces, &err) < 0)
        goto fail;
    struct err e = {0};
    if (tok_encode(r->model->m.tok, content->valuestring, strlen(content->valuestring), special, &ids, &n, &e) < 0) {
        oai_errorf(&err, e.code == ERR_NOMEM ? 500 : 400, e.code == ERR_NOMEM ? "server_error" : "invalid_request_error",
                   NULL, "content", "%s", e.msg);
        goto fail;
    }
    bool ok = (out = cJSON_CreateObject()) && (toks = cJSON_AddArrayToObject(out, "tokens"));
    char piece[TOK_PIECE_MAX * 3 + 8];
    for (size_t i = 0; ok && i < n; i++) {
        if (!pieces) {
            ok = cJSON_AddItemToArray(toks, cJSON_CreateNumber(ids[i]));
            continue;
        }
        char *txt = NULL;
        cJSON *t = cJSON_CreateObject();
        ok = t && cJSON_AddItemToArray(toks, t) && cJSON_AddNumberToObject(t, "id", ids[i]) &&
             tok_decode(r->model->m.tok, &ids[i], 1, false, &txt, NULL) == 0;
        if (ok)
            snprintf(piece, sizeof piece, "%s", txt);
        free(txt);
        ok = ok && cJSON_AddStringToObject(t, "piece", piece);
    }
    free(ids);
    cJSON_Delete(in);
    if (!ok) {
        cJSON_Delete(out);
        out = NULL;
    }
    r->n_prompt = (int)n;
    return srv_reply_json(c, r, 200, out);
fail:
    free(ids);
    cJSON_Delete(in);
    return srv_reply_error(c, r, &err);
}

/* POST /detokenize {"tokens": [ids]} -> {"content": text}. */
static enum MHD_Result ep_detokenize(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    (void)s;  /* the model is the request's (r->model) */
    struct oai_error err;
    cJSON *in = oai_parse_object(r->body, r->len, &err), *out = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    if (!in)
        return srv_reply_error(c, r, &err);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(in, "tokens"), *t;
    int n = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : -1, i = 0;
    if (n < 0 || n > OAI_MAX_PROMPT_IDS) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "tokens",
                   n < 0 ? "'tokens' must be an array of token ids" : "'tokens' holds more than %d ids",
                   OAI_MAX_PROMPT_IDS);
        goto fail;
    }
    ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) {
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    cJSON_ArrayForEach(t, toks) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(v >= 0 && v < r->model->m.n_vocab && v == (double)(int32_t)v)) {
            oai_errorf(&err, 400, "invalid_request_error", NULL, "tokens",
                       "tokens[%d] is not a token id in [0, %d)", i, r->model->m.n_vocab);
            goto fail;
        }
        ids[i++] = (int32_t)v;
    }
    struct err e = {0};
    if (tok_decode(r->model->m.tok, ids, (size_t)n, false, &text, &e) < 0) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "tokens", "%s", e.msg);
        goto fail;
    }
    if ((out = cJSON_CreateObject()) && !cJSON_AddStringToObject(out, "content", text)) {
        cJSON_Delete(out);
        out = NULL;
    }
    free(text);
    free(ids);
    cJSON_Delete(in);
    return srv_reply_json(c, r, 200, out);
fail:
    free(ids);
    cJSON_Delete(in);
    return srv_reply_error(c, r, &err);
}

/* POST /apply-template {"messages": [...], "tools"?, "chat_template_kwargs"?} -> {"prompt": text}:
 * the chat prompt /v1/chat/completions renders for the same body (as llama-server's): the
 * tools (unless tool_choice is none) and chat_template_kwargs go to the template, and with
 * a template that demands 9-character call ids the ids are shortened as there (gen.c). */
static enum MHD_Result ep_apply_template(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    (void)s;  /* the model is the request's (r->model) */
    struct oai_error err;
    struct oai_request q;
    char *text = NULL;
    size_t len;
    cJSON *out = NULL;
    if (oai_request_parse(&q, OAI_CHAT, r->body, r->len, r->model->m.n_vocab, &err) < 0)
        return srv_reply_error(c, r, &err);
    struct err e = {0};
    cJSON *extra = NULL;
    if (!r->model->m.tmpl) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "messages", "this model has no chat template");
    } else if (!(extra = q.template_kwargs ? cJSON_Duplicate(q.template_kwargs, true) : cJSON_CreateObject()) ||
               (q.tools && q.tool_choice != OAI_TOOL_CHOICE_NONE &&
                !cJSON_AddItemToObject(extra, "tools", cJSON_Duplicate(q.tools, true))) ||
               (outparse_detect_short_ids(chat_tmpl_source(r->model->m.tmpl)) && outparse_shorten_ids(q.messages) < 0)) {
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
    } else if (chat_tmpl_apply(r->model->m.tmpl, q.messages, true, extra, &text, &len, &e) < 0) {
        oai_errorf(&err, e.code == ERR_NOMEM ? 500 : 400, e.code == ERR_NOMEM ? "server_error" : "invalid_request_error",
                   NULL, "messages", "the chat template failed: %s", e.msg);
    } else if ((out = cJSON_CreateObject()) && !cJSON_AddStringToObject(out, "prompt", text)) {
        cJSON_Delete(out);
        out = NULL;
    }
    free(text);
    cJSON_Delete(extra);
    oai_request_free(&q);
    if (text || out)
        return srv_reply_json(c, r, 200, out);
    return srv_reply_error(c, r, &err);
}

/* The chat page (src/server/chat.html), embedded at build time by cmake/embed.cmake. */
extern const unsigned char srv_chat_html[];
extern const size_t srv_chat_html_len;

/* GET / -> the chat page: static, answered without the API key (the page asks for it) and
 * confined by its Content-Security-Policy to inline code and this server (images: only the data:
 * URLs the page makes from files the user attaches). */
static enum MHD_Result ep_page(struct MHD_Connection *c, struct srv_req *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(srv_chat_html_len, (void *)srv_chat_html, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    bool ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8") == MHD_YES &&
              MHD_add_response_header(resp, "Content-Security-Policy",
                                      "default-src 'self'; script-src 'unsafe-inline' 'self'; "
                                      "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                      "form-action 'none'; frame-ancestors 'none'") == MHD_YES &&
              MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff") == MHD_YES &&
              MHD_add_response_header(resp, "Referrer-Policy", "no-referrer") == MHD_YES &&
              MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache") == MHD_YES;
    enum MHD_Result q = ok ? srv_queue(c, r, 200, resp) : MHD_NO;
    MHD_destroy_response(resp);
    return q;
}

/* GET /favicon.ico -> a small SVG icon (what browsers ask for beside the chat page; an SVG is
 * read by its Content-Type whatever the name). */
static enum MHD_Result ep_favicon(struct MHD_Connection *c, struct srv_req *r)
{
    static const char k_icon[] =
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">"
        "<rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#2d6cdf\"/>"
        "<path d=\"M4 11V5l2 3 2-3 2 3 2-3v6\" fill=\"none\" stroke=\"#fff\" stroke-width=\"1.5\"/></svg>";
    struct MHD_Response *resp = MHD_create_response_from_buffer(sizeof k_icon - 1, (void *)k_icon,
                                                                MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    bool ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "image/svg+xml") == MHD_YES &&
              MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff") == MHD_YES &&
              MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "max-age=86400") == MHD_YES;
    enum MHD_Result q = ok ? srv_queue(c, r, 200, resp) : MHD_NO;
    MHD_destroy_response(resp);
    return q;
}

// ---- routing ----

enum route {
    R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE,
    R_TEMPLATE, R_PAGE, R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS, R_FAVICON, R_EMBEDDINGS, R_RERANK,
    R_ROUTER_MODELS, R_ROUTER_LOAD, R_ROUTER_UNLOAD,  /* llama-server's router mode (api_router.c) */
    R_LLAMA_COMPLETION, R_LLAMA_INFILL, R_LLAMA_PROPS, R_LLAMA_SLOTS,
    R_LORA,
};

struct route_entry {
    const char *path;
    bool post;
    enum route route;
    char *(*error_json)(const struct oai_error *err);  /* the dialect's error body (NULL: OpenAI's) */
};

static const struct route_entry k_routes[] = {
    {"/", false, R_PAGE, NULL},
    {"/favicon.ico", false, R_FAVICON, NULL},
    {"/health", false, R_HEALTH, NULL},
    {"/v1/health", false, R_HEALTH, NULL},
    {"/v1/models", false, R_MODELS, NULL},
    {"/metrics", false, R_METRICS, NULL},
    {"/v1/chat/completions", true, R_CHAT, NULL},
    {"/v1/completions", true, R_COMPLETIONS, NULL},
    {"/v1/responses", true, R_RESPONSES, NULL},
    {"/tokenize", true, R_TOKENIZE, NULL},
    {"/detokenize", true, R_DETOKENIZE, NULL},
    {"/apply-template", true, R_TEMPLATE, NULL},
    {"/v1/messages", true, R_MESSAGES, anthropic_error_json},
    {"/v1/messages/count_tokens", true, R_COUNT_TOKENS, anthropic_error_json},
    {"/v1/embeddings", true, R_EMBEDDINGS, NULL},
    {"/v1/rerank", true, R_RERANK, NULL},
    {"/rerank", true, R_RERANK, NULL},
    {"/models", false, R_ROUTER_MODELS, NULL},
    {"/models/load", true, R_ROUTER_LOAD, NULL},
    {"/models/unload", true, R_ROUTER_UNLOAD, NULL},
    /* llama-server's native routes (api_llama.h); POST /props as well (dispatch) */
    {"/completion", true, R_LLAMA_COMPLETION, llama_error_json},
    {"/completions", true, R_LLAMA_COMPLETION, llama_error_json},
    {"/infill", true, R_LLAMA_INFILL, llama_error_json},
    {"/props", false, R_LLAMA_PROPS, llama_error_json},
    {"/slots", false, R_LLAMA_SLOTS, llama_error_json},
    {"/lora-adapters", false, R_LORA, NULL},  /* GET, and POST (route_post) */
};

/* The error renderer of path's route (NULL: OpenAI's). */
static char *(*route_error_json(const char *path))(const struct oai_error *)
{
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (strcmp(path, k_routes[i].path) == 0)
            return k_routes[i].error_json;
    return NULL;
}

/* Whether a POST to route rt is its POST form: /lora-adapters answers both methods. */
static bool route_post(enum route rt, bool post, const char *method)
{
    return post || (rt == R_LORA && strcmp(method, "POST") == 0);
}

/* The route of path, and whether it is a POST endpoint (*post). */
static enum route find_route(const char *path, bool *post)
{
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (strcmp(path, k_routes[i].path) == 0) {
            *post = k_routes[i].post;
            return k_routes[i].route;
        }
    if (strncmp(path, "/v1/models/", 11) == 0 && path[11]) {
        *post = false;
        return R_MODEL;
    }
    return R_NONE;
}

/* The path of a request target. RFC 9112 3.2.2: a server accepts the absolute-form
 * ("GET http://127.0.0.1:8080/v1/models HTTP/1.1", the scheme in any case) as well as the
 * origin-form ("/v1/models"): its path ("/" when empty) is routed, and its authority, copied
 * into auth, stands for Host (guard_head checks it against the allowlist instead).
 * Origin-form: the target itself, auth empty; an authority too long for auth becomes one
 * that no allowlist accepts (" "). */
static const char *target_path(const char *url, char *auth, size_t cap)
{
    const char *p = strncasecmp(url, "http://", 7) == 0 ? url + 7 : strncasecmp(url, "https://", 8) == 0 ? url + 8 : NULL;
    auth[0] = '\0';
    if (!p)
        return url;
    size_t n = strcspn(p, "/?#");
    snprintf(auth, cap, "%.*s", (int)(n < cap ? n : 0), n < cap ? p : " ");
    if (!auth[0])
        snprintf(auth, cap, " ");  /* "http:///x": no authority, not allowed */
    return p[n] == '/' ? p + n : "/";
}

static enum MHD_Result dispatch(struct server *s, struct MHD_Connection *c, struct srv_req *r, const char *target,
                                const char *method)
{
    struct oai_error err;
    bool post = false;
    char auth[256];
    const char *url = target_path(target, auth, sizeof auth);
    enum route rt = find_route(url, &post);
    post = route_post(rt, post, method);
    bool is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool is_post = strcmp(method, "POST") == 0;
    if (rt != R_HEALTH && rt != R_PAGE && rt != R_FAVICON && !authorized(s, c)) {
        oai_errorf(&err, 401, "authentication_error", "invalid_api_key", NULL,
                   "missing or incorrect API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
        return srv_reply_error(c, r, &err);
    }
    if (rt == R_NONE) {
        oai_errorf(&err, 404, "not_found_error", NULL, NULL, "no such endpoint: %s %s", r->method, r->path);
        return srv_reply_error(c, r, &err);
    }
    if ((post ? !is_post : !is_get) && !(rt == R_LLAMA_PROPS && is_post)) {
        r->endpoint_ok = post ? 2 : 1;
        oai_errorf(&err, 405, "invalid_request_error", NULL, NULL, "%s %s is not allowed; use %s", r->method,
                   r->path, post ? "POST" : "GET");
        return srv_reply_error(c, r, &err);
    }
    if (r->too_big) {
        oai_errorf(&err, 413, "invalid_request_error", NULL, NULL, "the request body is larger than %zu bytes",
                   s->o.max_body);
        return srv_reply_error(c, r, &err);
    }
    if (rt == R_HEALTH) {
        if (!atomic_load(&s->ready)) {
            oai_errorf(&err, 503, "server_error", NULL, NULL, "the model is loading");
            return srv_reply_error(c, r, &err);
        }
        static const char k_ok[] = "{\"status\":\"ok\"}";
        return srv_reply(c, r, 200, "application/json", k_ok, sizeof k_ok - 1, NULL, NULL);
    }
    if (!atomic_load(&s->ready) || atomic_load(&s->stopping)) {
        oai_errorf(&err, 503, "server_error", NULL, NULL,
                   atomic_load(&s->stopping) ? "the server is shutting down" : "the model is loading");
        return srv_reply_error(c, r, &err);
    }
    bool gen_route = rt == R_CHAT || rt == R_COMPLETIONS || rt == R_RESPONSES || rt == R_MESSAGES ||
                     rt == R_COUNT_TOKENS || rt == R_TEMPLATE || rt == R_LLAMA_COMPLETION || rt == R_LLAMA_INFILL;
    /* the model answering: the server's one, or in router mode the one the body's "model" names
     * (loaded, referenced until the request completes); /props, /slots and /lora-adapters name
     * it in the query (?model=NAME), as llama-server's router does */
    bool model_route = gen_route || rt == R_EMBEDDINGS || rt == R_RERANK || rt == R_TOKENIZE || rt == R_DETOKENIZE;
    bool query_model = rt == R_LLAMA_PROPS || rt == R_LLAMA_SLOTS || rt == R_LORA;
    if (!s->router) {
        r->model = &s->single;
    } else if (query_model) {
        const char *name = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
        if (srv_router_resolve_name(s, r, name, &err) < 0)
            return srv_reply_error(c, r, &err);
    } else if (model_route && srv_router_resolve(s, r, &err) < 0) {
        return srv_reply_error(c, r, &err);
    }
    /* an encoder does not generate, a generating model does not embed */
    if (gen_route && r->model->m.embedder) {
        oai_errorf(&err, 400, "invalid_request_error", "model_not_supported", "model", "model '%s' is an "
                   "embedding model (%s): it does not generate text; use %s", r->model->id,
                   r->model->m.hp->n_cls > 0 || r->model->m.hp->lm_rerank ? "a reranker" : "an encoder",
                   r->model->m.hp->n_cls > 0 || r->model->m.hp->lm_rerank ? "/v1/rerank" : "/v1/embeddings");
        return srv_reply_error(c, r, &err);
    }
    if ((rt == R_EMBEDDINGS || rt == R_RERANK) && !r->model->m.embedder) {
        oai_errorf(&err, 400, "invalid_request_error", "model_not_supported", "model", "model '%s' generates "
                   "text: it does not %s (serve an embedding model or a cross-encoder)", r->model->id,
                   rt == R_RERANK ? "rerank" : "produce embeddings");
        return srv_reply_error(c, r, &err);
    }
    if ((rt == R_TOKENIZE || rt == R_DETOKENIZE) && !r->model->m.tok) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, NULL, "model '%s' has no usable tokenizer",
                   r->model->id);
        return srv_reply_error(c, r, &err);
    }
    switch (rt) {
    case R_EMBEDDINGS: return srv_embeddings(s, c, r);
    case R_RERANK: return srv_rerank(s, c, r);
    case R_MODELS: return ep_models(s, c, r, NULL);
    case R_ROUTER_MODELS: return ep_models(s, c, r, NULL);
    case R_ROUTER_LOAD: return srv_router_load(s, c, r, true);
    case R_ROUTER_UNLOAD: return srv_router_load(s, c, r, false);
    case R_MODEL: return ep_models(s, c, r, url + 11);
    case R_METRICS: return ep_metrics(s, c, r);
    case R_CHAT: return srv_generate(s, c, r, OAI_CHAT);
    case R_COMPLETIONS: return srv_generate(s, c, r, OAI_COMPLETIONS);
    case R_RESPONSES: return srv_responses(s, c, r);
    case R_TOKENIZE: return ep_tokenize(s, c, r);
    case R_DETOKENIZE: return ep_detokenize(s, c, r);
    case R_TEMPLATE: return ep_apply_template(s, c, r);
    case R_PAGE: return ep_page(c, r);
    case R_FAVICON: return ep_favicon(c, r);
    case R_LORA: return srv_lora_adapters(s, c, r, post);
    case R_MESSAGES: return srv_anthropic_messages(s, c, r);
    case R_COUNT_TOKENS: return srv_anthropic_count_tokens(s, c, r);
    case R_LLAMA_COMPLETION: return srv_llama_completion(s, c, r);
    case R_LLAMA_INFILL: return srv_llama_infill(s, c, r);
    case R_LLAMA_PROPS: return srv_llama_props(s, c, r, is_post);
    case R_LLAMA_SLOTS: return srv_llama_slots(s, c, r);
    default: break;
    }
    oai_errorf(&err, 404, "not_found_error", NULL, NULL, "no such endpoint");
    return srv_reply_error(c, r, &err);
}

/* Copies s into out (cap bytes) with bytes outside printable ASCII as \xNN: log lines stay
 * one line of plain text whatever the client sent. */
static void escape_into(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
    }
    out[o] = 0;
}

/* The first call, with the headers: the request's state, then guard.c's checks of its head
 * and the body's announced size, answered before any body byte is read. */
static enum MHD_Result begin_request(struct server *s, struct MHD_Connection *c, const char *target,
                                     const char *method, const char *version, void **ctx)
{
    char auth[256];
    const char *url = target_path(target, auth, sizeof auth);
    struct srv_req *r = calloc(1, sizeof *r);
    if (!r)
        return MHD_NO;
    *ctx = r;
    atomic_fetch_add(&s->n_active, 1);
    r->t_start = gen_now();
    r->n_prompt = r->n_gen = -1;
    r->ttft = r->itl = -1;
    escape_into(r->method, sizeof r->method, method);
    escape_into(r->path, sizeof r->path, target);
    r->error_json = route_error_json(url);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    r->conn = ci ? ci->socket_context : NULL;
    if (!guard_advance(r, CONN_BODY))
        return MHD_NO;  /* the watchdog answered 408 first */
    bool post = false;
    enum route rt = find_route(url, &post);
    post = route_post(rt, post, method);
    enum srv_route_kind kind = rt == R_NONE ? ROUTE_KIND_NONE : post ? ROUTE_KIND_POST : ROUTE_KIND_GET;
    bool health = rt == R_HEALTH && (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0);
    struct oai_error err;
    int g = guard_head(s, c, r, target, auth[0] ? auth : NULL, method, version, kind, health, &err);
    if (g > 0)
        return MHD_YES;
    if (g < 0)
        return srv_reply_error(c, r, &err);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (errno || end == cl || v > s->o.max_body) {
            oai_errorf(&err, 413, "invalid_request_error", NULL, NULL, "the request body is larger than %zu bytes",
                       s->o.max_body);
            r->too_big = true;
            return srv_reply_error(c, r, &err);
        }
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx)
{
    struct server *s = cls;
    struct srv_req *r = *ctx;
    if (!r)
        return begin_request(s, c, url, method, version ? version : "", ctx);
    if (*upload_size) {
        if (!guard_advance(r, CONN_BODY))
            return MHD_NO;
        if (!r->too_big && r->len + *upload_size <= s->o.max_body) {
            if (r->len + *upload_size + 1 > r->cap) {
                size_t cap = r->cap ? r->cap : 4096;
                while (cap < r->len + *upload_size + 1)
                    cap *= 2;
                char *p = realloc(r->body, cap);
                if (!p)
                    return MHD_NO;
                r->body = p;
                r->cap = cap;
            }
            memcpy(r->body + r->len, upload, *upload_size);
            r->len += *upload_size;
        } else {
            r->too_big = true;  /* a chunked body over the limit: read and dropped, then 413 */
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->queued)
        return MHD_YES;
    if (!guard_advance(r, CONN_SERVING))
        return MHD_NO;  /* the whole request came too late: the watchdog answered 408 */
    return dispatch(s, c, r, url, method);
}

static void log_request(struct server *s, const struct srv_req *r, double ms)
{
    pthread_mutex_lock(&s->log_mu);
    if (s->o.log_json)
        fprintf(stderr, "{\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,\"prompt_tokens\":%d,"
                "\"completion_tokens\":%d,\"ms\":%.1f}\n", r->method, r->path, r->status,
                r->n_prompt > 0 ? r->n_prompt : 0, r->n_gen > 0 ? r->n_gen : 0, ms);
    else
        fprintf(stderr, "%s %s %d prompt=%d completion=%d %.1fms\n", r->method, r->path, r->status,
                r->n_prompt > 0 ? r->n_prompt : 0, r->n_gen > 0 ? r->n_gen : 0, ms);
    pthread_mutex_unlock(&s->log_mu);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode toe)
{
    struct server *s = cls;
    struct srv_req *r = *ctx;
    (void)c;
    if (!r)
        return;
    srv_generate_end(s, r);
    srv_model_release(r->model);  /* a stream's generation holds its own reference */
    double dt = gen_now() - r->t_start;
    if (!guard_advance(r, CONN_IDLE))
        r->status = 408;  /* answered by the watchdog */
    if (r->status == 0)
        r->status = toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? 408 : 499;  /* never answered */
    log_request(s, r, dt * 1e3);
    bool gen = r->n_gen >= 0;
    if (!r->tokens_counted) /* a generation that ended without its answer (count_usage, gen.c) */
        metrics_tokens(&s->metrics, r->n_prompt, r->n_gen);
    char auth[256];  /* an absolute-form target counts under its path's endpoint */
    metrics_request(&s->metrics, target_path(r->path, auth, sizeof auth), r->status, r->ttft, r->itl,
                    gen ? dt : -1.0);
    free(r->body);
    free(r);
    *ctx = NULL;
    atomic_fetch_sub(&s->n_active, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    LOG_INFO("http: %s", msg);
}

// ---- lifetime ----

int server_start(struct server **out, const struct server_opts *o, struct err *e)
{
    *out = NULL;
    struct server *s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "out of memory");
    s->o = *o;
    snprintf(s->host, sizeof s->host, "%s", o->host ? o->host : "127.0.0.1");
    s->o.host = s->host;
    s->o.api_key = NULL;
    if (o->api_key && !(s->o.api_key = strdup(o->api_key))) {
        free(s);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    s->created = (long)time(NULL);
    s->listen_fd = MHD_INVALID_SOCKET;
    metrics_init(&s->metrics);
    pthread_mutex_init(&s->log_mu, NULL);
    pthread_mutex_init(&s->conn_mu, NULL);
    emb_batcher_init(&s->single.embed_b, SRV_EMBED_BATCH_TOKENS, &(struct err){0});
    atomic_init(&s->next_id, ((uint64_t)time(NULL) << 20) ^ (uint64_t)(uintptr_t)s);

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, s->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)o->port);
    } else if (inet_pton(AF_INET6, s->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)o->port);
        flags |= MHD_USE_IPv6;
    } else {
        server_free(s);
        return err_setf(e, ERR_ARG, "--host '%.64s' is not an IPv4 or IPv6 address", o->host);
    }
    int rc = guard_start(s, e);
    if (rc < 0) {
        server_free(s);
        return rc;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,  /* first: it asks so */
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(o->max_connections + SRV_CONN_RESERVE + SRV_CONN_REFUSE),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)SRV_MHD_POOL_BYTES,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, guard_notify_connection, s,
                            MHD_OPTION_END);
    if (!s->d) {
        int errnum = errno;
        server_free(s);
        return err_setf(e, ERR_IO, "cannot listen on %s port %d: %s", o->host ? o->host : "127.0.0.1", o->port,
                        errnum ? strerror(errnum) : "libmicrohttpd refused to start");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

int server_port(const struct server *s)
{
    return s->port;
}

void server_set_model(struct server *s, const struct server_model *m)
{
    s->single.m = *m;
    snprintf(s->single.id, sizeof s->single.id, "%s", m->id);
    s->single.m.id = s->single.id;
    atomic_store(&s->ready, 1);
}

void server_begin_stop(struct server *s)
{
    atomic_store(&s->stopping, 1);
    if (s->d)
        s->listen_fd = MHD_quiesce_daemon(s->d);  /* ours to close, after the daemon stops */
}

/* Longest wait for in-flight requests to finish their answers at shutdown. */
#define SRV_DRAIN_MS 10000

void server_free(struct server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, 1);
    /* the requests in flight see `stopping`, cancel their jobs and finish their answers (a
     * stream's error event and [DONE], a 503); stopping the daemon first would cut them */
    for (int waited = 0; s->d && atomic_load(&s->n_active) > 0 && waited < SRV_DRAIN_MS; waited += 10) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (s->d)
        MHD_stop_daemon(s->d);  /* every connection closed and unregistered (guard.c) */
    router_free(s->router);     /* no request or generation holds a model any more */
    guard_stop(s);
    if (s->listen_fd != MHD_INVALID_SOCKET)
        close(s->listen_fd);
    metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->log_mu);
    pthread_mutex_destroy(&s->conn_mu);
    emb_batcher_destroy(&s->single.embed_b);
    free((char *)s->o.api_key);
    free(s);
}
