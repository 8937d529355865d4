/*
 * kvcache: the paged KV pool and its sequence operations (kvcache.h).
 *
 * Pool layout (one backend allocation): for each layer, K then V, each
 * [blocks * block_size][dim] f32, where blocks is the full pool's count for
 * full and latent layers and the sliding pool's for sliding-window layers. A
 * block id of a pool therefore names the same slots in every layer of that
 * pool, and copy-on-write copies one block per layer of the pool.
 *
 * Block states, in each pool: free (on free_list, refcnt 0, not indexed),
 * held (refcnt > 0, indexed or not) and cached (refcnt 0, indexed, on the
 * pool's LRU list). block_take pops the free list first and reclaims the
 * least recently used cached block only when it is empty, so cached prefixes
 * live as long as the pool has never-used room.
 *
 * The sliding pool (ADR 0023): sequence tables of the same shape as the full
 * pool's, whose entries below swa_lo are -1: a block whose last position is
 * older than every later query's window is released as soon as the next
 * chunk is reserved. The attention kernels read only positions inside a
 * query's window, so they never meet a -1.
 *
 * The prefix index: an entry is one full block of the full pool, keyed by its
 * parent entry's serial (0 at position 0) and its block_size token ids.
 * Serials are never reused, so an entry stands for exactly one token prefix
 * (its parent's prefix plus its tokens, by induction), and a lookup that
 * compares parent serial and tokens cannot confuse two prefixes whatever the
 * hash does. The hash (FNV-1a over parent and tokens) only picks the bucket.
 * An entry may own one sliding block of the same positions (side / owner):
 * an owned sliding block that its sequences let go is cached in the sliding
 * pool's LRU, and reclaiming it only clears the entry's side. An entry may also
 * own a snapshot of the recurrent states at its end (kvcache_snap.c, ADR 0129), dropped
 * when the entry is unindexed; with recurrent layers a hit ends only at such an entry.
 */
#include "kvcache.h"
#include "kvcache_impl.h"
#include "../models/tp.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* 64 MiB of int32 block-table entries: 4096 sequences of 256k tokens in blocks of 16. */
#define KV_MAX_TABLE_ENTRIES (1 << 24)

static int32_t *seq_table(const struct kv_blocks *k, const struct kv_cache *kv, int seq)
{
    return k->tables_host + (size_t)seq * kv->max_blocks;
}

static int check_seq(const struct kv_cache *kv, int seq, struct err *e)
{
    if (seq < 0 || seq >= kv->max_seqs)
        return err_setf(e, ERR_RANGE, "sequence id %d is outside [0, %d)", seq, kv->max_seqs);
    return 0;
}

static bool has_swa(const struct kv_cache *kv)
{
    return kv->swa.window > 0;
}

/* First table entry a query at position p (or later) can see in a window of w. */
static int window_first_block(int p, int w, int bs)
{
    return p - w + 1 > 0 ? (p - w + 1) / bs : 0;
}

int kv_window_seq_blocks(int w, int n_rows, int bs)
{
    return (w - 1 + n_rows + bs - 1) / bs + 1;
}

// ---- LRU lists of cached blocks ----

void kv_lru_unlink(struct kv_lru *l, int32_t b)
{
    int32_t p = l->prev[b], n = l->next[b];
    if (p >= 0)
        l->next[p] = n;
    else
        l->head = n;
    if (n >= 0)
        l->prev[n] = p;
    else
        l->tail = p;
    l->prev[b] = l->next[b] = -1;
    l->n--;
}

/* b becomes the most recently used cached block. */
void kv_lru_push(struct kv_lru *l, int32_t b)
{
    l->prev[b] = l->tail;
    l->next[b] = -1;
    if (l->tail >= 0)
        l->next[l->tail] = b;
    else
        l->head = b;
    l->tail = b;
    l->n++;
}

// ---- the prefix index ----

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

/* Entry b lets go of its sliding block: a cached one becomes free. */
static void side_detach(struct kv_cache *kv, int32_t b)
{
    struct kv_swa *w = &kv->swa;
    int32_t s;
    if (!has_swa(kv) || (s = w->side[b]) < 0)
        return;
    w->side[b] = -1;
    w->owner[s] = -1;
    if (w->blk.refcnt[s] == 0) {
        kv_lru_unlink(&w->blk.lru, s);
        w->blk.free_list[w->blk.n_free++] = s;
    }
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
    side_detach(kv, b);
    kv_snap_detach(kv, b);
}

// ---- blocks ----

static bool block_indexed(const struct kv_cache *kv, const struct kv_blocks *k, int32_t b)
{
    return k == &kv->blk ? kv->px.serial[b] != 0 : kv->swa.owner[b] >= 0;
}

/* A block of pool k for the caller (refcount 1): a never-used one, else the least
 * recently used cached one, whose index entry (full pool) or place in its entry
 * (sliding pool) goes. The caller checked that the pool has room. */
static int32_t block_take(struct kv_cache *kv, struct kv_blocks *k)
{
    int32_t b;
    if (k->n_free > 0) {
        b = k->free_list[--k->n_free];
    } else {
        b = k->lru.head;
        kv_lru_unlink(&k->lru, b);
        if (k == &kv->blk) {
            index_remove(kv, b);
        } else {
            kv->swa.side[kv->swa.owner[b]] = -1;
            kv->swa.owner[b] = -1;
        }
    }
    k->refcnt[b] = 1;
    return b;
}

