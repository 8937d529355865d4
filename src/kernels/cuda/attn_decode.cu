/*
 * attn_decode: flash-decoding, the attention of decode rows (fewer than 32 query rows) split
 * along the keys and grouped by KV head (ADR 0105).
 *
 * A cluster of S blocks (grid z, Hopper clusters) takes one row and one KV head with up to R of
 * its query heads (R = the GQA group, or a tile of 8 of a larger one): block s walks the s-th
 * contiguous share of the row's keys and computes, for all R heads at once, the partial
 * softmax state (max m, sum l, output o), so each K and V row is read once per group instead
 * of once per query head (ADR 0028's kernel reads it n_rep times). Inside a block, a group of
 * LPR lanes (the power of two >= head_dim / 8) holds one key row, 8 elements a lane loaded as
 * 16-byte vectors; a warp holds 32 / LPR keys and a lane U keys at a time (several loads in
 * flight), reduces each score over its group (log2 LPR shuffles) and updates its online
 * softmax once per U keys. Groups merge by shuffles, warps through shared memory, and the
 * cluster's blocks through distributed shared memory: each block combines its slice of the
 * outputs over the S partials with the log-sum-exp rule (and the sink logit), so no global
 * scratch is needed and decode graphs record the kernel unchanged.
 *
 * S is chosen on the host from the rows x groups and the SM count only (fixed for a graph);
 * the context length is read on the device: a share is at least one block's pass of keys, so
 * a short context leaves the cluster's other blocks empty (they only join the merge) and runs
 * as one pass. The key range, window, chunk, spans, soft-cap and sinks are attn.cu's
 * (attn_range); caches F32 / F16 / BF16 through the paged block tables.
 */
#include <cooperative_groups.h>
#include <math.h>

#include "attn_common.cuh"

#define FD_WARPS 8
#define FD_THREADS (32 * FD_WARPS)
#define FD_EPL 8         /* elements of a head row per lane */
#define FD_MAX_SPLIT 16  /* blocks of a cluster (16: non-portable, where the device runs it) */
#define FD_N_SPLIT 5     /* cluster sizes 1, 2, 4, 8, 16 */

/* Raw vectors of a lane's 8 elements: two 16-byte words for f32, one for f16 / bf16. */
template <class T>
struct fd_raw {
    static constexpr int NV = sizeof(T) * FD_EPL / 16;
    uint4 v[NV];
};

template <class T>
__device__ __forceinline__ void fd_load(fd_raw<T> &r, const T *p)
{
#pragma unroll
    for (int i = 0; i < fd_raw<T>::NV; i++)
        r.v[i] = __ldg(reinterpret_cast<const uint4 *>(p) + i);
}

