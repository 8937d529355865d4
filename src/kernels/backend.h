/*
 * backend: the compute seam between model code and kernels.
 *
 * Model code (src/models/blocks.c) never calls a kernel directly: it calls
 * the function pointers of a struct backend. The CPU backend
 * (kernels/cpu/backend_cpu.c) runs them on the thread pool with the best
 * ISA variant chosen at startup; a CUDA backend implements the same table.
 *
 * Memory. Every activation, KV-cache and metadata pointer an op takes points
 * into memory the backend allocated (buf_alloc): host memory on the CPU,
 * device memory on a GPU. Host data crosses the seam only through upload /
 * download. Weights are struct tensor views; prepare_weight runs once per
 * weight at load and may copy, repack or upload it (rewriting the view).
 *
 * Errors. Ops return nothing: a failing op (scratch it could not allocate,
 * a launch that failed) records the first error in the backend, and every
 * later op may be skipped. backend_sync() waits for queued work and returns
 * that error (then clears it), so a caller checks once per forward pass.
 *
 * Conventions: activations are row-major f32 with the token (row) as the
 * outer dimension; `ld*` arguments are row strides in elements, so a
 * projection can write into columns of a wider buffer (fused q|k|v, gate|up)
 * and later ops read those columns in place. Weights are [out, in] in their
 * stored dtype (F32/F16/BF16, or MLX quantized). Integer metadata (positions,
 * cache slots, block tables, expert ids) are int32 in backend memory, so a
 * decode step needs no host pointer and can later be captured as a graph.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/err.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct backend;

/* The most states per channel selective_scan takes (Mamba's state_size is 16). */
#define BACKEND_SCAN_MAX_STATE 256

/* One product of linear_batch(): y[n_tok, out] (row stride ldy) = x[n_tok, in] Wᵀ (+ b). */
struct linear_job {
    float *y;
    int ldy;
    const float *x;           /* [n_tok, in], dense */
    const struct tensor *w;   /* [out, in] */
    const struct tensor *b;   /* [out] or NULL / absent */
    int n_tok;
};

/* Activation functions (applied elementwise; glu() multiplies by the up half). */
enum act_kind {
    ACT_SILU = 0,
    ACT_GELU_TANH = 1,        /* GPT-2 "gelu_new", gelu_pytorch_tanh */
    ACT_GELU_ERF = 2,         /* exact gelu */
    ACT_RELU = 3,
    ACT_RELU2 = 4,            /* relu(x)² (transformers "relu2") */
    ACT_XIELU = 5,            /* xIELU (Apertus), learned per layer: the xielu op only (act and
                               * glu record an error for it) */
    ACT_SIGMOID = 6,          /* 1 / (1 + exp(-x)): output gates (Qwen3-Next's attention) */
};

/* xIELU's constants of one layer (transformers XIELUActivation): alpha_p = softplus(alpha_p),
 * alpha_n = beta + softplus(alpha_n) of the stored parameters, beta and eps as stored. */
struct xielu_params {
    float alpha_p, alpha_n, beta, eps;
};

/* Expert routing rules (moe_route). */
enum router_kind {
    ROUTER_NONE = 0,          /* dense FFN */
    ROUTER_TOPK_SOFTMAX = 1,  /* top-k logits, softmax over those k (Phixtral) */
    ROUTER_SOFTMAX_TOPK = 2,  /* softmax over all, top-k, renormalize (Mixtral) */
    ROUTER_SPARSEMIXER = 3,   /* PhiMoE sparsemixer top-2, inference form */
    ROUTER_SOFTMAX_TOPK_RAW = 4, /* softmax over all, top-k, weights kept as they are
                                  * (Qwen2/3-MoE with norm_topk_prob false) */
    ROUTER_GROUP_SOFTMAX = 5, /* DeepSeek-V2: softmax over all, group-limited top-k with a
                               * group's score its best expert (moe_route_grouped) */
    ROUTER_GROUP_SIGMOID = 6, /* DeepSeek-V3 noaux_tc: sigmoid scores, choice on score +
                               * correction bias, group score the sum of its top 2 */
    ROUTER_TOPK_SIGMOID = 7,  /* top-k logits, each weighted by its own sigmoid (Llama 4) */
};

/* The options of the grouped routers (moe_route_grouped). Per token, with scores s
 * (softmax or sigmoid of the logits) and choice scores c = s + bias (bias: 0 when NULL):
 * the experts split into n_group equal groups of consecutive ids; the topk_group groups
 * with the best group score (c's max for ROUTER_GROUP_SOFTMAX, the sum of c's top 2 for
 * ROUTER_GROUP_SIGMOID) stay eligible, the others' c become -inf; the k experts with the
 * highest c are chosen (ties toward the lower index), each weighted by its s, divided by
 * the sum of the k (+ 1e-20; with norm_min > 0: by max(sum, norm_min)) when norm, then times
 * scale. */
