/*
 * encode: text -> ids, the pipeline of tok_impl.h run in order.
 *
 *   text ── added tokens (normalized = false) ──┬─> id
 *                                               └─ segment ─ normalizer ─ added tokens
 *                                                  (normalized = true) ─ pre-tokenizer
 *                                                  ─ byte-level map ─ BPE ─> ids
 *   then the post-processor's prefix/suffix ids when add_special is set.
 *
 * Added tokens are found leftmost-longest (as HF's Aho-Corasick matcher
 * does): at each byte only the tokens sharing its first byte are compared,
 * longest first. lstrip/rstrip extend a match over neighbouring Unicode
 * whitespace; single_word rejects a match touching a word character
 * (Unicode \w, as HF's regex check).
 *
 * All scratch (BPE arrays, the byte-level word buffer, PCRE2 match data,
 * the word cache) belongs to one call, so concurrent calls on one
 * tokenizer are safe without locks.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* Word cache: long texts repeat the same words (Zipf), and looking a word
 * up is several times cheaper than mapping and merging it again. It lives
 * for one call (so the tokenizer stays immutable), is only set up for
 * texts of at least WC_MIN_TEXT bytes, and holds at most WC_MAX_ENTRIES
 * words of at most WC_WORD_MAX bytes: a few MB at most. */
#define WC_MIN_TEXT    4096
#define WC_WORD_MAX    64     /* a word's ids <= its bytes, so both fit a uint8_t */
#define WC_MAX_ENTRIES 65536

struct wc_slot {
    uint32_t hash;
    uint32_t key_off;  /* word bytes in keys */
    uint32_t ids_off;  /* its ids in ids */
    uint8_t key_len;
    uint8_t n_ids;
    bool used;
};
struct word_cache {
    struct wc_slot *slots;  /* NULL: cache off */
    size_t mask, n, n_max;
    struct tok_pool keys;
    struct tok_ids ids;
};

struct enc {
    const struct tokenizer *t;
    struct tok_ids out;
    struct word_cache wc;
    struct tok_bpe_scratch bs;
    pcre2_match_data *md;
    char *map;  /* byte-level mapped word */
    size_t map_cap;
    struct err *e;
    /* tokenizers 0.23's early exit under truncation: once a text has limit
     * ids (counted from base), the words and added tokens after the word
     * that got there are dropped (0: no limit) */
    size_t limit, base;
    bool stop;
};

/* ---- word cache ---- */

static int wc_init(struct word_cache *wc, size_t text_len, struct err *e)
{
    size_t n_max = text_len / 16 + 64, cap = 64;
    if (n_max > WC_MAX_ENTRIES)
        n_max = WC_MAX_ENTRIES;
    while (cap < 2 * n_max)
        cap *= 2;
    wc->slots = calloc(cap, sizeof *wc->slots);
    if (!wc->slots)
        return err_setf(e, ERR_NOMEM, "encode: word cache of %zu slots", cap);
    wc->mask = cap - 1;
    wc->n_max = n_max;
    return 0;
}

static void wc_deinit(struct word_cache *wc)
{
    free(wc->slots);
    tok_pool_deinit(&wc->keys);
    free(wc->ids.v);
}

/* Returns the slot holding w, or the empty slot where it would go. */
static struct wc_slot *wc_find(const struct word_cache *wc, const char *w, size_t len,
                               uint32_t h)
{
    for (size_t i = h & wc->mask;; i = (i + 1) & wc->mask) {
        struct wc_slot *sl = &wc->slots[i];
        if (!sl->used || (sl->hash == h && sl->key_len == len &&
                          memcmp(wc->keys.buf + sl->key_off, w, len) == 0))
            return sl;
    }
}

/* Remembers that w encodes to ids[0..n). Silently does nothing when full. */
static int wc_put(struct word_cache *wc, struct wc_slot *sl, const char *w, size_t len, uint32_t h,
                  const int32_t *ids, size_t n, struct err *e)
{
    int rc;
    if (wc->n >= wc->n_max || n > UINT8_MAX)
        return 0;
    sl->hash = h;
    sl->key_len = (uint8_t)len;
    sl->n_ids = (uint8_t)n;
    sl->ids_off = (uint32_t)wc->ids.n;
    if ((rc = tok_pool_add(&wc->keys, w, len, &sl->key_off, e)) < 0)
        return rc;
    if ((rc = tok_ids_append(&wc->ids, ids, n, e)) < 0)
        return rc;
    sl->used = true;
    wc->n++;
    return 0;
}

