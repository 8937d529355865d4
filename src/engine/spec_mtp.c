/*
 * spec_mtp: the checkpoint's multi-token-prediction layer as a drafter (spec.h, ADR 0108).
 *
 * Per sequence s of the model's cache, the layer's own cache sequence s holds the rows of model
 * positions base .. base + fed - 1: row p is (token at p + 1, the model's hidden state at p),
 * the input DeepSeek-V3 trained the layer on. The model's hidden states arrive through
 * spec_mtp_observe after each of its forwards and wait in pend until the token after their
 * position is known; a draft feeds them (one forward, logits for the last row: the token after
 * the step's own), then chains up to max - 1 more tokens one row at a time, each with the
 * layer's own final hidden state standing in for the model's, and truncates the chained rows
 * again: the model's verification supplies their true hidden states, and the accepted ones come
 * back through spec_mtp_observe.
 *
 * A chain of k drafts from one layer trained to look one token ahead is right less often at
 * each depth (vLLM with num_speculative_tokens > 1 and one MTP layer does the same; DeepSeek-V3
 * reports 85-90 % acceptance for the first token): the adaptive length (spec_pace) shortens
 * drafts that keep failing.
 */
#include "spec.h"

#include <stdlib.h>
#include <string.h>

#include "../core/fscan.h"
#include "../core/log.h"
#include "../models/model.h"
#include "batch.h"
#include "kvcache.h"

/* Hidden states a sequence keeps waiting for their successor token: a verify step's kept rows
 * (at most SPEC_DRAFT_MAX_LIMIT + 1) and a pause's plain steps; more are fed right away. */
#define MTP_PEND 96

struct mtp_seq {
    int base;        /* the model position of the layer's position 0; -1: not started */
    int fed;         /* rows in the layer's cache (model positions base .. base + fed - 1) */
    int32_t *toks;   /* [cap] each fed row's token (the one at its position + 1) */
    float *pend;     /* [MTP_PEND, n_embd] hidden states of positions base + fed .. */
    int n_pend;
};

struct spec_mtp {
    struct model_ctx *c;
    struct kv_cache *kv;
    int n_seqs, cap, d, V;
    struct mtp_seq *s;   /* [n_seqs] */
    struct batch b;      /* MTP_PEND rows */
    float *logits;       /* [n_vocab] the last row's */
    float *hid;          /* [MTP_PEND, n_embd] the layer's final hidden states of a feed */
    float *g;            /* [n_embd] the one a chained row conditions on */
    struct err err;      /* the first failure; drafting stops */
};

int spec_mtp_check(const struct model *target, const struct model *mtp, struct err *e)
{
    if (!tensor_is_present(&mtp->mtp.eh_proj))
        return err_setf(e, ERR_ARG, "not a multi-token-prediction layer");
    if (target->hp.n_vocab != mtp->hp.n_vocab || target->hp.n_embd != mtp->hp.n_embd)
        return err_setf(e, ERR_ARG, "the multi-token-prediction layer has %d ids and width %d, the model "
                        "%d and %d", mtp->hp.n_vocab, mtp->hp.n_embd, target->hp.n_vocab, target->hp.n_embd);
    return 0;
}