struct moe_group_params {
    const struct tensor *bias;   /* [n_expert] F32 correction bias, or NULL */
    int n_group, topk_group;     /* 1, 1: no group limit */
    bool norm;                   /* renormalize the k weights */
    float scale;                 /* routed_scaling_factor */
    float norm_min;              /* > 0: the renormalization divides by max(sum, norm_min)
                                  * (ERNIE 4.5's moe_norm_min); 0: by sum + 1e-20 (DeepSeek) */
};

/* E linears of one shape: views into a stacked [E, out, in] tensor or into
 * per-expert tensors; no copies either way. */
struct expert_linear {
    struct tensor *w;   /* [n_expert] views, each [out, in] */
    struct tensor *b;   /* [n_expert] views [out], or NULL */
};

/* One layer's slice of the paged KV pool: slot s (= block * block_size +
 * offset) holds K row k + s * k_dim and V row v + s * v_dim. A recurrent layer's (ADR 0057):
 * k holds each sequence's convolution state (k_dim floats at k + seq * k_dim), v its
 * recurrent state (v_dim floats at v + seq * v_dim); dtype F32. */
struct kv_layer {
    void *k, *v;             /* [slots][k_dim], [slots][v_dim] elements of dtype */
    int k_dim, v_dim;        /* elements per slot: n_kv_head * head_dim; a latent (MLA) layer
                              * keeps one row of kv_lora_rank + rope dims, v == k */
    enum dtype dtype;        /* F32, or F16 / BF16 where the backend's kv_dtypes has it
                              * (kv_store rounds to nearest even, attention widens) */
};

/* Where the rows of one forward chunk sit in the paged cache, all in backend
 * memory. Row i is token pos[i] of a sequence whose block table starts at
 * tables + table[i]; its K/V were stored at slot[i]. */
struct kv_rows {
    const int32_t *pos;      /* [n] positions */
    const int32_t *slot;     /* [n] cache slots of the rows' own K/V */
    const int32_t *table;    /* [n] offset of the row's sequence table in tables */
    const int32_t *tables;   /* block tables: entry j = physical block of positions
                              * [j * block_size, (j + 1) * block_size) */
    const int32_t *seq_end;  /* [n] the sequence's length after this forward call */
    int block_size;
    const int32_t *state;    /* [n] the row's sequence id: its slot of a recurrent layer's
                              * states (kv_layer k / v of KV_RECURRENT layers) */
    const int32_t *span;     /* [n][2] or NULL: row i's bidirectional block, positions
                              * [span[2i], span[2i + 1]] around pos[i] (an image's tokens in
                              * Gemma 3, a vision tower's patches), which it attends besides
                              * its causal (window, chunk) keys: keys [min(lo, first),
                              * max(pos, last)]; (pos, pos) for a row in none. Their K/V are
                              * stored by the same forward. Gemma 3's image rows take (pos,
                              * last): ahead only, the window still bounding the past (ADR 0087) */
};

/* Attention of one layer. */
struct attn_params {
    int n_head, n_kv_head, head_dim;
    float scale;             /* softmax scale */
    float softcap;           /* > 0: scores = softcap * tanh(scores / softcap) before the mask */
    int window;              /* > 0: a query at p attends positions (p - window, p] only */
    const float *sinks;      /* [n_head] per-head sink logits joining the softmax, or NULL */
    int chunk;               /* > 0: ... and only those of its chunk, [p - p % chunk, p]
                              * (Llama 4's chunked local attention); both bounds may apply */
};

/* The shape of Mamba-2's SSD scan (ssd_scan): n_head heads of head_dim channels, B / C in
 * n_group groups of d_state (n_head a multiple of n_group), dt clamped to [dt_min, dt_max]
 * (transformers' time_step_limit; 0, INFINITY: none). */
struct ssd_params {
    int n_head, head_dim, d_state, n_group;
    float dt_min, dt_max;
};

/* The RG-LRU's weights (backend.h rglru): width channels in n_head blocks, every tensor F32. */
struct rglru_params {
    const struct tensor *wi, *bi;   /* input gate: [n_head, bw, bw], [width] */
    const struct tensor *wa, *ba;   /* recurrence gate: [n_head, bw, bw], [width] */
    const struct tensor *a_param;   /* [width]: a = exp(-8 r softplus(a_param)) */
    int width, n_head;
};