/* ---- model ---- */

/* Runs the model on one word (already in the vocab's alphabet). */
static int model_ids(struct enc *c, const char *w, size_t len)
{
    switch (c->t->model) {
    case TOK_MODEL_UNIGRAM:
        return tok_uni_word(c->t, w, len, &c->out, c->e);
    case TOK_MODEL_WORDPIECE:
        return tok_wp_word(c->t, w, len, &c->out, c->e);
    case TOK_MODEL_WORDLEVEL:
        return tok_wl_word(c->t, w, len, &c->out, c->e);
    default:
        return tok_bpe_word(c->t, &c->bs, w, len, &c->out, c->e);
    }
}

/* Runs the model on one word of at most TOK_WORD_MAX bytes (any length for
 * WordPiece and WordLevel), byte-level mapped first when the pre-tokenizer
 * ends with ByteLevel. */
static int chunk_ids(struct enc *c, const char *w, size_t len)
{
    const struct tok_bytelevel *bl = &c->t->bl;
    if (!c->t->pretok.byte_level)
        return model_ids(c, w, len);
    if (len > SIZE_MAX / 2 - 256)
        return err_setf(c->e, ERR_RANGE, "encode: %zu-byte word", len);
    if (2 * len > c->map_cap) {
        size_t cap = 2 * len < 256 ? 256 : 2 * len;
        char *nm = realloc(c->map, cap);
        if (!nm)
            return err_setf(c->e, ERR_NOMEM, "encode: %zu-byte word", len);
        c->map = nm;
        c->map_cap = cap;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)w[i];
        c->map[n] = bl->enc[b][0];
        c->map[n + 1] = bl->enc[b][1];
        n += bl->enc_len[b];
    }
    return model_ids(c, c->map, n);
}

/* BPE scratch costs ~100 bytes per byte of a word, so a word longer than
 * TOK_WORD_MAX (only ever seen in hostile input: one run of 256 KiB of
 * letters) is cut at character boundaries into pieces of at most that
 * size. Up to that length the result is exactly HF's. */
static int word_ids(struct enc *c, const char *w, size_t len)
{
    int rc;
    /* WordPiece counts a word's characters against max_input_chars_per_word
     * and WordLevel looks the word up whole: both cost O(len) and are never
     * cut. Unigram's lattice is cut as BPE is. */
    if (c->t->model == TOK_MODEL_WORDPIECE || c->t->model == TOK_MODEL_WORDLEVEL)
        return chunk_ids(c, w, len);
    while (len > TOK_WORD_MAX) {
        size_t cut = TOK_WORD_MAX;
        while (cut > 0 && ((unsigned char)w[cut] & 0xC0) == 0x80)
            cut--;
        if ((rc = chunk_ids(c, w, cut)) < 0)
            return rc;
        w += cut;
        len -= cut;
    }
    return chunk_ids(c, w, len);
}

/* One word through the cache (when on and the word is short) and the model. */
static int cached_word(struct enc *c, const char *w, size_t len)
{
    int rc;
    if (!c->wc.slots || len > WC_WORD_MAX)
        return word_ids(c, w, len);
    uint32_t h = tok_hash_str(w, len);
    struct wc_slot *sl = wc_find(&c->wc, w, len, h);
    if (sl->used)
        return tok_ids_append(&c->out, c->wc.ids.v + sl->ids_off, sl->n_ids, c->e);
    size_t n0 = c->out.n;
    if ((rc = word_ids(c, w, len)) < 0)
        return rc;
    return wc_put(&c->wc, sl, w, len, h, c->out.v + n0, c->out.n - n0, c->e);
}

static bool is_meta(const char *w, size_t len, size_t i)
{
    return i + 3 <= len && memcmp(w + i, TOK_META, 3) == 0;
}

/* SentencePiece-style tokenizers without a splitting pre-tokenizer hand the
 * model whole segments ("\u2581Hello\u2581world..."). When the vocab has no
 * piece with U+2581 right after another character (tokenizer.spm_cut,
 * checked at load), no merge can join the text on both sides of such a
 * U+2581, so BPE of the segment equals BPE of the pieces cut before each
 * U+2581 that follows another character: exactly HF's result, but with
 * short words that the cache serves. */
