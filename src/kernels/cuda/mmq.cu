/*
 * mmq: y[t, r] = Σ_k x[t, k] W[r, k] for MLX affine 4- and 8-bit weights on int8 tensor cores
 * (ADR 0147): the long products of a prefill, which otherwise decode the weights into two bf16
 * planes for three cuBLAS products (linear.cu's gemm), or take mma.cu's two bf16 products a
 * step.
 *
 * Arithmetic: mmq_prep_kernel writes each token's scale group of x as integers
 * X = rint(x / d), d = max|x| / 32639 over the group, in two int8 limbs X = 256 h + l
 * (h in [-127, 127], l in [-128, 127]), and the group's sum xs = Σ x in f32. A code q
 * (0..15 or 0..255) is a u8 operand as it lies, so m16n8k32 s8 x u8 products accumulate
 * Σ q X = 256 Σ q h + Σ q l over the group exactly in s32 (|Σ| <= 255 x 32639 x 128 < 2^31 for
 * groups of up to 128); at the group's end y += s d Σ q X + b xs (w = s q + b). The only
 * rounding besides f32's is x's to 16 bits of its group's largest magnitude (|x - d X| <= d / 2,
 * 2^-16 of the group's max), where the bf16 hi + lo split of mma.cu keeps 16 bits of each
 * element.
 *
 * The limbs of each 32 k are stored in the order the codes' fragments come in, so that a
 * thread builds its B registers from one code word with a mask: 4-bit, thread q of the mma's
 * quad takes word q of the row's 16 bytes (k 8q .. 8q + 7, the lower k in the low nibble):
 * b0 = w & 0x0f0f0f0f is k 8q, 8q + 2, 8q + 4, 8q + 6 and b1 = (w >> 4) & 0x0f0f0f0f the odd
 * ones, so x's slot 4q + j holds k 8q + 2j and slot 16 + 4q + j k 8q + 2j + 1; 8-bit, words q
 * and 4 + q are k 4q .. and 16 + 4q .., the natural order.
 *
 * Tiling: a block takes 64 tokens by 128 out rows with 8 warps, 2 along the tokens by 4 along
 * the rows, each 32 tokens x 32 rows = 2 m16 x 4 n8 tiles (193-202 registers, so one block an
 * SM; separate h and l accumulators spill at two), and walks K 32 at a time through
 * MMQ_STAGES shared-memory stages filled by cp.async (zero-filled past n_tok and out). A tile's
 * step is two mma: t = h q, then acc = l q + (acc + 256 t). x rows are 32 + 16 bytes a limb
 * (the 48-byte stride puts ldmatrix's 8 rows in different banks), code rows 16 bytes (4-bit)
 * or 32 + 16 (8-bit). Few blocks split K over grid z in whole groups, into partial sums reduced
 * in order afterwards (deterministic), as mma.cu does.
 *
 * Fragments of mma.m16n8k32 .row.col with 8-bit integers (PTX ISA "Matrix Fragments for
 * mma.m16n8k32"), g = lane / 4, q = lane % 4, the lower k in the low byte of a register:
 *   A (16 tokens x 32 slots): a0 (token g, slots 4q .. 4q + 3), a1 (token g + 8, same), a2
 *     (token g, slots 16 + 4q ..), a3 (token g + 8, same): ldmatrix.x4 of the 16 x 32-byte
 *     tile as 16 x 16 b16, lane l giving the address of token row l % 16 at byte 16 (l / 16);
 *   B (32 slots x 8 out rows): b0 (slots 4q .. 4q + 3 of row g), b1 (slots 16 + 4q ..);
 *   C (16 x 8 s32): c0, c1 (token g, rows 2q, 2q + 1), c2, c3 (token g + 8, the same rows).
 */
#include "affine_frag.cuh"
#include "ptx.cuh"

