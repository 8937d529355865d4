/*
 * embedder: a loaded encoder served as sentence-transformers serves it: texts (or token
 * ids) in, one vector per input out (SentenceTransformer.encode), or query/document pairs in,
 * one score per pair out (CrossEncoder.predict). It joins the encoder run (encode.h), the
 * folder's sentence-transformers modules (embed.h) and the tokenizer.
 *
 * Texts longer than the model's limit (min(position table, max_seq_length)) are truncated
 * as sentence-transformers truncates them (the text's tokens, keeping the special tokens;
 * a pair by tokenizers' longest_first), or refused when the caller asks (-ERR_RANGE).
 * One embedder serves one thread at a time; the model and tokenizer are borrowed.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "embed.h"
#include "encode.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tokenizer;

/* One tokenized input: ids with their token types (NULL: all 0), and the leading rows a
 * prompt took (pooled or not as the Pooling config's include_prompt says). Owned. */
struct emb_item {
    int32_t *ids;
    int32_t *types;
    int n;
    int skip;
};
void emb_item_deinit(struct emb_item *it);

struct embedder {
    const struct model *m;        /* borrowed */
    const struct tokenizer *tok;  /* borrowed; NULL: token ids only */
    struct encoder *enc;          /* owned */
    struct emb_config cfg;        /* owned */
    int max_len;                  /* tokens per sequence, specials included */
    bool pair_types;              /* a pair's second segment gets token type 1 (the tokenizer
                                   * returns token_type_ids: embedder_new) */
    /* an LM reranker (hp.lm_rerank, ADR 0098): the ids of "no" and "yes", the prompt's ids
     * before and after each formatted pair, and the instruction it names (owned) */
    int32_t rr_no, rr_yes;
    int32_t *rr_prefix, *rr_suffix;
    int n_rr_prefix, n_rr_suffix;
    char *rr_instruction;
};

/* Qwen3-Reranker's prompt (its model card's reference code): the system turn, then per pair
 * the user turn "<Instruct>: I\n<Query>: Q\n<Document>: D" and the assistant's empty think
 * block; the score is P(yes) = softmax over the last token's "no" / "yes" logits. */
#define EMB_RR_PREFIX "<|im_start|>system\nJudge whether the Document meets the requirements based " \
    "on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"." \
    "<|im_end|>\n<|im_start|>user\n"
#define EMB_RR_SUFFIX "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
#define EMB_RR_INSTRUCTION "Given a web search query, retrieve relevant passages that answer the query"

/* An embedder of m (an encoder prepared for be) with dir's sentence-transformers files. */
int embedder_new(struct embedder **out, const struct model *m, struct backend *be,
                 const struct tokenizer *tok, struct err *e);
void embedder_free(struct embedder *em);

/* Whether it scores pairs (a sequence-classification head, an LM reranker) rather than
 * embedding texts. */
bool embedder_is_reranker(const struct embedder *em);

/* An LM reranker's instruction (the model card's `instruction`; default EMB_RR_INSTRUCTION),
 * copied. -ERR_ARG for another model or an instruction over 64 KiB. */
int embedder_set_instruction(struct embedder *em, const char *text, struct err *e);

/* prompt (may be NULL) + text, with the tokenizer's post-processor (its single template's
 * special tokens; none when tokenizer.json has no post-processor, as transformers adds none),
 * into *it; it->skip is sentence-transformers' prompt_length (the prompt's ids with the
 * special tokens, less one). */
int embedder_tokenize(const struct embedder *em, const char *prompt, const char *text, size_t len,
                      bool truncate, struct emb_item *it, struct err *e);
/* A query / document pair as the tokenizer's pair template makes it (tok_encode_pair: BERT
 * [CLS] q [SEP] d [SEP]; RoBERTa <s> q </s></s> d </s>; no post-processor: q d with no
 * special token, as tokenizers' default processing concatenates them), into *it. The token
 * types are the template's when the tokenizer returns token_type_ids (transformers passes
 * them to the model then): tokenizer_config.json's model_input_names lists them, or, without
 * that key, its tokenizer_class is BERT's or ELECTRA's; else every type is 0. A pair template
 * the tokenizer lacks (a TemplateProcessing without "pair") is -ERR_UNSUPPORTED.
 * An LM reranker's pair: the prefix ids, then the user turn formatted from the instruction,
 * q and d, tokenized as one text (truncated at its end to the model's limit less the prefix
 * and suffix: the model card's max_length - len(prefix) - len(suffix)), then the suffix ids. */
int embedder_tokenize_pair(const struct embedder *em, const char *q, size_t ql, const char *d,
                           size_t dl, bool truncate, struct emb_item *it, struct err *e);
/* Token ids given as they are (no special tokens added), into *it. */
int embedder_ids(const struct embedder *em, const int32_t *ids, int n, bool truncate,
                 struct emb_item *it, struct err *e);

/* out[n, cfg.dim] for n items. */
int embedder_embed(struct embedder *em, const struct emb_item *items, int n, float *out,
                   struct err *e);
/* scores[n] of n pair items (a reranker of one label: -ERR_UNSUPPORTED for more; an LM
 * reranker: P(yes) of each item's last token). */
int embedder_score(struct embedder *em, const struct emb_item *items, int n, float *scores,
                   struct err *e);

#ifdef __cplusplus
}
#endif
