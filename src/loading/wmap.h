/*
 * wmap: binding checkpoint tensors to canonical slots, with shape and dtype
 * checks. Families call these from map_weights; they are the only functions
 * that turn a checkpoint name into a struct tensor.
 *
 * Names are printf formats ("model.layers.%d.mlp.up_proj"), so a family
 * writes each name once. A linear is looked up as PREFIX.weight (+ MLX
 * PREFIX.scales / PREFIX.biases when the checkpoint is quantized); the
 * logical shape is checked either way. Errors name the tensor and the
 * expected versus actual shape.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/safetensors.h"
#include "../core/tensor.h"
#include "quant.h"

#ifdef __cplusplus
extern "C" {
#endif

struct wmap {
    struct st_set *st;
    const struct qconfig *qc;  /* the checkpoint's quantization settings */
};

#define WM_REQUIRED true
#define WM_OPTIONAL false

/* A float tensor NAME with the given shape (ndim dims). Absent + optional -> out->ndim = 0. */
int wm_tensor(struct wmap *w, struct tensor *out, bool required, int ndim, const int64_t *shape,
              struct err *e, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* A linear weight PREFIX.weight of logical shape [lead.., n_out, n_in] (lead: stacked experts,
 * n_lead = 0 or 1), quantized when PREFIX.scales exists and the model is quantized. */
int wm_linear(struct wmap *w, struct tensor *out, bool required, int64_t n_lead, int64_t n_out,
              int64_t n_in, struct err *e, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* A 1-D float tensor of n elements. */
int wm_vec(struct wmap *w, struct tensor *out, bool required, int64_t n, struct err *e,
           const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* True when tensor NAME exists. */
bool wm_has(struct wmap *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
