/*
 * decoder: the forward of the decoder-only families (Llama, Mistral, Qwen2/3,
 * Phi, Phi-3, Mixtral, PhiMoE, Qwen2/3-MoE, Phixtral, SmolLM3, Granite, StarCoder2, OLMo 2,
 * Gemma, Cohere, Gemma 2, Gemma 3, gpt-oss), composed from the block library
 * and driven per layer by struct layer_spec:
 *
 *   x = embd_scale * embed(ids), an image's rows (fwd_chunk.img) its embeddings instead;
 *       DeepStack (ADR 0120): after layer il < img.n_deep, x[image rows] += its plane il + 1
 *   rope at each row's position, or M-RoPE's three positions (hp.mrope_section, ADR 0094)
 *   an MTP layer (model.mtp, ADR 0108): x = eh_proj(cat(enorm(x), hnorm(h))), h each row's
 *       hidden state (bufs.mtp_in's second half, staged by model_forward)
 *   for each layer il (ls = hp->layer[il]), every residual add scaled by residual_scale:
 *     RESID_SEQUENTIAL:  x += attn(norm1(x));  x += ffn(norm2(x))
 *     RESID_PARALLEL:    h = norm1(x);  x += attn(h) + ffn(h)
 *     RESID_POST:        x += norm1(attn(x));  x += norm2(ffn(x))
 *     RESID_SANDWICH:    x += post1(attn(norm1(x)));  x += post2(ffn(norm2(x)))
 *     norms: hp.norm kind, weights used as w + hp.norm_w_offset
 *     attn: ls.kv (full / sliding window; latent: multi-head latent attention), ls.n_rot, ls.rope_style and rope tables, ls.qk_norm(_full),
 *           ls.softcap, ls.sinks, ls.attn_scale; or, by ls.mixer, a recurrent mixer over the
 *           layer's state (KV_RECURRENT: blk_recurrent), or none (an FFN-only layer: its
 *           norm is norm2)
 *     ffn:  absent for FFN_NONE layers (a mixer-only layer)
 *     ffn:  ls.moe ? routed experts (ls.router (+ router bias), ls.n_expert_used; GLU, MLP or
 *                    the clamped GLU of ls.glu_alpha / ls.glu_limit)
 *                    [+ sigmoid-gated (or plain) shared expert of ls.n_ff_shexp] : dense GLU / MLP
 *   logits = logit_scale * lm_head(norm_out(x[out_rows])), then cap * tanh(logits / cap)
 *            when logit_softcap is set
 *   run by the encoder path for embeddings (hp.encoder, ADR 0097) without logit rows:
 *            x = norm_out(x), every row's last hidden state
 *   fwd_chunk.hidden: norm_out(x) of every row into bufs.o (what an MTP layer conditions on)
 *
 * A family whose layers are not of this shape writes its own forward from
 * the same blocks.
 */
#include "blocks.h"
#include "tp.h"

static void attn_cfg_of(const struct model_ctx *c, int il,
                        struct blk_attn_cfg *cfg, struct rope_params *rp)
{
    const struct hparams *hp = &c->m->hp;
    const struct layer_spec *ls = &hp->layer[il];
    float *rope = c->bufs.rope + (size_t)il * 2 * HP_MAX_ROT_HALF;
    *rp = (struct rope_params){
        .n_rot = ls->n_rot,
        .inv_freq = rope,
        .inv_long = ls->rope == ROPE_LONGROPE ? rope + HP_MAX_ROT_HALF : NULL,
        .long_after = hp->rope_orig_ctx,
        .ntk_factor = ls->rope == ROPE_DYNAMIC ? hp->rope_factor : 0.0f,
        .mscale = ls->rope == ROPE_LONGROPE || ls->rope == ROPE_YARN ? hp->rope_attn_factor : 1.0f,
        .style = ls->rope_style,
    };
    *cfg = (struct blk_attn_cfg){
        .ap = {
            .n_head = hp->n_head,
            .n_kv_head = hp->n_kv_head,
            .head_dim = hp->head_dim,
            .scale = ls->attn_scale,
            .softcap = ls->softcap,
            /* a bidirectional model's sliding rows attend the band their span gives
             * (encode.c), their causal part themselves alone (ADR 0097) */
            .window = ls->kv != KV_SLIDING ? 0 : hp->encoder && !hp->causal ? 1 : ls->window,
            .sinks = ls->sinks ? c->bufs.sinks + (size_t)il * hp->n_head : NULL,
            .chunk = ls->kv == KV_SLIDING ? ls->chunk : 0,
        },
        .rp = ls->n_rot > 0 ? rp : NULL,
        .qk_norm = ls->qk_norm,
        .qk_norm_full = ls->qk_norm_full,
        .out_gate = ls->attn_gate,
        .norm = hp->norm,
        .norm_eps = hp->norm_eps,
        .norm_w_off = hp->norm_w_offset,
        .n_embd = hp->n_embd,
        .qk_norm_post_rope = ls->qk_norm_post_rope,
        .temp_floor = ls->attn_temp_floor,
        .temp_scale = ls->attn_temp_scale,
        .tp = ls->tp_mix && ls->qk_norm_full ? c : NULL,
        .kv_per = model_tp_kv_per(c),
    };
}

