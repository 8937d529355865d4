/*
 * linear: y[n_tok, out] = x[n_tok, in] Wᵀ (+ b) for every weight format
 * (F32/F16/BF16, MLX affine 2..8 bits, mxfp4, mxfp8, nvfp4), and the
 * embedding lookup, on the GPU.
 *
 * Decode (n_tok <= GEMV_TOK), MLX affine 4/8 bits and bf16 / f16 rows (ADR 0142):
 * gemv_affine_kernel (several rows per warp, 16-byte code loads in flight, split K
 * for few long rows, up to GA_MAX_JOBS products of one format per launch: q | k | v,
 * gate | up).
 *
 * Decode, every other format: fused dequant-GEMV. One warp per output row,
 * 8 warps per block; lane l takes the row's 32-element chunks l, l + 32, ...
 * (a chunk lies in one or two scale groups: groups are >= 16), decodes the
 * chunk to f32 in registers and accumulates it against every token's x, so
 * the weight row is read once for all tokens. Elements past the last whole
 * chunk go one per lane. A warp reduction finishes each dot product.
 *
 * Batched decode and short prefill chunks (GEMV_TOK < n_tok <= 128,
 * backend_opts.cuda_mma_max_tokens), MLX affine 4/8 bits (the
 * ga_ok conditions): mma.cu's tensor-core product straight from the codes
 * (ADR 0074): x split into bf16 hi + lo once, the codes exact in bf16, one
 * group's Σ q x in f32 registers, then s Σ q x + b Σ x per group; each weight
 * byte read once per 32 or 64 tokens. MLXCEL_CUDA_MMA=0 (backend_opts.cuda_mma)
 * sends them down the path below instead.
 *
 * Prefill, every other format and longer affine products: tensor cores (ADR 0054). x and the weight rows
 * are split into two bf16 parts each (hi + lo, 16 significant bits), the rows
 * decoded panel by panel (up to PANEL_FLOATS f32's worth of scratch) into the
 * two planes, and three bf16 cuBLAS products accumulate in f32; bf16 weights
 * take two, read in place. The bias is added after.
 *
 * Values follow the CPU reference (kern_ref.c): affine w = s * q + b, fp
 * modes w = value(q) * scale, codes a little-endian bit stream per row.
 */
#include <cuda_bf16.h>

#include "affine_frag.cuh"

#define GEMV_TOK 8
#define GEMV_WARPS 8
#define GA_WARPS 4      /* warps per block of the affine 4/8-bit GEMV */
#define PANEL_FLOATS ((size_t)32 << 20)

// ---- decoding ----

/* e2m1 code c (sign, 2 exponent bits, 1 mantissa bit) without a table: 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6. */
__device__ __forceinline__ float e2m1(unsigned c)
{
    unsigned e = (c >> 1) & 3u, m = c & 1u;
    float mag = e ? __uint_as_float((e + 126u) << 23 | m << 22) : 0.5f * (float)m;
    return c & 8u ? -mag : mag;
}

__device__ __forceinline__ float e4m3(unsigned b)
{
    return __uint_as_float((b & 0x80u) << 24 | (b & 0x7fu) << 20) * 0x1p120f;
}

__device__ __forceinline__ float e8m0(unsigned b)
{
    return __uint_as_float(b == 0 ? 0x00400000u : b == 255 ? 0x7f800000u : b << 23);
}

/* Scale and bias of group g of row r. */
__device__ __forceinline__ void qgroup_sb(const cu_wmat &w, int r, int g, float *s, float *b)
{
    const uint8_t *sr = w.qs + (size_t)r * w.qrow_bytes;
    if (w.qmode == QMODE_AFFINE) {
        *s = cu_ld(sr, w.qsdt, (size_t)g);
        *b = cu_ld(w.qb + (size_t)r * w.qrow_bytes, w.qsdt, (size_t)g);
    } else {
        *s = w.qmode == QMODE_NVFP4 ? e4m3(sr[g]) : e8m0(sr[g]);
        *b = 0.0f;
    }
}

__device__ __forceinline__ float qvalue(const cu_wmat &w, unsigned q, float s, float b)
{
    if (w.qmode == QMODE_AFFINE)
        return s * (float)q + b;
    return (w.qmode == QMODE_MXFP8 ? e4m3(q) : e2m1(q)) * s;
}

/* W[r, k], any format (tails, embeddings). */
__device__ float w_elem(const cu_wmat &w, int r, int k)
{
    const uint8_t *row = w.data + (size_t)r * w.row_bytes;
    if (!w.qbits)
        return cu_ld(row, w.dt, (size_t)k);
    size_t o = (size_t)k * w.qbits;
    unsigned v = row[o >> 3];
    if ((o & 7) + w.qbits > 8)
        v |= (unsigned)row[(o >> 3) + 1] << 8;
    unsigned q = (v >> (o & 7)) & ((1u << w.qbits) - 1);
    float s, b;
    qgroup_sb(w, r, k / w.qgroup, &s, &b);
    return qvalue(w, q, s, b);
}

/* Code j of the 32-element chunk held in u. */
template <int BITS>
__device__ __forceinline__ unsigned chunk_code(const uint32_t *u, int j)
{
    const int o = j * BITS, wi = o >> 5, sh = o & 31;
    uint32_t x = u[wi] >> sh;
    if (sh + BITS > 32)
        x |= u[wi + 1] << (32 - sh);
    return x & ((1u << BITS) - 1);
}

/* Chunk c (elements 32c .. 32c + 31) of quantized row r: BITS words. The mode branch
 * stays outside the unrolled loops (fp modes exist for 4 and 8 bits only). */
template <int BITS>
__device__ __forceinline__ void decode_q(const cu_wmat &w, int r, int c, float *v)
{
    const uint32_t *wd = (const uint32_t *)(w.data + (size_t)r * w.row_bytes) + (size_t)c * BITS;
    uint32_t u[BITS];
#pragma unroll
    for (int i = 0; i < BITS; i++)
        u[i] = __ldg(wd + i);
    float s0, b0, s1, b1;
    qgroup_sb(w, r, (c * 32) / w.qgroup, &s0, &b0);
    qgroup_sb(w, r, (c * 32 + 16) / w.qgroup, &s1, &b1);
    if (BITS == 4 && w.qmode != QMODE_AFFINE) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = e2m1(chunk_code<BITS>(u, j)) * (j < 16 ? s0 : s1);
    } else if (BITS == 8 && w.qmode != QMODE_AFFINE) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = e4m3(chunk_code<BITS>(u, j)) * (j < 16 ? s0 : s1);
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = (j < 16 ? s0 : s1) * (float)chunk_code<BITS>(u, j) + (j < 16 ? b0 : b1);
    }
}

