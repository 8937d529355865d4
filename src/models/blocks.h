/*
 * blocks: the library of transformer blocks every family's forward is
 * composed of. Each block takes its weights, dimensions and options as
 * explicit parameters (never struct hparams), runs through the backend ops
 * only (so a GPU backend runs the same code), and works on n rows of a
 * forward chunk whose positions and cache slots are in struct kv_rows.
 *
 *   blk_norm       RMSNorm / LayerNorm of rows
 *   blk_attention  q|k|v projections -> per-head q/k norm -> RoPE -> store
 *                  K/V in the paged cache -> attention -> output projection
 *   blk_glu        down(act(gate(x)) * up(x)), separate or fused gate_up
 *   blk_mlp        fc2(act(fc1(x)))
 *   blk_moe        router (+ bias) -> top-k -> group by expert -> expert GLU/MLP/clamped GLU ->
 *                  weighted combine
 *   blk_shared_expert  a GLU expert every token takes, gated by a sigmoid
 *   blk_head       final norm and lm_head of the rows that need logits
 *
 * Scratch buffers come from the caller (struct ctx_bufs of model.h).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A norm's kind, epsilon and weights (b: NULL/absent for none); the weight is used as
 * w + w_off (Gemma's x * (1 + w): 1; else 0). */
struct blk_norm_w {
    enum norm_kind kind;
    float eps;
    const struct tensor *w, *b;
    float w_off;
};

/* y[n, dim] = norm(x[n, dim]); y may equal x. */
void blk_norm(struct backend *be, float *y, const float *x, const struct blk_norm_w *nw, int n,
              int dim);

/* Everything one attention block needs besides weights. */
struct blk_attn_cfg {
    struct attn_params ap;        /* heads, scale, softcap, window, sinks */
    const struct rope_params *rp; /* NULL: no rope */
    bool qk_norm;                 /* norm of q and k (weights L->q_norm/k_norm) ... */
    bool qk_norm_full;            /* ... over the whole q / k row, else per head */
    bool out_gate;                /* att *= sigmoid(L->wq_gate xn) before wo (in b->rec) */
    enum norm_kind norm;          /* its kind, epsilon and weight offset (no bias) */
    float norm_eps;
    float norm_w_off;
    int n_embd;
    bool qk_norm_post_rope;       /* the q/k norm after RoPE (HunYuan), else before */
    int temp_floor;               /* > 0: query temperature by position (attn_temp op) */
    float temp_scale;
    /* M-RoPE (ADR 0094): instead of rp, three rope passes, stream s with mrope[s] (its
     * section's frequencies, the rest zero) at positions mpos + s * mpos_ld (backend memory) */
    const struct rope_params *mrope;  /* [3], or NULL */
    const int32_t *mpos;
    int mpos_ld;
    /* a tensor-parallel rank's context when qk_norm_full: the norm over rows gathered from
     * the ranks (model_tp_rmsnorm_full); NULL otherwise */
    const struct model_ctx *tp;
    int kv_per;                   /* ... and how many ranks share each KV head (1: none) */
};

/* o[n, n_embd] = wo(attend(rope(q), rope(k), v)) for xn [n, n_embd], with this
 * layer's K/V stored into kv at rows->slot. Uses b->qkv and b->att. */
void blk_attention(struct backend *be, float *o, const float *xn, const struct layer *L,
                   const struct blk_attn_cfg *cfg, const struct kv_layer *kv,
                   const struct kv_rows *rows, const struct ctx_bufs *b, int n);

/* f[n, n_embd] = down(act(gate(xn)) * up(xn)) (L->gate/up or fused L->gate_up). Uses b->h, b->h1. */
void blk_glu(struct backend *be, float *f, const float *xn, const struct layer *L, enum act_kind act,
             int n_ff, const struct ctx_bufs *b, int n);
/* f[n, n_embd] = down(act(up(xn) + up_b)) + down_b (ACT_XIELU: with L->xielu). Uses b->h. */
void blk_mlp(struct backend *be, float *f, const float *xn, const struct layer *L, enum act_kind act,
             int n_ff, const struct ctx_bufs *b, int n);

