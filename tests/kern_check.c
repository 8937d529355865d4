/*
 * kern_check: the fixtures shared by the kernel suites (kern_check.h).
 */
#include "kern_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t kc_rng = 0x9e3779b97f4a7c15ull;

/* Every ISA the machine supports x threads {1, 3}. */
void kc_open(struct kc_bes *b)
{
    kc_open_opts(b, test_backend_opts());
}

void kc_open_opts(struct kc_bes *b, const struct backend_opts *o)
{
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    static const int threads[] = {1, 3};
    kc_rng = 0x9e3779b97f4a7c15ull; /* each test's data independent of the others */
    b->n = 0;
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 2; t++) {
            struct err e = {0};
            struct backend *be;
            if (backend_cpu_new(&be, threads[t], isas[i], o, &e) == 0)
                b->be[b->n++] = be;
        }
    }
    assert_true(b->n >= 2);
}

void kc_close(struct kc_bes *b)
{
    for (int i = 0; i < b->n; i++)
        backend_free(b->be[i]);
}

float kc_frand(float lo, float hi)
{
    kc_rng = kc_rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((kc_rng >> 40) / 16777216.0);
}

unsigned kc_urand(unsigned n)
{
    kc_rng = kc_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)((kc_rng >> 33) % n);
}

float *kc_fvec(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof *p + 4);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = kc_frand(lo, hi);
    return p;
}

int kc_isa_index(const struct backend *be)
{
    return strstr(be->name, "avx512") ? 2 : strstr(be->name, "avx2") ? 1 : 0;
}

/* Compare got against ref (n values); fail above the thresholds. */
void kc_check(struct kc_errstat *st, const char *what, const struct backend *be,
                  const float *got, const double *ref, size_t n, double thr_nmse, double thr_rel)
{
    double se = 0, sr = 0, maxabs = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        if (!isfinite(got[i]))
            d = INFINITY;
        se += d * d;
        sr += ref[i] * ref[i];
        maxabs = fabs(d) > maxabs ? fabs(d) : maxabs;
        maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
    }
    /* Floors (RMS and max 1e-2): a reference that is all but zero must not
     * turn an f32 absolute error into 100% (gelu_tanh(-5.84) is -3.5e-10,
     * where f32 1 + tanh() is exactly 0; 1 + erf() likewise loses all its
     * digits). Every test's data is O(1). */
    double nmse = se / fmax(sr, (double)n * 1e-4);
    double rel = maxabs / fmax(maxref, 1e-2);
    int ix = kc_isa_index(be);
    if (nmse > st->nmse[ix])
        st->nmse[ix] = nmse;
    if (rel > st->maxrel[ix])
        st->maxrel[ix] = rel;
    if (!(nmse <= thr_nmse && rel <= thr_rel)) {
        print_error("%s on %s (%d threads): nmse %.3g (max %.3g), max rel %.3g (max %.3g)\n", what,
                    be->name, be->n_threads, nmse, thr_nmse, rel, thr_rel);
        fail();
    }
}

void kc_report(const char *test, const struct kc_errstat *st)
{
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    printf("    %-12s", test);
    if (st->nmse[0] == 0 && st->maxrel[0] == 0 && st->maxrel[2] == 0)
        printf("  exact on every ISA");
    for (int i = 0; i < 3; i++)
        if (st->nmse[i] > 0 || st->maxrel[i] > 0)
            printf("  %s: nmse %.2g rel %.2g", names[i], st->nmse[i], st->maxrel[i]);
    printf("\n");
}

