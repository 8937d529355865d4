/*
 * tokenizer: text <-> token ids from a Hugging Face tokenizer.json.
 *
 * Supports byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer with the
 * GPT-2 split regex or a Split pre-tokenizer with a custom regex, PCRE2),
 * merges given as "a b" strings or [a, b] pairs, added/special tokens matched
 * before pre-tokenization, and the ByteLevel decoder.
 * tokenizer_config.json (optional) supplies bos/eos and add_bos_token.
 *
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

/* Load dir/tokenizer.json (+ dir/tokenizer_config.json when present). */
int tok_load(struct tokenizer **out, const char *dir, struct err *e);
/* Load from a tokenizer.json path (config optional: NULL). */
int tok_load_files(struct tokenizer **out, const char *tokenizer_json, const char *config_json,
                   struct err *e);
void tok_free(struct tokenizer *t);

int tok_vocab_size(const struct tokenizer *t);   /* highest id + 1 */
int32_t tok_bos_id(const struct tokenizer *t);   /* -1 when none */
int32_t tok_eos_id(const struct tokenizer *t);   /* -1 when none */
/* Piece string for an id (raw vocab string), or NULL when out of range. */
const char *tok_id_to_piece(const struct tokenizer *t, int32_t id);
bool tok_is_special(const struct tokenizer *t, int32_t id);

/* Encode len bytes of UTF-8 text. add_special applies the post-processor
 * (e.g. a BOS when the tokenizer's template adds one). *ids is malloc'd. */
int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, struct err *e);
/* Decode ids to a malloc'd NUL-terminated string. Ids out of range -> error. */
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
/* Largest decoded piece; longer vocab entries are rejected at load. */
#define TOK_PIECE_MAX 1024
/* Writes the complete UTF-8 text that id finishes to out (NUL-terminated);
 * cap must be >= TOK_PIECE_MAX + 16. Returns bytes written (>= 0) or a
 * negative error (id out of range). */
int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, struct err *e);
/* Bytes still pending at the end (an incomplete character) are emitted as U+FFFD. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
