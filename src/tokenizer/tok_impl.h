/*
 * tok_impl.h: internals shared by the tokenizer's .c files. Not for use
 * outside src/tokenizer/.
 *
 * The encode pipeline mirrors Hugging Face `tokenizers`, one stage per file,
 * each stage a flat list of steps loaded from tokenizer.json (a Sequence is
 * flattened at load; see docs/adr/0008-tokenizer-pipeline.md):
 *   added tokens (encode.c)     split out before anything else, matched
 *                               leftmost-longest on the raw text
 *   normalizer   (normalize.c)  NFC/NFD/NFKC/NFKD, Lowercase, Strip,
 *                               Prepend, Replace, ByteLevel
 *   pre-tokenizer(pretok.c)     steps that rewrite and cut a segment into
 *                               words (Split, ByteLevel, Metaspace, Digits...)
 *   model        (bpe.c)        BPE over one word with merge ranks
 *                (wordpiece.c)  WordPiece (greedy longest match) and WordLevel
 *                (unigram.c)    Unigram (Viterbi over the vocab's scores)
 *   post-process (post.c)       special ids and type ids of a single text or a
 *                               pair (Template/Bert/RobertaProcessing), truncation
 * and decoding goes through decode.c (a list of decoder steps over the
 * token strings, as HF's decode_chain). Shared containers (string pool,
 * hash tables, id vector, byte buffer) and UTF-8 helpers live in tables.c,
 * Unicode classes in normalize.c and uccat.c (the old tables tokenizers
 * takes some classes from), the Precompiled charsmap in charsmap.c.
 *
 * A loaded tokenizer is immutable: every function taking a const tokenizer
 * is safe to call from several threads; per-call scratch lives on the stack
 * or in the caller's objects.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <pcre2.h>

#include "tokenizer.h"

/* Bounds on hostile input. tokenizer.json files in the wild are <= ~12 MB
 * (Qwen3 11 MB); 64 MiB leaves room and caps what a bad file can cost. */
#define TOK_JSON_MAX   ((size_t)64 << 20)
#define TOK_CONFIG_MAX ((size_t)16 << 20)  /* tokenizer_config.json (big chat templates) */
#define TOK_TEXT_MAX   ((size_t)64 << 20)  /* one tok_encode call */
#define TOK_ID_LIMIT   (1 << 24)           /* ids must be < 2^24 */
#define TOK_WORD_MAX   ((size_t)256 << 10) /* longer words are cut (encode.c) */
/* Ids may have holes, but the id table is allocated up to the highest id, so
 * highest id + 1 must stay below 2 * (number of entries) + TOK_ID_SLACK. */
#define TOK_ID_SLACK   65536
#define TOK_STEPS_MAX  8   /* normalizer / pre-tokenizer steps in a Sequence */
#define TOK_POST_MAX   8   /* special ids a post-processor adds on one side */
#define TOK_JSON_DEPTH 128 /* nesting the span reader (jscan.c) accepts */
#define TOK_AFFIX_MAX  32  /* BPE continuing_subword_prefix / end_of_word_suffix bytes */
#define TOK_TYPE_ID_MAX 65535  /* post-processor type ids (real ones are 0..2) */
#define TOK_CHARSMAP_MAX ((size_t)16 << 20)  /* Precompiled charsmap, decoded bytes */

/* ---- containers (tables.c) ---- */

/* Append-only string storage; strings are NUL-terminated and addressed by
 * offset because the buffer moves when it grows. */
struct tok_pool {
    char *buf;
    size_t n, cap;
};
int tok_pool_add(struct tok_pool *p, const char *s, size_t len, uint32_t *off, struct err *e);
/* Makes room for extra more bytes (one realloc instead of many doublings). */
int tok_pool_reserve(struct tok_pool *p, size_t extra, struct err *e);
void tok_pool_deinit(struct tok_pool *p);

uint32_t tok_hash_str(const char *s, size_t len);

/* Open-addressing map from a pooled string to an id. Sized once at init for
 * n_max keys (load <= 2/3), so puts never rehash. */
struct tok_strslot {
    uint32_t hash;
    int32_t id;   /* -1 = empty */
    uint32_t off; /* key in the pool */
    uint32_t len;
};
struct tok_strmap {
    struct tok_strslot *slots;
    size_t mask;
    size_t n, n_max;
};
int tok_strmap_init(struct tok_strmap *m, size_t n_max, struct err *e);
void tok_strmap_deinit(struct tok_strmap *m);
/* Insert pool string (off, len) -> id. Returns 0, or the existing id + 1
 * (> 0) when the key is already present (nothing changes), or -ERR_INTERNAL
 * when full. */
