/*
 * gen: one generation below the wire format (gen.h).
 *
 * The connection thread "pumps": it reads the tokens the engine appended to
 * each job (the runner lock held only to read the counts), turns them into
 * text (textout: stop strings, hold-back), splits the text that is final into
 * content / reasoning / tool calls (outparse, when the request asked for
 * tools or the template reasons), records logprobs, and ends a choice at a
 * stop string (cancelling its job), at EOS or at max_tokens.
 *
 * Non-streamed, the thread pumps until every choice ends and the dialect
 * renders one document. Streamed, the response is a libmicrohttpd callback
 * whose reader pumps and asks the dialect for the events of what changed.
 * While it waits, the thread looks at the socket: a client that went away has
 * its jobs cancelled at once. Server shutdown cancels them too.
 */
#include "gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../grammar/grammar.h"
#include "../models/vision.h"
#include "image_fetch.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"

#define WAIT_MS 50           /* longest wait before looking at the socket again */

int gbuf_add(struct gbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

// ---- set-up ----

void gen_free(struct gen *g)
{
    if (!g)
        return;
    if (g->submitted) {
        /* the runner owns submitted jobs until done: cancel and wait */
        runner_lock(g->model->m.runner);
        for (int i = 0; i < g->n; i++)
            runner_cancel_locked(g->model->m.runner, &g->ch[i].job);
        for (;;) {
            bool all = true;
            for (int i = 0; i < g->n; i++)
                all &= g->ch[i].job.done;
            if (all)
                break;
            runner_wait_locked(g->model->m.runner, &g->cv, WAIT_MS);
        }
        runner_unlock(g->model->m.runner);
    }
    for (int i = 0; g->ch && i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        runner_job_release(&c->job);
        grammar_state_free(c->gstate);
        textout_free(&c->out);
        outparse_free(c->op);
        free(c->content.p);
        free(c->reasoning.p);
        cJSON_Delete(c->tool_calls);
        cJSON_Delete(c->lp);
        cJSON_Delete(c->c_tokens);
        cJSON_Delete(c->c_lps);
        cJSON_Delete(c->c_tops);
        cJSON_Delete(c->c_offsets);
    }
    if (g->cv_init)
        pthread_cond_destroy(&g->cv);
    free(g->ch);
    grammar_free(g->gram);
    free(g->prompt);
    if (g->imgs.su)
        image_input_free(&g->imgs);
    free(g->echo);
    free(g->bias);
    free(g->alt);
    free(g->sse.p);
    if (g->dstate && g->d->free_state)
        g->d->free_state(g->dstate);
    oai_request_free(&g->q);
    srv_model_release(g->model);
    free(g);
}

static int oom(struct oai_error *err)
{
    return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* Code points in n bytes of UTF-8 (the bytes that do not continue a character). */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* The request's images decoded (bounded: image.h's defaults, the bytes by OAI_MAX_IMAGE_BYTES)
 * and processed into g->imgs; 400 naming the part for an image that does not decode, naming
 * the model when it takes no images. */
static int take_images(struct gen *g, struct oai_error *err)
{
    const struct server_model *m = &g->model->m;
    if (!m->images)
        return oai_errorf(err, 400, "invalid_request_error", NULL, g->q.images[0].param,
                          "the model '%s' does not take images%s%s", m->id ? m->id : "",
                          m->images_error ? ": " : " (it has no vision tower)",
                          m->images_error ? m->images_error : "");
    image_input_init(&g->imgs, m->images);
    for (int i = 0; i < g->q.n_images; i++) {
        struct oai_image *qi = &g->q.images[i];
        struct image im = {0};
        struct err e = {0};
        int rc;
        if (qi->url && !g->s->o.allow_image_urls)
            return oai_errorf(err, 400, "invalid_request_error", NULL, qi->param,
                              "image URLs are not fetched by this server (start it with `mlxcel serve "
                              "--allow-image-urls` for that): send the image as a data: URL "
                              "(data:image/png;base64,...)");
        if (qi->url && (rc = image_fetch(qi->url, OAI_MAX_IMAGE_BYTES, &qi->data, &qi->len, &e)) < 0)
            return rc == -ERR_NOMEM ? oom(err)
                                    : oai_errorf(err, 400, "invalid_request_error", NULL, qi->param, "%s", e.msg);
        rc = image_decode(&im, qi->data, qi->len, NULL, &e);
        if (rc == 0) {
            rc = image_input_add(&g->imgs, &im, &e);
            image_free(&im);
        }
        if (rc == -ERR_NOMEM)
            return oom(err);
        if (rc < 0)
            return oai_errorf(err, 400, "invalid_request_error", NULL, qi->param, "the image could not be used: %s",
                              e.msg);
    }
    return 0;
}

/* Each image's run of image tokens in the n prompt ids (the jobs' images); 400 when they do
 * not match (a placeholder the template did not write, or image tokens written as text). */
static int image_rows(struct gen *g, size_t n, struct oai_error *err)
{
    struct err e = {0};
    int32_t pos[IMAGE_INPUT_MAX];
    if (!g->imgs.su && g->q.n_images == 0) {
        /* a text prompt: image tokens written as text are no image */
        struct image_input none;
        image_input_init(&none, g->model->m.images);
        if (image_input_runs(&none, g->prompt, n, pos, &e) < 0)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "messages",
                              "the prompt holds image tokens without images: %s", e.msg);
        return 0;
    }
    if (image_input_runs(&g->imgs, g->prompt, n, pos, &e) < 0)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "messages",
                          "%s: the chat template writes each image's placeholder, and the text may not hold one",
                          e.msg);
    /* each image's pixels where image_input put them; a grid for images of their own size */
    bool grid = g->model->m.images->m->vision->info.merge > 0;
    for (int k = 0; k < g->imgs.n_img; k++) {
        g->simg[k] = (struct sched_image){pos[k], g->imgs.pixels + g->imgs.off[k], {0, 0, 0}};
        if (grid)
            memcpy(g->simg[k].grid, g->imgs.grid[k], sizeof g->simg[k].grid);
    }
    return 0;
}

