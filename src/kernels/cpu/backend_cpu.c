/*
 * backend_cpu: struct backend_ops on the CPU (see backend.h): lifetime,
 * memory, the dense and elementwise ops. Rope, the paged KV store and
 * attention are in backend_cpu_attn.c; MoE routing and the expert linears
 * in backend_cpu_moe.c.
 *
 * Every op here is threading glue: it describes the work in a small context
 * struct, makes sure each thread's scratch is large enough (grown on the
 * calling thread before the dispatch, so nothing allocates in steady state),
 * then runs one tpool_run() whose task splits the work by (ith, nth) and
 * calls the single-threaded kernels of struct cpu_kernels (kern.h) chosen at
 * creation: scalar, avx2 or avx512. An op that cannot get its scratch
 * records the error (cpu_fail) and returns; sync() reports it.
 *
 * Memory is host memory: buf_alloc is a 64-byte aligned allocation, upload,
 * download and copy are memcpy.
 *
 * prepare_weight lays each weight out as the kernels read it and keeps its
 * format's plan (linear_plan.h); the linear products that run it are in
 * backend_cpu_linear.c.
 *
 * Work splits:
 *   embed, norms tokens / rows
 *   elementwise  rows, or contiguous chunks; small sizes run on the caller alone
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/fileio.h"
#include "../../core/log.h"
#include "backend_cpu_impl.h"

/* Below this many elements an elementwise op is not worth waking the pool. */
#define ELEM_MIN_PARALLEL 32768

// ---- errors and scratch ----

void cpu_fail(struct cpu_backend *c, const char *what, size_t bytes)
{
    if (c->err_rc)
        return;
    c->err_rc = -ERR_NOMEM;
    snprintf(c->err_msg, sizeof c->err_msg, "cpu backend: cannot allocate %zu bytes of %s", bytes,
             what);
}

/* Scratch and activations of 2 MiB and more in huge pages (mem_huge_alloc): the GEMM walks a
 * prompt's activations row by row. */
static float *alloc_floats(size_t n)
{
    return n <= SIZE_MAX / sizeof(float) ? mem_huge_alloc(n * sizeof(float)) : NULL;
}

bool cpu_scratch_ensure(struct cpu_backend *c, size_t n)
{
    if (n <= c->scr_cap)
        return true;
    n += n / 4;
    for (int i = 0; i < c->nth; i++) {
        free(c->scr[i]);
        c->scr[i] = alloc_floats(n);
        if (!c->scr[i]) {
            c->scr_cap = 0;
            cpu_fail(c, "scratch", n * sizeof(float));
            return false;
        }
    }
    c->scr_cap = n;
    return true;
}

float *cpu_shared_ensure(struct cpu_backend *c, size_t n)
{
    if (n > c->shared_cap) {
        free(c->shared);
        n += n / 4;
        c->shared = alloc_floats(n);
        c->shared_cap = c->shared ? n : 0;
        if (!c->shared)
            cpu_fail(c, "scratch", n * sizeof(float));
    }
    return c->shared;
}

int32_t *cpu_iscratch_ensure(struct cpu_backend *c, size_t n)
{
    if (n > c->iscr_cap) {
        free(c->iscr);
        n += n / 4 + 16;
        c->iscr = malloc(n * sizeof *c->iscr);
        c->iscr_cap = c->iscr ? n : 0;
        if (!c->iscr)
            cpu_fail(c, "scratch", n * sizeof *c->iscr);
    }
    return c->iscr;
}

// ---- memory ----

static int cpu_buf_alloc(struct backend *be, size_t bytes, void **out, struct err *e)
{
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    *out = n >= bytes ? mem_huge_alloc(n) : NULL;
    if (!*out)
        return err_setf(e, ERR_NOMEM, "cpu backend: cannot allocate %zu MiB", bytes >> 20);
    return 0;
}

static void cpu_buf_free(struct backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_memcpy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes)
        memmove(dst, src, bytes);
}


struct pack_ctx {
    const struct cpu_kernels *k;
    uint8_t *dst;
    const struct wmat *w;
    int p0, p1;
};

