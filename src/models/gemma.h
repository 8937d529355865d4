/*
 * gemma: what the Gemma families share (gemma.c): Gemma 1's norm weight offset and
 * dtype-rounded embedding scale, and the config of the sandwich-norm generations
 * (Gemma 2, Gemma 3 text) built on it.
 */
#pragma once
#include <cjson/cJSON.h>

#include "hf_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Gemma 2 / 3 config class's defaults beyond hf_defaults (hf.sliding must be false:
 * the sliding layers come from layer_types or the pattern). */
struct gemma_defaults {
    struct hf_defaults hf;
    int window;              /* sliding_window */
    int pattern;             /* sliding_window_pattern: every pattern-th layer is full */
    float attn_softcap;      /* attn_logit_softcapping (0: none) */
    float final_softcap;     /* final_logit_softcapping (0: none) */
};

/* hf_parse_decoder plus: embedding scale sqrt(hidden) in the checkpoint dtype, norm weights
 * w + 1, sandwich norms, attention scale query_pre_attn_scalar^-0.5 (default 256), attention
 * and final logit soft-capping (null: none), and every layer's spec with the sliding layers
 * from layer_types, else from sliding_window_pattern. */
int gemma_parse_sandwich(struct hparams *hp, const cJSON *cfg, const struct gemma_defaults *g,
                         struct err *e);

#ifdef __cplusplus
}
#endif
