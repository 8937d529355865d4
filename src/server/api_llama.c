/*
 * api_llama: POST /completion (and /completions) and POST /infill, the
 * completion routes of llama-server (tools/server), over gen (gen.h).
 *
 * The body is read with llama-server's field names into a struct
 * oai_request (n_predict -> max_tokens, repeat_penalty, n_probs -> logprobs,
 * logit_bias as [[id, bias]] or {"id": bias}, n_cmpl / n); the prompt is
 * tokenized here, as llama-server's tokenize_mixed does (a string, token ids,
 * or both in one array; the first element, when a string, gets the
 * tokenizer's special tokens), and handed to gen as token ids. Sampling the
 * request leaves out comes from generation_config.json, else llama-server's
 * defaults (llama_default_sampling). An n_predict beyond the context is cut
 * to it, as llama-server's slot stops at its context (truncated: true).
 * Samplers this engine lacks (mirostat, typical_p, DRY, XTC, dynamic
 * temperature, grammars) are refused with 400 when set to anything but their
 * off value, rather than silently ignored.
 *
 * /infill builds llama-server's fill-in-the-middle prompt (format_prompt_infill,
 * prefix-suffix-middle order): [extra context][BOS][PRE]prefix prompt[SUF]
 * suffix[MID], with the repo-level pattern (<|fim_repo|>, <|file_sep|>) when
 * the vocabulary has those tokens. FIM tokens are found in the vocabulary by
 * the names llama.cpp's vocab looks for (Qwen's <|fim_prefix|>, CodeLlama's
 * ▁<PRE>, DeepSeek's, Granite's, GLM's); without them /infill is 501.
 *
 * api_llama_dialect.c renders the answers (llama-server's objects and
 * stream).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../tokenizer/tokenizer.h"
#include "api_llama.h"
#include "gen.h"

#define LLAMA_MAX_EXTRA 1024         /* input_extra chunks */
#define LLAMA_INFILL_BATCH 2048      /* llama-server's n_batch default, for the FIM budget */

static int bad(struct oai_error *err, const char *fmt, const char *name)
{
    return oai_errorf(err, 400, "invalid_request_error", NULL, name, fmt, name);
}

static int oom(struct oai_error *err)
{
    return oai_errorf(err, 500, "server_error", NULL, NULL, "out of memory");
}

// ---- token ids ----


static int ids_push(struct ids *b, const int32_t *v, size_t n, struct oai_error *err)
{
    if (b->n + n > OAI_MAX_PROMPT_IDS)
        return oai_errorf(err, 400, "invalid_request_error", NULL, NULL, "the prompt holds more than %d tokens",
                          OAI_MAX_PROMPT_IDS);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p)
            return oom(err);
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, v, n * sizeof *v);
    b->n += n;
    return 0;
}

/* The last n ids of src (n <= src->n) onto b. */
static int ids_push_tail(struct ids *b, const struct ids *src, size_t n, struct oai_error *err)
{
    return n ? ids_push(b, src->p + (src->n - n), n, err) : 0;
}

static int ids_push1(struct ids *b, int32_t id, struct oai_error *err)
{
    return ids_push(b, &id, 1, err);
}

/* text encoded (special tokens added when add_special) onto b. */
static int encode(const struct server_model *m, const char *text, bool add_special, struct ids *b, const char *what,
                  struct oai_error *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    struct err e = {0};
    int rc = tok_encode(m->tok, text, strlen(text), add_special, &ids, &n, &e);
    if (rc < 0)
        return rc == -ERR_NOMEM ? oom(err)
                                : oai_errorf(err, 400, "invalid_request_error", NULL, what, "%s: %s", what, e.msg);
    rc = ids_push(b, ids, n, err);
    free(ids);
    return rc;
}

/* llama-server's tokenize_mixed: a string, or an array of token ids and strings, onto b; the
 * first element, when a string, gets the special tokens with add_special. */
