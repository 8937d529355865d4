/*
 * backend_cpu_moe: mixture-of-experts ops on the CPU (backend.h): routing
 * (top-k and weights per token: ../moe_route.h, shared with the CUDA backend),
 * grouping of (token, slot) pairs by expert,
 * the expert linears over grouped rows, and the weighted combine.
 *
 * linear_experts runs every expert's rows in one dispatch of matvecs when
 * each expert has fewer rows than the GEMM threshold (decode of one or a
 * few sequences: the k selected experts' products share one wake-up of the
 * pool; ADR 0004), else one linear per expert, which takes the GEMM path
 * where an expert has many rows (prefill). Both give the same arithmetic
 * per row; backend.fused_moe = false forces the second form.
 */
#include <math.h>
#include <stdio.h>
#include <stdbool.h>
#include <string.h>

#include "../moe_route.h"
#include "backend_cpu_impl.h"

// ---- routing ----

void cpu_moe_route(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                   const float *logits, int n_tok, int n_expert, int k, float jitter)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc)
        return;
    if (n_expert > MOE_ROUTE_MAX_EXPERTS || k > n_expert) { /* hparams bound both below */
        c->err_rc = -ERR_INTERNAL;
        snprintf(c->err_msg, sizeof c->err_msg, "moe_route: %d experts, k %d", n_expert, k);
        return;
    }
    for (int t = 0; t < n_tok; t++)
        moe_route_one(kind, logits + (size_t)t * n_expert, n_expert, k, jitter,
                      sel + (size_t)t * k, w + (size_t)t * k);
}

void cpu_moe_route_grouped(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                           const float *logits, int n_tok, int n_expert, int k,
                           const struct moe_group_params *p)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc)
        return;
    if (n_expert > MOE_ROUTE_MAX_EXPERTS || p->n_group < 1 || n_expert % p->n_group != 0 || p->topk_group < 1 ||
        p->topk_group > p->n_group || k > n_expert ||
        (kind != ROUTER_GROUP_SOFTMAX && kind != ROUTER_GROUP_SIGMOID)) {
        if (!c->err_rc) {
            c->err_rc = -ERR_INTERNAL;
            snprintf(c->err_msg, sizeof c->err_msg, "moe_route_grouped: bad routing options "
                     "(%d experts in %d groups, top %d groups, k %d)", n_expert, p->n_group,
                     p->topk_group, k);
        }
        return;
    }
    const float *bias = p->bias && tensor_is_present(p->bias) ? p->bias->data : NULL;
    for (int t = 0; t < n_tok; t++)
        moe_route_grouped_one(kind, logits + (size_t)t * n_expert, n_expert, k, p->n_group,
                              p->topk_group, p->norm, p->scale, p->norm_min, bias,
                              sel + (size_t)t * k, w + (size_t)t * k);
}

// ---- grouping and combining ----

void cpu_moe_group(struct backend *be, int32_t *order, int32_t *offsets, const int32_t *sel,
                   int n_slot, int n_expert)
{
    if (cpu_of(be)->err_rc)
        return;
    /* counting sort, stable: slots ascend within each expert */
    memset(offsets, 0, (size_t)(n_expert + 1) * sizeof *offsets);
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

void cpu_moe_combine(struct backend *be, float *y, const float *x, const int32_t *order,
                     const float *w, int k, int n_slot, int n)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc)
        return;
    memset(y, 0, (size_t)(n_slot / k) * (size_t)n * sizeof *y);
    for (int r = 0; r < n_slot; r++) {
        int s = order[r];
        c->k.axpy(y + (size_t)(s / k) * n, w[s], x + (size_t)r * n, (size_t)n);
    }
}

// ---- expert linears ----

static const struct tensor *expert_bias(const struct expert_linear *el, int e)
{
    return el->b && tensor_is_present(&el->b[e]) ? &el->b[e] : NULL;
}

/* Experts' products beyond this many go out in several dispatches. */
#define EXPERT_JOBS_MAX 512

void cpu_linear_experts(struct backend *be, float *y, int ldy, const float *x,
                        const struct expert_linear *el, int n_el, const int32_t *offsets,
                        int n_expert, int n_slot)
{
    struct cpu_backend *c = cpu_of(be);
    (void)n_slot;
    if (c->err_rc)
        return;
    bool small = be->fused_moe;
    for (int e = 0; e < n_expert && small; e++)
        small = offsets[e + 1] - offsets[e] < cpu_gemm_min_tok(c, &el[0].w[e]);
    struct cpu_job jobs[EXPERT_JOBS_MAX];
    int nj = 0;
    for (int e = 0; e < n_expert; e++) {
        int m = offsets[e + 1] - offsets[e];
        for (int i = 0; i < n_el && m > 0; i++) {
            const struct tensor *w = &el[i].w[e];
            float *ye = y + (size_t)offsets[e] * ldy + (size_t)i * w->shape[0];
            const float *xe = x + (size_t)offsets[e] * w->shape[1];
            if (!small) {
                /* prefill-sized groups: each expert's linear on its own (GEMM path) */
                cpu_linear(be, ye, ldy, xe, w, expert_bias(&el[i], e), m);
                continue;
            }
            if (nj == EXPERT_JOBS_MAX) {
                cpu_linear_jobs(c, jobs, nj);
                nj = 0;
            }
            /* decode-sized: every selected expert's matvecs in one dispatch */
            jobs[nj++] = (struct cpu_job){ye, (size_t)ldy, xe, w, expert_bias(&el[i], e), m};
        }
    }
    if (nj > 0)
        cpu_linear_jobs(c, jobs, nj);
}
