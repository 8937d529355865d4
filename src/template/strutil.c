/*
 * strutil: Python string operations on UTF-8 strings for the template
 * interpreter: whitespace as str.isspace() sees it, strip with an optional
 * character set, case mapping through utf8proc (one code point to one,
 * as str.lower/upper do for all but a few special cases), split, replace,
 * splitlines and a code point decoder. Results are arena strings.
 */
#include <string.h>
#include <utf8proc.h>

#include "strutil.h"

/* Decode one code point at s[i] (invalid bytes decode as themselves, 1 byte). */
int32_t su_decode(const char *s, size_t len, size_t i, size_t *next)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
    if (n <= 0) {
        *next = i + 1;
        return (unsigned char)s[i];
    }
    *next = i + (size_t)n;
    return cp;
}

bool su_is_space(int32_t cp)
{
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Start of the code point that ends at byte j (j > 0). */
static size_t prev_cp(const char *s, size_t j)
{
    size_t i = j - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && j - i < 4)
        i--;
    return i;
}

static bool in_set(int32_t cp, const struct tstr *chars)
{
    if (!chars)
        return su_is_space(cp);
    for (size_t i = 0; i < chars->len;) {
        size_t nx;
        if (su_decode(chars->s, chars->len, i, &nx) == cp)
            return true;
        i = nx;
    }
    return false;
}

struct tstr *su_strip(struct rctx *c, const struct tstr *s, const struct tstr *chars, bool left, bool right)
{
    size_t a = 0, b = s->len, nx;
    while (left && a < b && in_set(su_decode(s->s, s->len, a, &nx), chars))
        a = nx;
    while (right && b > a) {
        size_t p = prev_cp(s->s, b);
        if (!in_set(su_decode(s->s, s->len, p, &nx), chars))
            break;
        b = p;
    }
    return tstr_new(c, s->s + a, b - a);
}

static int put_cp(struct rctx *c, struct sbuf *b, int32_t cp)
{
    utf8proc_uint8_t u[8];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, u);
    return sbuf_put(c, b, (const char *)u, (size_t)n);
}

/* Python's one-to-many case mappings (SpecialCasing.txt) for the letters
 * templates might meet; utf8proc maps code point to code point only. */
static const struct { int32_t cp; const char *upper, *title, *lower; } k_special_case[] = {
    {0xDF, "SS", "Ss", NULL},       {0xFB00, "FF", "Ff", NULL},   {0xFB01, "FI", "Fi", NULL},
    {0xFB02, "FL", "Fl", NULL},     {0xFB03, "FFI", "Ffi", NULL}, {0xFB04, "FFL", "Ffl", NULL},
    {0xFB05, "ST", "St", NULL},     {0xFB06, "ST", "St", NULL},   {0x149, "\xCA\xBCN", "\xCA\xBCN", NULL},
    {0x1F0, "J\xCC\x8C", "J\xCC\x8C", NULL}, {0x130, NULL, NULL, "i\xCC\x87"},
};

/* Append the special mapping of cp for mode (0 upper, 1 title, 2 lower); false when none. */
static bool special_case(struct rctx *c, struct sbuf *b, int32_t cp, int mode, int *rc)
{
    for (size_t i = 0; i < sizeof k_special_case / sizeof k_special_case[0]; i++) {
        if (k_special_case[i].cp != cp)
            continue;
        const char *m = mode == 0 ? k_special_case[i].upper : mode == 1 ? k_special_case[i].title
                                                                          : k_special_case[i].lower;
        if (!m)
            return false;
        *rc = sbuf_put(c, b, m, strlen(m));
        return true;
    }
    return false;
}

static bool is_cased(int32_t cp)
{
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

struct tstr *su_case(struct rctx *c, const struct tstr *s, enum su_case mode)
{
    struct sbuf b = {0};
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s->len;) {
        size_t nx;
        int32_t cp = su_decode(s->s, s->len, i, &nx), o = cp;
        int special = -1, rc = 0;  /* which one-to-many mapping applies: 0 upper, 1 title, 2 lower */
        switch (mode) {
        case SU_LOWER: o = utf8proc_tolower(cp), special = 2; break;
        case SU_UPPER: o = utf8proc_toupper(cp), special = 0; break;
        case SU_CAPITALIZE:
            o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
            special = first ? 1 : 2;
            break;
        case SU_PY_TITLE:  /* str.title(): a letter after a cased letter is lowered */
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            special = prev_cased ? 2 : 1;
            prev_cased = is_cased(cp);
            break;
        case SU_JINJA_TITLE:  /* the title filter: words start after - space ( { [ < */
            o = word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            special = word_start ? 0 : 2;
            word_start = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || su_is_space(cp);
            break;
        }
        first = false;
        if (cp >= 0x80 && special_case(c, &b, cp, special, &rc)) {
            if (rc < 0)
                return NULL;
        } else if (put_cp(c, &b, o) < 0) {
            return NULL;
        }
        i = nx;
    }
    return tstr_new(c, b.p ? b.p : "", b.len);
}

