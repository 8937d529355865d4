/*
 * tables: the containers the tokenizer is built from, plus UTF-8 helpers.
 *
 * Vocab lookups happen once per character and once per candidate merge, so
 * they go through open-addressing hash tables with linear probing, sized
 * once at load for a known key count (load factor <= 2/3; no rehashing,
 * no deletion). String keys live in one append-only pool and are addressed
 * by offset so the pool can grow while tables refer to it.
 *
 * The UTF-8 helpers follow the Unicode "maximal subpart" rule (the one Rust's
 * String::from_utf8_lossy uses, and so Hugging Face's decoders): an invalid
 * sequence is replaced by one U+FFFD per maximal prefix of a valid sequence,
 * or per lone byte. Overlongs, surrogates and code points > U+10FFFF are
 * invalid (the second-byte ranges below exclude them).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* ---- growable byte buffers ---- */

/* Make the array whose pointer is at bufp (a T **, read and written with
 * memcpy so no pointer type is aliased) hold at least need elements of elem
 * bytes, doubling the capacity from first; -1 (array unchanged) when out of
 * memory. */
static int vec_reserve(void *bufp, size_t *cap, size_t need, size_t first, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : first;
    while (c < need && c <= SIZE_MAX / 2 / elem)
        c *= 2;
    if (c < need)
        return -1;
    void *old, *nb;
    memcpy(&old, bufp, sizeof old);
    if (!(nb = realloc(old, c * elem)))
        return -1;
    memcpy(bufp, &nb, sizeof nb);
    *cap = c;
    return 0;
}

/* ---- string pool ---- */

int tok_pool_add(struct tok_pool *p, const char *s, size_t len, uint32_t *off, struct err *e)
{
    if (len >= UINT32_MAX || p->n > UINT32_MAX - len - 1)
        return err_setf(e, ERR_RANGE, "tokenizer string pool over 4 GiB");
    if (vec_reserve(&p->buf, &p->cap, p->n + len + 1, 4096, 1) < 0)
        return err_setf(e, ERR_NOMEM, "tokenizer string pool: %zu bytes", p->n + len + 1);
    memcpy(p->buf + p->n, s, len);
    p->buf[p->n + len] = '\0';
    *off = (uint32_t)p->n;
    p->n += len + 1;
    return 0;
}

int tok_pool_reserve(struct tok_pool *p, size_t extra, struct err *e)
{
    if (extra >= UINT32_MAX || p->n > UINT32_MAX - extra)
        return err_setf(e, ERR_RANGE, "tokenizer string pool over 4 GiB");
    if (p->n + extra <= p->cap)
        return 0;
    char *nb = realloc(p->buf, p->n + extra);
    if (!nb)
        return err_setf(e, ERR_NOMEM, "tokenizer string pool: %zu bytes", p->n + extra);
    p->buf = nb;
    p->cap = p->n + extra;
    return 0;
}

void tok_pool_deinit(struct tok_pool *p)
{
    free(p->buf);
    memset(p, 0, sizeof *p);
}

/* ---- string -> id map ---- */

/* FNV-1a: keys are short (a few bytes), so a simple byte loop is enough. */
uint32_t tok_hash_str(const char *s, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* Load factor at most 2/3: linear probing stays short, and the tables of a
 * 150k-entry vocab are half the size (fewer fresh pages to fault in at load). */
static size_t table_cap(size_t n_max)
{
    return pow2_at_least(n_max + n_max / 2 + 1);
}

int tok_strmap_init(struct tok_strmap *m, size_t n_max, struct err *e)
{
    size_t cap = table_cap(n_max);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots)
        return err_setf(e, ERR_NOMEM, "vocab hash table: %zu slots", cap);
    for (size_t i = 0; i < cap; i++)
        m->slots[i].id = -1;
    m->mask = cap - 1;
    m->n = 0;
    m->n_max = n_max;
    return 0;
}

