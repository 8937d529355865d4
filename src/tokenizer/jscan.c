/*
 * jscan: a minimal JSON reader for the two big arrays of tokenizer.json.
 *
 * model.vocab and model.merges are 90% of a tokenizer.json (Qwen3: 151k
 * vocab entries and 151k merges in 11 MB). Built as a cJSON tree they cost
 * over a million small mallocs, which made loading take ~0.5 s. Instead,
 * tok_json_model_spans walks the document's structure once (strings,
 * nesting; nothing is allocated) to find the byte spans of those two
 * values; the loader then blanks them out of a copy given to cJSON (which
 * parses the small rest) and reads the spans itself with the cursor
 * functions below, unescaping one string at a time into a reused buffer.
 *
 * Everything is bounds-checked against the end of the text; nesting is
 * capped at TOK_JSON_DEPTH. The reader is only as strict as the loader
 * needs: anything it cannot make sense of is an error, and the blanked
 * document still goes through cJSON, which rejects malformed JSON.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

static void skip_ws(struct tok_jcur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

bool tok_json_lit(struct tok_jcur *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

bool tok_json_peek(struct tok_jcur *c, char ch)
{
    skip_ws(c);
    return c->p < c->end && *c->p == ch;
}

static int hex4(const char *p, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Appends code point cp as UTF-8. */
static int put_cp(struct tok_buf *o, uint32_t cp, struct err *e)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    return tok_buf_put(o, u, n, e);
}

/* Reads a \uXXXX escape (p at the 'u'), pairing surrogates; lone ones
 * become U+FFFD as serde_json's lossy mode would reject them anyway. */
