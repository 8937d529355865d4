/*
 * sampler: greedy picks the argmax (ties to the lower id); each filter keeps
 * exactly the tokens it should (checked by sampling many times and looking
 * at the support); a seed reproduces a run and different seeds give
 * different runs; the penalty follows the HF rule.
 */
#include <math.h>
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

/* n draws at temperature 1 from a flat distribution over the V ids with this seed */
static void draws(uint64_t seed, int *out, int n)
{
    static const float flat[V];
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1.0f;
    p.seed = seed;
    struct sampler *s = make(&p);
    for (int i = 0; i < n; i++)
        out[i] = sampler_sample(s, flat);
    sampler_free(s);
}

/* The seed decides the run: the same seed twice gives the same draws, and
 * different seeds (the default one among them) give different draws. With 256
 * draws over 8 equally likely ids, two independent runs agree by chance with
 * probability 8^-256, so a sampler that ignores its seed cannot pass. */
static void seeded(void **state)
{
    (void)state;
    enum { N = 256 };
    static const uint64_t k_seeds[] = {42, 43, 0, 1, 0x5eed, UINT64_MAX};
    enum { N_SEEDS = sizeof k_seeds / sizeof k_seeds[0] };
    static int runs[N_SEEDS][N];
    int again[N];
    for (int i = 0; i < N_SEEDS; i++) {
        draws(k_seeds[i], runs[i], N);
        draws(k_seeds[i], again, N);
        if (memcmp(runs[i], again, sizeof again) != 0)
            fail_msg("seed %llu gave two different runs", (unsigned long long)k_seeds[i]);
        unsigned mask = 0; /* a run that is random at all visits every id */
        for (int k = 0; k < N; k++)
            mask |= 1u << runs[i][k];
        assert_int_equal(mask, (1u << V) - 1);
    }
    for (int i = 0; i < N_SEEDS; i++)
        for (int j = i + 1; j < N_SEEDS; j++)
            if (memcmp(runs[i], runs[j], sizeof runs[i]) == 0)
                fail_msg("seeds %llu and %llu gave the same %d draws",
                         (unsigned long long)k_seeds[i], (unsigned long long)k_seeds[j], N);
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

/* A tiny temperature is greedy, and a small one over huge logits samples only the top ids
 * (scaled as l / T the logits overflowed to inf, inf - inf = NaN, and the last id came out). */
static void tiny_temperature(void **state)
{
    (void)state;
    struct sampler_params p;
    sampler_params_default(&p);
    p.temperature = 1e-40f;
    struct sampler *s = make(&p);
    assert_int_equal(support(s, k_logits), 1u << 1);
    sampler_free(s);

    float big[V];
    for (int i = 0; i < V; i++)
        big[i] = k_logits[i] * 1e34f;
    p.temperature = 2e-5f;
    s = make(&p);
    assert_int_equal(support(s, big), (1u << 1) | (1u << 3));
    sampler_free(s);

    /* the penalty's bounds: a tiny divisor would overflow a logit */
    struct err e = {0};
    sampler_params_default(&p);
    p.repeat_penalty = 1e-30f;
    assert_int_equal(sampler_params_check(&p, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "--repeat-penalty"));
}

/* logit_bias moves the argmax; presence/frequency count generated tokens only (the
 * prompt's sampler_accept does not count), per occurrence for frequency */
static void bias_and_presence(void **state)
{
    (void)state;
    struct err e = {0};
    struct sampler_params p;
    sampler_params_default(&p);
    struct sampler_bias b[2] = {{1, -5.0f}, {7, 2.9f}};
    p.bias = b;
    p.n_bias = 2;
    struct sampler *s = make(&p);
    assert_int_equal(sampler_sample(s, k_logits), 3);  /* 1 pushed down: 3 wins the tie */
    sampler_free(s);
    b[1].bias = 3.5f;                                  /* 7: 0 + 3.5 beats 3 */
    s = make(&p);
    assert_int_equal(sampler_sample(s, k_logits), 7);
    sampler_free(s);
    b[0].id = V;
    assert_int_equal(sampler_new(&s, &p, V, &e), -ERR_RANGE);
    b[0] = (struct sampler_bias){1, 101.0f};
    assert_int_equal(sampler_new(&s, &p, V, &e), -ERR_ARG);

    sampler_params_default(&p);
    p.presence_penalty = 0.6f;  /* 1 and 3 tie at 3; 6 at 2.5 */
    s = make(&p);
    sampler_accept(s, 1);       /* a prompt token: no presence penalty */
    assert_int_equal(sampler_sample(s, k_logits), 1);
    sampler_accept_output(s, 1); /* 1 -> 2.4: 3 wins */
    assert_int_equal(sampler_sample(s, k_logits), 3);
    sampler_accept_output(s, 3); /* 3 -> 2.4 too: 6 at 2.5 wins */
    assert_int_equal(sampler_sample(s, k_logits), 6);
    sampler_free(s);

    sampler_params_default(&p);
    p.frequency_penalty = 0.3f;
    s = make(&p);
    sampler_accept_output(s, 1);
    sampler_accept_output(s, 1); /* 1 -> 2.4, 3 stays at 3 */
    assert_int_equal(sampler_sample(s, k_logits), 3);
    sampler_free(s);
    p.frequency_penalty = 2.5f;
    assert_int_equal(sampler_params_check(&p, &e), -ERR_ARG);
}

/* log_softmax against a direct double computation; the top list sorted, ties to the lower id */
static void logprobs(void **state)
{
    (void)state;
    double z = 0.0;
    for (int i = 0; i < V; i++)
        z += exp((double)k_logits[i]);
    float lp, top_lp[4];
    int32_t top_id[4];
    sampler_logprobs(k_logits, V, 6, 4, &lp, top_id, top_lp);
    assert_float_equal(lp, 2.5 - log(z), 1e-6);
    const int32_t want[4] = {1, 3, 6, 2};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(top_id[i], want[i]);
        assert_float_equal(top_lp[i], k_logits[want[i]] - log(z), 1e-6);
    }
    sampler_logprobs(k_logits, V, 4, 0, &lp, top_id, top_lp);
    assert_float_equal(lp, -1.0 - log(z), 1e-6);
}

