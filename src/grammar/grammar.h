/*
 * grammar: structured output. A JSON Schema (or "any JSON value/object" for
 * response_format json_object) is compiled against a tokenizer into an
 * immutable grammar; a grammar_state per generation is an engine constraint
 * (constraint.h): it masks every token whose bytes cannot continue a valid
 * document and advances with the chosen one, so the output always parses and
 * validates. Optional literal prefix and suffix text surround the document
 * (tool-call wrappers such as "<tool_call>\n" ... "\n</tool_call>"); once the
 * suffix is complete only end-of-sequence ids are allowed.
 *
 * Supported schema subset (anything else is -ERR_ARG naming the keyword):
 * type (incl. arrays of types), properties, required, additionalProperties
 * (false / true / schema), items, prefixItems, minItems/maxItems, enum,
 * const, string minLength/maxLength, pattern-free strings, integer/number
 * with minimum/maximum (bounds checked where a prefix decides them), anyOf /
 * oneOf, $ref to local "#/$defs/..." or "#/definitions/..." with a depth bound,
 * nested objects and arrays. Every input is hostile: schema size, nesting,
 * enum size, $ref depth and compile work are bounded (struct grammar_limits);
 * exceeding one is an error, never a hang. Masking costs a bounded time per
 * token (a trie over the vocabulary's byte strings, walked with the state).
 *
 * The output language, precisely (grammar_impl.h, match.c, schema.c):
 *   - compact JSON: no whitespace anywhere, so the model cannot loop on it;
 *   - object keys in any order, each at most once; '}' only once every
 *     required key is there; with additionalProperties false only the listed
 *     keys; keys are written as cJSON escapes them, additional keys without
 *     backslash escapes;
 *   - enum/const values byte for byte as cJSON_PrintUnformatted writes them;
 *   - strings: valid UTF-8, JSON escapes, no \u0000 and no surrogate escapes;
 *     min/maxLength count code points (an escape is one);
 *   - numbers: at most 20 integer, 20 fraction and 3 exponent digits; with a
 *     bound, no exponent and at most 15 digits in all (18 for integers), and
 *     every digit is allowed only while some completion with those digits
 *     lies within the bounds, decided exactly: integers in 64-bit integer
 *     arithmetic (an integer bound must be exact in a double: |bound| < 2^53,
 *     or beyond every 18-digit integer), numbers on the decimal grid as a
 *     double-based validator reads them. Bounds that no such number meets
 *     are refused when the schema is compiled (-ERR_ARG naming the path);
 *   - oneOf is treated as anyOf (the output matches at least one), allOf only
 *     with one schema, "format" and other annotations are ignored;
 *   - nesting at run time is at most 32 levels (GM_DEPTH); a schema whose
 *     every document is deeper leaves only end of sequence allowed.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/err.h"
#include "../engine/constraint.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tokenizer;

/* One function of a forced tool call (grammar_opts.calls). */
struct grammar_call {
    const char *name;      /* the function's name: the call's "name" value */
    const cJSON *params;   /* its parameters schema (NULL: any object); the root that its
                            * own "#/..." references resolve against */
    const char *where;     /* how errors name the schema, e.g. "tools[3].function.parameters" */
};

struct grammar_opts {
    const char *prefix;          /* literal text before the document (NULL: none) */
    const char *suffix;          /* literal text after it (NULL: none) */
    const int32_t *eos_ids;      /* ids allowed once the output is complete */
    int n_eos;
    bool any_object;             /* schema NULL: any JSON object (json_object mode) */
    /* Optional, borrowed: the tokenizer's byte trie from grammar_vocab_new, shared by
     * every grammar compiled for that tokenizer (it must outlive them). NULL: compile
     * builds a private one (~0.1 s for a 150k vocabulary). */
    const struct grammar_vocab *vocab;
    /* Optional: a forced tool call instead of a schema (schema NULL): the document is
     * {"name":<one of calls[].name>,"<args_key>":<that call's parameters>}, name first,
     * so the arguments follow the schema of the name written. Each call's schema is
     * compiled against its own root; names must differ. */
    const struct grammar_call *calls;
    int n_calls;                 /* 1 .. GRAMMAR_MAX_CALLS */
    const char *args_key;        /* "arguments" (NULL) or "parameters" */
};

/* The most functions one forced call chooses among (the server's tool limit). */
#define GRAMMAR_MAX_CALLS 128

struct grammar;
struct grammar_state;
struct grammar_vocab;

/* The vocabulary side of masking, built once per tokenizer: every token's output bytes
 * (tok_token_bytes) in a byte trie. Immutable, may be shared by threads; borrows
 * nothing from tok. -ERR_NOMEM. */
int grammar_vocab_new(struct grammar_vocab **out, const struct tokenizer *tok, struct err *e);
void grammar_vocab_free(struct grammar_vocab *v);

/* Compile schema (NULL with opts->any_object) for tok. -ERR_ARG for an unsupported or
 * invalid schema (the message names the keyword and its JSON pointer), -ERR_RANGE for a
 * bound exceeded, -ERR_NOMEM. The grammar is immutable and may be shared by threads. */
int grammar_compile(struct grammar **out, const cJSON *schema, const struct tokenizer *tok,
                    const struct grammar_opts *opts, struct err *e);
void grammar_free(struct grammar *g);

int grammar_state_new(struct grammar_state **out, const struct grammar *g, struct err *e);
void grammar_state_free(struct grammar_state *s);
/* Whether the document (and suffix) is complete, or ended. */
bool grammar_state_complete(const struct grammar_state *s);
/* Whether the output ended where nothing but end of sequence was left although the document
 * was unfinished (every completion deeper than GM_DEPTH): the text does not validate, and
 * the server says so (finish_reason "length", never "stop"). */
bool grammar_state_cut(const struct grammar_state *s);

/* The constraint_ops whose state is a struct grammar_state *. */
extern const struct constraint_ops grammar_constraint_ops;

#ifdef __cplusplus
}
#endif
