/*
 * kvcache_snap: snapshots of the recurrent layers' states for the prefix cache (ADR 0129).
 *
 * A recurrent state cannot be rebuilt from a cached block's rows, nor cut back to a block
 * boundary: a prefix hit on such a model needs the states as they stood right after the hit's
 * last position. A snapshot is that copy, taken from a sequence whose length is a registered
 * block boundary (the scheduler makes a prompt chunk end there), and kept with the index
 * entry of the block that ends there: an entry stands for exactly one token prefix (ADR
 * 0022), so its snapshot is exactly the states after that prefix. The snapshot goes when its
 * entry goes (block eviction, kv_prefix_clear), or earlier when the slots run out (least
 * recently used first): a hit then ends at an earlier entry that still has one, or nothing
 * is attached. Never a wrong state: a slot also keeps the serial of the entry it was taken
 * for, and kv_check holds them to each other.
 *
 * Slot layout: every recurrent layer in order, its conv row then its recurrent row, the rows
 * of one sequence id in the live states (kv->state); copies go through the backend's copy op
 * (device to device on CUDA), as the checkpoints of speculation do (ADR 0112).
 */
#include "kvcache_impl.h"

#include <stdlib.h>
#include <string.h>

#include "../core/log.h"

/* 64 MiB: the least the default keeps for snapshots of small states (an LFM2-1.2B snapshot is
 * 160 KiB: 409 of them), where two per sequence id would be few. */
#define KV_SNAP_MIN_BYTES ((size_t)64 << 20)

int kv_snap_default(size_t snap_bytes, int max_seqs, int n_blocks)
{
    int64_t n = 2 * (int64_t)max_seqs;
    if (snap_bytes > 0 && (int64_t)(KV_SNAP_MIN_BYTES / snap_bytes) > n)
        n = (int64_t)(KV_SNAP_MIN_BYTES / snap_bytes);
    return (int)(n < n_blocks ? n : n_blocks);
}

int kv_snap_init(struct kv_cache *kv, int n_snap, struct err *e)
{
    struct kv_snap *sn = &kv->snap;
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++)
        if (kv->layer_rec[i % kv->n_layer])
            sn->per += (size_t)kv->layers[i].k_dim + (size_t)kv->layers[i].v_dim;
    if (kv->n_rec == 0 || n_snap < 0)
        return 0;
    sn->n = n_snap == 0 ? kv_snap_default(sn->per * sizeof(float), kv->max_seqs, kv->n_blocks)
                        : n_snap < kv->n_blocks ? n_snap : kv->n_blocks;
    sn->entry = malloc((size_t)sn->n * sizeof *sn->entry);
    sn->serial = calloc((size_t)sn->n, sizeof *sn->serial);
    sn->free_list = malloc((size_t)sn->n * sizeof *sn->free_list);
    sn->lru.prev = malloc((size_t)sn->n * sizeof *sn->lru.prev);
    sn->lru.next = malloc((size_t)sn->n * sizeof *sn->lru.next);
    sn->of = malloc((size_t)kv->n_blocks * sizeof *sn->of);
    if (!sn->entry || !sn->serial || !sn->free_list || !sn->lru.prev || !sn->lru.next || !sn->of)
        return err_setf(e, ERR_NOMEM, "kv cache: out of memory (snapshot slots)");
    for (int i = 0; i < sn->n; i++) {
        sn->entry[i] = sn->lru.prev[i] = sn->lru.next[i] = -1;
        sn->free_list[i] = sn->n - 1 - i;
    }
    for (int b = 0; b < kv->n_blocks; b++)
        sn->of[b] = -1;
    sn->lru.head = sn->lru.tail = -1;
    sn->n_free = sn->n;
    return 0;
}

void kv_snap_deinit(struct kv_cache *kv)
{
    struct kv_snap *sn = &kv->snap;
    if (sn->buf)
        kv->be->ops->buf_free(kv->be, sn->buf);
    free(sn->entry);
    free(sn->serial);
    free(sn->free_list);
    free(sn->lru.prev);
    free(sn->lru.next);
    free(sn->of);
}

/* seq's states copied into slot (save) or from it. */
static void snap_copy(struct kv_cache *kv, int seq, int32_t slot, bool save)
{
    char *p = (char *)kv->snap.buf + (size_t)slot * kv->snap.per * sizeof(float);
    for (int i = 0; i < kv->n_layer * kv->n_rank; i++) {
        if (!kv->layer_rec[i % kv->n_layer])
            continue;
        const struct kv_layer *L = &kv->layers[i];
        size_t kb = (size_t)L->k_dim * sizeof(float), vb = (size_t)L->v_dim * sizeof(float);
        char *k = (char *)L->k + (size_t)seq * kb, *v = (char *)L->v + (size_t)seq * vb;
        if (kb)
            kv->be->ops->copy(kv->be, save ? p : k, save ? k : p, kb);
        p += kb;
        if (vb)
            kv->be->ops->copy(kv->be, save ? p : v, save ? v : p, vb);
        p += vb;
    }
}

/* The slots' buffer, at the first snapshot: n slots, or half as many as long as the backend
 * refuses (a GPU whose memory the weights and the pool took), at least one; the slots not
 * had are dropped from the free list (none is used yet). -ERR_NOMEM: not even one, and no
 * snapshots from then on. */
