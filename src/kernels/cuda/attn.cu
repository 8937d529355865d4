/*
 * attn: rotary embedding, the paged KV store and attention on the GPU
 * (backend.h), with the CPU reference's semantics (backend_cpu_attn.c):
 * rope angles pos * inv_freq in double; a query at position p attends the
 * positions (p - window, p] (and of its chunk, [p - p % chunk, p]) of its sequence
 * through the block table, scores
 * scale * q.k, soft-capped, softmax with an optional per-head sink logit.
 *
 * rope:      one thread per (token, head, frequency)
 * kv_store:  one block of 512 threads per row; an F16 / BF16 cache rounds to
 *            nearest even (as the CPU's), attention widens each element to f32
 * rope + kv_store (a rope of q | k held back for the store of k and v, fuse.cu,
 *            ADR 0138): one block of 256 threads per row, each frequency's cos / sin
 *            once per row, the same roundings as the two ops'
 * attention: one block of ATTN_WARPS warps per (query row, head) and, for
 *            decode, per split of its keys (ADR 0028).
 *            Prefill (ATTN_PIECES_MIN_TOK rows or more): F16 / BF16 caches at
 *            head_dim <= 128, F32 ones at 64 to 128, in attn_prefill.cu (ADR 0146);
 *            what it declines (MLXCEL_CUDA_ATTN_FA2=0, misaligned caches) at head_dim
 *            64 to 128: attn_fa_kernel, tiles of 64 rows on tensor cores (below), at a
 *            width of 64, 80 or 128 (a smaller head zero-padded: SigLIP's 72 at 80).
 *            Wider heads (Gemma's 256) and heads under 64: warp w takes the row's
 *            keys 32 at a time (pieces w, w + ATTN_WARPS, ...): the lanes hold
 *            q and the output spread over head_dim (HD_PER_LANE each), read
 *            each key row of the piece coalesced into 32 partial dot products
 *            per lane, and one reduce-scatter (31 shuffles) leaves key k's
 *            score in lane k; the warp then updates its online softmax once per
 *            piece (running max and sum) and adds the piece's 32 value rows into
 *            the output. The warps' partials merge in shared memory at the end.
 *            Decode (fewer rows): a cluster of ATTN_SPLIT blocks shares a row's
 *            keys, each block a contiguous share; in a block warp w takes keys
 *            w, w + ATTN_WARPS, ... one at a time (a warp reduction per key and
 *            its softmax update: pieces cost decode 15-28 % with too few blocks
 *            to hide their latency), and block 0 merges the blocks' partials
 *            through distributed shared memory. MLXCEL_CUDA_ATTN_SPLIT=0: one
 *            block per (row, head), the same per-key loop (attn_kernel<false>).
 *            Both serve decode only where attn_decode.cu's flash-decoding (ADR 0105:
 *            K/V read once per KV group) does not: MLXCEL_CUDA_ATTN_FLASH=0, head_dims
 *            that are not a multiple of 8, a device without clusters.
 */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <mma.h>

#include "attn_common.cuh"

#define ATTN_WARPS 8
#define HD_PER_LANE 8   /* head_dim up to 256 */
#define ATTN_PIECES_MIN_TOK 32
#define ATTN_SPLIT 8     /* decode: blocks of a cluster sharing one row's keys */

// ---- rope ----

/* cos and sin (times mscale) of frequency j of rope rp at position p of a row whose sequence
 * ends at se. */
__device__ __forceinline__ void rope_cs(const struct rope_params &rp, int j, int p, int se,
                                        float *cj, float *sj)
{
    const float *inv = rp.inv_long && se > rp.long_after ? rp.inv_long : rp.inv_freq;
    float f = inv[j];
    if (rp.ntk_factor > 0.0f && se > rp.long_after) {
        double s = (double)rp.ntk_factor * se / rp.long_after - ((double)rp.ntk_factor - 1.0);
        f = (float)((double)rp.inv_freq[j] * pow(s, -2.0 * j / (rp.n_rot - 2)));
    }
    double a = (double)p * (double)f;
    *cj = (float)(cos(a) * rp.mscale);
    *sj = (float)(sin(a) * rp.mscale);
}

/* Rotate the pair (xh[d], xh[d + step]) of frequency j of a head xh by (cj, sj), in rounding
 * steps of their own (rope_kernel and rope_store_kernel give the same bits); the rotated pair
 * into *r1, *r2 as well. */
