/*
 * mtp: the steps of model_load_mtp (model.c) that know where a checkpoint keeps its
 * multi-token-prediction layer (mtp.c; ADR 0108). Internal to src/models.
 */
#pragma once
#include <cjson/cJSON.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Before parse_config: ops has an MTP layout and cfg states num_nextn_predict_layers >= 1
 * (Qwen3-Next: mtp_num_hidden_layers, or num_nextn_predict_layers, not 0)
 * (-ERR_UNSUPPORTED / -ERR_CONFIG naming what is missing); cfg's num_hidden_layers grows by one
 * (so that the family parses the MTP layer's spec too; Qwen3-Next: a full-attention layer) and
 * *n_main is the model's own count. */
int mtp_config(cJSON *cfg, const struct model_ops *ops, int *n_main, struct err *e);
/* model_load of a family with an MTP layout: *n the config's num_nextn_predict_layers (0 when
 * absent), and after st_set_open those layers' tensors (model.layers.n_layer ..) marked as not
 * read, since the causal LM does not use them. */
int mtp_count(const cJSON *cfg, int *n, struct err *e);
void mtp_skip(struct st_set *st, int n_layer, int n);
/* After parse_config: layer n_main's spec becomes layer 0's, the only one (MTP_QWEN3_NEXT:
 * with layer 0's FFN, as vLLM indexes the layer). */
void mtp_layer_spec(struct hparams *hp, int n_main, enum mtp_layout layout);
/* Before map_weights: the MTP layer's tensors under the names map_weights reads (mtp.c);
 * -ERR_FORMAT naming the first missing one. */
int mtp_rename(struct st_set *st, int n_main, enum mtp_layout layout, struct err *e);
/* After map_weights: m->mtp (enorm, hnorm, eh_proj; Qwen3-Next's pre_fc norms made 1 + w). */
int mtp_map(struct model *m, struct st_set *st, struct err *e);

#ifdef __cplusplus
}
#endif
