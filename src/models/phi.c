/*
 * phi: PhiForCausalLM (Phi-1.5, Phi-2). One LayerNorm (with bias) per block
 * feeds attention and the MLP in parallel: x + attn(ln(x)) + mlp(ln(x)).
 * q/k/v and the output projection (`dense`) carry biases; RoPE covers only
 * partial_rotary_factor of each head; the MLP is fc2(gelu_new(fc1(x))) with
 * biases; the head is final_layernorm then lm_head with a bias.
 */
#include <stdio.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers PhiConfig defaults */
static const struct hf_defaults phi_defaults = {
    .eps_key = "layer_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 10000.0f, .partial_rotary = 0.5f, .act = "gelu_new",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int phi_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    bool qk_ln;
    if ((rc = hf_parse_decoder(hp, cfg, &phi_defaults, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "qk_layernorm", false, &qk_ln, e)) < 0)
        return rc;
    if (qk_ln)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'qk_layernorm' = true is not supported");
    hp->norm = NORM_LAYER;
    hp->parallel_residual = true;
    hp->qkv_bias = hp->out_bias = true;
    hp->ffn = FFN_MLP;
    hp->ffn_bias = true;
    hp->head_bias = true;
    return hf_finish_layers(hp, cfg, &phi_defaults, 0, e);
}

static int phi_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_kv_head * hp->head_dim;
    char pre[128], ln[160];
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.final_layernorm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(ln, sizeof ln, "%s.input_layernorm", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, ln, e)) < 0 ||
            (rc = wm_linear(&w, &L->wq, WM_REQUIRED, 0, qd, d, e, "%s.self_attn.q_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.self_attn.k_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.self_attn.v_proj", pre)) < 0 ||
            (rc = wm_linear(&w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.self_attn.dense", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bq, WM_REQUIRED, qd, e, "%s.self_attn.q_proj.bias", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bk, WM_REQUIRED, kvd, e, "%s.self_attn.k_proj.bias", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bv, WM_REQUIRED, kvd, e, "%s.self_attn.v_proj.bias", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bo, WM_REQUIRED, d, e, "%s.self_attn.dense.bias", pre)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, hp->n_ff, d, e, "%s.mlp.fc1", pre)) < 0 ||
            (rc = wm_vec(&w, &L->up_b, WM_REQUIRED, hp->n_ff, e, "%s.mlp.fc1.bias", pre)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, hp->n_ff, e, "%s.mlp.fc2", pre)) < 0 ||
            (rc = wm_vec(&w, &L->down_b, WM_REQUIRED, d, e, "%s.mlp.fc2.bias", pre)) < 0)
            return rc;
    }
    return 0;
}

static const char *const phi_archs[] = {"PhiForCausalLM", NULL};

const struct model_ops phi_ops = {
    .family = "phi",
    .description = "Phi-1.5 / Phi-2: parallel residual, LayerNorm+bias, partial rotary, gelu_new MLP",
    .architectures = phi_archs,
    .parse_config = phi_parse_config,
    .map_weights = phi_map_weights,
    .forward = decoder_forward,
};
