/*
 * backend_cpu: struct backend_ops on the CPU (see backend.h).
 *
 * Every op here is threading glue: it describes the work in a small context
 * struct, makes sure each thread's scratch is large enough (grown on the
 * calling thread before the dispatch, so nothing allocates in steady state),
 * then runs one tpool_run() whose task splits the work by (ith, nth) and
 * calls the single-threaded kernels of struct cpu_kernels (kern.h) chosen at
 * creation: scalar, avx2 or avx512.
 *
 * linear runs one of two algorithms: below gemm_min_tok tokens (decode) the
 * matvec streams every weight row once; from there on a packed-panel GEMM
 * (gemm_rows) reuses each widened weight panel across all tokens.
 *
 * Work splits:
 *   linear       output rows (matvec) or GEMM panels of gemm_nr rows
 *   linear_batch the concatenated rows of all jobs, one dispatch
 *   embed, norms tokens / rows
 *   rope         (token, head) pairs, contiguous
 *   attention    (kv head, tile of query tokens) items, round-robin (causal
 *                rows grow); decode: one item per kv head
 *   elementwise  contiguous chunks; small vectors run on the caller alone
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/log.h"
#include "../../core/threadpool.h"
#include "../backend.h"
#include "kern.h"

/* Below this many elements an elementwise op is not worth waking the pool. */
#define ELEM_MIN_PARALLEL 32768

struct cpu_backend {
    struct backend be;
    struct tpool *pool;
    struct cpu_kernels k;
    int nth;
    float **scr;          /* [nth] per-thread scratch, 64-byte aligned */
    size_t scr_cap;       /* floats in each scr[i] */
    float *shared;        /* scratch read by all threads (quantized x sums) */
    size_t shared_cap;
};

static struct cpu_backend *cpu_of(struct backend *be)
{
    return (struct cpu_backend *)be->impl;
}

// ---- scratch ----

static float *alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* Grow every thread's scratch to at least n floats. Only ever grows, so a
 * model reaches steady state after its largest op. Backend ops cannot
 * return errors: on allocation failure this logs, the op writes NaN to its
 * output (so the failure cannot go unnoticed downstream) and returns. */
static bool scratch_ensure(struct cpu_backend *c, size_t n)
{
    if (n <= c->scr_cap)
        return true;
    n += n / 4;
    for (int i = 0; i < c->nth; i++) {
        free(c->scr[i]);
        c->scr[i] = alloc_floats(n);
        if (!c->scr[i]) {
            LOG_ERR("cpu backend: cannot allocate %zu bytes of scratch", n * sizeof(float));
            c->scr_cap = 0;
            return false;
        }
    }
    c->scr_cap = n;
    return true;
}

static float *shared_ensure(struct cpu_backend *c, size_t n)
{
    if (n > c->shared_cap) {
        free(c->shared);
        n += n / 4;
        c->shared = alloc_floats(n);
        c->shared_cap = c->shared ? n : 0;
        if (!c->shared)
            LOG_ERR("cpu backend: cannot allocate %zu bytes of scratch", n * sizeof(float));
    }
    return c->shared;
}

static void nan_fill(float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = NAN;
}

// ---- weights ----

/* The [out, in] matrix of a 1-D ([in]: out = 1) or N-D tensor whose leading
 * dims are contiguous (they fold into out). */
static void wmat_from(struct wmat *m, const struct tensor *w)
{
    int nd = w->ndim;
    memset(m, 0, sizeof *m);
    m->data = w->data;
    m->dt = w->dtype;
    m->in = (int)w->shape[nd - 1];
    m->out = 1;
    for (int d = 0; d < nd - 1; d++)
        m->out *= (int)w->shape[d];
    int64_t row_elems = nd >= 2 ? w->stride[nd - 2] : tensor_row_storage(w);
    m->row_bytes = (size_t)row_elems * dtype_size(w->dtype);
    if (w->qbits) {
        m->qbits = w->qbits;
        m->qgroup = w->qgroup;
        m->qmode = w->qmode;
        m->qsdt = w->qsdtype;
        m->qs = w->qscales;
        m->qb = w->qmode == QMODE_AFFINE ? w->qbiases : NULL;
        m->qrow_bytes = (size_t)(m->in / m->qgroup) * dtype_size(w->qsdtype);
    }
}