struct blk_moe_cfg {
    enum router_kind router;
    int n_expert, k;
    float jitter;
    const struct moe_group_params *group;  /* ROUTER_GROUP_*: their options (bias: router_b) */
    enum ffn_kind ffn;            /* each expert: GLU (gate, up, down) or MLP (up, down) */
    enum act_kind act;
    int n_ff, n_embd;
    float glu_alpha, glu_limit;   /* FFN_GLU_CLAMPED */
    bool weight_input;            /* the routing weights scale the experts' inputs (Llama 4) */
};

/* f[n, n_embd] = sum over the k routed experts of weight * expert(xn). Uses b->router, sel,
 * sel_w, order, offsets, xg, h, h1, yg. */
void blk_moe(struct backend *be, float *f, const float *xn, const struct layer *L,
             const struct blk_moe_cfg *cfg, const struct ctx_bufs *b, int n);

/* f[n, n_embd] += sigmoid(shexp_inp_gate(xn)) * shexp_down(act(shexp_gate(xn)) * shexp_up(xn)):
 * the shared expert of a MoE layer, after blk_moe wrote f (plain: no sigmoid gate, the
 * expert's output added as it is). Uses b->h, h1, yg, router. */
void blk_shared_expert(struct backend *be, float *f, const float *xn, const struct layer *L,
                       enum act_kind act, int n_ff, bool plain, const struct ctx_bufs *b, int n);

/* Multi-head latent attention (DeepSeek-V2/V3), in the absorbed form over a KV_LATENT cache. */
struct blk_mla_cfg {
    int n_head, nope, rope, v_dim, kv_rank, q_rank;  /* q_rank 0: no q LoRA */
    float scale;                  /* softmax scale */
    const struct rope_params *rp; /* on the rope dims (n_rot = rope) */
    float norm_eps;               /* q_a / kv_a RMSNorms */
    int n_embd;
};

/* o[n, n_embd] = wo(MLA(xn)): q = wq(xn) or wq(rms(wq_a xn)) split per head into q_nope |
 * q_pe; the row [rms(latent) | rope(k_pe)] of wkv_a xn is stored in the cache; each head
 * attends with [q_nope wk_lat_h | rope(q_pe)] against the cached rows (one shared "kv head" of
 * kv_rank + rope dims: q_nope . k_nope = (wk_lat_h q_nope) . latent), and its value is
 * wv_lat_h times the attended latent. Uses b->qkv and b->att. */
void blk_mla_attention(struct backend *be, float *o, const float *xn, const struct layer *L,
                       const struct blk_mla_cfg *cfg, const struct kv_layer *kv,
                       const struct kv_rows *rows, const struct ctx_bufs *b, int n);

/* o[n, n_embd] = the recurrent mixer of layer il (hp.layer[il].mixer) over xn [n, n_embd],
 * carrying each sequence's state in kv (a KV_RECURRENT layer: conv state k, recurrent state
 * v; ADR 0057) across chunks. Uses b->rec (hp.rec_scratch floats per row), b->qkv, b->att.
 * blocks_rec.c dispatches to the mixer's block. */
void blk_recurrent(const struct model_ctx *c, float *o, const float *xn, int il,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n);

/* LFM2's gated short convolution: B | C | x = ssm_in(xn) (+ bias); y = conv(B * x) (state:
 * the last d_conv - 1 products); o = ssm_out(C * y). Needs rec_scratch >= 4 n_embd. */
void blk_shortconv(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n);

/* Mamba's mixer (MIXER_MAMBA): x | z = ssm_in(xn) (+ bias); x = silu(conv(x)) (state: the last
 * d_conv - 1 inputs); dt = ssm_x(x), B | C = ssm_xbc(x), each RMS-normalized when the layer
 * has ssm_dt_norm / ssm_b_norm / ssm_c_norm (Jamba, epsilon hp.ssm.norm_eps); y = the
 * selective scan of x with softplus(ssm_dt(dt) + ssm_dt_b), A = -exp(ssm_a), B, C, D = ssm_d,
 * gated by silu(z); o = ssm_out(y) (+ bias). Uses b->rec: 4 d_inner + dt_rank + 2 d_state
 * floats per row. */