/* Formats as template arguments (one small kernel each, quick to compile): float dtypes,
 * or FMT_Q + bits. */
#define FMT_Q 16

/* Chunk c of row r widened or dequantized to f32. */
template <int F>
__device__ __forceinline__ void decode_chunk(const cu_wmat &w, int r, int c, float *v)
{
    if constexpr (F >= FMT_Q) {
        decode_q<F - FMT_Q>(w, r, c, v);
    } else if constexpr (F == DTYPE_F32) {
        const float4 *p = (const float4 *)(w.data + (size_t)r * w.row_bytes) + c * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 f = __ldg(p + i);
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
    } else {
        const uint4 *p = (const uint4 *)(w.data + (size_t)r * w.row_bytes) + c * 4;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 q = __ldg(p + i);
            uint32_t a[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint16_t lo = (uint16_t)(a[j] & 0xffffu), hi = (uint16_t)(a[j] >> 16);
                v[8 * i + 2 * j] = F == DTYPE_BF16 ? cu_bf16(lo) : cu_f16(lo);
                v[8 * i + 2 * j + 1] = F == DTYPE_BF16 ? cu_bf16(hi) : cu_f16(hi);
            }
        }
    }
}

/* Whole 32-element chunks per row decode_chunk may read: the rows must be 16-byte aligned
 * for the vector loads of float weights, else every element goes through w_elem. */
static int whole_chunks(const cu_wmat &w)
{
    bool vec_ok = w.qbits || ((uintptr_t)w.data % 16 == 0 && w.row_bytes % 16 == 0);
    return vec_ok ? w.in / 32 : 0;
}

// ---- kernels ----

/* grid: ceil(out / GEMV_WARPS) blocks of GEMV_WARPS warps; warp = one output row. */
template <int F>
__global__ void gemv_kernel(float *y, int ldy, const float *__restrict__ x, int ldx, cu_wmat w,
                            int n_chunks, int n_tok, const void *bias, int bdt)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int r = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= w.out)
        return;
    float acc[GEMV_TOK];
#pragma unroll
    for (int t = 0; t < GEMV_TOK; t++)
        acc[t] = 0.0f;
    for (int c = lane; c < n_chunks; c += 32) {
        float v[32];
        decode_chunk<F>(w, r, c, v);
#pragma unroll
        for (int t = 0; t < GEMV_TOK; t++) {
            if (t < n_tok) {
                const float4 *xp = (const float4 *)(x + (size_t)t * ldx + (size_t)c * 32);
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 f = xp[i];
                    a += f.x * v[4 * i] + f.y * v[4 * i + 1] + f.z * v[4 * i + 2] + f.w * v[4 * i + 3];
                }
                acc[t] += a;
            }
        }
    }
    for (int k = n_chunks * 32 + lane; k < w.in; k += 32) {
        float wv = w_elem(w, r, k);
#pragma unroll
        for (int t = 0; t < GEMV_TOK; t++)
            if (t < n_tok)
                acc[t] += x[(size_t)t * ldx + k] * wv;
    }
    float bv = bias ? cu_ld(bias, bdt, (size_t)r) : 0.0f;
#pragma unroll
    for (int t = 0; t < GEMV_TOK; t++) {
        if (t < n_tok) {
            float s = cu_warp_sum(acc[t]);
            if (lane == 0)
                y[(size_t)t * ldy + r] = s + bv;
        }
    }
}

// ---- affine 4/8-bit decode ----

/* Byte K (a code < 256) of b as a float, exactly: the bit pattern of 2^23 + code, minus 2^23
 * (a byte permute and an add, where an int-to-float conversion runs at a quarter rate). */
template <int K>
__device__ __forceinline__ float code_f(uint32_t b)
{
    return __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7540u | K)) - 8388608.0f;
}

/* Byte K of b, a 4-bit code q in its bits 3..6, as the float 0.5 + q / 32: the byte becomes
 * the top mantissa bits under the exponent of 0.5 (one byte permute, no add). */
template <int K>
__device__ __forceinline__ float half_code(uint32_t b)
{
    return __uint_as_float(__byte_perm(b, 0x3F000000u, 0x7054u | (K << 8)));
}

/* One 16-byte piece of codes against x (PB floats). 8 bits: Σ q x over its 16 codes. 4 bits:
 * F = Σ (0.5 + q / 32) x over its 32 nibbles (element 2k of a word in byte k's low nibble,
 * 2k + 1 in its high one), so that Σ q x = 32 F - 16 Σ x: one permute and one FMA per code.
 * The 0.5 costs about two bits of the f32 sum (the products stay exact), far inside the
 * tolerance of test_cuda and the goldens. */
template <int BITS, int WDT = DTYPE_BF16>
__device__ __forceinline__ float piece_dot(uint4 q, const float *x)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (BITS == 16) {
            /* 16-bit float weights: elements 2i (low half) and 2i + 1 of the piece */
            if constexpr (WDT == DTYPE_BF16) {
                d0 = fmaf(__uint_as_float(u[i] << 16), x[2 * i], d0);
                d1 = fmaf(__uint_as_float(u[i] & 0xffff0000u), x[2 * i + 1], d1);
            } else {
                const float2 f = __half22float2(*(const __half2 *)&u[i]);
                d0 = fmaf(f.x, x[2 * i], d0);
                d1 = fmaf(f.y, x[2 * i + 1], d1);
            }
        } else if constexpr (BITS == 4) {
            uint32_t lo = (u[i] << 3) & 0x78787878u, hi = (u[i] >> 1) & 0x78787878u;
            d0 = fmaf(half_code<0>(lo), x[8 * i], d0);
            d1 = fmaf(half_code<0>(hi), x[8 * i + 1], d1);
            d0 = fmaf(half_code<1>(lo), x[8 * i + 2], d0);
            d1 = fmaf(half_code<1>(hi), x[8 * i + 3], d1);
            d0 = fmaf(half_code<2>(lo), x[8 * i + 4], d0);
            d1 = fmaf(half_code<2>(hi), x[8 * i + 5], d1);
            d0 = fmaf(half_code<3>(lo), x[8 * i + 6], d0);
            d1 = fmaf(half_code<3>(hi), x[8 * i + 7], d1);
        } else {
            d0 += code_f<0>(u[i]) * x[4 * i] + code_f<1>(u[i]) * x[4 * i + 1];
            d1 += code_f<2>(u[i]) * x[4 * i + 2] + code_f<3>(u[i]) * x[4 * i + 3];
        }
    }
    return d0 + d1;
}

