/*
 * scheduler: continuous batching (scheduler.h).
 *
 * A request holds its tokens (prompt, then what it generated) and how many
 * of them are in its cache sequence (n_fed). Every step feeds each running
 * request toks[n_fed .. n_toks) as far as the step's row budget allows (a
 * decoding request has exactly one token to feed, the one it just sampled),
 * asks for logits where a request's feed reaches its last token, and
 * samples those. Decode rows go first, so prefills never delay them; a long
 * prompt is prefilled over several steps.
 *
 * Speculative decoding (gen_params.spec, ADR 0079): a decoding request's row is
 * followed by its draft's rows (within the step's budget), all with logits;
 * after the forward the request's rows are judged in order as generate()
 * judges them and its sequence is truncated back to the tokens it keeps, so
 * its output equals generate()'s with the same parameters.
 */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#define SCHED_DEFAULT_MAX_REQUESTS 1024

struct sreq {
    int id;                      /* > 0 while in use */
    int seq;                     /* cache sequence, -1 while waiting */
    int32_t *toks;               /* [cap] prompt, then generated ids */
    int n_toks, cap, n_prompt;
    int n_fed;                   /* toks in the cache */
    long admitted;               /* admission order (preemption takes the newest) */
    struct sampler *smp;
    struct gen_params p;
    struct sched_cb cb;
    bool cons_broken;            /* the constraint refused a token (an internal error) */
    bool spec;                   /* drafts for this request (asked, and the model can take them) */
    int32_t *draft;              /* [p.spec.draft_max] this step's draft */
    int n_draft;                 /* its length */
    bool decoding;               /* this step feeds its one sampled token (a decode step) */
    struct spec_pace pace;       /* the draft length now (spec.h) */
    struct gen_stats st;
    double t_admit, t_first;
};

struct sched {
    struct model_ctx *c;
    struct kv_cache *kv;
    struct sreq *reqs;           /* [max_requests] */
    int *waiting;                /* [max_requests] FIFO of request slots */
    int n_waiting, max_requests, next_id;
    long n_admitted;
    struct batch b;
    int *row_req;                /* [max_batch_tokens] request slot of each logits row */
    float *logits;               /* [max_batch_tokens, n_vocab] */
    int budget;
    bool prefix;                 /* the prefix cache is on */
    bool spec_ok;                /* the model and cache can take drafts (gen_spec_supported) */
    uint64_t n_drafted, n_accepted;  /* speculative decoding, all requests (sched_spec_stats) */
    bool no_drafts;              /* this step's batch is built without drafts (the pool is short) */
    uint64_t n_query, n_hit;     /* prompt tokens admitted / found cached (sched_prefix_stats) */
};

// ---- requests ----

static void req_end(struct sched *s, struct sreq *r, int rc, const struct err *e)
{
    if (r->seq >= 0)
        kv_seq_remove(s->kv, r->seq);
    if (r->t_first > 0)
        r->st.t_gen_s = gen_now() - r->t_first;
    if (r->cb.on_done)
        r->cb.on_done(r->cb.ud, &r->st, rc, e);
    sampler_free(r->smp);
    free(r->toks);
    free(r->draft);
    memset(r, 0, sizeof *r);
    r->seq = -1;
}

static int free_seq(const struct sched *s)
{
    for (int q = 0; q < s->kv->max_seqs; q++)
        if (kv_seq_len(s->kv, q) < 0)
            return q;
    return -1;
}

// ---- lifetime and submission ----

