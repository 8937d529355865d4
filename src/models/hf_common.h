/*
 * hf_common: the config fields and tensor names shared by the Hugging Face
 * decoder families (LlamaForCausalLM and its relatives). A family's
 * parse_config calls hf_parse_decoder and then sets what differs; its
 * map_weights calls hf_map_decoder, which binds names according to the
 * hparams flags (biases, qk-norm, fused qkv/gate_up, MoE, LayerNorm).
 */
#pragma once
#include <cjson/cJSON.h>

#include "../loading/convert.h"
#include "../loading/wmap.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The defaults of one transformers config class, for the fields that have one.
 * Each family writes its table once; nothing else invents a default. */
struct hf_defaults {
    const char *eps_key;     /* "rms_norm_eps" or "layer_norm_eps" */
    float norm_eps;
    float rope_theta;
    float partial_rotary;    /* partial_rotary_factor */
    const char *act;         /* hidden_act */
    int head_dim;            /* head_dim when absent; 0: hidden_size / num_attention_heads */
    bool sliding;            /* use_sliding_window when absent (Qwen: false; Mistral-style: the
                              * presence of sliding_window decides) */
    bool tie_embd;           /* tie_word_embeddings when absent (Gemma, Cohere: true) */
};

/* vocab_size, hidden_size, num_hidden_layers, num_attention_heads (required);
 * num_key_value_heads (= heads), head_dim (= hidden / heads), intermediate_size,
 * max_position_embeddings (required), the norm epsilon, rope_theta,
 * partial_rotary_factor, rope_scaling / rope_parameters, hidden_act,
 * tie_word_embeddings (d->tie_embd), attention_bias (false). */
int hf_parse_decoder(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                     struct err *e);

/* Norm weight (+ bias for a LayerNorm with hp->norm_bias) PREFIX.weight / PREFIX.bias of n_embd. */
int hf_map_norm(struct wmap *w, const struct hparams *hp, struct tensor *wt, struct tensor *b,
                const char *prefix, struct err *e);

/* partial_rotary_factor, from rope_parameters (transformers 5) or the top level, must be 1 or
 * absent (the families whose rope transformers cannot run on part of the head); else an error
 * naming the field, with why. */
int hf_check_full_rotary(const cJSON *cfg, const char *why, struct err *e);

/* Fill every layer's spec (hparams_fill_layers) once the family set its model-wide
 * fields, then the attention kind per layer, as transformers resolves it:
 * `layer_types` ("full_attention" / "sliding_attention") when present, else
 * `sliding_window` (null/absent: none) on the layers from `max_window_layers` on
 * (absent: max_window_default), unless `use_sliding_window` (absent: d->sliding) is false. */
int hf_finish_layers(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                     int max_window_default, struct err *e);

/* The sliding / full layers of the hybrid families (OLMo 3, EXAONE 4): every layer's spec
 * (hparams_fill_layers), then `layer_types` when listed, else layer il slides unless
 * (il + 1) % pattern == 0 (pattern 0: no layer slides). The window is `sliding_window`
 * (absent: win_default; null: none, an error for a sliding layer). */
int hf_hybrid_layers(struct hparams *hp, const cJSON *cfg, int win_default, int pattern,
                     struct err *e);

/* Experts-per-layer fields of MoE configs: num_local_experts, num_experts_per_tok. */
int hf_parse_moe(struct hparams *hp, const cJSON *cfg, struct err *e);

/* Qwen-MoE sparse layers, after hf_finish_layers: num_experts, num_experts_per_tok,
 * moe_intermediate_size (required), norm_topk_prob (false: ROUTER_SOFTMAX_TOPK_RAW, else
 * renormalized), decoder_sparse_step (1) and mlp_only_layers ([]): layer il has experts when
 * num_experts > 0, il is not in mlp_only_layers and (il + 1) % decoder_sparse_step == 0, else a
 * dense GLU of intermediate_size. shared_key (or NULL): the config field of a shared expert's
 * width on every MoE layer. hp->n_ff becomes the widest FFN of any layer. */
int hf_parse_sparse_moe(struct hparams *hp, const cJSON *cfg, const char *shared_key,
                        struct err *e);

/* model.layers.N.self_attn.{q,k,v,o}_proj (or a fused qkv_proj), with the biases hp asks for
 * (qkv_bias, out_bias) and q_norm / k_norm when layer N's spec has a q/k norm ([head_dim], the
 * full q / k width with qk_norm_full, or [heads, head_dim] with hp->qk_norm_per_head). A missing
 * tensor is an error naming it. */
int hf_map_attention(struct wmap *w, const struct hparams *hp, struct layer *L, int il,
                     struct err *e);

/* Checkpoint names of a family's MoE layers (each format takes the layer index). */
struct hf_moe_names {
    const char *router;                       /* the gate linear */
    const struct expert_stack_rule *experts;  /* gate, down, up: per-expert and stacked formats */
    const char *shared;                       /* shared expert prefix ({gate,up,down}_proj), or NULL */
    const char *shared_gate;                  /* its sigmoid gate linear [1, n_embd] (not read for
                                               * layers whose spec adds the shared expert plain) */
    const char *router_bias;                  /* with hp->router_bias: the correction bias of a
                                               * grouped router [n_expert] (widened to F32), or NULL */
};

/* The correction bias NAME of a grouped router into L->router_b: [n_expert], or [1, n_expert]
 * (ERNIE 4.5's one expert group; grouped: the shape a recording st_set writes), published F32;
 * another float dtype is widened once, exactly, into model-owned memory. */
int hf_map_router_bias(struct model *m, struct wmap *w, struct layer *L, const char *name,
                       bool grouped, struct err *e);

