/*
 * model: a loaded checkpoint in the canonical layout, the family interface
 * (struct model_ops), and the activation context (model_ctx) that runs it.
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
 *   attn_post_norm, ffn_post_norm [n_embd]  norms of the attention / FFN outputs
 *                                           (RESID_SANDWICH)
 *   wq/wk/wv        [n_head*head_dim | n_kv_head*head_dim, n_embd]   or
 *   wqkv            [(n_head + 2 n_kv_head) * head_dim, n_embd]  (fused)
 *   bq/bk/bv, bqkv  biases of the above
 *   wo, bo          [n_embd, n_head*head_dim]
 *   q_norm, k_norm  [head_dim]
 *   sinks           [n_head] attention sink logits (layer_spec.sinks)
 *   dense FFN: up/gate/down (+ biases), or gate_up fused [2 n_ff, n_embd]
 *   MoE: router [n_expert, n_embd] (+ router_b [n_expert]: gpt-oss's bias on the logits; for
 *        DeepSeek's grouped routers a correction bias used only for the choice) and struct
 *        experts (one view per expert).
 *   MLA (KV_LATENT layers): wq [n_head * (nope + rope), q_lora_rank or n_embd], wq_a
 *        [q_lora_rank, n_embd] and q_a_norm [q_lora_rank] when q is low-rank; wkv_a
 *        [kv_lora_rank + rope, n_embd], kv_a_norm [kv_lora_rank]; from kv_b_proj, per head:
 *        wk_lat [n_head, kv_lora_rank, nope] (its k rows transposed: q_nope -> latent) and
 *        wv_lat [n_head, v_head_dim, kv_lora_rank + rope] (its v rows, zero past the latent);
 *        wo [n_embd, n_head * v_head_dim].
 *   Recurrent mixers (KV_RECURRENT layers; each family's file says which it binds):
 *        ssm_in [proj, n_embd] (+ ssm_in_b) the input projection (Mamba's in_proj: x | z, Mamba-2's
 *        z | xBC | dt, LFM2's B | C | x, the delta rule's q | k | v | z), ssm_x a second input
 *        projection (Mamba's x_proj, the delta rule's b | a), ssm_dt / ssm_dt_b Mamba's
 *        dt_proj or the per-head dt bias, ssm_conv [channels, d_conv] and ssm_conv_b the
 *        depthwise convolution (F32: model_widen_f32), ssm_a A_log, ssm_d the D skip,
 *        ssm_norm the gated norm, ssm_out [n_embd, inner] (+ ssm_out_b) the output projection.
 *        Mamba (MIXER_MAMBA) splits x_proj [dt_rank + 2 d_state, inner] by rows: ssm_x its
 *        dt_rank rows, ssm_xbc its B | C rows (views); ssm_dt_norm [dt_rank], ssm_b_norm and
 *        ssm_c_norm [d_state] are Jamba's RMSNorms of dt, B and C (absent: none).
 *        The gated delta rule (blocks_gdn.c): ssm_in [q | k | v rows], ssm_z the output gate's
 *        projection [value dim, n_embd], ssm_x b [value heads, n_embd], ssm_xa a (the decay's
 *        input) [value heads, n_embd], ssm_dt_b dt_bias, ssm_a A_log, ssm_conv [q|k|v channels,
 *        d_conv], ssm_norm [value head dim].
 *   wq_gate [n_head * head_dim, n_embd]: an attention output gate, o = wo(att * sigmoid(wq_gate
 *        x)) (layer_spec.attn_gate; Qwen3-Next's q_proj rows split into wq and wq_gate).
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

struct experts {
    struct expert_linear up;    /* fc1 / w3: [n_ff, n_embd] */
    struct expert_linear gate;  /* w1: [n_ff, n_embd]; unused for FFN_MLP */
    struct expert_linear down;  /* fc2 / w2: [n_embd, n_ff] */
    struct expert_linear gate_up; /* fused [2 n_ff, n_embd], gate / up rows interleaved
                                   * (gpt-oss; FFN_GLU_CLAMPED), else absent (w NULL) */
};

/* The tensor slots of a layer, as an X-macro so that code visiting every
 * weight (prepare_weights) cannot miss one. */
