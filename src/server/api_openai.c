/*
 * api_openai: POST /v1/chat/completions and /v1/completions, the OpenAI
 * dialect over gen (gen.h): the body parsed by oai_request, the answer as
 * `chat.completion` / `text_completion`, the stream as OpenAI's chunks.
 *
 * Streaming: a first chunk per choice with delta.role (chat) or the echoed
 * prompt (completions), then deltas of content, reasoning_content and
 * tool_calls as they become final, a chunk with finish_reason, a usage chunk
 * with empty choices when stream_options.include_usage (every other chunk
 * then carries "usage": null), and `data: [DONE]`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen.h"

/* The usage object; with speculative decoding (issue 45), the drafts as OpenAI counts a
 * prediction's tokens (Predicted Outputs): completion_tokens_details' accepted_prediction_tokens
 * (drafted tokens the answer kept) and rejected_prediction_tokens (the rest). */
static cJSON *usage_object(const struct gen *g)
{
    int comp, p = gen_usage(g, &comp), acc, drafted = gen_drafted(g, &acc);
    cJSON *u = cJSON_CreateObject();
    cJSON *d;
    if (u && (!cJSON_AddNumberToObject(u, "prompt_tokens", p) ||
              !cJSON_AddNumberToObject(u, "completion_tokens", comp) ||
              !cJSON_AddNumberToObject(u, "total_tokens", p + comp) ||
              !(d = cJSON_AddObjectToObject(u, "prompt_tokens_details")) ||
              !cJSON_AddNumberToObject(d, "cached_tokens", gen_cached(g)) ||
              (drafted > 0 && (!(d = cJSON_AddObjectToObject(u, "completion_tokens_details")) ||
                               !cJSON_AddNumberToObject(d, "accepted_prediction_tokens", acc) ||
                               !cJSON_AddNumberToObject(d, "rejected_prediction_tokens", drafted - acc))))) {
        cJSON_Delete(u);
        return NULL;
    }
    return u;
}

/* OpenAI's system_fingerprint names "the backend configuration the model runs with": here
 * "fp_" and 12 hex digits of FNV-1a over the served model's id, so it changes when the
 * model served does and stays the same across requests and restarts. */
static void fingerprint(const struct gen *g, char out[16])
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *p = g->model->id; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    snprintf(out, 16, "fp_%012llx", (unsigned long long)(h & 0xFFFFFFFFFFFFULL));
}