static void block_release(struct kv_cache *kv, struct kv_blocks *k, int32_t b)
{
    if (--k->refcnt[b] > 0)
        return;
    if (block_indexed(kv, k, b))
        kv_lru_push(&k->lru, b);
    else
        k->free_list[k->n_free++] = b;
}

/* Pool k's rows of block src copied into block dst, in every layer of the pool. */
static void block_copy(struct kv_cache *kv, const struct kv_blocks *k, int32_t dst, int32_t src)
{
    size_t bs = (size_t)kv->block_size;
    bool swa = k != &kv->blk;
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++) {
        const struct kv_layer *L = &kv->layers[i];
        int il = i % kv->n_layer;
        if (kv->layer_swa[il] != swa || kv->layer_rec[il])
            continue;
        size_t es = dtype_size(L->dtype), kb = bs * (size_t)L->k_dim * es,
               vb = bs * (size_t)L->v_dim * es;
        kv->be->ops->copy(kv->be, (char *)L->k + (size_t)dst * kb, (char *)L->k + (size_t)src * kb, kb);
        if (L->v != L->k)
            kv->be->ops->copy(kv->be, (char *)L->v + (size_t)dst * vb, (char *)L->v + (size_t)src * vb,
                              vb);
    }
}

// ---- creation ----

static int check_params(const struct kv_params *p, int *bs, struct err *e)
{
    *bs = p->block_size > 0 ? p->block_size : KV_DEFAULT_BLOCK;
    if (*bs > 4096)
        return err_setf(e, ERR_ARG, "kv cache: block_size %d exceeds 4096", *bs);
    if (p->n_tokens < 1 || p->n_tokens > KV_MAX_TOKENS)
        return err_setf(e, ERR_ARG, "kv cache: n_tokens %d must be in [1, 2^28]", p->n_tokens);
    if (p->max_seqs < 1 || p->max_seqs > 65536)
        return err_setf(e, ERR_ARG, "kv cache: max_seqs %d must be in [1, 65536]", p->max_seqs);
    if (p->swa_slack < 0 || p->swa_slack > 4096)
        return err_setf(e, ERR_ARG, "kv cache: swa_slack %d must be in [0, 4096]", p->swa_slack);
    if (p->dtype != DTYPE_F32 && p->dtype != DTYPE_F16 && p->dtype != DTYPE_BF16)
        return err_setf(e, ERR_UNSUPPORTED,
                        "kv cache: element type %s is not supported (f32, f16, bf16)",
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
    if (ls->kv == KV_RECURRENT) {
        *k_dim = *v_dim = 0;  /* no rows in the pool: a state per sequence (alloc_state) */
        return 0;
    }
    if (ls->kv != KV_FULL && ls->kv != KV_SLIDING)
        return err_setf(e, ERR_UNSUPPORTED, "kv cache: layer %d's cache kind is not supported", il);
    *k_dim = *v_dim = hp->n_kv_head * hp->head_dim;
    return 0;
}

static int blocks_init(struct kv_blocks *k, const struct kv_cache *kv, int n_blocks)
{
    size_t nb = (size_t)n_blocks;
    k->n_blocks = n_blocks;
    k->refcnt = calloc(nb, sizeof *k->refcnt);
    k->free_list = malloc(nb * sizeof *k->free_list);
    k->lru.prev = malloc(nb * sizeof *k->lru.prev);
    k->lru.next = malloc(nb * sizeof *k->lru.next);
    k->tables_host = malloc((size_t)kv->max_seqs * kv->max_blocks * sizeof *k->tables_host);
    if (!k->refcnt || !k->free_list || !k->lru.prev || !k->lru.next || !k->tables_host)
        return -1;
    for (size_t i = 0; i < (size_t)kv->max_seqs * kv->max_blocks; i++)
        k->tables_host[i] = -1;
    for (int i = 0; i < n_blocks; i++) {
        k->lru.prev[i] = k->lru.next[i] = -1;
        k->free_list[i] = n_blocks - 1 - i;  /* pop order: block 0 first */
    }
    k->lru.head = k->lru.tail = -1;
    k->n_free = n_blocks;
    return 0;
}

static void blocks_deinit(struct kv_blocks *k, struct backend *be)
{
    if (k->tables)
        be->ops->buf_free(be, k->tables);
    free(k->refcnt);
    free(k->free_list);
    free(k->lru.prev);
    free(k->lru.next);
    free(k->tables_host);
}

/* The sliding layers and their window; the sliding pool's size: enough for every
 * sequence to hold its window and one chunk (kv_window_seq_blocks), plus one block of
 * copy-on-write room, but never more than the full pool. */
static void swa_plan(struct kv_cache *kv, const struct hparams *hp, const struct kv_params *p,
                     int *n_blocks)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        kv->layer_swa[il] = ls->kv == KV_SLIDING && ls->window > 0;
        if (kv->layer_swa[il]) {
            kv->swa.n_layer++;
            kv->swa.window = ls->window > kv->swa.window ? ls->window : kv->swa.window;
        }
    }
    kv->swa.keep = kv->swa.window + (has_swa(kv) && p->swa_slack > 0 ? p->swa_slack : 0);
    *n_blocks = kv->n_blocks;
    if (!has_swa(kv) || p->n_batch <= 0)
        return;
    int64_t per = kv_window_seq_blocks(kv->swa.keep, p->n_batch, kv->block_size);
    int64_t want = (int64_t)kv->max_seqs * per + 1;
    if (want < *n_blocks)
        *n_blocks = (int)want;
}

