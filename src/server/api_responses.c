/*
 * api_responses: POST /v1/responses, OpenAI's Responses API over gen (gen.h).
 *
 * The body is translated into the chat shape and validated there
 * (oai_request_from_object): input items become messages (instructions a
 * first system message; function_call items the tool_calls of an assistant
 * turn, joined with the assistant text before them; function_call_output
 * items tool turns; reasoning items are dropped, as chat templates drop past
 * reasoning), flat function tools become chat's nested ones, tool_choice
 * {type: function, name} chat's named choice, text.format response_format,
 * max_output_tokens max_tokens. What only this API has is checked here and
 * named as the client wrote it (input[2].content); an error of the shared
 * parser or of gen names chat's field, which rename_fields() turns back into
 * this API's (max_tokens -> max_output_tokens, ...). The server is stateless:
 * previous_response_id, conversation and item references are refused, store
 * is accepted and nothing is stored. One output (n = 1).
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api_responses.h"

#define INVALID "invalid_request_error"

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

// ---- the request: Responses' body -> the chat shape ----

struct rs_parse {
    const cJSON *root;
    cJSON *chat;          /* the chat-shaped body */
    cJSON *msgs;          /* its messages */
    cJSON *last;          /* the last message appended */
    cJSON *tools_echo;    /* the tools as the response repeats them */
    struct oai_error *err;
};

__attribute__((format(printf, 3, 4)))
static int bad(struct oai_error *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof err->message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return oai_errorf(err, 400, INVALID, NULL, param, "%s", msg);
}

static int nomem(struct oai_error *err)
{
    return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory while parsing the request");
}

/* A member of o; JSON null counts as absent, as everywhere in the server. */
static const cJSON *field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static bool is(const cJSON *v, const char *s)
{
    return cJSON_IsString(v) && strcmp(v->valuestring, s) == 0;
}

static bool push_item(cJSON *out, cJSON *item)
{
    if (!item || !cJSON_AddItemToArray(out, item)) {
        cJSON_Delete(item);
        return false;
    }
    return true;
}

/* Adds v (taken) to o as key; false (v deleted) when v is NULL or out of memory. */
static bool add_owned(cJSON *o, const char *key, cJSON *v)
{
    if (!v || !cJSON_AddItemToObject(o, key, v)) {
        cJSON_Delete(v);
        return false;
    }
    return true;
}

/* The text of content (param names it): a string, or parts joined (input_text and output_text:
 * "text"; refusal: "refusal"). *out is malloc'd. */
static int content_text(struct oai_error *err, const cJSON *content, const char *param, char **out)
{
    char p[128];
    if (cJSON_IsString(content))
        return (*out = strdup(content->valuestring)) ? 0 : nomem(err);
    if (!cJSON_IsArray(content))
        return bad(err, param, "'%s' must be a string or an array of content parts", param);
    if (cJSON_GetArraySize(content) > OAI_MAX_CONTENT_PARTS)
        return bad(err, param, "'%s' must have at most %d parts", param, OAI_MAX_CONTENT_PARTS);
    struct gbuf b = {0};
    if (gbuf_add(&b, "", 0) < 0)
        return nomem(err);
    int j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        snprintf(p, sizeof p, "%s[%d]", param, j++);
        const cJSON *type = cJSON_IsObject(part) ? field(part, "type") : NULL, *text;
        const char *key = is(type, "input_text") || is(type, "output_text") || is(type, "text") ? "text"
                          : is(type, "refusal")                                                 ? "refusal"
                                                                                                : NULL;
        int rc = 0;
        if (!cJSON_IsString(type))
            rc = bad(err, p, "'%s' must be an object with a string 'type'", p);
        else if (!key)
            rc = bad(err, p, "content parts of type '%.64s' are not supported (this server reads text: "
                     "'input_text', 'output_text')", type->valuestring);
        else if (!cJSON_IsString(text = field(part, key)))
            rc = bad(err, p, "'%s.%s' must be a string", p, key);
        else if (gbuf_add(&b, text->valuestring, strlen(text->valuestring)) < 0)
            rc = nomem(err);
        if (rc < 0) {
            free(b.p);
            return -1;
        }
    }
    *out = b.p;
    return 0;
}

