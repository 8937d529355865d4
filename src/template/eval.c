/*
 * eval: renders a parsed template (struct tmpl) -- the tree walker.
 *
 * Design: one struct rctx per render holds the arena every value lives
 * in, the output buffer being written (swapped for a capturing buffer in
 * macros, {% set %} blocks and {% filter %} blocks), the step and depth
 * counters and the error. exec() runs statements, ev() evaluates
 * expressions; both return 0 or a negative ERR_* with c->e filled.
 * break/continue unwind through c->ctl rather than return codes.
 *
 * Scoping follows jinja2: a for-loop iteration, a macro call and a with
 * block get a new frame (so `set` inside them does not leak out, which is
 * why templates use namespace()); if blocks do not. Names not found in any
 * frame are looked up among the globals (range, namespace, dict,
 * raise_exception, strftime_now), then become Undefined, which prints as
 * "", is false and iterates as empty, but is an error in arithmetic, in
 * comparisons, when called, or when its attributes are read (jinja2's
 * default Undefined).
 *
 * Bounds: every node evaluated and every loop iteration is one step
 * (max_steps); nesting of evaluation (expressions, blocks, macro calls)
 * is counted in c->depth (max_depth); strings and output are capped at
 * max_output; all memory comes from the capped arena.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tmpl_impl.h"

static int ev(struct rctx *c, const struct node *n, struct frame *f, struct tv *out);
static int exec(struct rctx *c, const struct node *n, struct frame *f);

int ev_step(struct rctx *c)
{
    if (++c->steps > c->lim->max_steps)
        return rerr(c, ERR_RANGE, "render took more than %llu steps",
                    (unsigned long long)c->lim->max_steps);
    return 0;
}

static int enter(struct rctx *c)
{
    if (++c->depth > c->lim->max_depth)
        return rerr(c, ERR_RANGE, "nesting deeper than %d (recursive macro?)", c->lim->max_depth);
    return 0;
}

static struct frame *frame_new(struct rctx *c, struct frame *parent)
{
    struct frame *f = ar_alloc(&c->ar, sizeof *f);
    if (!f) {
        rerr(c, c->ar.over_cap ? ERR_RANGE : ERR_NOMEM, "render needs more than %zu bytes of memory", c->ar.cap);
        return NULL;
    }
    f->parent = parent;
    return f;
}

static int frame_set(struct rctx *c, struct frame *f, struct tstr *name, struct tv v)
{
    return tdict_set(c, &f->vars, tv_str(name), v);
}

static struct tv lookup(struct rctx *c, struct frame *f, const struct tstr *name)
{
    for (; f; f = f->parent) {
        c->steps += f->vars.n / 4;  /* scopes with thousands of names cost their scan */
        const struct tv *v = tdict_get(&f->vars, name->s, name->len);
        if (v)
            return *v;
    }
    if (bi_is_global(name->s)) {
        struct tfunc *fn = ar_alloc(&c->ar, sizeof *fn);
        if (fn) {
            fn->name = name->s;
            return (struct tv){.k = TV_FUNC, .fn = fn};
        }
    }
    return tv_undef(name->s);
}

static int undefined_err(struct rctx *c, struct tv v)
{
    return rerr(c, ERR_FORMAT, "'%s' is undefined", v.uname ? v.uname : "value");
}

/* ---- attribute and item access ---- */

static int get_attr(struct rctx *c, struct tv obj, const char *name, size_t len, struct tv *out)
{
    int rc;
    bool found = false;
    if (obj.k == TV_UNDEF)
        return undefined_err(c, obj);
    if (obj.k == TV_DICT || obj.k == TV_NS) {
        c->steps += obj.d->n / 16;
        if (obj.k == TV_DICT && (rc = bi_getattr(c, obj, name, len, out, &found)) < 0)
            return rc;
        if (found)
            return 0;
        const struct tv *v = tdict_get(obj.d, name, len);
        *out = v ? *v : tv_undef(name);
        return 0;
    }
    if ((rc = bi_getattr(c, obj, name, len, out, &found)) < 0)
        return rc;
    if (!found)
        *out = tv_undef(name);
    return 0;
}

static int get_item(struct rctx *c, struct tv obj, struct tv key, struct tv *out)
{
    if (obj.k == TV_UNDEF)
        return undefined_err(c, obj);
    if (obj.k == TV_DICT || obj.k == TV_NS) {
        c->steps += obj.d->n / 16;
        const struct tv *v = tdict_getv(c, obj.d, key);
        if (v) {
            *out = *v;
            return 0;
        }
    } else if ((obj.k == TV_LIST || obj.k == TV_STR) && (key.k == TV_INT || key.k == TV_BOOL)) {
        int64_t i = key.k == TV_INT ? key.i : key.b;
        size_t n = obj.k == TV_LIST ? obj.l->n : utf8_count(obj.s->s, obj.s->len);
        if (i < 0)
            i += (int64_t)n;
        if (i < 0 || (uint64_t)i >= n) {
            *out = tv_undef("item");
            return 0;
        }
        if (obj.k == TV_LIST) {
            *out = obj.l->v[i];
            return 0;
        }
        size_t a = utf8_offset(obj.s->s, obj.s->len, (size_t)i);
        size_t b = utf8_offset(obj.s->s, obj.s->len, (size_t)i + 1);
        struct tstr *s = tstr_new(c, obj.s->s + a, b - a);
        if (!s)
            return -c->e->code;
        *out = tv_str(s);
        return 0;
    }
    if (key.k == TV_STR)
        return get_attr(c, obj, key.s->s, key.s->len, out);
    *out = tv_undef("item");
    return 0;
}

