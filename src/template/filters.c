/*
 * filters: jinja2's built-in filters and tests as chat templates use them,
 * plus transformers' `tojson` (json.dumps with ensure_ascii=False, and
 * indent / separators / sort_keys). Each follows the jinja2 3.x Python
 * implementation's observable behaviour: argument names and defaults,
 * case-insensitive sort/unique/min/max by default, `default` only
 * replacing Undefined unless boolean=true, `round` rounding half to even
 * as Python's round() does, `indent`'s handling of blank lines.
 * An unknown filter or test name is a render error naming it (jinja2
 * reports that at compile time; the text is the same).
 * Each filter is one function (f_<name>, or one per family: the case
 * filters, first/last, min/max, the map/select family), found by name in
 * k_filters, where aliases (count, d, e, escape, forceescape) are entries.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strutil.h"

/* One filter call: the filter's name and its arguments, positional then keyword. */
struct fcall {
    const char *name;
    struct tv *pos;
    size_t n;
    struct tstr **kw;
    struct tv *kwv;
    size_t n_kw;
};

/* Argument i by position, or by keyword name; *v untouched when absent. */
static bool arg(const struct fcall *fc, size_t i, const char *name, struct tv *v)
{
    if (i < fc->n) {
        *v = fc->pos[i];
        return true;
    }
    for (size_t k = 0; k < fc->n_kw; k++)
        if (!strcmp(fc->kw[k]->s, name)) {
            *v = fc->kwv[k];
            return true;
        }
    return false;
}

static int need_str(struct rctx *c, struct tv v, struct tstr **out) { return tv_to_str(c, v, out); }

static int out_str(struct rctx *c, struct tstr *s, struct tv *out)
{
    if (!s)
        return -c->e->code;
    *out = tv_str(s);
    return 0;
}

static int out_list(struct tlist *l, struct tv *out)
{
    *out = (struct tv){.k = TV_LIST, .l = l};
    return 0;
}

/* jinja2's attribute getter: "a.b.0" through getitem-then-getattr per part. */
static int get_path(struct rctx *c, struct tv v, struct tstr *path, struct tv *out)
{
    size_t i = 0;
    while (i <= path->len) {
        size_t j = i;
        while (j < path->len && path->s[j] != '.')
            j++;
        bool digits = j > i;
        int64_t idx = 0;
        for (size_t k = i; k < j; k++) {
            if (path->s[k] < '0' || path->s[k] > '9' || idx > 100000000)
                digits = false;
            else
                idx = idx * 10 + (path->s[k] - '0');
        }
        if (v.k == TV_UNDEF)
            return rerr(c, ERR_FORMAT, "'%s' is undefined", v.uname ? v.uname : "value");
        if (digits && v.k == TV_LIST) {
            v = (uint64_t)idx < v.l->n ? v.l->v[idx] : tv_undef("item");
        } else if (v.k == TV_DICT || v.k == TV_NS) {
            const struct tv *x = tdict_get(v.d, path->s + i, j - i);
            v = x ? *x : tv_undef(path->s + i);
        } else {
            v = tv_undef(path->s + i);
        }
        i = j + 1;
    }
    *out = v;
    return 0;
}

/* Sort key comparison: strings lowered unless case-sensitive. */
static int key_cmp(struct rctx *c, struct tv a, struct tv b, bool cs, int *cmp)
{
    if (!cs && a.k == TV_STR && b.k == TV_STR) {
        struct tstr *la = su_case(c, a.s, SU_LOWER), *lb = la ? su_case(c, b.s, SU_LOWER) : NULL;
        if (!lb)
            return -c->e->code;
        a = tv_str(la);
        b = tv_str(lb);
    }
    return tv_compare(c, a, b, cmp);
}

/* Stable insertion sort of a copy of src by key: attribute path, pair element
 * (pair_key 0/1, for dictsort) or the item itself. */
static int sort_list(struct rctx *c, struct tlist *src, struct tstr *attr, bool cs, bool reverse,
                     int pair_key, struct tlist **out)
{
    struct tlist *l = tlist_new(c, src->n);
    struct tv *keys = src->n ? ar_alloc(&c->ar, src->n * sizeof *keys) : NULL;
    int rc;
    if (!l || (src->n && !keys))
        return rerr(c, ERR_RANGE, "out of memory sorting");
    if ((uint64_t)src->n * src->n > c->lim->max_steps)
        return rerr(c, ERR_RANGE, "sorting %zu items is over the step limit", src->n);
    for (size_t i = 0; i < src->n; i++) {
        struct tv k = src->v[i];
        if (pair_key >= 0 && k.k == TV_LIST && k.l->n == 2)  /* dictsort: by key or by value */
            k = k.l->v[pair_key];
        if (attr && (rc = get_path(c, src->v[i], attr, &k)) < 0)
            return rc;
        size_t j = l->n;
        while (j > 0) {
            int cmp;
            if ((rc = key_cmp(c, keys[j - 1], k, cs, &cmp)) < 0 || (rc = ev_step(c)) < 0)
                return rc;
            if (reverse ? cmp >= 0 : cmp <= 0)
                break;
            keys[j] = keys[j - 1];
            l->v[j] = l->v[j - 1];
            j--;
        }
        keys[j] = k;
        l->v[j] = src->v[i];
        l->n++;
    }
    *out = l;
    return 0;
}