/* Per-group x sums per token: affine weights only (fp modes have no biases). */
static size_t xsum_len(const struct wmat *w)
{
    return w->qbits && w->qmode == QMODE_AFFINE ? (size_t)(w->in / w->qgroup) : 0;
}

/* Floats per token of the x a quantized matvec reads: permuted (qxperm) or x itself. */
static size_t qx_stride(const struct cpu_kernels *k, const struct wmat *w)
{
    return w->qbits && k->qxperm ? kern_qx_len(w->in) : (size_t)w->in;
}

/* Floats of shared scratch that qprep_fill() writes for n_tok rows of x. */
static size_t qprep_size(const struct cpu_kernels *k, const struct wmat *w, int n_tok)
{
    if (!w->qbits)
        return 0;
    size_t n = (size_t)n_tok * xsum_len(w);
    if (k->qxperm)
        n += (size_t)n_tok * kern_qx_len(w->in);
    return n;
}

/* The x-side inputs of a quantized matvec, computed once per call rather
 * than once per weight row: for affine weights the per-group sums
 * xs [n_tok, in/qgroup] (NULL otherwise), and on ISAs that want it x
 * permuted (qxperm, row stride qx_stride()) into the order in which the
 * kernel unpacks codes. *xp is x itself otherwise. */
static void qprep_fill(const struct cpu_kernels *k, float *buf, const float *x, int n_tok,
                       const struct wmat *w, const float **xs, const float **xp)
{
    int ng = (int)xsum_len(w), in = w->in;
    for (int t = 0; t < n_tok; t++)
        for (int g = 0; g < ng; g++)
            buf[(size_t)t * ng + g] = k->sum(x + (size_t)t * in + (size_t)g * w->qgroup, w->qgroup);
    *xs = ng ? buf : NULL;
    *xp = x;
    if (!k->qxperm)
        return;
    float *d = buf + (size_t)n_tok * ng;
    size_t ld = kern_qx_len(in);
    for (int t = 0; t < n_tok; t++)
        k->qxperm(d + (size_t)t * ld, x + (size_t)t * in, w);
    *xp = d;
}

static void bias_add(float *y, size_t ldy, int n_tok, const struct tensor *b, int r0, int r1)
{
    for (int t = 0; t < n_tok; t++)
        for (int r = r0; r < r1; r++)
            y[(size_t)t * ldy + r] += kern_ld(b->data, b->dtype, (size_t)r);
}

// ---- linear ----

struct linear_ctx {
    struct cpu_backend *c;
    float *y;
    const float *x;
    const struct wmat *w;
    const struct tensor *b;   /* NULL when absent */
    const float *xsum;        /* [n_tok, in/qgroup] or NULL */
    size_t ldx;               /* row stride of x (permuted x: qx_stride) */
    int n_tok;
    bool gemm;
};

/* Rows [r0, r1) for all tokens through the packed-panel GEMM. Per panel of
 * gemm_nr rows and contraction block of GEMM_KC, the rows' block is widened
 * (or dequantized) and transposed into the panel bp [KC][nr] (L1-resident),
 * then the microkernel runs over every token, accumulating into y across
 * blocks. W is read exactly once. Float weights go straight from W into the
 * panel (pack_w, which prefetches the next block); quantized rows are first
 * dequantized whole into tmp [nr][in] by one sequential read of a contiguous
 * stretch of W (tmp stays in L2/L3), then transposed block by block. */
static void gemm_rows(const struct cpu_kernels *k, float *scr, float *y, size_t ldy,
                      const float *x, size_t ldx, int n_tok, const struct wmat *w, int r0, int r1)
{
    int nr = k->gemm_nr, in = w->in;
    bool direct = k->pack_w && !w->qbits;
    float *bp = scr;
    float *tmp = scr + (size_t)GEMM_KC * nr;
    for (int rb = r0; rb < r1; rb += nr) {
        int nv = r1 - rb < nr ? r1 - rb : nr;
        for (int j = 0; j < nv && !direct; j++)
            k->wrow_f32(tmp + (size_t)j * in, w, rb + j, 0, in);
        for (int k0 = 0; k0 < in; k0 += GEMM_KC) {
            int kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC;
            if (direct)
                k->pack_w(bp, nr, w, rb, nv, k0, kc,
                          in - k0 - kc < GEMM_KC ? in - k0 - kc : GEMM_KC);
            else
                k->pack_t(bp, nr, tmp + k0, (size_t)in, nv, kc);
            for (int m = 0; m < n_tok; m += k->gemm_mr) {
                int mr = n_tok - m < k->gemm_mr ? n_tok - m : k->gemm_mr;
                k->ukernel(y + (size_t)m * ldy + rb, ldy, x + (size_t)m * ldx + k0, ldx, mr, bp,
                           kc, nv, k0 > 0);
            }
        }
    }
}

