/*
 * grammar: compile (schema.c + the vocabulary trie), the per-generation
 * state, and the constraint ops the sampler calls.
 *
 * Masking walks the vocabulary trie depth first with one matcher state per
 * depth (walk[d] = walk[d-1] advanced by the node's byte), so tokens sharing
 * a prefix share its work, and a byte the grammar refuses drops the whole
 * subtree. Inside a plain string (no escape or partial character pending,
 * room for the subtree's longest token) a subtree whose tokens are all plain
 * text (no quote, backslash or control byte, complete UTF-8) is allowed
 * without walking it: that is where most of a large vocabulary is.
 *
 * Token rules: a token with no bytes is never allowed (it would loop without
 * progress); special added tokens only when every byte of theirs is prefix
 * or suffix text (a tool-call marker), never inside the document;
 * end-of-sequence ids only when the document and the suffix are complete,
 * or when nothing else is possible (a schema whose every completion is
 * deeper than GM_DEPTH: the output then ends early rather than hang).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "tokenizer/tokenizer.h"

#define GM_MAX_EOS 64

/* ---- vocabulary ---- */

static bool is_plain(const char *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)p[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return false;
    }
    size_t need;
    for (uint32_t i = 0; i < n;) {  /* complete, valid UTF-8 */
        if ((uint8_t)p[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = tok_utf8_seq((const unsigned char *)p + i, n - i, &need);
        if (!need || k != need)
            return false;
        i += (uint32_t)k;
    }
    return n > 0;
}

int grammar_vocab_new(struct grammar_vocab **out, const struct tokenizer *tok, struct err *e)
{
    struct grammar_vocab *v = calloc(1, sizeof *v);
    char *buf = malloc(TOK_TOKEN_BYTES_MAX);
    const char **s = NULL;
    uint32_t *np = NULL;
    size_t cap = 0, used = 0;
    int rc = 0;
    *out = NULL;
    if (!v || !buf)
        goto nomem;
    v->n_vocab = tok_vocab_size(tok);
    size_t n = (size_t)v->n_vocab;
    v->off = calloc(n + 1, sizeof *v->off);
    v->len = calloc(n + 1, sizeof *v->len);
    v->special = calloc(n + 1, 1);
    v->chars = calloc(n + 1, sizeof *v->chars);
    s = calloc(n + 1, sizeof *s);
    np = calloc(n + 2, sizeof *np);
    if (!v->off || !v->len || !v->special || !v->chars || !s || !np)
        goto nomem;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        int len = tok_token_bytes(tok, id, buf, TOK_TOKEN_BYTES_MAX);
        if (len == -ERR_NOMEM)
            goto nomem;
        if (len < 0)
            len = 0;  /* a hole */
        if (used + (size_t)len > cap) {
            size_t nc = cap ? 2 * cap : 1 << 20;
            while (nc < used + (size_t)len)
                nc *= 2;
            char *nb = realloc(v->bytes, nc);
            if (!nb)
                goto nomem;
            v->bytes = nb;
            cap = nc;
        }
        memcpy(v->bytes + used, buf, (size_t)len);
        v->off[id] = (uint32_t)used;
        v->len[id] = (uint32_t)len;
        v->special[id] = tok_is_special(tok, id);
        for (int i = 0; i < len; i++)
            v->chars[id] += ((uint8_t)buf[i] & 0xC0) != 0x80;
        used += (size_t)len;
    }
    for (size_t id = 0; id < n; id++)
        s[id] = v->bytes ? v->bytes + v->off[id] : "";
    if ((rc = gtrie_build(&v->trie, s, v->len, (uint32_t)n, e)) < 0)
        goto fail;
    /* node plain = no non-plain token in its range (prefix counts over the sorted order) */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = v->trie.order[i];
        np[i + 1] = np[i] + !(!v->special[id] && is_plain(v->bytes + v->off[id], v->len[id]));
    }
    for (uint32_t k = 0; k < v->trie.n_node; k++)
        v->trie.node[k].plain = np[v->trie.node[k].hi] == np[v->trie.node[k].lo];
    free(s);
    free(np);
    free(buf);
    *out = v;
    return 0;
nomem:
    rc = err_setf(e, ERR_NOMEM, "grammar: vocabulary of %d tokens", v ? v->n_vocab : 0);
fail:
    free(s);
    free(np);
    free(buf);
    grammar_vocab_free(v);
    return rc;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v)
        return;
    gtrie_deinit(&v->trie);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->special);
    free(v->chars);
    free(v);
}

/* ---- compile ---- */

static int copy_affix(char **dst, uint32_t *len, const char *src, const char *what, struct err *e)
{
    size_t n = src ? strlen(src) : 0;
    if (n > GM_MAX_AFFIX)
        return err_setf(e, ERR_RANGE, "grammar: %s of %zu bytes (at most %d)", what, n, GM_MAX_AFFIX);
    if (!(*dst = malloc(n + 1)))
        return err_setf(e, ERR_NOMEM, "grammar: out of memory");
    memcpy(*dst, src ? src : "", n + 1);
    *len = (uint32_t)n;
    return 0;
}