static int do_tojson(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv ind = tv_none(), seps = tv_none(), sk = tv_bool(false);
    arg(fc, 0, "indent", &ind);
    arg(fc, 1, "separators", &seps);  /* transformers' tojson(x, ensure_ascii, indent, separators, sort_keys) */
    arg(fc, 99, "sort_keys", &sk);
    int indent = -1;
    if (ind.k == TV_INT) {
        if (ind.i < 0 || ind.i > 64)
            return rerr(c, ERR_RANGE, "tojson: indent %lld out of range", (long long)ind.i);
        indent = (int)ind.i;
    } else if (ind.k != TV_NONE && ind.k != TV_UNDEF) {
        return rerr(c, ERR_FORMAT, "tojson: indent must be an integer");
    }
    const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
    if (seps.k == TV_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].k != TV_STR || seps.l->v[1].k != TV_STR)
            return rerr(c, ERR_FORMAT, "tojson: separators must be two strings");
        item_sep = seps.l->v[0].s->s;
        key_sep = seps.l->v[1].s->s;
    }
    struct sbuf b = {0};
    int rc = tv_to_json(c, &b, v, indent, item_sep, key_sep, tv_truthy(sk), 0);
    if (rc < 0)
        return rc;
    return out_str(c, tstr_new(c, b.p ? b.p : "", b.len), out);
}

static int do_indent(struct rctx *c, struct tstr *s, struct tv width, bool first, bool blank, struct tv *out)
{
    struct tstr *ind;
    struct tlist *lines;
    struct sbuf b = {0};
    int rc;
    if (width.k == TV_STR) {
        ind = width.s;
    } else {
        int64_t w = width.k == TV_INT ? width.i : 4;
        if (w < 0 || w > 1024)
            return rerr(c, ERR_RANGE, "indent width out of range");
        char sp[1025];
        memset(sp, ' ', (size_t)w);
        if (!(ind = tstr_new(c, sp, (size_t)w)))
            return -c->e->code;
    }
    struct tstr *s2 = tstr_new(c, s->s, s->len + 1);  /* jinja2 appends "\n" before splitlines */
    if (!s2)
        return -c->e->code;
    s2->s[s->len] = '\n';
    if ((rc = su_splitlines(c, s2, &lines)) < 0)
        return rc;
    if (first && (rc = sbuf_put(c, &b, ind->s, ind->len)) < 0)
        return rc;
    for (size_t i = 0; i < lines->n; i++) {
        struct tstr *ln = lines->v[i].s;
        if (i && (rc = sbuf_put(c, &b, "\n", 1)) < 0)
            return rc;
        if (i && (blank || ln->len) && (rc = sbuf_put(c, &b, ind->s, ind->len)) < 0)
            return rc;
        if ((rc = sbuf_put(c, &b, ln->s, ln->len)) < 0)
            return rc;
    }
    return out_str(c, tstr_new(c, b.p ? b.p : "", b.len), out);
}

static int do_round(struct rctx *c, struct tv v, int64_t prec, const char *method, struct tv *out)
{
    if (v.k == TV_UNDEF)
        return rerr(c, ERR_FORMAT, "'%s' is undefined", v.uname ? v.uname : "value");
    if (v.k != TV_INT && v.k != TV_FLOAT && v.k != TV_BOOL)
        return rerr(c, ERR_FORMAT, "round: '%s' is not a number", tv_type_name(v));
    double x = v.k == TV_FLOAT ? v.f : v.k == TV_INT ? (double)v.i : v.b;
    if (prec < -20 || prec > 20)
        return rerr(c, ERR_RANGE, "round: precision out of range");
    if (strcmp(method, "common") != 0) {
        double p = pow(10, (double)prec);
        if (!strcmp(method, "ceil"))
            x = ceil(x * p) / p;
        else if (!strcmp(method, "floor"))
            x = floor(x * p) / p;
        else
            return rerr(c, ERR_FORMAT, "method must be common, ceil or floor");
        *out = tv_float(x);
        return 0;
    }
    if (v.k != TV_FLOAT) {  /* round(int, n) stays an int */
        *out = v.k == TV_BOOL ? tv_int(v.b) : v;
        return 0;
    }
    if (prec >= 0 && isfinite(x)) {
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);  /* exact value, ties to even */
        x = strtod(buf, NULL);
    } else if (isfinite(x)) {
        double p = pow(10, (double)-prec);
        x = nearbyint(x / p) * p;
    }
    *out = tv_float(x);
    return 0;
}