/* id, object, created, model, system_fingerprint. */
static cJSON *envelope(const struct gen *g, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    char fp[16];
    fingerprint(g, fp);
    if (o && (!cJSON_AddStringToObject(o, "id", g->id) || !cJSON_AddStringToObject(o, "object", object) ||
              !cJSON_AddNumberToObject(o, "created", (double)g->created) ||
              !cJSON_AddStringToObject(o, "model", g->model->id) ||
              !cJSON_AddStringToObject(o, "system_fingerprint", fp))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* The completions logprobs object of choice c (its arrays move into it; fresh ones stay). */
static cJSON *completion_logprobs(struct gen_choice *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "tokens", c->c_tokens);
    cJSON_AddItemToObject(o, "token_logprobs", c->c_lps);
    cJSON_AddItemToObject(o, "top_logprobs", c->c_tops);
    cJSON_AddItemToObject(o, "text_offset", c->c_offsets);
    c->c_tokens = cJSON_CreateArray();
    c->c_lps = cJSON_CreateArray();
    c->c_tops = cJSON_CreateArray();
    c->c_offsets = cJSON_CreateArray();
    if (!c->c_tokens || !c->c_lps || !c->c_tops || !c->c_offsets) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* OpenAI's tool_calls entries for c's calls from index `from` (streaming: with "index"). */
static cJSON *tool_calls(const struct gen_choice *c, int from, bool indexed)
{
    cJSON *arr = cJSON_CreateArray(), *t;
    int i = 0;
    bool ok = arr != NULL;
    cJSON_ArrayForEach(t, c->tool_calls) {
        if (!ok || i++ < from)
            continue;
        cJSON *o = cJSON_CreateObject(), *fn;
        ok = o && cJSON_AddItemToArray(arr, o) && (!indexed || cJSON_AddNumberToObject(o, "index", i - 1)) &&
             cJSON_AddStringToObject(o, "id", cJSON_GetObjectItem(t, "id")->valuestring) &&
             cJSON_AddStringToObject(o, "type", "function") && (fn = cJSON_AddObjectToObject(o, "function")) &&
             cJSON_AddStringToObject(fn, "name", cJSON_GetObjectItem(t, "name")->valuestring) &&
             cJSON_AddStringToObject(fn, "arguments", cJSON_GetObjectItem(t, "arguments")->valuestring);
    }
    if (!ok) {
        cJSON_Delete(arr);
        return NULL;
    }
    return arr;
}

static cJSON *full(struct gen *g)
{
    bool chat = g->ep == OAI_CHAT;
    cJSON *doc = envelope(g, chat ? "chat.completion" : "text_completion"), *choices = NULL, *u = usage_object(g);
    bool ok = doc && u && (choices = cJSON_AddArrayToObject(doc, "choices"));
    for (int i = 0; ok && i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        cJSON *ch = cJSON_CreateObject(), *msg, *lp, *tc;
        ok = ch && cJSON_AddItemToArray(choices, ch) && cJSON_AddNumberToObject(ch, "index", i);
        if (ok && chat) {
            bool calls = cJSON_GetArraySize(c->tool_calls) > 0;
            ok = (msg = cJSON_AddObjectToObject(ch, "message")) && cJSON_AddStringToObject(msg, "role", "assistant") &&
                 (calls && c->content.len == 0 ? cJSON_AddNullToObject(msg, "content") != NULL
                                               : cJSON_AddStringToObject(msg, "content", c->content.p) != NULL);
            if (ok && c->reasoning.len > 0)
                ok = cJSON_AddStringToObject(msg, "reasoning_content", c->reasoning.p) != NULL;
            if (ok && calls)
                ok = (tc = tool_calls(c, 0, false)) && cJSON_AddItemToObject(msg, "tool_calls", tc);
            /* as OpenAI's message has them: no refusal (this server never refuses by policy), no
             * annotations (no web search) */
            ok = ok && cJSON_AddNullToObject(msg, "refusal") && cJSON_AddArrayToObject(msg, "annotations");
            if (ok && c->lp) {
                ok = (lp = cJSON_AddObjectToObject(ch, "logprobs"));
                if (ok)
                    cJSON_AddItemToObject(lp, "content", c->lp);
                c->lp = NULL;
            } else if (ok) {
                ok = cJSON_AddNullToObject(ch, "logprobs");
            }
        } else if (ok) {
            struct gbuf text = {0};
            ok = gbuf_add(&text, g->echo ? g->echo : "", g->echo_len) == 0 &&
                 gbuf_add(&text, c->content.p, c->content.len) == 0 && cJSON_AddStringToObject(ch, "text", text.p);
            free(text.p);
            if (ok && c->c_tokens)
                ok = (lp = completion_logprobs(c)) && cJSON_AddItemToObject(ch, "logprobs", lp);
            else if (ok)
                ok = cJSON_AddNullToObject(ch, "logprobs");
        }
        ok = ok && cJSON_AddStringToObject(ch, "finish_reason", gen_finish_openai(c->finish));
    }
    ok = ok && cJSON_AddItemToObject(doc, "usage", u);
    if (!ok) {
        if (!doc || !cJSON_GetObjectItemCaseSensitive(doc, "usage"))
            cJSON_Delete(u);
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

/* Chat logprob entries that may be streamed now: all once the choice is finished, else
 * those up to the last that completes text (the ones after it, tokens of an unfinished
 * character, are held back: the decoder's last flush may still add to the last of them). */
static int lp_ready(const struct gen_choice *c)
{
    int k = 0;
    if (c->finished)
        return c->lp ? cJSON_GetArraySize(c->lp) : 0;
    const cJSON *e = c->lp ? c->lp->child : NULL;
    for (int i = 0; e; e = e->next, i++) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "token");
        if (cJSON_IsString(t) && t->valuestring[0])
            k = i + 1;
    }
    return k;
}

/* Moves the first n entries of c->lp into a new array (NULL: out of memory). */
static cJSON *lp_take(struct gen_choice *c, int n)
{
    cJSON *out = cJSON_CreateArray();
    while (out && n-- > 0)
        cJSON_AddItemToArray(out, cJSON_DetachItemFromArray(c->lp, 0));
    return out;
}

/* One chunk for choice i. Chat: role on the first, content / reasoning deltas (NULL: none),
 * tool calls from index `tools_from` (-1: none); completions: text. finish: NULL or the
 * reason. */
static cJSON *chunk(struct gen *g, int i, const char *text, size_t len, const char *reasoning, size_t rlen,
                    int tools_from, const char *finish, bool role)
{
    bool chat = g->ep == OAI_CHAT;
    struct gen_choice *c = &g->ch[i];
    cJSON *doc = envelope(g, chat ? "chat.completion.chunk" : "text_completion"), *choices, *ch, *delta, *tc;
    char *t = text ? strndup(text, len) : NULL, *rs = reasoning ? strndup(reasoning, rlen) : NULL;
    bool ok = doc && (!text || t) && (!reasoning || rs) && (choices = cJSON_AddArrayToObject(doc, "choices")) &&
              (ch = cJSON_CreateObject()) && cJSON_AddItemToArray(choices, ch) &&
              cJSON_AddNumberToObject(ch, "index", i);
    if (ok && chat) {
        ok = (delta = cJSON_AddObjectToObject(ch, "delta")) &&
             (!role || (cJSON_AddStringToObject(delta, "role", "assistant") && cJSON_AddNullToObject(delta, "refusal"))) &&
             (!t || cJSON_AddStringToObject(delta, "content", t)) &&
             (!rs || cJSON_AddStringToObject(delta, "reasoning_content", rs));
        if (ok && tools_from >= 0)
            ok = (tc = tool_calls(c, tools_from, true)) && cJSON_AddItemToObject(delta, "tool_calls", tc);
        int n_lp = lp_ready(c);
        if (ok && n_lp > 0 && !finish) {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs"), *arr;
            ok = lp && (arr = lp_take(c, n_lp)) && cJSON_AddItemToObject(lp, "content", arr);
        } else if (ok) {
            ok = cJSON_AddNullToObject(ch, "logprobs");
        }
    } else if (ok) {
        ok = cJSON_AddStringToObject(ch, "text", t ? t : "");
        if (ok && c->c_tokens && cJSON_GetArraySize(c->c_tokens) > 0) {
            cJSON *lp = completion_logprobs(c);
            ok = lp && cJSON_AddItemToObject(ch, "logprobs", lp);
        } else if (ok) {
            ok = cJSON_AddNullToObject(ch, "logprobs");
        }
    }
    ok = ok && (finish ? cJSON_AddStringToObject(ch, "finish_reason", finish) != NULL
                       : cJSON_AddNullToObject(ch, "finish_reason") != NULL);
    if (ok && g->q.include_usage)
        ok = cJSON_AddNullToObject(doc, "usage") != NULL;
    free(t);
    free(rs);
    if (!ok) {
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

static int events(struct gen *g)
{
    for (int i = 0; i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        if (!c->head_sent && g->ep == OAI_CHAT) {
            if (gen_sse_event(g, NULL, chunk(g, i, "", 0, NULL, 0, -1, NULL, true)) < 0)
                return -1;
        } else if (!c->head_sent && g->echo_len > 0) {
            /* completions' echo: the prompt text comes first, as in the non-streamed text */
            if (gen_sse_event(g, NULL, chunk(g, i, g->echo, g->echo_len, NULL, 0, -1, NULL, false)) < 0)
                return -1;
        }
        c->head_sent = true;
        bool lp_pending = lp_ready(c) > 0 ||
                          (c->c_tokens && cJSON_GetArraySize(c->c_tokens) > 0);
        int n_tools = cJSON_GetArraySize(c->tool_calls);
        bool text = c->content.len > c->sent_content, reason = c->reasoning.len > c->sent_reasoning;
        if (text || reason || lp_pending || n_tools > c->sent_tools) {
            cJSON *doc = chunk(g, i, text || (!reason && n_tools == c->sent_tools) ? c->content.p + c->sent_content : NULL,
                               c->content.len - c->sent_content, reason ? c->reasoning.p + c->sent_reasoning : NULL,
                               c->reasoning.len - c->sent_reasoning, n_tools > c->sent_tools ? c->sent_tools : -1,
                               NULL, false);
            if (gen_sse_event(g, NULL, doc) < 0)
                return -1;
            c->sent_content = c->content.len;
            c->sent_reasoning = c->reasoning.len;
            c->sent_tools = n_tools;
        }
        if (c->finished && !c->finish_sent && g->rc == 0) {
            if (gen_sse_event(g, NULL, chunk(g, i, g->ep == OAI_CHAT ? NULL : "", 0, NULL, 0, -1,
                                             gen_finish_openai(c->finish), false)) < 0)
                return -1;
            c->finish_sent = true;
        }
    }
    return 0;
}

/* The events after the last choice: an error (a failed job), the usage chunk, [DONE]. */
static int tail(struct gen *g)
{
    if (g->rc < 0 || g->aborted) {
        char *body = oai_error_json(&g->err);
        int rc = body && gen_sse_raw(g, "data: ", 6) == 0 && gen_sse_raw(g, body, strlen(body)) == 0 &&
                         gen_sse_raw(g, "\n\n", 2) == 0
                     ? 0
                     : -1;
        free(body);
        if (rc < 0)
            return -1;
    } else if (g->q.include_usage) {
        cJSON *doc = envelope(g, g->ep == OAI_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON *u = usage_object(g);
        if (!doc || !u || !cJSON_AddArrayToObject(doc, "choices") || !cJSON_AddItemToObject(doc, "usage", u)) {
            cJSON_Delete(u);
            cJSON_Delete(doc);
            return -1;
        }
        if (gen_sse_event(g, NULL, doc) < 0)
            return -1;
    }
    return gen_sse_raw(g, "data: [DONE]\n\n", 14);
}

static const struct gen_dialect k_openai = {full, events, tail, NULL};

enum MHD_Result srv_generate(struct server *s, struct MHD_Connection *c, struct srv_req *r, enum oai_endpoint ep)
{
    struct oai_error err;
    struct oai_request q;
    struct gen *g;
    if (oai_request_parse(&q, ep, r->body ? r->body : "", r->len, r->model->m.n_vocab, &err) < 0)
        return srv_reply_error(c, r, &err);
    if (gen_new(&g, s, c, r, ep, &q, ep == OAI_CHAT ? "chatcmpl" : "cmpl", &k_openai, &err) < 0)
        return srv_reply_error(c, r, &err);
    return gen_serve(g);
}
