/*
 * hparams: the typed hyper-parameters every family normalizes config.json
 * into, and the dimension glossary used across the code base:
 *
 *   n_vocab   vocabulary size            n_embd    residual width
 *   n_layer   transformer blocks         n_head    query heads
 *   n_kv_head key/value heads (GQA)      head_dim  per-head width
 *   n_ff      FFN inner width (per expert for MoE)
 *   n_rot     rotary dims per head (partial rotary when < head_dim)
 *   n_expert  experts per MoE layer      n_expert_used  experts per token (top-k)
 *   n_tok     tokens in a forward call   pos       absolute position
 *   il        layer index
 *
 * Families differ only by the flags and enums below; src/models/blocks.c
 * reads them. A family's parse_config is the one place its config.json
 * names and defaults are written down; hparams_validate() then rejects
 * values that cannot work, so nothing downstream sees a zero head count.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "../loading/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_MAX_EOS      16
#define HP_MAX_ROT_HALF 256   /* longrope factor arrays: n_rot / 2 entries */
#define HP_MAX_EXPERTS  256
#define HP_MAX_LAYERS   1024
#define HP_MAX_DIM      (1 << 20)

enum norm_kind   { NORM_RMS = 0, NORM_LAYER = 1 };
enum act_kind    { ACT_SILU = 0, ACT_GELU_TANH = 1, ACT_GELU_ERF = 2 };
enum ffn_kind    {
    FFN_GLU = 0,   /* down(act(gate(x)) * up(x))  (SwiGLU) */
    FFN_MLP = 1,   /* fc2(act(fc1(x)))             (GPT-2 / Phi) */
};
enum rope_kind   { ROPE_DEFAULT = 0, ROPE_LINEAR = 1, ROPE_LLAMA3 = 2, ROPE_LONGROPE = 3 };
enum router_kind {
    ROUTER_NONE = 0,          /* dense FFN */
    ROUTER_TOPK_SOFTMAX = 1,  /* top-k logits, softmax over those k (Phixtral) */
    ROUTER_SOFTMAX_TOPK = 2,  /* softmax over all, top-k, renormalize (Mixtral) */
    ROUTER_SPARSEMIXER = 3,   /* PhiMoE sparsemixer top-2, inference form */
};

struct hparams {
    char model_type[64];        /* as written in config.json */
    int n_vocab;
    int n_embd;
    int n_layer;
    int n_head;
    int n_kv_head;
    int head_dim;
    int n_ff;
    int n_ctx;                  /* max_position_embeddings / n_positions */

    /* block structure */
    enum norm_kind norm;
    float norm_eps;
    bool parallel_residual;     /* x + attn(ln(x)) + ffn(ln(x)), one norm per block */
    bool qkv_bias;              /* biases on q/k/v projections */
    bool out_bias;              /* bias on the attention output projection */
    bool qk_norm;               /* per-head RMSNorm on q and k (Qwen3) */
    float attn_scale;           /* softmax scale, 1/sqrt(head_dim) unless stated */

    /* rotary embedding */
    int n_rot;                  /* rotary dims per head, even, <= head_dim */
    float rope_theta;
    enum rope_kind rope;
    float rope_factor;          /* linear / llama3 factor */
    float rope_low_freq_factor; /* llama3 */
    float rope_high_freq_factor;/* llama3 */
    int rope_orig_ctx;          /* llama3 / longrope original_max_position_embeddings */
    float rope_attn_factor;     /* longrope cos/sin scale; 1 otherwise */
    float rope_short[HP_MAX_ROT_HALF]; /* longrope factors (n_rot / 2) */
    float rope_long[HP_MAX_ROT_HALF];

    /* feed-forward */
    enum ffn_kind ffn;
    enum act_kind act;
    bool ffn_bias;              /* biases on the FFN / expert linears */
    int n_expert;               /* 0: dense */
    int n_expert_used;
    enum router_kind router;
    float router_jitter;        /* sparsemixer epsilon (PhiMoE router_jitter_noise) */

    /* head */
    bool tie_embd;              /* lm_head shares the token embedding */
    bool head_bias;             /* bias on lm_head */

    /* special tokens (config.json; generation_config.json overrides eos) */
    int32_t bos_id;             /* -1: none */
    int32_t eos_ids[HP_MAX_EOS];
    int n_eos;

    /* MLX quantization (config "quantization"), validated; quant.present is
     * false for a float checkpoint. Overrides are owned (model_free). */
    struct qconfig quant;
};

/* Fill the defaults shared by every family before its parse_config runs. */
void hparams_init(struct hparams *hp);
/* Reject values that cannot work; the message names the config field. */
int hparams_validate(const struct hparams *hp, struct err *e);

#ifdef __cplusplus
}
#endif
