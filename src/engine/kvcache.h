/*
 * kvcache: the paged KV cache. One pool of fixed-size blocks (block_size
 * token slots each, every layer's K and V rows of a slot), allocated through
 * the backend at creation from a token budget; per-sequence block tables map
 * position p to slot table[p / block_size] * block_size + p % block_size.
 *
 * Blocks are reference counted: kv_seq_fork shares the source's blocks with
 * the new sequence (prefix sharing, beam-style search), and the first write
 * into a shared block copies it (copy-on-write), so a forked sequence never
 * sees its sibling's later tokens. Truncate and remove return blocks to the
 * pool. The block tables are mirrored in backend memory (tables), uploaded
 * before a forward when they changed, so attention reads them on the device.
 *
 * Per-layer cache kinds come from the layer specs: full and sliding-window
 * layers keep one K and one V row per position (a sliding layer attends only
 * its last `window` positions); a latent (MLA) layer keeps one row per
 * position, kv_lora_rank + qk_rope_dim floats (the normalized latent and the
 * roped shared key), which is its K and its V (layer.v == layer.k; ADR 0019);
 * the recurrent kind is refused at creation until a family needs it. Elements are f32 (dtype is checked
 * at creation so f16/bf16 can follow).
 *
 * Sequences are ids in [0, max_seqs). Not thread-safe: one owner (the
 * generate loop or the scheduler) drives a cache.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/dtype.h"
#include "../models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_DEFAULT_BLOCK 16
/* Largest pool, in token slots (kv_params.n_tokens). */
#define KV_MAX_TOKENS (1 << 28)

struct kv_params {
    int n_tokens;        /* pool size in token slots (rounded up to whole blocks) */
    int max_seqs;        /* sequence ids [0, max_seqs) */
    int max_seq_len;     /* longest sequence; <= 0: the model's context length; above it: error */
    int block_size;      /* <= 0: KV_DEFAULT_BLOCK */
    enum dtype dtype;    /* element type; F32 today */
};

struct kv_seq {
    bool used;
    int len;             /* positions stored */
    int n_blocks;        /* blocks in its table */
    bool dirty;          /* table changed since the last upload */
};

struct kv_cache {
    struct backend *be;              /* borrowed */
    int n_layer, block_size, n_blocks, max_seqs, max_blocks, max_seq_len;
    void *pool;                      /* backend memory of every layer's K and V */
    struct kv_layer *layers;         /* [n_layer] views into pool */
    int32_t *refcnt;                 /* [n_blocks] sequences holding each block */
    int32_t *free_list;              /* [n_blocks] free block ids (stack) */
    int n_free;
    struct kv_seq *seqs;             /* [max_seqs] */
    int32_t *tables_host;            /* [max_seqs][max_blocks] block tables */
    int32_t *tables;                 /* backend mirror of tables_host */
    int32_t *want;                   /* [max_seqs] scratch for kv_reserve */
};

/* A cache for m on be. Errors: -ERR_ARG for bad params (names the field), -ERR_RANGE for a
 * max_seq_len above the model's context (both numbers named),
 * -ERR_UNSUPPORTED for a layer cache kind or dtype not supported, -ERR_NOMEM. */
int kv_cache_new(struct kv_cache **out, const struct model *m, struct backend *be,
                 const struct kv_params *p, struct err *e);
void kv_cache_free(struct kv_cache *kv);

/* Sequence operations. seq must be in [0, max_seqs) (-ERR_RANGE otherwise). */
int kv_seq_add(struct kv_cache *kv, int seq, struct err *e);          /* empty; -ERR_ARG if used */
void kv_seq_remove(struct kv_cache *kv, int seq);                     /* no-op if unused */
int kv_seq_truncate(struct kv_cache *kv, int seq, int len, struct err *e); /* keep [0, len) */
int kv_seq_fork(struct kv_cache *kv, int src, int dst, struct err *e); /* dst unused */
/* Positions stored for seq; -1 when seq is not in use. */
int kv_seq_len(const struct kv_cache *kv, int seq);
/* Blocks not held by any sequence. */
int kv_n_free_blocks(const struct kv_cache *kv);

/* Make room for positions [len, want[seq]) of every sequence with want[seq] > len
 * (want: [max_seqs], -1 / <= len: untouched): allocate blocks and copy shared blocks
 * about to be written. All or nothing: when the pool cannot hold it, nothing changes
 * and -ERR_NOMEM says how many blocks were needed. Lengths become want. */
int kv_reserve(struct kv_cache *kv, const int32_t *want, struct err *e);
/* Slot of position pos of seq (pos < its length). */
int32_t kv_slot(const struct kv_cache *kv, int seq, int pos);
/* Upload the block tables that changed. */
void kv_sync_tables(struct kv_cache *kv);

#ifdef __cplusplus
}
#endif
