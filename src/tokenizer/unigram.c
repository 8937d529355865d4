/*
 * unigram: the Unigram model of tokenizer.json (SentencePiece unigram as
 * XLM-R, T5, ALBERT checkpoints have it), exactly as tokenizers' Unigram.
 *
 * Load: model.vocab is a list of [piece, score] pairs; a piece's id is its
 * position. unk_id (null or an index into the list) and byte_fallback come
 * with it. Pieces listed twice keep every id in the id table, but lookups
 * give the last one, as tokenizers' token_to_ids map does.
 *
 * Encode one word (tokenizers' encode_optimized): a best-path lattice over
 * the word's bytes. From each character boundary, every vocab piece the rest
 * of the word starts with is an edge scored with the piece's score (found
 * here by extending an FNV-1a hash byte by byte up to the longest piece and
 * probing the piece map at each character boundary, where tokenizers walks
 * a trie: same edges, same order); when no piece covers exactly the next
 * character, an edge of one character with the unk id and score
 * min(score) - 10 is added. A node keeps the first best score it is offered
 * (strictly greater wins), in that order, so ties resolve as tokenizers'.
 * Backtracking from the end, consecutive unk nodes (also a literal match of
 * the unk piece) fuse into one string; then each string is looked up: found
 * -> its id, else with byte_fallback its bytes' <0xXX> pieces when all
 * exist, else unk.
 *
 * Cost: O(word x longest piece) time (probes bounded by the longest piece
 * in bytes and in characters), 16 bytes of lattice per byte;
 * encode.c cuts words longer than TOK_WORD_MAX as it does for BPE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* tokenizers' K_UNK_PENALTY: an unknown character scores this far below the
 * worst piece, so any path of known pieces beats it. */
#define UNI_UNK_PENALTY 10.0

/* ---- load ---- */

static size_t span_pos(struct tok_span sp, const struct tok_jcur *c)
{
    return (size_t)(c->p - sp.p);
}

static int vlist_grow(struct tok_vlist *v, double **scores, size_t *cap, struct err *e)
{
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
    double *ns = realloc(*scores, nc * sizeof *ns);
    if (ns)
        *scores = ns;
    if (!no || !nl || !ni || !ns)
        return err_setf(e, ERR_NOMEM, "model.vocab: %zu entries", nc);
    *cap = nc;
    return 0;
}

/* Reads one [piece, score] pair at c into key and *score. */
static int read_pair(struct tok_jcur *c, struct tok_buf *key, double *score, size_t i,
                     struct err *e)
{
    int rc;
    if (!tok_json_lit(c, '['))
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: expected [piece, score]", i);
    if ((rc = tok_json_string(c, key, e)) < 0)
        return rc;
    if (!tok_json_lit(c, ','))
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: expected ','", i);
    if (tok_json_number(c, score, NULL) < 0 || *score != *score || *score > 1e300 || *score < -1e300)
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: score must be a finite number", i);
    if (!tok_json_lit(c, ']'))
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: expected ']'", i);
    if (key->n > TOK_PIECE_MAX)
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: piece of %zu bytes (max %d)", i, key->n,
                        TOK_PIECE_MAX);
    if (tok_utf8_check(key->p, key->n) != key->n)
        return err_setf(e, ERR_FORMAT, "model.vocab[%zu]: piece is not valid UTF-8", i);
    return 0;
}

int tok_uni_read_vocab(struct tokenizer *t, struct tok_span sp, struct tok_vlist *v,
                       double **scores, struct err *e)
{
    struct tok_jcur c = {sp.p, sp.p ? sp.p + sp.len : NULL};
    struct tok_buf key = {0};
    size_t cap = 0;
    int rc = 0;
    memset(v, 0, sizeof *v);
    v->max_id = -1;
    *scores = NULL;
    if (sp.p && (rc = tok_pool_reserve(&t->pool, sp.len, e)) < 0)
        return rc;
    if (!sp.p || !tok_json_lit(&c, '['))
        return err_setf(e, ERR_FORMAT, "model.vocab: expected a list of [piece, score]");
    if (tok_json_lit(&c, ']'))
        return err_setf(e, ERR_FORMAT, "model.vocab: empty (tokenizers: EmptyVocabulary)");
    do {
        double score;
        uint32_t off;
        if (v->n >= TOK_ID_LIMIT) {
            rc = err_setf(e, ERR_FORMAT, "model.vocab: more than %d pieces", TOK_ID_LIMIT);
            break;
        }
        if ((rc = read_pair(&c, &key, &score, v->n, e)) < 0)
            break;
        if (v->n == cap && (rc = vlist_grow(v, scores, &cap, e)) < 0)
            break;
        if ((rc = tok_pool_add(&t->pool, key.p, key.n, &off, e)) < 0)
            break;
        v->off[v->n] = off;
        v->len[v->n] = (uint32_t)key.n;
        v->id[v->n] = (int32_t)v->n;
        (*scores)[v->n] = score;
        v->max_id = (int32_t)v->n;
        v->n++;
    } while (tok_json_lit(&c, ','));
    if (rc == 0 && !tok_json_lit(&c, ']'))
        rc = err_setf(e, ERR_FORMAT, "expected ',' or ']'");
    if (rc < 0)
        err_prefix(e, "model.vocab at byte %zu of the value", span_pos(sp, &c));
    free(key.p);
    return rc;
}

