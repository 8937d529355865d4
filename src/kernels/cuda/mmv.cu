/*
 * mmv: y[t, r] = Σ_k x[t, k] W[r, k] for 2..MMV_TOK rows of x (speculative verification,
 * decode of a few sequences) against MLX affine 4/8-bit weights, on tensor cores, each weight
 * byte read once per call (ADR 0115). The GEMV of linear.cu multiplies every code into every
 * row of x with one FMA each (8 rows: 8 FMAs and the x loads of 8 rows per code), which made
 * 8 rows cost 10x one row (124 against 1,285 GB/s on 14336 x 4096, 4-bit).
 *
 * Arithmetic: that of mma.cu (ADR 0074), exact apart from f32 accumulation: codes are exact in
 * bf16; x is split into hi = bf16(x), lo = bf16(x - hi), two m16n8k16 products per step
 * accumulate Σ_{k in g} q (xh + xl) in f32; at each scale group's end y += s acc + b Σ_{k in g} x.
 *
 * Roles are swapped against mma.cu: the weight rows are the M side (16 per tile), x's rows
 * the N side (8 per tile, those past n_tok zero), so a warp's tile is 16 weight rows by every
 * token. Fragments of mma.m16n8k16 .row.col, g = lane / 4, c = lane % 4:
 *   A (16 weight rows x 16 k): a0 (row g, k 2c, 2c+1), a1 (row g + 8, same k), a2 (row g,
 *     k 2c+8, 2c+9), a3 (row g + 8, k 2c+8, 2c+9);
 *   B (16 k x 8 tokens): b0 (k 2c, 2c+1 of token g), b1 (k 2c+8, 2c+9 of token g);
 *   C: c0, c1 (row g, tokens 2c, 2c+1), c2, c3 (row g + 8, the same tokens).
 * A product sums over k in any order, so the k of a step need not be the group's k in order:
 * lane c reads its own quarter of each row's group (GROUP / 4 consecutive codes: 8 bytes of a
 * 4-bit group of 64) and of x, and a step pairs them up as it likes, A and B alike:
 *   4-bit: a code word (elements e0..e7, element j in bits 4j..4j+3) gives two steps,
 *     (e0, e4) (e1, e5) then (e2, e6) (e3, e7): one shift, one mask-or (128 + q in bf16) and
 *     one bf16 subtraction per two codes;
 *   8-bit: a word (bytes b0..b3) gives one step, (b0, b1) (b2, b3), through f32.
 * Every step stays inside one scale group (4 lanes x GROUP / 4 codes), so the group's fold
 * applies s and b of the lane's two rows to the accumulator.
 *
 * Blocks: KS warps share RT tiles (16 RT weight rows), warp w taking U consecutive groups at a
 * time (mmv_u) from group w U on, all their code loads issued before the first is used; the warps'
 * sums meet in shared memory and warp 0 adds them in order (deterministic, no atomics). KS is
 * chosen per launch so that the grid has about MMV_WARPS_PER_SM warps a multiprocessor.
 */
#include "affine_frag.cuh"

#define MMV_MAX_WARPS 8
#define MMV_WARPS_PER_SM 16

/* Groups a warp loads before it uses the first: 64 bytes of codes per row and lane (4-bit
 * groups of 64: 4; 8-bit groups of 128: 2 would spill past 255 registers at 4 tiles). */
__host__ __device__ constexpr int mmv_u(int bits, int group)
{
    return group * bits / 32 <= 8 ? 4 : group * bits / 32 == 16 ? 2 : 1;
}

/* BPT bytes (4, 8, 16 or 32) at p, 8-byte aligned at least, as words. */
template <int BPT>
__device__ __forceinline__ void mmv_load(uint32_t (&q)[BPT / 4], const uint8_t *p)
{
    if constexpr (BPT == 4) {
        q[0] = __ldg((const uint32_t *)p);
    } else if constexpr (BPT == 8) {
        uint2 v = __ldg((const uint2 *)p);
        q[0] = v.x, q[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < BPT / 16; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            q[4 * i] = v.x, q[4 * i + 1] = v.y, q[4 * i + 2] = v.z, q[4 * i + 3] = v.w;
        }
    }
}

/* Elements j and j + 4 of a word of 4-bit codes as a bf16 pair (j in the low half), exactly. */
__device__ __forceinline__ uint32_t mmv_nib_pair(uint32_t w, int j)
{
    uint32_t r = (w >> (4 * j)) & 0x000f000fu | 0x43004300u;
    __nv_bfloat162 h;
    h.x = __ushort_as_bfloat16((unsigned short)(r & 0xffffu));
    h.y = __ushort_as_bfloat16((unsigned short)(r >> 16));
    return bf162_bits(__hsub2(h, __float2bfloat162_rn(128.0f)));
}

/* x's pair (a, b) as the bf16 pairs hi = bf16(a, b) and lo = bf16(a - hi, b - hi). */
__device__ __forceinline__ void mmv_split(float a, float b, uint32_t &hi, uint32_t &lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    hi = bf162_bits(h);
    lo = bf162_bits(__floats2bfloat162_rn(a - __bfloat162float(h.x), b - __bfloat162float(h.y)));
}

