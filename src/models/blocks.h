/*
 * blocks: the shared transformer building blocks every family is made of,
 * and the generic forward pass that composes them from struct hparams flags
 * (norm kind, parallel residual, fused projections, qk-norm, partial and
 * scaled rotary, dense GLU/MLP or routed experts). Families differ only in
 * hparams and in how map_weights binds the canonical layout (model.h).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The forward pass of every family (struct model_ops.forward). */
int blk_forward(struct model_ctx *c, const int32_t *ids, int n_tok, float *logits,
                bool all_logits, struct err *e);

/* Router: pick hp->n_expert_used experts for one token from its gate logits
 * [n_expert] and their weights. Ties break toward the lower expert index. */
void blk_route(const struct hparams *hp, const float *logits, int *sel, float *w);

/* Inverse frequencies [n_rot / 2] for hp's rope kind (long factors for longrope into
 * inv_long, which may be NULL otherwise). Computed in double. */
void blk_rope_freqs(const struct hparams *hp, float *inv, float *inv_long);

#ifdef __cplusplus
}
#endif
