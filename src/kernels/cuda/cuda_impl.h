/*
 * cuda_impl: what the CUDA backend's files share (internal to
 * src/kernels/cuda/). backend_cuda.cu holds the lifetime, memory, weights,
 * the plugin entry point and the ops' table; linear.cu the products
 * (fused dequant-GEMV for decode, bf16-split cuBLAS products for prefill) and
 * the embedding; mma.cu the tensor-core product over affine 4/8-bit codes
 * for prefill; elem.cu norms and elementwise ops; attn.cu rope, the paged
 * KV store and attention; moe.cu routing, grouping, expert linears, combine.
 *
 * Every op runs on the backend's one stream, records the first failure
 * (cu_fail) and becomes a no-op afterwards; sync reports it. Weights are
 * described to kernels by struct cu_wmat, passed by value. Between
 * graph_begin and graph_end the stream is being captured (graph.cu): ops
 * that need the host or an allocation call cu_not_capturable first.
 */
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../backend.h"

struct cu_alloc {
    void *p;
    struct cu_alloc *next;
};

/* fuse.cu (ADR 0138): the one op held back so that the next can fuse with it. An axpy (a
 * residual add) waits for a norm of the rows it wrote, a rope for the kv_store of the heads it
 * rotated; every other entry of the table launches it first (cu_flush), as the op it is. */
enum cu_pend_kind { CU_PEND_NONE = 0, CU_PEND_AXPY = 1, CU_PEND_ROPE = 2 };
struct cu_pend {
    int kind;                   /* enum cu_pend_kind */
    /* axpy: y[r, :n] += s * x[r, :n] over n_rows rows (strides ldy, ldx) */
    float *y;
    const float *x;
    int ldy, ldx, n_rows, n;
    float s;
    /* rope of n_head heads of head_dim in n_tok rows of q (stride ld) */
    float *q;
    int ld, n_tok, n_head, head_dim;
    struct rope_params rp;
    struct kv_rows rows;
};

/* One expert's prepared weight on the device (its codes or values, scales, biases) and its
 * output bias (NULL: none). */
struct cu_xent {
    const uint8_t *data, *qs, *qb;
    const void *bias;
};

/* prepare_experts' table of an expert_linear: key its views (el.w), d0 expert 0's device data
 * when the table was made (a later preparation moves the views: the table is then stale). */
struct cu_xtab {
    const struct tensor *key;
    const void *d0;
    struct cu_xent *dev;        /* [n] on the device */
    int n;
    int bdt;                    /* the output biases' element type (when the experts have them) */
    struct cu_xtab *next;
};

