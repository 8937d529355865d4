/*
 * moe: mixture-of-experts ops on the GPU (backend.h), the CPU reference's
 * arithmetic (backend_cpu_moe.c): top-k by repeated selection (ties to the
 * lower index), softmax weights in double, PhiMoE's sparsemixer.
 *
 * route:   one thread per token
 * group:   one thread (a stable counting sort of n_slot = n_tok * k pairs)
 * experts: offsets come back to the host (one small download), then each
 *          expert's rows run through cu_linear (GEMV or GEMM by row count)
 * combine: the inverse of order, then one thread per (token, column) sums its
 *          k slots in slot order
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_impl.h"

#define MOE_MAX_EXPERTS 256
#define MOE_MAX_K 16

// ---- routing ----

__device__ float sparsemixer_pick(const float *logits, const bool *masked, int n, float eps,
                                  int32_t *pick)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!masked[i] && (best < 0 || logits[i] > logits[best]))
            best = i;
    float thr = logits[best];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        if (masked[i])
            continue;
        float factor = fabsf(logits[i]) > thr ? fabsf(logits[i]) : thr;
        if ((thr - logits[i]) / factor > 2.0f * eps)
            continue;
        sum += exp((double)logits[i] - thr);
    }
    *pick = best;
    return (float)(1.0 / sum);
}

__global__ void route_kernel(int kind, int32_t *sel_all, float *w_all, const float *logits_all,
                             int n_tok, int n, int k, float jitter)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok)
        return;
    const float *logits = logits_all + (size_t)t * n;
    int32_t *sel = sel_all + (size_t)t * k;
    float *w = w_all + (size_t)t * k;
    if (kind == ROUTER_SPARSEMIXER) {
        bool masked[MOE_MAX_EXPERTS] = {};
        w[0] = sparsemixer_pick(logits, masked, n, jitter, &sel[0]);
        masked[sel[0]] = true;
        w[1] = sparsemixer_pick(logits, masked, n, jitter, &sel[1]);
        return;
    }
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int u = 0; u < s; u++)
                taken |= sel[u] == i;
            if (!taken && (best < 0 || logits[i] > logits[best]))
                best = i;
        }
        sel[s] = best;
    }
    double sum = 0.0, mx = logits[sel[0]];
    bool all = kind == ROUTER_SOFTMAX_TOPK_RAW;
    for (int s = 0; s < (all ? n : k); s++)
        sum += exp((double)logits[all ? s : sel[s]] - mx);
    for (int s = 0; s < k; s++)
        w[s] = (float)(exp((double)logits[sel[s]] - mx) / sum);
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

/* Top-k of doubles by repeated selection, ties toward the lower index. */
__device__ void topk_d(const double *v, int n, int k, int32_t *idx)
{
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int t = 0; t < s; t++)
                taken |= idx[t] == i;
            if (!taken && (best < 0 || v[i] > v[best]))
                best = i;
        }
        idx[s] = best;
    }
}

/* One thread per token: the CPU's route_grouped_one (backend_cpu_moe.c), in double. */
__global__ void route_grouped_kernel(int kind, int32_t *sel_all, float *w_all,
                                     const float *logits_all, int n_tok, int n, int k,
                                     const float *bias, int n_group, int topk_group, bool norm,
                                     float scale)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok)
        return;
    const float *logits = logits_all + (size_t)t * n;
    int32_t *sel = sel_all + (size_t)t * k;
    float *w = w_all + (size_t)t * k;
    double s[MOE_MAX_EXPERTS], c[MOE_MAX_EXPERTS], gscore[MOE_MAX_EXPERTS];
    int32_t gsel[MOE_MAX_EXPERTS];
    if (kind == ROUTER_GROUP_SOFTMAX) {
        double mx = logits[0], sum = 0.0;
        for (int i = 1; i < n; i++)
            mx = logits[i] > mx ? logits[i] : mx;
        for (int i = 0; i < n; i++)
            sum += s[i] = exp((double)logits[i] - mx);
        for (int i = 0; i < n; i++)
            s[i] /= sum;
    } else {
        for (int i = 0; i < n; i++)
            s[i] = 1.0 / (1.0 + exp(-(double)logits[i]));
    }
    for (int i = 0; i < n; i++)
        c[i] = s[i] + (bias ? (double)bias[i] : 0.0);
    int gs = n / n_group;
    if (n_group > 1 && topk_group < n_group) {
        for (int g = 0; g < n_group; g++) {
            const double *cg = c + (size_t)g * gs;
            int32_t two[2] = {0, 0};
            if (kind == ROUTER_GROUP_SIGMOID && gs >= 2) {
                topk_d(cg, gs, 2, two);
                gscore[g] = cg[two[0]] + cg[two[1]];
            } else {
                topk_d(cg, gs, 1, two);
                gscore[g] = cg[two[0]];
            }
        }
        topk_d(gscore, n_group, topk_group, gsel);
        for (int g = 0; g < n_group; g++) {
            bool keep = false;
            for (int u = 0; u < topk_group; u++)
                keep |= gsel[u] == g;
            for (int i = 0; !keep && i < gs; i++)
                c[(size_t)g * gs + i] = 0.0;
        }
    }
    topk_d(c, n, k, sel);
    double sum = 0.0;
    for (int j = 0; j < k; j++)
        sum += s[sel[j]];
    for (int j = 0; j < k; j++)
        w[j] = (float)((norm ? s[sel[j]] / (sum + 1e-20) : s[sel[j]]) * scale);
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
                                                              p->norm, p->scale);
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

void cu_moe_combine(struct backend *be, float *y, const float *x, const int32_t *order,
                    const float *w, int k, int n_slot, int n)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_slot <= 0)
        return;
    int32_t *inv = cu_iscratch(c, (size_t)n_slot);
    if (!inv)
        return;
    invert_kernel<<<(n_slot + 255) / 256, 256, 0, c->st>>>(inv, order, n_slot);
    size_t total = (size_t)(n_slot / k) * n, g = (total + 255) / 256;
    combine_kernel<<<(int)(g < 65536 ? g : 65536), 256, 0, c->st>>>(y, x, inv, w, k, n_slot / k, n);
    cu_check(c, "moe_combine");
}

// ---- expert linears ----

void cu_linear_experts(struct backend *be, float *y, int ldy, const float *x,
                       const struct expert_linear *el, int n_el, const int32_t *offsets,
                       int n_expert, int n_slot)
{
    struct cuda_backend *c = cu_of(be);
    (void)n_slot;
    if (c->err_rc || cu_not_capturable(c, "moe offsets in a graph"))
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