#define MMQ_BM 64       /* tokens per block: 2 warps of 32 */
#define MMQ_BN 128      /* out rows per block: 4 warps of 32 */
#define MMQ_THREADS 256
#define MMQ_KS 32       /* k per pipeline step */
#define MMQ_STAGES 4    /* cp.async stages in flight */
#define MMQ_XROW 48     /* bytes per token row of a limb's tile: 32 + 16 of padding */
#define MMQ_XMAX 32639  /* |X| at most: 256 x 127 + 127 */

template <int BITS>
struct mmq_cfg {
    static constexpr int WROW = BITS == 4 ? 16 : 48;            /* bytes per code row */
    static constexpr int XBYTES = 2 * MMQ_BM * MMQ_XROW;        /* the two limbs' tiles */
    static constexpr int STAGE = XBYTES + MMQ_BN * WROW;
    static constexpr int SMEM = MMQ_STAGES * STAGE;
};

/* c = a b + c: m16n8k32, s8 x u8 in, s32 accumulate. */
__device__ __forceinline__ void mma_s8u8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1, const int (&c)[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]),
          "r"(c[2]), "r"(c[3]));
}

/* The slot of k' (0..31) within its 32 k: see the header. */
__device__ __forceinline__ int mmq_slot(int kk, int bits)
{
    if (bits != 4)
        return kk;
    const int j = kk / 8, n = kk % 8;
    return (n & 1) * 16 + 4 * j + n / 2;
}

// ---- kernels ----

/* x [n_tok, in] (leading dimension ldx) into the limbs xh / xl [n_tok, in] (int8, slots
 * permuted per 32 k), each group's step d [n_tok, ng] and sum xs [n_tok, ng]; a warp per
 * (token, group). */
__global__ void mmq_prep_kernel(int8_t *xh, int8_t *xl, float *xd, float *xs, const float *x,
                                int ldx, int in, int group, int n_tok, int bits)
{
    const int lane = threadIdx.x % 32, ng = in / group;
    const size_t n = (size_t)n_tok * ng, step = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t p = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; p < n; p += step) {
        const int t = (int)(p / ng), k0 = (int)(p % ng) * group;
        const float *xr = x + (size_t)t * ldx;
        float s = 0.0f, m = 0.0f;
        for (int k = k0 + lane; k < k0 + group; k += 32) {
            float v = xr[k];
            s += v;
            m = fmaxf(m, fabsf(v));
        }
        s = cu_warp_sum(s);
#pragma unroll
        for (int o = 16; o; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float inv = m > 0.0f ? (float)MMQ_XMAX / m : 0.0f;
        for (int k = k0 + lane; k < k0 + group; k += 32) {
            int v = __float2int_rn(xr[k] * inv);
            v = max(-MMQ_XMAX, min(MMQ_XMAX, v));
            const int h = (v + 128) >> 8, l = v - 256 * h;
            const size_t o = (size_t)t * in + (k & ~31) + mmq_slot(k & 31, bits);
            xh[o] = (int8_t)h;
            xl[o] = (int8_t)l;
        }
        if (lane == 0) {
            xs[p] = s;
            xd[p] = m / (float)MMQ_XMAX;
        }
    }
}

/* grid: (out / 128, n_tok / 128, splits of K) rounded up; block z takes the groups
 * [z gpz, (z + 1) gpz) and writes y + z zstride (leading dimension ldy), overwriting. */
