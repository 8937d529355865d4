/*
 * pretok: the pre-tokenizer stage of tokenizer.json: cutting a normalized
 * segment into words for the model.
 *
 * A pre-tokenizer is a flat list of steps (a Sequence is flattened at
 * load). Each step takes one piece from the step before, may rewrite it
 * (ByteLevel's prefix space, Metaspace's U+2581), then cuts it with a
 * PCRE2 regex (compiled once at load with UTF + UCP, JIT when available)
 * and a delimiter behaviour (Isolated, Removed, MergedWithPrevious/Next,
 * Contiguous), optionally inverted. Every HF pre-tokenizer we support is
 * such a step: Split (regex or literal), ByteLevel (GPT-2 regex), Metaspace
 * (split on U+2581, MergedWithNext), Digits (\p{N}), Punctuation,
 * Whitespace (\w+|[^\w\s]+ kept, the rest removed), WhitespaceSplit,
 * CharDelimiterSplit and BertPreTokenizer (two steps). Pieces flow
 * depth-first through the steps to a callback, so no list of pieces is
 * ever built; each step owns two scratch buffers for one call (its
 * rewritten input and, for ByteLevel, the byte-mapped piece it passes on).
 * A ByteLevel that is the last step leaves the byte mapping to the encoder
 * (tok_pretok.byte_level), which maps only words its cache has not seen.
 *
 * HF runs these regexes with Oniguruma (Split) or Rust's regex crate;
 * PCRE2 agrees on the syntax the published patterns use (\p{L}, \p{N},
 * (?i:...), (?!\S)) and on what \s matches (Unicode White_Space).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* The GPT-2 pre-tokenization regex (openai/gpt-2 encoder.py, also HF's ByteLevel). */
static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust's regex \w and \s (what tokenizers' Whitespace pattern \w+|[^\w\s]+
 * means: Alphabetic, not PCRE2's \p{L}\p{N}) and char::is_whitespace (the
 * White_Space property: PCRE2's \s also takes U+180E). */
#define RUST_W "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"
static const char k_whitespace_regex[] = "[" RUST_W "]+|[^" RUST_W "\\p{White_Space}]+";
static const char k_space_regex[] = "\\p{White_Space}+";

static const char *json_type(const cJSON *j)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* ---- load ---- */