struct cuda_backend {
    struct backend be;
    int dev;
    cudaStream_t st;
    cublasHandle_t blas;
    struct cu_alloc *weights;   /* device copies made by prepare_weight, freed at destroy */
    struct cu_xtab *xtabs;      /* prepare_experts' tables (ADR 0143), freed at destroy */
    float *scr;                 /* scratch: dequantized weight panels */
    size_t scr_cap;             /* floats */
    int32_t *iscr;              /* int scratch (moe_combine's inverse order) */
    size_t iscr_cap;
    int32_t *h_off;             /* host copy of linear_experts' offsets */
    size_t h_off_cap;
    void *pin;                  /* pinned staging of large downloads (logits), grows only */
    size_t pin_cap;
    bool pdl;                   /* cu_launch lets kernels start early (backend_opts.cuda_pdl) */
    bool qi;                    /* one token's 4-bit GEMV on integer x (backend_opts.cuda_qi) */
    void *qi_x;                 /* ... its prepared x: cu_qi_x_bytes(), made with the backend */
    int qi_min_rows;            /* ... for launches of this many rows on (backend_opts.cuda_qi_min_rows) */
    bool attn_split;            /* decode attention over clusters of blocks (backend_opts.cuda_attn_split) */
    bool attn_flash;            /* decode attention split-K per KV group (backend_opts.cuda_attn_flash) */
    bool attn_fa2;              /* prefill attention in registers (backend_opts.cuda_attn_fa2) */
    int fd_ncl[3][4][5];        /* attn_decode.cu: clusters of 1..16 blocks the device runs at once,
                                 * per cache type (F32, F16, BF16) and heads a block (1, 2, 4, 8) */
    bool mma;                   /* affine 4/8-bit products of > 8 rows on mma.cu (backend_opts.cuda_mma) */
    bool moe_dev;               /* cu_linear_experts_dev (backend_opts.cuda_moe_dev, ADR 0143) */
    bool mmq;                   /* affine products past mma_max_tok rows on mmq.cu (backend_opts.cuda_mmq) */
    int mma_max_tok;            /* ... up to this many rows (backend_opts.cuda_mma_max_tokens) */
    bool chunked;               /* long runs of ssd_scan / gated_delta in chunks (backend_opts.cuda_chunked) */
    void *rscr;                 /* rec.cu: the chunked forms' plan and per-chunk planes, grows only */
    size_t rscr_cap;            /* bytes */
    size_t rec_smem[4];         /* rec.cu: dynamic shared memory the chunk kernels are opted into */
    int n_sm;                   /* multiprocessors of the device */
    struct cu_pend pend;        /* the op held back for a fusion (fuse.cu) */
    bool capturing;             /* between graph_begin and graph_end */
    bool cap_bad;               /* an op could not be recorded: graph_end returns NULL */
    int err_rc;
    char err_msg[256];
    char name[32];
};

/* A weight matrix [out, in] as the kernels see it (the CPU's struct wmat). */
struct cu_wmat {
    const uint8_t *data;        /* row r at data + r * row_bytes */
    size_t row_bytes;
    int dt;                     /* enum dtype: F32/F16/BF16, U32 when qbits */
    int in, out;
    int qbits, qgroup, qmode, qsdt;
    const uint8_t *qs, *qb;     /* per-row scales / biases (qb NULL for fp modes) */
    size_t qrow_bytes;
};

/* Blocks of 256 threads for a grid-stride loop over n items (at least 1, at most 65536). */
static inline int cu_grid256(size_t n)
{
    size_t g = (n + 255) / 256;
    return (int)(g < 65536 ? (g ? g : 1) : 65536);
}

static inline struct cuda_backend *cu_of(struct backend *be)
{
    return (struct cuda_backend *)be->impl;
}

/* Record the first error (sticky until sync); what names the op. */
void cu_fail(struct cuda_backend *c, const char *what, cudaError_t rc);
/* An op that cannot be recorded into a graph (a host round trip, an allocation): true
 * (and the recording marked unusable, the op to be skipped) while recording. */
bool cu_not_capturable(struct cuda_backend *c, const char *what);
/* After a launch: record a launch failure; false when the backend has failed. */
bool cu_check(struct cuda_backend *c, const char *what);
/* Scratch of at least n floats / ints (grows only); NULL after cu_fail. */
float *cu_scratch(struct cuda_backend *c, size_t n);
int32_t *cu_iscratch(struct cuda_backend *c, size_t n);
void cu_wmat_from(struct cu_wmat *m, const struct tensor *w);

/* graph.cu */
void cu_graph_begin(struct backend *be);
void *cu_graph_end(struct backend *be);
void cu_graph_launch(struct backend *be, void *graph);
void cu_graph_free(struct backend *be, void *graph);

/* linear.cu */
void cu_linear(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
               const struct tensor *b, int n_tok);
void cu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs);
void cu_embed(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n_tok);
/* The experts' products for at most CU_EXPERT_DEV_SLOTS slots without the host (ADR 0143);
 * false where a product has no table (prepare_experts) or its format does not take the
 * affine GEMV (cu_linear_experts then groups on the host). */
#define CU_EXPERT_DEV_SLOTS 16
int cu_prepare_experts(struct backend *be, const struct expert_linear *el, int n_expert,
                       struct err *e);