/* Codes, scales and biases of rows r0 .. r0 + R (rows past the last repeat it). */
template <int R>
__device__ __forceinline__ void ga_rows(const cu_wmat &w, int r0, const uint4 *(&wr)[R],
                                        const uint8_t *(&sr)[R], const uint8_t *(&br)[R])
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        size_t rr = (size_t)min(r0 + r, w.out - 1);
        wr[r] = (const uint4 *)(w.data + rr * w.row_bytes);
        sr[r] = w.qs + rr * w.qrow_bytes;
        br[r] = w.qb + rr * w.qrow_bytes;
    }
}

/* Weights, scales and biases of the pieces p0 + 32 KS u (u < U) of R rows (BITS 16: float
 * weights, scale 1 and bias 0). */
template <int SDT, int R, int U, int KS, int BITS = 4>
__device__ __forceinline__ void ga_load(uint4 (&q)[U][R], float (&sc)[U][R], float (&bi)[U][R],
                                        const uint4 *const (&wr)[R], const uint8_t *const (&sr)[R],
                                        const uint8_t *const (&br)[R], int p0, int n_p, int gsh)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int p = p0 + 32 * KS * u;
        bool ok = p < n_p;
#pragma unroll
        for (int r = 0; r < R; r++) {
            q[u][r] = ok ? __ldg(wr[r] + p) : make_uint4(0, 0, 0, 0);
            if constexpr (BITS == 16) {  /* float weights: no scales (SDT is their dtype) */
                sc[u][r] = 1.0f;
                bi[u][r] = 0.0f;
            } else {
                sc[u][r] = ok ? cu_ld_sb<SDT>(sr[r], p >> gsh) : 0.0f;
                bi[u][r] = ok ? cu_ld_sb<SDT>(br[r], p >> gsh) : 0.0f;
            }
        }
    }
}

/* grid: the jobs' blocks one after the other, each job ceil(out / (R * GA_WARPS / KS))
 * blocks of GA_WARPS warps. KS = 1: warp = R rows; lane l takes the rows' 16-byte pieces
 * l, l + 32, ... (PB elements each, inside one scale group: groups are >= 32 elements).
 * KS = GA_WARPS (split K, for few rows of many pieces): the block's warps share R rows,
 * warp w taking the pieces 32 w + l, 32 (w + KS) + l, ..., and add their sums through shared
 * memory. U pieces of every row at a time, all R * U loads issued before the first is used.
 * A piece adds s * Σ q x + b * Σ x per token, Σ x and the x loads shared by the warp's R
 * rows. Measured versions (R, U, register caps, software pipelining, the two code
 * decodings): dev/kernels/gemv_affine_lab.cu. */
template <int BITS, int SDT, int NT, int R, int U, int KS>
__global__ void __launch_bounds__(32 * GA_WARPS)
gemv_affine_kernel(ga_jobs js, int n_tok)
{
    constexpr int PB = 128 / BITS;
    __shared__ float part[KS > 1 ? KS : 1][R][NT];
    cu_pdl_trigger();
    ga_job jb = ga_pick(js, (int)blockIdx.x);
    if (js.ex.off)
        ga_expert_pick(js.ex, jb);
    const cu_wmat &w = jb.w;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int r0 = KS > 1 ? (blockIdx.x - jb.b0) * R : ((blockIdx.x - jb.b0) * GA_WARPS + wid) * R;
    if (r0 >= w.out) {
        cu_pdl_wait();
        return;
    }
    const int n_p = w.in / PB;
    const uint4 *wr[R];
    const uint8_t *sr[R], *br[R];
    ga_rows<R>(w, r0, wr, sr, br);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    /* the first pieces' weights are fetched into L2 before the wait for x, while the kernel
     * before this one finishes */
#pragma unroll
    for (int u = 0; u < U; u++) {
        int p = lane + (KS > 1 ? 32 * wid : 0) + 32 * KS * u;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (p < n_p)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + p));
    }
    cu_pdl_wait();
    for (int p0 = lane + (KS > 1 ? 32 * wid : 0); p0 < n_p; p0 += 32 * KS * U) {
        uint4 q[U][R];
        float sc[U][R], bi[U][R];
        ga_load<SDT, R, U, KS, BITS>(q, sc, bi, wr, sr, br, p0, n_p, jb.gsh);
        if (BITS == 4)  /* s Σ q x + b Σ x = 32 s F + (b - 16 s) Σ x */
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    bi[u][r] -= 16.0f * sc[u][r];
                    sc[u][r] *= 32.0f;
                }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + 32 * KS * u;
            if (p >= n_p)
                break;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (NT > 1 && t >= n_tok)
                    break;
                const float4 *xp = (const float4 *)(jb.x + (size_t)t * w.in + (size_t)p * PB);
                float xv[PB], xs = 0.0f;
#pragma unroll
                for (int i = 0; i < PB / 4; i++) {
                    float4 f = __ldg(xp + i);
                    xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
                    xs += (f.x + f.y) + (f.z + f.w);
                }
#pragma unroll
                for (int r = 0; r < R; r++)
                    if constexpr (BITS == 16)
                        acc[r][t] += piece_dot<16, SDT>(q[u][r], xv);
                    else
                        acc[r][t] += sc[u][r] * piece_dot<BITS>(q[u][r], xv) + bi[u][r] * xs;
            }
        }
    }
    if (KS > 1) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[r][t] = cu_warp_sum(acc[r][t]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    part[wid][r][t] = acc[r][t];
        __syncthreads();
        if (wid != 0)
            return;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < KS; k++)
                    v += part[k][r][t];
                acc[r][t] = v;
            }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float bv = jb.bias && r0 + r < w.out ? cu_ld(jb.bias, jb.bdt, (size_t)(r0 + r)) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (NT > 1 && t >= n_tok)
                break;
            float v = KS > 1 ? acc[r][t] : cu_warp_sum(acc[r][t]);
            if (lane == 0 && r0 + r < w.out)
                jb.y[(size_t)t * jb.ldy + r0 + r] = v + bv;
        }
    }
}

// ---- the integer GEMV: one token, affine 4-bit ----

/* One token against affine 4-bit rows of at most QI_MAX_IN elements, the rule of the CPU's
 * integer matvec (ADR 0025) on dp4a: qi_prep_kernel first rounds x per 32-element piece to
 * 16-bit integers q16 = rint(x / xs), xs = max|x| / 32639, split into two signed 8-bit limbs
 * (q16 = 256 hi + lo, lo in [-128, 127]), into a slot of the backend's qi_x, once per distinct
 * x of a launch (before ADR 0026's addendum every block prepared all of x into shared memory),
 * with the piece's Σ x kept in f32 for the bias term. A weight word's eight nibbles (two masks)
 * then meet the limbs in four dp4a: Σ q q16 over a piece is exact in int32 and in the float it
 * becomes (|.| < 32 * 15 * 32767 < 2^24), and the piece adds s xs Σ q q16 + b Σ x. Against the
 * f32 GEMV: about 7 instructions per 8 codes instead of 18, and |error| <= Σ |s q| xs / 2 per
 * output (xs / 2 = max|x| / 65278 of the piece's largest element). A piece whose max is below
 * 2^-100 counts as zero; NaN and Inf in x reach the output as NaN. The weights' first loads are
 * issued before the wait for x. */
