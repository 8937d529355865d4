/*
 * tp: tensor parallelism (ADR 0139). A model split over n ranks, Megatron style: each rank
 * holds its share of every split block's weights and runs the family forward on them; the
 * partial sums of a split block's output meet in an all-reduce, after which every rank holds
 * the same residual stream.
 *
 *   attention  heads split: q (and Qwen3-Next's output gate) rows of the rank's heads, k / v
 *              rows of their KV heads (one KV head on each of n / n_kv_head ranks when there
 *              are fewer KV heads than ranks, as vLLM replicates them), per-head norms and
 *              sinks sliced, o columns; each rank caches the K/V of its own heads; a norm over
 *              the whole q / k width (OLMo 2) over rows gathered from the ranks
 *   latent     MLA by heads: the per-head products and o's columns; the latent row (and so
 *              its cache) replicated
 *   FFN        dense GLU / MLP: gate / up rows, down columns; MoE: every expert's rows and
 *              columns the same way (the router replicated), the shared expert too
 *   LM head    by vocabulary: each rank its rows' logits, gathered into the context's rows
 *   Mamba-2    by heads: their channels of the input projection (z, x, dt; B / C of their
 *              groups), of the convolution, A, D, the norm (one group: the whole weight, over
 *              gathered rows); ssm_out's columns; each rank keeps the states of its heads
 *   DeltaNet   by value heads and their key heads: q | k | v rows and conv channels, z, b, a,
 *              A_log, dt bias; ssm_out's columns; each rank its heads' states
 *   short conv LFM2's, by channels: B | C | x rows, the convolution, out_proj's columns
 *   Mamba      by channels: x / z rows, the convolution, x_proj's columns (dt / B / C partial
 *              sums all-reduced), dt_proj's rows, A, D; out_proj's columns
 *   RG-LRU     Griffin's, by heads: linear_y / linear_x rows, the convolution, the per-head
 *              gates, a; linear_out's columns
 *   the rest   replicated: embeddings, norms, and any block whose shapes do not split evenly
 *              (heads, widths, quantization groups of the column-split weights)
 *   biases     of column-split products (o, down, the mixers' out projections) on rank 0 alone
 *
 * A split block's output is summed over the ranks in rank order, so every rank holds the same
 * bits afterwards (replicated blocks then compute the same values everywhere). This file's
 * all-reduce is the in-process one: one thread per rank, a barrier, each rank summing the
 * published partials through its own backend's ops; the ranks' memory must be one every rank's
 * backend addresses (CPU ranks, or CUDA ranks on one GPU).
 *
 * Order: model_load, model_tp_split, model_tp_prepare (instead of model_prepare), then
 * model_ctx_new and kv_cache_new of the split model as usual: the context runs one rank
 * context per rank, the cache keeps every rank's K/V (kv_cache.layers, rank-major).
 */
#pragma once
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TP_MAX_RANKS 8

struct model_tp {
    int n_rank;
    struct model *rank[TP_MAX_RANKS];   /* the shards, owned (views into the model's weights
                                         * where replicated, owned copies where split) */
    struct backend *be[TP_MAX_RANKS];   /* each rank's backend (model_tp_prepare), borrowed */
    bool attn_split;                    /* attention layers split by heads */
    int n_ffn_split;                    /* layers whose FFN is split */
    bool rec_split;                     /* the recurrent mixers split (Mamba-2, DeltaNet by heads,
                                         * short convolutions by channels) */
    bool head_split;                    /* the LM head split by vocabulary: rank r's logits are
                                         * columns [vocab0[r], vocab0[r] + n_vocab_r[r]) */
    int vocab0[TP_MAX_RANKS], n_vocab_r[TP_MAX_RANKS];
};

/* Split m (loaded, not prepared) over n_rank ranks (2..TP_MAX_RANKS) into m->tp.
 * -ERR_UNSUPPORTED for a family with a forward of its own that does not all-reduce the split
 * blocks (neither decoder_forward nor model_ops.tp_reduces), a model with an image tower;
 * -ERR_ARG for a prepared model, a split one or a bad count; -ERR_NOMEM. */
int model_tp_split(struct model *m, int n_rank, struct err *e);

/* Prepare each rank's weights for its backend be[r] (distinct backends of one kind: CPU, or
 * CUDA on one GPU). The split model itself computes nothing. -ERR_UNSUPPORTED for ranks of
 * different backends, -ERR_ARG for two ranks on one backend. */
int model_tp_prepare(struct model *m, struct backend *const *be, struct err *e);

/* Free m->tp (model_free calls it). */
void model_tp_free(struct model_tp *tp);

/* The rank contexts of a context of a split model (model_ctx_new). */
int model_tp_ctx_new(struct model_ctx *c, struct err *e);
void model_tp_ctx_free(struct model_ctx *c);

/* One forward chunk on every rank: rank r with the KV layers rank_kv + r * n_layer; rank 0's
 * logits (and hidden states) land in c->bufs. */
int model_tp_forward(struct model_ctx *c, const struct fwd_chunk *ch, const struct kv_layer *rank_kv,
                     struct err *e);

/* How many ranks of c's group share each KV head (a split model with fewer KV heads than
 * ranks); 1 outside a rank context. */
int model_tp_kv_per(const struct model_ctx *c);

/* In a rank's forward: buf [n, n_embd] becomes the sum of every rank's buf (rank order). A
 * no-op outside a split model's rank context. */
void model_tp_reduce(const struct model_ctx *c, float *buf, int n);
/* The same for a dense buf [n, cols], cols <= n_embd (Mamba's x_proj partial sums). */
void model_tp_reduce_cols(const struct model_ctx *c, float *buf, int n, int cols);

/* The RMS norm of n rows whose columns are spread over the ranks: rank r holds columns
 * [(r / per) cols, (r / per + 1) cols) of each row in y (stride ldy; per ranks hold the same
 * columns, as KV heads replicated over ranks); the norm runs over the whole row, as the
 * unsplit model's does (w: the whole row's weight, used as w + w_off), and each rank keeps its
 * columns of the result (the rows gathered on every rank: Mamba-2's one-group gated norm,
 * OLMo 2's q / k norm). Outside a rank context: the rmsnorm op over y's cols columns. */
void model_tp_rmsnorm_full(const struct model_ctx *c, float *y, int ldy, int cols, int per,
                           const struct tensor *w, float w_off, float eps, int n);

#ifdef __cplusplus
}
#endif
