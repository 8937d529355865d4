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
 * The fields are the model-wide values a family's parse_config reads from
 * config.json (the one place its names and defaults are written down); the
 * per-layer struct layer_spec array is filled from them and adjusted where
 * layers differ. hparams_validate() then rejects values that cannot work,
 * so nothing downstream sees a zero head count.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "../kernels/backend.h"
#include "../loading/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_MAX_EOS      16
#define HP_MAX_CTX      (1 << 24) /* positions */
#define HP_MAX_ROT_HALF 256   /* longrope factor arrays: n_rot / 2 entries */
#define HP_MAX_EXPERTS  256
#define HP_MAX_LAYERS   1024
#define HP_MAX_DIM      (1 << 20)
#define HP_MAX_HEADS    4096
#define HP_MAX_HEAD_DIM 4096
#define HP_MAX_STATE    (1 << 26) /* floats of one layer's recurrent state per sequence */

enum norm_kind   { NORM_RMS = 0, NORM_LAYER = 1 };
/* enum act_kind and enum router_kind live in kernels/backend.h (ops take them). */
enum ffn_kind    {
    FFN_GLU = 0,   /* down(act(gate(x)) * up(x))  (SwiGLU) */
    FFN_MLP = 1,   /* fc2(act(fc1(x)))             (GPT-2 / Phi) */
    FFN_GLU_CLAMPED = 2, /* down((u + 1) * g * sigmoid(alpha g)), g = min(gate(x), limit),
                          * u = clamp(up(x), -limit, limit)  (gpt-oss; act unused) */
    FFN_NONE = 3,  /* no FFN in this layer (Mamba's blocks, Nemotron-H's mixer-only layers) */
};
/* What mixes positions in a layer (the block before its FFN). The recurrent kinds keep a
 * fixed-size state per sequence (layer_spec.kv = KV_RECURRENT, ADR 0057). */
enum mixer_kind {
    MIXER_ATTENTION = 0,  /* attention over the KV cache (kv: full, sliding or latent) */
    MIXER_NONE = 1,       /* none: the layer is its FFN alone (Nemotron-H's MLP / MoE layers) */
    MIXER_SHORTCONV = 2,  /* LFM2's gated short convolution */
    MIXER_MAMBA = 3,      /* Mamba's selective scan */
    MIXER_MAMBA2 = 4,     /* Mamba-2's SSD */
    MIXER_DELTANET = 5,   /* the gated delta rule (Qwen3-Next's linear attention) */
    MIXER_RGLRU = 6,      /* Griffin's recurrent block: conv1d + RG-LRU, gated (RecurrentGemma) */
};
enum rope_kind   { ROPE_DEFAULT = 0, ROPE_LINEAR = 1, ROPE_LLAMA3 = 2, ROPE_LONGROPE = 3, ROPE_YARN = 4,
                   ROPE_DYNAMIC = 5 };
/* What a layer keeps in the KV cache and how much of it a query sees. */
enum kv_kind {
    KV_FULL = 0,       /* every position */
    KV_SLIDING = 1,    /* a query at p attends (p - window, p] */
    KV_LATENT = 2,     /* MLA: per position one row of the normalized latent (kv_lora_rank)
                        * and the roped shared key (qk_rope_dim), no per-head K/V (ADR 0019) */
    KV_RECURRENT = 3,  /* fixed-size state per sequence (SSM, linear attention, short conv):
                        * state_conv + state_rec floats, no per-position rows (ADR 0057) */
};
/* Where a layer's norms and residual adds sit. */
enum residual_kind {
    RESID_SEQUENTIAL = 0,  /* x += attn(norm1(x)); x += ffn(norm2(x)) */
    RESID_PARALLEL = 1,    /* h = norm1(x); x += attn(h) + ffn(h) */
    RESID_POST = 2,        /* x += norm1(attn(x)); x += norm2(ffn(x))  (OLMo 2: no pre-norms;
                            * the attn_norm / ffn_norm slots hold the post norms) */
    RESID_SANDWICH = 3,    /* x += post1(attn(norm1(x))); x += post2(ffn(norm2(x)))  (Gemma 2/3:
                            * pre-norms in attn_norm / ffn_norm, post norms in
                            * attn_post_norm / ffn_post_norm) */
};

