/*
 * falcon_h1: FalconH1ForCausalLM (TII Falcon-H1). Every layer runs attention and a Mamba-2
 * mixer side by side on the same normalized input, then a SwiGLU MLP, with muP multipliers
 * throughout (transformers' FalconH1DecoderLayer):
 *
 *   x = embedding_multiplier * embed(ids)
 *   h = rmsnorm(x)                                         input_layernorm
 *   x += ssm_out_multiplier * mamba(ssm_in_multiplier * h)
 *      + attention_out_multiplier * attn(attention_in_multiplier * h)
 *   x += down_mult * down(up(g) * silu(gate_mult * gate(g))),  g = rmsnorm(x)   pre_ff_layernorm
 *   logits = lm_head_multiplier * lm_head(rmsnorm(x))      final_layernorm
 *
 * mamba: the Mamba-2 mixer (blocks_ssm.c) with the in_proj columns z | x | B | C | dt scaled
 * by ssm_multipliers (the mup vector), the gated norm per group (mamba_rms_norm; before the
 * gate with mamba_norm_before_gate) or only the gate y * silu(z). attn: Llama attention whose
 * keys are scaled by key_multiplier (folded into the softmax scale: k only meets q).
 *
 * A layer holds both a KV cache and a recurrent state, which one kv_layer cannot: the model's
 * hp layers are pairs, 2 i the attention (norms, attention, MLP) and 2 i + 1 the Mamba-2 mixer
 * of config layer i, and this file's forward walks them pairwise.
 *
 * Config (transformers FalconH1Config): the Llama fields (hf_parse_decoder: rms_norm_eps
 * 1e-5, rope_theta / rope_parameters (Llama's 1e4 when absent; released configs state it),
 * head_dim, attention_bias, mlp_bias refused), the multipliers (each 1 when absent or null;
 * mlp_multipliers [gate, down], ssm_multipliers [z, x, B, C, dt]), mamba_d_ssm (null:
 * mamba_expand x hidden_size), mamba_n_heads, mamba_d_head ("auto": inner / heads),
 * mamba_d_state, mamba_n_groups, mamba_d_conv, mamba_chunk_size, mamba_conv_bias,
 * mamba_proj_bias (in_proj), projectors_bias (out_proj; must equal mamba_proj_bias here),
 * mamba_rms_norm (false), mamba_norm_before_gate (true), time_step_limit.
 *
 * mlx-lm's converted layout (conv1d [ch, K, 1]) holds the multipliers folded into the
 * weights by its sanitize (embedding, lm_head, q / k by attention_in, o, out_proj, the MLP's
 * gate and down, in_proj by ssm_in x the mup vector; not key_multiplier, nor v's share of
 * attention_in), and mlx-lm's forward applies none of them, except a tied head's
 * lm_head / embedding ratio: such a checkpoint runs as mlx-lm runs it (map_weights resets
 * the multipliers, the one hparams change a weight layout makes). `mlxcel convert` keeps
 * transformers' layout for this family (a view cannot fold a scale), so its output runs with
 * the multipliers applied.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "tp.h"
#include "hf_common.h"
#include "ssm2.h"

static const struct hf_defaults falcon_h1_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static const struct ssm2_keys falcon_h1_keys = {
    .n_head = "mamba_n_heads", .head_dim = "mamba_d_head", .d_state = "mamba_d_state",
    .n_group = "mamba_n_groups", .d_conv = "mamba_d_conv", .expand = "mamba_expand",
    .inner = "mamba_d_ssm", .conv_bias = "mamba_conv_bias", .proj_bias = "mamba_proj_bias",
    .chunk = "mamba_chunk_size", .eps = "rms_norm_eps", .act = "hidden_act",
    .def_n_head = 128, .def_head_dim = 0, .def_d_state = 256, .def_n_group = 1,
    .def_d_conv = 4, .def_chunk = 256, .def_expand = 2.0f, .def_eps = 1e-5f,
    .def_conv_bias = true, .def_proj_bias = false, .norm_per_group = true,
};

/* A finite multiplier, 1 when absent or null */
static int mult(const cJSON *cfg, const char *key, float *out, struct err *e)
{
    int rc = 0;
    *out = 1.0f;
    if (cfg_has(cfg, key))
        rc = cfg_float(cfg, key, out, e);
    if (rc == 0 && !isfinite(*out))
        return err_setf(e, ERR_CONFIG, "config field '%s' must be finite", key);
    return rc;
}

