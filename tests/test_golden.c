/*
 * golden: per-family parity with the float64 Hugging Face references in
 * tests/fixtures/golden/<case>/golden.safetensors.
 *
 * For each case: prefill logits at every prompt position within
 * 1e-3 x max|logit| of that row, then greedy decoding through the KV cache
 * must pick exactly the reference ids while each step's logits stay within
 * the same tolerance. MoE cases run with the fused single-token path on and
 * off. Each case prints its max error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "test.h"

#define REL_TOL 1e-3
/* With --fast (the run's backend_opts.fast, MLXCEL_FAST=1: the CI sweep) the affine 4-bit
 * products take x rounded to 8 bits per group. On the random-weight 4-bit cases that moves
 * the logits by up to 7.5e-2 of max|logit| with an f32 KV cache (measured: qwen3_moe_mlx_q4
 * 7.52e-2 AVX2, 6.45e-2 AVX-512), 5.1e-2 with f16, 1.27e-1 with bf16 (phixtral_mlx_q4), and
 * flips near-tied greedy ids (qwen3_moe_mlx_q4 step 7, AVX2). A case with such weights is
 * held to its bound plus FAST_TOL, and decoding, which feeds the reference ids anyway, does
 * not require the argmax to be them; every other case changes no bit and keeps its bound. */
#define FAST_TOL 1.5e-1
/* The bound run_dirs holds each logit row to (REL_TOL unless a test widens it). */
static double g_tol = REL_TOL;

struct golden {
    struct st_set *st;
    struct tensor ids, prefill, greedy, decode;
};

static void golden_open(struct golden *g, const char *dir)
{
    char path[512];
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    int rc = st_set_open_file(&g->st, path, &e);
    if (rc < 0)
        fail_msg("%s", e.msg);
    assert_int_equal(st_set_take(g->st, "input_ids", &g->ids, &e), 0);
    assert_int_equal(st_set_take(g->st, "prefill_logits", &g->prefill, &e), 0);
    assert_int_equal(st_set_take(g->st, "greedy_ids", &g->greedy, &e), 0);
    assert_int_equal(st_set_take(g->st, "decode_logits", &g->decode, &e), 0);
    assert_int_equal(g->ids.dtype, DTYPE_I32);
    assert_int_equal(g->prefill.dtype, DTYPE_F32);
}

/* The model in dir against the golden data in golden_dir (usually the same folder),
 * with chunks of n_batch rows (0: the default). */
/* Whether a linear of m is affine 4-bit (what --fast changes). */
static bool has_affine4(const struct model *m)
{
    const struct tensor *t[] = {&m->lm_head};
    bool any = t[0]->qbits == 4 && t[0]->qmode == QMODE_AFFINE;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct layer *l = &m->layers[il];
#define AFFINE4(name) any = any || (l->name.qbits == 4 && l->name.qmode == QMODE_AFFINE);
        LAYER_MATRICES(AFFINE4)
#undef AFFINE4
        const struct expert_linear *el[] = {&l->ex.up, &l->ex.gate, &l->ex.down, &l->ex.gate_up};
        for (size_t k = 0; k < 4; k++)
            any = any || (el[k]->w && el[k]->w[0].qbits == 4 && el[k]->w[0].qmode == QMODE_AFFINE);
    }
    return any;
}

