/*
 * tokenizer: text <-> token ids from a Hugging Face tokenizer.json, matching
 * the Rust `tokenizers` library token for token.
 *
 * Supported components (anything else fails to load with -ERR_UNSUPPORTED
 * naming the type; nothing falls back silently):
 *   model           BPE: byte-level (GPT-2, Llama 3, Qwen) or SentencePiece
 *                   style (byte_fallback, unk_token, fuse_unk), ignore_merges,
 *                   continuing_subword_prefix / end_of_word_suffix; merges as
 *                   "a b" strings or [a, b] pairs; dropout is ignored.
 *                   WordPiece (BERT), WordLevel, Unigram (XLM-R, T5: Viterbi,
 *                   unk fusion, byte_fallback)
 *   normalizer      NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace
 *                   (string or regex), ByteLevel, BertNormalizer, StripAccents,
 *                   Precompiled (SentencePiece charsmap), Sequence
 *   pre_tokenizer   Split (regex or string, every behaviour, invert),
 *                   ByteLevel, Metaspace, Digits, Punctuation, Whitespace,
 *                   WhitespaceSplit, CharDelimiterSplit, BertPreTokenizer,
 *                   Sequence (regexes via PCRE2 with Unicode properties, JIT)
 *   added_tokens    special and normal, lstrip/rstrip/single_word/normalized,
 *                   matched leftmost-longest before normalization
 *   post_processor  TemplateProcessing (single and pair, type ids), ByteLevel,
 *                   RobertaProcessing, BertProcessing, Sequence
 *   decoder         ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
 *                   BPEDecoder, WordPiece, Sequence
 * tokenizer_config.json (optional) supplies bos/eos and add_bos_token /
 * add_eos_token.
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently on it.
 * Streaming detokenization (struct tok_stream) emits only complete UTF-8,
 * holding back partial characters and byte-fallback runs.
 * All inputs are untrusted: sizes are bounded, bad JSON is an error.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tokenizer;

/* Load dir/tokenizer.json (+ dir/tokenizer_config.json when present).
 * On success *out is owned by the caller (tok_free). Errors: -ERR_MISSING
 * (no tokenizer.json; the message names the path), -ERR_IO, -ERR_FORMAT
 * (invalid JSON, bad ids, duplicates, piece > TOK_PIECE_MAX bytes),
 * -ERR_RANGE (file over 64 MiB), -ERR_UNSUPPORTED (model/pre-tokenizer/...
 * type we do not handle, named in the message), -ERR_NOMEM. */
int tok_load(struct tokenizer **out, const char *dir, struct err *e);
/* Load from a tokenizer.json path (config optional: NULL). Same contract as tok_load. */
int tok_load_files(struct tokenizer **out, const char *tokenizer_json, const char *config_json,
                   struct err *e);
void tok_free(struct tokenizer *t);  /* NULL is a no-op */

int tok_vocab_size(const struct tokenizer *t);   /* highest id + 1 */
int32_t tok_bos_id(const struct tokenizer *t);   /* -1 when none */
int32_t tok_eos_id(const struct tokenizer *t);   /* -1 when none */
/* Piece string for an id (raw vocab string, or the added token's content),
 * or NULL when out of range or a hole. Borrowed: lives as long as t. */
const char *tok_id_to_piece(const struct tokenizer *t, int32_t id);
bool tok_is_special(const struct tokenizer *t, int32_t id);  /* added token with special */
/* Id of a piece (an added token's content first, then the model vocab, in
 * the vocab's own alphabet, e.g. "\u0120the"), or -1 when absent. */
int32_t tok_piece_to_id(const struct tokenizer *t, const char *piece);

/* Encode len bytes of UTF-8 text (added tokens such as "<|endoftext|>" in
 * the text are recognised). add_special applies the post-processor (e.g. a
 * BOS when the tokenizer's template adds one). *ids is malloc'd (non-NULL
 * on success, even for 0 ids) and owned by the caller. Errors: -ERR_RANGE
 * (len over 64 MiB), -ERR_ARG (invalid UTF-8, with its byte offset),
 * -ERR_FORMAT (a word needs an unk token the vocabulary lacks, as tokenizers
 * fails then, or a Precompiled charsmap points outside itself), -ERR_NOMEM. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, struct err *e);
/* Truncation strategies of tok_encode_pair, as tokenizers' TruncationStrategy. */
enum tok_trunc {
    TOK_TRUNC_LONGEST_FIRST = 0,  /* a pair: cut the longer text first (tokenizers' rule) */
    TOK_TRUNC_ONLY_FIRST = 1,
    TOK_TRUNC_ONLY_SECOND = 2,
};
struct tok_encode_opts {
    bool add_special;        /* the post-processor's special tokens ([CLS] ... [SEP]) */
    size_t max_length;       /* 0: no truncation; else at most this many ids, specials included */
    enum tok_trunc strategy;
};
/* One encoding: ids and their token type ids (segment ids: 0 for the first
 * text, 1 for the second with BERT's template), both malloc'd [n + 1] and
 * owned by the caller (tok_encoding_deinit). */