/* Which dims of a head RoPE rotates together with frequency j. */
enum rope_style {
    ROPE_STYLE_HALF = 0,     /* (j, j + n_rot / 2): NeoX / HF rotate_half */
    ROPE_STYLE_PAIRS = 1,    /* (2j, 2j + 1): GPT-J / Cohere interleaved pairs */
};

/* Rotary tables of one layer, in backend memory. */
struct rope_params {
    int n_rot;               /* rotated dims per head (first n_rot), even */
    const float *inv_freq;   /* [n_rot / 2] */
    const float *inv_long;   /* [n_rot / 2] longrope long factors, or NULL */
    int long_after;          /* inv_long / dynamic NTK apply to rows whose seq_end exceeds this */
    float ntk_factor;        /* > 0: dynamic NTK: such a row's base becomes base * s^(n_rot / (n_rot - 2)),
                              * s = ntk_factor * seq_end / long_after - (ntk_factor - 1) */
    float mscale;            /* cos/sin multiplier (longrope / yarn attention factor; 1 otherwise) */
    enum rope_style style;   /* which dims pair up (zero: rotate-half) */
};

/* The gated delta rule's shape and per-head weights (backend_ops.gated_delta). */
struct gdn_params {
    int n_k_head, n_v_head;  /* key heads, value heads (a multiple of the key heads) */
    int k_dim, v_dim;        /* key / value head dims */
    const struct tensor *a_log, *dt_bias;  /* F32 [n_v_head] */
};

/* prepare_weight flags. A backend that copies or repacks a weight into memory of its own
 * does so only when it may give the stored pages back (DISPOSABLE), or when told to keep
 * both (BESIDE: kernel tests and benchmarks on weights they own), so a model never holds
 * two layouts of the same bytes. */
#define PREP_SOURCE_DISPOSABLE 1u
#define PREP_REPACK_BESIDE 2u
/* w is read by linear products (and otherwise only as embedding rows), never as a vector of
 * values (norm weights, biases): the backend may lay its rows out its own way for them. An
 * embedding table that no product reads is not marked (a layout for products would only
 * slow its lookups). */
#define PREP_MATRIX 4u

/* What backend_ops.linear_plan reports for one weight: its layout, and from each bucket's
 * from_tok on (to the next one's) the path and kernel of the product. Names are static
 * strings. */
#define LINEAR_PLAN_MAX 8
struct linear_plan_info {
    const char *layout;     /* "stored", "qg16", "fpan" */
    bool fast;              /* --fast's coarser x is in effect for this weight */
    int n;                  /* buckets */
    struct {
        int from_tok;
        const char *path;   /* "matvec", "matvec_qi", "fpan_linear", "gemm" */
        const char *kernel; /* the function, "isa.name" */
    } b[LINEAR_PLAN_MAX];
};

struct backend_ops {
    /* ---- memory ---- */
    /* bytes of backend memory (64-byte aligned, uninitialized) into *out; -ERR_NOMEM. */
    int (*buf_alloc)(struct backend *be, size_t bytes, void **out, struct err *e);
    void (*buf_free)(struct backend *be, void *p);
    /* host -> backend, backend -> host, backend -> backend; may be queued until sync. */
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(struct backend *be, void *dst, const void *src, size_t bytes);
    /* Once per weight at load: copy, repack or upload w and rewrite the view (the CPU keeps
     * the mmap view, or repacks 4-bit affine weights for its VNNI kernels). With
     * PREP_SOURCE_DISPOSABLE in flags nothing reads w's stored bytes after this call, so the
     * backend may give their pages back (madvise) as it consumes them. */
    int (*prepare_weight)(struct backend *be, struct tensor *w, unsigned flags, struct err *e);
    /* Wait for queued work; return (and clear) the first error an op recorded. */
    int (*sync)(struct backend *be, struct err *e);

