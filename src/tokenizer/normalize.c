/*
 * normalize: the normalizer stage of tokenizer.json, and the Unicode
 * character classes the other stages share.
 *
 * A normalizer is a flat list of steps (a Sequence is flattened at load),
 * each rewriting the whole segment into a new buffer:
 *   NFC/NFD/NFKC/NFKD  utf8proc_map
 *   Lowercase          per code point (utf8proc_tolower; U+0130 becomes
 *                      "i\u0307" as Rust's char::to_lowercase does)
 *   Strip              Unicode White_Space off the left and/or right
 *   Prepend            a string in front of a non-empty segment
 *   Replace            every leftmost non-overlapping match of a literal or
 *                      PCRE2 regex by a fixed string (SentencePiece's " " ->
 *                      U+2581)
 *   ByteLevel          every byte to its GPT-2 byte-level character
 *   BertNormalizer     clean_text (drop NUL, U+FFFD and Cc/Cf/Co except
 *                      \t\n\r, then the remaining whitespace -> " "), spaces around CJK
 *                      ideographs, strip_accents (NFD, drop Mn; null means
 *                      "as lowercase"), lowercase, in that order
 *   StripAccents       drop every mark, Mn, Mc and Me (files put an NFD before it)
 *   Precompiled        SentencePiece's charsmap (charsmap.c)
 * BertNormalizer's and StripAccents' classes are the old crates' that
 * tokenizers uses (uccat.c), not utf8proc's. Lowercase and NFC/NFD/NFKC/NFKD
 * come from utf8proc, whose Unicode version is newer than tokenizers'
 * unicode-normalization-alignments (9.0) and older than Rust's std: the few
 * characters added in between may differ.
 * HF tracks offsets through each rewrite; we only need the text. Each
 * output is bounded (TOK_TEXT_MAX times a small factor is rejected), so a
 * hostile Replace cannot blow memory up.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tok_impl.h"

/* ---- Unicode classes ---- */

size_t tok_utf8_next(const char *s, size_t n, int32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) {
        *cp = -1;
        return 0;
    }
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    size_t len = u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (len > n) {
        *cp = 0xFFFD;
        return n;
    }
    int32_t c = u[0] & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++)
        c = (c << 6) | (u[i] & 0x3F);
    *cp = c;
    return len;
}

size_t tok_utf8_prev(const char *s, size_t end)
{
    size_t i = end;
    while (i > 0) {
        i--;
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            break;
    }
    return i;
}

bool tok_cp_is_space(int32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

bool tok_cp_is_word(int32_t c)
{
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D)
        return true;  /* Join_Control is part of Rust's \w */
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* ---- load ---- */

static const char *json_type(const cJSON *j)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Copies a JSON string field into a malloc'd buffer (at most max bytes). */
static int dup_field(const cJSON *j, const char *key, const char *what, size_t max, char **out,
                     size_t *len, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsString(v))
        return err_setf(e, ERR_FORMAT, "%s: missing string \"%s\"", what, key);
    size_t n = strlen(v->valuestring);
    if (n > max)
        return err_setf(e, ERR_FORMAT, "%s: \"%s\" of %zu bytes (max %zu)", what, key, n, max);
    if (tok_utf8_check(v->valuestring, n) != n)
        return err_setf(e, ERR_FORMAT, "%s: \"%s\" is not valid UTF-8", what, key);
    *out = malloc(n + 1);
    if (!*out)
        return err_setf(e, ERR_NOMEM, "%s", what);
    memcpy(*out, v->valuestring, n + 1);
    *len = n;
    return 0;
}

