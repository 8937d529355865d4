/*
 * parse: tokens -> syntax tree (struct node), by recursive descent that
 * follows jinja2's parser, so precedence and quirks match:
 *   expr     := or ['if' or ['else' expr]]
 *   or/and/not, then compare (==, !=, <, >, <=, >=, in, not in; chained)
 *   math1 (+ -) > concat (~) > math2 (* / // %) > pow (**) > unary (- +)
 *   unary    := primary postfix* (filter | test | call)*
 * so `not x is defined` is not(test), `-1|abs` is abs(-1) and
 * `messages|length - 1` is (length) - 1.
 *
 * Node fields by type (unused ones are zero):
 *   N_CONST val | N_NAME name | N_LIST/N_TUPLE kids | N_DICT kids=keys kv=values
 *   N_ATTR a.name | N_ITEM a[b] | N_SLICE a[b:c:d] | N_CALL a(kids, names=kv)
 *   N_FILTER a|name(kids, names=kv) (a NULL in filter/set blocks) | N_TEST likewise, op=negated
 *   N_NEG/N_POS/N_NOT a | N_BIN a op b | N_CMP a, kids[i] with ops[i]
 *   N_AND/N_OR a b | N_COND b if a else c | N_CONCAT kids
 *   N_BODY kids | N_TEXT val | N_OUTPUT a | N_IF a b [c: else body or N_IF]
 *   N_FOR names in a [if b] c [else d] | N_SET names = a, or names[0].name = a
 *   N_SETBLOCK names[0], kids = filters, c body | N_MACRO name(names=kv) c
 *   N_CALLBLOCK a = call, names=kv caller params, c body | N_FILTERBLOCK kids c
 *   N_WITH names=kv, c body | N_BREAK | N_CONTINUE
 * Nesting is bounded (PARSE_DEPTH_MAX) so hostile input cannot exhaust the stack.
 */
#include <string.h>

#include "tmpl_impl.h"

#define PARSE_DEPTH_MAX 128

struct parser {
    struct arena *ar;
    const struct token *t;
    size_t n, i;
    int depth;
    int loops;   /* enclosing for loops (break/continue are valid) */
    struct err *e;
};

struct vec { void **v; size_t n, cap; };

static int oom(struct parser *P)
{
    return err_setf(P->e, ERR_NOMEM, "template: out of memory");
}

static int vpush(struct parser *P, struct vec *v, void *x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 4;
        void **nv = ar_alloc(P->ar, nc * sizeof *nv);
        if (!nv)
            return oom(P);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

static const struct token *cur(struct parser *P) { return &P->t[P->i]; }
static const struct token *peek(struct parser *P, size_t k)
{
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}
static void adv(struct parser *P)
{
    if (P->i + 1 < P->n)
        P->i++;
}

static const char *tok_desc(const struct token *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: return t->s->s;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: return "operator";
    }
}

static int fail(struct parser *P, const char *what)
{
    const struct token *t = cur(P);
    return err_setf(P->e, ERR_FORMAT, "template line %d: %s (got %s)", t->line, what, tok_desc(t));
}

static bool is_op(struct parser *P, int op) { return cur(P)->type == TK_OP && cur(P)->op == op; }
static bool is_name(struct parser *P, const char *s)
{
    return cur(P)->type == TK_NAME && strcmp(cur(P)->s->s, s) == 0;
}
static bool skip_op(struct parser *P, int op)
{
    if (!is_op(P, op))
        return false;
    adv(P);
    return true;
}
static bool skip_name(struct parser *P, const char *s)
{
    if (!is_name(P, s))
        return false;
    adv(P);
    return true;
}
static int expect_op(struct parser *P, int op, const char *what)
{
    return skip_op(P, op) ? 0 : fail(P, what);
}

static struct node *mk(struct parser *P, int type, int line)
{
    struct node *n = ar_alloc(P->ar, sizeof *n);
    if (n) {
        n->type = type;
        n->line = line;
    }
    return n;
}

static int enter(struct parser *P)
{
    if (++P->depth > PARSE_DEPTH_MAX)
        return err_setf(P->e, ERR_RANGE, "template line %d: nested too deeply (over %d levels)",
                        cur(P)->line, PARSE_DEPTH_MAX);
    return 0;
}

static int parse_expr(struct parser *P, struct node **out, bool condexpr);
static int parse_unary(struct parser *P, struct node **out, bool filters);

/* ---- expressions ---- */

