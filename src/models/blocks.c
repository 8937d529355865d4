/*
 * blocks: shared transformer blocks and the generic forward pass.
 *
 * blk_forward() runs one chunk of tokens through the model:
 *
 *   x = embed(ids)
 *   for each layer:
 *     sequential:  x += attn(norm1(x));  x += ffn(norm2(x))      (Llama, Qwen, Phi-3, Mixtral)
 *     parallel:    h = norm1(x);  x += attn(h) + ffn(h)           (Phi-2, Phixtral)
 *   logits = lm_head(norm_out(x))
 *
 * attn: q/k/v projections (separate or fused), optional per-head q/k RMSNorm,
 * rotate-half RoPE on the first n_rot dims, K/V appended to the cache, causal
 * GQA attention, output projection. ffn: dense GLU / MLP, or a routed MoE over
 * the canonical expert views (see moe_* below). Every op goes through the
 * backend table, so a CUDA backend runs the same code.
 */
#include "blocks.h"

#include <math.h>
#include <string.h>

/* ---- helpers ---- */

static const struct tensor *opt(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

static void norm_rows(struct model_ctx *c, float *y, const float *x, const struct tensor *w,
                      const struct tensor *b, int n_rows)
{
    const struct hparams *hp = &c->m->hp;
    if (hp->norm == NORM_RMS)
        c->be->ops->rmsnorm(c->be, y, x, w, hp->norm_eps, n_rows, hp->n_embd);
    else
        c->be->ops->layernorm(c->be, y, x, w, opt(b), hp->norm_eps, n_rows, hp->n_embd);
}

/* Apply the activation of an MLP (not GLU) hidden layer in place. */
static void act_inplace(struct model_ctx *c, float *h, size_t n)
{
    switch (c->m->hp.act) {
    case ACT_GELU_TANH: c->be->ops->gelu_tanh(c->be, h, n); break;
    case ACT_GELU_ERF:  c->be->ops->gelu_erf(c->be, h, n); break;
    case ACT_SILU:      break; /* hparams_validate rejects silu outside a GLU */
    }
}

/* Copy columns [col, col + width) of rows of `stride` floats into a dense [n, width]
 * buffer. dst may equal src (rows move toward the front, in ascending order). */
static void split_cols(float *dst, const float *src, int n, int stride, int col, int width)
{
    for (int i = 0; i < n; i++)
        memmove(dst + (size_t)i * width, src + (size_t)i * stride + col, (size_t)width * sizeof(float));
}

/* ---- rotary embedding ---- */

void blk_rope_freqs(const struct hparams *hp, float *inv, float *inv_long)
{
    int half = hp->n_rot / 2;
    for (int j = 0; j < half; j++) {
        double base = pow((double)hp->rope_theta, (2.0 * j) / hp->n_rot);
        double f = 1.0 / base;
        switch (hp->rope) {
        case ROPE_DEFAULT:
            break;
        case ROPE_LINEAR:
            f /= hp->rope_factor;
            break;
        case ROPE_LLAMA3: {
            /* transformers _compute_llama3_parameters: long wavelengths are divided by
             * factor, short ones kept, the band between interpolated smoothly. */
            double lo_wl = hp->rope_orig_ctx / (double)hp->rope_low_freq_factor;
            double hi_wl = hp->rope_orig_ctx / (double)hp->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > lo_wl) {
                f /= hp->rope_factor;
            } else if (wl >= hi_wl) {
                double s = (hp->rope_orig_ctx / wl - hp->rope_low_freq_factor) /
                           (hp->rope_high_freq_factor - hp->rope_low_freq_factor);
                f = (1.0 - s) * f / hp->rope_factor + s * f;
            }
            break;
        }
        case ROPE_LONGROPE:
            if (inv_long)
                inv_long[j] = (float)(1.0 / (hp->rope_long[j] * base));
            f = 1.0 / (hp->rope_short[j] * base);
            break;
        }
        inv[j] = (float)f;
    }
}

/* ---- attention block: out[n, n_embd] = attn(xn) ---- */