int tok_strmap_put(struct tok_strmap *m, const struct tok_pool *p, uint32_t off, uint32_t len,
                   int32_t id);
int32_t tok_strmap_get(const struct tok_strmap *m, const struct tok_pool *p, const char *s,
                       size_t len);

/* Map from an ordered id pair (a merge) to its rank and merged id. */
struct tok_pairslot {
    uint64_t key;  /* 0 = empty; else ((a + 1) << 32) | b */
    int32_t rank;
    int32_t id;
};
struct tok_pairmap {
    struct tok_pairslot *slots;
    size_t mask;
    size_t n, n_max;
};
int tok_pairmap_init(struct tok_pairmap *m, size_t n_max, struct err *e);
void tok_pairmap_deinit(struct tok_pairmap *m);
/* Returns 0, 1 when the pair is already present (first one kept), or
 * -ERR_INTERNAL when full. */
int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const struct tok_pairslot *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b);

/* Growable byte buffer owned by its user (free p); p is NUL-terminated
 * once anything (even "") was put. */
struct tok_buf {
    char *p;
    size_t n, cap;
};
int tok_buf_put(struct tok_buf *b, const char *s, size_t n, struct err *e);

/* Growable id array owned by its user (free v). */
struct tok_ids {
    int32_t *v;
    size_t n, cap;
};
/* Append one id / n ids (ids must not point into v). Errors: ERR_NOMEM. */
int tok_ids_push(struct tok_ids *v, int32_t id, struct err *e);
int tok_ids_append(struct tok_ids *v, const int32_t *ids, size_t n, struct err *e);

/* ---- JSON spans (jscan.c) ---- */

/* A byte range of the tokenizer.json text. */
struct tok_span {
    const char *p;  /* NULL: absent */
    size_t len;
};
/* A read position in a span. */
struct tok_jcur {
    const char *p, *end;
};
/* Finds the values of the top-level "model" object's "vocab" and "merges"
 * (first occurrences; p = NULL when absent). Returns 0, or -1 when the
 * text is not well-formed enough to walk (cJSON then reports where). */
int tok_json_model_spans(const char *text, size_t len, struct tok_span *vocab,
                         struct tok_span *merges);
/* Skips whitespace and consumes ch when it comes next. */
bool tok_json_lit(struct tok_jcur *c, char ch);
/* Skips whitespace; true when ch comes next (not consumed). */
bool tok_json_peek(struct tok_jcur *c, char ch);
/* Reads a JSON string into o (reset first, NUL-terminated), unescaped.
 * Errors: ERR_FORMAT (message without position; the caller adds it). */
int tok_json_string(struct tok_jcur *c, struct tok_buf *o, struct err *e);
int tok_json_number(struct tok_jcur *c, double *v, struct err *e);

/* ---- UTF-8 (tables.c) ---- */

/* Byte offset of the first invalid sequence in s, or n when all valid. */
size_t tok_utf8_check(const char *s, size_t n);
/* Decodes the character at s[0] of valid UTF-8 (n bytes left) into *cp;
 * returns its length (0 when n == 0). */
size_t tok_utf8_next(const char *s, size_t n, int32_t *cp);
/* Start of the character ending at s[end - 1]. */
size_t tok_utf8_prev(const char *s, size_t end);
/* Unicode White_Space (Rust char::is_whitespace, regex \s). */
bool tok_cp_is_space(int32_t cp);
/* Rust regex \w: letters, marks, decimal and letter numbers, connector
 * punctuation, Join_Control. */
bool tok_cp_is_word(int32_t cp);

/* The classes tokenizers takes from old crates (uccat.c, about Unicode 9):
 * unicode_categories' Cc|Cf|Co, Mn and punctuation (the latter as a PCRE2
 * class, with ASCII punctuation), unicode-normalization-alignments' marks. */
bool tok_cp_is_bert_other(int32_t cp);
bool tok_cp_is_bert_mn(int32_t cp);
bool tok_cp_is_combining_mark(int32_t cp);
extern const char tok_punct_class[];

