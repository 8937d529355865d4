/*
 * mma: y[t, r] = Σ_k x[t, k] W[r, k] for MLX affine 4- and 8-bit weights on tensor cores,
 * straight from the codes (ADR 0074): the product of more than GEMV_TOK rows (prefill,
 * batched decode) that linear.cu's gemm() hands over, where the old path decoded every weight
 * into two bf16 planes in scratch for three cuBLAS products.
 *
 * Arithmetic (exact apart from f32 accumulation): mma_prep_kernel splits x into bf16
 * hi = bf16(x), lo = bf16(x - hi) and sums each scale group, xs[t, g] = Σ_{k in g} x[t, k].
 * A code q (0..15 or 0..255) is exact in bf16, so m16n8k16 bf16 products accumulate
 * acc_g = Σ_{k in g} q[r, k] (xh[t, k] + xl[t, k]) in f32 registers (two mma per tile, hi and
 * lo: bf16 x bf16 products are exact in f32); at the group's end y += s[r, g] acc_g +
 * b[r, g] xs[t, g] (w = s q + b). 4-bit codes become bf16 through 128 + q (0x4300 | q) minus 128
 * in bf16, exact, so no -128 s xs term has to cancel afterwards; 8-bit codes through f32.
 *
 * Tiling: a block takes BM = 32 WM tokens (WM = 1 for <= 32 tokens, else 2) by 128 out rows,
 * warps WM x 4, each 32 tokens x 32 rows = 2 m16 x 4 n8 tiles, and walks K 32 at a time
 * (every step inside one scale group: groups are powers of two >= 32) through MMA_STAGES
 * shared-memory stages filled by cp.async (zero-filled past n_tok and out). x tiles hold
 * 32 + 8 bf16 a token row (the 80-byte stride puts ldmatrix's 8 rows in different banks); code
 * rows are 16 bytes (4-bit) or 32 + 16 (8-bit, the same reason). Few blocks (a product of few
 * tokens: batched decode) split K over grid z in whole groups, into partial sums reduced in
 * order afterwards (deterministic, no atomics).
 *
 * Fragments of mma.m16n8k16 .row.col (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating
 * point type"), g = lane / 4, q = lane % 4, the lower k in the low 16 bits of a register:
 *   A (16 tokens x 16 k): a0 (token g, k 2q, 2q+1), a1 (token g+8, same k), a2 (token g,
 *     k 2q+8, 2q+9), a3 (token g+8, k 2q+8, 2q+9): ldmatrix.x4, lane l giving the address of
 *     token row l % 16 at k 8 (l / 16) (its matrices 0..3 are those four registers);
 *   B (16 k x 8 out rows): b0 (k 2q, 2q+1 of row g), b1 (k 2q+8, 2q+9 of row g), built from the
 *     codes: 4-bit: byte q of the row's code words 0 and 1 (k 0..15), 2 and 3 (k 16..31), its
 *     low nibble the lower k; 8-bit: bytes 2 (q & 1), +1 of words q / 2 + {0, 2} and + {4, 6};
 *   C (16 x 8 f32): c0, c1 (token g, rows 2q, 2q+1), c2, c3 (token g+8, the same rows).
 */
#include <cuda_bf16.h>

#include "affine_frag.cuh"
#include "ptx.cuh"

#define MMA_BN 128      /* out rows per block: 4 warps of 32 */
#define MMA_KS 32       /* k per pipeline step */
#define MMA_STAGES 4    /* cp.async stages in flight */
#define MMA_XROW 40     /* bf16 per token row of an x tile: 32 + 8 of padding */
#define MMA_MAX_Z 16    /* splits of K at most */

/* The shape of one instantiation: BM tokens per block, a stage's bytes (x hi, x lo, codes). */
template <int BITS, int WM>
struct mma_cfg {
    static constexpr int BM = 32 * WM;
    static constexpr int THREADS = 128 * WM;
    static constexpr int WROW = BITS == 4 ? 16 : 48;        /* bytes per code row in a stage */
    static constexpr int XBYTES = 2 * BM * MMA_XROW * 2;    /* the x tile's two planes */
    static constexpr int STAGE = XBYTES + MMA_BN * WROW;
    static constexpr int SMEM = MMA_STAGES * STAGE;
};

// ---- kernels ----