template <class T>
__device__ __forceinline__ void fd_zero(fd_raw<T> &r)
{
#pragma unroll
    for (int i = 0; i < fd_raw<T>::NV; i++)
        r.v[i] = make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ void fd_word(unsigned u, float *x, const float *) { x[0] = __uint_as_float(u); }
__device__ __forceinline__ void fd_word(unsigned u, float *x, const __half *)
{
    x[0] = __half2float(__ushort_as_half((unsigned short)(u & 0xffffu)));
    x[1] = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
}
__device__ __forceinline__ void fd_word(unsigned u, float *x, const __nv_bfloat16 *)
{
    x[0] = __uint_as_float(u << 16);
    x[1] = __uint_as_float(u & 0xffff0000u);
}

/* The 8 elements of r as f32 (exact widening). */
template <class T>
__device__ __forceinline__ void fd_cvt(const fd_raw<T> &r, float (&x)[FD_EPL])
{
    constexpr int PER = 4 / sizeof(T) > 0 ? 4 / (int)sizeof(T) : 1; /* elements per 32-bit word */
#pragma unroll
    for (int i = 0; i < fd_raw<T>::NV; i++) {
        fd_word(r.v[i].x, &x[4 * PER * i + 0 * PER], (const T *)0);
        fd_word(r.v[i].y, &x[4 * PER * i + 1 * PER], (const T *)0);
        fd_word(r.v[i].z, &x[4 * PER * i + 2 * PER], (const T *)0);
        fd_word(r.v[i].w, &x[4 * PER * i + 3 * PER], (const T *)0);
    }
}

/* Shared memory of a block (floats): the warps' partials wo[W][R][hd], wm[W][R], wl[W][R]; the
 * block's bo[R][hd], bm[R], bl[R] (read by the cluster); the merge factors fac[S][R] and the
 * sums sl[R]. */
static __host__ __device__ __forceinline__ size_t fd_smem_floats(int R, int hd)
{
    return (size_t)FD_WARPS * R * hd + 2 * FD_WARPS * R + (size_t)R * hd + 2 * R + FD_MAX_SPLIT * R + R;
}

/* Keys per lane and pass: 64 bytes of K and V rows a key in flight for f32, 128 for f16 / bf16
 * (their rows take half the registers); half that for 8 heads (q and o take the registers). */
template <class T, int R>
struct fd_u {
    static constexpr int U = R > 4 ? 2 : sizeof(T) == 2 ? 8 : 4;
};

/* grid (n_kv * n_ht, n_tok, S), clusters of (1, 1, S), FD_THREADS threads. */
template <class T, int R>
__global__ void __launch_bounds__(FD_THREADS, 1) attn_fd_kernel(attn_args<T> a, int n_ht)
{
    namespace cg = cooperative_groups;
    constexpr int U = fd_u<T, R>::U;
    extern __shared__ float fd_sm[];
    cg::cluster_group cl = cg::this_cluster();
    cu_pdl_trigger();
    cu_pdl_wait();
    const int S = (int)cl.num_blocks(), sp = (int)cl.block_rank();
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, hd = a.hd;
    const int g = blockIdx.x / n_ht, tile = blockIdx.x % n_ht, t = blockIdx.y;
    const int h0 = g * a.n_rep + tile * R;
    const int nr = a.n_rep - tile * R < R ? a.n_rep - tile * R : R;
    int lpr = 1;
    while (lpr * FD_EPL < hd)
        lpr *= 2;
    const int kpw = 32 / lpr, ng = FD_WARPS * kpw, step = ng * U;
    const int gid = w * kpw + lane / lpr, d0 = (lane % lpr) * FD_EPL;
    const bool act = d0 < hd;

    /* this block's keys: a share of at least one pass */
    int lo, hi;
    attn_range(a, t, a.pos[t], lo, hi);
    int per = (hi - lo + S - 1) / S;
    per = per < step ? step : per;
    const int klo = lo + sp * per < hi ? lo + sp * per : hi;
    const int khi = klo + per < hi ? klo + per : hi;

    float q[R][FD_EPL], o[R][FD_EPL], m[R], l[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float *qh = a.q + (size_t)t * a.ldq + (size_t)(h0 + r) * hd + d0;
#pragma unroll
        for (int e = 0; e < FD_EPL; e++) {
            q[r][e] = r < nr && act ? qh[e] : 0.0f;
            o[r][e] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const int32_t *tab = a.tables + a.table[t];
    const T *kb = a.kc + (size_t)g * hd + d0, *vb = a.vc + (size_t)g * hd + d0;
    /* the warp's first key decides (uniform across the warp: the shuffles below) */
    for (int jb = klo; jb + w * kpw < khi; jb += step) {
        fd_raw<T> kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = jb + gid + ng * u;
            ok[u] = j < khi;
            if (ok[u] && act) {
                const size_t sl = (size_t)tab[j / a.bs] * a.bs + j % a.bs;
                fd_load(kr[u], kb + sl * a.k_dim);
                fd_load(vr[u], vb + sl * a.v_dim);
            } else {
                fd_zero(kr[u]);
                fd_zero(vr[u]);
            }
        }
        float s[R][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[FD_EPL];
            fd_cvt(kr[u], kf);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float acc = 0.0f;
#pragma unroll
                for (int e = 0; e < FD_EPL; e++)
                    acc += q[r][e] * kf[e];
                s[r][u] = acc;
            }
        }
        for (int off = lpr / 2; off > 0; off /= 2)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int u = 0; u < U; u++)
                    s[r][u] += __shfl_xor_sync(0xffffffffu, s[r][u], off);
        /* online softmax per head over the U keys; s becomes the weights p */
        float corr[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float mx = m[r];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float x = s[r][u] * a.scale;
                if (a.softcap > 0.0f)
                    x = a.softcap * tanhf(x / a.softcap);
                s[r][u] = ok[u] ? x : -INFINITY;
                mx = fmaxf(mx, s[r][u]);
            }
            if (mx == -INFINITY) { /* none of this group's keys yet */
                corr[r] = 1.0f;
#pragma unroll
                for (int u = 0; u < U; u++)
                    s[r][u] = 0.0f;
                continue;
            }
            corr[r] = expf(m[r] - mx);
            float sum = l[r] * corr[r];
#pragma unroll
            for (int u = 0; u < U; u++) {
                s[r][u] = expf(s[r][u] - mx);
                sum += s[r][u];
            }
            l[r] = sum;
            m[r] = mx;
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < FD_EPL; e++)
                o[r][e] *= corr[r];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float vf[FD_EPL];
            fd_cvt(vr[u], vf);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int e = 0; e < FD_EPL; e++)
                    o[r][e] += s[r][u] * vf[e];
        }
    }

    /* the warp's groups merged (every lane of a group holds the same m, l) */
    for (int off = lpr; off < 32; off *= 2)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float mb = __shfl_xor_sync(0xffffffffu, m[r], off);
            float lb = __shfl_xor_sync(0xffffffffu, l[r], off);
            float M = fmaxf(m[r], mb);
            float fa = M == -INFINITY ? 0.0f : expf(m[r] - M);
            float fb = M == -INFINITY ? 0.0f : expf(mb - M);
            l[r] = l[r] * fa + lb * fb;
