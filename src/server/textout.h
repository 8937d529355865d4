/*
 * textout: the text of one generated choice, token by token, with stop
 * strings. Tokens are decoded incrementally (tok_stream: only complete UTF-8
 * characters), appended to the choice's text, and searched for the stop
 * strings across token boundaries. A stop string ends the text just before
 * its first occurrence. textout_ready() says how much of the text may be
 * sent to a streaming client now: everything except a tail that could still
 * grow into a stop string, so nothing sent is ever taken back and the
 * streamed deltas concatenate to exactly the non-streamed text.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct textout {
    struct tok_stream ts;
    char *text;                    /* [len] the choice's text so far (NUL-terminated) */
    size_t len, cap;
    const char *const *stop;       /* borrowed stop strings */
    const size_t *stop_len;
    int n_stop;
    size_t max_stop;               /* longest stop string */
    bool stopped;                  /* a stop string matched: text ends before it */
    int stop_idx;                  /* which one (index into stop), -1 when none */
    bool finished;                 /* no more tokens: nothing is held back */
    char *scratch;                 /* [TOK_STREAM_CAP] */
};

/* skip_special: leave special tokens out of the text (the server's choice, as vLLM). */
int textout_init(struct textout *t, const struct tokenizer *tok, bool skip_special, const char *const *stop,
                 const size_t *stop_len, int n_stop, struct err *e);
void textout_free(struct textout *t);

/* Appends id's text (none for an id outside the tokenizer's vocabulary). Returns 1 when a stop string matched (the text is cut before it and
 * later pushes are ignored), 0 otherwise, or a negative error. piece and piece_len (optional)
 * receive the text id added before any stop cut (pointer into scratch, valid until the next
 * call). */
int textout_push(struct textout *t, int32_t id, const char **piece, size_t *piece_len, struct err *e);
/* No more tokens: flush what the decoder holds (checking stops once more). Returns as push. */
int textout_finish(struct textout *t, struct err *e);
/* Bytes of text that are final: all of it once stopped or finished, else all but the longest
 * tail that is a proper prefix of a stop string. */
size_t textout_ready(const struct textout *t);
/* The text id would add after the text so far, without adding it (for logprob
 * alternatives): written to out (cap >= TOK_STREAM_CAP), bytes returned, or < 0. */
int textout_peek(const struct textout *t, int32_t id, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