#define LAYER_TENSORS(X) \
    X(attn_norm) X(attn_norm_b) X(ffn_norm) X(ffn_norm_b) X(attn_post_norm) X(ffn_post_norm) \
    X(wq) X(wk) X(wv) X(wqkv) X(bq) X(bk) X(bv) X(bqkv) X(wo) X(bo) \
    X(q_norm) X(k_norm) X(sinks) \
    X(up) X(gate) X(down) X(gate_up) X(up_b) X(down_b) X(router) X(router_b) \
    X(shexp_gate) X(shexp_up) X(shexp_down) X(shexp_inp_gate) \
    X(wq_a) X(q_a_norm) X(wkv_a) X(kv_a_norm) X(wk_lat) X(wv_lat) \
    X(ssm_in) X(ssm_in_b) X(ssm_x) X(ssm_dt) X(ssm_dt_b) X(ssm_conv) X(ssm_conv_b) X(ssm_a) \
    X(ssm_d) X(ssm_norm) X(ssm_out) X(ssm_out_b) \
    X(ssm_xbc) X(ssm_dt_norm) X(ssm_b_norm) X(ssm_c_norm) X(wq_gate) X(ssm_z) X(ssm_xa) \
    X(gate_b) X(rg_y) X(rg_y_b) X(rg_wi) X(rg_bi) X(rg_wa) X(rg_ba) X(rg_a)

/* The slots of LAYER_TENSORS that only linear products read (prepare_weight's PREP_MATRIX). */
#define LAYER_MATRICES(X) \
    X(wq) X(wk) X(wv) X(wqkv) X(wo) X(up) X(gate) X(down) X(gate_up) X(router) \
    X(shexp_gate) X(shexp_up) X(shexp_down) X(shexp_inp_gate) X(wq_a) X(wkv_a) X(wk_lat) X(wv_lat) \
    X(ssm_in) X(ssm_x) X(ssm_dt) X(ssm_out) X(ssm_xbc) X(wq_gate) X(ssm_z) X(ssm_xa) X(rg_y)

struct layer {
#define LAYER_FIELD(name) struct tensor name;
    LAYER_TENSORS(LAYER_FIELD)
#undef LAYER_FIELD
    struct experts ex;
    /* MLA: per head h, mla_heads[4 h ..]: wq's q_nope rows, wq's q_pe rows, wk_lat[h],
     * wv_lat[h] (views; storage in model.derived), or NULL */
    struct tensor *mla_heads;
    /* ACT_XIELU layers: the activation's constants, computed at load from the layer's
     * act_fn.{alpha_p, alpha_n, beta, eps} (Apertus) */
    struct xielu_params xielu;
};

/* generation_config.json's sampling values: NaN (top_k: GEN_TOP_K_ABSENT) when not given.
 * Without do_sample (transformers' default) the model decodes greedily: temperature is 0
 * and top_p, top_k and min_p are dropped. Values given are not range-checked here (the
 * bounds live with the sampler): callers check them (cli_check_generation_config). */
#define GEN_TOP_K_ABSENT (-2147483647 - 1)
struct generation_defaults {
    float temperature;
    float top_p;
    int top_k;
    float min_p;
    float repeat_penalty;
    bool do_sample;
};

/* Where a family's checkpoints keep their multi-token-prediction (MTP) layers
 * (model_load_mtp, ADR 0108). */
enum mtp_layout {
    MTP_NONE = 0,      /* none the loader knows */
    MTP_DEEPSEEK = 1,  /* DeepSeek-V3's: num_nextn_predict_layers layers past num_hidden_layers,
                        * model.layers.N.{enorm, hnorm, eh_proj, shared_head.{norm, head}} + a
                        * decoder layer of the model's own kind (GLM-4.5 and GLM-4.7-Flash too) */
    MTP_QWEN3_NEXT = 2,  /* Qwen3-Next's and Qwen3.5's: mtp.{fc, pre_fc_norm_embedding,
                          * pre_fc_norm_hidden, norm} + mtp.layers.0.* a full-attention decoder
                          * layer (mtp_num_hidden_layers), the model's embeddings and lm_head */
};

struct prepared_view;
struct model_tp;           /* tp.h */
struct tp_group;
struct tp_peer;
struct lora_run;           /* lora.h */
struct vision;             /* vision.h */
struct model;
struct model_ctx;
struct fwd_chunk;
struct expert_stack_rule;  /* src/loading/convert.h */
struct quant_params;       /* src/loading/quantize.h */
struct ck_view_rule;       /* src/loading/convert.h */