__device__ __forceinline__ void rope_rot(const struct rope_params &rp, float *xh, int j, float cj,
                                         float sj, int *d1, int *d2, float *r1, float *r2)
{
    int half = rp.n_rot / 2;
    int pairs = rp.style == ROPE_STYLE_PAIRS, step = pairs ? 1 : half, d = pairs ? 2 * j : j;
    float x1 = xh[d], x2 = xh[d + step];
    *r1 = __fsub_rn(__fmul_rn(x1, cj), __fmul_rn(x2, sj));
    *r2 = __fadd_rn(__fmul_rn(x2, cj), __fmul_rn(x1, sj));
    xh[d] = *r1;
    xh[d + step] = *r2;
    *d1 = d;
    *d2 = d + step;
}

__global__ void rope_kernel(float *x, int ld, int n_tok, int n_head, int head_dim,
                            struct rope_params rp, const int32_t *pos, const int32_t *seq_end)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int half = rp.n_rot / 2;
    size_t n = (size_t)n_tok * n_head * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half), h = (int)(i / half % n_head), t = (int)(i / half / n_head);
        float cj, sj, r1, r2;
        int d1, d2;
        rope_cs(rp, j, pos[t], seq_end[t], &cj, &sj);
        rope_rot(rp, x + (size_t)t * ld + (size_t)h * head_dim, j, cj, sj, &d1, &d2, &r1, &r2);
    }
}

void cu_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
             const struct rope_params *rp, const struct kv_rows *rows)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || rp->n_rot <= 0 || n_tok <= 0)
        return;
    size_t n = (size_t)n_tok * n_head * (rp->n_rot / 2);
    size_t g = (n + 255) / 256;
    cu_launch(c, rope_kernel, dim3((unsigned)(g < 65536 ? g : 65536)), dim3(256), x, ld, n_tok,
              n_head, head_dim, *rp, rows->pos, rows->seq_end);
    cu_check(c, "rope");
}

// ---- KV store ----


template <class T>
__global__ void kv_store_kernel(T *kc, T *vc, int k_dim, int v_dim, const float *k, int ldk,
                                const float *v, int ldv, const int32_t *slot)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int i = blockIdx.x;
    size_t s = (size_t)slot[i];
    for (int d = threadIdx.x; d < k_dim; d += blockDim.x)
        kv_st(&kc[s * k_dim + d], k[(size_t)i * ldk + d]);
    for (int d = threadIdx.x; d < v_dim; d += blockDim.x)
        kv_st(&vc[s * v_dim + d], v[(size_t)i * ldv + d]);
}

template <class T>
static void kv_store_launch(struct cuda_backend *c, const struct kv_layer *kv, const float *k,
                            int ldk, const float *v, int ldv, const struct kv_rows *rows, int n_tok)
{
    cu_launch(c, kv_store_kernel<T>, dim3(n_tok), dim3(512), (T *)kv->k, (T *)kv->v, kv->k_dim,
              kv->v_dim, k, ldk, v, ldv, rows->slot);
}

/* One block per row t: the row's cos / sin once per frequency (shared), every head's pairs
 * rotated in place, the kv heads' (from kh0 on) rotated pairs and unrotated dims stored at
 * slot[t], then v's row. */
template <class T>
__global__ void rope_store_kernel(float *x, int ld, int n_head, int head_dim, struct rope_params rp,
                                  const int32_t *pos, const int32_t *seq_end, T *kc, T *vc,
                                  int k_dim, int v_dim, int kh0, const float *v, int ldv,
                                  const int32_t *slot)
{
    __shared__ float cs[2][CU_ROPE_STORE_MAX_HALF];
    cu_pdl_trigger();
    cu_pdl_wait();
    int t = blockIdx.x, half = rp.n_rot / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        rope_cs(rp, j, pos[t], seq_end[t], &cs[0][j], &cs[1][j]);
    __syncthreads();
    float *xt = x + (size_t)t * ld;
    size_t s = (size_t)slot[t];
    for (int i = threadIdx.x; i < n_head * half; i += blockDim.x) {
        int j = i % half, h = i / half, d1, d2;
        float r1, r2;
        rope_rot(rp, xt + (size_t)h * head_dim, j, cs[0][j], cs[1][j], &d1, &d2, &r1, &r2);
        if (h >= kh0) {
            T *kr = kc + s * k_dim + (size_t)(h - kh0) * head_dim;
            kv_st(&kr[d1], r1);
            kv_st(&kr[d2], r2);
        }
    }
    int rest = head_dim - rp.n_rot, nk = n_head - kh0;
    for (int i = threadIdx.x; i < nk * rest; i += blockDim.x) {
        int h = i / rest, d = rp.n_rot + i % rest;
        kv_st(&kc[s * k_dim + (size_t)h * head_dim + d], xt[(size_t)(kh0 + h) * head_dim + d]);
    }
    for (int d = threadIdx.x; d < v_dim; d += blockDim.x)
        kv_st(&vc[s * v_dim + d], v[(size_t)t * ldv + d]);
}

