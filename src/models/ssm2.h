/*
 * ssm2: the Mamba-2 mixer's config fields and checkpoint names, shared by the families
 * built on it (mamba2, bamba, nemotron_h, granitemoehybrid, falcon_h1). Each family names
 * its config keys and transformers' defaults once in a struct ssm2_keys; ssm2_parse reads
 * them into hp->ssm and checks that they fit together (heads x head_dim = the inner width,
 * heads a multiple of the groups), ssm2_layer makes a layer a Mamba-2 layer (its state
 * sizes and the scratch of blk_mamba2), and ssm2_map binds one mixer's tensors (in_proj,
 * conv1d in transformers' [ch, 1, K] or mlx-lm's [ch, K, 1], dt_bias, A_log, D, norm,
 * out_proj), widening the per-channel ones to F32 for the kernels.
 */
#pragma once
#include <cjson/cJSON.h>

#include "../loading/wmap.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One family's config keys of the mixer (NULL: the family has no such key, the default
 * stands) and transformers' defaults. d_inner is inner_key's value when given, else
 * expand * hidden_size. */
struct ssm2_keys {
    const char *n_head, *head_dim, *d_state, *n_group, *d_conv, *expand, *inner;
    const char *conv_bias, *proj_bias, *chunk, *eps, *act;
    int def_n_head, def_head_dim, def_d_state, def_n_group, def_d_conv, def_chunk;
    float def_expand, def_eps;
    bool def_conv_bias, def_proj_bias;
    bool norm_per_group;     /* the gated norm works per group of d_inner / n_group */
};

/* Read the mixer's fields of cfg (hp->n_embd already set) into hp->ssm, with
 * time_step_limit (default [0, inf]; transformers 5 writes inf as {"__float__": "Infinity"}).
 * -ERR_CONFIG naming the field for sizes out of range or inconsistent, -ERR_UNSUPPORTED for
 * an activation other than silu. */
int ssm2_parse(struct hparams *hp, const cJSON *cfg, const struct ssm2_keys *k, struct err *e);

/* Layer il becomes a Mamba-2 layer (mixer, recurrent cache, state sizes; its FFN as the
 * family set it); hp->rec_scratch grows to blk_mamba2's need. */
void ssm2_layer(struct hparams *hp, int il);

/* The mixer of one layer under prefix (e.g. "backbone.layers.3.mixer"): a missing tensor
 * is an error naming it. */
int ssm2_map(struct model *m, struct wmap *w, struct layer *L, const char *prefix,
             struct err *e);

#ifdef __cplusplus
}
#endif
