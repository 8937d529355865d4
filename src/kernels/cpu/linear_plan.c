/*
 * linear_plan: the kernel each token count of a CPU linear product runs (linear_plan.h).
 *
 * lp_classify() is the one decision: for a weight as the kernels see it (struct wmat), the
 * ISA's kernel table and a token count, the path and the kernel. A plan is that decision
 * tabulated over token counts: every threshold in linear_plan.h is below LP_SCAN_TOK, so
 * the buckets found up to it hold for every larger count.
 */
#include <string.h>

#include "backend_cpu_impl.h"
#include "linear_plan.h"

/* Past every threshold of linear_plan.h (the largest is 32). */
#define LP_SCAN_TOK 64

static bool is_avx512(const struct cpu_kernels *k)
{
    return !strcmp(k->name, "avx512");
}

static bool is_avx2(const struct cpu_kernels *k)
{
    return !strcmp(k->name, "avx2");
}

/* VNNI: the AVX-512 table with its integer matvec, which reads QG16. */
static bool is_vnni(const struct cpu_kernels *k)
{
    return is_avx512(k) && k->qg16_pack;
}

bool lp_uses_qi(const struct cpu_kernels *k, const struct wmat *w)
{
    return w->qbits && k->matvec_qi && k->qi_ok(w);
}

int lp_gemm_from(const struct cpu_kernels *k, const struct wmat *w)
{
    if (!k->ukernel || w->fpan) /* FPAN: one kernel at every token count */
        return 1 << 30;
    if (!w->qbits)
        return k->gemm_min_tok;
    if (!lp_uses_qi(k, w))
        return k->gemm_min_tok_q;
    return k->qi_any_tok && k->qi_any_tok(w) ? 1 << 30 : k->gemm_min_tok_qi;
}

/* The VNNI integer matvec's kernel for n_tok tokens of w. */
static enum lp_kernel vnni_kernel(const struct wmat *w, int n_tok)
{
    if (w->qmode != QMODE_AFFINE)
        return LK_A2_QI; /* mxfp4 stays with the AVX2 integer matvec */
    if (w->qg16 && n_tok < LP_VNNI_QG_TILE)
        return n_tok >= LP_VNNI_QG_T4 ? LK_VNNI_QG_SOME : LK_VNNI_QG_FEW;
    if (w->qg16)
        return w->qbits == 4 && n_tok >= LP_VNNI_QG3_MIN ? LK_VNNI_QG_TILES3 : LK_VNNI_QG_TILES;
    if (w->qbits == 4 && n_tok >= LP_VNNI_QG_ROWS_MIN)
        return LK_VNNI_QG_ROWS;
    return LK_VNNI_QV_BLOCK;
}

/* The f32 matvec's kernel (k->matvec) for n_tok tokens of w. */
static enum lp_kernel matvec_kernel(const struct cpu_kernels *k, const struct wmat *w, int n_tok)
{
    if (is_avx512(k)) {
        if (w->qbits)
            return kern_q_lanes_ok(w) ? LK_A512_MV_QUANT : LK_A512_MV_QGENERIC;
        return n_tok == 1 ? LK_A512_MV_ROW
               : n_tok < LP_A512_MVP_MIN ? LK_A512_MV_BLOCK_T : LK_A512_MV_BLOCK_P;
    }
    if (is_avx2(k)) {
        if (w->qbits && !kern_q_lanes_ok(w))
            return LK_A2_MV_QGENERIC;
        if (w->qbits)
            return n_tok >= LP_A2_MVQ_MULTI ? LK_A2_MV_QUANT_M : LK_A2_MV_QUANT;
        return n_tok == 1 ? LK_A2_MV_ROW : LK_A2_MV_BLOCK_T;
    }
    return LK_REF_MATVEC;
}

struct lp_bucket lp_classify(const struct cpu_kernels *k, const struct wmat *w, int n_tok)
{
    struct lp_bucket b = {.from_tok = n_tok, .rows = 16};
    if (n_tok >= lp_gemm_from(k, w)) {
        b.path = LP_PATH_GEMM;
        b.kernel = LK_GEMM;
        b.rows = (int16_t)k->gemm_nr;
    } else if (w->fpan) {
        b.path = LP_PATH_FPAN;
        b.kernel = n_tok >= LP_FPAN_SIX_MIN ? LK_A512_FPAN6 : LK_A512_FPAN8;
        b.rows = FPAN_R;
    } else if (lp_uses_qi(k, w)) {
        b.path = LP_PATH_QI;
        b.kernel = is_vnni(k) ? vnni_kernel(w, n_tok) : LK_A2_QI;
        if (b.kernel == LK_VNNI_QG_TILES3)
            b.rows = 48; /* three panels a tile */
    } else {
        b.path = LP_PATH_MATVEC;
        b.kernel = matvec_kernel(k, w, n_tok);
    }
    return b;
}