/* Prompt ids: the chat template's text encoded without special tokens (as transformers'
 * apply_chat_template(tokenize=True)); a completion's text with them; or its ids. */
static int build_prompt(struct gen *g, struct oai_error *err)
{
    const struct server_model *m = &g->model->m;
    struct err e = {0};
    char *text = NULL;
    size_t len = 0, n = 0;
    int rc;
    if (g->ep == OAI_CHAT) {
        if (g->q.n_images > 0 && take_images(g, err) < 0)
            return -1;
        if (!m->tmpl)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "messages",
                              "this model has no chat template: use /v1/completions");
        /* the template sees the tools (unless tool_choice is none) and chat_template_kwargs */
        cJSON *extra = g->q.template_kwargs ? cJSON_Duplicate(g->q.template_kwargs, true) : cJSON_CreateObject();
        if (!extra || (g->q.tools && g->q.tool_choice != OAI_TOOL_CHOICE_NONE &&
                       !cJSON_AddItemToObject(extra, "tools", cJSON_Duplicate(g->q.tools, true)))) {
            cJSON_Delete(extra);
            return oom(err);
        }
        if (outparse_detect_short_ids(chat_tmpl_source(m->tmpl)) && outparse_shorten_ids(g->q.messages) < 0) {
            cJSON_Delete(extra);
            return oom(err);
        }
        rc = chat_tmpl_apply(m->tmpl, g->q.messages, true, extra, &text, &len, &e);
        cJSON_Delete(extra);
        if (rc == 0 && g->q.n_images > 0) {
            /* as transformers' processor: each placeholder the template wrote becomes the
             * image's tokens in the text, then the whole prompt is tokenized */
            char *sub = NULL;
            size_t sub_len = 0;
            rc = image_input_substitute(&g->imgs, text, len, &sub, &sub_len, &e);
            free(text);
            text = sub;
            len = sub_len;
            if (rc < 0)
                return oom(err);
        }
        if (rc == 0 && m->reasoning)
            g->in_reasoning = outparse_prompt_opens_reasoning(text, len);
        if (rc < 0)
            return rc == -ERR_NOMEM ? oom(err)
                                    : oai_errorf(err, 400, "invalid_request_error", NULL, "messages",
                                                 "the chat template failed: %s", e.msg);
        rc = tok_encode(m->tok, text, len, false, &g->prompt, &n, &e);
        free(text);
    } else if (g->q.prompt_ids) {
        n = (size_t)g->q.n_prompt_ids;
        g->prompt = malloc(n * sizeof *g->prompt);
        if (!g->prompt)
            return oom(err);
        memcpy(g->prompt, g->q.prompt_ids, n * sizeof *g->prompt);
        rc = 0;
        if (g->q.echo && tok_decode(m->tok, g->prompt, n, true, &g->echo, &e) < 0)
            return oom(err);
    } else {
        rc = tok_encode(m->tok, g->q.prompt, g->q.prompt_len, true, &g->prompt, &n, &e);
        if (rc == 0 && g->q.echo && !(g->echo = strdup(g->q.prompt)))
            return oom(err);
    }
    if (rc < 0)
        return rc == -ERR_NOMEM ? oom(err)
                                : oai_errorf(err, 400, "invalid_request_error", NULL,
                                             g->ep == OAI_CHAT ? "messages" : "prompt", "%s", e.msg);
    if (m->images && image_rows(g, n, err) < 0)
        return -1;
    if (g->echo) {
        g->echo_len = strlen(g->echo);
        g->echo_chars = utf8_chars(g->echo, g->echo_len);
    }
    g->n_prompt = (int)n;
    if (n == 0)
        return oai_errorf(err, 400, "invalid_request_error", NULL, g->ep == OAI_CHAT ? "messages" : "prompt",
                          "the prompt is empty");
    return 0;
}

int gen_count_prompt(struct srv_model *sm, enum oai_endpoint ep, const struct oai_request *q, int *n,
                     struct oai_error *err)
{
    /* a generation that only builds its prompt: q is read, never freed, through the copy */
    struct gen g = {.model = sm, .ep = ep, .q = *q};
    int rc = build_prompt(&g, err);
    free(g.prompt);
    if (g.imgs.su)
        image_input_free(&g.imgs);
    free(g.echo);
    *n = rc < 0 ? 0 : g.n_prompt;
    return rc < 0 ? -1 : 0;
}

/* max_tokens within the context: an explicit value that does not fit is an error, as
 * OpenAI's; without one, generation may fill the context. */