/* map / select / reject / selectattr / rejectattr over an iterable. */
static int do_seq_filter(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    const char *name = fc->name;
    struct tv *args = fc->pos;
    size_t n_args = fc->n;
    struct tlist *items, *res;
    int rc;
    if ((rc = tv_iter(c, v, &items)) < 0 || !(res = tlist_new(c, 0)))
        return rc < 0 ? rc : -c->e->code;
    bool is_map = !strcmp(name, "map"), attr_mode = strstr(name, "attr") != NULL;
    bool reject = !strncmp(name, "reject", 6);
    struct tv attr = tv_undef(NULL), dflt = tv_undef(NULL), fname = tv_undef(NULL);
    size_t rest = 0;
    if (is_map) {
        if (arg(fc, 99, "attribute", &attr)) {
            arg(fc, 99, "default", &dflt);
        } else if (n_args < 1 || args[0].k != TV_STR) {
            return rerr(c, ERR_FORMAT, "map: expected a filter name or attribute=");
        } else {
            fname = args[0];
            rest = 1;
        }
    } else if (attr_mode) {
        if (n_args < 1 || args[0].k != TV_STR)
            return rerr(c, ERR_FORMAT, "%s: expected an attribute name", name);
        attr = args[0];
        if (n_args >= 2) {
            fname = args[1];
            rest = 2;
        }
    } else if (n_args >= 1) {
        fname = args[0];
        rest = 1;
    }
    if (fname.k != TV_UNDEF && fname.k != TV_STR)
        return rerr(c, ERR_FORMAT, "%s: the filter/test name must be a string", name);
    if (attr.k == TV_INT) {  /* map(attribute=0): an index */
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)attr.i);
        struct tstr *t = tstr_new(c, num, strlen(num));
        if (!t)
            return -c->e->code;
        attr = tv_str(t);
    }
    if (attr.k != TV_STR && attr.k != TV_UNDEF)
        return rerr(c, ERR_FORMAT, "%s: the attribute must be a string, not %s", name, tv_type_name(attr));
    if (is_map && attr.k != TV_STR && fname.k != TV_STR)
        return rerr(c, ERR_FORMAT, "map: expected a filter name or attribute=");
    for (size_t i = 0; i < items->n; i++) {
        struct tv x = items->v[i], r;
        if ((rc = ev_step(c)) < 0)
            return rc;
        if (attr.k == TV_STR && (rc = get_path(c, x, attr.s, &r)) < 0)
            return rc;
        if (attr.k != TV_STR)
            r = x;
        if (is_map) {
            if (attr.k == TV_STR) {
                if (r.k == TV_UNDEF && dflt.k != TV_UNDEF)
                    r = dflt;
            } else if ((rc = bi_filter(c, fname.s->s, x, args + rest, n_args - rest, fc->kw, fc->kwv, fc->n_kw, &r)) < 0) {
                return rc;
            }
            if ((rc = tlist_push(c, res, r)) < 0)
                return rc;
            continue;
        }
        bool keep;
        if (fname.k == TV_STR) {
            if ((rc = bi_test(c, fname.s->s, r, args + rest, n_args - rest, &keep)) < 0)
                return rc;
        } else {
            keep = tv_truthy(r);
        }
        if (keep != reject && (rc = tlist_push(c, res, x)) < 0)
            return rc;
    }
    return out_list(res, out);
}

static int do_minmax(struct rctx *c, struct tv v, bool max, bool cs, struct tv attr, struct tv *out)
{
    struct tlist *items;
    int rc = tv_iter(c, v, &items);
    if (rc < 0)
        return rc;
    if (items->n == 0) {
        *out = tv_undef("min/max of an empty sequence");
        return 0;
    }
    struct tv best = items->v[0], bk = best;
    if (attr.k == TV_STR && (rc = get_path(c, best, attr.s, &bk)) < 0)
        return rc;
    for (size_t i = 1; i < items->n; i++) {
        struct tv k = items->v[i];
        int cmp;
        if (attr.k == TV_STR && (rc = get_path(c, items->v[i], attr.s, &k)) < 0)
            return rc;
        if ((rc = key_cmp(c, k, bk, cs, &cmp)) < 0 || (rc = ev_step(c)) < 0)
            return rc;
        if (max ? cmp > 0 : cmp < 0) {
            best = items->v[i];
            bk = k;
        }
    }
    *out = best;
    return 0;
}