static int alloc_host(struct kv_cache *kv, const struct hparams *hp, const struct kv_params *p,
                      struct err *e)
{
    int n_swa = 0;
    kv->layers = calloc((size_t)kv->n_layer * kv->n_rank, sizeof *kv->layers);
    kv->layer_swa = calloc((size_t)kv->n_layer, sizeof *kv->layer_swa);
    kv->layer_rec = calloc((size_t)kv->n_layer, sizeof *kv->layer_rec);
    kv->seqs = calloc((size_t)kv->max_seqs, sizeof *kv->seqs);
    kv->want = malloc((size_t)kv->max_seqs * sizeof *kv->want);
    if (!kv->layers || !kv->layer_swa || !kv->layer_rec || !kv->seqs || !kv->want ||
        blocks_init(&kv->blk, kv, kv->n_blocks) < 0)
        return err_setf(e, ERR_NOMEM, "kv cache: out of memory");
    swa_plan(kv, hp, p, &n_swa);
    if (has_swa(kv)) {
        struct kv_swa *w = &kv->swa;
        w->owner = malloc((size_t)n_swa * sizeof *w->owner);
        w->side = malloc((size_t)kv->n_blocks * sizeof *w->side);
        w->from = malloc((size_t)kv->max_seqs * sizeof *w->from);
        w->to = malloc((size_t)kv->max_seqs * sizeof *w->to);
        if (!w->owner || !w->side || !w->from || !w->to || blocks_init(&w->blk, kv, n_swa) < 0)
            return err_setf(e, ERR_NOMEM, "kv cache: out of memory");
        for (int i = 0; i < n_swa; i++)
            w->owner[i] = -1;
        for (int i = 0; i < kv->n_blocks; i++)
            w->side[i] = -1;
    }
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
    if (!px->hash || !px->serial || !px->parent || !px->toks || !px->next || !px->bucket)
        return err_setf(e, ERR_NOMEM, "kv cache: out of memory");
    for (int i = 0; i < px->n_buckets; i++)
        px->bucket[i] = -1;
    for (int i = 0; i < kv->n_blocks; i++)
        px->next[i] = -1;
    px->hash_mask = ~0ull;
    return 0;
}

/* The pool and the device tables through the backend; layer views into the pool. */
static int alloc_backend(struct kv_cache *kv, const struct model *m, struct err *e)
{
    const struct hparams *hp = &m->hp;
    size_t total = 0, bs = (size_t)kv->block_size;
    int rc, NL = kv->n_layer * kv->n_rank;
    for (int i = 0; i < NL; i++) {
        int kd = 0, vd = 0, il = i % kv->n_layer;
        /* a rank's K/V: its own heads' (its model's n_kv_head) */
        const struct hparams *rhp = m->tp ? &m->tp->rank[i / kv->n_layer]->hp : hp;
        if ((rc = layer_dims(rhp, il, &kd, &vd, e)) < 0)
            return rc;
        kv->layers[i].k_dim = kd;
        kv->layers[i].v_dim = vd;
        size_t slots = (size_t)(kv->layer_swa[il] ? kv->swa.blk.n_blocks : kv->n_blocks) * bs;
        total += slots * (size_t)(kd + vd);
    }
    size_t es = dtype_size(kv->dtype);
    /* a model of recurrent layers only keeps no rows: the pool still exists (one element) */
    if ((rc = kv->be->ops->buf_alloc(kv->be, (total > 0 ? total : 1) * es, &kv->pool, e)) < 0)
        return err_prefix(e, "kv cache (%zu MiB)", (total * es) >> 20);
    size_t tb = (size_t)kv->max_seqs * kv->max_blocks * sizeof(int32_t);
    if ((rc = kv->be->ops->buf_alloc(kv->be, tb, (void **)&kv->blk.tables, e)) < 0 ||
        (has_swa(kv) && (rc = kv->be->ops->buf_alloc(kv->be, tb, (void **)&kv->swa.blk.tables, e)) < 0))
        return err_prefix(e, "kv block tables");
    char *p = kv->pool;
    for (int i = 0; i < NL; i++) {
        struct kv_layer *L = &kv->layers[i];
        int il = i % kv->n_layer;
        size_t slots = (size_t)(kv->layer_swa[il] ? kv->swa.blk.n_blocks : kv->n_blocks) * bs;
        L->dtype = kv->dtype;
        L->k = p;
        p += slots * (size_t)L->k_dim * es;
        L->v = p;
        p += slots * (size_t)L->v_dim * es;
        if (L->v_dim == 0 && hp->layer[il].kv == KV_LATENT) {
            /* latent: V reads the K row (attention's values are the latent columns) */
            L->v = L->k;
            L->v_dim = L->k_dim;
        }
    }
    return 0;
}

/* The recurrent layers' states: f32, [max_seqs] of each layer's conv and recurrent state,
 * in one backend buffer (ADR 0057). */