static int slice_index(struct rctx *c, struct tv v, int64_t *out, bool *given)
{
    *given = false;
    if (v.k == TV_NONE || v.k == TV_UNDEF)
        return 0;
    if (v.k != TV_INT && v.k != TV_BOOL)
        return rerr(c, ERR_FORMAT, "slice indices must be integers or None");
    *out = v.k == TV_INT ? v.i : v.b;
    *given = true;
    return 0;
}

/* Python obj[a:b:s] on lists and strings (strings by code point). */
static int do_slice(struct rctx *c, struct tv obj, struct tv va, struct tv vb, struct tv vs, struct tv *out)
{
    int64_t a = 0, b = 0, s = 1;
    bool ga, gb, gs;
    int rc;
    if ((rc = slice_index(c, va, &a, &ga)) < 0 || (rc = slice_index(c, vb, &b, &gb)) < 0 ||
        (rc = slice_index(c, vs, &s, &gs)) < 0)
        return rc;
    if (obj.k == TV_UNDEF)
        return undefined_err(c, obj);
    if (obj.k != TV_LIST && obj.k != TV_STR)
        return rerr(c, ERR_FORMAT, "'%s' object is not subscriptable", tv_type_name(obj));
    if (s == 0)
        return rerr(c, ERR_FORMAT, "slice step cannot be zero");
    int64_t n = obj.k == TV_LIST ? (int64_t)obj.l->n : (int64_t)utf8_count(obj.s->s, obj.s->len);
    if (!ga)
        a = s > 0 ? 0 : n - 1;
    else if (a < 0)
        a = a + n < 0 ? (s > 0 ? 0 : -1) : a + n;
    else if (a >= n)
        a = s > 0 ? n : n - 1;
    if (!gb)
        b = s > 0 ? n : -1;
    else if (b < 0)
        b = b + n < 0 ? (s > 0 ? 0 : -1) : b + n;
    else if (b >= n)
        b = s > 0 ? n : n - 1;
    struct tlist *l = obj.k == TV_LIST ? tlist_new(c, 0) : NULL;
    struct sbuf sb = {0};
    size_t *offs = NULL;
    if (obj.k == TV_LIST && !l)
        return -c->e->code;
    if (obj.k == TV_STR) {  /* code point offsets, once */
        if (!(offs = ar_alloc(&c->ar, ((size_t)n + 1) * sizeof *offs)))
            return rerr(c, ERR_RANGE, "out of memory slicing a string");
        size_t k = 0;
        for (size_t i = 0; i < obj.s->len; i++)
            if (((unsigned char)obj.s->s[i] & 0xC0) != 0x80)
                offs[k++] = i;
        offs[k] = obj.s->len;
    }
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
        if ((rc = ev_step(c)) < 0)
            return rc;
        if (l)
            rc = tlist_push(c, l, obj.l->v[i]);
        else
            rc = sbuf_put(c, &sb, obj.s->s + offs[i], offs[i + 1] - offs[i]);
        if (rc < 0)
            return rc;
    }
    if (l) {
        l->tuple = obj.l->tuple;
        *out = (struct tv){.k = TV_LIST, .l = l};
        return 0;
    }
    struct tstr *str = tstr_new(c, sb.p ? sb.p : "", sb.len);
    if (!str)
        return -c->e->code;
    *out = tv_str(str);
    return 0;
}

/* ---- operators ---- */

static bool is_num(struct tv v) { return v.k == TV_INT || v.k == TV_FLOAT || v.k == TV_BOOL; }
static double fval(struct tv v) { return v.k == TV_FLOAT ? v.f : v.k == TV_INT ? (double)v.i : v.b; }
static int64_t ival(struct tv v) { return v.k == TV_INT ? v.i : v.k == TV_BOOL ? v.b : 0; }

static const char *op_name(int op)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op >= OP_ADD && op <= OP_POW ? names[op] : "?";
}

static int repeat(struct rctx *c, struct tv seq, int64_t k, struct tv *out)
{
    if (k < 0)
        k = 0;
    if (seq.k == TV_STR) {
        if (seq.s->len && (uint64_t)k > c->lim->max_output / seq.s->len)
            return rerr(c, ERR_RANGE, "string repetition is over the limit of %zu bytes", c->lim->max_output);
        struct sbuf b = {0};
        for (int64_t i = 0; i < k; i++) {
            int rc = sbuf_put(c, &b, seq.s->s, seq.s->len);
            if (rc < 0)
                return rc;
        }
        struct tstr *s = tstr_new(c, b.p ? b.p : "", b.len);
        if (!s)
            return -c->e->code;
        *out = tv_str(s);
        return 0;
    }
    if (seq.l->n && (uint64_t)k > c->lim->max_steps / seq.l->n)
        return rerr(c, ERR_RANGE, "list repetition too large");
    struct tlist *l = tlist_new(c, (size_t)k * seq.l->n);
    if (!l)
        return -c->e->code;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.l->n; j++) {
            int rc = ev_step(c);
            if (rc < 0 || (rc = tlist_push(c, l, seq.l->v[j])) < 0)
                return rc;
        }
    l->tuple = seq.l->tuple;
    *out = (struct tv){.k = TV_LIST, .l = l};
    return 0;
}