/* Call arguments after '(' up to ')': positional into args, name=value into names/kv. */
static int parse_args(struct parser *P, struct vec *args, struct vec *names, struct vec *kv)
{
    while (!is_op(P, OP_RPAREN)) {
        if (args->n + kv->n > 0 && expect_op(P, OP_COMMA, "expected ',' between arguments") < 0)
            return -ERR_FORMAT;
        if (is_op(P, OP_RPAREN))
            break;
        if (is_op(P, OP_MUL) || is_op(P, OP_POW))
            return fail(P, "*args and **kwargs are not supported");
        struct node *x;
        int rc;
        if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && peek(P, 1)->op == OP_ASSIGN) {
            struct tstr *nm = cur(P)->s;
            adv(P);
            adv(P);
            if ((rc = parse_expr(P, &x, true)) < 0)
                return rc;
            if (vpush(P, names, nm) < 0 || vpush(P, kv, x) < 0)
                return -ERR_NOMEM;
        } else {
            if (kv->n)
                return fail(P, "positional argument after a keyword argument");
            if ((rc = parse_expr(P, &x, true)) < 0 || (rc = vpush(P, args, x)) < 0)
                return rc;
        }
    }
    adv(P);
    return 0;
}

static void set_args(struct node *n, struct vec *args, struct vec *names, struct vec *kv)
{
    n->kids = (struct node **)args->v;
    n->n_kids = args->n;
    n->names = (struct tstr **)names->v;
    n->n_names = names->n;
    n->kv = (struct node **)kv->v;
    n->n_kv = kv->n;
}

/* '|' already consumed: name ('.' name)* ['(' args ')'] applied to in (may be NULL). */
static int parse_filter(struct parser *P, struct node *in, struct node **out)
{
    if (cur(P)->type != TK_NAME)
        return fail(P, "expected a filter name after '|'");
    struct node *n = mk(P, N_FILTER, cur(P)->line);
    if (!n)
        return oom(P);
    n->a = in;
    n->name = cur(P)->s;
    adv(P);
    if (is_op(P, OP_DOT))
        return fail(P, "dotted filter names are not supported");
    struct vec a = {0}, nm = {0}, kv = {0};
    if (skip_op(P, OP_LPAREN)) {
        int rc = parse_args(P, &a, &nm, &kv);
        if (rc < 0)
            return rc;
    }
    set_args(n, &a, &nm, &kv);
    *out = n;
    return 0;
}

static int parse_test(struct parser *P, struct node *in, struct node **out)
{
    int line = cur(P)->line;
    bool neg = skip_name(P, "not");
    if (cur(P)->type != TK_NAME)
        return fail(P, "expected a test name after 'is'");
    struct node *n = mk(P, N_TEST, line);
    if (!n)
        return oom(P);
    n->a = in;
    n->op = neg;
    n->name = cur(P)->s;
    adv(P);
    struct vec a = {0}, nm = {0}, kv = {0};
    int rc;
    const struct token *t = cur(P);
    if (skip_op(P, OP_LPAREN)) {
        if ((rc = parse_args(P, &a, &nm, &kv)) < 0)
            return rc;
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
                (t->type == TK_OP && (t->op == OP_LBRACKET || t->op == OP_LBRACE))) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") && !is_name(P, "if")) {
        if (is_name(P, "is"))
            return fail(P, "tests cannot be chained with 'is'");
        struct node *x;
        if ((rc = parse_unary(P, &x, false)) < 0 || (rc = vpush(P, &a, x)) < 0)
            return rc;
    }
    set_args(n, &a, &nm, &kv);
    *out = n;
    return 0;
}

/* Comma-separated expressions; a tuple when there is a comma. */
static bool tuple_end(struct parser *P)
{
    const struct token *t = cur(P);
    return t->type == TK_VAR_END || t->type == TK_BLOCK_END || (t->type == TK_OP && t->op == OP_RPAREN) ||
           is_name(P, "if") || is_name(P, "recursive") || is_op(P, OP_ASSIGN);
}

static int parse_tuple(struct parser *P, struct node **out, bool condexpr, bool explicit_parens)
{
    struct vec v = {0};
    int line = cur(P)->line, rc;
    bool comma = false;
    (void)explicit_parens;
    for (;;) {
        if (v.n) {
            if (!skip_op(P, OP_COMMA))
                break;
            comma = true;
            if (tuple_end(P))
                break;
        }
        struct node *x;
        if ((rc = parse_expr(P, &x, condexpr)) < 0 || (rc = vpush(P, &v, x)) < 0)
            return rc;
    }
    if (v.n == 1 && !comma) {
        *out = v.v[0];
        return 0;
    }
    struct node *n = mk(P, N_TUPLE, line);
    if (!n)
        return oom(P);
    n->kids = (struct node **)v.v;
    n->n_kids = v.n;
    *out = n;
    return 0;
}

