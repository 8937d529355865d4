/*
 * spec: drafters for speculative decoding (spec.h).
 */
#include "spec.h"

#include <stdlib.h>
#include <string.h>

#include "../core/fscan.h"
#include "../core/log.h"
#include "../models/model.h"
#include "batch.h"
#include "kvcache.h"

void spec_params_default(struct spec_params *p)
{
    memset(p, 0, sizeof *p);
    p->mode = SPEC_NONE;
    p->draft_max = 16;
    p->draft_min = 1;
    p->ngram_min = 1;
    p->ngram_max = 3;
    p->gate = true;
}

int spec_params_check(const struct spec_params *p, struct err *e)
{
    if (p->mode != SPEC_NONE && p->mode != SPEC_NGRAM && p->mode != SPEC_DRAFT && p->mode != SPEC_MTP)
        return err_setf(e, ERR_ARG, "unknown speculative mode %d", (int)p->mode);
    if (p->mode == SPEC_DRAFT && !p->draft)
        return err_setf(e, ERR_ARG, "--spec draft needs a draft model (--model-draft)");
    if (p->mode == SPEC_MTP && (!p->draft || !p->observe))
        return err_setf(e, ERR_ARG, "--spec mtp needs the checkpoint's multi-token-prediction layer");
    if (p->draft_max < 1 || p->draft_max > SPEC_DRAFT_MAX_LIMIT)
        return err_setf(e, ERR_ARG, "--draft-max must be in [1, %d] (got %d)", SPEC_DRAFT_MAX_LIMIT, p->draft_max);
    if (p->draft_min < 0 || p->draft_min > p->draft_max)
        return err_setf(e, ERR_ARG, "--draft-min must be in [0, --draft-max = %d] (got %d)", p->draft_max,
                        p->draft_min);
    if (p->ngram_max < 1 || p->ngram_max > 16 || p->ngram_min < 1 || p->ngram_min > p->ngram_max)
        return err_setf(e, ERR_ARG, "the n-gram sizes must satisfy 1 <= min <= max <= 16 (got %d, %d)",
                        p->ngram_min, p->ngram_max);
    return 0;
}

bool spec_on(const struct spec_params *p)
{
    return p->mode == SPEC_NGRAM || p->draft != NULL;
}

int spec_ngram(const int32_t *hist, int n, int ngram_min, int ngram_max, int32_t *out, int max)
{
    if (max <= 0)
        return 0;
    for (int m = ngram_max < n - 1 ? ngram_max : n - 1; m >= ngram_min; m--) {
        const int32_t *key = hist + n - m;
        /* an occurrence at [i, i + m) with at least one token after it, most recent first */
        for (int i = n - m - 1; i >= 0; i--) {
            if (hist[i] != key[0] || memcmp(hist + i, key, (size_t)m * sizeof *key) != 0)
                continue;
            int k = n - (i + m) < max ? n - (i + m) : max;
            memcpy(out, hist + i + m, (size_t)k * sizeof *out);
            return k;
        }
    }
    return 0;
}

int spec_draft(const struct spec_params *p, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    if (p->draft)
        return p->draft(p->draft_ud, seq, hist, n, out, max);
    if (p->mode == SPEC_NGRAM)
        return spec_ngram(hist, n, p->ngram_min, p->ngram_max, out, max);
    return 0;
}

void spec_pace_init(struct spec_pace *a, int draft_max)
{
    *a = (struct spec_pace){.len = draft_max, .max = draft_max};
}

int spec_pace_len(const struct spec_pace *a)
{
    return a->rest > 0 ? 0 : a->len;
}

void spec_pace_update(struct spec_pace *a, int j, int k)
{
    if (k == 0) {
        if (a->rest > 0)
            a->rest--;
    } else if (j == k) {
        a->len = 2 * a->len < a->max ? 2 * a->len : a->max;
        a->pause = 0;
    } else if (j > 0) {
        a->pause = 0;
    } else if (a->len > 1) {
        a->len /= 2;
    } else {
        a->pause = a->pause ? (2 * a->pause < SPEC_PAUSE_MAX ? 2 * a->pause : SPEC_PAUSE_MAX) : 1;
        a->rest = a->pause;
    }
}

void spec_gate_init(struct spec_gate *g, bool sticky)
{
    *g = (struct spec_gate){.sticky = sticky};
}

