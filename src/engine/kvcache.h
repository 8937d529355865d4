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
 * Per-layer cache kinds come from the layer specs: full layers keep one K and
 * one V row per position; sliding-window layers (a query at p attends (p -
 * window, p]) have their own, smaller pool of blocks and their own tables
 * (ADR 0023): a sequence holds only the sliding blocks some later query can
 * still see, so its sliding layers keep at most the window plus one block
 * (plus one forward chunk while it is computed); a latent (MLA) layer keeps
 * one row per position, kv_lora_rank + qk_rope_dim floats (the normalized latent and the
 * roped shared key), which is its K and its V (layer.v == layer.k; ADR 0019);
 * a recurrent layer (SSM, linear attention, short convolution: ADR 0057) keeps no rows in
 * the pool but a fixed-size f32 state per sequence id, in a buffer of its own (state): its
 * kv_layer's k is the convolution states [max_seqs][state_conv], v the recurrent states
 * [max_seqs][state_rec]; the kernels start a sequence's state from zero at its position 0.
 * A model with recurrent layers cannot truncate a sequence except to 0 (a state does not
 * go back), and forks copy the state. Its prefix cache needs snapshots (ADR 0129): a copy of a
 * sequence's states taken when its length is a registered block boundary, kept with that
 * block's index entry (and dropped with it), in a buffer of kv_params.n_snap slots reused
 * least recently used first; a hit must end where a snapshot is, which is copied into the new
 * sequence's states. Elements are f32, or
 * f16 / bf16 on a backend that keeps them (kv_params.dtype, ADR 0030).
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
 * caller registers it, so the cache is off for callers that never do. An
 * index entry also keeps the sliding block of the same positions while the
 * sliding pool has room; a hit is as long as the longest matched chain whose
 * last window of sliding blocks is still there.
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
    enum dtype dtype;    /* element type: F32, or F16 / BF16 where the backend keeps them
                          * (backend.kv_dtypes; the CPU does): half the bytes, K and V
                          * rounded to it when stored */
    int swa_slack;       /* sliding-window layers: positions kept beyond the window, so a
                          * sequence can step back that far (speculative decoding's
                          * rollback; kv_step_back_max); 0: none */
    int n_batch;         /* most rows of one sequence in one forward chunk (the context's
                          * n_batch): sizes the sliding-window pool; <= 0: no bound (the
                          * sliding pool gets as many blocks as the full one) */
    int n_snap;          /* recurrent layers: most prefix-cache snapshots of the states kept at
                          * once (ADR 0129); 0: kv_snap_default; < 0: none (no prefix hits on
                          * such a model). The buffer is allocated at the first snapshot, with
                          * half as many slots while the backend refuses it. */
};

/* Snapshots kept when kv_params.n_snap is 0: two per sequence id, or as many as 64 MiB
 * holds when that is more, never more than the pool has blocks (a snapshot belongs to an
 * index entry). snap_bytes: bytes of one snapshot (all recurrent layers of one sequence). */
int kv_snap_default(size_t snap_bytes, int max_seqs, int n_blocks);

struct kv_seq {
    bool used;
    int len;             /* positions stored */
    int n_blocks;        /* blocks in its table */
    bool dirty;          /* table changed since the last upload */
    int n_indexed;       /* leading blocks whose content is in the prefix index */
    uint64_t chain;      /* serial of the index entry of block n_indexed - 1 (0: none) */
    /* sliding-window layers: table entries [swa_lo, swa_n) hold blocks, those below are
     * -1 (released: no later query sees them); positions [0, swa_len) are stored */
    int swa_lo, swa_n, swa_len;
    bool swa_dirty;      /* sliding table changed since the last upload */
    int ckpt;            /* recurrent layers: length of the checkpoint of its states (kv_seq_checkpoint,
                          * ADR 0112); 0: none */
};