static int alloc_state(struct kv_cache *kv, const struct model *m, struct err *e)
{
    const struct hparams *hp = &m->hp;
    size_t total = 0, S = (size_t)kv->max_seqs;
    for (int il = 0; il < kv->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        kv->layer_rec[il] = ls->kv == KV_RECURRENT;
        if (!kv->layer_rec[il])
            continue;
        kv->n_rec++;
        /* every rank its own states: its heads' (a split mixer), or a copy (a replicated one) */
        for (int r = 0; r < kv->n_rank; r++) {
            const struct layer_spec *rs = m->tp ? &m->tp->rank[r]->hp.layer[il] : ls;
            total += S * ((size_t)rs->state_conv + (size_t)rs->state_rec);
        }
    }
    if (kv->n_rec == 0)
        return 0;
    kv->state_bytes = total * sizeof(float);
    int rc = kv->be->ops->buf_alloc(kv->be, kv->state_bytes, &kv->state, e);
    if (rc < 0)
        return err_prefix(e, "recurrent state (%zu MiB for %d sequences)", kv->state_bytes >> 20,
                          kv->max_seqs);
    float *p = kv->state;
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++) {
        int il = i % kv->n_layer;
        if (!kv->layer_rec[il])
            continue;
        struct kv_layer *L = &kv->layers[i];
        const struct layer_spec *rs = m->tp ? &m->tp->rank[i / kv->n_layer]->hp.layer[il] : &hp->layer[il];
        L->dtype = DTYPE_F32;
        L->k_dim = rs->state_conv;
        L->v_dim = rs->state_rec;
        L->k = p;
        p += S * (size_t)L->k_dim;
        L->v = p;
        p += S * (size_t)L->v_dim;
    }
    return 0;
}

/* The recurrent states of sequence seq saved into the checkpoints' buffer (save) or restored
 * from it: the rows of each layer at the same offsets in both buffers. */
static void state_ckpt(struct kv_cache *kv, int seq, bool save)
{
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++) {
        if (!kv->layer_rec[i % kv->n_layer])
            continue;
        const struct kv_layer *L = &kv->layers[i];
        size_t kb = (size_t)L->k_dim * sizeof(float), vb = (size_t)L->v_dim * sizeof(float);
        char *k = (char *)L->k + (size_t)seq * kb, *v = (char *)L->v + (size_t)seq * vb;
        char *ck = (char *)kv->ckpt + (k - (char *)kv->state), *cv = (char *)kv->ckpt + (v - (char *)kv->state);
        if (kb)
            kv->be->ops->copy(kv->be, save ? ck : k, save ? k : ck, kb);
        if (vb)
            kv->be->ops->copy(kv->be, save ? cv : v, save ? v : cv, vb);
    }
}

/* The recurrent states of sequence src copied to dst (kv_seq_fork). */
static void state_copy(struct kv_cache *kv, int dst, int src)
{
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++) {
        if (!kv->layer_rec[i % kv->n_layer])
            continue;
        const struct kv_layer *L = &kv->layers[i];
        size_t kb = (size_t)L->k_dim * sizeof(float), vb = (size_t)L->v_dim * sizeof(float);
        if (kb)
            kv->be->ops->copy(kv->be, (char *)L->k + (size_t)dst * kb, (char *)L->k + (size_t)src * kb, kb);
        if (vb)
            kv->be->ops->copy(kv->be, (char *)L->v + (size_t)dst * vb, (char *)L->v + (size_t)src * vb, vb);
    }
}