/* Appends {"role": role} to the messages (NULL: out of memory). */
static cJSON *push_message(struct rs_parse *p, const char *role)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(p->msgs, m)) {
        cJSON_Delete(m);
        return NULL;
    }
    p->last = m;
    return cJSON_AddStringToObject(m, "role", role) ? m : NULL;
}

/* Appends {"role", "content": text}; text is freed. */
static int push_text(struct rs_parse *p, const char *role, char *text)
{
    cJSON *m = push_message(p, role);
    bool ok = m && cJSON_AddStringToObject(m, "content", text);
    free(text);
    return ok ? 0 : nomem(p->err);
}

/* {"role", "content"} item i (type "message" or none). */
static int add_message(struct rs_parse *p, const cJSON *item, int i)
{
    char param[64];
    const cJSON *role = field(item, "role"), *content = field(item, "content");
    snprintf(param, sizeof param, "input[%d].role", i);
    if (!is(role, "user") && !is(role, "assistant") && !is(role, "system") && !is(role, "developer"))
        return bad(p->err, param, "'%s' must be 'user', 'assistant', 'system' or 'developer'", param);
    snprintf(param, sizeof param, "input[%d].content", i);
    if (!content)
        return bad(p->err, param, "'%s' is required", param);
    char *text;
    if (content_text(p->err, content, param, &text) < 0)
        return -1;
    return push_text(p, role->valuestring, text);
}

/* A function_call item i: a tool call of the assistant turn it follows (its text or the calls
 * before it), or of a new one. */
static int add_call(struct rs_parse *p, const cJSON *item, int i)
{
    static const char *const k_keys[] = {"call_id", "name", "arguments"};
    char param[64];
    for (size_t k = 0; k < sizeof k_keys / sizeof k_keys[0]; k++) {
        snprintf(param, sizeof param, "input[%d].%s", i, k_keys[k]);
        if (!cJSON_IsString(field(item, k_keys[k])))
            return bad(p->err, param, "'%s' must be a string", param);
    }
    cJSON *turn = p->last, *calls, *call, *fn;
    if (!turn || !is(cJSON_GetObjectItemCaseSensitive(turn, "role"), "assistant")) {
        if (!(turn = push_message(p, "assistant")) || !cJSON_AddNullToObject(turn, "content"))
            return nomem(p->err);
    }
    calls = cJSON_GetObjectItemCaseSensitive(turn, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(turn, "tool_calls")))
        return nomem(p->err);
    if (cJSON_GetArraySize(calls) >= OAI_MAX_TOOL_CALLS) {
        snprintf(param, sizeof param, "input[%d]", i);
        return bad(p->err, param, "at most %d function_call items may follow one another", OAI_MAX_TOOL_CALLS);
    }
    call = cJSON_CreateObject();
    if (!call || !cJSON_AddItemToArray(calls, call)) {
        cJSON_Delete(call);
        return nomem(p->err);
    }
    bool ok = cJSON_AddStringToObject(call, "id", field(item, "call_id")->valuestring) &&
              cJSON_AddStringToObject(call, "type", "function") && (fn = cJSON_AddObjectToObject(call, "function")) &&
              cJSON_AddStringToObject(fn, "name", field(item, "name")->valuestring) &&
              cJSON_AddStringToObject(fn, "arguments", field(item, "arguments")->valuestring);
    return ok ? 0 : nomem(p->err);
}

/* A function_call_output item i: a tool turn. */
static int add_call_output(struct rs_parse *p, const cJSON *item, int i)
{
    char param[64];
    const cJSON *id = field(item, "call_id"), *output = field(item, "output");
    snprintf(param, sizeof param, "input[%d].call_id", i);
    if (!cJSON_IsString(id))
        return bad(p->err, param, "'%s' must be a string", param);
    snprintf(param, sizeof param, "input[%d].output", i);
    if (!output)
        return bad(p->err, param, "'%s' is required", param);
    char *text;
    if (content_text(p->err, output, param, &text) < 0)
        return -1;
    cJSON *m = push_message(p, "tool");
    bool ok = m && cJSON_AddStringToObject(m, "content", text) &&
              cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
    free(text);
    return ok ? 0 : nomem(p->err);
}