#define QI_MAX_IN 16384
#define QI_WARPS 8
#define QI_Q16_MAX 32639    /* (32639 + 128) >> 8 = 127: the high limb stays a signed byte */

/* A slot of prepared x for rows of up to QI_MAX_IN elements: the limbs (16 bytes per 8
 * elements, the words j of every piece together so that lanes read consecutive pieces
 * coalesced), then each piece's xs and Σ x; GA_MAX_JOBS slots, a launch's distinct x. */
#define QI_SLOT ((size_t)QI_MAX_IN * 2 + (size_t)QI_MAX_IN / 32 * 2 * sizeof(float))

size_t cu_qi_x_bytes(void)
{
    return GA_MAX_JOBS * QI_SLOT;
}

/* x (in elements, in % 32 == 0) into slot xq: the limbs xq[j n_p + p] of each piece p (n_p =
 * in / 32), then its xs and Σ x (n_p floats each); a thread per 8 elements, 256 a block. */
__global__ void __launch_bounds__(256) qi_prep_kernel(const float *x, int in, int4 *xq)
{
    cu_pdl_trigger();
    cu_pdl_wait(); /* x is an earlier kernel's, and the slot may be what the GEMV before read */
    const int n_w = in / 8, n_p = in / 32;
    float *pxs = (float *)(xq + 4 * (size_t)n_p), *psx = pxs + n_p;
    const float4 *x4 = (const float4 *)x;
    /* a piece's 4 words are 4 neighbouring threads of one warp: n_w is a multiple of 4 */
    const int k = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const bool ok = k < n_w;
    float4 a = ok ? __ldg(x4 + 2 * k) : make_float4(0, 0, 0, 0);
    float4 b = ok ? __ldg(x4 + 2 * k + 1) : make_float4(0, 0, 0, 0);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    float m = 0.0f, s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        m = fmaxf(m, fabsf(v[i]));
        s += v[i];
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    /* Inf: xs = Inf and limbs 0, so the piece adds Inf * 0 = NaN; NaN: Σ x is NaN */
    float xs = m < 0x1p-100f ? 0.0f : m * (1.0f / QI_Q16_MAX);
    float inv = xs > 0.0f ? (float)QI_Q16_MAX / m : 0.0f;
    uint32_t limb[4] = {0, 0, 0, 0};    /* hi of elements 0,2,4,6; hi of 1,3,5,7; lo; lo */
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int q = min(max(__float2int_rn(v[i] * inv), -QI_Q16_MAX), QI_Q16_MAX);
        int hi = (q + 128) >> 8, lo = q - hi * 256;
        limb[i & 1] |= (uint32_t)(hi & 0xff) << (8 * (i >> 1));
        limb[2 + (i & 1)] |= (uint32_t)(lo & 0xff) << (8 * (i >> 1));
    }
    if (ok) {
        int p = k >> 2, j = k & 3;
        xq[(size_t)j * n_p + p] = make_int4((int)limb[0], (int)limb[1], (int)limb[2], (int)limb[3]);
        if (j == 0) {
            pxs[p] = xs;
            psx[p] = s;
        }
    }
}

/* Σ q q16 over one piece: word j's nibbles (elements 8j + 2i in byte i's low nibble, 8j + 2i + 1
 * in its high one) against limb word j of the piece. */
__device__ __forceinline__ int qi_piece(uint4 q, int4 x0, int4 x1, int4 x2, int4 x3)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    const int4 xv[4] = {x0, x1, x2, x3};
    int h = 0, l = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int lo = (int)(u[j] & 0x0f0f0f0fu), hi = (int)((u[j] >> 4) & 0x0f0f0f0fu);
        h = __dp4a(lo, xv[j].x, h);
        h = __dp4a(hi, xv[j].y, h);
        l = __dp4a(lo, xv[j].z, l);
        l = __dp4a(hi, xv[j].w, l);
    }
    return h * 256 + l;
}

/* grid: the jobs' blocks one after the other (ga_jobs), blocks of QI_WARPS warps. KS = 1: warp
 * = R rows, lane l takes the pieces l, l + 32, ...; KS = QI_WARPS: the block's warps share R
 * rows, warp w taking the pieces 32 w + l, 32 (w + KS) + l, ..., summed through shared memory.
 * U pieces of every row are loaded at a time; x comes prepared (jb.xq, read through L1). */
template <int SDT, int R, int U, int KS>
__global__ void __launch_bounds__(32 * QI_WARPS)
gemv_qi_kernel(ga_jobs js)
{
    __shared__ float part[KS > 1 ? KS : 1][R];
    cu_pdl_trigger();
    const ga_job jb = ga_pick(js, (int)blockIdx.x);
    const cu_wmat &w = jb.w;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int r0 = KS > 1 ? (blockIdx.x - jb.b0) * R : ((blockIdx.x - jb.b0) * QI_WARPS + wid) * R;
    const bool live = r0 < w.out;   /* a warp past the last row still meets the barrier */
    const int n_p = w.in / 32, step = 32 * KS * U, pbase = lane + (KS > 1 ? 32 * wid : 0);
    const int4 *xq = jb.xq;
    const float *pxs = (const float *)(xq + 4 * (size_t)n_p), *psx = pxs + n_p;
    const uint4 *wr[R];
    const uint8_t *sr[R], *br[R];
    ga_rows<R>(w, r0, wr, sr, br);
    uint4 q[U][R];
    float sc[U][R], bi[U][R];
    if (live)
        ga_load<SDT, R, U, KS>(q, sc, bi, wr, sr, br, pbase, n_p, jb.gsh);
    cu_pdl_wait();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int p0 = pbase; live && p0 < n_p; p0 += step) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + 32 * KS * u;
            if (p >= n_p)
                break;
            int4 x0 = __ldg(xq + p), x1 = __ldg(xq + n_p + p), x2 = __ldg(xq + 2 * n_p + p),
                 x3 = __ldg(xq + 3 * n_p + p);
            float xs = __ldg(pxs + p), sx = __ldg(psx + p);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += sc[u][r] * (xs * (float)qi_piece(q[u][r], x0, x1, x2, x3)) + bi[u][r] * sx;
        }
        if (p0 + step < n_p)
            ga_load<SDT, R, U, KS>(q, sc, bi, wr, sr, br, p0 + step, n_p, jb.gsh);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = cu_warp_sum(acc[r]);
    if (KS > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
                part[wid][r] = acc[r];
        __syncthreads();
        if (wid != 0)
            return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; k++)
                v += part[k][r];
            acc[r] = v;
        }
    }
    if (lane != 0 || !live)
        return;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (r0 + r < w.out)
            jb.y[r0 + r] = acc[r] + (jb.bias ? cu_ld(jb.bias, jb.bdt, (size_t)(r0 + r)) : 0.0f);
}