int kv_cache_new(struct kv_cache **out, const struct model *m, struct backend *be,
                 const struct kv_params *p, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int bs, rc;
    *out = NULL;
    if ((rc = check_params(p, &bs, e)) < 0)
        return rc;
    if (!(be->kv_dtypes & 1u << p->dtype))
        return err_setf(e, ERR_UNSUPPORTED, "kv cache: the %s backend keeps no %s cache (f32)",
                        be->name, dtype_name(p->dtype));
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
    kv->n_rank = m->tp ? m->tp->n_rank : 1;
    kv->block_size = bs;
    kv->dtype = p->dtype;
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
    if ((rc = alloc_host(kv, hp, p, e)) < 0 || (rc = alloc_backend(kv, m, e)) < 0 ||
        (rc = alloc_state(kv, m, e)) < 0 || (rc = kv_snap_init(kv, p->n_snap, e)) < 0) {
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
    if (kv->state)
        kv->be->ops->buf_free(kv->be, kv->state);
    if (kv->ckpt)
        kv->be->ops->buf_free(kv->be, kv->ckpt);
    kv_snap_deinit(kv);
    blocks_deinit(&kv->blk, kv->be);
    blocks_deinit(&kv->swa.blk, kv->be);
    free(kv->swa.owner);
    free(kv->swa.side);
    free(kv->swa.from);
    free(kv->swa.to);
    free(kv->layers);
    free(kv->layer_swa);
    free(kv->layer_rec);
    free(kv->seqs);
    free(kv->want);
    free(kv->px.hash);
    free(kv->px.serial);
    free(kv->px.parent);
    free(kv->px.toks);
    free(kv->px.next);
    free(kv->px.bucket);
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
    kv->seqs[seq] = (struct kv_seq){.used = true, .dirty = true, .swa_dirty = true};
    return 0;
}

/* Release the sliding entries [from, swa_n) of seq, last first. */
static void swa_release_tail(struct kv_cache *kv, int seq, int from)
{
    struct kv_seq *s = &kv->seqs[seq];
    int32_t *t = seq_table(&kv->swa.blk, kv, seq);
    for (int i = s->swa_n - 1; i >= from && i >= s->swa_lo; i--) {
        block_release(kv, &kv->swa.blk, t[i]);
        t[i] = -1;
    }
}

void kv_seq_remove(struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return;
    /* last block first: a chain's tail becomes the least recently used part of it, so
     * eviction shortens a cached prefix rather than cutting off its head */
    int32_t *t = seq_table(&kv->blk, kv, seq);
    if (has_swa(kv))
        swa_release_tail(kv, seq, 0);
    for (int i = kv->seqs[seq].n_blocks - 1; i >= 0; i--) {
        block_release(kv, &kv->blk, t[i]);
        t[i] = -1;
    }
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
    bool restore = kv->n_rec > 0 && len > 0 && len < s->len;
    if (restore && len != s->ckpt)
        return err_setf(e, ERR_UNSUPPORTED, "cannot truncate sequence %d to %d positions: the "
                        "model's recurrent state holds all %d (only 0%s is possible)", seq, len, s->len,
                        s->ckpt > 0 ? " or its checkpoint's length" : "");
    int bs = kv->block_size, keep = (len + bs - 1) / bs;
    if (has_swa(kv) && len > 0 && window_first_block(len, kv->swa.window, bs) < s->swa_lo)
        return err_setf(e, ERR_RANGE, "cannot truncate sequence %d to %d positions: its "
                        "sliding-window layers no longer hold positions below %d", seq, len,
                        s->swa_lo * bs);
    if (restore)
        state_ckpt(kv, seq, false);
    if (len < s->ckpt)
        s->ckpt = 0;
    int32_t *t = seq_table(&kv->blk, kv, seq);
    for (int i = s->n_blocks - 1; i >= keep; i--) {
        block_release(kv, &kv->blk, t[i]);
        t[i] = -1;
    }
    if (has_swa(kv)) {
        swa_release_tail(kv, seq, keep);
        if (s->swa_n > keep)
            s->swa_n = keep;
        if (s->swa_len > len)
            s->swa_len = len;
        if (len == 0)
            s->swa_lo = s->swa_n = 0;
        s->swa_dirty = true;
    }
    if (len < s->n_indexed * bs) {
        /* registration starts over (it finds the entries again) */
        s->n_indexed = 0;
        s->chain = 0;
    }
    s->n_blocks = keep;
    s->len = len;
    s->dirty = true;
    return 0;
}

int kv_step_back_max(const struct kv_cache *kv)
{
    if (kv->n_rec > 0)
        return 0;
    return has_swa(kv) ? kv->swa.keep - kv->swa.window : INT_MAX;
}

bool kv_can_step_back(const struct kv_cache *kv)
{
    return kv_step_back_max(kv) > 0;
}

bool kv_has_recurrent(const struct kv_cache *kv)
{
    return kv->n_rec > 0;
}

int kv_spec_back_max(const struct kv_cache *kv)
{
    if (kv->n_rec == 0)
        return kv_step_back_max(kv);
    /* back to the position before the step's first row: one more than the drafts */
    int slack = kv->swa.keep - kv->swa.window;
    return has_swa(kv) ? (slack > 1 ? slack - 1 : 0) : INT_MAX;
}

int kv_seq_checkpoint(struct kv_cache *kv, int seq, struct err *e)
{
    int rc;
    if ((rc = check_seq(kv, seq, e)) < 0)
        return rc;
    if (!kv->seqs[seq].used)
        return err_setf(e, ERR_ARG, "sequence %d does not exist", seq);
    if (kv->n_rec == 0)
        return 0;
    if (!kv->ckpt && (rc = kv->be->ops->buf_alloc(kv->be, kv->state_bytes, &kv->ckpt, e)) < 0) {
        kv->ckpt = NULL;
        return err_prefix(e, "recurrent state checkpoints (%zu MiB)", kv->state_bytes >> 20);
    }
    state_ckpt(kv, seq, true);
    kv->seqs[seq].ckpt = kv->seqs[seq].len;
    return 0;
}

int kv_seq_checkpoint_len(const struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return 0;
    return kv->seqs[seq].ckpt;
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
    const struct kv_seq *s = &kv->seqs[src];
    kv->seqs[dst] = *s;
    kv->seqs[dst].ckpt = 0;  /* the checkpoint is src's */
    if (kv->n_rec > 0)
        state_copy(kv, dst, src);
    kv->seqs[dst].dirty = kv->seqs[dst].swa_dirty = true;
    int32_t *ts = seq_table(&kv->blk, kv, src), *td = seq_table(&kv->blk, kv, dst);
    for (int i = 0; i < s->n_blocks; i++) {
        td[i] = ts[i];
        kv->blk.refcnt[ts[i]]++;
    }
    if (has_swa(kv)) {
        ts = seq_table(&kv->swa.blk, kv, src);
        td = seq_table(&kv->swa.blk, kv, dst);
        for (int i = s->swa_lo; i < s->swa_n; i++) {
            td[i] = ts[i];
            kv->swa.blk.refcnt[ts[i]]++;
        }
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
    return kv->blk.n_free + kv->blk.lru.n;
}

int kv_n_cached_blocks(const struct kv_cache *kv)
{
    return kv->blk.lru.n;
}

int kv_window_blocks_held(const struct kv_cache *kv)
{
    return kv->swa.blk.n_blocks - kv->swa.blk.n_free - kv->swa.blk.lru.n;
}

// ---- reservation ----

/* Blocks seq needs to grow to want: new ones, plus a copy of its last block when
 * that block is shared or indexed (its content is the index's) and will be written. */
static int blocks_needed(const struct kv_cache *kv, int seq, int want, bool *cow)
{
    const struct kv_seq *s = &kv->seqs[seq];
    int need = (want + kv->block_size - 1) / kv->block_size - s->n_blocks;
    int32_t last = s->n_blocks > 0 ? seq_table(&kv->blk, kv, seq)[s->n_blocks - 1] : -1;
    *cow = s->len % kv->block_size != 0 && (kv->blk.refcnt[last] > 1 || kv->px.serial[last] != 0);
    return need + (*cow ? 1 : 0);
}

/* Give table entry i of seq in pool k a private copy of its block. */
static void entry_cow(struct kv_cache *kv, struct kv_blocks *k, int seq, int i)
{
    int32_t *t = seq_table(k, kv, seq);
    int32_t old = t[i], nb = block_take(kv, k);
    block_copy(kv, k, nb, old);
    block_release(kv, k, old);
    t[i] = nb;
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
            entry_cow(kv, &kv->blk, q, s->n_blocks - 1);
        int32_t *t = seq_table(&kv->blk, kv, q);
        for (int i = 0; i < n_new; i++)
            t[s->n_blocks++] = block_take(kv, &kv->blk);
        s->len = want[q];
        s->dirty = true;
    }
    return 0;
}

/* Release seq's sliding blocks that no query at position p or later can see. */
static void swa_release_dead(struct kv_cache *kv, int seq, int p)
{
    struct kv_seq *s = &kv->seqs[seq];
    int first = window_first_block(p, kv->swa.keep, kv->block_size);
    int32_t *t = seq_table(&kv->swa.blk, kv, seq);
    if (first <= s->swa_lo)
        return;
    for (int i = s->swa_lo; i < first && i < s->swa_n; i++) {
        block_release(kv, &kv->swa.blk, t[i]);
        t[i] = -1;
    }
    s->swa_lo = first;
    if (s->swa_n < first)
        s->swa_n = first;
    s->swa_dirty = true;
}

/* Sliding blocks seq needs to hold positions through `to`: missing entries, plus a copy
 * of the partly written last block when it is shared or owned by an index entry. */
static int swa_needed(const struct kv_cache *kv, int seq, int to, int *cow_at)
{
    const struct kv_seq *s = &kv->seqs[seq];
    const struct kv_blocks *k = &kv->swa.blk;
    const int32_t *t = seq_table(k, kv, seq);
    int bs = kv->block_size, n = to / bs + 1, need = 0;
    *cow_at = -1;
    for (int i = s->swa_lo; i < n; i++) {
        if (i >= s->swa_n || t[i] < 0) {
            need++;
        } else if (i == s->swa_len / bs && s->swa_len % bs != 0 &&
                   (k->refcnt[t[i]] > 1 || kv->swa.owner[t[i]] >= 0)) {
            *cow_at = i;
            need++;
        }
    }
    return need;
}

int kv_reserve_window(struct kv_cache *kv, const int32_t *seq, const int32_t *pos, int n,
                      struct err *e)
{
    struct kv_swa *w = &kv->swa;
    if (!has_swa(kv))
        return 0;
    for (int i = 0; i < n; i++)
        w->from[seq[i]] = w->to[seq[i]] = -1;
    for (int i = 0; i < n; i++) {
        int q = seq[i];
        if (w->from[q] < 0)
            w->from[q] = pos[i];
        w->to[q] = pos[i];
    }
    int need = 0, cow;
    for (int i = 0; i < n; i++) {
        int q = seq[i];
        if (w->from[q] < 0 || pos[i] != w->from[q])
            continue;  /* each sequence once, at its first row */
        swa_release_dead(kv, q, w->from[q]);
        need += swa_needed(kv, q, w->to[q], &cow);
    }
    int avail = w->blk.n_free + w->blk.lru.n;
    if (need > avail)
        return err_setf(e, ERR_NOMEM, "kv cache full: the sliding-window layers need %d more blocks "
                        "of %d tokens, %d free of %d (a chunk longer than the cache was sized for)",
                        need, kv->block_size, avail, w->blk.n_blocks);
    for (int i = 0; i < n; i++) {
        int q = seq[i];
        if (w->from[q] < 0 || pos[i] != w->from[q])
            continue;
        struct kv_seq *s = &kv->seqs[q];
        int32_t *t = seq_table(&w->blk, kv, q);
        int last = w->to[q] / kv->block_size + 1;
        /* the table changes (and is uploaded) only when a block is taken or copied */
        if (swa_needed(kv, q, w->to[q], &cow) > 0)
            s->swa_dirty = true;
        if (cow >= 0)
            entry_cow(kv, &w->blk, q, cow);
        for (int j = s->swa_lo; j < last; j++)
            if (j >= s->swa_n || t[j] < 0)
                t[j] = block_take(kv, &w->blk);
        if (last > s->swa_n)
            s->swa_n = last;
        if (w->to[q] + 1 > s->swa_len)
            s->swa_len = w->to[q] + 1;
        w->from[q] = -1;
    }
    return 0;
}

int32_t kv_slot(const struct kv_cache *kv, int seq, int pos)
{
    return seq_table(&kv->blk, kv, seq)[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

int32_t kv_slot_window(const struct kv_cache *kv, int seq, int pos)
{
    return seq_table(&kv->swa.blk, kv, seq)[pos / kv->block_size] * kv->block_size +
           pos % kv->block_size;
}

void kv_sync_tables(struct kv_cache *kv)
{
    for (int q = 0; q < kv->max_seqs; q++) {
        struct kv_seq *s = &kv->seqs[q];
        size_t off = (size_t)q * kv->max_blocks;
        if (s->dirty && s->n_blocks > 0)
            kv->be->ops->upload(kv->be, kv->blk.tables + off, kv->blk.tables_host + off,
                                (size_t)s->n_blocks * sizeof(int32_t));
        if (has_swa(kv) && s->swa_dirty && s->swa_n > 0)
            kv->be->ops->upload(kv->be, kv->swa.blk.tables + off, kv->swa.blk.tables_host + off,
                                (size_t)s->swa_n * sizeof(int32_t));
        s->dirty = s->swa_dirty = false;
    }
}

// ---- prefix cache ----

/* Entry b (full block i of seq, just registered) and seq's sliding block of the same
 * positions: the entry adopts seq's block, or seq shares the entry's. */
static void side_register(struct kv_cache *kv, int seq, int i, int32_t b)
{
    struct kv_swa *w = &kv->swa;
    struct kv_seq *s = &kv->seqs[seq];
    int32_t *t = seq_table(&w->blk, kv, seq);
    int32_t own = i >= s->swa_lo && i < s->swa_n ? t[i] : -1;
    if (own < 0 || w->side[b] == own || (i + 1) * kv->block_size > s->swa_len)
        return;
    if (w->side[b] < 0) {
        if (w->owner[own] < 0) {
            w->side[b] = own;
            w->owner[own] = b;
        }
        return;
    }
    /* the entry holds the same positions' rows already: share them */
    int32_t sb = w->side[b];
    if (w->blk.refcnt[sb]++ == 0)
        kv_lru_unlink(&w->blk.lru, sb);
    block_release(kv, &w->blk, own);
    t[i] = sb;
    s->swa_dirty = true;
}

void kv_prefix_register(struct kv_cache *kv, int seq, const int32_t *toks, int n)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return;
    struct kv_seq *s = &kv->seqs[seq];
    struct kv_prefix *px = &kv->px;
    int bs = kv->block_size, full = (n < s->len ? n : s->len) / bs;
    int32_t *t = seq_table(&kv->blk, kv, seq);
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
            if (kv->blk.refcnt[b]++ == 0)
                kv_lru_unlink(&kv->blk.lru, b);
            block_release(kv, &kv->blk, t[i]);
            t[i] = b;
            s->dirty = true;
        }
        if (has_swa(kv))
            side_register(kv, seq, i, b);
        s->chain = px->serial[b];
        s->n_indexed = i + 1;
    }
}

