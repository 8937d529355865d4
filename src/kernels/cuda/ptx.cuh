/*
 * ptx: the inline-PTX wrappers the tensor-core kernels share (mma.cu's product over the affine
 * codes, attn_prefill.cu's flash attention): shared-memory addresses, cp.async copies, ldmatrix
 * loads and the f16 m16n8k16 mma (affine_frag.cuh has the bf16 one).
 */
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; zeros where !ok (src is then not read). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* A K loop over `steps` steps through STAGES shared-memory stages (mma.cu, mmq.cu): load(st, ks)
 * issues the cp.async copies of step ks into stage st. cp_pipe_start fills the first STAGES - 1
 * stages; cp_pipe_step at step kt waits for it (groups committed: STAGES - 1 + kt; all but the
 * last STAGES - 2 done = step kt landed), and past the barrier, which also says every thread is
 * done with step kt - 1's stage, refills that stage with step kt + STAGES - 1. */
template <int STAGES, class L>
__device__ __forceinline__ void cp_pipe_start(L &load, int steps, int k_lo)
{
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < steps)
            load(s, k_lo + s);
        cp_async_commit();
    }
}

template <int STAGES, class L>
__device__ __forceinline__ void cp_pipe_step(L &load, int kt, int steps, int k_lo)
{
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < steps)
        load((kt + STAGES - 1) % STAGES, k_lo + kt + STAGES - 1);
    cp_async_commit();
}

/* Four 8 x 8 b16 matrices: lane l gives the address of row l % 8 of matrix l / 8; r[i] gets
 * row lane / 4, columns 2 (lane % 4) and + 1 of matrix i. */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* The same, each matrix transposed: r[i] gets column lane / 4, rows 2 (lane % 4) and + 1. */
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* c += a b: m16n8k16, f16 in, f32 accumulate. */
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
