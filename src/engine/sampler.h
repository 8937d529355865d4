/*
 * sampler: turns a row of logits into the next token id.
 *
 * Order of the transforms (the Hugging Face logits-processor order):
 * repetition penalty over the last repeat_last_n tokens -> temperature ->
 * top-k -> top-p (nucleus) -> min-p -> draw from the renormalized
 * distribution. temperature <= 0 is greedy (argmax; ties to the lower id).
 * The RNG is xoshiro256** seeded from `seed`, so a seed reproduces a run.
 * Scratch space is allocated once per sampler (n_vocab entries).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sampler_params {
    float temperature;     /* <= 0: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off (HF repetition_penalty: divide positive, multiply negative) */
    int repeat_last_n;     /* window of recent tokens the penalty looks at */
    uint64_t seed;
};

/* Greedy, no penalty. */
void sampler_params_default(struct sampler_params *p);
/* Reject values that make no sense (negative temperature is fine = greedy). */
int sampler_params_check(const struct sampler_params *p, struct err *e);

struct sampler;

int sampler_new(struct sampler **out, const struct sampler_params *p, int n_vocab, struct err *e);
void sampler_free(struct sampler *s);
/* Record a token as part of the context (prompt or generated) for the penalty. */
void sampler_accept(struct sampler *s, int32_t id);
/* Pick the next id from logits [n_vocab]; logits are not modified. */
int32_t sampler_sample(struct sampler *s, const float *logits);

#ifdef __cplusplus
}
#endif
