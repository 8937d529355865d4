/*
 * quant: the MLX quantization settings of a checkpoint (config.json
 * "quantization"), validated once, and resolved per module at weight-binding
 * time.
 *
 * config.json carries a top-level (group_size, bits, mode) and, optionally,
 * per-module overrides keyed by module path (the tensor prefix: "P.weight"
 * has path "P"):
 *   "P": {"group_size": g, "bits": b, "mode": m}   keys missing from the entry
 *        take the defaults of the entry's own mode (a missing mode is affine,
 *        whatever the top level says)
 *   "P": true    the top-level parameters
 *   "P": false   a float module
 * Every stored (mode, group_size, bits) is validated here, before any weight
 * is bound, so no kernel can see a combination outside
 *   affine {2,3,4,5,6,8} x {32,64,128},  mxfp4 (32,4),  mxfp8 (32,8),  nvfp4 (16,4).
 * The number of overrides and the path lengths are bounded.
 *
 * Whether a module is quantized is decided by the weights (wmap.c): P.scales
 * exists and P.weight is U32. The config must agree: quantized weights with
 * no quantization config, or with an override of false, and an override that
 * asks for quantization of a float module, are load errors.
 */
#pragma once
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "../core/err.h"
#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QCFG_MAX_OVERRIDES 65536   /* per-module entries in "quantization" */
#define QCFG_MAX_PATH      256     /* bytes of one module path */

struct qparams {
    enum qmode mode;
    int bits;     /* 0: float */
    int group;    /* elements per scale group */
};

struct qoverride {
    char *path;            /* module path, owned */
    struct qparams p;      /* bits == 0 for false */
};

struct qconfig {
    bool present;          /* config.json has a quantization object */
    struct qparams top;    /* top-level parameters (bits 0 when !present) */
    struct qoverride *ov;  /* sorted by path, owned; NULL when none */
    int n_ov;
    bool hf_mxfp4;         /* quantization_config {quant_method: "mxfp4"} (openai gpt-oss):
                            * no MLX quantization; the family binds its *_blocks / *_scales */
};

/* "affine", "mxfp4", "mxfp8", "nvfp4". */
const char *qmode_name(enum qmode m);
/* Parse a mode name; -ERR_CONFIG naming it (and the valid modes) when unknown. */
int qmode_parse(const char *s, enum qmode *out, struct err *e);
/* (group_size, bits) a mode takes when the config leaves them out. */
void qmode_defaults(enum qmode m, int *group, int *bits);
/* -ERR_CONFIG unless (mode, group, bits) is one MLX defines (list above). */
int qparams_validate(const struct qparams *p, struct err *e);

/* Read cfg's "quantization" (or, when absent, an MLX-style
 * "quantization_config"; a Hugging Face quant_method there is
 * -ERR_UNSUPPORTED, except "mxfp4": hf_mxfp4, present false). No quantization object leaves
 * qc->present false.
 * Errors name the field, e.g. "quantization.model.layers.0.mlp.gate.bits". */
int qconfig_parse(struct qconfig *qc, const cJSON *cfg, struct err *e);
void qconfig_free(struct qconfig *qc);

/* The override for module path, or NULL. */
const struct qoverride *qconfig_find(const struct qconfig *qc, const char *path);
/* The parameters the config gives module path: its override, else the top
 * level (bits 0: float, or no quantization config). */
struct qparams qconfig_resolve(const struct qconfig *qc, const char *path);

#ifdef __cplusplus
}
#endif
