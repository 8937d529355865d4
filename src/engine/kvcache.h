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
 * Prefix cache (ADR 0022): full blocks can be registered in a content index
 * (kv_prefix_register) keyed by (the chain entry of the block before it,
 * the block's token ids); a new sequence attaches the longest indexed chain
 * of its prompt (kv_prefix_attach) instead of recomputing it. A registered
 * block whose last sequence lets go stays indexed as "cached": held by the
 * index only, counted as free (kv_n_free_blocks), and taken back, least
 * recently used first, when the pool runs out of never-used blocks. Lookups
 * compare the tokens and the parent entry, so a hash collision is a miss,
 * never a wrong block. Indexed blocks are never written: a write into one
 * copies it first, as into a shared block. Nothing is indexed unless a
 * caller registers it, so the cache is off for callers that never do.
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
    int n_indexed;       /* leading blocks whose content is in the prefix index */
    uint64_t chain;      /* serial of the index entry of block n_indexed - 1 (0: none) */
};

/* The prefix index and the cached-block LRU (per block, [n_blocks] arrays). A block is
 * indexed when serial[b] != 0; an indexed block with refcnt 0 is on the LRU list. */
struct kv_prefix {
    uint64_t *hash;                  /* hash of (parent, tokens), masked by hash_mask */
    uint64_t *serial;                /* unique id of the entry (never reused); 0: not indexed */
    uint64_t *parent;                /* serial of the entry before it; 0 at position 0 */
    int32_t *toks;                   /* [n_blocks][block_size] the block's token ids */
    int32_t *next;                   /* bucket chain */
    int32_t *bucket;                 /* [n_buckets] first block of each bucket, -1: empty */
    int32_t *lru_prev, *lru_next;    /* cached blocks, head = least recently used */
    int32_t lru_head, lru_tail;
    int n_buckets, n_indexed, n_lru;
    uint64_t next_serial;
    uint64_t hash_mask;              /* ~0; a test sets 0 to make every block collide */
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
    struct kv_prefix px;
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
/* Blocks not held by any sequence: never used, or cached (reclaimable). */
int kv_n_free_blocks(const struct kv_cache *kv);
/* Of them, cached: indexed blocks held by no sequence. */
int kv_n_cached_blocks(const struct kv_cache *kv);

/* Prefix cache. Register the full blocks of seq's first n positions, whose tokens are
 * toks[0 .. n) (the caller's promise: the ids the sequence's cache was computed from),
 * in the index; blocks already registered are skipped, and where the index holds the
 * block's content already (another sequence computed it), seq shares that block and its
 * own copy is released (seq's table changes: call between forwards). */
void kv_prefix_register(struct kv_cache *kv, int seq, const int32_t *toks, int n);
/* Attach to seq, which must be empty, the longest chain of indexed blocks matching the
 * full blocks of toks[0 .. n): shared, not copied. Returns the positions attached (a
 * multiple of block_size, <= n); seq's length becomes that. */
int kv_prefix_attach(struct kv_cache *kv, int seq, const int32_t *toks, int n);
/* Drop every cached block and unindex every block (the index is emptied). */
void kv_prefix_clear(struct kv_cache *kv);
/* Checks the pool's bookkeeping: every refcount equals the number of table entries
 * holding the block, free + cached + held blocks = n_blocks, the LRU list holds exactly
 * the indexed unheld blocks, and the index's bucket chains hold exactly the indexed
 * blocks. -ERR_INTERNAL names the first violation. (For tests.) */
int kv_check(const struct kv_cache *kv, struct err *e);

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
