/*
 * model: a loaded checkpoint in the canonical layout, the family interface
 * (struct model_ops), and the per-request context that runs it.
 *
 * Loading: config.json -> registry lookup -> ops->parse_config (hparams) ->
 * hparams_validate -> st_set_open -> ops->map_weights, which binds every
 * canonical slot below to a view of a checkpoint tensor (checking its shape)
 * and is the only place checkpoint names appear. Forward code only ever sees
 * the canonical layout. A loaded model is immutable and may be shared by
 * several contexts; it owns the st_set (the mmaps) and the layer array.
 *
 * Canonical layout, per layer (absent tensors have ndim == 0):
 *   attn_norm[_b]   [n_embd]                norm before attention (and the FFN
 *                                           when parallel_residual)
 *   ffn_norm[_b]    [n_embd]                norm before the FFN (sequential blocks)
 *   wq/wk/wv        [n_head*head_dim | n_kv_head*head_dim, n_embd]   or
 *   wqkv            [(n_head + 2 n_kv_head) * head_dim, n_embd]  (fused)
 *   bq/bk/bv, bqkv  biases of the above
 *   wo, bo          [n_embd, n_head*head_dim]
 *   q_norm, k_norm  [head_dim]
 *   dense FFN: up/gate/down (+ biases), or gate_up fused [2 n_ff, n_embd]
 *   MoE: router [n_expert, n_embd] and struct experts (one view per expert).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/err.h"
#include "../core/safetensors.h"
#include "../core/tensor.h"
#include "../kernels/backend.h"
#include "hparams.h"

#ifdef __cplusplus
extern "C" {
#endif

/* E linears of one shape: views into a stacked [E, out, in] tensor or into
 * per-expert tensors; no copies either way. */
struct expert_linear {
    struct tensor *w;   /* [n_expert] views, each [out, in] */
    struct tensor *b;   /* [n_expert] views [out], or NULL */
};

struct experts {
    struct expert_linear up;    /* fc1 / w3: [n_ff, n_embd] */
    struct expert_linear gate;  /* w1: [n_ff, n_embd]; unused for FFN_MLP */
    struct expert_linear down;  /* fc2 / w2: [n_embd, n_ff] */
};

struct layer {
    struct tensor attn_norm, attn_norm_b;
    struct tensor ffn_norm, ffn_norm_b;
    struct tensor wq, wk, wv, wqkv;
    struct tensor bq, bk, bv, bqkv;
    struct tensor wo, bo;
    struct tensor q_norm, k_norm;
    struct tensor up, gate, down, gate_up;
    struct tensor up_b, down_b;
    struct tensor router;
    struct experts ex;
};

struct generation_defaults {
    float temperature;   /* < 0: not given */
    float top_p;
    int top_k;
    float min_p;
    float repeat_penalty;
};

struct model;
struct model_ctx;
struct expert_stack_rule;  /* src/loading/convert.h */

struct model_ops {
    const char *family;       /* our family name, e.g. "llama" */
    const char *description;  /* one line for `mlxcel arch` */
    const char *const *architectures;  /* config "architectures" names, NULL-terminated */
    /* config.json -> hparams (hparams_init already ran). */
    int (*parse_config)(struct hparams *hp, const cJSON *cfg, struct err *e);
    /* Bind canonical slots of m (m->hp is final) to tensors of st. */
    int (*map_weights)(struct model *m, struct st_set *st, struct err *e);
    /* Runs n_tok tokens; see model_forward. */
    int (*forward)(struct model_ctx *c, const int32_t *ids, int n_tok, float *logits,
                   bool all_logits, struct err *e);
    /* Family unit tests (config parsing, mapping, block contracts); 0 on success. */
    int (*self_test)(struct err *e);
    /* mlx-lm's sanitize of per-expert tensors into stacked ones, for `mlxcel convert`
     * and `synth -q`; NULL-terminated, or NULL for dense families. */
    const struct expert_stack_rule *expert_stacking;
    /* Where map_weights accepts two layouts, name suffixes of the one published
     * checkpoints use (e.g. fused ".qkv_proj.weight"), for `mlxcel synth`; or NULL. */
    const char *const *synth_prefer;
};