struct model_ops {
    const char *family;       /* our family name, e.g. "llama" */
    const char *description;  /* one line for `mlxcel arch` */
    const char *const *architectures;  /* config "architectures" names, NULL-terminated */
    /* config.json -> hparams (hparams_init already ran). */
    int (*parse_config)(struct hparams *hp, const cJSON *cfg, struct err *e);
    /* Bind canonical slots of m (m->hp is final, except scales a layout has folded into
     * its weights: falcon_h1 resets them for mlx-lm's checkpoints) to tensors of st. */
    int (*map_weights)(struct model *m, struct st_set *st, struct err *e);
    /* One chunk of a batch (model_forward in engine/batch.c prepared the cache): every
     * row through the layers, logits of the chunk's out_rows into c->bufs.logits. Ops may
     * fail asynchronously: the engine checks backend_sync() afterwards. */
    int (*forward)(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e);
    /* mlx-lm's sanitize of per-expert tensors into stacked ones, for `mlxcel convert`
     * and `synth -q`; NULL-terminated, or NULL for dense families. */
    const struct expert_stack_rule *expert_stacking;
    /* mlx-lm's quant_predicate for `convert -q` / `synth -q` (ck_quant_predicate_fn:
     * CK_Q_FLOAT, CK_Q_DEFAULT or CK_Q_OVERRIDE with *qp), or NULL: every candidate. */
    int (*quant_predicate)(const char *module, const struct quant_params *base,
                           struct quant_params *qp);
    /* mlx-lm's sanitize of tensors it reorders (gpt-oss's experts in transformers' layout,
     * DeepSeek-V3's kv_b_proj), for `mlxcel convert` and `synth -q`: writes at most
     * CK_MAX_VIEWS rules for hp into out, the last {NULL}; or NULL (model_convert_views). */
    void (*convert_views)(const struct hparams *hp, struct ck_view_rule *out);
    /* Where map_weights accepts two layouts, name suffixes of the one published
     * checkpoints use (e.g. fused ".qkv_proj.weight"), for `mlxcel synth`; or NULL. */
    const char *const *synth_prefer;
    /* Its checkpoints' MTP layers (model_load_mtp); MTP_NONE: --spec mtp is refused. A family
     * with a layout runs decoder_forward, which honours fwd_chunk.hidden and model.mtp. */
    enum mtp_layout mtp;
    /* Its own forward all-reduces the blocks a tensor-parallel rank marks (layer_spec.tp_mix /
     * tp_ffn, models/tp.h), so model_tp_split may split it; decoder_forward's families do. */
    bool tp_reduces;
};

/* A multi-token-prediction layer loaded as a model of one layer (model_load_mtp): each row's
 * input is x = eh_proj(cat(enorm(embed(id)), hnorm(h))), h the hidden state the row conditions
 * on (batch.hidden); then the layer, and shared_head's norm and head as out_norm and lm_head.
 * Absent (eh_proj.ndim == 0) in every other model. */
struct mtp_input {
    struct tensor enorm, hnorm;      /* [n_embd] RMSNorms of the embedding and of h */
    struct tensor eh_proj;           /* [n_embd, 2 n_embd] */
};

struct model {
    struct hparams hp;
    const struct model_ops *ops;
    struct st_set *st;               /* owns the mmaps */
    /* model_prepare: the views a backend rewrote, with their stored pointers, so that
     * preparing again (for another backend) starts from the views as bound. */
    struct prepared_view *prepared;
    size_t n_prepared, cap_prepared;
    struct generation_defaults gen;
    char dir[4096];
    char multimodal[64];             /* a multimodal checkpoint's model_type, whose text model this
                                      * is; "" for a text checkpoint */
    struct vision *vision;           /* its image tower and projector (vision.h, ADR 0087), owned;
                                      * NULL: the model takes no images */
    struct tensor tok_embd;          /* [n_vocab, n_embd] */
    struct tensor out_norm, out_norm_b;  /* [n_embd] */
    struct tensor lm_head, lm_head_b;    /* [n_vocab, n_embd], [n_vocab] */
    /* encoders (hp.encoder): absolute position and token-type embeddings, the LayerNorm of
     * their sum, and a sequence-classification head: cls_dense (BERT's pooler, RoBERTa's
     * classifier.dense) + tanh on the first token, then cls_out (classifier / out_proj) */
    struct tensor pos_embd;              /* [n_ctx, n_embd] */
    struct tensor type_embd;             /* [n_type_vocab, n_embd] */
    struct tensor embd_norm, embd_norm_b;/* [n_embd] */
    struct tensor cls_dense, cls_dense_b;/* [n_embd, n_embd], [n_embd] */
    struct tensor cls_norm, cls_norm_b;  /* [n_embd]: ModernBERT's head.norm after the dense */
    struct tensor cls_out, cls_out_b;    /* [n_cls, n_embd], [n_cls] */
    struct mtp_input mtp;                /* an MTP layer's input stage, or absent */
    struct layer *layers;            /* [n_layer], owned */
    struct tensor *expert_views;     /* backing store of every expert_linear, owned */
    void *derived;                   /* weights a family rearranged at load (MLA's per-head
                                      * kv_b_proj factors), owned; NULL if none */
    size_t n_expert_views, expert_views_used;
    void **owned;                    /* weights a layout forces to copy (transformers'
                                      * transposed gpt-oss experts), owned */
    size_t n_owned;
    struct model_tp *tp;             /* its split over tensor-parallel ranks (tp.h), owned; NULL:
                                      * none */
};