static int parse_primary(struct parser *P, struct node **out)
{
    const struct token *t = cur(P);
    struct node *n = NULL;
    int rc;
    switch (t->type) {
    case TK_NAME: {
        const char *s = t->s->s;
        n = mk(P, N_CONST, t->line);
        if (!n)
            return oom(P);
        if (!strcmp(s, "true") || !strcmp(s, "True"))
            n->val = (struct tv){.k = TV_BOOL, .b = true};
        else if (!strcmp(s, "false") || !strcmp(s, "False"))
            n->val = (struct tv){.k = TV_BOOL, .b = false};
        else if (!strcmp(s, "none") || !strcmp(s, "None"))
            n->val = (struct tv){.k = TV_NONE};
        else {
            n->type = N_NAME;
            n->name = t->s;
        }
        adv(P);
        break;
    }
    case TK_STRING: {
        n = mk(P, N_CONST, t->line);
        if (!n)
            return oom(P);
        struct tstr *s = t->s;
        adv(P);
        while (cur(P)->type == TK_STRING) {  /* "a" "b" is "ab" */
            struct tstr *u = cur(P)->s, *j = ar_alloc(P->ar, sizeof *j + s->len + u->len + 1);
            if (!j)
                return oom(P);
            memcpy(j->s, s->s, s->len);
            memcpy(j->s + s->len, u->s, u->len + 1);
            j->len = s->len + u->len;
            s = j;
            adv(P);
        }
        n->val = (struct tv){.k = TV_STR, .s = s};
        break;
    }
    case TK_INT:
    case TK_FLOAT:
        n = mk(P, N_CONST, t->line);
        if (!n)
            return oom(P);
        n->val = t->type == TK_INT ? (struct tv){.k = TV_INT, .i = t->i} : (struct tv){.k = TV_FLOAT, .f = t->f};
        adv(P);
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            adv(P);
            if (skip_op(P, OP_RPAREN)) {
                if (!(n = mk(P, N_TUPLE, t->line)))
                    return oom(P);
                break;
            }
            if ((rc = parse_tuple(P, &n, true, true)) < 0)
                return rc;
            if ((rc = expect_op(P, OP_RPAREN, "expected ')'")) < 0)
                return rc;
            break;
        }
        if (t->op == OP_LBRACKET || t->op == OP_LBRACE) {
            bool dict = t->op == OP_LBRACE;
            int close = dict ? OP_RBRACE : OP_RBRACKET;
            struct vec k = {0}, v = {0};
            if (!(n = mk(P, dict ? N_DICT : N_LIST, t->line)))
                return oom(P);
            adv(P);
            while (!skip_op(P, close)) {
                if (k.n && (rc = expect_op(P, OP_COMMA, dict ? "expected ',' or '}'" : "expected ',' or ']'")) < 0)
                    return rc;
                if (skip_op(P, close))
                    break;
                struct node *x;
                if ((rc = parse_expr(P, &x, true)) < 0 || (rc = vpush(P, &k, x)) < 0)
                    return rc;
                if (dict) {
                    if ((rc = expect_op(P, OP_COLON, "expected ':' in a dict literal")) < 0 ||
                        (rc = parse_expr(P, &x, true)) < 0 || (rc = vpush(P, &v, x)) < 0)
                        return rc;
                }
            }
            n->kids = (struct node **)k.v;
            n->n_kids = k.n;
            n->kv = (struct node **)v.v;
            n->n_kv = v.n;
            break;
        }
        return fail(P, "expected an expression");
    default:
        return fail(P, "expected an expression");
    }
    *out = n;
    return 0;
}

static int parse_subscript(struct parser *P, struct node *obj, struct node **out)
{
    int line = cur(P)->line, rc;
    struct node *part[3] = {0};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(P, OP_COLON)) {
            slice = true;
            if (++k > 2)
                return fail(P, "too many ':' in a slice");
            adv(P);
            continue;
        }
        if (is_op(P, OP_RBRACKET))
            break;
        if (part[k])
            return fail(P, "expected ']'");
        if ((rc = parse_expr(P, &part[k], true)) < 0)
            return rc;
    }
    adv(P);
    struct node *n = mk(P, slice ? N_SLICE : N_ITEM, line);
    if (!n)
        return oom(P);
    n->a = obj;
    if (!slice && !part[0])
        return fail(P, "empty subscript");
    n->b = part[0];
    n->c = part[1];
    n->d = part[2];
    *out = n;
    return 0;
}