static struct tok_pre_step *new_step(struct tok_pretok *p, enum tok_pre_kind kind,
                                     enum tok_split_behavior b, struct err *e)
{
    if (p->n >= TOK_STEPS_MAX) {
        err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer: more than %d steps", TOK_STEPS_MAX);
        return NULL;
    }
    struct tok_pre_step *s = &p->step[p->n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->behavior = b;
    return s;
}

/* Adds a step splitting by the regex pat (NUL-terminated). */
static int add_regex_step(struct tok_pretok *p, const char *what, const char *pat,
                          enum tok_split_behavior b, bool invert, struct err *e)
{
    struct tok_pre_step *s = new_step(p, TOK_PRE_SPLIT, b, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    s->invert = invert;
    return tok_regex_compile(&s->re, pat, strlen(pat), false, what, e);
}

static int load_bytelevel(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(j, "use_regex");
    struct tok_pre_step *s = new_step(p, TOK_PRE_BYTELEVEL, TOK_SPLIT_ISOLATED, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    s->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space"));
    if (ur && !cJSON_IsTrue(ur))
        return 0;  /* use_regex = false: map bytes only */
    return tok_regex_compile(&s->re, k_gpt2_regex, sizeof k_gpt2_regex - 1, false,
                             "pre_tokenizer ByteLevel", e);
}

static int parse_behavior(const cJSON *j, const char *what, enum tok_split_behavior dflt,
                          enum tok_split_behavior *b, struct err *e)
{
    static const struct {
        const char *name;
        enum tok_split_behavior b;
    } k_b[] = {
        {"Isolated", TOK_SPLIT_ISOLATED},         {"Removed", TOK_SPLIT_REMOVED},
        {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV}, {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
        {"Contiguous", TOK_SPLIT_CONTIGUOUS},
    };
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!v && dflt) {
        *b = dflt;
        return 0;
    }
    if (!cJSON_IsString(v))
        return err_setf(e, ERR_FORMAT, "%s: missing \"behavior\"", what);
    for (size_t i = 0; i < sizeof k_b / sizeof k_b[0]; i++)
        if (strcmp(v->valuestring, k_b[i].name) == 0) {
            *b = k_b[i].b;
            return 0;
        }
    return err_setf(e, ERR_UNSUPPORTED, "%s: behavior '%.64s' is not supported", what,
                    v->valuestring);
}

static int load_split(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    enum tok_split_behavior b;
    int rc;
    if ((rc = parse_behavior(j, "pre_tokenizer Split", 0, &b, e)) < 0)
        return rc;
    struct tok_pre_step *s = new_step(p, TOK_PRE_SPLIT, b, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    s->invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert"));
    return tok_pattern_load(&s->re, cJSON_GetObjectItemCaseSensitive(j, "pattern"),
                            "pre_tokenizer Split", e);
}

/* Metaspace: " " -> replacement, prepend_scheme (or the older
 * add_prefix_space), split on the replacement (default true). */
static int load_metaspace(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(j, "replacement");
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(j, "split");
    int32_t cp;
    struct tok_pre_step *s = new_step(p, TOK_PRE_METASPACE, TOK_SPLIT_MERGED_NEXT, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    if (!cJSON_IsString(rep) || rep->valuestring[0] == '\0' ||
        tok_utf8_check(rep->valuestring, strlen(rep->valuestring)) != strlen(rep->valuestring) ||
        tok_utf8_next(rep->valuestring, strlen(rep->valuestring), &cp) != strlen(rep->valuestring))
        return err_setf(e, ERR_FORMAT, "pre_tokenizer Metaspace: \"replacement\" must be one character");
    s->repl_len = strlen(rep->valuestring);
    memcpy(s->repl, rep->valuestring, s->repl_len);
    s->prepend = TOK_PREPEND_ALWAYS;
    if (cJSON_IsString(scheme)) {
        if (strcmp(scheme->valuestring, "first") == 0)
            s->prepend = TOK_PREPEND_FIRST;
        else if (strcmp(scheme->valuestring, "never") == 0)
            s->prepend = TOK_PREPEND_NEVER;
        else if (strcmp(scheme->valuestring, "always") != 0)
            return err_setf(e, ERR_FORMAT, "pre_tokenizer Metaspace: prepend_scheme '%.32s'",
                            scheme->valuestring);
    }
    if (cJSON_IsFalse(aps))
        s->prepend = TOK_PREPEND_NEVER;
    if (split && !cJSON_IsTrue(split))
        return 0;
    return tok_regex_compile(&s->re, s->repl, s->repl_len, true, "pre_tokenizer Metaspace", e);
}

static int load_simple(struct tok_pretok *p, const char *type, const cJSON *j, struct err *e)
{
    enum tok_split_behavior b;
    int rc;
    if (strcmp(type, "Digits") == 0) {
        bool each = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "individual_digits"));
        return add_regex_step(p, "pre_tokenizer Digits", "\\p{N}",
                              each ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, false, e);
    }
    if (strcmp(type, "Punctuation") == 0) {
        if ((rc = parse_behavior(j, "pre_tokenizer Punctuation", TOK_SPLIT_ISOLATED, &b, e)) < 0)
            return rc;
        return add_regex_step(p, "pre_tokenizer Punctuation", tok_punct_class, b, false, e);
    }
    if (strcmp(type, "Whitespace") == 0)
        return add_regex_step(p, "pre_tokenizer Whitespace", k_whitespace_regex, TOK_SPLIT_REMOVED,
                              true, e);
    if (strcmp(type, "WhitespaceSplit") == 0)
        return add_regex_step(p, "pre_tokenizer WhitespaceSplit", k_space_regex, TOK_SPLIT_REMOVED,
                              false, e);
    if (strcmp(type, "BertPreTokenizer") == 0) {
        if ((rc = add_regex_step(p, "pre_tokenizer BertPreTokenizer", k_space_regex,
                                 TOK_SPLIT_REMOVED, false, e)) < 0)
            return rc;
        return add_regex_step(p, "pre_tokenizer BertPreTokenizer", tok_punct_class,
                              TOK_SPLIT_ISOLATED, false, e);
    }
    if (strcmp(type, "CharDelimiterSplit") == 0) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "delimiter");
        int32_t cp;
        if (!cJSON_IsString(d) || d->valuestring[0] == '\0' ||
            tok_utf8_check(d->valuestring, strlen(d->valuestring)) != strlen(d->valuestring) ||
            tok_utf8_next(d->valuestring, strlen(d->valuestring), &cp) != strlen(d->valuestring))
            return err_setf(e, ERR_FORMAT, "pre_tokenizer CharDelimiterSplit: bad \"delimiter\"");
        struct tok_pre_step *s = new_step(p, TOK_PRE_SPLIT, TOK_SPLIT_REMOVED, e);
        if (!s)
            return -ERR_UNSUPPORTED;
        return tok_regex_compile(&s->re, d->valuestring, strlen(d->valuestring), true,
                                 "pre_tokenizer CharDelimiterSplit", e);
    }
    return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer type '%.64s' is not supported", type);
}

static int pretok_add(struct tok_pretok *p, const cJSON *j, int depth, struct err *e)
{
    const char *type = json_type(j);
    if (!type)
        return err_setf(e, ERR_FORMAT, "pre_tokenizer: missing \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"), *it;
        if (!cJSON_IsArray(list) || depth > 4)
            return err_setf(e, ERR_FORMAT, "pre_tokenizer Sequence: bad \"pretokenizers\"");
        cJSON_ArrayForEach(it, list) {
            int rc = pretok_add(p, it, depth + 1, e);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0)
        return load_bytelevel(p, j, e);
    if (strcmp(type, "Split") == 0)
        return load_split(p, j, e);
    if (strcmp(type, "Metaspace") == 0)
        return load_metaspace(p, j, e);
    return load_simple(p, type, j, e);
}

int tok_pretok_load(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    int rc;
    memset(p, 0, sizeof *p);
    if (!j || cJSON_IsNull(j))
        return 0;
    if ((rc = pretok_add(p, j, 0, e)) < 0)
        return rc;
    /* A trailing ByteLevel leaves its mapping to the encoder (see top). */
    p->byte_level = p->n > 0 && p->step[p->n - 1].kind == TOK_PRE_BYTELEVEL;
    return 0;
}

void tok_pretok_deinit(struct tok_pretok *p)
{
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->step[i].re);
    memset(p, 0, sizeof *p);
}