template <class T>
static void rope_store_launch(struct cuda_backend *c, const struct cu_pend *p,
                              const struct kv_layer *kv, int kh0, const float *v, int ldv,
                              const int32_t *slot)
{
    cu_launch(c, rope_store_kernel<T>, dim3(p->n_tok), dim3(256), p->q, p->ld, p->n_head,
              p->head_dim, p->rp, p->rows.pos, p->rows.seq_end, (T *)kv->k, (T *)kv->v, kv->k_dim,
              kv->v_dim, kh0, v, ldv, slot);
}

void cu_rope_store(struct cuda_backend *c, const struct cu_pend *p, const struct kv_layer *kv,
                   int kh0, const float *v, int ldv, const int32_t *slot)
{
    if (c->err_rc || p->n_tok <= 0)
        return;
    switch (kv->dtype) {
    case DTYPE_F32: rope_store_launch<float>(c, p, kv, kh0, v, ldv, slot); break;
    case DTYPE_F16: rope_store_launch<__half>(c, p, kv, kh0, v, ldv, slot); break;
    case DTYPE_BF16: rope_store_launch<__nv_bfloat16>(c, p, kv, kh0, v, ldv, slot); break;
    default: cu_fail(c, "rope + kv_store: cache element type", cudaErrorInvalidValue); return;
    }
    cu_check(c, "rope + kv_store");
}

void cu_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                 const float *v, int ldv, const struct kv_rows *rows, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    switch (kv->dtype) {
    case DTYPE_F32: kv_store_launch<float>(c, kv, k, ldk, v, ldv, rows, n_tok); break;
    case DTYPE_F16: kv_store_launch<__half>(c, kv, k, ldk, v, ldv, rows, n_tok); break;
    case DTYPE_BF16: kv_store_launch<__nv_bfloat16>(c, kv, k, ldk, v, ldv, rows, n_tok); break;
    default: cu_fail(c, "kv_store: cache element type", cudaErrorInvalidValue); return;
    }
    cu_check(c, "kv_store");
}

// ---- attention ----


/* Lane's share of q (dims lane + 32 i) into qv, and the output o zeroed. */
template <class T>
__device__ __forceinline__ void attn_load_q(const attn_args<T> &a, const float *qh, int lane, float *qv,
                                            float *o)
{
#pragma unroll
    for (int i = 0; i < HD_PER_LANE; i++) {
        int d = lane + 32 * i;
        qv[i] = d < a.hd ? qh[d] : 0.0f;
        o[i] = 0.0f;
    }
}

/* One warp over keys j0, j0 + ATTN_WARPS, ... below j1 (attn_common.cuh's attn_keys_pl). */
template <class T>
__device__ __forceinline__ void attn_keys(const attn_args<T> &a, const int32_t *tab, int g, int lane,
                                          const float *qv, float *o, float &m, float &l, int j0,
                                          int j1)
{
    attn_keys_pl<T, HD_PER_LANE, ATTN_WARPS>(a, tab, g, lane, qv, o, m, l, j0, j1);
}

/* One partial of a merge: its max (-inf: empty), its sum and its output [dim]. */
struct attn_part {
    const float *m, *l, *o;
};

/* Merge n partials (part(i) for i < n) and an optional sink logit into acc (lane's dims) and
 * the sum L; returns the common max. part is a small accessor, not an array of pointers: an
 * array kept the prefill kernel at 98 registers instead of 60 (half its blocks per SM; pp512
 * 7948 against 10975 t/s on the H200). */
template <class Part>
__device__ __forceinline__ float attn_merge(Part part, int n, const float *sink, int lane, float *acc,
                                            float &L)
{
    float M = -INFINITY;
    for (int i = 0; i < n; i++)
        M = fmaxf(M, *part(i).m);
    if (sink)
        M = fmaxf(M, *sink);
    L = sink ? expf(*sink - M) : 0.0f;
#pragma unroll
    for (int k = 0; k < HD_PER_LANE; k++)
        acc[k] = 0.0f;
    for (int i = 0; i < n; i++) {
        const attn_part pi = part(i);
        if (*pi.m == -INFINITY)
            continue;
        float f = expf(*pi.m - M);
        L += *pi.l * f;
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++)
            acc[k] += pi.o[lane + 32 * k] * f;
    }
    return M;
}

