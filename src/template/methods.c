/*
 * methods: what `obj.name` and `name(...)` reach besides template
 * variables -- Python str and dict methods, the safe list methods, the
 * `loop` object, and the globals transformers' environment has (range,
 * namespace, dict, raise_exception, strftime_now).
 *
 * A method read (`s.strip`) yields a TV_FUNC bound to its receiver; the
 * call dispatches on (receiver kind, name). As in jinja2's
 * ImmutableSandboxedEnvironment, mutating methods (list.append, dict.pop,
 * ...) can be read but calling them is an error ("access to attribute
 * 'append' of 'list' object is unsafe"), and range() is capped at 100000
 * items.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strutil.h"

static const char *const k_str_methods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace", "lower", "upper",
    "title", "capitalize", "format", "find", "rfind", "index", "count", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "islower", "isupper", NULL,
};
static const char *const k_dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const k_dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const k_list_methods[] = {"index", "count", "copy", NULL};
static const char *const k_list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
static const char *const k_globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static const char *find_name(const char *const *tab, const char *name, size_t len)
{
    for (size_t i = 0; tab[i]; i++)
        if (strlen(tab[i]) == len && memcmp(tab[i], name, len) == 0)
            return tab[i];
    return NULL;
}

bool bi_is_global(const char *name)
{
    return find_name(k_globals, name, strlen(name)) != NULL;
}

/* A TV_FUNC for obj.name; unsafe ones are tagged "!list"/"!dict" and refuse calls. */
static int bound(struct rctx *c, struct tv self, const char *name, bool unsafe, struct tv *out)
{
    struct tfunc *fn = ar_alloc(&c->ar, sizeof *fn);
    if (!fn)
        return rerr(c, ERR_RANGE, "out of memory");
    if (unsafe) {
        fn->name = self.k == TV_LIST ? "!list" : "!dict";
        fn->self = tv_undef(name);
    } else {
        fn->name = name;
        fn->self = self;
    }
    *out = (struct tv){.k = TV_FUNC, .fn = fn};
    return 0;
}

int bi_getattr(struct rctx *c, struct tv obj, const char *name, size_t len, struct tv *out, bool *found)
{
    const char *m = NULL;
    *found = false;
    if (obj.k == TV_STR && (m = find_name(k_str_methods, name, len))) {
        *found = true;
        return bound(c, obj, m, false, out);
    }
    if (obj.k == TV_DICT || obj.k == TV_LIST) {
        const char *const *safe = obj.k == TV_DICT ? k_dict_methods : k_list_methods;
        const char *const *unsafe = obj.k == TV_DICT ? k_dict_unsafe : k_list_unsafe;
        if ((m = find_name(safe, name, len))) {
            *found = true;
            return bound(c, obj, m, false, out);
        }
        if ((m = find_name(unsafe, name, len))) {
            *found = true;
            return bound(c, obj, m, true, out);
        }
        return 0;
    }
    if (obj.k == TV_LOOP) {
        const struct tloop *lp = obj.loop;
        int64_t i = (int64_t)lp->i, n = (int64_t)lp->items->n;
        char nm[16];
        if (len >= sizeof nm)
            return 0;
        memcpy(nm, name, len);
        nm[len] = 0;
        *found = true;
        if (!strcmp(nm, "index")) *out = tv_int(i + 1);
        else if (!strcmp(nm, "index0")) *out = tv_int(i);
        else if (!strcmp(nm, "revindex")) *out = tv_int(n - i);
        else if (!strcmp(nm, "revindex0")) *out = tv_int(n - i - 1);
        else if (!strcmp(nm, "first")) *out = tv_bool(i == 0);
        else if (!strcmp(nm, "last")) *out = tv_bool(i == n - 1);
        else if (!strcmp(nm, "length")) *out = tv_int(n);
        else if (!strcmp(nm, "depth")) *out = tv_int(1);
        else if (!strcmp(nm, "depth0")) *out = tv_int(0);
        else if (!strcmp(nm, "previtem")) *out = i > 0 ? lp->items->v[i - 1] : tv_undef("previtem");
        else if (!strcmp(nm, "nextitem")) *out = i + 1 < n ? lp->items->v[i + 1] : tv_undef("nextitem");
        else if (!strcmp(nm, "cycle")) return bound(c, obj, "cycle", false, out);
        else *found = false;
    }
    return 0;
}