/* v as hi + lo, two bf16 (8 significant bits each): hi = v rounded to nearest even, lo = the
 * rest rounded; hi + lo keeps 16 significant bits of v, and bf16 keeps f32's range. */
__device__ __forceinline__ void split_bf16(float v, __nv_bfloat16 *hi, __nv_bfloat16 *lo)
{
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    *hi = h;
    *lo = __float2bfloat16_rn(v - __bfloat162float(h));
}

/* hi/lo [rows, in] = W[r0 .. r0 + rows) split into two bf16 planes; grid-stride over (row, chunk-or-tail-element), a warp's 32
 * items at a time. A lane decodes its chunk of 32 into registers, then the warp writes the 32
 * chunks one after another through shared memory, each as one coalesced store (a lane writing
 * its own chunk would touch 32 lines per store instruction). blockDim 256. */
template <int F>
__global__ void dequant_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, cu_wmat w, int r0, int rows,
                               int n_chunks)
{
    __shared__ float st[8][32][33];
    int tail = w.in - n_chunks * 32, per_row = n_chunks + tail;
    int lane = threadIdx.x % 32, wp = threadIdx.x / 32;
    size_t n = (size_t)rows * per_row;
    for (size_t i0 = blockIdx.x * (size_t)blockDim.x + 32 * (size_t)wp; i0 < n;
         i0 += (size_t)gridDim.x * blockDim.x) {
        size_t i = i0 + lane;
        long long d = -1; /* element offset of this lane's chunk in the planes */
        if (i < n) {
            int rr = (int)(i / per_row), c = (int)(i % per_row);
            size_t row = (size_t)rr * w.in;
            if (c < n_chunks) {
                float v[32];
                decode_chunk<F>(w, r0 + rr, c, v);
#pragma unroll
                for (int j = 0; j < 32; j++)
                    st[wp][lane][j] = v[j];
                d = (long long)(row + (size_t)c * 32);
            } else {
                int k = n_chunks * 32 + (c - n_chunks);
                split_bf16(w_elem(w, r0 + rr, k), &hi[row + k], &lo[row + k]);
            }
        }
        __syncwarp();
        for (int k = 0; k < 32; k++) {
            long long dk = __shfl_sync(0xffffffffu, d, k);
            if (dk >= 0)
                split_bf16(st[wp][k][lane], &hi[dk + lane], &lo[dk + lane]);
        }
        __syncwarp();
    }
}

/* x [n, in] (f32, leading dimension ldx) split into hi/lo [n, in] bf16 planes. */
__global__ void split_x_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const float *x, int ldx,
                               int in, int n)
{
    size_t m = (size_t)n * in;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x)
        split_bf16(x[i / in * ldx + i % in], &hi[i], &lo[i]);
}

/* y[t, r] += b[r] over n_tok rows of out. */
__global__ void bias_kernel(float *y, int ldy, const void *b, int bdt, int out, int n_tok)
{
    size_t n = (size_t)out * n_tok;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i / out * ldy + i % out] += cu_ld(b, bdt, i % out);
}

/* y[t, :] = row ids[t] of w; grid: n_tok blocks. */
__global__ void embed_kernel(float *y, cu_wmat w, const int32_t *ids)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int t = blockIdx.x, r = ids[t];
    for (int k = threadIdx.x; k < w.in; k += blockDim.x)
        y[(size_t)t * w.in + k] = w_elem(w, r, k);
}

// ---- launchers ----

/* Run L<F> for w's format: L is a macro body taking the format as FMT. */
#define FMT_DISPATCH(w, L) \
    do { \
        switch ((w).qbits ? FMT_Q + (w).qbits : (w).dt) { \
        case DTYPE_F32: { constexpr int FMT = DTYPE_F32; L; } break; \
        case DTYPE_F16: { constexpr int FMT = DTYPE_F16; L; } break; \
        case DTYPE_BF16: { constexpr int FMT = DTYPE_BF16; L; } break; \
        case FMT_Q + 2: { constexpr int FMT = FMT_Q + 2; L; } break; \
        case FMT_Q + 3: { constexpr int FMT = FMT_Q + 3; L; } break; \
        case FMT_Q + 4: { constexpr int FMT = FMT_Q + 4; L; } break; \
        case FMT_Q + 5: { constexpr int FMT = FMT_Q + 5; L; } break; \
        case FMT_Q + 6: { constexpr int FMT = FMT_Q + 6; L; } break; \
        default: { constexpr int FMT = FMT_Q + 8; L; } break; \
        } \
    } while (0)

/* C[rows, n_tok] (+)= A[rows, in] B[n_tok, in]ᵀ on tensor cores: bf16 in, f32 accumulate. */
static bool gemm_bf16(struct cuda_backend *c, float *y, int ldy, const __nv_bfloat16 *a, int lda,
                      const __nv_bfloat16 *b, int rows, int n_tok, int in, bool accumulate)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, in, &one, a,
                                    CUDA_R_16BF, lda, b, CUDA_R_16BF, in, accumulate ? &one : &zero,
                                    y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cu_fail(c, "cublasGemmEx", cudaErrorUnknown);
        return false;
    }
    return true;
}

/* Prefill products on tensor cores with f32-level accuracy. Affine 4/8-bit weights: mma.cu
 * (ADR 0074) up to cuda_mma_max_tokens rows, past them mmq.cu when cuda_mmq is on (ADR 0147).
 * Others (ADR 0054): W and x each split into
 * two bf16 parts, y = Wh xh + Wh xl + Wl xh (Wl xl, about 2^-16 of the product, is left out).
 * bf16 products are exact in the f32 accumulator, so the error is that of 16-bit operands: the
 * golden error stays at the f32 path's (measured in docs/benchmarks.md). bf16 weights are their
 * own hi part (lo = 0) and go to cuBLAS as they lie, two products; every other format is
 * decoded panel by panel into the two planes. */