struct tok_encoding {
    int32_t *ids;
    int32_t *type_ids;
    size_t n;
};
/* Encodes text a, or the pair (a, b) when b is non-NULL (a reranker's
 * query and document), with the post-processor's pair template and type
 * ids, truncated as tokenizers does (Tokenizer::encode with a
 * TruncationParams of direction right and stride 0). Same input errors as
 * tok_encode, plus -ERR_RANGE when only_first / only_second cannot cut
 * enough (or only_second without b) and -ERR_UNSUPPORTED for a pair when
 * the template has none. out is zeroed on error. */
int tok_encode_pair(const struct tokenizer *t, const char *a, size_t a_len, const char *b,
                    size_t b_len, const struct tok_encode_opts *o, struct tok_encoding *out,
                    struct err *e);
void tok_encoding_deinit(struct tok_encoding *enc);  /* NULL is a no-op */

/* Decode ids to a malloc'd NUL-terminated string (caller frees).
 * skip_special drops special tokens. Byte sequences that are not valid
 * UTF-8 become U+FFFD. Ids out of range -> -ERR_RANGE. */
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **out, struct err *e);
/* tok_decode that also gives the text's length in *len: the text may hold NUL bytes (a
 * byte-level vocabulary decodes id of byte 0 to one, as transformers' decode keeps it), so
 * a caller that prints or stores the whole text must use *len, not strlen. */
int tok_decode_len(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                   char **out, size_t *len, struct err *e);

/* Largest piece in bytes; longer vocab entries are rejected at load. */
#define TOK_PIECE_MAX 1024
/* Ids a stream holds while it waits for a complete character. */
#define TOK_STREAM_WINDOW 8

/* The raw bytes token id contributes to decoded text in the middle of a
 * sequence (not its first token, not its last), as the decoder produces
 * them before any lossy UTF-8 repair: byte-level pieces map back through
 * the byte alphabet, "<0xNN>" byte-fallback pieces give that byte,
 * SentencePiece's U+2581 becomes a space (never dropped: not the first
 * token), and added tokens (special or not) give their content through the
 * same decoder steps, as tok_decode does. The result may be a partial UTF-8
 * character. Writes at most cap bytes to out (not NUL-terminated) and
 * returns the length; -ERR_RANGE for an id out of range or a hole, or when
 * the bytes do not fit cap (TOK_TOKEN_BYTES_MAX always fits); -ERR_NOMEM. */
#define TOK_TOKEN_BYTES_MAX (3 * TOK_PIECE_MAX + 1)
int tok_token_bytes(const struct tokenizer *t, int32_t id, char *out, size_t cap);

/* Streaming decoder: push one id at a time, get the text that is now final.
 * Plain value, no heap: no deinit needed. Fields are private. */
struct tok_stream {
    const struct tokenizer *tok;
    bool skip_special;
    int32_t ids[TOK_STREAM_WINDOW];  /* recent ids: n_ctx already emitted, then pending ones */
    int n_ids, n_ctx;
    bool mid;  /* ids have left the window: it no longer starts the text */
};
void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special);
/* An output buffer this large always fits one tok_stream_push or flush: the
 * text of a full window plus one id, each piece byte at most 3 bytes of
 * output (U+FFFD), plus a separator per token. */
#define TOK_STREAM_CAP ((TOK_STREAM_WINDOW + 1) * (3 * TOK_PIECE_MAX + 1) + 1)
/* Writes the text that id completes to out (NUL-terminated): nothing while
 * the text so far ends in an incomplete character or byte run, at most
 * TOK_STREAM_WINDOW ids long. cap >= TOK_STREAM_CAP always suffices.
 * Returns bytes written (>= 0) or a negative error: -ERR_RANGE for an id
 * out of range or output that does not fit cap, -ERR_NOMEM (the stream is
 * then unchanged). For valid text, concatenating every push and the flush
 * gives exactly tok_decode of the same ids, including decoders that treat
 * the first token differently (Metaspace, Strip). */
int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, struct err *e);
/* Writes what is still pending (U+FFFD for an incomplete character) and
 * resets the stream. Returns bytes written, -ERR_RANGE when it does not fit
 * cap, -ERR_NOMEM. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* The one UTF-8 validator of the program (the CLI escapes messages with it).
 * Scans the UTF-8 sequence starting at s[0] (n bytes available). Sets
 * *need to the length its lead byte announces (0: not a lead byte) and
 * returns how many bytes form a valid prefix of it: == *need for a complete
 * character, less for a maximal subpart that is cut short or broken. */
size_t tok_utf8_seq(const unsigned char *s, size_t n, size_t *need);

#ifdef __cplusplus
}
#endif