/* A list of n finite multipliers, all 1 when absent or null */
static int mult_list(const cJSON *cfg, const char *key, float *out, int n, struct err *e)
{
    for (int i = 0; i < n; i++)
        out[i] = 1.0f;
    if (!cfg_has(cfg, key))
        return 0;
    int rc = cfg_float_array(cfg, key, out, n, e);
    for (int i = 0; rc == 0 && i < n; i++)
        if (!isfinite(out[i]))
            return err_setf(e, ERR_CONFIG, "config field '%s'[%d] must be finite", key, i);
    return rc;
}

static int falcon_h1_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, n_cfg;
    float key_mult, mlp[2];
    bool rms, before, proj_bias, out_bias;
    if ((rc = hf_parse_decoder(hp, cfg, &falcon_h1_defaults, e)) < 0 ||
        (rc = mult(cfg, "embedding_multiplier", &hp->embd_scale, e)) < 0 ||
        (rc = mult(cfg, "lm_head_multiplier", &hp->logit_scale, e)) < 0 ||
        (rc = mult(cfg, "key_multiplier", &key_mult, e)) < 0 ||
        (rc = mult(cfg, "attention_in_multiplier", &hp->mup.attn_in, e)) < 0 ||
        (rc = mult(cfg, "attention_out_multiplier", &hp->mup.attn_out, e)) < 0 ||
        (rc = mult(cfg, "ssm_in_multiplier", &hp->mup.ssm_in, e)) < 0 ||
        (rc = mult(cfg, "ssm_out_multiplier", &hp->mup.ssm_out, e)) < 0 ||
        (rc = mult_list(cfg, "mlp_multipliers", mlp, 2, e)) < 0 ||
        (rc = mult_list(cfg, "ssm_multipliers", hp->ssm.mup_mult, 5, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mamba_rms_norm", false, &rms, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mamba_norm_before_gate", true, &before, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mamba_proj_bias", false, &proj_bias, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "projectors_bias", false, &out_bias, e)) < 0 ||
        (rc = ssm2_parse(hp, cfg, &falcon_h1_keys, e)) < 0)
        return rc;
    if (proj_bias != out_bias)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'projectors_bias' = %s differing from "
                        "'mamba_proj_bias' is not supported", out_bias ? "true" : "false");
    if (hp->embd_scale == 0.0f || hp->logit_scale == 0.0f)
        return err_setf(e, ERR_CONFIG, "config fields 'embedding_multiplier' and "
                        "'lm_head_multiplier' must be non-zero");
    hp->ssm.norm_off = !rms;
    hp->ssm.norm_before_gate = before;
    hp->ssm.mup = true;
    hp->mup.mlp_gate = mlp[0];
    hp->mup.mlp_down = mlp[1];
    /* two hp layers per config layer: 2 i attention + MLP, 2 i + 1 the Mamba-2 mixer */
    n_cfg = hp->n_layer;
    if ((rc = hparams_check_dim(n_cfg, "num_hidden_layers", 1, HP_MAX_LAYERS / 2, e)) < 0)
        return rc;
    hp->n_layer = 2 * n_cfg;
    /* k * key_multiplier meets q only: the softmax scale takes it */
    hp->attn_scale *= key_mult;
    hparams_fill_layers(hp);
    for (int i = 0; i < n_cfg; i++) {
        hp->layer[2 * i + 1].ffn = FFN_NONE;
        ssm2_layer(hp, 2 * i + 1);
    }
    return 0;
}

