/*
 * blocks_mamba: Mamba's mixer (Gu & Dao 2023; transformers MambaMixer, JambaMambaMixer) from
 * the backend ops, over the n rows of a chunk with each sequence's conv and scan states in
 * its layer's kv_layer (ADR 0057):
 *
 *   x | z  = in_proj(xn)                      [n, 2 d_inner]
 *   x      = silu(conv1d(x))                  depthwise, width d_conv, state: last d_conv - 1 x
 *   dt     = x_proj's dt rows (x)             [n, dt_rank]   (Jamba: rms(dt))
 *   B | C  = x_proj's B | C rows (x)          [n, 2 d_state] (Jamba: rms(B), rms(C))
 *   dt     = dt_proj(dt) + dt_bias            [n, d_inner]
 *   y      = scan(x, softplus(dt), A = -exp(A_log), B, C, D) * silu(z)   (selective_scan)
 *   o      = out_proj(y)
 *
 * x_proj is bound as two row views (model.h) so that each product writes a dense buffer the
 * next product reads (linear takes dense x). Scratch: b->rec, carved per chunk into dense
 * buffers of n rows each.
 */
#include "blocks.h"
#include "tp.h"

/* absent tensor -> NULL (the ops' "no bias") */
static const struct tensor *opt_t(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

void blk_mamba(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
               const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct hparams *hp = &c->m->hp;
    int di = hp->ssm.d_inner, ds = hp->ssm.d_state, r = hp->ssm.dt_rank;
    float eps = hp->ssm.norm_eps;
    float *xz = c->bufs.rec;              /* [n, 2 di]: x | z */
    float *xc = xz + (size_t)n * 2 * di;  /* [n, di]: conv output, then the scan's y */
    float *dtr = xc + (size_t)n * di;     /* [n, r] */
    float *bc = dtr + (size_t)n * r;      /* [n, 2 ds]: B | C */
    float *dt = bc + (size_t)n * 2 * ds;  /* [n, di] */

    op->linear(be, xz, 2 * di, xn, &L->ssm_in, opt_t(&L->ssm_in_b), n);
    op->conv1d(be, xc, di, xz, 2 * di, &L->ssm_conv, opt_t(&L->ssm_conv_b), kv, rows, n, di,
               hp->ssm.d_conv, true);
    struct linear_job jobs[2] = {
        {.y = dtr, .ldy = r, .x = xc, .w = &L->ssm_x, .b = NULL, .n_tok = n},
        {.y = bc, .ldy = 2 * ds, .x = xc, .w = &L->ssm_xbc, .b = NULL, .n_tok = n},
    };
    op->linear_batch(be, jobs, 2);
    if (hp->ssm.tp_reduce_xproj) {   /* a tensor-parallel rank: the products of its channels */
        model_tp_reduce_cols(c, dtr, n, r);
        model_tp_reduce_cols(c, bc, n, 2 * ds);
    }
    if (tensor_is_present(&L->ssm_dt_norm))
        op->rmsnorm(be, dtr, dtr, r, &L->ssm_dt_norm, 0.0f, eps, n, 1, r);
    if (tensor_is_present(&L->ssm_b_norm))
        op->rmsnorm(be, bc, bc, 2 * ds, &L->ssm_b_norm, 0.0f, eps, n, 1, ds);
    if (tensor_is_present(&L->ssm_c_norm))
        op->rmsnorm(be, bc + ds, bc + ds, 2 * ds, &L->ssm_c_norm, 0.0f, eps, n, 1, ds);
    op->linear(be, dt, di, dtr, &L->ssm_dt, opt_t(&L->ssm_dt_b), n);
    op->selective_scan(be, xc, di, xc, di, dt, di, bc, bc + ds, 2 * ds, xz + di, 2 * di, &L->ssm_a,
                       opt_t(&L->ssm_d), kv, rows, n, di, ds);
    op->linear(be, o, hp->n_embd, xc, &L->ssm_out, opt_t(&L->ssm_out_b), n);
}
