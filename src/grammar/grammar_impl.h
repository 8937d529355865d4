/*
 * grammar_impl.h: internals shared by the .c files of src/grammar. Not for use outside.
 *
 * A compiled grammar is three things:
 *   schema nodes (schema.c)   the schema as a graph of typed nodes (object,
 *                             array, string, number, literal set, alternatives);
 *                             $ref cycles are edges, so recursion is a cycle
 *   byte tries (trie.c)       sorted byte strings with shared prefixes merged:
 *                             one over the vocabulary's token bytes, small ones
 *                             for enum/const literals and object keys
 *   the matcher (match.c)     a pushdown automaton over bytes: a set of at most
 *                             GM_PAR stacks of frames (parallel states for anyOf),
 *                             each frame a fixed-size value, so a state is copied
 *                             with memcpy and the mask can walk the vocabulary trie
 *                             with one state per depth
 * grammar.c ties them together: compile, the per-generation state, mask, accept.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* ---- bounds (every input is hostile) ---- */

#define GM_MAX_NODES    32768    /* schema nodes (uint16 in frames); 128 tools of ~250 each */
#define GM_MAX_NEST     64       /* schema JSON nesting followed by the compiler */
#define GM_MAX_WORK     100000   /* schema objects visited by one compile */
#define GM_MAX_ENUM     1024     /* values of one enum */
#define GM_MAX_LIT      (1 << 20) /* bytes of all serialized literals and keys */
#define GM_MAX_PROPS    64       /* properties of one object (a 64-bit seen mask) */
#define GM_MAX_ALT      16       /* alternatives of one anyOf after flattening */
#define GM_MAX_REF_CHAIN 32      /* $ref -> $ref -> ... without structure in between */
#define GM_MAX_AFFIX    1024     /* prefix / suffix bytes */
#define GM_DEPTH        32       /* frames of one stack: JSON nesting at run time */
#define GM_PAR          8        /* parallel stacks (anyOf interpretations alive at once) */
/* Numbers: digits are bounded so a model cannot loop on them forever; 15
 * significant digits keep a bounded number's value exact in a double. */
#define GM_NUM_INT_MAX  20
#define GM_NUM_FRAC_MAX 20
#define GM_NUM_EXP_MAX  3
#define GM_NUM_SIG_MAX  15
/* Bounded integers: up to 18 digits, so every value and bound fits an int64. */
#define GM_INT_SIG_MAX  18
/* Bytes of the text between a forced call's name and its arguments: ,"<key>": */
#define GM_CALL_MID_MAX 32
/* ---- byte tries (trie.c) ---- */

/* One node: the strings of sorted[lo, hi) share the node's bytes; the first
 * n_term of them end here. Children are contiguous, sorted by byte. */
struct gtrie_node {
    uint32_t child;     /* index of the first child */
    uint32_t lo, hi;    /* range in the sorted order */
    uint16_t n_child;
    uint16_t n_term;
    uint16_t left;      /* most bytes below this node in its subtree */
    uint8_t byte;       /* the byte leading here (root: 0) */
    uint8_t plain;      /* every string in the subtree is plain (vocab trie) */
};
struct gtrie {
    struct gtrie_node *node;  /* [n_node], node 0 is the root */
    uint32_t n_node, cap;
    uint32_t *order;          /* [n_str] sorted position -> caller's index */
    uint32_t n_str;
};
/* Builds a trie over n strings (s[i], len[i]); order[] gives each sorted
 * position's index i. Equal strings share a node (n_term > 1). Errors:
 * -ERR_NOMEM, -ERR_RANGE (a string over 65535 bytes). */
int gtrie_build(struct gtrie *t, const char *const *s, const uint32_t *len, uint32_t n,
                struct err *e);
void gtrie_deinit(struct gtrie *t);
/* Child of node k reached by byte c, or -1. */
int32_t gtrie_child(const struct gtrie *t, uint32_t k, uint8_t c);

/* ---- schema nodes (schema.c) ---- */

enum gnode_kind {
    GN_OBJECT = 1,
    GN_ARRAY,
    GN_STRING,
    GN_NUMBER,
    GN_LITERAL,   /* one of a set of serialized JSON values (enum, const, true/false/null) */
    GN_ALT,       /* any of alt[] (anyOf, oneOf, type lists, $ref, "any value") */
    GN_CALL,      /* a forced tool call: {"name":<items: literal of names>,"<key>":<alt[i]>} */
};

struct gprop {
    uint16_t node;
    bool required;
};