static void attn_block(struct model_ctx *c, const struct layer *L, int il, int n)
{
    const struct hparams *hp = &c->m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;
    int hd = hp->head_dim;
    int q_dim = hp->n_head * hd, kv_dim = hp->n_kv_head * hd;

    /* K and V are written straight into this layer's cache rows [pos, pos + n) */
    size_t layer_off = (size_t)il * c->n_ctx * kv_dim;
    float *kc = c->k_cache + layer_off, *vc = c->v_cache + layer_off;
    float *k = kc + (size_t)c->pos * kv_dim, *v = vc + (size_t)c->pos * kv_dim;

    /* 1. projections (one dispatch for a single token) */
    if (tensor_is_present(&L->wqkv)) {
        int qkv_dim = q_dim + 2 * kv_dim;
        op->linear(c->be, b->qkv, b->xn, &L->wqkv, opt(&L->bqkv), n);
        split_cols(b->q, b->qkv, n, qkv_dim, 0, q_dim);
        split_cols(k, b->qkv, n, qkv_dim, q_dim, kv_dim);
        split_cols(v, b->qkv, n, qkv_dim, q_dim + kv_dim, kv_dim);
    } else if (n == 1) {
        struct linear_job jobs[3] = {
            {b->q, b->xn, &L->wq, opt(&L->bq)},
            {k, b->xn, &L->wk, opt(&L->bk)},
            {v, b->xn, &L->wv, opt(&L->bv)},
        };
        op->linear_batch(c->be, jobs, 3);
    } else {
        op->linear(c->be, b->q, b->xn, &L->wq, opt(&L->bq), n);
        op->linear(c->be, k, b->xn, &L->wk, opt(&L->bk), n);
        op->linear(c->be, v, b->xn, &L->wv, opt(&L->bv), n);
    }

    /* 2. per-head q/k RMSNorm (Qwen3), before RoPE */
    if (hp->qk_norm) {
        op->rmsnorm(c->be, b->q, b->q, &L->q_norm, hp->norm_eps, n * hp->n_head, hd);
        op->rmsnorm(c->be, k, k, &L->k_norm, hp->norm_eps, n * hp->n_kv_head, hd);
    }

    /* 3. RoPE; longrope switches to the long factors once the sequence passes the
     * original context, per forward call, as transformers' dynamic update does. */
    if (hp->n_rot > 0) {
        const float *inv = b->inv_freq;
        if (hp->rope == ROPE_LONGROPE && c->pos + n > hp->rope_orig_ctx)
            inv = b->inv_freq_long;
        op->rope(c->be, b->q, n, q_dim, hp->n_head, hd, hp->n_rot, c->pos, inv, hp->rope_attn_factor);
        op->rope(c->be, k, n, kv_dim, hp->n_kv_head, hd, hp->n_rot, c->pos, inv, hp->rope_attn_factor);
    }

    /* 4. attend over the cache, the new rows included */
    op->attention(c->be, b->att, b->q, kc, vc, n, c->pos, hp->n_head, hp->n_kv_head, hd, hp->attn_scale);

    /* 5. output projection */
    op->linear(c->be, b->o, b->att, &L->wo, opt(&L->bo), n);
}

/* ---- dense FFN: f[n, n_embd] = ffn(xn) ---- */

static void ffn_dense(struct model_ctx *c, const struct layer *L, int n)
{
    const struct hparams *hp = &c->m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;
    size_t nf = (size_t)n * hp->n_ff;

    if (hp->ffn == FFN_MLP) {
        op->linear(c->be, b->h1, b->xn, &L->up, opt(&L->up_b), n);
        act_inplace(c, b->h1, nf);
        op->linear(c->be, b->f, b->h1, &L->down, opt(&L->down_b), n);
        return;
    }
    if (tensor_is_present(&L->gate_up)) {
        /* Phi-3 fused gate_up_proj: rows [0, n_ff) are the gate, [n_ff, 2 n_ff) the up */
        op->linear(c->be, b->h2, b->xn, &L->gate_up, NULL, n);
        split_cols(b->h1, b->h2, n, 2 * hp->n_ff, 0, hp->n_ff);
        split_cols(b->h2, b->h2, n, 2 * hp->n_ff, hp->n_ff, hp->n_ff);
    } else if (n == 1) {
        struct linear_job jobs[2] = {{b->h1, b->xn, &L->gate, NULL}, {b->h2, b->xn, &L->up, NULL}};
        op->linear_batch(c->be, jobs, 2);
    } else {
        op->linear(c->be, b->h1, b->xn, &L->gate, NULL, n);
        op->linear(c->be, b->h2, b->xn, &L->up, NULL, n);
    }
    op->silu_mul(c->be, b->h1, b->h1, b->h2, nf);
    op->linear(c->be, b->f, b->h1, &L->down, NULL, n);
}

/* ---- mixture of experts ---- */

/* Top-k by repeated selection; strict '>' keeps the lower index on ties. */
static void topk(const float *v, int n, int k, int *idx)
{
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int t = 0; t < s; t++)
                taken |= idx[t] == i;
            if (!taken && (best < 0 || v[i] > v[best]))
                best = i;
        }
        idx[s] = best;
    }
}