/* Layer il's FFN: with layer_spec.moe the router, the shared expert (n_ff_shexp > 0) and the
 * experts under names; else model.layers.N.mlp.{gate,up,down}_proj or gate_up_proj. */
int hf_map_ffn(struct model *m, struct wmap *w, struct layer *L, int il,
               const struct hf_moe_names *names, struct err *e);

/* hf_map_decoder with the MoE layers under the given names. */
int hf_map_decoder_moe(struct model *m, struct st_set *st, const struct hf_moe_names *names,
                       struct err *e);

/* model.embed_tokens, model.layers.N.{input_layernorm, post_attention_layernorm (not with a
 * parallel residual), self_attn (hf_map_attention), mlp.{gate,up,down}_proj |
 * gate_up_proj (a non-gated FFN_MLP layer: up_proj, down_proj), block_sparse_moe.{gate,
 * experts.E.w1/w2/w3}}, model.norm, lm_head.
 * Post-norm layers (RESID_POST) bind post_attention_layernorm and post_feedforward_layernorm
 * to the attn_norm / ffn_norm slots instead. Sandwich layers (RESID_SANDWICH) bind
 * input_layernorm / pre_feedforward_layernorm there and post_attention_layernorm /
 * post_feedforward_layernorm to attn_post_norm / ffn_post_norm. */
int hf_map_decoder(struct model *m, struct st_set *st, struct err *e);

/* Bind an expert_linear: E tensors PREFIX_FMT with the expert index, or one stacked
 * tensor. Helpers for MoE families; views are stored in m->expert_views. */
int hf_experts_alloc(struct model *m, struct err *e);
/* Reserve the E views of el (and of its biases) for a family that fills them itself. */
int hf_expert_views(struct model *m, struct expert_linear *el, bool bias, struct err *e);
int hf_map_expert_linear(struct model *m, struct wmap *w, struct expert_linear *el, int il,
                         int64_t n_out, int64_t n_in, bool bias, const char *per_expert_fmt,
                         const char *stacked_fmt, struct err *e);

/* The stacking rules of the block_sparse_moe experts (Mixtral, PhiMoE), and of the
 * mlp.experts ones (Qwen2/3-MoE: mlp.switch_mlp once stacked). */
extern const struct expert_stack_rule hf_moe_stacking[];
extern const struct expert_stack_rule hf_mlp_experts_stacking[];

/* mlx-lm's quant predicates (model_ops.quant_predicate; convert.h's ck_quant_predicate_fn),
 * by the module's last name: hf_quant_gate_8bit quantizes "mlp.gate" at 8 bits group 64
 * (qwen3_moe's), hf_quant_router_8bit "mlp.router" the same (gpt_oss's), and
 * hf_quant_gate_float keeps "mlp.gate" float (DeepSeek's MoEGate is no nn.Linear). */
int hf_quant_gate_8bit(const char *module, const struct quant_params *base, struct quant_params *qp);
int hf_quant_router_8bit(const char *module, const struct quant_params *base, struct quant_params *qp);
int hf_quant_gate_float(const char *module, const struct quant_params *base, struct quant_params *qp);

/* DeepSeek-V3's routed experts beside ordinary attention (dots1, glm4_moe): the defaults of
 * the family's config class for the fields below; -1: the field is required. */
struct hf_v3_moe_defaults {
    int n_routed;        /* n_routed_experts */
    int k;               /* num_experts_per_tok */
    int moe_ff;          /* moe_intermediate_size */
    int n_shared;        /* n_shared_experts */
    int first_dense;     /* first_k_dense_replace */
    int n_group, topk_group;
    bool norm_topk;      /* norm_topk_prob */
    float scale;         /* routed_scaling_factor */
    bool mlp_layer_types; /* the config may list mlp_layer_types (GLM-4.7-Flash) */
};

/* After hf_finish_layers: the noaux_tc router of DeepSeek-V3 (ROUTER_GROUP_SIGMOID with the
 * correction bias in router_b) on the layers from first_k_dense_replace on, each with experts
 * of moe_intermediate_size and n_shared_experts shared ones added plain (one GLU of
 * n_shared * moe_intermediate_size); the layers before it a dense GLU of intermediate_size.
 * With d->mlp_layer_types, a config's non-null `mlp_layer_types` (one "dense" / "sparse" per
 * layer) decides instead. hp->n_ff becomes the widest FFN. Rejections name the field. */
int hf_parse_v3_moe(struct hparams *hp, const cJSON *cfg, const struct hf_v3_moe_defaults *d,
                    struct err *e);

/* dst [E][rows][cols] = src [E][cols][rows], transposed per expert, elements of es bytes
 * (transformers' x @ W expert tensors into the [out, in] the kernels read: gpt-oss, Llama 4). */
void hf_transpose_experts(void *dst, const void *src, int64_t E, int64_t rows, int64_t cols,
                          size_t es);

/* The float tensor name [E, n_in, n_out] (transformers' x @ W experts) transposed into an
 * owned [E, n_out, n_in] in *out (from a recording st_set: its shape only). */
int hf_take_transposed(struct model *m, struct wmap *w, struct tensor *out, int64_t n_out,
                       int64_t n_in, const char *name, struct err *e);

/* Token embedding, final norm and head under the given names (head NULL: tied). */
int hf_map_head(struct model *m, struct wmap *w, const char *embd, const char *norm,
                const char *head, struct err *e);

/* M-RoPE's mrope_section (ADR 0094) into hp->mrope_section: from rope_scaling (published
 * configs, transformers 4) or rope_parameters (transformers 5); three integers, else
 * -ERR_CONFIG. */
int hf_parse_mrope(struct hparams *hp, const cJSON *cfg, struct err *e);

#ifdef __cplusplus
}
#endif
