/*
 * synth: random-weight checkpoints of any shape (`mlxcel synth`), for
 * benchmarks at real proportions without a download.
 *
 * The tensor list is not written down anywhere here: synth_record runs the
 * family's own map_weights against a recording st_set (safetensors.h), so
 * the names and shapes are exactly what the loader asks for. synth_checkpoint
 * then streams them through the convert pipeline (convert.h) with a seeded
 * generator as the source: float output keeps the published per-expert
 * layout, quantized output is the MLX layout (experts stacked by the
 * family's expert_stacking rules), bit-identical to `mlxcel convert -q` of the
 * float output of the same seed.
 *
 * Values: matrices ~ N(0, 0.02) (the HF initializer_range), norm weights 1,
 * biases ~ N(0, 0.002); each block of 65536 elements of a tensor draws from
 * its own xoshiro256** stream seeded from (seed, tensor name, block), so its
 * values do not depend on the other tensors, the dtype, the layout or the
 * number of threads.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/err.h"
#include "../core/safetensors.h"
#include "../loading/convert.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct synth_opts {
    const char *config;              /* config.json path */
    const char *dst;                 /* new folder (absent or empty) */
    const struct quant_params *q;    /* NULL: float */
    int dtype;                       /* -1: the config's torch_dtype, else BF16 */
    uint64_t seed;
    int n_threads;                   /* generator and quantizer threads; <= 0: online CPUs
                                      * (at most CK_MAX_THREADS); the bytes do not depend on it */
    const char *tokenizer;           /* folder to copy tokenizer files from, or NULL */
    ck_progress_fn progress;
    void *progress_ud;
};

struct synth_stats {
    struct ck_stats ck;
    const char *family;
    enum dtype dtype;
};

/* The tensors the family of cfg loads (F32 placeholders, name order) into a recording
 * set *out (caller frees), and the family's ops. Config errors name the field. */
int synth_record(const cJSON *cfg, struct st_set **out, const struct model_ops **ops, struct err *e);

/* Whether a tensor of an image-text checkpoint belongs to its vision tower or projector (kept
 * float by `synth -q`, as mlx-vlm converts them). */
bool synth_is_vision(const char *name);

/* Write config.json (last), model.safetensors and the optional tokenizer files into o->dst. */
int synth_checkpoint(const struct synth_opts *o, struct synth_stats *st, struct err *e);

#ifdef __cplusplus
}
#endif
