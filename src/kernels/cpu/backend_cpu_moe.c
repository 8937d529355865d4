/*
 * backend_cpu_moe: mixture-of-experts ops on the CPU (backend.h): routing
 * (top-k and weights per token), grouping of (token, slot) pairs by expert,
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

#include "backend_cpu_impl.h"

// ---- routing ----

/* Top-k by repeated selection over floats (vf) or doubles (vd, when vf is NULL); strict '>'
 * keeps the lower index on ties. */
static void topk_fd(const float *vf, const double *vd, int n, int k, int32_t *idx)
{
    for (int s = 0; s < k; s++) {
        int best = -1;
        double bv = 0.0;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int t = 0; t < s; t++)
                taken |= idx[t] == i;
            double v = vf ? (double)vf[i] : vd[i];  /* float -> double is exact: same order */
            if (!taken && (best < 0 || v > bv)) {
                best = i;
                bv = v;
            }
        }
        idx[s] = best;
    }
}

static void topk(const float *v, int n, int k, int32_t *idx)
{
    topk_fd(v, NULL, n, k, idx);
}

static void topk_d(const double *v, int n, int k, int32_t *idx)
{
    topk_fd(NULL, v, n, k, idx);
}

/* PhiMoE sparsemixer, inference form (transformers modeling_phimoe.sparsemixer):
 * the winner's weight is its softmax over the experts whose logit lies within
 * a relative band 2*eps of the max; the band is measured against
 * max(|logit_i|, max). The second pick repeats this with the winner masked. */
static float sparsemixer_pick(const float *logits, const bool *masked, int n, float eps,
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

/* One token's routing. */
static void route_one(enum router_kind kind, const float *logits, int n, int k, float jitter,
                      int32_t *sel, float *w)
{
    if (kind == ROUTER_SPARSEMIXER) {
        bool masked[256] = {0};
        w[0] = sparsemixer_pick(logits, masked, n, jitter, &sel[0]);
        masked[sel[0]] = true;
        w[1] = sparsemixer_pick(logits, masked, n, jitter, &sel[1]);
        return;
    }
    /* Phixtral: softmax over the top-k logits. Mixtral: softmax over all, keep top-k,
     * renormalize -- the same weights, since the shared denominator cancels. */
    topk(logits, n, k, sel);
    double sum = 0.0, mx = logits[sel[0]];
    /* Qwen-MoE without norm_topk_prob: the softmax over all experts, not renormalized */
    bool all = kind == ROUTER_SOFTMAX_TOPK_RAW;
    for (int s = 0; s < (all ? n : k); s++)
        sum += exp((double)logits[all ? s : sel[s]] - mx);
    for (int s = 0; s < k; s++)
        w[s] = (float)(exp((double)logits[sel[s]] - mx) / sum);
}

void cpu_moe_route(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                   const float *logits, int n_tok, int n_expert, int k, float jitter)
{
    if (cpu_of(be)->err_rc)
        return;
    for (int t = 0; t < n_tok; t++)
        route_one(kind, logits + (size_t)t * n_expert, n_expert, k, jitter, sel + (size_t)t * k,
                  w + (size_t)t * k);
}

/* One token of a grouped router (backend.h, struct moe_group_params), in double. */
static void route_grouped_one(enum router_kind kind, const float *logits, int n, int k,
                              const struct moe_group_params *p, const float *bias, int32_t *sel,
                              float *w)
{
    double s[256], c[256], gscore[256];
    int32_t gsel[256];
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
    int ng = p->n_group, gs = n / ng;
    if (ng > 1 && p->topk_group < ng) {
        for (int g = 0; g < ng; g++) {
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
        topk_d(gscore, ng, p->topk_group, gsel);
        for (int g = 0; g < ng; g++) {
            bool keep = false;
            for (int t = 0; t < p->topk_group; t++)
                keep |= gsel[t] == g;
            for (int i = 0; !keep && i < gs; i++)
                c[(size_t)g * gs + i] = 0.0;
        }
    }
    topk_d(c, n, k, sel);
    double sum = 0.0;
    for (int j = 0; j < k; j++)
        sum += s[sel[j]];
    for (int j = 0; j < k; j++)
        w[j] = (float)((p->norm ? s[sel[j]] / (sum + 1e-20) : s[sel[j]]) * p->scale);
}

void cpu_moe_route_grouped(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                           const float *logits, int n_tok, int n_expert, int k,
                           const struct moe_group_params *p)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc)
        return;
    if (n_expert > 256 || p->n_group < 1 || n_expert % p->n_group != 0 || p->topk_group < 1 ||
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
        route_grouped_one(kind, logits + (size_t)t * n_expert, n_expert, k, p, bias,
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
