/*
 * tmpl_impl: the internals shared by the template module's files.
 *
 * Memory: everything lives in arenas. A parsed template owns one arena (its
 * tokens' strings and the syntax tree); each render owns another (every
 * value, scope and output buffer) that is freed whole when the render
 * ends, so values need no reference counts and an error anywhere leaks
 * nothing. The render arena is capped (tmpl_limits.max_memory).
 *
 * Values (struct tv) are small tagged unions passed by value. Strings,
 * lists and dicts are arena objects; lists and dicts are never mutated once
 * built (the sandbox is immutable), except namespaces (TV_NS), whose
 * attributes `set ns.x = ...` replaces.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "template.h"

/* ---- arena ---- */

struct ar_chunk;
struct arena {
    struct ar_chunk *head;
    size_t used;   /* bytes handed out plus chunk overhead */
    size_t cap;    /* 0 = unbounded */
    bool over_cap; /* an allocation failed because of cap (not the system) */
};
void *ar_alloc(struct arena *a, size_t n);  /* 16-aligned, zeroed; NULL over cap/OOM */
void ar_free_all(struct arena *a);

/* ---- values ---- */

enum tv_kind {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_NS,
    TV_MACRO, TV_FUNC, TV_LOOP,
};

struct tstr { size_t len; char s[]; };  /* NUL-terminated as well */
struct tlist;
struct tdict;
struct tmacro;
struct tfunc;
struct tloop;

struct tv {
    int k;  /* enum tv_kind */
    union {
        bool b;
        int64_t i;
        double f;
        struct tstr *s;
        struct tlist *l;
        struct tdict *d;         /* TV_DICT and TV_NS */
        struct tmacro *m;
        struct tfunc *fn;
        struct tloop *loop;
        const char *uname;       /* TV_UNDEF: the name that was missing (may be NULL) */
    };
};

struct tlist {
    size_t n, cap;
    struct tv *v;
    bool tuple;
    const char *view;  /* "dict_items"/"dict_keys"/"dict_values": how repr() shows d.items() etc. */
};
struct tdict { size_t n, cap; struct tv *k, *v; };

/* ---- tokens and syntax tree ---- */

enum tok_type {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};

/* Operators as small codes (TK_OP tokens and node ops). */
enum op {
    OP_NONE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_COMMA,
    OP_DOT, OP_COLON, OP_PIPE, OP_ASSIGN, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
    OP_SEMI, OP_IN, OP_NOTIN,
};

struct token {
    int type;      /* enum tok_type */
    int op;        /* TK_OP: enum op */
    int line;
    struct tstr *s;  /* TEXT, NAME, STRING: the (unescaped) text */
    int64_t i;
    double f;
};

enum node_type {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER,
    N_TEST, N_NEG, N_POS, N_NOT, N_BIN, N_CMP, N_AND, N_OR, N_COND, N_CONCAT,
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_WITH,
};

/* One node shape for everything; which fields mean what is listed per type in parse.c. */
struct node {
    int type;           /* enum node_type */
    int op;             /* N_BIN/N_CMP operator(s); N_TEST: 1 = negated */
    int line;
    struct node *a, *b, *c, *d;
    struct node **kids;   /* positional children: list items, args, body statements */
    size_t n_kids;
    struct node **kv;     /* keyword-argument values, dict values, defaults */
    struct tstr **names;  /* keyword-argument names, targets, parameters */
    size_t n_kv, n_names;
    int *ops;             /* N_CMP: one operator per comparison */
    struct tstr *name;    /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO, N_SET (ns attr) */
    struct tv val;        /* N_CONST, N_TEXT (a string) */
};

struct tmpl {
    struct arena ar;
    struct node *root;
    struct tmpl_limits lim;
};

/* lexer.c: tokens into *toks (arena array, TK_EOF-terminated). */
int tmpl_lex(struct arena *ar, const char *src, size_t len, struct token **toks, size_t *n,
             struct err *e);
/* parse.c */
int tmpl_parse_tokens(struct arena *ar, const struct token *toks, size_t n, struct node **root,
                      struct err *e);

/* ---- render context (eval.c, filters.c, methods.c, value.c) ---- */

struct frame {
    struct frame *parent;
    struct tdict vars;
};

struct sbuf { char *p; size_t len, cap; };

