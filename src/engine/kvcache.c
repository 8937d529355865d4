/*
 * kvcache: the paged KV pool and its sequence operations (kvcache.h).
 *
 * Pool layout (one backend allocation): for each layer, K then V, each
 * [n_blocks * block_size][dim] f32. A block id therefore names the same
 * slots in every layer, and copy-on-write copies one block per layer.
 *
 * Block states: free (on free_list, refcnt 0, not indexed), held (refcnt
 * > 0, indexed or not) and cached (refcnt 0, indexed, on the LRU list).
 * block_take pops the free list first and reclaims the least recently used
 * cached block only when it is empty, so cached prefixes live as long as the
 * pool has never-used room.
 *
 * The prefix index: an entry is one full block, keyed by its parent entry's
 * serial (0 at position 0) and its block_size token ids. Serials are never
 * reused, so an entry stands for exactly one token prefix (its parent's
 * prefix plus its tokens, by induction), and a lookup that compares parent
 * serial and tokens cannot confuse two prefixes whatever the hash does. The
 * hash (FNV-1a over parent and tokens) only picks the bucket.
 */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>

/* 64 MiB of int32 block-table entries: 4096 sequences of 256k tokens in blocks of 16. */
#define KV_MAX_TABLE_ENTRIES (1 << 24)

static int32_t *seq_table(const struct kv_cache *kv, int seq)
{
    return kv->tables_host + (size_t)seq * kv->max_blocks;
}

static int check_seq(const struct kv_cache *kv, int seq, struct err *e)
{
    if (seq < 0 || seq >= kv->max_seqs)
        return err_setf(e, ERR_RANGE, "sequence id %d is outside [0, %d)", seq, kv->max_seqs);
    return 0;
}

// ---- the prefix index and the LRU list of cached blocks ----

static void lru_unlink(struct kv_prefix *px, int32_t b)
{
    int32_t p = px->lru_prev[b], n = px->lru_next[b];
    if (p >= 0)
        px->lru_next[p] = n;
    else
        px->lru_head = n;
    if (n >= 0)
        px->lru_prev[n] = p;
    else
        px->lru_tail = p;
    px->lru_prev[b] = px->lru_next[b] = -1;
    px->n_lru--;
}

/* b becomes the most recently used cached block. */
static void lru_push(struct kv_prefix *px, int32_t b)
{
    px->lru_prev[b] = px->lru_tail;
    px->lru_next[b] = -1;
    if (px->lru_tail >= 0)
        px->lru_next[px->lru_tail] = b;
    else
        px->lru_head = b;
    px->lru_tail = b;
    px->n_lru++;
}