static void linear_task(void *arg, int ith, int nth)
{
    struct linear_ctx *lc = arg;
    const struct cpu_kernels *k = &lc->c->k;
    const struct wmat *w = lc->w;
    size_t ldy = (size_t)w->out, ldx = lc->ldx;
    long lo, hi;
    if (lc->gemm) {
        long n_panels = (w->out + k->gemm_nr - 1) / k->gemm_nr;
        tpool_range(n_panels, ith, nth, &lo, &hi);
        lo *= k->gemm_nr;
        hi = hi * k->gemm_nr < w->out ? hi * k->gemm_nr : w->out;
        if (lo < hi)
            gemm_rows(k, lc->c->scr[ith], lc->y, ldy, lc->x, ldx, lc->n_tok, w, (int)lo, (int)hi);
    } else {
        /* whole groups of 8 rows per thread so SIMD row blocks do not straddle threads */
        long n8 = (w->out + 7) / 8;
        tpool_range(n8, ith, nth, &lo, &hi);
        lo *= 8;
        hi = hi * 8 < w->out ? hi * 8 : w->out;
        if (lo < hi)
            k->matvec(lc->y, ldy, lc->x, ldx, lc->n_tok, w, (int)lo, (int)hi, lc->xsum,
                      xsum_len(w));
    }
    if (lc->b && lo < hi)
        bias_add(lc->y, ldy, lc->n_tok, lc->b, (int)lo, (int)hi);
}

static void cpu_linear(struct backend *be, float *y, const float *x, const struct tensor *w,
                       const struct tensor *b, int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    struct wmat m;
    wmat_from(&m, w);
    struct linear_ctx lc = {
        .c = c, .y = y, .x = x, .w = &m, .n_tok = n_tok, .ldx = (size_t)m.in,
        .b = b && tensor_is_present(b) ? b : NULL,
    };
    lc.gemm = c->k.ukernel && n_tok >= (m.qbits ? c->k.gemm_min_tok_q : c->k.gemm_min_tok);
    bool ok = true;
    if (lc.gemm) {
        ok = scratch_ensure(c, ((size_t)GEMM_KC + (m.qbits || !c->k.pack_w ? (size_t)m.in : 0)) *
                                   (size_t)c->k.gemm_nr);
    } else if (qprep_size(&c->k, &m, n_tok)) {
        float *buf = shared_ensure(c, qprep_size(&c->k, &m, n_tok));
        if ((ok = buf != NULL)) {
            qprep_fill(&c->k, buf, x, n_tok, &m, &lc.xsum, &lc.x);
            lc.ldx = qx_stride(&c->k, &m);
        }
    }
    if (!ok) {
        nan_fill(y, (size_t)n_tok * (size_t)m.out);
        return;
    }
    tpool_run(c->pool, linear_task, &lc);
}

// ---- linear_batch ----

struct batch_ctx {
    struct cpu_backend *c;
    const struct linear_job *jobs;
    const struct wmat *w;     /* [n_jobs] */
    const size_t *xs_off;     /* [n_jobs] offset of each job's qprep data in c->shared */
    const float **xp;         /* [n_jobs] x as the kernel takes it (see qprep_fill) */
    long total;               /* sum of rows */
    int n_jobs;
};

static void batch_task(void *arg, int ith, int nth)
{
    struct batch_ctx *bc = arg;
    const struct cpu_kernels *k = &bc->c->k;
    long lo, hi, base = 0;
    tpool_range((bc->total + 7) / 8, ith, nth, &lo, &hi);
    lo *= 8;
    hi = hi * 8 < bc->total ? hi * 8 : bc->total;
    for (int j = 0; j < bc->n_jobs && base < hi; j++) {
        const struct wmat *w = &bc->w[j];
        long a = lo > base ? lo - base : 0;
        long z = hi - base < w->out ? hi - base : w->out;
        if (a < z) {
            const struct linear_job *jb = &bc->jobs[j];
            const float *xs = xsum_len(w) ? bc->c->shared + bc->xs_off[j] : NULL;
            k->matvec(jb->y, (size_t)w->out, bc->xp[j], qx_stride(k, w), 1, w, (int)a, (int)z, xs,
                      xsum_len(w));
            if (jb->b && tensor_is_present(jb->b))
                bias_add(jb->y, (size_t)w->out, 1, jb->b, (int)a, (int)z);
        }
        base += w->out;
    }
}

