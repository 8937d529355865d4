/*
 * blocks_ssm: Mamba-2's mixer (blocks.h blk_mamba2), composed of backend ops: the input
 * projection, the depthwise convolution with silu over the x | B | C columns (conv1d, its
 * state in kv->k), the SSD scan (ssd_scan, its state in kv->v), the gated RMSNorm as
 * silu(z) * y then a per-group rmsnorm, and the output projection. The projection's
 * columns are transformers' split order: z (d_inner) | xBC (d_inner + 2 n_group d_state)
 * | dt (n_head).
 */
#include "blocks.h"
#include "tp.h"

static const struct tensor *opt_t(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

/* The gated norm over y [n, di]: per group, or (a tensor-parallel rank's one-group norm) over
 * the whole row gathered from the ranks. */
static void gated_norm(const struct model_ctx *c, const struct layer *L, float *y, int di, int ng, int n)
{
    const struct hparams *hp = &c->m->hp;
    if (hp->ssm.tp_norm_full)
        model_tp_rmsnorm_full(c, y, di, di, 1, &L->ssm_norm, 0.0f, hp->ssm.norm_eps, n);
    else
        c->be->ops->rmsnorm(c->be, y, y, di, &L->ssm_norm, 0.0f, hp->ssm.norm_eps, n, ng, di / ng);
}

int blk_mamba2_scratch(const struct hparams *hp)
{
    int di = hp->ssm.d_inner, gn = hp->ssm.n_group * hp->ssm.d_state;
    return 2 * di + 2 * gn + hp->ssm.n_head + di;
}

void blk_mamba2(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct hparams *hp = &c->m->hp;
    int di = hp->ssm.d_inner, gn = hp->ssm.n_group * hp->ssm.d_state, cd = di + 2 * gn;
    int w = di + cd + hp->ssm.n_head, ng = hp->ssm.norm_groups;
    float *zx = c->bufs.rec;                         /* [n, w]: z | x B C | dt */
    float *y = zx + (size_t)c->n_batch * w;          /* [n, di], dense for ssm_out */
    struct ssd_params sp = {
        .n_head = hp->ssm.n_head, .head_dim = hp->ssm.head_dim, .d_state = hp->ssm.d_state,
        .n_group = hp->ssm.n_group, .dt_min = hp->ssm.dt_min, .dt_max = hp->ssm.dt_max,
    };
    op->linear(be, zx, w, xn, &L->ssm_in, opt_t(&L->ssm_in_b), n);
    if (hp->ssm.mup) {
        /* Falcon-H1's per-segment multipliers of z | x | B | C | dt */
        int off[6] = {0, di, 2 * di, 2 * di + gn, 2 * di + 2 * gn, w};
        for (int k = 0; k < 5; k++)
            if (hp->ssm.mup_mult[k] != 1.0f)
                op->scale(be, zx + off[k], w, hp->ssm.mup_mult[k], n, off[k + 1] - off[k]);
    }
    op->conv1d(be, zx + di, w, zx + di, w, &L->ssm_conv, opt_t(&L->ssm_conv_b), kv, rows, n, cd,
               hp->ssm.d_conv, true);
    op->ssd_scan(be, y, di, zx + di, zx + 2 * di, zx + 2 * di + gn, w, zx + di + cd, w, &L->ssm_a,
                 opt_t(&L->ssm_d), &L->ssm_dt_b, kv, rows, n, &sp);
    bool before = hp->ssm.norm_before_gate && !hp->ssm.norm_off;
    if (before)
        gated_norm(c, L, y, di, ng, n);
    op->act(be, ACT_SILU, zx, w, n, di);                          /* z = silu(z) */
    op->mul(be, y, di, y, di, zx, w, n, di);                      /* y = y * silu(z) */
    if (!before && !hp->ssm.norm_off)
        gated_norm(c, L, y, di, ng, n);
    op->linear(be, o, hp->n_embd, y, &L->ssm_out, opt_t(&L->ssm_out_b), n);
}