/* instructions and input -> messages. */
static int parse_input(struct rs_parse *p)
{
    const cJSON *ins = field(p->root, "instructions"), *in = field(p->root, "input"), *item;
    char param[64], *text;
    if (ins && !cJSON_IsString(ins))
        return bad(p->err, "instructions", "'instructions' must be a string");
    if (ins && (!(text = strdup(ins->valuestring)) || push_text(p, "system", text) < 0))
        return nomem(p->err);
    if (!in)
        return bad(p->err, "input", "'input' is required");
    if (cJSON_IsString(in))
        return (text = strdup(in->valuestring)) ? push_text(p, "user", text) : nomem(p->err);
    if (!cJSON_IsArray(in))
        return bad(p->err, "input", "'input' must be a string or an array of input items");
    int n = cJSON_GetArraySize(in), i = 0;
    if (n == 0)
        return bad(p->err, "input", "'input' must not be empty");
    if (n > OAI_MAX_MESSAGES)
        return bad(p->err, "input", "'input' must have at most %d items", OAI_MAX_MESSAGES);
    cJSON_ArrayForEach(item, in) {
        snprintf(param, sizeof param, "input[%d]", i);
        const cJSON *type = cJSON_IsObject(item) ? field(item, "type") : NULL;
        int rc;
        if (!cJSON_IsObject(item))
            rc = bad(p->err, param, "'%s' must be an object", param);
        else if (type && !cJSON_IsString(type))
            rc = bad(p->err, param, "'%s.type' must be a string", param);
        else if (!type || is(type, "message"))
            rc = add_message(p, item, i);
        else if (is(type, "function_call"))
            rc = add_call(p, item, i);
        else if (is(type, "function_call_output"))
            rc = add_call_output(p, item, i);
        else if (is(type, "reasoning"))
            rc = 0;  /* past reasoning: chat templates leave it out of the prompt */
        else if (is(type, "item_reference"))
            rc = bad(p->err, param, "item references are not supported: this server is stateless; send the "
                     "items themselves");
        else
            rc = bad(p->err, param, "input items of type '%.64s' are not supported (only 'message', "
                     "'function_call', 'function_call_output' and 'reasoning')", type->valuestring);
        if (rc < 0)
            return -1;
        i++;
    }
    if (cJSON_GetArraySize(p->msgs) == 0)
        return bad(p->err, "input", "'input' has no message");
    return 0;
}

/* tools: [{"type": "function", "name", "description"?, "parameters"?, "strict"?}] -> chat's
 * [{"type": "function", "function": {...}}] (the shared parser checks the rest), and their echo. */
static int parse_tools(struct rs_parse *p)
{
    const cJSON *tools = field(p->root, "tools"), *t;
    char param[64];
    if (!(p->tools_echo = cJSON_CreateArray()))
        return nomem(p->err);
    if (!tools)
        return 0;
    if (!cJSON_IsArray(tools))
        return bad(p->err, "tools", "'tools' must be an array");
    cJSON *chat = cJSON_AddArrayToObject(p->chat, "tools");
    if (!chat)
        return nomem(p->err);
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        snprintf(param, sizeof param, "tools[%d]", i++);
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        if (!cJSON_IsString(type))
            return bad(p->err, param, "'%s' must be an object with a string 'type'", param);
        if (!is(type, "function"))
            return bad(p->err, param, "tools of type '%.64s' are not supported (only 'function': this server "
                       "runs no hosted tools)", type->valuestring);
        if (!cJSON_IsString(field(t, "name")))
            return bad(p->err, param, "'%s.name' must be a string", param);
        cJSON *c = cJSON_CreateObject(), *e = cJSON_CreateObject(), *fn = NULL;
        bool ok = push_item(chat, c);
        ok = push_item(p->tools_echo, e) && ok;
        ok = ok && cJSON_AddStringToObject(c, "type", "function") && (fn = cJSON_AddObjectToObject(c, "function")) &&
             cJSON_AddStringToObject(e, "type", "function");
        static const char *const k_keys[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; ok && k < sizeof k_keys / sizeof k_keys[0]; k++) {
            const cJSON *v = field(t, k_keys[k]);
            ok = (!v || add_owned(fn, k_keys[k], cJSON_Duplicate(v, true))) &&
                 add_owned(e, k_keys[k], v ? cJSON_Duplicate(v, true) : cJSON_CreateNull());
        }
        if (!ok)
            return nomem(p->err);
    }
    return 0;
}