struct model {
    struct hparams hp;
    const struct model_ops *ops;
    struct st_set *st;               /* owns the mmaps */
    struct generation_defaults gen;
    char dir[4096];
    struct tensor tok_embd;          /* [n_vocab, n_embd] */
    struct tensor out_norm, out_norm_b;  /* [n_embd] */
    struct tensor lm_head, lm_head_b;    /* [n_vocab, n_embd], [n_vocab] */
    struct layer *layers;            /* [n_layer], owned */
    struct tensor *expert_views;     /* backing store of every expert_linear, owned */
    size_t n_expert_views, expert_views_used;
};

/* Load the checkpoint in dir. */
int model_load(struct model **out, const char *dir, struct err *e);
void model_free(struct model *m);
/* Parameter count (elements of every consumed tensor; quantized counted unpacked). */
int64_t model_n_params(const struct model *m);
/* Bytes of weights (as stored). */
uint64_t model_weight_bytes(const struct model *m);
/* KV-cache bytes per token of context. */
uint64_t model_kv_bytes_per_token(const struct model *m);

/* Activation buffers, carved out of one arena at context creation.
 * B = n_batch (tokens per internal forward chunk). */
struct ctx_bufs {
    float *x;        /* [B, n_embd] residual stream */
    float *xn;       /* [B, n_embd] normalized input of a block */
    float *q;        /* [B, n_head*head_dim] */
    float *qkv;      /* [B, (n_head + 2 n_kv_head) * head_dim] fused projection */
    float *att;      /* [B, n_head*head_dim] attention output before wo */
    float *o;        /* [B, n_embd] attention block output */
    float *f;        /* [B, n_embd] FFN block output */
    float *h1;       /* [B, n_ff] FFN hidden */
    float *h2;       /* [B, 2 n_ff] second FFN hidden / fused gate_up output */
    float *router;   /* [B, n_expert] gate logits */
    int *sel;        /* [B, n_expert_used] chosen experts */
    float *sel_w;    /* [B, n_expert_used] their weights */
    int *order;      /* [B * n_expert_used] (token, slot) pairs grouped by expert */
    float *xg, *yg;  /* [B, n_embd] gathered rows of one expert */
    float *inv_freq;      /* [n_rot / 2] */
    float *inv_freq_long; /* [n_rot / 2] longrope long factors */
};

/* Per-request state: KV cache, activations (allocated once), backend. */
struct model_ctx {
    const struct model *m;
    struct backend *be;              /* borrowed */
    int n_ctx;                       /* cache capacity in tokens */
    int n_batch;                     /* max tokens per internal forward chunk */
    int pos;                         /* tokens in the cache */
    float *k_cache, *v_cache;        /* [n_layer, n_ctx, n_kv_head*head_dim], owned */
    void *arena;                     /* backing store of bufs, owned */
    struct ctx_bufs bufs;
    bool fused_moe;                  /* single-token MoE fast path ($MLXCEL_FUSED_MOE, default on) */
};

/* n_ctx <= 0: the model's context length. */
int model_ctx_new(struct model_ctx **out, const struct model *m, struct backend *be, int n_ctx,
                  struct err *e);
void model_ctx_free(struct model_ctx *c);
/* Forget the cache (pos = 0). */
void model_ctx_reset(struct model_ctx *c);

/* Run n_tok tokens starting at c->pos and append them to the cache.
 * logits: [n_tok, n_vocab] when all_logits, else [n_vocab] for the last token.
 * Errors: ids out of range, or the cache would overflow (-ERR_RANGE). */
int model_forward(struct model_ctx *c, const int32_t *ids, int n_tok, float *logits,
                  bool all_logits, struct err *e);

#ifdef __cplusplus
}
#endif