bool spec_gate_drafts(const struct spec_gate *g)
{
    return g->phase == 0 || (g->phase == 2 && !g->plain);
}

void spec_gate_update(struct spec_gate *g, int n, double s)
{
    if (g->phase == 2) {
        if ((g->left -= n) <= 0 && !(g->sticky && g->plain))
            *g = (struct spec_gate){.sticky = g->sticky, .plain = g->plain, .hold = g->hold};
        return;
    }
    const int m = g->phase == 0;
    g->t[m] += s;
    g->n[m] += n;
    if (g->phase == 0 && g->n[1] >= SPEC_GATE_SPEC) {
        g->phase = 1;
    } else if (g->phase == 1 && g->n[0] >= SPEC_GATE_PLAIN) {
        /* t0 / n0 < t1 / n1: plain steps took fewer seconds a token */
        const bool plain = g->t[0] * g->n[1] < g->t[1] * g->n[0];
        g->hold = g->hold && plain == g->plain
                      ? (2 * g->hold < SPEC_GATE_HOLD_MAX ? 2 * g->hold : SPEC_GATE_HOLD_MAX)
                      : SPEC_GATE_HOLD;
        g->plain = plain;
        g->left = g->hold;
        g->phase = 2;
    }
}

// ---- a draft model ----

struct spec_model {
    struct model_ctx *c;
    struct kv_cache *kv;
    int n_seqs, cap;
    int32_t *toks;     /* [n_seqs][cap] what each draft sequence holds, position by position */
    int *n_toks;       /* [n_seqs]; -1: the sequence is not in the cache yet */
    float *logits;     /* [n_vocab] */
    struct batch b;
    struct err err;    /* the first failure; drafting stops */
};

int spec_model_check(const struct model *target, const struct model *draft, const struct kv_cache *draft_kv,
                     struct err *e)
{
    const struct hparams *t = &target->hp, *d = &draft->hp;
    if (t->n_vocab != d->n_vocab)
        return err_setf(e, ERR_ARG, "the draft model's vocabulary has %d ids, the model's %d: drafts must "
                        "be the model's tokens", d->n_vocab, t->n_vocab);
    if (t->n_eos != d->n_eos || memcmp(t->eos_ids, d->eos_ids, (size_t)t->n_eos * sizeof *t->eos_ids) != 0)
        return err_setf(e, ERR_ARG, "the draft model's end-of-sequence ids differ from the model's: not "
                        "the same tokenizer");
    if (draft_kv && kv_spec_back_max(draft_kv) <= 0)
        return err_setf(e, ERR_UNSUPPORTED, "the draft model has sliding-window layers without slack: its "
                        "cache cannot step back after a rejected draft");
    return 0;
}