/* Blocks held by no sequence but kept for the prefix index, least recently used first. */
struct kv_lru {
    int32_t *prev, *next;            /* [n_blocks] */
    int32_t head, tail;
    int n;
};

/* One block allocator and its per-sequence tables: the full pool (every non-sliding
 * layer) or the sliding-window pool. A block is free (on free_list), held (refcnt > 0)
 * or cached (refcnt 0, indexed, on lru). */
struct kv_blocks {
    int n_blocks;
    int32_t *refcnt;                 /* [n_blocks] table entries holding each block */
    int32_t *free_list;              /* [n_blocks] free block ids (stack) */
    int n_free;
    struct kv_lru lru;
    int32_t *tables_host;            /* [max_seqs][max_blocks] block tables; -1: none */
    int32_t *tables;                 /* backend mirror of tables_host */
};

/* The sliding-window layers' pool (ADR 0023); window 0: the model has no sliding layer. */
struct kv_swa {
    int window;                      /* the largest window of the sliding layers */
    int keep;                        /* window + kv_params.swa_slack: positions a sequence keeps */
    int n_layer;                     /* sliding layers */
    struct kv_blocks blk;
    int32_t *owner;                  /* [blk.n_blocks] index entry (full block) it belongs to, -1 */
    int32_t *side;                   /* [full n_blocks] sliding block of each index entry, -1 */
    int32_t *from, *to;              /* [max_seqs] scratch of kv_reserve_window */
};

/* Prefix-cache snapshots of the recurrent states (ADR 0129): n slots of `per` floats (every
 * recurrent layer's conv row, then its recurrent row), in one backend buffer allocated at the
 * first snapshot. A slot is free or holds the states of the index entry entry[slot] (a full-pool
 * block, whose serial was serial[slot] when taken) at that entry's end; used slots are on lru,
 * least recently used (taken or attached) first, and a snapshot is wanted when none is free. */
struct kv_snap {
    int n;                           /* slots (0: no snapshots) */
    size_t per;                      /* floats per snapshot */
    void *buf;                       /* backend [n][per] f32; NULL until the first snapshot */
    bool failed;                     /* allocating buf failed: no snapshots from then on */
    int32_t *entry;                  /* [n] full-pool block of the entry, -1: free */
    uint64_t *serial;                /* [n] its serial when taken */
    int32_t *of;                     /* [full n_blocks] slot of each entry's snapshot, -1 */
    int32_t *free_list;              /* [n] */
    int n_free;
    struct kv_lru lru;               /* used slots */
    uint64_t n_taken, n_evicted;     /* snapshots taken; of them, dropped to make room */
};

/* The prefix index (per block of the full pool, [n_blocks] arrays). A block is indexed
 * when serial[b] != 0; an indexed block with refcnt 0 is on the full pool's LRU list. */
struct kv_prefix {
    uint64_t *hash;                  /* hash of (parent, tokens), masked by hash_mask */
    uint64_t *serial;                /* unique id of the entry (never reused); 0: not indexed */
    uint64_t *parent;                /* serial of the entry before it; 0 at position 0 */
    int32_t *toks;                   /* [n_blocks][block_size] the block's token ids */
    int32_t *next;                   /* bucket chain */
    int32_t *bucket;                 /* [n_buckets] first block of each bucket, -1: empty */
    int n_buckets, n_indexed;
    uint64_t next_serial;
    uint64_t hash_mask;              /* ~0; a test sets 0 to make every block collide */
};