static int py_int(struct rctx *c, struct tv v, struct tv dflt, int64_t base, struct tv *out)
{
    *out = dflt;
    if (v.k == TV_INT || v.k == TV_BOOL) {
        *out = tv_int(v.k == TV_INT ? v.i : v.b);
    } else if (v.k == TV_FLOAT) {
        if (isfinite(v.f) && fabs(v.f) < 9.2e18)
            *out = tv_int((int64_t)v.f);
    } else if (v.k == TV_STR) {
        struct tstr *s = su_strip(c, v.s, NULL, true, true);
        char buf[80];
        if (!s)
            return -c->e->code;
        size_t o = 0;
        for (size_t i = 0; i < s->len && o < sizeof buf - 1; i++)
            if (s->s[i] != '_')
                buf[o++] = s->s[i];
        buf[o] = 0;
        if (o == 0 || s->len >= sizeof buf)
            return 0;
        char *end;
        long long x = strtoll(buf, &end, (int)base);
        if (*end == 0 && end != buf) {
            *out = tv_int(x);
        } else {
            double d = strtod(buf, &end);
            if (*end == 0 && isfinite(d) && fabs(d) < 9.2e18)
                *out = tv_int((int64_t)d);
        }
    }
    return 0;
}

static int py_format(struct rctx *c, struct tstr *fmt, struct tv *args, size_t n_args, struct tv *out);

/* ---- filters: one function per filter (or per family), found through k_filters ---- */

/* `default` / `d`: the value, or default_value (""), when it is Undefined (or falsy with
 * boolean=true). */
static int f_default(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_str(tstr_new(c, "", 0)), b = tv_undef(NULL);
    arg(fc, 0, "default_value", &a);
    arg(fc, 1, "boolean", &b);
    bool use = v.k == TV_UNDEF || (tv_truthy(b) && !tv_truthy(v));
    *out = use ? a : v;
    return 0;
}

static int f_safe(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)c;
    (void)fc;
    *out = v;
    return 0;
}

static int f_string(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    int rc;
    if (v.k == TV_STR)
        return f_safe(c, v, fc, out);
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    return out_str(c, s, out);
}

static int f_tojson(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    return do_tojson(c, v, fc, out);
}

/* `length` / `count` */
static int f_length(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    switch (v.k) {
    case TV_UNDEF: *out = tv_int(0); return 0;
    case TV_STR: *out = tv_int((int64_t)utf8_count(v.s->s, v.s->len)); return 0;
    case TV_LIST: *out = tv_int((int64_t)v.l->n); return 0;
    case TV_DICT: *out = tv_int((int64_t)v.d->n); return 0;
    case TV_LOOP: *out = tv_int((int64_t)v.loop->items->n); return 0;
    default: return rerr(c, ERR_FORMAT, "object of type '%s' has no len()", tv_type_name(v));
    }
}

// ---- string filters: the value turned into a string first ----

static int f_trim(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    struct tv a = tv_undef(NULL);
    int rc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    arg(fc, 0, "chars", &a);
    return out_str(c, su_strip(c, s, a.k == TV_STR ? a.s : NULL, true, true), out);
}

/* lower / upper / title / capitalize: one su_case mode each */
static int str_case(struct rctx *c, struct tv v, enum su_case mode, struct tv *out)
{
    struct tstr *s;
    int rc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    return out_str(c, su_case(c, s, mode), out);
}

static int f_lower(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return str_case(c, v, SU_LOWER, out);
}

static int f_upper(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return str_case(c, v, SU_UPPER, out);
}

static int f_title(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return str_case(c, v, SU_JINJA_TITLE, out);
}

static int f_capitalize(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return str_case(c, v, SU_CAPITALIZE, out);
}

static int f_center(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    int rc;
    (void)fc;
    (void)out;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    return rerr(c, ERR_UNSUPPORTED, "filter 'center' is not supported");
}

/* words as jinja2's \w+ counts them (any non-ASCII byte is a word byte) */
static int f_wordcount(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    int rc;
    (void)fc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        bool w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
        n += w && !in;
        in = w;
    }
    *out = tv_int(n);
    return 0;
}

static int f_replace(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    struct tv a = tv_undef(NULL), b = tv_undef(NULL), d = tv_int(-1);
    int rc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    if (!arg(fc, 0, "old", &a) || !arg(fc, 1, "new", &b) || a.k != TV_STR || b.k != TV_STR)
        return rerr(c, ERR_FORMAT, "replace: expected two strings");
    arg(fc, 2, "count", &d);
    return out_str(c, su_replace(c, s, a.s, b.s, d.k == TV_INT ? d.i : -1), out);
}

