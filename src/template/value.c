/*
 * value: the arena and the value type of the template interpreter
 * (tmpl_impl.h): construction, Python truthiness / equality / ordering,
 * Python str() and repr() text, json.dumps() text, and conversion from
 * cJSON. Text forms follow CPython exactly where templates can see them:
 * repr(float) is the shortest round-trip form ("1.0", "1e+16"), dicts and
 * lists print as {'a': 1} / ['x'], None/True/False as in Python.
 * JSON numbers without a fraction or exponent that fit in int64 become
 * ints, others floats (cJSON does not keep the text; a JSON "1.0" is read
 * as the int 1 -- a documented difference).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tmpl_impl.h"

/* ---- arena ---- */

struct ar_chunk {
    struct ar_chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

#define AR_CHUNK 65536

void *ar_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct ar_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t sz = n > AR_CHUNK / 4 ? n : AR_CHUNK;
        if (a->cap && (a->used + sz + sizeof *c > a->cap || sz > a->cap)) {
            a->over_cap = true;
            return NULL;
        }
        c = malloc(sizeof *c + sz);
        if (!c)
            return NULL;
        c->size = sz;
        c->used = 0;
        a->used += sz + sizeof *c;
        if (sz == n && a->head) {  /* a big block: keep the current chunk on top */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void ar_free_all(struct arena *a)
{
    struct ar_chunk *c = a->head;
    while (c) {
        struct ar_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- construction ---- */

int rerr(struct rctx *c, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_setf(c->e, code, "template line %d: %s", c->line, msg);
}

static void *ralloc(struct rctx *c, size_t n)
{
    void *p = ar_alloc(&c->ar, n);
    if (!p)
        rerr(c, c->ar.over_cap ? ERR_RANGE : ERR_NOMEM,
             "render needs more than %zu bytes of memory", c->ar.cap);
    return p;
}

struct tstr *tstr_new(struct rctx *c, const char *s, size_t len)
{
    if (len > c->lim->max_output) {
        rerr(c, ERR_RANGE, "string of %zu bytes is over the limit of %zu", len, c->lim->max_output);
        return NULL;
    }
    struct tstr *t = ralloc(c, sizeof *t + len + 1);
    if (!t)
        return NULL;
    t->len = len;
    if (len && s)
        memcpy(t->s, s, len);
    t->s[len] = 0;
    return t;
}

struct tv tv_str(struct tstr *s) { return (struct tv){.k = TV_STR, .s = s}; }
struct tv tv_int(int64_t i) { return (struct tv){.k = TV_INT, .i = i}; }
struct tv tv_float(double f) { return (struct tv){.k = TV_FLOAT, .f = f}; }
struct tv tv_bool(bool b) { return (struct tv){.k = TV_BOOL, .b = b}; }
struct tv tv_none(void) { return (struct tv){.k = TV_NONE}; }
struct tv tv_undef(const char *name) { return (struct tv){.k = TV_UNDEF, .uname = name}; }

struct tlist *tlist_new(struct rctx *c, size_t cap)
{
    struct tlist *l = ralloc(c, sizeof *l);
    if (!l)
        return NULL;
    if (cap && !(l->v = ralloc(c, cap * sizeof *l->v)))
        return NULL;
    l->cap = cap;
    return l;
}

int tlist_push(struct rctx *c, struct tlist *l, struct tv v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        struct tv *nv = ralloc(c, nc * sizeof *nv);
        if (!nv)
            return -c->e->code;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

struct tdict *tdict_new(struct rctx *c, size_t cap)
{
    struct tdict *d = ralloc(c, sizeof *d);
    if (!d)
        return NULL;
    if (cap && (!(d->k = ralloc(c, cap * sizeof *d->k)) || !(d->v = ralloc(c, cap * sizeof *d->v))))
        return NULL;
    d->cap = cap;
    return d;
}

const struct tv *tdict_getv(struct rctx *c, const struct tdict *d, struct tv key)
{
    for (size_t i = 0; i < d->n; i++)
        if (tv_equal(c, d->k[i], key))
            return &d->v[i];
    return NULL;
}

const struct tv *tdict_get(const struct tdict *d, const char *key, size_t klen)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].k == TV_STR && d->k[i].s->len == klen && memcmp(d->k[i].s->s, key, klen) == 0)
            return &d->v[i];
    return NULL;
}

int tdict_set(struct rctx *c, struct tdict *d, struct tv k, struct tv v)
{
    c->steps += d->n / 4;
    const struct tv *old = tdict_getv(c, d, k);
    if (old) {
        d->v[old - d->v] = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        struct tv *nk = ralloc(c, nc * sizeof *nk), *nv = nk ? ralloc(c, nc * sizeof *nv) : NULL;
        if (!nv)
            return -c->e->code;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 0;
}

/* ---- Python semantics ---- */

bool tv_truthy(struct tv v)
{
    switch (v.k) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v.b;
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.f != 0;
    case TV_STR: return v.s->len > 0;
    case TV_LIST: return v.l->n > 0;
    case TV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(struct tv v) { return v.k == TV_BOOL || v.k == TV_INT || v.k == TV_FLOAT; }
static double num_f(struct tv v) { return v.k == TV_FLOAT ? v.f : v.k == TV_INT ? (double)v.i : v.b; }
static int64_t num_i(struct tv v) { return v.k == TV_INT ? v.i : v.k == TV_BOOL ? v.b : 0; }

static bool equal_d(struct rctx *c, struct tv a, struct tv b, int depth)
{
    if (depth > 200 || (c && (a.k == TV_LIST || a.k == TV_DICT) && ++c->steps > c->lim->max_steps))
        return false;  /* only self-nesting values get here; treated as different */
    if (is_num(a) && is_num(b)) {
        if (a.k != TV_FLOAT && b.k != TV_FLOAT)
            return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case TV_UNDEF: case TV_NONE: return true;
    case TV_STR: return a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
    case TV_LIST:
        if (a.l->n != b.l->n || a.l->tuple != b.l->tuple)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal_d(c, a.l->v[i], b.l->v[i], depth + 1))
                return false;
        return true;
    case TV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            const struct tv *o = tdict_getv(c, b.d, a.d->k[i]);
            if (!o || !equal_d(c, a.d->v[i], *o, depth + 1))
                return false;
        }
        return true;
    case TV_NS: return a.d == b.d;
    case TV_MACRO: return a.m == b.m;
    case TV_FUNC: return a.fn == b.fn;
    default: return a.loop == b.loop;
    }
}

bool tv_equal(struct rctx *c, struct tv a, struct tv b)
{
    return equal_d(c, a, b, 0);
}

const char *tv_type_name(struct tv v)
{
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                        "list", "dict", "Namespace", "Macro", "function", "LoopContext"};
    if (v.k == TV_LIST && v.l->tuple)
        return "tuple";
    return names[v.k];
}

static int compare_d(struct rctx *c, struct tv a, struct tv b, int *cmp, int depth)
{
    if (depth > 200)
        return rerr(c, ERR_RANGE, "comparing values nested deeper than 200 levels");
    if (is_num(a) && is_num(b)) {
        if (a.k != TV_FLOAT && b.k != TV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            *cmp = x < y ? -1 : x > y ? 1 : 0;  /* NaN compares as equal-ish: both false in Python */
        }
        return 0;
    }
    if (a.k == TV_STR && b.k == TV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int r = memcmp(a.s->s, b.s->s, n);
        *cmp = r < 0 ? -1 : r > 0 ? 1 : a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
        return 0;
    }
    if (a.k == TV_LIST && b.k == TV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (tv_equal(c, a.l->v[i], b.l->v[i]))
                continue;
            return compare_d(c, a.l->v[i], b.l->v[i], cmp, depth + 1);
        }
        *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    if (a.k == TV_UNDEF || b.k == TV_UNDEF)
        return rerr(c, ERR_FORMAT, "'%s' is undefined", (a.k == TV_UNDEF ? a : b).uname ? (a.k == TV_UNDEF ? a : b).uname : "value");
    return rerr(c, ERR_FORMAT, "comparison not supported between instances of '%s' and '%s'",
                tv_type_name(a), tv_type_name(b));
}

int tv_compare(struct rctx *c, struct tv a, struct tv b, int *cmp)
{
    return compare_d(c, a, b, cmp, 0);
}

/* ---- text ---- */

int sbuf_put(struct rctx *c, struct sbuf *b, const char *s, size_t n)
{
    if (n > c->lim->max_output || b->len > c->lim->max_output - n)
        return rerr(c, ERR_RANGE, "output is over the limit of %zu bytes", c->lim->max_output);
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *p = ralloc(c, nc);
        if (!p)
            return -c->e->code;
        if (b->len)
            memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static int sbuf_puts(struct rctx *c, struct sbuf *b, const char *s) { return sbuf_put(c, b, s, strlen(s)); }

void fmt_float(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[64], dig[32];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    size_t nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            dig[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    dig[nd] = 0;
    size_t o = 0;
    char out[64];
    if (neg)
        out[o++] = '-';
    if (exp < -4 || exp >= 16) {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, dig + 1, nd - 1);
            o += nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp >= 0) {
        for (int i = 0; i <= exp; i++)
            out[o++] = (size_t)i < nd ? dig[i] : '0';
        out[o++] = '.';
        if ((size_t)exp + 1 < nd) {
            memcpy(out + o, dig + exp + 1, nd - (size_t)exp - 1);
            o += nd - (size_t)exp - 1;
        } else {
            out[o++] = '0';
        }
    } else {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp - 1; i++)
            out[o++] = '0';
        memcpy(out + o, dig, nd);
        o += nd;
    }
    out[o] = 0;
    snprintf(buf, cap, "%s", out);
}

/* str.isprintable() for one code point: not in Cc, Cf, Cs, Co, Cn, Zl, Zp, or Zs other than ' '. */
static bool cp_printable(int32_t cp)
{
    if (cp == ' ')
        return true;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* Python repr() of a str: quotes chosen as CPython does, \n \r \t \\ and the
 * quote escaped, other non-printable code points as \xNN, \uNNNN or \UNNNNNNNN. */
static int write_repr_str(struct rctx *c, struct sbuf *b, const struct tstr *s)
{
    bool sq = memchr(s->s, '\'', s->len) != NULL, dq = memchr(s->s, '"', s->len) != NULL;
    char q = sq && !dq ? '"' : '\'';
    int rc = sbuf_put(c, b, &q, 1);
    for (size_t i = 0; rc == 0 && i < s->len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s->s + i, (utf8proc_ssize_t)(s->len - i), &cp);
        char esc[16];
        if (n <= 0) {  /* not reached: strings are valid UTF-8 */
            n = 1;
            cp = (unsigned char)s->s[i];
        }
        if (cp == '\\' || cp == q) {
            esc[0] = '\\', esc[1] = (char)cp;
            rc = sbuf_put(c, b, esc, 2);
        } else if (cp == '\n' || cp == '\r' || cp == '\t') {
            esc[0] = '\\', esc[1] = cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't';
            rc = sbuf_put(c, b, esc, 2);
        } else if (!cp_printable(cp)) {
            int w = snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x",
                             (unsigned)cp);
            rc = sbuf_put(c, b, esc, (size_t)w);
        } else {
            rc = sbuf_put(c, b, s->s + i, (size_t)n);
        }
        i += (size_t)n;
    }
    return rc ? rc : sbuf_put(c, b, &q, 1);
}