/* ---- run ---- */

/* One call of tok_pretok_run: the scratch buffers of every step. */
struct pt_run {
    const struct tokenizer *t;
    pcre2_match_data *md;
    tok_word_fn fn;
    void *ctx;
    struct err *e;
    struct tok_buf in[TOK_STEPS_MAX];   /* a step's rewritten input */
    struct tok_buf out[TOK_STEPS_MAX];  /* a ByteLevel step's mapped piece */
};

/* One step in progress over the piece s: pieces it has decided on go to
 * the next step; the MergedWith and Contiguous behaviours hold one piece
 * back (pend) until they know whether the neighbour merges into it. */
struct split_run {
    struct pt_run *run;
    int k;  /* this step's index */
    const char *s;
    bool first;  /* s starts at the start of the original text */
    bool has_pend, pend_match;
    size_t ps, pe;
};

static int run_from(struct pt_run *r, int k, const char *s, size_t len, bool first);

/* Passes s[a, b) on to the next step (byte-mapped first for a ByteLevel
 * step that is not the last). */
static int emit(struct split_run *r, size_t a, size_t b)
{
    struct pt_run *run = r->run;
    const struct tokenizer *t = run->t;
    const struct tok_pretok *p = &t->pretok;
    int rc;
    if (a == b)
        return 0;
    if (p->step[r->k].kind != TOK_PRE_BYTELEVEL || r->k == p->n - 1)
        return run_from(run, r->k + 1, r->s + a, b - a, r->first && a == 0);
    struct tok_buf *o = &run->out[r->k];
    o->n = 0;
    for (size_t i = a; i < b; i++) {
        unsigned char c = (unsigned char)r->s[i];
        if ((rc = tok_buf_put(o, t->bl.enc[c], t->bl.enc_len[c], run->e)) < 0)
            return rc;
    }
    return run_from(run, r->k + 1, o->p, o->n, r->first && a == 0);
}

static int flush(struct split_run *r)
{
    if (!r->has_pend)
        return 0;
    r->has_pend = false;
    return emit(r, r->ps, r->pe);
}

static int hold(struct split_run *r, size_t a, size_t b, bool is_match)
{
    r->has_pend = true;
    r->pend_match = is_match;
    r->ps = a;
    r->pe = b;
    return 0;
}

/* Handles the next piece [a, b) of the step; pieces arrive in order and
 * cover the input. */
