/*
 * linear: y[n_tok, out] = x[n_tok, in] Wᵀ (+ b) for every weight format
 * (F32/F16/BF16, MLX affine 2..8 bits, mxfp4, mxfp8, nvfp4), and the
 * embedding lookup, on the GPU.
 *
 * Decode (n_tok <= GEMV_TOK): fused dequant-GEMV. One warp per output row,
 * 8 warps per block; lane l takes the row's 32-element chunks l, l + 32, ...
 * (a chunk lies in one or two scale groups: groups are >= 16), decodes the
 * chunk to f32 in registers and accumulates it against every token's x, so
 * the weight row is read once for all tokens. Elements past the last whole
 * chunk go one per lane. A warp reduction finishes each dot product.
 *
 * Prefill: the rows are dequantized (widened) to f32 into scratch in panels
 * of up to PANEL_FLOATS, and cuBLAS SGEMM (f32, no TF32) multiplies each panel;
 * f32 weights go to cuBLAS directly. The bias is added after.
 *
 * Values follow the CPU reference (kern_ref.c): affine w = s * q + b, fp
 * modes w = value(q) * scale, codes a little-endian bit stream per row.
 */
#include "cuda_impl.h"

#define GEMV_TOK 8
#define GEMV_WARPS 8
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

/* dst [rows, in] = W[r0 .. r0 + rows) in f32; grid-stride over (row, chunk-or-tail-element). */
template <int F>
__global__ void dequant_kernel(float *dst, cu_wmat w, int r0, int rows, int n_chunks)
{
    int tail = w.in - n_chunks * 32, per_row = n_chunks + tail;
    size_t n = (size_t)rows * per_row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int rr = (int)(i / per_row), c = (int)(i % per_row);
        float *d = dst + (size_t)rr * w.in;
        if (c < n_chunks) {
            float v[32];
            decode_chunk<F>(w, r0 + rr, c, v);
#pragma unroll
            for (int j = 0; j < 32; j++)
                d[c * 32 + j] = v[j];
        } else {
            int k = n_chunks * 32 + (c - n_chunks);
            d[k] = w_elem(w, r0 + rr, k);
        }
    }
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

static int grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (int)(g < 65536 ? (g ? g : 1) : 65536);
}

static void gemm(struct cuda_backend *c, float *y, int ldy, const float *x, const cu_wmat &w,
                 int n_tok)
{
    const float one = 1.0f, zero = 0.0f;
    if (!w.qbits && w.dt == DTYPE_F32) {
        cublasStatus_t s = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, w.out, n_tok, w.in, &one,
                                       (const float *)w.data, (int)(w.row_bytes / 4), x, w.in,
                                       &zero, y, ldy);
        if (s != CUBLAS_STATUS_SUCCESS)
            cu_fail(c, "cublasSgemm", cudaErrorUnknown);
        return;
    }
    int panel = (int)(PANEL_FLOATS / (size_t)w.in);
    panel = panel < 1 ? 1 : panel > w.out ? w.out : panel;
    float *scr = cu_scratch(c, (size_t)panel * w.in);
    if (!scr)
        return;
    int n_chunks = whole_chunks(w);
    for (int r0 = 0; r0 < w.out; r0 += panel) {
        int rows = w.out - r0 < panel ? w.out - r0 : panel;
        size_t items = (size_t)rows * (n_chunks + (w.in - n_chunks * 32));
        FMT_DISPATCH(w, (dequant_kernel<FMT><<<grid_for(items), 256, 0, c->st>>>(scr, w, r0, rows,
                                                                                  n_chunks)));
        if (!cu_check(c, "dequantize"))
            return;
        cublasStatus_t s = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, w.in, &one,
                                       scr, w.in, x, w.in, &zero, y + r0, ldy);
        if (s != CUBLAS_STATUS_SUCCESS) {
            cu_fail(c, "cublasSgemm", cudaErrorUnknown);
            return;
        }
    }
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
    if (n_tok <= GEMV_TOK) {
        /* x rows must allow float4 loads of whole chunks */
        int n_chunks = (uintptr_t)x % 16 == 0 && m.in % 4 == 0 ? whole_chunks(m) : 0;
        const void *bd = bias ? bias->data : NULL;
        int bdt = bias ? (int)bias->dtype : 0, nb = (m.out + GEMV_WARPS - 1) / GEMV_WARPS;
        FMT_DISPATCH(m, (gemv_kernel<FMT><<<nb, 32 * GEMV_WARPS, 0, c->st>>>(
                            y, ldy, x, m.in, m, n_chunks, n_tok, bd, bdt)));
        cu_check(c, "gemv");
        return;
    }
    gemm(c, y, ldy, x, m, n_tok);
    if (bias && !c->err_rc) {
        bias_kernel<<<grid_for((size_t)m.out * n_tok), 256, 0, c->st>>>(y, ldy, bias->data,
                                                                        bias->dtype, m.out, n_tok);
        cu_check(c, "bias");
    }
}

void cu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs)
{
    for (int j = 0; j < n_jobs; j++)
        cu_linear(be, jobs[j].y, jobs[j].ldy, jobs[j].x, jobs[j].w, jobs[j].b, jobs[j].n_tok);
}

void cu_embed(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    cu_wmat m;
    cu_wmat_from(&m, w);
    embed_kernel<<<n_tok, 256, 0, c->st>>>(y, m, ids);
    cu_check(c, "embed");
}