/* ---- str methods ---- */

static int want_str(struct rctx *c, const char *m, struct tv *args, size_t n, size_t i, bool optional,
                    struct tstr **out)
{
    *out = NULL;
    if (i >= n || args[i].k == TV_NONE) {
        if (optional)
            return 0;
        return rerr(c, ERR_FORMAT, "str.%s: missing argument %zu", m, i + 1);
    }
    if (args[i].k != TV_STR)
        return rerr(c, ERR_FORMAT, "str.%s: argument %zu must be str, not %s", m, i + 1, tv_type_name(args[i]));
    *out = args[i].s;
    return 0;
}

static int ret_str(struct rctx *c, struct tstr *s, struct tv *out)
{
    if (!s)
        return -c->e->code;
    *out = tv_str(s);
    return 0;
}

static bool has_prefix(const struct tstr *s, const struct tstr *p, bool suffix)
{
    if (p->len > s->len)
        return false;
    return memcmp(s->s + (suffix ? s->len - p->len : 0), p->s, p->len) == 0;
}

/* "{} {0} {name}".format(...): fields without format specs. */
static int str_format(struct rctx *c, struct tstr *f, struct tv *args, size_t n, struct tstr **kw,
                      struct tv *kwv, size_t n_kw, struct tv *out)
{
    struct sbuf b = {0};
    size_t auto_i = 0;
    int rc;
    for (size_t i = 0; i < f->len; i++) {
        char ch = f->s[i];
        if ((ch == '{' || ch == '}') && i + 1 < f->len && f->s[i + 1] == ch) {
            if ((rc = sbuf_put(c, &b, &ch, 1)) < 0)
                return rc;
            i++;
            continue;
        }
        if (ch == '}')
            return rerr(c, ERR_FORMAT, "str.format: single '}' encountered");
        if (ch != '{') {
            if ((rc = sbuf_put(c, &b, &ch, 1)) < 0)
                return rc;
            continue;
        }
        size_t j = i + 1;
        while (j < f->len && f->s[j] != '}')
            j++;
        if (j >= f->len)
            return rerr(c, ERR_FORMAT, "str.format: single '{' encountered");
        const char *field = f->s + i + 1;
        size_t fl = j - i - 1;
        struct tv v = tv_undef(NULL);
        if (memchr(field, ':', fl) || memchr(field, '!', fl) || memchr(field, '.', fl) || memchr(field, '[', fl))
            return rerr(c, ERR_UNSUPPORTED, "str.format: format specs and field access are not supported");
        if (fl == 0 || (field[0] >= '0' && field[0] <= '9')) {
            size_t k = fl == 0 ? auto_i++ : (size_t)strtoul(field, NULL, 10);
            if (k >= n)
                return rerr(c, ERR_FORMAT, "str.format: replacement index %zu out of range", k);
            v = args[k];
        } else {
            bool ok = false;
            for (size_t k = 0; k < n_kw && !ok; k++)
                if (strlen(kw[k]->s) == fl && !memcmp(kw[k]->s, field, fl)) {
                    v = kwv[k];
                    ok = true;
                }
            if (!ok)
                return rerr(c, ERR_FORMAT, "str.format: no argument named '%.*s'", (int)fl, field);
        }
        if ((rc = tv_write(c, &b, v, false)) < 0)
            return rc;
        i = j;
    }
    return ret_str(c, tstr_new(c, b.p ? b.p : "", b.len), out);
}

