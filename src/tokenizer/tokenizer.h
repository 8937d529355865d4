/*
 * tokenizer: text <-> token ids from a Hugging Face tokenizer.json.
 *
 * Supports BPE models (GPT-2 style: ByteLevel pre-tokenizer with the GPT-2
 * split regex; Llama-3/Qwen style: Split pre-tokenizer with a custom regex,
 * PCRE2, ignore_merges; NFC/NFKC normalizers), merges given as "a b"
 * strings or [a, b] pairs, added/special tokens matched before
 * pre-tokenization, TemplateProcessing/ByteLevel post-processors and the
 * ByteLevel decoder. Other component types (WordPiece/Unigram models,
 * Metaspace, ...) fail to load with -ERR_UNSUPPORTED naming the type.
 * tokenizer_config.json (optional) supplies bos/eos and add_bos_token.
 *
 * A loaded tokenizer is immutable: encode/decode may run concurrently on it.
 * Streaming detokenization (struct tok_stream) emits only complete UTF-8
 * characters, holding back partial sequences until the next token.
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
 * -ERR_NOMEM. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, struct err *e);
/* Decode ids to a malloc'd NUL-terminated string (caller frees).
 * skip_special drops special tokens. Byte sequences that are not valid
 * UTF-8 become U+FFFD. Ids out of range -> -ERR_RANGE. */
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **out, struct err *e);

/* Streaming decoder: push one id at a time, get the bytes that are now final. */
struct tok_stream {
    const struct tokenizer *tok;
    bool skip_special;
    unsigned char pending[8];  /* bytes of an incomplete UTF-8 character */
    int n_pending;
};
void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special);
/* Largest piece in bytes; longer vocab entries are rejected at load. */
#define TOK_PIECE_MAX 1024
/* An output buffer this large always fits one tok_stream_push: a token's
 * bytes plus 3 pending ones, each possibly becoming a 3-byte U+FFFD. */
#define TOK_STREAM_CAP (3 * (TOK_PIECE_MAX + 8) + 1)
/* Writes the complete UTF-8 text that id finishes to out (NUL-terminated).
 * cap >= TOK_STREAM_CAP always suffices; TOK_PIECE_MAX + 16 suffices
 * unless the token's bytes are invalid UTF-8. Returns bytes written (>= 0)
 * or a negative error: -ERR_RANGE for an id out of range or output that
 * does not fit cap (the stream is then unchanged). Concatenating every
 * push and the flush gives exactly tok_decode of the same ids. */
int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, struct err *e);
/* Bytes still pending at the end (an incomplete character) are emitted as
 * one U+FFFD. Returns bytes written (0 or 3), -ERR_RANGE when cap < 4. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
