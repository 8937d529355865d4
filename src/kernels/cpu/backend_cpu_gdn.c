/*
 * backend_cpu_gdn: the gated delta rule on the CPU (backend_ops.gated_delta; Qwen3-Next's
 * linear attention). Work splits over value heads: a thread owns its heads' state matrices
 * in every sequence, so it walks the chunk's rows in order and each sequence's rows see the
 * state its earlier rows left, wherever other sequences' rows sit between them. A row at
 * position 0 starts from zero.
 *
 * The state is S [k_dim][v_dim] per head (transformers' [.., k_head_dim, v_head_dim]). Two
 * forms of the same recurrence:
 *  - gdn_step, one row: S *= exp(g); u = beta (v - S^T k); S += k u^T; y = S^T q (two passes
 *    over S). Decode rows and short runs take it; it is the reference the other is held to.
 *  - gdn_block, a run of up to GDN_BLOCK consecutive positions of one sequence (prefill):
 *    with G_t the cumulative log-decay inside the block and S the state before it, the
 *    recurrence unrolls to
 *        u_t = beta_t (v_t - e^{G_t} S^T k_t) - sum_{s<t} beta_t e^{G_t - G_s} (k_t . k_s) u_s
 *        y_t = e^{G_t} S^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s
 *        S  <- e^{G_T} S + sum_s e^{G_T - G_s} k_s u_s^T
 *    (the triangular solve of the WY / UT form, by forward substitution). S is read once for
 *    the whole block and written once; every exponent is <= 0, so nothing overflows.
 * Both compute in double and round only the state they store and the outputs, so how a
 * sequence's rows are grouped into steps and blocks (which depends on the batch they came
 * in) moves the results by the state's float rounding alone (measured on the golden
 * cases' mixed batches, tests/test_batch.c: no change with scalar and AVX-512 kernels).
 * The two forms are in kern_gdn.h, compiled once per ISA (kern.h gdn_rows: vectorized over
 * the state's columns, the same bits everywhere); this file walks the rows and the threads.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* Rows from i on that continue row i's sequence position by position (at most GDN_BLOCK). */
static int gdn_run(const struct gdn_ctx *g, int i)
{
    int j = i + 1;
    while (j < g->n_tok && j - i < GDN_BLOCK && g->seq[j] == g->seq[i] && g->pos[j] == g->pos[j - 1] + 1)
        j++;
    return j - i;
}

static void gdn_task(void *arg, int ith, int nth)
{
    const struct gdn_ctx *g = arg;
    long lo, hi;
    tpool_range(g->nv, ith, nth, &lo, &hi);
    for (int i = 0, T; i < g->n_tok; i += T) {
        T = gdn_run(g, i);
        for (long h = lo; h < hi; h++)
            g->k->gdn_rows(g, (double *)(void *)g->scr[ith], i, T, (int)h);  /* 64-byte aligned */
    }
}

void cpu_gated_delta(struct backend *be, float *y, int ldy, const float *x, int ldx,
                     const float *ab, int ldab, const struct gdn_params *p,
                     const struct kv_layer *st, const struct kv_rows *rows, int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    int nk = p->n_k_head, nv = p->n_v_head, dk = p->k_dim, dv = p->v_dim;
    if (nk < 1 || nv < 1 || nv % nk || dk < 1 || dv < 1 || p->a_log->dtype != DTYPE_F32 ||
        p->dt_bias->dtype != DTYPE_F32 || tensor_nelem(p->a_log) != nv ||
        tensor_nelem(p->dt_bias) != nv || st->dtype != DTYPE_F32 ||
        (int64_t)st->v_dim != (int64_t)nv * dk * dv) {
        cpu_fail(c, "gated_delta: value heads a multiple of the key heads, F32 A_log and "
                 "dt_bias of one per value head, a state of value heads * k_dim * v_dim floats", 0);
        return;
    }
    /* doubles: gdn_block's Q, K, U, P, G, B and a row (gdn_step's q, k, kv, y fit in it) */
    size_t blk = (size_t)GDN_BLOCK * (2 * (size_t)dk + 2 * (size_t)dv + 2) + (size_t)dv;
    if (!cpu_scratch_ensure(c, 2 * blk))
        return;
    struct gdn_ctx g = {
        .k = &c->k, .y = y, .x = x, .ab = ab, .ldy = (size_t)ldy, .ldx = (size_t)ldx, .ldab = (size_t)ldab,
        .a_log = p->a_log->data, .dt_bias = p->dt_bias->data, .st = st->v,
        .pos = rows->pos, .seq = rows->state, .scr = c->scr,
        .n_tok = n_tok, .nk = nk, .nv = nv, .dk = dk, .dv = dv,
    };
    if ((size_t)n_tok * nv * dk * dv < 32768)
        gdn_task(&g, 0, 1);
    else
        tpool_run(c->pool, gdn_task, &g);
}
