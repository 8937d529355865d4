/*
 * decode: ids -> text, in one piece (tok_decode) or token by token
 * (struct tok_stream).
 *
 * tok_decode follows HF's Tokenizer::decode: each id becomes its piece
 * string (special ones dropped with skip_special), then the decoder's steps
 * run in order over the list of token strings, each step mapping the list
 * to a new list (HF's decode_chain), and the result is joined:
 *   ByteLevel     every token's characters back to bytes (a token with a
 *                 character outside the alphabet is taken verbatim), all
 *                 joined into ONE token, invalid UTF-8 -> U+FFFD (maximal
 *                 subparts, as String::from_utf8_lossy)
 *   ByteFallback  each run of <0xXX> tokens -> one token of its bytes when
 *                 they are valid UTF-8, else one U+FFFD token per byte
 *   Fuse          all tokens joined into one
 *   Strip         up to start/stop copies of a character off each token
 *   Replace       pattern -> content in each token
 *   Metaspace     replacement -> " " in each token, dropped in token 0
 *                 (unless prepend_scheme is never)
 *   BPEDecoder    suffix -> " " in each token, "" in the last
 *   WordPiece     each token but token 0: the prefix ("##") stripped, else
 *                 " " in front; then (cleanup) " ." -> "." and tokenizers'
 *                 other ten replacements, one after the other, in each token
 * Without a decoder the tokens are joined with " " (HF does the same).
 *
 * Streaming uses HF's DecodeStream method over a small window of ids:
 * decode(window + id) minus decode(the window's already-emitted ids) is
 * the new text, emitted once it is longer and does not end in U+FFFD (an
 * incomplete character or byte run). Once ids have left the window, it no
 * longer starts the text, and the steps that treat the start specially
 * (Metaspace's first token, a Strip after a Fuse) are told so (mid), so
 * the pieces concatenate to tok_decode's text. The window is bounded: after
 * TOK_STREAM_WINDOW ids without a complete character (only for invalid
 * byte runs) the text so far is emitted as it is. For the stream, an
 * invalid ByteFallback run is replaced per maximal invalid subpart rather
 * than HF's one U+FFFD per byte of the whole run, so that a character
 * already emitted is never taken back; these two are the only cases where
 * the stream can differ from tok_decode, and only for invalid byte runs.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define FFFD "\xEF\xBF\xBD"

/* ---- load ---- */

static int copy_char(const cJSON *j, const char *key, const char *what, char *out, size_t *len,
                     struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    int32_t cp;
    size_t n = cJSON_IsString(v) ? strlen(v->valuestring) : 0;
    if (n == 0 || n > 4 || tok_utf8_check(v->valuestring, n) != n ||
        tok_utf8_next(v->valuestring, n, &cp) != n)
        return err_setf(e, ERR_FORMAT, "%s: \"%s\" must be one character", what, key);
    memcpy(out, v->valuestring, n + 1);
    *len = n;
    return 0;
}

static int copy_str(const cJSON *j, const char *key, const char *what, char **out, size_t *len,
                    struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v))
        return err_setf(e, ERR_FORMAT, "%s: missing string \"%s\"", what, key);
    size_t n = strlen(v->valuestring);
    if (n > TOK_PIECE_MAX || tok_utf8_check(v->valuestring, n) != n)
        return err_setf(e, ERR_FORMAT, "%s: \"%s\" too long or not UTF-8", what, key);
    *out = malloc(n + 1);
    if (!*out)
        return err_setf(e, ERR_NOMEM, "%s", what);
    memcpy(*out, v->valuestring, n + 1);
    *len = n;
    return 0;
}

static int strip_count(const cJSON *j, const char *key, int *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > TOK_PIECE_MAX ||
        v->valuedouble != (int)v->valuedouble)
        return err_setf(e, ERR_FORMAT, "decoder Strip: \"%s\" must be an integer in [0, %d]", key,
                        TOK_PIECE_MAX);
    *out = (int)v->valuedouble;
    return 0;
}

/* Replace may not lengthen a token: the stream's output bound (TOK_STREAM_CAP)
 * relies on decoded text being at most 3 bytes per piece byte. */