int grammar_compile(struct grammar **out, const cJSON *schema, const struct tokenizer *tok,
                    const struct grammar_opts *opts, struct err *e)
{
    static const struct grammar_opts k_none = {0};
    int rc;
    *out = NULL;
    if (!opts)
        opts = &k_none;
    if (!schema && !opts->any_object && opts->n_calls <= 0)
        return err_setf(e, ERR_ARG, "grammar: no schema");
    if (opts->n_eos < 0 || opts->n_eos > GM_MAX_EOS || (opts->n_eos > 0 && !opts->eos_ids))
        return err_setf(e, ERR_RANGE, "grammar: %d end-of-sequence ids (at most %d)", opts->n_eos, GM_MAX_EOS);
    struct grammar *g = calloc(1, sizeof *g);
    if (!g)
        return err_setf(e, ERR_NOMEM, "grammar: out of memory");
    if ((rc = copy_affix(&g->prefix, &g->prefix_len, opts->prefix, "prefix", e)) < 0 ||
        (rc = copy_affix(&g->suffix, &g->suffix_len, opts->suffix, "suffix", e)) < 0)
        goto fail;
    if (!(g->eos = malloc((size_t)(opts->n_eos + 1) * sizeof *g->eos))) {
        rc = err_setf(e, ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    for (int i = 0; i < opts->n_eos; i++)
        if (opts->eos_ids[i] >= 0 && opts->eos_ids[i] < tok_vocab_size(tok))
            g->eos[g->n_eos++] = opts->eos_ids[i];
    if (g->n_eos == 0 && tok_eos_id(tok) >= 0)
        g->eos[g->n_eos++] = tok_eos_id(tok);
    if ((rc = gm_schema_compile(g, schema, opts, e)) < 0)
        goto fail;
    g->voc = opts->vocab;
    if (!g->voc) {
        if ((rc = grammar_vocab_new(&g->own_voc, tok, e)) < 0)
            goto fail;
        g->voc = g->own_voc;
    }
    *out = g;
    return 0;
fail:
    grammar_free(g);
    return rc;
}

void grammar_free(struct grammar *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_lit; i++) {
        gtrie_deinit(&g->lit[i]);
        free(g->lit_mask[i]);
    }
    free(g->lit);
    free(g->lit_mask);
    free(g->node);
    free(g->prop);
    free(g->list);
    free(g->prefix);
    free(g->suffix);
    free(g->eos);
    grammar_vocab_free(g->own_voc);
    free(g);
}

/* ---- state ---- */

struct grammar_state {
    const struct grammar *g;
    struct gset cur;
    bool done;          /* an end-of-sequence id was accepted */
    bool stuck;         /* the last mask found nothing but end of sequence */
    bool cut;           /* the end of sequence came when stuck: the document is unfinished */
    uint32_t max_depth; /* the longest token's bytes */
    struct gset *walk;  /* [max_depth + 1] one state per trie depth */
    bool *lit;          /* [max_depth + 1] every byte so far was prefix/suffix text */
    uint8_t *allowed;   /* [n_vocab] */
    uint32_t *stack;    /* DFS stack: (node, depth) pairs */
    size_t cap_stack;
};

int grammar_state_new(struct grammar_state **out, const struct grammar *g, struct err *e)
{
    struct grammar_state *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return err_setf(e, ERR_NOMEM, "grammar: out of memory");
    s->g = g;
    s->max_depth = g->voc->trie.node[0].left;
    s->cap_stack = 2 * (256 * (size_t)(s->max_depth + 1) + 1);
    s->walk = malloc((size_t)(s->max_depth + 2) * sizeof *s->walk);
    s->lit = malloc((size_t)(s->max_depth + 2) * sizeof *s->lit);
    s->allowed = malloc((size_t)g->voc->n_vocab + 1);
    s->stack = malloc(s->cap_stack * sizeof *s->stack);
    if (!s->walk || !s->lit || !s->allowed || !s->stack) {
        uint32_t depth = s->max_depth;
        grammar_state_free(s);
        return err_setf(e, ERR_NOMEM, "grammar: state for tokens of %u bytes", depth);
    }
    gm_start(g, &s->cur);
    *out = s;
    return 0;
}

void grammar_state_free(struct grammar_state *s)
{
    if (!s)
        return;
    free(s->walk);
    free(s->lit);
    free(s->allowed);
    free(s->stack);
    free(s);
}

bool grammar_state_cut(const struct grammar_state *s)
{
    /* stuck: the last mask left only end of sequence (the engine may stop on it without
     * handing it to accept) */
    return s->cut || s->stuck;
}

bool grammar_state_complete(const struct grammar_state *s)
{
    return s->done || gm_complete(s->g, &s->cur);
}

/* ---- mask ---- */

/* Marks the tokens below node nd (depth d, all plain) whose characters past
 * the node's d bytes are at most room. */
static size_t mark_fitting(struct grammar_state *s, const struct gtrie_node *nd, uint32_t d, int64_t room)
{
    const struct grammar_vocab *v = s->g->voc;
    const struct gtrie *t = &v->trie;
    const uint8_t *p = (const uint8_t *)v->bytes + v->off[t->order[nd->lo]];
    size_t n = 0;
    int64_t pc = 0;
    for (uint32_t i = 0; i < d; i++)
        pc += (p[i] & 0xC0) != 0x80;
    for (uint32_t i = nd->lo; i < nd->hi; i++) {
        uint32_t id = t->order[i];
        if ((int64_t)v->chars[id] - pc <= room) {
            s->allowed[id] = 1;
            n++;
        }
    }
    return n;
}

/* Marks allowed[] for every token that can follow the current state. */
static size_t walk_vocab(struct grammar_state *s)
{
    const struct grammar *g = s->g;
    const struct grammar_vocab *v = g->voc;
    const struct gtrie *t = &v->trie;
    size_t sp = 0, n_ok = 0;
    const struct gtrie_node *root = &t->node[0];
    s->lit[0] = true;
    for (uint32_t c = 0; c < root->n_child; c++) {
        s->stack[sp++] = root->child + c;
        s->stack[sp++] = 1;
    }
    while (sp > 0) {
        uint32_t d = s->stack[--sp], k = s->stack[--sp];
        const struct gtrie_node *nd = &t->node[k];
        const struct gset *prev = d == 1 ? &s->cur : &s->walk[d - 1];
        bool lit;
        if (!gm_step(g, prev, nd->byte, &s->walk[d], &lit))
            continue;
        s->lit[d] = s->lit[d - 1] && lit;
        int64_t room = nd->plain ? gm_plain_room(g, &s->walk[d]) : -1;
        if (room >= nd->left) {
            for (uint32_t i = nd->lo; i < nd->hi; i++)
                s->allowed[t->order[i]] = 1;
            n_ok += nd->hi - nd->lo;
            continue;
        }
        if (room >= 0) {  /* plain tokens, as long as their characters fit */
            n_ok += mark_fitting(s, nd, d, room);
            continue;
        }
        for (uint32_t i = nd->lo; i < nd->lo + nd->n_term; i++) {
            uint32_t id = t->order[i];
            if (v->special[id] && !s->lit[d])
                continue;
            s->allowed[id] = 1;
            n_ok++;
        }
        for (uint32_t c = 0; c < nd->n_child && sp + 2 <= s->cap_stack; c++) {
            s->stack[sp++] = nd->child + c;
            s->stack[sp++] = d + 1;
        }
    }
    return n_ok;
}

static void grammar_mask(void *state, float *logits, int n_vocab)
{
    struct grammar_state *s = state;
    const struct grammar *g = s->g;
    int32_t nv = g->voc->n_vocab;
    size_t n_ok = 0;
    memset(s->allowed, 0, (size_t)nv);
    if (!s->done)
        n_ok = walk_vocab(s);
    bool end = s->done || gm_complete(g, &s->cur);
    for (int i = 0; i < g->n_eos; i++) {  /* eos ids only as end of sequence */
        n_ok -= s->allowed[g->eos[i]];
        s->allowed[g->eos[i]] = 0;
    }
    s->stuck = n_ok == 0 && !end;
    for (int i = 0; i < g->n_eos; i++)
        s->allowed[g->eos[i]] = end || s->stuck;
    for (int i = 0; i < n_vocab; i++)
        if (i >= nv || !s->allowed[i])
            logits[i] = -INFINITY;
}

static bool is_eos(const struct grammar *g, int32_t id)
{
    for (int i = 0; i < g->n_eos; i++)
        if (g->eos[i] == id)
            return true;
    return false;
}

static int grammar_accept(void *state, int32_t id)
{
    struct grammar_state *s = state;
    const struct grammar *g = s->g;
    const struct grammar_vocab *v = g->voc;
    if (s->done)
        return -ERR_ARG;
    if (is_eos(g, id)) {
        bool complete = gm_complete(g, &s->cur);
        if (!s->stuck && !complete)
            return -ERR_ARG;
        s->cut = !complete;
        s->done = true;
        return 0;
    }
    if (id < 0 || id >= v->n_vocab || v->len[id] == 0 || v->len[id] > s->max_depth)
        return -ERR_ARG;
    const uint8_t *p = (const uint8_t *)v->bytes + v->off[id];
    const struct gset *prev = &s->cur;
    bool all_lit = true, lit;
    for (uint32_t i = 0; i < v->len[id]; i++) {
        struct gset *next = &s->walk[i % 2 + 1];
        if (!gm_step(g, prev, p[i], next, &lit))
            return -ERR_ARG;
        all_lit = all_lit && lit;
        prev = next;
    }
    if (v->special[id] && !all_lit)
        return -ERR_ARG;
    gm_set_copy(&s->cur, prev);
    s->stuck = false;
    return 0;
}

const struct constraint_ops grammar_constraint_ops = {
    .mask = grammar_mask,
    .accept = grammar_accept,
};