/* GPT-2 byte-level alphabet: each byte maps to one printable code point
 * (printable Latin-1 bytes map to themselves, the rest to U+0100 + k). */
#define TOK_BL_CP_MAX 0x144  /* every mapped code point is below this */
struct tok_bytelevel {
    char enc[256][2];          /* UTF-8 of the code point for each byte */
    uint8_t enc_len[256];
    int16_t dec[TOK_BL_CP_MAX]; /* code point -> byte, -1 when unmapped */
};
void tok_bytelevel_init(struct tok_bytelevel *bl);

/* ---- id table ---- */

enum tok_entry_flag {
    TOK_E_MODEL   = 1,  /* id is in model.vocab */
    TOK_E_ADDED   = 2,  /* id is an added token; off/len is its content */
    TOK_E_SPECIAL = 4,  /* added token with special = true */
};
struct tok_entry {
    uint32_t off;  /* piece in the pool (added content wins over the model piece) */
    uint32_t len;
    uint8_t flags; /* enum tok_entry_flag; 0 = hole */
};

/* ---- model: BPE (bpe.c) ---- */

struct tok_bpe {
    struct tok_strmap vocab;   /* model.vocab only, not added tokens */
    struct tok_pairmap merges;
    int32_t unk_id;            /* -1: unknown characters are dropped (as HF does) */
    bool fuse_unk;
    bool byte_fallback;        /* unknown chars -> <0xXX> pieces (SentencePiece style) */
    bool ignore_merges;        /* a word already in the vocab is one token (Llama 3) */
    int32_t byte_tok[256];     /* ids of "<0xXX>", -1 when absent */
    /* continuing_subword_prefix / end_of_word_suffix ("" when unset): added
     * to every character but the first / to the last before lookup. */
    char prefix[TOK_AFFIX_MAX + 1], suffix[TOK_AFFIX_MAX + 1];
    size_t prefix_len, suffix_len;
};

struct bpe_sym;
struct bpe_cand;
/* Per-call scratch for tok_bpe_word, grown on demand; owned by the caller. */
struct tok_bpe_scratch {
    struct bpe_sym *sym;
    size_t cap_sym;
    struct bpe_cand *heap;
    size_t cap_heap;
};
void tok_bpe_scratch_deinit(struct tok_bpe_scratch *s);

/* model.vocab as read from its span: the pieces are in the tokenizer's pool. */
struct tok_vlist {
    uint32_t *off, *len;
    int32_t *id;
    size_t n;
    int32_t max_id;
};
void tok_vlist_deinit(struct tok_vlist *v);

struct tokenizer;
/* Reads the model.vocab object at sp into v (pieces into t's pool), checking
 * ids are integers in [0, 2^24) and pieces valid UTF-8 of at most
 * TOK_PIECE_MAX bytes. Errors: ERR_FORMAT (with the byte offset), ERR_NOMEM. */
int tok_bpe_read_vocab(struct tokenizer *t, struct tok_span sp, struct tok_vlist *v,
                       struct err *e);
/* Fills t->bpe from the model options (cJSON), the vocab list and the
 * model.merges span, and the id table (which tok_load sized beforehand).
 * Errors: ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOMEM. */
int tok_bpe_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                 struct tok_span merges, struct err *e);
void tok_bpe_deinit(struct tok_bpe *b);
/* Appends the ids of one pre-tokenized word (already in the vocab's
 * alphabet, e.g. byte-level mapped) to out. */
int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const char *w, size_t len,
             struct tok_ids *out, struct err *e);

/* ---- regexes (normalize.c) ---- */

/* Compiles pat (len bytes) with UTF (+UCP unless literal), JIT when
 * available. what names the component in errors (-ERR_UNSUPPORTED). */
int tok_regex_compile(pcre2_code **out, const char *pat, size_t len, bool literal,
                      const char *what, struct err *e);
/* Compiles a tokenizer.json pattern object {"Regex": ...} or {"String": ...}. */
int tok_pattern_load(pcre2_code **re, const cJSON *pattern, const char *what, struct err *e);

/* ---- normalizer (normalize.c) ---- */

