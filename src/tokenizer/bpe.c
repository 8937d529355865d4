/*
 * bpe: the BPE model of a tokenizer.json (model.type = "BPE").
 *
 * Load: model.vocab ({piece: id}) fills the id table and a piece -> id hash
 * table; model.merges (either "a b" strings or ["a", "b"] pairs, rank =
 * position in the list) becomes a hash table from the id pair (a, b) to
 * (rank, id of "ab"). Resolving merges to ids once at load means encoding
 * never builds or hashes merged strings.
 *
 * Encode one word: split it into characters (each looked up in the vocab;
 * unknown ones go to <0xXX> byte pieces when byte_fallback is on, else to
 * unk, else are dropped, as Hugging Face does), then repeatedly merge the
 * adjacent pair of lowest rank, leftmost first on ties. Symbols form a
 * doubly linked list over an array and candidate merges sit in a binary
 * min-heap keyed by (rank, position); a candidate whose symbols changed
 * since it was pushed is stale and skipped when popped. That is
 * O(n log n) per word, so a 1 MB word without spaces stays fast.
 * With ignore_merges (Llama 3), a word that is itself a vocab piece is
 * emitted as one token without merging. continuing_subword_prefix and
 * end_of_word_suffix (subword-nmt style vocabs) are added to characters
 * before lookup, and a merge's result is "a" + "b" without b's prefix, as
 * in HF. dropout is ignored: inference is deterministic.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

struct bpe_sym {
    int32_t id;    /* -1 once merged into its left neighbour */
    int32_t prev;  /* index of the previous live symbol, -1 at the start */
    int32_t next;  /* index of the next live symbol, -1 at the end */
};

/* A candidate merge of symbols pos and right, valid while they still hold
 * lid and rid and are still neighbours. */
struct bpe_cand {
    int32_t rank;
    int32_t pos;
    int32_t right;
    int32_t lid, rid;
    int32_t new_id;
};

/* ---- load ---- */

static bool opt_bool(const cJSON *obj, const char *key, bool dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

/* Copies an optional affix string (null or absent: ""). */
static int load_affix(const cJSON *model, const char *key, char *out, size_t *len, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(model, key);
    *len = 0;
    out[0] = '\0';
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsString(j))
        return err_setf(e, ERR_FORMAT, "model.%s: expected a string or null", key);
    size_t n = strlen(j->valuestring);
    if (n > TOK_AFFIX_MAX)
        return err_setf(e, ERR_UNSUPPORTED, "model.%s: %zu bytes (max %d)", key, n, TOK_AFFIX_MAX);
    memcpy(out, j->valuestring, n + 1);
    *len = n;
    return 0;
}

static int load_options(struct tok_bpe *b, const cJSON *model, struct err *e)
{
    int rc;
    /* dropout only matters for training-time sampling; HF's encode with
     * dropout set is random, and inference checkpoints leave it null. It is
     * ignored here (deterministic merges), but must still be a probability. */
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble >= 0 && dropout->valuedouble <= 1))
        return err_setf(e, ERR_FORMAT, "model.dropout: expected null or a number in [0, 1]");
    if ((rc = load_affix(model, "continuing_subword_prefix", b->prefix, &b->prefix_len, e)) < 0)
        return rc;
    if ((rc = load_affix(model, "end_of_word_suffix", b->suffix, &b->suffix_len, e)) < 0)
        return rc;
    b->fuse_unk = opt_bool(model, "fuse_unk", false);
    b->byte_fallback = opt_bool(model, "byte_fallback", false);
    b->ignore_merges = opt_bool(model, "ignore_merges", false);
    return 0;
}

/* ---- model.vocab ---- */

void tok_vlist_deinit(struct tok_vlist *v)
{
    free(v->off);
    free(v->len);
    free(v->id);
    memset(v, 0, sizeof *v);
}

