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
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* transformers' l2norm epsilon (modeling_qwen3_next.py l2norm, FLA's default) */
#define GDN_L2_EPS 1e-6
/* Rows per block of the block form (transformers' and FLA's chunk size), and the shortest
 * run of one sequence's rows that takes it: decode rows and short runs step. */
#define GDN_BLOCK 64
#define GDN_BLOCK_MIN 4

struct gdn_ctx {
    float *y;
    const float *x, *ab;
    size_t ldy, ldx, ldab;
    const float *a_log, *dt_bias;  /* [n_v_head] */
    float *st;                     /* [seqs][n_v_head][k_dim][v_dim] */
    const int32_t *pos, *seq;
    float **scr;                   /* per thread: gdn_block's planes / gdn_step's vectors, doubles */
    int n_tok, nk, nv, dk, dv;
};

/* torch.nn.functional.softplus (beta 1, threshold 20: x itself above it) */
static double softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

/* out = x / sqrt(sum x^2 + eps) * s over n */
static void l2norm(double *out, const float *x, int n, double s)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double r = s / sqrt(ss + GDN_L2_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r;
}

static double dot(const double *a, const double *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Row i's inputs for value head h: q (scaled) and k normalized, the log-decay g, beta and
 * v. Returns v. */
static const float *gdn_row(const struct gdn_ctx *g, int i, int h, double *q, double *k,
                            double *gl, double *beta)
{
    int dk = g->dk, kh = h / (g->nv / g->nk);
    const float *xr = g->x + (size_t)i * g->ldx, *abr = g->ab + (size_t)i * g->ldab;
    l2norm(q, xr + (size_t)kh * dk, dk, 1.0 / sqrt((double)dk));
    l2norm(k, xr + (size_t)(g->nk + kh) * dk, dk, 1.0);
    *gl = -exp((double)g->a_log[h]) * softplus((double)abr[g->nv + h] + g->dt_bias[h]);
    *beta = 1.0 / (1.0 + exp(-(double)abr[h]));
    return xr + (size_t)2 * g->nk * dk + (size_t)h * g->dv;
}

/* Value head h's state in row i's sequence, zeroed when the row is its position 0. */
static float *gdn_state(const struct gdn_ctx *g, int i, int h)
{
    size_t n = (size_t)g->dk * g->dv;
    float *S = g->st + ((size_t)g->seq[i] * g->nv + h) * n;
    if (g->pos[i] == 0)
        memset(S, 0, n * sizeof *S);
    return S;
}

/* One step of value head h on row i. */
static void gdn_step(const struct gdn_ctx *g, double *scr, int i, int h)
{
    int dk = g->dk, dv = g->dv;
    double *q = scr, *k = q + dk, *kv = k + dk, *y = kv + dv, gl, beta;
    float *S = gdn_state(g, i, h);
    const float *v = gdn_row(g, i, h, q, k, &gl, &beta);
    double decay = exp(gl);
    /* kv = (exp(g) S)^T k */
    memset(kv, 0, (size_t)2 * dv * sizeof *kv);  /* kv and y */
    for (int r = 0; r < dk; r++) {
        const float *Sr = S + (size_t)r * dv;
        double kr = k[r] * decay;
        for (int j = 0; j < dv; j++)
            kv[j] += Sr[j] * kr;
    }
    /* u = beta (v - kv); S = exp(g) S + k u^T; y = S^T q */
    for (int j = 0; j < dv; j++)
        kv[j] = beta * (v[j] - kv[j]);
    for (int r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv;
        double kr = k[r], qr = q[r];
        for (int j = 0; j < dv; j++) {
            double sn = Sr[j] * decay + kr * kv[j];
            Sr[j] = (float)sn;
            y[j] += sn * qr;
        }
    }
    float *yo = g->y + (size_t)i * g->ldy + (size_t)h * dv;
    for (int j = 0; j < dv; j++)
        yo[j] = (float)y[j];
}

/* Rows [i0, i0 + T) of one sequence at consecutive positions, value head h, as one block. */
static void gdn_block(const struct gdn_ctx *g, double *scr, int i0, int T, int h)
{
    int dk = g->dk, dv = g->dv;
    double *Q = scr, *K = Q + (size_t)T * dk, *U = K + (size_t)T * dk, *P = U + (size_t)T * dv;
    double *G = P + (size_t)T * dv, *B = G + T, *row = B + T;
    const float *V[GDN_BLOCK];
    float *S = gdn_state(g, i0, h);
    /* the rows' inputs; G: cumulative log-decay; U = S^T k, P = S^T q of the state before */
    for (int t = 0; t < T; t++) {
        double gl;
        V[t] = gdn_row(g, i0 + t, h, Q + (size_t)t * dk, K + (size_t)t * dk, &gl, &B[t]);
        G[t] = (t ? G[t - 1] : 0.0) + gl;
    }
    memset(U, 0, (size_t)2 * T * dv * sizeof *U);  /* U and P */
    for (int r = 0; r < dk; r++) {
        const float *Sr = S + (size_t)r * dv;
        for (int t = 0; t < T; t++) {
            double kr = K[(size_t)t * dk + r], qr = Q[(size_t)t * dk + r];
            double *Ut = U + (size_t)t * dv, *Pt = P + (size_t)t * dv;
            for (int j = 0; j < dv; j++) {
                Ut[j] += Sr[j] * kr;
                Pt[j] += Sr[j] * qr;
            }
        }
    }
    /* forward substitution for u_t, then y_t from the u_s of s <= t */
    for (int t = 0; t < T; t++) {
        double *Ut = U + (size_t)t * dv, eg = exp(G[t]);
        const double *kt = K + (size_t)t * dk, *qt = Q + (size_t)t * dk, *Pt = P + (size_t)t * dv;
        for (int j = 0; j < dv; j++)
            Ut[j] = B[t] * (V[t][j] - eg * Ut[j]);
        for (int s2 = 0; s2 < t; s2++) {
            double c = B[t] * exp(G[t] - G[s2]) * dot(kt, K + (size_t)s2 * dk, dk);
            const double *Us = U + (size_t)s2 * dv;
            for (int j = 0; j < dv; j++)
                Ut[j] -= c * Us[j];
        }
        for (int j = 0; j < dv; j++)
            row[j] = eg * Pt[j];
        for (int s2 = 0; s2 <= t; s2++) {
            double c = exp(G[t] - G[s2]) * dot(qt, K + (size_t)s2 * dk, dk);
            const double *Us = U + (size_t)s2 * dv;
            for (int j = 0; j < dv; j++)
                row[j] += c * Us[j];
        }
        float *y = g->y + (size_t)(i0 + t) * g->ldy + (size_t)h * dv;
        for (int j = 0; j < dv; j++)
            y[j] = (float)row[j];
    }
    /* the state after the block */
    double eT = exp(G[T - 1]);
    for (int t = 0; t < T; t++)
        B[t] = exp(G[T - 1] - G[t]);  /* beta is spent: the decays to the block's end */
    for (int r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv;
        for (int j = 0; j < dv; j++)
            row[j] = eT * Sr[j];
        for (int t = 0; t < T; t++) {
            double c = B[t] * K[(size_t)t * dk + r];
            const double *Ut = U + (size_t)t * dv;
            for (int j = 0; j < dv; j++)
                row[j] += c * Ut[j];
        }
        for (int j = 0; j < dv; j++)
            Sr[j] = (float)row[j];
    }
}

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
        for (long h = lo; h < hi; h++) {
            double *scr = (double *)(void *)g->scr[ith];  /* 64-byte aligned */
            if (T >= GDN_BLOCK_MIN)
                gdn_block(g, scr, i, T, (int)h);
            else
                for (int t = 0; t < T; t++)
                    gdn_step(g, scr, i + t, (int)h);
        }
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
        .y = y, .x = x, .ab = ab, .ldy = (size_t)ldy, .ldx = (size_t)ldx, .ldab = (size_t)ldab,
        .a_log = p->a_log->data, .dt_bias = p->dt_bias->data, .st = st->v,
        .pos = rows->pos, .seq = rows->state, .scr = c->scr,
        .n_tok = n_tok, .nk = nk, .nv = nv, .dk = dk, .dv = dv,
    };
    if ((size_t)n_tok * nv * dk * dv < 32768)
        gdn_task(&g, 0, 1);
    else
        tpool_run(c->pool, gdn_task, &g);
}
