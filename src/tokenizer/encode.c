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
 * longest first. lstrip/rstrip extend a match over neighbouring ASCII
 * whitespace; single_word rejects a match touching a word character (ASCII
 * alphanumerics, '_' and any non-ASCII byte, an approximation of HF's
 * Unicode check).
 *
 * All scratch (BPE arrays, the byte-level word buffer, PCRE2 match data)
 * belongs to one call, so concurrent calls on one tokenizer are safe.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

struct enc {
    const struct tokenizer *t;
    struct tok_ids out;
    struct bpe_scratch bs;
    pcre2_match_data *md;
    char *map;  /* byte-level mapped word */
    size_t map_cap;
    struct err *e;
};

/* ---- model ---- */

static int on_word(void *ctx, const char *w, size_t len)
{
    struct enc *c = ctx;
    const struct tok_bytelevel *bl = &c->t->bl;
    if (!c->t->pretok.byte_level)
        return bpe_word(c->t, &c->bs, w, len, &c->out, c->e);
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
    return bpe_word(c->t, &c->bs, c->map, n, &c->out, c->e);
}

/* ---- added tokens ---- */

typedef int (*seg_fn)(struct enc *c, const char *s, size_t len);

static bool is_ascii_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

static bool is_word_byte(char ch)
{
    unsigned char u = (unsigned char)ch;
    return u >= 0x80 || (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') ||
           (u >= 'A' && u <= 'Z') || u == '_';
}

/* Returns the added token matching at s[i] (longest first), or NULL. */
static const struct tok_added *match_at(const struct tokenizer *t, const struct tok_added_set *set,
                                        const char *s, size_t len, size_t i)
{
    unsigned char b = (unsigned char)s[i];
    for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
        const struct tok_added *a = &t->added[set->idx[k]];
        if (a->len > len - i || memcmp(t->pool.buf + a->off, s + i, a->len) != 0)
            continue;
        if (a->single_word && ((i > 0 && is_word_byte(s[i - 1])) ||
                               (i + a->len < len && is_word_byte(s[i + a->len]))))
            continue;
        return a;
    }
    return NULL;
}

/* Splits s by the tokens of set: matches become ids, the text between them
 * goes to seg. */
static int split_added(struct enc *c, const struct tok_added_set *set, const char *s, size_t len,
                       seg_fn seg)
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
        size_t ms = i, me = i + a->len;
        while (a->lstrip && ms > seg_start && is_ascii_space(s[ms - 1]))
            ms--;
        while (a->rstrip && me < len && is_ascii_space(s[me]))
            me++;
        if (ms > seg_start && (rc = seg(c, s + seg_start, ms - seg_start)) < 0)
            return rc;
        if ((rc = tok_ids_push(&c->out, a->id, c->e)) < 0)
            return rc;
        seg_start = i = me;
    }
    if (len > seg_start)
        return seg(c, s + seg_start, len - seg_start);
    return 0;
}

/* ---- segments ---- */

static int seg_pretok(struct enc *c, const char *s, size_t len)
{
    return tok_pretok_run(&c->t->pretok, c->md, s, len, on_word, c, c->e);
}

/* A segment between raw-matched added tokens: normalize, then split out the
 * normalized added tokens, then pre-tokenize the rest. */
static int seg_normalize(struct enc *c, const char *s, size_t len)
{
    const struct tokenizer *t = c->t;
    char *ns = NULL;
    size_t nlen = 0;
    int rc;
    if (t->norm.n == 0)
        return t->n_added_norm ? split_added(c, &t->added_norm, s, len, seg_pretok)
                               : seg_pretok(c, s, len);
    if ((rc = tok_norm_apply(&t->norm, s, len, &ns, &nlen, c->e)) < 0)
        return rc;
    rc = t->n_added_norm ? split_added(c, &t->added_norm, ns, nlen, seg_pretok)
                         : seg_pretok(c, ns, nlen);
    free(ns);
    return rc;
}

/* ---- public ---- */

int tok_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n_ids, struct err *e)
{
    struct enc c = {.t = t, .e = e};
    int rc = 0;
    *ids = NULL;
    *n_ids = 0;
    if (len > TOK_TEXT_MAX)
        return err_setf(e, ERR_RANGE, "encode: text of %zu bytes (limit %zu)", len, TOK_TEXT_MAX);
    if (len > 0 && !text)
        return err_setf(e, ERR_ARG, "encode: NULL text");
    size_t bad = len ? tok_utf8_check(text, len) : 0;
    if (bad < len)
        return err_setf(e, ERR_ARG, "encode: text is not valid UTF-8 at byte %zu", bad);
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md)
        return err_setf(e, ERR_NOMEM, "encode: PCRE2 match data");
    for (int i = 0; add_special && i < t->post.n_prefix && rc == 0; i++)
        rc = tok_ids_push(&c.out, t->post.prefix[i], e);
    if (rc == 0 && len > 0)
        rc = split_added(&c, &t->added_raw, text, len, seg_normalize);
    for (int i = 0; add_special && i < t->post.n_suffix && rc == 0; i++)
        rc = tok_ids_push(&c.out, t->post.suffix[i], e);
    if (rc == 0 && !c.out.v) {  /* always hand back an array, even for no ids */
        rc = tok_ids_push(&c.out, 0, e);
        c.out.n = 0;
    }
    pcre2_match_data_free(c.md);
    bpe_scratch_deinit(&c.bs);
    free(c.map);
    if (rc < 0) {
        free(c.out.v);
        return rc;
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return 0;
}