static int parse_postfix(struct parser *P, struct node **io, bool filters)
{
    int rc;
    for (;;) {
        const struct token *t = cur(P);
        if (skip_op(P, OP_DOT)) {
            const struct token *u = cur(P);
            struct node *n = mk(P, N_ATTR, u->line);
            if (!n)
                return oom(P);
            n->a = *io;
            if (u->type == TK_NAME) {
                n->name = u->s;
            } else if (u->type == TK_INT) {
                struct node *k = mk(P, N_CONST, u->line);
                if (!k)
                    return oom(P);
                k->val = (struct tv){.k = TV_INT, .i = u->i};
                n->type = N_ITEM;
                n->b = k;
            } else {
                return fail(P, "expected an attribute name after '.'");
            }
            adv(P);
            *io = n;
        } else if (skip_op(P, OP_LBRACKET)) {
            if ((rc = parse_subscript(P, *io, io)) < 0)
                return rc;
        } else if (skip_op(P, OP_LPAREN)) {
            struct node *n = mk(P, N_CALL, t->line);
            struct vec a = {0}, nm = {0}, kv = {0};
            if (!n)
                return oom(P);
            if ((rc = parse_args(P, &a, &nm, &kv)) < 0)
                return rc;
            n->a = *io;
            set_args(n, &a, &nm, &kv);
            *io = n;
        } else if (filters && skip_op(P, OP_PIPE)) {
            if ((rc = parse_filter(P, *io, io)) < 0)
                return rc;
        } else if (filters && skip_name(P, "is")) {
            if ((rc = parse_test(P, *io, io)) < 0)
                return rc;
        } else {
            return 0;
        }
    }
}

static int parse_unary(struct parser *P, struct node **out, bool filters)
{
    int rc, line = cur(P)->line;
    if ((rc = enter(P)) < 0)
        return rc;
    if (is_op(P, OP_SUB) || is_op(P, OP_ADD)) {
        int type = is_op(P, OP_SUB) ? N_NEG : N_POS;
        adv(P);
        struct node *n = mk(P, type, line);
        if (!n)
            return oom(P);
        if ((rc = parse_unary(P, &n->a, false)) < 0)
            return rc;
        *out = n;
    } else if ((rc = parse_primary(P, out)) < 0) {
        return rc;
    }
    if ((rc = parse_postfix(P, out, false)) < 0)
        return rc;
    if (filters && (rc = parse_postfix(P, out, true)) < 0)
        return rc;
    P->depth--;
    return 0;
}

static int mk_bin(struct parser *P, int type, int op, struct node *l, struct node *r, int line,
                  struct node **out)
{
    struct node *n = mk(P, type, line);
    if (!n)
        return oom(P);
    n->op = op;
    n->a = l;
    n->b = r;
    *out = n;
    return 0;
}

static int parse_pow(struct parser *P, struct node **out)
{
    int rc = parse_unary(P, out, true);
    while (rc == 0 && is_op(P, OP_POW)) {
        int line = cur(P)->line;
        struct node *r;
        adv(P);
        if ((rc = parse_unary(P, &r, true)) == 0)
            rc = mk_bin(P, N_BIN, OP_POW, *out, r, line, out);
    }
    return rc;
}

static int parse_math2(struct parser *P, struct node **out)
{
    int rc = parse_pow(P, out);
    while (rc == 0 && (is_op(P, OP_MUL) || is_op(P, OP_DIV) || is_op(P, OP_FLOORDIV) || is_op(P, OP_MOD))) {
        int op = cur(P)->op, line = cur(P)->line;
        struct node *r;
        adv(P);
        if ((rc = parse_pow(P, &r)) == 0)
            rc = mk_bin(P, N_BIN, op, *out, r, line, out);
    }
    return rc;
}