struct gnode {
    uint8_t kind;                 /* enum gnode_kind */
    bool integer;                 /* number: integer */
    bool lo_strict, hi_strict;    /* number: exclusive bounds */
    bool bounded;                 /* number: lo or hi finite (no exponent then) */
    int32_t addl;                 /* object: node of additional properties, -1 none */
    uint32_t prop0, n_props;      /* object: props[prop0 ..] in key-trie order */
    uint64_t req_mask;            /* object: required properties (bit = prop index) */
    uint32_t trie;                /* object: key trie; literal: value trie (index into lits) */
    int32_t items;                /* array: node for items past prefix, -1 none allowed */
    uint32_t pre0, n_pre;         /* array: prefixItems nodes in list[] */
    uint32_t min_n, max_n;        /* array: items; string: characters */
    double lo, hi;                /* number bounds (-inf, inf when absent) */
    int64_t ilo, ihi;             /* integer: the same bounds, inclusive and exact */
    uint32_t alt0, n_alt;         /* alt: flattened non-alt nodes in list[]; call: the
                                   * arguments' node of each name, in the names' order */
};

struct grammar {
    struct gnode *node;           /* [n_node] */
    uint32_t n_node;
    uint16_t root;                /* the document's node */
    uint16_t any;                 /* "any JSON value" (an alt) */
    struct gprop *prop;           /* [n_prop] */
    uint32_t n_prop;
    uint32_t *list;               /* [n_list] node ids: prefixItems, alternatives */
    uint32_t n_list;
    struct gtrie *lit;            /* [n_lit] literal and key tries */
    uint32_t n_lit;
    uint64_t **lit_mask;          /* [n_lit][n_node of that trie]: terminal bits below (keys) */
    char call_mid[GM_CALL_MID_MAX]; /* a forced call's ,"arguments": ("" when none) */
    uint32_t call_mid_len;
    char *prefix, *suffix;        /* literal text around the document ("" when none) */
    uint32_t prefix_len, suffix_len;
    int32_t *eos;                 /* [n_eos] */
    int n_eos;
    /* the vocabulary */
    const struct grammar_vocab *voc;
    struct grammar_vocab *own_voc; /* built by compile when opts->vocab is NULL */
};

struct grammar_vocab {
    int32_t n_vocab;              /* tokenizer ids: 0 .. n_vocab - 1 */
    char *bytes;                  /* every token's bytes, back to back */
    uint32_t *off, *len;          /* [n_vocab] */
    uint8_t *special;             /* [n_vocab] special added token */
    uint32_t *chars;              /* [n_vocab] characters (UTF-8 lead and ASCII bytes) */
    struct gtrie trie;            /* over the ids with bytes (order[] holds ids) */
};

/* Compiles schema (NULL: opts->calls, else opts->any_object) into g's node tables. */
int gm_schema_compile(struct grammar *g, const cJSON *schema, const struct grammar_opts *opts,
                      struct err *e);
/* Whether some number the matcher can write for node nd lies within its bounds (match.c);
 * the compiler refuses bounds for which none does. */
bool gm_num_satisfiable(const struct gnode *nd);

/* ---- the matcher (match.c) ---- */

enum gframe_kind {
    GF_ROOT = 1,
    GF_OBJ,
    GF_ARR,
    GF_STR,
    GF_NUM,
    GF_LIT,
    GF_CALL,
};

/* One frame; every byte is initialised (states are compared with memcmp). */
struct gframe {
    uint16_t node;    /* schema node (the object's for a key string) */
    uint8_t kind;     /* enum gframe_kind */
    uint8_t phase;
    uint8_t flags;
    uint8_t pend;     /* string: UTF-8 continuation bytes still due */
    uint8_t u8lo, u8hi; /* string: range of the next continuation byte */
    uint32_t a;       /* root: affix position; string: characters; array: items; lit/key: trie node; number: int digits */
    uint32_t b;       /* object: current property (or GM_ADDL); number: fraction digits; key: trie node */
    uint64_t c;       /* object/key: seen mask; number: mantissa */
};
#define GM_ADDL 0xFFFFFFFFu  /* the key is an additional property */

struct gstack {
    uint32_t depth;
    struct gframe f[GM_DEPTH];
};
struct gset {
    uint32_t n;
    struct gstack s[GM_PAR];
};

/* The state before the first byte. */
void gm_start(const struct grammar *g, struct gset *out);
/* out = in advanced by byte c; false when no stack survives. *lit: every
 * surviving stack took c as part of the prefix or suffix text. */
bool gm_step(const struct grammar *g, const struct gset *in, uint8_t c, struct gset *out, bool *lit);
/* Whether some stack has a complete document and suffix. */
bool gm_complete(const struct grammar *g, const struct gset *s);
/* When every stack is inside a plain string (no escape or partial character
 * pending, no known key to track): how many more characters all of them can
 * take (INT64_MAX: unbounded); any plain, self-contained UTF-8 text of at
 * most that many characters keeps them valid. -1 otherwise. */
int64_t gm_plain_room(const struct grammar *g, const struct gset *s);
void gm_set_copy(struct gset *dst, const struct gset *src);