static int load_replace(struct tok_dec_step *s, const cJSON *j, struct err *e)
{
    int rc;
    uint32_t min_chars = 0;
    if ((rc = copy_str(j, "content", "decoder Replace", &s->str, &s->str_len, e)) < 0)
        return rc;
    if ((rc = tok_pattern_load(&s->re, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                               "decoder Replace", e)) < 0)
        return rc;
    pcre2_pattern_info(s->re, PCRE2_INFO_MINLENGTH, &min_chars);
    if (s->str_len > min_chars)
        return err_setf(e, ERR_UNSUPPORTED,
                        "decoder Replace: content of %zu bytes is longer than the shortest "
                        "match (%u characters)", s->str_len, min_chars);
    return 0;
}

static int load_metaspace(struct tok_dec_step *s, const cJSON *j, struct err *e)
{
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    int rc = copy_char(j, "replacement", "decoder Metaspace", s->ch, &s->ch_len, e);
    if (rc < 0)
        return rc;
    s->prepend = !(cJSON_IsFalse(aps) ||
                   (cJSON_IsString(scheme) && strcmp(scheme->valuestring, "never") == 0));
    return 0;
}

static int dec_add(struct tok_dec *d, const cJSON *j, int depth, struct err *e);

static int dec_add_one(struct tok_dec *d, const char *ty, const cJSON *j, struct err *e)
{
    static const struct {
        const char *name;
        enum tok_dec_kind kind;
    } k_kinds[] = {
        {"ByteLevel", TOK_DEC_BYTELEVEL}, {"ByteFallback", TOK_DEC_BYTEFALLBACK},
        {"Fuse", TOK_DEC_FUSE},           {"Strip", TOK_DEC_STRIP},
        {"Replace", TOK_DEC_REPLACE},     {"Metaspace", TOK_DEC_METASPACE},
        {"BPEDecoder", TOK_DEC_BPE},      {"WordPiece", TOK_DEC_WORDPIECE},
    };
    int rc;
    for (size_t i = 0; i < sizeof k_kinds / sizeof k_kinds[0]; i++) {
        if (strcmp(ty, k_kinds[i].name) != 0)
            continue;
        if (d->n >= TOK_STEPS_MAX)
            return err_setf(e, ERR_UNSUPPORTED, "decoder: more than %d steps", TOK_STEPS_MAX);
        struct tok_dec_step *s = &d->step[d->n++];
        memset(s, 0, sizeof *s);
        s->kind = k_kinds[i].kind;
        switch (s->kind) {
        case TOK_DEC_STRIP:
            if ((rc = copy_char(j, "content", "decoder Strip", s->ch, &s->ch_len, e)) < 0 ||
                (rc = strip_count(j, "start", &s->start, e)) < 0)
                return rc;
            return strip_count(j, "stop", &s->stop, e);
        case TOK_DEC_REPLACE:
            return load_replace(s, j, e);
        case TOK_DEC_METASPACE:
            return load_metaspace(s, j, e);
        case TOK_DEC_BPE:
            if ((rc = copy_str(j, "suffix", "decoder BPEDecoder", &s->str, &s->str_len, e)) < 0)
                return rc;
            if (s->str_len == 0)
                return err_setf(e, ERR_FORMAT, "decoder BPEDecoder: empty \"suffix\"");
            return 0;
        case TOK_DEC_WORDPIECE: {
            const cJSON *cl = cJSON_GetObjectItemCaseSensitive(j, "cleanup");
            s->cleanup = !cJSON_IsFalse(cl);
            if (!cJSON_GetObjectItemCaseSensitive(j, "prefix")) {
                s->str = strdup("##");
                s->str_len = 2;
                return s->str ? 0 : err_setf(e, ERR_NOMEM, "decoder WordPiece");
            }
            return copy_str(j, "prefix", "decoder WordPiece", &s->str, &s->str_len, e);
        }
        default:
            return 0;
        }
    }
    return err_setf(e, ERR_UNSUPPORTED, "decoder type '%.64s' is not supported", ty);
}