static int tokenize_mixed(const struct server_model *m, const cJSON *v, bool add_special, struct ids *b, const char *what,
                          struct oai_error *err)
{
    if (cJSON_IsString(v))
        return encode(m, v->valuestring, add_special, b, what, err);
    if (!cJSON_IsArray(v))
        return bad(err, "\"%s\" must be a string or an array of token ids and strings", what);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (cJSON_IsString(e)) {
            if (encode(m, e->valuestring, add_special && i == 0, b, what, err) < 0)
                return -1;
        } else if (cJSON_IsNumber(e)) {
            double d = e->valuedouble;
            if (!(d >= 0 && d < m->n_vocab && d == (double)(int32_t)d))
                return oai_errorf(err, 400, "invalid_request_error", NULL, what,
                                  "\"%s\"[%d] is not a token id in [0, %d)", what, i, m->n_vocab);
            if (ids_push1(b, (int32_t)d, err) < 0)
                return -1;
        } else {
            return oai_errorf(err, 400, "invalid_request_error", NULL, what,
                              "\"%s\"[%d] must be a token id or a string", what, i);
        }
        i++;
    }
    return 0;
}

/* One prompt: a string, token ids, ids and strings (llama-server's "single" shapes). */
static bool is_single(const cJSON *p)
{
    if (cJSON_IsString(p))
        return true;
    bool num = false, other = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
        num |= cJSON_IsNumber(e);
        other |= !cJSON_IsNumber(e) && !cJSON_IsString(e);
    }
    return cJSON_IsArray(p) && !other && (num || !p->child);
}

/* {"prompt_string", "multimodal_data"}: the text (images go through /v1/chat/completions). */
static int prompt_object(const struct server_model *m, const cJSON *p, struct ids *b, struct oai_error *err)
{
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(p, "multimodal_data");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prompt_string");
    if (mm && !cJSON_IsNull(mm) && !(cJSON_IsArray(mm) && !mm->child))
        return bad(err, "\"%s\" is not supported on /completion: send images to /v1/chat/completions",
                   "multimodal_data");
    if (!cJSON_IsString(ps))
        return bad(err, "\"%s\" must be a string", "prompt_string");
    return encode(m, ps->valuestring, true, b, "prompt", err);
}

/* One element of a list of prompts: a string, ids and strings, or {"prompt_string"}. */
static int one_prompt(const struct server_model *m, const cJSON *p, struct ids *b, struct oai_error *err)
{
    if (cJSON_IsObject(p))
        return prompt_object(m, p, b, err);
    if (!is_single(p))
        return bad(err, "\"%s\" must be a string, a list of tokens, a list of mixed strings & tokens, or a list "
                   "of prompts", "prompt");
    return tokenize_mixed(m, p, true, b, "prompt", err);
}

/* The request's prompts as token ids (llama-server's tokenize_input_prompts): one (a
 * string, ids, ids and strings, an object), or a list of them (strings, id arrays,
 * objects), at most OAI_MAX_N. */
static int parse_prompts(const struct server_model *m, const cJSON *in, struct ids *b, int *n_prompts,
                         struct oai_error *err)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(in, "prompt"), *e;
    *n_prompts = 0;
    if (!p || cJSON_IsNull(p))
        return bad(err, "\"%s\" is required", "prompt");
    if (!cJSON_IsString(p) && !cJSON_IsArray(p) && !cJSON_IsObject(p))
        return bad(err, "\"%s\" must be a string, a list of tokens, a list of mixed strings & tokens, or a list "
                   "of prompts", "prompt");
    if (cJSON_IsObject(p) || is_single(p)) {
        *n_prompts = 1;
        return one_prompt(m, p, &b[0], err);
    }
    int n = cJSON_GetArraySize(p);
    if (n > OAI_MAX_N)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "prompt",
                          "\"prompt\" holds %d prompts; at most %d in one request", n, OAI_MAX_N);
    cJSON_ArrayForEach(e, p) {
        if (one_prompt(m, e, &b[(*n_prompts)++], err) < 0)
            return -1;
    }
    return 0;
}

// ---- the other fields ----


/* Member name: 0 absent (or null), 1 present, -1 with *err when not a finite number. */
static int num(const cJSON *in, const char *name, double *out, struct oai_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(err, "\"%s\" must be a number", name);
    *out = v->valuedouble;
    return 1;
}