#pragma unroll
            for (int e = 0; e < FD_EPL; e++)
                o[r][e] = o[r][e] * fa + __shfl_xor_sync(0xffffffffu, o[r][e], off) * fb;
            m[r] = M;
        }

    float *wo = fd_sm, *wm = wo + (size_t)FD_WARPS * R * hd, *wl = wm + FD_WARPS * R;
    float *bo = wl + FD_WARPS * R, *bm = bo + (size_t)R * hd, *bl = bm + R;
    float *fac = bl + R, *sl = fac + FD_MAX_SPLIT * R;
    if (lane < lpr && act)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < FD_EPL; e++)
                wo[((size_t)w * R + r) * hd + d0 + e] = o[r][e];
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; r++) {
            wm[w * R + r] = m[r];
            wl[w * R + r] = l[r];
        }
    __syncthreads();
    /* the block's partial over its warps */
    for (int i = tid; i < nr * hd; i += FD_THREADS) {
        const int r = i / hd, d = i % hd;
        float M = -INFINITY, acc = 0.0f, L = 0.0f;
        for (int k = 0; k < FD_WARPS; k++)
            M = fmaxf(M, wm[k * R + r]);
        for (int k = 0; k < FD_WARPS; k++) {
            float mk = wm[k * R + r];
            if (mk == -INFINITY)
                continue;
            float f = expf(mk - M);
            acc += wo[((size_t)k * R + r) * hd + d] * f;
            L += wl[k * R + r] * f;
        }
        bo[(size_t)r * hd + d] = acc;
        if (d == 0) {
            bm[r] = M;
            bl[r] = L;
        }
    }
    cl.sync(); /* every block's partial is in its shared memory */
    /* the merge factors of the S partials, and the sums, with the sink logit */
    if (tid < nr) {
        const int r = tid;
        float M = a.sinks ? a.sinks[h0 + r] : -INFINITY;
        for (int k = 0; k < S; k++)
            M = fmaxf(M, *cl.map_shared_rank(&bm[r], k));
        float L = a.sinks ? expf(a.sinks[h0 + r] - M) : 0.0f;
        for (int k = 0; k < S; k++) {
            float mk = *cl.map_shared_rank(&bm[r], k);
            float f = mk == -INFINITY ? 0.0f : expf(mk - M);
            fac[k * R + r] = f;
            L += *cl.map_shared_rank(&bl[r], k) * f;
        }
        sl[r] = L;
    }
    __syncthreads();
    /* this block's slice of the outputs */
    const int n_out = nr * hd, share = (n_out + S - 1) / S;
    const int o0 = sp * share, o1 = o0 + share < n_out ? o0 + share : n_out;
    for (int i = o0 + tid; i < o1; i += FD_THREADS) {
        const int r = i / hd, d = i % hd;
        float acc = 0.0f;
        for (int k = 0; k < S; k++) {
            float f = fac[k * R + r];
            if (f != 0.0f)
                acc += *cl.map_shared_rank(&bo[(size_t)r * hd + d], k) * f;
        }
        a.out[(size_t)t * a.ldo + (size_t)(h0 + r) * hd + d] = acc / sl[r];
    }
    cl.sync(); /* the others' shared memory is no longer read before any block exits */
}