struct tstr *su_replace(struct rctx *c, const struct tstr *s, const struct tstr *old,
                        const struct tstr *new_, int64_t count)
{
    struct sbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) {  /* Python inserts new_ around every character */
        for (;;) {
            if ((count < 0 || done < count)) {
                if (sbuf_put(c, &b, new_->s, new_->len) < 0)
                    return NULL;
                done++;
            }
            if (i >= s->len)
                break;
            size_t nx;
            su_decode(s->s, s->len, i, &nx);
            if (sbuf_put(c, &b, s->s + i, nx - i) < 0)
                return NULL;
            i = nx;
        }
        return tstr_new(c, b.p ? b.p : "", b.len);
    }
    while (i <= s->len) {
        const char *hit = (count < 0 || done < count) && s->len - i >= old->len
                        ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!hit) {
            if (sbuf_put(c, &b, s->s + i, s->len - i) < 0)
                return NULL;
            break;
        }
        size_t h = (size_t)(hit - s->s);
        if (sbuf_put(c, &b, s->s + i, h - i) < 0 || sbuf_put(c, &b, new_->s, new_->len) < 0)
            return NULL;
        i = h + old->len;
        done++;
        if (ev_step(c) < 0)
            return NULL;
    }
    return tstr_new(c, b.p ? b.p : "", b.len);
}

static int push_piece(struct rctx *c, struct tlist *l, const char *s, size_t n)
{
    struct tstr *t = tstr_new(c, s, n);
    if (!t)
        return -c->e->code;
    int rc = ev_step(c);
    return rc < 0 ? rc : tlist_push(c, l, tv_str(t));
}

int su_split(struct rctx *c, const struct tstr *s, const struct tstr *sep, int64_t maxsplit, bool from_right,
             struct tlist **out)
{
    struct tlist *l = tlist_new(c, 0);
    int rc;
    if (!l)
        return -c->e->code;
    *out = l;
    if (sep && sep->len == 0)
        return rerr(c, ERR_FORMAT, "empty separator");
    if (from_right) {
        /* collect right to left, then reverse */
        size_t b = s->len;
        int64_t done = 0;
        if (!sep) {
            size_t nx;
            for (;;) {
                while (b > 0 && su_is_space(su_decode(s->s, s->len, prev_cp(s->s, b), &nx)))
                    b = prev_cp(s->s, b);
                if (b == 0)
                    break;
                size_t a = b;
                if (maxsplit >= 0 && done >= maxsplit) {
                    if ((rc = push_piece(c, l, s->s, b)) < 0)
                        return rc;
                    break;
                }
                while (a > 0 && !su_is_space(su_decode(s->s, s->len, prev_cp(s->s, a), &nx)))
                    a = prev_cp(s->s, a);
                if ((rc = push_piece(c, l, s->s + a, b - a)) < 0)
                    return rc;
                done++;
                b = a;
            }
        } else {
            for (;;) {
                size_t hit = SIZE_MAX;
                if ((maxsplit < 0 || done < maxsplit) && b >= sep->len)
                    for (size_t p = b - sep->len + 1; p-- > 0;)
                        if (memcmp(s->s + p, sep->s, sep->len) == 0) {
                            hit = p;
                            break;
                        }
                if (hit == SIZE_MAX) {
                    if ((rc = push_piece(c, l, s->s, b)) < 0)
                        return rc;
                    break;
                }
                if ((rc = push_piece(c, l, s->s + hit + sep->len, b - hit - sep->len)) < 0)
                    return rc;
                done++;
                b = hit;
            }
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            struct tv t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
        return 0;
    }
    size_t i = 0, nx;
    int64_t done = 0;
    if (!sep) {
        for (;;) {
            while (i < s->len && su_is_space(su_decode(s->s, s->len, i, &nx)))
                i = nx;
            if (i >= s->len)
                return 0;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t b = s->len;
                while (b > i && su_is_space(su_decode(s->s, s->len, prev_cp(s->s, b), &nx)))
                    b = prev_cp(s->s, b);
                return push_piece(c, l, s->s + i, b - i);
            }
            size_t a = i;
            while (i < s->len && !su_is_space(su_decode(s->s, s->len, i, &nx)))
                i = nx;
            if ((rc = push_piece(c, l, s->s + a, i - a)) < 0)
                return rc;
            done++;
        }
    }
    for (;;) {
        const char *hit = (maxsplit < 0 || done < maxsplit) && s->len - i >= sep->len
                        ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
        if (!hit)
            return push_piece(c, l, s->s + i, s->len - i);
        if ((rc = push_piece(c, l, s->s + i, (size_t)(hit - s->s) - i)) < 0)
            return rc;
        i = (size_t)(hit - s->s) + sep->len;
        done++;
    }
}

/* Length of the line break at s[i] as str.splitlines() sees it, 0 if none. */
static size_t line_break(const char *s, size_t len, size_t i)
{
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r')
        return i + 1 < len && s[i + 1] == '\n' ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || ch == 0x1c || ch == 0x1d || ch == 0x1e)
        return 1;
    if (ch == 0xC2 && i + 1 < len && (unsigned char)s[i + 1] == 0x85)
        return 2;
    if (ch == 0xE2 && i + 2 < len && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))
        return 3;
    return 0;
}

int su_splitlines(struct rctx *c, const struct tstr *s, struct tlist **out)
{
    struct tlist *l = tlist_new(c, 0);
    int rc;
    if (!l)
        return -c->e->code;
    size_t a = 0;
    for (size_t i = 0; i < s->len;) {
        size_t k = line_break(s->s, s->len, i);
        if (!k) {
            i++;
            continue;
        }
        if ((rc = push_piece(c, l, s->s + a, i - a)) < 0)
            return rc;
        i += k;
        a = i;
    }
    if (a < s->len && (rc = push_piece(c, l, s->s + a, s->len - a)) < 0)
        return rc;
    *out = l;
    return 0;
}

int64_t su_cp_index(const struct tstr *s, size_t byte_off)
{
    return (int64_t)utf8_count(s->s, byte_off);
}
