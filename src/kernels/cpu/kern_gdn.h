/*
 * kern_gdn.h: the body of the gated delta rule on the CPU (backend_cpu_gdn.c has the
 * threading and the forms' derivation; kern.h gdn_rows the contract). Static functions,
 * included once per ISA by kern_rec_ref.c, kern_rec_avx2.c and kern_rec_avx512.c: each file
 * is compiled with its own target flags and -fvect-cost-model=dynamic, so GCC vectorizes the
 * loops over the state's columns (doubles) for that ISA. The build is ISO C (no
 * -ffp-contract): no multiply-add is fused and no sum is reassociated, so every ISA computes
 * the same bits as the scalar file.
 *
 * The including file defines KERN_GDN_ENTRY, the name of its kern.h gdn_rows.
 */
#include <math.h>
#include <string.h>

#include "kern.h"

/* torch.nn.functional.softplus (beta 1, threshold 20: x itself above it) */
static double softplus(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

/* out = x / sqrt(sum x^2 + eps) * s over n */
static void l2norm(double *restrict out, const float *restrict x, int n, double s)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double r = s / sqrt(ss + GDN_L2_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r;
}

/* Four partial sums (elements i mod 4), added pairwise at the end: four independent chains
 * of adds rather than one (the block form takes T^2 of these per head). */
static double dot(const double *restrict a, const double *restrict b, int n)
{
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* y[j] += a x[j] over n */
static void daxpy(double *restrict y, double a, const double *restrict x, int n)
{
    for (int j = 0; j < n; j++)
        y[j] += a * x[j];
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
    double *q = scr, *k = q + dk, *restrict kv = k + dk, *restrict y = kv + dv, gl, beta;
    float *S = gdn_state(g, i, h);
    const float *v = gdn_row(g, i, h, q, k, &gl, &beta);
    double decay = exp(gl);
    /* kv = (exp(g) S)^T k */
    memset(kv, 0, (size_t)2 * dv * sizeof *kv);  /* kv and y */
    for (int r = 0; r < dk; r++) {
        const float *restrict Sr = S + (size_t)r * dv;
        double kr = k[r] * decay;
        for (int j = 0; j < dv; j++)
            kv[j] += Sr[j] * kr;
    }
    /* u = beta (v - kv); S = exp(g) S + k u^T; y = S^T q */
    for (int j = 0; j < dv; j++)
        kv[j] = beta * (v[j] - kv[j]);
    for (int r = 0; r < dk; r++) {
        float *restrict Sr = S + (size_t)r * dv;
        double kr = k[r], qr = q[r];
        for (int j = 0; j < dv; j++) {
            double sn = Sr[j] * decay + kr * kv[j];
            Sr[j] = (float)sn;
            y[j] += sn * qr;
        }
    }
    float *restrict yo = g->y + (size_t)i * g->ldy + (size_t)h * dv;
    for (int j = 0; j < dv; j++)
        yo[j] = (float)y[j];
}

/* Rows [i0, i0 + T) of one sequence at consecutive positions, value head h, as one block. */
static void gdn_block(const struct gdn_ctx *g, double *scr, int i0, int T, int h)
{
    int dk = g->dk, dv = g->dv;
    double *Q = scr, *K = Q + (size_t)T * dk, *U = K + (size_t)T * dk, *P = U + (size_t)T * dv;
    double *G = P + (size_t)T * dv, *B = G + T, *restrict row = B + T;
    const float *V[GDN_BLOCK];
    float *S = gdn_state(g, i0, h);
    /* the rows' inputs; G: cumulative log-decay */
    for (int t = 0; t < T; t++) {
        double gl;
        V[t] = gdn_row(g, i0 + t, h, Q + (size_t)t * dk, K + (size_t)t * dk, &gl, &B[t]);
        G[t] = (t ? G[t - 1] : 0.0) + gl;
    }
    /* U = S^T k_t, P = S^T q_t of the state before the block, each summed over the state's
     * rows in order (row t's two vectors stay in L1 while S streams by) */
    for (int t = 0; t < T; t++) {
        double *restrict Ut = U + (size_t)t * dv, *restrict Pt = P + (size_t)t * dv;
        const double *kt = K + (size_t)t * dk, *qt = Q + (size_t)t * dk;
        memset(Ut, 0, (size_t)dv * sizeof *Ut);
        memset(Pt, 0, (size_t)dv * sizeof *Pt);
        for (int r = 0; r < dk; r++) {
            const float *restrict Sr = S + (size_t)r * dv;
            double kr = kt[r], qr = qt[r];
            for (int j = 0; j < dv; j++) {
                Ut[j] += Sr[j] * kr;
                Pt[j] += Sr[j] * qr;
            }
        }
    }
    /* forward substitution for u_t, then y_t from the u_s of s <= t */
    for (int t = 0; t < T; t++) {
        double *restrict Ut = U + (size_t)t * dv, eg = exp(G[t]);
        const double *kt = K + (size_t)t * dk, *qt = Q + (size_t)t * dk, *Pt = P + (size_t)t * dv;
        const float *restrict Vt = V[t];
        for (int j = 0; j < dv; j++)
            Ut[j] = B[t] * (Vt[j] - eg * Ut[j]);
        for (int s2 = 0; s2 < t; s2++)
            daxpy(Ut, -(B[t] * exp(G[t] - G[s2]) * dot(kt, K + (size_t)s2 * dk, dk)),
                  U + (size_t)s2 * dv, dv);
        for (int j = 0; j < dv; j++)
            row[j] = eg * Pt[j];
        for (int s2 = 0; s2 <= t; s2++)
            daxpy(row, exp(G[t] - G[s2]) * dot(qt, K + (size_t)s2 * dk, dk), U + (size_t)s2 * dv,
                  dv);
        float *restrict y = g->y + (size_t)(i0 + t) * g->ldy + (size_t)h * dv;
        for (int j = 0; j < dv; j++)
            y[j] = (float)row[j];
    }
    /* the state after the block */
    double eT = exp(G[T - 1]);
    for (int t = 0; t < T; t++)
        B[t] = exp(G[T - 1] - G[t]);  /* beta is spent: the decays to the block's end */
    for (int r = 0; r < dk; r++) {
        float *restrict Sr = S + (size_t)r * dv;
        for (int j = 0; j < dv; j++)
            row[j] = eT * Sr[j];
        for (int t = 0; t < T; t++)
            daxpy(row, B[t] * K[(size_t)t * dk + r], U + (size_t)t * dv, dv);
        for (int j = 0; j < dv; j++)
            Sr[j] = (float)row[j];
    }
}

void KERN_GDN_ENTRY(const struct gdn_ctx *g, double *scr, int i, int T, int h)
{
    if (T >= GDN_BLOCK_MIN)
        gdn_block(g, scr, i, T, h);
    else
        for (int t = 0; t < T; t++)
            gdn_step(g, scr, i + t, h);
}
