/*
 * textout: a choice's text with stop strings (textout.h).
 */
#include "textout.h"

#include <stdlib.h>
#include <string.h>

int textout_init(struct textout *t, const struct tokenizer *tok, bool skip_special, const char *const *stop,
                 const size_t *stop_len, int n_stop, struct err *e)
{
    memset(t, 0, sizeof *t);
    tok_stream_init(&t->ts, tok, skip_special);
    t->stop = stop;
    t->stop_len = stop_len;
    t->n_stop = n_stop;
    t->stop_idx = -1;
    for (int i = 0; i < n_stop; i++)
        t->max_stop = stop_len[i] > t->max_stop ? stop_len[i] : t->max_stop;
    t->cap = 256;
    t->text = malloc(t->cap);
    t->scratch = malloc(TOK_STREAM_CAP);
    if (!t->text || !t->scratch) {
        textout_free(t);
        return err_setf(e, ERR_NOMEM, "out of memory for a choice's text");
    }
    t->text[0] = 0;
    return 0;
}

void textout_free(struct textout *t)
{
    free(t->text);
    free(t->scratch);
    memset(t, 0, sizeof *t);
}

/* Appends n bytes and looks for the earliest stop string that ends inside them. */
static int append(struct textout *t, const char *s, size_t n, struct err *e)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap;
        while (t->len + n + 1 > cap)
            cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p)
            return err_setf(e, ERR_NOMEM, "out of memory for a choice's text");
        t->text = p;
        t->cap = cap;
    }
    size_t old = t->len;
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
    /* a match must end in the new bytes: start at most max_stop - 1 bytes before them */
    size_t from = old > t->max_stop ? old - t->max_stop + 1 : 0, best = SIZE_MAX;
    int which = -1;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = memmem(t->text + from, t->len - from, t->stop[i], t->stop_len[i]);
        if (hit && (size_t)(hit - t->text) < best) {
            best = (size_t)(hit - t->text);
            which = i;
        }
    }
    if (best == SIZE_MAX)
        return 0;
    t->len = best;
    t->text[best] = 0;
    t->stopped = true;
    t->stop_idx = which;
    return 1;
}

int textout_push(struct textout *t, int32_t id, const char **piece, size_t *piece_len, struct err *e)
{
    if (piece) {
        *piece = "";
        *piece_len = 0;
    }
    if (t->stopped || t->finished)
        return t->stopped;
    /* an id the model has but the tokenizer does not (a vocabulary padded for the hardware, a
     * random-weight model) has no text: it adds nothing, as in vLLM's detokenizer */
    if (id < 0 || id >= tok_vocab_size(t->ts.tok))
        return 0;
    int w = tok_stream_push(&t->ts, id, t->scratch, TOK_STREAM_CAP, e);
    if (w < 0)
        return w;
    if (piece) {
        *piece = t->scratch;
        *piece_len = (size_t)w;
    }
    return append(t, t->scratch, (size_t)w, e);
}

int textout_finish(struct textout *t, struct err *e)
{
    if (t->stopped || t->finished) {
        t->finished = true;
        return t->stopped;
    }
    t->finished = true;
    int w = tok_stream_flush(&t->ts, t->scratch, TOK_STREAM_CAP);
    if (w < 0)
        return err_setf(e, ERR_NOMEM, "out of memory decoding the last token");
    return append(t, t->scratch, (size_t)w, e);
}

size_t textout_ready(const struct textout *t)
{
    if (t->stopped || t->finished)
        return t->len;
    size_t hold = 0;
    for (int i = 0; i < t->n_stop; i++) {
        size_t m = t->stop_len[i] - 1 < t->len ? t->stop_len[i] - 1 : t->len;
        for (size_t k = m; k > hold; k--)
            if (memcmp(t->text + t->len - k, t->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return t->len - hold;
}

int textout_peek(const struct textout *t, int32_t id, char *out, size_t cap)
{
    if (id < 0 || id >= tok_vocab_size(t->ts.tok))
        return 0;
    struct tok_stream s = t->ts;  /* a plain value: the copy leaves t unchanged */
    return tok_stream_push(&s, id, out, cap, NULL);
}