/* Row t, head h of the output: acc / L over the lane's dims. */
template <class T>
__device__ __forceinline__ void attn_store(const attn_args<T> &a, int t, int h, int lane, const float *acc,
                                           float L)
{
    float *oh = a.out + (size_t)t * a.ldo + (size_t)h * a.hd;
#pragma unroll
    for (int k = 0; k < HD_PER_LANE; k++) {
        int d = lane + 32 * k;
        if (d < a.hd)
            oh[d] = acc[k] / L;
    }
}

/* The warps' partials written to shared memory (attn_merge reads them there). */
__device__ __forceinline__ void attn_warp_partial(float *sm_m, float *sm_l,
                                                  float (*sm_o)[32 * HD_PER_LANE], int w, int lane,
                                                  float m, float l, const float *o)
{
    if (lane == 0) {
        sm_m[w] = m;
        sm_l[w] = l;
    }
#pragma unroll
    for (int i = 0; i < HD_PER_LANE; i++)
        sm_o[w][lane + 32 * i] = o[i];
}

/* grid: (n_head, n_tok); block: ATTN_WARPS warps; PIECES: keys 32 at a time. */
template <class T, bool PIECES>
__global__ void attn_kernel(attn_args<T> a)
{
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_o[ATTN_WARPS][32 * HD_PER_LANE];
    cu_pdl_trigger();
    cu_pdl_wait();
    int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int g = h / a.n_rep, p = a.pos[t];
    int hi, lo;
    attn_range(a, t, p, lo, hi);
    const int32_t *tab = a.tables + a.table[t];
    const float *qh = a.q + (size_t)t * a.ldq + (size_t)h * a.hd;
    float qv[HD_PER_LANE], o[HD_PER_LANE];
    attn_load_q(a, qh, lane, qv, o);
    float m = -INFINITY, l = 0.0f;
    if (!PIECES)
        attn_keys(a, tab, g, lane, qv, o, m, l, lo + w, hi);
    for (int j0 = lo + 32 * w; PIECES && j0 < hi; j0 += 32 * ATTN_WARPS) {
        const int j = j0 + lane, nk = hi - j0 < 32 ? hi - j0 : 32;
        const size_t slot = j < hi ? (size_t)tab[j / a.bs] * a.bs + j % a.bs : 0;
        float part[32];
#pragma unroll
        for (int k = 0; k < 32; k++) {
            part[k] = 0.0f;
            size_t sk = (size_t)__shfl_sync(0xffffffffu, (unsigned long long)slot, k);
            if (k < nk) {
                const T *kr = a.kc + sk * a.k_dim + (size_t)g * a.hd;
#pragma unroll
                for (int i = 0; i < HD_PER_LANE; i++) {
                    int d = lane + 32 * i;
                    if (d < a.hd)
                        part[k] += qv[i] * kv_ld(&kr[d]);
                }
            }
        }
        /* reduce-scatter: after the step of width h, part[0 .. h) of lane L holds the
         * partial sums of the keys whose index agrees with L in the bits above h */
#pragma unroll
        for (int h = 16; h >= 1; h /= 2) {
            const bool up = lane & h;
#pragma unroll
            for (int k = 0; k < h; k++) {
                float send = up ? part[k] : part[k + h], keep = up ? part[k + h] : part[k];
                part[k] = keep + __shfl_xor_sync(0xffffffffu, send, h);
            }
        }
        float s = -INFINITY;
        if (j < hi) {
            s = part[0] * a.scale;
            if (a.softcap > 0.0f)
                s = a.softcap * tanhf(s / a.softcap);
        }
        float mn = fmaxf(m, cu_warp_max(s)), corr = expf(m - mn);
        float pj = j < hi ? expf(s - mn) : 0.0f;
        l = l * corr + cu_warp_sum(pj);
#pragma unroll
        for (int i = 0; i < HD_PER_LANE; i++)
            o[i] *= corr;
        for (int k = 0; k < nk; k++) {
            float pk = __shfl_sync(0xffffffffu, pj, k);
            size_t sk = (size_t)__shfl_sync(0xffffffffu, (unsigned long long)slot, k);
            const T *vr = a.vc + sk * a.v_dim + (size_t)g * a.hd;
#pragma unroll
            for (int i = 0; i < HD_PER_LANE; i++) {
                int d = lane + 32 * i;
                if (d < a.hd)
                    o[i] += pk * kv_ld(&vr[d]);
            }
        }
        m = mn;
    }
    attn_warp_partial(sm_m, sm_l, sm_o, w, lane, m, l, o);
    __syncthreads();
    if (w != 0)
        return;
    float acc[HD_PER_LANE], L;
    attn_merge([&](int i) { return attn_part{&sm_m[i], &sm_l[i], sm_o[i]}; }, ATTN_WARPS,
               a.sinks ? &a.sinks[h] : NULL, lane, acc, L);
    attn_store(a, t, h, lane, acc, L);
}