static int vlist_push(struct tok_vlist *v, size_t *cap, uint32_t off, uint32_t len, int32_t id,
                      struct err *e)
{
    if (v->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 1024;
        uint32_t *no = realloc(v->off, nc * sizeof *no);
        if (no)
            v->off = no;
        uint32_t *nl = realloc(v->len, nc * sizeof *nl);
        if (nl)
            v->len = nl;
        int32_t *ni = realloc(v->id, nc * sizeof *ni);
        if (ni)
            v->id = ni;
        if (!no || !nl || !ni)
            return err_setf(e, ERR_NOMEM, "model.vocab: %zu entries", nc);
        *cap = nc;
    }
    v->off[v->n] = off;
    v->len[v->n] = len;
    v->id[v->n] = id;
    v->n++;
    if (id > v->max_id)
        v->max_id = id;
    return 0;
}

static size_t span_at(struct tok_span sp, const struct tok_jcur *c)
{
    return (size_t)(c->p - sp.p);
}

int tok_bpe_read_vocab(struct tokenizer *t, struct tok_span sp, struct tok_vlist *v,
                       struct err *e)
{
    struct tok_jcur c = {sp.p, sp.p ? sp.p + sp.len : NULL};
    struct tok_buf key = {0};
    size_t cap = 0;
    int rc = 0;
    memset(v, 0, sizeof *v);
    v->max_id = -1;
    /* the pieces take less room than their JSON: one pool allocation */
    if (sp.p && (rc = tok_pool_reserve(&t->pool, sp.len, e)) < 0)
        return rc;
    if (!sp.p || !tok_json_lit(&c, '{'))
        return err_setf(e, ERR_FORMAT, "model.vocab: expected an object of piece -> id");
    if (tok_json_lit(&c, '}'))
        return err_setf(e, ERR_FORMAT, "model.vocab: missing or empty");
    do {
        double x;
        uint32_t off;
        if ((rc = tok_json_string(&c, &key, e)) < 0 ||
            (!tok_json_lit(&c, ':') && (rc = err_setf(e, ERR_FORMAT, "expected ':'")) < 0))
            break;
        if (tok_json_number(&c, &x, NULL) < 0 || x < 0 || x >= TOK_ID_LIMIT || x != (int32_t)x) {
            rc = err_setf(e, ERR_FORMAT, "model.vocab['%.64s']: id must be an integer in [0, %d)",
                          key.p, TOK_ID_LIMIT);
            goto out;
        }
        if (key.n > TOK_PIECE_MAX) {
            rc = err_setf(e, ERR_FORMAT, "model.vocab id %d: piece of %zu bytes (max %d)",
                          (int32_t)x, key.n, TOK_PIECE_MAX);
            goto out;
        }
        if (tok_utf8_check(key.p, key.n) != key.n) {
            rc = err_setf(e, ERR_FORMAT, "model.vocab id %d: piece is not valid UTF-8", (int32_t)x);
            goto out;
        }
        if ((rc = tok_pool_add(&t->pool, key.p, key.n, &off, e)) < 0 ||
            (rc = vlist_push(v, &cap, off, (uint32_t)key.n, (int32_t)x, e)) < 0)
            goto out;
    } while (tok_json_lit(&c, ','));
    if (rc == 0 && !tok_json_lit(&c, '}'))
        rc = err_setf(e, ERR_FORMAT, "expected ',' or '}'");
    if (rc < 0)
        err_prefix(e, "model.vocab at byte %zu of the value", span_at(sp, &c));
out:
    free(key.p);
    return rc;
}

/* Fills the id table (sized by the caller) and the piece map from v. */
static int load_vocab(struct tokenizer *t, const struct tok_vlist *v, struct err *e)
{
    struct tok_bpe *b = &t->bpe;
    int rc;
    if ((rc = tok_strmap_init(&b->vocab, v->n, e)) < 0)
        return rc;
    for (size_t i = 0; i < v->n; i++) {
        int32_t id = v->id[i];
        const char *piece = t->pool.buf + v->off[i];
        if (t->entry[id].flags & TOK_E_MODEL)
            return err_setf(e, ERR_FORMAT, "model.vocab: id %d used twice ('%.64s')", id, piece);
        rc = tok_strmap_put(&b->vocab, &t->pool, v->off[i], v->len[i], id);
        if (rc > 0)
            return err_setf(e, ERR_FORMAT, "model.vocab: piece '%.64s' listed twice", piece);
        if (rc < 0)
            return err_setf(e, ERR_INTERNAL, "model.vocab: hash table full");
        t->entry[id] = (struct tok_entry){v->off[i], v->len[i], TOK_E_MODEL};
    }
    return 0;
}