/* Puts piece -> id, the later id winning for a repeated piece. */
static int map_put_last(struct tok_strmap *m, const struct tok_pool *p, uint32_t off,
                        uint32_t len, int32_t id, struct err *e)
{
    int rc = tok_strmap_put(m, p, off, len, id);
    if (rc < 0)
        return err_setf(e, ERR_INTERNAL, "model.vocab: hash table full");
    if (rc == 0)
        return 0;
    uint32_t h = tok_hash_str(p->buf + off, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct tok_strslot *sl = &m->slots[i];
        if (sl->hash == h && sl->len == len && memcmp(p->buf + sl->off, p->buf + off, len) == 0) {
            sl->id = id;
            return 0;
        }
    }
}

int tok_uni_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                 double *scores, struct err *e)
{
    struct tok_unigram *u = &t->uni;
    double min_score = 0;
    int rc;
    u->score = scores;
    u->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsNumber(unk) || unk->valuedouble < 0 || unk->valuedouble >= (double)v->n ||
            unk->valuedouble != (int32_t)unk->valuedouble)
            return err_setf(e, ERR_FORMAT, "model.unk_id: must be an index into the %zu pieces",
                            v->n);
        u->unk_id = (int32_t)unk->valuedouble;
    }
    const cJSON *bf = cJSON_GetObjectItemCaseSensitive(model, "byte_fallback");
    u->byte_fallback = cJSON_IsTrue(bf);
    t->bpe.unk_id = u->unk_id;
    if ((rc = tok_strmap_init(&t->bpe.vocab, v->n, e)) < 0)
        return rc;
    for (size_t i = 0; i < v->n; i++) {
        if ((rc = map_put_last(&t->bpe.vocab, &t->pool, v->off[i], v->len[i], v->id[i], e)) < 0)
            return rc;
        t->entry[v->id[i]] = (struct tok_entry){v->off[i], v->len[i], TOK_E_MODEL};
        if (i == 0 || scores[i] < min_score)
            min_score = scores[i];
        if (v->len[i] > u->max_piece)
            u->max_piece = v->len[i];
        size_t nc = 0;
        for (uint32_t k = 0; k < v->len[i]; k++)
            nc += ((unsigned char)t->pool.buf[v->off[i] + k] & 0xC0) != 0x80;
        if (nc > u->max_chars)
            u->max_chars = nc;
    }
    u->unk_score = min_score - UNI_UNK_PENALTY;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->bpe.byte_tok[b] = tok_strmap_get(&t->bpe.vocab, &t->pool, name, 6);
    }
    return 0;
}

void tok_uni_deinit(struct tok_unigram *u)
{
    free(u->score);
    memset(u, 0, sizeof *u);
}

/* ---- encode ---- */

struct uni_node {
    double score;    /* best path score up to here */
    int32_t start;   /* where the best edge into here starts; -1: none yet */
    int32_t id;
};

static uint32_t fnv_byte(uint32_t h, unsigned char b)
{
    return (h ^ b) * 16777619u;
}

/* Id of s[0..len) (hash h) in the piece map, or -1. */
static int32_t map_get_h(const struct tokenizer *t, const char *s, size_t len, uint32_t h)
{
    const struct tok_strmap *m = &t->bpe.vocab;
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_strslot *sl = &m->slots[i];
        if (sl->id < 0)
            return -1;
        if (sl->hash == h && sl->len == len && memcmp(t->pool.buf + sl->off, s, len) == 0)
            return sl->id;
    }
}