void linear_plan_make(struct linear_plan *p, const struct cpu_kernels *k, const struct wmat *w)
{
    memset(p, 0, sizeof *p);
    p->layout = w->fpan ? LP_LAYOUT_FPAN : w->qg16 ? LP_LAYOUT_QG16 : LP_LAYOUT_STORED;
    p->fast = lp_uses_qi(k, w) && k->matvec_qi == k->matvec_qi_fast &&
              w->qmode == QMODE_AFFINE && w->qbits == 4;
    for (int t = 1; t <= LP_SCAN_TOK; t++) {
        const struct lp_bucket b = lp_classify(k, w, t);
        const struct lp_bucket *last = p->n ? &p->b[p->n - 1] : NULL;
        if (last && last->path == b.path && last->kernel == b.kernel && last->rows == b.rows)
            continue;
        if (p->n == LP_MAX_BUCKETS) /* cannot happen: no format has more (test_linear_plan) */
            break;
        p->b[p->n++] = b;
    }
}

int linear_plan_gemm_from(const struct linear_plan *p)
{
    for (int i = 0; i < p->n; i++)
        if (p->b[i].path == LP_PATH_GEMM)
            return p->b[i].from_tok;
    return 1 << 30;
}

const char *lp_layout_name(enum lp_layout l)
{
    switch (l) {
    case LP_LAYOUT_QG16: return "qg16";
    case LP_LAYOUT_FPAN: return "fpan";
    default: return "stored";
    }
}

const char *lp_path_name(enum lp_path p)
{
    switch (p) {
    case LP_PATH_QI: return "matvec_qi";
    case LP_PATH_FPAN: return "fpan_linear";
    case LP_PATH_GEMM: return "gemm";
    default: return "matvec";
    }
}

const char *lp_kernel_name(enum lp_kernel k)
{
    static const char *const names[LK_COUNT] = {
        [LK_REF_MATVEC] = "ref_matvec",
        [LK_GEMM] = "gemm_rows",
        [LK_A2_MV_ROW] = "avx2.mv_row",
        [LK_A2_MV_BLOCK_T] = "avx2.mv_block_t",
        [LK_A2_MV_QUANT] = "avx2.mv_quant",
        [LK_A2_MV_QUANT_M] = "avx2.mv_quant_multi",
        [LK_A2_MV_QGENERIC] = "avx2.mv_qgeneric",
        [LK_A2_QI] = "avx2.qi_block",
        [LK_A512_MV_ROW] = "avx512.mv_row",
        [LK_A512_MV_BLOCK_T] = "avx512.mv_block_t",
        [LK_A512_MV_BLOCK_P] = "avx512.mv_block_p",
        [LK_A512_MV_QUANT] = "avx512.mv_quant",
        [LK_A512_MV_QGENERIC] = "avx512.mv_qgeneric",
        [LK_A512_FPAN8] = "avx512.fpan_rows8",
        [LK_A512_FPAN6] = "avx512.fpan_rows6",
        [LK_VNNI_QV_BLOCK] = "vnni.qv_block",
        [LK_VNNI_QG_ROWS] = "vnni.qg_rows",
        [LK_VNNI_QG_FEW] = "vnni.qg_rows16n",
        [LK_VNNI_QG_SOME] = "vnni.qg_rows16_4n",
        [LK_VNNI_QG_TILES] = "vnni.qg_rows16",
        [LK_VNNI_QG_TILES3] = "vnni.qg_panels3",
    };
    return (unsigned)k < LK_COUNT && names[k] ? names[k] : "?";
}

/* Whether a and b have one plan: the fields lp_classify reads. */
static bool same_format(const struct wmat *a, const struct wmat *b)
{
    return a->fpan == b->fpan && a->qg16 == b->qg16 && a->dt == b->dt && a->qbits == b->qbits &&
           a->qmode == b->qmode && a->qgroup == b->qgroup && a->in == b->in;
}

const struct linear_plan *cpu_plan_of(const struct cpu_backend *c, const struct wmat *w,
                                      struct linear_plan *tmp)
{
    for (int i = 0; i < c->n_plans; i++)
        if (same_format(&c->plans[i].key, w))
            return &c->plans[i].plan;
    linear_plan_make(tmp, &c->k, w);
    return tmp;
}

void cpu_plan_keep(struct cpu_backend *c, const struct tensor *w)
{
    struct wmat m;
    struct linear_plan tmp;
    cpu_wmat_from(&m, w);
    if (c->n_plans == CPU_PLANS_MAX || cpu_plan_of(c, &m, &tmp) != &tmp)
        return;
    c->plans[c->n_plans].key = m;
    c->plans[c->n_plans++].plan = tmp;
}

int cpu_linear_plan_info(struct backend *be, const struct tensor *w, struct linear_plan_info *out)
{
    struct cpu_backend *c = cpu_of(be);
    struct wmat m;
    struct linear_plan tmp;
    cpu_wmat_from(&m, w);
    const struct linear_plan *p = cpu_plan_of(c, &m, &tmp);
    memset(out, 0, sizeof *out);
    out->layout = lp_layout_name((enum lp_layout)p->layout);
    out->fast = p->fast;
    for (int i = 0; i < p->n && i < LINEAR_PLAN_MAX; i++) {
        out->b[i].from_tok = p->b[i].from_tok;
        out->b[i].path = lp_path_name((enum lp_path)p->b[i].path);
        out->b[i].kernel = lp_kernel_name((enum lp_kernel)p->b[i].kernel);
        out->n = i + 1;
    }
    return 0;
}