void blk_mamba(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
               const struct kv_layer *kv, const struct kv_rows *rows, int n);
/* Qwen3-Next's gated DeltaNet (blocks_gdn.c): q | k | v = ssm_in(xn), z = ssm_z(xn),
 * b = ssm_x(xn), a = ssm_xa(xn); q | k | v = silu(conv(q | k | v)) (state: the last d_conv - 1
 * rows); y = the gated delta rule (backend gated_delta, state: per value head a [k_dim, v_dim]
 * matrix); o = ssm_out(rmsnorm(y) * ssm_norm * silu(z)), the norm per value head. Uses b->rec
 * (blk_deltanet_scratch floats per row). */
void blk_deltanet(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                  const struct kv_layer *kv, const struct kv_rows *rows, int n);
/* Floats per row blk_deltanet needs in b->rec for hp's hp->ssm shape. */
int blk_deltanet_scratch(const struct hparams *hp);
/* Mamba-2's mixer (blocks_ssm.c), with hp.ssm's sizes (d_inner, d_state, n_head, head_dim,
 * n_group, d_conv, dt clamp, norm_eps, norm_groups): z | xBC | dt = ssm_in(xn) (+ bias);
 * xBC = silu(conv(xBC)) (state: its last d_conv - 1 inputs); y = SSD scan of x, B, C, dt
 * with A_log (ssm_a), D (ssm_d), dt_bias (ssm_dt_b) (state: [n_head][head_dim][d_state]);
 * y = rmsnorm(y * silu(z)) over norm_groups groups (weight ssm_norm; Falcon-H1's options:
 * norm_before_gate rmsnorm(y) * silu(z), norm_off y * silu(z), mup: the projection's
 * column segments scaled by mup_mult); o = ssm_out(y). Uses
 * b->rec: [n_batch][2 d_inner + 2 n_group d_state + n_head] then [n][d_inner]. */
void blk_mamba2(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                const struct kv_layer *kv, const struct kv_rows *rows, int n);
/* Floats per row blk_mamba2 needs in b->rec (hparams.rec_scratch) for hp's sizes. */
int blk_mamba2_scratch(const struct hparams *hp);

/* logits[n_out, n_vocab] = lm_head(norm(x[out_rows])) (+ bias). Uses b->xn. */
void blk_head(struct backend *be, float *logits, const float *x, const int32_t *out_rows, int n_out,
              const struct blk_norm_w *nw, const struct tensor *lm_head, const struct tensor *lm_head_b,
              int n_embd, const struct ctx_bufs *b);

/* Inverse frequencies [n_rot / 2] of layer spec ls under hp's rope scaling (long
 * factors for longrope into inv_long, which may be NULL otherwise). Computed in double. */
void blk_rope_freqs(const struct hparams *hp, const struct layer_spec *ls, float *inv,
                    float *inv_long);

/* The forward of the decoder families (Llama-like, Phi, the MoE ones): per layer,
 * norms and residuals from layer_spec.residual, attention, then a dense or MoE FFN. */
int decoder_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e);

/* blk_glu with biases on gate, up and down (L->gate_b, up_b, down_b; RecurrentGemma's MLP):
 * blk_glu calls it when L->gate_b is present. Uses b->h, b->h1. */
void blk_glu_bias(struct backend *be, float *f, const float *xn, const struct layer *L,
                  enum act_kind act, int n_ff, const struct ctx_bufs *b, int n);
/* Griffin's recurrent block (RecurrentGemma; blocks_rglru.c): o = linear_out(rglru(conv1d(
 * linear_x(xn))) * act(linear_y(xn))), the conv state in kv->k, the RG-LRU's in kv->v. Uses
 * b->rec: blk_rglru_scratch floats per row. */
void blk_rglru(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
               const struct kv_layer *kv, const struct kv_rows *rows, int n);
/* Floats per row blk_rglru needs in b->rec for an RG-LRU of width lru_width. */
int blk_rglru_scratch(int lru_width);

#ifdef __cplusplus
}
#endif