static int plan_tokens(struct gen *g, int *n_predict, struct oai_error *err)
{
    int ctx = g->model->m.n_ctx;
    if (g->n_prompt >= ctx && !(g->n_prompt == ctx && g->q.max_tokens == 0))
        return oai_errorf(err, 400, "invalid_request_error", "context_length_exceeded",
                          g->ep == OAI_CHAT ? "messages" : "prompt",
                          "this model's maximum context length is %d tokens, but the %s has %d tokens", ctx,
                          g->ep == OAI_CHAT ? "conversation" : "prompt", g->n_prompt);
    if (g->q.max_tokens >= 0 && (long)g->n_prompt + g->q.max_tokens > ctx)
        return oai_errorf(err, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                          "this model's maximum context length is %d tokens, but %d tokens were requested "
                          "(%d in the prompt, %d for the completion)", ctx, g->n_prompt + g->q.max_tokens,
                          g->n_prompt, g->q.max_tokens);
    *n_predict = g->q.max_tokens >= 0 ? g->q.max_tokens : ctx - g->n_prompt;
    return 0;
}

/* Sampling: the request's fields, else generation_config.json's, else OpenAI's defaults. */
static int plan_sampling(struct gen *g, struct sampler_params *sp, struct oai_error *err)
{
    const struct generation_defaults *d = &g->model->m.gen;
    const struct oai_request *q = &g->q;
    sampler_params_default(sp);
    sp->temperature = q->has_temperature ? q->temperature : d->temperature >= 0 ? d->temperature : 1.0f;
    sp->top_p = q->has_top_p ? q->top_p : d->top_p >= 0 ? d->top_p : 1.0f;
    sp->top_k = q->has_top_k ? q->top_k : d->top_k >= 0 ? d->top_k : 0;
    sp->min_p = q->has_min_p ? q->min_p : d->min_p >= 0 ? d->min_p : 0.0f;
    sp->repeat_penalty = q->has_repetition_penalty ? q->repetition_penalty
                         : d->repeat_penalty >= 0  ? d->repeat_penalty : 1.0f;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    if (q->n_bias > 0) {
        g->bias = malloc((size_t)q->n_bias * sizeof *g->bias);
        if (!g->bias)
            return oom(err);
        for (int i = 0; i < q->n_bias; i++)
            g->bias[i] = (struct sampler_bias){q->bias[i].id, q->bias[i].bias};
        sp->bias = g->bias;
        sp->n_bias = q->n_bias;
    }
    if (q->has_seed) {
        sp->seed = q->seed;
    } else if (getrandom(&sp->seed, sizeof sp->seed, GRND_NONBLOCK) != sizeof sp->seed) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sp->seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)g;
    }
    struct err e = {0};
    if (sampler_params_check(sp, &e) < 0)
        return oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "%s", e.msg);
    return 0;
}


// ---- pumping tokens into text ----

/* {"token", "logprob", "bytes"}: token the text, bytes the n bytes of raw. */
static cJSON *lp_entry(const char *text, size_t len, const char *raw, size_t n, float lp)
{
    cJSON *o = cJSON_CreateObject(), *b;
    char *t = strndup(text, len);
    bool ok = o && t && cJSON_AddStringToObject(o, "token", t) && cJSON_AddNumberToObject(o, "logprob", lp) &&
              (b = cJSON_AddArrayToObject(o, "bytes"));
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    free(t);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* A chat logprob entry for token id whose text (the characters it completes) is text[len].
 * Where tokens split a UTF-8 character, "token" is "" on the tokens before the last and
 * the whole character on the one that completes it, so the tokens concatenate to the
 * content; "bytes" is always the token's own bytes (as OpenAI gives them), so they
 * concatenate to the content's bytes. held: text of earlier tokens is waiting for this one.
 * A token that splits nothing carries its text's bytes (the same bytes, after what the
 * decoder does to them: a leading space stripped, a special token skipped). */
static cJSON *chat_lp_entry(const struct gen *g, int32_t id, bool held, const char *text, size_t len, float lp)
{
    char own[TOK_TOKEN_BYTES_MAX];
    const struct tokenizer *tok = g->model->m.tok;
    if ((held || len == 0) && id >= 0 && id < tok_vocab_size(tok) && !tok_is_special(tok, id)) {
        int n = tok_token_bytes(tok, id, own, sizeof own);
        return lp_entry(text, len, own, n > 0 ? (size_t)n : 0, lp);
    }
    return lp_entry(text, len, text, len, lp);
}

/* The logprob record of token k of choice c (before its text is pushed: alternatives are
 * decoded in the same context). */