int sched_new(struct sched **out, struct model_ctx *c, struct kv_cache *kv, const struct sched_params *p,
              struct err *e)
{
    int rc;
    *out = NULL;
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    s->c = c;
    s->kv = kv;
    s->next_id = 1;
    s->budget = p && p->max_batch_tokens > 0 ? p->max_batch_tokens : c->n_batch;
    s->max_requests = p && p->max_requests > 0 ? p->max_requests : SCHED_DEFAULT_MAX_REQUESTS;
    s->prefix = !(p && p->no_prefix_cache);
    s->spec_ok = gen_spec_supported(c, kv);
    s->reqs = calloc((size_t)s->max_requests, sizeof *s->reqs);
    s->waiting = calloc((size_t)s->max_requests, sizeof *s->waiting);
    s->logits = malloc((size_t)s->budget * c->m->hp.n_vocab * sizeof *s->logits);
    s->row_req = malloc((size_t)s->budget * sizeof *s->row_req);
    if (!s->reqs || !s->waiting || !s->logits || !s->row_req) {
        sched_free(s);
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    }
    for (int i = 0; i < s->max_requests; i++)
        s->reqs[i].seq = -1;
    if ((rc = batch_init(&s->b, s->budget, e)) < 0) {
        sched_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    for (int i = 0; s->reqs && i < s->max_requests; i++)
        if (s->reqs[i].id > 0) {
            s->reqs[i].st.stop = GEN_STOP_CALLBACK;
            req_end(s, &s->reqs[i], 0, NULL);
        }
    batch_free(&s->b);
    free(s->reqs);
    free(s->waiting);
    free(s->logits);
    free(s->row_req);
    free(s);
}

int sched_submit(struct sched *s, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                 const struct sched_cb *cb, int *id, struct err *e)
{
    int rc, slot = -1;
    if (n_prompt <= 0)
        return err_setf(e, ERR_ARG, "the prompt is empty");
    if (p->n_predict < 0)
        return err_setf(e, ERR_ARG, "the number of tokens to generate must not be negative");
    /* ADR 0087: the scheduler's encode step and the prefix key of image rows are issue 43's
     * server work; until then an image prompt is refused, never run as its placeholder ids */
    if (p->n_images != 0)
        return err_setf(e, ERR_UNSUPPORTED, "the scheduler does not take images yet");
    if (n_prompt > s->kv->max_seq_len)
        return err_setf(e, ERR_RANGE, "the prompt has %d tokens but the context holds %d", n_prompt,
                        s->kv->max_seq_len);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->c->m->hp.n_vocab)
            return err_setf(e, ERR_RANGE, "token id %d at position %d is outside the vocabulary [0, %d)",
                            prompt[i], i, s->c->m->hp.n_vocab);
    for (int i = 0; i < s->max_requests && slot < 0; i++)
        if (s->reqs[i].id == 0)
            slot = i;
    if (slot < 0)
        return err_setf(e, ERR_RANGE, "the scheduler holds %d requests already", s->max_requests);
    struct sreq *r = &s->reqs[slot];
    memset(r, 0, sizeof *r);
    r->seq = -1;
    r->cap = n_prompt + (p->n_predict < s->kv->max_seq_len ? p->n_predict : s->kv->max_seq_len) + 1;
    if (spec_on(&p->spec) && (rc = spec_params_check(&p->spec, e)) < 0)
        return rc;
    r->spec = spec_on(&p->spec) && s->spec_ok;
    r->toks = malloc((size_t)r->cap * sizeof *r->toks);
    r->draft = r->spec ? malloc((size_t)p->spec.draft_max * sizeof *r->draft) : NULL;
    if (!r->toks || (r->spec && !r->draft)) {
        free(r->toks);
        free(r->draft);
        r->toks = r->draft = NULL;
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    }
    spec_pace_init(&r->pace, r->spec ? p->spec.draft_max : 0);
    if ((rc = sampler_new(&r->smp, &p->sampling, s->c->m->hp.n_vocab, e)) < 0) {
        free(r->toks);
        free(r->draft);
        r->toks = r->draft = NULL;
        return rc;
    }
    memcpy(r->toks, prompt, (size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++)
        sampler_accept(r->smp, prompt[i]);
    r->n_toks = r->n_prompt = n_prompt;
    r->p = *p;
    if (cb)
        r->cb = *cb;
    r->st = (struct gen_stats){.n_prompt = n_prompt, .stop = GEN_STOP_LENGTH,
                               .spec_off = spec_on(&p->spec) && !s->spec_ok};
    r->id = s->next_id++;
    if (s->next_id <= 0)
        s->next_id = 1;
    s->waiting[s->n_waiting++] = slot;
    if (id)
        *id = r->id;
    return 0;
}

static void waiting_remove(struct sched *s, int at)
{
    memmove(s->waiting + at, s->waiting + at + 1, (size_t)(s->n_waiting - at - 1) * sizeof *s->waiting);
    s->n_waiting--;
}

bool sched_cancel(struct sched *s, int id)
{
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id != id || id <= 0)
            continue;
        for (int w = 0; w < s->n_waiting; w++)
            if (s->waiting[w] == i)
                waiting_remove(s, w);
        r->st.stop = GEN_STOP_CALLBACK;
        req_end(s, r, 0, NULL);
        return true;
    }
    return false;
}