static void gemm(struct cuda_backend *c, float *y, int ldy, const float *x, const cu_wmat &w,
                 int n_tok)
{
    if (c->mma && n_tok <= c->mma_max_tok && cu_mma_ok(&w)) {
        cu_mma_affine(c, y, ldy, x, w.in, &w, n_tok);
        return;
    }
    if (c->mmq && cu_mmq_ok(&w)) {
        cu_mmq_affine(c, y, ldy, x, w.in, &w, n_tok);
        return;
    }
    bool direct = !w.qbits && w.dt == DTYPE_BF16 && w.row_bytes % 2 == 0;
    int panel = direct ? 0 : (int)(PANEL_FLOATS / (size_t)w.in);
    panel = direct ? 0 : panel < 1 ? 1 : panel > w.out ? w.out : panel;
    /* scratch: the weight panel's two planes, then x's */
    float *scr = cu_scratch(c, (size_t)panel * w.in + (size_t)n_tok * w.in);
    if (!scr)
        return;
    __nv_bfloat16 *wh = (__nv_bfloat16 *)scr, *wl = wh + (size_t)panel * w.in;
    __nv_bfloat16 *xh = wl + (size_t)panel * w.in, *xl = xh + (size_t)n_tok * w.in;
    split_x_kernel<<<cu_grid256((size_t)n_tok * w.in), 256, 0, c->st>>>(xh, xl, x, w.in, w.in, n_tok);
    if (!cu_check(c, "split x"))
        return;
    if (direct) {
        const __nv_bfloat16 *a = (const __nv_bfloat16 *)w.data;
        int lda = (int)(w.row_bytes / 2);
        if (gemm_bf16(c, y, ldy, a, lda, xh, w.out, n_tok, w.in, false))
            gemm_bf16(c, y, ldy, a, lda, xl, w.out, n_tok, w.in, true);
        return;
    }
    int n_chunks = whole_chunks(w);
    for (int r0 = 0; r0 < w.out; r0 += panel) {
        int rows = w.out - r0 < panel ? w.out - r0 : panel;
        size_t items = (size_t)rows * (n_chunks + (w.in - n_chunks * 32));
        FMT_DISPATCH(w, (dequant_kernel<FMT><<<cu_grid256(items), 256, 0, c->st>>>(wh, wl, w, r0, rows,
                                                                                  n_chunks)));
        if (!cu_check(c, "dequantize") ||
            !gemm_bf16(c, y + r0, ldy, wh, w.in, xh, rows, n_tok, w.in, false) ||
            !gemm_bf16(c, y + r0, ldy, wh, w.in, xl, rows, n_tok, w.in, true) ||
            !gemm_bf16(c, y + r0, ldy, wl, w.in, xh, rows, n_tok, w.in, true))
            return;
    }
}

/* Whether the affine GEMV takes w and x: 16-byte aligned rows and x; affine 4/8 bits in
 * power-of-two groups of >= 32 elements with f32/f16/bf16 scales, or bf16 / f16 rows of a
 * multiple of 8 elements (BITS 16, ADR 0142); else gemv_kernel. */
static bool ga_ok(const cu_wmat &m, const float *x)
{
    if (!m.qbits && (m.dt == DTYPE_BF16 || m.dt == DTYPE_F16))  /* 16-bit floats: BITS 16 */
        return m.in % 8 == 0 && (uintptr_t)m.data % 16 == 0 && m.row_bytes % 16 == 0 &&
               (uintptr_t)x % 16 == 0;
    return m.qmode == QMODE_AFFINE && (m.qbits == 4 || m.qbits == 8) && m.qgroup >= 32 &&
           !(m.qgroup & (m.qgroup - 1)) && m.in % m.qgroup == 0 && (uintptr_t)m.data % 16 == 0 &&
           m.row_bytes % 16 == 0 && (uintptr_t)x % 16 == 0 &&
           (m.qsdt == DTYPE_F32 || m.qsdt == DTYPE_F16 || m.qsdt == DTYPE_BF16);
}

/* Rows of the products from which one token's GEMV gives each warp 8 rows of one piece each
 * instead of 4 rows of two (more loads in flight per block: 49 % against 33 % of the copy
 * bandwidth on 128256 x 2048, fewer warps on small products: measured in the lab). */
#define GA_WIDE_ROWS 16384

/* Pieces per lane and row from which one token's GEMV of fewer than GA_WIDE_ROWS rows splits
 * K over the block's warps (2048 x 8192 4-bit: 128 warps of 8 pieces a lane would leave most
 * of the GPU idle). */
#define GA_SPLIT_PIECES 8

/* Each job's first block (b0) for blocks of rows rows; the blocks in all. */
static int ga_blocks(ga_jobs &js, int rows)
{
    int nb = 0;
    for (int i = 0; i < js.n; i++) {
        js.j[i].b0 = nb;
        nb += (js.j[i].w.out + rows - 1) / rows;
    }
    return nb;
}

template <int BITS, int SDT, int NT, int R, int U, int KS>
static void ga_launch(struct cuda_backend *c, ga_jobs &js, int n_tok)
{
    int nb = ga_blocks(js, R * GA_WARPS / KS);
    cu_launch(c, gemv_affine_kernel<BITS, SDT, NT, R, U, KS>,
              dim3(nb, js.ex.off ? js.ex.n_slot : 1), dim3(32 * GA_WARPS), js, n_tok);
}

template <int BITS, int SDT>
static void ga_launch_nt(struct cuda_backend *c, ga_jobs &js, int n_tok, int rows)
{
    /* fewer rows and pieces per warp with more tokens: their accumulators take the registers */
    int lane_pieces = js.j[0].w.in / (128 / BITS) / 32;
    for (int i = 1; i < js.n; i++)
        lane_pieces = min(lane_pieces, js.j[i].w.in / (128 / BITS) / 32);
    if (n_tok == 1 && rows >= GA_WIDE_ROWS)
        ga_launch<BITS, SDT, 1, 8, 1, 1>(c, js, n_tok);
    else if (n_tok == 1 && lane_pieces >= GA_SPLIT_PIECES)
        ga_launch<BITS, SDT, 1, 4, 2, GA_WARPS>(c, js, n_tok);
    else if (n_tok == 1)
        ga_launch<BITS, SDT, 1, 4, 2, 1>(c, js, n_tok);
    else if (n_tok == 2)
        ga_launch<BITS, SDT, 2, 2, 2, 1>(c, js, n_tok);
    else if (n_tok <= 4)
        ga_launch<BITS, SDT, 4, 2, 1, 1>(c, js, n_tok);
    else
        ga_launch<BITS, SDT, 8, 2, 1, 1>(c, js, n_tok);
}

template <int SDT, int R, int U, int KS>
static void qi_launch(struct cuda_backend *c, ga_jobs &js)
{
    int nb = ga_blocks(js, R * QI_WARPS / KS);
    cu_launch(c, gemv_qi_kernel<SDT, R, U, KS>, dim3(nb), dim3(32 * QI_WARPS), js);
}