void tok_strmap_deinit(struct tok_strmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int tok_strmap_put(struct tok_strmap *m, const struct tok_pool *p, uint32_t off, uint32_t len,
                   int32_t id)
{
    const char *s = p->buf + off;
    uint32_t h = tok_hash_str(s, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        struct tok_strslot *sl = &m->slots[i];
        if (sl->id < 0) {
            if (m->n >= m->n_max)
                return -ERR_INTERNAL;
            sl->hash = h;
            sl->id = id;
            sl->off = off;
            sl->len = len;
            m->n++;
            return 0;
        }
        if (sl->hash == h && sl->len == len && memcmp(p->buf + sl->off, s, len) == 0)
            return sl->id + 1;
    }
}

int32_t tok_strmap_get(const struct tok_strmap *m, const struct tok_pool *p, const char *s,
                       size_t len)
{
    if (!m->slots)
        return -1;
    uint32_t h = tok_hash_str(s, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_strslot *sl = &m->slots[i];
        if (sl->id < 0)
            return -1;
        if (sl->hash == h && sl->len == len && memcmp(p->buf + sl->off, s, len) == 0)
            return sl->id;
    }
}

/* ---- pair -> (rank, id) map ---- */

/* splitmix64 finalizer: pair keys are structured (small ids), so mix well. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)(a + 1) << 32) | (uint32_t)b;
}

int tok_pairmap_init(struct tok_pairmap *m, size_t n_max, struct err *e)
{
    size_t cap = table_cap(n_max);
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return err_setf(e, ERR_NOMEM, "merge hash table: %zu slots", cap);
    m->mask = cap - 1;
    m->n = 0;
    m->n_max = n_max;
    return 0;
}

void tok_pairmap_deinit(struct tok_pairmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t k = pair_key(a, b);
    for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
        struct tok_pairslot *sl = &m->slots[i];
        if (sl->key == 0) {
            if (m->n >= m->n_max)
                return -ERR_INTERNAL;
            sl->key = k;
            sl->rank = rank;
            sl->id = id;
            m->n++;
            return 0;
        }
        if (sl->key == k)
            return 1;
    }
}

const struct tok_pairslot *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b)
{
    if (!m->slots)
        return NULL;
    uint64_t k = pair_key(a, b);
    for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
        const struct tok_pairslot *sl = &m->slots[i];
        if (sl->key == k)
            return sl;
        if (sl->key == 0)
            return NULL;
    }
}

/* ---- id vector ---- */

int tok_ids_append(struct tok_ids *v, const int32_t *ids, size_t n, struct err *e)
{
    if (vec_reserve(&v->v, &v->cap, v->n + n, 64, sizeof *v->v) < 0)
        return err_setf(e, ERR_NOMEM, "token id buffer: %zu ids", v->n + n);
    memcpy(v->v + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

int tok_ids_push(struct tok_ids *v, int32_t id, struct err *e)
{
    if (v->n < v->cap) {
        v->v[v->n++] = id;
        return 0;
    }
    return tok_ids_append(v, &id, 1, e);
}

/* ---- UTF-8 ---- */

size_t tok_utf8_seq(const unsigned char *s, size_t n, size_t *need)
{
    *need = 0;
    if (n == 0)
        return 0;
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xBF;  /* allowed range of the second byte */
    size_t len;
    if (c < 0x80)
        len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c == 0xE0)
        len = 3, lo = 0xA0;  /* no overlongs */
    else if (c == 0xED)
        len = 3, hi = 0x9F;  /* no surrogates */
    else if (c >= 0xE1 && c <= 0xEF)
        len = 3;
    else if (c == 0xF0)
        len = 4, lo = 0x90;  /* no overlongs */
    else if (c == 0xF4)
        len = 4, hi = 0x8F;  /* <= U+10FFFF */
    else if (c >= 0xF1 && c <= 0xF3)
        len = 4;
    else
        return 0;
    *need = len;
    if (len == 1)
        return 1;
    if (n < 2 || s[1] < lo || s[1] > hi)
        return 1;
    size_t k = 2;
    while (k < len && k < n && (s[k] & 0xC0) == 0x80)
        k++;
    return k;
}

size_t tok_utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, need;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = tok_utf8_seq(u + i, n - i, &need);
        if (need == 0 || k != need)
            return i;
        i += k;
    }
    return n;
}

/* ---- GPT-2 byte-level alphabet ---- */

static bool bl_is_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

void tok_bytelevel_init(struct tok_bytelevel *bl)
{
    int extra = 0;
    for (int i = 0; i < TOK_BL_CP_MAX; i++)
        bl->dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        int cp = bl_is_printable(b) ? b : 256 + extra++;
        if (cp < 0x80) {
            bl->enc[b][0] = (char)cp;
            bl->enc_len[b] = 1;
        } else {
            bl->enc[b][0] = (char)(0xC0 | (cp >> 6));
            bl->enc[b][1] = (char)(0x80 | (cp & 0x3F));
            bl->enc_len[b] = 2;
        }
        bl->dec[cp] = (int16_t)b;
    }
}

/* ---- byte buffer ---- */

int tok_buf_put(struct tok_buf *b, const char *s, size_t n, struct err *e)
{
    /* Every buffer holds text derived from one bounded input; 4x the text
     * limit leaves room for legitimate growth (byte-level mapping doubles,
     * U+FFFD triples) and stops runaway rewrites. */
    if (n > TOK_TEXT_MAX * 4 || b->n + n > TOK_TEXT_MAX * 4)
        return err_setf(e, ERR_RANGE, "tokenizer: intermediate text over %zu bytes",
                        TOK_TEXT_MAX * 4);
    if (vec_reserve(&b->p, &b->cap, b->n + n + 1, 64, 1) < 0)
        return err_setf(e, ERR_NOMEM, "tokenizer: buffer of %zu bytes", b->n + n + 1);
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}