/* PhiMoE sparsemixer, inference form (transformers modeling_phimoe.sparsemixer):
 * the winner's weight is its softmax over the experts whose logit lies within
 * a relative band 2*eps of the max; the band is measured against
 * max(|logit_i|, max). The second pick repeats this with the winner masked. */
static float sparsemixer_pick(const float *logits, const bool *masked, int n, float eps, int *pick)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!masked[i] && (best < 0 || logits[i] > logits[best]))
            best = i;
    float thr = logits[best];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        if (masked[i])
            continue;
        float factor = fabsf(logits[i]) > thr ? fabsf(logits[i]) : thr;
        if ((thr - logits[i]) / factor > 2.0f * eps)
            continue;
        sum += exp((double)logits[i] - thr);
    }
    *pick = best;
    return (float)(1.0 / sum);
}

void blk_route(const struct hparams *hp, const float *logits, int *sel, float *w)
{
    int k = hp->n_expert_used, n = hp->n_expert;
    if (hp->router == ROUTER_SPARSEMIXER) {
        bool masked[HP_MAX_EXPERTS] = {0};
        w[0] = sparsemixer_pick(logits, masked, n, hp->router_jitter, &sel[0]);
        masked[sel[0]] = true;
        w[1] = sparsemixer_pick(logits, masked, n, hp->router_jitter, &sel[1]);
        return;
    }
    /* Phixtral: softmax over the top-k logits. Mixtral: softmax over all, keep top-k,
     * renormalize -- the same weights, since the shared denominator cancels. */
    topk(logits, n, k, sel);
    double sum = 0.0, mx = logits[sel[0]];
    for (int s = 0; s < k; s++)
        sum += exp((double)logits[sel[s]] - mx);
    for (int s = 0; s < k; s++)
        w[s] = (float)(exp((double)logits[sel[s]] - mx) / sum);
}

/* One expert over m gathered rows: yg[m, n_embd] = down(act(up/gate(xg))). */
static void expert_rows(struct model_ctx *c, const struct layer *L, int e, int m)
{
    const struct hparams *hp = &c->m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;
    const struct experts *ex = &L->ex;
    const struct tensor *ub = ex->up.b ? opt(&ex->up.b[e]) : NULL;
    const struct tensor *db = ex->down.b ? opt(&ex->down.b[e]) : NULL;
    size_t nf = (size_t)m * hp->n_ff;

    op->linear(c->be, b->h1, b->xg, &ex->up.w[e], ub, m);
    if (hp->ffn == FFN_GLU) {
        op->linear(c->be, b->h2, b->xg, &ex->gate.w[e], NULL, m);
        op->silu_mul(c->be, b->h1, b->h2, b->h1, nf);
    } else {
        act_inplace(c, b->h1, nf);
    }
    op->linear(c->be, b->yg, b->h1, &ex->down.w[e], db, m);
}

/* General path: tokens grouped by expert, each expert run once over its rows. */
static void moe_grouped(struct model_ctx *c, const struct layer *L, int n)
{
    const struct hparams *hp = &c->m->hp;
    struct ctx_bufs *b = &c->bufs;
    int k = hp->n_expert_used, d = hp->n_embd;

    memset(b->f, 0, (size_t)n * d * sizeof(float));
    for (int e = 0; e < hp->n_expert; e++) {
        int m = 0;
        for (int i = 0; i < n * k; i++)
            if (b->sel[i] == e)
                b->order[m++] = i;
        if (!m)
            continue;
        for (int r = 0; r < m; r++)
            memcpy(b->xg + (size_t)r * d, b->xn + (size_t)(b->order[r] / k) * d, (size_t)d * sizeof(float));
        expert_rows(c, L, e, m);
        for (int r = 0; r < m; r++) {
            int slot = b->order[r];
            c->be->ops->axpy(c->be, b->f + (size_t)(slot / k) * d, b->sel_w[slot], b->yg + (size_t)r * d, (size_t)d);
        }
    }
}

