/*
 * constraint: what a sequence may generate next (structured output: a JSON
 * schema, a grammar, a forced tool call). A constraint is a state machine
 * over tokens owned by the caller: before each sampling the sampler asks it
 * to mask the logits of the ids it forbids now (set them to -INFINITY; when
 * the output is complete it allows only end-of-sequence ids), and after the
 * choice it is advanced with the chosen id. Masking happens on the sampler's
 * working copy, so logprobs still report the model's raw distribution.
 *
 * The engine knows only this interface; implementations live where their
 * input is parsed (e.g. the JSON-schema compiler).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct constraint_ops {
    /* logits[n_vocab]: set every id not allowed now to -INFINITY. At least one id stays
     * allowed (an end-of-sequence id when nothing else may follow). */
    void (*mask)(void *state, float *logits, int n_vocab);
    /* advance with the id just generated; < 0 when it was not allowed */
    int (*accept)(void *state, int32_t id);
};

struct constraint {
    const struct constraint_ops *ops;
    void *state;                  /* borrowed: outlives the generation */
};

#ifdef __cplusplus
}
#endif
