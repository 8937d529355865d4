/*
 * backend: the compute seam between model code and kernels.
 *
 * Model code (src/models/blocks.c) never calls a kernel directly: it calls
 * the function pointers of a struct backend. The CPU backend
 * (kernels/cpu/backend_cpu.c) runs them on the thread pool with the best
 * ISA variant chosen at startup; a CUDA backend implements the same table.
 *
 * Conventions: activations are row-major f32 with the token as the outer
 * dimension; weights are struct tensor views in their stored dtype
 * (F32/F16/BF16, or MLX affine quantized). All sizes are ints in tokens or
 * elements; products are formed in size_t inside the kernels.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct backend;

/* One matrix-vector product for linear_batch(): y[out] = W x (+ b). */
struct linear_job {
    float *y;                 /* [out] */
    const float *x;           /* [in] */
    const struct tensor *w;   /* [out, in] */
    const struct tensor *b;   /* [out] or NULL / absent */
};

struct backend_ops {
    /* y[n_tok, out] = x[n_tok, in] · Wᵀ (+ b). w: [out, in]; b: [out] or NULL/absent.
     * y and x do not alias. */
    void (*linear)(struct backend *be, float *y, const float *x, const struct tensor *w,
                   const struct tensor *b, int n_tok);
    /* Independent single-token products in one dispatch (fused MoE decode). */
    void (*linear_batch)(struct backend *be, const struct linear_job *jobs, int n_jobs);
    /* y[i, :] = row ids[i] of w [n_vocab, n_embd], widened to f32. ids are in range. */
    void (*embed)(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n_tok);
    /* Row-wise RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. w: [n]. y may equal x. */
    void (*rmsnorm)(struct backend *be, float *y, const float *x, const struct tensor *w, float eps,
                    int n_rows, int n);
    /* Row-wise LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b. b may be NULL/absent. y may equal x. */
    void (*layernorm)(struct backend *be, float *y, const float *x, const struct tensor *w,
                      const struct tensor *b, float eps, int n_rows, int n);
    /* Rotate-half (NeoX / HF rotate_half) RoPE in place on the first n_rot dims of every head.
     * x: [n_tok, n_head, head_dim] with rows of row_stride floats per token (heads contiguous).
     * Token i has position pos0 + i; angle(j) = pos * inv_freq[j], j < n_rot/2;
     * cos and sin are multiplied by mscale (longrope attention factor; 1 otherwise). */
    void (*rope)(struct backend *be, float *x, int n_tok, int row_stride, int n_head, int head_dim,
                 int n_rot, int pos0, const float *inv_freq, float mscale);
    /* Causal attention of n_tok new queries (positions pos0..pos0+n_tok-1) over the cache
     * rows 0..pos0+n_tok-1. q: [n_tok, n_head*head_dim]; k, v: [n_ctx, n_kv_head*head_dim];
     * out: [n_tok, n_head*head_dim]. Query head h reads kv head h / (n_head / n_kv_head).
     * softmax(q·kᵀ * scale) v. */
    void (*attention)(struct backend *be, float *out, const float *q, const float *k,
                      const float *v, int n_tok, int pos0, int n_head, int n_kv_head, int head_dim,
                      float scale);
    /* x = gelu_tanh(x) (GPT-2 "gelu_new"). */
    void (*gelu_tanh)(struct backend *be, float *x, size_t n);
    /* x = gelu(x) with erf. */
    void (*gelu_erf)(struct backend *be, float *x, size_t n);
    /* y = silu(gate) * up, elementwise. y may equal gate. */
    void (*silu_mul)(struct backend *be, float *y, const float *gate, const float *up, size_t n);
    /* y += a * x. */
    void (*axpy)(struct backend *be, float *y, float a, const float *x, size_t n);
    /* Release everything the backend owns, the struct included (backend_free). */
    void (*destroy)(struct backend *be);
};

struct backend {
    const struct backend_ops *ops;
    const char *name;       /* "cpu-avx512", "cpu-avx2", "cpu-scalar", "cuda" */
    int n_threads;
    void *impl;             /* owned by the backend */
};

/* CPU backend on a new thread pool of n_threads (<= 0: online CPUs).
 * isa: NULL/"auto", "scalar", "avx2" or "avx512" (also read from $MLXCEL_ISA when NULL). */
int backend_cpu_new(struct backend **out, int n_threads, const char *isa, struct err *e);
/* Free any backend (NULL is a no-op). */
void backend_free(struct backend *be);

#ifdef __cplusplus
}
#endif