static int record_logprobs(struct gen *g, struct gen_choice *c, int k, const char *piece, size_t piece_len,
                           size_t offset)
{
    const struct runner_job *j = &c->job;
    char *alt_buf = g->alt;
    if (g->ep == OAI_CHAT) {
        bool held = c->out.ts.n_ids > c->out.ts.n_ctx;  /* the stream as before the token */
        cJSON *e = chat_lp_entry(g, j->ids[k], held, piece, piece_len, j->lp[k]), *tops;
        if (!e || !cJSON_AddItemToArray(c->lp, e) || !(tops = cJSON_AddArrayToObject(e, "top_logprobs")))
            return -1;
        for (int t = 0; t < j->n_top; t++) {
            int32_t id = j->top_id[(size_t)k * j->n_top + t];
            int w = id == j->ids[k] ? -2 : textout_peek(&c->out, id, alt_buf, TOK_STREAM_CAP);
            float lp = j->top_lp[(size_t)k * j->n_top + t];
            cJSON *a = w == -2 ? chat_lp_entry(g, id, held, piece, piece_len, lp)
                               : chat_lp_entry(g, id, held, alt_buf, w > 0 ? (size_t)w : 0, lp);
            if (!a || !cJSON_AddItemToArray(tops, a))
                return -1;
        }
        return 0;
    }
    char *t = strndup(piece, piece_len);
    cJSON *tops = cJSON_CreateObject();
    bool ok = t && tops && cJSON_AddItemToArray(c->c_tokens, cJSON_CreateString(t)) &&
              cJSON_AddItemToArray(c->c_lps, cJSON_CreateNumber(j->lp[k])) &&
              cJSON_AddItemToArray(c->c_offsets, cJSON_CreateNumber((double)offset));
    free(t);
    for (int a = 0; ok && a < j->n_top; a++) {
        int32_t id = j->top_id[(size_t)k * j->n_top + a];
        int w = id == j->ids[k] ? -2 : textout_peek(&c->out, id, alt_buf, TOK_STREAM_CAP);
        char *key = w == -2 ? strndup(piece, piece_len) : strndup(alt_buf, w > 0 ? (size_t)w : 0);
        ok = key && (cJSON_GetObjectItemCaseSensitive(tops, key) ||
                     cJSON_AddNumberToObject(tops, key, j->top_lp[(size_t)k * j->n_top + a]));
        free(key);
    }
    if (!ok || !cJSON_AddItemToArray(c->c_tops, tops)) {
        if (!ok)
            cJSON_Delete(tops);
        return -1;
    }
    return 0;
}

/* The output parser of a choice: tool calls when the request gave tools, reasoning when the
 * template emits <think>; none (all content) otherwise. */
static int parser_new(struct gen *g, struct gen_choice *c, struct oai_error *err)
{
    const struct server_model *m = &g->model->m;
    if (g->ep != OAI_CHAT || !m->tmpl)
        return 0;
    bool tools = g->q.tools && g->q.tool_choice != OAI_TOOL_CHOICE_NONE;
    /* ids as the dialect's clients know them; 9 alphanumerics where the template demands them
     * (an Anthropic client's toolu_ ids are shortened when they come back: outparse_shorten_ids) */
    enum outparse_ids ids = g->q.anthropic ? OUTPARSE_IDS_ANTHROPIC
                            : outparse_detect_short_ids(chat_tmpl_source(m->tmpl)) ? OUTPARSE_IDS_MISTRAL
                                                                                   : OUTPARSE_IDS_OPENAI;
    struct outparse_opts o = {.format = tools ? (enum outparse_format)g->tool_format : OUTPARSE_NONE,
                              .reasoning = m->reasoning, .ids = ids,
                              .in_reasoning = g->in_reasoning, .tools = tools ? g->q.tools : NULL};
    if (o.format == OUTPARSE_NONE && !o.reasoning)
        return 0;
    struct err e = {0};
    if (outparse_new(&c->op, &o, &e) < 0)
        return oai_errorf(err, 500, "server_error", NULL, NULL, "output parser: %s", e.msg);
    return 0;
}

static int emit_event(void *ud, const struct outparse_event *ev)
{
    struct gen_choice *c = ud;
    switch (ev->kind) {
    case OUTPARSE_TEXT: return gbuf_add(&c->content, ev->text, ev->len);
    case OUTPARSE_REASONING: return gbuf_add(&c->reasoning, ev->text, ev->len);
    case OUTPARSE_TOOL_CALL: {
        cJSON *t = cJSON_CreateObject();
        char *args = strndup(ev->text, ev->len);
        bool added = t && cJSON_AddItemToArray(c->tool_calls, t);
        bool ok = added && args && cJSON_AddStringToObject(t, "id", ev->id) &&
                  cJSON_AddStringToObject(t, "name", ev->name) && cJSON_AddStringToObject(t, "arguments", args);
        if (!added)
            cJSON_Delete(t);
        free(args);
        return ok ? 0 : -1;
    }
    }
    return 0;
}

/* Hands the text that became final to the parser (or straight to content). */
static int feed_ready(struct gen_choice *c)
{
    size_t ready = textout_ready(&c->out);
    if (ready <= c->fed)
        return 0;
    const char *t = c->out.text + c->fed;
    size_t n = ready - c->fed;
    c->fed = ready;
    if (!c->op)
        return gbuf_add(&c->content, t, n);
    return outparse_feed(c->op, t, n, emit_event, c) < 0 ? -1 : 0;
}

static enum gen_finish finish_of(enum gen_stop st)
{
    return st == GEN_STOP_LENGTH || st == GEN_STOP_CONTEXT ? GEN_FINISH_LENGTH : GEN_FINISH_STOP;
}

const char *gen_finish_openai(enum gen_finish f)
{
    switch (f) {
    case GEN_FINISH_LENGTH: return "length";
    case GEN_FINISH_TOOL_CALLS: return "tool_calls";
    default: return "stop";
    }
}

/* The decoder's last flush (bytes of an unfinished character, as U+FFFD) belongs to the
 * last token's logprob entry, so the entries' tokens still concatenate to the content (the
 * entries after the last complete character are held back from the stream for this). */
static int lp_flushed(struct gen_choice *c, size_t before)
{
    int n = c->lp ? cJSON_GetArraySize(c->lp) : 0;
    if (n == 0 || c->out.len <= before)
        return 0;
    cJSON *tok = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(c->lp, n - 1), "token");
    size_t old = strlen(tok->valuestring), add = c->out.len - before;
    char *t = malloc(old + add + 1);
    if (!t)
        return -1;
    memcpy(t, tok->valuestring, old);
    memcpy(t + old, c->out.text + before, add);
    t[old + add] = '\0';
    bool ok = cJSON_SetValuestring(tok, t) != NULL;
    free(t);
    return ok ? 0 : -1;
}

