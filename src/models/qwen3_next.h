/*
 * qwen3_next.h: what Qwen3-Next (qwen3_next.c) shares with Qwen3.5's text model
 * (qwen3_5_text.c): the hybrid layer pattern of gated DeltaNet and gated full attention,
 * its config fields, and the weights both bind the same way. The families differ in their
 * FFN (sparse MoE with a shared expert, or dense) and in how the DeltaNet input
 * projections are stored (one head-interleaved in_proj_qkvz / in_proj_ba, or four plain
 * ones), which each family maps through its own qn_inproj_fn. The shared code is in
 * qwen3_next_common.c.
 */
#pragma once
#include <cjson/cJSON.h>

#include "hf_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The decoder fields (hf_parse_decoder with d), the linear-attention fields
 * (linear_conv_kernel_dim, linear_{key,value}_head_dim, linear_num_{key,value}_heads),
 * layer_types or full_attention_interval, and every layer's spec: DeltaNet layers with their
 * state sizes, full-attention layers with the sigmoid output gate and q/k norms. */
int qwen3_next_parse_common(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                            struct err *e);

/* Binds a DeltaNet layer's input projections (ssm_in q|k|v, ssm_z, ssm_x b, ssm_xa a). */
typedef int (*qn_inproj_fn)(struct model *m, struct wmap *w, struct layer *L, int il,
                            const char *pre, struct err *e);

/* Every weight: embeddings, norms (transformers' zero-centred weights made 1 + w at load,
 * mlx-lm's already are), the DeltaNet layers (inproj for their input projections), the
 * gated attention layers, the FFN of each layer under names, the head. */
int qwen3_next_map_common(struct model *m, struct st_set *st, const struct hf_moe_names *names,
                          qn_inproj_fn inproj, struct err *e);

/* A zero-centred norm weight t of transformers' layout as an owned F32 1 + w (the MTP module's
 * pre_fc norms, mtp.c); nothing for an absent tensor or a recording set. */
int qwen3_next_norm_plus_one(struct model *m, struct st_set *st, struct tensor *t, struct err *e);

/* Replace the view t by an owned copy whose row r is t's row perm[r] (n rows, float or
 * MLX-quantized); nothing on a recording set (synth). */
int qwen3_next_permute_rows(struct model *m, struct st_set *st, struct tensor *t,
                            const int32_t *perm, struct err *e);

#ifdef __cplusplus
}
#endif