/* bytes of host memory owned by m (freed by model_free), for a weight map that cannot
 * keep a view (a stored layout the kernels do not read). */
int model_alloc_owned(struct model *m, size_t bytes, void **out, struct err *e);

/* Replace the view t (absent: nothing) by an owned F32 copy of it, for the small
 * per-channel weights recurrent kernels read as F32 (conv weights, A_log, D, dt biases).
 * -ERR_FORMAT for a quantized or strided tensor (names it). */
int model_widen_f32(struct model *m, struct tensor *t, struct err *e);

/* Load the checkpoint in dir. A decoder checkpoint that is an embedding model or an LM
 * reranker is loaded as one (hp.encoder, ADR 0097 / 0098): a sentence-transformers folder
 * (modules.json) of a causal decoder (hp.causal: Qwen3-Embedding), or a config.json carrying
 * vLLM's Qwen3-Reranker fields ("classifier_from_token": ["no", "yes"],
 * "is_original_qwen3_reranker": true; hp.lm_rerank).
 * A decoder's base model saved alone (embed_tokens.*, layers.N.*, norm.*: Qwen3Model /
 * Gemma3TextModel as sentence-transformers saves them) loads under its LM's "model." names. */
int model_load(struct model **out, const char *dir, struct err *e);

/* Serve loaded decoder m as an LM reranker (ADR 0098, `--reranker qwen3`): hp.encoder,
 * hp.causal, hp.lm_rerank set; scores come from its LM head's "yes" / "no" logits at each
 * pair's last token. -ERR_ARG for an encoder, a model whose layers are not all attention
 * layers (recurrent, latent) or one without an LM head. Before model_prepare. */
int model_set_lm_reranker(struct model *m, struct err *e);
/* Load the first multi-token-prediction layer of the checkpoint in dir as a model of one layer
 * (struct mtp_input; ADR 0108, 0135): its decoder layer as layer 0, shared_head.norm (Qwen3-Next:
 * mtp.norm) as out_norm, shared_head.head (or the model's lm_head when the layer has none) as
 * lm_head, the model's embeddings. -ERR_UNSUPPORTED when the family has no MTP layout,
 * -ERR_CONFIG when config.json has none (num_nextn_predict_layers / mtp_num_hidden_layers
 * absent or 0), -ERR_FORMAT naming a missing tensor. */
int model_load_mtp(struct model **out, const char *dir, struct err *e);
void model_free(struct model *m);
/* Parameter count (elements of every consumed tensor; quantized counted unpacked). */
int64_t model_n_params(const struct model *m);
/* Bytes of weights (as stored). */
uint64_t model_weight_bytes(const struct model *m);
/* The family's convert_views for config cfg into out[CK_MAX_VIEWS]: 0 and *views = out, or
 * *views = NULL when the family reorders nothing; parse_config's error otherwise. */
int model_convert_views(const struct model_ops *ops, const cJSON *cfg, struct ck_view_rule *out,
                        const struct ck_view_rule **views, struct err *e);
/* KV-cache bytes per token of context, in a cache of kv_dtype elements (F32, F16, BF16),
 * while a sequence is shorter than every window (every layer's rows). */
uint64_t model_kv_bytes_per_token(const struct model *m, enum dtype kv_dtype);
/* The cache by layer kind (ADR 0023): full and latent layers keep every position,
 * sliding-window layers at most their window plus one block, recurrent layers a fixed state
 * per sequence (ADR 0057). */