static int write_d(struct rctx *c, struct sbuf *b, struct tv v, bool repr, int depth)
{
    char tmp[64];
    int rc = 0;
    if (depth > 200)
        return rerr(c, ERR_RANGE, "printing a value nested deeper than 200 levels");
    switch (v.k) {
    case TV_UNDEF: return 0;
    case TV_NONE: return sbuf_puts(c, b, "None");
    case TV_BOOL: return sbuf_puts(c, b, v.b ? "True" : "False");
    case TV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.i);
        return sbuf_puts(c, b, tmp);
    case TV_FLOAT:
        fmt_float(v.f, tmp, sizeof tmp);
        return sbuf_puts(c, b, tmp);
    case TV_STR: return repr ? write_repr_str(c, b, v.s) : sbuf_put(c, b, v.s->s, v.s->len);
    case TV_LIST: {
        if ((rc = ev_step(c)) < 0 || (v.l->view && ((rc = sbuf_puts(c, b, v.l->view)) < 0 ||
                                                   (rc = sbuf_puts(c, b, "(")) < 0)) ||
            (rc = sbuf_puts(c, b, v.l->tuple ? "(" : "[")) < 0)
            return rc;
        for (size_t i = 0; i < v.l->n; i++)
            if ((i && (rc = sbuf_puts(c, b, ", ")) < 0) || (rc = write_d(c, b, v.l->v[i], true, depth + 1)) < 0)
                return rc;
        if (v.l->tuple && v.l->n == 1 && (rc = sbuf_puts(c, b, ",")) < 0)
            return rc;
        if ((rc = sbuf_puts(c, b, v.l->tuple ? ")" : "]")) < 0)
            return rc;
        return v.l->view ? sbuf_puts(c, b, ")") : 0;
    }
    case TV_DICT:
    case TV_NS:
        if ((rc = ev_step(c)) < 0 || (rc = sbuf_puts(c, b, v.k == TV_NS ? "<Namespace {" : "{")) < 0)
            return rc;
        for (size_t i = 0; i < v.d->n; i++)
            if ((i && (rc = sbuf_puts(c, b, ", ")) < 0) || (rc = write_d(c, b, v.d->k[i], true, depth + 1)) < 0 ||
                (rc = sbuf_puts(c, b, ": ")) < 0 || (rc = write_d(c, b, v.d->v[i], true, depth + 1)) < 0)
                return rc;
        return sbuf_puts(c, b, v.k == TV_NS ? "}>" : "}");
    case TV_MACRO: return sbuf_puts(c, b, "<Macro>");
    case TV_FUNC: return sbuf_puts(c, b, "<function>");
    default: return sbuf_puts(c, b, "<LoopContext>");
    }
}

