/*
 * sampler: greedy picks the argmax (ties to the lower id); each filter keeps
 * exactly the tokens it should (checked by sampling many times and looking
 * at the support); a seed reproduces a run; the penalty follows the HF rule.
 */
#include <string.h>

#include "engine/sampler.h"
#include "test.h"

#define V 8

static struct sampler *make(struct sampler_params *p)
{
    struct sampler *s = NULL;
    struct err e = {0};
    assert_int_equal(sampler_new(&s, p, V, &e), 0);
    return s;
}

/* which ids appear in 4000 draws */
static unsigned support(struct sampler *s, const float *logits)
{
    unsigned mask = 0;
    for (int i = 0; i < 4000; i++)
        mask |= 1u << sampler_sample(s, logits);
    return mask;
}

static const float k_logits[V] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f, 2.5f, 0.0f};

static void greedy(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    struct sampler *s = make(&p);
    assert_int_equal(sampler_sample(s, k_logits), 1); /* 1 and 3 tie at 3.0 */
    sampler_free(s);
}

static void filters(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 3; /* ids 1, 3, 6 */
    struct sampler *s = make(&p);
    assert_int_equal(support(s, k_logits), (1u << 1) | (1u << 3) | (1u << 6));
    sampler_free(s);

    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.min_p = 0.5f; /* keep p >= 0.5 p_max: logits >= 3 - ln 2 -> 1, 3, 6 (2.5) */
    s = make(&p);
    assert_int_equal(support(s, k_logits), (1u << 1) | (1u << 3) | (1u << 6));
    sampler_free(s);

    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_p = 0.5f; /* the two tied leaders hold ~0.57 of the mass */
    s = make(&p);
    assert_int_equal(support(s, k_logits), (1u << 1) | (1u << 3));
    sampler_free(s);
}

/* A flat distribution over 1000 ids: top-p 0.5 must widen the sorted prefix past its
 * first guess and keep the 500 best (ties go to the lower id). */
static void top_p_widens(void **state)
{
    (void)state;
    enum { N = 1000 };
    static float flat[N];
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_p = 0.5f;
    struct sampler *s = NULL;
    struct err e = {0};
    assert_int_equal(sampler_new(&s, &p, N, &e), 0);
    static unsigned char seen[N];
    int distinct = 0, max_id = 0;
    for (int i = 0; i < 20000; i++) {
        int id = sampler_sample(s, flat);
        max_id = id > max_id ? id : max_id;
        distinct += !seen[id];
        seen[id] = 1;
    }
    assert_true(max_id <= 501);
    assert_true(distinct > 450);
    sampler_free(s);
}

static void seeded(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.5f;
    p.seed = 42;
    struct sampler *a = make(&p), *b = make(&p);
    int same = 1;
    for (int i = 0; i < 100; i++)
        same &= sampler_sample(a, k_logits) == sampler_sample(b, k_logits);
    assert_true(same);
    sampler_free(a);
    sampler_free(b);
}

static void penalty(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.repeat_penalty = 2.0f; /* 3.0 -> 1.5 for the seen id 1; id 3 wins */
    struct sampler *s = make(&p);
    sampler_accept(s, 1);
    sampler_accept(s, 1);
    assert_int_equal(sampler_sample(s, k_logits), 3);
    sampler_free(s);

    struct err e = {0};
    p.top_p = 0.0f;
    assert_int_equal(sampler_params_check(&p, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "top-p"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(greedy),
    cmocka_unit_test(filters),
    cmocka_unit_test(top_p_widens),
    cmocka_unit_test(seeded),
    cmocka_unit_test(penalty),
};

TEST_SUITE(sampler, tests);
