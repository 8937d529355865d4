/*
 * kvcache_impl: what kvcache.c and kvcache_snap.c share (the snapshots of recurrent states
 * for the prefix cache, ADR 0129). Not for other modules.
 */
#pragma once
#include "kvcache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kv's block lists (kvcache.c). */
void kv_lru_unlink(struct kv_lru *l, int32_t b);
void kv_lru_push(struct kv_lru *l, int32_t b);

/* The snapshot slots' bookkeeping for n_snap (kv_params.n_snap) after the states are
 * allocated (kv->n_rec, kv->n_blocks known); host memory only. -ERR_NOMEM. */
int kv_snap_init(struct kv_cache *kv, int n_snap, struct err *e);
/* Frees what kv_snap_init and the first snapshot allocated. */
void kv_snap_deinit(struct kv_cache *kv);
/* Index entry b goes (unindexed): its snapshot, if any, is dropped. */
void kv_snap_detach(struct kv_cache *kv, int32_t b);
/* Whether index entry b has a snapshot. */
bool kv_snap_has(const struct kv_cache *kv, int32_t b);
/* Entry b's snapshot copied into seq's states (b has one); it becomes the most recently
 * used. */
void kv_snap_restore(struct kv_cache *kv, int seq, int32_t b);
/* Slots agree with the entries they name (kv_check). */
int kv_snap_check(const struct kv_cache *kv, struct err *e);

#ifdef __cplusplus
}
#endif
