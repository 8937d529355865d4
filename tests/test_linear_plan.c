/*
 * linear_plan: the kernel each token count of a CPU linear product runs
 * (src/kernels/cpu/linear_plan.h). The expected plans below spell out every
 * threshold of the table as a number, so changing one shows up here, beside the
 * measurement it needs (docs/architecture.md "Which kernel runs", ADR 0055).
 */
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/linear_plan.h"
#include "test.h"

/* A weight as the kernels see it after prepare_weight: only its format matters. */
static struct wmat fmt_float(enum dtype dt, bool fpan)
{
    return (struct wmat){.dt = dt, .in = 2048, .out = 2048, .fpan = fpan};
}

static struct wmat fmt_q(int bits, int group, enum qmode mode, bool qg16)
{
    return (struct wmat){.dt = DTYPE_U32, .in = 2048, .out = 2048, .qbits = bits, .qgroup = group,
                         .qmode = mode, .qsdt = mode == QMODE_AFFINE ? DTYPE_BF16 : DTYPE_U8,
                         .qg16 = qg16};
}

/* The plan as "from kernel|from kernel|..." (rows appended where not 16). */
static void plan_str(char *buf, size_t cap, const struct linear_plan *p)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < p->n && n < cap; i++) {
        const struct lp_bucket *b = &p->b[i];
        n += (size_t)snprintf(buf + n, cap - n, "%s%d %s", i ? "|" : "", b->from_tok,
                              lp_kernel_name((enum lp_kernel)b->kernel));
        if (b->path != LP_PATH_GEMM && b->path != LP_PATH_FPAN && b->rows != 16 && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "/%d", b->rows);
    }
}

/* w's plan under k is want, and the plan gives what the decision gives at every count. */
static void check_plan(const struct cpu_kernels *k, struct wmat w, const char *want)
{
    struct linear_plan p;
    char got[256];
    linear_plan_make(&p, k, &w);
    plan_str(got, sizeof got, &p);
    if (strcmp(got, want) != 0)
        fail_msg("%s, %s %d-bit g%d%s%s: plan\n  %s\nwant\n  %s", k->name, dtype_name(w.dt), w.qbits,
                 w.qgroup, w.qg16 ? " qg16" : "", w.fpan ? " fpan" : "", got, want);
    for (int t = 1; t <= 600; t++) {
        const struct lp_bucket *b = linear_plan_at(&p, t), c = lp_classify(k, &w, t);
        assert_int_equal(b->path, c.path);
        assert_int_equal(b->kernel, c.kernel);
        assert_int_equal(b->rows, c.rows);
        assert_int_equal(t >= linear_plan_gemm_from(&p), c.path == LP_PATH_GEMM);
    }
    assert_int_equal(linear_plan_gemm_from(&p), lp_gemm_from(k, &w));
}

static void test_plan_scalar(void **state)
{
    (void)state;
    struct cpu_kernels k;
    assert_true(cpu_kernels_init(&k, CPU_ISA_SCALAR));
    check_plan(&k, fmt_float(DTYPE_BF16, false), "1 ref_matvec");
    check_plan(&k, fmt_q(4, 64, QMODE_AFFINE, false), "1 ref_matvec");
    check_plan(&k, fmt_q(4, 32, QMODE_MXFP4, false), "1 ref_matvec");
}

static void test_plan_avx2(void **state)
{
    (void)state;
    struct cpu_kernels k;
    if (cpu_isa_best() < CPU_ISA_AVX2 || !cpu_kernels_init(&k, CPU_ISA_AVX2))
        skip();
    check_plan(&k, fmt_float(DTYPE_BF16, false), "1 avx2.mv_row|2 avx2.mv_block_t|16 gemm_rows");
    check_plan(&k, fmt_float(DTYPE_F32, false), "1 avx2.mv_row|2 avx2.mv_block_t|16 gemm_rows");
    /* affine 4-bit: the integer matvec at every count (ADR 0025 item 8) */
    check_plan(&k, fmt_q(4, 64, QMODE_AFFINE, false), "1 avx2.qi_block");
    check_plan(&k, fmt_q(8, 64, QMODE_AFFINE, false), "1 avx2.qi_block|32 gemm_rows");
    check_plan(&k, fmt_q(4, 32, QMODE_MXFP4, false), "1 avx2.qi_block|32 gemm_rows");
    check_plan(&k, fmt_q(3, 64, QMODE_AFFINE, false),
               "1 avx2.mv_quant|2 avx2.mv_quant_multi|32 gemm_rows");
    check_plan(&k, fmt_q(8, 32, QMODE_MXFP8, false),
               "1 avx2.mv_quant|2 avx2.mv_quant_multi|32 gemm_rows");
    struct linear_plan p;
    struct wmat w = fmt_q(4, 64, QMODE_AFFINE, false);
    k.matvec_qi = k.matvec_qi_fast; /* what --fast does at backend creation */
    linear_plan_make(&p, &k, &w);
    assert_true(p.fast);
    w = fmt_q(8, 64, QMODE_AFFINE, false);
    linear_plan_make(&p, &k, &w);
    assert_false(p.fast); /* --fast changes 4-bit products only */
}

static void test_plan_vnni(void **state)
{
    (void)state;
    struct cpu_kernels k;
    if (cpu_isa_best() < CPU_ISA_AVX512 || !cpu_has_avx512_vnni() ||
        !cpu_kernels_init(&k, CPU_ISA_AVX512) || !k.qg16_pack)
        skip();
    check_plan(&k, fmt_float(DTYPE_BF16, false),
               "1 avx512.mv_row|2 avx512.mv_block_t|5 avx512.mv_block_p|24 gemm_rows");
    check_plan(&k, fmt_float(DTYPE_BF16, true), "1 avx512.fpan_rows8|12 avx512.fpan_rows6");
    check_plan(&k, fmt_float(DTYPE_F16, true), "1 avx512.fpan_rows8|12 avx512.fpan_rows6");
    check_plan(&k, fmt_q(4, 64, QMODE_AFFINE, true),
               "1 vnni.qg_rows16n|4 vnni.qg_rows16_4n|8 vnni.qg_rows16|32 vnni.qg_panels3/48");
    check_plan(&k, fmt_q(4, 32, QMODE_AFFINE, true),
               "1 vnni.qg_rows16n|4 vnni.qg_rows16_4n|8 vnni.qg_rows16|32 vnni.qg_panels3/48");
    check_plan(&k, fmt_q(8, 128, QMODE_AFFINE, true),
               "1 vnni.qg_rows16n|4 vnni.qg_rows16_4n|8 vnni.qg_rows16");
    /* repacking off (MLXCEL_REPACK=0): the stored layout */
    check_plan(&k, fmt_q(4, 64, QMODE_AFFINE, false), "1 vnni.qv_block|4 vnni.qg_rows");
    check_plan(&k, fmt_q(8, 64, QMODE_AFFINE, false), "1 vnni.qv_block|32 gemm_rows");
    check_plan(&k, fmt_q(4, 32, QMODE_MXFP4, false), "1 avx2.qi_block|32 gemm_rows");
    check_plan(&k, fmt_q(3, 64, QMODE_AFFINE, false), "1 avx512.mv_quant|6 gemm_rows");
    check_plan(&k, fmt_q(4, 16, QMODE_NVFP4, false), "1 avx512.mv_quant|6 gemm_rows");
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_plan_scalar),
    cmocka_unit_test(test_plan_avx2),
    cmocka_unit_test(test_plan_vnni),
};

TEST_SUITE(linear_plan, tests);