/* A choice's text is complete: flush the parser; tool calls decide the finish reason. */
static int finish_choice(struct gen *g, struct gen_choice *c, enum gen_finish f)
{
    struct err e = {0};
    size_t before = c->out.len;
    c->finished = true;
    c->finish = f;
    if (textout_finish(&c->out, &e) < 0 || lp_flushed(c, before) < 0 || feed_ready(c) < 0 ||
        (c->op && outparse_finish(c->op, emit_event, c) < 0)) {
        g->rc = -1;
        oom(&g->err);
        return -1;
    }
    if (c->out.stopped && c->out.stop_idx >= 0)
        c->stop_seq = g->q.stop[c->out.stop_idx];
    if (cJSON_GetArraySize(c->tool_calls) > 0 && f == GEN_FINISH_STOP)
        c->finish = GEN_FINISH_TOOL_CALLS;
    /* structured output the grammar could not finish is cut short, not a stop */
    if (c->finish == GEN_FINISH_STOP && c->gstate && grammar_state_cut(c->gstate))
        c->finish = GEN_FINISH_LENGTH;
    return 0;
}

/* Turns the tokens the engine produced into text for every choice, at most `limit` tokens
 * per choice (0: all of them); ends choices. Returns whether anything changed. Failures set
 * g->rc / g->err. A stream takes one token at a time, so each token gets its own event (as
 * OpenAI's, vLLM's and llama-server's streams do) however far the engine has run ahead. */
static bool pump(struct gen *g, int limit)
{
    struct runner *run = g->model->m.runner;
    bool changed = false;
    for (int i = 0; i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        if (c->finished)
            continue;
        runner_lock(run);
        int n_out = c->job.n_out;
        bool done = c->job.done;
        runner_unlock(run);
        if (limit > 0 && n_out - c->consumed > limit) {
            n_out = c->consumed + limit;
            done = false;
        }
        /* entries below n_out are written before n_out grows and never change */
        for (; c->consumed < n_out && !c->finished; c->consumed++) {
            int k = c->consumed;
            const char *piece;
            /* completions' text_offset counts characters, as OpenAI's and vLLM's (Python's len) */
            size_t plen, offset = g->echo_chars + c->lp_chars;
            struct err e = {0};
            /* logprob alternatives are decoded against the text before this token */
            struct tok_stream before = c->out.ts;
            int st = textout_push(&c->out, c->job.ids[k], &piece, &plen, &e);
            if (st < 0) {
                g->rc = -1;
                oai_errorf(&g->err, 500, "server_error", NULL, NULL, "decoding the output failed: %s", e.msg);
                return true;
            }
            if (c->job.logprobs) {
                struct tok_stream saved = c->out.ts;
                c->out.ts = before;  /* alternatives see the stream state before the token */
                int lr = record_logprobs(g, c, k, piece, plen, offset);
                c->lp_chars += utf8_chars(piece, plen);
                c->out.ts = saved;
                if (lr < 0) {
                    g->rc = -1;
                    oom(&g->err);
                    return true;
                }
            }
            changed = true;
            if (st == 1) {
                c->consumed++;
                runner_lock(run);
                runner_cancel_locked(run, &c->job);
                runner_unlock(run);
                finish_choice(g, c, GEN_FINISH_STOP);
                break;
            }
            if (feed_ready(c) < 0) {
                g->rc = -1;
                oom(&g->err);
                return true;
            }
        }
        if (!c->finished && done && c->consumed == n_out) {
            changed = true;
            if (c->job.rc < 0) {
                g->rc = -1;
                oai_errorf(&g->err, 500, "server_error", NULL, NULL, "generation failed: %s", c->job.err.msg);
                c->finished = true;
                continue;
            }
            finish_choice(g, c, finish_of(c->job.stats.stop));
        }
    }
    return changed;
}

/* The parameters of tool t as a forced call enforces them (a new tree, NULL: out of memory):
 * read as OpenAI's strict mode reads them, no keys beyond the listed ones unless the schema
 * says otherwise (a small model would otherwise invent keys), and an object. */
static cJSON *call_params(const cJSON *t)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "parameters");
    cJSON *args = params ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
    bool ok = args != NULL;
    if (ok && cJSON_GetObjectItemCaseSensitive(args, "properties") &&
        !cJSON_GetObjectItemCaseSensitive(args, "additionalProperties"))
        ok = cJSON_AddFalseToObject(args, "additionalProperties") != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(args, "type") && !cJSON_GetObjectItemCaseSensitive(args, "$ref") &&
        !cJSON_GetObjectItemCaseSensitive(args, "anyOf") && !cJSON_GetObjectItemCaseSensitive(args, "oneOf") &&
        !cJSON_GetObjectItemCaseSensitive(args, "allOf"))
        ok = cJSON_AddStringToObject(args, "type", "object") != NULL;
    if (!ok) {
        cJSON_Delete(args);
        return NULL;
    }
    return args;
}

_Static_assert(OAI_MAX_TOOLS <= GRAMMAR_MAX_CALLS, "a forced call must be able to choose among every tool");

