/*
 * pretok: the normalizer and pre-tokenizer stages of tokenizer.json.
 *
 * Normalizer: NFC/NFD/NFKC/NFKD (utf8proc), alone or in a Sequence. It runs
 * on each text segment between added tokens and produces a new string.
 *
 * Pre-tokenizer: a flat list of steps (a Sequence is flattened at load).
 * A Split step cuts every piece coming from the step before into pieces by
 * a PCRE2 regex (compiled once at load with UTF + UCP, JIT when available)
 * and a delimiter behaviour (Isolated, Removed, MergedWithPrevious/Next,
 * Contiguous), optionally inverted. ByteLevel is a Split with the GPT-2
 * regex (when use_regex) plus a flag telling the encoder to map each final
 * word's bytes to the byte-level alphabet before BPE; since the mapping
 * happens last, a Split after a ByteLevel step would see unmapped text and
 * is rejected as unsupported. Pieces flow depth-first through the steps to
 * a callback, so no list of pieces is ever built.
 *
 * HF runs these regexes with Oniguruma; PCRE2 agrees on the syntax the
 * published patterns use (\p{L}, \p{N}, (?i:...), (?!\S)) and on what \s
 * matches (Unicode White_Space).
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tok_impl.h"

/* The GPT-2 pre-tokenization regex (openai/gpt-2 encoder.py, also HF's ByteLevel). */
static const char k_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *json_type(const cJSON *j)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* ---- normalizer ---- */

static int norm_add(struct tok_norm *nm, const cJSON *j, int depth, struct err *e)
{
    const char *type = json_type(j);
    static const struct {
        const char *name;
        enum tok_norm_kind kind;
    } k_kinds[] = {
        {"NFC", TOK_NORM_NFC}, {"NFD", TOK_NORM_NFD}, {"NFKC", TOK_NORM_NFKC}, {"NFKD", TOK_NORM_NFKD},
    };
    if (!type)
        return err_setf(e, ERR_FORMAT, "normalizer: missing \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers"), *it;
        if (!cJSON_IsArray(list) || depth > 4)
            return err_setf(e, ERR_FORMAT, "normalizer Sequence: bad \"normalizers\"");
        cJSON_ArrayForEach(it, list) {
            int rc = norm_add(nm, it, depth + 1, e);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof k_kinds / sizeof k_kinds[0]; i++) {
        if (strcmp(type, k_kinds[i].name) != 0)
            continue;
        if (nm->n >= TOK_STEPS_MAX)
            return err_setf(e, ERR_UNSUPPORTED, "normalizer: more than %d steps", TOK_STEPS_MAX);
        nm->kind[nm->n++] = k_kinds[i].kind;
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "normalizer type '%.64s' is not supported", type);
}

int tok_norm_load(struct tok_norm *nm, const cJSON *j, struct err *e)
{
    nm->n = 0;
    if (!j || cJSON_IsNull(j))
        return 0;
    return norm_add(nm, j, 0, e);
}

int tok_norm_apply(const struct tok_norm *nm, const char *s, size_t len, char **out,
                   size_t *out_len, struct err *e)
{
    uint8_t *cur = NULL;
    utf8proc_ssize_t n = (utf8proc_ssize_t)len;
    for (int i = 0; i < nm->n; i++) {
        int opt = UTF8PROC_STABLE;
        switch (nm->kind[i]) {
        case TOK_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
        case TOK_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
        case TOK_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
        case TOK_NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
        }
        uint8_t *next = NULL;
        const uint8_t *src = cur ? cur : (const uint8_t *)s;
        n = utf8proc_map(src, n, &next, (utf8proc_option_t)opt);
        free(cur);
        cur = next;
        if (n < 0)
            return err_setf(e, n == UTF8PROC_ERROR_NOMEM ? ERR_NOMEM : ERR_ARG,
                            "normalizer: %s", utf8proc_errmsg(n));
    }
    if (!cur) {  /* no steps: hand back a copy so the caller always frees */
        cur = malloc(len + 1);
        if (!cur)
            return err_setf(e, ERR_NOMEM, "normalizer: %zu bytes", len);
        memcpy(cur, s, len);
        cur[len] = '\0';
    }
    *out = (char *)cur;
    *out_len = (size_t)n;
    return 0;
}

/* ---- pre-tokenizer: load ---- */

static int compile_regex(pcre2_code **out, const char *pat, size_t len, bool literal,
                         struct err *e)
{
    int ec;
    PCRE2_SIZE eoff;
    /* PCRE2_LITERAL admits no UCP (nothing to classify in a literal). */
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opt, &ec, &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer regex '%.64s': %s at offset %zu", pat,
                        (const char *)msg, (size_t)eoff);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

static struct tok_pre_step *new_step(struct tok_pretok *p, struct err *e)
{
    if (p->n >= TOK_STEPS_MAX) {
        err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer: more than %d steps", TOK_STEPS_MAX);
        return NULL;
    }
    struct tok_pre_step *s = &p->step[p->n++];
    memset(s, 0, sizeof *s);
    s->behavior = TOK_SPLIT_ISOLATED;
    return s;
}

