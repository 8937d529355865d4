/*
 * request_check: the promises of an accepted chat request (oai_request.h),
 * checked by the fuzz targets of the three dialects that end in one
 * (fuzz_oai_request, fuzz_responses, fuzz_anthropic). Every check aborts, so
 * libFuzzer reports a broken promise as a crash. Header-only (static): each
 * target is one file (CMake builds fuzz/fuzz_*.c).
 */
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/oai_request.h"
#include "tokenizer/tokenizer.h"

#define N_VOCAB 2048

static void check_utf8(const char *s, size_t n)
{
    size_t need;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_seq((const unsigned char *)s + i, n - i, &need);
        if (need == 0 || k != need)
            abort();
        i += k;
    }
}

/* A body as the server sends it: valid UTF-8 that cJSON parses back (NULL: out of memory). */
static cJSON *check_body(char *s)
{
    if (!s)
        return NULL;
    check_utf8(s, strlen(s));
    cJSON *o = cJSON_Parse(s);
    free(s);
    if (!o)
        abort();
    return o;
}

/* err as an OpenAI error body: {"error": {"message": <string>, ...}}. */
static void check_error(const struct oai_error *err)
{
    if (err->status < 400 || err->status > 599 || !err->type)
        abort();
    cJSON *o = check_body(oai_error_json(err));
    if (o && !cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "error"), "message")))
        abort();
    cJSON_Delete(o);
}

/* A request that failed holds nothing. */
static void check_empty(const struct oai_request *r)
{
    if (r->messages || r->prompt || r->prompt_ids || r->model || r->bias || r->n_stop || r->tools ||
        r->tool_choice_name || r->format_schema || r->template_kwargs || r->images || r->n_images)
        abort();
}

/* A user message's parts with images: {"type": "text", "text"} and {"type": "image"} only;
 * returns the images. */
static int check_parts(const cJSON *parts)
{
    int n_img = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, parts) {
        const cJSON *type = cJSON_GetObjectItem(p, "type"), *text = cJSON_GetObjectItem(p, "text");
        if (!cJSON_IsString(type))
            abort();
        if (strcmp(type->valuestring, "image") == 0) {
            if (cJSON_GetArraySize(p) != 1)
                abort();
            n_img++;
        } else if (strcmp(type->valuestring, "text") != 0 || cJSON_GetArraySize(p) != 2 || !cJSON_IsString(text)) {
            abort();
        } else {
            check_utf8(text->valuestring, strlen(text->valuestring));
        }
    }
    if (n_img < 1)
        abort();
    return n_img;
}

static void check_messages(const cJSON *msgs, int n_images)
{
    int n = 0, n_img = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItem(m, "role"), *content = cJSON_GetObjectItem(m, "content");
        const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls"), *call_id = cJSON_GetObjectItem(m, "tool_call_id");
        if (cJSON_GetArraySize(m) != 2 + !!calls + !!call_id || !cJSON_IsString(role) ||
            !(cJSON_IsString(content) || (cJSON_IsArray(content) && strcmp(role->valuestring, "user") == 0)))
            abort();
        if (cJSON_IsArray(content)) {
            n_img += check_parts(content);
            n++;
            continue;
        }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant") && strcmp(role->valuestring, "tool"))
            abort();
        if ((calls && (strcmp(role->valuestring, "assistant") || !cJSON_IsArray(calls) ||
                       cJSON_GetArraySize(calls) > OAI_MAX_TOOL_CALLS)) ||
            (call_id && (strcmp(role->valuestring, "tool") || !cJSON_IsString(call_id))))
            abort();
        check_utf8(content->valuestring, strlen(content->valuestring));
        n++;
    }
    if (n < 1 || n > OAI_MAX_MESSAGES || n_img != n_images || n_images > OAI_MAX_IMAGES)
        abort();
}