/* Everything that may differ from one layer to the next. A family's
 * parse_config fills hp->layer[0 .. n_layer): hparams_fill_layers() copies
 * the model-wide values below into every layer, then the family changes the
 * layers that differ (sliding windows, dense layers before MoE ones, a
 * second rope base, no-rope layers). The decoder forward reads only these
 * for per-layer behaviour. */
struct layer_spec {
    enum mixer_kind mixer;      /* attention (the default), none, or a recurrent kind */
    enum kv_kind kv;
    /* KV_RECURRENT: floats per sequence of its convolution state (the last d_conv - 1 inputs
     * of the conv channels) and of its recurrent state (SSM / delta-rule matrices); either
     * may be 0, not both */
    int state_conv, state_rec;
    int window;                 /* KV_SLIDING: positions attended, the query's own included */
    int n_rot;                  /* rotary dims per head; 0: no rope in this layer */
    float rope_theta;
    enum rope_kind rope;        /* scaling kind (factors: hparams, model-wide) */
    float attn_scale;
    float softcap;              /* attention logit soft-capping; 0: none */
    bool sinks;                 /* per-head attention sink logits (weights: layer.sinks) */
    bool qk_norm;               /* norm on q and k before RoPE (the model's norm kind) */
    bool qk_norm_full;          /* ... over the full projection (n_head * head_dim, before the
                                 * head split; OLMo 2), else per head (Qwen3, Cohere) */
    enum rope_style rope_style; /* which dims rope pairs: halves or interleaved pairs */
    enum residual_kind residual;
    bool moe;                   /* routed experts (else the dense FFN) */
    enum ffn_kind ffn;          /* dense FFN and each expert */
    enum act_kind act;
    int n_ff;                   /* FFN width (per expert for MoE) */
    float glu_alpha, glu_limit; /* FFN_GLU_CLAMPED: sigmoid gain and clamp */
    int n_ff_shexp;             /* MoE layers: width of a shared GLU expert added to the routed
                                 * ones, scaled by sigmoid(shexp_inp_gate x) (Qwen2-MoE); 0: none */
    bool shexp_plain;           /* ... added as it is, without the sigmoid gate (DeepSeek) */
    enum router_kind router;
    int n_expert_used;
    float router_jitter;        /* sparsemixer epsilon */
    bool qk_norm_post_rope;     /* the q/k norm after RoPE instead of before (HunYuan) */
    int chunk;                  /* > 0: a query at p attends only [p - p % chunk, p] (Llama 4's
                                 * chunked local attention; the layer is KV_SLIDING with a
                                 * window of chunk, which bounds its cache) */
    int attn_temp_floor;        /* > 0: q at p times 1 + attn_temp_scale * ln(floor((p + 1) /
                                 * attn_temp_floor) + 1) (Llama 4's NoPE layers) */
    float attn_temp_scale;
    bool moe_weight_input;      /* routing weights scale each expert's input, not its output */
    bool attn_gate;             /* attention output times sigmoid(wq_gate x) before wo (Qwen3-Next;
                                 * the gate's values sit in ctx_bufs.rec: rec_scratch >= n_head *
                                 * head_dim) */
    /* a tensor-parallel rank's model (tp.h): the mixer's / the FFN's output is this rank's
     * partial sum, all-reduced over the ranks before the residual add */
    bool tp_mix, tp_ffn;
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
    int n_ctx_max;              /* > n_ctx: a cache may hold this many (dynamic NTK rope
                                 * extends past the trained context); else n_ctx */