static double run_dirs(const char *name, const char *dir, const char *golden_dir, struct backend *be,
                       bool fused, int n_batch)
{
    struct err e = {0};
    struct golden g = {0};
    struct test_eng r;
    golden_open(&g, golden_dir);
    int L = (int)g.ids.shape[0], N = (int)g.greedy.shape[0];
    test_eng_open(&r, dir, be, n_batch, L + N, 1, 4);
    be->fused_moe = fused;
    const bool fast = be->fast && has_affine4(r.m);
    const double tol = fast ? g_tol + FAST_TOL : g_tol;
    int V = r.m->hp.n_vocab;
    assert_int_equal(g.prefill.shape[1], V);
    float *logits = malloc((size_t)L * V * sizeof(float));
    assert_non_null(logits);
    double worst = 0.0;

    /* prefill: every position */
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    for (int i = 0; i < L; i++)
        assert_int_equal(batch_add(r.b, ((const int32_t *)g.ids.data)[i], i, 0, true, &e), 0);
    if (model_forward(r.c, r.b, r.kv, logits, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    const float *ref = g.prefill.data;
    for (int i = 0; i < L; i++) {
        double rr = test_row_rel_err(logits + (size_t)i * V, ref + (size_t)i * V, V);
        if (rr > worst)
            worst = rr;
        if (rr > tol)
            fail_msg("%s: prefill position %d: relative error %.3g > %.0e", name, i, rr, tol);
    }

    /* greedy decode through the cache */
    const int32_t *greedy = g.greedy.data;
    const float *dref = g.decode.data;
    int next = test_argmax(logits + (size_t)(L - 1) * V, V);
    for (int s = 0; s < N; s++) {
        if (next != greedy[s] && !fast)
            fail_msg("%s: greedy step %d: got id %d, reference %d", name, s, next, greedy[s]);
        batch_clear(r.b);
        assert_int_equal(batch_add(r.b, greedy[s], L + s, 0, true, &e), 0);
        if (model_forward(r.c, r.b, r.kv, logits, &e) < 0)
            fail_msg("%s: %s", name, e.msg);
        double rr = test_row_rel_err(logits, dref + (size_t)s * V, V);
        if (rr > worst)
            worst = rr;
        if (rr > tol)
            fail_msg("%s: decode step %d: relative error %.3g > %.0e", name, s, rr, tol);
        next = test_argmax(logits, V);
    }
    printf("golden %-20s fused_moe=%d fast=%d n_batch=%d kv=%s  prefill %d + decode %d tokens  max rel "
           "err %.2e\n", name, fused, fast, r.c->n_batch, dtype_name(test_kv_dtype), L, N, worst);
    free(logits);
    test_eng_close(&r);
    st_set_free(g.st);
    return worst;
}

static double run_case(const char *name, struct backend *be, bool fused)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/fixtures/golden"), name);
    return run_dirs(name, dir, dir, be, fused, 0);
}

double golden_check_model(const char *model_dir, const char *golden_dir, bool fused)
{
    struct backend *be = NULL;
    struct err e = {0};
    if (test_backend_new(&be, 2, &e) < 0)
        fail_msg("%s", e.msg);
    double r = run_dirs(model_dir, model_dir, golden_dir, be, fused, 0);
    backend_free(be);
    return r;
}

static void check_case(void **state)
{
    const char *name = *state;
    struct backend *be = NULL;
    struct err e = {0};
    if (test_backend_new(&be, 2, &e) < 0)
        fail_msg("%s", e.msg);

    run_case(name, be, true);
    run_case(name, be, false);
    /* chunks of 5 rows: prefill split across forward chunks and logit downloads */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_path("tests/fixtures/golden"), name);
    run_dirs(name, dir, dir, be, true, 5);
    backend_free(be);
}

#define GOLDEN_CASES(X) \
    X(llama) X(llama3_rope) X(mistral) X(qwen2) X(qwen3) X(phi) X(phi3) \
    X(phi3_longrope_short) X(phi3_longrope_long) X(mixtral) X(phimoe) X(phixtral) X(phixtral_mlx) \
    X(phixtral_mlx_q4) X(phixtral_mlx_q8) X(mistral_swa) X(phi3_swa) \
    X(smollm3) X(granite) X(starcoder2) X(olmo2) X(gemma) X(cohere) X(gemma2) X(gemma3_text) \
    X(qwen3_moe) X(qwen3_moe_mlx_q4) X(qwen2_moe) X(qwen3_yarn) X(llama_dynamic) \
    X(gpt_oss) X(gpt_oss_mlx) X(deepseek_v2) X(deepseek_v3)

/* Every case again with the narrow KV caches of --kv-type (ADR 0030), greedy ids identical:
 * f16 within 2e-3 (measured: at most 7.4e-4 with AVX2 and AVX-512, gpt_oss; 1.01e-3 on the
 * scalar path, gpt_oss_mlx, the one case past the 1e-3 bound of the f32 default), bf16 (8
 * significant bits) within 3e-2 (measured: at most 1.6e-2, qwen3_moe_mlx_q4). */
#define NAME(n) #n,
static const char *const k_cases[] = {GOLDEN_CASES(NAME)};
#undef NAME

static void check_kv_narrow(void **state)
{
    (void)state;
    struct backend *be = NULL;
    struct err e = {0};
    if (test_backend_new(&be, 2, &e) < 0)
        fail_msg("%s", e.msg);
    double worst16 = 0.0, worstb = 0.0;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        /* fused MoE on and off (the CI sweep's axes: fused MoE x KV type) */
        test_kv_dtype = DTYPE_F16;
        g_tol = 2e-3;
        double r16 = fmax(run_case(k_cases[i], be, true), run_case(k_cases[i], be, false));
        test_kv_dtype = DTYPE_BF16;
        g_tol = 3e-2;
        double rb = fmax(run_case(k_cases[i], be, true), run_case(k_cases[i], be, false));
        test_kv_dtype = DTYPE_F32;
        g_tol = REL_TOL;
        worst16 = r16 > worst16 ? r16 : worst16;
        worstb = rb > worstb ? rb : worstb;
    }
    printf("golden kv caches: f16 max rel err %.2e, bf16 %.2e over %zu cases\n", worst16, worstb,
           sizeof k_cases / sizeof k_cases[0]);
    backend_free(be);
}

/* After check_kv_narrow, also when a case failed inside it: the f32 cache and bound again. */
static int kv_reset(void **state)
{
    (void)state;
    test_kv_dtype = DTYPE_F32;
    g_tol = REL_TOL;
    return 0;
}

/* the case name travels as the test's initial state */
#define ENTRY(n) {"golden_" #n, check_case, NULL, NULL, (void *)#n},
static const struct CMUnitTest tests[] = {GOLDEN_CASES(ENTRY)
                                           cmocka_unit_test_teardown(check_kv_narrow, kv_reset)};
#undef ENTRY

TEST_SUITE(golden, tests);
