/*
 * api_llama_dialect: how a generation of llama-server's routes is answered
 * (api_llama.h): the final object of each completion (content, tokens, stop,
 * stop_type, stopping_word, timings, generation_settings, ...; an array of
 * them for several prompts or n_cmpl), and streamed, one `data: {...}` chunk
 * per token (content, tokens, stop: false, completion_probabilities with
 * n_probs), then the final object with stop: true; an error during the
 * stream is `data: {"error": {...}}`; no [DONE], as llama-server sends none
 * on these routes. Field order and names follow llama-server's
 * server_task_result_cmpl_final / _partial::to_json_non_oaicompat.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "api_llama.h"
#include "gen.h"


void llama_state_free(void *p)
{
    struct lstate *st = p;
    if (!st)
        return;
    for (int i = 0; i < st->n_prompts; i++)
        free(st->prompts[i].p);
    free(st->prompts);
    free(st->sent);
    free(st);
}

/* The job is done (its stats final): a choice ended by a stop string has its job cancelled,
 * which ends within one engine step. */
static void wait_done(struct gen *g, struct gen_choice *c)
{
    if (!g->submitted)
        return;
    runner_lock(g->model->m.runner);
    while (!c->job.done)
        runner_wait_locked(g->model->m.runner, &g->cv, 50);
    runner_unlock(g->model->m.runner);
}

/* The longest valid UTF-8 prefix of n bytes (llama-server's validate_utf8). */
static size_t utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = s[i] < 0x80 ? 1 : (s[i] & 0xE0) == 0xC0 ? 2 : (s[i] & 0xF0) == 0xE0 ? 3 : (s[i] & 0xF8) == 0xF0 ? 4 : 0;
        if (k == 0 || i + k > n)
            break;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return i;
        i += k;
    }
    return i;
}

/* {"id", "token", "bytes", "logprob"} of token id. */
static cJSON *prob_entry(const struct gen *g, int32_t id, float lp)
{
    char buf[TOK_TOKEN_BYTES_MAX];
    int n = tok_token_bytes(g->model->m.tok, id, buf, sizeof buf);
    size_t nb = n > 0 ? (size_t)n : 0, nv = utf8_valid((const unsigned char *)buf, nb);
    char *txt = strndup(buf, nv);
    cJSON *o = cJSON_CreateObject(), *b;
    /* llama-server reports log(0) as the lowest float: JSON has no -inf */
    bool ok = o && txt && cJSON_AddNumberToObject(o, "id", id) && cJSON_AddStringToObject(o, "token", txt) &&
              (b = cJSON_AddArrayToObject(o, "bytes"));
    for (size_t i = 0; ok && i < nb; i++)
        ok = cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)buf[i]));
    ok = ok && cJSON_AddNumberToObject(o, "logprob", isfinite(lp) ? lp : -FLT_MAX);
    free(txt);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* completion_probabilities entries of tokens [from, to) of choice c, onto arr. */
static bool add_probs(const struct gen *g, const struct gen_choice *c, int from, int to, cJSON *arr)
{
    const struct runner_job *j = &c->job;
    for (int k = from; k < to; k++) {
        cJSON *e = prob_entry(g, j->ids[k], j->lp[k]), *tops;
        if (!e || !cJSON_AddItemToArray(arr, e) || !(tops = cJSON_AddArrayToObject(e, "top_logprobs")))
            return false;
        for (int t = 0; t < j->n_top; t++) {
            cJSON *a = prob_entry(g, j->top_id[(size_t)k * j->n_top + t], j->top_lp[(size_t)k * j->n_top + t]);
            if (!a || !cJSON_AddItemToArray(tops, a))
                return false;
        }
    }
    return true;
}

static bool add_ids(cJSON *o, const char *name, const int32_t *ids, int from, int to)
{
    cJSON *a = cJSON_AddArrayToObject(o, name);
    for (int k = from; a && k < to; k++)
        if (!cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[k])))
            return false;
    return a != NULL;
}