    /* ---- dense ops ---- */
    /* y[n_tok, out] (row stride ldy >= out) = x[n_tok, in] · Wᵀ (+ b). y and x do not alias. */
    void (*linear)(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
                   const struct tensor *b, int n_tok);
    /* Independent products (all reading their own x) in as few dispatches as the backend
     * can: one for decode-sized n_tok. */
    void (*linear_batch)(struct backend *be, const struct linear_job *jobs, int n_jobs);
    /* y[i, :] = row ids[i] of w [n_vocab, n_embd], widened to f32. ids are in range. */
    void (*embed)(struct backend *be, float *y, const struct tensor *w, const int32_t *ids, int n_tok);
    /* Norm of rows of n elements, in place allowed (y == x). Row r of the n_tok * per_tok
     * rows starts at (r / per_tok) * ld + (r % per_tok) * n in both x and y (per_tok > 1:
     * per-head norms inside a wider row). RMS: x / sqrt(mean(x²) + eps) * (w + w_off); layer:
     * (x - mean) / sqrt(var + eps) * (w + w_off) + b (b NULL/absent: none). w holds n
     * elements shared by every row, or per_tok * n (one weight row per head: row r uses
     * w[r % per_tok], Cohere's [n_head, head_dim] q/k norms). w_off is 0, or 1 for Gemma's
     * x * (1 + w), added in f32. */
    void (*rmsnorm)(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                    float w_off, float eps, int n_tok, int per_tok, int n);
    void (*layernorm)(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                      float w_off, const struct tensor *b, float eps, int n_tok, int per_tok, int n);
    /* RoPE in place on the first n_rot dims of every head, dims paired by rp->style.
     * x: n_tok rows of stride ld, n_head heads of head_dim each; row i at position
     * rows->pos[i]; angle(j) = pos * inv_freq[j]. */
    void (*rope)(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
                 const struct rope_params *rp, const struct kv_rows *rows);
    /* Store K rows k[i] (stride ldk) and V rows v[i] (stride ldv) into slot rows->slot[i]. */
    void (*kv_store)(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                     const float *v, int ldv, const struct kv_rows *rows, int n_tok);
    /* Causal attention of n_tok query rows q (stride ldq) over their sequences' cached
     * positions through the block tables (the rows' own K/V already stored). Query head h
     * reads kv head h / (n_head / n_kv_head). out: [n_tok, n_head * head_dim] (stride ldo). */
    void (*attention)(struct backend *be, float *out, int ldo, const float *q, int ldq,
                      const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                      const struct attn_params *ap);
    /* x = act(x) over n_rows rows of n (stride ld). */
    void (*act)(struct backend *be, enum act_kind act, float *x, int ld, int n_rows, int n);
    /* y[r, :n] = act(x[r, :n]) * x[r, n:2n] (x stride ldx, y stride ldy; y may equal x). */
    void (*glu)(struct backend *be, enum act_kind act, float *y, int ldy, const float *x, int ldx,
                int n_rows, int n);
    /* gpt-oss clamped SwiGLU over n_rows rows of n outputs: with g = min(gate, limit) and
     * u = clamp(up, -limit, limit), y[r, j] = (u + 1) * g * sigmoid(alpha * g). gate and up
     * are x[r, j] and x[r, n + j] (halves), or x[r, 2j] and x[r, 2j + 1] (interleaved, as the
     * published fused gate_up_proj rows are). y (stride ldy) does not alias x (stride ldx). */
    void (*glu_clamped)(struct backend *be, float *y, int ldy, const float *x, int ldx,
                        int n_rows, int n, float alpha, float limit, bool interleaved);
    /* x *= a over n_rows rows of n (stride ld). */
    void (*scale)(struct backend *be, float *x, int ld, float a, int n_rows, int n);
    /* x = cap * tanh(x / cap) over n_rows rows of n (stride ld); cap > 0 (Gemma 2's final
     * logit soft-capping). */
    void (*softcap)(struct backend *be, float *x, int ld, float cap, int n_rows, int n);
    /* y += a * x over n_rows rows of n (strides ldy, ldx). */
    void (*axpy)(struct backend *be, float *y, int ldy, float a, const float *x, int ldx,
                 int n_rows, int n);
    /* y[r, :n] += sigmoid(g[r]) * x[r, :n] over n_rows rows (strides ldy, ldx; g dense):
     * a gated residual add (Qwen2-MoE's shared expert). */
    void (*sigmoid_axpy)(struct backend *be, float *y, int ldy, const float *g, const float *x,
                         int ldx, int n_rows, int n);
    /* y[i, :] = x[idx[i] / div, :] for i < n_rows, rows of n (x stride ldx, y dense). */
    void (*gather)(struct backend *be, float *y, const float *x, int ldx, const int32_t *idx,
                   int div, int n_rows, int n);