struct model_kv_sizes {
    int n_full, n_swa;              /* layers of each kind (latent layers count as full) */
    uint64_t full_per_token;        /* bytes per position of the full and latent layers */
    uint64_t swa_per_token;         /* bytes per position of the sliding layers */
    int window;                     /* the largest window (0: no sliding layer) */
    int n_rec;                      /* recurrent layers (KV_RECURRENT: no rows) */
    uint64_t rec_per_seq;           /* bytes of their f32 states per sequence */
};
void model_kv_sizes(const struct model *m, enum dtype kv_dtype, struct model_kv_sizes *out);
/* Most positions a sliding layer holds for one decoding sequence in blocks of
 * block_size: the window's blocks plus one of misalignment (kvcache's bound for a
 * one-row chunk); n_tokens when shorter. */
int model_kv_window_positions(int window, int n_tokens, int block_size);
/* KV-cache bytes of one sequence of n_tokens positions in blocks of block_size (kv_dtype
 * elements): the full layers' rows of every position, the sliding layers' of at most their
 * window, and the recurrent layers' states. */
uint64_t model_kv_bytes(const struct model *m, int n_tokens, int block_size, enum dtype kv_dtype);

/* Prepare every weight for be once (backend_ops.prepare_weight: the CPU copies the
 * views into memory of its own or repacks them, or keeps the mmap views; a GPU uploads).
 * The views then belong to be: a model runs on the backend it was last prepared for,
 * which must outlive that use. Preparing again (for a new backend) starts from the views
 * as bound (pages of the mapping given back are read from the file again). */
int model_prepare(struct model *m, struct backend *be, struct err *e);

/* Activation buffers and per-chunk metadata, carved out of one backend
 * allocation at context creation. B = n_batch (rows per forward chunk),
 * K = B * n_expert_used (routed (token, expert) slots). */
struct ctx_bufs {
    float *x;        /* [B, n_embd] residual stream */
    float *xn;       /* [B, n_embd] normalized input of a block */
    float *qkv;      /* [B, (n_head + 2 n_kv_head) * head_dim] q | k | v columns */
    float *att;      /* [B, n_head * head_dim] attention output before wo */
    float *o;        /* [B, n_embd] attention block output */
    float *f;        /* [B, n_embd] FFN block output */
    float *h;        /* [max(B, K), 2 n_ff] FFN hidden: gate | up, or fc1 */
    float *h1;       /* [max(B, K), n_ff] activated hidden */
    float *router;   /* [B, n_expert] gate logits */
    int32_t *sel;    /* [K] chosen experts */
    float *sel_w;    /* [K] their weights */
    int32_t *order;  /* [K] slots grouped by expert */
    int32_t *offsets;/* [n_expert + 1] each expert's run in order */
    float *xg;       /* [K, n_embd] gathered rows */
    float *yg;       /* [K, n_embd] expert outputs */
    float *logits;   /* [n_out, n_vocab] */
    float *rope;     /* [n_layer][2][HP_MAX_ROT_HALF] inv_freq | longrope long factors */
    float *mrope;    /* [3][HP_MAX_ROT_HALF] M-RoPE: layer 0's inv_freq with the frequencies
                      * outside stream s's section zero (hp.mrope_section; ADR 0094) */
    float *sinks;    /* [n_layer][n_head] attention sink logits in f32 (layers with sinks) */
    float *rec;      /* [B, hp.rec_scratch] the recurrent blocks' projections */
    const struct lora_run *lora; /* the chunk's active adapters (lora.h), or NULL: the base
                                  * alone; set per chunk by model_forward */
    float *mtp_in;   /* [B, 2 n_embd] an MTP model's input rows: embedding | the hidden state
                      * it conditions on (model_forward stages zeros | h); NULL otherwise */
    int32_t *meta;   /* [CTX_META_ROWS][B] ids, pos, slot, table, seq_end, out_rows, sliding
                      * slot, state slot (the row's sequence id), then [B][2] the rows'
                      * bidirectional spans (kv_rows.span, chunks with images only), then
                      * [3][B] the rows' M-RoPE positions (t, h, w; M-RoPE models only) */
};
#define CTX_META_ROWS 13
#define CTX_META_MROPE 10   /* the row of meta where the M-RoPE positions start */

/* Per-chunk input of a family forward: n_tok rows (ids in range, K/V slots
 * reserved), of which n_out need logits. Pointers are backend memory except
 * kv, the per-layer views of the cache pool (host array). */
/* Rows [row, row + n) of a chunk that take embeddings embd [n, n_embd] (backend memory)
 * in place of their tokens' (an image's, ADR 0087); DeepStack (ADR 0120): after decoder
 * layer k < n_deep, the rows embd + (k + 1) deep_ld [n, n_embd] are added to them. */
