/*
 * deepseek: what DeepSeek-V2 (deepseek_v2.c) and DeepSeek-V3 (deepseek_v3.c) share:
 * the config of multi-head latent attention and of the routed + shared experts, and the
 * checkpoint names. The families differ only in their router (DEEPSEEK_V2: softmax,
 * greedy or group-limited by the group's best expert; DEEPSEEK_V3: sigmoid with a
 * correction bias, groups ranked by their top-2 sum, weights renormalized) and in
 * V3's rope_interleave switch.
 */
#pragma once
#include <cjson/cJSON.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

enum deepseek_version { DEEPSEEK_V2 = 2, DEEPSEEK_V3 = 3 };

int deepseek_parse_config(struct hparams *hp, const cJSON *cfg, enum deepseek_version v,
                          struct err *e);
int deepseek_map_weights(struct model *m, struct st_set *st, struct err *e);

#ifdef __cplusplus
}
#endif
