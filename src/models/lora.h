/*
 * lora: low-rank adapters (LoRA; Hu et al. 2021) over a loaded base model, applied unmerged at
 * run time so that several adapters share one base and each sequence of a batch picks its own
 * (ADR 0103).
 *
 * Two on-disk layouts are read, both a folder (or its safetensors file) with adapter_config.json:
 *   mlx-lm  adapters.safetensors: model.layers.N.<grp>.<proj>.lora_a [in, r], .lora_b [r, out];
 *           config fine_tune_type, num_layers (the last ones), lora_parameters {rank, scale,
 *           dropout, keys}; y = W x + scale · (x lora_a) lora_b (mlx_lm/tuner/lora.py LoRALinear)
 *   PEFT    adapter_model.safetensors: base_model.model.model.layers.N.<grp>.<proj>.lora_A.weight
 *           [r, in], .lora_B.weight [out, r]; config r, lora_alpha, target_modules, use_rslora;
 *           y = W x + s · B (A x), s = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
 *           (peft/tuners/lora/layer.py LoraLayer.update_layer)
 * Both become one canonical form: per layer and targeted linear, A [r, in] and B [out, r] in F32
 * with the adapter's scale s kept apart (B is not pre-scaled, so a user scale multiplies s as
 * llama.cpp's --lora-scaled does). Dropout is ignored (inference).
 *
 * The linears an adapter may target are those blk_attention, blk_glu and blk_mlp run (q, k, v or
 * fused qkv, o, gate, up or fused gate_up, down) in decoder families' attention layers and dense
 * FFNs; DoRA, embeddings, lm_head, experts, latent attention and recurrent mixers are refused.
 *
 * Run time. A context holds a set of adapters (model_ctx_set_lora) and each forward chunk stages
 * its rows' scales (lora_stage: row i of a sequence using adapter a at user scale u gets
 * u · s_a; 0 for the others). Every targeted product then adds, per active adapter,
 *   t = x Aᵀ [n, r];  t *= S_a (the row's scale, per row);  y += t Bᵀ
 * with the existing backend ops linear, mul and axpy (the low-rank part in f32 whatever the
 * base's dtype or quantization; the base product untouched). A row whose scale is 0 gets
 * exactly 0 added, so each row equals its sequence run alone.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/tensor.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LORA_MAX_RANK 1024      /* largest r accepted (published adapters use 4..256) */
#define LORA_MAX_ADAPTERS 32    /* adapters one context holds */
#define LORA_CONFIG_MAX (1u << 20) /* bytes of adapter_config.json read */
#define LORA_MAX_SCALE 1e4f     /* |user scale| accepted (llama.cpp takes any float; a bound
                                 * keeps the products finite) */

/* The linears of a layer an adapter may target (blocks.c's products). */
enum lora_slot {
    LORA_WQ = 0, LORA_WK = 1, LORA_WV = 2, LORA_WQKV = 3, LORA_WO = 4,
    LORA_GATE = 5, LORA_UP = 6, LORA_GATE_UP = 7, LORA_DOWN = 8,
    LORA_N_SLOTS = 9
};

/* One targeted linear: A [r, in] and B [out, r], F32 (a.ndim == 0: not targeted). */
struct lora_delta {
    struct tensor a, b;
};

/* A loaded adapter: immutable once prepared; owned by whoever loaded it (lora_free). */
struct lora_adapter {
    char path[4096];
    const char *format;          /* "mlx" or "peft" */
    int rank;
    float scale;                 /* the adapter's own: mlx's scale, alpha / r, alpha / sqrt(r) */
    int n_layer;
    struct lora_delta *d;        /* [n_layer][LORA_N_SLOTS] */
    float *store;                /* every a and b's floats, owned */
    int max_out;                 /* widest targeted linear's out */
    int n_targets;               /* targeted linears */
};