struct fwd_image {
    int row, n;
    const float *embd;
    int n_deep;
    size_t deep_ld;
};

struct fwd_chunk {
    int n_tok, n_out;
    const int32_t *ids;       /* [n_tok] */
    const int32_t *out_rows;  /* [n_out] rows whose logits go to bufs.logits, in order */
    const struct kv_rows *rows;      /* full and latent layers */
    const struct kv_rows *rows_swa;  /* sliding-window layers: their own pool (ADR 0023) */
    const struct kv_layer *kv; /* [n_layer] */
    /* encoders (hp.encoder; engine/encode.c): per row its token type and absolute position
     * id (the embedding rows), backend memory; NULL for decoders */
    const int32_t *type_ids;   /* [n_tok] */
    const int32_t *emb_pos;    /* [n_tok] */
    const struct fwd_image *img;     /* [n_img] host array; NULL: no image rows */
    int n_img;
    /* M-RoPE models (hp.mrope_section): [3][mpos_ld] each row's temporal, height and width
     * rope positions, backend memory (ADR 0094); NULL otherwise */
    const int32_t *mpos;
    int mpos_ld;
    bool hidden;               /* also every row's final hidden state, the output norm of the
                                * residual stream (what lm_head reads), into bufs.o [n_tok,
                                * n_embd] (decoder_forward; batch.hidden_out) */
};

/* Graphs a context keeps (decode shapes: one per row count and cache layout). */
#define CTX_MAX_GRAPHS 32

/* A decode step recorded by model_forward (engine/batch.c) for replay: valid for chunks of
 * n_tok rows, all of them logit rows, over the cache whose buffers hash to cache_key. */
struct ctx_graph {
    int n_tok;
    bool hidden;                     /* recorded with fwd_chunk.hidden */
    uint64_t cache_key;
    void *graph;                     /* backend graph, owned; NULL: recording failed, run ops */
};

/* Activations of one model on one backend; serves any KV cache of that model. */
struct model_ctx {
    const struct model *m;
    struct backend *be;              /* borrowed */
    int n_batch;                     /* max rows per forward chunk */
    int n_out;                       /* max logit rows per chunk */
    void *arena;                     /* backend memory of bufs, owned */
    struct ctx_bufs bufs;
    int32_t *meta_host;              /* [CTX_META_ROWS][B] staging of bufs.meta, owned */
    float *mtp_host;                 /* [B, 2 n_embd] staging of bufs.mtp_in (MTP models), owned */
    int n_nonfinite;                 /* logit rows holding NaN/Inf in the last model_forward */
    bool warned_nonfinite;           /* the one warning about them was logged */
    struct ctx_graph graphs[CTX_MAX_GRAPHS]; /* recorded decode steps, n_graphs of them */
    int n_graphs;
    struct lora_run *lora;           /* adapters this context serves (model_ctx_set_lora), owned;
                                      * NULL: none */
    struct tp_group *tp;             /* a split model's rank contexts (tp.h), owned; NULL: none */
    struct tp_peer *tp_peer;         /* a rank context's place in its group, or NULL */
};

/* The most rows a context's chunk holds when asked for more (n_batch > 0). */
#define CTX_MAX_ROWS 4096

/* n_batch <= 0: the default (512 rows, fewer for wide models so the arena stays
 * within its budget); n_batch > 0: that many rows, at most CTX_MAX_ROWS. */
int model_ctx_new(struct model_ctx **out, const struct model *m, struct backend *be, int n_batch,
                  struct err *e);
/* The rows of a forward chunk model_ctx_new picks when n_batch is 0: the most, from 512 down
 * by halves, whose activations fit budget bytes, at least 32, and at least one image's tokens
 * where the text model attends bidirectionally among them (they cannot be cut). */
int model_ctx_auto_batch(const struct model *m, size_t budget);

/* A multimodal config (Gemma 3, Qwen2.5-VL, ... ADR 0080): *cfg becomes its text model's
 * config (the keys about the whole checkpoint copied in), *outer the whole one (the caller
 * frees both), wrapper its model_type; 1 when so, 0 when cfg is a text model's already. */
int model_nest_config(cJSON **cfg, cJSON **outer, char *wrapper, size_t cap, struct err *e);
void model_ctx_free(struct model_ctx *c);

#ifdef __cplusplus
}
#endif