static int int_pow(struct rctx *c, int64_t a, int64_t b, struct tv *out)
{
    int64_t r = 1;
    if (b < 0) {
        *out = tv_float(pow((double)a, (double)b));
        return 0;
    }
    while (b > 0) {
        if ((b & 1) && __builtin_mul_overflow(r, a, &r))
            return rerr(c, ERR_RANGE, "integer overflow in '**'");
        b >>= 1;
        if (b && __builtin_mul_overflow(a, a, &a))
            return rerr(c, ERR_RANGE, "integer overflow in '**'");
    }
    *out = tv_int(r);
    return 0;
}

static int binop(struct rctx *c, int op, struct tv a, struct tv b, struct tv *out)
{
    if (a.k == TV_UNDEF)
        return undefined_err(c, a);
    if (b.k == TV_UNDEF)
        return undefined_err(c, b);
    if (op == OP_ADD && a.k == TV_STR && b.k == TV_STR) {
        if (a.s->len + b.s->len > c->lim->max_output)
            return rerr(c, ERR_RANGE, "string is over the limit of %zu bytes", c->lim->max_output);
        struct tstr *s = tstr_new(c, NULL, a.s->len + b.s->len);
        if (!s)
            return -c->e->code;
        memcpy(s->s, a.s->s, a.s->len);
        memcpy(s->s + a.s->len, b.s->s, b.s->len + 1);
        *out = tv_str(s);
        return 0;
    }
    if (op == OP_ADD && a.k == TV_LIST && b.k == TV_LIST) {
        struct tlist *l = tlist_new(c, a.l->n + b.l->n);
        if (!l)
            return -c->e->code;
        for (size_t i = 0; i < a.l->n; i++)
            l->v[l->n++] = a.l->v[i];
        for (size_t i = 0; i < b.l->n; i++)
            l->v[l->n++] = b.l->v[i];
        c->steps += l->n / 16;
        l->tuple = a.l->tuple;
        *out = (struct tv){.k = TV_LIST, .l = l};
        return 0;
    }
    if (op == OP_MUL && (a.k == TV_STR || a.k == TV_LIST) && (b.k == TV_INT || b.k == TV_BOOL))
        return repeat(c, a, ival(b), out);
    if (op == OP_MUL && (b.k == TV_STR || b.k == TV_LIST) && (a.k == TV_INT || a.k == TV_BOOL))
        return repeat(c, b, ival(a), out);
    if (op == OP_MOD && a.k == TV_STR)
        return rerr(c, ERR_UNSUPPORTED, "'%%' string formatting is not supported; use the format filter");
    if (!is_num(a) || !is_num(b))
        return rerr(c, ERR_FORMAT, "unsupported operand type(s) for %s: '%s' and '%s'", op_name(op),
                    tv_type_name(a), tv_type_name(b));
    bool ints = a.k != TV_FLOAT && b.k != TV_FLOAT;
    int64_t x = ival(a), y = ival(b), r;
    double fx = fval(a), fy = fval(b);
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
        if (ints) {
            bool ovf = op == OP_ADD ? __builtin_add_overflow(x, y, &r)
                     : op == OP_SUB ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r);
            if (ovf)
                return rerr(c, ERR_RANGE, "integer overflow in '%s'", op_name(op));
            *out = tv_int(r);
        } else {
            *out = tv_float(op == OP_ADD ? fx + fy : op == OP_SUB ? fx - fy : fx * fy);
        }
        return 0;
    case OP_DIV:
        if (fy == 0)
            return rerr(c, ERR_FORMAT, "division by zero");
        *out = tv_float(fx / fy);
        return 0;
    case OP_FLOORDIV:
    case OP_MOD:
        if (ints ? y == 0 : fy == 0)
            return rerr(c, ERR_FORMAT, "integer division or modulo by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1)
                return rerr(c, ERR_RANGE, "integer overflow in '%s'", op_name(op));
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            *out = tv_int(op == OP_FLOORDIV ? q : m);
        } else {
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0)))
                m += fy;
            *out = tv_float(op == OP_FLOORDIV ? floor(fx / fy) : m);
        }
        return 0;
    case OP_POW:
        if (ints)
            return int_pow(c, x, y, out);
        *out = tv_float(pow(fx, fy));
        return 0;
    }
    return rerr(c, ERR_INTERNAL, "unknown operator");
}

