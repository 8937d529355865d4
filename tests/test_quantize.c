/*
 * quantize suite: the C quantizer (src/loading/quantize.c) against expected
 * bytes written by the NumPy reference mlxq.py (scripts/make-quant-fixture.py
 * -> tests/fixtures/quant/affine/quant.safetensors): every affine bits x group x
 * input dtype x variant and every fp mode, on adversarial rows. Plus the
 * spec's worked examples, the codec edges and the rejected parameters.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/safetensors.h"
#include "../src/loading/quantize.h"
#include "test.h"

#define FIXTURE "tests/fixtures/quant/affine/quant.safetensors"

static const char *const k_dtypes[] = {"F32", "F16", "BF16"};

/* Expected tensor NAME must exist with exactly n bytes equal to got. */
static void expect_bytes(struct st_set *st, const char *name, const void *got, size_t n)
{
    const struct st_tensor *t = st_set_find(st, name);
    if (!t)
        fail_msg("fixture lacks '%s' (regenerate with scripts/make-quant-fixture.py)", name);
    assert_int_equal(t->end - t->begin, n);
    const uint8_t *a = got, *b = t->data;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            fail_msg("%s: byte %zu differs: got 0x%02x, mlxq 0x%02x", name, i, a[i], b[i]);
}

/* Quantize fixture input in.<dt> with p and compare with <prefix>.{weight,scales,biases}. */
static void check_config(struct st_set *st, const struct quant_params *p, const char *dt_name,
                         const char *prefix)
{
    char name[128];
    struct err e = {0};
    snprintf(name, sizeof name, "in.%s", dt_name);
    const struct st_tensor *in = st_set_find(st, name);
    assert_non_null(in);
    assert_int_equal(in->ndim, 2);
    int64_t rows = in->shape[0], cols = in->shape[1];
    size_t nw = (size_t)(rows * quant_row_words(p, cols)), ng = (size_t)(rows * quant_row_groups(p, cols));
    enum dtype sdt = quant_scale_dtype(p, in->dtype);
    uint32_t *wq = calloc(nw, sizeof *wq);
    uint8_t *sc = calloc(ng, dtype_size(sdt)), *bi = calloc(ng, dtype_size(sdt));
    assert_true(wq && sc && bi);
    int rc = quant_rows(p, in->dtype, in->data, rows, cols, wq, sc, bi, &e);
    if (rc < 0)
        fail_msg("%s: %s", prefix, e.msg);
    snprintf(name, sizeof name, "%s.weight", prefix);
    expect_bytes(st, name, wq, nw * sizeof *wq);
    snprintf(name, sizeof name, "%s.scales", prefix);
    expect_bytes(st, name, sc, ng * dtype_size(sdt));
    if (p->mode == QMODE_AFFINE) {
        snprintf(name, sizeof name, "%s.biases", prefix);
        expect_bytes(st, name, bi, ng * dtype_size(sdt));
    }
    free(wq);
    free(sc);
    free(bi);
}

static void test_affine_vs_mlxq(void **state)
{
    (void)state;
    static const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    struct st_set *st = NULL;
    struct err e = {0};
    if (st_set_open_file(&st, test_path(FIXTURE), &e) < 0)
        fail_msg("%s", e.msg);
    int n = 0;
    for (int v = 0; v < 2; v++)
        for (int d = 0; d < 3; d++)
            for (int b = 0; b < 6; b++)
                for (int g = 0; g < 3; g++) {
                    struct quant_params p = {QMODE_AFFINE, bits[b], groups[g], v ? QUANT_CPU : QUANT_GPU};
                    char prefix[64];
                    snprintf(prefix, sizeof prefix, "affine.%s.%s.b%d.g%d", v ? "cpu" : "gpu",
                             k_dtypes[d], bits[b], groups[g]);
                    check_config(st, &p, k_dtypes[d], prefix);
                    n++;
                }
    assert_int_equal(n, 108);
    st_set_free(st);
}

static void test_fp_modes_vs_mlxq(void **state)
{
    (void)state;
    struct st_set *st = NULL;
    struct err e = {0};
    if (st_set_open_file(&st, test_path(FIXTURE), &e) < 0)
        fail_msg("%s", e.msg);
    static const enum qmode modes[] = {QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4};
    for (int m = 0; m < 3; m++)
        for (int d = 0; d < 3; d++) {
            struct quant_params p = {modes[m], 0, 0, QUANT_GPU};
            qmode_defaults(modes[m], &p.group, &p.bits);
            char prefix[64];
            snprintf(prefix, sizeof prefix, "%s.%s", qmode_name(modes[m]), k_dtypes[d]);
            check_config(st, &p, k_dtypes[d], prefix);
        }
    st_set_free(st);
}