enum tok_norm_kind {
    TOK_NORM_NFC = 1,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_BYTELEVEL,
    TOK_NORM_BERT,         /* BertNormalizer */
    TOK_NORM_STRIP_ACCENTS,/* StripAccents: drop marks (after an NFD the file puts first) */
    TOK_NORM_PRECOMPILED,  /* SentencePiece charsmap (charsmap.c) */
};
struct tok_charsmap;
struct tok_norm_step {
    enum tok_norm_kind kind;
    bool left, right;   /* Strip */
    /* BertNormalizer; strip_accents is resolved at load (null: = lowercase) */
    bool clean_text, chinese, strip_accents, lowercase;
    struct tok_charsmap *cmap;  /* Precompiled (owned) */
    char *str;          /* Prepend's string, Replace's content (owned) */
    size_t str_len;
    pcre2_code *re;     /* Replace's pattern (a literal is compiled as one) */
};
struct tok_norm {
    int n;  /* 0 = no normalizer */
    struct tok_norm_step step[TOK_STEPS_MAX];
};
/* Reads the "normalizer" section (NULL or null: none). Errors: ERR_FORMAT,
 * ERR_UNSUPPORTED (naming the type), ERR_NOMEM; partial state is freed by
 * tok_norm_deinit. */
int tok_norm_load(struct tok_norm *nm, const cJSON *j, struct err *e);
void tok_norm_deinit(struct tok_norm *nm);
struct tokenizer;
/* Runs t's normalizer over s[0..len) into a malloc'd NUL-terminated *out
 * (caller frees). md: match data for Replace. Errors: ERR_NOMEM, ERR_RANGE. */
int tok_norm_apply(const struct tokenizer *t, pcre2_match_data *md, const char *s, size_t len,
                   char **out, size_t *out_len, struct err *e);

/* ---- pre-tokenizer (pretok.c) ---- */

enum tok_pre_kind {
    TOK_PRE_SPLIT = 1,     /* regex or literal split */
    TOK_PRE_BYTELEVEL,     /* optional " " prefix, GPT-2 regex (use_regex), byte mapping */
    TOK_PRE_METASPACE,     /* " " -> U+2581, prepend, split before each U+2581 */
};
enum tok_split_behavior {
    TOK_SPLIT_ISOLATED = 1,
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};
enum tok_prepend {
    TOK_PREPEND_ALWAYS = 1,
    TOK_PREPEND_FIRST,   /* only for the piece at the start of the text */
    TOK_PREPEND_NEVER,
};
struct tok_pre_step {
    enum tok_pre_kind kind;
    pcre2_code *re;  /* NULL: no split (ByteLevel without use_regex, Metaspace split=false) */
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space;  /* ByteLevel */
    char repl[8];           /* Metaspace replacement (one character) */
    size_t repl_len;
    enum tok_prepend prepend;
};
struct tok_pretok {
    int n;
    struct tok_pre_step step[TOK_STEPS_MAX];
    bool byte_level;  /* the last step is ByteLevel: the encoder maps words' bytes */
};
/* Reads the "pre_tokenizer" section (NULL or null: none). Same error and
 * cleanup contract as tok_norm_load. */
int tok_pretok_load(struct tok_pretok *p, const cJSON *j, struct err *e);
void tok_pretok_deinit(struct tok_pretok *p);
/* Called once per word (a span of the segment given to tok_pretok_run). */
typedef int (*tok_word_fn)(void *ctx, const char *w, size_t len);
/* Cuts s[0..len) (valid UTF-8) into words with t's pre-tokenizer and calls
 * fn on each, in order. first: s starts the original text (Metaspace
 * prepend_scheme "first"). md must hold at least one ovector pair. Stops
 * at fn's first error. */
int tok_pretok_run(const struct tokenizer *t, pcre2_match_data *md, const char *s, size_t len,
                   bool first, tok_word_fn fn, void *ctx, struct err *e);

/* ---- added tokens and post-processor (tokenizer.c, used by encode.c) ---- */

struct tok_added {
    int32_t id;
    uint32_t off, len;    /* content in the pool */
    uint32_t moff, mlen;  /* what is matched: the content, normalized when normalized */
    bool special, lstrip, rstrip, single_word, normalized;
};
/* Added tokens of one kind (normalized or not), grouped by first byte and
 * longest first within a group, for leftmost-longest matching. */
struct tok_added_set {
    uint32_t *idx;         /* indices into tokenizer.added */
    uint32_t start[257];   /* idx[start[b] .. start[b+1]) begin with byte b */
};