/* Jobs beyond this many are run in several dispatches (the wmat array lives on the stack). */
#define BATCH_MAX 64

static void cpu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs)
{
    struct cpu_backend *c = cpu_of(be);
    while (n_jobs > 0) {
        int n = n_jobs < BATCH_MAX ? n_jobs : BATCH_MAX;
        struct wmat w[BATCH_MAX];
        size_t xs_off[BATCH_MAX], xs_total = 0;
        const float *xp[BATCH_MAX];
        long total = 0;
        for (int j = 0; j < n; j++) {
            wmat_from(&w[j], jobs[j].w);
            total += w[j].out;
            xs_off[j] = xs_total;
            xs_total += qprep_size(&c->k, &w[j], 1);
            xp[j] = jobs[j].x;
        }
        if (xs_total) {
            float *buf = shared_ensure(c, xs_total);
            const float *xs;
            if (!buf) {
                for (int j = 0; j < n; j++)
                    nan_fill(jobs[j].y, (size_t)w[j].out);
                jobs += n;
                n_jobs -= n;
                continue;
            }
            for (int j = 0; j < n; j++)
                if (w[j].qbits)
                    qprep_fill(&c->k, buf + xs_off[j], jobs[j].x, 1, &w[j], &xs, &xp[j]);
        }
        struct batch_ctx bc = {c, jobs, w, xs_off, xp, total, n};
        tpool_run(c->pool, batch_task, &bc);
        jobs += n;
        n_jobs -= n;
    }
}

// ---- embed ----

struct embed_ctx {
    struct cpu_backend *c;
    float *y;
    const struct wmat *w;
    const int32_t *ids;
    int n_tok;
};