int tv_write(struct rctx *c, struct sbuf *b, struct tv v, bool repr)
{
    return write_d(c, b, v, repr, 0);
}

int tv_to_str(struct rctx *c, struct tv v, struct tstr **out)
{
    if (v.k == TV_STR) {
        *out = v.s;
        return 0;
    }
    struct sbuf b = {0};
    int rc = tv_write(c, &b, v, false);
    if (rc < 0)
        return rc;
    *out = tstr_new(c, b.p ? b.p : "", b.len);
    return *out ? 0 : -c->e->code;
}

static int json_str(struct rctx *c, struct sbuf *b, const char *s, size_t n)
{
    int rc = sbuf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        if (i > run && (rc = sbuf_put(c, b, s + run, i - run)) < 0)
            return rc;
        char esc[8];
        switch (ch) {
        case '"': rc = sbuf_put(c, b, "\\\"", 2); break;
        case '\\': rc = sbuf_put(c, b, "\\\\", 2); break;
        case '\n': rc = sbuf_put(c, b, "\\n", 2); break;
        case '\r': rc = sbuf_put(c, b, "\\r", 2); break;
        case '\t': rc = sbuf_put(c, b, "\\t", 2); break;
        case '\b': rc = sbuf_put(c, b, "\\b", 2); break;
        case '\f': rc = sbuf_put(c, b, "\\f", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            rc = sbuf_put(c, b, esc, 6);
        }
        run = i + 1;
    }
    if (rc == 0 && n > run)
        rc = sbuf_put(c, b, s + run, n - run);
    return rc ? rc : sbuf_put(c, b, "\"", 1);
}

