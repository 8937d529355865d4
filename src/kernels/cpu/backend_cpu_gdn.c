/*
 * backend_cpu_gdn: the gated delta rule on the CPU (backend_ops.gated_delta; Qwen3-Next's
 * linear attention), the scalar reference: one recurrent step per row. Work splits over
 * value heads: a thread owns its heads' state matrices in every sequence, so it walks the
 * chunk's rows in order and each sequence's rows see the state its earlier rows left,
 * wherever other sequences' rows sit between them. A row at position 0 starts from zero.
 *
 * The state is S [k_dim][v_dim] per head (transformers' [.., k_head_dim, v_head_dim]); each
 * step makes two passes over it: decay and the read-out S^T k, then the rank-one update and
 * the output S^T q. Every column of S evolves on its own (the columns share only k, q, g and
 * beta), which is what the CUDA kernel parallelizes over.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* transformers' l2norm epsilon (modeling_qwen3_next.py l2norm, FLA's default) */
#define GDN_L2_EPS 1e-6f

struct gdn_ctx {
    float *y;
    const float *x, *ab;
    size_t ldy, ldx, ldab;
    const float *a_log, *dt_bias;  /* [n_v_head] */
    float *st;                     /* [seqs][n_v_head][k_dim][v_dim] */
    const int32_t *pos, *seq;
    float **scr;                   /* per thread: q | k | kv of k_dim, k_dim, v_dim floats */
    int n_tok, nk, nv, dk, dv;
};

/* torch.nn.functional.softplus (beta 1, threshold 20: x itself above it) */
static float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* out = x / sqrt(sum x^2 + eps) * s over n */
static void l2norm(float *out, const float *x, int n, float s)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = s / sqrtf(ss + GDN_L2_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r;
}

/* One step of value head h on row i. */
static void gdn_step(const struct gdn_ctx *g, float *scr, int i, int h)
{
    int dk = g->dk, dv = g->dv, kh = h / (g->nv / g->nk);
    const float *xr = g->x + (size_t)i * g->ldx, *abr = g->ab + (size_t)i * g->ldab;
    float *S = g->st + ((size_t)g->seq[i] * g->nv + h) * (size_t)dk * dv;
    float *q = scr, *k = scr + dk, *kv = scr + 2 * dk;
    if (g->pos[i] == 0)
        memset(S, 0, (size_t)dk * dv * sizeof *S);
    l2norm(q, xr + (size_t)kh * dk, dk, 1.0f / sqrtf((float)dk));
    l2norm(k, xr + (size_t)(g->nk + kh) * dk, dk, 1.0f);
    const float *v = xr + (size_t)2 * g->nk * dk + (size_t)h * dv;
    float decay = expf(-expf(g->a_log[h]) * softplus(abr[g->nv + h] + g->dt_bias[h]));
    float beta = 1.0f / (1.0f + expf(-abr[h]));
    /* S *= exp(g); kv = S^T k */
    memset(kv, 0, (size_t)dv * sizeof *kv);
    for (int r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv, kr = k[r];
        for (int j = 0; j < dv; j++) {
            Sr[j] *= decay;
            kv[j] += Sr[j] * kr;
        }
    }
    /* delta = beta (v - kv); S += k delta^T; y = S^T q */
    for (int j = 0; j < dv; j++)
        kv[j] = beta * (v[j] - kv[j]);
    float *y = g->y + (size_t)i * g->ldy + (size_t)h * dv;
    memset(y, 0, (size_t)dv * sizeof *y);
    for (int r = 0; r < dk; r++) {
        float *Sr = S + (size_t)r * dv, kr = k[r], qr = q[r];
        for (int j = 0; j < dv; j++) {
            Sr[j] += kr * kv[j];
            y[j] += Sr[j] * qr;
        }
    }
}

static void gdn_task(void *arg, int ith, int nth)
{
    const struct gdn_ctx *g = arg;
    long lo, hi;
    tpool_range(g->nv, ith, nth, &lo, &hi);
    for (int i = 0; i < g->n_tok; i++)
        for (long h = lo; h < hi; h++)
            gdn_step(g, g->scr[ith], i, (int)h);
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
    if (!cpu_scratch_ensure(c, (size_t)2 * dk + dv))
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