static int parse_concat(struct parser *P, struct node **out)
{
    int rc = parse_math2(P, out);
    if (rc < 0 || !is_op(P, OP_TILDE))
        return rc;
    struct vec v = {0};
    struct node *n = mk(P, N_CONCAT, cur(P)->line);
    if (!n || vpush(P, &v, *out) < 0)
        return oom(P);
    while (skip_op(P, OP_TILDE)) {
        struct node *x;
        if ((rc = parse_math2(P, &x)) < 0 || (rc = vpush(P, &v, x)) < 0)
            return rc;
    }
    n->kids = (struct node **)v.v;
    n->n_kids = v.n;
    *out = n;
    return 0;
}

static int parse_math1(struct parser *P, struct node **out)
{
    int rc = parse_concat(P, out);
    while (rc == 0 && (is_op(P, OP_ADD) || is_op(P, OP_SUB))) {
        int op = cur(P)->op, line = cur(P)->line;
        struct node *r;
        adv(P);
        if ((rc = parse_concat(P, &r)) == 0)
            rc = mk_bin(P, N_BIN, op, *out, r, line, out);
    }
    return rc;
}

static int cmp_op(struct parser *P)
{
    const struct token *t = cur(P);
    if (t->type == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT || t->op == OP_GT ||
                             t->op == OP_LE || t->op == OP_GE))
        return t->op;
    if (is_name(P, "in"))
        return OP_IN;
    if (is_name(P, "not") && peek(P, 1)->type == TK_NAME && !strcmp(peek(P, 1)->s->s, "in"))
        return OP_NOTIN;
    return OP_NONE;
}

static int parse_compare(struct parser *P, struct node **out)
{
    int rc = parse_math1(P, out), op;
    if (rc < 0 || (op = cmp_op(P)) == OP_NONE)
        return rc;
    struct node *n = mk(P, N_CMP, cur(P)->line);
    struct vec v = {0};
    int *ops = ar_alloc(P->ar, 64 * sizeof *ops);
    if (!n || !ops)
        return oom(P);
    n->a = *out;
    while ((op = cmp_op(P)) != OP_NONE) {
        if (v.n >= 64)
            return fail(P, "too many chained comparisons");
        adv(P);
        if (op == OP_NOTIN)
            adv(P);
        struct node *x;
        if ((rc = parse_math1(P, &x)) < 0 || (rc = vpush(P, &v, x)) < 0)
            return rc;
        ops[v.n - 1] = op;
    }
    n->kids = (struct node **)v.v;
    n->n_kids = v.n;
    n->ops = ops;
    *out = n;
    return 0;
}

static int parse_not(struct parser *P, struct node **out)
{
    if (is_name(P, "not")) {
        int rc, line = cur(P)->line;
        adv(P);
        if ((rc = enter(P)) < 0)
            return rc;
        struct node *n = mk(P, N_NOT, line);
        if (!n)
            return oom(P);
        if ((rc = parse_not(P, &n->a)) < 0)
            return rc;
        P->depth--;
        *out = n;
        return 0;
    }
    return parse_compare(P, out);
}

static int parse_and(struct parser *P, struct node **out)
{
    int rc = parse_not(P, out);
    while (rc == 0 && is_name(P, "and")) {
        int line = cur(P)->line;
        struct node *r;
        adv(P);
        if ((rc = parse_not(P, &r)) == 0)
            rc = mk_bin(P, N_AND, 0, *out, r, line, out);
    }
    return rc;
}

static int parse_or(struct parser *P, struct node **out)
{
    int rc = parse_and(P, out);
    while (rc == 0 && is_name(P, "or")) {
        int line = cur(P)->line;
        struct node *r;
        adv(P);
        if ((rc = parse_and(P, &r)) == 0)
            rc = mk_bin(P, N_OR, 0, *out, r, line, out);
    }
    return rc;
}

static int parse_expr(struct parser *P, struct node **out, bool condexpr)
{
    int rc;
    if ((rc = enter(P)) < 0 || (rc = parse_or(P, out)) < 0)
        return rc;
    while (condexpr && is_name(P, "if")) {
        struct node *n = mk(P, N_COND, cur(P)->line);
        if (!n)
            return oom(P);
        adv(P);
        n->b = *out;
        if ((rc = parse_or(P, &n->a)) < 0)
            return rc;
        if (skip_name(P, "else") && (rc = parse_expr(P, &n->c, true)) < 0)
            return rc;
        *out = n;
    }
    P->depth--;
    return 0;
}

/* ---- statements ---- */

static int parse_body(struct parser *P, const char *const *ends, struct node **out, const char **which);

