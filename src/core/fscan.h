/*
 * fscan: scans over a row of floats that every decode step makes on the host (the
 * logits of a 128k vocabulary: the greedy pick, the finite check). Plain loops of
 * one comparison per element run at the latency of a load-compare chain (the
 * running best re-read each time: ~5 ns an element, 0.6 ms for 128256 logits) or
 * unvectorized at -O2; these keep several lanes apart and use SSE2 where the
 * target has it (every x86-64), with the same results as the plain loops.
 */
#ifndef MLXCEL_CORE_FSCAN_H
#define MLXCEL_CORE_FSCAN_H

#include <stdbool.h>
#include <stdint.h>

/* The plain loop's pick: best = 0, then every i with v[i] > v[best] becomes best.
 * That is the first index of the largest non-NaN value, or 0 when v[0] is NaN (no
 * later value compares greater than a NaN) or n <= 1. */
int32_t fscan_argmax(const float *v, int n);

/* Whether no element is a NaN or an infinity. */
bool fscan_finite(const float *v, int n);

#endif