bool cu_linear_experts_dev(struct cuda_backend *c, float *y, int ldy, const float *x,
                           const struct expert_linear *el, int n_el, const int32_t *offsets,
                           int n_expert, int n_slot);

/* linear.cu: the bytes of the integer GEMV's prepared x (one slot per job of a launch). */
size_t cu_qi_x_bytes(void);

/* mma.cu: whether the tensor-core product over affine codes takes w (4/8 bits, power-of-two
 * groups >= 32, 16-byte aligned rows, f32/f16/bf16 scales); y[n_tok, out] (leading dimension
 * ldy, overwritten) = x[n_tok, in] (leading dimension ldx) wᵀ on it. */
bool cu_mma_ok(const struct cu_wmat *w);
void cu_mma_affine(struct cuda_backend *c, float *y, int ldy, const float *x, int ldx,
                   const struct cu_wmat *w, int n_tok);
/* ... and what mmq.cu shares with it: the splits of K (of ng scale groups, nk steps) over grid
 * z while a grid of blocks is short of target (the number returned, *gpz groups each), and the
 * splits' partial sums part (nz x [n_tok, out]) into y in order of z (deterministic). */
int cu_mma_splits(long blocks, long target, int ng, int nk, int *gpz);
void cu_mma_reduce(struct cuda_backend *c, float *y, int ldy, const float *part, int nz, int out,
                   int n_tok);

/* mmq.cu: the same product on int8 tensor cores, x in two int8 limbs a scale group (ADR 0147;
 * groups of 32 to 128). */
bool cu_mmq_ok(const struct cu_wmat *w);
void cu_mmq_affine(struct cuda_backend *c, float *y, int ldy, const float *x, int ldx,
                   const struct cu_wmat *w, int n_tok);

/* elem.cu */
void cu_rmsnorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                float w_off, float eps, int n_tok, int per_tok, int n);
void cu_layernorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                  float w_off, const struct tensor *b, float eps, int n_tok, int per_tok, int n);
void cu_act(struct backend *be, enum act_kind act, float *x, int ld, int n_rows, int n);
void cu_glu(struct backend *be, enum act_kind act, float *y, int ldy, const float *x, int ldx,
            int n_rows, int n);
void cu_xielu(struct backend *be, float *x, int ld, int n_rows, int n, const struct xielu_params *p);
void cu_glu_clamped(struct backend *be, float *y, int ldy, const float *x, int ldx, int n_rows,
                    int n, float alpha, float limit, bool interleaved);
void cu_scale(struct backend *be, float *x, int ld, float a, int n_rows, int n);
void cu_softcap(struct backend *be, float *x, int ld, float cap, int n_rows, int n);
void cu_axpy(struct backend *be, float *y, int ldy, float a, const float *x, int ldx, int n_rows,
             int n);
void cu_sigmoid_axpy(struct backend *be, float *y, int ldy, const float *g, const float *x,
                     int ldx, int n_rows, int n);
void cu_gather(struct backend *be, float *y, const float *x, int ldx, const int32_t *idx, int div,
               int n_rows, int n);

/* elem.cu: the norm (layer: layernorm, else RMS) of n_tok rows of n (stride ld) of h after
 * h[r, :n] += rs * res[r, :n] (res stride ldres), h's new rows written back: axpy and then the
 * norm, the same arithmetic, in one launch. y may be h or res (row for row), or apart from both. */
void cu_norm_res(struct cuda_backend *c, float *y, float *h, const float *res, int ldres, float rs,
                 int ld, const struct tensor *w, float w_off, const struct tensor *b, float eps,
                 int n_tok, int n, bool layer);

/* fuse.cu: the held-back op launched (nothing when none is); the table's entries that fuse */
void cu_flush(struct cuda_backend *c);
void cu_fuse_axpy(struct backend *be, float *y, int ldy, float a, const float *x, int ldx,
                  int n_rows, int n);