    /* ---- mixture of experts ---- */
    /* Per token: pick k of n_expert experts from its gate logits [n_tok, n_expert] (ties
     * toward the lower index) into sel [n_tok, k] with weights w [n_tok, k]. jitter: the
     * sparsemixer epsilon. */
    void (*moe_route)(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                      const float *logits, int n_tok, int n_expert, int k, float jitter);
    /* moe_route for the grouped kinds (ROUTER_GROUP_*), with their options p. */
    void (*moe_route_grouped)(struct backend *be, enum router_kind kind, int32_t *sel, float *w,
                              const float *logits, int n_tok, int n_expert, int k,
                              const struct moe_group_params *p);
    /* Group the n_slot = n_tok * k (token, slot) pairs of sel by expert: order [n_slot]
     * lists slot indices expert by expert (ascending within one), offsets [n_expert + 1]
     * delimits each expert's run. */
    void (*moe_group)(struct backend *be, int32_t *order, int32_t *offsets, const int32_t *sel,
                      int n_slot, int n_expert);
    /* Row r of x [n_slot, in] goes through the expert e whose run in offsets contains r,
     * for each of the n_el linears el[i] (all [out, in]; GLU: gate and up):
     * y[r, i * out + j] (stride ldy) = (W_{i,e} x[r, :] (+ b_{i,e}))[j]. */
    void (*linear_experts)(struct backend *be, float *y, int ldy, const float *x,
                           const struct expert_linear *el, int n_el, const int32_t *offsets,
                           int n_expert, int n_slot);
    /* y[order[r] / k, :] += w[order[r]] * x[r, :] for r < n_slot (rows of n, y dense). */
    void (*moe_combine)(struct backend *be, float *y, const float *x, const int32_t *order,
                        const float *w, int k, int n_slot, int n);

    /* y[r, :n] = a[r, :n] * b[r, :n] over n_rows rows (strides ldy, lda, ldb); y may be a or b
     * (same stride): the gates of recurrent mixers. New ops go after this one, before
     * destroy, in the same place of every backend's table (the CUDA table is positional). */
    void (*mul)(struct backend *be, float *y, int ldy, const float *a, int lda, const float *b,
                int ldb, int n_rows, int n);