static int on_word(void *ctx, const char *w, size_t len)
{
    struct enc *c = ctx;
    int rc;
    if (c->stop)
        return 0;
    if (!c->t->spm_cut) {
        rc = cached_word(c, w, len);
    } else {
        size_t start = 0;
        for (size_t i = 1; i < len; i++) {
            if (!is_meta(w, len, i) || (i >= 3 && is_meta(w, len, i - 3)))
                continue;
            if ((rc = cached_word(c, w + start, i - start)) < 0)
                return rc;
            start = i;
        }
        rc = cached_word(c, w + start, len - start);
    }
    if (c->limit > 0 && c->out.n - c->base >= c->limit)
        c->stop = true;
    return rc;
}

/* ---- added tokens ---- */

typedef int (*seg_fn)(struct enc *c, const char *s, size_t len, bool first);

/* The code point just before s[i] / at s[i] (-1 at the ends). */
static int32_t cp_before(const char *s, size_t i)
{
    int32_t cp = -1;
    if (i > 0) {
        size_t p = tok_utf8_prev(s, i);
        tok_utf8_next(s + p, i - p, &cp);
    }
    return cp;
}

static int32_t cp_at(const char *s, size_t len, size_t i)
{
    int32_t cp = -1;
    if (i < len)
        tok_utf8_next(s + i, len - i, &cp);
    return cp;
}

/* Returns the longest added token of set matching at s[i], or NULL. */
static const struct tok_added *match_at(const struct tokenizer *t, const struct tok_added_set *set,
                                        const char *s, size_t len, size_t i)
{
    unsigned char b = (unsigned char)s[i];
    for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
        const struct tok_added *a = &t->added[set->idx[k]];
        if (a->mlen <= len - i && memcmp(t->pool.buf + a->moff, s + i, a->mlen) == 0)
            return a;
    }
    return NULL;
}

/* Splits s by the tokens of set, as HF's AddedVocabulary::find_matches:
 * leftmost-longest, non-overlapping; a single_word token touching a word
 * character (Unicode \w) is not a match and its text is skipped over;
 * lstrip/rstrip take in the Unicode whitespace around a match. Matches
 * become ids, the text between them goes to seg. first: s starts the
 * original text. */
static int split_added(struct enc *c, const struct tok_added_set *set, const char *s, size_t len,
                       bool first, seg_fn seg)
{
    size_t seg_start = 0, i = 0;
    int rc;
    while (i < len) {
        unsigned char b = (unsigned char)s[i];
        const struct tok_added *a = set->start[b] == set->start[b + 1] ? NULL
                                                                       : match_at(c->t, set, s, len, i);
        if (!a) {
            i++;
            continue;
        }
        size_t ms = i, me = i + a->mlen;
        if (a->single_word && (tok_cp_is_word(cp_before(s, ms)) || tok_cp_is_word(cp_at(s, len, me)))) {
            i = me;
            continue;
        }
        while (a->lstrip && ms > seg_start && tok_cp_is_space(cp_before(s, ms)))
            ms = tok_utf8_prev(s, ms);
        while (a->rstrip && me < len && tok_cp_is_space(cp_at(s, len, me)))
            me += tok_utf8_next(s + me, len - me, &(int32_t){0});
        if (ms > seg_start && (rc = seg(c, s + seg_start, ms - seg_start, first && seg_start == 0)) < 0)
            return rc;
        if (!c->stop && (rc = tok_ids_push(&c->out, a->id, c->e)) < 0)
            return rc;
        seg_start = i = me;
    }
    if (len > seg_start)
        return seg(c, s + seg_start, len - seg_start, first && seg_start == 0);
    return 0;
}

/* ---- segments ---- */

static int seg_pretok(struct enc *c, const char *s, size_t len, bool first)
{
    return tok_pretok_run(c->t, c->md, s, len, first, on_word, c, c->e);
}

/* A segment between raw-matched added tokens: normalize, then split out the
 * normalized added tokens, then pre-tokenize the rest. */