/* An integer member within [lo, hi] (same returns as num). */
static int integer(const cJSON *in, const char *name, double lo, double hi, long long *out, struct oai_error *err)
{
    double d = 0;
    int rc = num(in, name, &d, err);
    if (rc <= 0)
        return rc;
    if (d != floor(d))
        return bad(err, "\"%s\" must be an integer", name);
    if (d < lo || d > hi)
        return oai_errorf(err, 400, "invalid_request_error", NULL, name, "\"%s\" must be within [%.0f, %.0f]",
                          name, lo, hi);
    *out = (long long)d;
    return 1;
}

static int boolean(const cJSON *in, const char *name, bool *out, struct oai_error *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, name);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return bad(err, "\"%s\" must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

/* Samplers this engine lacks: refused unless set to their off value. */
static int refuse_unsupported(const cJSON *in, struct oai_error *err)
{
    static const struct {
        const char *name;
        double off;
    } k_off[] = {{"mirostat", 0}, {"typical_p", 1}, {"dynatemp_range", 0}, {"xtc_probability", 0},
                 {"dry_multiplier", 0}};
    for (size_t i = 0; i < sizeof k_off / sizeof k_off[0]; i++) {
        double v = k_off[i].off;
        int rc = num(in, k_off[i].name, &v, err);
        if (rc < 0)
            return rc;
        if (v != k_off[i].off)
            return bad(err, "\"%s\" is not supported by this server (its sampler has no such stage)", k_off[i].name);
    }
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(in, "grammar");
    if (g && !cJSON_IsNull(g) && !(cJSON_IsString(g) && !*g->valuestring))
        return bad(err, "\"%s\" is not supported on this route: use /v1/chat/completions with response_format",
                   "grammar");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(in, "json_schema");
    if (js && !cJSON_IsNull(js))
        return bad(err, "\"%s\" is not supported on this route: use /v1/chat/completions with response_format",
                   "json_schema");
    const cJSON *lora = cJSON_GetObjectItemCaseSensitive(in, "lora");
    if (lora && !cJSON_IsNull(lora) && !cJSON_IsArray(lora))
        return bad(err, "\"%s\" must be an array of objects with 'id' and 'scale' fields", "lora");
    if (cJSON_IsArray(lora) && lora->child)
        return bad(err, "\"%s\": per-request LoRA adapters are not supported on this route", "lora");
    bool post = false;
    if (boolean(in, "post_sampling_probs", &post, err) < 0)
        return -1;
    if (post)
        return bad(err, "\"%s\" is not supported: n_probs reports the log-probabilities before sampling",
                   "post_sampling_probs");
    return 0;
}

/* stop: an array of strings (empty ones skipped, as llama-server does). */
static int parse_stop(const cJSON *in, struct oai_request *q, struct oai_error *err)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(in, "stop"), *e;
    if (!st || cJSON_IsNull(st))
        return 0;
    if (!cJSON_IsArray(st))
        return bad(err, "\"%s\" must be an array of strings", "stop");
    cJSON_ArrayForEach(e, st) {
        if (!cJSON_IsString(e))
            return bad(err, "\"%s\" must be an array of strings", "stop");
        size_t n = strlen(e->valuestring);
        if (n == 0)
            continue;
        if (q->n_stop == OAI_MAX_STOP || n > OAI_MAX_STOP_LEN)
            return oai_errorf(err, 400, "invalid_request_error", NULL, "stop",
                              "\"stop\" holds at most %d strings of at most %d bytes", OAI_MAX_STOP, OAI_MAX_STOP_LEN);
        if (!(q->stop[q->n_stop] = strdup(e->valuestring)))
            return oom(err);
        q->stop_len[q->n_stop++] = n;
    }
    return 0;
}

/* One logit_bias entry: key an id or a text (its tokens), value a number or false (banned).
 * Ids outside the vocabulary are skipped, as llama-server skips them. */