/* tool_choice: "auto" | "none" | "required" (the shared parser checks them) | {"type":
 * "function", "name"} -> chat's {"type": "function", "function": {"name"}}. */
static int parse_tool_choice(struct rs_parse *p)
{
    const cJSON *tc = field(p->root, "tool_choice");
    if (!tc || cJSON_IsString(tc))
        return !tc || cJSON_AddItemToObject(p->chat, "tool_choice", cJSON_Duplicate(tc, true)) ? 0 : nomem(p->err);
    const cJSON *type = cJSON_IsObject(tc) ? field(tc, "type") : NULL, *name = field(tc, "name");
    if (!is(type, "function") || !cJSON_IsString(name))
        return bad(p->err, "tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": "
                   "\"function\", \"name\": ...}");
    cJSON *c = cJSON_AddObjectToObject(p->chat, "tool_choice"), *fn;
    return c && cJSON_AddStringToObject(c, "type", "function") && (fn = cJSON_AddObjectToObject(c, "function")) &&
                   cJSON_AddStringToObject(fn, "name", name->valuestring)
               ? 0
               : nomem(p->err);
}

/* text.format: {"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "name",
 * "schema", "strict"?, "description"?} -> response_format. */
static int parse_text(struct rs_parse *p)
{
    const cJSON *text = field(p->root, "text"), *f = cJSON_IsObject(text) ? field(text, "format") : NULL;
    if (text && !cJSON_IsObject(text))
        return bad(p->err, "text", "'text' must be an object");
    if (!f)
        return 0;
    const cJSON *type = cJSON_IsObject(f) ? field(f, "type") : NULL;
    if (!cJSON_IsString(type))
        return bad(p->err, "text.format", "'text.format' must be an object with a string 'type'");
    if (is(type, "text"))
        return 0;
    cJSON *rf = cJSON_AddObjectToObject(p->chat, "response_format"), *js;
    if (!rf)
        return nomem(p->err);
    if (is(type, "json_object"))
        return cJSON_AddStringToObject(rf, "type", "json_object") ? 0 : nomem(p->err);
    if (!is(type, "json_schema"))
        return bad(p->err, "text.format.type", "'text.format.type' must be 'text', 'json_object' or 'json_schema' "
                   "(got '%.64s')", type->valuestring);
    if (!cJSON_IsString(field(f, "name")))
        return bad(p->err, "text.format.name", "'text.format.name' must be a string");
    if (!cJSON_IsObject(field(f, "schema")))
        return bad(p->err, "text.format.schema", "'text.format.schema' must be an object");
    if (!cJSON_AddStringToObject(rf, "type", "json_schema") || !(js = cJSON_AddObjectToObject(rf, "json_schema")))
        return nomem(p->err);
    static const char *const k_keys[] = {"name", "schema", "strict", "description"};
    for (size_t k = 0; k < sizeof k_keys / sizeof k_keys[0]; k++) {
        const cJSON *v = field(f, k_keys[k]);
        if (v && !cJSON_AddItemToObject(js, k_keys[k], cJSON_Duplicate(v, true)))
            return nomem(p->err);
    }
    return 0;
}