/* Fused single-token path: the selected experts' matvecs in one dispatch per stage. */
static void moe_fused(struct model_ctx *c, const struct layer *L)
{
    const struct hparams *hp = &c->m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;
    const struct experts *ex = &L->ex;
    int k = hp->n_expert_used, d = hp->n_embd, nf = hp->n_ff;
    struct linear_job jobs[2 * HP_MAX_EXPERTS];
    int nj = 0;

    /* stage 1: up (and gate) of every selected expert; h1 row s = up_s, h2 row s = gate_s */
    for (int s = 0; s < k; s++) {
        int e = b->sel[s];
        jobs[nj++] = (struct linear_job){b->h1 + (size_t)s * nf, b->xn, &ex->up.w[e],
                                         ex->up.b ? opt(&ex->up.b[e]) : NULL};
        if (hp->ffn == FFN_GLU)
            jobs[nj++] = (struct linear_job){b->h2 + (size_t)s * nf, b->xn, &ex->gate.w[e], NULL};
    }
    op->linear_batch(c->be, jobs, nj);
    if (hp->ffn == FFN_GLU)
        op->silu_mul(c->be, b->h1, b->h2, b->h1, (size_t)k * nf);
    else
        act_inplace(c, b->h1, (size_t)k * nf);

    /* stage 2: down projections into yg rows, then the weighted sum */
    nj = 0;
    for (int s = 0; s < k; s++) {
        int e = b->sel[s];
        jobs[nj++] = (struct linear_job){b->yg + (size_t)s * d, b->h1 + (size_t)s * nf,
                                         &ex->down.w[e], ex->down.b ? opt(&ex->down.b[e]) : NULL};
    }
    op->linear_batch(c->be, jobs, nj);
    memset(b->f, 0, (size_t)d * sizeof(float));
    for (int s = 0; s < k; s++)
        op->axpy(c->be, b->f, b->sel_w[s], b->yg + (size_t)s * d, (size_t)d);
}

static void ffn_moe(struct model_ctx *c, const struct layer *L, int n)
{
    const struct hparams *hp = &c->m->hp;
    struct ctx_bufs *b = &c->bufs;
    int k = hp->n_expert_used;

    c->be->ops->linear(c->be, b->router, b->xn, &L->router, NULL, n);
    for (int i = 0; i < n; i++)
        blk_route(hp, b->router + (size_t)i * hp->n_expert, b->sel + (size_t)i * k, b->sel_w + (size_t)i * k);
    if (n == 1 && c->fused_moe)
        moe_fused(c, L);
    else
        moe_grouped(c, L, n);
}

/* ---- the forward pass ---- */

static void layer_forward(struct model_ctx *c, const struct layer *L, int il, int n)
{
    const struct hparams *hp = &c->m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;
    size_t nd = (size_t)n * hp->n_embd;

    norm_rows(c, b->xn, b->x, &L->attn_norm, &L->attn_norm_b, n);
    attn_block(c, L, il, n);
    if (!hp->parallel_residual) {
        op->axpy(c->be, b->x, 1.0f, b->o, nd);
        norm_rows(c, b->xn, b->x, &L->ffn_norm, &L->ffn_norm_b, n);
    }
    if (hp->n_expert > 0)
        ffn_moe(c, L, n);
    else
        ffn_dense(c, L, n);
    if (hp->parallel_residual)
        op->axpy(c->be, b->x, 1.0f, b->o, nd);
    op->axpy(c->be, b->x, 1.0f, b->f, nd);
}

/* One chunk of at most n_batch tokens. */
static void forward_chunk(struct model_ctx *c, const int32_t *ids, int n, float *logits, bool all_logits)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    struct ctx_bufs *b = &c->bufs;

    op->embed(c->be, b->x, &m->tok_embd, ids, n);
    for (int il = 0; il < hp->n_layer; il++)
        layer_forward(c, &m->layers[il], il, n);

    /* final norm and head: every row for all_logits, else only the last */
    int first = all_logits ? 0 : n - 1, rows = n - first;
    float *xl = b->x + (size_t)first * hp->n_embd;
    norm_rows(c, b->xn, xl, &m->out_norm, &m->out_norm_b, rows);
    op->linear(c->be, logits, b->xn, &m->lm_head, opt(&m->lm_head_b), rows);
    c->pos += n;
}

int blk_forward(struct model_ctx *c, const int32_t *ids, int n_tok, float *logits,
                bool all_logits, struct err *e)
{
    const struct hparams *hp = &c->m->hp;
    if (n_tok <= 0)
        return err_setf(e, ERR_ARG, "forward: no tokens");
    if ((int64_t)c->pos + n_tok > c->n_ctx)
        return err_setf(e, ERR_RANGE, "context overflow: %d cached + %d new tokens exceed the context of %d",
                        c->pos, n_tok, c->n_ctx);
    for (int i = 0; i < n_tok; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return err_setf(e, ERR_RANGE, "token id %d at position %d is outside the vocabulary [0, %d)",
                            ids[i], i, hp->n_vocab);
    for (int done = 0; done < n_tok;) {
        int n = n_tok - done < c->n_batch ? n_tok - done : c->n_batch;
        /* without all_logits each chunk writes its last row to logits; the final one wins */
        float *out = all_logits ? logits + (size_t)done * hp->n_vocab : logits;
        forward_chunk(c, ids + done, n, out, all_logits);
        done += n;
    }
    return 0;
}