static int add_bias(const struct server_model *m, const cJSON *key, const char *skey, const cJSON *val,
                    struct oai_request *q, struct oai_error *err)
{
    float bias;
    if (cJSON_IsNumber(val) && isfinite(val->valuedouble))
        bias = (float)fmax(-SAMPLER_MAX_BIAS, fmin(SAMPLER_MAX_BIAS, val->valuedouble));
    else if (cJSON_IsFalse(val))
        bias = -SAMPLER_MAX_BIAS;  /* llama-server's -inf: the token is never sampled */
    else
        return bad(err, "\"%s\" values must be numbers or false", "logit_bias");
    struct ids ids = {0};
    char *end = NULL;
    double d = key ? key->valuedouble : skey && *skey ? strtod(skey, &end) : -1;
    bool is_id = key ? cJSON_IsNumber(key) : end && *end == '\0';
    if (is_id) {
        if (d >= 0 && d < m->n_vocab && d == floor(d) && ids_push1(&ids, (int32_t)d, err) < 0)
            return -1;
    } else if (encode(m, key ? key->valuestring : skey, false, &ids, "logit_bias", err) < 0) {
        free(ids.p);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ids.n; i++) {
        if (q->n_bias == OAI_MAX_BIAS) {
            rc = oai_errorf(err, 400, "invalid_request_error", NULL, "logit_bias",
                            "\"logit_bias\" holds more than %d tokens", OAI_MAX_BIAS);
            break;
        }
        q->bias[q->n_bias++] = (struct oai_bias){ids.p[i], bias};
    }
    free(ids.p);
    return rc;
}

static int parse_bias(const struct server_model *m, const cJSON *in, struct oai_request *q, struct oai_error *err)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(in, "logit_bias"), *e;
    if (!lb || cJSON_IsNull(lb))
        return 0;
    if (!cJSON_IsArray(lb) && !cJSON_IsObject(lb))
        return bad(err, "\"%s\" must be an array of [token, bias] pairs or an object", "logit_bias");
    if (!(q->bias = malloc(OAI_MAX_BIAS * sizeof *q->bias)))
        return oom(err);
    cJSON_ArrayForEach(e, lb) {
        int rc;
        if (cJSON_IsObject(lb)) {
            rc = add_bias(m, NULL, e->string, e, q, err);
        } else {
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 ||
                !(cJSON_IsNumber(e->child) || cJSON_IsString(e->child)))
                return bad(err, "\"%s\" entries must be [token id or text, bias]", "logit_bias");
            rc = add_bias(m, e->child, NULL, e->child->next, q, err);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Sampling: the request's values over llama_default_sampling's. */
static int parse_sampling(const struct server_model *m, const cJSON *in, struct oai_request *q, struct oai_error *err)
{
    struct sampler_params d;
    llama_default_sampling(m, &d);
    double t = d.temperature, tp = d.top_p, mp = d.min_p, rp = d.repeat_penalty, pp = 0, fp = 0;
    long long tk = d.top_k, seed = -1;
    if (num(in, "temperature", &t, err) < 0 || num(in, "top_p", &tp, err) < 0 || num(in, "min_p", &mp, err) < 0 ||
        num(in, "repeat_penalty", &rp, err) < 0 || num(in, "presence_penalty", &pp, err) < 0 ||
        num(in, "frequency_penalty", &fp, err) < 0 || integer(in, "top_k", -1e18, 1e18, &tk, err) < 0 ||
        integer(in, "seed", -1, 9007199254740992.0, &seed, err) < 0)
        return -1;
    /* llama-server: a temperature <= 0 is greedy, top_k <= 0 and top_p >= 1 are off */
    q->has_temperature = q->has_top_p = q->has_top_k = q->has_min_p = q->has_repetition_penalty = true;
    q->temperature = t > 0 ? (float)t : 0.0f;
    q->top_k = tk > 0 ? (int)(tk < (1 << 24) ? tk : (1 << 24)) : 0;
    q->top_p = tp < 1 ? (float)tp : 1.0f;
    q->min_p = mp > 0 ? (float)mp : 0.0f;
    q->repetition_penalty = (float)rp;
    q->presence_penalty = (float)pp;
    q->frequency_penalty = (float)fp;
    q->has_seed = true;
    q->seed = (uint64_t)seed;
    if (seed < 0 || (unsigned long long)seed == LLAMA_SEED_RANDOM) {
        /* a random seed of llama-server's 32 bits, reported in generation_settings so that
         * sending it back reproduces the completion */
        uint32_t r32;
        if (getrandom(&r32, sizeof r32, GRND_NONBLOCK) != sizeof r32) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r32 = (uint32_t)(ts.tv_nsec ^ ts.tv_sec * 2654435761u);
        }
        q->seed = r32 == LLAMA_SEED_RANDOM ? 0 : r32;
    }
    return 0;
}