/* Structured output: response_format's JSON (any object, or a schema), or a forced tool call
 * (tool_choice required: one of the tools; named: that one) in the template's tool-call
 * format (a template without one gets Hermes' <tool_call> wrapper, which the output parser
 * then reads). A forced call is {"name": ..., "arguments": ...}, name first, each tool's
 * parameters compiled against their own root ("#/$defs/..." refs) and named in errors by
 * the request's path. The grammar masks every token that would leave it. */
static int plan_grammar(struct gen *g, struct oai_error *err)
{
    const struct server_model *m = &g->model->m;
    const struct oai_request *q = &g->q;
    bool forced = q->tools && (q->tool_choice == OAI_TOOL_CHOICE_REQUIRED || q->tool_choice == OAI_TOOL_CHOICE_NAMED);
    if (!forced && q->format == OAI_FORMAT_TEXT)
        return 0;
    if (g->ep != OAI_CHAT)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "response_format",
                          "structured output needs a chat request");
    struct grammar_opts o = {.eos_ids = m->hp->eos_ids, .n_eos = m->hp->n_eos, .vocab = m->gvocab};
    struct grammar_call calls[GRAMMAR_MAX_CALLS];
    char where[GRAMMAR_MAX_CALLS][64];
    int n = 0, i = 0, rc = 0;
    bool nomem = false;
    const cJSON *t;
    const char *param = forced ? "tools" : "response_format";
    if (forced) {
        if (g->tool_format == OUTPARSE_NONE)
            g->tool_format = OUTPARSE_HERMES;
        static const char *const k_wrap[][2] = {
            [OUTPARSE_HERMES] = {"<tool_call>\n", "\n</tool_call>"},
            [OUTPARSE_LLAMA3] = {NULL, NULL},
            [OUTPARSE_MISTRAL] = {"[TOOL_CALLS][", "]"},
        };
        o.prefix = k_wrap[g->tool_format][0];
        o.suffix = k_wrap[g->tool_format][1];
        o.args_key = g->tool_format == OUTPARSE_LLAMA3 ? "parameters" : "arguments";
        cJSON_ArrayForEach(t, q->tools) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            if (n < GRAMMAR_MAX_CALLS &&
                (q->tool_choice == OAI_TOOL_CHOICE_REQUIRED || strcmp(name->valuestring, q->tool_choice_name) == 0)) {
                snprintf(where[n], sizeof where[n], q->tools_where ? q->tools_where : "tools[%d].function.parameters", i);
                calls[n] = (struct grammar_call){.name = name->valuestring, .params = call_params(t), .where = where[n]};
                nomem |= !calls[n++].params;
            }
            i++;
        }
        o.calls = calls;
        o.n_calls = n;
    } else {
        o.any_object = q->format == OAI_FORMAT_JSON_OBJECT;
    }
    struct err e = {0};
    if (!nomem)
        rc = grammar_compile(&g->gram, forced ? NULL : q->format_schema, m->tok, &o, &e);
    for (int k = 0; k < n; k++)
        cJSON_Delete((cJSON *)calls[k].params);
    if (nomem || rc == -ERR_NOMEM)
        return oom(err);
    if (rc < 0)
        return oai_errorf(err, 400, "invalid_request_error", NULL, param, "%s: %s",
                          forced ? "the tool's parameters cannot be enforced" : "the JSON schema cannot be enforced",
                          e.msg);
    return 0;
}

static int gen_prepare(struct gen *g, struct oai_error *err)
{
    g->tool_format = g->model->m.tool_format;
    if (plan_grammar(g, err) < 0)
        return -1;
    int n_predict = 0, rc;
    struct sampler_params sp;
    if ((rc = build_prompt(g, err)) < 0 || (rc = plan_tokens(g, &n_predict, err)) < 0 ||
        (rc = plan_sampling(g, &sp, err)) < 0)
        return -1;
    g->n = g->q.n;
    g->ch = calloc((size_t)g->n, sizeof *g->ch);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    g->cv_init = pthread_cond_init(&g->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!g->ch || !g->cv_init || (g->q.logprobs && !(g->alt = malloc(TOK_STREAM_CAP))))
        return oom(err);
    for (int i = 0; i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        struct err e = {0};
        c->job.prompt = g->prompt;
        c->job.n_prompt = g->n_prompt;
        c->job.images = g->imgs.n_img ? g->simg : NULL;
        c->job.n_images = g->imgs.n_img;
        c->job.params = (struct gen_params){.n_predict = n_predict, .ignore_eos = g->q.ignore_eos, .sampling = sp,
                                            .spec = g->model->m.spec};
        c->job.params.sampling.seed = sp.seed + (uint64_t)i;  /* n choices differ, a seed reproduces them */
        if (srv_lora_params(&g->model->m, &g->q, &c->job.params, err) < 0)
            return -1;
        if (g->gram) {
            if (grammar_state_new(&c->gstate, g->gram, &e) < 0)
                return oom(err);
            c->job.params.sampling.cons = (struct constraint){&grammar_constraint_ops, c->gstate};
        }
        c->job.logprobs = g->q.logprobs;
        c->job.n_top = g->q.top_logprobs;
        c->job.cv = &g->cv;
        /* special tokens stay out of the text, except where the tool-call parser reads them
         * (Mistral's [TOOL_CALLS], Llama's <|python_tag|> are special tokens) */
        bool keep_special = g->q.tools && g->q.tool_choice != OAI_TOOL_CHOICE_NONE && g->tool_format != OUTPARSE_NONE;
        if (textout_init(&c->out, g->model->m.tok, !keep_special, (const char *const *)g->q.stop, g->q.stop_len, g->q.n_stop,
                         &e) < 0)
            return oom(err);
        if (!(c->tool_calls = cJSON_CreateArray()) || gbuf_add(&c->content, "", 0) < 0 ||
            gbuf_add(&c->reasoning, "", 0) < 0)
            return oom(err);
        if (parser_new(g, c, err) < 0)
            return -1;
        if (g->q.logprobs && g->ep == OAI_CHAT && !(c->lp = cJSON_CreateArray()))
            return oom(err);
        if (g->q.logprobs && g->ep == OAI_COMPLETIONS &&
            (!(c->c_tokens = cJSON_CreateArray()) || !(c->c_lps = cJSON_CreateArray()) ||
             !(c->c_tops = cJSON_CreateArray()) || !(c->c_offsets = cJSON_CreateArray())))
            return oom(err);
    }
    return 0;
}