/* a constraint that allows only ids >= its floor, and refuses others at accept */
struct floor_cons {
    int32_t floor;
    int accepted;
};
static void floor_mask(void *st, float *logits, int n)
{
    const struct floor_cons *c = st;
    for (int i = 0; i < n && i < c->floor; i++)
        logits[i] = -INFINITY;
}
static int floor_accept(void *st, int32_t id)
{
    struct floor_cons *c = st;
    c->accepted++;
    return id >= c->floor ? 0 : -1;
}
static const struct constraint_ops k_floor_ops = {floor_mask, floor_accept};

/* the constraint masks before sampling (greedy and sampled) and is advanced on accept */
static void constraint_hook(void **state)
{
    (void)state;
    struct floor_cons fc = {.floor = 4};
    struct sampler_params p;
    sampler_params_default(&p);
    p.cons = (struct constraint){&k_floor_ops, &fc};
    struct sampler *s = make(&p);
    assert_int_equal(sampler_sample(s, k_logits), 6);   /* 1 and 3 are masked: 6 (2.5) */
    assert_int_equal(sampler_accept_output(s, 6), 0);
    assert_int_equal(sampler_accept_output(s, 2), -1);
    assert_int_equal(fc.accepted, 2);
    sampler_free(s);
    p.temperature = 1.0f;
    s = make(&p);
    assert_int_equal(support(s, k_logits) & 0xf, 0u);   /* never below the floor */
    sampler_free(s);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(constraint_hook),
    cmocka_unit_test(bias_and_presence),
    cmocka_unit_test(logprobs),
    cmocka_unit_test(tiny_temperature),
    cmocka_unit_test(greedy),
    cmocka_unit_test(filters),
    cmocka_unit_test(top_p_widens),
    cmocka_unit_test(seeded),
    cmocka_unit_test(penalty),
};

TEST_SUITE(sampler, tests);