static int dec_add(struct tok_dec *d, const cJSON *j, int depth, struct err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type"), *it;
    if (!cJSON_IsString(type))
        return err_setf(e, ERR_FORMAT, "decoder: missing \"type\"");
    if (strcmp(type->valuestring, "Sequence") != 0)
        return dec_add_one(d, type->valuestring, j, e);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
    if (!cJSON_IsArray(list) || depth > 4)
        return err_setf(e, ERR_FORMAT, "decoder Sequence: bad \"decoders\"");
    cJSON_ArrayForEach(it, list) {
        int rc = dec_add(d, it, depth + 1, e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int tok_decoder_load(struct tokenizer *t, const cJSON *j, struct err *e)
{
    memset(&t->dec, 0, sizeof t->dec);
    if (!j || cJSON_IsNull(j))
        return 0;
    t->dec.present = true;
    return dec_add(&t->dec, j, 0, e);
}

void tok_decoder_deinit(struct tok_dec *d)
{
    for (int i = 0; i < d->n; i++) {
        pcre2_code_free(d->step[i].re);
        free(d->step[i].str);
    }
    memset(d, 0, sizeof *d);
}

/* ---- token lists ---- */

/* A list of token strings: token i is text.p[off[i] .. off[i] + len[i]). */
struct tlist {
    struct tok_buf text;
    size_t *off, *len;
    size_t n, cap;
};

static void tl_free(struct tlist *l)
{
    free(l->text.p);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

/* Starts a new token; its bytes are then appended with tl_put. */
static int tl_begin(struct tlist *l, struct err *e)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        size_t *no = realloc(l->off, cap * sizeof *no);
        if (!no)
            return err_setf(e, ERR_NOMEM, "decode: %zu tokens", cap);
        l->off = no;
        size_t *nl = realloc(l->len, cap * sizeof *nl);
        if (!nl)
            return err_setf(e, ERR_NOMEM, "decode: %zu tokens", cap);
        l->len = nl;
        l->cap = cap;
    }
    l->off[l->n] = l->text.n;
    l->len[l->n] = 0;
    l->n++;
    return tok_buf_put(&l->text, "", 0, e);
}

static int tl_put(struct tlist *l, const char *s, size_t n, struct err *e)
{
    l->len[l->n - 1] += n;
    return tok_buf_put(&l->text, s, n, e);
}

static int tl_add(struct tlist *l, const char *s, size_t n, struct err *e)
{
    int rc = tl_begin(l, e);
    return rc < 0 ? rc : tl_put(l, s, n, e);
}

static const char *tl_tok(const struct tlist *l, size_t i) { return l->text.p + l->off[i]; }

/* ---- lossy UTF-8 ---- */

/* Appends s[0..n) to the current token of o as valid UTF-8, each maximal
 * invalid subpart becoming U+FFFD. */
static int put_lossy(struct tlist *o, const unsigned char *s, size_t n, struct err *e)
{
    size_t i = 0, run = 0, need;
    int rc;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = tok_utf8_seq(s + i, n - i, &need);
        if (need && k == need) {
            i += k;
            continue;
        }
        if ((rc = tl_put(o, (const char *)s + run, i - run, e)) < 0 ||
            (rc = tl_put(o, FFFD, 3, e)) < 0)
            return rc;
        i += k ? k : 1;
        run = i;
    }
    return tl_put(o, (const char *)s + run, n - run, e);
}

/* ---- decoder steps ---- */

/* Appends the bytes a byte-level token stands for to raw, or the token
 * itself when a character is outside the alphabet (as HF). */
static int bytelevel_token(const struct tokenizer *t, const char *p, size_t len,
                           struct tok_buf *raw, struct err *e)
{
    size_t start = raw->n, need;
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < len;) {
        size_t k = tok_utf8_seq(u + i, len - i, &need);
        uint32_t cp;
        if (need == 0 || k != need || k > 2)
            goto verbatim;  /* every byte-level code point is 1 or 2 bytes */
        cp = k == 1 ? u[i] : ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
        if (cp >= TOK_BL_CP_MAX || t->bl.dec[cp] < 0)
            goto verbatim;
        char b = (char)t->bl.dec[cp];
        int rc = tok_buf_put(raw, &b, 1, e);
        if (rc < 0)
            return rc;
        i += k;
    }
    return 0;
verbatim:
    raw->n = start;
    return tok_buf_put(raw, p, len, e);
}