static int str_method(struct rctx *c, const char *m, struct tstr *s, struct tv *args, size_t n,
                      struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out)
{
    struct tstr *a = NULL, *b = NULL;
    int rc;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        bool suffix = m[0] == 'e', r = false;
        if (n >= 1 && args[0].k == TV_LIST) {
            for (size_t i = 0; i < args[0].l->n && !r; i++) {
                if (args[0].l->v[i].k != TV_STR)
                    return rerr(c, ERR_FORMAT, "str.%s: tuple items must be str", m);
                r = has_prefix(s, args[0].l->v[i].s, suffix);
            }
        } else {
            if ((rc = want_str(c, m, args, n, 0, false, &a)) < 0)
                return rc;
            r = has_prefix(s, a, suffix);
        }
        *out = tv_bool(r);
        return 0;
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if ((rc = want_str(c, m, args, n, 0, true, &a)) < 0)
            return rc;
        return ret_str(c, su_strip(c, s, a, m[0] != 'r', m[0] != 'l'), out);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        struct tv sep = n >= 1 ? args[0] : tv_none(), mx = n >= 2 ? args[1] : tv_int(-1);
        for (size_t k = 0; k < n_kw; k++) {
            if (!strcmp(kw[k]->s, "sep"))
                sep = kwv[k];
            else if (!strcmp(kw[k]->s, "maxsplit"))
                mx = kwv[k];
        }
        if ((sep.k != TV_NONE && sep.k != TV_STR) || mx.k != TV_INT)
            return rerr(c, ERR_FORMAT, "str.%s: bad arguments", m);
        struct tlist *l;
        if ((rc = su_split(c, s, sep.k == TV_STR ? sep.s : NULL, mx.i, m[0] == 'r', &l)) < 0)
            return rc;
        *out = (struct tv){.k = TV_LIST, .l = l};
        return 0;
    }
    if (!strcmp(m, "replace")) {
        if ((rc = want_str(c, m, args, n, 0, false, &a)) < 0 || (rc = want_str(c, m, args, n, 1, false, &b)) < 0)
            return rc;
        return ret_str(c, su_replace(c, s, a, b, n >= 3 && args[2].k == TV_INT ? args[2].i : -1), out);
    }
    if (!strcmp(m, "lower")) return ret_str(c, su_case(c, s, SU_LOWER), out);
    if (!strcmp(m, "upper")) return ret_str(c, su_case(c, s, SU_UPPER), out);
    if (!strcmp(m, "title")) return ret_str(c, su_case(c, s, SU_PY_TITLE), out);
    if (!strcmp(m, "capitalize")) return ret_str(c, su_case(c, s, SU_CAPITALIZE), out);
    if (!strcmp(m, "format")) return str_format(c, s, args, n, kw, kwv, n_kw, out);
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index") || !strcmp(m, "count")) {
        if ((rc = want_str(c, m, args, n, 0, false, &a)) < 0)
            return rc;
        if (!strcmp(m, "count")) {
            int64_t k = 0;
            if (a->len == 0) {
                k = (int64_t)utf8_count(s->s, s->len) + 1;
            } else {
                for (const char *p = s->s; (p = memmem(p, s->len - (size_t)(p - s->s), a->s, a->len)); p += a->len)
                    k++;
            }
            *out = tv_int(k);
            return 0;
        }
        int64_t pos = -1;
        if (m[0] == 'r') {
            for (size_t p = s->len >= a->len ? s->len - a->len + 1 : 0; p-- > 0;)
                if (memcmp(s->s + p, a->s, a->len) == 0) {
                    pos = su_cp_index(s, p);
                    break;
                }
        } else {
            const char *h = a->len == 0 ? s->s : memmem(s->s, s->len, a->s, a->len);
            if (h)
                pos = su_cp_index(s, (size_t)(h - s->s));
        }
        if (pos < 0 && m[0] == 'i')
            return rerr(c, ERR_FORMAT, "substring not found");
        *out = tv_int(pos);
        return 0;
    }
    if (!strcmp(m, "join")) {
        struct tlist *l;
        struct sbuf sb = {0};
        if (n < 1 || (rc = tv_iter(c, args[0], &l)) < 0)
            return n < 1 ? rerr(c, ERR_FORMAT, "str.join: missing argument") : rc;
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].k != TV_STR)
                return rerr(c, ERR_FORMAT, "sequence item %zu: expected str instance, %s found", i, tv_type_name(l->v[i]));
            if ((i && (rc = sbuf_put(c, &sb, s->s, s->len)) < 0) ||
                (rc = sbuf_put(c, &sb, l->v[i].s->s, l->v[i].s->len)) < 0)
                return rc;
        }
        return ret_str(c, tstr_new(c, sb.p ? sb.p : "", sb.len), out);
    }
    if (!strcmp(m, "splitlines")) {
        struct tlist *l;
        if ((rc = su_splitlines(c, s, &l)) < 0)
            return rc;
        *out = (struct tv){.k = TV_LIST, .l = l};
        return 0;
    }
    /* is* predicates over ASCII classes (non-ASCII letters count as alpha) */
    bool r = s->len > 0, any_cased = false;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        bool digit = ch >= '0' && ch <= '9', lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
        bool alpha = lo || up || ch >= 0x80, space = ch == ' ' || (ch >= 9 && ch <= 13);
        any_cased |= lo || up;
        if (!strcmp(m, "isdigit")) r &= digit;
        else if (!strcmp(m, "isalpha")) r &= alpha;
        else if (!strcmp(m, "isalnum")) r &= alpha || digit;
        else if (!strcmp(m, "isspace")) r &= space;
        else if (!strcmp(m, "islower")) r &= !up;
        else if (!strcmp(m, "isupper")) r &= !lo;
    }
    if (!strcmp(m, "islower") || !strcmp(m, "isupper"))
        r = r && any_cased;
    *out = tv_bool(r);
    return 0;
}