/* Whether a hit of the first k matched entries m[0..k) is usable: the last window of
 * sliding blocks is still attached (a query at k * block_size needs them), and with
 * recurrent layers entry k - 1 has a snapshot of the states (ADR 0129). */
static bool hit_usable(const struct kv_cache *kv, const int32_t *m, int k)
{
    if (kv->n_rec > 0 && !kv_snap_has(kv, m[k - 1]))
        return false;
    if (!has_swa(kv))
        return true;
    int i = window_first_block(k * kv->block_size, kv->swa.window, kv->block_size);
    while (i < k && kv->swa.side[m[i]] >= 0)
        i++;
    return i == k;
}

/* Blocks of the longest chain of indexed entries matching the full blocks of toks[0 .. n),
 * at most max_blocks; their ids into m (may be NULL). */
static int index_match(const struct kv_cache *kv, const int32_t *toks, int n, int32_t *m)
{
    const struct kv_prefix *px = &kv->px;
    int bs = kv->block_size, full = n / bs, k = 0;
    uint64_t chain = 0;
    if (full > kv->max_blocks)
        full = kv->max_blocks;
    for (; k < full; k++) {
        const int32_t *bt = toks + (size_t)k * bs;
        int32_t b = index_find(kv, block_hash(px, chain, bt, bs), chain, bt);
        if (b < 0)
            break;
        if (m)
            m[k] = b;
        chain = px->serial[b];
    }
    return k;
}