static int load_bytelevel(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(j, "use_regex");
    if (cJSON_IsTrue(aps)) {
        if (p->n > 0)
            return err_setf(e, ERR_UNSUPPORTED,
                            "pre_tokenizer: ByteLevel add_prefix_space after another step");
        p->add_prefix_space = true;
    }
    if (p->byte_level)
        return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer: two ByteLevel steps");
    struct tok_pre_step *s = new_step(p, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    s->kind = TOK_PRE_BYTELEVEL;
    p->byte_level = true;
    if (ur && !cJSON_IsTrue(ur))
        return 0;  /* use_regex = false: map bytes only */
    return compile_regex(&s->re, k_gpt2_regex, sizeof k_gpt2_regex - 1, false, e);
}

static int parse_behavior(const cJSON *j, enum tok_split_behavior *b, struct err *e)
{
    static const struct {
        const char *name;
        enum tok_split_behavior b;
    } k_b[] = {
        {"Isolated", TOK_SPLIT_ISOLATED},          {"Removed", TOK_SPLIT_REMOVED},
        {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV}, {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
        {"Contiguous", TOK_SPLIT_CONTIGUOUS},
    };
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "behavior");
    if (!cJSON_IsString(v))
        return err_setf(e, ERR_FORMAT, "pre_tokenizer Split: missing \"behavior\"");
    for (size_t i = 0; i < sizeof k_b / sizeof k_b[0]; i++)
        if (strcmp(v->valuestring, k_b[i].name) == 0) {
            *b = k_b[i].b;
            return 0;
        }
    return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer Split: behavior '%.64s' is not supported",
                    v->valuestring);
}

static int load_split(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *src = cJSON_IsString(rx) ? rx : lit;
    int rc;
    if (p->byte_level)
        return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer: Split after ByteLevel");
    if (!cJSON_IsString(src) || src->valuestring[0] == '\0')
        return err_setf(e, ERR_FORMAT, "pre_tokenizer Split: \"pattern\" needs a Regex or String");
    struct tok_pre_step *s = new_step(p, e);
    if (!s)
        return -ERR_UNSUPPORTED;
    s->kind = TOK_PRE_SPLIT;
    s->invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert"));
    if ((rc = parse_behavior(j, &s->behavior, e)) < 0)
        return rc;
    return compile_regex(&s->re, src->valuestring, strlen(src->valuestring), src == lit, e);
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
    return err_setf(e, ERR_UNSUPPORTED, "pre_tokenizer type '%.64s' is not supported", type);
}

int tok_pretok_load(struct tok_pretok *p, const cJSON *j, struct err *e)
{
    memset(p, 0, sizeof *p);
    if (!j || cJSON_IsNull(j))
        return 0;
    return pretok_add(p, j, 0, e);
}

void tok_pretok_deinit(struct tok_pretok *p)
{
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->step[i].re);
    memset(p, 0, sizeof *p);
}

/* ---- pre-tokenizer: run ---- */

/* One Split step in progress over the piece s: pieces it has decided on go
 * to the next step; the MergedWith and Contiguous behaviours hold one piece
 * back (pend) until
 * they know whether the neighbour merges into it. */
struct split_run {
    const struct tok_pretok *p;
    int k;  /* this step's index */
    pcre2_match_data *md;
    const char *s;
    tok_word_fn fn;
    void *ctx;
    struct err *e;
    bool has_pend, pend_match;
    size_t ps, pe;
};

static int run_from(const struct tok_pretok *p, int k, pcre2_match_data *md, const char *s,
                    size_t len, tok_word_fn fn, void *ctx, struct err *e);

static int emit(struct split_run *r, size_t a, size_t b)
{
    if (a == b)
        return 0;
    return run_from(r->p, r->k + 1, r->md, r->s + a, b - a, r->fn, r->ctx, r->e);
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
    switch (r->p->step[r->k].behavior) {
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
    return err_setf(r->e, ERR_INTERNAL, "pre_tokenizer: bad split behavior");
}

static size_t next_char(const char *s, size_t i, size_t len)
{
    i++;
    while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

static int run_split(struct split_run *r, size_t len)
{
    const struct tok_pre_step *st = &r->p->step[r->k];
    size_t pos = 0, gap = 0;
    int rc;
    while (pos < len) {
        int m = pcre2_match(st->re, (PCRE2_SPTR)r->s, len, pos, PCRE2_NO_UTF_CHECK, r->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return err_setf(r->e, ERR_ARG, "pre_tokenizer regex at byte %zu: %s", pos,
                            (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  /* empty match: no piece, move on one character */
            pos = next_char(r->s, ms, len);
            continue;
        }
        if ((rc = piece(r, gap, ms, st->invert)) < 0 || (rc = piece(r, ms, me, !st->invert)) < 0)
            return rc;
        gap = pos = me;
    }
    if ((rc = piece(r, gap, len, st->invert)) < 0)
        return rc;
    return flush(r);
}

static int run_from(const struct tok_pretok *p, int k, pcre2_match_data *md, const char *s,
                    size_t len, tok_word_fn fn, void *ctx, struct err *e)
{
    if (k == p->n)
        return fn(ctx, s, len);
    if (!p->step[k].re)
        return run_from(p, k + 1, md, s, len, fn, ctx, e);
    struct split_run r = {.p = p, .k = k, .md = md, .s = s, .fn = fn, .ctx = ctx, .e = e};
    return run_split(&r, len);
}

int tok_pretok_run(const struct tok_pretok *p, pcre2_match_data *md, const char *s, size_t len,
                   tok_word_fn fn, void *ctx, struct err *e)
{
    if (len == 0)
        return 0;
    if (!p->add_prefix_space || s[0] == ' ')
        return run_from(p, 0, md, s, len, fn, ctx, e);
    char *buf = malloc(len + 1);
    if (!buf)
        return err_setf(e, ERR_NOMEM, "pre_tokenizer: %zu bytes", len + 1);
    buf[0] = ' ';
    memcpy(buf + 1, s, len);
    int rc = run_from(p, 0, md, buf, len + 1, fn, ctx, e);
    free(buf);
    return rc;
}