/* x [n_tok, in] (leading dimension ldx) into bf16 planes hi / lo [n_tok, in] and the group
 * sums xs [n_tok, in / group]; a warp per (token, group). */
__global__ void mma_prep_kernel(__nv_bfloat16 *xh, __nv_bfloat16 *xl, float *xs, const float *x,
                                int ldx, int in, int group, int n_tok)
{
    const int lane = threadIdx.x % 32, ng = in / group;
    const size_t n = (size_t)n_tok * ng, step = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t p = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; p < n; p += step) {
        const int t = (int)(p / ng), k0 = (int)(p % ng) * group;
        float s = 0.0f;
        for (int k = k0 + lane; k < k0 + group; k += 32) {
            float v = x[(size_t)t * ldx + k];
            __nv_bfloat16 h = __float2bfloat16_rn(v);
            xh[(size_t)t * in + k] = h;
            xl[(size_t)t * in + k] = __float2bfloat16_rn(v - __bfloat162float(h));
            s += v;
        }
        s = cu_warp_sum(s);
        if (lane == 0)
            xs[p] = s;
    }
}

/* grid: (out / 128, n_tok / BM, splits of K) rounded up; block z takes the groups
 * [z gpz, (z + 1) gpz) and writes y + z zstride (leading dimension ldy), overwriting. */
template <int BITS, int SDT, int WM>
__global__ void __launch_bounds__(128 * WM, 2 / WM)
mma_affine_kernel(float *y, int ldy, size_t zstride, const __nv_bfloat16 *xh,
                  const __nv_bfloat16 *xl, const float *xs, cu_wmat w, int n_tok, int gpz)
{
    using C = mma_cfg<BITS, WM>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;
    const int g = lane / 4, tq = lane % 4, wm = wid / 4, wn = wid % 4;
    const int n0 = blockIdx.x * MMA_BN, m0 = blockIdx.y * C::BM;
    const int ng = w.in / w.qgroup, spg = w.qgroup / MMA_KS;
    const int g_lo = blockIdx.z * gpz, g_hi = min(ng, g_lo + gpz);
    const int k_lo = g_lo * spg, steps = max(g_hi - g_lo, 0) * spg;
    y += blockIdx.z * zstride;

    /* step ks (k 32 ks ..) into stage st: x rows m0.. of both planes, code rows n0.. */
    auto load = [&](int st, int ks) {
        uint8_t *sp = smem + st * C::STAGE;
        const int k0 = ks * MMA_KS;
        for (int i = tid; i < 2 * C::BM * 4; i += C::THREADS) {
            int p = i / (C::BM * 4), row = i / 4 % C::BM, c = i % 4, t = m0 + row;
            const __nv_bfloat16 *src =
                (p ? xl : xh) + (size_t)min(t, n_tok - 1) * w.in + k0 + 8 * c;
            cp_async16(smem_u32(sp + (p * C::BM + row) * MMA_XROW * 2 + 16 * c), src, t < n_tok);
        }
        constexpr int CPR = BITS / 4;   /* 16-byte pieces per row and step */
        for (int i = tid; i < MMA_BN * CPR; i += C::THREADS) {
            int row = i / CPR, c = i % CPR, r = n0 + row;
            const uint8_t *src = w.data + (size_t)min(r, w.out - 1) * w.row_bytes +
                                 (size_t)ks * (4 * BITS) + 16 * c;
            cp_async16(smem_u32(sp + C::XBYTES + row * C::WROW + 16 * c), src, r < w.out);
        }
    };

    float acc[2][4][4], yo[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mi][ni][e] = yo[mi][ni][e] = 0.0f;

    cp_pipe_start<MMA_STAGES>(load, steps, k_lo);
    for (int kt = 0; kt < steps; kt++) {
        cp_pipe_step<MMA_STAGES>(load, kt, steps, k_lo);
        const uint8_t *sp = smem + (kt % MMA_STAGES) * C::STAGE;

        /* the group's scales, biases and x sums at its last step, asked for before the
         * products that hide their latency */
        const bool gend = (kt + 1) % spg == 0;
        const int grp = g_lo + kt / spg;
        float sc[4][2], bi[4][2], sx[2][2];
        if (gend) {
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    size_t r = (size_t)min(n0 + wn * 32 + ni * 8 + 2 * tq + e, w.out - 1);
                    sc[ni][e] = cu_ld_sb<SDT>(w.qs + r * w.qrow_bytes, grp);
                    bi[ni][e] = cu_ld_sb<SDT>(w.qb + r * w.qrow_bytes, grp);
                }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int t = m0 + wm * 32 + mi * 16 + g + 8 * e;
                    sx[mi][e] = t < n_tok ? __ldg(xs + (size_t)t * ng + grp) : 0.0f;
                }
        }

        /* B: bq[ni][2 h + j] = b_j of k 16 h .. 16 h + 15 for out row 8 ni + g of the warp */
        uint32_t bq[4][4];
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const uint8_t *wr = sp + C::XBYTES + (wn * 32 + ni * 8 + g) * C::WROW;
            if constexpr (BITS == 4) {
                uint4 v = *(const uint4 *)wr;
                bq[ni][0] = codes4_bf16(v.x, 8 * tq);
                bq[ni][1] = codes4_bf16(v.y, 8 * tq);
                bq[ni][2] = codes4_bf16(v.z, 8 * tq);
                bq[ni][3] = codes4_bf16(v.w, 8 * tq);
            } else {
                uint4 v0 = *(const uint4 *)wr, v1 = *(const uint4 *)(wr + 16);
                const bool odd = tq >= 2;   /* k 2 tq lies in word tq / 2 of each 4 */
                const int kb = 2 * (tq & 1);
                bq[ni][0] = codes8_bf16(odd ? v0.y : v0.x, kb);
                bq[ni][1] = codes8_bf16(odd ? v0.w : v0.z, kb);
                bq[ni][2] = codes8_bf16(odd ? v1.y : v1.x, kb);
                bq[ni][3] = codes8_bf16(odd ? v1.w : v1.z, kb);
            }
        }