/* mlx-lm's Falcon-H1 checkpoint: the multipliers are in the weights (or, key_multiplier,
 * nowhere), and mlx-lm's forward scales only a tied head, by lm_head / embedding */
static void mlx_folded(struct hparams *hp)
{
    hp->logit_scale = hp->tie_embd ? hp->logit_scale / hp->embd_scale : 1.0f;
    hp->embd_scale = 1.0f;
    hp->mup.ssm_in = hp->mup.ssm_out = hp->mup.attn_in = hp->mup.attn_out = 1.0f;
    hp->mup.mlp_gate = hp->mup.mlp_down = 1.0f;
    hp->ssm.mup = false;
    float scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->attn_scale = scale;
    for (int il = 0; il < hp->n_layer; il++)
        hp->layer[il].attn_scale = scale;
}

static int falcon_h1_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    char pre[128];
    int rc;
    const struct st_tensor *c0 = st_set_find(st, "model.layers.0.mamba.conv1d.weight");
    if (c0 && c0->ndim == 3 && c0->shape[2] == 1 && c0->shape[1] > 1)
        mlx_folded(&m->hp);
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.final_layernorm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il += 2) {
        struct layer *A = &m->layers[il], *M = &m->layers[il + 1];
        int64_t d = hp->n_embd, ff = hp->layer[il].n_ff;
        int i = il / 2;
        snprintf(pre, sizeof pre, "model.layers.%d", i);
        if ((rc = wm_vec(&w, &A->attn_norm, WM_REQUIRED, d, e, "%s.input_layernorm.weight", pre)) < 0 ||
            (rc = wm_vec(&w, &A->ffn_norm, WM_REQUIRED, d, e, "%s.pre_ff_layernorm.weight", pre)) < 0)
            return rc;
        /* named by the config layer i; of hp->layer[i] it reads only the q/k norm flags,
         * false on every layer here */
        if ((rc = hf_map_attention(&w, hp, A, i, e)) < 0)
            return rc;
        snprintf(pre, sizeof pre, "model.layers.%d.feed_forward", i);
        if ((rc = wm_linear(&w, &A->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &A->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &A->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
            return rc;
        snprintf(pre, sizeof pre, "model.layers.%d.mamba", i);
        if ((rc = ssm2_map(m, &w, M, pre, e)) < 0)
            return rc;
    }
    return 0;
}

static void attn_cfg(const struct model_ctx *c, int il, struct blk_attn_cfg *cfg,
                     struct rope_params *rp)
{
    const struct hparams *hp = &c->m->hp;
    const struct layer_spec *ls = &hp->layer[il];
    *rp = (struct rope_params){
        .n_rot = ls->n_rot,
        .inv_freq = c->bufs.rope + (size_t)il * 2 * HP_MAX_ROT_HALF,
        .mscale = 1.0f,
        .style = ls->rope_style,
    };
    *cfg = (struct blk_attn_cfg){
        .ap = {.n_head = hp->n_head, .n_kv_head = hp->n_kv_head, .head_dim = hp->head_dim,
               .scale = ls->attn_scale},
        .rp = ls->n_rot > 0 ? rp : NULL,
        .norm = hp->norm,
        .norm_eps = hp->norm_eps,
        .n_embd = hp->n_embd,
    };
}

/* b->f = down_mult * down(up(xn) * silu(gate_mult * gate(xn))) */
static void mlp(const struct model_ctx *c, const struct layer *L, const struct layer_spec *ls,
                int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int ff = ls->n_ff, d = c->m->hp.n_embd;
    op->linear(be, b->h, 2 * ff, b->xn, &L->gate, NULL, n);
    op->linear(be, b->h + ff, 2 * ff, b->xn, &L->up, NULL, n);
    if (c->m->hp.mup.mlp_gate != 1.0f)
        op->scale(be, b->h, 2 * ff, c->m->hp.mup.mlp_gate, n, ff);
    op->glu(be, ACT_SILU, b->h1, ff, b->h, 2 * ff, n, ff);
    op->linear(be, b->f, d, b->h1, &L->down, NULL, n);
}

static int falcon_h1_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e)
{
    const struct model *m = c->m;
    const struct hparams *hp = &m->hp;
    const struct backend_ops *op = c->be->ops;
    const struct ctx_bufs *b = &c->bufs;
    int n = ch->n_tok, d = hp->n_embd;
    (void)e;
    op->embed(c->be, b->x, &m->tok_embd, ch->ids, n);
    if (hp->embd_scale != 1.0f)
        op->scale(c->be, b->x, d, hp->embd_scale, n, d);
    for (int il = 0; il < hp->n_layer; il += 2) {
        const struct layer *A = &m->layers[il], *M = &m->layers[il + 1];
        const struct layer_spec *la = &hp->layer[il];
        struct blk_norm_w n1 = {.kind = NORM_RMS, .eps = hp->norm_eps, .w = &A->attn_norm};
        struct blk_norm_w n2 = {.kind = NORM_RMS, .eps = hp->norm_eps, .w = &A->ffn_norm};
        struct blk_attn_cfg ac;
        struct rope_params rp;
        attn_cfg(c, il, &ac, &rp);
        blk_norm(c->be, b->xn, b->x, &n1, n, d);
        /* mamba on ssm_in * h (b->f as the scaled copy), into b->o */
        op->copy(c->be, b->f, b->xn, (size_t)n * d * sizeof *b->f);
        if (hp->mup.ssm_in != 1.0f)
            op->scale(c->be, b->f, d, hp->mup.ssm_in, n, d);
        blk_mamba2(c, b->o, b->f, M, &ch->kv[il + 1], ch->rows, n);
        if (hp->layer[il + 1].tp_mix)
            model_tp_reduce(c, b->o, n);
        op->axpy(c->be, b->x, d, hp->mup.ssm_out, b->o, d, n, d);
        /* attention on attention_in * h, into b->o */
        if (hp->mup.attn_in != 1.0f)
            op->scale(c->be, b->xn, d, hp->mup.attn_in, n, d);
        blk_attention(c->be, b->o, b->xn, A, &ac, &ch->kv[il], ch->rows, b, n);
        if (la->tp_mix)
            model_tp_reduce(c, b->o, n);
        op->axpy(c->be, b->x, d, hp->mup.attn_out, b->o, d, n, d);
        /* the MLP */
        blk_norm(c->be, b->xn, b->x, &n2, n, d);
        mlp(c, A, la, n);
        if (la->tp_ffn)
            model_tp_reduce(c, b->f, n);
        op->axpy(c->be, b->x, d, hp->mup.mlp_down, b->f, d, n, d);
    }
    struct blk_norm_w nout = {.kind = NORM_RMS, .eps = hp->norm_eps, .w = &m->out_norm};
    if (ch->n_out > 0) {
        blk_head(c->be, b->logits, b->x, ch->out_rows, ch->n_out, &nout, &m->lm_head,
                 &m->lm_head_b, d, b);
        if (hp->logit_scale != 1.0f)
            op->scale(c->be, b->logits, (int)m->lm_head.shape[0], hp->logit_scale, ch->n_out,
                      (int)m->lm_head.shape[0]);
    }
    return 0;
}

static const char *const falcon_h1_archs[] = {"FalconH1ForCausalLM", NULL};

const struct model_ops falcon_h1_ops = {
    .family = "falcon_h1",
    .description = "Falcon-H1: attention and Mamba-2 side by side in every layer, SwiGLU MLP, muP "
                   "multipliers",
    .architectures = falcon_h1_archs,
    .parse_config = falcon_h1_parse_config,
    .map_weights = falcon_h1_map_weights,
    .forward = falcon_h1_forward,
    .tp_reduces = true,
};