/* ---- dict / list methods ---- */

static int dict_method(struct rctx *c, const char *m, struct tdict *d, struct tv *args, size_t n, struct tv *out)
{
    if (!strcmp(m, "get")) {
        if (n < 1)
            return rerr(c, ERR_FORMAT, "dict.get: missing key");
        const struct tv *v = tdict_getv(c, d, args[0]);
        *out = v ? *v : n >= 2 ? args[1] : tv_none();
        return 0;
    }
    if (!strcmp(m, "copy")) {
        *out = (struct tv){.k = TV_DICT, .d = d};  /* values are immutable: sharing is a copy */
        return 0;
    }
    struct tlist *l = tlist_new(c, d->n);
    if (!l)
        return -c->e->code;
    for (size_t i = 0; i < d->n; i++) {
        if (m[0] == 'k') {
            l->v[i] = d->k[i];
        } else if (m[0] == 'v') {
            l->v[i] = d->v[i];
        } else {
            struct tlist *p = tlist_new(c, 2);
            if (!p)
                return -c->e->code;
            p->v[0] = d->k[i];
            p->v[1] = d->v[i];
            p->n = 2;
            p->tuple = true;
            l->v[i] = (struct tv){.k = TV_LIST, .l = p};
        }
        l->n++;
    }
    c->steps += d->n / 16;
    l->view = m[0] == 'k' ? "dict_keys" : m[0] == 'v' ? "dict_values" : "dict_items";
    *out = (struct tv){.k = TV_LIST, .l = l};
    return 0;
}

static int list_method(struct rctx *c, const char *m, struct tlist *l, struct tv *args, size_t n, struct tv *out)
{
    if (!strcmp(m, "copy")) {
        *out = (struct tv){.k = TV_LIST, .l = l};
        return 0;
    }
    if (n < 1)
        return rerr(c, ERR_FORMAT, "list.%s: missing argument", m);
    int64_t k = 0, pos = -1;
    for (size_t i = 0; i < l->n; i++)
        if (tv_equal(c, l->v[i], args[0])) {
            k++;
            if (pos < 0)
                pos = (int64_t)i;
        }
    c->steps += l->n / 16;
    if (m[0] == 'i' && pos < 0)
        return rerr(c, ERR_FORMAT, "list.index(x): x not in list");
    *out = tv_int(m[0] == 'i' ? pos : k);
    return 0;
}

/* ---- globals ---- */