/* What a stateless server refuses, and the types of the fields it accepts and ignores. */
static int check_stateless(struct rs_parse *p)
{
    const cJSON *r = p->root, *v;
    if (field(r, "previous_response_id"))
        return bad(p->err, "previous_response_id", "previous_response_id is not supported: this server is "
                   "stateless; send the conversation as input items");
    if (field(r, "conversation"))
        return bad(p->err, "conversation", "conversation is not supported: this server is stateless; send the "
                   "conversation as input items");
    if (field(r, "prompt"))
        return bad(p->err, "prompt", "stored prompts are not supported: send instructions and input");
    if ((v = field(r, "background")) && !cJSON_IsBool(v))
        return bad(p->err, "background", "'background' must be a boolean");
    if (cJSON_IsTrue(v))
        return bad(p->err, "background", "background responses are not supported: this server is stateless");
    static const char *const k_bools[] = {"store", "parallel_tool_calls"};
    for (size_t k = 0; k < sizeof k_bools / sizeof k_bools[0]; k++)
        if ((v = field(r, k_bools[k])) && !cJSON_IsBool(v))
            return bad(p->err, k_bools[k], "'%s' must be a boolean", k_bools[k]);
    static const char *const k_objects[] = {"metadata", "reasoning"};
    for (size_t k = 0; k < sizeof k_objects / sizeof k_objects[0]; k++)
        if ((v = field(r, k_objects[k])) && !cJSON_IsObject(v))
            return bad(p->err, k_objects[k], "'%s' must be an object", k_objects[k]);
    return 0;
}

/* Fields that keep their name and meaning: the shared parser checks them. The ones after
 * "user" are not OpenAI's here but the server's chat extensions, accepted here too. */
static int pass_through(struct rs_parse *p)
{
    static const char *const k_same[] = {
        "model", "temperature", "top_p", "stream", "user",
        "seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
        "chat_template_kwargs",
    };
    for (size_t k = 0; k < sizeof k_same / sizeof k_same[0]; k++) {
        const cJSON *v = field(p->root, k_same[k]);
        if (v && !cJSON_AddItemToObject(p->chat, k_same[k], cJSON_Duplicate(v, true)))
            return nomem(p->err);
    }
    const cJSON *v = field(p->root, "max_output_tokens");  /* errors name it (rename_fields) */
    return !v || cJSON_AddItemToObject(p->chat, "max_tokens", cJSON_Duplicate(v, true)) ? 0 : nomem(p->err);
}

/* A copy of root[key], else dflt (taken; NULL when out of memory). */
static cJSON *given_or(const cJSON *root, const char *key, cJSON *dflt)
{
    const cJSON *v = field(root, key);
    if (!v)
        return dflt;
    cJSON_Delete(dflt);
    return cJSON_Duplicate(v, true);
}

/* {"format": text.format, else {"type": "text"}}. */
static cJSON *text_echo(const cJSON *root)
{
    const cJSON *text = field(root, "text"), *f = text ? field(text, "format") : NULL;
    cJSON *t = cJSON_CreateObject(), *fmt = f ? cJSON_Duplicate(f, true) : cJSON_CreateObject();
    bool owned = t && fmt && cJSON_AddItemToObject(t, "format", fmt);
    if (!owned)
        cJSON_Delete(fmt);
    if (!owned || (!f && !cJSON_AddStringToObject(fmt, "type", "text"))) {
        cJSON_Delete(t);
        return NULL;
    }
    return t;
}