static void pack_task(void *arg, int ith, int nth)
{
    const struct pack_ctx *pc = arg;
    long lo, hi;
    tpool_range(pc->p1 - pc->p0, ith, nth, &lo, &hi);
    if (lo >= hi)
        return;
    if (pc->w->qbits)
        pc->k->qg16_pack(pc->dst, pc->w, pc->p0 + (int)lo, pc->p0 + (int)hi);
    else
        kern_fpan_pack(pc->dst, pc->w, pc->p0 + (int)lo, pc->p0 + (int)hi);
}

/* Source bytes packed between releases of the consumed pages. */
#define PACK_SLAB (8u << 20)

/* Prepared weights (repacked or copied) fill arenas one after another, 64-byte aligned: each
 * arena a mapping of at least ARENA bytes that starts on a huge-page boundary, huge pages
 * advised, freed at destroy. The kernel backs only the aligned 2 MiB stretches of a
 * mapping with huge pages, so a mapping per weight left both ends of each (and all of a
 * weight under 2 MiB, the k and v projections of GQA among them) on 4 KiB pages: a quarter
 * of llama-1b's and phi-2's weights (ADR 0042). An arena's untouched tail is address space,
 * not memory, but the huge page its last weight ends in is filled whole: up to 2 MiB an
 * arena, 42 MiB over phi-2 bf16's 21 arenas of 256 MiB, so they are 1 GiB. */
#define ARENA (1u << 30)

/* len bytes in the current arena, or in a new one; NULL with e set when out of memory. */
static uint8_t *pack_alloc(struct cpu_backend *c, size_t len, const char *why,
                           const struct tensor *w, struct err *e)
{
    if (len > SIZE_MAX / 2) {
        err_setf(e, ERR_NOMEM, "cpu backend: cannot allocate %zu MiB to %s %s", len >> 20, why,
                 w->name ? w->name : "a weight");
        return NULL;
    }
    len = (len + 63) & ~(size_t)63;
    if (len > c->arena_left) {
        if (c->n_packs == c->cap_packs) {
            size_t cap = c->cap_packs ? 2 * c->cap_packs : 16;
            struct cpu_pack *np = realloc(c->packs, cap * sizeof *np);
            if (!np) {
                err_setf(e, ERR_NOMEM, "cpu backend: out of memory");
                return NULL;
            }
            c->packs = np;
            c->cap_packs = cap;
        }
        size_t n = len > ARENA ? len : ARENA;
        uint8_t *a = mem_anon_alloc(n);
        if (!a && n > len) /* no room for a whole arena's address space: this weight alone */
            a = mem_anon_alloc(n = len);
        if (!a) {
            err_setf(e, ERR_NOMEM, "cpu backend: cannot allocate %zu MiB to %s %s", len >> 20,
                     why, w->name ? w->name : "a weight");
            return NULL;
        }
        c->packs[c->n_packs++] = (struct cpu_pack){a, n};
        c->arena_cur = a;
        c->arena_left = n;
    }
    uint8_t *p = c->arena_cur;
    c->arena_cur += len;
    c->arena_left -= len;
    return p;
}

struct copy_ctx {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
};

static void copy_task(void *arg, int ith, int nth)
{
    const struct copy_ctx *cc = arg;
    long lo, hi;
    tpool_range((long)((cc->n + 4095) / 4096), ith, nth, &lo, &hi);
    size_t a = (size_t)lo * 4096, z = (size_t)hi * 4096 < cc->n ? (size_t)hi * 4096 : cc->n;
    if (a < z)
        memcpy(cc->dst + a, cc->src + a, z - a);
}

/* n bytes from src into dst, a slab at a time on every thread (most of the time goes to
 * the kernel zeroing the new pages), each consumed slab's pages given back. */
static void copy_release(struct cpu_backend *c, uint8_t *dst, const uint8_t *src, size_t n)
{
    for (size_t o = 0; o < n; o += PACK_SLAB) {
        struct copy_ctx cc = {dst + o, src + o, n - o < PACK_SLAB ? n - o : PACK_SLAB};
        if (cc.n >= (1u << 20))
            tpool_run(c->pool, copy_task, &cc);
        else
            memcpy(cc.dst, cc.src, cc.n);
        mem_release(cc.src, cc.n);
    }
}