    /* block structure */
    enum norm_kind norm;
    float norm_eps;
    float norm_w_offset;        /* every norm weight is used as w + offset (Gemma: 1) */
    bool norm_bias;             /* LayerNorm has a bias (Cohere's has none) */
    bool parallel_residual;     /* x + attn(ln(x)) + ffn(ln(x)), one norm per block */
    bool post_norm;             /* x + norm(attn(x)), x + norm(ffn(x)): norms after the blocks */
    bool sandwich_norm;         /* x + post(attn(pre(x))), x + post(ffn(pre(x))): both (Gemma 2) */
    bool qkv_bias;              /* biases on q/k/v projections */
    bool out_bias;              /* bias on the attention output projection */
    bool qk_norm;               /* norm on q and k (Qwen3 RMS, Cohere LayerNorm) */
    bool qk_norm_full;          /* q/k norm over the full q / k width instead (OLMo 2) */
    bool qk_norm_per_head;      /* q/k norm weights [n_head, head_dim] (Cohere), else [head_dim] */
    float attn_scale;           /* softmax scale, 1/sqrt(head_dim) unless stated */

    /* rotary embedding */
    int n_rot;                  /* rotary dims per head, even, <= head_dim */
    float rope_theta;
    enum rope_kind rope;
    enum rope_style rope_style; /* rotate-half (default) or interleaved pairs (Cohere) */
    float rope_factor;          /* linear / llama3 / yarn / dynamic factor */
    float rope_low_freq_factor; /* llama3 */
    float rope_high_freq_factor;/* llama3 */
    int rope_orig_ctx;          /* llama3 / longrope / yarn / dynamic original_max_position_embeddings */
    float rope_attn_factor;     /* longrope / yarn cos/sin scale; 1 otherwise */
    float rope_beta_fast;       /* yarn correction range (rotations) */
    float rope_beta_slow;
    bool rope_truncate;         /* yarn: floor / ceil the correction range */
    float rope_short[HP_MAX_ROT_HALF]; /* longrope factors (n_rot / 2) */
    float rope_long[HP_MAX_ROT_HALF];
    /* M-RoPE (Qwen2-VL, ADR 0094): frequencies [0, s0) turn with a row's temporal position,
     * [s0, s0 + s1) with its height, the next s2 with its width (s0 + s1 + s2 = n_rot / 2);
     * all zero: plain rope. Interleaved (Qwen3-VL, ADR 0120): frequency j turns with the height
     * when j % 3 == 1 and j < 3 s1, with the width when j % 3 == 2 and j < 3 s2, else with the
     * temporal position (transformers' apply_interleaved_mrope) */
    int mrope_section[3];
    bool mrope_interleaved;

    /* feed-forward */
    enum ffn_kind ffn;
    enum act_kind act;
    bool ffn_bias;              /* biases on the FFN / expert linears */
    float glu_alpha, glu_limit; /* FFN_GLU_CLAMPED (gpt-oss swiglu_alpha / swiglu_limit) */
    bool attn_sinks;            /* per-head attention sink logits on every layer */
    bool router_bias;           /* layer.router_b [n_expert]: a bias on the router logits (gpt-oss),
                                 * or with a grouped router the F32 e_score_correction_bias that
                                 * only chooses experts (DeepSeek-V3) */
    int n_expert;               /* 0: dense */
    int n_expert_used;
    enum router_kind router;
    float router_jitter;        /* sparsemixer epsilon (PhiMoE router_jitter_noise) */
    /* grouped routers (ROUTER_GROUP_SOFTMAX / _SIGMOID, struct moe_group_params) */
    int moe_n_group, moe_topk_group;  /* n_group, topk_group (1, 1: no group limit) */
    bool moe_norm;              /* renormalize the chosen weights (norm_topk_prob) */
    float moe_scale;            /* routed_scaling_factor */
    float moe_norm_min;         /* > 0: renormalize by max(sum, moe_norm_min) (ERNIE 4.5); 0: by
                                 * sum + 1e-20 (DeepSeek) */