/* Load the adapter at path (a folder holding adapter_config.json and adapters.safetensors or
 * adapter_model.safetensors, or one of those files) for base model m, checking every tensor
 * against m: -ERR_FORMAT / -ERR_CONFIG / -ERR_UNSUPPORTED / -ERR_MISSING with e naming the file
 * and the tensor or field (DoRA, unsupported targets, rank or shape mismatches, non-finite
 * values, ranks out of bounds). *out is the caller's (lora_free). */
int lora_load(struct lora_adapter **out, const struct model *m, const char *path, struct err *e);
void lora_free(struct lora_adapter *a);

/* Prepare the adapter's matrices for backend be (a GPU uploads them; they live as long as be).
 * Once per adapter and backend, before a context uses it. */
int lora_prepare(struct lora_adapter *a, struct backend *be, struct err *e);

/* The base tensor of layer L a slot targets (absent when the layer has none). */
const struct tensor *lora_slot_tensor(const struct layer *L, enum lora_slot s);
/* The checkpoint name of a slot's module ("q_proj", "gate_up_proj", ...). */
const char *lora_slot_name(enum lora_slot s);

/* Per-context run state (model_ctx.lora): the adapters a context serves, scratch, and the
 * current chunk's per-row scales. Opaque outside lora.c / context.c. */
struct lora_run;

/* Give context c the n adapters ad (borrowed, prepared for c->be; n == 0: none). The index of
 * an adapter in ad is its id in batches (batch.lora). -ERR_ARG / -ERR_NOMEM. */
int model_ctx_set_lora(struct model_ctx *c, struct lora_adapter *const *ad, int n, struct err *e);
/* Adapters c serves. */
int model_ctx_n_lora(const struct model_ctx *c);
/* The user scales of rows whose batch gives none (batch.lora NULL): scale[i] for adapter i
 * (llama-server's global scales; 1 after model_ctx_set_lora, 0 leaves the base alone).
 * -ERR_ARG for a count that is not the context's, -ERR_RANGE for a non-finite or |scale| >
 * LORA_MAX_SCALE. */
int model_ctx_set_lora_scales(struct model_ctx *c, const float *scale, int n, struct err *e);
/* Adapter i's global scale (0 when there is none). */
float model_ctx_lora_scale(const struct model_ctx *c, int i);
void lora_run_free(struct lora_run *r, struct backend *be);

/* Stage the scales of rows [0, n) of a chunk: row i takes scale[seq[i] * n_lora + a] (times the
 * adapter's own) for adapter a; scale NULL: every row the context's global scales. Uploads
 * what the rows use; returns whether any is active (false: the chunk runs the base alone). */
bool lora_stage(struct lora_run *r, struct backend *be, const int32_t *seq, int n,
                const float *scale, int n_lora);

/* y[n, out] (stride ldy) += every active adapter's delta of base tensor w (a slot of layer L)
 * over x [n, in] (dense). No-op when r is NULL, nothing is active, or no adapter targets w. */
void lora_apply(struct backend *be, const struct lora_run *r, float *y, int ldy, const float *x,
                const struct layer *L, const struct tensor *w, int n);

/* Merge the adapter into float weights: w [out, in] F32 (host) += scale · s · B A, in double
 * accumulation (mlx_lm fuse: weight + (scale · Bᵀ) @ Aᵀ). For `mlxcel convert --fuse-lora`. */
void lora_merge_into(const struct lora_delta *d, float scale, float *w, int out, int in);

/* The merged weights of n adapters (ad[k] at user scale scale[k]) over float base m: one F32
 * copy W + sum_k scale_k s_k B_k A_k per targeted tensor, found by its checkpoint name
 * (lora_fused_find, convert_opts.replace). -ERR_UNSUPPORTED for a quantized base or a weight
 * map_weights rearranged (the stored tensor is not the product's weight). */
struct lora_fused;
int lora_fused_new(struct lora_fused **out, const struct model *m, struct lora_adapter *const *ad,
                   const float *scale, int n, struct err *e);
const float *lora_fused_find(void *ud, const char *name);
void lora_fused_free(struct lora_fused *f);

#ifdef __cplusplus
}
#endif