/* w's stored bytes (data, scales, biases) copied as they are, views rebased: only when
 * the source is disposable (its pages go back as they are copied, so resident memory
 * grows by one slab) and the copies stay within the budget. */
static int copy_weight(struct cpu_backend *c, struct tensor *w, unsigned flags, struct err *e)
{
    const uint64_t nd = tensor_data_extent(w), na = tensor_qaux_bytes(w);
    const uint64_t total = nd + (w->qscales ? na : 0) + (w->qbiases ? na : 0);
    if (!(flags & PREP_SOURCE_DISPOSABLE) || !w->data || total == 0 || total > c->copy_budget ||
        total > SIZE_MAX / 2)
        return 0;
    const void **src[3] = {(const void **)&w->data, &w->qscales, &w->qbiases};
    const uint64_t len[3] = {nd, na, na};
    for (int i = 0; i < 3; i++) {
        if (!*src[i] || len[i] == 0)
            continue;
        uint8_t *dst = pack_alloc(c, (size_t)len[i], "copy", w, e);
        if (!dst)
            return -ERR_NOMEM;
        copy_release(c, dst, *src[i], (size_t)len[i]);
        *src[i] = dst;
    }
    c->copy_budget -= total;
    return 0;
}

/* Panels [0, n_panels) of pr rows each of m into dst, a slab at a time on every thread;
 * when the source is disposable the pages of each consumed slab go back at once, so
 * resident memory grows by about one slab, not by the tensor. */
static void pack_panels(struct cpu_backend *c, uint8_t *dst, const struct wmat *m, int pr,
                        int n_panels, unsigned flags)
{
    const int slab = (int)(PACK_SLAB / ((size_t)pr * m->row_bytes) + 1);
    for (int p = 0; p < n_panels; p += slab) {
        struct pack_ctx pc = {&c->k, dst, m, p, p + slab < n_panels ? p + slab : n_panels};
        tpool_run(c->pool, pack_task, &pc);
        if (flags & PREP_SOURCE_DISPOSABLE)
            mem_release(m->data, (size_t)pc.p1 * pr < (size_t)m->out ? (size_t)pc.p1 * pr * m->row_bytes
                                                                     : (size_t)m->out * m->row_bytes);
    }
}

/* A 4/8-bit affine W that the VNNI kernels take, repacked as QG16 (kern.h), and a float
 * matrix that the variant reads as FPAN (within the copy budget, as a copy would be),
 * into anonymous memory the backend owns; any other W copied there as it is
 * (copy_weight). Only 2-D float matrices of at least one panel of rows that linear products
 * read become FPAN (the model says which: PREP_MATRIX); cpu_embed reads a row of an FPAN
 * table (a head tied to the embedding) back. */
static int prepare_layout(struct cpu_backend *c, struct tensor *w, unsigned flags, struct err *e)
{
    struct wmat m;
    if (w->packed)
        return err_setf(e, ERR_INTERNAL, "cpu backend: weight %s was already prepared",
                        w->name ? w->name : "(unnamed)");
    cpu_wmat_from(&m, w);
    const bool may = c->repack && (flags & (PREP_SOURCE_DISPOSABLE | PREP_REPACK_BESIDE));
    if (may && (flags & PREP_MATRIX) && c->k.fpan_linear && w->ndim == 2 && m.out >= FPAN_R &&
        kern_fpan_ok(&m)) {
        const int n_panels = (m.out + FPAN_R - 1) / FPAN_R;
        const size_t len = (size_t)n_panels * kern_fpan_bytes(m.in, m.dt);
        if (len > c->copy_budget)
            return copy_weight(c, w, flags, e);
        uint8_t *dst = pack_alloc(c, len, "repack", w, e);
        if (!dst)
            return -ERR_NOMEM;
        pack_panels(c, dst, &m, FPAN_R, n_panels, flags);
        c->copy_budget -= len;
        w->data = dst;
        w->packed = CPU_PACK_FPAN;
        return 0;
    }
    if (!may || !c->k.qg16_pack || !kern_qg16_ok(&m))
        return copy_weight(c, w, flags, e); /* the kernels read the stored layout */
    const int n_panels = (m.out + 15) / 16;
    m.qg16_panel = kern_qg16_bytes(m.in, m.qbits, m.qgroup, dtype_size(m.qsdt));
    const size_t len = (size_t)n_panels * m.qg16_panel;
    uint8_t *dst = pack_alloc(c, len, "repack", w, e);
    if (!dst)
        return -ERR_NOMEM;
    const size_t ss_bytes = (size_t)m.out * m.qrow_bytes;
    pack_panels(c, dst, &m, 16, n_panels, flags);
    if (flags & PREP_SOURCE_DISPOSABLE) {
        mem_release(m.qs, ss_bytes);
        mem_release(m.qb, ss_bytes);
    }
    w->data = dst;
    w->packed = CPU_PACK_QG16;
    return 0;
}