// ---- launch ----

static int fd_dtype_index(enum dtype dt)
{
    return dt == DTYPE_F32 ? 0 : dt == DTYPE_F16 ? 1 : dt == DTYPE_BF16 ? 2 : -1;
}

static int fd_r_index(int R)
{
    return R == 1 ? 0 : R == 2 ? 1 : R == 4 ? 2 : 3;
}

/* Heads of a block for a group of n_rep query heads: the power of two >= n_rep, at most 8. */
static int fd_heads(int n_rep)
{
    int R = 1;
    while (R < n_rep && R < 8)
        R *= 2;
    return R;
}

/* How many clusters of 1, 2, 4, 8 and 16 blocks of attn_fd_kernel<T, R> the device runs at
 * once with the most shared memory the kernel takes (head_dim 256) into n[5]; n[0] = 0 where
 * it runs none (attn.cu's kernels serve then). */
template <class T, int R>
static void fd_probe(struct cuda_backend *c, int *n)
{
    void (*k)(attn_args<T>, int) = attn_fd_kernel<T, R>;
    size_t smem = fd_smem_floats(R, 32 * FD_EPL) * sizeof(float);
    for (int i = 0; i < FD_N_SPLIT; i++)
        n[i] = 0;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess ||
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    for (int i = 0; i < FD_N_SPLIT; i++) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = 1;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1u << i;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, 1, 1u << i);
        cfg.blockDim = dim3(FD_THREADS);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = c->st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (cudaOccupancyMaxActiveClusters(&n[i], k, &cfg) != cudaSuccess) {
            cudaGetLastError();
            n[i] = 0;
        }
    }
}

template <class T>
static void fd_probe_all(struct cuda_backend *c, int ti)
{
    fd_probe<T, 1>(c, c->fd_ncl[ti][0]);
    fd_probe<T, 2>(c, c->fd_ncl[ti][1]);
    fd_probe<T, 4>(c, c->fd_ncl[ti][2]);
    fd_probe<T, 8>(c, c->fd_ncl[ti][3]);
}

void cu_attn_decode_init(struct cuda_backend *c)
{
    memset(c->fd_ncl, 0, sizeof c->fd_ncl);
    if (!c->attn_flash)
        return;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->dev) != cudaSuccess ||
        major < 9) { /* clusters: sm_90 on */
        cudaGetLastError();
        return;
    }
    fd_probe_all<float>(c, 0);
    fd_probe_all<__half>(c, 1);
    fd_probe_all<__nv_bfloat16>(c, 2);
}