static int expect_block_end(struct parser *P)
{
    if (cur(P)->type != TK_BLOCK_END)
        return fail(P, "expected end of statement block '%}'");
    adv(P);
    return 0;
}

/* Target names: a[, b]* (optionally in parentheses). */
static int parse_targets(struct parser *P, struct vec *names)
{
    bool paren = skip_op(P, OP_LPAREN);
    do {
        if (cur(P)->type != TK_NAME)
            return fail(P, "expected a variable name");
        if (vpush(P, names, cur(P)->s) < 0)
            return -ERR_NOMEM;
        adv(P);
    } while (skip_op(P, OP_COMMA) && cur(P)->type == TK_NAME);
    if (paren && !skip_op(P, OP_RPAREN))
        return fail(P, "expected ')'");
    return 0;
}

static int parse_if(struct parser *P, int line, struct node **out)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct node *n = mk(P, N_IF, line);
    const char *which;
    int rc;
    if (!n)
        return oom(P);
    if ((rc = parse_tuple(P, &n->a, true, false)) < 0 || (rc = expect_block_end(P)) < 0 ||
        (rc = parse_body(P, ends, &n->b, &which)) < 0)
        return rc;
    if (!strcmp(which, "elif")) {
        if ((rc = enter(P)) < 0 || (rc = parse_if(P, cur(P)->line, &n->c)) < 0)
            return rc;
        P->depth--;
    } else if (!strcmp(which, "else")) {
        static const char *const end_only[] = {"endif", NULL};
        if ((rc = expect_block_end(P)) < 0 || (rc = parse_body(P, end_only, &n->c, &which)) < 0 ||
            (rc = expect_block_end(P)) < 0)
            return rc;
    } else if ((rc = expect_block_end(P)) < 0) {
        return rc;
    }
    *out = n;
    return 0;
}

static int parse_for(struct parser *P, int line, struct node **out)
{
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    struct node *n = mk(P, N_FOR, line);
    struct vec names = {0};
    const char *which;
    int rc;
    if (!n)
        return oom(P);
    if ((rc = parse_targets(P, &names)) < 0)
        return rc;
    n->names = (struct tstr **)names.v;
    n->n_names = names.n;
    if (!skip_name(P, "in"))
        return fail(P, "expected 'in' in a for loop");
    if ((rc = parse_tuple(P, &n->a, false, false)) < 0)
        return rc;
    if (skip_name(P, "if") && (rc = parse_expr(P, &n->b, true)) < 0)
        return rc;
    if (is_name(P, "recursive"))
        return fail(P, "recursive for loops are not supported");
    if ((rc = expect_block_end(P)) < 0)
        return rc;
    P->loops++;
    rc = parse_body(P, ends, &n->c, &which);
    P->loops--;
    if (rc < 0 || (rc = expect_block_end(P)) < 0)
        return rc;
    if (!strcmp(which, "else") &&
        ((rc = parse_body(P, end_only, &n->d, &which)) < 0 || (rc = expect_block_end(P)) < 0))
        return rc;
    *out = n;
    return 0;
}

static int parse_filter_chain(struct parser *P, struct vec *chain)
{
    int rc;
    do {
        struct node *f;
        if ((rc = parse_filter(P, NULL, &f)) < 0 || (rc = vpush(P, chain, f)) < 0)
            return rc;
    } while (skip_op(P, OP_PIPE));
    return 0;
}

static int parse_set(struct parser *P, int line, struct node **out)
{
    static const char *const ends[] = {"endset", NULL};
    struct node *n = mk(P, N_SET, line);
    struct vec names = {0};
    int rc;
    const char *which;
    if (!n)
        return oom(P);
    if (cur(P)->type == TK_NAME && peek(P, 1)->type == TK_OP && peek(P, 1)->op == OP_DOT) {
        if (vpush(P, &names, cur(P)->s) < 0)
            return -ERR_NOMEM;
        adv(P);
        adv(P);
        if (cur(P)->type != TK_NAME)
            return fail(P, "expected an attribute name");
        n->name = cur(P)->s;
        adv(P);
    } else if ((rc = parse_targets(P, &names)) < 0) {
        return rc;
    }
    n->names = (struct tstr **)names.v;
    n->n_names = names.n;
    if (skip_op(P, OP_ASSIGN)) {
        if ((rc = parse_tuple(P, &n->a, true, false)) < 0)
            return rc;
        *out = n;
        return expect_block_end(P);
    }
    if (n->name || names.n != 1)
        return fail(P, "expected '=' in a set statement");
    n->type = N_SETBLOCK;
    struct vec chain = {0};
    if (skip_op(P, OP_PIPE) && (rc = parse_filter_chain(P, &chain)) < 0)
        return rc;
    n->kids = (struct node **)chain.v;
    n->n_kids = chain.n;
    if ((rc = expect_block_end(P)) < 0 || (rc = parse_body(P, ends, &n->c, &which)) < 0)
        return rc;
    *out = n;
    return expect_block_end(P);
}