#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t a[2][2][4];    /* [plane][m16 tile] */
#pragma unroll
            for (int p = 0; p < 2; p++)
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    int row = p * C::BM + wm * 32 + mi * 16 + lane % 16;
                    int col = 16 * h + 8 * (lane / 16);
                    ldsm_x4(a[p][mi], smem_u32(sp + (row * MMA_XROW + col) * 2));
                }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int p = 0; p < 2; p++)
                        mma_bf16(acc[mi][ni], a[p][mi], bq[ni][2 * h], bq[ni][2 * h + 1]);
        }

        /* at the group's end: y += s Σ q x + b Σ x */
        if (gend) {
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        yo[mi][ni][e] += sc[ni][e & 1] * acc[mi][ni][e] +
                                         bi[ni][e & 1] * sx[mi][e >> 1];
                        acc[mi][ni][e] = 0.0f;
                    }
        }
    }
    cp_async_wait<0>();
    mma_store_warp(y, ldy, yo, m0, n0, wm, wn, lane, n_tok, w.out);
}

/* y[t, r] = Σ_z part[z][t, r] in order of z (part: nz x [n_tok, out]). */
__global__ void mma_reduce_kernel(float *y, int ldy, const float *part, int nz, int out, int n_tok)
{
    const size_t n = (size_t)n_tok * out;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < nz; z++)
            s += part[(size_t)z * n + i];
        y[i / out * ldy + i % out] = s;
    }
}

// ---- launchers ----

void cu_mma_reduce(struct cuda_backend *c, float *y, int ldy, const float *part, int nz, int out,
                   int n_tok)
{
    mma_reduce_kernel<<<cu_grid256((size_t)n_tok * out), 256, 0, c->st>>>(y, ldy, part, nz, out,
                                                                          n_tok);
    cu_check(c, "mma reduce");
}

/* Split K in whole groups while the grid is short of blocks, each split >= 2 groups and >= 4
 * steps, into as many splits as fill one wave (rounded down: a second wave of a few blocks
 * would cost as much as the first). */
int cu_mma_splits(long blocks, long target, int ng, int nk, int *gpz)
{
    int nz = 1;
    if (2 * blocks <= target) {
        int zmax = min(min(ng / 2, nk / 4), MMA_MAX_Z);
        nz = (int)min((long)max(zmax, 1), target / blocks);
    }
    *gpz = (ng + nz - 1) / nz;
    return (ng + *gpz - 1) / *gpz;
}