static int unescape_u(struct tok_jcur *c, struct tok_buf *o, struct err *e)
{
    uint32_t v, lo;
    if (c->end - c->p < 5 || hex4(c->p + 1, &v) < 0)
        return err_setf(e, ERR_FORMAT, "bad \\u escape");
    c->p += 5;
    if (v >= 0xD800 && v <= 0xDBFF && c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u' &&
        hex4(c->p + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
        c->p += 6;
        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
    } else if (v >= 0xD800 && v <= 0xDFFF) {
        return err_setf(e, ERR_FORMAT, "unpaired surrogate \\u%04X", v);
    }
    return put_cp(o, v, e);
}

int tok_json_string(struct tok_jcur *c, struct tok_buf *o, struct err *e)
{
    int rc;
    o->n = 0;
    if ((rc = tok_buf_put(o, "", 0, e)) < 0)
        return rc;
    if (!tok_json_lit(c, '"'))
        return err_setf(e, ERR_FORMAT, "expected a string");
    for (;;) {
        const char *run = c->p;
        while (c->p < c->end && *c->p != '"' && *c->p != '\\' && (unsigned char)*c->p >= 0x20)
            c->p++;
        if ((rc = tok_buf_put(o, run, (size_t)(c->p - run), e)) < 0)
            return rc;
        if (c->p >= c->end || (unsigned char)*c->p < 0x20)
            return err_setf(e, ERR_FORMAT, "unterminated string");
        if (*c->p == '"') {
            c->p++;
            return 0;
        }
        if (c->end - c->p < 2)
            return err_setf(e, ERR_FORMAT, "unterminated string");
        char esc = c->p[1], ch;
        switch (esc) {
        case '"': case '\\': case '/': ch = esc; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u':
            c->p++;
            if ((rc = unescape_u(c, o, e)) < 0)
                return rc;
            continue;
        default:
            return err_setf(e, ERR_FORMAT, "bad escape '\\%c'", esc);
        }
        c->p += 2;
        if ((rc = tok_buf_put(o, &ch, 1, e)) < 0)
            return rc;
    }
}

int tok_json_number(struct tok_jcur *c, double *v, struct err *e)
{
    char buf[64];
    size_t n = 0;
    skip_ws(c);
    while (c->p + n < c->end && n < sizeof buf - 1 &&
           (strchr("+-.eE", c->p[n]) || (c->p[n] >= '0' && c->p[n] <= '9')))
        n++;
    memcpy(buf, c->p, n);
    buf[n] = '\0';
    char *endp;
    *v = strtod(buf, &endp);
    if (n == 0 || endp != buf + n)
        return err_setf(e, ERR_FORMAT, "expected a number");
    c->p += n;
    return 0;
}

/* ---- structure walk ---- */

/* Skips a string's body and closing quote (c->p just past the opening one):
 * jumps from quote to quote with memchr, a quote preceded by an odd number
 * of backslashes being escaped. */
static int skip_string_body(struct tok_jcur *c)
{
    for (;;) {
        const char *q = memchr(c->p, '"', (size_t)(c->end - c->p));
        if (!q)
            return -1;
        size_t bs = 0;
        while (q - bs > c->p && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        c->p = q + 1;
        if (bs % 2 == 0)
            return 0;
    }
}

static bool is_delim(char ch)
{
    switch (ch) {
    case ',': case ':': case ']': case '}': case ' ': case '\t': case '\n': case '\r':
    case '"': case '{': case '[':
        return true;
    default:
        return false;
    }
}

/* Skips one value of any type. */
static int skip_value(struct tok_jcur *c)
{
    int depth = 0;
    skip_ws(c);
    do {
        if (c->p >= c->end)
            return -1;
        char ch = *c->p;
        if (ch == '"') {
            c->p++;
            if (skip_string_body(c) < 0)
                return -1;
        } else if (ch == '{' || ch == '[') {
            if (++depth > TOK_JSON_DEPTH)
                return -1;
            c->p++;
        } else if (ch == '}' || ch == ']') {
            if (--depth < 0)
                return -1;
            c->p++;
        } else if (ch == ',' || ch == ':' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            if (depth == 0)
                return -1;
            c->p++;
        } else {  /* number or literal: up to the next delimiter */
            while (c->p < c->end && !is_delim(*c->p))
                c->p++;
        }
    } while (depth > 0);
    return 0;
}

/* Reads an object key without unescaping (keys we look for have no escapes);
 * *k, *klen point into the text. */
static int raw_key(struct tok_jcur *c, const char **k, size_t *klen)
{
    if (!tok_json_lit(c, '"'))
        return -1;
    *k = c->p;
    if (skip_string_body(c) < 0)
        return -1;
    *klen = (size_t)(c->p - 1 - *k);
    return tok_json_lit(c, ':') ? 0 : -1;
}

static bool key_is(const char *k, size_t klen, const char *want)
{
    return klen == strlen(want) && memcmp(k, want, klen) == 0;
}

/* Walks the object at c; for each key in names[] (first occurrence), records
 * the span of its value; descend says which key's object to walk into with
 * the same function (only "model" at the top). */
static int walk_model(struct tok_jcur *c, struct tok_span *vocab, struct tok_span *merges)
{
    const char *k;
    size_t klen;
    if (!tok_json_lit(c, '{'))
        return -1;
    if (tok_json_lit(c, '}'))
        return 0;
    do {
        if (raw_key(c, &k, &klen) < 0)
            return -1;
        skip_ws(c);
        const char *v0 = c->p;
        if (skip_value(c) < 0)
            return -1;
        struct tok_span *sp = key_is(k, klen, "vocab") ? vocab
                              : key_is(k, klen, "merges") ? merges : NULL;
        if (sp && !sp->p) {
            sp->p = v0;
            sp->len = (size_t)(c->p - v0);
        }
    } while (tok_json_lit(c, ','));
    return tok_json_lit(c, '}') ? 0 : -1;
}

int tok_json_model_spans(const char *text, size_t len, struct tok_span *vocab,
                         struct tok_span *merges)
{
    struct tok_jcur c = {text, text + len};
    const char *k;
    size_t klen;
    bool seen_model = false;
    memset(vocab, 0, sizeof *vocab);
    memset(merges, 0, sizeof *merges);
    if (!tok_json_lit(&c, '{'))
        return -1;
    if (tok_json_lit(&c, '}'))
        return 0;
    do {
        if (raw_key(&c, &k, &klen) < 0)
            return -1;
        if (key_is(k, klen, "model") && !seen_model && tok_json_peek(&c, '{')) {
            seen_model = true;
            if (walk_model(&c, vocab, merges) < 0)
                return -1;
        } else if (skip_value(&c) < 0) {
            return -1;
        }
    } while (tok_json_lit(&c, ','));
    return tok_json_lit(&c, '}') ? 0 : -1;
}
