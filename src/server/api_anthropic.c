/*
 * api_anthropic: POST /v1/messages and /v1/messages/count_tokens, the
 * Anthropic Messages dialect over gen (gen.h).
 *
 * The body is translated into OpenAI's chat shape and validated by
 * oai_request_from_object, so both dialects render the same chat template
 * from the same messages: `system` becomes a system message; a user turn's
 * `tool_result` blocks become `role: tool` messages (in block order, text
 * between them a user message); an assistant turn's `tool_use` blocks become
 * tool_calls whose arguments are the JSON text of `input` (thinking blocks in
 * history are dropped); `stop_sequences` is `stop`, `tools` and
 * `tool_choice` map onto OpenAI's; `thinking` sets the template variable
 * `enable_thinking`. Only text is accepted: image and document blocks are a
 * 400. One choice per request.
 *
 * The answer is a `message` whose content blocks come in the order the
 * output has them (thinking, text, tool_use); a stream is Anthropic's named
 * events: message_start, per block content_block_start / _delta / _stop,
 * message_delta (stop_reason, usage), message_stop, or `event: error`. Every
 * error of these routes, down to a 401 or 413 answered before routing, has
 * Anthropic's shape {"type": "error", "error": {"type", "message"}}.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_anthropic.h"
#include "gen.h"

#define INVALID "invalid_request_error"

// ---- errors ----

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : INVALID;
    }
}

/* {"type": "error", "error": {"type", "message"}} of err (NULL: out of memory). */
static cJSON *error_object(const struct oai_error *err)
{
    /* oai_error_json makes the message valid UTF-8; take it from there */
    char *oai = oai_error_json(err);
    cJSON *parsed = oai ? cJSON_Parse(oai) : NULL, *doc = cJSON_CreateObject(), *e;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(parsed, "error"), "message");
    bool ok = cJSON_IsString(msg) && doc && cJSON_AddStringToObject(doc, "type", "error") &&
              (e = cJSON_AddObjectToObject(doc, "error")) &&
              cJSON_AddStringToObject(e, "type", error_type(err->status)) &&
              cJSON_AddStringToObject(e, "message", msg->valuestring);
    free(oai);
    cJSON_Delete(parsed);
    if (!ok) {
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

char *anthropic_error_json(const struct oai_error *err)
{
    cJSON *doc = error_object(err);
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    return s;
}

/* A 400 invalid_request_error (always -1). */
static int bad(struct oai_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct oai_error *err, const char *fmt, ...)
{
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return oai_errorf(err, 400, INVALID, NULL, NULL, "%s", msg);
}

static int nomem(struct oai_error *err)
{
    return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* Rewrites OpenAI field names in a message oai_request wrote into Anthropic's. */
static void rename_fields(struct oai_error *err)
{
    static const char *const k[][2] = {
        {"'stop'", "'stop_sequences'"}, {"stop[", "stop_sequences["}, {".function.name", ".name"},
        {".function.parameters", ".input_schema"},
        {".function'", "'"},           {"max_completion_tokens", "max_tokens"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char *at = strstr(err->message, k[i][0]);
        if (!at)
            continue;
        char tail[sizeof err->message];
        snprintf(tail, sizeof tail, "%s", at + strlen(k[i][0]));
        snprintf(at, sizeof err->message - (size_t)(at - err->message), "%s%s", k[i][1], tail);
    }
}

// ---- the request: Anthropic's body in OpenAI's chat shape ----

static const cJSON *member(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static bool type_is(const cJSON *block, const char *type)
{
    const cJSON *t = member(block, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

/* Appends {"type": "text", "text"} to parts for a text block at `where`. */
static int add_text_part(cJSON *parts, const cJSON *block, const char *where, struct oai_error *err)
{
    const cJSON *text = member(block, "text");
    if (!cJSON_IsString(text))
        return bad(err, "%s.text: a text block needs a string 'text'", where);
    cJSON *p = cJSON_CreateObject();
    if (!p || !cJSON_AddItemToArray(parts, p)) {
        cJSON_Delete(p);
        return nomem(err);
    }
    return cJSON_AddStringToObject(p, "type", "text") && cJSON_AddStringToObject(p, "text", text->valuestring)
               ? 0 : nomem(err);
}

/* Content that is a string or an array of text blocks (system, tool_result content) as an
 * OpenAI content value (a string or text parts), NULL with *err. */
static cJSON *text_content(const cJSON *v, const char *where, struct oai_error *err)
{
    char w[128];
    if (cJSON_IsString(v)) {
        cJSON *s = cJSON_CreateString(v->valuestring);
        if (!s)
            nomem(err);
        return s;
    }
    if (!cJSON_IsArray(v)) {
        bad(err, "%s: must be a string or an array of text blocks", where);
        return NULL;
    }
    if (cJSON_GetArraySize(v) > OAI_MAX_CONTENT_PARTS) {
        bad(err, "%s: at most %d blocks", where, OAI_MAX_CONTENT_PARTS);
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    const cJSON *b;
    int j = 0;
    if (!parts) {
        nomem(err);
        return NULL;
    }
    cJSON_ArrayForEach(b, v) {
        snprintf(w, sizeof w, "%s.%d", where, j++);
        if (!type_is(b, "text") ? bad(err, "%s: only text blocks are supported here", w) < 0
                                : add_text_part(parts, b, w, err) < 0) {
            cJSON_Delete(parts);
            return NULL;
        }
    }
    return parts;
}

/* Appends {"role", "content"} (content moved in), and "tool_call_id" when call_id is not NULL.
 * The message is filled here, not found again in out: looking up the last of n messages walks
 * all n, and a 4 MiB body holds ~100k tool_result blocks. */
static int add_message(cJSON *out, const char *role, cJSON *content, const char *call_id, struct oai_error *err)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(out, m)) {
        cJSON_Delete(m);
        cJSON_Delete(content);
        return nomem(err);
    }
    if (!cJSON_AddStringToObject(m, "role", role)) {
        cJSON_Delete(content);
        return nomem(err);
    }
    if (!cJSON_AddItemToObject(m, "content", content)) {
        cJSON_Delete(content);
        return nomem(err);
    }
    return !call_id || cJSON_AddStringToObject(m, "tool_call_id", call_id) ? 0 : nomem(err);
}

/* Appends an image block {"type": "image", "source": {"type": "base64", "media_type", "data"}}
 * at `where` to parts as OpenAI's {"type": "image_url", "image_url": {"url": "data:...;base64,..."}}
 * (the bytes are checked where OpenAI's parts are). */
static int add_image_part(cJSON *parts, const cJSON *block, const char *where, struct oai_error *err)
{
    static const char *const k_types[] = {"image/jpeg", "image/png", "image/gif", "image/webp"};
    const cJSON *src = member(block, "source");
    const cJSON *ty = src ? member(src, "type") : NULL, *mt = src ? member(src, "media_type") : NULL,
                *data = src ? member(src, "data") : NULL;
    if (!cJSON_IsObject(src) || !cJSON_IsString(ty))
        return bad(err, "%s.source: an image block needs a 'source' object with a string 'type'", where);
    if (strcmp(ty->valuestring, "url") == 0) {
        /* an http(s) URL, fetched where OpenAI's are (serve --allow-image-urls) */
        const cJSON *u = member(src, "url");
        if (!cJSON_IsString(u) || (strncmp(u->valuestring, "http://", 7) && strncmp(u->valuestring, "https://", 8)))
            return bad(err, "%s.source.url: a url image source needs an http(s) 'url'", where);
        cJSON *p = cJSON_CreateObject(), *iu;
        if (!p || !cJSON_AddItemToArray(parts, p)) {
            cJSON_Delete(p);
            return nomem(err);
        }
        return cJSON_AddStringToObject(p, "type", "image_url") && (iu = cJSON_AddObjectToObject(p, "image_url")) &&
                       cJSON_AddStringToObject(iu, "url", u->valuestring)
                   ? 0 : nomem(err);
    }
    if (strcmp(ty->valuestring, "base64") != 0)
        return bad(err, "%s.source.type: '%.32s' is not supported ('base64', 'url')", where, ty->valuestring);
    bool known = false;
    for (size_t i = 0; cJSON_IsString(mt) && i < sizeof k_types / sizeof k_types[0]; i++)
        known |= strcmp(mt->valuestring, k_types[i]) == 0;
    if (!known)
        return bad(err, "%s.source.media_type: must be one of image/jpeg, image/png, image/gif, image/webp", where);
    if (!cJSON_IsString(data))
        return bad(err, "%s.source.data: a base64 image block needs a string 'data'", where);
    size_t n = strlen(data->valuestring), m = strlen(mt->valuestring);
    char *url = malloc(n + m + 16);
    cJSON *p = cJSON_CreateObject(), *iu;
    bool ok = url && p && cJSON_AddItemToArray(parts, p);
    if (!ok)
        cJSON_Delete(p);
    if (ok) {
        snprintf(url, n + m + 16, "data:%s;base64,%s", mt->valuestring, data->valuestring);
        ok = cJSON_AddStringToObject(p, "type", "image_url") && (iu = cJSON_AddObjectToObject(p, "image_url")) &&
             cJSON_AddStringToObject(iu, "url", url);
    }
    free(url);
    return ok ? 0 : nomem(err);
}

/* A block type no endpoint here takes: a clear 400. */
static int unsupported_block(const cJSON *b, const char *where, struct oai_error *err)
{
    const cJSON *t = member(b, "type");
    if (!cJSON_IsString(t))
        return bad(err, "%s: a content block needs a string 'type'", where);
    if (strcmp(t->valuestring, "image") == 0)
        return bad(err, "%s: image blocks go in user messages", where);
    if (strcmp(t->valuestring, "document") == 0)
        return bad(err, "%s: 'document' blocks are not supported (this server takes text and images)", where);
    return bad(err, "%s: unsupported content block type '%.32s'", where, t->valuestring);
}

/* A user turn: text blocks become user messages, tool_result blocks tool messages, in order. */
static int user_turn(cJSON *out, const cJSON *content, int i, struct oai_error *err)
{
    char w[128];
    cJSON *parts = NULL;
    const cJSON *b;
    int j = 0;
    cJSON_ArrayForEach(b, content) {
        snprintf(w, sizeof w, "messages.%d.content.%d", i, j++);
        if (type_is(b, "text") || type_is(b, "image")) {
            if (!parts && !(parts = cJSON_CreateArray())) {
                nomem(err);
                goto fail;
            }
            if ((type_is(b, "text") ? add_text_part(parts, b, w, err) : add_image_part(parts, b, w, err)) < 0)
                goto fail;
            continue;
        }
        if (!type_is(b, "tool_result")) {
            unsupported_block(b, w, err);
            goto fail;
        }
        const cJSON *id = member(b, "tool_use_id"), *c = member(b, "content"), *is_err = member(b, "is_error");
        if (!cJSON_IsString(id) || (is_err && !cJSON_IsBool(is_err))) {
            bad(err, "%s: a tool_result block needs a string 'tool_use_id' (and 'is_error' a boolean)", w);
            goto fail;
        }
        if (parts && add_message(out, "user", parts, NULL, err) < 0) {
            parts = NULL;
            goto fail;
        }
        parts = NULL;
        char wc[160];
        snprintf(wc, sizeof wc, "%s.content", w);
        cJSON *text = c ? text_content(c, wc, err) : cJSON_CreateString("");
        if (!text) {
            if (!c)
                nomem(err);
            goto fail;
        }
        if (add_message(out, "tool", text, id->valuestring, err) < 0)
            goto fail;
    }
    if (parts)
        return add_message(out, "user", parts, NULL, err);
    return 0;
fail:
    cJSON_Delete(parts);
    return -1;
}

/* {"id", "type": "function", "function": {"name", "arguments": <input as JSON text>}}. */
static cJSON *tool_call(const cJSON *b, const char *where, struct oai_error *err)
{
    const cJSON *id = member(b, "id"), *name = member(b, "name"), *input = member(b, "input");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
        bad(err, "%s: a tool_use block needs a string 'id', a string 'name' and an object 'input'", where);
        return NULL;
    }
    char *args = cJSON_PrintUnformatted(input);
    cJSON *o = cJSON_CreateObject(), *f;
    bool ok = args && o && cJSON_AddStringToObject(o, "id", id->valuestring) &&
              cJSON_AddStringToObject(o, "type", "function") && (f = cJSON_AddObjectToObject(o, "function")) &&
              cJSON_AddStringToObject(f, "name", name->valuestring) && cJSON_AddStringToObject(f, "arguments", args);
    free(args);
    if (!ok) {
        cJSON_Delete(o);
        nomem(err);
        return NULL;
    }
    return o;
}

/* An assistant turn: text blocks as content, tool_use blocks as tool_calls; thinking dropped. */
static int assistant_turn(cJSON *out, const cJSON *content, int i, struct oai_error *err)
{
    char w[128];
    cJSON *parts = cJSON_CreateArray(), *calls = cJSON_CreateArray(), *m = NULL;
    const cJSON *b;
    int j = 0;
    if (!parts || !calls)
        goto oom;
    cJSON_ArrayForEach(b, content) {
        snprintf(w, sizeof w, "messages.%d.content.%d", i, j++);
        if (type_is(b, "text")) {
            if (add_text_part(parts, b, w, err) < 0)
                goto fail;
        } else if (type_is(b, "tool_use")) {
            cJSON *call = tool_call(b, w, err);
            if (!call)
                goto fail;
            if (!cJSON_AddItemToArray(calls, call)) {
                cJSON_Delete(call);
                goto oom;
            }
        } else if (!type_is(b, "thinking") && !type_is(b, "redacted_thinking")) {
            unsupported_block(b, w, err);
            goto fail;
        }
    }
    bool has_calls = cJSON_GetArraySize(calls) > 0;
    if (!(m = cJSON_CreateObject()) || !cJSON_AddItemToArray(out, m)) {
        cJSON_Delete(m);
        goto oom;
    }
    /* a turn of calls only has content "" rather than null: templates that concatenate the
     * content (no `if message.content`) render it instead of failing */
    bool ok = cJSON_AddStringToObject(m, "role", "assistant") != NULL;
    if (ok && cJSON_GetArraySize(parts) == 0)
        ok = cJSON_AddStringToObject(m, "content", "") != NULL;
    else if (ok)
        ok = cJSON_AddItemToObject(m, "content", parts) && !(parts = NULL);
    if (ok && has_calls)
        ok = cJSON_AddItemToObject(m, "tool_calls", calls) && !(calls = NULL);
    if (!ok)
        goto oom;
    cJSON_Delete(parts);
    cJSON_Delete(calls);
    return 0;
oom:
    nomem(err);
fail:
    cJSON_Delete(parts);
    cJSON_Delete(calls);
    return -1;
}

/* system + messages -> OpenAI messages in o. */
static int translate_messages(cJSON *o, const cJSON *root, struct oai_error *err)
{
    const cJSON *sys = member(root, "system"), *msgs = member(root, "messages"), *m;
    cJSON *out = cJSON_AddArrayToObject(o, "messages");
    if (!out)
        return nomem(err);
    if (sys && !cJSON_IsNull(sys)) {
        cJSON *c = text_content(sys, "system", err);
        if (!c)
            return -1;
        bool empty = cJSON_IsString(c) ? c->valuestring[0] == 0 : cJSON_GetArraySize(c) == 0;
        if (empty)
            cJSON_Delete(c);
        else if (add_message(out, "system", c, NULL, err) < 0)
            return -1;
    }
    if (!msgs)
        return bad(err, "messages: field required");
    if (!cJSON_IsArray(msgs))
        return bad(err, "messages: must be an array");
    if (cJSON_GetArraySize(msgs) == 0)
        return bad(err, "messages: at least one message is required");
    if (cJSON_GetArraySize(msgs) > OAI_MAX_MESSAGES)
        return bad(err, "messages: at most %d messages", OAI_MAX_MESSAGES);
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = member(m, "role"), *content = member(m, "content");
        if (!cJSON_IsObject(m))
            return bad(err, "messages.%d: must be an object", i);
        bool user = cJSON_IsString(role) && strcmp(role->valuestring, "user") == 0;
        bool assistant = cJSON_IsString(role) && strcmp(role->valuestring, "assistant") == 0;
        if (!user && !assistant)
            return bad(err, "messages.%d.role: must be 'user' or 'assistant' (the system prompt is the top-level "
                       "'system' field)", i);
        if (cJSON_IsString(content)) {
            cJSON *s = cJSON_CreateString(content->valuestring);
            if (!s || add_message(out, role->valuestring, s, NULL, err) < 0)
                return nomem(err);
        } else if (!cJSON_IsArray(content)) {
            return bad(err, "messages.%d.content: must be a string or an array of content blocks", i);
        } else if (cJSON_GetArraySize(content) == 0 || cJSON_GetArraySize(content) > OAI_MAX_CONTENT_PARTS) {
            return bad(err, "messages.%d.content: must have 1 to %d blocks", i, OAI_MAX_CONTENT_PARTS);
        } else if ((user ? user_turn(out, content, i, err) : assistant_turn(out, content, i, err)) < 0) {
            return -1;
        }
        i++;
    }
    return 0;
}

/* tools [{name, description, input_schema}] -> [{"type": "function", "function": {...}}];
 * tool_choice {type: auto|any|tool|none, name} -> "auto" | "required" | named | "none". */
static int translate_tools(cJSON *o, const cJSON *root, struct oai_error *err)
{
    const cJSON *tools = member(root, "tools"), *choice = member(root, "tool_choice"), *t;
    if (tools && !cJSON_IsArray(tools))
        return bad(err, "tools: must be an array");
    if (tools && cJSON_GetArraySize(tools) > 0) {
        cJSON *out = cJSON_AddArrayToObject(o, "tools");
        int i = 0;
        if (!out)
            return nomem(err);
        cJSON_ArrayForEach(t, tools) {
            const cJSON *type = member(t, "type"), *name = member(t, "name"), *desc = member(t, "description");
            const cJSON *schema = member(t, "input_schema");
            if (type && !cJSON_IsNull(type) && !type_is(t, "custom"))
                return bad(err, "tools.%d: only client tools ({name, description, input_schema}) are supported", i);
            if (!cJSON_IsString(name) || !cJSON_IsObject(schema) || (desc && !cJSON_IsString(desc)))
                return bad(err, "tools.%d: a tool needs a string 'name' and an object 'input_schema' ('description' "
                           "a string)", i);
            cJSON *e = cJSON_CreateObject(), *f;
            if (!e || !cJSON_AddItemToArray(out, e)) {
                cJSON_Delete(e);
                return nomem(err);
            }
            if (!cJSON_AddStringToObject(e, "type", "function") || !(f = cJSON_AddObjectToObject(e, "function")) ||
                !cJSON_AddStringToObject(f, "name", name->valuestring) ||
                (desc && !cJSON_AddStringToObject(f, "description", desc->valuestring)) ||
                !cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(schema, true)))
                return nomem(err);
            i++;
        }
    }
    if (!choice || cJSON_IsNull(choice))
        return 0;
    const cJSON *name = member(choice, "name");
    cJSON *c = NULL, *f;
    if (type_is(choice, "auto") || type_is(choice, "none")) {
        c = cJSON_CreateString(member(choice, "type")->valuestring);
    } else if (type_is(choice, "any")) {
        c = cJSON_CreateString("required");
    } else if (type_is(choice, "tool")) {
        if (!cJSON_IsString(name))
            return bad(err, "tool_choice.name: required (a string) when the type is 'tool'");
        if ((c = cJSON_CreateObject()) &&
            (!cJSON_AddStringToObject(c, "type", "function") || !(f = cJSON_AddObjectToObject(c, "function")) ||
             !cJSON_AddStringToObject(f, "name", name->valuestring))) {
            cJSON_Delete(c);
            c = NULL;
        }
    } else {
        return bad(err, "tool_choice: must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
    }
    return c && cJSON_AddItemToObject(o, "tool_choice", c) ? 0 : (cJSON_Delete(c), nomem(err));
}

/* thinking {type: enabled | disabled} -> chat_template_kwargs {enable_thinking}. */
static int translate_thinking(cJSON *o, const cJSON *root, struct oai_error *err)
{
    const cJSON *th = member(root, "thinking"), *budget = member(th, "budget_tokens");
    if (!th || cJSON_IsNull(th))
        return 0;
    bool on = type_is(th, "enabled");
    if (!on && !type_is(th, "disabled"))
        return bad(err, "thinking: must be {\"type\": \"enabled\" | \"disabled\"}");
    if (budget && !cJSON_IsNumber(budget))
        return bad(err, "thinking.budget_tokens: must be an integer");
    cJSON *kw = cJSON_AddObjectToObject(o, "chat_template_kwargs");
    return kw && cJSON_AddBoolToObject(kw, "enable_thinking", on) ? 0 : nomem(err);
}

/* The body as an OpenAI chat request object (NULL with *err). max_tokens is required unless
 * counting (then it is left out). */
static cJSON *translate(const cJSON *root, bool count, struct oai_error *err)
{
    static const char *const k_same[] = {"model", "temperature", "top_p", "top_k", "stream"};
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        nomem(err);
        return NULL;
    }
    /* Anthropic's ranges, narrower than OpenAI's (temperature 0..2, top_k -1 for off) that
     * oai_request checks after: temperature 0..1, top_k an integer >= 0 (its API reference) */
    const cJSON *temp = member(root, "temperature"), *top_k = member(root, "top_k");
    if (temp && !cJSON_IsNull(temp) && !(cJSON_IsNumber(temp) && temp->valuedouble >= 0.0 && temp->valuedouble <= 1.0)) {
        oai_errorf(err, 400, INVALID, NULL, "temperature", "temperature: must be a number from 0 to 1");
        goto fail;
    }
    if (top_k && !cJSON_IsNull(top_k) &&
        !(cJSON_IsNumber(top_k) && top_k->valuedouble >= 0.0 && top_k->valuedouble == floor(top_k->valuedouble))) {
        oai_errorf(err, 400, INVALID, NULL, "top_k", "top_k: must be an integer >= 0");
        goto fail;
    }
    for (size_t i = 0; i < sizeof k_same / sizeof k_same[0]; i++) {
        const cJSON *v = member(root, k_same[i]);
        if ((count && strcmp(k_same[i], "stream") == 0) || !v || cJSON_IsNull(v))
            continue;
        if (!cJSON_AddItemToObject(o, k_same[i], cJSON_Duplicate(v, true))) {
            nomem(err);
            goto fail;
        }
    }
    const cJSON *mt = member(root, "max_tokens"), *stop = member(root, "stop_sequences");
    if (!count && (!mt || cJSON_IsNull(mt))) {
        bad(err, "max_tokens: field required");
        goto fail;
    }
    if (!count && !cJSON_AddItemToObject(o, "max_tokens", cJSON_Duplicate(mt, true))) {
        nomem(err);
        goto fail;
    }
    if (!count && stop && !cJSON_IsNull(stop)) {
        if (!cJSON_IsArray(stop)) {
            bad(err, "stop_sequences: must be an array of strings");
            goto fail;
        }
        if (!cJSON_AddItemToObject(o, "stop", cJSON_Duplicate(stop, true))) {
            nomem(err);
            goto fail;
        }
    }
    if (translate_messages(o, root, err) < 0 || translate_tools(o, root, err) < 0 ||
        translate_thinking(o, root, err) < 0)
        goto fail;
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

int anthropic_translate(const cJSON *root, bool count, int n_vocab, struct oai_request *q,
                        struct oai_error *err)
{
    oai_request_init(q);
    cJSON *o = translate(root, count, err);
    if (!o)
        return -1;
    int rc = oai_request_from_object(q, OAI_CHAT, o, n_vocab, err);
    cJSON_Delete(o);
    if (rc < 0)
        rename_fields(err);
    q->tools_where = "tools.%d.input_schema";  /* the tools keep their order and index */
    q->anthropic = true;
    return rc;
}

/* The request body into q (checked as OpenAI's chat request); -1 with *err. */
static int parse_body(struct server *s, struct srv_req *r, bool count, struct oai_request *q, struct oai_error *err)
{
    (void)s;  /* the model is the request's (r->model) */
    oai_request_init(q);
    cJSON *root = oai_parse_object(r->body ? r->body : "", r->len, err);
    if (!root)
        return -1;
    int rc = anthropic_translate(root, count, r->model->m.n_vocab, q, err);
    cJSON_Delete(root);
    return rc;
}

// ---- the answer ----

static const char *stop_reason(const struct gen_choice *c)
{
    if (c->finish == GEN_FINISH_TOOL_CALLS)
        return "tool_use";
    if (c->stop_seq)
        return "stop_sequence";
    return c->finish == GEN_FINISH_LENGTH ? "max_tokens" : "end_turn";
}

/* {input_tokens (the whole prompt), output_tokens, cache_read_input_tokens (of them, found in
 * the prefix cache), cache_creation_input_tokens: 0}. */
static cJSON *usage(const struct gen *g, bool start)
{
    int comp, p = gen_usage(g, &comp);
    cJSON *u = cJSON_CreateObject();
    if (u && (!cJSON_AddNumberToObject(u, "input_tokens", p) ||
              !cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0) ||
              !cJSON_AddNumberToObject(u, "cache_read_input_tokens", gen_cached(g)) ||
              !cJSON_AddNumberToObject(u, "output_tokens", start ? 0 : comp))) {
        cJSON_Delete(u);
        return NULL;
    }
    return u;
}

/* A tool call's input: its arguments parsed (an object; anything else as {}). */
static cJSON *tool_input(const cJSON *call)
{
    cJSON *in = cJSON_Parse(cJSON_GetObjectItem(call, "arguments")->valuestring);
    if (in && cJSON_IsObject(in))
        return in;
    cJSON_Delete(in);
    return cJSON_CreateObject();
}

/* {"type": "tool_use", "id", "name", "input"} (input: the call's, or {} for a stream's start). */
static cJSON *tool_block(const cJSON *call, bool empty_input)
{
    cJSON *b = cJSON_CreateObject(), *in = empty_input ? cJSON_CreateObject() : tool_input(call);
    bool ok = b && in && cJSON_AddStringToObject(b, "type", "tool_use") &&
              cJSON_AddStringToObject(b, "id", cJSON_GetObjectItem(call, "id")->valuestring) &&
              cJSON_AddStringToObject(b, "name", cJSON_GetObjectItem(call, "name")->valuestring) &&
              cJSON_AddItemToObject(b, "input", in);
    if (!ok) {
        if (!b || !cJSON_GetObjectItemCaseSensitive(b, "input"))
            cJSON_Delete(in);
        cJSON_Delete(b);
        return NULL;
    }
    return b;
}

/* {"type": "text" | "thinking", ...} holding text. */
static cJSON *text_block(bool thinking, const char *text)
{
    cJSON *b = cJSON_CreateObject();
    if (b && (!cJSON_AddStringToObject(b, "type", thinking ? "thinking" : "text") ||
              !cJSON_AddStringToObject(b, thinking ? "thinking" : "text", text) ||
              (thinking && !cJSON_AddStringToObject(b, "signature", "")))) {
        cJSON_Delete(b);
        return NULL;
    }
    return b;
}

/* The message with its content (start: empty content, no stop reason yet, as message_start). */
static cJSON *message(const struct gen *g, bool start)
{
    const struct gen_choice *c = &g->ch[0];
    cJSON *m = cJSON_CreateObject(), *content, *u = usage(g, start), *t;
    bool ok = m && u && cJSON_AddStringToObject(m, "id", g->id) && cJSON_AddStringToObject(m, "type", "message") &&
              cJSON_AddStringToObject(m, "role", "assistant") &&
              cJSON_AddStringToObject(m, "model", g->model->id) && (content = cJSON_AddArrayToObject(m, "content"));
    if (ok && !start) {
        if (c->reasoning.len > 0)
            ok = cJSON_AddItemToArray(content, text_block(true, c->reasoning.p));
        if (ok && c->content.len > 0)
            ok = cJSON_AddItemToArray(content, text_block(false, c->content.p));
        cJSON_ArrayForEach(t, c->tool_calls) {
            if (ok)
                ok = cJSON_AddItemToArray(content, tool_block(t, false));
        }
    }
    ok = ok && (start ? cJSON_AddNullToObject(m, "stop_reason") != NULL
                      : cJSON_AddStringToObject(m, "stop_reason", stop_reason(c)) != NULL);
    ok = ok && (start || !c->stop_seq ? cJSON_AddNullToObject(m, "stop_sequence") != NULL
                                      : cJSON_AddStringToObject(m, "stop_sequence", c->stop_seq) != NULL);
    ok = ok && cJSON_AddItemToObject(m, "usage", u);
    if (!ok) {
        if (!m || !cJSON_GetObjectItemCaseSensitive(m, "usage"))
            cJSON_Delete(u);
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static cJSON *full(struct gen *g)
{
    return message(g, false);
}

// ---- streaming ----

/* The open block lives in the choice's dialect state: c->block = kind | (blocks opened << 2). */
enum block_kind { BLOCK_NONE = 0, BLOCK_THINKING = 1, BLOCK_TEXT = 2, BLOCK_TOOL = 3 };

static enum block_kind block_kind(const struct gen_choice *c)
{
    return (enum block_kind)(c->block & 3);
}

/* {"type": <type>, "index": <the open block>} (NULL: out of memory). */
static cJSON *block_event(const struct gen_choice *c, const char *type)
{
    cJSON *e = cJSON_CreateObject();
    if (e && (!cJSON_AddStringToObject(e, "type", type) || !cJSON_AddNumberToObject(e, "index", (c->block >> 2) - 1))) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

static int block_close(struct gen *g, struct gen_choice *c)
{
    if (block_kind(c) == BLOCK_NONE)
        return 0;
    c->block &= ~3;  /* BLOCK_NONE */
    /* the index is still that of the block just closed */
    return gen_sse_event(g, "content_block_stop", block_event(c, "content_block_stop"));
}

/* Closes the open block and opens block (moved in) of kind. */
static int block_open(struct gen *g, struct gen_choice *c, enum block_kind kind, cJSON *block)
{
    if (!block || block_close(g, c) < 0) {
        cJSON_Delete(block);
        return -1;
    }
    c->block = (((c->block >> 2) + 1) << 2) | kind;
    cJSON *e = block_event(c, "content_block_start");
    if (!e || !cJSON_AddItemToObject(e, "content_block", block)) {
        cJSON_Delete(e);
        cJSON_Delete(block);
        return -1;
    }
    return gen_sse_event(g, "content_block_start", e);
}

/* A content_block_delta of the open block: {"type": dtype, key: n bytes of text}. */
static int block_delta(struct gen *g, struct gen_choice *c, const char *dtype, const char *key, const char *text,
                       size_t n)
{
    cJSON *e = block_event(c, "content_block_delta"), *d;
    char *t = strndup(text, n);
    bool ok = e && t && (d = cJSON_AddObjectToObject(e, "delta")) && cJSON_AddStringToObject(d, "type", dtype) &&
              cJSON_AddStringToObject(d, key, t);
    free(t);
    if (!ok) {
        cJSON_Delete(e);
        return -1;
    }
    return gen_sse_event(g, "content_block_delta", e);
}

/* Reasoning or content that grew: into the open block of its kind (opened when another is). */
static int text_events(struct gen *g, struct gen_choice *c, bool thinking)
{
    struct gbuf *b = thinking ? &c->reasoning : &c->content;
    size_t *sent = thinking ? &c->sent_reasoning : &c->sent_content;
    enum block_kind kind = thinking ? BLOCK_THINKING : BLOCK_TEXT;
    if (b->len <= *sent)
        return 0;
    if (block_kind(c) != kind && block_open(g, c, kind, text_block(thinking, "")) < 0)
        return -1;
    if (block_delta(g, c, thinking ? "thinking_delta" : "text_delta", thinking ? "thinking" : "text",
                    b->p + *sent, b->len - *sent) < 0)
        return -1;
    *sent = b->len;
    return 0;
}

/* Each new tool call: a tool_use block with its whole input as one input_json_delta. */
static int tool_events(struct gen *g, struct gen_choice *c)
{
    int n = cJSON_GetArraySize(c->tool_calls);
    for (; c->sent_tools < n; c->sent_tools++) {
        const cJSON *call = cJSON_GetArrayItem(c->tool_calls, c->sent_tools);
        cJSON *in = tool_input(call);
        char *json = in ? cJSON_PrintUnformatted(in) : NULL;
        cJSON_Delete(in);
        int rc = json ? block_open(g, c, BLOCK_TOOL, tool_block(call, true)) : -1;
        if (rc == 0)
            rc = block_delta(g, c, "input_json_delta", "partial_json", json, strlen(json));
        free(json);
        if (rc < 0 || block_close(g, c) < 0)
            return -1;
    }
    return 0;
}

static int events(struct gen *g)
{
    struct gen_choice *c = &g->ch[0];
    if (!c->head_sent) {
        cJSON *e = cJSON_CreateObject(), *m = message(g, true);
        if (!e || !m || !cJSON_AddStringToObject(e, "type", "message_start") || !cJSON_AddItemToObject(e, "message", m)) {
            if (!e || !cJSON_GetObjectItemCaseSensitive(e, "message"))
                cJSON_Delete(m);
            cJSON_Delete(e);
            return -1;
        }
        if (gen_sse_event(g, "message_start", e) < 0)
            return -1;
        c->head_sent = true;
    }
    if (text_events(g, c, true) < 0 || text_events(g, c, false) < 0 || tool_events(g, c) < 0)
        return -1;
    return 0;
}

/* The closing events: the open block's stop, message_delta, message_stop; or an error event. */
static int tail(struct gen *g)
{
    struct gen_choice *c = &g->ch[0];
    if (g->rc < 0 || g->aborted)
        return gen_sse_event(g, "error", error_object(&g->err));
    if (block_close(g, c) < 0)
        return -1;
    cJSON *e = cJSON_CreateObject(), *d, *u = usage(g, false);
    bool ok = e && u && cJSON_AddStringToObject(e, "type", "message_delta") && (d = cJSON_AddObjectToObject(e, "delta")) &&
              cJSON_AddStringToObject(d, "stop_reason", stop_reason(c)) &&
              (c->stop_seq ? cJSON_AddStringToObject(d, "stop_sequence", c->stop_seq) != NULL
                           : cJSON_AddNullToObject(d, "stop_sequence") != NULL) &&
              cJSON_AddItemToObject(e, "usage", u);
    if (!ok) {
        if (!e || !cJSON_GetObjectItemCaseSensitive(e, "usage"))
            cJSON_Delete(u);
        cJSON_Delete(e);
        return -1;
    }
    if (gen_sse_event(g, "message_delta", e) < 0)
        return -1;
    cJSON *stop = cJSON_CreateObject();
    if (stop && !cJSON_AddStringToObject(stop, "type", "message_stop")) {
        cJSON_Delete(stop);
        stop = NULL;
    }
    return gen_sse_event(g, "message_stop", stop);
}

const struct gen_dialect anthropic_dialect = {full, events, tail, NULL};

// ---- the endpoints ----

enum MHD_Result srv_anthropic_messages(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct oai_request q;
    struct gen *g;
    if (parse_body(s, r, false, &q, &err) < 0)
        return srv_reply_error(c, r, &err);
    if (gen_new(&g, s, c, r, OAI_CHAT, &q, "msg", &anthropic_dialect, &err) < 0)
        return srv_reply_error(c, r, &err);
    g->id[3] = '_';  /* "msg_<hex>", as Anthropic's ids */
    return gen_serve(g);
}

enum MHD_Result srv_anthropic_count_tokens(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    struct oai_error err;
    struct oai_request q;
    int n = 0;
    if (parse_body(s, r, true, &q, &err) < 0)
        return srv_reply_error(c, r, &err);
    if (q.model && strcmp(q.model, r->model->id) != 0) {
        oai_errorf(&err, 404, "not_found_error", "model_not_found", "model",
                   "the model '%.64s' does not exist; this server serves '%s'", q.model, r->model->id);
        oai_request_free(&q);
        return srv_reply_error(c, r, &err);
    }
    int rc = gen_count_prompt(r->model, OAI_CHAT, &q, &n, &err);
    oai_request_free(&q);
    if (rc < 0)
        return srv_reply_error(c, r, &err);
    r->n_prompt = n;
    cJSON *doc = cJSON_CreateObject();
    if (doc && !cJSON_AddNumberToObject(doc, "input_tokens", n)) {
        cJSON_Delete(doc);
        doc = NULL;
    }
    return srv_reply_json(c, r, 200, doc);
}
