/*
 * rng: xoshiro256** (Blackman & Vigna) seeded through splitmix64. Small,
 * fast and reproducible: one seed gives the same stream on every machine,
 * which the sampler (--seed) and `mlxcel synth` (weights from a seed) rely on.
 * Not for anything security-related.
 */
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rng {
    uint64_t s[4];
};

/* The four state words from splitmix64 of seed (never all zero). */
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(struct rng *r);

#ifdef __cplusplus
}
#endif