static int piece(struct split_run *r, size_t a, size_t b, bool is_match)
{
    int rc;
    if (a == b)
        return 0;
    switch (r->run->t->pretok.step[r->k].behavior) {
    case TOK_SPLIT_ISOLATED:
        return emit(r, a, b);
    case TOK_SPLIT_REMOVED:
        return is_match ? 0 : emit(r, a, b);
    case TOK_SPLIT_MERGED_PREV:  /* a delimiter joins the non-delimiter before it */
        if (!is_match) {
            if ((rc = flush(r)) < 0)
                return rc;
            return hold(r, a, b, false);
        }
        if (r->has_pend && !r->pend_match) {
            r->has_pend = false;
            return emit(r, r->ps, b);
        }
        if ((rc = flush(r)) < 0)
            return rc;
        return emit(r, a, b);
    case TOK_SPLIT_MERGED_NEXT:  /* a delimiter joins the non-delimiter after it */
        if (!is_match && r->has_pend && r->pend_match) {
            r->has_pend = false;
            return emit(r, r->ps, b);
        }
        if ((rc = flush(r)) < 0)
            return rc;
        return is_match ? hold(r, a, b, true) : emit(r, a, b);
    case TOK_SPLIT_CONTIGUOUS:  /* runs of delimiters become one piece */
        if (is_match && r->has_pend) {
            r->pe = b;
            return 0;
        }
        if ((rc = flush(r)) < 0)
            return rc;
        return is_match ? hold(r, a, b, true) : emit(r, a, b);
    }
    return err_setf(r->run->e, ERR_INTERNAL, "pre_tokenizer: bad split behavior");
}

static size_t next_char(const char *s, size_t i, size_t len)
{
    i++;
    while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

static int run_split(struct split_run *r, const pcre2_code *re, bool invert, size_t len)
{
    pcre2_match_data *md = r->run->md;
    size_t pos = 0, gap = 0;
    int rc;
    while (pos < len) {
        int m = pcre2_match(re, (PCRE2_SPTR)r->s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return err_setf(r->run->e, ERR_ARG, "pre_tokenizer regex at byte %zu: %s", pos,
                            (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  /* empty match: no piece, move on one character */
            pos = next_char(r->s, ms, len);
            continue;
        }
        if ((rc = piece(r, gap, ms, invert)) < 0 || (rc = piece(r, ms, me, !invert)) < 0)
            return rc;
        gap = pos = me;
    }
    if ((rc = piece(r, gap, len, invert)) < 0)
        return rc;
    return flush(r);
}

/* Metaspace's rewrite of s into o: every " " becomes the replacement, which
 * is also prepended per the scheme unless s already starts with it. */
static int metaspace_rewrite(const struct tok_pre_step *st, const char *s, size_t len, bool first,
                             struct tok_buf *o, struct err *e)
{
    int rc;
    /* HF tests for the replacement after replacing, so a leading " " counts. */
    bool starts = s[0] == ' ' || (len >= st->repl_len && memcmp(s, st->repl, st->repl_len) == 0);
    bool pre = st->prepend == TOK_PREPEND_ALWAYS || (st->prepend == TOK_PREPEND_FIRST && first);
    o->n = 0;
    if (pre && !starts && (rc = tok_buf_put(o, st->repl, st->repl_len, e)) < 0)
        return rc;
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != ' ')
            continue;
        if ((rc = tok_buf_put(o, s + run, i - run, e)) < 0 ||
            (rc = tok_buf_put(o, st->repl, st->repl_len, e)) < 0)
            return rc;
        run = i + 1;
    }
    return tok_buf_put(o, s + run, len - run, e);
}

static int run_from(struct pt_run *r, int k, const char *s, size_t len, bool first)
{
    const struct tok_pretok *p = &r->t->pretok;
    int rc;
    if (k == p->n)
        return r->fn(r->ctx, s, len);
    const struct tok_pre_step *st = &p->step[k];
    struct tok_buf *in = &r->in[k];
    if (st->kind == TOK_PRE_BYTELEVEL && st->add_prefix_space && s[0] != ' ') {
        in->n = 0;
        if ((rc = tok_buf_put(in, " ", 1, r->e)) < 0 || (rc = tok_buf_put(in, s, len, r->e)) < 0)
            return rc;
        s = in->p;
        len = in->n;
    } else if (st->kind == TOK_PRE_METASPACE) {
        if ((rc = metaspace_rewrite(st, s, len, first, in, r->e)) < 0)
            return rc;
        s = in->p;
        len = in->n;
    }
    struct split_run sr = {.run = r, .k = k, .s = s, .first = first};
    if (!st->re)
        return emit(&sr, 0, len);
    return run_split(&sr, st->re, st->invert, len);
}

int tok_pretok_run(const struct tokenizer *t, pcre2_match_data *md, const char *s, size_t len,
                   bool first, tok_word_fn fn, void *ctx, struct err *e)
{
    struct pt_run r = {.t = t, .md = md, .fn = fn, .ctx = ctx, .e = e};
    if (len == 0)
        return 0;
    int rc = run_from(&r, 0, s, len, first);
    for (int i = 0; i < TOK_STEPS_MAX; i++) {
        free(r.in[i].p);
        free(r.out[i].p);
    }
    return rc;
}