struct rctx {
    struct arena ar;
    struct err *e;
    const struct tmpl_limits *lim;
    struct sbuf *out;     /* where output goes now (swapped for captures) */
    uint64_t steps;
    int depth;
    int ctl;              /* 0, or CTL_BREAK / CTL_CONTINUE while unwinding a loop body */
    int line;             /* line of the node being evaluated (for errors) */
    struct frame *globals;
};
enum { CTL_NONE = 0, CTL_BREAK = 1, CTL_CONTINUE = 2 };

struct tmacro {
    const struct node *def;   /* N_MACRO (or the caller body of a call block) */
    struct frame *closure;
    struct tv caller;         /* `caller` inside a macro invoked by {% call %} */
};
struct tfunc {
    const char *name;         /* global function or method name */
    struct tv self;           /* receiver for methods; TV_UNDEF for globals */
};
struct tloop {
    const struct tlist *items;
    size_t i;
};

/* value.c */
int rerr(struct rctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
struct tstr *tstr_new(struct rctx *c, const char *s, size_t len);  /* s NULL: uninitialized; returns NULL with the error set */
struct tv tv_str(struct tstr *s);
struct tv tv_int(int64_t i);
struct tv tv_float(double f);
struct tv tv_bool(bool b);
struct tv tv_none(void);
struct tv tv_undef(const char *name);
struct tlist *tlist_new(struct rctx *c, size_t cap);
int tlist_push(struct rctx *c, struct tlist *l, struct tv v);
struct tdict *tdict_new(struct rctx *c, size_t cap);
int tdict_set(struct rctx *c, struct tdict *d, struct tv k, struct tv v);  /* replaces */
const struct tv *tdict_get(const struct tdict *d, const char *key, size_t klen);
/* Lookup and equality count one step per container visited (c may be NULL: no counting);
 * past the step limit they answer "not found"/false and the render fails at its next step. */
const struct tv *tdict_getv(struct rctx *c, const struct tdict *d, struct tv key);
bool tv_truthy(struct tv v);
bool tv_equal(struct rctx *c, struct tv a, struct tv b);
int tv_compare(struct rctx *c, struct tv a, struct tv b, int *cmp);  /* <, ==, > as -1, 0, 1 */
const char *tv_type_name(struct tv v);
int sbuf_put(struct rctx *c, struct sbuf *b, const char *s, size_t n);
/* Python str() of v appended to b; repr when repr is true. */
int tv_write(struct rctx *c, struct sbuf *b, struct tv v, bool repr);
int tv_to_str(struct rctx *c, struct tv v, struct tstr **out);  /* str(v) */
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys); indent < 0 = None. */
int tv_to_json(struct rctx *c, struct sbuf *b, struct tv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys, int depth);
int tv_from_json(struct rctx *c, const cJSON *j, struct tv *out, int depth);
/* Strings are valid UTF-8 (template source and variables are checked on the way in). */
size_t utf8_invalid_at(const char *s, size_t len);  /* offset of the first bad byte, SIZE_MAX if valid */
size_t utf8_count(const char *s, size_t len);   /* code points */
size_t utf8_offset(const char *s, size_t len, size_t cp);  /* byte offset of code point cp */
void fmt_float(double f, char *buf, size_t cap);  /* Python repr(float) */

/* filters.c: filters and tests */
int bi_filter(struct rctx *c, const char *name, struct tv v, struct tv *args, size_t n_args,
              struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out);
int bi_test(struct rctx *c, const char *name, struct tv v, struct tv *args, size_t n_args,
            bool *out);
/* methods.c: attribute lookup of a method or value on a builtin type (*found false when
 * none), calls, and the global functions */
int bi_getattr(struct rctx *c, struct tv obj, const char *name, size_t len, struct tv *out,
               bool *found);
/* Call a TV_FUNC (global or bound method). */
int bi_call(struct rctx *c, const struct tfunc *fn, struct tv *args, size_t n_args,
            struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out);
bool bi_is_global(const char *name);
/* eval.c: call a macro value (used by map/select on macros and by bi_call for caller()). */
int ev_call_macro(struct rctx *c, const struct tmacro *m, struct tv *args, size_t n_args,
                  struct tstr **kw, struct tv *kwv, size_t n_kw, struct tv *out);
int ev_step(struct rctx *c);
/* Items of a for loop: lists as they are, dict keys, string characters, Undefined empty. */
int tv_iter(struct rctx *c, struct tv v, struct tlist **out);  /* counts one step; error past the limit */