/* llama-server's timings object. */
static cJSON *timings(const struct gen *g, const struct gen_choice *c)
{
    const struct gen_stats *st = &c->job.stats;
    bool ran = g->submitted;
    double cache_n = ran ? st->n_cached : 0, prompt_n = ran ? c->job.n_prompt - st->n_cached : 0;
    double prompt_ms = ran ? st->t_prompt_s * 1e3 : 0, pred_n = c->consumed, pred_ms = ran ? st->t_gen_s * 1e3 : 0;
    static const char *const k_names[] = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms",
                                          "prompt_per_second", "predicted_n", "predicted_ms",
                                          "predicted_per_token_ms", "predicted_per_second"};
    const double v[] = {cache_n, prompt_n, prompt_ms, prompt_n > 0 ? prompt_ms / prompt_n : 0,
                        prompt_ms > 0 ? 1e3 * prompt_n / prompt_ms : 0, pred_n, pred_ms,
                        pred_n > 0 ? pred_ms / pred_n : 0, pred_ms > 0 ? 1e3 * pred_n / pred_ms : 0};
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < sizeof v / sizeof v[0]; i++)
        if (!cJSON_AddNumberToObject(o, k_names[i], v[i])) {
            cJSON_Delete(o);
            return NULL;
        }
    if (o && ran && st->n_drafted > 0 &&
        (!cJSON_AddNumberToObject(o, "draft_n", st->n_drafted) ||
         !cJSON_AddNumberToObject(o, "draft_n_accepted", st->n_accepted))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *settings(const struct gen *g, const struct gen_choice *c)
{
    const struct lstate *st = g->dstate;
    const struct gen_params *p = &c->job.params;
    struct llama_settings x = {.n_predict = st->o.n_predict, .ignore_eos = p->ignore_eos, .stream = g->q.stream,
                               .spec = p->spec.mode != SPEC_NONE, .n_probs = st->o.n_probs,
                               .stop = (const char *const *)g->q.stop, .n_stop = g->q.n_stop,
                               .bias = p->sampling.bias, .n_bias = p->sampling.n_bias};
    return llama_params_json(&p->sampling, &x, true);
}

/* The final object of choice i (stream: the content and tokens not yet streamed). */
static cJSON *final_object(struct gen *g, int i, bool stream)
{
    const struct lstate *st = g->dstate;
    struct gen_choice *c = &g->ch[i];
    wait_done(g, c);
    size_t from = stream ? c->sent_content : 0;
    char *content = strndup(c->content.p + from, c->content.len - from), *prompt = NULL;
    bool word = c->finish != GEN_FINISH_LENGTH && c->stop_seq;
    const char *stop_type = c->finish == GEN_FINISH_LENGTH ? "limit" : word ? "word" : "eos";
    bool truncated = c->finish == GEN_FINISH_LENGTH && c->job.n_prompt + c->consumed >= g->model->m.n_ctx;
    cJSON *o = cJSON_CreateObject(), *gs = settings(g, c), *tm = timings(g, c), *pr;
    bool ok = o && gs && tm && content &&
              tok_decode(g->model->m.tok, c->job.prompt, (size_t)c->job.n_prompt, false, &prompt, NULL) == 0 &&
              cJSON_AddNumberToObject(o, "index", i) && cJSON_AddStringToObject(o, "content", content) &&
              add_ids(o, "tokens", c->job.ids, 0, !stream && st->o.return_tokens ? c->consumed : 0) &&
              cJSON_AddNumberToObject(o, "id_slot", -1) && cJSON_AddTrueToObject(o, "stop") &&
              cJSON_AddStringToObject(o, "model", g->model->id) &&
              cJSON_AddNumberToObject(o, "tokens_predicted", c->consumed) &&
              cJSON_AddNumberToObject(o, "tokens_evaluated", c->job.n_prompt);
    if (ok) {
        cJSON_AddItemToObject(o, "generation_settings", gs);
        gs = NULL;
    }
    ok = ok && cJSON_AddStringToObject(o, "prompt", prompt) &&
         cJSON_AddBoolToObject(o, "has_new_line", memchr(c->content.p, '\n', c->content.len) != NULL) &&
         cJSON_AddBoolToObject(o, "truncated", truncated) && cJSON_AddStringToObject(o, "stop_type", stop_type) &&
         cJSON_AddStringToObject(o, "stopping_word", word ? c->stop_seq : "") &&
         cJSON_AddNumberToObject(o, "tokens_cached", g->submitted ? c->job.stats.n_cached : 0);
    if (ok) {
        cJSON_AddItemToObject(o, "timings", tm);
        tm = NULL;
    }
    if (ok && !stream && st->o.n_probs > 0)
        ok = (pr = cJSON_AddArrayToObject(o, "completion_probabilities")) && add_probs(g, c, 0, c->consumed, pr);
    free(content);
    free(prompt);
    cJSON_Delete(gs);
    cJSON_Delete(tm);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *full(struct gen *g)
{
    if (g->n == 1)
        return final_object(g, 0, false);
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < g->n; i++) {
        cJSON *o = final_object(g, i, false);
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* A streamed chunk of choice i: the content and tokens since the last one. */
static cJSON *partial(struct gen *g, int i)
{
    struct lstate *st = g->dstate;
    struct gen_choice *c = &g->ch[i];
    char *content = strndup(c->content.p + c->sent_content, c->content.len - c->sent_content);
    cJSON *o = cJSON_CreateObject(), *pr;
    bool ok = o && content && cJSON_AddNumberToObject(o, "index", i) &&
              cJSON_AddStringToObject(o, "content", content) &&
              add_ids(o, "tokens", c->job.ids, st->sent[i], c->consumed) && cJSON_AddFalseToObject(o, "stop") &&
              cJSON_AddNumberToObject(o, "id_slot", -1) && cJSON_AddNumberToObject(o, "tokens_predicted", c->consumed) &&
              cJSON_AddNumberToObject(o, "tokens_evaluated", c->job.n_prompt);
    if (ok && st->o.n_probs > 0)
        ok = (pr = cJSON_AddArrayToObject(o, "completion_probabilities")) && add_probs(g, c, st->sent[i], c->consumed, pr);
    free(content);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    c->sent_content = c->content.len;
    st->sent[i] = c->consumed;
    return o;
}

static int events(struct gen *g)
{
    struct lstate *st = g->dstate;
    for (int i = 0; i < g->n; i++) {
        struct gen_choice *c = &g->ch[i];
        if (c->finish_sent)
            continue;
        if (c->consumed > st->sent[i] && gen_sse_event(g, NULL, partial(g, i)) < 0)
            return -1;
        if (c->finished && g->rc == 0) {
            if (gen_sse_event(g, NULL, final_object(g, i, true)) < 0)
                return -1;
            c->finish_sent = true;
        }
    }
    return 0;
}

/* After the last choice: an error event when the generation failed (llama-server's
 * `data: {"error": {...}}`); no [DONE] on these routes. */
static int tail(struct gen *g)
{
    if (g->rc == 0 && !g->aborted)
        return 0;
    char *body = llama_error_json(&g->err);
    int rc = body && gen_sse_raw(g, "data: ", 6) == 0 && gen_sse_raw(g, body, strlen(body)) == 0 &&
                     gen_sse_raw(g, "\n\n", 2) == 0
                 ? 0
                 : -1;
    free(body);
    return rc;
}

const struct gen_dialect llama_dialect = {full, events, tail, llama_state_free};