/* The split of a row's keys for items (rows x groups) clusters: the S whose waves of clusters
 * (ncl[i] at once) take the least time, a block's work being 1 / S of a row; ties to the
 * smaller S (less to merge). A function of the shape only, never of the context length, so a
 * decode graph records the right one. */
static int fd_splits(const int *ncl, int items)
{
    int best = 0;
    double best_cost = 0;
    for (int i = 0; i < FD_N_SPLIT; i++) {
        if (ncl[i] <= 0)
            continue;
        double cost = (double)((items + ncl[i] - 1) / ncl[i]) / (double)(1 << i);
        if (!best_cost || cost < best_cost * 0.999) {
            best = i;
            best_cost = cost;
        }
    }
    return 1 << best;
}

template <class T, int R>
static void fd_launch(struct cuda_backend *c, const attn_args<T> &a, int n_kv, int n_tok,
                      const int *ncl)
{
    const int n_ht = (a.n_rep + R - 1) / R, S = fd_splits(ncl, n_kv * n_ht * n_tok);
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = c->pdl ? 1 : 0;
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = 1;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = (unsigned)S;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(n_kv * n_ht), (unsigned)n_tok, (unsigned)S);
    cfg.blockDim = dim3(FD_THREADS);
    cfg.dynamicSmemBytes = fd_smem_floats(R, a.hd) * sizeof(float);
    cfg.stream = c->st;
    cfg.attrs = at;
    cfg.numAttrs = 2;
    cudaError_t rc = cudaLaunchKernelEx(&cfg, attn_fd_kernel<T, R>, a, n_ht);
    if (rc != cudaSuccess)
        cu_fail(c, "attention (flash-decoding) launch", rc);
}

template <class T>
static void fd_dispatch(struct cuda_backend *c, float *out, int ldo, const float *q, int ldq,
                        const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                        const struct attn_params *ap, int R, const int *ncl)
{
    attn_args<T> a = {out, q, ldo, ldq, (const T *)kv->k, (const T *)kv->v, kv->k_dim, kv->v_dim,
                      rows->pos, rows->table, rows->tables, rows->block_size, ap->n_head,
                      ap->n_head / ap->n_kv_head, ap->head_dim, ap->scale, ap->softcap, ap->window,
                      ap->sinks, ap->chunk, rows->span};
    switch (R) {
    case 1: fd_launch<T, 1>(c, a, ap->n_kv_head, n_tok, ncl); break;
    case 2: fd_launch<T, 2>(c, a, ap->n_kv_head, n_tok, ncl); break;
    case 4: fd_launch<T, 4>(c, a, ap->n_kv_head, n_tok, ncl); break;
    default: fd_launch<T, 8>(c, a, ap->n_kv_head, n_tok, ncl); break;
    }
}

bool cu_attn_decode(struct cuda_backend *c, float *out, int ldo, const float *q, int ldq,
                    const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                    const struct attn_params *ap)
{
    const int ti = fd_dtype_index(kv->dtype), R = fd_heads(ap->n_head / ap->n_kv_head);
    if (!c->attn_flash || ti < 0 || ap->head_dim % FD_EPL || ap->head_dim > 32 * FD_EPL ||
        kv->k_dim % FD_EPL || kv->v_dim % FD_EPL || (uintptr_t)kv->k % 16 || (uintptr_t)kv->v % 16)
        return false;
    const int *ncl = c->fd_ncl[ti][fd_r_index(R)];
    if (ncl[0] <= 0)
        return false;
    switch (kv->dtype) {
    case DTYPE_F32: fd_dispatch<float>(c, out, ldo, q, ldq, kv, rows, n_tok, ap, R, ncl); break;
    case DTYPE_F16: fd_dispatch<__half>(c, out, ldo, q, ldq, kv, rows, n_tok, ap, R, ncl); break;
    default: fd_dispatch<__nv_bfloat16>(c, out, ldo, q, ldq, kv, rows, n_tok, ap, R, ncl); break;
    }
    return true;
}
