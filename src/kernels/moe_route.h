/*
 * moe_route: one token's mixture-of-experts routing (backend_ops moe_route and
 * moe_route_grouped, backend.h), as plain functions that the CPU backend
 * (cpu/backend_cpu_moe.c, a loop over tokens) and the CUDA backend
 * (cuda/moe.cu, one thread per token) both compile, so the two cannot drift:
 * top-k by repeated selection (strict '>': ties go to the lower index),
 * softmax weights in double, PhiMoE's sparsemixer, and the group-limited
 * routers of DeepSeek-V2/V3.
 */
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#ifdef __CUDACC__
#define MOE_FN static inline __host__ __device__
#else
#define MOE_FN static inline
#endif

/* Experts a router takes (the arrays below live on the stack / in a thread's registers). */
#define MOE_ROUTE_MAX_EXPERTS 256

/* The k largest of v[0 .. n) into idx, largest first, by repeated selection. */
MOE_FN void moe_topk_f(const float *v, int n, int k, int32_t *idx)
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

MOE_FN void moe_topk_d(const double *v, int n, int k, int32_t *idx)
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

/* PhiMoE sparsemixer, inference form (transformers modeling_phimoe.sparsemixer): the
 * winner's weight is its softmax over the experts whose logit lies within a relative band
 * 2*eps of the max; the band is measured against max(|logit_i|, max). The second pick
 * repeats this with the winner masked. */
MOE_FN float moe_sparsemixer_pick(const float *logits, const bool *masked, int n, float eps,
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

/* One token's routing (kind: ROUTER_TOPK_SOFTMAX, ROUTER_SOFTMAX_TOPK,
 * ROUTER_SOFTMAX_TOPK_RAW, ROUTER_SPARSEMIXER, ROUTER_TOPK_SIGMOID): k experts into sel, their
 * weights into w. */
MOE_FN void moe_route_one(int kind, const float *logits, int n, int k, float jitter, int32_t *sel,
                          float *w)
{
    if (kind == ROUTER_TOPK_SIGMOID) {
        /* Llama 4: the k largest logits, each weight sigmoid(its logit), not normalized */
        moe_topk_f(logits, n, k, sel);
        for (int s = 0; s < k; s++)
            w[s] = (float)(1.0 / (1.0 + exp(-(double)logits[sel[s]])));
        return;
    }
    if (kind == ROUTER_SPARSEMIXER) {
        bool masked[MOE_ROUTE_MAX_EXPERTS];
        for (int i = 0; i < n; i++)
            masked[i] = false;
        w[0] = moe_sparsemixer_pick(logits, masked, n, jitter, &sel[0]);
        masked[sel[0]] = true;
        w[1] = moe_sparsemixer_pick(logits, masked, n, jitter, &sel[1]);
        return;
    }
    /* Phixtral: softmax over the top-k logits. Mixtral: softmax over all, keep top-k,
     * renormalize -- the same weights, since the shared denominator cancels. */
    moe_topk_f(logits, n, k, sel);
    double sum = 0.0, mx = logits[sel[0]];
    /* Qwen-MoE without norm_topk_prob: the softmax over all experts, not renormalized */
    bool all = kind == ROUTER_SOFTMAX_TOPK_RAW;
    for (int s = 0; s < (all ? n : k); s++)
        sum += exp((double)logits[all ? s : sel[s]] - mx);
    for (int s = 0; s < k; s++)
        w[s] = (float)(exp((double)logits[sel[s]] - mx) / sum);
}

/* One token of a grouped router (ROUTER_GROUP_SOFTMAX / ROUTER_GROUP_SIGMOID; backend.h,
 * struct moe_group_params, whose fields are passed one by one), in double. bias: n
 * floats or NULL. The caller has checked n <= MOE_ROUTE_MAX_EXPERTS and the groups. */
MOE_FN void moe_route_grouped_one(int kind, const float *logits, int n, int k, int n_group,
                                  int topk_group, bool norm, float scale, float norm_min,
                                  const float *bias, int32_t *sel, float *w)
{
    double s[MOE_ROUTE_MAX_EXPERTS], c[MOE_ROUTE_MAX_EXPERTS], gscore[MOE_ROUTE_MAX_EXPERTS];
    int32_t gsel[MOE_ROUTE_MAX_EXPERTS];
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
                moe_topk_d(cg, gs, 2, two);
                gscore[g] = cg[two[0]] + cg[two[1]];
            } else {
                moe_topk_d(cg, gs, 1, two);
                gscore[g] = cg[two[0]];
            }
        }
        moe_topk_d(gscore, n_group, topk_group, gsel);
        for (int g = 0; g < n_group; g++) {
            bool keep = false;
            for (int u = 0; u < topk_group; u++)
                keep |= gsel[u] == g;
            /* -inf, not 0: a choice score s + bias may be negative, and an expert outside
             * the kept groups must never win over one inside (transformers 5's Glm4Moe
             * router; DeepSeek's own code masks with -inf too). The caller keeps k within
             * the kept groups' experts, so no -inf is ever chosen. */
            for (int i = 0; !keep && i < gs; i++)
                c[(size_t)g * gs + i] = -HUGE_VAL;
        }
    }
    moe_topk_d(c, n, k, sel);
    double sum = 0.0;
    for (int j = 0; j < k; j++)
        sum += s[sel[j]];
    /* DeepSeek: sum + 1e-20; ERNIE 4.5: clamp(sum, min=moe_norm_min) */
    double den = norm_min > 0.0f ? (sum > (double)norm_min ? sum : (double)norm_min) : sum + 1e-20;
    for (int j = 0; j < k; j++)
        w[j] = (float)((norm ? s[sel[j]] / den : s[sel[j]]) * scale);
}