static int32_t vocab_get(const struct tokenizer *t, const char *s, size_t len)
{
    return tok_strmap_get(&t->bpe.vocab, &t->pool, s, len);
}

/* ---- model.merges ---- */

/* Reads merges[i] at c: "a b" into (a, la, b, lb), both within buf, or
 * ["a", "b"] into a and b. */
static int read_merge(struct tok_jcur *c, size_t i, struct tok_buf *a, struct tok_buf *b,
                      struct err *e)
{
    int rc = 0;
    if (tok_json_lit(c, '[')) {
        if ((rc = tok_json_string(c, a, e)) < 0 || !tok_json_lit(c, ',') ||
            (rc = tok_json_string(c, b, e)) < 0 || !tok_json_lit(c, ']'))
            goto fail_syntax;
        return 0;
    }
    if ((rc = tok_json_string(c, a, e)) < 0)
        goto fail_syntax;
    char *sp = memchr(a->p, ' ', a->n);
    if (!sp || memchr(sp + 1, ' ', a->n - (size_t)(sp + 1 - a->p)))
        return err_setf(e, ERR_FORMAT, "model.merges[%zu] '%.64s': expected \"a b\"", i, a->p);
    b->n = 0;
    if ((rc = tok_buf_put(b, sp + 1, a->n - (size_t)(sp + 1 - a->p), e)) < 0)
        return rc;
    a->n = (size_t)(sp - a->p);
    a->p[a->n] = '\0';
    return 0;

fail_syntax:  /* out of memory is reported as such, not as a syntax error */
    if (rc == -ERR_NOMEM)
        return rc;
    return err_setf(e, ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
}

/* Resolves one merge (a, b) to ids and puts it in the pair map with rank i. */
static int add_merge(struct tokenizer *t, size_t i, const struct tok_buf *a,
                     const struct tok_buf *bb, struct err *e)
{
    struct tok_bpe *b = &t->bpe;
    char buf[2 * TOK_PIECE_MAX + 1];
    const char *sb = bb->p;
    size_t la = a->n, lb = bb->n;
    int32_t ia = vocab_get(t, a->p, la), ib = vocab_get(t, sb, lb);
    if (ia < 0 || ib < 0)
        return err_setf(e, ERR_FORMAT, "model.merges[%zu]: '%.64s' is not in the vocab", i,
                        ia < 0 ? a->p : sb);
    /* HF drops the continuing_subword_prefix of the right part. */
    if (b->prefix_len) {
        if (lb < b->prefix_len || memcmp(sb, b->prefix, b->prefix_len) != 0)
            return err_setf(e, ERR_FORMAT, "model.merges[%zu]: '%.64s' lacks the prefix '%s'", i,
                            sb, b->prefix);
        sb += b->prefix_len;
        lb -= b->prefix_len;
    }
    /* Both parts are vocab pieces, so each is <= TOK_PIECE_MAX bytes. */
    memcpy(buf, a->p, la);
    memcpy(buf + la, sb, lb);
    int32_t iab = vocab_get(t, buf, la + lb);
    if (iab < 0)
        return err_setf(e, ERR_FORMAT, "model.merges[%zu]: merged piece '%.*s' is not in the vocab",
                        i, (int)(la + lb > 64 ? 64 : la + lb), buf);
    if (tok_pairmap_put(&b->merges, ia, ib, (int32_t)i, iab) < 0)
        return err_setf(e, ERR_INTERNAL, "model.merges: hash table full");
    return 0;
}

/* Counts the elements of the merges array (for the table size): the commas
 * at depth 1, outside strings; an upper bound for malformed input. */
static size_t count_merges(struct tok_span sp)
{
    size_t n = 1;
    int depth = 0;
    for (size_t i = 0; i < sp.len; i++) {
        char ch = sp.p[i];
        if (ch == '"') {
            for (i++; i < sp.len && sp.p[i] != '"'; i++)
                i += sp.p[i] == '\\';
        } else if (ch == '[' || ch == '{') {
            depth++;
        } else if (ch == ']' || ch == '}') {
            depth--;
        } else if (ch == ',' && depth == 1) {
            n++;
        }
    }
    return n;
}

static int load_merges(struct tokenizer *t, struct tok_span sp, struct err *e)
{
    struct tok_bpe *b = &t->bpe;
    struct tok_jcur c = {sp.p, sp.p ? sp.p + sp.len : NULL};
    struct tok_buf ba = {0}, bb = {0};
    size_t i = 0;
    int rc = 0;
    if (!sp.p || (sp.len == 4 && memcmp(sp.p, "null", 4) == 0))
        return tok_pairmap_init(&b->merges, 0, e);
    if (!tok_json_lit(&c, '['))
        return err_setf(e, ERR_FORMAT, "model.merges: expected an array");
    if ((rc = tok_pairmap_init(&b->merges, count_merges(sp), e)) < 0)
        return rc;
    if (tok_json_lit(&c, ']'))
        return 0;
    do {
        if ((rc = read_merge(&c, i, &ba, &bb, e)) < 0 || (rc = add_merge(t, i, &ba, &bb, e)) < 0)
            break;
        i++;
    } while (tok_json_lit(&c, ','));
    if (rc == 0 && !tok_json_lit(&c, ']'))
        rc = err_setf(e, ERR_FORMAT, "model.merges: expected ',' or ']' at byte %zu of the value",
                      span_at(sp, &c));
    free(ba.p);
    free(bb.p);
    return rc;
}

int tok_bpe_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                 struct tok_span merges, struct err *e)
{
    struct tok_bpe *b = &t->bpe;
    int rc;
    b->unk_id = -1;
    if ((rc = load_options(b, model, e)) < 0)
        return rc;
    if ((rc = load_vocab(t, v, e)) < 0)
        return rc;
    if ((rc = load_merges(t, merges, e)) < 0)
        return rc;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk))
        b->unk_id = vocab_get(t, unk->valuestring, strlen(unk->valuestring));
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_tok[i] = vocab_get(t, name, 6);
    }
    return 0;
}