/* One item of a pair template: a special id, or sequence A or B. */
#define TOK_POST_SEQ_A (-1)
#define TOK_POST_SEQ_B (-2)
#define TOK_POST_PAIR_MAX (2 * TOK_POST_MAX + 2)
struct tok_post_item {
    int32_t id;       /* >= 0: special id; TOK_POST_SEQ_A / TOK_POST_SEQ_B */
    int32_t type_id;
};
struct tok_post {
    int n_prefix, n_suffix;
    int32_t prefix[TOK_POST_MAX];  /* ids before the sequence (e.g. BOS) */
    int32_t suffix[TOK_POST_MAX];  /* ids after it (e.g. EOS) */
    int32_t prefix_type[TOK_POST_MAX], suffix_type[TOK_POST_MAX];
    int32_t type_a;                /* type id of the single sequence */
    bool all_zero;                 /* RobertaProcessing: every type id is 0, even without specials */
    /* the pair template; n_pair = 0: none (A:0 B:1, no special ids) */
    int n_pair;
    struct tok_post_item pair[TOK_POST_PAIR_MAX];
};

enum tok_dec_kind {
    TOK_DEC_BYTELEVEL = 1,  /* byte-level characters -> bytes, all tokens joined, lossy UTF-8 */
    TOK_DEC_BYTEFALLBACK,   /* runs of <0xXX> tokens -> their bytes (U+FFFD per byte if invalid) */
    TOK_DEC_FUSE,           /* all tokens joined into one */
    TOK_DEC_STRIP,          /* up to start/stop copies of a character off each token */
    TOK_DEC_REPLACE,        /* pattern -> content in each token */
    TOK_DEC_METASPACE,      /* replacement -> " ", dropped in the first token */
    TOK_DEC_BPE,            /* BPEDecoder: suffix -> " " ("" in the last token) */
    TOK_DEC_WORDPIECE,      /* prefix stripped, else " " before (not token 0); cleanup */
};
struct tok_dec_step {
    enum tok_dec_kind kind;
    pcre2_code *re;   /* Replace */
    char *str;        /* Replace content, BPEDecoder suffix (owned) */
    size_t str_len;
    char ch[8];       /* Strip content, Metaspace replacement (one character) */
    size_t ch_len;
    int start, stop;  /* Strip */
    bool prepend;     /* Metaspace: prepend_scheme != never */
    bool cleanup;     /* WordPiece: " ." -> "." and the like */
};
struct tok_dec {
    bool present;  /* false: no decoder, tokens are joined with " " (as HF) */
    int n;
    struct tok_dec_step step[TOK_STEPS_MAX];
};

enum tok_model_kind {
    TOK_MODEL_BPE = 1,
    TOK_MODEL_WORDPIECE,
    TOK_MODEL_WORDLEVEL,
    TOK_MODEL_UNIGRAM,
};

/* Unigram model (unigram.c); the piece -> id map is tok_bpe.vocab. */
struct tok_unigram {
    double *score;       /* [n_ids] log-probabilities */
    double unk_score;    /* lowest score - 10 (tokenizers' K_UNK_PENALTY) */
    int32_t unk_id;      /* -1: none */
    bool byte_fallback;  /* unknown pieces -> <0xXX> when all their bytes have one */
    size_t max_piece;    /* longest piece in bytes */
    size_t max_chars;    /* longest piece in characters (SentencePiece: <= 16) */
};

struct tokenizer {
    struct tok_pool pool;
    struct tok_entry *entry;  /* [n_ids] */
    int32_t n_ids;            /* highest id + 1 */
    enum tok_model_kind model;
    /* BPE; for WordPiece / WordLevel / Unigram only vocab (piece -> id),
     * unk_id, and for WordPiece prefix (continuing_subword_prefix) */
    struct tok_bpe bpe;
    size_t wp_max_chars;      /* WordPiece max_input_chars_per_word */
    size_t wp_max_piece;      /* WordPiece: longest vocab piece in bytes */
    size_t wp_piece_chars;    /* WordPiece: longest vocab piece in characters */
    struct tok_unigram uni;
    struct tok_added *added;  /* [n_added] */
    size_t n_added;
    struct tok_added_set added_raw;   /* normalized = false: matched on raw text */
    struct tok_added_set added_norm;  /* normalized = true: matched after the normalizer */
    size_t n_added_norm;
    struct tok_norm norm;
    struct tok_pretok pretok;
    struct tok_post post;
    struct tok_dec dec;
    struct tok_bytelevel bl;
    int32_t bos_id, eos_id;   /* -1 when none */
    bool spm_cut;  /* words may be cut before U+2581 (encode.c on_word; set by tok_spm_cut_ok) */
};