void cu_fuse_rmsnorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                     float w_off, float eps, int n_tok, int per_tok, int n);
void cu_fuse_layernorm(struct backend *be, float *y, const float *x, int ld,
                       const struct tensor *w, float w_off, const struct tensor *b, float eps,
                       int n_tok, int per_tok, int n);
void cu_fuse_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
                  const struct rope_params *rp, const struct kv_rows *rows);
void cu_fuse_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                      const float *v, int ldv, const struct kv_rows *rows, int n_tok);

/* attn.cu: the rope p held (its last heads the kv heads from kh0 on, k_dim / head_dim of
 * them) and the kv_store of those heads and of v (stride ldv, rows apart from p's heads) at
 * slot, one launch; the same arithmetic as cu_rope and then cu_kv_store. */
#define CU_ROPE_STORE_MAX_HALF 256
void cu_rope_store(struct cuda_backend *c, const struct cu_pend *p, const struct kv_layer *kv,
                   int kh0, const float *v, int ldv, const int32_t *slot);

/* attn.cu */
void cu_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
             const struct rope_params *rp, const struct kv_rows *rows);
void cu_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                 const float *v, int ldv, const struct kv_rows *rows, int n_tok);
void cu_attention(struct backend *be, float *out, int ldo, const float *q, int ldq,
                  const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                  const struct attn_params *ap);
/* attn_decode.cu: flash-decoding (ADR 0105). init (at creation) sets the kernels' attributes and
 * measures the clusters the device runs; cu_attn_decode launches decode attention split along
 * the keys and grouped by KV head, or returns false where it does not serve the call (option
 * off, no clusters, head_dim not a multiple of 8 or over 256, unaligned cache rows). */
void cu_attn_decode_init(struct cuda_backend *c);
bool cu_attn_decode(struct cuda_backend *c, float *out, int ldo, const float *q, int ldq,
                    const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                    const struct attn_params *ap);

/* moe.cu */
void cu_moe_route(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                  const float *logits, int n_tok, int n_expert, int k, float jitter);
void cu_moe_route_grouped(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                          const float *logits, int n_tok, int n_expert, int k,
                          const struct moe_group_params *p);
void cu_moe_group(struct backend *be, int32_t *order, int32_t *offsets, const int32_t *sel,
                  int n_slot, int n_expert);
void cu_linear_experts(struct backend *be, float *y, int ldy, const float *x,
                       const struct expert_linear *el, int n_el, const int32_t *offsets,
                       int n_expert, int n_slot);
void cu_moe_combine(struct backend *be, float *y, const float *x, const int32_t *order,
                    const float *w, int k, int n_slot, int n);
void cu_mul(struct backend *be, float *y, int ldy, const float *a, int lda, const float *b, int ldb,
            int n_rows, int n);
/* rec.cu */
void cu_conv1d(struct backend *be, float *y, int ldy, const float *x, int ldx,
               const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
               const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu);
/* The chunked prefill of the recurrent layers (ADR 0132): a call's rows are cut into
 * items, in row order: a run of one sequence's consecutive positions of at least
 * REC_CHUNK_MIN rows is split into ceil(len / REC_CHUNK) chunks of near-equal length (so
 * every chunk has at least REC_CHUNK_MIN rows), every shorter run is one item that the
 * recurrence walks. cu_rec_plan builds that list on the device (no host round trip) in
 * the backend's recurrent scratch, followed by `floats` floats (16-byte aligned) for the
 * caller's per-chunk planes; max_chunks bounds the chunks any call of n_tok rows can
 * have. NULL after a failure (recorded). */
#define REC_CHUNK 64
#define REC_CHUNK_MIN 32
struct rec_plan {
    const int32_t *cnt;         /* [2]: items, chunks (device) */
    const int4 *items;          /* [n_tok]: row0, rows, chunk index or -1 (a recurrent run), 0 */
    const int2 *chunks;         /* [max_chunks]: row0, rows */
    float *f;                   /* the caller's floats */
    int max_chunks;
};
bool cu_rec_plan(struct cuda_backend *c, const struct kv_rows *rows, int n_tok, size_t floats,
                 struct rec_plan *pl);