/* Every field but the prompt into q and lo. */
static int parse_options(const struct server *s, const struct server_model *m, const cJSON *in, struct oai_request *q, struct lopts *lo,
                         struct oai_error *err)
{
    long long np = -1, n = 1, probs = 0;
    bool cache = true;
    int max_n = s->o.parallel < OAI_MAX_N ? s->o.parallel : OAI_MAX_N;
    /* n_predict, else max_completion_tokens, else max_tokens (llama-server's order) */
    int rc = integer(in, "n_predict", -1e18, 1e18, &np, err);
    if (rc == 0)
        rc = integer(in, "max_completion_tokens", -1e18, 1e18, &np, err);
    if (rc == 0)
        rc = integer(in, "max_tokens", -1e18, 1e18, &np, err);
    if (rc < 0)
        return -1;
    if (np < -1)
        return bad(err, "\"%s\" must be -1 (no limit) or a count of tokens >= 0", "n_predict");
    rc = integer(in, "n_cmpl", 1, 1e9, &n, err);
    if (rc == 0)
        rc = integer(in, "n", 1, 1e9, &n, err);
    if (rc < 0)
        return -1;
    if (n > max_n)
        return oai_errorf(err, 400, "invalid_request_error", NULL, "n_cmpl",
                          "n_cmpl cannot be greater than the number of slots (%d), please increase -np", max_n);
    if (integer(in, "n_probs", 0, RUNNER_MAX_TOP, &probs, err) < 0 || boolean(in, "stream", &q->stream, err) < 0 ||
        boolean(in, "cache_prompt", &cache, err) < 0 || boolean(in, "return_tokens", &lo->return_tokens, err) < 0 ||
        boolean(in, "ignore_eos", &q->ignore_eos, err) < 0 || refuse_unsupported(in, err) < 0 ||
        parse_sampling(m, in, q, err) < 0 || parse_stop(in, q, err) < 0 || parse_bias(m, in, q, err) < 0)
        return -1;
    lo->n_predict = np > 1 << 30 ? 1 << 30 : (int)np;
    lo->n_probs = (int)probs;
    q->n = (int)n;
    q->logprobs = probs > 0;
    q->top_logprobs = (int)probs;
    return 0;
}

// ---- running a request ----

/* 400 exceed_context_size_error with llama-server's extra fields. */
static enum MHD_Result reply_context(struct MHD_Connection *c, struct srv_req *r, int n_prompt, int n_ctx)
{
    char body[320];
    int n = snprintf(body, sizeof body, "{\"error\":{\"code\":400,\"message\":\"the request exceeds the available "
                     "context size (%d tokens in the prompt, %d in the context), try increasing it\","
                     "\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":%d,\"n_ctx\":%d}}",
                     n_prompt, n_ctx, n_prompt, n_ctx);
    return srv_reply(c, r, 400, "application/json", body, (size_t)n, NULL, NULL);
}

static void free_prompts(struct ids *b, int n)
{
    for (int i = 0; i < n; i++)
        free(b[i].p);
}

/* Runs n_prompts prompts (b, moved into the generation) q->n times each with q and lo;
 * answers. Choice i runs prompt i / q->n with the request's seed + i % q->n, so the same
 * prompt twice gives the same completion, as llama-server's tasks of one request do. */