static int f_indent(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    struct tv a = tv_int(4), b = tv_undef(NULL), d = tv_undef(NULL);
    int rc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    arg(fc, 0, "width", &a);
    arg(fc, 1, "first", &b);
    arg(fc, 2, "blank", &d);
    return do_indent(c, s, a, tv_truthy(b), tv_truthy(d), out);
}

static int f_format(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    int rc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    return py_format(c, s, fc->pos, fc->n, out);
}

/* `escape` / `e` / `forceescape`: & < > " ' as jinja2's markupsafe writes them */
static int f_escape(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tstr *s;
    int rc;
    (void)fc;
    if ((rc = need_str(c, v, &s)) < 0)
        return rc;
    struct sbuf sb = {0};
    for (size_t i = 0; i < s->len; i++) {
        const char *r = NULL;
        switch (s->s[i]) {
        case '&': r = "&amp;"; break;
        case '<': r = "&lt;"; break;
        case '>': r = "&gt;"; break;
        case '"': r = "&#34;"; break;
        case '\'': r = "&#39;"; break;
        }
        if ((rc = r ? sbuf_put(c, &sb, r, strlen(r)) : sbuf_put(c, &sb, s->s + i, 1)) < 0)
            return rc;
    }
    return out_str(c, tstr_new(c, sb.p ? sb.p : "", sb.len), out);
}

// ---- mappings and joins ----

static int f_items(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    if (v.k == TV_UNDEF)
        return out_list(tlist_new(c, 0), out);
    if (v.k != TV_DICT)
        return rerr(c, ERR_FORMAT, "items: can only be used on mappings, not '%s'", tv_type_name(v));
    struct tfunc fn = {.name = "items", .self = v};
    return bi_call(c, &fn, NULL, 0, NULL, NULL, 0, out);
}

static int f_join(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_str(tstr_new(c, "", 0)), b = tv_undef(NULL);
    struct tlist *l;
    int rc;
    arg(fc, 0, "d", &a);
    arg(fc, 1, "attribute", &b);
    if ((rc = tv_iter(c, v, &l)) < 0)
        return rc;
    struct sbuf sb = {0};
    for (size_t i = 0; i < l->n; i++) {
        struct tv x = l->v[i];
        if (b.k == TV_STR && (rc = get_path(c, x, b.s, &x)) < 0)
            return rc;
        if ((i && (rc = tv_write(c, &sb, a, false)) < 0) || (rc = tv_write(c, &sb, x, false)) < 0 ||
            (rc = ev_step(c)) < 0)
            return rc;
    }
    return out_str(c, tstr_new(c, sb.p ? sb.p : "", sb.len), out);
}

static int f_dictsort(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_undef(NULL), by = tv_undef(NULL), d = tv_undef(NULL);
    int rc;
    if (v.k != TV_DICT)
        return rerr(c, ERR_FORMAT, "dictsort: expected a mapping, not '%s'", tv_type_name(v));
    arg(fc, 0, "case_sensitive", &a);
    arg(fc, 1, "by", &by);
    arg(fc, 2, "reverse", &d);
    struct tv items;
    struct tfunc fn = {.name = "items", .self = v};
    if ((rc = bi_call(c, &fn, NULL, 0, NULL, NULL, 0, &items)) < 0)
        return rc;
    bool by_value = by.k == TV_STR && !strcmp(by.s->s, "value");
    struct tlist *r;
    if ((rc = sort_list(c, items.l, NULL, tv_truthy(a), tv_truthy(d), by_value ? 1 : 0, &r)) < 0)
        return rc;
    return out_list(r, out);
}

// ---- sequence filters: over the items of a list, string, mapping or Undefined ----

static int seq_items(struct rctx *c, struct tv v, struct tlist **l)
{
    if (v.k != TV_UNDEF && v.k != TV_LIST && v.k != TV_STR && v.k != TV_DICT)
        return rerr(c, ERR_FORMAT, "'%s' object is not iterable", tv_type_name(v));
    return tv_iter(c, v, l);
}

/* first / last */
static int seq_end(struct rctx *c, struct tv v, bool last, struct tv *out)
{
    struct tlist *l;
    int rc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    *out = l->n ? l->v[last ? l->n - 1 : 0] : tv_undef("first/last of an empty sequence");
    return 0;
}

static int f_first(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return seq_end(c, v, false, out);
}

static int f_last(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    return seq_end(c, v, true, out);
}

static int f_list(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tlist *l;
    int rc;
    (void)fc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    struct tlist *cp = tlist_new(c, l->n);
    if (!cp)
        return -c->e->code;
    if (l->n)
        memcpy(cp->v, l->v, l->n * sizeof *l->v);
    cp->n = l->n;
    return out_list(cp, out);
}

