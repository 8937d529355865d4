/*
 * blocks_rglru: Griffin's recurrent block (De et al. 2024, "Griffin"; transformers
 * RecurrentGemmaRecurrentBlock), a mixer of the block library (blocks.h, ADR 0073):
 *
 *   y = act(linear_y(xn))                          the gate branch
 *   x = rglru(conv1d(linear_x(xn)))                conv with bias, no activation
 *   o = linear_out(x * y)
 *
 * The conv state (conv1d_width - 1 inputs of lru_width channels) is the layer's kv->k, the
 * RG-LRU's (lru_width floats) its kv->v, both per sequence.
 */
#include "blocks.h"

static const struct tensor *opt_t(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

int blk_rglru_scratch(int lru_width)
{
    return 3 * lru_width;
}

void blk_rglru(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
               const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct hparams *hp = &c->m->hp;
    int d = hp->n_embd, w = hp->ssm.d_inner;
    float *yb = c->bufs.rec;             /* [n, w] dense each: the gate branch, */
    float *xb = yb + (size_t)n * w;      /* the conv's input and output, */
    float *hb = xb + (size_t)n * w;      /* the RG-LRU's output */
    struct linear_job jobs[2] = {
        {yb, w, xn, &L->rg_y, opt_t(&L->rg_y_b), n},
        {xb, w, xn, &L->ssm_in, opt_t(&L->ssm_in_b), n},
    };
    op->linear_batch(be, jobs, 2);
    op->act(be, hp->act, yb, w, n, w);
    op->conv1d(be, xb, w, xb, w, &L->ssm_conv, opt_t(&L->ssm_conv_b), kv, rows, n, w,
               hp->ssm.d_conv, false);
    struct rglru_params p = {.wi = &L->rg_wi, .bi = &L->rg_bi, .wa = &L->rg_wa, .ba = &L->rg_ba,
                             .a_param = &L->rg_a, .width = w, .n_head = hp->ssm.n_head};
    op->rglru(be, hb, w, xb, w, &p, kv, rows, n);
    op->mul(be, hb, w, hb, w, yb, w, n, w);
    op->linear(be, o, d, hb, &L->ssm_out, opt_t(&L->ssm_out_b), n);
}