/* Decode (fewer than ATTN_PIECES_MIN_TOK rows): the keys of a (row, head) split over a cluster
 * of ATTN_SPLIT blocks (grid z), so a step runs n_head x rows x 8 blocks instead of too few to
 * fill the GPU. Each block runs the warp-per-key loop over its contiguous share of the keys,
 * merges its warps in shared memory, and block 0 of the cluster merges the blocks' partials
 * through distributed shared memory (Hopper clusters: no scratch, so graphs can record it). */
template <class T>
__global__ void __cluster_dims__(1, 1, ATTN_SPLIT) attn_split_kernel(attn_args<T> a)
{
    namespace cg = cooperative_groups;
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_o[ATTN_WARPS][32 * HD_PER_LANE];
    __shared__ float bm, bl, bo[32 * HD_PER_LANE];
    cg::cluster_group cl = cg::this_cluster();
    cu_pdl_trigger();
    cu_pdl_wait();
    int h = blockIdx.x, t = blockIdx.y, sp = (int)cl.block_rank();
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int g = h / a.n_rep, p = a.pos[t];
    int hi, lo;
    attn_range(a, t, p, lo, hi);
    int per = (hi - lo + ATTN_SPLIT - 1) / ATTN_SPLIT;
    int klo = lo + sp * per, khi = klo + per < hi ? klo + per : hi;
    const int32_t *tab = a.tables + a.table[t];
    const float *qh = a.q + (size_t)t * a.ldq + (size_t)h * a.hd;
    float qv[HD_PER_LANE], o[HD_PER_LANE];
    attn_load_q(a, qh, lane, qv, o);
    float m = -INFINITY, l = 0.0f;
    attn_keys(a, tab, g, lane, qv, o, m, l, klo + w, khi);
    attn_warp_partial(sm_m, sm_l, sm_o, w, lane, m, l, o);
    __syncthreads();
    float acc[HD_PER_LANE], L;
    if (w == 0) { /* this block's partial: max, sum and output over its warps */
        float M = attn_merge([&](int i) { return attn_part{&sm_m[i], &sm_l[i], sm_o[i]}; },
                             ATTN_WARPS, NULL, lane, acc, L);
        if (lane == 0) {
            bm = M;
            bl = L;
        }
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++)
            bo[lane + 32 * k] = acc[k];
    }
    cl.sync(); /* every block's partial is in its shared memory */
    if (sp == 0 && w == 0) {
        attn_merge([&](int r) {
                       return attn_part{cl.map_shared_rank(&bm, r), cl.map_shared_rank(&bl, r),
                                        cl.map_shared_rank(bo, r)};
                   },
                   ATTN_SPLIT, a.sinks ? &a.sinks[h] : NULL, lane, acc, L);
        attn_store(a, t, h, lane, acc, L);
    }
    cl.sync(); /* block 0 has read the others' shared memory before they exit */
}


// ---- prefill: tiles of 64 query rows on tensor cores ----

/* Prefill attention on tensor cores (ADR 0054). A block of FA_WARPS warps takes FA_ROWS query
 * rows of one head that share one sequence (block table) and walks their keys FA_KEYS at a
 * time: the tile's K and V rows are read once for all 64 rows. q, K, P and V are each split
 * into two bf16 parts (hi + lo, 16 significant bits) and every product is three bf16 WMMA
 * products accumulated in f32 (hi hi + hi lo + lo hi), so scores and outputs keep f32-level
 * accuracy. Warp w owns rows 16 w .. 16 w + 15: S = Q Kᵀ into shared memory, the online
 * softmax per row (two keys a lane), P split into shared memory, O (in shared memory) scaled
 * and O += P V. Rows of a block whose tables differ (a batch mixing sequences) take a plain
 * loop, a warp per row and a key at a time. */
#define FA_ROWS 64
#define FA_KEYS 64
#define FA_WARPS 4

template <int HD>
struct __align__(128) fa_smem {
    __nv_bfloat16 qh[FA_ROWS][HD + 8], ql[FA_ROWS][HD + 8];
    __nv_bfloat16 kh[FA_KEYS][HD + 8], kl[FA_KEYS][HD + 8];
    __nv_bfloat16 vh[FA_KEYS][HD + 8], vl[FA_KEYS][HD + 8];
    float s[FA_WARPS][16][FA_KEYS + 4];
    __nv_bfloat16 ph[FA_WARPS][16][FA_KEYS + 8], pl[FA_WARPS][16][FA_KEYS + 8];
    float o[FA_WARPS][16][HD + 4];
    int rlo[FA_ROWS], rhi[FA_ROWS];
    int slot[FA_KEYS];
    int klo, khi, mixed;
};