void tok_bpe_deinit(struct tok_bpe *b)
{
    tok_strmap_deinit(&b->vocab);
    tok_pairmap_deinit(&b->merges);
}

void tok_bpe_scratch_deinit(struct tok_bpe_scratch *s)
{
    free(s->sym);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

/* ---- encode one word ---- */

static int scratch_reserve(struct tok_bpe_scratch *s, size_t n, struct err *e)
{
    if (n > s->cap_sym) {
        struct bpe_sym *ns = realloc(s->sym, n * sizeof *ns);
        if (!ns)
            return err_setf(e, ERR_NOMEM, "BPE scratch: %zu symbols", n);
        s->sym = ns;
        s->cap_sym = n;
    }
    /* n - 1 initial candidates plus at most two per merge (n - 1 merges). */
    size_t nh = 3 * n;
    if (nh > s->cap_heap) {
        struct bpe_cand *nc = realloc(s->heap, nh * sizeof *nc);
        if (!nc)
            return err_setf(e, ERR_NOMEM, "BPE scratch: %zu candidates", nh);
        s->heap = nc;
        s->cap_heap = nh;
    }
    return 0;
}

/* Word text is valid UTF-8 (checked at the encode entry), so the lead byte
 * gives the length. */
static size_t char_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Looks up one character c (cl bytes) of a word with the affixes HF adds:
 * the prefix unless it is the first character, the suffix when it is the
 * last. The affixed string goes to key (*klen bytes). */
static int32_t char_lookup(const struct tokenizer *t, const char *c, size_t cl, bool first,
                           bool last, char *key, size_t *klen)
{
    const struct tok_bpe *b = &t->bpe;
    size_t n = 0;
    if (!first && b->prefix_len) {
        memcpy(key, b->prefix, b->prefix_len);
        n = b->prefix_len;
    }
    memcpy(key + n, c, cl);
    n += cl;
    if (last && b->suffix_len) {
        memcpy(key + n, b->suffix, b->suffix_len);
        n += b->suffix_len;
    }
    *klen = n;
    return vocab_get(t, key, n);
}

/* Splits w into initial symbols; returns their count. As HF: a character
 * not in the vocab becomes the <0xXX> tokens of its (affixed) bytes with
 * byte_fallback, else unk (one per run of unknown characters with
 * fuse_unk), else nothing. A pending unk is written out only when the next
 * known character comes (or at the end), so a byte-fallback character
 * right after an unknown one lands before its unk, exactly as HF orders it. */
static size_t initial_symbols(const struct tokenizer *t, struct bpe_sym *sym, const char *w,
                              size_t len)
{
    const struct tok_bpe *b = &t->bpe;
    char key[TOK_AFFIX_MAX * 2 + 8];
    size_t n = 0, klen;
    bool unk_pending = false;
    for (size_t i = 0; i < len;) {
        size_t cl = char_len((unsigned char)w[i]);
        if (cl > len - i)
            cl = len - i;
        int32_t id = char_lookup(t, w + i, cl, i == 0, i + cl == len, key, &klen);
        i += cl;
        if (id >= 0) {
            if (unk_pending)
                sym[n++].id = b->unk_id;
            unk_pending = false;
            sym[n++].id = id;
            continue;
        }
        bool fallback = b->byte_fallback;
        for (size_t k = 0; fallback && k < klen; k++)
            fallback = b->byte_tok[(unsigned char)key[k]] >= 0;
        if (fallback) {
            for (size_t k = 0; k < klen; k++)
                sym[n++].id = b->byte_tok[(unsigned char)key[k]];
            continue;
        }
        if (b->unk_id < 0)
            continue;
        if (unk_pending && !b->fuse_unk)
            sym[n++].id = b->unk_id;
        unk_pending = true;
    }
    if (unk_pending)
        sym[n++].id = b->unk_id;
    for (size_t k = 0; k < n; k++) {
        sym[k].prev = (int32_t)k - 1;
        sym[k].next = k + 1 < n ? (int32_t)k + 1 : -1;
    }
    return n;
}

static bool cand_less(const struct bpe_cand *x, const struct bpe_cand *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(struct bpe_cand *h, size_t *n, struct bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct bpe_cand heap_pop(struct bpe_cand *h, size_t *n)
{
    struct bpe_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c]))
            c++;
        if (!cand_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Pushes the merge of pos with its right neighbour, when there is one. */
static void push_pair(const struct tokenizer *t, const struct bpe_sym *sym, struct bpe_cand *h,
                      size_t *nh, int32_t pos)
{
    if (pos < 0 || sym[pos].next < 0)
        return;
    int32_t r = sym[pos].next;
    const struct tok_pairslot *m = tok_pairmap_get(&t->bpe.merges, sym[pos].id, sym[r].id);
    if (m)
        heap_push(h, nh, (struct bpe_cand){m->rank, pos, r, sym[pos].id, sym[r].id, m->id});
}

int tok_bpe_word(const struct tokenizer *t, struct tok_bpe_scratch *s, const char *w, size_t len,
             struct tok_ids *out, struct err *e)
{
    int rc;
    if (len == 0)
        return 0;
    if (t->bpe.ignore_merges) {
        int32_t id = vocab_get(t, w, len);
        if (id >= 0)
            return tok_ids_push(out, id, e);
    }
    /* Byte fallback turns a character into up to its affixed bytes. */
    size_t cap = len * (1 + t->bpe.prefix_len) + t->bpe.suffix_len + 1;
    if ((rc = scratch_reserve(s, cap, e)) < 0)
        return rc;
    struct bpe_sym *sym = s->sym;
    size_t n = initial_symbols(t, sym, w, len), nh = 0;
    for (size_t k = 0; k + 1 < n; k++)
        push_pair(t, sym, s->heap, &nh, (int32_t)k);
    while (nh > 0) {
        struct bpe_cand c = heap_pop(s->heap, &nh);
        struct bpe_sym *l = &sym[c.pos], *r = &sym[c.right];
        if (l->id != c.lid || l->next != c.right || r->id != c.rid)
            continue;  /* stale: a neighbour merged since this was pushed */
        l->id = c.new_id;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = c.pos;
        r->id = -1;
        push_pair(t, sym, s->heap, &nh, l->prev);
        push_pair(t, sym, s->heap, &nh, c.pos);
    }
    for (int32_t k = n ? 0 : -1; k >= 0; k = sym[k].next)
        if ((rc = tok_ids_push(out, sym[k].id, e)) < 0)
            return rc;
    return 0;
}