static int contains(struct rctx *c, struct tv hay, struct tv needle, bool *out)
{
    *out = false;
    switch (hay.k) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (needle.k != TV_STR)
            return rerr(c, ERR_FORMAT, "'in <string>' requires string as left operand, not %s", tv_type_name(needle));
        *out = needle.s->len == 0 || (needle.s->len <= hay.s->len &&
                                      memmem(hay.s->s, hay.s->len, needle.s->s, needle.s->len) != NULL);
        c->steps += hay.s->len / 256;
        return 0;
    case TV_LIST:
        for (size_t i = 0; i < hay.l->n && !*out; i++)
            *out = tv_equal(c, hay.l->v[i], needle);
        c->steps += hay.l->n / 16;
        return 0;
    case TV_DICT:
    case TV_NS:
        *out = tdict_getv(c, hay.d, needle) != NULL;
        c->steps += hay.d->n / 16;
        return 0;
    default:
        return rerr(c, ERR_FORMAT, "argument of type '%s' is not iterable", tv_type_name(hay));
    }
}

static int compare(struct rctx *c, int op, struct tv a, struct tv b, bool *out)
{
    int cmp = 0, rc;
    switch (op) {
    case OP_EQ: *out = tv_equal(c, a, b); return 0;
    case OP_NE: *out = !tv_equal(c, a, b); return 0;
    case OP_IN: return contains(c, b, a, out);
    case OP_NOTIN:
        rc = contains(c, b, a, out);
        *out = !*out;
        return rc;
    }
    if ((rc = tv_compare(c, a, b, &cmp)) < 0)
        return rc;
    if ((a.k == TV_FLOAT && isnan(a.f)) || (b.k == TV_FLOAT && isnan(b.f))) {
        *out = false;
        return 0;
    }
    *out = op == OP_LT ? cmp < 0 : op == OP_GT ? cmp > 0 : op == OP_LE ? cmp <= 0 : cmp >= 0;
    return 0;
}

/* ---- calls ---- */

struct args {
    struct tv *pos;
    size_t n;
    struct tstr **kw;
    struct tv *kwv;
    size_t n_kw;
};

static int eval_args(struct rctx *c, const struct node *n, struct frame *f, struct args *a)
{
    int rc;
    memset(a, 0, sizeof *a);
    if (n->n_kids && !(a->pos = ar_alloc(&c->ar, n->n_kids * sizeof *a->pos)))
        return rerr(c, ERR_RANGE, "out of memory");
    if (n->n_kv && !(a->kwv = ar_alloc(&c->ar, n->n_kv * sizeof *a->kwv)))
        return rerr(c, ERR_RANGE, "out of memory");
    for (size_t i = 0; i < n->n_kids; i++)
        if ((rc = ev(c, n->kids[i], f, &a->pos[i])) < 0)
            return rc;
    for (size_t i = 0; i < n->n_kv; i++)
        if ((rc = ev(c, n->kv[i], f, &a->kwv[i])) < 0)
            return rc;
    a->n = n->n_kids;
    a->kw = n->names;
    a->n_kw = n->n_kv;
    return 0;
}

/* Run body with c->out capturing into a fresh buffer; the text goes to *out. */
static int capture(struct rctx *c, const struct node *body, struct frame *f, struct tstr **out)
{
    struct sbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    int rc = exec(c, body, f);
    c->out = saved;
    if (rc < 0)
        return rc;
    *out = tstr_new(c, buf.p ? buf.p : "", buf.len);
    return *out ? 0 : -c->e->code;
}

static int call_macro(struct rctx *c, const struct tmacro *m, const struct args *a, struct tv caller,
                      struct tv *out)
{
    const struct node *d = m->def;
    const char *name = d->name ? d->name->s : "caller";
    int rc;
    if (a->n > d->n_names)
        return rerr(c, ERR_FORMAT, "macro '%s' takes not more than %zu argument(s)", name, d->n_names);
    struct frame *f = frame_new(c, m->closure);
    if (!f || (rc = enter(c)) < 0)
        return f ? rc : -c->e->code;
    for (size_t k = 0; k < a->n_kw; k++) {
        size_t i = 0;
        while (i < d->n_names && strcmp(d->names[i]->s, a->kw[k]->s) != 0)
            i++;
        if (i == d->n_names)
            return rerr(c, ERR_FORMAT, "macro '%s' has no parameter named '%s'", name, a->kw[k]->s);
        if (i < a->n)
            return rerr(c, ERR_FORMAT, "macro '%s' got multiple values for parameter '%s'", name, a->kw[k]->s);
    }
    for (size_t i = 0; i < d->n_names; i++) {
        struct tv v = tv_undef(d->names[i]->s);
        bool set = false;
        if (i < a->n) {
            v = a->pos[i];
            set = true;
        }
        for (size_t k = 0; !set && k < a->n_kw; k++)
            if (!strcmp(d->names[i]->s, a->kw[k]->s)) {
                v = a->kwv[k];
                set = true;
            }
        if (!set && d->kv[i] && (rc = ev(c, d->kv[i], f, &v)) < 0)
            return rc;
        if ((rc = frame_set(c, f, d->names[i], v)) < 0)
            return rc;
    }
    if (caller.k != TV_UNDEF) {
        struct tstr *cn = tstr_new(c, "caller", 6);
        if (!cn || (rc = frame_set(c, f, cn, caller)) < 0)
            return -c->e->code;
    }
    struct tstr *s;
    if ((rc = capture(c, d->c, f, &s)) < 0)
        return rc;
    c->depth--;
    *out = tv_str(s);
    return 0;
}