static void offer(struct uni_node *n, double score, int32_t start, int32_t id)
{
    if (n->start < 0 || score > n->score) {
        n->score = score;
        n->start = start;
        n->id = id;
    }
}

/* Fills the lattice nodes [0..len] of w. */
static int viterbi(const struct tokenizer *t, const char *w, size_t len, struct uni_node *nodes,
                   struct err *e)
{
    const struct tok_unigram *u = &t->uni;
    for (size_t i = 0; i <= len; i++)
        nodes[i] = (struct uni_node){0, -1, -1};
    for (size_t s = 0; s < len;) {
        size_t mblen = 1;
        while (s + mblen < len && ((unsigned char)w[s + mblen] & 0xC0) == 0x80)
            mblen++;
        double base = nodes[s].score;
        bool single = false;
        uint32_t h = 2166136261u;
        size_t chars = 0;
        for (size_t k = s; k < len && k - s < u->max_piece && chars < u->max_chars; k++) {
            h = fnv_byte(h, (unsigned char)w[k]);
            if (k + 1 < len && ((unsigned char)w[k + 1] & 0xC0) == 0x80)
                continue;
            chars++;
            int32_t id = map_get_h(t, w + s, k + 1 - s, h);
            if (id < 0)
                continue;
            offer(&nodes[k + 1], u->score[id] + base, (int32_t)s, id);
            single |= k + 1 - s == mblen;
        }
        if (!single) {
            if (u->unk_id < 0)
                return err_setf(e, ERR_FORMAT,
                                "Unigram: unknown character at byte %zu of a word and no unk_id", s);
            offer(&nodes[s + mblen], u->unk_score + base, (int32_t)s, u->unk_id);
        }
        s += mblen;
    }
    return 0;
}

/* Appends the ids of piece string s (an element of the backtracked path). */
static int emit_piece(const struct tokenizer *t, const char *s, size_t len, struct tok_ids *out,
                      struct err *e)
{
    int32_t id = tok_strmap_get(&t->bpe.vocab, &t->pool, s, len);
    int rc;
    if (id >= 0)
        return tok_ids_push(out, id, e);
    if (t->uni.byte_fallback) {
        bool all = true;
        for (size_t i = 0; i < len && all; i++)
            all = t->bpe.byte_tok[(unsigned char)s[i]] >= 0;
        for (size_t i = 0; i < len && all; i++)
            if ((rc = tok_ids_push(out, t->bpe.byte_tok[(unsigned char)s[i]], e)) < 0)
                return rc;
        if (all)
            return 0;
    }
    if (t->uni.unk_id < 0)
        return err_setf(e, ERR_FORMAT, "Unigram: unknown piece and no unk_id");
    return tok_ids_push(out, t->uni.unk_id, e);
}

int tok_uni_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                 struct err *e)
{
    int rc;
    if (len == 0)
        return 0;
    if (len >= INT32_MAX)
        return err_setf(e, ERR_RANGE, "Unigram: word of %zu bytes", len);
    struct uni_node *nodes = malloc((len + 1) * sizeof *nodes);
    /* the path's pieces, backwards: [start, end) pairs */
    size_t *cuts = malloc(2 * (len + 1) * sizeof *cuts);
    size_t n_cuts = 0;
    if (!nodes || !cuts) {
        rc = err_setf(e, ERR_NOMEM, "Unigram: lattice of %zu bytes", len);
        goto out;
    }
    if ((rc = viterbi(t, w, len, nodes, e)) < 0)
        goto out;
    /* backtrack, fusing runs of unk nodes into one piece */
    bool last_unk = false;
    for (size_t end = len; end > 0;) {
        const struct uni_node *nd = &nodes[end];
        size_t start = (size_t)nd->start;
        bool unk = t->uni.unk_id >= 0 && nd->id == t->uni.unk_id;
        if (unk && last_unk) {
            cuts[2 * (n_cuts - 1)] = start;  /* the run grows leftwards */
        } else {
            cuts[2 * n_cuts] = start;
            cuts[2 * n_cuts + 1] = end;
            n_cuts++;
        }
        last_unk = unk;
        end = start;
    }
    for (size_t i = n_cuts; i-- > 0 && rc == 0;)
        rc = emit_piece(t, w + cuts[2 * i], cuts[2 * i + 1] - cuts[2 * i], out, e);
out:
    free(nodes);
    free(cuts);
    return rc;
}
