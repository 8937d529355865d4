/*
 * batch: the input of one forward pass over many sequences, and the one
 * entry point that runs it (model_forward). A batch is a list of rows, each
 * a token id at a position of a sequence, flagged when its logits are
 * wanted. Prefill of one prompt, decode of 16 sequences (one row each), and
 * 3 prompts being prefilled while 5 sequences decode are all one call.
 *
 * Rules (checked, -ERR_ARG / -ERR_RANGE otherwise): every sequence exists in
 * the cache; its rows appear in increasing position order, the first at the
 * sequence's current length and each next one position later (rows of
 * different sequences may interleave); ids are in the vocabulary; no
 * sequence grows past the cache's max_seq_len (the one context check).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../models/model.h"
#include "kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An image's rows in a batch (ADR 0087): the n_tok rows of sequence seq at positions
 * [pos, pos + n_tok), consecutive rows of the batch holding the model's image token, take
 * the rows of embd [n_tok, n_embd] (backend memory: vision_encode's output, the caller's)
 * in place of their token's embedding; where the model's vision_info.bidirectional says so
 * they also attend to each other both ways (kv_rows.span). An image is never split across
 * forward chunks, so it must fit one (n_tok <= the context's n_batch). */
struct batch_image {
    int32_t seq, pos, n_tok;
    const float *embd;
};

struct batch {
    int n_tok, cap;
    int32_t *ids;     /* [cap] token ids */
    int32_t *pos;     /* [cap] positions */
    int32_t *seq;     /* [cap] sequence ids */
    bool *logits;     /* [cap] whether the row's logits are wanted */
    const struct batch_image *img;  /* [n_img] images among the rows, borrowed; NULL: none */
    int n_img;
    /* An MTP model (model.mtp, ADR 0108): the hidden state each row conditions on, [n_tok,
     * n_embd] host, borrowed; required for such a model, ignored by others. */
    const float *hidden;
    /* Not NULL: every row's final hidden state (the output norm of the residual stream, what
     * lm_head reads) is written here, [n_tok, n_embd] host; families with an MTP layout
     * only (model_ops.mtp), and MTP models (-ERR_UNSUPPORTED otherwise). */
    float *hidden_out;
};

/* Room for cap rows (owned arrays). */
int batch_init(struct batch *b, int cap, struct err *e);
void batch_free(struct batch *b);
/* No rows, no images, no hidden states in or out. */
void batch_clear(struct batch *b);
/* Append a row; -ERR_RANGE when the batch is full. */
int batch_add(struct batch *b, int32_t id, int32_t pos, int32_t seq, bool logits, struct err *e);
/* Append n rows of seq at positions pos0.. (logits for the last one only when last). */
int batch_add_seq(struct batch *b, const int32_t *ids, int n, int32_t pos0, int32_t seq, bool last,
                  struct err *e);

/* Run every row of b through the model, appending each row's K/V to its sequence
 * in kv, and write the logits of the flagged rows, in row order, to
 * logits [n_flagged, n_vocab] (host memory). Chunks larger than the context's
 * n_batch are split. On error the sequences keep their previous lengths (a sequence
 * whose sliding-window blocks an earlier chunk of the call already released is emptied). */
/* Whether one row of V logits holds only finite values (model_forward counts the rows that
 * do not into c->n_nonfinite). */
bool logits_row_finite(const float *l, int V);

int model_forward(struct model_ctx *c, const struct batch *b, struct kv_cache *kv, float *logits,
                  struct err *e);

#ifdef __cplusplus
}
#endif