static int step_bytelevel(const struct tokenizer *t, const struct tlist *in, struct tlist *o,
                          struct err *e)
{
    struct tok_buf raw = {0};
    int rc = tok_buf_put(&raw, "", 0, e);
    for (size_t i = 0; i < in->n && rc == 0; i++)
        rc = bytelevel_token(t, tl_tok(in, i), in->len[i], &raw, e);
    if (rc == 0 && (rc = tl_begin(o, e)) == 0)
        rc = put_lossy(o, (const unsigned char *)raw.p, raw.n, e);
    free(raw.p);
    return rc;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte of a "<0xXX>" token, or -1. As HF (Rust's u8::from_str_radix),
 * either case of hex digit is accepted, and so is "+X". */
static int byte_token(const char *p, size_t len)
{
    if (len != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    if (p[3] == '+')
        return hexval(p[4]);
    int hi = hexval(p[3]), lo = hexval(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* A finished run of byte tokens: one token of its text when valid, else
 * (as HF) one U+FFFD per byte, or, for the stream (lossy), the maximal-
 * subpart replacement, which never changes text already emitted. */
static int flush_bytes(struct tlist *o, const unsigned char *b, size_t n, bool lossy,
                       struct err *e)
{
    int rc = 0;
    if (n == 0)
        return 0;
    if (tok_utf8_check((const char *)b, n) == n)
        return tl_add(o, (const char *)b, n, e);
    if (lossy)
        return (rc = tl_begin(o, e)) < 0 ? rc : put_lossy(o, b, n, e);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = tl_add(o, FFFD, 3, e);
    return rc;
}

static int step_bytefallback(const struct tlist *in, struct tlist *o, bool lossy, struct err *e)
{
    struct tok_buf run = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        int b = byte_token(tl_tok(in, i), in->len[i]);
        if (b >= 0) {
            char c = (char)b;
            rc = tok_buf_put(&run, &c, 1, e);
            continue;
        }
        if ((rc = flush_bytes(o, (const unsigned char *)run.p, run.n, lossy, e)) < 0)
            break;
        run.n = 0;
        rc = tl_add(o, tl_tok(in, i), in->len[i], e);
    }
    if (rc == 0)
        rc = flush_bytes(o, (const unsigned char *)run.p, run.n, lossy, e);
    free(run.p);
    return rc;
}

/* no_start0: token 0 is a joined text that does not begin the decoded text
 * (a stream window past the start), so its start is not stripped. */
static int step_strip(const struct tok_dec_step *st, bool no_start0, const struct tlist *in,
                      struct tlist *o, struct err *e)
{
    int rc = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        const char *p = tl_tok(in, i);
        size_t a = 0, b = in->len[i];
        int start = i == 0 && no_start0 ? 0 : st->start;
        for (int k = 0; k < start && b - a >= st->ch_len &&
                        memcmp(p + a, st->ch, st->ch_len) == 0; k++)
            a += st->ch_len;
        for (int k = 0; k < st->stop && b - a >= st->ch_len &&
                        memcmp(p + b - st->ch_len, st->ch, st->ch_len) == 0; k++)
            b -= st->ch_len;
        rc = tl_add(o, p + a, b - a, e);
    }
    return rc;
}

/* Replaces every occurrence of (what, wlen) in token i by rep: Metaspace and
 * BPEDecoder. */
static int replace_literal(struct tlist *o, const char *p, size_t len, const char *what,
                           size_t wlen, const char *rep, size_t rlen, struct err *e)
{
    size_t run = 0;
    int rc = tl_begin(o, e);
    for (size_t i = 0; rc == 0 && i + wlen <= len;) {
        if (memcmp(p + i, what, wlen) != 0) {
            i++;
            continue;
        }
        if ((rc = tl_put(o, p + run, i - run, e)) < 0 || (rc = tl_put(o, rep, rlen, e)) < 0)
            return rc;
        i += wlen;
        run = i;
    }
    return rc < 0 ? rc : tl_put(o, p + run, len - run, e);
}

static int step_replace(const struct tok_dec_step *st, pcre2_match_data *md,
                        const struct tlist *in, struct tlist *o, struct err *e)
{
    int rc = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        const char *p = tl_tok(in, i);
        size_t len = in->len[i], pos = 0, run = 0;
        rc = tl_begin(o, e);
        while (rc == 0 && pos < len) {
            int m = pcre2_match(st->re, (PCRE2_SPTR)p, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (m < 0)
                break;  /* no (more) matches; a match error leaves the rest as is */
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            if (ov[1] <= ov[0]) {
                int32_t cp;
                pos = ov[0] + (ov[0] < len ? tok_utf8_next(p + ov[0], len - ov[0], &cp) : 1);
                continue;
            }
            if ((rc = tl_put(o, p + run, ov[0] - run, e)) < 0 ||
                (rc = tl_put(o, st->str, st->str_len, e)) < 0)
                return rc;
            run = pos = ov[1];
        }
        if (rc == 0)
            rc = tl_put(o, p + run, len - run, e);
    }
    return rc;
}

/* tokenizers' decoders::wordpiece::cleanup, applied in this order. */
static const char *const k_wp_cleanup[][2] = {
    {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},
    {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" do not", " don't"},
    {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
};

/* One WordPiece token: i > 0 (or a stream window's token 0) loses the
 * prefix or gains a leading space; then cleanup. */
static int wordpiece_token(const struct tok_dec_step *st, bool first, const char *p, size_t len,
                           struct tlist *o, struct err *e)
{
    struct tok_buf cur = {0};
    int rc = 0;
    if (!first && st->str_len <= len && memcmp(p, st->str, st->str_len) == 0) {
        p += st->str_len;
        len -= st->str_len;
    } else if (!first) {
        rc = tok_buf_put(&cur, " ", 1, e);
    }
    if (rc == 0)
        rc = tok_buf_put(&cur, p, len, e);
    for (size_t r = 0; st->cleanup && rc == 0 && r < sizeof k_wp_cleanup / sizeof k_wp_cleanup[0]; r++) {
        struct tlist tmp = {0};
        const char *w = k_wp_cleanup[r][0], *to = k_wp_cleanup[r][1];
        if (!memmem(cur.p, cur.n, w, strlen(w)))
            continue;
        if ((rc = replace_literal(&tmp, cur.p, cur.n, w, strlen(w), to, strlen(to), e)) == 0) {
            cur.n = 0;
            rc = tok_buf_put(&cur, tl_tok(&tmp, 0), tmp.len[0], e);
        }
        tl_free(&tmp);
    }
    if (rc == 0)
        rc = tl_add(o, cur.p, cur.n, e);
    free(cur.p);
    return rc;
}

/* How a decode runs: the whole text (tok_decode) or a stream window. */
struct dec_mode {
    bool skip_special;
    bool lossy;   /* stream: ByteFallback runs replaced per maximal subpart */
    bool mid;     /* stream window that does not start the text */
    bool joined;  /* set while running: token 0 is the join of all tokens so far */
};

static int run_step(const struct tokenizer *t, const struct tok_dec_step *st,
                    pcre2_match_data *md, const struct dec_mode *m, const struct tlist *in,
                    struct tlist *o, struct err *e)
{
    bool lossy = m->lossy;
    int rc = 0;
    switch (st->kind) {
    case TOK_DEC_BYTELEVEL:
        return step_bytelevel(t, in, o, e);
    case TOK_DEC_BYTEFALLBACK:
        return step_bytefallback(in, o, lossy, e);
    case TOK_DEC_FUSE:
        rc = tl_begin(o, e);
        for (size_t i = 0; i < in->n && rc == 0; i++)
            rc = tl_put(o, tl_tok(in, i), in->len[i], e);
        return rc;
    case TOK_DEC_STRIP:
        return step_strip(st, m->mid && m->joined, in, o, e);
    case TOK_DEC_REPLACE:
        return step_replace(st, md, in, o, e);
    case TOK_DEC_METASPACE:
        for (size_t i = 0; i < in->n && rc == 0; i++) {
            bool drop = i == 0 && st->prepend && !m->mid;
            rc = replace_literal(o, tl_tok(in, i), in->len[i], st->ch, st->ch_len, " ",
                                 drop ? 0 : 1, e);
        }
        return rc;
    case TOK_DEC_BPE:
        for (size_t i = 0; i < in->n && rc == 0; i++)
            rc = replace_literal(o, tl_tok(in, i), in->len[i], st->str, st->str_len, " ",
                                 i + 1 == in->n ? 0 : 1, e);
        return rc;
    case TOK_DEC_WORDPIECE:
        for (size_t i = 0; i < in->n && rc == 0; i++)
            rc = wordpiece_token(st, i == 0 && !m->mid, tl_tok(in, i), in->len[i], o, e);
        return rc;
    }
    return err_setf(e, ERR_INTERNAL, "decoder: bad step kind %d", (int)st->kind);
}

/* ---- decode ---- */

static int check_id(const struct tokenizer *t, int32_t id, size_t pos, struct err *e)
{
    if (id < 0 || id >= t->n_ids || !t->entry[id].flags)
        return err_setf(e, ERR_RANGE, "decode: id %d at position %zu is not in the vocab (size %d)",
                        id, pos, t->n_ids);
    return 0;
}

/* Decodes ids (already checked) into out (reset first): the whole of
 * tok_decode except the id check, in mode m. */
static int decode_ids(const struct tokenizer *t, const int32_t *ids, size_t n, struct dec_mode m,
                      struct tok_buf *out, struct err *e)
{
    bool skip_special = m.skip_special;
    struct tlist a = {0}, b = {0};
    pcre2_match_data *md = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (skip_special && tok_is_special(t, ids[i]))
            continue;
        const struct tok_entry *en = &t->entry[ids[i]];
        rc = tl_add(&a, t->pool.buf + en->off, en->len, e);
    }
    if (rc == 0 && t->dec.n > 0 && !(md = pcre2_match_data_create(1, NULL)))
        rc = err_setf(e, ERR_NOMEM, "decode: PCRE2 match data");
    for (int s = 0; s < t->dec.n && rc == 0; s++) {
        b.n = 0;
        b.text.n = 0;
        rc = run_step(t, &t->dec.step[s], md, &m, &a, &b, e);
        if (t->dec.step[s].kind == TOK_DEC_BYTELEVEL || t->dec.step[s].kind == TOK_DEC_FUSE)
            m.joined = true;
        struct tlist tmp = a;
        a = b;
        b = tmp;
    }
    out->n = 0;
    if (rc == 0)
        rc = tok_buf_put(out, "", 0, e);
    for (size_t i = 0; i < a.n && rc == 0; i++) {
        if (i > 0 && !t->dec.present && (rc = tok_buf_put(out, " ", 1, e)) < 0)
            break;
        rc = tok_buf_put(out, tl_tok(&a, i), a.len[i], e);
    }
    pcre2_match_data_free(md);
    tl_free(&a);
    tl_free(&b);
    return rc;
}

/* Makes out valid UTF-8 in place of the raw text (only pieces that were
 * never checked, e.g. verbatim byte-level pieces, can break it). */
static int make_valid(struct tok_buf *out, struct err *e)
{
    if (tok_utf8_check(out->p, out->n) == out->n)
        return 0;
    struct tlist l = {0};
    int rc = tl_begin(&l, e);
    if (rc == 0)
        rc = put_lossy(&l, (const unsigned char *)out->p, out->n, e);
    if (rc == 0) {
        free(out->p);
        *out = l.text;
        l.text = (struct tok_buf){0};
    }
    tl_free(&l);
    return rc;
}

int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **out, struct err *e)
{
    size_t len;
    return tok_decode_len(t, ids, n, skip_special, out, &len, e);
}

int tok_decode_len(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                   char **out, size_t *len, struct err *e)
{
    struct tok_buf res = {0};
    int rc;
    *out = NULL;
    if (n > 0 && !ids)
        return err_setf(e, ERR_ARG, "decode: NULL ids");
    for (size_t i = 0; i < n; i++)
        if ((rc = check_id(t, ids[i], i, e)) < 0)
            return rc;
    struct dec_mode m = {.skip_special = skip_special};
    if ((rc = decode_ids(t, ids, n, m, &res, e)) < 0 ||
        (rc = make_valid(&res, e)) < 0) {
        free(res.p);
        return rc;
    }
    *out = res.p;
    *len = res.n;
    return 0;
}

/* ---- streaming ---- */

void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->skip_special = skip_special;
}

static bool ends_fffd(const struct tok_buf *b)
{
    return b->n >= 3 && memcmp(b->p + b->n - 3, FFFD, 3) == 0;
}

/* Length of the part of str that follows what was already emitted for
 * prefix: all of prefix when str extends it, else their common prefix cut
 * back to a character boundary. */
static size_t emitted_len(const struct tok_buf *str, const struct tok_buf *prefix)
{
    size_t k = 0;
    while (k < prefix->n && k < str->n && str->p[k] == prefix->p[k])
        k++;
    if (k == prefix->n)
        return k;
    while (k > 0 && ((unsigned char)str->p[k] & 0xC0) == 0x80)
        k--;
    return k;
}

static int stream_out(const struct tok_buf *str, size_t from, char *out, size_t cap,
                      struct err *e)
{
    size_t w = str->n > from ? str->n - from : 0;
    if (w + 1 > cap)
        return err_setf(e, ERR_RANGE, "stream: %zu bytes of output, buffer holds %zu", w + 1, cap);
    memcpy(out, str->p + from, w);
    out[w] = '\0';
    return (int)w;
}

int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, struct err *e)
{
    const struct tokenizer *t = s->tok;
    int32_t ids[TOK_STREAM_WINDOW + 1];
    struct tok_buf prefix = {0}, str = {0};
    int rc, n_ctx = s->n_ctx;
    struct dec_mode m = {.skip_special = s->skip_special, .lossy = true, .mid = s->mid};
    if ((rc = check_id(t, id, 0, e)) < 0)
        return rc;
    if (!out || cap == 0)
        return err_setf(e, ERR_ARG, "stream: no output buffer");
    out[0] = '\0';
    if (s->skip_special && tok_is_special(t, id))
        return 0;
    size_t n = (size_t)s->n_ids;
    memcpy(ids, s->ids, n * sizeof *ids);
    ids[n++] = id;
    if ((rc = decode_ids(t, ids, (size_t)n_ctx, m, &prefix, e)) < 0)
        goto out;
    if (prefix.n == 0 && s->n_ids > 0) {  /* HF: absorb ids that decoded to nothing */
        if ((rc = decode_ids(t, ids, n - 1, m, &str, e)) < 0)
            goto out;
        if (!ends_fffd(&str)) {
            struct tok_buf tmp = prefix;
            prefix = str;
            str = tmp;
            n_ctx = (int)n - 1;
        }
    }
    if ((rc = decode_ids(t, ids, n, m, &str, e)) < 0)
        goto out;
    bool force = n > TOK_STREAM_WINDOW;  /* no room to wait any longer */
    if (!force && (str.n <= prefix.n || ends_fffd(&str))) {
        memcpy(s->ids, ids, n * sizeof *ids);  /* wait for more */
        s->n_ids = (int)n;
        s->n_ctx = n_ctx;
        rc = 0;
        goto out;
    }
    if ((rc = make_valid(&str, e)) < 0 ||
        (rc = stream_out(&str, emitted_len(&str, &prefix), out, cap, e)) < 0)
        goto out;
    /* The ids just emitted become the context of the next push. */
    size_t keep = n - (size_t)n_ctx;
    if (keep > TOK_STREAM_WINDOW)
        keep = 1;
    s->mid |= keep < n;
    memmove(s->ids, ids + n - keep, keep * sizeof *ids);
    s->n_ids = s->n_ctx = (int)keep;
out:
    free(prefix.p);
    free(str.p);
    return rc;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
    struct tok_buf prefix = {0}, str = {0};
    struct dec_mode m = {.skip_special = s->skip_special, .lossy = true, .mid = s->mid};
    int rc;
    if (!out || cap == 0)
        return -ERR_RANGE;
    out[0] = '\0';
    if (s->n_ids == s->n_ctx) {  /* nothing pending */
        s->n_ids = s->n_ctx = 0;
        s->mid = false;
        return 0;
    }
    if ((rc = decode_ids(s->tok, s->ids, (size_t)s->n_ctx, m, &prefix, NULL)) == 0 &&
        (rc = decode_ids(s->tok, s->ids, (size_t)s->n_ids, m, &str, NULL)) == 0 &&
        (rc = make_valid(&str, NULL)) == 0)
        rc = stream_out(&str, emitted_len(&str, &prefix), out, cap, NULL);
    if (rc >= 0) {
        s->n_ids = s->n_ctx = 0;
        s->mid = false;
    }
    free(prefix.p);
    free(str.p);
    return rc;
}

