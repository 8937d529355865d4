/*
 * api_responses: POST /v1/responses, OpenAI's Responses API over gen (gen.h):
 * the route and the dialect (the request's translation is responses_request.c).
 *
 * The body becomes a chat request (responses_request.c) that gen runs with
 * one choice (n = 1); gen's state of that choice (reasoning, text, tool calls)
 * is rendered here.
 *
 * The answer is a `response` object whose output holds a reasoning item (when
 * the model reasoned), a message item (unless the output is only tool calls)
 * and one function_call item per call, in that order; the SDKs compute
 * output_text themselves (the API does not send it). Streamed, it is the
 * typed events the SDK's accumulator replays (`event: <type>` + `data: {"type",
 * "sequence_number", ...}`): response.created, response.in_progress, then per
 * item output_item.added, its content part, its deltas, their done events and
 * output_item.done, and last response.completed (response.incomplete when the
 * token limit cut it, response.failed on an error), which carries the items
 * the stream built. No [DONE]: this API sends none.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_responses.h"

enum rs_item {
    RS_NONE = 0,
    RS_REASONING = 1,
    RS_MESSAGE = 2,
};

/* The dialect's state (gen's dstate). */
struct rs_state {
    cJSON *echo;          /* the request fields every response object repeats, in order */
    cJSON *items;         /* streamed: the output items done so far */
    int seq;              /* the next sequence_number */
    int n_items;          /* output items opened so far: the next output_index */
    enum rs_item open;    /* the item text is streaming into */
    int open_index;       /* its output_index */
    char open_id[64];
    size_t open_from;     /* where its text starts in the choice's content / reasoning */
    bool message;         /* a message item was opened */
    bool head_sent;       /* response.created and response.in_progress */
};

static void state_free(void *p)
{
    struct rs_state *st = p;
    if (!st)
        return;
    cJSON_Delete(st->echo);
    cJSON_Delete(st->items);
    free(st);
}

void *responses_state_new(cJSON *echo)
{
    struct rs_state *st = calloc(1, sizeof *st);
    if (!st || !(st->items = cJSON_CreateArray())) {
        free(st);
        cJSON_Delete(echo);
        return NULL;
    }
    st->echo = echo;
    return st;
}

static bool push_item(cJSON *out, cJSON *item)
{
    if (!item || !cJSON_AddItemToArray(out, item)) {
        cJSON_Delete(item);
        return false;
    }
    return true;
}

// ---- the response object ----

static bool incomplete(const struct gen *g)
{
    return g->ch[0].finish == GEN_FINISH_LENGTH;
}

/* The id of output item index: "<prefix>_<the response's hex><index>". */
static void item_id(const struct gen *g, const char *prefix, int index, char *buf, size_t cap)
{
    const char *hex = strchr(g->id, '_');
    snprintf(buf, cap, "%s_%s%02x", prefix, hex ? hex + 1 : g->id, (unsigned)index);
}

static cJSON *usage_object(const struct gen *g)
{
    int comp, in = gen_usage(g, &comp);
    cJSON *u = cJSON_CreateObject(), *d;
    bool ok = u && cJSON_AddNumberToObject(u, "input_tokens", in) &&
              (d = cJSON_AddObjectToObject(u, "input_tokens_details")) && cJSON_AddNumberToObject(d, "cached_tokens", gen_cached(g)) &&
              cJSON_AddNumberToObject(u, "output_tokens", comp) &&
              (d = cJSON_AddObjectToObject(u, "output_tokens_details")) &&
              cJSON_AddNumberToObject(d, "reasoning_tokens", 0) && cJSON_AddNumberToObject(u, "total_tokens", in + comp);
    if (!ok) {
        cJSON_Delete(u);
        return NULL;
    }
    return u;
}

/* A response object with status and output (taken); error, incomplete_details and usage are
 * null until set_outcome. */
