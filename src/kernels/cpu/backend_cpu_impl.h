/*
 * backend_cpu_impl: what the CPU backend's files share (internal to
 * src/kernels/cpu/). backend_cpu.c holds the lifetime, memory, weight
 * preparation, embedding, norms and elementwise ops; backend_cpu_linear.c the
 * linear products; backend_cpu_attn.c rope, the paged KV store and
 * attention; backend_cpu_moe.c routing, grouping and the expert linears.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "../../core/threadpool.h"
#include "../backend.h"
#include "kern.h"
#include "linear_plan.h"

/* Distinct weight formats whose plans a backend keeps (linear_plan.c); more are planned
 * per call. */
#define CPU_PLANS_MAX 64

/* tensor.packed values of the layouts this backend repacks into (kern.h) */
#define CPU_PACK_QG16 1
#define CPU_PACK_FPAN 2

struct cpu_backend {
    struct backend be;
    struct tpool *pool;
    struct cpu_kernels k;
    int nth;
    float **scr;          /* [nth] per-thread scratch, 64-byte aligned */
    size_t scr_cap;       /* floats in each scr[i] */
    float *shared;        /* scratch read by all threads (quantized x sums) */
    size_t shared_cap;
    int32_t *iscr;        /* integer scratch of the caller (attention tiles) */
    size_t iscr_cap;
    bool repack;          /* prepare_weight repacks what the kernels read as QG16 / FPAN (MLXCEL_REPACK) */
    struct cpu_pack { void *p; size_t len; } *packs; /* arenas holding weights, freed at destroy */
    size_t n_packs, cap_packs;
    uint64_t copy_budget; /* bytes of weights prepare_weight may still copy (MLXCEL_MMAP) */
    uint8_t *arena_cur;   /* the free rest of the last arena (pack_alloc) */
    size_t arena_left;
    /* the plans made at prepare_weight, one per weight format (cpu_plan_of) */
    struct cpu_plan { struct wmat key; struct linear_plan plan; } plans[CPU_PLANS_MAX];
    int n_plans;
    int err_rc;           /* first error an op recorded since the last sync; 0: none */
    char err_msg[256];
};

/* One product of cpu_linear_jobs(): y[n_tok, out] (stride ldy) = x[n_tok, in] Wᵀ (+ b). */
struct cpu_job {
    float *y;
    size_t ldy;
    const float *x;           /* rows of w->in floats */
    const struct tensor *w;
    const struct tensor *b;   /* NULL when absent */
    int n_tok;
};

static inline struct cpu_backend *cpu_of(struct backend *be)
{
    return (struct cpu_backend *)be->impl;
}

/* The [out, in] matrix of a tensor as the kernels see it (its layout from tensor.packed). */
void cpu_wmat_from(struct wmat *m, const struct tensor *w);
/* The plan of w (cpu_wmat_from) kept since prepare_weight, or (for a weight no
 * prepare_weight saw, or past CPU_PLANS_MAX formats) made into *tmp. */
const struct linear_plan *cpu_plan_of(const struct cpu_backend *c, const struct wmat *w,
                                      struct linear_plan *tmp);
/* Keep the plan of a prepared weight's format (prepare_weight). */
void cpu_plan_keep(struct cpu_backend *c, const struct tensor *w);
/* backend_ops.linear_plan (linear_plan.c). */
int cpu_linear_plan_info(struct backend *be, const struct tensor *w, struct linear_plan_info *out);
/* Record the first error of a failing op (reported by sync). */
void cpu_fail(struct cpu_backend *c, const char *what, size_t bytes);
/* Grow every thread's scratch to at least n floats (only grows); false after cpu_fail. */
bool cpu_scratch_ensure(struct cpu_backend *c, size_t n);
/* Grow the scratch all threads share to n floats (only grows); NULL after cpu_fail. */
float *cpu_shared_ensure(struct cpu_backend *c, size_t n);
/* Grow the caller's integer scratch to n entries; NULL after cpu_fail. */
int32_t *cpu_iscratch_ensure(struct cpu_backend *c, size_t n);
/* Run the jobs as matvecs in one dispatch (every n_tok small), rows split across threads. */
void cpu_linear_jobs(struct cpu_backend *c, const struct cpu_job *jobs, int n_jobs);
/* backend_cpu_linear.c: the dense linear ops (backend_ops.linear, linear_batch). */
void cpu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs);
void cpu_linear(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
                const struct tensor *b, int n_tok);
/* Tokens from which linear takes the GEMM path for w (below it: matvec). */
int cpu_gemm_min_tok(const struct cpu_backend *c, const struct tensor *w);

/* backend_cpu_attn.c */
void cpu_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
              const struct rope_params *rp, const struct kv_rows *rows);
void cpu_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                  const float *v, int ldv, const struct kv_rows *rows, int n_tok);
void cpu_attention(struct backend *be, float *out, int ldo, const float *q, int ldq,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                   const struct attn_params *ap);

/* backend_cpu_moe.c */
void cpu_moe_route_grouped(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                           const float *logits, int n_tok, int n_expert, int k,
                           const struct moe_group_params *p);
void cpu_moe_route(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                   const float *logits, int n_tok, int n_expert, int k, float jitter);
void cpu_moe_group(struct backend *be, int32_t *order, int32_t *offsets, const int32_t *sel,
                   int n_slot, int n_expert);
void cpu_linear_experts(struct backend *be, float *y, int ldy, const float *x,
                        const struct expert_linear *el, int n_el, const int32_t *offsets,
                        int n_expert, int n_slot);
void cpu_moe_combine(struct backend *be, float *y, const float *x, const int32_t *order,
                     const float *w, int k, int n_slot, int n);

/* backend_ops.conv1d (backend_cpu_rec.c). */
void cpu_conv1d(struct backend *be, float *y, int ldy, const float *x, int ldx,
                const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
                const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu);
/* backend_ops.selective_scan (backend_cpu_scan.c). */
void cpu_selective_scan(struct backend *be, float *y, int ldy, const float *x, int ldx,
                        const float *dt, int lddt, const float *B, const float *C, int ldbc,
                        const float *z, int ldz, const struct tensor *A_log, const struct tensor *D,
                        const struct kv_layer *st, const struct kv_rows *rows, int n_tok,
                        int d_inner, int d_state);
/* backend_ops.gated_delta (backend_cpu_gdn.c). */
void cpu_gated_delta(struct backend *be, float *y, int ldy, const float *x, int ldx,
                     const float *ab, int ldab, const struct gdn_params *p,
                     const struct kv_layer *st, const struct kv_rows *rows, int n_tok);
/* backend_ops.ssd_scan (backend_cpu_ssm.c). */
void cpu_ssd_scan(struct backend *be, float *y, int ldy, const float *x, const float *B,
                  const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                  const struct tensor *d, const struct tensor *dt_bias, const struct kv_layer *st,
                  const struct kv_rows *rows, int n_tok, const struct ssd_params *p);
/* backend_ops.rglru (backend_cpu_rglru.c). */
void cpu_rglru(struct backend *be, float *y, int ldy, const float *x, int ldx,
               const struct rglru_params *p, const struct kv_layer *st, const struct kv_rows *rows,
               int n_tok);