/* An MTP layer's input (model.mtp): bufs.mtp_in holds zeros | h per row (stride 2d); the
 * embedding in x joins the first half, both halves are normalized in place, and
 * x = eh_proj(mtp_in). */
static void mtp_input(const struct model_ctx *c, int n)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    float *in = c->bufs.mtp_in;
    int d = hp->n_embd;
    op->axpy(c->be, in, 2 * d, 1.0f, c->bufs.x, d, n, d);
    op->rmsnorm(c->be, in, in, 2 * d, &m->mtp.enorm, hp->norm_w_offset, hp->norm_eps, n, 1, d);
    op->rmsnorm(c->be, in + d, in + d, 2 * d, &m->mtp.hnorm, hp->norm_w_offset, hp->norm_eps, n, 1, d);
    op->linear(c->be, c->bufs.x, d, in, &m->mtp.eh_proj, NULL, n);
}

/* b->f = ffn(in) for the n rows of in */
static void ffn(const struct model_ctx *c, const struct layer *L, const struct layer_spec *ls,
                const float *in, int n)
{
    const struct hparams *hp = &c->m->hp;
    const struct ctx_bufs *b = &c->bufs;
    if (ls->moe) {
        struct moe_group_params gp = {
            .bias = hp->router_bias ? &L->router_b : NULL,
            .n_group = hp->moe_n_group,
            .topk_group = hp->moe_topk_group,
            .norm = hp->moe_norm,
            .scale = hp->moe_scale,
            .norm_min = hp->moe_norm_min,
        };
        struct blk_moe_cfg mc = {
            .router = ls->router,
            .n_expert = hp->n_expert,
            .k = ls->n_expert_used,
            .jitter = ls->router_jitter,
            .group = &gp,
            .ffn = ls->ffn,
            .act = ls->act,
            .n_ff = ls->n_ff,
            .n_embd = hp->n_embd,
            .glu_alpha = ls->glu_alpha,
            .glu_limit = ls->glu_limit,
            .weight_input = ls->moe_weight_input,
        };
        blk_moe(c->be, b->f, in, L, &mc, b, n);
        if (ls->n_ff_shexp > 0)
            blk_shared_expert(c->be, b->f, in, L, ls->act, ls->n_ff_shexp, ls->shexp_plain, b, n);
    } else if (ls->ffn == FFN_GLU) {
        blk_glu(c->be, b->f, in, L, ls->act, ls->n_ff, b, n);
    } else {
        blk_mlp(c->be, b->f, in, L, ls->act, ls->n_ff, b, n);
    }
}

int decoder_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int n = ch->n_tok, d = hp->n_embd;
    (void)e;

    float rs = hp->residual_scale;
    op->embed(c->be, b->x, &m->tok_embd, ch->ids, n);
    if (hp->embd_scale != 1.0f)
        op->scale(c->be, b->x, d, hp->embd_scale, n, d);
    /* an image's rows take its embeddings as they are: the embedding scale belongs to the
     * token embedding (Gemma's), which they never pass (ADR 0087) */
    for (int i = 0; i < ch->n_img; i++)
        op->copy(c->be, b->x + (size_t)ch->img[i].row * d, ch->img[i].embd,
                 (size_t)ch->img[i].n * d * sizeof(float));
    if (tensor_is_present(&m->mtp.eh_proj))
        mtp_input(c, n);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const struct layer_spec *ls = &hp->layer[il];
        float wo = hp->norm_w_offset;
        struct blk_norm_w n1 = {.kind = hp->norm, .eps = hp->norm_eps, .w = &L->attn_norm,
                                .b = &L->attn_norm_b, .w_off = wo};
        struct blk_norm_w n2 = {.kind = hp->norm, .eps = hp->norm_eps, .w = &L->ffn_norm,
                                .b = &L->ffn_norm_b, .w_off = wo};
        struct blk_attn_cfg ac;
        struct rope_params rp, mrp[3];
        attn_cfg_of(c, il, &ac, &rp);
        if (hparams_has_mrope(hp) && ac.rp && ch->mpos) {
            /* M-RoPE (ADR 0094): the layer's rope, per stream with its section's frequencies */
            for (int s = 0; s < 3; s++) {
                mrp[s] = rp;
                mrp[s].inv_freq = b->mrope + (size_t)s * HP_MAX_ROT_HALF;
            }
            ac.mrope = mrp;
            ac.mpos = ch->mpos;
            ac.mpos_ld = ch->mpos_ld;
        }

        struct blk_norm_w p1 = {.kind = hp->norm, .eps = hp->norm_eps, .w = &L->attn_post_norm,
                                .b = NULL, .w_off = wo};
        struct blk_norm_w p2 = {.kind = hp->norm, .eps = hp->norm_eps, .w = &L->ffn_post_norm,
                                .b = NULL, .w_off = wo};
        bool post = ls->residual == RESID_POST, sandwich = ls->residual == RESID_SANDWICH;
        /* the norms of the block outputs: OLMo 2's only ones, or Gemma 2's second pair */
        const struct blk_norm_w *after1 = post ? &n1 : sandwich ? &p1 : NULL;
        const struct blk_norm_w *after2 = post ? &n2 : sandwich ? &p2 : NULL;
        /* post-norm blocks read the residual stream itself; the others its norm */
        const float *in = post ? b->x : b->xn;
        bool mix = ls->mixer != MIXER_NONE, has_ffn = ls->moe || ls->ffn != FFN_NONE;
        if (!post && mix)
            blk_norm(c->be, b->xn, b->x, &n1, n, d);
        if (!mix) {
            /* an FFN-only layer (Nemotron-H): its one norm is the FFN's */
        } else if (ls->kv == KV_RECURRENT) {
            blk_recurrent(c, b->o, in, il, &ch->kv[il], ch->rows, n);
        } else if (ls->kv == KV_LATENT) {
            struct blk_mla_cfg mla = {
                .n_head = hp->n_head,
                .nope = hp->qk_nope_dim,
                .rope = hp->qk_rope_dim,
                .v_dim = hp->v_head_dim,
                .kv_rank = hp->kv_lora_rank,
                .q_rank = hp->q_lora_rank,
                .scale = ls->attn_scale,
                .rp = &rp,
                .norm_eps = 1e-6f,  /* the q_a / kv_a norms: transformers' RMSNorm default,
                                     * not rms_norm_eps */
                .n_embd = d,
            };
            blk_mla_attention(c->be, b->o, in, L, &mla, &ch->kv[il], ch->rows, b, n);
        } else {
            blk_attention(c->be, b->o, in, L, &ac, &ch->kv[il],
                          ls->kv == KV_SLIDING && ls->window > 0 ? ch->rows_swa : ch->rows, b, n);
        }
        if (mix && ls->tp_mix)
            model_tp_reduce(c, b->o, n);
        if (mix && after1)
            blk_norm(c->be, b->o, b->o, after1, n, d);
        if (mix && ls->residual != RESID_PARALLEL)
            op->axpy(c->be, b->x, d, rs, b->o, d, n, d);
        if (has_ffn) {
            if (ls->residual == RESID_SEQUENTIAL || sandwich)
                blk_norm(c->be, b->xn, b->x, &n2, n, d);
            ffn(c, L, ls, in, n);
            if (ls->tp_ffn)
                model_tp_reduce(c, b->f, n);
            if (after2)
                blk_norm(c->be, b->f, b->f, after2, n, d);
            if (mix && ls->residual == RESID_PARALLEL)
                op->axpy(c->be, b->x, d, rs, b->o, d, n, d);
            op->axpy(c->be, b->x, d, rs, b->f, d, n, d);
        }
        /* DeepStack (Qwen3-VL, ADR 0120): the image rows' features for this layer added to
         * its output */
        for (int i = 0; i < ch->n_img; i++)
            if (il < ch->img[i].n_deep)
                op->axpy(c->be, b->x + (size_t)ch->img[i].row * d, d, 1.0f,
                         ch->img[i].embd + (size_t)(il + 1) * ch->img[i].deep_ld, d, ch->img[i].n, d);
    }
    struct blk_norm_w nout = {.kind = hp->norm, .eps = hp->norm_eps, .w = &m->out_norm,
                              .b = &m->out_norm_b, .w_off = hp->norm_w_offset};
    if (hp->encoder && ch->n_out == 0)
        blk_norm(c->be, b->x, b->x, &nout, n, d);
    if (ch->n_out > 0) {
        /* the head's rows: n_vocab, or a tensor-parallel rank's share of them (tp.h) */
        int hw = (int)m->lm_head.shape[0];
        blk_head(c->be, b->logits, b->x, ch->out_rows, ch->n_out, &nout, &m->lm_head, &m->lm_head_b,
                 d, b);
        if (hp->logit_scale != 1.0f)
            op->scale(c->be, b->logits, hw, hp->logit_scale, ch->n_out, hw);
        if (hp->logit_softcap > 0.0f)
            op->softcap(c->be, b->logits, hw, hp->logit_softcap, ch->n_out, hw);
    }
    if (ch->hidden)
        blk_norm(c->be, b->o, b->x, &nout, n, d);
    return 0;
}