static int json_scalar(struct rctx *c, struct sbuf *b, struct tv v, bool key)
{
    char tmp[64];
    switch (v.k) {
    case TV_NONE: return sbuf_puts(c, b, key ? "\"null\"" : "null");
    case TV_BOOL: return sbuf_puts(c, b, key ? (v.b ? "\"true\"" : "\"false\"") : v.b ? "true" : "false");
    case TV_INT:
        snprintf(tmp, sizeof tmp, key ? "\"%lld\"" : "%lld", (long long)v.i);
        return sbuf_puts(c, b, tmp);
    case TV_FLOAT: {
        char f[48];
        if (isnan(v.f))
            snprintf(f, sizeof f, "NaN");
        else if (isinf(v.f))
            snprintf(f, sizeof f, v.f < 0 ? "-Infinity" : "Infinity");
        else
            fmt_float(v.f, f, sizeof f);
        snprintf(tmp, sizeof tmp, key ? "\"%s\"" : "%s", f);
        return sbuf_puts(c, b, tmp);
    }
    case TV_STR: return json_str(c, b, v.s->s, v.s->len);
    default:
        return rerr(c, ERR_FORMAT, key ? "keys must be str, int, float, bool or None, not %s"
                                       : "Object of type %s is not JSON serializable", tv_type_name(v));
    }
}

static int json_nl(struct rctx *c, struct sbuf *b, int indent, int level)
{
    int rc = sbuf_put(c, b, "\n", 1);
    for (int i = 0; rc == 0 && i < indent * level; i++)
        rc = sbuf_put(c, b, " ", 1);
    return rc;
}