/* Opt chunk kernel fn (slot k of rec_smem: 0, 1 ssm.cu, 2, 3 gdn.cu) into bytes of dynamic
 * shared memory; the runtime is asked only when a call needs more than before. */
bool cu_rec_smem(struct cuda_backend *c, int k, const void *fn, size_t bytes);
void cu_moe_weight_input(struct backend *be, float *x, const int32_t *order, float *w, int n_slot,
                         int n);
void cu_attn_temp(struct backend *be, float *x, int ld, int n_tok, int n, const struct kv_rows *rows,
                  int floor_scale, float attn_scale);
/* scan.cu */
void cu_selective_scan(struct backend *be, float *y, int ldy, const float *x, int ldx,
                       const float *dt, int lddt, const float *B, const float *C, int ldbc,
                       const float *z, int ldz, const struct tensor *A_log, const struct tensor *D,
                       const struct kv_layer *st, const struct kv_rows *rows, int n_tok,
                       int d_inner, int d_state);
/* gdn.cu */
void cu_gated_delta(struct backend *be, float *y, int ldy, const float *x, int ldx,
                    const float *ab, int ldab, const struct gdn_params *p,
                    const struct kv_layer *st, const struct kv_rows *rows, int n_tok);
/* ssm.cu */
void cu_ssd_scan(struct backend *be, float *y, int ldy, const float *x, const float *B,
                 const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                 const struct tensor *d, const struct tensor *dt_bias, const struct kv_layer *st,
                 const struct kv_rows *rows, int n_tok, const struct ssd_params *p);
void cu_rglru(struct backend *be, float *y, int ldy, const float *x, int ldx,
              const struct rglru_params *p, const struct kv_layer *st, const struct kv_rows *rows,
              int n_tok);

/* ---- device helpers shared by the kernels ---- */
#ifdef __CUDACC__
#include <cuda_fp16.h>

/* Programmatic dependent launch (Hopper): a kernel started by cu_launch may run while the
 * kernel before it in the stream is still running. It calls cu_pdl_trigger() first (its own
 * successor may then be launched) and cu_pdl_wait() before it reads anything an earlier op
 * wrote or writes anything an earlier op reads: the wait returns once the previous kernel has
 * completed and its writes are visible, and since every kernel waits before it completes, so
 * has everything before it. Before the wait a kernel may only read what no op writes (the
 * weights). Both are no-ops in a kernel launched without the attribute. */
__device__ __forceinline__ void cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/* Launch k(args) with smem bytes of dynamic shared memory on the backend's stream as a
 * programmatic dependent of the kernel before it (when c->pdl): only for kernels that follow
 * the rules of cu_pdl_wait. */
template <typename... P, typename... A>
static inline void cu_launch_smem(struct cuda_backend *c, void (*k)(P...), dim3 grid, dim3 block,
                                  size_t smem, A... args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl ? 1 : 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    cudaError_t rc = cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...);
    if (rc != cudaSuccess)
        cu_fail(c, "launch", rc);
}

/* cu_launch without dynamic shared memory. */
template <typename... P, typename... A>
static inline void cu_launch(struct cuda_backend *c, void (*k)(P...), dim3 grid, dim3 block,
                             A... args)
{
    cu_launch_smem(c, k, grid, block, 0, args...);
}

__device__ __forceinline__ float cu_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* IEEE half to float, exact (subnormals included). */
__device__ __forceinline__ float cu_f16(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* Element i of a F32/F16/BF16 array. */
__device__ __forceinline__ float cu_ld(const void *p, int dt, size_t i)
{
    if (dt == 1)
        return cu_f16(((const uint16_t *)p)[i]);
    if (dt == 2)
        return cu_bf16(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif
