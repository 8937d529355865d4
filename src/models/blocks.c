/*
 * blocks: the block library (blocks.h). Every block is a short sequence of
 * backend ops over the rows of one forward chunk; the decoder forward at the
 * end composes them per layer from struct layer_spec.
 *
 * Layout of the attention scratch: projections write q | k | v as column
 * ranges of one row of b->qkv (linear's output stride), whether the
 * checkpoint has a fused qkv tensor or three separate ones; q/k norm, RoPE,
 * the KV store and attention then read those columns in place. The FFN
 * hidden b->h holds gate | up the same way.
 *
 * Adapters: after each product of a linear an adapter may target (q, k, v, qkv, o, gate, up,
 * gate_up, down), lora_apply adds the chunk's active low-rank deltas into the same columns
 * (b->lora; nothing when NULL). ADR 0103.
 */
#include "blocks.h"
#include "tp.h"

#include <math.h>
#include "lora.h"
#include <string.h>

/* ---- helpers ---- */

static const struct tensor *opt(const struct tensor *t)
{
    return tensor_is_present(t) ? t : NULL;
}

/* The norm of n_tok * per_tok rows of dim, per_tok of them in each row of stride ld. */
static void norm_rows(struct backend *be, float *y, const float *x, int ld,
                      const struct blk_norm_w *nw, int n_tok, int per_tok, int dim)
{
    if (nw->kind == NORM_RMS)
        be->ops->rmsnorm(be, y, x, ld, nw->w, nw->w_off, nw->eps, n_tok, per_tok, dim);
    else
        be->ops->layernorm(be, y, x, ld, nw->w, nw->w_off, nw->b ? opt(nw->b) : NULL, nw->eps,
                           n_tok, per_tok, dim);
}

void blk_norm(struct backend *be, float *y, const float *x, const struct blk_norm_w *nw, int n,
              int dim)
{
    norm_rows(be, y, x, dim, nw, n, 1, dim);
}

/* ---- rotary embedding ---- */

/* transformers find_correction_dim: the dim whose wavelength turns n_rot times
 * over the original context. */
static double yarn_corr_dim(double n_rot_turns, int dim, double base, int orig_ctx)
{
    return dim * log(orig_ctx / (n_rot_turns * 2.0 * M_PI)) / (2.0 * log(base));
}

void blk_rope_freqs(const struct hparams *hp, const struct layer_spec *ls, float *inv,
                    float *inv_long)
{
    int half = ls->n_rot / 2;
    /* yarn: frequency j is extrapolated (kept) below the correction range [lo, hi],
     * interpolated (divided by factor) above it, with a linear ramp between */
    double lo = 0.0, hi = 0.0;
    if (ls->rope == ROPE_YARN) {
        lo = yarn_corr_dim(hp->rope_beta_fast, ls->n_rot, ls->rope_theta, hp->rope_orig_ctx);
        hi = yarn_corr_dim(hp->rope_beta_slow, ls->n_rot, ls->rope_theta, hp->rope_orig_ctx);
        if (hp->rope_truncate) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        lo = fmax(lo, 0.0);
        hi = fmin(hi, ls->n_rot - 1);
        if (lo == hi)
            hi += 0.001;
    }
    for (int j = 0; j < half; j++) {
        double base = pow((double)ls->rope_theta, (2.0 * j) / ls->n_rot);
        double f = 1.0 / base;
        switch (ls->rope) {
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
        case ROPE_YARN: {
            double ramp = fmin(fmax((j - lo) / (hi - lo), 0.0), 1.0);
            f = f / hp->rope_factor * ramp + f * (1.0 - ramp);
            break;
        }
        case ROPE_DYNAMIC: /* base frequencies; the rope op rescales them per sequence */
            break;
        case ROPE_LONGROPE:
            if (inv_long)
                inv_long[j] = (float)(1.0 / (hp->rope_long[j] * base));
            f = 1.0 / (hp->rope_short[j] * base);
            break;
        }
        inv[j] = (float)f;
    }
}

/* ---- attention ---- */

/* The q/k norms of blk_attention over the q and k columns of n rows of stride ld. */
static void qk_norm_rows(struct backend *be, float *q, float *k, int ld, const struct layer *L,
                         const struct blk_attn_cfg *cfg, int n)
{
    const struct attn_params *ap = &cfg->ap;
    int q_dim = ap->n_head * ap->head_dim, kv_dim = ap->n_kv_head * ap->head_dim;
    int qh = cfg->qk_norm_full ? 1 : ap->n_head, kh = cfg->qk_norm_full ? 1 : ap->n_kv_head;
    struct blk_norm_w qn = {.kind = cfg->norm, .eps = cfg->norm_eps, .w = &L->q_norm, .b = NULL,
                            .w_off = cfg->norm_w_off};
    struct blk_norm_w kn = {.kind = cfg->norm, .eps = cfg->norm_eps, .w = &L->k_norm, .b = NULL,
                            .w_off = cfg->norm_w_off};
    if (cfg->qk_norm_full && cfg->tp) {  /* RMS over the ranks' gathered columns */
        model_tp_rmsnorm_full(cfg->tp, q, ld, q_dim, 1, &L->q_norm, cfg->norm_w_off, cfg->norm_eps, n);
        model_tp_rmsnorm_full(cfg->tp, k, ld, kv_dim, cfg->kv_per, &L->k_norm, cfg->norm_w_off, cfg->norm_eps,
                              n);
        return;
    }
    norm_rows(be, q, q, ld, &qn, n, qh, q_dim / qh);
    norm_rows(be, k, k, ld, &kn, n, kh, kv_dim / kh);
}

void blk_attention(struct backend *be, float *o, const float *xn, const struct layer *L,
                   const struct blk_attn_cfg *cfg, const struct kv_layer *kv,
                   const struct kv_rows *rows, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    const struct attn_params *ap = &cfg->ap;
    int hd = ap->head_dim, q_dim = ap->n_head * hd, kv_dim = ap->n_kv_head * hd;
    int ld = q_dim + 2 * kv_dim;
    float *q = b->qkv, *k = b->qkv + q_dim, *v = b->qkv + q_dim + kv_dim;

    /* 1. projections into the q | k | v columns */
    if (tensor_is_present(&L->wqkv)) {
        op->linear(be, b->qkv, ld, xn, &L->wqkv, opt(&L->bqkv), n);
        lora_apply(be, b->lora, b->qkv, ld, xn, L, &L->wqkv, n);
        if (cfg->out_gate)
            op->linear(be, b->rec, q_dim, xn, &L->wq_gate, NULL, n);
    } else {
        struct linear_job jobs[4] = {
            {q, ld, xn, &L->wq, opt(&L->bq), n},
            {k, ld, xn, &L->wk, opt(&L->bk), n},
            {v, ld, xn, &L->wv, opt(&L->bv), n},
            {b->rec, q_dim, xn, &L->wq_gate, NULL, n},  /* Qwen3-Next's output gate */
        };
        op->linear_batch(be, jobs, cfg->out_gate ? 4 : 3);
        for (int j = 0; j < 3; j++)
            lora_apply(be, b->lora, jobs[j].y, ld, xn, L, jobs[j].w, n);
    }
    /* 2. q/k norm before RoPE (or, qk_norm_post_rope, after it: step 3): per head (Qwen3 RMS,
     *    Cohere LayerNorm with a weight per head), or over the whole q / k width before the
     *    head split (OLMo 2), one "head" per row */
    if (cfg->qk_norm && !cfg->qk_norm_post_rope)
        qk_norm_rows(be, q, k, ld, L, cfg, n);
    /* 3. RoPE at each row's position: the k heads follow the q heads in each row, so one
     *    call rotates both */
    if (cfg->mrope) {
        for (int s = 0; s < 3; s++) {
            struct kv_rows rs = *rows;
            rs.pos = cfg->mpos + (size_t)s * cfg->mpos_ld;
            op->rope(be, q, ld, n, ap->n_head + ap->n_kv_head, hd, &cfg->mrope[s], &rs);
        }
    } else if (cfg->rp && cfg->rp->n_rot > 0) {
        op->rope(be, q, ld, n, ap->n_head + ap->n_kv_head, hd, cfg->rp, rows);
    }
    if (cfg->qk_norm && cfg->qk_norm_post_rope)
        qk_norm_rows(be, q, k, ld, L, cfg, n);
    /* Llama 4's NoPE layers: the query temperature grows with the position */
    if (cfg->temp_floor > 0)
        op->attn_temp(be, q, ld, n, q_dim, rows, cfg->temp_floor, cfg->temp_scale);
    /* 4. this chunk's K/V into the cache, then attend over each row's sequence */
    op->kv_store(be, kv, k, ld, v, ld, rows, n);
    op->attention(be, b->att, q_dim, q, ld, kv, rows, n, ap);
    /* 5. the output gate (Qwen3-Next: per element, from its own projection), then the
     *    output projection */
    if (cfg->out_gate) {
        op->act(be, ACT_SIGMOID, b->rec, q_dim, n, q_dim);
        op->mul(be, b->att, q_dim, b->att, q_dim, b->rec, q_dim, n, q_dim);
    }
    op->linear(be, o, cfg->n_embd, b->att, &L->wo, opt(&L->bo), n);
    lora_apply(be, b->lora, o, cfg->n_embd, b->att, L, &L->wo, n);
}

/* ---- feed-forward ---- */

/* down(act(gate(xn)) * up(xn)) from explicit weights (gate_up: fused, or NULL) of layer L
 * (whose adapters, if any, apply where the weights are its gate / up / down). */
static void glu_w(struct backend *be, const struct layer *L, float *f, const float *xn,
                  const struct tensor *gate,
                  const struct tensor *up, const struct tensor *gate_up, const struct tensor *down,
                  enum act_kind act, int n_ff, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    int n_embd = (int)down->shape[0];
    if (gate_up) {
        /* Phi-3 fused gate_up_proj: rows [0, n_ff) are the gate, [n_ff, 2 n_ff) the up */
        op->linear(be, b->h, 2 * n_ff, xn, gate_up, NULL, n);
        lora_apply(be, b->lora, b->h, 2 * n_ff, xn, L, gate_up, n);
    } else {
        struct linear_job jobs[2] = {
            {b->h, 2 * n_ff, xn, gate, NULL, n},
            {b->h + n_ff, 2 * n_ff, xn, up, NULL, n},
        };
        op->linear_batch(be, jobs, 2);
        lora_apply(be, b->lora, b->h, 2 * n_ff, xn, L, gate, n);
        lora_apply(be, b->lora, b->h + n_ff, 2 * n_ff, xn, L, up, n);
    }
    op->glu(be, act, b->h1, n_ff, b->h, 2 * n_ff, n, n_ff);
    op->linear(be, f, n_embd, b->h1, down, NULL, n);
    lora_apply(be, b->lora, f, n_embd, b->h1, L, down, n);
}

void blk_glu(struct backend *be, float *f, const float *xn, const struct layer *L, enum act_kind act,
             int n_ff, const struct ctx_bufs *b, int n)
{
    if (tensor_is_present(&L->gate_b)) {   /* RecurrentGemma: biases on all three */
        blk_glu_bias(be, f, xn, L, act, n_ff, b, n);
        return;
    }
    glu_w(be, L, f, xn, &L->gate, &L->up, opt(&L->gate_up), &L->down, act, n_ff, b, n);
}

void blk_mlp(struct backend *be, float *f, const float *xn, const struct layer *L, enum act_kind act,
             int n_ff, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    int n_embd = (int)L->down.shape[0];
    op->linear(be, b->h, n_ff, xn, &L->up, opt(&L->up_b), n);
    lora_apply(be, b->lora, b->h, n_ff, xn, L, &L->up, n);
    if (act == ACT_XIELU)
        op->xielu(be, b->h, n_ff, n, n_ff, &L->xielu);
    else
        op->act(be, act, b->h, n_ff, n, n_ff);
    op->linear(be, f, n_embd, b->h, &L->down, opt(&L->down_b), n);
    lora_apply(be, b->lora, f, n_embd, b->h, L, &L->down, n);
}

/* ---- mixture of experts ---- */

void blk_moe(struct backend *be, float *f, const float *xn, const struct layer *L,
             const struct blk_moe_cfg *cfg, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    const struct experts *ex = &L->ex;
    int k = cfg->k, n_slot = n * k, ff = cfg->n_ff, d = cfg->n_embd;

    /* route every token, then group its k (token, expert) slots by expert */
    bool grouped = cfg->router == ROUTER_GROUP_SOFTMAX || cfg->router == ROUTER_GROUP_SIGMOID;
    /* router_b: gpt-oss's bias on the logits; for the grouped routers (DeepSeek) a correction
     * bias that only chooses experts, which moe_route_grouped takes through cfg->group */
    op->linear(be, b->router, cfg->n_expert, xn, &L->router, grouped ? NULL : opt(&L->router_b), n);
    if (grouped)
        op->moe_route_grouped(be, cfg->router, b->sel, b->sel_w, b->router, n, cfg->n_expert, k,
                              cfg->group);
    else
        op->moe_route(be, cfg->router, b->sel, b->sel_w, b->router, n, cfg->n_expert, k, cfg->jitter);
    op->moe_group(be, b->order, b->offsets, b->sel, n_slot, cfg->n_expert);
    op->gather(be, b->xg, xn, d, b->order, k, n_slot, d);
    /* Llama 4 weighs what enters an expert (its weights become 1 for the combine) */
    if (cfg->weight_input)
        op->moe_weight_input(be, b->xg, b->order, b->sel_w, n_slot, d);

    /* each expert over its rows: up (and gate) -> activation -> down */
    if (cfg->ffn == FFN_GLU_CLAMPED) {
        /* gpt-oss: one fused interleaved gate_up linear, or separate gate | up halves */
        bool fused = ex->gate_up.w != NULL;
        const struct expert_linear gate_up[2] = {ex->gate, ex->up};
        op->linear_experts(be, b->h, 2 * ff, b->xg, fused ? &ex->gate_up : gate_up, fused ? 1 : 2,
                           b->offsets, cfg->n_expert, n_slot);
        op->glu_clamped(be, b->h1, ff, b->h, 2 * ff, n_slot, ff, cfg->glu_alpha, cfg->glu_limit,
                        fused);
    } else if (cfg->ffn == FFN_GLU) {
        const struct expert_linear gate_up[2] = {ex->gate, ex->up};
        op->linear_experts(be, b->h, 2 * ff, b->xg, gate_up, 2, b->offsets, cfg->n_expert, n_slot);
        op->glu(be, cfg->act, b->h1, ff, b->h, 2 * ff, n_slot, ff);
    } else {
        op->linear_experts(be, b->h1, ff, b->xg, &ex->up, 1, b->offsets, cfg->n_expert, n_slot);
        op->act(be, cfg->act, b->h1, ff, n_slot, ff);
    }
    op->linear_experts(be, b->yg, d, b->h1, &ex->down, 1, b->offsets, cfg->n_expert, n_slot);

    /* the weighted sum per token, experts in ascending order */
    op->moe_combine(be, f, b->yg, b->order, b->sel_w, k, n_slot, d);
}

void blk_shared_expert(struct backend *be, float *f, const float *xn, const struct layer *L,
                       enum act_kind act, int n_ff, bool plain, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    int d = (int)L->shexp_down.shape[0];
    /* b->yg holds n_tok * k >= n rows of n_embd and is free once the experts are combined */
    glu_w(be, L, b->yg, xn, &L->shexp_gate, &L->shexp_up, NULL, &L->shexp_down, act, n_ff, b, n);
    if (plain) {
        op->axpy(be, f, d, 1.0f, b->yg, d, n, d);
        return;
    }
    op->linear(be, b->router, 1, xn, &L->shexp_inp_gate, NULL, n);
    op->sigmoid_axpy(be, f, d, b->router, b->yg, d, n, d);
}

/* ---- multi-head latent attention ---- */

/* Linear jobs go out in batches of this many (each head has its own products). */
#define MLA_JOBS 32

static void flush_jobs(struct backend *be, struct linear_job *jobs, int *nj)
{
    if (*nj > 0)
        be->ops->linear_batch(be, jobs, *nj);
    *nj = 0;
}

static void add_job(struct backend *be, struct linear_job *jobs, int *nj, struct linear_job j)
{
    if (*nj == MLA_JOBS)
        flush_jobs(be, jobs, nj);
    jobs[(*nj)++] = j;
}

void blk_mla_attention(struct backend *be, float *o, const float *xn, const struct layer *L,
                       const struct blk_mla_cfg *cfg, const struct kv_layer *kv,
                       const struct kv_rows *rows, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    int H = cfg->n_head, r = cfg->kv_rank, lr = r + cfg->rope, vd = cfg->v_dim;
    size_t N = (size_t)n;
    /* scratch: q_a [n, q_rank] | q_nope [H][n][nope] | q_full [n, H * lr] | latent row [n, lr];
     * per-head attention outputs [H][n][lr] (or [n, H * lr] for one row) | values [n, H * vd] */
    float *qa = b->qkv, *qn = qa + N * cfg->q_rank, *qf = qn + (size_t)H * N * cfg->nope;
    float *ckv = qf + N * H * lr, *ah = b->att, *vo = ah + (size_t)H * N * lr;
    struct linear_job jobs[MLA_JOBS];
    int nj = 0;

    /* 1. q input: x, or the normalized low-rank q_a */
    const float *qin = xn;
    if (cfg->q_rank > 0) {
        op->linear(be, qa, cfg->q_rank, xn, &L->wq_a, NULL, n);
        op->rmsnorm(be, qa, qa, cfg->q_rank, &L->q_a_norm, 0.0f, cfg->norm_eps, n, 1, cfg->q_rank);
        qin = qa;
    }
    /* 2. per head: q_nope into its own dense block, q_pe into its q_full columns; the latent
     *    row [latent | k_pe] */
    add_job(be, jobs, &nj, (struct linear_job){ckv, lr, xn, &L->wkv_a, NULL, n});
    for (int h = 0; h < H; h++) {
        const struct tensor *v = &L->mla_heads[4 * h];
        add_job(be, jobs, &nj, (struct linear_job){qn + (size_t)h * N * cfg->nope, cfg->nope, qin,
                                                   &v[0], NULL, n});
        add_job(be, jobs, &nj, (struct linear_job){qf + (size_t)h * lr + r, H * lr, qin, &v[1],
                                                   NULL, n});
    }
    flush_jobs(be, jobs, &nj);
    /* 3. the latent normalized, k_pe and q_pe rotated; the row into the cache */
    op->rmsnorm(be, ckv, ckv, lr, &L->kv_a_norm, 0.0f, cfg->norm_eps, n, 1, r);
    op->rope(be, ckv + r, lr, n, 1, cfg->rope, cfg->rp, rows);
    op->rope(be, qf + r, H * lr, n, H, lr, cfg->rp, rows);
    op->kv_store(be, kv, ckv, lr, ckv, lr, rows, n);
    /* 4. absorbed query: q_nope of head h through its k rows of kv_b_proj, into the latent
     *    columns of q_full */
    for (int h = 0; h < H; h++)
        add_job(be, jobs, &nj, (struct linear_job){qf + (size_t)h * lr, H * lr,
                                                   qn + (size_t)h * N * cfg->nope,
                                                   &L->mla_heads[4 * h + 2], NULL, n});
    flush_jobs(be, jobs, &nj);
    /* 5. attention over the cached rows (keys and values both the row; a head's output past
     *    the latent columns is unused). One row: all heads in one call; else one call per
     *    head so that each head's output is dense for its value product. */
    struct attn_params ap = {.n_head = n == 1 ? H : 1, .n_kv_head = 1, .head_dim = lr,
                             .scale = cfg->scale};
    if (n == 1) {
        op->attention(be, ah, H * lr, qf, H * lr, kv, rows, n, &ap);
    } else {
        for (int h = 0; h < H; h++)
            op->attention(be, ah + (size_t)h * N * lr, lr, qf + (size_t)h * lr, H * lr, kv, rows,
                          n, &ap);
    }
    /* 6. each head's value from its attended latent, then the output projection */
    for (int h = 0; h < H; h++)
        add_job(be, jobs, &nj, (struct linear_job){vo + (size_t)h * vd, H * vd,
                                                   ah + (size_t)h * (n == 1 ? 1 : N) * lr,
                                                   &L->mla_heads[4 * h + 3], NULL, n});
    flush_jobs(be, jobs, &nj);
    op->linear(be, o, cfg->n_embd, vo, &L->wo, NULL, n);
}

/* ---- head ---- */

void blk_head(struct backend *be, float *logits, const float *x, const int32_t *out_rows, int n_out,
              const struct blk_norm_w *nw, const struct tensor *lm_head, const struct tensor *lm_head_b,
              int n_embd, const struct ctx_bufs *b)
{
    const struct backend_ops *op = be->ops;
    op->gather(be, b->xn, x, n_embd, out_rows, 1, n_out, n_embd);
    blk_norm(be, b->xn, b->xn, nw, n_out, n_embd);
    op->linear(be, logits, (int)lm_head->shape[0], b->xn, lm_head, opt(lm_head_b), n_out);
}

void blk_glu_bias(struct backend *be, float *f, const float *xn, const struct layer *L,
                  enum act_kind act, int n_ff, const struct ctx_bufs *b, int n)
{
    const struct backend_ops *op = be->ops;
    int n_embd = (int)L->down.shape[0];
    struct linear_job jobs[2] = {
        {b->h, 2 * n_ff, xn, &L->gate, opt(&L->gate_b), n},
        {b->h + n_ff, 2 * n_ff, xn, &L->up, opt(&L->up_b), n},
    };
    op->linear_batch(be, jobs, 2);
    op->glu(be, act, b->h1, n_ff, b->h, 2 * n_ff, n, n_ff);
    op->linear(be, f, n_embd, b->h1, &L->down, opt(&L->down_b), n);
}