/* tools, tool_choice, format and template variables as oai_request.h describes them. */
static void check_tools_format(const struct oai_request *r)
{
    const cJSON *t;
    bool named = false;
    if (r->tools && (!cJSON_IsArray(r->tools) || cJSON_GetArraySize(r->tools) < 1 ||
                     cJSON_GetArraySize(r->tools) > OAI_MAX_TOOLS))
        abort();
    cJSON_ArrayForEach(t, r->tools) {
        const cJSON *name = cJSON_GetObjectItem(cJSON_GetObjectItem(t, "function"), "name");
        if (!cJSON_IsString(name))
            abort();
        named |= r->tool_choice_name && strcmp(name->valuestring, r->tool_choice_name) == 0;
    }
    if ((r->tool_choice == OAI_TOOL_CHOICE_NAMED) != !!r->tool_choice_name ||
        (r->tool_choice_name && !named) || (r->tool_choice == OAI_TOOL_CHOICE_REQUIRED && !r->tools))
        abort();
    if ((r->format == OAI_FORMAT_JSON_SCHEMA) != !!r->format_schema ||
        (r->template_kwargs && !cJSON_IsObject(r->template_kwargs)))
        abort();
}

static bool in(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

/* Every count and value of an accepted request within its bound; chat: the messages and
 * tools, completions: the prompt. */
static void check_request(const struct oai_request *r, enum oai_endpoint ep)
{
    if (ep == OAI_CHAT) {
        if (!cJSON_IsArray(r->messages) || r->prompt || r->prompt_ids || r->max_tokens == 0)
            abort();
        check_messages(r->messages, r->n_images);
        for (int i = 0; i < r->n_images; i++)
            if (r->images[i].url ? r->images[i].data || strlen(r->images[i].url) > OAI_MAX_IMAGE_URL
                                 : !r->images[i].data || r->images[i].len < 1 || r->images[i].len > OAI_MAX_IMAGE_BYTES)
                abort();
        check_tools_format(r);
    } else {
        if (r->messages || r->images || !r->prompt == !r->prompt_ids)
            abort();
        if (r->prompt && (strlen(r->prompt) != r->prompt_len))
            abort();
        if (r->prompt_ids && (r->n_prompt_ids < 1 || r->n_prompt_ids > OAI_MAX_PROMPT_IDS))
            abort();
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= N_VOCAB)
                abort();
    }
    if (r->max_tokens < -1 || r->max_tokens > OAI_MAX_TOKENS_VALUE || r->n < 1 || r->n > OAI_MAX_N)
        abort();
    if (!in(r->temperature, 0, 2) || !in(r->min_p, 0, 1) || !in(r->presence_penalty, -2, 2) ||
        !in(r->frequency_penalty, -2, 2) || r->top_k < 0 || r->top_k > (1 << 20))
        abort();
    if ((r->has_top_p && !(r->top_p > 0 && r->top_p <= 1)) ||
        (r->has_repetition_penalty && !(r->repetition_penalty > 0 && r->repetition_penalty <= 10)))
        abort();
    if (r->top_logprobs < 0 || r->top_logprobs > (ep == OAI_CHAT ? OAI_MAX_TOP_LOGPROBS : OAI_MAX_LOGPROBS) ||
        (r->top_logprobs && !r->logprobs) || (r->include_usage && !r->stream))
        abort();
    if (r->n_stop < 0 || r->n_stop > OAI_MAX_STOP)
        abort();
    for (int i = 0; i < r->n_stop; i++) {
        if (r->stop_len[i] < 1 || r->stop_len[i] > OAI_MAX_STOP_LEN || strlen(r->stop[i]) != r->stop_len[i])
            abort();
        check_utf8(r->stop[i], r->stop_len[i]);
    }
    if (r->n_bias < 0 || r->n_bias > OAI_MAX_BIAS || (r->n_bias && !r->bias))
        abort();
    for (int i = 0; i < r->n_bias; i++) {
        if (r->bias[i].id < 0 || r->bias[i].id >= N_VOCAB || !in(r->bias[i].bias, -100, 100))
            abort();
        for (int j = 0; j < i; j++)
            if (r->bias[j].id == r->bias[i].id)
                abort();
    }
}