static int f_reverse(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tlist *l;
    int rc;
    (void)fc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    if (v.k == TV_STR) {
        struct sbuf sb = {0};
        for (size_t i = l->n; i-- > 0;)
            if ((rc = sbuf_put(c, &sb, l->v[i].s->s, l->v[i].s->len)) < 0)
                return rc;
        return out_str(c, tstr_new(c, sb.p ? sb.p : "", sb.len), out);
    }
    struct tlist *r = tlist_new(c, l->n);
    if (!r)
        return -c->e->code;
    for (size_t i = l->n; i-- > 0;)
        r->v[r->n++] = l->v[i];
    return out_list(r, out);
}

static int f_sum(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tlist *l;
    struct tv a = tv_undef(NULL), acc = tv_int(0);
    int rc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    arg(fc, 0, "attribute", &a);
    arg(fc, 1, "start", &acc);
    for (size_t i = 0; i < l->n; i++) {
        struct tv x = l->v[i];
        if (a.k == TV_STR && (rc = get_path(c, x, a.s, &x)) < 0)
            return rc;
        if (x.k != TV_INT && x.k != TV_FLOAT && x.k != TV_BOOL)
            return rerr(c, ERR_FORMAT, "sum: '%s' is not a number", tv_type_name(x));
        if (acc.k == TV_INT && x.k != TV_FLOAT) {
            if (__builtin_add_overflow(acc.i, x.k == TV_INT ? x.i : x.b, &acc.i))
                return rerr(c, ERR_RANGE, "integer overflow in sum");
        } else {
            double ax = acc.k == TV_FLOAT ? acc.f : (double)acc.i;
            acc = tv_float(ax + (x.k == TV_FLOAT ? x.f : x.k == TV_INT ? (double)x.i : x.b));
        }
    }
    *out = acc;
    return 0;
}

/* min / max */
static int seq_minmax(struct rctx *c, struct tv v, const struct fcall *fc, bool max, struct tv *out)
{
    struct tlist *l;
    struct tv a = tv_undef(NULL), b = tv_undef(NULL);
    int rc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    arg(fc, 0, "case_sensitive", &a);
    arg(fc, 1, "attribute", &b);
    return do_minmax(c, v, max, tv_truthy(a), b, out);
}

static int f_min(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    return seq_minmax(c, v, fc, false, out);
}

static int f_max(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    return seq_minmax(c, v, fc, true, out);
}

static int f_unique(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tlist *l;
    struct tv a = tv_undef(NULL), b = tv_undef(NULL);
    int rc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    arg(fc, 0, "case_sensitive", &a);
    arg(fc, 1, "attribute", &b);
    struct tlist *r = tlist_new(c, 0), *seen = tlist_new(c, 0);
    if (!r || !seen)
        return -c->e->code;
    if ((uint64_t)l->n * l->n > c->lim->max_steps)
        return rerr(c, ERR_RANGE, "unique over %zu items is over the step limit", l->n);
    for (size_t i = 0; i < l->n; i++) {
        struct tv k = l->v[i];
        bool dup = false;
        if (b.k == TV_STR && (rc = get_path(c, k, b.s, &k)) < 0)
            return rc;
        if (!tv_truthy(a) && k.k == TV_STR && !(k = tv_str(su_case(c, k.s, SU_LOWER))).s)
            return -c->e->code;
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = tv_equal(c, seen->v[j], k);
        c->steps += seen->n / 16;
        if (!dup && ((rc = tlist_push(c, seen, k)) < 0 || (rc = tlist_push(c, r, l->v[i])) < 0))
            return rc;
    }
    return out_list(r, out);
}

static int f_sort(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tlist *l, *r;
    struct tv a = tv_undef(NULL), b = tv_undef(NULL), d = tv_undef(NULL);
    int rc;
    if ((rc = seq_items(c, v, &l)) < 0)
        return rc;
    arg(fc, 0, "reverse", &a);
    arg(fc, 1, "case_sensitive", &b);
    arg(fc, 2, "attribute", &d);
    if ((rc = sort_list(c, l, d.k == TV_STR ? d.s : NULL, tv_truthy(b), tv_truthy(a), -1, &r)) < 0)
        return rc;
    return out_list(r, out);
}

/* map / select / reject / selectattr / rejectattr */
static int f_seq_filter(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    return do_seq_filter(c, v, fc, out);
}

// ---- numbers and attributes ----

static int f_int(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_int(0), b = tv_int(10);
    arg(fc, 0, "default", &a);
    arg(fc, 1, "base", &b);
    if (b.k != TV_INT || b.i < 2 || b.i > 36)
        b = tv_int(10);
    return py_int(c, v, a, b.i, out);
}

