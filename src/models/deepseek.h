/*
 * deepseek: what DeepSeek-V2 (deepseek_v2.c) and DeepSeek-V3 (deepseek_v3.c) share:
 * the config of multi-head latent attention and of the routed + shared experts, and the
 * checkpoint names. GLM-4.7-Flash (glm4_moe_lite.c) takes the attention half and the
 * weights from here, its experts from hf_parse_v3_moe. The families differ only in their router (DEEPSEEK_V2: softmax,
 * greedy or group-limited by the group's best expert; DEEPSEEK_V3: sigmoid with a
 * correction bias, groups ranked by their top-2 sum, weights renormalized) and in
 * V3's rope_interleave switch.
 */
#pragma once
#include <cjson/cJSON.h>

#include "hf_common.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

enum deepseek_version { DEEPSEEK_V2 = 2, DEEPSEEK_V3 = 3 };

/* A config class's defaults of the latent attention fields (null q_lora_rank: none). */
struct deepseek_mla_defaults {
    int q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    bool rope_interleave;   /* the config has rope_interleave (default true): V3 and its kin */
};

/* The attention half of a DeepSeek-style config: hf_parse_decoder with d, the latent
 * attention's dims (md; head_dim and n_rot become the q head and qk_rope_head_dim, every head
 * its own "kv head"), no biases (attention_bias = true is refused), the rope style
 * (interleaved pairs, or rotate-half with rope_interleave false) and the softmax scale
 * ((nope + rope)^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 under a scaled rope). */
int deepseek_parse_mla(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                       const struct deepseek_mla_defaults *md, struct err *e);

/* hf_finish_layers, then every layer KV_LATENT (a sliding window is refused). */
int deepseek_latent_layers(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                           struct err *e);

int deepseek_parse_config(struct hparams *hp, const cJSON *cfg, enum deepseek_version v,
                          struct err *e);
int deepseek_map_weights(struct model *m, struct st_set *st, struct err *e);

/* mlx-lm's sanitize of deepseek_v3 and glm4_moe_lite (model_ops.convert_views): kv_b_proj
 * [n_head * (nope + v), kv_lora_rank] becomes the MultiLinears embed_q [n_head, kv_lora_rank,
 * nope] (each head's k rows, transposed) and unembed_out [n_head, v, kv_lora_rank] (its v
 * rows). */
void deepseek_convert_views(const struct hparams *hp, struct ck_view_rule *out);

#ifdef __cplusplus
}
#endif