static enum MHD_Result run(struct server *s, struct MHD_Connection *c, struct srv_req *r, struct oai_request *q,
                           struct ids *b, int n_prompts, const struct lopts *lo)
{
    const struct server_model *m = &r->model->m;   /* the model answering (router mode: the body's) */
    struct oai_error err;
    struct gen *g;
    struct lstate *st = NULL;
    int ctx = m->n_ctx, n_cmpl = q->n, total = n_prompts * n_cmpl;
    if (total > OAI_MAX_N) {
        oai_errorf(&err, 400, "invalid_request_error", NULL, "prompt", "%d prompts x n_cmpl %d: at most %d "
                   "completions in one request", n_prompts, n_cmpl, OAI_MAX_N);
        goto fail;
    }
    for (int k = 0; k < n_prompts; k++) {
        if (b[k].n == 0) {
            bad(&err, "\"%s\" is empty", "prompt");
            goto fail;
        }
        if ((long)b[k].n >= ctx) {
            free_prompts(b, n_prompts);
            oai_request_free(q);
            return reply_context(c, r, (int)b[k].n, ctx);
        }
    }
    st = calloc(1, sizeof *st);
    if (!st || !(st->sent = calloc((size_t)total, sizeof *st->sent)) ||
        !(st->prompts = calloc((size_t)n_prompts, sizeof *st->prompts)) ||
        !(q->prompt_ids = malloc(b[0].n * sizeof *q->prompt_ids))) {
        oom(&err);
        goto fail;
    }
    /* gen builds its prompt (the log's count) from the first; each job gets its own below */
    memcpy(q->prompt_ids, b[0].p, b[0].n * sizeof *q->prompt_ids);
    q->n_prompt_ids = (int)b[0].n;
    q->max_tokens = lo->n_predict < 0 || lo->n_predict > ctx - (int)b[0].n ? ctx - (int)b[0].n : lo->n_predict;
    q->n = total;
    if (gen_new(&g, s, c, r, OAI_COMPLETIONS, q, "cmpl", &llama_dialect, &err) < 0)
        goto fail;
    st->o = *lo;
    memcpy(st->prompts, b, (size_t)n_prompts * sizeof *b);
    st->n_prompts = n_prompts;
    g->dstate = st;
    uint64_t seed = g->ch[0].job.params.sampling.seed;
    for (int i = 0; i < total; i++) {
        struct runner_job *j = &g->ch[i].job;
        const struct ids *p = &st->prompts[i / n_cmpl];
        int room = ctx - (int)p->n;
        j->prompt = p->p;
        j->n_prompt = (int)p->n;
        if (j->params.n_predict > 0)  /* 0: nothing runs (n_predict 0) */
            j->params.n_predict = lo->n_predict < 0 || lo->n_predict > room ? room : lo->n_predict;
        j->params.sampling.seed = seed + (uint64_t)(i % n_cmpl);
    }
    return gen_serve(g);
fail:
    free_prompts(b, n_prompts);
    oai_request_free(q);
    if (st) {
        st->n_prompts = 0;
        llama_state_free(st);
    }
    return srv_reply_error(c, r, &err);
}

enum MHD_Result srv_llama_completion(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    const struct server_model *m = &r->model->m;   /* the model answering (router mode: the body's) */
    struct oai_error err;
    struct oai_request q;
    struct ids b[OAI_MAX_N] = {{0}};
    struct lopts lo = {.n_predict = -1};
    int n_prompts = 0;
    cJSON *in = oai_parse_object(r->body ? r->body : "", r->len, &err);
    if (!in)
        return srv_reply_error(c, r, &err);
    oai_request_init(&q);
    q.endpoint = OAI_COMPLETIONS;
    int rc = parse_prompts(m, in, b, &n_prompts, &err);
    if (rc == 0)
        rc = parse_options(s, m, in, &q, &lo, &err);
    cJSON_Delete(in);
    if (rc < 0) {
        free_prompts(b, OAI_MAX_N);
        oai_request_free(&q);
        return srv_reply_error(c, r, &err);
    }
    return run(s, c, r, &q, b, n_prompts, &lo);
}

// ---- /infill ----

/* The FIM tokens, by the names llama.cpp's vocab looks for (llama-vocab.cpp); -1: none. */
struct fim {
    int32_t pre, suf, mid, rep, sep;
};

static int32_t first_piece(const struct tokenizer *t, const char *const *names)
{
    for (; *names; names++) {
        int32_t id = tok_piece_to_id(t, *names);
        if (id >= 0)
            return id;
    }
    return -1;
}

