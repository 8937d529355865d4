/*
 * moe: mixture-of-experts ops on the GPU (backend.h), the CPU reference's
 * arithmetic: the routing is ../moe_route.h, the same functions the CPU
 * backend runs (top-k by repeated selection, ties to the lower index, softmax
 * weights in double, PhiMoE's sparsemixer, the grouped routers).
 *
 * route:   one thread per token
 * group:   one thread (a stable counting sort of n_slot = n_tok * k pairs)
 * experts: up to CU_EXPERT_DEV_SLOTS slots (decode), experts stacked at one
 *          stride: one GEMV launch for every product, each block finding its
 *          slot's expert in the offsets on the device (ADR 0143); else the
 *          offsets come back to the host (one small download), then each
 *          expert's rows run through cu_linear (GEMV or GEMM by row count)
 * combine: up to 4096 slots, a block per token finds its k slots in order
 *          (no scratch, so a decode step's graph holds it); else the inverse
 *          of order in scratch; then one thread per (token, column) sums its k
 *          slots in slot order
 */
#include <math.h>
#include <stdlib.h>

#include "../moe_route.h"
#include "cuda_impl.h"

#define MOE_MAX_EXPERTS MOE_ROUTE_MAX_EXPERTS
#define MOE_MAX_K 16

// ---- routing ----

__global__ void route_kernel(int kind, int32_t *sel_all, float *w_all, const float *logits_all,
                             int n_tok, int n, int k, float jitter)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok)
        return;
    moe_route_one(kind, logits_all + (size_t)t * n, n, k, jitter, sel_all + (size_t)t * k,
                  w_all + (size_t)t * k);
}

void cu_moe_route(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                  const float *logits, int n_tok, int n_expert, int k, float jitter)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    if (n_expert > MOE_MAX_EXPERTS || k > MOE_MAX_K) {
        cu_fail(c, "moe_route: more than 256 experts or top-16", cudaErrorInvalidValue);
        return;
    }
    route_kernel<<<(n_tok + 127) / 128, 128, 0, c->st>>>(kind, sel, w, logits, n_tok, n_expert, k,
                                                         jitter);
    cu_check(c, "moe_route");
}

/* One thread per token: the CPU's arithmetic (../moe_route.h), in double. */
__global__ void route_grouped_kernel(int kind, int32_t *sel_all, float *w_all,
                                     const float *logits_all, int n_tok, int n, int k,
                                     const float *bias, int n_group, int topk_group, bool norm,
                                     float scale, float norm_min)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok)
        return;
    moe_route_grouped_one(kind, logits_all + (size_t)t * n, n, k, n_group, topk_group, norm, scale,
                          norm_min, bias, sel_all + (size_t)t * k, w_all + (size_t)t * k);
}

void cu_moe_route_grouped(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                          const float *logits, int n_tok, int n_expert, int k,
                          const struct moe_group_params *p)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    if (n_expert > MOE_MAX_EXPERTS || p->n_group < 1 || n_expert % p->n_group != 0 ||
        p->topk_group < 1 || p->topk_group > p->n_group || k > n_expert ||
        (kind != ROUTER_GROUP_SOFTMAX && kind != ROUTER_GROUP_SIGMOID)) {
        cu_fail(c, "moe_route_grouped: bad routing options", cudaErrorInvalidValue);
        return;
    }
    const float *bias = p->bias && tensor_is_present(p->bias) ? (const float *)p->bias->data : NULL;
    route_grouped_kernel<<<(n_tok + 63) / 64, 64, 0, c->st>>>(kind, sel, w, logits, n_tok, n_expert,
                                                              k, bias, p->n_group, p->topk_group,
                                                              p->norm, p->scale, p->norm_min);
    cu_check(c, "moe_route_grouped");
}

// ---- grouping and combining ----

__global__ void group_kernel(int32_t *order, int32_t *offsets, const int32_t *sel, int n_slot,
                             int n_expert)
{
    for (int e = 0; e <= n_expert; e++)
        offsets[e] = 0;
    for (int i = 0; i < n_slot; i++)
        offsets[sel[i] + 1]++;
    for (int e = 0; e < n_expert; e++)
        offsets[e + 1] += offsets[e];
    for (int e = n_expert; e > 0; e--)
        offsets[e] = offsets[e - 1];
    for (int i = 0; i < n_slot; i++)
        order[offsets[sel[i] + 1]++] = i;
    offsets[0] = 0;
}

void cu_moe_group(struct backend *be, int32_t *order, int32_t *offsets, const int32_t *sel,
                  int n_slot, int n_expert)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc)
        return;
    group_kernel<<<1, 1, 0, c->st>>>(order, offsets, sel, n_slot, n_expert);
    cu_check(c, "moe_group");
}

__global__ void invert_kernel(int32_t *inv, const int32_t *order, int n_slot)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n_slot)
        inv[order[r]] = r;
}

