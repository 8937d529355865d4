/*
 * fuse: kernels fused across the backend seam by holding one op back
 * (ADR 0138). Model code issues a decode layer as small ops (blocks.c):
 * the residual add (axpy) and then the next norm of the same rows, the rope
 * of q | k and then the store of k and v. Each pair is one launch here:
 *
 *   axpy(h += s * o)  then rmsnorm / layernorm(y = norm(h)), rows for row
 *                     -> cu_norm_res: the add and the norm in one block per row
 *   rope(q | k)       then kv_store(k, the last heads rope rotated; v)
 *                     -> cu_rope_store: one block per row
 *
 * The table's axpy and rope entries record their arguments (all device
 * pointers and values) in c->pend instead of launching; the norms and the
 * kv_store look at what is held and either take it into their launch or
 * launch it first, unchanged. Every other entry of the table, and sync,
 * the graph calls, buf_free and destroy, launches what is held first
 * (backend_cuda.cu wraps them), so the stream runs the ops in the order
 * they were issued and a graph records the same work. The fused kernels
 * round as the two ops do (elem.cu axpy_f, attn.cu rope_rot), so a fused
 * step gives the same bits as the ops one by one (test_cuda).
 *
 * Calls inside the plugin (cu_axpy, cu_rope, ...) launch at once: only
 * the table's entries hold an op back.
 */
#include <stdint.h>

#include "cuda_impl.h"

void cu_flush(struct cuda_backend *c)
{
    struct cu_pend p = c->pend;
    c->pend.kind = CU_PEND_NONE;
    if (p.kind == CU_PEND_AXPY)
        cu_axpy(&c->be, p.y, p.ldy, p.s, p.x, p.ldx, p.n_rows, p.n);
    else if (p.kind == CU_PEND_ROPE)
        cu_rope(&c->be, p.q, p.ld, p.n_tok, p.n_head, p.head_dim, &p.rp, &p.rows);
}

/* Whether [a, a + na) and [b, b + nb) (floats) are apart. */
static bool apart(const float *a, size_t na, const float *b, size_t nb)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 + na * sizeof(float) <= b0 || b0 + nb * sizeof(float) <= a0;
}

/* Floats from a row's first to the last row's end: n_rows rows of n at stride ld. */
static size_t span_of(int n_rows, int n, int ld)
{
    return (size_t)(n_rows - 1) * (size_t)ld + (size_t)n;
}

void cu_fuse_axpy(struct backend *be, float *y, int ldy, float a, const float *x, int ldx,
                  int n_rows, int n)
{
    struct cuda_backend *c = cu_of(be);
    cu_flush(c);
    if (c->err_rc || n_rows <= 0 || n <= 0)
        return;
    struct cu_pend *p = &c->pend;
    p->kind = CU_PEND_AXPY;
    p->y = y, p->x = x, p->ldy = ldy, p->ldx = ldx, p->n_rows = n_rows, p->n = n, p->s = a;
}

/* Whether the held axpy wrote exactly the rows a norm (y = norm(x), stride ld) reads, and y
 * may be written as the fused kernel writes it: into h itself or the added rows row for
 * row (each element by the thread that read it), or apart from both. */
static bool norm_takes(const struct cuda_backend *c, const float *y, const float *x, int ld,
                       int n_tok, int per_tok, int n)
{
    const struct cu_pend *p = &c->pend;
    if (p->kind != CU_PEND_AXPY || per_tok != 1 || p->y != x || p->ldy != ld ||
        p->n_rows != n_tok || p->n != n || n_tok <= 0)
        return false;
    if (y == x || (y == p->x && p->ldx == ld))
        return true;
    size_t ny = span_of(n_tok, n, ld);
    return apart(y, ny, x, ny) && apart(y, ny, p->x, span_of(n_tok, n, p->ldx));
}

/* The norm with the held axpy folded in when norm_takes says so (true), else the held op
 * launched first and false: the caller launches the norm alone. */