/* grid: the jobs' blocks one after the other, each job ceil(out / (16 RT)) blocks of KS warps. */
template <int BITS, int SDT, int GROUP, int RT>
__global__ void __launch_bounds__(32 * MMV_MAX_WARPS)
mmv_kernel(ga_jobs js, int n_tok)
{
    constexpr int CPT = GROUP / 4;              /* codes a lane takes of a row's group */
    constexpr int BPT = CPT * BITS / 8;         /* their bytes */
    constexpr int WPT = BPT / 4;                /* their words */
    constexpr int GBYTES = GROUP * BITS / 8;    /* a row's group */
    constexpr int U = mmv_u(BITS, GROUP);
    __shared__ float red[MMV_MAX_WARPS][RT][4][32];
    cu_pdl_trigger();
    const ga_job jb = ga_pick(js, (int)blockIdx.x);
    const cu_wmat &w = jb.w;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, ks = blockDim.x / 32;
    const int g = lane / 4, c = lane % 4;
    const int r0 = (blockIdx.x - jb.b0) * 16 * RT;
    const int ng = w.in / GROUP;
    const uint8_t *wr[RT][2], *sr[RT][2], *br[RT][2];
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            size_t rr = (size_t)min(r0 + 16 * t + 8 * h + g, w.out - 1);
            wr[t][h] = w.data + rr * w.row_bytes + c * BPT;
            sr[t][h] = w.qs + rr * w.qrow_bytes;
            br[t][h] = w.qb + rr * w.qrow_bytes;
        }
    /* this lane's x row (token g; zeros past n_tok) */
    const bool tok_ok = g < n_tok;
    const float *xr = jb.x + (size_t)(tok_ok ? g : 0) * w.in + c * CPT;
    float y[RT][4];
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            y[t][i] = 0.0f;
    cu_pdl_wait();
    for (int g0 = wid * U; g0 < ng; g0 += ks * U) {
        uint32_t q[U][RT][2][WPT];
        float s[U][RT][2], b[U][RT][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int gi = min(g0 + u, ng - 1);
#pragma unroll
            for (int t = 0; t < RT; t++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mmv_load<BPT>(q[u][t][h], wr[t][h] + (size_t)gi * GBYTES);
                    s[u][t][h] = cu_ld_sb<SDT>(sr[t][h], gi);
                    b[u][t][h] = cu_ld_sb<SDT>(br[t][h], gi);
                }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int gi = g0 + u;
            if (gi >= ng)
                break;
            float xv[CPT];
            float xsum = 0.0f;
#pragma unroll
            for (int i = 0; i < CPT / 4; i++) {
                float4 f = tok_ok ? __ldg((const float4 *)(xr + (size_t)gi * GROUP) + i)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
                xsum += (f.x + f.y) + (f.z + f.w);
            }
            /* Σ x of the group for token g (the quad's four quarters), then for the tokens
             * 2c and 2c + 1 of this lane's accumulators */
            xsum += __shfl_xor_sync(0xffffffffu, xsum, 1);
            xsum += __shfl_xor_sync(0xffffffffu, xsum, 2);
            const float xs0 = __shfl_sync(0xffffffffu, xsum, 8 * c);
            const float xs1 = __shfl_sync(0xffffffffu, xsum, 8 * c + 4);
            float acc[RT][4];
#pragma unroll
            for (int t = 0; t < RT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[t][i] = 0.0f;
#pragma unroll
            for (int j = 0; j < WPT; j++) {
                if constexpr (BITS == 4) {
                    /* word j: elements 8j .. 8j + 7 of the lane's quarter, two steps */
#pragma unroll
                    for (int st = 0; st < 2; st++) {
                        const float *x8 = xv + 8 * j;
                        uint32_t bh0, bl0, bh1, bl1;
                        mmv_split(x8[2 * st], x8[2 * st + 4], bh0, bl0);
                        mmv_split(x8[2 * st + 1], x8[2 * st + 5], bh1, bl1);
#pragma unroll
                        for (int t = 0; t < RT; t++) {
                            const uint32_t a[4] = {mmv_nib_pair(q[u][t][0][j], 2 * st),
                                                   mmv_nib_pair(q[u][t][1][j], 2 * st),
                                                   mmv_nib_pair(q[u][t][0][j], 2 * st + 1),
                                                   mmv_nib_pair(q[u][t][1][j], 2 * st + 1)};
                            mma_bf16(acc[t], a, bh0, bh1);
                            mma_bf16(acc[t], a, bl0, bl1);
                        }
                    }
                } else {
                    /* word j: elements 4j .. 4j + 3, one step */
                    const float *x4 = xv + 4 * j;
                    uint32_t bh0, bl0, bh1, bl1;
                    mmv_split(x4[0], x4[1], bh0, bl0);
                    mmv_split(x4[2], x4[3], bh1, bl1);
#pragma unroll
                    for (int t = 0; t < RT; t++) {
                        const uint32_t a[4] = {codes8_bf16(q[u][t][0][j], 0), codes8_bf16(q[u][t][1][j], 0),
                                               codes8_bf16(q[u][t][0][j], 2), codes8_bf16(q[u][t][1][j], 2)};
                        mma_bf16(acc[t], a, bh0, bh1);
                        mma_bf16(acc[t], a, bl0, bl1);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < RT; t++) {
                y[t][0] += s[u][t][0] * acc[t][0] + b[u][t][0] * xs0;
                y[t][1] += s[u][t][0] * acc[t][1] + b[u][t][0] * xs1;
                y[t][2] += s[u][t][1] * acc[t][2] + b[u][t][1] * xs0;
                y[t][3] += s[u][t][1] * acc[t][3] + b[u][t][1] * xs1;
            }
        }
    }
    if (ks > 1) {
#pragma unroll
        for (int t = 0; t < RT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[wid][t][i][lane] = y[t][i];
        __syncthreads();
        if (wid != 0)
            return;
#pragma unroll
        for (int t = 0; t < RT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v = 0.0f;
                for (int k = 0; k < ks; k++)
                    v += red[k][t][i][lane];
                y[t][i] = v;
            }
    }
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r0 + 16 * t + g + 8 * (i / 2), tok = 2 * c + i % 2;
            if (r < w.out && tok < n_tok) {
                float bv = jb.bias ? cu_ld(jb.bias, jb.bdt, (size_t)r) : 0.0f;
                jb.y[(size_t)tok * jb.ldy + r] = y[t][i] + bv;
            }
        }
}

bool cu_mmv_ok(const cu_wmat &m)
{
    return m.qmode == QMODE_AFFINE && (m.qbits == 4 || m.qbits == 8) &&
           (m.qgroup == 32 || m.qgroup == 64 || m.qgroup == 128) && m.in % m.qgroup == 0 &&
           (uintptr_t)m.data % 16 == 0 && m.row_bytes % 16 == 0 &&
           (m.qsdt == DTYPE_F32 || m.qsdt == DTYPE_F16 || m.qsdt == DTYPE_BF16);
}

template <int BITS, int SDT, int GROUP, int RT>
static void mmv_launch(struct cuda_backend *c, ga_jobs &js, int n_tok)
{
    int nb = 0, min_ng = js.j[0].w.in / GROUP;
    for (int i = 0; i < js.n; i++) {
        js.j[i].b0 = nb;
        nb += (js.j[i].w.out + 16 * RT - 1) / (16 * RT);
        min_ng = min(min_ng, js.j[i].w.in / GROUP);
    }
    /* warps per block: enough for MMV_WARPS_PER_SM a multiprocessor, each with >= 2 rounds of
     * mmv_u groups */
    const int sms = c->n_sm > 0 ? c->n_sm : 132;
    int ks = (MMV_WARPS_PER_SM * sms + nb - 1) / nb;
    ks = max(1, min(ks, min(MMV_MAX_WARPS, min_ng / (2 * mmv_u(BITS, GROUP)))));
    cu_launch(c, mmv_kernel<BITS, SDT, GROUP, RT>, dim3(nb), dim3(32 * ks), js, n_tok);
}

template <int BITS, int SDT>
static void mmv_group(struct cuda_backend *c, ga_jobs &js, int n_tok)
{
    int rows = 0;
    for (int i = 0; i < js.n; i++)
        rows += js.j[i].w.out;
    const int group = js.j[0].w.qgroup;
    /* 4 tiles a warp (x split once for 64 rows) where that still gives every multiprocessor
     * a block, else 2 */
    const bool wide = rows >= 64 * 2 * (c->n_sm > 0 ? c->n_sm : 132);
    if (group == 32)
        wide ? mmv_launch<BITS, SDT, 32, 4>(c, js, n_tok) : mmv_launch<BITS, SDT, 32, 2>(c, js, n_tok);
    else if (group == 64)
        wide ? mmv_launch<BITS, SDT, 64, 4>(c, js, n_tok) : mmv_launch<BITS, SDT, 64, 2>(c, js, n_tok);
    else
        wide ? mmv_launch<BITS, SDT, 128, 4>(c, js, n_tok) : mmv_launch<BITS, SDT, 128, 2>(c, js, n_tok);
}

void cu_mmv(struct cuda_backend *c, ga_jobs &js, int n_tok)
{
    const cu_wmat &m = js.j[0].w;
    if (m.qbits == 4 && m.qsdt == DTYPE_BF16)
        mmv_group<4, DTYPE_BF16>(c, js, n_tok);
    else if (m.qbits == 4 && m.qsdt == DTYPE_F16)
        mmv_group<4, DTYPE_F16>(c, js, n_tok);
    else if (m.qbits == 4)
        mmv_group<4, DTYPE_F32>(c, js, n_tok);
    else if (m.qsdt == DTYPE_BF16)
        mmv_group<8, DTYPE_BF16>(c, js, n_tok);
    else if (m.qsdt == DTYPE_F16)
        mmv_group<8, DTYPE_F16>(c, js, n_tok);
    else
        mmv_group<8, DTYPE_F32>(c, js, n_tok);
    cu_check(c, "mmv");
}