/* The request fields a response object repeats (OpenAI's order). Takes p->tools_echo. */
static cJSON *echo_new(struct rs_parse *p)
{
    const cJSON *r = p->root;
    cJSON *e = cJSON_CreateObject();
    bool ok = e && add_owned(e, "instructions", given_or(r, "instructions", cJSON_CreateNull())) &&
              add_owned(e, "max_output_tokens", given_or(r, "max_output_tokens", cJSON_CreateNull())) &&
              add_owned(e, "metadata", given_or(r, "metadata", cJSON_CreateObject())) &&
              add_owned(e, "parallel_tool_calls", given_or(r, "parallel_tool_calls", cJSON_CreateTrue())) &&
              add_owned(e, "previous_response_id", cJSON_CreateNull()) &&
              add_owned(e, "reasoning", given_or(r, "reasoning", cJSON_CreateNull())) &&
              add_owned(e, "store", cJSON_CreateFalse()) &&
              add_owned(e, "temperature", given_or(r, "temperature", cJSON_CreateNull())) &&
              add_owned(e, "text", text_echo(r)) &&
              add_owned(e, "tool_choice", given_or(r, "tool_choice", cJSON_CreateString("auto")));
    cJSON *tools = p->tools_echo;
    p->tools_echo = NULL;
    if (ok)
        ok = add_owned(e, "tools", tools);
    else
        cJSON_Delete(tools);
    ok = ok && add_owned(e, "top_p", given_or(r, "top_p", cJSON_CreateNull())) &&
         add_owned(e, "truncation", given_or(r, "truncation", cJSON_CreateString("disabled")));
    if (!ok) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

/* Replaces every `from` in s (cap bytes) by `to`, cutting what no longer fits. */
static void replace_all(char *s, size_t cap, const char *from, const char *to)
{
    char out[sizeof ((struct oai_error *)0)->message];
    size_t n = 0, fl = strlen(from), tl = strlen(to);
    const char *at = s;
    if (cap > sizeof out)
        cap = sizeof out;
    while (*at && n + 1 < cap) {
        if (strncmp(at, from, fl) == 0 && n + tl < cap) {
            memcpy(out + n, to, tl);
            n += tl;
            at += fl;
        } else {
            out[n++] = *at++;
        }
    }
    out[n] = '\0';
    memcpy(s, out, n + 1);
}

/* An error that names a chat field (from the shared parser or gen) names this API's. */
static void rename_fields(struct oai_error *err)
{
    static const char *const k_names[][2] = {
        {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"},
        {"].function", "]"}, {".json_schema.", "."},
    };
    for (size_t k = 0; k < sizeof k_names / sizeof k_names[0]; k++) {
        replace_all(err->param, sizeof err->param, k_names[k][0], k_names[k][1]);
        replace_all(err->message, sizeof err->message, k_names[k][0], k_names[k][1]);
    }
    if (strncmp(err->param, "messages", 8) == 0)
        replace_all(err->param, sizeof err->param, "messages", "input");
}

int responses_translate(const cJSON *root, int n_vocab, struct oai_request *q, void **out, struct oai_error *err)
{
    struct rs_parse p = {.root = root, .err = err};
    struct rs_state *st = NULL;
    int rc = -1;
    *out = NULL;
    oai_request_init(q);
    if (!(p.chat = cJSON_CreateObject()) || !(p.msgs = cJSON_AddArrayToObject(p.chat, "messages"))) {
        nomem(err);
        goto out;
    }
    if (check_stateless(&p) < 0 || parse_input(&p) < 0 || parse_tools(&p) < 0 || parse_tool_choice(&p) < 0 ||
        parse_text(&p) < 0 || pass_through(&p) < 0)
        goto out;
    if (oai_request_from_object(q, OAI_CHAT, p.chat, n_vocab, err) < 0) {
        rename_fields(err);
        goto out;
    }
    if (!(st = calloc(1, sizeof *st)) || !(st->items = cJSON_CreateArray()) || !(st->echo = echo_new(&p))) {
        oai_request_free(q);
        state_free(st);
        nomem(err);
        goto out;
    }
    *out = st;
    rc = 0;
out:
    cJSON_Delete(p.chat);
    cJSON_Delete(p.tools_echo);
    return rc;
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
              (d = cJSON_AddObjectToObject(u, "input_tokens_details")) && cJSON_AddNumberToObject(d, "cached_tokens", 0) &&
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
              cJSON_AddNullToObject(r, "incomplete_details") && cJSON_AddStringToObject(r, "model", g->s->model_id);
    cJSON_ArrayForEach(v, st->echo)
        ok = ok && add_owned(r, v->string, cJSON_Duplicate(v, true));
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

const struct gen_dialect responses_dialect = {full, events, tail, oai_error_json, state_free};

enum MHD_Result srv_responses(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct oai_request q;
    void *st;
    struct gen *g;
    cJSON *root = oai_parse_object(r->body ? r->body : "", r->len, &err);
    if (!root)
        return srv_reply_error(c, r, &err);
    int rc = responses_translate(root, s->m.n_vocab, &q, &st, &err);
    cJSON_Delete(root);
    if (rc < 0)
        return srv_reply_error(c, r, &err);
    if (gen_new(&g, s, c, r, OAI_CHAT, &q, "resp", &responses_dialect, &err) < 0) {
        state_free(st);
        rename_fields(&err);
        return srv_reply_error(c, r, &err);
    }
    g->id[4] = '_';  /* gen names it "resp-<hex>"; this API's ids are "resp_<hex>" */
    g->dstate = st;
    return gen_serve(g);
}