/* Whether any choice has a token or has ended (the engine took the request in). */
static bool started(struct gen *g)
{
    struct runner *run = g->model->m.runner;
    bool any = g->ch[0].job.params.n_predict == 0;
    runner_lock(run);
    for (int i = 0; i < g->n && !any; i++)
        any = g->ch[i].job.n_out > 0 || g->ch[i].job.done;
    runner_unlock(run);
    return any;
}

static bool all_finished(const struct gen *g)
{
    for (int i = 0; i < g->n; i++)
        if (!g->ch[i].finished)
            return false;
    return true;
}

/* Waits (bounded) for the engine; false when the client left or the server stops: the jobs
 * are then cancelled and the generation is aborted. */
static bool wait_engine(struct gen *g)
{
    struct runner *run = g->model->m.runner;
    runner_lock(run);
    bool news = false;
    for (int i = 0; i < g->n && !news; i++)
        news = !g->ch[i].finished && (g->ch[i].job.n_out > g->ch[i].consumed || g->ch[i].job.done);
    if (!news)
        runner_wait_locked(run, &g->cv, WAIT_MS);
    runner_unlock(run);
    /* waiting for the engine is not idleness: setting the timeout restarts its clock, so a
     * request queued or generating longer than --timeout is still answered */
    MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);  /* libmicrohttpd restarts */
    MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)g->s->o.timeout_s);  /* the clock from 0 */
    if (atomic_load(&g->s->stopping) || srv_client_gone(g->conn)) {
        g->aborted = true;
        runner_lock(run);
        for (int i = 0; i < g->n; i++)
            runner_cancel_locked(run, &g->ch[i].job);
        runner_unlock(run);
        return false;
    }
    return true;
}

int gen_usage(const struct gen *g, int *completion)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += g->ch[i].consumed;
    *completion = n;
    return g->n_prompt;
}

int gen_cached(const struct gen *g)
{
    return g->ch[0].job.done ? g->ch[0].job.stats.n_cached : 0;
}

int gen_drafted(const struct gen *g, int *accepted)
{
    int d = 0, a = 0;
    for (int i = 0; g->submitted && i < g->n; i++)
        if (g->ch[i].job.done) {
            d += g->ch[i].job.stats.n_drafted;
            a += g->ch[i].job.stats.n_accepted;
        }
    *accepted = a;
    return d;
}

static void note_stats(struct gen *g)
{
    if (!g->r)
        return;
    int comp;
    g->r->n_prompt = gen_usage(g, &comp);
    g->r->n_gen = comp;
    const struct runner_job *j = &g->ch[0].job;
    if (j->t_first > 0) {
        g->r->ttft = j->t_first - g->t_start;
        if (g->ch[0].consumed > 1)
            g->r->itl = (gen_now() - j->t_first) / (g->ch[0].consumed - 1);
    }
}

/* The request's final usage into the metrics, once, before the end of its answer is handed
 * to the client (so a /metrics read after the answer sees it). */
static void count_usage(struct gen *g)
{
    note_stats(g);
    if (g->r && !g->r->tokens_counted) {
        metrics_tokens(&g->s->metrics, g->r->n_prompt, g->r->n_gen);
        g->r->tokens_counted = true;
    }
}

// ---- streaming ----

int gen_sse_raw(struct gen *g, const char *s, size_t n)
{
    return gbuf_add(&g->sse, s, n);
}