/* The integer GEMV's shape for the jobs: split K from 8 pieces a lane (2048 x 8192: few rows
 * of many pieces), 4 pieces a lane at once from 3, else 2 (2048 x 2048), 4 rows a warp from
 * 8192 rows in all (shapes measured when each block still prepared x). */
template <int SDT>
static void qi_shape(struct cuda_backend *c, ga_jobs &js, int rows, int min_in)
{
    int lane_pieces = min_in / 32 / 32;
    if (lane_pieces >= 8)
        qi_launch<SDT, 8, 1, QI_WARPS>(c, js);
    else if (lane_pieces >= 3)
        qi_launch<SDT, 2, 4, 1>(c, js);
    else if (rows >= 8192)
        qi_launch<SDT, 4, 2, 1>(c, js);
    else
        qi_launch<SDT, 2, 2, 1>(c, js);
}

/* Each distinct x of the jobs prepared into a slot of qi_x (jobs sharing x share it). */
static void qi_prepare(struct cuda_backend *c, ga_jobs &js)
{
    int4 *slots = (int4 *)c->qi_x;
    for (int i = 0; i < js.n; i++) {
        int same = -1;
        for (int j = 0; j < i && same < 0; j++)
            if (js.j[j].x == js.j[i].x && js.j[j].w.in == js.j[i].w.in)
                same = j;
        if (same >= 0) {
            js.j[i].xq = js.j[same].xq;
            continue;
        }
        int4 *xq = slots + (size_t)i * (QI_SLOT / sizeof(int4));
        js.j[i].xq = xq;
        const int n_w = js.j[i].w.in / 8;
        cu_launch(c, qi_prep_kernel, dim3((n_w + 255) / 256), dim3(256), js.j[i].x, js.j[i].w.in, xq);
    }
}

/* One launch of the affine GEMV for the jobs (same bits and scale dtype, n_tok rows each). */
static void ga_run(struct cuda_backend *c, ga_jobs &js, int n_tok)
{
    const cu_wmat &m = js.j[0].w;
    int rows = 0, min_in = m.in, max_in = m.in;
    for (int i = 0; i < js.n; i++) {
        rows += js.j[i].w.out;
        min_in = min(min_in, js.j[i].w.in);
        max_in = max(max_in, js.j[i].w.in);
    }
    /* 2..8 rows: tensor cores read each weight once (ADR 0115); the jobs must share the group.
     * Experts (js.ex) take gemv_affine_kernel only: one row per slot. */
    bool mmv = c->mma && n_tok >= 2 && n_tok <= MMV_TOK && !js.ex.off;
    for (int i = 0; mmv && i < js.n; i++)
        mmv = cu_mmv_ok(js.j[i].w) && js.j[i].w.qgroup == m.qgroup;
    if (mmv) {
        cu_mmv(c, js, n_tok);
        return;
    }
    /* the integer GEMV from qi_min_rows rows a launch: below about 12k rows it has too few
     * blocks to hide its loads and gemv_affine_kernel wins (H100, bench_cuda_linear, GB/s of the
     * f32 GEMV / the integer one: 8192 x 2048 887 / 815, 4096 x 14336 1225 / 1113; above it
     * 14336 x 4096 1273 / 1671, the 4096-wide head 1891 / 2878; ADR 0026) */
    if (c->qi && c->qi_x && n_tok == 1 && m.qbits == 4 && max_in <= QI_MAX_IN && rows >= c->qi_min_rows &&
        !js.ex.off) {
        qi_prepare(c, js);
        if (m.qsdt == DTYPE_BF16)
            qi_shape<DTYPE_BF16>(c, js, rows, min_in);
        else if (m.qsdt == DTYPE_F16)
            qi_shape<DTYPE_F16>(c, js, rows, min_in);
        else
            qi_shape<DTYPE_F32>(c, js, rows, min_in);
        cu_check(c, "gemv");
        return;
    }
    if (!m.qbits && m.dt == DTYPE_BF16)
        ga_launch_nt<16, DTYPE_BF16>(c, js, n_tok, rows);
    else if (!m.qbits)
        ga_launch_nt<16, DTYPE_F16>(c, js, n_tok, rows);
    else if (m.qbits == 4 && m.qsdt == DTYPE_BF16)
        ga_launch_nt<4, DTYPE_BF16>(c, js, n_tok, rows);
    else if (m.qbits == 4 && m.qsdt == DTYPE_F16)
        ga_launch_nt<4, DTYPE_F16>(c, js, n_tok, rows);
    else if (m.qbits == 4)
        ga_launch_nt<4, DTYPE_F32>(c, js, n_tok, rows);
    else if (m.qsdt == DTYPE_BF16)
        ga_launch_nt<8, DTYPE_BF16>(c, js, n_tok, rows);
    else if (m.qsdt == DTYPE_F16)
        ga_launch_nt<8, DTYPE_F16>(c, js, n_tok, rows);
    else
        ga_launch_nt<8, DTYPE_F32>(c, js, n_tok, rows);
    cu_check(c, "gemv");
}

static ga_job ga_job_of(float *y, int ldy, const float *x, const cu_wmat &m,
                        const struct tensor *bias)
{
    int gsh = 0;
    while (m.qbits && (128 / m.qbits << gsh) < m.qgroup)
        gsh++;
    return ga_job{y, ldy, x, m, gsh, bias ? bias->data : NULL, bias ? (int)bias->dtype : 0, 0, NULL, NULL};
}

void cu_linear(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
               const struct tensor *b, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    cu_wmat m;
    cu_wmat_from(&m, w);
    const struct tensor *bias = b && tensor_is_present(b) ? b : NULL;
    if (n_tok <= GEMV_TOK && ga_ok(m, x)) {
        ga_jobs js = {};
        js.j[0] = ga_job_of(y, ldy, x, m, bias);
        js.n = 1;
        ga_run(c, js, n_tok);
        return;
    }
    if (n_tok <= GEMV_TOK) {
        /* x rows must allow float4 loads of whole chunks */
        int n_chunks = (uintptr_t)x % 16 == 0 && m.in % 4 == 0 ? whole_chunks(m) : 0;
        const void *bd = bias ? bias->data : NULL;
        int bdt = bias ? (int)bias->dtype : 0, nb = (m.out + GEMV_WARPS - 1) / GEMV_WARPS;
        FMT_DISPATCH(m, (cu_launch(c, gemv_kernel<FMT>, dim3(nb), dim3(32 * GEMV_WARPS), y, ldy,
                                   x, m.in, m, n_chunks, n_tok, bd, bdt)));
        cu_check(c, "gemv");
        return;
    }
    gemm(c, y, ldy, x, m, n_tok);
    if (bias && !c->err_rc) {
        bias_kernel<<<cu_grid256((size_t)m.out * n_tok), 256, 0, c->st>>>(y, ldy, bias->data,
                                                                        bias->dtype, m.out, n_tok);
        cu_check(c, "bias");
    }
}

