/*
 * responses_request: a Responses API body -> the chat request
 * (api_responses.h), validated there (oai_request_from_object).
 *
 * Input items become messages: instructions a first system message; message
 * items (roles user, assistant, system, developer; content a string or
 * input_text / output_text parts) their text; function_call items the
 * tool_calls of an assistant turn, joined with the assistant text and the
 * calls right before them (as a model's turn held them); function_call_output
 * items tool turns; reasoning items are dropped (chat templates drop past
 * reasoning). Flat function tools become chat's nested ones, tool_choice
 * {type: function, name} chat's named choice, text.format response_format,
 * max_output_tokens max_tokens; the server's chat extensions (seed, top_k,
 * stop, ...) pass through. What only this API has is checked here and named
 * as the client wrote it (input[2].content); an error of the shared parser or
 * of gen names chat's field, which responses_rename_fields() turns into this
 * API's. The server is stateless: previous_response_id, conversation, stored
 * prompts, background and item references are refused; store is accepted and
 * nothing is stored.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api_responses.h"

#define INVALID "invalid_request_error"

/* One translation: the body, the chat body it becomes, and the tools' echo. */
struct rs_parse {
    const cJSON *root;
    cJSON *chat;          /* the chat-shaped body */
    cJSON *msgs;          /* its messages */
    cJSON *last;          /* the last message appended */
    cJSON *tools_echo;    /* the tools as the response repeats them */
    struct oai_error *err;
    const char **call_ids;  /* the function_call items' call_ids so far: open addressing, id_cap slots */
    uint32_t id_cap;
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

/* Whether content (an array) holds an input_image part. */
static bool has_image(const cJSON *content)
{
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        if (cJSON_IsObject(part) && is(field(part, "type"), "input_image"))
            return true;
    }
    return false;
}

/* A user message's content with input_image parts as OpenAI's parts: input_text {"type":
 * "text", "text"}, input_image {"type": "image_url", "image_url": {"url": image_url}} (its
 * bytes are checked where OpenAI's are). */
static int push_parts(struct rs_parse *p, const cJSON *content, const char *param)
{
    char pp[128];
    if (cJSON_GetArraySize(content) > OAI_MAX_CONTENT_PARTS)
        return bad(p->err, param, "'%s' must have at most %d parts", param, OAI_MAX_CONTENT_PARTS);
    cJSON *m = push_message(p, "user"), *parts = m ? cJSON_AddArrayToObject(m, "content") : NULL, *o, *iu;
    if (!parts)
        return nomem(p->err);
    int j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        snprintf(pp, sizeof pp, "%s[%d]", param, j++);
        const cJSON *type = cJSON_IsObject(part) ? field(part, "type") : NULL, *v;
        if (!(o = cJSON_CreateObject()) || !cJSON_AddItemToArray(parts, o)) {
            cJSON_Delete(o);
            return nomem(p->err);
        }
        if (is(type, "input_text") || is(type, "text")) {
            if (!cJSON_IsString(v = field(part, "text")))
                return bad(p->err, pp, "'%s.text' must be a string", pp);
            if (!cJSON_AddStringToObject(o, "type", "text") || !cJSON_AddStringToObject(o, "text", v->valuestring))
                return nomem(p->err);
        } else if (is(type, "input_image")) {
            if (field(part, "file_id"))
                return bad(p->err, pp, "'%s.file_id': files are not supported (this server is stateless): send "
                           "image_url as a data: URL", pp);
            if (!cJSON_IsString(v = field(part, "image_url")))
                return bad(p->err, pp, "'%s.image_url' must be a string (a data: URL)", pp);
            if (strncasecmp(v->valuestring, "data:", 5) != 0 && strncasecmp(v->valuestring, "http://", 7) != 0 &&
                strncasecmp(v->valuestring, "https://", 8) != 0)
                return bad(p->err, pp, "'%s.image_url' must be a data: URL (data:image/png;base64,...) or an "
                           "http(s) URL", pp);
            if (!cJSON_AddStringToObject(o, "type", "image_url") || !(iu = cJSON_AddObjectToObject(o, "image_url")) ||
                !cJSON_AddStringToObject(iu, "url", v->valuestring))
                return nomem(p->err);
        } else {
            return bad(p->err, pp, "content parts of type '%.64s' are not supported with images (only "
                       "'input_text', 'input_image')", cJSON_IsString(type) ? type->valuestring : "?");
        }
    }
    return 0;
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
    if (cJSON_IsArray(content) && has_image(content)) {
        if (!is(role, "user"))
            return bad(p->err, param, "images go in user messages");
        return push_parts(p, content, param);
    }
    char *text;
    if (content_text(p->err, content, param, &text) < 0)
        return -1;
    return push_text(p, role->valuestring, text);
}

/* The slot of call_id in p->call_ids: where it is, or the empty slot where it would go (the
 * table is never full: id_cap is over twice the items). */
static uint32_t id_slot(const struct rs_parse *p, const char *id)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *c = (const unsigned char *)id; *c; c++)
        h = (h ^ *c) * 16777619u;
    for (h &= p->id_cap - 1; p->call_ids[h] && strcmp(p->call_ids[h], id) != 0; h = (h + 1) & (p->id_cap - 1))
        ;
    return h;
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
    const char *id = field(item, "call_id")->valuestring;
    p->call_ids[id_slot(p, id)] = id;
    bool ok = cJSON_AddStringToObject(call, "id", id) &&
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
    /* as OpenAI: an output answers a function_call item before it, by its call_id */
    if (!p->call_ids[id_slot(p, id->valuestring)]) {
        free(text);
        snprintf(param, sizeof param, "input[%d].call_id", i);
        return bad(p->err, param, "No tool call found for function call output with call_id '%.64s': '%s' must "
                   "be the call_id of a function_call item before it", id->valuestring, param);
    }
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
    for (p->id_cap = 16; p->id_cap <= 2u * (uint32_t)n; p->id_cap *= 2)
        ;
    if (!(p->call_ids = calloc(p->id_cap, sizeof *p->call_ids)))
        return nomem(p->err);
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
        bool ok = c && e && cJSON_AddItemToArray(chat, c);
        if (!ok)
            cJSON_Delete(c);
        if (!ok || !cJSON_AddItemToArray(p->tools_echo, e)) {
            cJSON_Delete(e);
            return nomem(p->err);
        }
        ok = cJSON_AddStringToObject(c, "type", "function") && (fn = cJSON_AddObjectToObject(c, "function")) &&
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

void responses_rename_fields(struct oai_error *err)
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

int responses_translate(const cJSON *root, int n_vocab, struct oai_request *q, cJSON **echo, struct oai_error *err)
{
    struct rs_parse p = {.root = root, .err = err};
    int rc = -1;
    *echo = NULL;
    oai_request_init(q);
    if (!(p.chat = cJSON_CreateObject()) || !(p.msgs = cJSON_AddArrayToObject(p.chat, "messages"))) {
        nomem(err);
        goto out;
    }
    if (check_stateless(&p) < 0 || parse_input(&p) < 0 || parse_tools(&p) < 0 || parse_tool_choice(&p) < 0 ||
        parse_text(&p) < 0 || pass_through(&p) < 0)
        goto out;
    if (oai_request_from_object(q, OAI_CHAT, p.chat, n_vocab, err) < 0) {
        responses_rename_fields(err);
        goto out;
    }
    q->tools_where = "tools[%d].parameters";  /* flat function tools, in their order */
    if (!(*echo = echo_new(&p))) {
        oai_request_free(q);
        nomem(err);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(p.chat);
    cJSON_Delete(p.tools_echo);
    free(p.call_ids);
    return rc;
}