static void fim_find(const struct tokenizer *t, struct fim *f)
{
    static const char *const k_pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>",
                                        "<PRE>", "▁<PRE>", "<|code_prefix|>", NULL};
    static const char *const k_suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
                                        "<SUF>", "▁<SUF>", "<|code_suffix|>", NULL};
    static const char *const k_mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>",
                                        "<MID>", "▁<MID>", "<|code_middle|>", NULL};
    static const char *const k_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
    static const char *const k_sep[] = {"<|file_sep|>", NULL};
    f->pre = first_piece(t, k_pre);
    f->suf = first_piece(t, k_suf);
    f->mid = first_piece(t, k_mid);
    f->rep = first_piece(t, k_rep);
    f->sep = first_piece(t, k_sep);
}

/* input_extra: an array of {"text": string, "filename"?: string}. */
static int check_extra(const cJSON *x, struct oai_error *err)
{
    const cJSON *e;
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) > LLAMA_MAX_EXTRA)
        return bad(err, "\"%s\" must be an array of {\"filename\": string, \"text\": string} (at most 1024)",
                   "input_extra");
    cJSON_ArrayForEach(e, x) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "text"), *f = cJSON_GetObjectItemCaseSensitive(e, "filename");
        if (!cJSON_IsString(t))
            return bad(err, "extra_context chunk must contain a \"text\" field with a string value", "input_extra");
        if (f && !cJSON_IsString(f))
            return bad(err, "extra_context chunk's \"filename\" field must be a string", "input_extra");
    }
    return 0;
}

/* The extra context tokens (the repo-level pattern when the vocabulary has its tokens). */
static int extra_tokens(const struct server_model *m, const struct fim *f, const cJSON *x, struct ids *b,
                        struct oai_error *err)
{
    /* "\n\n--- snippet ---\n\n": llama-server's separator without FIM_SEP */
    static const char k_snippet[] = "\n\n--- snippet ---\n\n";
    const cJSON *e;
    if (f->rep >= 0 && (ids_push1(b, f->rep, err) < 0 || encode(m, "myproject\n", false, b, "input_extra", err) < 0))
        return -1;
    cJSON_ArrayForEach(e, x) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "filename");
        const char *name = cJSON_IsString(fn) ? fn->valuestring : "tmp";
        if (f->sep >= 0) {
            size_t n = strlen(name);
            char *line = malloc(n + 2);
            if (!line)
                return oom(err);
            memcpy(line, name, n);
            memcpy(line + n, "\n", 2);
            int rc = ids_push1(b, f->sep, err) < 0 ? -1 : encode(m, line, false, b, "input_extra", err);
            free(line);
            if (rc < 0)
                return -1;
        } else if (encode(m, k_snippet, false, b, "input_extra", err) < 0) {
            return -1;
        }
        if (encode(m, cJSON_GetObjectItemCaseSensitive(e, "text")->valuestring, false, b, "input_extra", err) < 0)
            return -1;
    }
    if (f->sep >= 0 && (ids_push1(b, f->sep, err) < 0 || encode(m, "filename\n", false, b, "input_extra", err) < 0))
        return -1;
    return 0;
}

/* Whether the tokenizer's special tokens start with BOS (llama_vocab_get_add_bos). */
static bool adds_bos(const struct tokenizer *t)
{
    int32_t *ids = NULL;
    size_t n = 0;
    bool bos = tok_bos_id(t) >= 0 && tok_encode(t, "", 0, true, &ids, &n, NULL) == 0 && n > 0 && ids[0] == tok_bos_id(t);
    free(ids);
    return bos;
}

/* llama-server's format_prompt_infill (prefix-suffix-middle): the prefix's last 3/4 of the
 * batch, the suffix's first 1/4 less the prompt, the extra context's last tokens in what
 * the context leaves beside the batch and twice the tokens to generate. Its n_batch (2048
 * by default) is taken as min(2048, context / 2) here, and an n_predict of -1 reserves a
 * quarter of that, so the three parts and the generation fit the context. */