int kv_prefix_match(const struct kv_cache *kv, const int32_t *toks, int n)
{
    return n > 0 ? index_match(kv, toks, n, NULL) * kv->block_size : 0;
}

int kv_prefix_attach(struct kv_cache *kv, int seq, const int32_t *toks, int n)
{
    if (seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used || kv->seqs[seq].n_blocks > 0 || n <= 0)
        return 0;
    struct kv_seq *s = &kv->seqs[seq];
    struct kv_prefix *px = &kv->px;
    int bs = kv->block_size, k;
    int32_t *t = seq_table(&kv->blk, kv, seq);
    /* the matched chain into the table first, references taken after the sliding and
     * snapshot checks */
    int matched = index_match(kv, toks, n, t);
    k = matched;
    while (k > 0 && !hit_usable(kv, t, k))
        k--;
    if (kv->n_rec > 0 && k > 0)
        kv_snap_restore(kv, seq, t[k - 1]);
    for (int i = 0; i < k; i++) {
        if (kv->blk.refcnt[t[i]]++ == 0)
            kv_lru_unlink(&kv->blk.lru, t[i]);
        s->chain = px->serial[t[i]];
    }
    for (int i = k; i < matched; i++)
        t[i] = -1;
    s->n_blocks = s->n_indexed = k;
    s->len = k * bs;
    s->dirty = true;
    if (has_swa(kv) && k > 0) {
        struct kv_swa *w = &kv->swa;
        int32_t *ts = seq_table(&w->blk, kv, seq);
        s->swa_lo = window_first_block(s->len, w->window, bs);
        for (int i = s->swa_lo; i < k; i++) {
            ts[i] = w->side[t[i]];
            if (w->blk.refcnt[ts[i]]++ == 0)
                kv_lru_unlink(&w->blk.lru, ts[i]);
        }
        s->swa_n = k;
        s->swa_len = s->len;
        s->swa_dirty = true;
    }
    return s->len;
}