int ev_call_macro(struct rctx *c, const struct tmacro *m, struct tv *args, size_t n_args,
                  struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out)
{
    struct args a = {args, n_args, kw, kwv, n_kw};
    return call_macro(c, m, &a, m->caller, out);
}

static int call_value(struct rctx *c, struct tv fn, const struct args *a, struct tv caller, struct tv *out)
{
    if (fn.k == TV_MACRO)
        return call_macro(c, fn.m, a, caller.k != TV_UNDEF ? caller : fn.m->caller, out);
    if (fn.k == TV_FUNC)
        return bi_call(c, fn.fn, a->pos, a->n, a->kw, a->kwv, a->n_kw, out);
    if (fn.k == TV_UNDEF)
        return undefined_err(c, fn);
    return rerr(c, ERR_FORMAT, "'%s' object is not callable", tv_type_name(fn));
}

/* ---- expressions ---- */

static int ev_filter(struct rctx *c, const struct node *n, struct tv in, struct frame *f, struct tv *out)
{
    struct args a;
    int rc = eval_args(c, n, f, &a);
    if (rc < 0)
        return rc;
    c->line = n->line;
    return bi_filter(c, n->name->s, in, a.pos, a.n, a.kw, a.kwv, a.n_kw, out);
}

/* [a, b] and (a, b): a list of the evaluated items, marked a tuple for the second. */
static int ev_list(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    int rc;
    struct tlist *l = tlist_new(c, n->n_kids);
    if (!l)
        return -c->e->code;
    for (size_t i = 0; i < n->n_kids; i++)
        if ((rc = ev(c, n->kids[i], f, &l->v[l->n++])) < 0)
            return rc;
    l->tuple = n->type == N_TUPLE;
    *out = (struct tv){.k = TV_LIST, .l = l};
    return 0;
}

/* {k: v, ...}: keys and values evaluated in source order. */
static int ev_dict(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a, b;
    int rc;
    struct tdict *d = tdict_new(c, n->n_kids);
    if (!d)
        return -c->e->code;
    for (size_t i = 0; i < n->n_kids; i++)
        if ((rc = ev(c, n->kids[i], f, &a)) < 0 || (rc = ev(c, n->kv[i], f, &b)) < 0 ||
            (rc = tdict_set(c, d, a, b)) < 0)
            return rc;
    *out = (struct tv){.k = TV_DICT, .d = d};
    return 0;
}

/* x[start:stop:step], each bound None when left out. */
static int ev_slice(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a, s0 = tv_none(), s1 = tv_none(), s2 = tv_none();
    int rc;
    if ((rc = ev(c, n->a, f, &a)) < 0 || (n->b && (rc = ev(c, n->b, f, &s0)) < 0) ||
        (n->c && (rc = ev(c, n->c, f, &s1)) < 0) || (n->d && (rc = ev(c, n->d, f, &s2)) < 0))
        return rc;
    c->line = n->line;
    return do_slice(c, a, s0, s1, s2, out);
}

/* fn(args...): the callee first, then the arguments. */
static int ev_call(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a;
    struct args args;
    int rc;
    if ((rc = ev(c, n->a, f, &a)) < 0 || (rc = eval_args(c, n, f, &args)) < 0)
        return rc;
    c->line = n->line;
    return call_value(c, a, &args, tv_undef(NULL), out);
}

/* x is [not] name(args...). */
static int ev_test(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a;
    struct args args;
    bool r;
    int rc;
    if ((rc = ev(c, n->a, f, &a)) < 0 || (rc = eval_args(c, n, f, &args)) < 0)
        return rc;
    c->line = n->line;
    if ((rc = bi_test(c, n->name->s, a, args.pos, args.n, &r)) < 0)
        return rc;
    *out = tv_bool(n->op ? !r : r);
    return 0;
}

/* -x and +x on numbers (a bool becomes an int, as in Python). */
static int ev_unary(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a;
    int rc;
    if ((rc = ev(c, n->a, f, &a)) < 0)
        return rc;
    if (a.k == TV_UNDEF)
        return undefined_err(c, a);
    if (!is_num(a))
        return rerr(c, ERR_FORMAT, "bad operand type for unary %s: '%s'", n->type == N_NEG ? "-" : "+",
                    tv_type_name(a));
    if (n->type == N_POS)
        *out = a.k == TV_BOOL ? tv_int(a.b) : a;
    else if (a.k == TV_FLOAT)
        *out = tv_float(-a.f);
    else if (ival(a) == INT64_MIN)
        return rerr(c, ERR_RANGE, "integer overflow in unary -");
    else
        *out = tv_int(-ival(a));
    return 0;
}