int sched_n_waiting(const struct sched *s)
{
    return s->n_waiting;
}

int sched_n_running(const struct sched *s)
{
    int n = 0;
    for (int i = 0; i < s->max_requests; i++)
        n += s->reqs[i].id > 0 && s->reqs[i].seq >= 0;
    return n;
}

void sched_prefix_stats(const struct sched *s, uint64_t *query_tokens, uint64_t *hit_tokens)
{
    *query_tokens = s->n_query;
    *hit_tokens = s->n_hit;
}

void sched_spec_stats(const struct sched *s, uint64_t *drafted, uint64_t *accepted)
{
    *drafted = s->n_drafted;
    *accepted = s->n_accepted;
}

// ---- one step ----

/* Blocks a request needs to hold all its tokens. */
static int blocks_for(const struct sched *s, int n_toks)
{
    return (n_toks + s->kv->block_size - 1) / s->kv->block_size;
}

/* Admit waiting requests in order while a sequence id and room for the tokens exist. A
 * request first attaches what the prefix cache holds of its tokens (all but the last,
 * which must be computed for its logits); the room it needs is for the rest. */
static void admit(struct sched *s)
{
    while (s->n_waiting > 0) {
        struct sreq *r = &s->reqs[s->waiting[0]];
        int q = free_seq(s);
        bool alone = sched_n_running(s) == 0;
        if (q < 0)
            return;
        kv_seq_add(s->kv, q, NULL);
        int hit = s->prefix ? kv_prefix_attach(s->kv, q, r->toks, r->n_toks - 1) : 0;
        int held = hit / s->kv->block_size, avail = kv_n_free_blocks(s->kv);
        if (avail < blocks_for(s, r->n_toks + 1) - held && !alone) {
            kv_seq_remove(s->kv, q);
            return;
        }
        if (avail < blocks_for(s, r->n_toks) - held) {
            struct err e;
            kv_seq_remove(s->kv, q);
            err_setf(&e, ERR_NOMEM, "kv cache of %d blocks is too small for a request of %d tokens",
                     s->kv->n_blocks, r->n_toks);
            waiting_remove(s, 0);
            req_end(s, r, -ERR_NOMEM, &e);
            continue;
        }
        r->seq = q;
        r->n_fed = hit;
        r->admitted = s->n_admitted++;
        if (r->t_admit == 0) {
            /* first admission: the prompt's hit counts (a readmission's does not) */
            r->t_admit = gen_now();
            r->st.n_cached = hit;
            s->n_query += (uint64_t)r->n_prompt;
            s->n_hit += (uint64_t)hit;
        }
        waiting_remove(s, 0);
    }
}

/* Drop the newest running request's cache and put it back at the head of the queue. */
static bool preempt(struct sched *s)
{
    struct sreq *v = NULL;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0 && (!v || r->admitted > v->admitted))
            v = r;
    }
    if (!v || sched_n_running(s) < 2)
        return false;
    kv_seq_remove(s->kv, v->seq);
    v->seq = -1;
    v->n_fed = 0;
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = (int)(v - s->reqs);
    s->n_waiting++;
    return true;
}

/* r's draft after its last token, as generate() drafts: at most its draft length now, the
 * output left after the step's own token, the context left, and room - 1 rows. */
static int draft_for(const struct sched *s, struct sreq *r, int room)
{
    int max = r->p.n_predict - r->st.n_gen - 1, ctx = s->kv->max_seq_len - r->n_fed - 1;
    int lim = spec_pace_len(&r->pace);
    max = max < lim ? max : lim;
    max = max < ctx ? max : ctx;
    max = max < kv_step_back_max(s->kv) ? max : kv_step_back_max(s->kv);
    max = max < room - 1 ? max : room - 1;
    int k = max > 0 ? spec_draft(&r->p.spec, r->seq, r->toks, r->n_toks, r->draft, max) : 0;
    return k < r->p.spec.draft_min || k < 0 ? 0 : k > max ? max : k;
}