    /* multi-head latent attention (layers with kv = KV_LATENT; DeepSeek-V2/V3): per head
     * q = [nope | rope] of qk_nope_dim + qk_rope_dim, v of v_head_dim; n_rot = qk_rope_dim */
    int q_lora_rank;            /* > 0: q = q_b(norm(q_a(x))); 0: q = q_proj(x) */
    int kv_lora_rank;           /* width of the compressed latent */
    int qk_nope_dim, qk_rope_dim, v_head_dim;

    /* recurrent layers (KV_RECURRENT): the families' model-wide values. Each family reads
     * its own config names into these and sets every recurrent layer's state sizes. */
    struct {
        int d_conv;             /* convolution width (LFM2 conv_L_cache, Mamba conv_kernel) */
        int d_inner;            /* inner width of the mixer (Mamba: expand * hidden) */
        int d_state;            /* SSM state per channel / head dim */
        int n_head;             /* SSM heads (Mamba-2), value heads (delta rule) */
        int head_dim;           /* channels per head (Mamba-2), value head dim (delta rule) */
        int n_group;            /* B/C groups (Mamba-2), key heads (delta rule) */
        int k_head_dim;         /* key head dim (delta rule) */
        int dt_rank;            /* Mamba's dt projection rank */
        int chunk;              /* prefill chunk of the chunked scans */
        bool conv_bias;         /* the convolution has a bias */
        bool proj_bias;         /* in / out projections have biases */
        float dt_min, dt_max;   /* clamp of softplus(dt + dt_bias) (time_step_limit); 0, inf: none */
        float norm_eps;         /* the gated norm's epsilon */
        int norm_groups;        /* Mamba-2's gated norm: RMS over d_inner / norm_groups columns
                                 * at a time (1: the whole row; n_group in Nemotron-H) */
        bool norm_before_gate;  /* Falcon-H1: y = norm(y) * silu(z) (else norm(y * silu(z))) */
        bool norm_off;          /* Falcon-H1 without mamba_rms_norm: y = y * silu(z), no norm */
        bool mup;               /* Falcon-H1: the input projection's z | x | B | C | dt columns
                                 * scaled by mup_mult[0..4] (ssm_multipliers) */
        float mup_mult[5];
        bool tp_norm_full;      /* a tensor-parallel rank's model: the one-group gated norm
                                 * runs over the ranks' gathered rows (model_tp_rmsnorm_full) */
        bool tp_reduce_xproj;   /* ... Mamba's x_proj partial sums all-reduced (model_tp_reduce_cols) */
    } ssm;
    /* floats per row the recurrent blocks need beyond the attention buffers (ctx_bufs.rec) */
    int rec_scratch;
    /* Falcon-H1's muP multipliers (1 = none), read by its own forward: the Mamba-2 and
     * attention inputs and outputs of a layer, and its MLP's gate and output */
    struct {
        float ssm_in, ssm_out, attn_in, attn_out, mlp_gate, mlp_down;
    } mup;

    /* scales (1 = none): x = embd_scale * embed(ids); every residual add is
     * x += residual_scale * block(x); logits *= logit_scale (Granite's multipliers and
     * logits_scaling, Gemma's sqrt(hidden), Cohere's logit_scale) */
    float embd_scale;
    float residual_scale;
    float logit_scale;
    float logit_softcap;        /* > 0: logits = cap * tanh(logits / cap) after logit_scale
                                 * (Gemma 2's final_logit_softcapping); 0: none */
    float attn_softcap;         /* every layer's attention soft-capping (layer_spec.softcap) */