static int f_float(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_float(0);
    arg(fc, 0, "default", &a);
    *out = a;
    if (v.k == TV_FLOAT || v.k == TV_INT || v.k == TV_BOOL) {
        *out = tv_float(v.k == TV_FLOAT ? v.f : v.k == TV_INT ? (double)v.i : v.b);
    } else if (v.k == TV_STR) {
        struct tstr *t = su_strip(c, v.s, NULL, true, true);
        char *end;
        if (!t)
            return -c->e->code;
        double x = strtod(t->s, &end);
        if (t->len && *end == 0)
            *out = tv_float(x);
    }
    return 0;
}

static int f_round(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_int(0), b = tv_undef(NULL);
    arg(fc, 0, "precision", &a);
    arg(fc, 1, "method", &b);
    return do_round(c, v, a.k == TV_INT ? a.i : 0, b.k == TV_STR ? b.s->s : "common", out);
}

static int f_abs(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    (void)fc;
    if (v.k == TV_INT && v.i != INT64_MIN)
        *out = tv_int(v.i < 0 ? -v.i : v.i);
    else if (v.k == TV_FLOAT)
        *out = tv_float(fabs(v.f));
    else if (v.k == TV_BOOL)
        *out = tv_int(v.b);
    else
        return rerr(c, ERR_FORMAT, "bad operand type for abs(): '%s'", tv_type_name(v));
    return 0;
}

static int f_attr(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out)
{
    struct tv a = tv_undef(NULL);
    int rc;
    if (!arg(fc, 0, "name", &a) || a.k != TV_STR)
        return rerr(c, ERR_FORMAT, "attr: expected a name");
    if (v.k == TV_NS) {
        const struct tv *x = tdict_get(v.d, a.s->s, a.s->len);
        *out = x ? *x : tv_undef(a.s->s);
        return 0;
    }
    bool found;
    if ((rc = bi_getattr(c, v, a.s->s, a.s->len, out, &found)) < 0)
        return rc;
    if (!found)
        *out = tv_undef(a.s->s);
    return 0;
}

/* Every filter by name; aliases are entries of their own (sorted by name). */
static const struct filter_entry {
    const char *name;
    int (*fn)(struct rctx *c, struct tv v, const struct fcall *fc, struct tv *out);
} k_filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_seq_filter},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_seq_filter},
    {"rejectattr", f_seq_filter},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_seq_filter},
    {"selectattr", f_seq_filter},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

int bi_filter(struct rctx *c, const char *name, struct tv v, struct tv *args, size_t n_args,
              struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out)
{
    int rc;
    if ((rc = ev_step(c)) < 0)
        return rc;
    struct fcall fc = {.name = name, .pos = args, .n = n_args, .kw = kw, .kwv = kwv, .n_kw = n_kw};
    for (size_t i = 0; i < sizeof k_filters / sizeof k_filters[0]; i++)
        if (!strcmp(name, k_filters[i].name))
            return k_filters[i].fn(c, v, &fc, out);
    return rerr(c, ERR_FORMAT, "no filter named '%s'", name);
}

/* "%s %d" % args (the format filter): s, r, d, i, f and %% only. */
static int py_format(struct rctx *c, struct tstr *fmt, struct tv *args, size_t n_args, struct tv *out)
{
    struct sbuf sb = {0};
    size_t k = 0;
    int rc;
    for (size_t i = 0; i < fmt->len; i++) {
        if (fmt->s[i] != '%') {
            if ((rc = sbuf_put(c, &sb, fmt->s + i, 1)) < 0)
                return rc;
            continue;
        }
        if (++i >= fmt->len)
            return rerr(c, ERR_FORMAT, "format: incomplete format");
        char f = fmt->s[i];
        if (f == '%') {
            if ((rc = sbuf_put(c, &sb, "%", 1)) < 0)
                return rc;
            continue;
        }
        if (k >= n_args)
            return rerr(c, ERR_FORMAT, "format: not enough arguments for format string");
        struct tv x = args[k++];
        char buf[64];
        if (f == 's' || f == 'r') {
            rc = tv_write(c, &sb, x, f == 'r');
        } else if ((f == 'd' || f == 'i') && (x.k == TV_INT || x.k == TV_BOOL || x.k == TV_FLOAT)) {
            snprintf(buf, sizeof buf, "%lld", x.k == TV_INT ? (long long)x.i : x.k == TV_BOOL ? x.b : (long long)x.f);
            rc = sbuf_put(c, &sb, buf, strlen(buf));
        } else if (f == 'f' && (x.k == TV_INT || x.k == TV_BOOL || x.k == TV_FLOAT)) {
            snprintf(buf, sizeof buf, "%f", x.k == TV_FLOAT ? x.f : x.k == TV_INT ? (double)x.i : x.b);
            rc = sbuf_put(c, &sb, buf, strlen(buf));
        } else {
            return rerr(c, ERR_UNSUPPORTED, "format: unsupported conversion '%%%c' for '%s'", f, tv_type_name(x));
        }
        if (rc < 0)
            return rc;
    }
    if (k < n_args)
        return rerr(c, ERR_FORMAT, "format: not all arguments converted during string formatting");
    return out_str(c, tstr_new(c, sb.p ? sb.p : "", sb.len), out);
}