static uint64_t block_hash(const struct kv_prefix *px, uint64_t parent, const int32_t *toks, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;  /* FNV-1a 64 offset basis and prime */
    for (int i = 0; i < 8; i++)
        h = (h ^ ((parent >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < 4; i++)
            h = (h ^ (((uint32_t)toks[t] >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h & px->hash_mask;
}

static int32_t *block_toks(const struct kv_cache *kv, int32_t b)
{
    return kv->px.toks + (size_t)b * kv->block_size;
}

/* The indexed block holding toks after the entry `parent`, -1 if none. */
static int32_t index_find(const struct kv_cache *kv, uint64_t h, uint64_t parent, const int32_t *toks)
{
    const struct kv_prefix *px = &kv->px;
    for (int32_t b = px->bucket[h & (uint64_t)(px->n_buckets - 1)]; b >= 0; b = px->next[b])
        if (px->hash[b] == h && px->parent[b] == parent &&
            memcmp(block_toks(kv, b), toks, (size_t)kv->block_size * sizeof *toks) == 0)
            return b;
    return -1;
}

static void index_add(struct kv_cache *kv, int32_t b, uint64_t h, uint64_t parent, const int32_t *toks)
{
    struct kv_prefix *px = &kv->px;
    int32_t *head = &px->bucket[h & (uint64_t)(px->n_buckets - 1)];
    px->hash[b] = h;
    px->parent[b] = parent;
    px->serial[b] = ++px->next_serial;
    memcpy(block_toks(kv, b), toks, (size_t)kv->block_size * sizeof *toks);
    px->next[b] = *head;
    *head = b;
    px->n_indexed++;
}

static void index_remove(struct kv_cache *kv, int32_t b)
{
    struct kv_prefix *px = &kv->px;
    int32_t *p = &px->bucket[px->hash[b] & (uint64_t)(px->n_buckets - 1)];
    while (*p != b)
        p = &px->next[*p];
    *p = px->next[b];
    px->next[b] = -1;
    px->serial[b] = 0;
    px->n_indexed--;
}

// ---- blocks ----

/* A block for the caller (refcount 1): a never-used one, else the least recently used
 * cached one, whose index entry goes. The caller checked kv_n_free_blocks. */
static int32_t block_take(struct kv_cache *kv)
{
    int32_t b;
    if (kv->n_free > 0) {
        b = kv->free_list[--kv->n_free];
    } else {
        b = kv->px.lru_head;
        lru_unlink(&kv->px, b);
        index_remove(kv, b);
    }
    kv->refcnt[b] = 1;
    return b;
}

static void block_release(struct kv_cache *kv, int32_t b)
{
    if (--kv->refcnt[b] > 0)
        return;
    if (kv->px.serial[b] != 0)
        lru_push(&kv->px, b);
    else
        kv->free_list[kv->n_free++] = b;
}

static int check_params(const struct kv_params *p, int *bs, struct err *e)
{
    *bs = p->block_size > 0 ? p->block_size : KV_DEFAULT_BLOCK;
    if (*bs > 4096)
        return err_setf(e, ERR_ARG, "kv cache: block_size %d exceeds 4096", *bs);
    if (p->n_tokens < 1 || p->n_tokens > KV_MAX_TOKENS)
        return err_setf(e, ERR_ARG, "kv cache: n_tokens %d must be in [1, 2^28]", p->n_tokens);
    if (p->max_seqs < 1 || p->max_seqs > 65536)
        return err_setf(e, ERR_ARG, "kv cache: max_seqs %d must be in [1, 65536]", p->max_seqs);
    if (p->dtype != DTYPE_F32)
        return err_setf(e, ERR_UNSUPPORTED, "kv cache: element type %s is not supported (f32)",
                        dtype_name(p->dtype));
    return 0;
}

/* Floats per slot of each layer's K and V, from its spec; a latent layer keeps one row
 * (the latent and the rope key) that serves as both (v_dim 0 here: nothing separate). */
static int layer_dims(const struct hparams *hp, int il, int *k_dim, int *v_dim, struct err *e)
{
    const struct layer_spec *ls = &hp->layer[il];
    if (ls->kv == KV_LATENT) {
        *k_dim = hp->kv_lora_rank + hp->qk_rope_dim;
        *v_dim = 0;
        return 0;
    }
    if (ls->kv != KV_FULL && ls->kv != KV_SLIDING)
        return err_setf(e, ERR_UNSUPPORTED, "kv cache: layer %d's cache kind is not supported", il);
    *k_dim = *v_dim = hp->n_kv_head * hp->head_dim;
    return 0;
}

static int alloc_host(struct kv_cache *kv, struct err *e)
{
    kv->layers = calloc((size_t)kv->n_layer, sizeof *kv->layers);
    kv->refcnt = calloc((size_t)kv->n_blocks, sizeof *kv->refcnt);
    kv->free_list = malloc((size_t)kv->n_blocks * sizeof *kv->free_list);
    kv->seqs = calloc((size_t)kv->max_seqs, sizeof *kv->seqs);
    kv->tables_host = calloc((size_t)kv->max_seqs * kv->max_blocks, sizeof *kv->tables_host);
    kv->want = malloc((size_t)kv->max_seqs * sizeof *kv->want);
    struct kv_prefix *px = &kv->px;
    size_t nb = (size_t)kv->n_blocks;
    px->n_buckets = 1;
    while (px->n_buckets < kv->n_blocks)
        px->n_buckets *= 2;
    px->hash = malloc(nb * sizeof *px->hash);
    px->serial = calloc(nb, sizeof *px->serial);
    px->parent = malloc(nb * sizeof *px->parent);
    px->toks = malloc(nb * kv->block_size * sizeof *px->toks);
    px->next = malloc(nb * sizeof *px->next);
    px->bucket = malloc((size_t)px->n_buckets * sizeof *px->bucket);
    px->lru_prev = malloc(nb * sizeof *px->lru_prev);
    px->lru_next = malloc(nb * sizeof *px->lru_next);
    if (!kv->layers || !kv->refcnt || !kv->free_list || !kv->seqs || !kv->tables_host || !kv->want ||
        !px->hash || !px->serial || !px->parent || !px->toks || !px->next || !px->bucket ||
        !px->lru_prev || !px->lru_next)
        return err_setf(e, ERR_NOMEM, "kv cache: out of memory");
    for (int i = 0; i < px->n_buckets; i++)
        px->bucket[i] = -1;
    for (int i = 0; i < kv->n_blocks; i++)
        px->next[i] = px->lru_prev[i] = px->lru_next[i] = -1;
    px->lru_head = px->lru_tail = -1;
    px->hash_mask = ~0ull;
    /* pop order: block 0 first */
    for (int i = 0; i < kv->n_blocks; i++)
        kv->free_list[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    return 0;
}

/* The pool and the device tables through the backend; layer views into the pool. */
static int alloc_backend(struct kv_cache *kv, const struct hparams *hp, struct err *e)
{
    size_t slots = (size_t)kv->n_blocks * kv->block_size, total = 0;
    int rc;
    for (int il = 0; il < kv->n_layer; il++) {
        int kd = 0, vd = 0;
        if ((rc = layer_dims(hp, il, &kd, &vd, e)) < 0)
            return rc;
        kv->layers[il].k_dim = kd;
        kv->layers[il].v_dim = vd;
        total += slots * (size_t)(kd + vd);
    }
    if ((rc = kv->be->ops->buf_alloc(kv->be, total * sizeof(float), &kv->pool, e)) < 0)
        return err_prefix(e, "kv cache (%zu MiB)", (total * sizeof(float)) >> 20);
    size_t tb = (size_t)kv->max_seqs * kv->max_blocks * sizeof(int32_t);
    if ((rc = kv->be->ops->buf_alloc(kv->be, tb, (void **)&kv->tables, e)) < 0)
        return err_prefix(e, "kv block tables");
    float *p = kv->pool;
    for (int il = 0; il < kv->n_layer; il++) {
        struct kv_layer *L = &kv->layers[il];
        L->k = p;
        p += slots * (size_t)L->k_dim;
        L->v = p;
        p += slots * (size_t)L->v_dim;
        if (L->v_dim == 0) {
            /* latent: V reads the K row (attention's values are the latent columns) */
            L->v = L->k;
            L->v_dim = L->k_dim;
        }
    }
    return 0;
}

int kv_cache_new(struct kv_cache **out, const struct model *m, struct backend *be,
                 const struct kv_params *p, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int bs, rc;
    *out = NULL;
    if ((rc = check_params(p, &bs, e)) < 0)
        return rc;
    /* the one context rule of the program: a longer sequence than the model was trained
     * for is refused here, never capped silently */
    int ctx_max = hp->n_ctx_max > hp->n_ctx ? hp->n_ctx_max : hp->n_ctx;
    if (p->max_seq_len > ctx_max)
        return err_setf(e, ERR_RANGE, "a context of %d tokens exceeds the model's context of %d "
                        "(config.json)", p->max_seq_len, ctx_max);
    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        return err_setf(e, ERR_NOMEM, "kv cache: out of memory");
    kv->be = be;
    kv->n_layer = hp->n_layer;
    kv->block_size = bs;
    kv->n_blocks = (p->n_tokens + bs - 1) / bs;
    kv->max_seqs = p->max_seqs;
    /* default: the model's context; past it (dynamic NTK), as many tokens as the pool holds */
    kv->max_seq_len = p->max_seq_len > 0 ? p->max_seq_len
                      : ctx_max > hp->n_ctx && p->n_tokens > hp->n_ctx ? (p->n_tokens < ctx_max ? p->n_tokens : ctx_max)
                      : hp->n_ctx;
    kv->max_blocks = (kv->max_seq_len + bs - 1) / bs;
    /* the block tables are max_seqs x max_blocks entries, host and backend */
    if ((int64_t)kv->max_seqs * kv->max_blocks > KV_MAX_TABLE_ENTRIES) {
        rc = err_setf(e, ERR_ARG, "kv cache: %d sequences of up to %d tokens need block tables of "
                      "%lld entries (at most %d)", kv->max_seqs, kv->max_seq_len,
                      (long long)kv->max_seqs * kv->max_blocks, KV_MAX_TABLE_ENTRIES);
        kv_cache_free(kv);
        return rc;
    }
    if ((rc = alloc_host(kv, e)) < 0 || (rc = alloc_backend(kv, hp, e)) < 0) {
        kv_cache_free(kv);
        return rc;
    }
    *out = kv;
    return 0;
}

void kv_cache_free(struct kv_cache *kv)
{
    if (!kv)
        return;
    if (kv->pool)
        kv->be->ops->buf_free(kv->be, kv->pool);
    if (kv->tables)
        kv->be->ops->buf_free(kv->be, kv->tables);
    free(kv->layers);
    free(kv->refcnt);
    free(kv->free_list);
    free(kv->seqs);
    free(kv->tables_host);
    free(kv->want);
    free(kv->px.hash);
    free(kv->px.serial);
    free(kv->px.parent);
    free(kv->px.toks);
    free(kv->px.next);
    free(kv->px.bucket);
    free(kv->px.lru_prev);
    free(kv->px.lru_next);
    free(kv);
}

// ---- sequences ----

int kv_seq_add(struct kv_cache *kv, int seq, struct err *e)
{
    int rc;
    if ((rc = check_seq(kv, seq, e)) < 0)
        return rc;
    if (kv->seqs[seq].used)
        return err_setf(e, ERR_ARG, "sequence %d already exists", seq);
    kv->seqs[seq] = (struct kv_seq){.used = true, .dirty = true};
    return 0;
}

void kv_seq_remove(struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return;
    /* last block first: a chain's tail becomes the least recently used part of it, so
     * eviction shortens a cached prefix rather than cutting off its head */
    int32_t *t = seq_table(kv, seq);
    for (int i = kv->seqs[seq].n_blocks - 1; i >= 0; i--)
        block_release(kv, t[i]);
    kv->seqs[seq] = (struct kv_seq){0};
}

int kv_seq_truncate(struct kv_cache *kv, int seq, int len, struct err *e)
{
    int rc;
    if ((rc = check_seq(kv, seq, e)) < 0)
        return rc;
    struct kv_seq *s = &kv->seqs[seq];
    if (!s->used)
        return err_setf(e, ERR_ARG, "sequence %d does not exist", seq);
    if (len < 0 || len > s->len)
        return err_setf(e, ERR_RANGE, "cannot truncate sequence %d of %d positions to %d", seq,
                        s->len, len);
    int keep = (len + kv->block_size - 1) / kv->block_size;
    int32_t *t = seq_table(kv, seq);
    for (int i = s->n_blocks - 1; i >= keep; i--)
        block_release(kv, t[i]);
    if (len < s->n_indexed * kv->block_size) {
        /* registration starts over (it finds the entries again) */
        s->n_indexed = 0;
        s->chain = 0;
    }
    s->n_blocks = keep;
    s->len = len;
    s->dirty = true;
    return 0;
}

int kv_seq_fork(struct kv_cache *kv, int src, int dst, struct err *e)
{
    int rc;
    if ((rc = check_seq(kv, src, e)) < 0 || (rc = check_seq(kv, dst, e)) < 0)
        return rc;
    if (!kv->seqs[src].used)
        return err_setf(e, ERR_ARG, "sequence %d does not exist", src);
    if (kv->seqs[dst].used)
        return err_setf(e, ERR_ARG, "sequence %d already exists", dst);
    kv->seqs[dst] = kv->seqs[src];
    kv->seqs[dst].dirty = true;
    int32_t *ts = seq_table(kv, src), *td = seq_table(kv, dst);
    for (int i = 0; i < kv->seqs[src].n_blocks; i++) {
        td[i] = ts[i];
        kv->refcnt[ts[i]]++;
    }
    return 0;
}

int kv_seq_len(const struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return -1;
    return kv->seqs[seq].len;
}

int kv_n_free_blocks(const struct kv_cache *kv)
{
    return kv->n_free + kv->px.n_lru;
}

int kv_n_cached_blocks(const struct kv_cache *kv)
{
    return kv->px.n_lru;
}

// ---- reservation ----

/* Blocks seq needs to grow to want: new ones, plus a copy of its last block when
 * that block is shared or indexed (its content is the index's) and will be written. */
static int blocks_needed(const struct kv_cache *kv, int seq, int want, bool *cow)
{
    const struct kv_seq *s = &kv->seqs[seq];
    int need = (want + kv->block_size - 1) / kv->block_size - s->n_blocks;
    int32_t last = s->n_blocks > 0 ? seq_table(kv, seq)[s->n_blocks - 1] : -1;
    *cow = s->len % kv->block_size != 0 && (kv->refcnt[last] > 1 || kv->px.serial[last] != 0);
    return need + (*cow ? 1 : 0);
}

/* Give seq a private copy of its last block (every layer's K and V rows). */
static void block_cow(struct kv_cache *kv, int seq)
{
    struct kv_seq *s = &kv->seqs[seq];
    int32_t *t = seq_table(kv, seq);
    int32_t old = t[s->n_blocks - 1], nb = block_take(kv);
    size_t bs = (size_t)kv->block_size;
    for (int il = 0; il < kv->n_layer; il++) {
        const struct kv_layer *L = &kv->layers[il];
        kv->be->ops->copy(kv->be, L->k + nb * bs * L->k_dim, L->k + old * bs * L->k_dim,
                          bs * L->k_dim * sizeof(float));
        if (L->v != L->k)
            kv->be->ops->copy(kv->be, L->v + nb * bs * L->v_dim, L->v + old * bs * L->v_dim,
                              bs * L->v_dim * sizeof(float));
    }
    block_release(kv, old);
    t[s->n_blocks - 1] = nb;
}

int kv_reserve(struct kv_cache *kv, const int32_t *want, struct err *e)
{
    int need = 0;
    for (int q = 0; q < kv->max_seqs; q++) {
        bool cow;
        if (!kv->seqs[q].used || want[q] <= kv->seqs[q].len)
            continue;
        if (want[q] > kv->max_seq_len)
            return err_setf(e, ERR_RANGE, "context overflow: sequence %d would hold %d tokens, the "
                            "context holds %d", q, want[q], kv->max_seq_len);
        need += blocks_needed(kv, q, want[q], &cow);
    }
    if (need > kv_n_free_blocks(kv))
        return err_setf(e, ERR_NOMEM, "kv cache full: %d more blocks of %d tokens needed, %d free "
                        "of %d", need, kv->block_size, kv_n_free_blocks(kv), kv->n_blocks);
    for (int q = 0; q < kv->max_seqs; q++) {
        struct kv_seq *s = &kv->seqs[q];
        bool cow;
        if (!s->used || want[q] <= s->len)
            continue;
        int n_new = blocks_needed(kv, q, want[q], &cow) - (cow ? 1 : 0);
        if (cow)
            block_cow(kv, q);
        int32_t *t = seq_table(kv, q);
        for (int i = 0; i < n_new; i++)
            t[s->n_blocks++] = block_take(kv);
        s->len = want[q];
        s->dirty = true;
    }
    return 0;
}

int32_t kv_slot(const struct kv_cache *kv, int seq, int pos)
{
    return seq_table(kv, seq)[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

void kv_sync_tables(struct kv_cache *kv)
{
    for (int q = 0; q < kv->max_seqs; q++) {
        struct kv_seq *s = &kv->seqs[q];
        if (!s->dirty)
            continue;
        size_t off = (size_t)q * kv->max_blocks;
        if (s->n_blocks > 0)
            kv->be->ops->upload(kv->be, kv->tables + off, kv->tables_host + off,
                                (size_t)s->n_blocks * sizeof(int32_t));
        s->dirty = false;
    }
}

// ---- prefix cache ----

void kv_prefix_register(struct kv_cache *kv, int seq, const int32_t *toks, int n)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return;
    struct kv_seq *s = &kv->seqs[seq];
    struct kv_prefix *px = &kv->px;
    int bs = kv->block_size, full = (n < s->len ? n : s->len) / bs;
    int32_t *t = seq_table(kv, seq);
    for (int i = s->n_indexed; i < full; i++) {
        const int32_t *bt = toks + (size_t)i * bs;
        uint64_t h = block_hash(px, s->chain, bt, bs);
        int32_t b = index_find(kv, h, s->chain, bt);
        if (b < 0 && px->serial[t[i]] == 0) {
            index_add(kv, t[i], h, s->chain, bt);
            b = t[i];
        } else if (b < 0) {
            /* t[i] is indexed under another chain of the same tokens (a fork's sibling
             * registered it): its entry stands for this prefix too */
            b = t[i];
        } else if (b != t[i]) {
            /* another sequence computed the same block first: share its block and let
             * this copy go (same tokens at the same positions: the same rows) */
            if (kv->refcnt[b]++ == 0)
                lru_unlink(px, b);
            block_release(kv, t[i]);
            t[i] = b;
            s->dirty = true;
        }
        s->chain = px->serial[b];
        s->n_indexed = i + 1;
    }
}

int kv_prefix_attach(struct kv_cache *kv, int seq, const int32_t *toks, int n)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used || kv->seqs[seq].n_blocks > 0)
        return 0;
    struct kv_seq *s = &kv->seqs[seq];
    struct kv_prefix *px = &kv->px;
    int bs = kv->block_size, full = n / bs;
    if (full > kv->max_blocks)
        full = kv->max_blocks;
    int32_t *t = seq_table(kv, seq);
    for (int i = 0; i < full; i++) {
        const int32_t *bt = toks + (size_t)i * bs;
        int32_t b = index_find(kv, block_hash(px, s->chain, bt, bs), s->chain, bt);
        if (b < 0)
            break;
        if (kv->refcnt[b]++ == 0)
            lru_unlink(px, b);
        t[s->n_blocks++] = b;
        s->chain = px->serial[b];
        s->n_indexed = s->n_blocks;
    }
    s->len = s->n_blocks * bs;
    s->dirty = true;
    return s->len;
}

void kv_prefix_clear(struct kv_cache *kv)
{
    struct kv_prefix *px = &kv->px;
    while (px->lru_head >= 0) {
        int32_t b = px->lru_head;
        lru_unlink(px, b);
        index_remove(kv, b);
        kv->free_list[kv->n_free++] = b;
    }
    for (int32_t b = 0; b < kv->n_blocks; b++)
        if (px->serial[b] != 0)
            index_remove(kv, b);
    for (int q = 0; q < kv->max_seqs; q++) {
        kv->seqs[q].n_indexed = 0;
        kv->seqs[q].chain = 0;
    }
}

int kv_check(const struct kv_cache *kv, struct err *e)
{
    const struct kv_prefix *px = &kv->px;
    int32_t *held = calloc((size_t)kv->n_blocks, sizeof *held);
    int rc = 0, n_held = 0, n_lru = 0, n_chained = 0;
    if (!held)
        return err_setf(e, ERR_NOMEM, "kv_check: out of memory");
    for (int q = 0; q < kv->max_seqs; q++)
        for (int i = 0; kv->seqs[q].used && i < kv->seqs[q].n_blocks; i++)
            held[seq_table(kv, q)[i]]++;
    for (int32_t b = 0; b < kv->n_blocks && rc == 0; b++) {
        if (held[b] != kv->refcnt[b])
            rc = err_setf(e, ERR_INTERNAL, "block %d: refcount %d, held by %d tables", b, kv->refcnt[b],
                          held[b]);
        n_held += held[b] > 0;
    }
    for (int32_t b = px->lru_head; b >= 0 && rc == 0; b = px->lru_next[b], n_lru++)
        if (kv->refcnt[b] != 0 || px->serial[b] == 0 || n_lru > kv->n_blocks)
            rc = err_setf(e, ERR_INTERNAL, "block %d on the LRU list is held or not indexed", b);
    for (int k = 0; k < px->n_buckets && rc == 0; k++)
        for (int32_t b = px->bucket[k]; b >= 0 && rc == 0; b = px->next[b], n_chained++)
            if (px->serial[b] == 0 || n_chained > kv->n_blocks)
                rc = err_setf(e, ERR_INTERNAL, "block %d in bucket %d is not indexed", b, k);
    if (rc == 0 && (n_lru != px->n_lru || n_chained != px->n_indexed))
        rc = err_setf(e, ERR_INTERNAL, "%d blocks on the LRU list (count %d), %d in the index (count %d)",
                      n_lru, px->n_lru, n_chained, px->n_indexed);
    if (rc == 0 && n_held + kv->n_free + px->n_lru != kv->n_blocks)
        rc = err_setf(e, ERR_INTERNAL, "%d held + %d free + %d cached blocks != %d", n_held, kv->n_free,
                      px->n_lru, kv->n_blocks);
    free(held);
    return rc;
}