template <int BITS, int SDT, int WM>
static void mma_launch(struct cuda_backend *c, dim3 grid, float *y, int ldy, size_t zstride,
                       const __nv_bfloat16 *xh, const __nv_bfloat16 *xl, const float *xs,
                       const cu_wmat &w, int n_tok, int gpz)
{
    using C = mma_cfg<BITS, WM>;
    cudaError_t rc = cudaFuncSetAttribute(mma_affine_kernel<BITS, SDT, WM>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (rc != cudaSuccess) {
        cu_fail(c, "mma shared memory", rc);
        return;
    }
    mma_affine_kernel<BITS, SDT, WM><<<grid, C::THREADS, C::SMEM, c->st>>>(y, ldy, zstride, xh, xl,
                                                                           xs, w, n_tok, gpz);
}

template <int BITS, int SDT>
static void mma_launch_wm(struct cuda_backend *c, int wm, dim3 grid, float *y, int ldy,
                          size_t zstride, const __nv_bfloat16 *xh, const __nv_bfloat16 *xl,
                          const float *xs, const cu_wmat &w, int n_tok, int gpz)
{
    if (wm == 1)
        mma_launch<BITS, SDT, 1>(c, grid, y, ldy, zstride, xh, xl, xs, w, n_tok, gpz);
    else
        mma_launch<BITS, SDT, 2>(c, grid, y, ldy, zstride, xh, xl, xs, w, n_tok, gpz);
}

bool cu_mma_ok(const struct cu_wmat *m)
{
    return m->qmode == QMODE_AFFINE && (m->qbits == 4 || m->qbits == 8) && m->qgroup >= MMA_KS &&
           !(m->qgroup & (m->qgroup - 1)) && m->in % m->qgroup == 0 &&
           (uintptr_t)m->data % 16 == 0 && m->row_bytes % 16 == 0 &&
           (m->qsdt == DTYPE_F32 || m->qsdt == DTYPE_F16 || m->qsdt == DTYPE_BF16);
}

/* Warps per SM the split of K aims at: 8, one block of 256 threads or two of 128 (a thread
 * takes 208-224 registers). */
#define MMA_WARPS_PER_SM 8

void cu_mma_affine(struct cuda_backend *c, float *y, int ldy, const float *x, int ldx,
                   const struct cu_wmat *w, int n_tok)
{
    const int ng = w->in / w->qgroup, nk = w->in / MMA_KS;
    const int wm = n_tok <= 32 ? 1 : 2, bm = 32 * wm;
    const int bx = (w->out + MMA_BN - 1) / MMA_BN, by = (n_tok + bm - 1) / bm;
    if (w->out <= 0)
        return;
    if (by > 65535) {
        cu_fail(c, "mma: too many tokens", cudaErrorInvalidValue);
        return;
    }
    const long target = (long)MMA_WARPS_PER_SM / (4 * wm) * (c->n_sm > 0 ? c->n_sm : 132);
    int gpz;
    const int nz = cu_mma_splits((long)bx * by, target, ng, nk, &gpz);
    /* scratch: x's two bf16 planes, its group sums, the splits' partial sums */
    const size_t nx = (size_t)n_tok * w->in, nxs = (size_t)n_tok * ng;
    const size_t zs = (size_t)n_tok * w->out;
    float *scr = cu_scratch(c, nx + nxs + (nz > 1 ? (size_t)nz * zs : 0));
    if (!scr)
        return;
    __nv_bfloat16 *xh = (__nv_bfloat16 *)scr, *xl = xh + nx;
    float *xs = scr + nx, *part = xs + nxs;
    mma_prep_kernel<<<cu_grid256(nxs * 32), 256, 0, c->st>>>(xh, xl, xs, x, ldx, w->in, w->qgroup,
                                                          n_tok);
    if (!cu_check(c, "mma split x"))
        return;
    dim3 grid(bx, by, nz);
    float *yo = nz > 1 ? part : y;
    const int ldo = nz > 1 ? w->out : ldy;
    const size_t zst = nz > 1 ? zs : 0;
    AFFINE_DISPATCH(w->qbits, w->qsdt,
                    (mma_launch_wm<AB, AS>(c, wm, grid, yo, ldo, zst, xh, xl, xs, *w, n_tok, gpz)));
    if (cu_check(c, "mma") && nz > 1)
        cu_mma_reduce(c, y, ldy, part, nz, w->out, n_tok);
}