    /* ---- recurrent layers (ADR 0057): states in a KV_RECURRENT kv_layer, one per sequence ----
     * Row i of a chunk is position rows->pos[i] of the sequence whose state slot is
     * rows->state[i]; one sequence's rows come in position order (other sequences' rows may
     * sit between), and a row at position 0 starts its sequence's state from zero. */
    /* Causal depthwise convolution of n_ch channels, width K, with the carried state st->k
     * (per sequence (K - 1) * n_ch floats: its last K - 1 inputs, oldest first, channel
     * fastest): y[i, c] = b[c] + sum_{j<K} w[c, j] * u(pos_i - K + 1 + j, c), where u(t, c) is
     * the sequence's input at position t (x's row, or the state; 0 before position 0), then
     * silu(y) when silu. w [n_ch, K] and b [n_ch] (NULL / absent: none) are F32. The state
     * ends holding each sequence's last K - 1 inputs. y (stride ldy) may alias x (ldx) only
     * when y == x and ldy == ldx. */
    void (*conv1d)(struct backend *be, float *y, int ldy, const float *x, int ldx,
                   const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
                   const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu);
    /* Mamba's selective scan (transformers MambaMixer.slow_forward) over n_tok rows of d_inner
     * channels of d_state states each, carried in st->v (per sequence d_inner * d_state floats,
     * channel-major: state [c][s]). Per row i and channel c, with delta = softplus(dt[i, c])
     * (identity above 20, as torch's) and A[c, s] = -exp(A_log[c, s]):
     *   h[c, s] = exp(delta * A[c, s]) * h[c, s] + delta * B[i, s] * x[i, c]
     *   y[i, c] = (sum_s h[c, s] * C[i, s] + D[c] * x[i, c]) * silu(z[i, c])
     * A_log [d_inner, d_state] and D [d_inner] (NULL / absent: no skip) are F32; z NULL: no gate.
     * B and C rows share the stride ldbc. d_state <= BACKEND_SCAN_MAX_STATE. y (stride ldy) may
     * alias x (ldx) only when y == x and ldy == ldx. */
    void (*selective_scan)(struct backend *be, float *y, int ldy, const float *x, int ldx,
                           const float *dt, int lddt, const float *B, const float *C, int ldbc,
                           const float *z, int ldz, const struct tensor *A_log,
                           const struct tensor *D, const struct kv_layer *st,
                           const struct kv_rows *rows, int n_tok, int d_inner, int d_state);
    /* The gated delta rule (Qwen3-Next's linear attention; Yang et al. 2024, "Gated Delta
     * Networks") with the carried state st->v: per sequence and value head h a matrix
     * S [k_dim][v_dim] (v_dim fastest; st->v_dim = n_v_head * k_dim * v_dim floats). Row i of
     * x (stride ldx) is q | k | v: n_k_head * k_dim, n_k_head * k_dim, n_v_head * v_dim; value
     * head h reads key head h / (n_v_head / n_k_head). Row i of ab (stride ldab) is
     * b [n_v_head] | a [n_v_head]. Per row and value head:
     *   q = l2norm(q) / sqrt(k_dim), k = l2norm(k)  (l2norm: x / sqrt(sum x^2 + 1e-6))
     *   g = -exp(A_log[h]) * softplus(a + dt_bias[h]), beta = sigmoid(b)
     *   S = S * exp(g);  S += k (beta (v - S^T k))^T;  y = S^T q
     * y[i, h * v_dim + j] (stride ldy) does not alias x or ab. A_log and dt_bias are F32
     * [n_v_head]. */
    void (*gated_delta)(struct backend *be, float *y, int ldy, const float *x, int ldx,
                        const float *ab, int ldab, const struct gdn_params *p,
                        const struct kv_layer *st, const struct kv_rows *rows, int n_tok);
    /* Mamba-2's SSD scan (Dao & Gu 2024, "Transformers are SSMs"), in its recurrent form:
     * for row i of the sequence with state S = st->v + rows->state[i] * v_dim ([n_head]
     * [head_dim][d_state] floats, v_dim their product) and head h of group
     * g = h / (n_head / n_group):
     *   dt  = clamp(softplus(dt[i, h] + dt_bias[h]), dt_min, dt_max)
     *   S[h, p, :] = exp(-exp(a_log[h]) * dt) * S[h, p, :] + dt * x[i, h P + p] * B[i, g, :]
     *   y[i, h P + p] = S[h, p, :] . C[i, g, :] + d[h] * x[i, h P + p]
     * x, B and C are rows of stride ldx (B[i, g, :] at B + i * ldx + g * d_state, C alike;
     * the columns of one xBC buffer), dt rows of stride lddt, y rows of stride ldy (y may
     * be x with ldy == ldx). a_log, d and dt_bias are F32 [n_head] (d NULL / absent: no
     * skip). softplus is torch's (x above 20 passes through). */
    void (*ssd_scan)(struct backend *be, float *y, int ldy, const float *x, const float *B,
                     const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                     const struct tensor *d, const struct tensor *dt_bias,
                     const struct kv_layer *st, const struct kv_rows *rows, int n_tok,
                     const struct ssd_params *p);
    /* Griffin's RG-LRU (RecurrentGemma; De et al. 2024) with the carried state st->v (per
     * sequence `width` floats; st->v_dim == width). Channel c of head h = c / (width / n_head)
     * (block width bw), with x_h the row's bw inputs of head h and torch's softplus:
     *   i = sigmoid(bi[c] + x_h . wi[h, :, c % bw]),  r = sigmoid(ba[c] + x_h . wa[h, :, c % bw])
     *   log_a = -8 r softplus(a_param[c]),  a = exp(log_a)
     *   h[c] = a h[c] + x[i, c] * i * sqrt(1 - exp(2 log_a)),  y[i, c] = h[c]
     * and at position 0: h[c] = x[i, c] * i (no normalization, no past). wi / wa are F32
     * [n_head, bw, bw], bi / ba F32 [width], a_param F32 [width]. y (stride ldy) does not
     * alias x (ldx). */
    void (*rglru)(struct backend *be, float *y, int ldy, const float *x, int ldx,
                  const struct rglru_params *p, const struct kv_layer *st,
                  const struct kv_rows *rows, int n_tok);

    /* Release everything the backend owns, the struct included (backend_free). */
    void (*destroy)(struct backend *be);

    /* ---- graphs (optional: NULL where the backend has none; ADR 0024) ----
     * graph_begin starts recording: the ops issued until graph_end are recorded, not run.
     * graph_end stops and returns a replayable graph of them, or NULL when they could not be
     * recorded (a download, a scratch buffer that had to grow, a failing op): then nothing
     * ran, no error stays recorded, and the caller issues the ops again to run them.
     * graph_launch runs a graph: the same ops with the same arguments (pointers, sizes), on
     * whatever backend memory holds at that moment, so per-step inputs (ids, positions,
     * slots, block tables) are uploaded into the same buffers before each launch. A graph
     * is valid while every buffer it names is; graph_free releases it (NULL: no-op). */
    void (*graph_begin)(struct backend *be);
    void *(*graph_end)(struct backend *be);
    void (*graph_launch)(struct backend *be, void *graph);
    void (*graph_free)(struct backend *be, void *graph);

    /* ---- description (optional: NULL where the backend has none) ----
     * The plan of a prepared weight's linear products: which kernel runs each bucket of
     * token counts (`mlxcel inspect --kernels`; the CPU's linear_plan.h). 0, or -ERR_*. */
    int (*linear_plan)(struct backend *be, const struct tensor *w, struct linear_plan_info *out);

