/*
 * backend_cpu_linear: the CPU backend's linear products (backend_ops linear and
 * linear_batch, and the expert linears' decode jobs).
 *
 * cpu_linear looks the call's token count up in the weight's plan (linear_plan.h:
 * made at prepare_weight, one per weight format) and runs that bucket on the pool:
 * a matvec that streams every weight row once (f32, integer or FPAN; the kernel
 * named in wmat.kid), or the packed-panel GEMM (gemm_rows) that reuses each
 * widened weight panel across all tokens.
 *
 * Work splits:
 *   linear       the bucket's rows (16, a QG16 tile's 48, FPAN's 32, or GEMM
 *                panels of gemm_nr rows), claimed in pieces (tpool_claim_guided)
 *   linear_batch the concatenated rows of all jobs, one dispatch
 */
#include <assert.h>
#include <string.h>

#include "backend_cpu_impl.h"
#include "linear_plan.h"

/* Per-group x sums per token: affine weights only (fp modes have no biases). */
static size_t xsum_len(const struct wmat *w)
{
    return w->qbits && w->qmode == QMODE_AFFINE ? (size_t)(w->in / w->qgroup) : 0;
}

/* True when the integer matvec takes W (kern.h, "qi"): x is then prepared
 * as integers (qi_prep, kern_qi_len bytes per token) instead of f32. */
static bool use_qi(const struct cpu_kernels *k, const struct wmat *w)
{
    return lp_uses_qi(k, w);
}

/* Floats per token of the x a quantized matvec reads: prepared for qi,
 * permuted (qxperm), or x itself. */
static size_t qx_stride(const struct cpu_kernels *k, const struct wmat *w)
{
    if (use_qi(k, w))
        return kern_qi_len(w) / sizeof(float);
    return w->qbits && k->qxperm ? kern_qx_len(w->in) : (size_t)w->in;
}

/* Floats of shared scratch that qprep_fill() writes for n_tok rows of x. */
static size_t qprep_size(const struct cpu_kernels *k, const struct wmat *w, int n_tok)
{
    if (!w->qbits)
        return 0;
    if (use_qi(k, w))
        return (size_t)n_tok * qx_stride(k, w);
    size_t n = (size_t)n_tok * xsum_len(w);
    if (k->qxperm)
        n += (size_t)n_tok * kern_qx_len(w->in);
    return n;
}

struct qi_prep_ctx {
    const struct cpu_kernels *k;
    float *buf;
    const float *x;
    const struct wmat *w;
    int n_tok;
};