template <int BITS, int SDT>
__global__ void __launch_bounds__(MMQ_THREADS, 1)
mmq_affine_kernel(float *y, int ldy, size_t zstride, const int8_t *xh, const int8_t *xl,
                  const float *xd, const float *xs, cu_wmat w, int n_tok, int gpz)
{
    using C = mmq_cfg<BITS>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;
    const int g = lane / 4, tq = lane % 4, wm = wid / 4, wn = wid % 4;
    const int n0 = blockIdx.x * MMQ_BN, m0 = blockIdx.y * MMQ_BM;
    const int ng = w.in / w.qgroup, spg = w.qgroup / MMQ_KS;
    const int g_lo = blockIdx.z * gpz, g_hi = min(ng, g_lo + gpz);
    const int k_lo = g_lo * spg, steps = max(g_hi - g_lo, 0) * spg;
    y += blockIdx.z * zstride;

    /* step ks (k 32 ks ..) into stage st: x rows m0.. of both limbs, code rows n0.. */
    auto load = [&](int st, int ks) {
        uint8_t *sp = smem + st * C::STAGE;
        const int k0 = ks * MMQ_KS;
        for (int i = tid; i < 2 * MMQ_BM * 2; i += MMQ_THREADS) {
            int p = i / (MMQ_BM * 2), row = i / 2 % MMQ_BM, c = i % 2, t = m0 + row;
            const int8_t *src = (p ? xl : xh) + (size_t)min(t, n_tok - 1) * w.in + k0 + 16 * c;
            cp_async16(smem_u32(sp + (p * MMQ_BM + row) * MMQ_XROW + 16 * c), src, t < n_tok);
        }
        constexpr int CPR = BITS / 4;   /* 16-byte pieces per row and step */
        for (int i = tid; i < MMQ_BN * CPR; i += MMQ_THREADS) {
            int row = i / CPR, c = i % CPR, r = n0 + row;
            const uint8_t *src = w.data + (size_t)min(r, w.out - 1) * w.row_bytes +
                                 (size_t)ks * (4 * BITS) + 16 * c;
            cp_async16(smem_u32(sp + C::XBYTES + row * C::WROW + 16 * c), src, r < w.out);
        }
    };

    int acc[2][4][4];
    float yo[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                acc[mi][ni][e] = 0;
                yo[mi][ni][e] = 0.0f;
            }
    const int zero[4] = {0, 0, 0, 0};

    cp_pipe_start<MMQ_STAGES>(load, steps, k_lo);
    for (int kt = 0; kt < steps; kt++) {
        cp_pipe_step<MMQ_STAGES>(load, kt, steps, k_lo);
        const uint8_t *sp = smem + (kt % MMQ_STAGES) * C::STAGE;

        /* A: both limbs of the warp's two m16 tiles */
        uint32_t ah[2][4], al[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int row = wm * 32 + mi * 16 + lane % 16, col = 16 * (lane / 16);
            ldsm_x4(ah[mi], smem_u32(sp + row * MMQ_XROW + col));
            ldsm_x4(al[mi], smem_u32(sp + (MMQ_BM + row) * MMQ_XROW + col));
        }
#pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            const uint8_t *wr = sp + C::XBYTES + (wn * 32 + ni * 8 + g) * C::WROW;
            uint32_t b0, b1;
            if constexpr (BITS == 4) {
                const uint32_t v = *(const uint32_t *)(wr + 4 * tq);
                b0 = v & 0x0f0f0f0fu;
                b1 = (v >> 4) & 0x0f0f0f0fu;
            } else {
                b0 = *(const uint32_t *)(wr + 4 * tq);
                b1 = *(const uint32_t *)(wr + 16 + 4 * tq);
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                int t[4], c[4];
                mma_s8u8(t, ah[mi], b0, b1, zero);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    c[e] = acc[mi][ni][e] + 256 * t[e];
                mma_s8u8(acc[mi][ni], al[mi], b0, b1, c);
            }
        }

        /* at the group's end: y += s d Σ q X + b Σ x */
        if ((kt + 1) % spg == 0) {
            const int grp = g_lo + kt / spg;
            float sd[2][2], sx[2][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int t = m0 + wm * 32 + mi * 16 + g + 8 * e;
                    bool in = t < n_tok;
                    sd[mi][e] = in ? __ldg(xd + (size_t)t * ng + grp) : 0.0f;
                    sx[mi][e] = in ? __ldg(xs + (size_t)t * ng + grp) : 0.0f;
                }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                float sc[2], bi[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    size_t r = (size_t)min(n0 + wn * 32 + ni * 8 + 2 * tq + e, w.out - 1);
                    sc[e] = cu_ld_sb<SDT>(w.qs + r * w.qrow_bytes, grp);
                    bi[e] = cu_ld_sb<SDT>(w.qb + r * w.qrow_bytes, grp);
                }
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        yo[mi][ni][e] += sc[e & 1] * (sd[mi][e >> 1] * (float)acc[mi][ni][e]) +
                                         bi[e & 1] * sx[mi][e >> 1];
                        acc[mi][ni][e] = 0;
                    }
            }
        }
    }
    cp_async_wait<0>();
    mma_store_warp(y, ldy, yo, m0, n0, wm, wn, lane, n_tok, w.out);
}