/* ---- one token's bytes ---- */

/* Runs one non-raw decoder step over the single token in cur (replaced by
 * the result) as tok_decode would for a token in the middle of the text. */
static int token_step(const struct tokenizer *t, const struct tok_dec_step *st,
                      pcre2_match_data *md, bool joined, struct tok_buf *cur, struct err *e)
{
    struct tlist in = {0}, o = {0};
    struct dec_mode m = {.mid = true, .joined = joined};
    int rc = tl_add(&in, cur->p, cur->n, e);
    if (rc == 0) {
        if (st->kind == TOK_DEC_BPE)  /* never the last token: the suffix is a space */
            rc = replace_literal(&o, cur->p, cur->n, st->str, st->str_len, " ", 1, e);
        else
            rc = run_step(t, st, md, &m, &in, &o, e);
    }
    if (rc == 0) {
        cur->n = 0;
        rc = tok_buf_put(cur, o.n ? tl_tok(&o, 0) : "", o.n ? o.len[0] : 0, e);
    }
    tl_free(&in);
    tl_free(&o);
    return rc;
}

int tok_token_bytes(const struct tokenizer *t, int32_t id, char *out, size_t cap)
{
    struct tok_buf cur = {0}, raw = {0};
    pcre2_match_data *md = NULL;
    bool joined = false;
    int rc;
    if ((rc = check_id(t, id, 0, NULL)) < 0)
        return rc;
    const struct tok_entry *en = &t->entry[id];
    if (!t->dec.present)  /* tokens are joined with " ": one precedes a middle token */
        rc = tok_buf_put(&cur, " ", 1, NULL);
    if (rc == 0)
        rc = tok_buf_put(&cur, t->pool.buf + en->off, en->len, NULL);
    if (rc == 0 && t->dec.n > 0 && !(md = pcre2_match_data_create(1, NULL)))
        rc = -ERR_NOMEM;
    for (int s = 0; s < t->dec.n && rc == 0; s++) {
        const struct tok_dec_step *st = &t->dec.step[s];
        int b;
        switch (st->kind) {
        case TOK_DEC_BYTELEVEL:  /* raw bytes, no lossy repair */
            raw.n = 0;
            if ((rc = tok_buf_put(&raw, "", 0, NULL)) == 0 &&
                (rc = bytelevel_token(t, cur.p, cur.n, &raw, NULL)) == 0) {
                struct tok_buf tmp = cur;
                cur = raw;
                raw = tmp;
            }
            joined = true;
            break;
        case TOK_DEC_BYTEFALLBACK:
            if ((b = byte_token(cur.p, cur.n)) >= 0) {
                cur.p[0] = (char)b;
                cur.n = 1;
            }
            break;
        case TOK_DEC_FUSE:
            joined = true;
            break;
        case TOK_DEC_STRIP:
            if (joined)  /* strips only the ends of the whole text */
                break;
            rc = token_step(t, st, md, joined, &cur, NULL);
            break;
        default:
            rc = token_step(t, st, md, joined, &cur, NULL);
            break;
        }
    }
    if (rc == 0 && cur.n > cap)
        rc = -ERR_RANGE;
    if (rc == 0) {
        memcpy(out, cur.p, cur.n);
        rc = (int)cur.n;
    }
    pcre2_match_data_free(md);
    free(cur.p);
    free(raw.p);
    return rc;
}
