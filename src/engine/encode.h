/*
 * encode: runs an encoder model (hp.encoder: BERT, XLM-RoBERTa, ModernBERT, and decoders
 * served for embeddings or reranking, ADR 0097) over a batch of token sequences of
 * different lengths, packed without padding (ADR 0083), and returns each token's last hidden
 * state and, for a sequence-classification head or an LM reranker, each sequence's logits.
 * A causal model's rows (hp.causal) attend their sequence up to themselves (no span).
 *
 * The sequences of one forward chunk are laid end to end as rows; every row keeps its own
 * position and carries the whole sequence as its bidirectional span (kv_rows.span, ADR
 * 0092), so the decoder's attention op over the paged KV layout attends the whole sequence
 * in its tiled prefill path, and the K/V of a layer live in one
 * scratch pool reused by every layer (nothing is cached between calls). One encoder is used
 * by one thread at a time; the model may be shared.
 */
#pragma once
#include <stdint.h>

#include "../core/err.h"
#include "../models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One input sequence: n token ids (and token types, NULL: all 0). Borrowed. */
struct enc_seq {
    const int32_t *ids;
    const int32_t *type_ids;
    int n;
};

struct encoder;

/* An encoder of m (hp.encoder) on be (m prepared for it): its context, K/V scratch and
 * staging. -ERR_ARG for a model that is not an encoder. */
int enc_new(struct encoder **out, const struct model *m, struct backend *be, struct err *e);
void enc_free(struct encoder *en);

/* The longest sequence the model takes: its position table less the first position id
 * (RoBERTa's padding_idx + 1), at most 8192 (a decoder's long context is not an
 * embedding's, ADR 0097). */
int enc_max_tokens(const struct model *m);

/* Run n_seq sequences. hidden (host, may be NULL): [sum of n, n_embd], the sequences' rows
 * in order; logits (host, may be NULL; needs hp.n_cls or hp.lm_rerank): [n_seq, n_cls] from
 * each sequence's first token, or for a causal model (hp.causal) its last token, an LM
 * reranker's [n_seq, n_vocab] (a decoder's hidden states are final-normalized only in a call
 * without logits). -ERR_RANGE naming the sequence for an empty or too long one,
 * or an id / type out of range; -ERR_FORMAT when the forward produced a NaN or an infinity
 * (broken weights). */
int enc_run(struct encoder *en, const struct enc_seq *seqs, int n_seq, float *hidden, float *logits,
            struct err *e);

#ifdef __cplusplus
}
#endif