int tv_to_json(struct rctx *c, struct sbuf *b, struct tv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth)
{
    int rc;
    if (depth > 100)
        return rerr(c, ERR_RANGE, "tojson: value nested deeper than 100 levels");
    if ((rc = ev_step(c)) < 0)
        return rc;
    if (v.k != TV_LIST && v.k != TV_DICT)
        return json_scalar(c, b, v, false);
    bool dict = v.k == TV_DICT;
    size_t n = dict ? v.d->n : v.l->n;
    if (n == 0)
        return sbuf_puts(c, b, dict ? "{}" : "[]");
    size_t *order = NULL;
    if (dict && sort_keys) {
        if (!(order = ar_alloc(&c->ar, n * sizeof *order)))
            return rerr(c, ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {  /* insertion sort: dicts in templates are small */
            size_t j = i;
            while (j > 0) {
                int cmp = 0;
                if ((rc = tv_compare(c, v.d->k[order[j - 1]], v.d->k[i], &cmp)) < 0)
                    return rc;
                if (cmp <= 0)
                    break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = i;
            if ((rc = ev_step(c)) < 0)
                return rc;
        }
    }
    if ((rc = sbuf_puts(c, b, dict ? "{" : "[")) < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        size_t k = order ? order[i] : i;
        if (i && (rc = sbuf_puts(c, b, item_sep)) < 0)
            return rc;
        if (indent >= 0 && (rc = json_nl(c, b, indent, depth + 1)) < 0)
            return rc;
        if (dict) {
            struct tv key = v.d->k[k];
            if ((rc = key.k == TV_STR ? json_str(c, b, key.s->s, key.s->len) : json_scalar(c, b, key, true)) < 0 ||
                (rc = sbuf_puts(c, b, key_sep)) < 0)
                return rc;
        }
        if ((rc = tv_to_json(c, b, dict ? v.d->v[k] : v.l->v[k], indent, item_sep, key_sep, sort_keys, depth + 1)) < 0)
            return rc;
    }
    if (indent >= 0 && (rc = json_nl(c, b, indent, depth)) < 0)
        return rc;
    return sbuf_puts(c, b, dict ? "}" : "]");
}

int tv_from_json(struct rctx *c, const cJSON *j, struct tv *out, int depth)
{
    int rc;
    if (depth > 200)
        return rerr(c, ERR_RANGE, "variables nested deeper than 200 levels");
    if ((rc = ev_step(c)) < 0)
        return rc;
    if (cJSON_IsNull(j) || !j) {
        *out = tv_none();
    } else if (cJSON_IsBool(j)) {
        *out = tv_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0)
            *out = tv_int((int64_t)d);
        else
            *out = tv_float(d);
    } else if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring), bad = utf8_invalid_at(j->valuestring, n);
        if (bad != SIZE_MAX)
            return rerr(c, ERR_ARG, "a string variable is not valid UTF-8 (byte %zu)", bad);
        struct tstr *s = tstr_new(c, j->valuestring, n);
        if (!s)
            return -c->e->code;
        *out = tv_str(s);
    } else if (cJSON_IsArray(j)) {
        struct tlist *l = tlist_new(c, (size_t)cJSON_GetArraySize(j));
        if (!l)
            return -c->e->code;
        for (const cJSON *x = j->child; x; x = x->next) {
            struct tv v;
            if ((rc = tv_from_json(c, x, &v, depth + 1)) < 0 || (rc = tlist_push(c, l, v)) < 0)
                return rc;
        }
        *out = (struct tv){.k = TV_LIST, .l = l};
    } else if (cJSON_IsObject(j)) {
        struct tdict *d = tdict_new(c, (size_t)cJSON_GetArraySize(j));
        if (!d)
            return -c->e->code;
        for (const cJSON *x = j->child; x; x = x->next) {
            struct tv v;
            size_t kn = x->string ? strlen(x->string) : 0;
            if (utf8_invalid_at(x->string ? x->string : "", kn) != SIZE_MAX)
                return rerr(c, ERR_ARG, "an object key is not valid UTF-8");
            struct tstr *k = tstr_new(c, x->string ? x->string : "", kn);
            if (!k)
                return -c->e->code;
            if ((rc = tv_from_json(c, x, &v, depth + 1)) < 0 || (rc = tdict_set(c, d, tv_str(k), v)) < 0)
                return rc;
        }
        *out = (struct tv){.k = TV_DICT, .d = d};
    } else {
        *out = tv_none();
    }
    return 0;
}

/* ---- UTF-8 ---- */

size_t utf8_invalid_at(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned char b = u[i];
        size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
        if (n == 0 || i + n > len || (n == 2 && b < 0xC2))
            return i;
        uint32_t cp = n == 1 ? b : n == 2 ? b & 0x1Fu : n == 3 ? b & 0x0Fu : b & 0x07u;
        for (size_t k = 1; k < n; k++) {
            if ((u[i + k] & 0xC0) != 0x80)
                return i;
            cp = cp << 6 | (u[i + k] & 0x3Fu);
        }
        if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += n;
    }
    return SIZE_MAX;
}

size_t utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t utf8_offset(const char *s, size_t len, size_t cp)
{
    size_t i = 0, k = 0;
    for (; i < len; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == cp)
                return i;
            k++;
        }
    }
    return len;
}