__device__ __forceinline__ void fa_split(float v, __nv_bfloat16 &hi, __nv_bfloat16 &lo)
{
    hi = __float2bfloat16_rn(v);
    lo = __float2bfloat16_rn(v - __bfloat162float(hi));
}

/* The block's rows: their key ranges [rlo, rhi), the union [klo, khi), and whether their
 * tables differ (mixed). */
template <class T, int HD>
__device__ __forceinline__ void fa_rows(const attn_args<T> &a, fa_smem<HD> &S, int t0, int nr,
                                        int tab0)
{
    for (int r = threadIdx.x; r < FA_ROWS; r += blockDim.x) {
        int lo = 0, hi = 0;
        if (r < nr) {
            attn_range(a, t0 + r, a.pos[t0 + r], lo, hi);
            if (a.table[t0 + r] != tab0)
                S.mixed = 1;
            atomicMin(&S.klo, lo);
            atomicMax(&S.khi, hi);
        }
        S.rlo[r] = lo;
        S.rhi[r] = hi;
    }
}

/* The tile of keys kt .. kt + FA_KEYS (past khi: zeros) split into the K and V planes; the
 * columns past the head's a.hd (<= HD) are zeros, so they add nothing to Q Kᵀ and P V. */
template <class T, int HD>
__device__ __forceinline__ void fa_load_kv(const attn_args<T> &a, fa_smem<HD> &S,
                                           const int32_t *tab, int kt, int khi, int g)
{
    if (threadIdx.x < FA_KEYS) {
        int j = kt + threadIdx.x;
        S.slot[threadIdx.x] = j < khi ? tab[j / a.bs] * a.bs + j % a.bs : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < FA_KEYS * HD; i += blockDim.x) {
        int kk = i / HD, d = i % HD, sl = S.slot[kk];
        float kv = 0.0f, vv = 0.0f;
        if (sl >= 0 && d < a.hd) {
            kv = kv_ld(&a.kc[(size_t)sl * a.k_dim + (size_t)g * a.hd + d]);
            vv = kv_ld(&a.vc[(size_t)sl * a.v_dim + (size_t)g * a.hd + d]);
        }
        fa_split(kv, S.kh[kk][d], S.kl[kk][d]);
        fa_split(vv, S.vh[kk][d], S.vl[kk][d]);
    }
}

/* Warp w's scores S.s[w] = Q_w Kᵀ of the tile (three products per 16 x 16 x 16 step). */
template <int HD>
__device__ __forceinline__ void fa_scores(fa_smem<HD> &S, int w)
{
    using namespace nvcuda;
#pragma unroll
    for (int nt = 0; nt < FA_KEYS / 16; nt++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa, qb;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> ka, kb;
            wmma::load_matrix_sync(qa, &S.qh[16 * w][16 * kk], HD + 8);
            wmma::load_matrix_sync(qb, &S.ql[16 * w][16 * kk], HD + 8);
            wmma::load_matrix_sync(ka, &S.kh[16 * nt][16 * kk], HD + 8);
            wmma::load_matrix_sync(kb, &S.kl[16 * nt][16 * kk], HD + 8);
            wmma::mma_sync(acc, qa, ka, acc);
            wmma::mma_sync(acc, qa, kb, acc);
            wmma::mma_sync(acc, qb, ka, acc);
        }
        wmma::store_matrix_sync(&S.s[w][0][16 * nt], acc, FA_KEYS + 4, wmma::mem_row_major);
    }
}

/* The online softmax of warp w's 16 rows over the tile at kt (keys lane and lane + 32): the
 * running max m and sum l, P split into S.ph / S.pl, and O scaled by each row's correction. */