/* a < b <= c ...: chained as Python does, stopping at the first false link. */
static int ev_cmp(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a, b;
    bool r = true;  /* the parser gives at least one link */
    int rc;
    if ((rc = ev(c, n->a, f, &a)) < 0)
        return rc;
    for (size_t i = 0; i < n->n_kids; i++) {
        if ((rc = ev(c, n->kids[i], f, &b)) < 0)
            return rc;
        c->line = n->line;
        if ((rc = compare(c, n->ops[i], a, b, &r)) < 0)
            return rc;
        if (!r)
            break;
        a = b;
    }
    *out = tv_bool(r);
    return 0;
}

/* a ~ b ~ ...: the items' string forms joined. */
static int ev_concat(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct sbuf sb = {0};
    struct tv a;
    int rc;
    for (size_t i = 0; i < n->n_kids; i++)
        if ((rc = ev(c, n->kids[i], f, &a)) < 0 || (rc = tv_write(c, &sb, a, false)) < 0)
            return rc;
    struct tstr *s = tstr_new(c, sb.p ? sb.p : "", sb.len);
    if (!s)
        return -c->e->code;
    *out = tv_str(s);
    return 0;
}

/* One expression node: the leaves and short-circuit forms here, the rest in the ev_* above. */
static int ev_inner(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    struct tv a, b;
    int rc;
    switch (n->type) {
    case N_CONST:
        *out = n->val;
        return 0;
    case N_NAME:
        *out = lookup(c, f, n->name);
        return 0;
    case N_LIST:
    case N_TUPLE:
        return ev_list(c, n, f, out);
    case N_DICT:
        return ev_dict(c, n, f, out);
    case N_ATTR:
        if ((rc = ev(c, n->a, f, &a)) < 0)
            return rc;
        c->line = n->line;
        return get_attr(c, a, n->name->s, n->name->len, out);
    case N_ITEM:
        if ((rc = ev(c, n->a, f, &a)) < 0 || (rc = ev(c, n->b, f, &b)) < 0)
            return rc;
        c->line = n->line;
        return get_item(c, a, b, out);
    case N_SLICE:
        return ev_slice(c, n, f, out);
    case N_CALL:
        return ev_call(c, n, f, out);
    case N_FILTER:
        if ((rc = ev(c, n->a, f, &a)) < 0)
            return rc;
        return ev_filter(c, n, a, f, out);
    case N_TEST:
        return ev_test(c, n, f, out);
    case N_NEG:
    case N_POS:
        return ev_unary(c, n, f, out);
    case N_NOT:
        if ((rc = ev(c, n->a, f, &a)) < 0)
            return rc;
        *out = tv_bool(!tv_truthy(a));
        return 0;
    case N_BIN:
        if ((rc = ev(c, n->a, f, &a)) < 0 || (rc = ev(c, n->b, f, &b)) < 0)
            return rc;
        c->line = n->line;
        return binop(c, n->op, a, b, out);
    case N_CMP:
        return ev_cmp(c, n, f, out);
    case N_AND:
    case N_OR:
        if ((rc = ev(c, n->a, f, &a)) < 0)
            return rc;
        if (tv_truthy(a) == (n->type == N_OR)) {
            *out = a;
            return 0;
        }
        return ev(c, n->b, f, out);
    case N_COND:
        if ((rc = ev(c, n->a, f, &a)) < 0)
            return rc;
        if (tv_truthy(a))
            return ev(c, n->b, f, out);
        if (n->c)
            return ev(c, n->c, f, out);
        *out = tv_undef(NULL);
        return 0;
    case N_CONCAT:
        return ev_concat(c, n, f, out);
    }
    return rerr(c, ERR_INTERNAL, "statement used as an expression");
}

static int ev(struct rctx *c, const struct node *n, struct frame *f, struct tv *out)
{
    int rc;
    if ((rc = enter(c)) < 0 || (rc = ev_step(c)) < 0)
        return rc;
    c->line = n->line;
    rc = ev_inner(c, n, f, out);
    c->depth--;
    return rc;
}

/* ---- statements ---- */

int tv_iter(struct rctx *c, struct tv v, struct tlist **out)
{
    struct tlist *l;
    switch (v.k) {
    case TV_LIST:
        *out = v.l;
        return 0;
    case TV_UNDEF:
        *out = tlist_new(c, 0);
        return *out ? 0 : -c->e->code;
    case TV_DICT:
        if (!(l = tlist_new(c, v.d->n)))
            return -c->e->code;
        if (v.d->n)
            memcpy(l->v, v.d->k, v.d->n * sizeof *l->v);
        l->n = v.d->n;
        *out = l;
        return 0;
    case TV_STR: {
        size_t n = utf8_count(v.s->s, v.s->len);
        if (!(l = tlist_new(c, n)))
            return -c->e->code;
        for (size_t i = 0; i < v.s->len;) {
            size_t j = i + 1;
            while (j < v.s->len && ((unsigned char)v.s->s[j] & 0xC0) == 0x80)
                j++;
            struct tstr *s = tstr_new(c, v.s->s + i, j - i);
            int rc = s ? tlist_push(c, l, tv_str(s)) : -c->e->code;
            if (rc < 0)
                return rc;
            i = j;
        }
        *out = l;
        return 0;
    }
    default:
        return rerr(c, ERR_FORMAT, "'%s' object is not iterable", tv_type_name(v));
    }
}

