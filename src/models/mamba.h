/*
 * mamba: what Mamba (mamba.c) and the hybrids with Mamba layers (jamba.c) share: the mixer's
 * config values (hp->ssm), a layer's recurrent spec, and the mixer's checkpoint names under a
 * prefix (in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj; Jamba's dt / B / C norms).
 */
#pragma once
#include <cjson/cJSON.h>

#include "../loading/wmap.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sizes of the mixer, as the config names them (for messages). */
struct mamba_fields {
    const char *expand, *d_state, *d_conv, *dt_rank, *conv_bias, *proj_bias;
    float expand_def;          /* transformers' defaults */
    int d_state_def, d_conv_def;
    bool conv_bias_def, proj_bias_def;
};

/* hp->ssm (d_inner = expand * hidden_size, d_state, d_conv, dt_rank: an int or "auto" =
 * ceil(hidden_size / 16), conv_bias, proj_bias) from cfg under the names in f, each checked
 * (d_state in [1, 256], the scan's limit; d_conv in [1, 64]); hp->n_embd is set. Also
 * hp->rec_scratch for blk_mamba. -ERR_CONFIG naming the field. */
int mamba_parse_ssm(struct hparams *hp, const cJSON *cfg, const struct mamba_fields *f,
                    struct err *e);
/* Make layer il a Mamba layer: MIXER_MAMBA over a recurrent state of (d_conv - 1) * d_inner
 * conv floats and d_inner * d_state scan floats per sequence. */
void mamba_layer(struct hparams *hp, int il);
/* Bind layer L's mixer under PREFIX (a printf format of the layer index): PREFIX.in_proj,
 * conv1d (the published [d_inner, 1, d_conv] or MLX's [d_inner, d_conv, 1], widened to F32),
 * x_proj (split into its dt and B | C rows), dt_proj (+ bias), A_log, D (F32), out_proj, and with
 * bcdt_norms PREFIX.{dt,b,c}_layernorm. A missing or misshapen tensor is an error naming it. */
int mamba_map_mixer(struct model *m, struct wmap *w, struct layer *L, int il, const char *prefix,
                    bool bcdt_norms, struct err *e);

#ifdef __cplusplus
}
#endif
