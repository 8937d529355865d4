/*
 * sampler: turns a row of logits into the next token id.
 *
 * Order of the transforms (the Hugging Face logits-processor order):
 * repetition penalty over the last repeat_last_n tokens -> temperature ->
 * top-k -> top-p (nucleus) -> min-p -> draw from the renormalized
 * distribution. A temperature below SAMPLER_GREEDY_TEMP is greedy (argmax;
 * ties to the lower id). Logits are scaled as (l - max) / T in double, so a
 * tiny temperature cannot overflow into inf - inf = NaN.
 *
 * Bounds: sampler_bounds[] is the one table of valid ranges; the CLI flags
 * and generation_config.json values are checked against it
 * (sampler_bound_check) and sampler_params_check applies it again.
 * The RNG is xoshiro256** seeded from `seed`, so a seed reproduces a run.
 * Scratch space is allocated once per sampler (n_vocab entries).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "constraint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Below this temperature sampling is argmax: at T = 1e-5 a logit gap of 1e-3 is already
 * exp(-100) apart, so float32 logits leave nothing but the top id (or exact ties). */
#define SAMPLER_GREEDY_TEMP 1e-5f

struct sampler_params {
    float temperature;     /* < SAMPLER_GREEDY_TEMP: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off (HF repetition_penalty: divide positive, multiply negative) */
    int repeat_last_n;     /* window of recent tokens the penalty looks at */
    float presence_penalty;   /* OpenAI: minus this once for every id generated so far (0: off) */
    float frequency_penalty;  /* OpenAI: minus this times the id's count so far (0: off) */
    const struct sampler_bias *bias;  /* logit_bias, added first (copied by sampler_new) */
    int n_bias;
    struct constraint cons;           /* ops NULL: none; masks before everything else */
    uint64_t seed;
};

/* One logit_bias entry: bias (within SAMPLER_MAX_BIAS) added to the logit of id. */
struct sampler_bias {
    int32_t id;
    float bias;
};
#define SAMPLER_MAX_BIAS 100.0f
#define SAMPLER_MAX_PRESENCE 2.0f  /* bound of presence_penalty and frequency_penalty */

/* The sampling values that come from users or checkpoints. */
enum sampler_field {
    SAMPLER_TEMPERATURE = 0,
    SAMPLER_TOP_K = 1,
    SAMPLER_TOP_P = 2,
    SAMPLER_MIN_P = 3,
    SAMPLER_REPEAT_PENALTY = 4,
    SAMPLER_REPEAT_LAST_N = 5,
    SAMPLER_N_FIELDS = 6,
};

/* Valid range [lo, hi] of one field, with its CLI flag and generation_config.json key. */
struct sampler_bound {
    const char *flag;
    const char *config_key;
    double lo, hi;
};

extern const struct sampler_bound sampler_bounds[SAMPLER_N_FIELDS];

/* 0 when v is finite and within sampler_bounds[f]; else -ERR_ARG with a message naming
 * `source` (a flag or a file), the field and the range. */
int sampler_bound_check(enum sampler_field f, double v, const char *source, struct err *e);

/* Greedy, no penalty. */
void sampler_params_default(struct sampler_params *p);
/* Every field within sampler_bounds (-ERR_ARG naming the field otherwise). */
int sampler_params_check(const struct sampler_params *p, struct err *e);

struct sampler;

int sampler_new(struct sampler **out, const struct sampler_params *p, int n_vocab, struct err *e);
void sampler_free(struct sampler *s);
/* Record a token as part of the context (prompt or generated) for the repetition penalty. */
void sampler_accept(struct sampler *s, int32_t id);
/* Record a generated token: sampler_accept plus the count the presence and frequency
 * penalties read (they look at generated tokens only, as OpenAI and vLLM do), and the
 * constraint's advance. Returns the constraint's verdict (< 0: id was not allowed). */
int sampler_accept_output(struct sampler *s, int32_t id);
/* Pick the next id from logits [n_vocab]; logits are not modified. */
int32_t sampler_sample(struct sampler *s, const float *logits);

/* Speculative sampling of a drafted token (the draft is one id, its own probability 1):
 * sampler_sample's draw, accepted when it is the draft. That is Leviathan et al.'s rule for a
 * point-mass draft (accepted with the probability the transforms above give it, else a draw
 * from the rest, renormalized), and it takes the same one uniform per output token as plain
 * decoding, so a seeded sequence gives plain decoding's tokens whatever it drafted (ADR 0116;
 * for a greedy sampler: the argmax, accepted when it is the draft). *accepted says whether
 * the result is the draft. logits are not modified. */
int32_t sampler_sample_draft(struct sampler *s, const float *logits, int32_t draft, bool *accepted);

/* Log-probabilities under the model: log_softmax of the raw logits [n_vocab] (before any
 * sampling transform, as OpenAI's and vLLM's logprobs). *lp_id receives id's; the n_top
 * most likely ids (descending, ties to the lower id) go to top_id/top_lp (n_top <= n_vocab;
 * 0 for none). Computed in double. */
void sampler_logprobs(const float *logits, int n_vocab, int32_t id, int n_top, float *lp_id,
                      int32_t *top_id, float *top_lp);

#ifdef __cplusplus
}
#endif
