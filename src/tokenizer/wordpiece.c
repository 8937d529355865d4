/*
 * wordpiece: the WordPiece (BERT) and WordLevel models of tokenizer.json.
 *
 * Both read model.vocab ({piece: id}) the way BPE does (tok_bpe_load with
 * no merges fills the piece -> id map and the id table; for WordPiece its
 * continuing_subword_prefix option is BPE's, "##").
 *
 * WordPiece, as tokenizers' WordPiece::tokenize: a word of more than
 * max_input_chars_per_word characters is one unk; otherwise from each
 * position the longest vocab piece that the rest of the word starts with
 * (after the first piece, looked up with the "##" prefix) is taken, and a
 * position where none matches makes the whole word one unk. tokenizers
 * tries ends from the longest down; the longest match is the same thing,
 * found here in one forward pass per position that extends an FNV-1a hash
 * byte by byte (tok_hash_str's) and probes the map at each character
 * boundary, up to the longest piece in the vocab: O(word x longest piece)
 * whatever max_input_chars_per_word says.
 *
 * WordLevel: the word's id, else unk's; unk absent from the vocab is an
 * error, as in tokenizers (only raised when a word needs it).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* ---- load ---- */

int tok_wp_load(struct tokenizer *t, const cJSON *model, const struct tok_vlist *v,
                struct err *e)
{
    int rc;
    if ((rc = tok_bpe_load(t, model, v, (struct tok_span){0}, e)) < 0)
        return rc;
    if (t->model == TOK_MODEL_WORDPIECE &&
        !cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) {
        memcpy(t->bpe.prefix, "##", 3);  /* tokenizers' default */
        t->bpe.prefix_len = 2;
    }
    t->wp_max_chars = 100;  /* tokenizers' default */
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
    if (mc && !cJSON_IsNull(mc)) {
        /* beyond 2^40 characters every text fits: saturate */
        double x = cJSON_IsNumber(mc) ? mc->valuedouble : -1;
        if (x > 1099511627776.0)
            x = 1099511627776.0;
        if (x < 0 || x != (double)(int64_t)x)
            return err_setf(e, ERR_FORMAT, "model.max_input_chars_per_word: expected an integer >= 0");
        t->wp_max_chars = (size_t)x;
    }
    t->wp_max_piece = t->wp_piece_chars = 0;
    for (size_t i = 0; i < v->n; i++) {
        size_t nc = 0;
        for (uint32_t k = 0; k < v->len[i]; k++)
            nc += ((unsigned char)t->pool.buf[v->off[i] + k] & 0xC0) != 0x80;
        if (v->len[i] > t->wp_max_piece)
            t->wp_max_piece = v->len[i];
        if (nc > t->wp_piece_chars)
            t->wp_piece_chars = nc;
    }
    return 0;
}

/* ---- encode ---- */

static int push_unk(const struct tokenizer *t, const char *model, struct tok_ids *out,
                    struct err *e)
{
    if (t->bpe.unk_id < 0)
        return err_setf(e, ERR_FORMAT, "%s: unk_token is missing from the vocabulary", model);
    return tok_ids_push(out, t->bpe.unk_id, e);
}

static uint32_t fnv_feed(uint32_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

/* Id of (pre + s[0..len)) in the vocab, whose hash is h, or -1. */
static int32_t lookup2(const struct tokenizer *t, const char *pre, size_t plen, const char *s,
                       size_t len, uint32_t h)
{
    const struct tok_strmap *m = &t->bpe.vocab;
    if (!m->slots)
        return -1;
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_strslot *sl = &m->slots[i];
        if (sl->id < 0)
            return -1;
        const char *p = t->pool.buf + sl->off;
        if (sl->hash == h && sl->len == plen + len && memcmp(p, pre, plen) == 0 &&
            memcmp(p + plen, s, len) == 0)
            return sl->id;
    }
}

int tok_wp_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                struct err *e)
{
    size_t n_chars = 0, n0 = out->n;
    int rc;
    for (size_t i = 0; i < len; i++)
        n_chars += ((unsigned char)w[i] & 0xC0) != 0x80;
    if (n_chars > t->wp_max_chars)
        return push_unk(t, "WordPiece", out, e);
    for (size_t start = 0; start < len;) {
        const char *pre = start > 0 ? t->bpe.prefix : "";
        size_t plen = start > 0 ? t->bpe.prefix_len : 0, best_end = 0;
        int32_t best = -1;
        uint32_t h = fnv_feed(2166136261u, pre, plen);
        size_t chars = 0;  /* of pre + the candidate, bounded by the longest piece */
        for (size_t k = 0; k < plen; k++)
            chars += ((unsigned char)pre[k] & 0xC0) != 0x80;
        for (size_t k = start; k < len && plen + (k - start) < t->wp_max_piece &&
                               chars < t->wp_piece_chars; k++) {
            h = fnv_feed(h, w + k, 1);
            if (k + 1 < len && ((unsigned char)w[k + 1] & 0xC0) == 0x80)
                continue;  /* not a character boundary */
            chars++;
            int32_t id = lookup2(t, pre, plen, w + start, k + 1 - start, h);
            if (id >= 0) {
                best = id;
                best_end = k + 1;
            }
        }
        if (best < 0) {  /* the whole word becomes one unk */
            out->n = n0;
            return push_unk(t, "WordPiece", out, e);
        }
        if ((rc = tok_ids_push(out, best, e)) < 0)
            return rc;
        start = best_end;
    }
    return 0;
}

int tok_wl_word(const struct tokenizer *t, const char *w, size_t len, struct tok_ids *out,
                struct err *e)
{
    int32_t id = tok_strmap_get(&t->bpe.vocab, &t->pool, w, len);
    if (id >= 0)
        return tok_ids_push(out, id, e);
    return push_unk(t, "WordLevel", out, e);
}