int gen_sse_event(struct gen *g, const char *name, cJSON *doc)
{
    char *txt = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    int rc = txt && (!name || (gen_sse_raw(g, "event: ", 7) == 0 && gen_sse_raw(g, name, strlen(name)) == 0 &&
                               gen_sse_raw(g, "\n", 1) == 0)) &&
                     gen_sse_raw(g, "data: ", 6) == 0 && gen_sse_raw(g, txt, strlen(txt)) == 0 &&
                     gen_sse_raw(g, "\n\n", 2) == 0
                 ? 0
                 : -1;
    free(txt);
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct gen *g = cls;
    (void)pos;
    for (;;) {
        if (g->sse_off < g->sse.len) {
            size_t n = g->sse.len - g->sse_off < max ? g->sse.len - g->sse_off : max;
            memcpy(buf, g->sse.p + g->sse_off, n);
            g->sse_off += n;
            if (g->sse_off == g->sse.len)
                g->sse_off = g->sse.len = 0;
            return (ssize_t)n;
        }
        if (g->ended) {
            note_stats(g);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        bool alive = true;
        if (!pump(g, 1) && !all_finished(g) && g->rc == 0)
            alive = wait_engine(g);
        if (!alive && srv_client_gone(g->conn))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->d->events(g) < 0) {
            g->rc = -1;
            g->ended = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (all_finished(g) || g->rc < 0 || g->aborted) {
            if (g->aborted)
                oai_errorf(&g->err, 503, "server_error", NULL, NULL, "the request was cancelled");
            if (g->d->tail(g) < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            g->ended = true;
            count_usage(g);
        }
    }
}

/* libmicrohttpd frees the response before or after the request's completion callback
 * (srv_generate_end), on the same thread: whichever runs first unlinks the other. */
static void stream_free(void *cls)
{
    struct gen *g = cls;
    if (g->r) {
        note_stats(g);
        g->r->stream = NULL;
    }
    gen_free(g);
}

// ---- creating and serving ----

int gen_new(struct gen **out, struct server *s, struct MHD_Connection *c, struct srv_req *r,
            enum oai_endpoint ep, struct oai_request *q, const char *id_prefix, const struct gen_dialect *d,
            struct oai_error *err)
{
    *out = NULL;
    struct gen *g = calloc(1, sizeof *g);
    if (!g) {
        oai_request_free(q);
        return oom(err);
    }
    g->s = s;
    g->model = r->model;  /* a stream's generation may outlive the request: its own reference */
    srv_model_retain(g->model);
    g->conn = c;
    g->r = r;
    g->d = d;
    g->ep = ep;
    g->t_start = r->t_start;
    g->created = (long)time(NULL);
    snprintf(g->id, sizeof g->id, "%s-%016llx", id_prefix, (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    g->q = *q;
    oai_request_init(q);
    if (g->q.model && strcmp(g->q.model, g->model->id) != 0) {
        oai_errorf(err, 404, "invalid_request_error", "model_not_found", "model",
                   "the model '%.64s' does not exist; this server serves '%s'", g->q.model, g->model->id);
        gen_free(g);
        return -1;
    }
    if (gen_prepare(g, err) < 0) {
        gen_free(g);
        return -1;
    }
    r->n_prompt = g->n_prompt;
    r->n_gen = 0;
    *out = g;
    return 0;
}

enum MHD_Result gen_serve(struct gen *g)
{
    struct server *s = g->s;
    struct MHD_Connection *c = g->conn;
    struct srv_req *r = g->r;
    struct oai_error err;
    if (g->ch[0].job.params.n_predict == 0) {
        /* max_tokens 0 (a completion that only echoes): nothing to run */
        for (int i = 0; i < g->n; i++)
            if (finish_choice(g, &g->ch[i], GEN_FINISH_LENGTH) < 0)
                break;
    } else {
        struct runner_job *jobs[OAI_MAX_N];
        for (int i = 0; i < g->n; i++)
            jobs[i] = &g->ch[i].job;
        struct err e = {0};
        bool busy;
        if (runner_submit(g->model->m.runner, jobs, g->n, &busy, &e) < 0) {
            if (busy)
                oai_errorf(&err, 429, "rate_limit_error", "rate_limit_exceeded", NULL, "%s; retry later", e.msg);
            else
                oai_errorf(&err, e.code == ERR_NOMEM ? 500 : 503, "server_error", NULL, NULL, "%s", e.msg);
            goto fail;
        }
        g->submitted = true;
    }
    if (g->q.stream && srv_client_gone(c)) {
        /* the client closed its side with the request: nobody will read the stream */
        gen_free(g);
        r->status = 499;
        return MHD_NO;
    }
    /* a stream's 200 goes out once its generation has begun: a request still waiting in the
     * queue when the server stops is answered 503 JSON, as a non-streamed one is, not a 200
     * whose stream is nothing but an error event */
    while (g->q.stream && !started(g) && wait_engine(g))
        ;
    if (g->q.stream && !g->aborted) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 << 10, stream_read, g,
                                                                      stream_free);
        if (!resp) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        r->stream = g;
        enum MHD_Result ok = srv_queue(c, r, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);  /* g now belongs to the response: stream_free frees it */
        return ok;
    }
    while (!all_finished(g) && g->rc == 0) {
        if (!pump(g, 0) && !all_finished(g) && g->rc == 0 && !wait_engine(g))
            break;
    }
    count_usage(g);
    if (g->aborted && !atomic_load(&s->stopping)) {
        /* the client closed its side (EOF, as a disconnect: uvicorn and llama-server read it
         * the same way): nobody to answer; the connection is closed */
        gen_free(g);
        r->status = 499;
        return MHD_NO;
    }
    if (g->aborted) {
        oai_errorf(&err, 503, "server_error", NULL, NULL, "the server is shutting down");
        goto fail;
    }
    if (g->rc < 0) {
        err = g->err;
        goto fail;
    }
    cJSON *doc = g->d->full(g);
    gen_free(g);
    return srv_reply_json(c, r, 200, doc);
fail:;
    /* the route chose the dialect's error shape (srv_req.error_json) */
    enum MHD_Result ok = srv_reply_error(c, r, &err);
    gen_free(g);
    return ok;
}

void srv_generate_end(struct server *s, struct srv_req *r)
{
    (void)s;
    if (r->stream) {
        note_stats(r->stream);
        r->stream->r = NULL;  /* the response (and the generation) may outlive the request */
    }
    r->stream = NULL;
}