static int seg_normalize(struct enc *c, const char *s, size_t len, bool first)
{
    const struct tokenizer *t = c->t;
    char *ns = NULL;
    size_t nlen = 0;
    int rc;
    if (t->norm.n == 0)
        return t->n_added_norm ? split_added(c, &t->added_norm, s, len, first, seg_pretok)
                               : seg_pretok(c, s, len, first);
    if ((rc = tok_norm_apply(t, c->md, s, len, &ns, &nlen, c->e)) < 0)
        return rc;
    rc = t->n_added_norm ? split_added(c, &t->added_norm, ns, nlen, first, seg_pretok)
                         : seg_pretok(c, ns, nlen, first);
    free(ns);
    return rc;
}

/* ---- public ---- */

/* The ids of one text without special tokens, appended to c->out (c->md
 * and the cache set up by the caller). */
static int encode_text(struct enc *c, const char *text, size_t len)
{
    if (len > TOK_TEXT_MAX)
        return err_setf(c->e, ERR_RANGE, "encode: text of %zu bytes (limit %zu)", len,
                        TOK_TEXT_MAX);
    if (len > 0 && !text)
        return err_setf(c->e, ERR_ARG, "encode: NULL text");
    size_t bad = len ? tok_utf8_check(text, len) : 0;
    if (bad < len)
        return err_setf(c->e, ERR_ARG, "encode: text is not valid UTF-8 at byte %zu", bad);
    if (len == 0)
        return 0;
    return split_added(c, &c->t->added_raw, text, len, true, seg_normalize);
}

static void enc_deinit(struct enc *c)
{
    pcre2_match_data_free(c->md);
    wc_deinit(&c->wc);
    tok_bpe_scratch_deinit(&c->bs);
    free(c->map);
}

/* Sets up c for texts of len bytes in all. */
static int enc_init(struct enc *c, const struct tokenizer *t, size_t len, struct err *e)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    c->e = e;
    c->md = pcre2_match_data_create(1, NULL);
    if (!c->md)
        return err_setf(e, ERR_NOMEM, "encode: PCRE2 match data");
    if (len >= WC_MIN_TEXT && len <= TOK_TEXT_MAX)
        return wc_init(&c->wc, len, e);
    return 0;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, struct err *e)
{
    struct enc c;
    int rc;
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_TEXT_MAX)
        return err_setf(e, ERR_RANGE, "encode: text of %zu bytes (limit %zu)", len, TOK_TEXT_MAX);
    rc = enc_init(&c, t, len, e);
    for (int i = 0; add_special && i < t->post.n_prefix && rc == 0; i++)
        rc = tok_ids_push(&c.out, t->post.prefix[i], e);
    if (rc == 0)
        rc = encode_text(&c, text, len);
    for (int i = 0; add_special && i < t->post.n_suffix && rc == 0; i++)
        rc = tok_ids_push(&c.out, t->post.suffix[i], e);
    if (rc == 0 && !c.out.v) {  /* always hand back an array, even for no ids */
        rc = tok_ids_push(&c.out, 0, e);
        c.out.n = 0;
    }
    enc_deinit(&c);
    if (rc < 0) {
        free(c.out.v);
        return rc;
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return 0;
}

int tok_encode_pair(const struct tokenizer *t, const char *a, size_t a_len, const char *b,
                    size_t b_len, const struct tok_encode_opts *o, struct tok_encoding *out,
                    struct err *e)
{
    struct enc c;
    struct tok_ids ia = {0};
    int rc;
    memset(out, 0, sizeof *out);
    if (a_len > TOK_TEXT_MAX || (b && b_len > TOK_TEXT_MAX - a_len))
        return err_setf(e, ERR_RANGE, "encode: texts of %zu bytes (limit %zu)",
                        a_len + (b ? b_len : 0), TOK_TEXT_MAX);
    rc = enc_init(&c, t, a_len + (b ? b_len : 0), e);
    /* tokenizers' early exit applies to the first text unless only the
     * second may be cut, and always to the second */
    c.limit = o->strategy == TOK_TRUNC_ONLY_SECOND ? 0 : o->max_length;
    if (rc == 0 && (rc = encode_text(&c, a, a_len)) == 0) {
        ia = c.out;  /* the cache is shared; each text gets its own id list */
        c.out = (struct tok_ids){0};
        c.limit = o->max_length;
        c.stop = false;
        if (b)
            rc = encode_text(&c, b, b_len);
    }
    if (rc == 0)
        rc = tok_post_assemble(t, &ia, b ? &c.out : NULL, o, out, e);
    enc_deinit(&c);
    free(ia.v);
    free(c.out.v);
    return rc;
}