int spec_model_new(struct spec_model **out, struct model_ctx *c, struct kv_cache *kv, struct err *e)
{
    int rc;
    *out = NULL;
    struct spec_model *d = calloc(1, sizeof *d);
    if (!d)
        return err_setf(e, ERR_NOMEM, "out of memory");
    d->c = c;
    d->kv = kv;
    d->n_seqs = kv->max_seqs;
    d->cap = kv->max_seq_len;
    d->toks = malloc((size_t)d->n_seqs * (size_t)d->cap * sizeof *d->toks);
    d->n_toks = malloc((size_t)d->n_seqs * sizeof *d->n_toks);
    d->logits = malloc((size_t)c->m->hp.n_vocab * sizeof *d->logits);
    if (!d->toks || !d->n_toks || !d->logits) {
        spec_model_free(d);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    for (int s = 0; s < d->n_seqs; s++)
        d->n_toks[s] = -1;
    if ((rc = batch_init(&d->b, d->cap, e)) < 0) {
        spec_model_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void spec_model_free(struct spec_model *d)
{
    if (!d)
        return;
    for (int s = 0; d->n_toks && s < d->n_seqs; s++)
        if (d->n_toks[s] >= 0)
            kv_seq_remove(d->kv, s);
    batch_free(&d->b);
    free(d->toks);
    free(d->n_toks);
    free(d->logits);
    free(d);
}

const char *spec_model_error(const struct spec_model *d)
{
    return d->err.code ? d->err.msg : NULL;
}

/* Feed ids[0..n) at the end of draft sequence seq; the logits of the last into d->logits. The
 * draft's cache keeps the sequences of requests that ended until their ids are taken again:
 * when the pool runs short, those of the other ids are dropped (they start over when drafted
 * for next) and the feed is tried once more. */
static int feed(struct spec_model *d, int seq, const int32_t *ids, int n)
{
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        batch_clear(&d->b);
        err_clear(&d->err);
        rc = batch_add_seq(&d->b, ids, n, d->n_toks[seq], seq, true, &d->err);
        if (rc == 0)
            rc = model_forward(d->c, &d->b, d->kv, d->logits, &d->err);
        if (rc != -ERR_NOMEM || attempt > 0)
            break;
        for (int s = 0; s < d->n_seqs; s++)
            if (s != seq && d->n_toks[s] > 0) {
                kv_seq_truncate(d->kv, s, 0, NULL);
                d->n_toks[s] = 0;
            }
    }
    if (rc < 0)
        return rc;
    memcpy(d->toks + (size_t)seq * d->cap + d->n_toks[seq], ids, (size_t)n * sizeof *ids);
    d->n_toks[seq] += n;
    return 0;
}

static int draft_seq(struct spec_model *d, int seq, const int32_t *hist, int n, int32_t *out, int max, int V);

int spec_model_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    struct spec_model *d = ud;
    int V = d->c->m->hp.n_vocab;
    if (d->err.code || n <= 0 || max <= 0 || seq < 0 || seq >= d->n_seqs)
        return 0;
    int k = draft_seq(d, seq, hist, n, out, max, V);
    if (d->err.code)
        LOG_WARN("the draft model failed (%s): decoding goes on without drafts", d->err.msg);
    return k;
}

void spec_model_prefill(void *ud, int seq, const int32_t *hist, int n)
{
    struct spec_model *d = ud;
    if (d->err.code || n <= 1 || seq < 0 || seq >= d->n_seqs || n - 1 > d->cap || d->n_toks[seq] > 0)
        return;
    if (d->n_toks[seq] < 0) {
        if (kv_seq_add(d->kv, seq, &d->err) < 0)
            return;
        d->n_toks[seq] = 0;
    }
    if (feed(d, seq, hist, n - 1) < 0)
        LOG_WARN("the draft model failed (%s): decoding goes on without drafts", d->err.msg);
}

/* spec_model_draft's work; d->err set on a failure (what was drafted before it stands). */
static int draft_seq(struct spec_model *d, int seq, const int32_t *hist, int n, int32_t *out, int max, int V)
{
    /* room: the history, then max - 1 drafted tokens fed back */
    if (n + max - 1 > d->cap)
        max = d->cap - n + 1;
    if (max <= 0)
        return 0;
    if (d->n_toks[seq] < 0) {
        if (kv_seq_add(d->kv, seq, &d->err) < 0)
            return 0;
        d->n_toks[seq] = 0;
    }
    /* keep the prefix the draft's sequence shares with the history, but always feed at
     * least the last token (its logits start the draft) */
    const int32_t *have = d->toks + (size_t)seq * d->cap;
    int held = d->n_toks[seq], keep = 0;
    while (keep < held && keep < n - 1 && have[keep] == hist[keep])
        keep++;
    bool rec = kv_has_recurrent(d->kv);
    if (keep < held && rec && keep > 0) {
        /* recurrent layers (ADR 0112): back to the checkpoint taken after the last history fed,
         * when the kept prefix reaches it, else start over */
        int ck = kv_seq_checkpoint_len(d->kv, seq);
        if (ck > 0 && ck <= keep)
            keep = ck;
        else
            keep = 0;
    }
    if (keep < held) {
        if (!rec && held - keep > kv_step_back_max(d->kv) && keep > 0) {
            /* further back than the draft's cache can step (sliding window): start over */
            kv_seq_remove(d->kv, seq);
            if (kv_seq_add(d->kv, seq, &d->err) < 0)
                return 0;
            keep = 0;
        } else if (kv_seq_truncate(d->kv, seq, keep, &d->err) < 0) {
            return 0;
        }
        d->n_toks[seq] = keep;
    }
    if (feed(d, seq, hist + keep, n - keep) < 0 || (rec && kv_seq_checkpoint(d->kv, seq, &d->err) < 0))
        return 0;
    int k = 0;
    for (;;) {
        out[k] = fscan_argmax(d->logits, V);
        if (++k == max || feed(d, seq, out + k - 1, 1) < 0)
            break;
    }
    return k;
}