/* Bind loop/set targets: one name takes the value, several unpack it. */
static int bind_targets(struct rctx *c, struct frame *f, struct tstr **names, size_t n, struct tv v)
{
    if (n == 1)
        return frame_set(c, f, names[0], v);
    struct tlist *l;
    int rc = tv_iter(c, v, &l);
    if (rc < 0)
        return rc;
    if (l->n != n)
        return rerr(c, ERR_FORMAT, "%s values to unpack (expected %zu, got %zu)",
                    l->n > n ? "too many" : "not enough", n, l->n);
    for (size_t i = 0; i < n; i++)
        if ((rc = frame_set(c, f, names[i], l->v[i])) < 0)
            return rc;
    return 0;
}

static int exec_for(struct rctx *c, const struct node *n, struct frame *f)
{
    struct tv it;
    struct tlist *items;
    int rc;
    if ((rc = ev(c, n->a, f, &it)) < 0 || (rc = tv_iter(c, it, &items)) < 0)
        return rc;
    if (n->b) {  /* {% for x in xs if cond %}: filter first, so loop.length counts kept items */
        struct tlist *kept = tlist_new(c, 0);
        if (!kept)
            return -c->e->code;
        struct frame *g = frame_new(c, f);
        if (!g)
            return -c->e->code;
        for (size_t i = 0; i < items->n; i++) {
            struct tv cond;
            g->vars.n = 0;
            if ((rc = ev_step(c)) < 0 || (rc = bind_targets(c, g, n->names, n->n_names, items->v[i])) < 0 ||
                (rc = ev(c, n->b, g, &cond)) < 0)
                return rc;
            if (tv_truthy(cond) && (rc = tlist_push(c, kept, items->v[i])) < 0)
                return rc;
        }
        items = kept;
    }
    if (items->n == 0)
        return n->d ? exec(c, n->d, f) : 0;
    struct tloop *lp = ar_alloc(&c->ar, sizeof *lp);
    struct tstr *loop_name = tstr_new(c, "loop", 4);
    if (!lp || !loop_name)
        return rerr(c, ERR_RANGE, "out of memory");
    lp->items = items;
    /* one frame for all iterations, emptied each time: memory stays flat in long loops */
    struct frame *g = frame_new(c, f);
    if (!g)
        return -c->e->code;
    for (size_t i = 0; i < items->n; i++) {
        g->vars.n = 0;
        lp->i = i;
        if ((rc = ev_step(c)) < 0 || (rc = bind_targets(c, g, n->names, n->n_names, items->v[i])) < 0 ||
            (rc = frame_set(c, g, loop_name, (struct tv){.k = TV_LOOP, .loop = lp})) < 0 ||
            (rc = exec(c, n->c, g)) < 0)
            return rc;
        if (c->ctl == CTL_BREAK) {
            c->ctl = CTL_NONE;
            break;
        }
        c->ctl = CTL_NONE;
    }
    return 0;
}

static int apply_filters(struct rctx *c, const struct node *chain, struct frame *f, struct tv *v)
{
    for (size_t i = 0; i < chain->n_kids; i++) {
        int rc = ev_filter(c, chain->kids[i], *v, f, v);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int exec_inner(struct rctx *c, const struct node *n, struct frame *f)
{
    struct tv v;
    struct tstr *s;
    int rc;
    switch (n->type) {
    case N_BODY:
        for (size_t i = 0; i < n->n_kids && c->ctl == CTL_NONE; i++)
            if ((rc = exec(c, n->kids[i], f)) < 0)
                return rc;
        return 0;
    case N_TEXT:
        return sbuf_put(c, c->out, n->val.s->s, n->val.s->len);
    case N_OUTPUT:
        if ((rc = ev(c, n->a, f, &v)) < 0)
            return rc;
        return tv_write(c, c->out, v, false);
    case N_IF:
        if ((rc = ev(c, n->a, f, &v)) < 0)
            return rc;
        if (tv_truthy(v))
            return exec(c, n->b, f);
        return n->c ? exec(c, n->c, f) : 0;
    case N_FOR:
        return exec_for(c, n, f);
    case N_SET:
        if ((rc = ev(c, n->a, f, &v)) < 0)
            return rc;
        if (n->name) {
            struct tv ns = lookup(c, f, n->names[0]);
            if (ns.k != TV_NS)
                return rerr(c, ERR_FORMAT, "cannot assign attribute on non-namespace object '%s'", n->names[0]->s);
            return tdict_set(c, ns.d, tv_str(n->name), v);
        }
        return bind_targets(c, f, n->names, n->n_names, v);
    case N_SETBLOCK:
        if ((rc = capture(c, n->c, f, &s)) < 0)
            return rc;
        v = tv_str(s);
        if ((rc = apply_filters(c, n, f, &v)) < 0)
            return rc;
        return frame_set(c, f, n->names[0], v);
    case N_MACRO: {
        struct tmacro *m = ar_alloc(&c->ar, sizeof *m);
        if (!m)
            return rerr(c, ERR_RANGE, "out of memory");
        m->def = n;
        m->closure = f;
        return frame_set(c, f, n->name, (struct tv){.k = TV_MACRO, .m = m});
    }
    case N_CALLBLOCK: {
        struct tmacro *m = ar_alloc(&c->ar, sizeof *m);
        struct args args;
        struct tv fn;
        if (!m)
            return rerr(c, ERR_RANGE, "out of memory");
        m->def = n;
        m->closure = f;
        if ((rc = ev(c, n->a->a, f, &fn)) < 0 || (rc = eval_args(c, n->a, f, &args)) < 0 ||
            (rc = call_value(c, fn, &args, (struct tv){.k = TV_MACRO, .m = m}, &v)) < 0)
            return rc;
        return tv_write(c, c->out, v, false);
    }
    case N_FILTERBLOCK:
        if ((rc = capture(c, n->c, f, &s)) < 0)
            return rc;
        v = tv_str(s);
        if ((rc = apply_filters(c, n, f, &v)) < 0)
            return rc;
        return tv_write(c, c->out, v, false);
    case N_BREAK:
        c->ctl = CTL_BREAK;
        return 0;
    case N_CONTINUE:
        c->ctl = CTL_CONTINUE;
        return 0;
    case N_WITH: {
        struct frame *g = frame_new(c, f);
        if (!g)
            return -c->e->code;
        for (size_t i = 0; i < n->n_names; i++)
            if ((rc = ev(c, n->kv[i], f, &v)) < 0 || (rc = frame_set(c, g, n->names[i], v)) < 0)
                return rc;
        return exec(c, n->c, g);
    }
    }
    return rerr(c, ERR_INTERNAL, "expression used as a statement");
}

static int exec(struct rctx *c, const struct node *n, struct frame *f)
{
    int rc;
    if ((rc = enter(c)) < 0 || (rc = ev_step(c)) < 0)
        return rc;
    c->line = n->line;
    rc = exec_inner(c, n, f);
    c->depth--;
    return rc;
}

/* ---- public ---- */

void tmpl_limits_default(struct tmpl_limits *l)
{
    l->max_source = 1u << 20;
    l->max_output = 16u << 20;
    l->max_memory = 256u << 20;
    l->max_steps = 20000000;
    l->max_depth = 200;
}

int tmpl_parse(struct tmpl **out, const char *src, size_t len, const struct tmpl_limits *lim,
               struct err *e)
{
    *out = NULL;
    struct tmpl_limits dl;
    if (!lim) {
        tmpl_limits_default(&dl);
        lim = &dl;
    }
    if (len > lim->max_source)
        return err_setf(e, ERR_RANGE, "template: %zu bytes is over the limit of %zu", len, lim->max_source);
    size_t bad = utf8_invalid_at(src, len);
    if (bad != SIZE_MAX)
        return err_setf(e, ERR_FORMAT, "template: not valid UTF-8 at byte %zu", bad);
    struct tmpl *t = calloc(1, sizeof *t);
    if (!t)
        return err_setf(e, ERR_NOMEM, "template: out of memory");
    t->lim = *lim;
    t->ar.cap = 64 * lim->max_source + (1u << 20);
    struct token *toks;
    size_t n;
    int rc = tmpl_lex(&t->ar, src, len, &toks, &n, e);
    if (rc == 0)
        rc = tmpl_parse_tokens(&t->ar, toks, n, &t->root, e);
    if (rc < 0) {
        tmpl_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tmpl_free(struct tmpl *t)
{
    if (!t)
        return;
    ar_free_all(&t->ar);
    free(t);
}

int tmpl_render(const struct tmpl *t, const cJSON *vars, char **out, size_t *len, struct err *e)
{
    struct err local;
    if (!e)
        e = &local;
    struct rctx c = {.e = e, .lim = &t->lim};
    struct sbuf buf = {0};
    int rc;
    *out = NULL;
    if (len)
        *len = 0;
    c.ar.cap = t->lim.max_memory;
    c.out = &buf;
    c.globals = frame_new(&c, NULL);
    if (!c.globals) {
        rc = -e->code;
        goto out;
    }
    if (vars && !cJSON_IsObject(vars)) {
        rc = err_setf(e, ERR_ARG, "template variables must be a JSON object");
        goto out;
    }
    for (const cJSON *v = vars ? vars->child : NULL; v; v = v->next) {
        struct tv val;
        struct tstr *name = tstr_new(&c, v->string ? v->string : "", v->string ? strlen(v->string) : 0);
        if (!name || (rc = tv_from_json(&c, v, &val, 0)) < 0 || (rc = frame_set(&c, c.globals, name, val)) < 0) {
            rc = name ? rc : -e->code;
            goto out;
        }
    }
    if ((rc = exec(&c, t->root, c.globals)) < 0)
        goto out;
    if (!(*out = malloc(buf.len + 1))) {
        rc = err_setf(e, ERR_NOMEM, "template: out of memory");
        goto out;
    }
    if (buf.len)
        memcpy(*out, buf.p, buf.len);
    (*out)[buf.len] = 0;
    if (len)
        *len = buf.len;
out:
    ar_free_all(&c.ar);
    return rc;
}