template <class T, int HD>
__device__ __forceinline__ void fa_softmax(const attn_args<T> &a, fa_smem<HD> &S, int w, int lane,
                                           int kt, float (&m)[16], float (&l)[16])
{
    float corr[16];
#pragma unroll
    for (int rr = 0; rr < 16; rr++) {
        const int r = 16 * w + rr, rlo = S.rlo[r], rhi = S.rhi[r];
        float sv[2], pv[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int c = lane + 32 * u, j = kt + c;
            float x = S.s[w][rr][c] * a.scale;
            if (a.softcap > 0.0f)
                x = a.softcap * tanhf(x / a.softcap);
            sv[u] = j >= rlo && j < rhi ? x : -INFINITY;
        }
        float mn = fmaxf(m[rr], cu_warp_max(fmaxf(sv[0], sv[1])));
        if (mn == -INFINITY) { /* no key of this row yet */
            corr[rr] = 1.0f;
            pv[0] = pv[1] = 0.0f;
        } else {
            corr[rr] = expf(m[rr] - mn);
            pv[0] = expf(sv[0] - mn);
            pv[1] = expf(sv[1] - mn);
        }
        l[rr] = l[rr] * corr[rr] + cu_warp_sum(pv[0] + pv[1]);
        m[rr] = mn;
        fa_split(pv[0], S.ph[w][rr][lane], S.pl[w][rr][lane]);
        fa_split(pv[1], S.ph[w][rr][lane + 32], S.pl[w][rr][lane + 32]);
    }
#pragma unroll
    for (int rr = 0; rr < 16; rr++)
        for (int d = lane; d < HD; d += 32)
            S.o[w][rr][d] *= corr[rr];
}

/* O_w += P_w V of the tile. */
template <int HD>
__device__ __forceinline__ void fa_pv(fa_smem<HD> &S, int w)
{
    using namespace nvcuda;
#pragma unroll
    for (int dt = 0; dt < HD / 16; dt++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, &S.o[w][0][16 * dt], HD + 4, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa, pb;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> va, vb;
            wmma::load_matrix_sync(pa, &S.ph[w][0][16 * kk], FA_KEYS + 8);
            wmma::load_matrix_sync(pb, &S.pl[w][0][16 * kk], FA_KEYS + 8);
            wmma::load_matrix_sync(va, &S.vh[16 * kk][16 * dt], HD + 8);
            wmma::load_matrix_sync(vb, &S.vl[16 * kk][16 * dt], HD + 8);
            wmma::mma_sync(acc, pa, va, acc);
            wmma::mma_sync(acc, pa, vb, acc);
            wmma::mma_sync(acc, pb, va, acc);
        }
        wmma::store_matrix_sync(&S.o[w][0][16 * dt], acc, HD + 4, wmma::mem_row_major);
    }
}

/* Warp w's rows of the output: O / L, the sink logit in L. */
template <class T, int HD>
__device__ __forceinline__ void fa_store(const attn_args<T> &a, fa_smem<HD> &S, int w, int lane,
                                         int t0, int nr, int h, const float (&m)[16],
                                         const float (&l)[16])
{
#pragma unroll
    for (int rr = 0; rr < 16; rr++) {
        const int r = 16 * w + rr;
        if (r >= nr)
            break;
        float L = l[rr], f = 1.0f;
        if (a.sinks) {
            float sk = a.sinks[h], M = fmaxf(m[rr], sk);
            f = expf(m[rr] - M);
            L = l[rr] * f + expf(sk - M);
        }
        float *oh = a.out + (size_t)(t0 + r) * a.ldo + (size_t)h * a.hd;
        for (int d = lane; d < a.hd; d += 32)
            oh[d] = S.o[w][rr][d] * f / L;
    }
}

template <class T, int HD>
__global__ void __launch_bounds__(32 * FA_WARPS) attn_fa_kernel(attn_args<T> a, int n_tok)
{
    extern __shared__ __align__(128) unsigned char fa_raw[];
    fa_smem<HD> &S = *reinterpret_cast<fa_smem<HD> *>(fa_raw);
    cu_pdl_trigger();
    cu_pdl_wait();
    const int h = blockIdx.x, t0 = blockIdx.y * FA_ROWS, tid = threadIdx.x;
    const int lane = tid % 32, w = tid / 32, g = h / a.n_rep;
    const int nr = n_tok - t0 < FA_ROWS ? n_tok - t0 : FA_ROWS;
    const int tab0 = a.table[t0];
    if (tid == 0) {
        S.klo = INT_MAX;
        S.khi = 0;
        S.mixed = 0;
    }
    __syncthreads();
    fa_rows(a, S, t0, nr, tab0);
    __syncthreads();
    if (S.mixed) {
        for (int r = w; r < nr; r += FA_WARPS)
            attn_row_plain<T, HD>(a, t0 + r, h, lane);
        return;
    }
    for (int i = tid; i < FA_ROWS * HD; i += blockDim.x) {
        int r = i / HD, d = i % HD;
        float v = r < nr && d < a.hd ? a.q[(size_t)(t0 + r) * a.ldq + (size_t)h * a.hd + d] : 0.0f;
        fa_split(v, S.qh[r][d], S.ql[r][d]);
    }
    for (int i = lane; i < 16 * HD; i += 32)
        S.o[w][i / HD][i % HD] = 0.0f;
    float m[16], l[16];
#pragma unroll
    for (int rr = 0; rr < 16; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
    }
    const int32_t *tab = a.tables + tab0;
    for (int kt = S.klo, khi = S.khi; kt < khi; kt += FA_KEYS) {
        __syncthreads(); /* the last tile's K, V and slots are no longer read */
        fa_load_kv(a, S, tab, kt, khi, g);
        __syncthreads();
        fa_scores(S, w);
        __syncwarp();
        fa_softmax(a, S, w, lane, kt, m, l);
        __syncwarp();
        fa_pv(S, w);
        __syncwarp();
    }
    fa_store(a, S, w, lane, t0, nr, h, m, l);
}