/* §3.1: w_i = 0.25 (i mod 16) - 1 over one 4-bit group of 32. */
static void test_worked_example(void **state)
{
    (void)state;
    float w[32], s, b;
    uint32_t wq[4];
    for (int i = 0; i < 32; i++)
        w[i] = 0.25f * (float)(i % 16) - 1.0f;
    for (int v = 0; v < 2; v++) {
        struct quant_params p = {QMODE_AFFINE, 4, 32, v ? QUANT_CPU : QUANT_GPU};
        assert_int_equal(quant_rows(&p, DTYPE_F32, w, 1, 32, wq, &s, &b, NULL), 0);
        assert_int_equal(wq[0], 0x89ABCDEFu);
        assert_int_equal(wq[1], 0x01234567u);
        assert_int_equal(wq[2], 0x89ABCDEFu);
        assert_int_equal(wq[3], 0x01234567u);
        assert_true(s == -0.25f && b == 2.75f);
    }
    /* §3.1 snapping and clipping: {1, -0.9, 0.3, -0.95, 0...} -> word 0 = 0x8888F6F0 */
    float w2[32] = {1.0f, -0.9f, 0.3f, -0.95f};
    struct quant_params p = {QMODE_AFFINE, 4, 32, QUANT_GPU};
    assert_int_equal(quant_rows(&p, DTYPE_F32, w2, 1, 32, wq, &s, &b, NULL), 0);
    assert_int_equal(wq[0], 0x8888F6F0u);
    assert_true(s == -0.125f && b == 1.0f);
    /* §2.5 tie: {-3, 0, -2.5, 0...} at 2 bits: code 0.5 -> 1 on gpu, 0 on cpu */
    float w3[32] = {-3.0f, 0.0f, -2.5f};
    uint32_t w3q[2];
    p = (struct quant_params){QMODE_AFFINE, 2, 32, QUANT_GPU};
    assert_int_equal(quant_rows(&p, DTYPE_F32, w3, 1, 32, w3q, &s, &b, NULL), 0);
    assert_int_equal((w3q[0] >> 4) & 3, 1);
    p.variant = QUANT_CPU;
    assert_int_equal(quant_rows(&p, DTYPE_F32, w3, 1, 32, w3q, &s, &b, NULL), 0);
    assert_int_equal((w3q[0] >> 4) & 3, 0);
    /* mxfp4 nibble order: element 0 is the low nibble of byte 0 */
    float w4[32] = {6.0f, -0.5f, 0, 0, 0, 0, 0, 0, 1.0f};
    uint32_t w4q[4];
    uint8_t sc;
    p = (struct quant_params){QMODE_MXFP4, 4, 32, QUANT_GPU};
    assert_int_equal(quant_rows(&p, DTYPE_F32, w4, 1, 32, w4q, &sc, NULL, NULL), 0);
    assert_int_equal(sc, 127);
    assert_int_equal(w4q[0], 0x97u);
    assert_int_equal(w4q[1], 0x2u);
}

/* Finite weights whose affine scale is not finite in the stored dtype are refused, naming
 * the row and group, never written as inf (issue 39 item 14). */
static void test_scale_overflow(void **state)
{
    (void)state;
    float w[64] = {0}, s[2], b[2];
    uint32_t wq[8];
    struct err e = {0};
    struct quant_params p = {QMODE_AFFINE, 4, 32, QUANT_GPU};
    w[40] = 3.0e38f;  /* group 1 spans -3e38 .. 3e38: the range overflows f32 */
    w[41] = -3.0e38f;
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, 1, 64, wq, s, b, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "row 0, group 1"));
    /* f16: 6e4 - -6e4 over 2 bits (3 bins) is a scale of 40000, fine; so is any f16 pair */
    uint16_t h[32], hs, hb;
    for (int i = 0; i < 32; i++)
        h[i] = f32_to_f16(i == 0 ? 60000.0f : i == 1 ? -60000.0f : 0.0f);
    p = (struct quant_params){QMODE_AFFINE, 2, 32, QUANT_GPU};
    assert_int_equal(quant_rows(&p, DTYPE_F16, h, 1, 32, wq, &hs, &hb, &e), 0);
    assert_true(isfinite(f16_to_f32(hs)) && isfinite(f16_to_f32(hb)));
}