static cJSON *response_new(struct gen *g, const char *status, cJSON *output)
{
    const struct rs_state *st = g->dstate;
    cJSON *r = cJSON_CreateObject(), *v;
    bool ok = r && cJSON_AddStringToObject(r, "id", g->id) && cJSON_AddStringToObject(r, "object", "response") &&
              cJSON_AddNumberToObject(r, "created_at", (double)g->created) &&
              cJSON_AddStringToObject(r, "status", status) && cJSON_AddNullToObject(r, "error") &&
              cJSON_AddNullToObject(r, "incomplete_details") && cJSON_AddStringToObject(r, "model", g->model->id);
    cJSON_ArrayForEach(v, st->echo) {
        cJSON *x = ok ? cJSON_Duplicate(v, true) : NULL;
        ok = x && cJSON_AddItemToObject(r, v->string, x);
        if (!ok)
            cJSON_Delete(x);
    }
    bool owned = ok && cJSON_AddItemToObject(r, "output", output);
    if (!owned)
        cJSON_Delete(output);
    if (!owned || !cJSON_AddNullToObject(r, "usage")) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

static bool set_field(cJSON *r, const char *key, cJSON *v)
{
    if (!v || !cJSON_ReplaceItemInObjectCaseSensitive(r, key, v)) {
        cJSON_Delete(v);
        return false;
    }
    return true;
}

/* The end of response r: usage, and why it is incomplete or failed. */
static int set_outcome(struct gen *g, cJSON *r, bool failed)
{
    cJSON *why;
    if (failed) {
        why = cJSON_CreateObject();
        if (!why || !cJSON_AddStringToObject(why, "code", g->err.status == 429 ? "rate_limit_exceeded" : "server_error") ||
            !cJSON_AddStringToObject(why, "message", g->err.message) || !set_field(r, "error", why))
            return -1;
    } else if (incomplete(g)) {
        why = cJSON_CreateObject();
        if (!why || !cJSON_AddStringToObject(why, "reason", "max_output_tokens") ||
            !set_field(r, "incomplete_details", why))
            return -1;
    } else if (!cJSON_AddNumberToObject(r, "completed_at", (double)time(NULL))) {
        return -1;
    }
    return set_field(r, "usage", usage_object(g)) ? 0 : -1;
}

// ---- output items ----

/* {"type": "output_text", "annotations": [], "logprobs": [], "text"} (n bytes of text). */
static cJSON *text_part(const char *type, const char *text, size_t n)
{
    char *t = strndup(text, n);
    cJSON *o = cJSON_CreateObject();
    bool ok = t && o && cJSON_AddStringToObject(o, "type", type) &&
              (strcmp(type, "output_text") != 0 ||
               (cJSON_AddArrayToObject(o, "annotations") && cJSON_AddArrayToObject(o, "logprobs"))) &&
              cJSON_AddStringToObject(o, "text", t);
    free(t);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* A message (kind RS_MESSAGE) or reasoning item; its content the one text part of n bytes, or
 * empty when text is NULL. status: NULL for a reasoning item. */
static cJSON *text_item(enum rs_item kind, const char *id, const char *status, const char *text, size_t n)
{
    bool msg = kind == RS_MESSAGE;
    cJSON *o = cJSON_CreateObject(), *content, *part = NULL;
    bool ok = o && cJSON_AddStringToObject(o, "id", id) &&
              cJSON_AddStringToObject(o, "type", msg ? "message" : "reasoning") &&
              (!msg || (cJSON_AddStringToObject(o, "status", status) && cJSON_AddStringToObject(o, "role", "assistant"))) &&
              (msg || cJSON_AddArrayToObject(o, "summary")) && (content = cJSON_AddArrayToObject(o, "content"));
    if (ok && text) {
        part = text_part(msg ? "output_text" : "reasoning_text", text, n);
        ok = part && cJSON_AddItemToArray(content, part);
        if (!ok)
            cJSON_Delete(part);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The function_call item of tool call t ({"id", "name", "arguments"}); arguments "" while
 * in progress. */
static cJSON *call_item(const char *id, const cJSON *t, bool done)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "id", id) && cJSON_AddStringToObject(o, "type", "function_call") &&
              cJSON_AddStringToObject(o, "status", done ? "completed" : "in_progress") &&
              cJSON_AddStringToObject(o, "arguments", done ? cJSON_GetObjectItem(t, "arguments")->valuestring : "") &&
              cJSON_AddStringToObject(o, "call_id", cJSON_GetObjectItem(t, "id")->valuestring) &&
              cJSON_AddStringToObject(o, "name", cJSON_GetObjectItem(t, "name")->valuestring);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The non-streamed answer: reasoning, the message (unless the output is only tool calls),
 * the calls. */
static cJSON *full(struct gen *g)
{
    const struct gen_choice *c = &g->ch[0];
    cJSON *out = cJSON_CreateArray(), *t;
    char id[64];
    int index = 0, n_calls = cJSON_GetArraySize(c->tool_calls);
    bool ok = out != NULL;
    if (ok && c->reasoning.len > 0) {
        item_id(g, "rs", index++, id, sizeof id);
        ok = push_item(out, text_item(RS_REASONING, id, NULL, c->reasoning.p, c->reasoning.len));
    }
    if (ok && (c->content.len > 0 || n_calls == 0)) {
        item_id(g, "msg", index++, id, sizeof id);
        ok = push_item(out, text_item(RS_MESSAGE, id, incomplete(g) ? "incomplete" : "completed", c->content.p,
                                      c->content.len));
    }
    cJSON_ArrayForEach(t, c->tool_calls) {
        item_id(g, "fc", index++, id, sizeof id);
        ok = ok && push_item(out, call_item(id, t, true));
    }
    if (!ok) {
        cJSON_Delete(out);
        return NULL;
    }
    cJSON *r = response_new(g, incomplete(g) ? "incomplete" : "completed", out);
    if (r && set_outcome(g, r, false) < 0) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

// ---- streaming ----

/* Sends event type with the fields of body (taken: deleted) after "type" and
 * "sequence_number". */
static int send_event(struct gen *g, const char *type, cJSON *body)
{
    struct rs_state *st = g->dstate;
    cJSON *e = cJSON_CreateObject(), *v;
    bool ok = body && e && cJSON_AddStringToObject(e, "type", type) &&
              cJSON_AddNumberToObject(e, "sequence_number", st->seq++);
    while (ok && body->child) {
        v = cJSON_DetachItemViaPointer(body, body->child);
        ok = cJSON_AddItemToObject(e, v->string, v);  /* re-keys v (copies its name) */
        if (!ok)
            cJSON_Delete(v);
    }
    cJSON_Delete(body);
    if (!ok) {
        cJSON_Delete(e);
        return -1;
    }
    return gen_sse_event(g, type, e);
}

/* {"item_id", "output_index"[, "content_index": 0]} plus kv: the body of an item's event. */
static cJSON *where(const char *id, int index, bool content)
{
    cJSON *b = cJSON_CreateObject();
    if (b && (!cJSON_AddStringToObject(b, "item_id", id) || !cJSON_AddNumberToObject(b, "output_index", index) ||
              (content && !cJSON_AddNumberToObject(b, "content_index", 0)))) {
        cJSON_Delete(b);
        return NULL;
    }
    return b;
}

/* output_item.added / output_item.done of item (taken) at index; done items are kept for the
 * final response. */
static int send_item(struct gen *g, bool done, int index, cJSON *item)
{
    struct rs_state *st = g->dstate;
    cJSON *b = cJSON_CreateObject();
    bool ok = b && item && cJSON_AddNumberToObject(b, "output_index", index);
    if (ok && done)
        ok = push_item(st->items, cJSON_Duplicate(item, true));
    if (ok && !cJSON_AddItemToObject(b, "item", item))
        ok = false;
    else if (ok)
        item = NULL;
    cJSON_Delete(item);
    if (!ok) {
        cJSON_Delete(b);
        return -1;
    }
    return send_event(g, done ? "response.output_item.done" : "response.output_item.added", b);
}

static int send_head(struct gen *g)
{
    struct rs_state *st = g->dstate;
    static const char *const k_types[] = {"response.created", "response.in_progress"};
    for (size_t k = 0; k < 2; k++) {
        cJSON *b = cJSON_CreateObject(), *r = response_new(g, "in_progress", cJSON_CreateArray());
        if (!b || !r || !cJSON_AddItemToObject(b, "response", r)) {
            cJSON_Delete(r);
            cJSON_Delete(b);
            return -1;
        }
        if (send_event(g, k_types[k], b) < 0)
            return -1;
    }
    st->head_sent = true;
    return 0;
}

/* Opens a message or reasoning item: output_item.added, content_part.added. */
static int open_item(struct gen *g, enum rs_item kind)
{
    struct rs_state *st = g->dstate;
    const struct gen_choice *c = &g->ch[0];
    bool msg = kind == RS_MESSAGE;
    st->open = kind;
    st->open_index = st->n_items++;
    st->open_from = msg ? c->sent_content : c->sent_reasoning;
    st->message |= msg;
    item_id(g, msg ? "msg" : "rs", st->open_index, st->open_id, sizeof st->open_id);
    if (send_item(g, false, st->open_index, text_item(kind, st->open_id, "in_progress", NULL, 0)) < 0)
        return -1;
    cJSON *b = where(st->open_id, st->open_index, true), *part = text_part(msg ? "output_text" : "reasoning_text", "", 0);
    if (!b || !part || !cJSON_AddItemToObject(b, "part", part)) {
        cJSON_Delete(part);
        cJSON_Delete(b);
        return -1;
    }
    return send_event(g, "response.content_part.added", b);
}

/* A text delta (n bytes) of the open item. */
static int send_delta(struct gen *g, const char *text, size_t n)
{
    struct rs_state *st = g->dstate;
    bool msg = st->open == RS_MESSAGE;
    char *t = strndup(text, n);
    cJSON *b = where(st->open_id, st->open_index, true);
    bool ok = t && b && cJSON_AddStringToObject(b, "delta", t) && (!msg || cJSON_AddArrayToObject(b, "logprobs"));
    free(t);
    if (!ok) {
        cJSON_Delete(b);
        return -1;
    }
    return send_event(g, msg ? "response.output_text.delta" : "response.reasoning_text.delta", b);
}

/* Closes the open item: the text's done event, content_part.done, output_item.done. */
static int close_item(struct gen *g)
{
    struct rs_state *st = g->dstate;
    const struct gen_choice *c = &g->ch[0];
    if (st->open == RS_NONE)
        return 0;
    bool msg = st->open == RS_MESSAGE;
    const struct gbuf *buf = msg ? &c->content : &c->reasoning;
    const char *text = buf->p + st->open_from;
    size_t n = (msg ? c->sent_content : c->sent_reasoning) - st->open_from;
    char *t = strndup(text, n);
    cJSON *b = where(st->open_id, st->open_index, true), *b2 = where(st->open_id, st->open_index, true);
    cJSON *part = text_part(msg ? "output_text" : "reasoning_text", text, n);
    bool ok = t && b && b2 && part && cJSON_AddStringToObject(b, "text", t) &&
              (!msg || cJSON_AddArrayToObject(b, "logprobs"));
    free(t);
    ok = ok && cJSON_AddItemToObject(b2, "part", part);
    if (!ok && !cJSON_GetObjectItemCaseSensitive(b2, "part"))
        cJSON_Delete(part);
    if (!ok) {
        cJSON_Delete(b);
        cJSON_Delete(b2);
        return -1;
    }
    const char *status = c->finished && incomplete(g) ? "incomplete" : "completed";
    if (send_event(g, msg ? "response.output_text.done" : "response.reasoning_text.done", b) < 0 ||
        send_event(g, "response.content_part.done", b2) < 0 ||
        send_item(g, true, st->open_index, text_item(st->open, st->open_id, status, text, n)) < 0)
        return -1;
    st->open = RS_NONE;
    return 0;
}

/* Tool call k as a function_call item: added, its arguments in one delta, done. */
static int send_call(struct gen *g, const cJSON *t)
{
    struct rs_state *st = g->dstate;
    char id[64];
    int index = st->n_items++;
    item_id(g, "fc", index, id, sizeof id);
    const char *args = cJSON_GetObjectItem(t, "arguments")->valuestring;
    cJSON *d = where(id, index, false), *e = where(id, index, false);
    bool ok = d && e && cJSON_AddStringToObject(d, "delta", args) &&
              cJSON_AddStringToObject(e, "name", cJSON_GetObjectItem(t, "name")->valuestring) &&
              cJSON_AddStringToObject(e, "arguments", args);
    if (!ok) {
        cJSON_Delete(d);
        cJSON_Delete(e);
        return -1;
    }
    if (send_item(g, false, index, call_item(id, t, false)) < 0) {
        cJSON_Delete(d);
        cJSON_Delete(e);
        return -1;
    }
    if (send_event(g, "response.function_call_arguments.delta", d) < 0) {
        cJSON_Delete(e);
        return -1;
    }
    if (send_event(g, "response.function_call_arguments.done", e) < 0)
        return -1;
    return send_item(g, true, index, call_item(id, t, true));
}

/* What changed since the last call: reasoning first, then text, then tool calls (the order
 * a model writes them in); an item closes when another kind begins. */
static int events(struct gen *g)
{
    struct rs_state *st = g->dstate;
    struct gen_choice *c = &g->ch[0];
    if (!st->head_sent && send_head(g) < 0)
        return -1;
    if (c->reasoning.len > c->sent_reasoning) {
        if (st->open != RS_REASONING && (close_item(g) < 0 || open_item(g, RS_REASONING) < 0))
            return -1;
        if (send_delta(g, c->reasoning.p + c->sent_reasoning, c->reasoning.len - c->sent_reasoning) < 0)
            return -1;
        c->sent_reasoning = c->reasoning.len;
    }
    if (c->content.len > c->sent_content) {
        if (st->open != RS_MESSAGE && (close_item(g) < 0 || open_item(g, RS_MESSAGE) < 0))
            return -1;
        if (send_delta(g, c->content.p + c->sent_content, c->content.len - c->sent_content) < 0)
            return -1;
        c->sent_content = c->content.len;
    }
    int n_calls = cJSON_GetArraySize(c->tool_calls);
    if (n_calls > c->sent_tools) {
        if (close_item(g) < 0)
            return -1;
        for (int k = c->sent_tools; k < n_calls; k++)
            if (send_call(g, cJSON_GetArrayItem(c->tool_calls, k)) < 0)
                return -1;
        c->sent_tools = n_calls;
    }
    if (c->finished && !c->finish_sent && g->rc == 0) {
        /* an output with no text and no calls is one empty message, as non-streamed */
        if (close_item(g) < 0 || (!st->message && n_calls == 0 && (open_item(g, RS_MESSAGE) < 0 || close_item(g) < 0)))
            return -1;
        c->finish_sent = true;
    }
    return 0;
}

/* The last event: response.completed / .incomplete, or .failed with the error; its response
 * holds the items the stream built. */
static int tail(struct gen *g)
{
    struct rs_state *st = g->dstate;
    if (!st->head_sent && send_head(g) < 0)
        return -1;
    bool failed = g->rc < 0 || g->aborted;
    const char *status = failed ? "failed" : incomplete(g) ? "incomplete" : "completed";
    char type[32];
    snprintf(type, sizeof type, "response.%s", status);
    cJSON *out = st->items, *b = cJSON_CreateObject();
    st->items = NULL;
    cJSON *r = response_new(g, status, out);
    if (!b || !r || set_outcome(g, r, failed) < 0 || !cJSON_AddItemToObject(b, "response", r)) {
        cJSON_Delete(r);
        cJSON_Delete(b);
        return -1;
    }
    return send_event(g, type, b);
}

const struct gen_dialect responses_dialect = {full, events, tail, state_free};

enum MHD_Result srv_responses(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct oai_request q;
    cJSON *echo;
    void *st;
    struct gen *g;
    cJSON *root = oai_parse_object(r->body ? r->body : "", r->len, &err);
    if (!root)
        return srv_reply_error(c, r, &err);
    int rc = responses_translate(root, r->model->m.n_vocab, &q, &echo, &err);
    cJSON_Delete(root);
    if (rc < 0)
        return srv_reply_error(c, r, &err);
    if (!(st = responses_state_new(echo))) {
        oai_request_free(&q);
        oai_errorf(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_reply_error(c, r, &err);
    }
    if (gen_new(&g, s, c, r, OAI_CHAT, &q, "resp", &responses_dialect, &err) < 0) {
        state_free(st);
        responses_rename_fields(&err);
        return srv_reply_error(c, r, &err);
    }
    g->id[4] = '_';  /* gen names it "resp-<hex>"; this API's ids are "resp_<hex>" */
    g->dstate = st;
    return gen_serve(g);
}