int tok_pattern_load(pcre2_code **re, const cJSON *pattern, const char *what, struct err *e)
{
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *src = cJSON_IsString(rx) ? rx : lit;
    if (!cJSON_IsString(src) || src->valuestring[0] == '\0')
        return err_setf(e, ERR_FORMAT, "%s: \"pattern\" needs a non-empty Regex or String", what);
    size_t n = strlen(src->valuestring);
    if (n > TOK_PIECE_MAX)
        return err_setf(e, ERR_FORMAT, "%s: pattern of %zu bytes (max %d)", what, n, TOK_PIECE_MAX);
    if (tok_utf8_check(src->valuestring, n) != n)
        return err_setf(e, ERR_FORMAT, "%s: pattern is not valid UTF-8", what);
    return tok_regex_compile(re, src->valuestring, n, src == lit, what, e);
}

int tok_regex_compile(pcre2_code **out, const char *pat, size_t len, bool literal,
                      const char *what, struct err *e)
{
    int ec;
    PCRE2_SIZE eoff;
    /* PCRE2_LITERAL admits no UCP (nothing to classify in a literal). */
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return err_setf(e, ERR_UNSUPPORTED, "%s: regex '%.64s': %s at offset %zu", what, pat,
                        (const char *)msg, (size_t)eoff);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

static struct tok_norm_step *norm_new_step(struct tok_norm *nm, enum tok_norm_kind kind,
                                           struct err *e)
{
    if (nm->n >= TOK_STEPS_MAX) {
        err_setf(e, ERR_UNSUPPORTED, "normalizer: more than %d steps", TOK_STEPS_MAX);
        return NULL;
    }
    struct tok_norm_step *s = &nm->step[nm->n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}

/* A BertNormalizer option: true, false, or (strip_accents) null. */
static int bert_opt(const cJSON *j, const char *key, bool dflt, bool *out, bool *is_null,
                    struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *out = dflt;
    if (is_null)
        *is_null = !v || cJSON_IsNull(v);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return err_setf(e, ERR_FORMAT, "normalizer BertNormalizer: \"%s\" must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int load_bert(struct tok_norm_step *s, const cJSON *j, struct err *e)
{
    bool strip_null;
    int rc;
    if ((rc = bert_opt(j, "clean_text", true, &s->clean_text, NULL, e)) < 0 ||
        (rc = bert_opt(j, "handle_chinese_chars", true, &s->chinese, NULL, e)) < 0 ||
        (rc = bert_opt(j, "lowercase", true, &s->lowercase, NULL, e)) < 0 ||
        (rc = bert_opt(j, "strip_accents", false, &s->strip_accents, &strip_null, e)) < 0)
        return rc;
    if (strip_null)  /* tokenizers: strip_accents.unwrap_or(lowercase) */
        s->strip_accents = s->lowercase;
    return 0;
}

static int norm_add(struct tok_norm *nm, const cJSON *j, int depth, struct err *e)
{
    static const struct {
        const char *name;
        enum tok_norm_kind kind;
    } k_kinds[] = {
        {"NFC", TOK_NORM_NFC}, {"NFD", TOK_NORM_NFD}, {"NFKC", TOK_NORM_NFKC},
        {"NFKD", TOK_NORM_NFKD}, {"Lowercase", TOK_NORM_LOWERCASE}, {"Strip", TOK_NORM_STRIP},
        {"Prepend", TOK_NORM_PREPEND}, {"Replace", TOK_NORM_REPLACE},
        {"ByteLevel", TOK_NORM_BYTELEVEL}, {"BertNormalizer", TOK_NORM_BERT},
        {"StripAccents", TOK_NORM_STRIP_ACCENTS}, {"Precompiled", TOK_NORM_PRECOMPILED},
    };
    const char *type = json_type(j);
    if (!type)
        return err_setf(e, ERR_FORMAT, "normalizer: missing \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers"), *it;
        if (!cJSON_IsArray(list) || depth > 4)
            return err_setf(e, ERR_FORMAT, "normalizer Sequence: bad \"normalizers\"");
        cJSON_ArrayForEach(it, list) {
            int rc = norm_add(nm, it, depth + 1, e);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof k_kinds / sizeof k_kinds[0]; i++) {
        if (strcmp(type, k_kinds[i].name) != 0)
            continue;
        struct tok_norm_step *s = norm_new_step(nm, k_kinds[i].kind, e);
        if (!s)
            return -ERR_UNSUPPORTED;
        switch (s->kind) {
        case TOK_NORM_STRIP:
            s->left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
            s->right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
            return 0;
        case TOK_NORM_PREPEND:
            return dup_field(j, "prepend", "normalizer Prepend", TOK_PIECE_MAX, &s->str,
                             &s->str_len, e);
        case TOK_NORM_REPLACE: {
            int rc = dup_field(j, "content", "normalizer Replace", TOK_PIECE_MAX, &s->str,
                               &s->str_len, e);
            if (rc < 0)
                return rc;
            return tok_pattern_load(&s->re, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                                    "normalizer Replace", e);
        }
        case TOK_NORM_BERT:
            return load_bert(s, j, e);
        case TOK_NORM_PRECOMPILED: {
            const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(j, "precompiled_charsmap");
            if (!cJSON_IsString(b64))
                return err_setf(e, ERR_FORMAT, "normalizer Precompiled: missing \"precompiled_charsmap\"");
            return tok_charsmap_new(&s->cmap, b64->valuestring, strlen(b64->valuestring), e);
        }
        default:
            return 0;
        }
    }
    return err_setf(e, ERR_UNSUPPORTED, "normalizer type '%.64s' is not supported", type);
}

int tok_norm_load(struct tok_norm *nm, const cJSON *j, struct err *e)
{
    memset(nm, 0, sizeof *nm);
    if (!j || cJSON_IsNull(j))
        return 0;
    return norm_add(nm, j, 0, e);
}

void tok_norm_deinit(struct tok_norm *nm)
{
    for (int i = 0; i < nm->n; i++) {
        free(nm->step[i].str);
        pcre2_code_free(nm->step[i].re);
        tok_charsmap_free(nm->step[i].cmap);
    }
    memset(nm, 0, sizeof *nm);
}

/* ---- apply ---- */


static int apply_lowercase(const char *s, size_t len, struct tok_buf *o, struct err *e)
{
    int rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t cp;
        size_t k = tok_utf8_next(s + i, len - i, &cp);
        if (cp == 0x130) {
            rc = tok_buf_put(o, "i\xCC\x87", 3, e);
        } else {
            uint8_t u[4];
            utf8proc_ssize_t w = utf8proc_encode_char(utf8proc_tolower(cp), u);
            rc = tok_buf_put(o, (const char *)u, (size_t)w, e);
        }
        i += k;
    }
    return rc;
}

static int apply_strip(const struct tok_norm_step *st, const char *s, size_t len, struct tok_buf *o,
                       struct err *e)
{
    size_t a = 0, b = len;
    int32_t cp;
    while (st->left && a < b) {
        size_t k = tok_utf8_next(s + a, b - a, &cp);
        if (!tok_cp_is_space(cp))
            break;
        a += k;
    }
    while (st->right && b > a) {
        size_t p = tok_utf8_prev(s, b);
        tok_utf8_next(s + p, b - p, &cp);
        if (!tok_cp_is_space(cp))
            break;
        b = p;
    }
    return tok_buf_put(o, s + a, b - a, e);
}

static int apply_replace(const struct tok_norm_step *st, pcre2_match_data *md, const char *s,
                         size_t len, struct tok_buf *o, struct err *e)
{
    size_t pos = 0, copied = 0;
    int rc;
    while (pos <= len) {
        int m = pcre2_match(st->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return err_setf(e, ERR_ARG, "normalizer Replace: regex failed (%d) at byte %zu", m, pos);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) {  /* empty match: nothing to replace, move on one character */
            if (ov[0] >= len)
                break;
            int32_t cp;
            pos = ov[0] + tok_utf8_next(s + ov[0], len - ov[0], &cp);
            continue;
        }
        if ((rc = tok_buf_put(o, s + copied, ov[0] - copied, e)) < 0 ||
            (rc = tok_buf_put(o, st->str, st->str_len, e)) < 0)
            return rc;
        copied = pos = ov[1];
    }
    return tok_buf_put(o, s + copied, len - copied, e);
}

static int map_unicode(int opt, const char *s, size_t len, struct tok_buf *o, struct err *e)
{
    uint8_t *next = NULL;
    utf8proc_ssize_t n = utf8proc_map((const uint8_t *)s, (utf8proc_ssize_t)len, &next,
                                      (utf8proc_option_t)opt);
    if (n < 0)
        return err_setf(e, n == UTF8PROC_ERROR_NOMEM ? ERR_NOMEM : ERR_ARG, "normalizer: %s",
                        utf8proc_errmsg(n));
    int rc = tok_buf_put(o, (const char *)next, (size_t)n, e);
    free(next);
    return rc;
}

/* NFC/NFD/NFKC/NFKD. ASCII is invariant under all four, and a boundary
 * just before an ASCII character never interacts with what precedes it (an
 * ASCII character is a starter and never the second half of a
 * composition), so only the stretches from the character before a
 * non-ASCII run up to the next ASCII character go through utf8proc. Mostly
 * ASCII text (code, English) is then a copy. */
static int apply_unicode(enum tok_norm_kind kind, const char *s, size_t len, struct tok_buf *o,
                         struct err *e)
{
    int opt = UTF8PROC_STABLE, rc;
    switch (kind) {
    case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    size_t pos = 0;
    while (pos < len) {
        size_t q = pos;
        while (q < len && (unsigned char)s[q] < 0x80)
            q++;
        if (q == len)
            return tok_buf_put(o, s + pos, len - pos, e);
        size_t cs = q > pos ? q - 1 : q, k = q;
        while (k < len && (unsigned char)s[k] >= 0x80)
            k++;
        if ((rc = tok_buf_put(o, s + pos, cs - pos, e)) < 0 ||
            (rc = map_unicode(opt, s + cs, k - cs, o, e)) < 0)
            return rc;
        pos = k;
    }
    return tok_buf_put(o, "", 0, e);
}

/* ---- BertNormalizer, StripAccents ---- */

/* The CJK blocks of tokenizers' is_chinese_char. */
static bool is_chinese(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* clean_text and handle_chinese_chars in one pass. */
static int bert_clean(const struct tok_norm_step *st, const char *s, size_t len,
                      struct tok_buf *o, struct err *e)
{
    int rc = tok_buf_put(o, "", 0, e);
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t cp;
        size_t k = tok_utf8_next(s + i, len - i, &cp);
        bool tnr = cp == '\t' || cp == '\n' || cp == '\r', ws = tnr || tok_cp_is_space(cp);
        /* tokenizers filters before it maps: a control character that is
         * also White_Space (U+000B, U+000C, U+0085...) is dropped */
        if (st->clean_text && (cp == 0 || cp == 0xFFFD || (!tnr && tok_cp_is_bert_other(cp)))) {
            i += k;
            continue;
        }
        bool cjk = st->chinese && is_chinese(cp);
        if (st->clean_text && ws) {
            rc = tok_buf_put(o, " ", 1, e);
        } else {
            if (cjk)
                rc = tok_buf_put(o, " ", 1, e);
            if (rc == 0)
                rc = tok_buf_put(o, s + i, k, e);
            if (rc == 0 && cjk)
                rc = tok_buf_put(o, " ", 1, e);
        }
        i += k;
    }
    return rc;
}

/* Drops nonspacing marks (Mn), or with all_marks every mark (Mn, Mc, Me:
 * StripAccents uses is_combining_mark, BertNormalizer is_mark_nonspacing). */
static int drop_marks(const char *s, size_t len, bool all_marks, struct tok_buf *o, struct err *e)
{
    int rc = tok_buf_put(o, "", 0, e);
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t cp;
        size_t k = tok_utf8_next(s + i, len - i, &cp);
        if (!(all_marks ? tok_cp_is_combining_mark(cp) : tok_cp_is_bert_mn(cp)))
            rc = tok_buf_put(o, s + i, k, e);
        i += k;
    }
    return rc;
}

static int apply_unicode(enum tok_norm_kind kind, const char *s, size_t len, struct tok_buf *o,
                         struct err *e);

/* BertNormalizer: its four passes through scratch buffers. */
static int apply_bert(const struct tok_norm_step *st, const char *s, size_t len,
                      struct tok_buf *o, struct err *e)
{
    struct tok_buf a = {0}, b = {0};
    int rc = 0;
    if (st->clean_text || st->chinese)
        rc = bert_clean(st, s, len, &a, e);
    else
        rc = tok_buf_put(&a, s, len, e);
    if (rc == 0 && st->strip_accents) {
        if ((rc = apply_unicode(TOK_NORM_NFD, a.p, a.n, &b, e)) == 0) {
            a.n = 0;
            rc = drop_marks(b.p, b.n, false, &a, e);
        }
    }
    if (rc == 0)
        rc = st->lowercase ? apply_lowercase(a.p, a.n, o, e) : tok_buf_put(o, a.p, a.n, e);
    if (rc == 0)
        rc = tok_buf_put(o, "", 0, e);
    free(a.p);
    free(b.p);
    return rc;
}

static int apply_step(const struct tokenizer *t, const struct tok_norm_step *st,
                      pcre2_match_data *md, const char *s, size_t len, struct tok_buf *o,
                      struct err *e)
{
    int rc;
    switch (st->kind) {
    case TOK_NORM_LOWERCASE:
        return apply_lowercase(s, len, o, e);
    case TOK_NORM_STRIP:
        return apply_strip(st, s, len, o, e);
    case TOK_NORM_PREPEND:
        if (len > 0 && (rc = tok_buf_put(o, st->str, st->str_len, e)) < 0)
            return rc;
        return tok_buf_put(o, s, len, e);
    case TOK_NORM_REPLACE:
        return apply_replace(st, md, s, len, o, e);
    case TOK_NORM_BERT:
        return apply_bert(st, s, len, o, e);
    case TOK_NORM_STRIP_ACCENTS:
        return drop_marks(s, len, true, o, e);
    case TOK_NORM_PRECOMPILED:
        return tok_charsmap_apply(st->cmap, s, len, o, e);
    case TOK_NORM_BYTELEVEL:
        for (size_t i = 0; i < len; i++) {
            unsigned char b = (unsigned char)s[i];
            if ((rc = tok_buf_put(o, t->bl.enc[b], t->bl.enc_len[b], e)) < 0)
                return rc;
        }
        return tok_buf_put(o, "", 0, e);
    default:
        return apply_unicode(st->kind, s, len, o, e);
    }
}

int tok_norm_apply(const struct tokenizer *t, pcre2_match_data *md, const char *s, size_t len,
                   char **out, size_t *out_len, struct err *e)
{
    const struct tok_norm *nm = &t->norm;
    struct tok_buf cur = {0}, next = {0};
    int rc = tok_buf_put(&cur, s, len, e);
    for (int i = 0; i < nm->n && rc == 0; i++) {
        next.n = 0;
        rc = apply_step(t, &nm->step[i], md, cur.p, cur.n, &next, e);
        struct tok_buf tmp = cur;
        cur = next;
        next = tmp;
    }
    free(next.p);
    if (rc == 0 && !cur.p)
        rc = tok_buf_put(&cur, "", 0, e);
    if (rc < 0) {
        free(cur.p);
        return rc;
    }
    *out = cur.p;
    *out_len = cur.n;
    return 0;
}