/* UTF-8 of U+2581, SentencePiece's space. */
#define TOK_META "\xE2\x96\x81"

/* Id of an added token's content or model piece, -1 when absent. */
int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len);

/* ---- other models (wordpiece.c, unigram.c) ---- */

/* Loads a WordPiece or WordLevel model: vocab ({piece: id}) as tok_bpe_load
 * does, unk_token, WordPiece's continuing_subword_prefix and
 * max_input_chars_per_word. Errors: ERR_FORMAT, ERR_NOMEM. */
int tok_wp_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                struct err *e);
/* Appends the ids of one word: WordPiece (greedy longest match, one unk for
 * a word that cannot be matched or is too long) or WordLevel (the word or
 * unk). Errors: ERR_FORMAT (unk needed but absent from the vocab), ERR_NOMEM. */
int tok_wp_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                struct err *e);
int tok_wl_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                struct err *e);

/* Reads a Unigram model.vocab ([[piece, score], ...], ids = positions)
 * into v (pieces into t's pool) and *scores (malloc'd [v->n], caller owns).
 * Errors: ERR_FORMAT (with the byte offset), ERR_NOMEM. */
int tok_uni_read_vocab(struct tokenizer *t, struct tok_span sp, struct tok_vlist *v,
                       double **scores, struct err *e);
/* Fills t->uni and t->bpe.vocab from the list (takes ownership of scores).
 * Errors: ERR_FORMAT (unk_id out of range, empty vocab), ERR_NOMEM. */
int tok_uni_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                 double *scores, struct err *e);
void tok_uni_deinit(struct tok_unigram *u);
/* Appends the Viterbi segmentation of one word. Errors: ERR_FORMAT (an
 * unknown character and no unk_id), ERR_NOMEM. */
int tok_uni_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                 struct err *e);

/* ---- Precompiled charsmap (charsmap.c) ---- */

/* Parses a base64 precompiled_charsmap (SentencePiece's: u32 trie size, a
 * darts-clone double array, then NUL-separated normalized strings) into
 * *out (caller frees with tok_charsmap_free). Errors: ERR_FORMAT (bad
 * base64, truncated blob, normalized strings not UTF-8), ERR_RANGE (over
 * TOK_CHARSMAP_MAX), ERR_NOMEM. */
int tok_charsmap_new(struct tok_charsmap **out, const char *b64, size_t len, struct err *e);
void tok_charsmap_free(struct tok_charsmap *m);
/* Normalizes s[0..len) (valid UTF-8) into o as tokenizers' Precompiled
 * normalizer: grapheme by grapheme, whole graphemes under 6 bytes first,
 * else character by character. Errors: ERR_FORMAT (an offset in the
 * charsmap leads outside it: hostile file), ERR_NOMEM. */
int tok_charsmap_apply(const struct tok_charsmap *m, const char *s, size_t len,
                       struct tok_buf *o, struct err *e);

/* ---- post-processor (post.c) ---- */

/* Reads the "post_processor" section (NULL or null: none) into t->post.
 * Errors: ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOMEM. */
int tok_post_load(struct tokenizer *t, const cJSON *j, struct err *e);
/* Builds the final encoding of a (and b: NULL for a single text): truncation
 * per o, then the template's special ids and type ids. out is owned by the
 * caller. Errors: ERR_RANGE (truncation impossible), ERR_UNSUPPORTED (pair
 * without a pair template), ERR_NOMEM. */
int tok_post_assemble(const struct tokenizer *t, const struct tok_ids *a, const struct tok_ids *b,
                      const struct tok_encode_opts *o, struct tok_encoding *out, struct err *e);
/* Appends special id `id` to the single template's prefix or suffix. */
int tok_post_push(struct tokenizer *t, bool prefix, int32_t id, struct err *e);

/* ---- decoding (decode.c) ---- */

/* Reads the "decoder" section (NULL or null: none) into t->dec. Errors:
 * ERR_FORMAT, ERR_UNSUPPORTED (naming the type), ERR_NOMEM; t->dec may then
 * be partly filled and is freed by tok_decoder_deinit. */
int tok_decoder_load(struct tokenizer *t, const cJSON *j, struct err *e);
void tok_decoder_deinit(struct tok_dec *d);