struct kv_cache {
    struct backend *be;              /* borrowed */
    int n_layer, block_size, max_seqs, max_blocks, max_seq_len;
    enum dtype dtype;                /* element type of the pool */
    int n_blocks;                    /* blocks of the full pool (blk.n_blocks) */
    void *pool;                      /* backend memory of every layer's K and V */
    struct kv_layer *layers;         /* [n_rank][n_layer] views into pool (recurrent: into state) */
    int n_rank;                      /* a tensor-parallel model's ranks (models/tp.h): each keeps
                                      * the K/V of its heads and its own recurrent states; else 1 */
    bool *layer_swa;                 /* [n_layer] the layer lives in the sliding pool */
    bool *layer_rec;                 /* [n_layer] the layer keeps a recurrent state */
    int n_rec;                       /* recurrent layers */
    void *state;                     /* backend memory of the recurrent layers' states */
    size_t state_bytes;              /* its size */
    void *ckpt;                      /* checkpoints of the states, the same layout (allocated by the
                                      * first kv_seq_checkpoint; ADR 0112) */
    struct kv_blocks blk;            /* the full pool: full and latent layers */
    struct kv_swa swa;
    struct kv_seq *seqs;             /* [max_seqs] */
    int32_t *want;                   /* [max_seqs] scratch for kv_reserve */
    struct kv_prefix px;
    struct kv_snap snap;
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
/* keep [0, len); with recurrent layers only len 0, the current length, or the length of the
 * sequence's checkpoint (its recurrent states are restored from it; kv_seq_checkpoint), else
 * -ERR_UNSUPPORTED */
int kv_seq_truncate(struct kv_cache *kv, int seq, int len, struct err *e);
int kv_seq_fork(struct kv_cache *kv, int src, int dst, struct err *e); /* dst unused */
/* How many positions back from its end any sequence can be truncated at any time
 * (speculative decoding's rollback): 0 with recurrent layers (their state holds every
 * position), kv_params.swa_slack with sliding-window layers (their blocks older than the
 * window are released as the forward passes them, unless the slack keeps them), else
 * INT_MAX. */
int kv_step_back_max(const struct kv_cache *kv);
/* kv_step_back_max(kv) > 0. */
bool kv_can_step_back(const struct kv_cache *kv);
/* Recurrent layers (ADR 0112): saves seq's recurrent states (conv and recurrent rows, copied
 * in backend memory) as its checkpoint at its current length, replacing any earlier one, so
 * that kv_seq_truncate can go back to that length (the states restored; attention layers
 * truncate as always). The checkpoint stands while the sequence keeps its first ckpt
 * positions (dropped by a truncation below it, remove, add). No-op (0) without recurrent
 * layers; -ERR_NOMEM when the checkpoints' buffer (the size of the states') cannot be
 * allocated on first use. */
int kv_seq_checkpoint(struct kv_cache *kv, int seq, struct err *e);
/* Length of seq's checkpoint; 0: none. */
int kv_seq_checkpoint_len(const struct kv_cache *kv, int seq);
/* Whether kv has recurrent layers. */
bool kv_has_recurrent(const struct kv_cache *kv);
/* How many drafted positions one verification step can take back (speculative decoding,
 * ADR 0079 / 0112): kv_step_back_max without recurrent layers; with them a rejected draft
 * goes back to the checkpoint taken before the step (one position before the step's first
 * row), so INT_MAX, or swa_slack - 1 with sliding-window layers too. */
int kv_spec_back_max(const struct kv_cache *kv);
/* Positions stored for seq; -1 when seq is not in use. */
int kv_seq_len(const struct kv_cache *kv, int seq);
/* Blocks of the full pool not held by any sequence: never used, or cached (reclaimable).
 * Admission and preemption count these: the sliding pool is sized so that it never runs
 * out first (ADR 0023). */
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
 * multiple of block_size, <= n); seq's length becomes that. With recurrent layers the
 * chain ends at the longest matched entry that has a snapshot (ADR 0129), whose states are
 * copied into seq's; none: nothing is attached (0). */
int kv_prefix_attach(struct kv_cache *kv, int seq, const int32_t *toks, int n);
/* Positions of the longest chain of indexed blocks matching the full blocks of toks[0 .. n),
 * whatever snapshots and sliding blocks exist (what kv_prefix_attach could attach at best).
 * Changes nothing. */