/* The weight laid out as the kernels read it, then its format's plan kept (linear_plan.h). */
static int cpu_prepare_weight(struct backend *be, struct tensor *w, unsigned flags, struct err *e)
{
    struct cpu_backend *c = cpu_of(be);
    int rc = prepare_layout(c, w, flags, e);
    if (rc == 0)
        cpu_plan_keep(c, w);
    return rc;
}

static int cpu_sync(struct backend *be, struct err *e)
{
    struct cpu_backend *c = cpu_of(be);
    int rc = c->err_rc;
    if (rc)
        err_setf(e, -rc, "%s", c->err_msg);
    c->err_rc = 0;
    return rc;
}

// ---- weights ----

/* The [out, in] matrix of a 1-D ([in]: out = 1) or N-D tensor whose leading
 * dims are contiguous (they fold into out). */
void cpu_wmat_from(struct wmat *m, const struct tensor *w)
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
    if (w->packed == CPU_PACK_FPAN) { /* float panels (cpu_prepare_weight) */
        m->fpan = true;
        m->fpan_panel = kern_fpan_bytes(m->in, m->dt);
        return;
    }
    if (w->packed) { /* QG16 (cpu_prepare_weight) */
        m->qbits = w->qbits;
        m->qgroup = w->qgroup;
        m->qmode = w->qmode;
        m->qsdt = w->qsdtype;
        m->qg16 = true;
        m->qg16_panel = kern_qg16_bytes(m->in, m->qbits, m->qgroup, dtype_size(m->qsdt));
        return;
    }
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
    const struct wmat *w = ec->w;
    long lo, hi;
    tpool_range(ec->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        float *y = ec->y + (size_t)t * w->in;
        if (w->fpan) { /* an FPAN table: the row back in the stored layout, then widened */
            uint8_t *row = (uint8_t *)ec->c->scr[ith];
            kern_fpan_unpack_row(row, w, ec->ids[t]);
            ec->c->k.to_f32(y, row, w->dt, (size_t)w->in);
            continue;
        }
        if (!w->qg16) {
            ec->c->k.wrow_f32(y, w, ec->ids[t], 0, w->in);
            continue;
        }
        /* a QG16 table (a head tied to the embedding): the row back in the stored layout
         * in this thread's scratch, then the same dequantization as unpacked */
        uint8_t *row = (uint8_t *)ec->c->scr[ith];
        size_t ssz = dtype_size(w->qsdt), ng = (size_t)(w->in / w->qgroup);
        kern_qg16_unpack_row(row, w, ec->ids[t]);
        struct wmat r1 = *w;
        r1.qg16 = false;
        r1.out = 1;
        r1.data = row;
        r1.row_bytes = (size_t)w->in * (size_t)w->qbits / 8;
        r1.qs = row + r1.row_bytes;
        r1.qb = r1.qs + ng * ssz;
        r1.qrow_bytes = ng * ssz;
        ec->c->k.wrow_f32(y, &r1, 0, 0, w->in);
    }
}

static void cpu_embed(struct backend *be, float *y, const struct tensor *w, const int32_t *ids,
                      int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    struct wmat m;
    cpu_wmat_from(&m, w);
    struct embed_ctx ec = {c, y, &m, ids, n_tok};
    if (c->err_rc)
        return;
    if (m.qg16 && !cpu_scratch_ensure(c, (size_t)m.in * (size_t)m.qbits / 32 + (size_t)(m.in / m.qgroup) * 2 + 16))
        return;
    if (m.fpan && !cpu_scratch_ensure(c, (size_t)m.in)) /* a row of at most 4-byte elements */
        return;
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
    float w_off;              /* weights used as w + w_off */
    float eps;
    int n_rows, per_tok, n;
    size_t ld;
    bool layer;               /* layernorm (else rmsnorm) */
};