/* y[t, j] = sum_i w[t*k + i] * x[inv[t*k + i], j]. */
__global__ void combine_kernel(float *y, const float *x, const int32_t *inv, const float *w, int k,
                               int n_tok, int n)
{
    size_t total = (size_t)n_tok * n;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / n), j = (int)(i % n);
        float acc = 0.0f;
        for (int s = 0; s < k; s++)
            acc += w[t * k + s] * x[(size_t)inv[t * k + s] * n + j];
        y[i] = acc;
    }
}

/* The same for few slots without scratch, so that a graph records it (a decode step; scratch
 * is never captured): block t finds where order put its k slots, then sums as combine_kernel
 * does, in the same order (the same bits). */
#define COMBINE_SCAN_K 64       /* experts per token at most */
#define COMBINE_SCAN_SLOTS 4096 /* slots at most */
__global__ void combine_scan_kernel(float *y, const float *x, const int32_t *order, const float *w,
                                    int k, int n_slot, int n)
{
    __shared__ int32_t pos[COMBINE_SCAN_K];
    const int t = blockIdx.x;
    for (int r = threadIdx.x; r < n_slot; r += blockDim.x) {
        const int o = order[r];
        if (o / k == t)
            pos[o % k] = r;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < k; s++)
            acc += w[t * k + s] * x[(size_t)pos[s] * n + j];
        y[(size_t)t * n + j] = acc;
    }
}

void cu_moe_combine(struct backend *be, float *y, const float *x, const int32_t *order,
                    const float *w, int k, int n_slot, int n)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_slot <= 0)
        return;
    if (k >= 1 && k <= COMBINE_SCAN_K && n_slot <= COMBINE_SCAN_SLOTS && n_slot % k == 0) {
        combine_scan_kernel<<<n_slot / k, 256, 0, c->st>>>(y, x, order, w, k, n_slot, n);
        cu_check(c, "moe_combine");
        return;
    }
    int32_t *inv = cu_iscratch(c, (size_t)n_slot);
    if (!inv)
        return;
    invert_kernel<<<(n_slot + 255) / 256, 256, 0, c->st>>>(inv, order, n_slot);
    size_t total = (size_t)(n_slot / k) * n, g = (total + 255) / 256;
    combine_kernel<<<(int)(g < 65536 ? g : 65536), 256, 0, c->st>>>(y, x, inv, w, k, n_slot / k, n);
    cu_check(c, "moe_combine");
}

/* grid: one block per slot row r (grid-stride over rows), threads over its n columns. The
 * row's weight is read by every thread before thread 0 resets it (order is a permutation:
 * no other block touches it). */
__global__ void weight_input_kernel(float *x, const int32_t *order, float *w, int n_slot, int n)
{
    for (int r = blockIdx.x; r < n_slot; r += gridDim.x) {
        float s = w[order[r]];
        for (int j = threadIdx.x; j < n; j += blockDim.x)
            x[(size_t)r * n + j] *= s;
        __syncthreads();
        if (threadIdx.x == 0)
            w[order[r]] = 1.0f;
    }
}

void cu_moe_weight_input(struct backend *be, float *x, const int32_t *order, float *w, int n_slot,
                         int n)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_slot <= 0 || n <= 0)
        return;
    weight_input_kernel<<<n_slot < 65535 ? n_slot : 65535, 256, 0, c->st>>>(x, order, w, n_slot, n);
    cu_check(c, "moe_weight_input");
}

// ---- expert linears ----

void cu_linear_experts(struct backend *be, float *y, int ldy, const float *x,
                       const struct expert_linear *el, int n_el, const int32_t *offsets,
                       int n_expert, int n_slot)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc)
        return;
    if (c->moe_dev && cu_linear_experts_dev(c, y, ldy, x, el, n_el, offsets, n_expert, n_slot))
        return;
    if (cu_not_capturable(c, "moe offsets in a graph"))
        return;
    if ((size_t)n_expert + 1 > c->h_off_cap) {
        int32_t *p = (int32_t *)realloc(c->h_off, ((size_t)n_expert + 1) * sizeof *p);
        if (!p) {
            cu_fail(c, "moe offsets", cudaErrorMemoryAllocation);
            return;
        }
        c->h_off = p;
        c->h_off_cap = (size_t)n_expert + 1;
    }
    cudaError_t rc = cudaMemcpyAsync(c->h_off, offsets, ((size_t)n_expert + 1) * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, c->st);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(c->st);
    if (rc != cudaSuccess) {
        cu_fail(c, "moe offsets", rc);
        return;
    }
    const int32_t *off = c->h_off;
    for (int e = 0; e < n_expert; e++) {
        int m = off[e + 1] - off[e];
        for (int i = 0; i < n_el && m > 0; i++) {
            const struct tensor *w = &el[i].w[e];
            const struct tensor *b = el[i].b && tensor_is_present(&el[i].b[e]) ? &el[i].b[e] : NULL;
            cu_linear(be, y + (size_t)off[e] * ldy + (size_t)i * w->shape[0], ldy,
                      x + (size_t)off[e] * w->shape[1], w, b, m);
        }
    }
}