static int infill_prompt(const struct server_model *m, const struct fim *f, const cJSON *in, const struct lopts *lo,
                         struct ids *out, struct oai_error *err)
{
    struct ids pre = {0}, suf = {0}, prm = {0}, ext = {0};
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(in, "prompt");
    int ctx = m->n_ctx, rc;
    int n_batch = ctx / 2 < LLAMA_INFILL_BATCH ? ctx / 2 : LLAMA_INFILL_BATCH;
    int reserve = lo->n_predict >= 0 ? lo->n_predict : n_batch / 4;
    rc = tokenize_mixed(m, cJSON_GetObjectItemCaseSensitive(in, "input_prefix"), false, &pre, "input_prefix", err);
    if (rc == 0)
        rc = tokenize_mixed(m, cJSON_GetObjectItemCaseSensitive(in, "input_suffix"), false, &suf, "input_suffix", err);
    if (rc == 0 && cJSON_IsString(p))
        rc = encode(m, p->valuestring, false, &prm, "prompt", err);
    if (rc == 0)
        rc = extra_tokens(m, f, cJSON_GetObjectItemCaseSensitive(in, "input_extra"), &ext, err);
    if (rc == 0) {
        long n_pre = (long)pre.n < 3L * (n_batch / 4) ? (long)pre.n : 3L * (n_batch / 4);
        long room = n_batch / 4 - (2 + (long)prm.n);
        long n_suf = (long)suf.n < (room > 0 ? room : 0) ? (long)suf.n : (room > 0 ? room : 0);
        long avail = (long)ctx - n_batch - 2L * reserve;
        long n_ext = (long)ext.n < (avail > 0 ? avail : 0) ? (long)ext.n : (avail > 0 ? avail : 0);
        rc = ids_push_tail(out, &ext, (size_t)n_ext, err);
        if (rc == 0 && adds_bos(m->tok))
            rc = ids_push1(out, tok_bos_id(m->tok), err);
        if (rc == 0)
            rc = ids_push1(out, f->pre, err);
        if (rc == 0)
            rc = ids_push_tail(out, &pre, (size_t)n_pre, err);
        if (rc == 0)
            rc = ids_push_tail(out, &prm, prm.n, err);
        if (rc == 0)
            rc = ids_push1(out, f->suf, err);
        if (rc == 0)
            rc = n_suf ? ids_push(out, suf.p, (size_t)n_suf, err) : 0;
        if (rc == 0)
            rc = ids_push1(out, f->mid, err);
    }
    free(pre.p);
    free(suf.p);
    free(prm.p);
    free(ext.p);
    return rc;
}

enum MHD_Result srv_llama_infill(struct server *s, struct MHD_Connection *c, struct srv_req *r)
{
    const struct server_model *m = &r->model->m;   /* the model answering (router mode: the body's) */
    struct oai_error err;
    struct oai_request q;
    struct ids b = {0};
    struct lopts lo = {.n_predict = -1};
    struct fim f;
    fim_find(m->tok, &f);
    if (f.pre < 0 || f.suf < 0 || f.mid < 0) {
        oai_errorf(&err, 501, "not_supported_error", NULL, NULL, "Infill is not supported by this model: %s%s%s",
                   f.pre < 0 ? "prefix token is missing. " : "", f.suf < 0 ? "suffix token is missing. " : "",
                   f.mid < 0 ? "middle token is missing. " : "");
        return srv_reply_error(c, r, &err);
    }
    cJSON *in = oai_parse_object(r->body ? r->body : "", r->len, &err);
    if (!in)
        return srv_reply_error(c, r, &err);
    oai_request_init(&q);
    q.endpoint = OAI_COMPLETIONS;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(in, "prompt");
    int rc = 0;
    if (p && !cJSON_IsNull(p) && !cJSON_IsString(p))
        rc = bad(&err, "\"%s\" must be a string", "prompt");
    else if (!cJSON_GetObjectItemCaseSensitive(in, "input_prefix"))
        rc = bad(&err, "\"%s\" is required", "input_prefix");
    else if (!cJSON_GetObjectItemCaseSensitive(in, "input_suffix"))
        rc = bad(&err, "\"%s\" is required", "input_suffix");
    else
        rc = check_extra(cJSON_GetObjectItemCaseSensitive(in, "input_extra"), &err);
    if (rc == 0)
        rc = parse_options(s, m, in, &q, &lo, &err);
    if (rc == 0)
        rc = infill_prompt(m, &f, in, &lo, &b, &err);
    cJSON_Delete(in);
    if (rc < 0) {
        free(b.p);
        oai_request_free(&q);
        return srv_reply_error(c, r, &err);
    }
    return run(s, c, r, &q, &b, 1, &lo);
}
