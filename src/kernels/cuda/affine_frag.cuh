/*
 * affine_frag: what the products over MLX affine codes share (linear.cu's GEMVs, mma.cu's
 * tensor-core product over the codes, mmv.cu's few-token product): the m16n8k16 bf16 mma,
 * codes to exact bf16 pairs, a row's scale or bias, and the jobs of one GEMV launch.
 */
#pragma once
#include <cuda_bf16.h>

#include "cuda_impl.h"

/* c += a b: m16n8k16, bf16 in, f32 accumulate. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- codes to bf16 ----

__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 h)
{
    return (uint32_t)__bfloat16_as_ushort(h.x) | (uint32_t)__bfloat16_as_ushort(h.y) << 16;
}

/* The two 4-bit codes of byte sh / 8 of v as a bf16 pair (low nibble in the low half), exactly:
 * each nibble under the exponent of 128 (0x4300 | q = 128 + q), then 128 subtracted in bf16. */
__device__ __forceinline__ uint32_t codes4_bf16(uint32_t v, int sh)
{
    uint32_t b = v >> sh;
    uint32_t r = (b & 0xfu) | (b & 0xf0u) << 12 | 0x43004300u;
    __nv_bfloat162 h;
    h.x = __ushort_as_bfloat16((unsigned short)(r & 0xffffu));
    h.y = __ushort_as_bfloat16((unsigned short)(r >> 16));
    return bf162_bits(__hsub2(h, __float2bfloat162_rn(128.0f)));
}

/* Bytes k and k + 1 of v (8-bit codes) as a bf16 pair, exactly: 2^23 + q in f32 minus 2^23. */
__device__ __forceinline__ uint32_t codes8_bf16(uint32_t v, int k)
{
    float f0 = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | k)) - 8388608.0f;
    float f1 = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | (k + 1))) - 8388608.0f;
    return bf162_bits(__floats2bfloat162_rn(f0, f1));
}

/* Scale or bias g of a row's array, of the template dtype. */
template <int SDT>
__device__ __forceinline__ float cu_ld_sb(const uint8_t *p, int g)
{
    if constexpr (SDT == DTYPE_F32) {
        return __ldg((const float *)p + g);
    } else {
        unsigned short h = __ldg((const unsigned short *)p + g);
        return SDT == DTYPE_BF16 ? cu_bf16(h) : cu_f16(h);
    }
}


/* CALL with AB (4 or 8) and AS (the scales' dtype: DTYPE_BF16, DTYPE_F16, else DTYPE_F32) as
 * constants for an affine format of bits and scale dtype sdt (mma.cu, mmq.cu). */
#define AFFINE_DISPATCH(bits, sdt, CALL)                                                     \
    do {                                                                                     \
        if ((bits) == 4 && (sdt) == DTYPE_BF16) {                                            \
            constexpr int AB = 4, AS = DTYPE_BF16;                                           \
            CALL;                                                                            \
        } else if ((bits) == 4 && (sdt) == DTYPE_F16) {                                      \
            constexpr int AB = 4, AS = DTYPE_F16;                                            \
            CALL;                                                                            \
        } else if ((bits) == 4) {                                                            \
            constexpr int AB = 4, AS = DTYPE_F32;                                            \
            CALL;                                                                            \
        } else if ((sdt) == DTYPE_BF16) {                                                    \
            constexpr int AB = 8, AS = DTYPE_BF16;                                           \
            CALL;                                                                            \
        } else if ((sdt) == DTYPE_F16) {                                                     \
            constexpr int AB = 8, AS = DTYPE_F16;                                            \
            CALL;                                                                            \
        } else {                                                                             \
            constexpr int AB = 8, AS = DTYPE_F32;                                            \
            CALL;                                                                            \
        }                                                                                    \
    } while (0)

/* A warp's 2 m16 x 4 n8 f32 C tiles (mma.cu, mmq.cu: tokens m0 + 32 wm + 16 mi + g and + 8,
 * rows n0 + 32 wn + 8 ni + 2 tq and + 1, g = lane / 4, tq = lane % 4) into y, inside n_tok x
 * out. */
__device__ __forceinline__ void mma_store_warp(float *y, int ldy, const float (&yo)[2][4][4],
                                               int m0, int n0, int wm, int wn, int lane, int n_tok,
                                               int out)
{
    const int g = lane / 4, tq = lane % 4;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = m0 + wm * 32 + mi * 16 + g + 8 * (e >> 1);
                int r = n0 + wn * 32 + ni * 8 + 2 * tq + (e & 1);
                if (t < n_tok && r < out)
                    y[(size_t)t * ldy + r] = yo[mi][ni][e];
            }
}

/* One product of a gemv_affine_kernel launch: blocks [b0, next job's b0) are its. */
struct ga_job {
    float *y;
    int ldy;
    const float *x;
    cu_wmat w;
    int gsh;                    /* log2 of 16-byte pieces per scale group */
    const void *bias;
    int bdt;
    int b0;
    const cu_xent *xt;          /* experts (ga_experts): the product's table, or NULL */
    const int4 *xq;             /* gemv_qi_kernel: x prepared by qi_prep_kernel (its slot) */
};

#define GA_MAX_JOBS 4

/* Experts on the device (cu_linear_experts, ADR 0143): row r of every job's x and y is slot r
 * (blockIdx.y), whose expert e is the one with off[e] <= r < off[e + 1]; a job's cu_wmat is
 * expert 0's, every expert's pointers in the job's table xt (prepare_experts). */
struct ga_experts {
    const int32_t *off;         /* NULL: not experts */
    int n_e, n_slot;
};

struct ga_jobs {
    ga_job j[GA_MAX_JOBS];
    int n;
    ga_experts ex;
};

/* Expert mode: jb moved to slot blockIdx.y's expert and rows (after the wait for the kernel
 * that wrote the offsets). */
__device__ __forceinline__ void ga_expert_pick(const ga_experts &ex, ga_job &jb)
{
    cu_pdl_wait();
    const int r = (int)blockIdx.y;
    int lo = 0, hi = ex.n_e; /* the last e with off[e] <= r (empty experts before it share it) */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (__ldg(ex.off + mid) <= r)
            lo = mid;
        else
            hi = mid;
    }
    const cu_xent *xe = jb.xt + lo;
    jb.w.data = (const uint8_t *)__ldg((const unsigned long long *)&xe->data);
    jb.w.qs = (const uint8_t *)__ldg((const unsigned long long *)&xe->qs);
    jb.w.qb = (const uint8_t *)__ldg((const unsigned long long *)&xe->qb);
    jb.bias = (const void *)__ldg((const unsigned long long *)&xe->bias);
    jb.x += (size_t)r * jb.w.in;
    jb.y += (size_t)r * jb.ldy;
}

/* The job block b belongs to (jobs in order of b0). */
__device__ __forceinline__ ga_job ga_pick(const ga_jobs &js, int b)
{
    ga_job jb = js.j[0];
#pragma unroll
    for (int i = 1; i < GA_MAX_JOBS; i++)
        if (i < js.n && b >= js.j[i].b0)
            jb = js.j[i];
    return jb;
}

/* n_tok (2..MMV_TOK) rows against affine 4/8-bit jobs on tensor cores, each weight read once
 * (mmv.cu); cu_mmv_ok says which products it takes. */
#define MMV_TOK 8
bool cu_mmv_ok(const cu_wmat &m);
void cu_mmv(struct cuda_backend *c, ga_jobs &js, int n_tok);