/* '(' a [= default], ... ')' into names/kv (kv entry NULL when no default). */
static int parse_params(struct parser *P, struct vec *names, struct vec *kv)
{
    int rc;
    if ((rc = expect_op(P, OP_LPAREN, "expected '('")) < 0)
        return rc;
    while (!skip_op(P, OP_RPAREN)) {
        if (names->n && (rc = expect_op(P, OP_COMMA, "expected ',' between parameters")) < 0)
            return rc;
        if (skip_op(P, OP_RPAREN))
            break;
        if (cur(P)->type != TK_NAME)
            return fail(P, "expected a parameter name");
        struct node *def = NULL;
        struct tstr *nm = cur(P)->s;
        adv(P);
        if (skip_op(P, OP_ASSIGN) && (rc = parse_expr(P, &def, true)) < 0)
            return rc;
        if (!def && kv->n && names->n && ((struct node **)kv->v)[kv->n - 1])
            return fail(P, "parameter without a default after one with a default");
        if (vpush(P, names, nm) < 0 || vpush(P, kv, def) < 0)
            return -ERR_NOMEM;
    }
    return 0;
}

static int parse_macro_like(struct parser *P, int type, int line, struct node **out)
{
    static const char *const macro_end[] = {"endmacro", NULL};
    static const char *const call_end[] = {"endcall", NULL};
    struct node *n = mk(P, type, line);
    struct vec names = {0}, kv = {0};
    const char *which;
    int rc, loops = P->loops;
    if (!n)
        return oom(P);
    if (type == N_MACRO) {
        if (cur(P)->type != TK_NAME)
            return fail(P, "expected a macro name");
        n->name = cur(P)->s;
        adv(P);
        if ((rc = parse_params(P, &names, &kv)) < 0)
            return rc;
    } else {
        if (is_op(P, OP_LPAREN) && (rc = parse_params(P, &names, &kv)) < 0)
            return rc;
        if ((rc = parse_expr(P, &n->a, true)) < 0)
            return rc;
        if (n->a->type != N_CALL)
            return fail(P, "expected a call in a call block");
    }
    n->names = (struct tstr **)names.v;
    n->n_names = names.n;
    n->kv = (struct node **)kv.v;
    n->n_kv = kv.n;
    P->loops = 0;
    if ((rc = expect_block_end(P)) < 0 ||
        (rc = parse_body(P, type == N_MACRO ? macro_end : call_end, &n->c, &which)) < 0)
        return rc;
    P->loops = loops;
    if (type == N_MACRO && cur(P)->type == TK_NAME)
        adv(P);  /* {% endmacro name %} */
    *out = n;
    return expect_block_end(P);
}

static int parse_with(struct parser *P, int line, struct node **out)
{
    static const char *const ends[] = {"endwith", NULL};
    struct node *n = mk(P, N_WITH, line);
    struct vec names = {0}, kv = {0};
    const char *which;
    int rc;
    if (!n)
        return oom(P);
    while (cur(P)->type != TK_BLOCK_END) {
        if (names.n && (rc = expect_op(P, OP_COMMA, "expected ','")) < 0)
            return rc;
        if (cur(P)->type != TK_NAME)
            return fail(P, "expected a variable name");
        struct tstr *nm = cur(P)->s;
        struct node *x;
        adv(P);
        if ((rc = expect_op(P, OP_ASSIGN, "expected '='")) < 0 || (rc = parse_expr(P, &x, true)) < 0)
            return rc;
        if (vpush(P, &names, nm) < 0 || vpush(P, &kv, x) < 0)
            return -ERR_NOMEM;
    }
    n->names = (struct tstr **)names.v;
    n->n_names = names.n;
    n->kv = (struct node **)kv.v;
    n->n_kv = kv.n;
    if ((rc = expect_block_end(P)) < 0 || (rc = parse_body(P, ends, &n->c, &which)) < 0)
        return rc;
    *out = n;
    return expect_block_end(P);
}