int spec_mtp_new(struct spec_mtp **out, struct model_ctx *c, struct kv_cache *kv, struct err *e)
{
    int rc;
    *out = NULL;
    struct spec_mtp *d = calloc(1, sizeof *d);
    if (!d)
        return err_setf(e, ERR_NOMEM, "out of memory");
    d->c = c;
    d->kv = kv;
    d->n_seqs = kv->max_seqs;
    d->cap = kv->max_seq_len;
    d->d = c->m->hp.n_embd;
    d->V = c->m->hp.n_vocab;
    d->s = calloc((size_t)d->n_seqs, sizeof *d->s);
    d->logits = malloc((size_t)d->V * sizeof *d->logits);
    d->hid = malloc((size_t)MTP_PEND * d->d * sizeof *d->hid);
    d->g = malloc((size_t)d->d * sizeof *d->g);
    if (!d->s || !d->logits || !d->hid || !d->g) {
        spec_mtp_free(d);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    for (int s = 0; s < d->n_seqs; s++)
        d->s[s].base = -1;
    if ((rc = batch_init(&d->b, MTP_PEND, e)) < 0) {
        spec_mtp_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void spec_mtp_free(struct spec_mtp *d)
{
    if (!d)
        return;
    for (int s = 0; d->s && s < d->n_seqs; s++) {
        if (d->s[s].base >= 0)
            kv_seq_remove(d->kv, s);
        free(d->s[s].toks);
        free(d->s[s].pend);
    }
    batch_free(&d->b);
    free(d->s);
    free(d->logits);
    free(d->hid);
    free(d->g);
    free(d);
}

const char *spec_mtp_error(const struct spec_mtp *d)
{
    return d->err.code ? d->err.msg : NULL;
}

/* Sequence seq starts over at model position base (-1: stopped until the next observation).
 * false when out of memory (d->err set). */
static bool restart(struct spec_mtp *d, int seq, int base)
{
    struct mtp_seq *S = &d->s[seq];
    if (S->base >= 0)
        kv_seq_remove(d->kv, seq);
    S->base = -1;
    S->fed = S->n_pend = 0;
    if (base < 0)
        return true;
    if (!S->toks)
        S->toks = malloc((size_t)d->cap * sizeof *S->toks);
    if (!S->pend)
        S->pend = malloc((size_t)MTP_PEND * d->d * sizeof *S->pend);
    if (!S->toks || !S->pend) {
        err_setf(&d->err, ERR_NOMEM, "out of memory");
        return false;
    }
    if (kv_seq_add(d->kv, seq, &d->err) < 0)
        return false;
    S->base = base;
    return true;
}

/* Feed n rows at the end of seq: ids (each the token after its row's position) and hidden [n,
 * n_embd]; with last, the last row's logits into d->logits and the final hidden states into
 * d->hid. When the pool runs short, the other sequences are dropped (they start over at their
 * next observation) and the feed is tried once more. */
static int feed(struct spec_mtp *d, int seq, const int32_t *ids, const float *hidden, int n, bool last)
{
    struct mtp_seq *S = &d->s[seq];
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        batch_clear(&d->b);
        err_clear(&d->err);
        rc = batch_add_seq(&d->b, ids, n, S->fed, seq, last, &d->err);
        d->b.hidden = hidden;
        d->b.hidden_out = last ? d->hid : NULL;
        if (rc == 0)
            rc = model_forward(d->c, &d->b, d->kv, d->logits, &d->err);
        if (rc != -ERR_NOMEM || attempt > 0)
            break;
        for (int s = 0; s < d->n_seqs; s++)
            if (s != seq && d->s[s].base >= 0)
                restart(d, s, -1);
    }
    if (rc < 0)
        return rc;
    memcpy(S->toks + S->fed, ids, (size_t)n * sizeof *ids);
    S->fed += n;
    return 0;
}

/* Feed the waiting rows of seq whose next token hist[0..n_hist) knows. */
static int flush(struct spec_mtp *d, int seq, const int32_t *hist, int n_hist)
{
    struct mtp_seq *S = &d->s[seq];
    int first = S->base + S->fed, m = n_hist - 1 - first;
    m = m < S->n_pend ? m : S->n_pend;
    if (m <= 0)
        return 0;
    if (S->fed + m > d->cap)
        return err_setf(&d->err, ERR_RANGE, "the multi-token-prediction cache is full");
    int rc = feed(d, seq, hist + first + 1, S->pend, m, false);
    if (rc < 0)
        return rc;
    S->n_pend -= m;
    memmove(S->pend, S->pend + (size_t)m * d->d, (size_t)S->n_pend * d->d * sizeof *S->pend);
    return 0;
}

void spec_mtp_observe(void *ud, int seq, int pos0, const float *hidden, int n, const int32_t *hist, int n_hist)
{
    struct spec_mtp *d = ud;
    if (d->err.code || seq < 0 || seq >= d->n_seqs || n <= 0 || pos0 < 0)
        return;
    struct mtp_seq *S = &d->s[seq];
    int end = S->base + S->fed + S->n_pend;
    /* a new request in seq (or one preempted and fed again), or a gap: start over at pos0 */
    if (S->base < 0 || pos0 < S->base + S->fed || pos0 > end) {
        if (!restart(d, seq, pos0))
            goto failed;
    } else {
        S->n_pend = pos0 - (S->base + S->fed);  /* rolled-back positions are superseded */
    }
    for (int i = 0; i < n; i++) {
        if (S->n_pend == MTP_PEND && flush(d, seq, hist, n_hist) < 0)
            goto failed;
        if (S->n_pend == MTP_PEND && !restart(d, seq, pos0 + i))  /* nothing could be fed */
            goto failed;
        memcpy(S->pend + (size_t)S->n_pend * d->d, hidden + (size_t)i * d->d, (size_t)d->d * sizeof *hidden);
        S->n_pend++;
    }
    return;
failed:
    LOG_WARN("the multi-token-prediction layer failed (%s): decoding goes on without drafts", d->err.msg);
}

/* spec_mtp_draft's work for a started sequence; d->err set on a failure. */
static int draft_seq(struct spec_mtp *d, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    struct mtp_seq *S = &d->s[seq];
    int last = n - 2;  /* the position whose next token, hist[n - 1], the step feeds the model */
    int first = S->base + S->fed, m = last - first + 1;
    /* the fed rows must be this history's (a sequence id taken over mid-way starts over) */
    if (S->fed > 0 && (first > n - 1 || memcmp(S->toks, hist + S->base + 1, (size_t)S->fed * sizeof *hist) != 0)) {
        restart(d, seq, -1);
        return 0;
    }
    if (m < 1 || m > S->n_pend)
        return 0;  /* a hidden state is missing (nothing observed there) */
    if (max > d->cap - (last - S->base))
        max = d->cap - (last - S->base);
    if (max <= 0)
        return 0;
    int fed0, k = 0;
    const float *g = NULL;  /* the last fed row's final hidden state */
    /* the waiting rows up to `last`, in pieces of a batch */
    while (m > 0) {
        int piece = m < MTP_PEND ? m : MTP_PEND;
        if (feed(d, seq, hist + S->base + S->fed + 1, S->pend, piece, piece == m) < 0)
            return 0;
        S->n_pend -= piece;
        memmove(S->pend, S->pend + (size_t)piece * d->d, (size_t)S->n_pend * d->d * sizeof *S->pend);
        m -= piece;
        g = d->hid + (size_t)(piece - 1) * d->d;
    }
    fed0 = S->fed;
    out[k++] = fscan_argmax(d->logits, d->V);
    /* chained rows: the token just drafted, the layer's own last hidden state */
    while (k < max) {
        memcpy(d->g, g, (size_t)d->d * sizeof *d->g);
        if (feed(d, seq, out + k - 1, d->g, 1, true) < 0)
            break;
        out[k++] = fscan_argmax(d->logits, d->V);
        g = d->hid;
    }
    if (S->fed > fed0) {
        struct err te;
        if (kv_seq_truncate(d->kv, seq, fed0, &te) < 0) {
            d->err = te;
            restart(d, seq, -1);
            return k;
        }
        S->fed = fed0;
    }
    err_clear(&d->err);  /* a chained row that failed only shortens the draft */
    return k;
}

int spec_mtp_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max)
{
    struct spec_mtp *d = ud;
    if (d->err.code || n < 2 || max <= 0 || seq < 0 || seq >= d->n_seqs || d->s[seq].base < 0)
        return 0;
    int k = draft_seq(d, seq, hist, n, out, max);
    if (d->err.code)
        LOG_WARN("the multi-token-prediction layer failed (%s): decoding goes on without drafts", d->err.msg);
    return k;
}
