/*
 * cuda_emul/cuda_impl.h: a host stand-in for src/kernels/cuda/cuda_impl.h, so that the
 * recurrent kernels (rec.cu, ssm.cu, gdn.cu) compile unchanged as C++ on a machine without
 * a GPU and run on POSIX threads: a block's threads are threads of the process, released
 * together; __syncthreads is a barrier of the block, a warp's shuffles an exchange behind a
 * barrier of the warp. Blocks run one after another, so __shared__ arrays may be globals.
 * run.sh copies the .cu files here (turning `extern __shared__` into `extern` and
 * `__shared__` into `static`) and builds emul_rec.cc against them. Slow, exact: it checks
 * the kernels' indexing, synchronization and arithmetic, not their speed.
 */
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tuple>
#include <utility>

#include "kernels/backend.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                   cudaErrorStreamCaptureUnsupported = 3 };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 0 };
static inline const char *cudaGetErrorString(cudaError_t rc) { return rc ? "error" : "success"; }
static inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = calloc(1, n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline void cudaFree(void *p) { free(p); }
template <typename K> static inline cudaError_t cudaFuncSetAttribute(K, int, int v)
{
    return v <= 232448 ? cudaSuccess : cudaErrorInvalidValue;  /* an H100's opt-in limit */
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3e { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct int4 { int x, y, z, w; };
static inline int2 make_int2(int a, int b) { return {a, b}; }
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }

extern thread_local uint3e threadIdx;
extern uint3e blockIdx;
extern dim3 blockDim;
extern size_t emul_smem;  /* dynamic shared memory of the launch, bytes */

void __syncthreads(void);
/* lane l's value v; every lane of the warp calls it */
void emul_warp_put(const void *v, size_t n);
void emul_warp_get(int lane, void *v, size_t n);
template <typename T> static inline T emul_shfl(T v, int src)
{
    emul_warp_put(&v, sizeof v);
    T r = v;
    if (src >= 0 && src < 32)
        emul_warp_get(src, &r, sizeof r);
    emul_warp_get(-1, NULL, 0);  /* everyone has read */
    return r;
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, int o)
{
    int lane = (int)(threadIdx.x + threadIdx.y * blockDim.x) & 31;
    return emul_shfl(v, lane >= o ? lane - o : lane);
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int o)
{
    int lane = (int)(threadIdx.x + threadIdx.y * blockDim.x) & 31;
    return emul_shfl(v, lane ^ o);
}

struct cuda_backend {
    struct backend be;
    int err_rc;
    char err_msg[256];
    bool capturing, pdl, chunked;
    void *rscr;
    size_t rscr_cap;
    size_t rec_smem[4];
};
static inline struct cuda_backend *cu_of(struct backend *be) { return (struct cuda_backend *)be->impl; }
static inline void cu_fail(struct cuda_backend *c, const char *what, cudaError_t rc)
{
    if (!c->err_rc) {
        c->err_rc = -1;
        snprintf(c->err_msg, sizeof c->err_msg, "%s: %d", what, (int)rc);
    }
}
static inline bool cu_not_capturable(struct cuda_backend *c, const char *what)
{
    if (c->capturing)
        cu_fail(c, what, cudaErrorStreamCaptureUnsupported);
    return c->capturing;
}
static inline bool cu_check(struct cuda_backend *c, const char *) { return c->err_rc == 0; }

/* Runs the grid: blocks in order, each block's threads on POSIX threads. */
void emul_run(void (*body)(void *), void *arg, dim3 grid, dim3 block, size_t smem);

template <typename... P, typename... A>
static inline void cu_launch_smem(struct cuda_backend *c, void (*k)(P...), dim3 grid, dim3 block,
                                  size_t smem, A... args)
{
    if (smem > 232448) {
        cu_fail(c, "launch: shared memory", cudaErrorInvalidValue);
        return;
    }
    auto tup = new std::tuple<P...>(static_cast<P>(args)...);
    struct ctx {
        void (*k)(P...);
        std::tuple<P...> *t;
    } cx = {k, tup};
    emul_run([](void *p) {
        ctx *x = (ctx *)p;
        std::apply(x->k, *x->t);
    }, &cx, grid, block, smem);
    delete tup;
}
template <typename... P, typename... A>
static inline void cu_launch(struct cuda_backend *c, void (*k)(P...), dim3 grid, dim3 block, A... args)
{
    cu_launch_smem(c, k, grid, block, 0, args...);
}
static inline void cu_pdl_wait() {}
static inline void cu_pdl_trigger() {}
static inline float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define REC_CHUNK 64
#define REC_CHUNK_MIN 32
struct rec_plan {
    const int32_t *cnt;
    const int4 *items;
    const int2 *chunks;
    float *f;
    int max_chunks;
};
bool cu_rec_plan(struct cuda_backend *c, const struct kv_rows *rows, int n_tok, size_t floats,
                 struct rec_plan *pl);
bool cu_rec_smem(struct cuda_backend *c, int k, const void *fn, size_t bytes);
void cu_ssd_scan(struct backend *be, float *y, int ldy, const float *x, const float *B,
                 const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                 const struct tensor *d, const struct tensor *dt_bias, const struct kv_layer *st,
                 const struct kv_rows *rows, int n_tok, const struct ssd_params *p);
void cu_gated_delta(struct backend *be, float *y, int ldy, const float *x, int ldx,
                    const float *ab, int ldab, const struct gdn_params *p,
                    const struct kv_layer *st, const struct kv_rows *rows, int n_tok);