/* Rows for every running request: decode rows (with their drafts) first, then prompt chunks. */
static void build_batch(struct sched *s)
{
    batch_clear(&s->b);
    for (int i = 0; i < s->max_requests; i++) {
        s->reqs[i].n_draft = 0;
        s->reqs[i].decoding = false;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < s->max_requests; i++) {
            struct sreq *r = &s->reqs[i];
            int left = r->n_toks - r->n_fed, room = s->budget - s->b.n_tok;
            if (r->id <= 0 || r->seq < 0 || left <= 0 || (pass == 0) != (left == 1) || room <= 0)
                continue;
            r->decoding = pass == 0;
            r->n_draft = pass == 0 && r->spec && !s->no_drafts ? draft_for(s, r, room) : 0;
            if (r->n_draft > 0) {
                batch_add(&s->b, r->toks[r->n_fed], r->n_fed, r->seq, true, NULL);
                s->row_req[s->b.n_tok - 1] = i;
                for (int j = 0; j < r->n_draft; j++) {
                    batch_add(&s->b, r->draft[j], r->n_fed + 1 + j, r->seq, true, NULL);
                    s->row_req[s->b.n_tok - 1] = i;
                }
                continue;
            }
            int k = left < room ? left : room;
            batch_add_seq(&s->b, r->toks + r->n_fed, k, r->n_fed, r->seq, k == left, NULL);
            if (k == left)
                s->row_req[s->b.n_tok - 1] = i;
        }
}

/* Output id, drawn from logits, for r; false when r ended (st.stop set, or cons_broken). */
static bool emit(struct sched *s, struct sreq *r, int32_t id, const float *logits)
{
    if (!r->p.ignore_eos && gen_is_eos(&s->c->m->hp, id)) {
        r->st.stop = GEN_STOP_EOS;
        return false;
    }
    r->st.n_gen++;
    if (sampler_accept_output(r->smp, id) < 0) {
        r->cons_broken = true;  /* the constraint refused what its own mask allowed */
        return false;
    }
    if (r->cb.on_token && r->cb.on_token(r->cb.ud, id, logits)) {
        r->st.stop = GEN_STOP_CALLBACK;
        return false;
    }
    if (r->st.n_gen == r->p.n_predict) {
        r->st.stop = GEN_STOP_LENGTH;
        return false;
    }
    if (r->n_toks >= s->kv->max_seq_len || r->n_toks >= r->cap) {
        r->st.stop = GEN_STOP_CONTEXT;
        return false;
    }
    r->toks[r->n_toks++] = id;
    return true;
}

/* Sample request r from its logits row; false when it ended. */
static bool sample_one(struct sched *s, struct sreq *r, const float *logits)
{
    if (r->t_first == 0) {
        r->t_first = gen_now();
        r->st.t_prompt_s = r->t_first - r->t_admit;
    }
    if (r->st.n_gen >= r->p.n_predict) {
        r->st.stop = GEN_STOP_LENGTH;
        return false;
    }
    return emit(s, r, sampler_sample(r->smp, logits), logits);
}

/* Judge r's draft on its rows lg[0..k] (row j scores draft j; row k follows the whole draft)
 * as generate() does; false when r ended. Its sequence is cut back to the tokens it keeps. */
static bool verify(struct sched *s, struct sreq *r, const float *lg, int V, struct err *e)
{
    int k = r->n_draft, j = 0;
    bool alive = true, acc = true;
    r->n_draft = 0;
    r->st.n_drafted += k;
    s->n_drafted += (uint64_t)k;
    for (; j < k; j++) {
        const float *row = lg + (size_t)j * V;
        int32_t id = sampler_sample_draft(r->smp, row, r->draft[j], &acc);
        if (!acc) {
            alive = emit(s, r, id, row);
            break;
        }
        r->st.n_accepted++;
        s->n_accepted++;
        if (!(alive = emit(s, r, id, row)))
            break;
    }
    if (alive && acc)
        alive = emit(s, r, sampler_sample(r->smp, lg + (size_t)k * V), lg + (size_t)k * V);
    spec_pace_update(&r->pace, j, k);
    if (alive && kv_seq_truncate(s->kv, r->seq, r->n_toks - 1, e) < 0)
        return false;
    r->n_fed = r->n_toks - 1;
    return alive;
}