// ---- launchers ----

template <int BITS, int SDT>
static void mmq_launch(struct cuda_backend *c, dim3 grid, float *y, int ldy, size_t zstride,
                       const int8_t *xh, const int8_t *xl, const float *xd, const float *xs,
                       const cu_wmat &w, int n_tok, int gpz)
{
    using C = mmq_cfg<BITS>;
    cudaError_t rc = cudaFuncSetAttribute(mmq_affine_kernel<BITS, SDT>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (rc != cudaSuccess) {
        cu_fail(c, "mmq shared memory", rc);
        return;
    }
    mmq_affine_kernel<BITS, SDT><<<grid, MMQ_THREADS, C::SMEM, c->st>>>(y, ldy, zstride, xh, xl, xd,
                                                                        xs, w, n_tok, gpz);
}

bool cu_mmq_ok(const struct cu_wmat *m)
{
    return m->qmode == QMODE_AFFINE && (m->qbits == 4 || m->qbits == 8) && m->qgroup >= MMQ_KS &&
           m->qgroup <= 128 && !(m->qgroup & (m->qgroup - 1)) && m->in % m->qgroup == 0 &&
           (uintptr_t)m->data % 16 == 0 && m->row_bytes % 16 == 0 &&
           (m->qsdt == DTYPE_F32 || m->qsdt == DTYPE_F16 || m->qsdt == DTYPE_BF16);
}

void cu_mmq_affine(struct cuda_backend *c, float *y, int ldy, const float *x, int ldx,
                   const struct cu_wmat *w, int n_tok)
{
    const int ng = w->in / w->qgroup, nk = w->in / MMQ_KS;
    const int bx = (w->out + MMQ_BN - 1) / MMQ_BN, by = (n_tok + MMQ_BM - 1) / MMQ_BM;
    if (w->out <= 0 || n_tok <= 0)
        return;
    if (by > 65535) {
        cu_fail(c, "mmq: too many tokens", cudaErrorInvalidValue);
        return;
    }
    /* K split as mma.cu splits it, while the grid is short of one block an SM */
    int gpz;
    const int nz = cu_mma_splits((long)bx * by, c->n_sm > 0 ? c->n_sm : 132, ng, nk, &gpz);
    /* scratch (floats): x's two int8 limbs, its groups' steps and sums, the splits' sums */
    const size_t nx = (size_t)n_tok * w->in, nxs = (size_t)n_tok * ng;
    const size_t nxf = (2 * nx + 15) / 16 * 4, zs = (size_t)n_tok * w->out;
    float *scr = cu_scratch(c, nxf + 2 * nxs + (nz > 1 ? (size_t)nz * zs : 0));
    if (!scr)
        return;
    int8_t *xh = (int8_t *)scr, *xl = xh + nx;
    float *xd = scr + nxf, *xs = xd + nxs, *part = xs + nxs;
    mmq_prep_kernel<<<cu_grid256(nxs * 32), 256, 0, c->st>>>(xh, xl, xd, xs, x, ldx, w->in,
                                                          w->qgroup, n_tok, w->qbits);
    if (!cu_check(c, "mmq split x"))
        return;
    dim3 grid(bx, by, nz);
    float *yo = nz > 1 ? part : y;
    const int ldo = nz > 1 ? w->out : ldy;
    const size_t zst = nz > 1 ? zs : 0;
    AFFINE_DISPATCH(w->qbits, w->qsdt,
                    (mmq_launch<AB, AS>(c, grid, yo, ldo, zst, xh, xl, xd, xs, *w, n_tok, gpz)));
    if (cu_check(c, "mmq") && nz > 1)
        cu_mma_reduce(c, y, ldy, part, nz, w->out, n_tok);
}