static int snap_alloc(struct kv_cache *kv, struct err *e)
{
    struct kv_snap *sn = &kv->snap;
    int want = sn->n;
    for (int n = sn->n; n > 0; n /= 2) {
        size_t bytes = (size_t)n * sn->per * sizeof(float);
        if (kv->be->ops->buf_alloc(kv->be, bytes, &sn->buf, e) < 0) {
            sn->buf = NULL;
            continue;
        }
        sn->n = sn->n_free = n;
        for (int i = 0; i < n; i++)
            sn->free_list[i] = n - 1 - i;
        LOG_INFO("prefix cache: up to %d snapshots of the recurrent states%s, %zu KiB each (%zu MiB)", n,
                 n < want ? " (fewer than planned: memory)" : "", sn->per * sizeof(float) >> 10, bytes >> 20);
        return 0;
    }
    sn->failed = true;
    return err_prefix(e, "prefix-cache snapshots of the recurrent states (%d of %zu KiB)", want,
                      sn->per * sizeof(float) >> 10);
}

/* The most recently used slot becomes slot. */
static void snap_touch(struct kv_snap *sn, int32_t slot)
{
    kv_lru_unlink(&sn->lru, slot);
    kv_lru_push(&sn->lru, slot);
}

void kv_snap_detach(struct kv_cache *kv, int32_t b)
{
    struct kv_snap *sn = &kv->snap;
    int32_t slot;
    if (sn->n == 0 || (slot = sn->of[b]) < 0)
        return;
    sn->of[b] = -1;
    sn->entry[slot] = -1;
    sn->serial[slot] = 0;
    kv_lru_unlink(&sn->lru, slot);
    sn->free_list[sn->n_free++] = slot;
}

bool kv_snap_has(const struct kv_cache *kv, int32_t b)
{
    return kv->snap.n > 0 && kv->snap.of[b] >= 0;
}

void kv_snap_restore(struct kv_cache *kv, int seq, int32_t b)
{
    int32_t slot = kv->snap.of[b];
    snap_copy(kv, seq, slot, false);
    snap_touch(&kv->snap, slot);
}

bool kv_can_snapshot(const struct kv_cache *kv)
{
    return kv->n_rec > 0 && kv->snap.n > 0 && !kv->snap.failed;
}

int kv_n_snapshots(const struct kv_cache *kv)
{
    return kv->snap.n - kv->snap.n_free;
}

int kv_prefix_snapshot(struct kv_cache *kv, int seq, struct err *e)
{
    struct kv_snap *sn = &kv->snap;
    if (!kv_can_snapshot(kv) || seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used)
        return 0;
    const struct kv_seq *s = &kv->seqs[seq];
    int bs = kv->block_size;
    if (s->len <= 0 || s->len % bs != 0 || s->n_indexed * bs != s->len)
        return 0;
    int32_t b = kv->blk.tables_host[(size_t)seq * kv->max_blocks + s->len / bs - 1];
    if (kv->px.serial[b] == 0)
        return 0;
    if (sn->of[b] >= 0) {
        snap_touch(sn, sn->of[b]);
        return 0;
    }
    if (!sn->buf && snap_alloc(kv, e) < 0)
        return -ERR_NOMEM;
    int32_t slot;
    if (sn->n_free > 0) {
        slot = sn->free_list[--sn->n_free];
    } else {
        slot = sn->lru.head;
        kv_lru_unlink(&sn->lru, slot);
        sn->of[sn->entry[slot]] = -1;
        sn->n_evicted++;
    }
    snap_copy(kv, seq, slot, true);
    sn->entry[slot] = b;
    sn->serial[slot] = kv->px.serial[b];
    sn->of[b] = slot;
    kv_lru_push(&sn->lru, slot);
    sn->n_taken++;
    return 1;
}

void kv_prefix_unsnap(struct kv_cache *kv, int seq, int len)
{
    if (kv->snap.n == 0 || seq < 0 || seq >= kv->max_seqs || !kv->seqs[seq].used || len <= 0 ||
        len % kv->block_size != 0 || len > kv->seqs[seq].n_indexed * kv->block_size)
        return;
    kv_snap_detach(kv, kv->blk.tables_host[(size_t)seq * kv->max_blocks + len / kv->block_size - 1]);
}

int kv_snap_check(const struct kv_cache *kv, struct err *e)
{
    const struct kv_snap *sn = &kv->snap;
    int used = 0, listed = 0;
    if (sn->n == 0)
        return 0;
    for (int32_t slot = 0; slot < sn->n; slot++) {
        int32_t b = sn->entry[slot];
        if (b < 0)
            continue;
        used++;
        if (b >= kv->n_blocks || sn->of[b] != slot)
            return err_setf(e, ERR_INTERNAL, "snapshot %d: its entry %d does not hold it", slot, b);
        if (kv->px.serial[b] == 0 || kv->px.serial[b] != sn->serial[slot])
            return err_setf(e, ERR_INTERNAL, "snapshot %d: entry %d is not the one it was taken for "
                            "(serial %llu, taken for %llu)", slot, b, (unsigned long long)kv->px.serial[b],
                            (unsigned long long)sn->serial[slot]);
    }
    for (int32_t b = 0; b < kv->n_blocks; b++)
        if (sn->of[b] >= 0 && (sn->of[b] >= sn->n || sn->entry[sn->of[b]] != b))
            return err_setf(e, ERR_INTERNAL, "entry %d: snapshot %d is not its own", b, sn->of[b]);
    for (int32_t slot = sn->lru.head; slot >= 0; slot = sn->lru.next[slot], listed++)
        if (sn->entry[slot] < 0 || listed > sn->n)
            return err_setf(e, ERR_INTERNAL, "snapshot %d on the LRU list is free", slot);
    if (listed != used || sn->lru.n != used || used + sn->n_free != sn->n)
        return err_setf(e, ERR_INTERNAL, "snapshots: %d used, %d listed (count %d), %d free of %d", used,
                        listed, sn->lru.n, sn->n_free, sn->n);
    return 0;
}