void kv_prefix_clear(struct kv_cache *kv)
{
    struct kv_prefix *px = &kv->px;
    while (kv->blk.lru.head >= 0) {
        int32_t b = kv->blk.lru.head;
        kv_lru_unlink(&kv->blk.lru, b);
        index_remove(kv, b);
        kv->blk.free_list[kv->blk.n_free++] = b;
    }
    for (int32_t b = 0; b < kv->n_blocks; b++)
        if (px->serial[b] != 0)
            index_remove(kv, b);
    for (int q = 0; q < kv->max_seqs; q++) {
        kv->seqs[q].n_indexed = 0;
        kv->seqs[q].chain = 0;
    }
}

// ---- checks ----

/* One pool: refcounts equal the table entries holding each block (held: [n_blocks]
 * scratch), the LRU list holds exactly the indexed unheld blocks, and held + free +
 * cached = n_blocks. */
static int check_pool(const struct kv_cache *kv, const struct kv_blocks *k, int32_t *held,
                      const char *what, struct err *e)
{
    bool swa = k != &kv->blk;
    int n_held = 0, n_lru = 0, n_idle = 0;
    memset(held, 0, (size_t)k->n_blocks * sizeof *held);
    for (int q = 0; q < kv->max_seqs; q++) {
        const struct kv_seq *s = &kv->seqs[q];
        const int32_t *t = seq_table(k, kv, q);
        int lo = swa ? s->swa_lo : 0, hi = swa ? s->swa_n : s->n_blocks;
        for (int i = lo; s->used && i < hi; i++) {
            if (t[i] < 0 || t[i] >= k->n_blocks)
                return err_setf(e, ERR_INTERNAL, "%s pool: sequence %d entry %d holds no block", what,
                                q, i);
            held[t[i]]++;
        }
    }
    for (int32_t b = 0; b < k->n_blocks; b++) {
        if (held[b] != k->refcnt[b])
            return err_setf(e, ERR_INTERNAL, "%s pool: block %d: refcount %d, held by %d tables",
                            what, b, k->refcnt[b], held[b]);
        n_held += held[b] > 0;
        n_idle += held[b] == 0 && block_indexed(kv, k, b);
    }
    for (int32_t b = k->lru.head; b >= 0; b = k->lru.next[b], n_lru++)
        if (k->refcnt[b] != 0 || !block_indexed(kv, k, b) || n_lru > k->n_blocks)
            return err_setf(e, ERR_INTERNAL, "%s pool: block %d on the LRU list is held or not "
                            "indexed", what, b);
    if (n_lru != k->lru.n || n_lru != n_idle)
        return err_setf(e, ERR_INTERNAL, "%s pool: %d blocks on the LRU list (count %d), %d indexed "
                        "and unheld", what, n_lru, k->lru.n, n_idle);
    if (n_held + k->n_free + k->lru.n != k->n_blocks)
        return err_setf(e, ERR_INTERNAL, "%s pool: %d held + %d free + %d cached blocks != %d", what,
                        n_held, k->n_free, k->lru.n, k->n_blocks);
    return 0;
}

/* The index's bucket chains hold exactly the indexed blocks; sides and owners agree. */
static int check_index(const struct kv_cache *kv, struct err *e)
{
    const struct kv_prefix *px = &kv->px;
    int n_chained = 0;
    for (int k = 0; k < px->n_buckets; k++)
        for (int32_t b = px->bucket[k]; b >= 0; b = px->next[b], n_chained++)
            if (px->serial[b] == 0 || n_chained > kv->n_blocks)
                return err_setf(e, ERR_INTERNAL, "block %d in bucket %d is not indexed", b, k);
    if (n_chained != px->n_indexed)
        return err_setf(e, ERR_INTERNAL, "%d blocks in the index (count %d)", n_chained,
                        px->n_indexed);
    for (int32_t b = 0; has_swa(kv) && b < kv->n_blocks; b++) {
        int32_t sb = kv->swa.side[b];
        if (sb >= 0 && (px->serial[b] == 0 || kv->swa.owner[sb] != b))
            return err_setf(e, ERR_INTERNAL, "entry %d: sliding block %d is not its own", b, sb);
    }
    for (int32_t sb = 0; has_swa(kv) && sb < kv->swa.blk.n_blocks; sb++) {
        int32_t b = kv->swa.owner[sb];
        if (b >= 0 && kv->swa.side[b] != sb)
            return err_setf(e, ERR_INTERNAL, "sliding block %d: its entry %d does not hold it", sb, b);
    }
    return 0;
}

int kv_check(const struct kv_cache *kv, struct err *e)
{
    int n = kv->n_blocks > kv->swa.blk.n_blocks ? kv->n_blocks : kv->swa.blk.n_blocks;
    int32_t *held = calloc((size_t)n, sizeof *held);
    int rc;
    if (!held)
        return err_setf(e, ERR_NOMEM, "kv_check: out of memory");
    if ((rc = check_pool(kv, &kv->blk, held, "full", e)) == 0 &&
        (!has_swa(kv) || (rc = check_pool(kv, &kv->swa.blk, held, "sliding", e)) == 0) &&
        (rc = check_index(kv, e)) == 0)
        rc = kv_snap_check(kv, e);
    free(held);
    return rc;
}