static void norm_row(const struct norm_ctx *nc, size_t row)
{
    const struct cpu_kernels *k = &nc->c->k;
    size_t off = row / (size_t)nc->per_tok * nc->ld + row % (size_t)nc->per_tok * (size_t)nc->n;
    const float *x = nc->x + off;
    float *y = nc->y + off;
    const void *bd = nc->b ? nc->b->data : NULL;
    enum dtype bdt = nc->b ? nc->b->dtype : DTYPE_F32;
    const char *wd = nc->w->data;
    /* one weight row per head when w holds per_tok rows of n */
    if (nc->per_tok > 1 && tensor_nelem(nc->w) == (int64_t)nc->per_tok * nc->n)
        wd += row % (size_t)nc->per_tok * (size_t)nc->n * dtype_size(nc->w->dtype);
    if (nc->layer) {
        /* two passes: mean, then the biased variance of the deviations */
        float mean = k->sum(x, nc->n) / (float)nc->n;
        float var = k->sumsq(x, mean, nc->n) / (float)nc->n;
        k->norm_apply(y, x, mean, 1.0f / sqrtf(var + nc->eps), wd, nc->w->dtype, nc->w_off, bd,
                      bdt, nc->n);
    } else {
        float ms = k->sumsq(x, 0.0f, nc->n) / (float)nc->n;
        k->norm_apply(y, x, 0.0f, 1.0f / sqrtf(ms + nc->eps), wd, nc->w->dtype, nc->w_off, NULL,
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
    if (c->err_rc)
        return;
    if (nc->n_rows == 1 || (size_t)nc->n_rows * (size_t)nc->n < ELEM_MIN_PARALLEL)
        norm_task(nc, 0, 1);
    else
        tpool_run(c->pool, norm_task, nc);
}

static void cpu_rmsnorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                        float w_off, float eps, int n_tok, int per_tok, int n)
{
    struct norm_ctx nc = {cpu_of(be), y, x, w, NULL, w_off, eps, n_tok * per_tok, per_tok, n,
                          (size_t)ld, false};
    norm_run(nc.c, &nc);
}

static void cpu_layernorm(struct backend *be, float *y, const float *x, int ld,
                          const struct tensor *w, float w_off, const struct tensor *b, float eps,
                          int n_tok, int per_tok, int n)
{
    struct norm_ctx nc = {cpu_of(be), y, x, w, b && tensor_is_present(b) ? b : NULL, w_off, eps,
                          n_tok * per_tok, per_tok, n, (size_t)ld, true};
    norm_run(nc.c, &nc);
}

// ---- elementwise (rows of n, strided) ----

enum elem_op { ELEM_ACT, ELEM_GLU, ELEM_GLU_CLAMPED, ELEM_AXPY, ELEM_SIGMOID_AXPY, ELEM_GATHER, ELEM_SCALE, ELEM_SOFTCAP,
               ELEM_MUL, ELEM_XIELU };

struct elem_ctx {
    const struct cpu_kernels *k;
    enum elem_op op;
    enum act_kind act;
    float *y;
    const float *x;
    const int32_t *idx;       /* gather */
    const float *g;           /* sigmoid_axpy: one gate logit per row */
    const float *x2;          /* mul: the second factor (stride ldx2) */
    size_t ldy, ldx, ldx2;
    float s;
    float alpha;              /* glu_clamped: sigmoid gain (s holds the limit) */
    bool interleaved;         /* glu_clamped: gate / up in alternate columns */
    struct xielu_params xp;   /* xielu */
    int n_rows, n, div;
};

static void act_apply(const struct cpu_kernels *k, enum act_kind act, float *x, size_t n)
{
    switch (act) {
    case ACT_GELU_TANH:
        k->gelu_tanh(x, n);
        break;
    case ACT_GELU_ERF:
        k->gelu_erf(x, n);
        break;
    case ACT_SILU:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] / (1.0f + expf(-x[i]));
        break;
    case ACT_RELU:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case ACT_RELU2:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
        break;
    case ACT_XIELU:  /* refused by cpu_act / cpu_glu: it needs its constants (xielu) */
        break;
    case ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            x[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    }
}

/* Columns [c0, c1) of row r. */
static void elem_row(const struct elem_ctx *ec, size_t r, size_t c0, size_t c1)
{
    float *y = ec->y + r * ec->ldy + c0;
    const float *x = ec->x ? ec->x + r * ec->ldx + c0 : NULL;
    size_t n = c1 - c0;
    switch (ec->op) {
    case ELEM_ACT:
        act_apply(ec->k, ec->act, y, n);
        break;
    case ELEM_GLU:
        /* silu has a fused kernel; other activations go through y, then the product */
        if (ec->act == ACT_SILU) {
            ec->k->silu_mul(y, x, x + ec->n, n);
            break;
        }
        if (y != x)
            memcpy(y, x, n * sizeof *y);
        act_apply(ec->k, ec->act, y, n);
        for (size_t i = 0; i < n; i++)
            y[i] *= x[ec->n + i];
        break;
    case ELEM_GLU_CLAMPED: {
        /* gate j and up j of row r, from the halves or the interleaved pairs */
        const float *xr = ec->x + r * ec->ldx;
        size_t gs = ec->interleaved ? 2 : 1, go = ec->interleaved ? 2 * c0 : c0;
        size_t uo = ec->interleaved ? 2 * c0 + 1 : (size_t)ec->n + c0;
        for (size_t i = 0; i < n; i++) {
            float g = xr[go + i * gs], u = xr[uo + i * gs], lim = ec->s;
            g = g < lim ? g : lim;
            u = u < -lim ? -lim : u > lim ? lim : u;
            y[i] = (u + 1.0f) * (g / (1.0f + expf(-ec->alpha * g)));
        }
        break;
    }
    case ELEM_AXPY:
        ec->k->axpy(y, ec->s, x, n);
        break;
    case ELEM_SIGMOID_AXPY:
        ec->k->axpy(y, (float)(1.0 / (1.0 + exp(-(double)ec->g[r]))), x, n);
        break;
    case ELEM_SCALE:
        ec->k->scale(y, ec->s, n);
        break;
    case ELEM_SOFTCAP:
        for (size_t i = 0; i < n; i++)
            y[i] = ec->s * tanhf(y[i] / ec->s);
        break;
    case ELEM_GATHER:
        memcpy(y, ec->x + (size_t)(ec->idx[r] / ec->div) * ec->ldx + c0, n * sizeof *y);
        break;
    case ELEM_MUL: {
        const float *x2 = ec->x2 + r * ec->ldx2 + c0;
        for (size_t i = 0; i < n; i++)
            y[i] = x[i] * x2[i];
        break;
    }
    case ELEM_XIELU: {
        const struct xielu_params *p = &ec->xp;
        for (size_t i = 0; i < n; i++) {
            float v = y[i];
            y[i] = v > 0.0f ? p->alpha_p * v * v + p->beta * v
                            : (expm1f(v < p->eps ? v : p->eps) - v) * p->alpha_n + p->beta * v;
        }
        break;
    }
    }
}

static void elem_task(void *arg, int ith, int nth)
{
    struct elem_ctx *ec = arg;
    long lo, hi;
    if (ec->n_rows >= nth) {
        tpool_range(ec->n_rows, ith, nth, &lo, &hi);
        for (long r = lo; r < hi; r++)
            elem_row(ec, (size_t)r, 0, (size_t)ec->n);
        return;
    }
    /* few long rows: chunks of 64 columns keep every thread's start cache-line aligned */
    long per = (ec->n + 63) / 64;
    tpool_range(per * ec->n_rows, ith, nth, &lo, &hi);
    for (long it = lo; it < hi;) {
        long r = it / per, c = it % per, c_end = hi - r * per < per ? hi - r * per : per;
        size_t z = (size_t)c_end * 64 < (size_t)ec->n ? (size_t)c_end * 64 : (size_t)ec->n;
        elem_row(ec, (size_t)r, (size_t)c * 64, z);
        it = r * per + c_end;
    }
}

static void elem_run(struct backend *be, struct elem_ctx *ec)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || ec->n_rows <= 0 || ec->n <= 0)
        return;
    ec->k = &c->k;
    if ((size_t)ec->n_rows * (size_t)ec->n < ELEM_MIN_PARALLEL)
        elem_task(ec, 0, 1);
    else
        tpool_run(c->pool, elem_task, ec);
}