    /* ---- parameterized activations ---- */
    /* x = xIELU(x) over n_rows rows of n (stride ld), with p's constants (host memory, read
     * at the call): alpha_p x² + beta x where x > 0, else (expm1(min(x, eps)) - x) alpha_n +
     * beta x (Apertus). */
    void (*xielu)(struct backend *be, float *x, int ld, int n_rows, int n,
                  const struct xielu_params *p);
    /* ---- Llama 4 (appended) ---- */
    /* Attention temperature of a NoPE layer (arXiv 2501.19399): row i of x (n_tok rows of n,
     * stride ld) times 1 + attn_scale * ln(floor((rows->pos[i] + 1) / floor_scale) + 1), the
     * factor computed in double. floor_scale >= 1. */
    void (*attn_temp)(struct backend *be, float *x, int ld, int n_tok, int n,
                      const struct kv_rows *rows, int floor_scale, float attn_scale);
    /* Routing weights applied to what enters an expert instead of what leaves it: for
     * r < n_slot, x[r, :n] (dense rows) *= w[order[r]], then w[order[r]] = 1, so that
     * moe_combine adds the expert outputs unweighted. order is moe_group's permutation of the
     * slots (each weight is read and reset by one row only). */
    void (*moe_weight_input)(struct backend *be, float *x, const int32_t *order, float *w,
                             int n_slot, int n);
    /* ---- device-side expert dispatch (appended; optional: NULL) ---- */
    /* After model_prepare, once per expert_linear of a layer: the backend may describe el's
     * n_expert prepared views to its own memory, so that linear_experts finds a slot's expert
     * there without the host (ADR 0143). Not called while a graph records. 0, or -ERR_*. */
    int (*prepare_experts)(struct backend *be, const struct expert_linear *el, int n_expert,
                           struct err *e);
};

struct backend {
    const struct backend_ops *ops;
    const char *name;       /* "cpu-avx512", "cpu-avx2", "cpu-scalar", "cuda" */
    int n_threads;
    /* linear_experts runs all experts' rows in one dispatch when every expert has few
     * rows (decode); false forces one linear per expert (backend_opts.fused_moe). */
    bool fused_moe;
    /* model_forward records decode steps as graphs and replays them (graph_* set; the
     * CUDA backend unless backend_opts.cuda_graphs is off). */
    bool graphs;
    /* KV cache element types its kv_store and attention take: bit 1 << dtype (F32 always). */
    unsigned kv_dtypes;
    /* --fast (backend_opts.fast) is in effect: some products take x at 8 significant bits per group
     * (CPU, affine 4-bit on AVX2 / AVX-512); false where the backend has no such form. */
    bool fast;
    void *impl;             /* owned by the backend */
};

/* Whether be is the CPU backend (any ISA): its compute runs on the host's cores and reads
 * the weights in host memory. */
static inline bool backend_is_cpu(const struct backend *be)
{
    return strncmp(be->name, "cpu", 3) == 0;
}

/* What the weights copied into the CPU backend's own memory at load are (--mmap / --no-mmap). */
enum backend_copy {
    BACKEND_COPY_AUTO = 0,  /* up to 3/4 of the memory available at creation, the rest mapped
                             * (ADR 0037) */
    BACKEND_COPY_NONE = 1,  /* --mmap: every weight read through the file mapping */
    BACKEND_COPY_ALL = 2,   /* --no-mmap: every weight copied, whatever the memory */
};

/* The options of a backend, set by the caller (the CLI's one config reader, src/cli/config.c,
 * or a test) and never read from the environment by the library (ADR 0056). Start from
 * BACKEND_OPTS_DEFAULT; a NULL options pointer means the defaults. Fields a backend has no
 * use for are ignored (the CPU reads no cuda_*, CUDA reads no isa, copy, repack, fast). */