/* After '{%' and a statement name. */
static int parse_statement(struct parser *P, struct node **out)
{
    const struct token *t = cur(P);
    int line = t->line, rc;
    if (t->type != TK_NAME)
        return fail(P, "expected a statement name after '{%'");
    const char *s = t->s->s;
    adv(P);
    if (!strcmp(s, "if"))
        return parse_if(P, line, out);
    if (!strcmp(s, "for"))
        return parse_for(P, line, out);
    if (!strcmp(s, "set"))
        return parse_set(P, line, out);
    if (!strcmp(s, "macro"))
        return parse_macro_like(P, N_MACRO, line, out);
    if (!strcmp(s, "call"))
        return parse_macro_like(P, N_CALLBLOCK, line, out);
    if (!strcmp(s, "with"))
        return parse_with(P, line, out);
    if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        if (!P->loops)
            return err_setf(P->e, ERR_FORMAT, "template line %d: '%s' outside a for loop", line, s);
        if (!(*out = mk(P, s[0] == 'b' ? N_BREAK : N_CONTINUE, line)))
            return oom(P);
        return expect_block_end(P);
    }
    if (!strcmp(s, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        struct node *n = mk(P, N_FILTERBLOCK, line);
        struct vec chain = {0};
        const char *which;
        if (!n)
            return oom(P);
        if ((rc = parse_filter_chain(P, &chain)) < 0 || (rc = expect_block_end(P)) < 0 ||
            (rc = parse_body(P, ends, &n->c, &which)) < 0)
            return rc;
        n->kids = (struct node **)chain.v;
        n->n_kids = chain.n;
        *out = n;
        return expect_block_end(P);
    }
    if (!strcmp(s, "generation")) {  /* transformers' AssistantTracker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        if ((rc = expect_block_end(P)) < 0 || (rc = parse_body(P, ends, out, &which)) < 0)
            return rc;
        return expect_block_end(P);
    }
    return err_setf(P->e, ERR_FORMAT, "template line %d: unknown or unexpected tag '%s'", line, s);
}

/* Statements until '{% <one of ends>'; *which is the end name found (its
 * BLOCK_END not consumed). ends NULL: until the end of the template. */
static int parse_body(struct parser *P, const char *const *ends, struct node **out, const char **which)
{
    struct node *body = mk(P, N_BODY, cur(P)->line);
    struct vec v = {0};
    int rc, open_line = cur(P)->line;
    if (!body)
        return oom(P);
    if ((rc = enter(P)) < 0)
        return rc;
    for (;;) {
        const struct token *t = cur(P);
        struct node *n = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                size_t k = 0;
                while (ends[k + 1] && strncmp(ends[k], "end", 3) != 0)
                    k++;
                return err_setf(P->e, ERR_FORMAT, "template line %d: missing {%% %s %%} for the block opened on line %d",
                                t->line, ends[k], open_line);
            }
            break;
        }
        if (t->type == TK_TEXT) {
            if (!(n = mk(P, N_TEXT, t->line)))
                return oom(P);
            n->val = (struct tv){.k = TV_STR, .s = t->s};
            adv(P);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(P);
            if (!(n = mk(P, N_OUTPUT, t->line)))
                return oom(P);
            if ((rc = parse_tuple(P, &n->a, true, false)) < 0)
                return rc;
            if (cur(P)->type != TK_VAR_END)
                return fail(P, "expected end of print statement '}}'");
            adv(P);
        } else if (t->type == TK_BLOCK_BEGIN) {
            const struct token *nt = peek(P, 1);
            if (ends && nt->type == TK_NAME) {
                for (size_t k = 0; ends[k]; k++)
                    if (!strcmp(nt->s->s, ends[k])) {
                        adv(P);
                        adv(P);
                        *which = ends[k];
                        goto done;
                    }
            }
            adv(P);
            if ((rc = parse_statement(P, &n)) < 0)
                return rc;
        } else {
            return fail(P, "unexpected token");
        }
        if ((rc = vpush(P, &v, n)) < 0)
            return rc;
    }
done:
    P->depth--;
    body->kids = (struct node **)v.v;
    body->n_kids = v.n;
    *out = body;
    return 0;
}

int tmpl_parse_tokens(struct arena *ar, const struct token *toks, size_t n, struct node **root,
                      struct err *e)
{
    struct parser P = {.ar = ar, .t = toks, .n = n, .e = e};
    const char *which = NULL;
    return parse_body(&P, NULL, root, &which);
}