/* An activation act / glu cannot apply (xIELU needs its constants): recorded, nothing runs. */
static bool act_refused(struct backend *be, enum act_kind act)
{
    struct cpu_backend *c = cpu_of(be);
    if (act != ACT_XIELU)
        return false;
    if (!c->err_rc) {
        c->err_rc = -ERR_INTERNAL;
        snprintf(c->err_msg, sizeof c->err_msg, "cpu backend: xIELU goes through the xielu op");
    }
    return true;
}

static void cpu_act(struct backend *be, enum act_kind act, float *x, int ld, int n_rows, int n)
{
    if (act_refused(be, act))
        return;
    struct elem_ctx ec = {.op = ELEM_ACT, .act = act, .y = x, .ldy = (size_t)ld, .n_rows = n_rows,
                          .n = n};
    elem_run(be, &ec);
}

static void cpu_glu(struct backend *be, enum act_kind act, float *y, int ldy, const float *x,
                    int ldx, int n_rows, int n)
{
    if (act_refused(be, act))
        return;
    struct elem_ctx ec = {.op = ELEM_GLU, .act = act, .y = y, .x = x, .ldy = (size_t)ldy,
                          .ldx = (size_t)ldx, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_glu_clamped(struct backend *be, float *y, int ldy, const float *x, int ldx,
                            int n_rows, int n, float alpha, float limit, bool interleaved)
{
    struct elem_ctx ec = {.op = ELEM_GLU_CLAMPED, .y = y, .x = x, .ldy = (size_t)ldy,
                          .ldx = (size_t)ldx, .s = limit, .alpha = alpha,
                          .interleaved = interleaved, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_xielu(struct backend *be, float *x, int ld, int n_rows, int n,
                      const struct xielu_params *p)
{
    struct elem_ctx ec = {.op = ELEM_XIELU, .y = x, .xp = *p, .ldy = (size_t)ld, .n_rows = n_rows,
                          .n = n};
    elem_run(be, &ec);
}

static void cpu_axpy(struct backend *be, float *y, int ldy, float a, const float *x, int ldx,
                     int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_AXPY, .y = y, .x = x, .s = a, .ldy = (size_t)ldy,
                          .ldx = (size_t)ldx, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_sigmoid_axpy(struct backend *be, float *y, int ldy, const float *g, const float *x,
                             int ldx, int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_SIGMOID_AXPY, .y = y, .x = x, .g = g, .ldy = (size_t)ldy,
                          .ldx = (size_t)ldx, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_scale(struct backend *be, float *x, int ld, float a, int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_SCALE, .y = x, .s = a, .ldy = (size_t)ld, .n_rows = n_rows,
                          .n = n};
    elem_run(be, &ec);
}

static void cpu_softcap(struct backend *be, float *x, int ld, float cap, int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_SOFTCAP, .y = x, .s = cap, .ldy = (size_t)ld,
                          .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_gather(struct backend *be, float *y, const float *x, int ldx, const int32_t *idx,
                       int div, int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_GATHER, .y = y, .x = x, .idx = idx, .div = div,
                          .ldy = (size_t)n, .ldx = (size_t)ldx, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

static void cpu_mul(struct backend *be, float *y, int ldy, const float *a, int lda, const float *b,
                    int ldb, int n_rows, int n)
{
    struct elem_ctx ec = {.op = ELEM_MUL, .y = y, .x = a, .x2 = b, .ldy = (size_t)ldy,
                          .ldx = (size_t)lda, .ldx2 = (size_t)ldb, .n_rows = n_rows, .n = n};
    elem_run(be, &ec);
}

/* Llama 4's NoPE-layer attention temperature (backend.h attn_temp): one factor per row, in
 * double, on the calling thread (n_tok x n multiplies). */
static void cpu_attn_temp(struct backend *be, float *x, int ld, int n_tok, int n,
                          const struct kv_rows *rows, int floor_scale, float attn_scale)
{
    if (cpu_of(be)->err_rc)
        return;
    for (int i = 0; i < n_tok; i++) {
        double f = 1.0 + attn_scale * log(floor((rows->pos[i] + 1.0) / floor_scale) + 1.0);
        float *r = x + (size_t)i * ld;
        for (int j = 0; j < n; j++)
            r[j] = (float)(r[j] * f);
    }
}

/* Routing weights onto the expert inputs (backend.h moe_weight_input), on the calling thread. */
static void cpu_moe_weight_input(struct backend *be, float *x, const int32_t *order, float *w,
                                 int n_slot, int n)
{
    if (cpu_of(be)->err_rc)
        return;
    for (int r = 0; r < n_slot; r++) {
        float s = w[order[r]];
        float *row = x + (size_t)r * n;
        for (int j = 0; j < n; j++)
            row[j] *= s;
        w[order[r]] = 1.0f;
    }
}

// ---- lifetime ----

static void cpu_destroy(struct backend *be);

static const struct backend_ops k_cpu_ops = {
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .prepare_weight = cpu_prepare_weight,
    .sync = cpu_sync,
    .linear = cpu_linear,
    .linear_batch = cpu_linear_batch,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .layernorm = cpu_layernorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .act = cpu_act,
    .glu = cpu_glu,
    .glu_clamped = cpu_glu_clamped,
    .xielu = cpu_xielu,
    .axpy = cpu_axpy,
    .sigmoid_axpy = cpu_sigmoid_axpy,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .gather = cpu_gather,
    .moe_route = cpu_moe_route,
    .moe_route_grouped = cpu_moe_route_grouped,
    .moe_group = cpu_moe_group,
    .linear_experts = cpu_linear_experts,
    .moe_combine = cpu_moe_combine,
    .mul = cpu_mul,
    .conv1d = cpu_conv1d,
    .selective_scan = cpu_selective_scan,
    .gated_delta = cpu_gated_delta,
    .ssd_scan = cpu_ssd_scan,
    .rglru = cpu_rglru,
    .destroy = cpu_destroy,
    .linear_plan = cpu_linear_plan_info,
    .attn_temp = cpu_attn_temp,
    .moe_weight_input = cpu_moe_weight_input,
};

/* backend names by ISA: static strings, valid for the program's lifetime */
static const char *const k_names[] = {"cpu-scalar", "cpu-avx2", "cpu-avx512"};

/* Resolve the requested ISA (argument, else the options' isa, else auto); *is_auto
 * tells the caller it may step down to a variant compiled into this build. */
static int isa_choose(enum cpu_isa *isa, bool *is_auto, const char *req, const char *opt, struct err *e)
{
    const char *src = "isa argument";
    if (!req) {
        req = opt;
        src = "isa option, MLXCEL_ISA";
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
int backend_cpu_new(struct backend **out, int n_threads, const char *isa_req, const struct backend_opts *o,
                    struct err *e)
{
    static const struct backend_opts k_default = BACKEND_OPTS_DEFAULT;
    enum cpu_isa isa;
    bool is_auto;
    int rc;
    *out = NULL;
    if (!o)
        o = &k_default;
    if ((rc = isa_choose(&isa, &is_auto, isa_req, o->isa, e)) < 0)
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
    c->be.kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_F16 | 1u << DTYPE_BF16;
    c->be.n_threads = c->nth;
    c->be.fused_moe = o->fused_moe;
    c->repack = o->repack;
    /* the copy budget: auto copies up to 3/4 of the memory available now (the rest stays
     * mapped, which the kernel can page out; ADR 0037) */
    c->copy_budget = o->copy == BACKEND_COPY_NONE  ? 0
                     : o->copy == BACKEND_COPY_ALL ? UINT64_MAX
                                                   : mem_available_bytes() / 4 * 3;
    if (o->fast && c->k.matvec_qi_fast) {
        c->k.matvec_qi = c->k.matvec_qi_fast;
        c->be.fast = true;
    }
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
    free(c->iscr);
    for (size_t i = 0; i < c->n_packs; i++)
        mem_anon_free(c->packs[i].p, c->packs[i].len);
    free(c->packs);
    tpool_free(c->pool);
    free(c);
}
