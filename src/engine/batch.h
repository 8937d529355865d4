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
 * they also attend to each other both ways (kv_rows.span), and then the image is never split
 * across forward chunks, so it must fit one (n_tok <= the context's n_batch); a causal image
 * (Qwen2-VL's) is cut between chunks like text. */
struct batch_image {
    int32_t seq, pos, n_tok;
    const float *embd;
    /* M-RoPE models (ADR 0094): the image's merged rows and columns (grid_h x grid_w = n_tok),
     * from which generate and the scheduler make the rows' positions; 0 otherwise */
    int32_t grid_h, grid_w;
    /* DeepStack models (vision_info.n_deepstack > 0, ADR 0120): embd + k deep_ld (floats),
     * k = 1 .. n_deepstack, are the same rows' deepstack features for decoder layer k - 1
     * (vision_encode_grid writes an image as 1 + n_deepstack planes of its rows, so deep_ld
     * is the whole image's rows x n_embd, also for a part of it); 0 otherwise */
    size_t deep_ld;
};

struct batch {
    int n_tok, cap;
    int32_t *ids;     /* [cap] token ids */
    int32_t *pos;     /* [cap] positions */
    int32_t *seq;     /* [cap] sequence ids */
    bool *logits;     /* [cap] whether the row's logits are wanted */
    int32_t *rope;    /* [cap][3] rope positions (temporal, height, width) for M-RoPE models
                       * (ADR 0094): batch_add writes (pos, pos, pos); batch_rope_set the
                       * positions of an image prompt's rows or a shifted text row; other
                       * models read pos alone */
    const struct batch_image *img;  /* [n_img] images among the rows, borrowed; NULL: none */
    int n_img;
    /* LoRA adapters (models/lora.h, ADR 0103): lora[s * n_lora + a] is the scale of the
     * context's adapter a for sequence id s (0: not used), for every sequence id the rows
     * name; borrowed. NULL: every row at the context's global scales (model_ctx_set_lora_scales;
     * the base alone where it has no adapters). n_lora is the context's adapter
     * count (model_ctx_n_lora). */
    const float *lora;
    int n_lora;
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

/* Rope positions of rows [row, row + n): p3[3 i + s] (stream s of the i-th row), or, p3 NULL,
 * each row's pos + delta in all three (text after an image: ADR 0094). -ERR_RANGE outside
 * the rows added. */
int batch_rope_set(struct batch *b, int row, int n, const int32_t *p3, int32_t delta, struct err *e);

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