static void qi_prep_task(void *arg, int ith, int nth)
{
    const struct qi_prep_ctx *pc = arg;
    size_t ld = qx_stride(pc->k, pc->w);
    long lo, hi;
    tpool_range(pc->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        pc->k->qi_prep((uint8_t *)(pc->buf + (size_t)t * ld), pc->x + (size_t)t * pc->w->in, pc->w);
}

/* The x-side inputs of a quantized matvec, computed once per call rather
 * than once per weight row: for qi, x prepared as integers with its group
 * sums (*xs NULL); otherwise for affine weights the per-group sums
 * xs [n_tok, in/qgroup] (NULL for other modes), and on ISAs that want it x
 * permuted (qxperm, row stride qx_stride()) into the order in which the
 * kernel unpacks codes. *xp is x itself otherwise. */
static void qprep_fill(struct cpu_backend *c, float *buf, const float *x, int n_tok,
                       const struct wmat *w, const float **xs, const float **xp)
{
    const struct cpu_kernels *k = &c->k;
    int ng = (int)xsum_len(w), in = w->in;
    if (use_qi(k, w)) {
        struct qi_prep_ctx pc = {k, buf, x, w, n_tok};
        if (n_tok >= LP_QI_PREP_THREADS) /* the tokens' preparations split over the threads */
            tpool_run(c->pool, qi_prep_task, &pc);
        else
            qi_prep_task(&pc, 0, 1);
        *xs = NULL;
        *xp = buf;
        return;
    }
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

/* The matvec path (w->kid names the kernel) for rows [r0, r1) of x as qprep_fill left it
 * (row stride ldx floats). */
static void matvec_rows(const struct cpu_kernels *k, enum lp_path path, float *y, size_t ldy,
                        const float *x, size_t ldx, int n_tok, const struct wmat *w, int r0, int r1,
                        const float *xsum)
{
    if (path == LP_PATH_FPAN)
        k->fpan_linear(y, ldy, x, ldx, n_tok, w, r0, r1);
    else if (path == LP_PATH_QI)
        k->matvec_qi(y, ldy, (const uint8_t *)x, ldx * sizeof(float), n_tok, w, r0, r1);
    else
        k->matvec(y, ldy, x, ldx, n_tok, w, r0, r1, xsum, xsum_len(w));
}

/* y[t][r0 .. r1) += b[r0 .. r1) for every token: the bias widened once per piece of rows,
 * then added with the vector axpy (times 1: the same sum as a plain add). */
static void bias_add(const struct cpu_kernels *k, float *y, size_t ldy, int n_tok,
                     const struct tensor *b, int r0, int r1)
{
    float bf[256];
    const size_t es = dtype_size(b->dtype); /* F32/F16/BF16: the loader takes no other bias */
    for (int r = r0; r < r1; r += 256) {
        const int n = r1 - r < 256 ? r1 - r : 256;
        k->to_f32(bf, (const uint8_t *)b->data + (size_t)r * es, b->dtype, (size_t)n);
        for (int t = 0; t < n_tok; t++)
            k->axpy(y + (size_t)t * ldy + r, 1.0f, bf, (size_t)n);
    }
}

// ---- linear ----

struct linear_ctx {
    struct cpu_backend *c;
    float *y;
    size_t ldy;
    const float *x;
    const struct wmat *w;
    const struct tensor *b;   /* NULL when absent */
    const float *xsum;        /* [n_tok, in/qgroup] or NULL */
    size_t ldx;               /* row stride of x (permuted x: qx_stride) */
    int n_tok;
    const struct lp_bucket *bk; /* the plan's bucket of n_tok: path, kernel (w->kid), rows */
    atomic_long next;         /* the next unit (panel or 16 rows) to claim: tpool_claim_guided */
};

/* The lines of a block of float W (rows r0 .. r0+nv, columns k0 .. k0+kc) that the GEMM
 * asks for while the microkernel runs over the block before it, a share before each call. */
struct pf_block {
    const char *base;
    size_t row_bytes;
    int n, lines;  /* lines in all, lines per row */
    int row, line; /* the next one: its row, and its line in the row */
};

static void pf_block_set(struct pf_block *p, const struct wmat *w, int r0, int nv, int k0, int kc)
{
    const size_t es = dtype_size(w->dt);
    p->base = (const char *)w->data + (size_t)r0 * w->row_bytes + (size_t)k0 * es;
    p->row_bytes = w->row_bytes;
    p->lines = (int)(((size_t)kc * es + 63) / 64);
    p->n = nv * p->lines;
    p->row = p->line = 0;
}

/* Ask for the next k lines (fewer at the block's end). */
static void pf_block_some(struct pf_block *p, int k)
{
    for (; k > 0 && p->row * p->lines < p->n; k--) {
        __builtin_prefetch(p->base + (size_t)p->row * p->row_bytes + 64 * (size_t)p->line, 0, 2);
        if (++p->line == p->lines) {
            p->line = 0;
            p->row++;
        }
    }
}

/* Float weights (pack_w) against n_tok >= GEMM_MC_MIN tokens (ADR 0144): per group of up to
 * GEMM_NP panels and contraction block, the panels packed side by side in bp, then the tokens
 * in blocks of GEMM_MC, every panel of the group over each block while its x is in L2 (one
 * panel over all the tokens streamed x from L3 or memory once per panel: 4 MiB of x per 16
 * rows at 4096 tokens). W is still read once; every output's sum runs over the same blocks in
 * the same order as gemm_rows', so the result is the same to the bit. */
static void gemm_rows_mc(const struct cpu_kernels *k, float *bp, float *y, size_t ldy,
                         const float *x, size_t ldx, int n_tok, const struct wmat *w, int r0, int r1)
{
    const int nr = k->gemm_nr, in = w->in;
    for (int g0 = r0; g0 < r1; g0 += nr * GEMM_NP) {
        const int g1 = r1 - g0 < nr * GEMM_NP ? r1 : g0 + nr * GEMM_NP, np = (g1 - g0 + nr - 1) / nr;
        for (int k0 = 0; k0 < in; k0 += GEMM_KC) {
            const int kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC;
            for (int p = 0; p < np; p++) {
                const int rb = g0 + p * nr;
                k->pack_w(bp + (size_t)p * GEMM_KC * nr, nr, w, rb, g1 - rb < nr ? g1 - rb : nr, k0, kc);
            }
            for (int m0 = 0; m0 < n_tok; m0 += GEMM_MC) {
                const int m1 = n_tok - m0 < GEMM_MC ? n_tok : m0 + GEMM_MC;
                for (int p = 0; p < np; p++) {
                    const int rb = g0 + p * nr, nv = g1 - rb < nr ? g1 - rb : nr;
                    for (int m = m0; m < m1; m += k->gemm_mr) {
                        int mr = m1 - m < k->gemm_mr ? m1 - m : k->gemm_mr;
                        k->ukernel(y + (size_t)m * ldy + rb, ldy, x + (size_t)m * ldx + k0, ldx, mr,
                                   bp + (size_t)p * GEMM_KC * nr, kc, nv, k0 > 0);
                    }
                }
            }
        }
    }
}

/* Rows [r0, r1) for all tokens through the packed-panel GEMM. Per panel of
 * gemm_nr rows and contraction block of GEMM_KC, the rows' block is widened
 * (or dequantized) and transposed into the panel bp [KC][nr] (L1-resident),
 * then the microkernel runs over every token, accumulating into y across
 * blocks. W is read exactly once. Float weights go straight from W into the
 * panel (pack_w), and the next block's lines (this panel's, else the next panel's first) are
 * asked for into L2 a share before each microkernel call, so they arrive spread over the
 * block's work instead of in one burst that the tokens' x then evicts; quantized rows are first
 * dequantized whole into tmp [nr][in] by one sequential read of a contiguous
 * stretch of W (tmp stays in L2/L3), then transposed block by block. Float weights against
 * GEMM_MC_MIN tokens or more: gemm_rows_mc. */
static void gemm_rows(const struct cpu_kernels *k, float *scr, float *y, size_t ldy,
                      const float *x, size_t ldx, int n_tok, const struct wmat *w, int r0, int r1)
{
    int nr = k->gemm_nr, in = w->in;
    bool direct = k->pack_w && !w->qbits;
    if (direct && n_tok >= GEMM_MC_MIN) {
        gemm_rows_mc(k, scr, y, ldy, x, ldx, n_tok, w, r0, r1);
        return;
    }
    float *bp = scr;
    float *tmp = scr + (size_t)GEMM_KC * nr;
    for (int rb = r0; rb < r1; rb += nr) {
        int nv = r1 - rb < nr ? r1 - rb : nr;
        for (int j = 0; j < nv && !direct; j++)
            k->wrow_f32(tmp + (size_t)j * in, w, rb + j, 0, in);
        for (int k0 = 0; k0 < in; k0 += GEMM_KC) {
            int kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC;
            struct pf_block pf = {0};
            if (direct) {
                k->pack_w(bp, nr, w, rb, nv, k0, kc);
                if (k0 + kc < in) /* this panel's next block, else the next panel's first */
                    pf_block_set(&pf, w, rb, nv, k0 + kc,
                                 in - k0 - kc < GEMM_KC ? in - k0 - kc : GEMM_KC);
                else if (rb + nr < r1)
                    pf_block_set(&pf, w, rb + nr, r1 - rb - nr < nr ? r1 - rb - nr : nr, 0,
                                 in < GEMM_KC ? in : GEMM_KC);
            } else {
                k->pack_t(bp, nr, tmp + k0, (size_t)in, nv, kc);
            }
            const int n_calls = (n_tok + k->gemm_mr - 1) / k->gemm_mr,
                      per = (pf.n + n_calls - 1) / n_calls;
            for (int m = 0; m < n_tok; m += k->gemm_mr) {
                int mr = n_tok - m < k->gemm_mr ? n_tok - m : k->gemm_mr;
                pf_block_some(&pf, per);
                k->ukernel(y + (size_t)m * ldy + rb, ldy, x + (size_t)m * ldx + k0, ldx, mr, bp,
                           kc, nv, k0 > 0);
            }
        }
    }
}

/* Rows are claimed in pieces (tpool_claim_guided), not split evenly: on a shared host one
 * thread may be preempted mid-product, and the others then take its share. A row's result does not
 * depend on which thread computes it. */
static void linear_task(void *arg, int ith, int nth)
{
    struct linear_ctx *lc = arg;
    const struct cpu_kernels *k = &lc->c->k;
    const struct wmat *w = lc->w;
    size_t ldy = lc->ldy, ldx = lc->ldx;
    /* the bucket's rows: whole GEMM panels or FPAN panels, or whole groups of 16 rows so
     * SIMD row blocks (QG16 panels) do not straddle threads; the QG16 panels a kernel reads
     * together (more than 16 rows) only where there are enough of them for 4 pieces a
     * thread */
    const bool gemm = lc->bk->path == LP_PATH_GEMM;
    long unit = lc->bk->rows;
    if (lc->bk->path == LP_PATH_QI && unit > 16 && w->out / unit < 4L * nth)
        unit = 16;
    const long n_units = (w->out + unit - 1) / unit;
    long lo, hi;
    while (tpool_claim_guided(&lc->next, n_units, nth, &lo, &hi)) {
        lo *= unit;
        hi = hi * unit < w->out ? hi * unit : w->out;
        if (gemm)
            gemm_rows(k, lc->c->scr[ith], lc->y, ldy, lc->x, ldx, lc->n_tok, w, (int)lo, (int)hi);
        else
            matvec_rows(k, (enum lp_path)lc->bk->path, lc->y, ldy, lc->x, ldx, lc->n_tok, w,
                        (int)lo, (int)hi, lc->xsum);
        if (lc->b)
            bias_add(k, lc->y, ldy, lc->n_tok, lc->b, (int)lo, (int)hi);
    }
}

int cpu_gemm_min_tok(const struct cpu_backend *c, const struct tensor *w)
{
    struct wmat m;
    struct linear_plan tmp;
    cpu_wmat_from(&m, w);
    return linear_plan_gemm_from(cpu_plan_of(c, &m, &tmp));
}

void cpu_linear(struct backend *be, float *y, int ldy, const float *x, const struct tensor *w,
                const struct tensor *b, int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    struct wmat m;
    struct linear_plan tmp;
    if (c->err_rc || n_tok <= 0)
        return;
    cpu_wmat_from(&m, w);
    const struct lp_bucket *bk = linear_plan_at(cpu_plan_of(c, &m, &tmp), n_tok);
    m.kid = bk->kernel;
    struct linear_ctx lc = {
        .c = c, .y = y, .ldy = (size_t)ldy, .x = x, .w = &m, .n_tok = n_tok, .ldx = (size_t)m.in,
        .b = b && tensor_is_present(b) ? b : NULL, .bk = bk,
    };
    assert(ldy >= m.out);
    assert(!m.qg16 || use_qi(&c->k, &m)); /* QG16 is only made for the kernels that read it */
    if (bk->path == LP_PATH_GEMM) {
        /* a panel and the rows it is dequantized from, or GEMM_NP panels (gemm_rows_mc) */
        if (!cpu_scratch_ensure(c, ((size_t)GEMM_KC * GEMM_NP + (m.qbits || !c->k.pack_w ? (size_t)m.in : 0)) *
                                       (size_t)c->k.gemm_nr))
            return;
    } else if (qprep_size(&c->k, &m, n_tok)) {
        float *buf = cpu_shared_ensure(c, qprep_size(&c->k, &m, n_tok));
        if (!buf)
            return;
        qprep_fill(c, buf, x, n_tok, &m, &lc.xsum, &lc.x);
        lc.ldx = qx_stride(&c->k, &m);
    }
    atomic_init(&lc.next, 0);
    tpool_run(c->pool, linear_task, &lc);
}

// ---- matvec jobs in one dispatch (linear_batch, the expert linears of decode) ----

struct batch_ctx {
    struct cpu_backend *c;
    const struct cpu_job *jobs;
    const struct wmat *w;     /* [n_jobs], kid set from each job's plan */
    const uint8_t *path;      /* [n_jobs] enum lp_path of each job's bucket */
    const size_t *xs_off;     /* [n_jobs] offset of each job's qprep data in c->shared */
    const float **xp;         /* [n_jobs] x as the kernel takes it (see qprep_fill) */
    long total;               /* sum of rows */
    int n_jobs;
    long unit;                /* rows a claim counts in: 16, or FPAN_R when a W is FPAN */
    atomic_long next;         /* the next unit to claim (tpool_claim_guided) */
};

static void batch_task(void *arg, int ith, int nth)
{
    (void)ith;
    struct batch_ctx *bc = arg;
    const struct cpu_kernels *k = &bc->c->k;
    const long u = bc->unit, nu = (bc->total + u - 1) / u;
    long lo, hi;
    while (tpool_claim_guided(&bc->next, nu, nth, &lo, &hi)) { /* pieces as in linear_task */
        long base = 0;
        lo *= u;
        hi = hi * u < bc->total ? hi * u : bc->total;
        for (int j = 0; j < bc->n_jobs && base < hi; j++) {
            const struct wmat *w = &bc->w[j];
            long a = lo > base ? lo - base : 0;
            long z = hi - base < w->out ? hi - base : w->out;
            if (a < z) {
                const struct cpu_job *jb = &bc->jobs[j];
                const float *xs = xsum_len(w) ? bc->c->shared + bc->xs_off[j] : NULL;
                size_t ldx = w->qbits ? qx_stride(k, w) : (size_t)w->in;
                matvec_rows(k, (enum lp_path)bc->path[j], jb->y, jb->ldy, bc->xp[j], ldx,
                            jb->n_tok, w, (int)a, (int)z, xs);
                if (jb->b)
                    bias_add(k, jb->y, jb->ldy, jb->n_tok, jb->b, (int)a, (int)z);
            }
            base += w->out;
        }
    }
}

/* An earlier job among jobs[0 .. j) whose prepared x job j can share (the
 * same x and token count, and weights whose preparation is identical: the
 * q/k/v or gate/up products of one layer), or -1. */
static int prep_twin(const struct cpu_kernels *k, const struct cpu_job *jobs,
                     const struct wmat *w, int j)
{
    if (!w[j].qbits)
        return -1;
    for (int i = 0; i < j; i++)
        if (jobs[i].x == jobs[j].x && jobs[i].n_tok == jobs[j].n_tok &&
            w[i].qbits == w[j].qbits && w[i].in == w[j].in && w[i].qgroup == w[j].qgroup &&
            w[i].qmode == w[j].qmode && use_qi(k, &w[i]) == use_qi(k, &w[j]))
            return i;
    return -1;
}

/* Jobs beyond this many are run in several dispatches (the wmat array lives on the stack). */
#define BATCH_MAX 64

void cpu_linear_jobs(struct cpu_backend *c, const struct cpu_job *jobs, int n_jobs)
{
    while (n_jobs > 0 && !c->err_rc) {
        int n = n_jobs < BATCH_MAX ? n_jobs : BATCH_MAX;
        struct wmat w[BATCH_MAX];
        uint8_t path[BATCH_MAX];
        size_t xs_off[BATCH_MAX], xs_total = 0;
        const float *xp[BATCH_MAX];
        int same[BATCH_MAX]; /* an earlier job whose prepared x this one reuses, or -1 */
        long total = 0;
        for (int j = 0; j < n; j++) {
            struct linear_plan tmp;
            cpu_wmat_from(&w[j], jobs[j].w);
            const struct lp_bucket *bk = linear_plan_at(cpu_plan_of(c, &w[j], &tmp), jobs[j].n_tok);
            assert(bk->path != LP_PATH_GEMM); /* callers send GEMM-sized products to cpu_linear */
            w[j].kid = bk->kernel;
            path[j] = bk->path;
            total += w[j].out;
            same[j] = prep_twin(&c->k, jobs, w, j);
            xs_off[j] = same[j] >= 0 ? xs_off[same[j]] : xs_total;
            if (same[j] < 0)
                xs_total += qprep_size(&c->k, &w[j], jobs[j].n_tok);
            xp[j] = jobs[j].x;
        }
        if (xs_total) {
            float *buf = cpu_shared_ensure(c, xs_total);
            const float *xs;
            if (!buf)
                return;
            for (int j = 0; j < n; j++)
                if (same[j] >= 0)
                    xp[j] = xp[same[j]];
                else if (w[j].qbits)
                    qprep_fill(c, buf + xs_off[j], jobs[j].x, jobs[j].n_tok, &w[j], &xs, &xp[j]);
        }
        long unit = 16;
        for (int j = 0; j < n; j++)
            unit = w[j].fpan ? FPAN_R : unit;
        struct batch_ctx bc = {.c = c, .jobs = jobs, .w = w, .path = path, .xs_off = xs_off, .xp = xp,
                               .total = total, .n_jobs = n, .unit = unit};
        atomic_init(&bc.next, 0);
        tpool_run(c->pool, batch_task, &bc);
        jobs += n;
        n_jobs -= n;
    }
}

void cpu_linear_batch(struct backend *be, const struct linear_job *jobs, int n_jobs)
{
    struct cpu_backend *c = cpu_of(be);
    struct cpu_job cj[BATCH_MAX];
    bool small = true;
    for (int j = 0; j < n_jobs && small; j++)
        small = jobs[j].n_tok < cpu_gemm_min_tok(c, jobs[j].w);
    if (!small) {
        /* prefill-sized: each product takes the GEMM path on its own */
        for (int j = 0; j < n_jobs; j++)
            cpu_linear(be, jobs[j].y, jobs[j].ldy, jobs[j].x, jobs[j].w, jobs[j].b, jobs[j].n_tok);
        return;
    }
    while (n_jobs > 0) {
        int n = n_jobs < BATCH_MAX ? n_jobs : BATCH_MAX;
        for (int j = 0; j < n; j++) {
            const struct tensor *b = jobs[j].b && tensor_is_present(jobs[j].b) ? jobs[j].b : NULL;
            cj[j] = (struct cpu_job){jobs[j].y, (size_t)jobs[j].ldy, jobs[j].x, jobs[j].w, b,
                                     jobs[j].n_tok};
        }
        cpu_linear_jobs(c, cj, n);
        jobs += n;
        n_jobs -= n;
    }
}
