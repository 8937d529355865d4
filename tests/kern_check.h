/*
 * kern_check: fixtures of the kernel suites (test_kernels.c, test_kernels_ops.c):
 * one backend per ISA this CPU runs x threads {1, 3}, a seeded generator,
 * and the comparison of a result with its double-precision reference
 * (normalized MSE and max relative error per ISA, printed per test).
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "test.h"

#define N_BE_MAX 6

struct kc_bes {
    struct backend *be[N_BE_MAX];
    int n;
};

/* Worst errors seen by one test per ISA (scalar, avx2, avx512), printed at its end. */
struct kc_errstat {
    double nmse[3], maxrel[3];
};

/* The generator's state; kc_open resets it so each test's data is independent. */
extern uint64_t kc_rng;

/* Every ISA the machine supports x threads {1, 3}. */
void kc_open(struct kc_bes *b);
/* The same with the backend options o (kc_open: test_backend_opts()). */
struct backend_opts;
void kc_open_opts(struct kc_bes *b, const struct backend_opts *o);
void kc_close(struct kc_bes *b);
float kc_frand(float lo, float hi);
unsigned kc_urand(unsigned n);
/* n uniform floats in [lo, hi) (freed by the caller). */
float *kc_fvec(size_t n, float lo, float hi);
int kc_isa_index(const struct backend *be);
/* Compare got against ref (n values); fail above the thresholds. */
void kc_check(struct kc_errstat *st, const char *what, const struct backend *be, const float *got,
              const double *ref, size_t n, double thr_nmse, double thr_rel);
void kc_report(const char *test, const struct kc_errstat *st);