static bool norm_fused(struct cuda_backend *c, float *y, const float *x, int ld, const struct tensor *w,
                       float w_off, const struct tensor *b, float eps, int n_tok, int per_tok, int n,
                       bool layer)
{
    if (!norm_takes(c, y, x, ld, n_tok, per_tok, n)) {
        cu_flush(c);
        return false;
    }
    struct cu_pend p = c->pend;
    c->pend.kind = CU_PEND_NONE;
    cu_norm_res(c, y, p.y, p.x, p.ldx, p.s, ld, w, w_off, b, eps, n_tok, n, layer);
    return true;
}

void cu_fuse_rmsnorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                     float w_off, float eps, int n_tok, int per_tok, int n)
{
    if (!norm_fused(cu_of(be), y, x, ld, w, w_off, NULL, eps, n_tok, per_tok, n, false))
        cu_rmsnorm(be, y, x, ld, w, w_off, eps, n_tok, per_tok, n);
}

void cu_fuse_layernorm(struct backend *be, float *y, const float *x, int ld,
                       const struct tensor *w, float w_off, const struct tensor *b, float eps,
                       int n_tok, int per_tok, int n)
{
    if (!norm_fused(cu_of(be), y, x, ld, w, w_off, b, eps, n_tok, per_tok, n, true))
        cu_layernorm(be, y, x, ld, w, w_off, b, eps, n_tok, per_tok, n);
}

void cu_fuse_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
                  const struct rope_params *rp, const struct kv_rows *rows)
{
    struct cuda_backend *c = cu_of(be);
    cu_flush(c);
    if (c->err_rc || rp->n_rot <= 0 || n_tok <= 0)
        return;
    if (rp->n_rot / 2 > CU_ROPE_STORE_MAX_HALF || rp->n_rot > head_dim) {
        cu_rope(be, x, ld, n_tok, n_head, head_dim, rp, rows);
        return;
    }
    struct cu_pend *p = &c->pend;
    p->kind = CU_PEND_ROPE;
    p->q = x, p->ld = ld, p->n_tok = n_tok, p->n_head = n_head, p->head_dim = head_dim;
    p->rp = *rp;
    p->rows = *rows;
}

/* The first kv head of the held rope when the store's k is its last k_dim / head_dim heads
 * (stride ld) and v's rows lie beside its heads in the same rows; -1 otherwise. */
static int store_takes(const struct cuda_backend *c, const struct kv_layer *kv, const float *k,
                       int ldk, const float *v, int ldv, int n_tok)
{
    const struct cu_pend *p = &c->pend;
    if (p->kind != CU_PEND_ROPE || n_tok != p->n_tok || ldk != p->ld || ldv != p->ld ||
        p->head_dim <= 0 || kv->k_dim % p->head_dim != 0)
        return -1;
    int kh0 = p->n_head - kv->k_dim / p->head_dim;
    if (kh0 < 0 || k != p->q + (size_t)kh0 * p->head_dim)
        return -1;
    /* v's columns within a row: after the rotated heads, before the next row */
    intptr_t off = ((intptr_t)v - (intptr_t)p->q) / (intptr_t)sizeof(float);
    if ((uintptr_t)v % sizeof(float) != (uintptr_t)p->q % sizeof(float) ||
        off < (intptr_t)p->n_head * p->head_dim || off + kv->v_dim > p->ld)
        return -1;
    return kh0;
}

void cu_fuse_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                      const float *v, int ldv, const struct kv_rows *rows, int n_tok)
{
    struct cuda_backend *c = cu_of(be);
    int kh0 = store_takes(c, kv, k, ldk, v, ldv, n_tok);
    if (kh0 >= 0) {
        struct cu_pend p = c->pend;
        c->pend.kind = CU_PEND_NONE;
        cu_rope_store(c, &p, kv, kh0, v, ldv, rows->slot);
        return;
    }
    cu_flush(c);
    cu_kv_store(be, kv, k, ldk, v, ldv, rows, n_tok);
}
