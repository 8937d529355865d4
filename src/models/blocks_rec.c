/*
 * blocks_rec: the recurrent mixers of the block library (blocks.h, ADR 0057). Each works
 * on the n rows of a chunk, carrying every sequence's state in its layer's kv_layer (conv
 * state k, recurrent state v, slot rows->state[i]) from one chunk to the next, through the
 * backend ops only.
 */
#include "blocks.h"

/* absent tensor -> NULL (the ops' "no bias") */
static const struct tensor *opt_t(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

void blk_shortconv(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct hparams *hp = &c->m->hp;
    /* d: the convolution's channels (n_embd; a tensor-parallel rank's share of them) */
    int d = (int)L->ssm_conv.shape[0], w = 3 * d;
    float *bcx = c->bufs.rec;           /* [n, 3d]: B | C | x */
    float *t = bcx + (size_t)n * w;     /* [n, d] dense: the products a linear reads */
    op->linear(be, bcx, w, xn, &L->ssm_in, opt_t(&L->ssm_in_b), n);
    op->mul(be, t, d, bcx, w, bcx + 2 * d, w, n, d);                    /* B * x */
    op->conv1d(be, t, d, t, d, &L->ssm_conv, opt_t(&L->ssm_conv_b), kv, rows, n, d,
               hp->ssm.d_conv, false);
    op->mul(be, t, d, bcx + d, w, t, d, n, d);                          /* C * conv */
    op->linear(be, o, hp->n_embd, t, &L->ssm_out, opt_t(&L->ssm_out_b), n);
}

void blk_recurrent(const struct model_ctx *c, float *o, const float *xn, int il,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    const struct layer *L = &c->m->layers[il];
    switch (c->m->hp.layer[il].mixer) {
    case MIXER_SHORTCONV:
        blk_shortconv(c, o, xn, L, kv, rows, n);
        break;
    case MIXER_MAMBA:
        blk_mamba(c, o, xn, L, kv, rows, n);
        break;
    case MIXER_DELTANET:
        blk_deltanet(c, o, xn, L, kv, rows, n);
        break;
    case MIXER_MAMBA2:
        blk_mamba2(c, o, xn, L, kv, rows, n);
        break;
    case MIXER_RGLRU:
        blk_rglru(c, o, xn, L, kv, rows, n);
        break;
    default:
        break;  /* hparams_validate admits only the mixers a family binds */
    }
}