/* Decode-sized products of one affine format (q | k | v, gate | up) go out in launches of up to
 * GA_MAX_JOBS; anything else one by one. */
void cu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs)
{
    struct cuda_backend *c = cu_of(be);
    ga_jobs js = {};
    int n_tok = 0;
    for (int j = 0; j < n_jobs; j++) {
        const struct linear_job *jb = &jobs[j];
        cu_wmat m;
        cu_wmat_from(&m, jb->w);
        const struct tensor *bias = jb->b && tensor_is_present(jb->b) ? jb->b : NULL;
        bool joins = jb->n_tok > 0 && jb->n_tok <= GEMV_TOK && ga_ok(m, jb->x) &&
                     (js.n == 0 || (n_tok == jb->n_tok && m.qbits == js.j[0].w.qbits &&
                                    m.qsdt == js.j[0].w.qsdt && m.dt == js.j[0].w.dt));
        if (js.n > 0 && (!joins || js.n == GA_MAX_JOBS)) {
            if (!c->err_rc)
                ga_run(c, js, n_tok);
            js.n = 0;
            joins = jb->n_tok > 0 && jb->n_tok <= GEMV_TOK && ga_ok(m, jb->x);
        }
        if (!joins) {
            cu_linear(be, jb->y, jb->ldy, jb->x, jb->w, jb->b, jb->n_tok);
            continue;
        }
        n_tok = jb->n_tok;
        js.j[js.n++] = ga_job_of(jb->y, jb->ldy, jb->x, m, bias);
    }
    if (js.n > 0 && !c->err_rc)
        ga_run(c, js, n_tok);
}

void cu_embed(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    cu_wmat m;
    cu_wmat_from(&m, w);
    cu_launch(c, embed_kernel, dim3(n_tok), dim3(256), y, m, ids);
    cu_check(c, "embed");
}

/* An expert_linear's table: every view prepared on this backend, of one format, and either
 * every expert with an output bias of one type and the product's length or none. */
int cu_prepare_experts(struct backend *be, const struct expert_linear *el, int n_expert,
                       struct err *e)
{
    struct cuda_backend *c = cu_of(be);
    if (!el->w || n_expert < 1)
        return 0;
    cu_wmat m0;
    cu_wmat_from(&m0, &el->w[0]);
    for (struct cu_xtab *t = c->xtabs; t; t = t->next)
        if (t->key == el->w && t->d0 == m0.data && t->n == n_expert)
            return 0;
    struct cu_xent *h = (struct cu_xent *)calloc((size_t)n_expert, sizeof *h);
    if (!h)
        return err_setf(e, ERR_NOMEM, "cuda backend: out of memory (expert table)");
    bool ok = true;
    const bool has_b = el->b && tensor_is_present(&el->b[0]);
    const int bdt = has_b ? (int)el->b[0].dtype : 0;
    for (int x = 0; x < n_expert && ok; x++) {
        cu_wmat m;
        cu_wmat_from(&m, &el->w[x]);
        const struct tensor *b = el->b ? &el->b[x] : NULL;
        const bool bx = b && tensor_is_present(b);
        ok = m.in == m0.in && m.out == m0.out && m.dt == m0.dt && m.qbits == m0.qbits &&
             m.qgroup == m0.qgroup && m.qmode == m0.qmode && m.qsdt == m0.qsdt &&
             m.row_bytes == m0.row_bytes && m.qrow_bytes == m0.qrow_bytes && bx == has_b &&
             (!bx || ((int)b->dtype == bdt && tensor_nelem(b) == m0.out &&
                      (b->dtype == DTYPE_F32 || b->dtype == DTYPE_F16 || b->dtype == DTYPE_BF16)));
        h[x] = cu_xent{m.data, m.qs, m.qb, bx ? b->data : NULL};
    }
    struct cu_xtab *t = ok ? (struct cu_xtab *)calloc(1, sizeof *t) : NULL;
    if (!ok || !t) {
        free(h);
        return ok ? err_setf(e, ERR_NOMEM, "cuda backend: out of memory (expert table)") : 0;
    }
    cudaError_t rc = cudaMalloc((void **)&t->dev, (size_t)n_expert * sizeof *h);
    if (rc == cudaSuccess)
        rc = cudaMemcpy(t->dev, h, (size_t)n_expert * sizeof *h, cudaMemcpyHostToDevice);
    free(h);
    if (rc != cudaSuccess) {
        cudaFree(t->dev);
        free(t);
        return err_setf(e, ERR_INTERNAL, "cuda backend: expert table: %s", cudaGetErrorString(rc));
    }
    t->key = el->w;
    t->d0 = m0.data;
    t->n = n_expert;
    t->bdt = bdt;
    t->next = c->xtabs;
    c->xtabs = t;
    return 0;
}

/* The experts' products of few slots on the device (ADR 0143): one launch of the affine GEMV
 * for all products, blockIdx.y the slot, each block finding its slot's expert in offsets and
 * its weights in the product's table, so nothing waits for the host and a CUDA graph holds
 * the whole MoE layer. false where a product has no table or takes no affine GEMV. */
bool cu_linear_experts_dev(struct cuda_backend *c, float *y, int ldy, const float *x,
                           const struct expert_linear *el, int n_el, const int32_t *offsets,
                           int n_expert, int n_slot)
{
    if (n_slot < 1 || n_slot > CU_EXPERT_DEV_SLOTS || n_el < 1 || n_el > GA_MAX_JOBS || n_expert < 1)
        return false;
    ga_jobs js = {};
    for (int i = 0; i < n_el; i++) {
        cu_wmat m0;
        cu_wmat_from(&m0, &el[i].w[0]);
        const struct cu_xtab *t = c->xtabs;
        while (t && !(t->key == el[i].w && t->d0 == m0.data && t->n == n_expert))
            t = t->next;
        if (!t || !ga_ok(m0, x) || m0.in % 4 != 0 || m0.in != el[0].w[0].shape[1])
            return false;
        if (i > 0 && (m0.qbits != js.j[0].w.qbits || m0.qsdt != js.j[0].w.qsdt || m0.dt != js.j[0].w.dt))
            return false;
        ga_job jb = ga_job_of(y + (size_t)i * m0.out, ldy, x, m0, NULL); /* cu_linear_experts' columns */
        jb.xt = t->dev;
        jb.bdt = t->bdt; /* each expert's bias (if any) comes from the table */
        js.j[js.n++] = jb;
    }
    js.ex = ga_experts{offsets, n_expert, n_slot};
    if (!c->err_rc)
        ga_run(c, js, 1);
    return true;
}