template <class T, int HD>
static void fa_launch(struct cuda_backend *c, const attn_args<T> &a, int n_head, int n_tok)
{
    size_t smem = sizeof(fa_smem<HD>);
    cudaError_t rc = cudaFuncSetAttribute(attn_fa_kernel<T, HD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (rc != cudaSuccess) {
        cu_fail(c, "attention: shared memory", rc);
        return;
    }
    cu_launch_smem(c, attn_fa_kernel<T, HD>, dim3(n_head, (n_tok + FA_ROWS - 1) / FA_ROWS),
                   dim3(32 * FA_WARPS), smem, a, n_tok);
}

template <class T>
static void attn_launch(struct cuda_backend *c, float *out, int ldo, const float *q, int ldq,
                        const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                        const struct attn_params *ap)
{
    attn_args<T> a = {out, q, ldo, ldq, (const T *)kv->k, (const T *)kv->v, kv->k_dim, kv->v_dim,
                      rows->pos, rows->table, rows->tables, rows->block_size, ap->n_head,
                      ap->n_head / ap->n_kv_head, ap->head_dim, ap->scale, ap->softcap, ap->window,
                      ap->sinks, ap->chunk, rows->span};
    dim3 grid(ap->n_head, n_tok);
    /* the flash kernel's width: the head size rounded up to 80 or 128 (SigLIP's 72 runs at
     * 80, zeros past 72); heads under 64 (test models) keep the per-row kernel, whose f32
     * arithmetic a batch's mixed tiles share (an embedding alone equals it batched) */
    if (n_tok >= ATTN_PIECES_MIN_TOK && cu_attn_prefill(c, a, ap->n_head, n_tok))
        return;
    if (n_tok >= ATTN_PIECES_MIN_TOK && ap->head_dim == 64)
        fa_launch<T, 64>(c, a, ap->n_head, n_tok);
    else if (n_tok >= ATTN_PIECES_MIN_TOK && ap->head_dim < 64)
        cu_launch(c, attn_kernel<T, true>, grid, dim3(32 * ATTN_WARPS), a);
    else if (n_tok >= ATTN_PIECES_MIN_TOK && ap->head_dim <= 80)
        fa_launch<T, 80>(c, a, ap->n_head, n_tok);
    else if (n_tok >= ATTN_PIECES_MIN_TOK && ap->head_dim <= 128)
        fa_launch<T, 128>(c, a, ap->n_head, n_tok);
    else if (n_tok >= ATTN_PIECES_MIN_TOK)
        cu_launch(c, attn_kernel<T, true>, grid, dim3(32 * ATTN_WARPS), a);
    else if (cu_attn_decode(c, out, ldo, q, ldq, kv, rows, n_tok, ap))
        return;
    else if (c->attn_split)
        cu_launch(c, attn_split_kernel<T>, dim3(ap->n_head, n_tok, ATTN_SPLIT), dim3(32 * ATTN_WARPS), a);
    else
        cu_launch(c, attn_kernel<T, false>, grid, dim3(32 * ATTN_WARPS), a);
}

void cu_attention(struct backend *be, float *out, int ldo, const float *q, int ldq,
                  const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                  const struct attn_params *ap)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    if (ap->head_dim > 32 * HD_PER_LANE || ap->n_head % ap->n_kv_head) {
        cu_fail(c, "attention: head_dim over 256 or heads not a multiple of kv heads",
                cudaErrorInvalidValue);
        return;
    }
    switch (kv->dtype) {
    case DTYPE_F32: attn_launch<float>(c, out, ldo, q, ldq, kv, rows, n_tok, ap); break;
    case DTYPE_F16: attn_launch<__half>(c, out, ldo, q, ldq, kv, rows, n_tok, ap); break;
    case DTYPE_BF16: attn_launch<__nv_bfloat16>(c, out, ldo, q, ldq, kv, rows, n_tok, ap); break;
    default: cu_fail(c, "attention: cache element type", cudaErrorInvalidValue); return;
    }
    cu_check(c, "attention");
}