/* Blocks the built batch needs beyond what its sequences hold (no request is forked, so
 * no copy-on-write). */
static int batch_blocks_needed(const struct sched *s)
{
    int need = 0;
    for (int i = 0; i < s->max_requests; i++) {
        const struct sreq *r = &s->reqs[i];
        if (r->id <= 0 || r->seq < 0)
            continue;
        int fed = r->n_fed, left = r->n_toks - r->n_fed;
        for (int row = 0; row < s->b.n_tok; row++)
            fed += s->b.seq[row] == r->seq;
        if (left > 0)
            need += blocks_for(s, fed) - s->kv->seqs[r->seq].n_blocks;
    }
    return need;
}

int sched_step(struct sched *s, struct err *e)
{
    int V = s->c->m->hp.n_vocab, rc;
    admit(s);
    /* the pool decides who runs: drafts are dropped first, then the newest request is
     * preempted until the batch fits (a draft never costs another request its cache) */
    s->no_drafts = false;
    for (;;) {
        build_batch(s);
        if (s->b.n_tok == 0)
            return s->n_waiting > 0 ? 1 : 0;
        if (batch_blocks_needed(s) <= kv_n_free_blocks(s->kv))
            break;
        bool drafted = false;
        for (int i = 0; i < s->max_requests && !s->no_drafts; i++)
            drafted |= s->reqs[i].id > 0 && s->reqs[i].n_draft > 0;
        if (drafted) {
            s->no_drafts = true;
            continue;
        }
        if (!preempt(s))
            break;
    }
    if ((rc = model_forward(s->c, &s->b, s->kv, s->logits, e)) < 0) {
        /* the sequences were rolled back; the running requests end with the error (a lone
         * request that outgrew the pool among them), waiting ones may still run */
        for (int i = 0; i < s->max_requests; i++)
            if (s->reqs[i].id > 0 && s->reqs[i].seq >= 0)
                req_end(s, &s->reqs[i], rc, e);
        return s->n_waiting > 0 ? 1 : 0;
    }
    /* the fed rows are in the cache; then sample in row order (a request's draft rows
     * together), then index what each running request keeps */
    int out = 0;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0)
            r->n_fed = kv_seq_len(s->kv, r->seq);
    }
    for (int row = 0; row < s->b.n_tok; row++) {
        if (!s->b.logits[row])
            continue;
        struct sreq *r = &s->reqs[s->row_req[row]];
        const float *lg = s->logits + (size_t)out * V;
        int rows = 1 + r->n_draft;
        out += rows;
        row += rows - 1;
        bool finite = true;
        for (int j = 0; j < rows && s->c->n_nonfinite > 0; j++)
            finite &= logits_row_finite(lg + (size_t)j * V, V);
        struct err re;
        re.code = ERR_OK;
        re.msg[0] = 0;
        if (!finite) {
            /* as generate(): a request whose logits are broken ends with an error */
            err_setf(&re, ERR_FORMAT, "the model produced non-finite logits (NaN or inf) at position "
                     "%d: its weights or config are broken", r->n_fed - 1);
            req_end(s, r, -ERR_FORMAT, &re);
            continue;
        }
        if (rows == 1 && r->spec && r->decoding)
            spec_pace_update(&r->pace, 0, 0);  /* a plain step counts toward a pause, as in generate() */
        if (rows > 1 ? !verify(s, r, lg, V, &re) : !sample_one(s, r, lg)) {
            bool failed = r->cons_broken || re.code != 0;
            if (r->cons_broken)
                err_setf(&re, ERR_INTERNAL, "the output constraint rejected a token its mask allowed");
            req_end(s, r, failed ? -re.code : 0, failed ? &re : NULL);
        }
    }
    for (int i = 0; s->prefix && i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0)
            kv_prefix_register(s->kv, r->seq, r->toks, r->n_fed);
    }
    return sched_n_running(s) + s->n_waiting > 0 ? 1 : 0;
}