int kv_prefix_match(const struct kv_cache *kv, const int32_t *toks, int n);
/* Recurrent layers (ADR 0129): keep a copy of seq's states as the snapshot of the index
 * entry of its last block. The caller's promise: the states are those after seq's len
 * positions (as after every forward). Requires len > 0, a multiple of block_size, and every
 * block registered (kv_prefix_register through len); otherwise, or without recurrent layers
 * or snapshots (kv_params.n_snap < 0), nothing happens (0). Returns 1 when a snapshot was
 * taken (the least recently used one dropped when every slot is used), 0 when the entry had
 * one already (it becomes the most recently used); -ERR_NOMEM when the snapshots' buffer
 * cannot be allocated at the first one (snapshots stay off from then on). */
int kv_prefix_snapshot(struct kv_cache *kv, int seq, struct err *e);
/* Drops the snapshot of the index entry of seq's block that ends at position len (a
 * multiple of block_size within its registered blocks), if it has one; else nothing. */
void kv_prefix_unsnap(struct kv_cache *kv, int seq, int len);
/* Whether kv_prefix_snapshot can keep anything: recurrent layers and snapshot slots. */
bool kv_can_snapshot(const struct kv_cache *kv);
/* Snapshots kept now (0 without recurrent layers). */
int kv_n_snapshots(const struct kv_cache *kv);
/* Drop every cached block and unindex every block (the index is emptied). */
void kv_prefix_clear(struct kv_cache *kv);
/* Checks the pool's bookkeeping: every refcount equals the number of table entries
 * holding the block, free + cached + held blocks = n_blocks, the LRU list holds exactly
 * the indexed unheld blocks, the index's bucket chains hold exactly the indexed
 * blocks, and every snapshot belongs to an indexed entry of the serial it was taken for.
 * -ERR_INTERNAL names the first violation. (For tests.) */
int kv_check(const struct kv_cache *kv, struct err *e);

/* Make room for positions [len, want[seq]) of every sequence with want[seq] > len
 * (want: [max_seqs], -1 / <= len: untouched) in the full pool: allocate blocks and copy
 * shared blocks about to be written. All or nothing: when the pool cannot hold it,
 * nothing changes and -ERR_NOMEM says how many blocks were needed. Lengths become want.
 * The sliding pool follows chunk by chunk (kv_reserve_window). */
int kv_reserve(struct kv_cache *kv, const int32_t *want, struct err *e);
/* The sliding pool's part of one forward chunk of n rows (row i: position pos[i] of
 * sequence seq[i], each sequence's rows at consecutive positions, reserved by
 * kv_reserve): every sequence in the chunk first releases the sliding blocks no query at
 * or after its first row can see, then holds blocks through its last row (a shared or
 * indexed last block is copied first). No-op for a model without sliding layers.
 * -ERR_NOMEM when the sliding pool is short (a chunk longer than kv_params.n_batch);
 * the releases stand, nothing else changes. */
int kv_reserve_window(struct kv_cache *kv, const int32_t *seq, const int32_t *pos, int n,
                      struct err *e);
/* Slot of position pos of seq (pos < its length) in the full pool. */
int32_t kv_slot(const struct kv_cache *kv, int seq, int pos);
/* Slot of position pos of seq in the sliding pool (reserved by kv_reserve_window). */
int32_t kv_slot_window(const struct kv_cache *kv, int seq, int pos);
/* Blocks of the sliding pool held by sequences (neither free nor cached); 0 without one. */
int kv_window_blocks_held(const struct kv_cache *kv);
/* Most sliding blocks one sequence holds after a chunk of n_rows rows (window w, blocks of
 * bs): the window before its first row plus the chunk, plus one block of misalignment. */
int kv_window_seq_blocks(int w, int n_rows, int bs);
/* Upload the block tables that changed. */
void kv_sync_tables(struct kv_cache *kv);

#ifdef __cplusplus
}
#endif