static void test_codecs(void **state)
{
    (void)state;
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t want[] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++)
        assert_int_equal(quant_e2m1_encode(mids[i]), want[i]);
    assert_int_equal(quant_e2m1_encode(100.0f), 7);
    assert_int_equal(quant_e2m1_encode(-0.0f), 8);
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F)
            continue;  /* 480 saturates to 448 */
        assert_int_equal(quant_e4m3_encode(quant_e4m3_decode((uint8_t)b)), b);
    }
    assert_true(quant_e4m3_decode(0x7E) == 448.0f && quant_e4m3_decode(0x01) == 0x1p-9f);
    assert_int_equal(quant_e4m3_encode(431.9f), 0x7D);
    assert_int_equal(quant_e4m3_encode(470.0f), 0x7E);
    assert_int_equal(quant_e4m3_encode(-1e6f), 0xFE);
    assert_int_equal(quant_e8m0_encode(1.0f), 127);
    assert_int_equal(quant_e8m0_encode(1.4f), 127);
    assert_int_equal(quant_e8m0_encode(1.5f), 128);
    assert_int_equal(quant_e8m0_encode(0.0f), 0);
    assert_int_equal(quant_e8m0_encode(INFINITY), 255);
    assert_true(isinf(quant_e8m0_decode(255)) && quant_e8m0_decode(127) == 1.0f);
}

static void test_rejections(void **state)
{
    (void)state;
    static const struct quant_params bad[] = {
        {QMODE_AFFINE, 4, 16, QUANT_GPU}, {QMODE_AFFINE, 7, 64, QUANT_GPU},
        {QMODE_AFFINE, 1, 64, QUANT_GPU}, {QMODE_AFFINE, 4, 48, QUANT_GPU},
        {QMODE_MXFP4, 4, 64, QUANT_GPU},  {QMODE_MXFP4, 3, 32, QUANT_GPU},
        {QMODE_MXFP8, 8, 16, QUANT_GPU},  {QMODE_NVFP4, 4, 32, QUANT_GPU},
        {(enum qmode)7, 4, 64, QUANT_GPU}, {QMODE_AFFINE, 4, 64, (enum quant_variant)5},
    };
    float w[96] = {0};
    uint32_t wq[64];
    float s[4], b[4];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct err e = {0};
        assert_int_equal(quant_params_check(&bad[i], &e), -ERR_ARG);
        assert_true(e.msg[0] != 0);
        assert_int_equal(quant_rows(&bad[i], DTYPE_F32, w, 1, 64, wq, s, b, NULL), -ERR_ARG);
    }
    struct quant_params p = {QMODE_AFFINE, 4, 64, QUANT_GPU};
    struct err e = {0};
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, 1, 96, wq, s, b, &e), -ERR_ARG);  /* 96 % 64 */
    assert_int_equal(quant_rows(&p, DTYPE_U32, w, 1, 64, wq, s, b, &e), -ERR_ARG);
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, 1, 64, wq, s, NULL, &e), -ERR_ARG);
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, -1, 64, wq, s, b, &e), -ERR_ARG);
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, 0, 64, wq, s, b, &e), 0);
    assert_int_equal(quant_rows(&p, DTYPE_F32, w, 0, 0, wq, s, b, &e), -ERR_ARG);
    int64_t one_d[1] = {64}, ok[2] = {4, 128}, odd[2] = {4, 96};
    assert_false(quant_shape_ok(&p, 1, one_d));
    assert_true(quant_shape_ok(&p, 2, ok));
    assert_false(quant_shape_ok(&p, 2, odd));
    enum qmode m;
    assert_int_equal(qmode_parse("xyz", &m, NULL), -ERR_CONFIG);
    assert_int_equal(qmode_parse("nvfp4", &m, NULL), 0);
    assert_int_equal(m, QMODE_NVFP4);
}

static const struct CMUnitTest quantize_tests[] = {
    cmocka_unit_test(test_affine_vs_mlxq),
    cmocka_unit_test(test_fp_modes_vs_mlxq),
    cmocka_unit_test(test_worked_example),
    cmocka_unit_test(test_scale_overflow),
    cmocka_unit_test(test_codecs),
    cmocka_unit_test(test_rejections),
};

TEST_SUITE(quantize, quantize_tests);