/* ---- tests ---- */

int bi_test(struct rctx *c, const char *name, struct tv v, struct tv *args, size_t n_args, bool *out)
{
    struct tv a = n_args ? args[0] : tv_undef(NULL);
    int cmp, rc;
    if (!strcmp(name, "defined")) *out = v.k != TV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v.k == TV_UNDEF;
    else if (!strcmp(name, "none")) *out = v.k == TV_NONE;
    else if (!strcmp(name, "boolean")) *out = v.k == TV_BOOL;
    else if (!strcmp(name, "true")) *out = v.k == TV_BOOL && v.b;
    else if (!strcmp(name, "false")) *out = v.k == TV_BOOL && !v.b;
    else if (!strcmp(name, "integer")) *out = v.k == TV_INT;
    else if (!strcmp(name, "float")) *out = v.k == TV_FLOAT;
    else if (!strcmp(name, "number")) *out = v.k == TV_INT || v.k == TV_FLOAT || v.k == TV_BOOL;
    else if (!strcmp(name, "string")) *out = v.k == TV_STR;
    else if (!strcmp(name, "mapping")) *out = v.k == TV_DICT;
    else if (!strcmp(name, "iterable")) *out = v.k == TV_STR || v.k == TV_LIST || v.k == TV_DICT || v.k == TV_UNDEF;
    else if (!strcmp(name, "sequence")) *out = v.k == TV_STR || v.k == TV_LIST || v.k == TV_DICT || v.k == TV_UNDEF;
    else if (!strcmp(name, "callable")) *out = v.k == TV_MACRO || v.k == TV_FUNC;
    else if (!strcmp(name, "sameas")) *out = v.k == a.k && (v.k == TV_NONE || v.k == TV_UNDEF || tv_equal(c, v, a));
    else if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) *out = tv_equal(c, v, a);
    else if (!strcmp(name, "ne") || !strcmp(name, "!=")) *out = !tv_equal(c, v, a);
    else if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "gt") || !strcmp(name, "greaterthan") ||
             !strcmp(name, "le") || !strcmp(name, "ge")) {
        if ((rc = tv_compare(c, v, a, &cmp)) < 0)
            return rc;
        *out = name[0] == 'l' ? (name[1] == 'e' && name[2] == 0 ? cmp <= 0 : cmp < 0)
                              : (name[1] == 'e' && name[2] == 0 ? cmp >= 0 : cmp > 0);
    } else if (!strcmp(name, "in")) {
        bool r = false;
        if (a.k == TV_STR && v.k == TV_STR)
            r = v.s->len == 0 || memmem(a.s->s, a.s->len, v.s->s, v.s->len);
        else if (a.k == TV_LIST)
            for (size_t i = 0; i < a.l->n && !r; i++)
                r = tv_equal(c, a.l->v[i], v);
        else if (a.k == TV_DICT)
            r = tdict_getv(c, a.d, v) != NULL;
        else if (a.k != TV_UNDEF)
            return rerr(c, ERR_FORMAT, "argument of type '%s' is not iterable", tv_type_name(a));
        *out = r;
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.k != TV_INT && v.k != TV_BOOL)
            return v.k == TV_UNDEF ? rerr(c, ERR_FORMAT, "'%s' is undefined", v.uname ? v.uname : "value")
                                   : rerr(c, ERR_FORMAT, "test '%s' needs an integer, not '%s'", name, tv_type_name(v));
        int64_t x = v.k == TV_INT ? v.i : v.b, m = 2;
        if (name[0] == 'd') {
            if (a.k != TV_INT || a.i == 0)
                return rerr(c, ERR_FORMAT, "divisibleby: expected a non-zero integer");
            m = a.i;
        }
        int64_t r = m == -1 ? 0 : x % m;
        *out = name[0] == 'o' ? r != 0 : r == 0;
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct tstr *s, *t;
        if ((rc = tv_to_str(c, v, &s)) < 0 || !(t = su_case(c, s, name[0] == 'l' ? SU_LOWER : SU_UPPER)))
            return rc < 0 ? rc : -c->e->code;
        bool cased = false;
        for (size_t i = 0; i < s->len; i++)
            cased |= ((unsigned char)s->s[i] | 32) >= 'a' && ((unsigned char)s->s[i] | 32) <= 'z';
        *out = cased && t->len == s->len && memcmp(t->s, s->s, s->len) == 0;
    } else {
        return rerr(c, ERR_FORMAT, "no test named '%s'", name);
    }
    return 0;
}