struct backend_opts {
    const char *isa;        /* CPU ISA: NULL or "auto" the best this CPU and build run, else
                             * "scalar", "avx2", "avx512" (a "cpu-<isa>" device name wins) */
    enum backend_copy copy; /* CPU: the weight copy budget (--mmap / --no-mmap) */
    bool repack;            /* CPU: repack weights into the kernels' layouts at load (on) */
    bool fused_moe;         /* one dispatch for all experts' rows at decode (on) */
    bool fast;              /* --fast: 4-bit products take x at 8 bits per group (off) */
    const char *cuda_plugin;/* path of libmlxcel-cuda.so; NULL: beside the executable. The
                             * plugin is loaded once per process: the first call's path wins */
    /* CUDA code-path switches (developer options: MLXCEL_CUDA_* in the CLI, ADR 0056) */
    bool cuda_qi;           /* integer (dp4a) GEMV for 4-bit decode (on; ADR 0026) */
    int cuda_qi_min_rows;   /* ... for launches of at least this many rows (12288); fewer, the
                             * f32 GEMV, faster there on the H100 */
    bool cuda_pdl;          /* programmatic dependent launch (off) */
    bool cuda_attn_split;   /* decode attention split over a cluster of blocks (on; ADR 0028) */
    bool cuda_attn_flash;   /* ... split along the keys, K/V read once per KV group (on; off:
                             * ADR 0028's cluster per query head; ADR 0105) */
    bool cuda_attn_fa2;     /* prefill attention with scores and outputs in registers: F16 /
                             * BF16 caches, F32 ones from head size 64 (on; off: ADR 0054's
                             * kernel; ADR 0146) */
    bool cuda_graphs;       /* record and replay decode steps as CUDA graphs (on; ADR 0024) */
    bool cuda_mma;          /* affine 4/8-bit products of > 8 rows on tensor cores over the
                             * codes (on; off: the decoded bf16 planes of ADR 0054; ADR 0074) */
    int cuda_mma_max_tokens;/* ... of at most this many rows (128); larger ones, the planes */
    bool cuda_chunked;      /* long runs of ssd_scan / gated_delta rows in the chunked forms
                             * (on; off: the recurrence for every row; ADR 0132) */
    bool cuda_moe_dev;      /* decode's expert products find their experts on the device (on;
                             * off: the offsets come back to the host; ADR 0143) */
    bool cuda_mmq;          /* affine 4/8-bit products past cuda_mma_max_tokens rows (or all of
                             * them with cuda_mma off) on int8 tensor cores, x in two int8 limbs
                             * (off: the planes; ADR 0147) */
};

/* Products of up to 128 rows run faster over the codes, longer ones on the planes (H100,
 * docs/benchmarks.md, ADR 0074) */
#define BACKEND_OPTS_MMA_MAX_TOKENS 128
/* One token's integer 4-bit GEMV wins from about 12k rows a launch (H100, ADR 0026) */
#define BACKEND_OPTS_QI_MIN_ROWS 12288

/* The defaults of every option, as an initializer: struct backend_opts o = BACKEND_OPTS_DEFAULT; */
#define BACKEND_OPTS_DEFAULT                                                                 \
    {.isa = NULL, .copy = BACKEND_COPY_AUTO, .repack = true, .fused_moe = true, .fast = false, \
     .cuda_plugin = NULL, .cuda_qi = true, .cuda_qi_min_rows = BACKEND_OPTS_QI_MIN_ROWS, .cuda_pdl = false, .cuda_attn_split = true,       \
     .cuda_attn_flash = true, .cuda_attn_fa2 = true, .cuda_graphs = true, .cuda_mma = true, .cuda_mma_max_tokens = BACKEND_OPTS_MMA_MAX_TOKENS, \
     .cuda_chunked = true, .cuda_moe_dev = true, .cuda_mmq = false}

/* The backend called name: "cpu" (or NULL: the CPU at o->isa), "auto" (a usable CUDA GPU,
 * else the CPU), "cpu-scalar", "cpu-avx2", "cpu-avx512" to force an ISA, "cuda" / "cuda:N";
 * n_threads <= 0: online CPUs; o NULL: BACKEND_OPTS_DEFAULT. */
int backend_new(struct backend **out, const char *name, int n_threads, const struct backend_opts *o,
                struct err *e);
/* CPU backend on a new thread pool of n_threads (<= 0: online CPUs).
 * isa: NULL (o->isa, else auto), "auto", "scalar", "avx2" or "avx512"; o NULL: the defaults. */
int backend_cpu_new(struct backend **out, int n_threads, const char *isa, const struct backend_opts *o,
                    struct err *e);
/* be->ops->linear_plan, or -ERR_UNSUPPORTED where the backend has none. */
static inline int backend_linear_plan(struct backend *be, const struct tensor *w,
                                      struct linear_plan_info *out)
{
    return be->ops->linear_plan ? be->ops->linear_plan(be, w, out) : -ERR_UNSUPPORTED;
}
/* Free any backend (NULL is a no-op). */
void backend_free(struct backend *be);
/* backend->ops->sync with a NULL check: 0, or the first error recorded since the last sync. */
int backend_sync(struct backend *be, struct err *e);

#ifdef __cplusplus
}
#endif