static void embed_task(void *arg, int ith, int nth)
{
    struct embed_ctx *ec = arg;
    long lo, hi;
    tpool_range(ec->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        ec->c->k.wrow_f32(ec->y + (size_t)t * ec->w->in, ec->w, ec->ids[t], 0, ec->w->in);
}

static void cpu_embed(struct backend *be, float *y, const struct tensor *w, const int32_t *ids,
                      int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    struct wmat m;
    wmat_from(&m, w);
    struct embed_ctx ec = {c, y, &m, ids, n_tok};
    if (n_tok == 1)
        embed_task(&ec, 0, 1);
    else
        tpool_run(c->pool, embed_task, &ec);
}

// ---- norms ----

struct norm_ctx {
    struct cpu_backend *c;
    float *y;
    const float *x;
    const struct tensor *w;
    const struct tensor *b;   /* layernorm only; NULL when absent */
    float eps;
    int n_rows, n;
    bool layer;               /* layernorm (else rmsnorm) */
};

static void norm_row(const struct norm_ctx *nc, size_t row)
{
    const struct cpu_kernels *k = &nc->c->k;
    const float *x = nc->x + row * (size_t)nc->n;
    float *y = nc->y + row * (size_t)nc->n;
    const void *bd = nc->b ? nc->b->data : NULL;
    enum dtype bdt = nc->b ? nc->b->dtype : DTYPE_F32;
    if (nc->layer) {
        /* two passes: mean, then the biased variance of the deviations */
        float mean = k->sum(x, nc->n) / (float)nc->n;
        float var = k->sumsq(x, mean, nc->n) / (float)nc->n;
        k->norm_apply(y, x, mean, 1.0f / sqrtf(var + nc->eps), nc->w->data, nc->w->dtype, bd, bdt,
                      nc->n);
    } else {
        float ms = k->sumsq(x, 0.0f, nc->n) / (float)nc->n;
        k->norm_apply(y, x, 0.0f, 1.0f / sqrtf(ms + nc->eps), nc->w->data, nc->w->dtype, NULL,
                      DTYPE_F32, nc->n);
    }
}

static void norm_task(void *arg, int ith, int nth)
{
    struct norm_ctx *nc = arg;
    long lo, hi;
    tpool_range(nc->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++)
        norm_row(nc, (size_t)r);
}

static void norm_run(struct cpu_backend *c, struct norm_ctx *nc)
{
    if (nc->n_rows == 1 || (size_t)nc->n_rows * (size_t)nc->n < ELEM_MIN_PARALLEL)
        norm_task(nc, 0, 1);
    else
        tpool_run(c->pool, norm_task, nc);
}

static void cpu_rmsnorm(struct backend *be, float *y, const float *x, const struct tensor *w,
                        float eps, int n_rows, int n)
{
    struct norm_ctx nc = {cpu_of(be), y, x, w, NULL, eps, n_rows, n, false};
    norm_run(nc.c, &nc);
}

static void cpu_layernorm(struct backend *be, float *y, const float *x, const struct tensor *w,
                          const struct tensor *b, float eps, int n_rows, int n)
{
    struct norm_ctx nc = {cpu_of(be), y, x, w, b && tensor_is_present(b) ? b : NULL, eps,
                          n_rows, n, true};
    norm_run(nc.c, &nc);
}

// ---- rope ----

struct rope_ctx {
    struct cpu_backend *c;
    float *x;
    const float *inv_freq;
    float mscale;
    int n_tok, row_stride, n_head, head_dim, n_rot, pos0;
};

/* cos/sin table of one position: angles in double (positions reach 1e5 and
 * a float product pos * inv_freq would lose ~1e-2 rad there), then cast. */
static void rope_table(float *cs, const struct rope_ctx *rc, int pos)
{
    int half = rc->n_rot / 2;
    for (int j = 0; j < half; j++) {
        double a = (double)pos * (double)rc->inv_freq[j];
        cs[j] = (float)(cos(a) * rc->mscale);
        cs[half + j] = (float)(sin(a) * rc->mscale);
    }
}

static void rope_task(void *arg, int ith, int nth)
{
    struct rope_ctx *rc = arg;
    float *cs = rc->c->scr[ith];
    int half = rc->n_rot / 2, cur = -1;
    long lo, hi;
    tpool_range((long)rc->n_tok * rc->n_head, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        int t = (int)(it / rc->n_head), h = (int)(it % rc->n_head);
        if (t != cur) {
            rope_table(cs, rc, rc->pos0 + t);
            cur = t;
        }
        float *xh = rc->x + (size_t)t * rc->row_stride + (size_t)h * rc->head_dim;
        for (int j = 0; j < half; j++) {
            float x1 = xh[j], x2 = xh[j + half];
            float cj = cs[j], sj = cs[half + j];
            xh[j] = x1 * cj - x2 * sj;
            xh[j + half] = x2 * cj + x1 * sj;
        }
    }
}

static void cpu_rope(struct backend *be, float *x, int n_tok, int row_stride, int n_head,
                     int head_dim, int n_rot, int pos0, const float *inv_freq, float mscale)
{
    struct cpu_backend *c = cpu_of(be);
    struct rope_ctx rc = {c, x, inv_freq, mscale, n_tok, row_stride, n_head, head_dim, n_rot, pos0};
    if (!scratch_ensure(c, (size_t)n_rot)) {
        nan_fill(x, (size_t)n_tok * (size_t)row_stride);
        return;
    }
    if (n_tok == 1)
        rope_task(&rc, 0, 1);
    else
        tpool_run(c->pool, rope_task, &rc);
}

// ---- attention ----

/* Keys per block: a K or V block of ATTN_JB rows x head_dim f32 (32 KiB at
 * head_dim 128) is copied to contiguous scratch and stays in L1 while every
 * query row of the item uses it. In the cache the rows of one head sit
 * n_kv_head * head_dim floats apart (4 KiB for 8 x 128): rows at a
 * power-of-two stride map to the same L1 sets, so in place they would evict
 * each other, and the hardware prefetchers stop at page boundaries. */
#define ATTN_JB 64
/* Rows ahead of the copy to prefetch (8 rows of 512 B: ~64 lines in flight). */
#define ATTN_PF 8
/* Query tokens per item in prefill; an item's rows are tokens x (query heads
 * of one kv head), so GQA heads and neighbouring tokens share each K/V block. */
#define ATTN_TT 4
/* Most query rows per item (tokens x heads per kv head). */
#define ATTN_ROWS 64

struct attn_ctx {
    struct cpu_backend *c;
    float *out;
    const float *q, *k, *v;
    int n_tok, pos0, n_head, n_kv_head, head_dim;
    int tt;                   /* tokens per item */
    int hc;                   /* query heads per item (n_rep, capped at ATTN_ROWS) */
    size_t ld_s;              /* scores row stride in scratch (max keys, padded) */
    float scale;
};

/* Query rows i = ti * n_rep + r of one item: token t0 + ti, head g * n_rep + r. */
struct attn_rows {
    const float *q[ATTN_ROWS];
    float *o[ATTN_ROWS];
    int n[ATTN_ROWS];         /* keys the row attends (causal) */
    float sum[ATTN_ROWS];     /* softmax denominators */
    int n_rows, n_max;
};

/* Copy rows [j0, j0 + nb) of one head (stride ld) to dst [nb][hd],
 * prefetching ATTN_PF rows ahead (up to row n_max). */
static void attn_copy(float *dst, const float *src, size_t ld, int j0, int nb, int n_max, int hd)
{
    for (int r = 0; r < nb; r++) {
        if (j0 + r + ATTN_PF < n_max) {
            const char *p = (const char *)(src + (size_t)(j0 + r + ATTN_PF) * ld);
            for (size_t b = 0; b < (size_t)hd * sizeof(float); b += 64)
                __builtin_prefetch(p + b, 0, 3);
        }
        memcpy(dst + (size_t)r * hd, src + (size_t)(j0 + r) * ld, (size_t)hd * sizeof(float));
    }
}

/* Causal attention for kv head g, its query heads [h0, h0 + hc) (all of
 * them unless n_rep > ATTN_ROWS) and tokens [t0, t0 + tt): two passes over
 * the keys in blocks of ATTN_JB, rows inside, so every K and V row is read
 * from memory once per item: (1) scores into scratch, (2) after a stable
 * softmax per row (max subtracted, f32), the weighted sum of V rows. */
static void attn_item(const struct attn_ctx *ac, float *scr, int g, int h0, int t0, int tt)
{
    const struct cpu_kernels *k = &ac->c->k;
    int hd = ac->head_dim, n_rep = ac->n_head / ac->n_kv_head;
    int nh = n_rep - h0 < ac->hc ? n_rep - h0 : ac->hc;
    size_t qs = (size_t)ac->n_head * hd, kvs = (size_t)ac->n_kv_head * hd;
    const float *kg = ac->k + (size_t)g * hd, *vg = ac->v + (size_t)g * hd;
    float *blk = scr + (size_t)(ac->tt * ac->hc) * ac->ld_s;
    struct attn_rows ar;
    ar.n_rows = tt * nh;
    ar.n_max = ac->pos0 + t0 + tt;
    for (int i = 0; i < ar.n_rows; i++) {
        int t = t0 + i / nh, h = g * n_rep + h0 + i % nh;
        ar.q[i] = ac->q + (size_t)t * qs + (size_t)h * hd;
        ar.o[i] = ac->out + (size_t)t * qs + (size_t)h * hd;
        ar.n[i] = ac->pos0 + t + 1;
    }
    for (int j0 = 0; j0 < ar.n_max; j0 += ATTN_JB) {
        int nb = ar.n_max - j0 < ATTN_JB ? ar.n_max - j0 : ATTN_JB;
        attn_copy(blk, kg, kvs, j0, nb, ar.n_max, hd);
        for (int i = 0; i < ar.n_rows; i++) {
            int n = ar.n[i] - j0 < nb ? ar.n[i] - j0 : nb;
            if (n > 0)
                k->attn_scores(scr + i * ac->ld_s + j0, ar.q[i], blk, n, hd, ac->scale);
        }
    }
    for (int i = 0; i < ar.n_rows; i++) {
        float *s = scr + i * ac->ld_s;
        ar.sum[i] = k->exp_sum(s, s, k->max(s, ar.n[i]), ar.n[i]);
    }
    for (int j0 = 0; j0 < ar.n_max; j0 += ATTN_JB) {
        int nb = ar.n_max - j0 < ATTN_JB ? ar.n_max - j0 : ATTN_JB;
        attn_copy(blk, vg, kvs, j0, nb, ar.n_max, hd);
        for (int i = 0; i < ar.n_rows; i++) {
            int n = ar.n[i] - j0 < nb ? ar.n[i] - j0 : nb;
            if (n > 0)
                k->attn_accum(ar.o[i], scr + i * ac->ld_s + j0, blk, n, hd, j0 > 0);
        }
    }
    for (int i = 0; i < ar.n_rows; i++)
        k->scale(ar.o[i], 1.0f / ar.sum[i], (size_t)hd);
}

static void attn_task(void *arg, int ith, int nth)
{
    struct attn_ctx *ac = arg;
    int n_rep = ac->n_head / ac->n_kv_head, n_hc = (n_rep + ac->hc - 1) / ac->hc;
    long per_tile = (long)ac->n_kv_head * n_hc;
    long n_items = (ac->n_tok + ac->tt - 1) / ac->tt * per_tile;
    /* round-robin: later tiles attend more keys, interleaving balances them */
    for (long it = ith; it < n_items; it += nth) {
        int t0 = (int)(it / per_tile) * ac->tt;
        int g = (int)(it % per_tile / n_hc), h0 = (int)(it % n_hc) * ac->hc;
        int tt = ac->n_tok - t0 < ac->tt ? ac->n_tok - t0 : ac->tt;
        attn_item(ac, ac->c->scr[ith], g, h0, t0, tt);
    }
}

static void cpu_attention(struct backend *be, float *out, const float *q, const float *k,
                          const float *v, int n_tok, int pos0, int n_head, int n_kv_head,
                          int head_dim, float scale)
{
    struct cpu_backend *c = cpu_of(be);
    int n_rep = n_head / n_kv_head;
    struct attn_ctx ac = {c, out, q, k, v, n_tok, pos0, n_head, n_kv_head, head_dim, 1, 1, 0,
                          scale};
    assert(n_rep >= 1 && n_head % n_kv_head == 0);
    ac.hc = n_rep < ATTN_ROWS ? n_rep : ATTN_ROWS;
    ac.tt = ATTN_ROWS / ac.hc < ATTN_TT ? ATTN_ROWS / ac.hc : ATTN_TT;
    /* padded to a cache line so score rows do not share lines */
    ac.ld_s = ((size_t)pos0 + (size_t)n_tok + 15) & ~(size_t)15;
    if (!scratch_ensure(c, ac.ld_s * (size_t)(ac.tt * ac.hc) + (size_t)ATTN_JB * head_dim)) {
        nan_fill(out, (size_t)n_tok * n_head * head_dim);
        return;
    }
    tpool_run(c->pool, attn_task, &ac);
}

// ---- elementwise ----

enum elem_op { ELEM_GELU_TANH, ELEM_GELU_ERF, ELEM_SILU_MUL, ELEM_AXPY };

struct elem_ctx {
    const struct cpu_kernels *k;
    enum elem_op op;
    float *y;
    const float *a, *b;
    float s;
    size_t n;
};

static void elem_range(const struct elem_ctx *ec, size_t lo, size_t hi)
{
    size_t n = hi - lo;
    switch (ec->op) {
    case ELEM_GELU_TANH:
        ec->k->gelu_tanh(ec->y + lo, n);
        break;
    case ELEM_GELU_ERF:
        ec->k->gelu_erf(ec->y + lo, n);
        break;
    case ELEM_SILU_MUL:
        ec->k->silu_mul(ec->y + lo, ec->a + lo, ec->b + lo, n);
        break;
    case ELEM_AXPY:
        ec->k->axpy(ec->y + lo, ec->s, ec->a + lo, n);
        break;
    }
}

static void elem_task(void *arg, int ith, int nth)
{
    struct elem_ctx *ec = arg;
    long lo, hi;
    /* chunks of 64 elements keep every thread's start cache-line aligned */
    tpool_range((long)((ec->n + 63) / 64), ith, nth, &lo, &hi);
    size_t a = (size_t)lo * 64, z = (size_t)hi * 64 < ec->n ? (size_t)hi * 64 : ec->n;
    if (a < z)
        elem_range(ec, a, z);
}

static void elem_run(struct backend *be, struct elem_ctx *ec)
{
    struct cpu_backend *c = cpu_of(be);
    ec->k = &c->k;
    if (ec->n < ELEM_MIN_PARALLEL)
        elem_range(ec, 0, ec->n);
    else
        tpool_run(c->pool, elem_task, ec);
}

static void cpu_gelu_tanh(struct backend *be, float *x, size_t n)
{
    struct elem_ctx ec = {.op = ELEM_GELU_TANH, .y = x, .n = n};
    elem_run(be, &ec);
}

static void cpu_gelu_erf(struct backend *be, float *x, size_t n)
{
    struct elem_ctx ec = {.op = ELEM_GELU_ERF, .y = x, .n = n};
    elem_run(be, &ec);
}

static void cpu_silu_mul(struct backend *be, float *y, const float *gate, const float *up, size_t n)
{
    struct elem_ctx ec = {.op = ELEM_SILU_MUL, .y = y, .a = gate, .b = up, .n = n};
    elem_run(be, &ec);
}

static void cpu_axpy(struct backend *be, float *y, float a, const float *x, size_t n)
{
    struct elem_ctx ec = {.op = ELEM_AXPY, .y = y, .a = x, .s = a, .n = n};
    elem_run(be, &ec);
}

// ---- lifetime ----

static void cpu_destroy(struct backend *be);

static const struct backend_ops k_cpu_ops = {
    .linear = cpu_linear,
    .linear_batch = cpu_linear_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .gelu_tanh = cpu_gelu_tanh,
    .gelu_erf = cpu_gelu_erf,
    .silu_mul = cpu_silu_mul,
    .axpy = cpu_axpy,
    .destroy = cpu_destroy,
};

/* backend names by ISA: static strings, valid for the program's lifetime */
static const char *const k_names[] = {"cpu-scalar", "cpu-avx2", "cpu-avx512"};

/* Resolve the requested ISA (argument, else $MLXCEL_ISA, else auto); *is_auto
 * tells the caller it may step down to a variant compiled into this build. */
static int isa_choose(enum cpu_isa *isa, bool *is_auto, const char *req, struct err *e)
{
    const char *src = "isa argument";
    if (!req) {
        req = getenv("MLXCEL_ISA");
        src = "MLXCEL_ISA";
    }
    if (!req)
        req = "auto";
    *is_auto = !strcmp(req, "auto") || !*req;
    if (cpu_isa_parse(req, isa) < 0)
        return err_setf(e, ERR_ARG, "cpu backend: unknown ISA '%s' (%s); expected auto, scalar, "
                        "avx2 or avx512", req, src);
    enum cpu_isa best = cpu_isa_best();
    if (*isa > best)
        return err_setf(e, ERR_UNSUPPORTED, "cpu backend: ISA '%s' (%s) is not supported by this "
                        "CPU/OS; best available is '%s'", req, src, cpu_isa_name(best));
    return 0;
}

/* Creates the pool and the dispatch table; the backend owns both (backend_free). */
int backend_cpu_new(struct backend **out, int n_threads, const char *isa_req, struct err *e)
{
    enum cpu_isa isa;
    bool is_auto;
    int rc;
    *out = NULL;
    if ((rc = isa_choose(&isa, &is_auto, isa_req, e)) < 0)
        return rc;
    struct cpu_backend *c = calloc(1, sizeof *c);
    if (!c)
        return err_setf(e, ERR_NOMEM, "cpu backend: out of memory");
    /* auto: the best variant the CPU runs and this build contains (a build
     * without the per-file target flags compiles the ISA files to stubs) */
    while (is_auto && isa > CPU_ISA_SCALAR && !cpu_kernels_init(&c->k, isa))
        isa = (enum cpu_isa)(isa - 1);
    if (!cpu_kernels_init(&c->k, isa)) {
        rc = err_setf(e, ERR_UNSUPPORTED, "cpu backend: ISA '%s' was not compiled into this build",
                      cpu_isa_name(isa));
        goto fail_free;
    }
    if ((rc = tpool_new(&c->pool, n_threads, e)) < 0)
        goto fail_free;
    c->nth = tpool_size(c->pool);
    c->scr = calloc((size_t)c->nth, sizeof *c->scr);
    if (!c->scr) {
        rc = err_setf(e, ERR_NOMEM, "cpu backend: out of memory");
        goto fail_pool;
    }
    c->be.ops = &k_cpu_ops;
    c->be.name = k_names[isa];
    c->be.n_threads = c->nth;
    c->be.impl = c;
    *out = &c->be;
    return 0;
fail_pool:
    tpool_free(c->pool);
fail_free:
    free(c);
    return rc;
}

static void cpu_destroy(struct backend *be)
{
    struct cpu_backend *c = cpu_of(be);
    for (int i = 0; c->scr && i < c->nth; i++)
        free(c->scr[i]);
    free(c->scr);
    free(c->shared);
    tpool_free(c->pool);
    free(c);
}