    /* encoders (BERT, XLM-RoBERTa; ADR 0083): every layer attends its whole sequence, no KV
     * cache is kept, and the forward leaves the last hidden states in ctx_bufs.x (and a
     * sequence-classification head's logits in ctx_bufs.logits) instead of next-token logits */
    bool encoder;
    int n_type_vocab;           /* token_type_embeddings rows (type_vocab_size); 0: none */
    int pos_offset;             /* the first token's absolute position id: 0 (BERT), or
                                 * padding_idx + 1 (RoBERTa's create_position_ids_from_input_ids) */
    int32_t pad_id;             /* RoBERTa: a pad token takes position padding_idx; -1: none */
    int n_cls;                  /* labels of a sequence-classification head (pooler dense + tanh,
                                 * then the classifier); 0: none */
    /* decoders run by the encoder path (ADR 0097): encoder is set for them too (no KV cache
     * kept, no generation); causal: every row attends its sequence's rows up to itself (a
     * causal decoder's embedding model: Qwen3-Embedding) instead of the whole sequence, and
     * a sequence's output row is its last, not its first; lm_rerank: scored from the LM
     * head's logits of "yes" and "no" at the last row (Qwen3-Reranker, ADR 0098), or with
     * n_cls > 0 from a score head of n_cls labels in the LM head's place (a converted one:
     * Qwen3ForSequenceClassification, ADR 0136), in the same prompt */
    bool causal;
    bool lm_rerank;
    bool cls_mean;              /* the classification head reads the mean of the sequence's rows,
                                 * not its first (ModernBERT's classifier_pooling "mean") */

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

    /* per-layer structure, [n_layer] valid (hparams_fill_layers) */
    struct layer_spec layer[HP_MAX_LAYERS];
};

/* Fill the defaults shared by every family before its parse_config runs. */
void hparams_init(struct hparams *hp);
/* Every layer's spec from the model-wide values above (parse_config calls it once the
 * model-wide fields are final, then adjusts the layers that differ). */
void hparams_fill_layers(struct hparams *hp);
/* Reject values that cannot work (model-wide and per layer); the message names the
 * config field. */
int hparams_validate(const struct hparams *hp, struct err *e);

/* The model turns rope by three position streams (M-RoPE: hp->mrope_section set). */
static inline bool hparams_has_mrope(const struct hparams *hp)
{
    return hp->mrope_section[0] + hp->mrope_section[1] + hp->mrope_section[2] > 0;
}

/* The M-RoPE stream (0 temporal, 1 height, 2 width) whose position turns rope frequency j
 * (0 <= j < n_rot / 2): contiguous sections, or interleaved t, h, w (hp.mrope_interleaved). */
static inline int hparams_mrope_stream(const struct hparams *hp, int j)
{
    const int *ms = hp->mrope_section;
    if (hp->mrope_interleaved)
        return j % 3 == 1 && j < 3 * ms[1] ? 1 : j % 3 == 2 && j < 3 * ms[2] ? 2 : 0;
    return j < ms[0] ? 0 : j < ms[0] + ms[1] ? 1 : 2;
}

/* The longest sequence a cache may hold: n_ctx_max when a rope extends past the trained
 * context (dynamic NTK), else n_ctx. */
int hparams_ctx_limit(const struct hparams *hp);
/* The context a run gets when none is asked for: n_ctx, except for dynamic NTK rope, whose
 * scaling engages only past n_ctx (transformers rescales at any length, llama.cpp has no
 * such rope): n_ctx x rope_scaling.factor, the length the factor was chosen for, at most
 * hparams_ctx_limit. A cache is sized for what a run needs, not for this. */
int hparams_ctx_default(const struct hparams *hp);

/* v in [lo, hi], else -ERR_CONFIG naming the config field. Families call it on the values
 * they derive sizes from (products, head_dim, rotary dims) before computing them, so every
 * derived size is computed from bounded inputs (in int64_t) and checked before narrowing. */
int hparams_check_dim(int64_t v, const char *field, int64_t lo, int64_t hi, struct err *e);

#ifdef __cplusplus
}
#endif