static int g_range(struct rctx *c, struct tv *args, size_t n, struct tv *out)
{
    int64_t a = 0, b, s = 1, v[3] = {0};
    for (size_t i = 0; i < n && i < 3; i++) {
        if (args[i].k != TV_INT && args[i].k != TV_BOOL)
            return rerr(c, ERR_FORMAT, "range: '%s' object cannot be interpreted as an integer", tv_type_name(args[i]));
        v[i] = args[i].k == TV_INT ? args[i].i : args[i].b;
    }
    if (n == 1)
        b = v[0];
    else if (n == 2 || n == 3)
        a = v[0], b = v[1], s = n == 3 ? v[2] : 1;
    else
        return rerr(c, ERR_FORMAT, "range expected 1 to 3 arguments, got %zu", n);
    if (s == 0)
        return rerr(c, ERR_FORMAT, "range() arg 3 must not be zero");
    double cnt = s > 0 ? ((double)b - (double)a) / (double)s : ((double)a - (double)b) / (double)-s;
    if (cnt > 100000)
        return rerr(c, ERR_RANGE, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    struct tlist *l = tlist_new(c, cnt > 0 ? (size_t)cnt + 1 : 0);
    if (!l)
        return -c->e->code;
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
        int rc = tlist_push(c, l, tv_int(i));
        if (rc < 0 || (rc = ev_step(c)) < 0)
            return rc;
    }
    *out = (struct tv){.k = TV_LIST, .l = l};
    return 0;
}

static int g_dict(struct rctx *c, bool ns, struct tv *args, size_t n, struct tstr **kw, struct tv *kwv,
                  size_t n_kw, struct tv *out)
{
    struct tdict *d = tdict_new(c, 0);
    int rc;
    if (!d)
        return -c->e->code;
    if (n > 1)
        return rerr(c, ERR_FORMAT, "%s expected at most 1 positional argument", ns ? "namespace" : "dict");
    if (n == 1) {
        if (args[0].k != TV_DICT)
            return rerr(c, ERR_FORMAT, "%s: positional argument must be a mapping", ns ? "namespace" : "dict");
        for (size_t i = 0; i < args[0].d->n; i++)
            if ((rc = tdict_set(c, d, args[0].d->k[i], args[0].d->v[i])) < 0)
                return rc;
    }
    for (size_t i = 0; i < n_kw; i++)
        if ((rc = tdict_set(c, d, tv_str(kw[i]), kwv[i])) < 0)
            return rc;
    *out = (struct tv){.k = ns ? TV_NS : TV_DICT, .d = d};
    return 0;
}

int bi_call(struct rctx *c, const struct tfunc *fn, struct tv *args, size_t n_args,
            struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out)
{
    const char *m = fn->name;
    int rc;
    if ((rc = ev_step(c)) < 0)
        return rc;
    if (m[0] == '!')
        return rerr(c, ERR_FORMAT, "access to attribute '%s' of '%s' object is unsafe.", fn->self.uname, m + 1);
    switch (fn->self.k) {
    case TV_STR: return str_method(c, m, fn->self.s, args, n_args, kw, kwv, n_kw, out);
    case TV_DICT: return dict_method(c, m, fn->self.d, args, n_args, out);
    case TV_LIST: return list_method(c, m, fn->self.l, args, n_args, out);
    case TV_LOOP:
        if (n_args == 0)
            return rerr(c, ERR_FORMAT, "no items for cycling given");
        *out = args[fn->self.loop->i % n_args];
        return 0;
    default: break;
    }
    if (!strcmp(m, "range"))
        return g_range(c, args, n_args, out);
    if (!strcmp(m, "namespace") || !strcmp(m, "dict"))
        return g_dict(c, m[0] == 'n', args, n_args, kw, kwv, n_kw, out);
    if (!strcmp(m, "raise_exception")) {
        struct tstr *s = NULL;
        if (n_args >= 1 && (rc = tv_to_str(c, args[0], &s)) < 0)
            return rc;
        return rerr(c, ERR_FORMAT, "%s", s ? s->s : "raise_exception() called");
    }
    if (!strcmp(m, "strftime_now")) {
        if (n_args < 1 || args[0].k != TV_STR || args[0].s->len > 256)
            return rerr(c, ERR_FORMAT, "strftime_now: expected a format string (at most 256 bytes)");
        char buf[1024];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t w = strftime(buf, sizeof buf, args[0].s->s, &tm);
        return ret_str(c, tstr_new(c, buf, w), out);
    }
    return rerr(c, ERR_FORMAT, "'%s' is not callable", m);
}
