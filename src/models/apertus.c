/*
 * apertus: ApertusForCausalLM (Swiss AI Apertus). The Llama attention with a
 * per-head q/k RMSNorm, and a non-gated MLP whose activation is xIELU with
 * constants learned per layer:
 *
 *   h   = x + attn(attention_layernorm(x))       q = q_norm(q), k = k_norm(k) per head,
 *   out = h + mlp(feedforward_layernorm(h))      before RoPE
 *   mlp(x) = down_proj(xielu(up_proj(x)))
 *   xielu(v) = ap v² + b v (v > 0), else (expm1(min(v, eps)) - v) an + b v,
 *   ap = softplus(alpha_p), an = b + softplus(alpha_n), b = beta   (mlp.act_fn.*)
 *
 * Config (transformers ApertusConfig): hidden_act "xielu" (another activation is
 * used as NemotronMLP would, down(act(up))), rms_norm_eps 1e-5, untied head,
 * num_key_value_heads = heads when absent; with neither rope_scaling nor
 * rope_parameters the rope is ApertusConfig's llama3 (theta 1.2e7, factor 8 over
 * 8192, low 1, high 4), and a top-level rope_theta does not change it (transformers
 * only fills a theta the rope dict lacks). qk_norm / post_norm of the published
 * config.json are not read (transformers always norms q and k, never post-norms);
 * mlp_bias = true is refused. Tensors: the xIELU parameters are stored as [1]
 * (transformers) or as scalars (mlx-lm's sanitize squeezes alpha_p / alpha_n).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers ApertusConfig defaults (hidden_act "xielu" is read here, not by hf_parse_decoder) */
static const struct hf_defaults apertus_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 12000000.0f, .partial_rotary = 1.0f, .act = "xielu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int apertus_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    struct hf_defaults d = apertus_defaults;
    char act[64];
    int rc;
    if ((rc = cfg_opt_str(cfg, "hidden_act", d.act, act, sizeof act, e)) < 0)
        return rc;
    bool xielu = strcmp(act, "xielu") == 0;
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c)
        return err_setf(e, ERR_NOMEM, "out of memory copying config.json");
    if (xielu) {
        /* the shared parser knows no xIELU: it reads a stand-in, replaced below */
        cJSON_DeleteItemFromObjectCaseSensitive(c, "hidden_act");
        d.act = "relu";
    }
    rc = hf_parse_decoder(hp, c, &d, e);
    cJSON_Delete(c);
    if (rc < 0)
        return rc;
    if (xielu)
        hp->act = ACT_XIELU;
    hp->ffn = FFN_MLP;
    hp->qk_norm = true;
    if (!cfg_has(cfg, "rope_scaling") && !cfg_has(cfg, "rope_parameters")) {
        hp->rope = ROPE_LLAMA3;
        hp->rope_theta = 12000000.0f;
        hp->rope_factor = 8.0f;
        hp->rope_low_freq_factor = 1.0f;
        hp->rope_high_freq_factor = 4.0f;
        hp->rope_orig_ctx = 8192;
    }
    return hf_finish_layers(hp, cfg, &d, 0, e);
}

/* One xIELU parameter PRE.mlp.act_fn.NAME ([1] or a scalar) as a finite double. */
static int act_param(struct wmap *w, const char *pre, const char *name, double *out, struct err *e)
{
    struct tensor t;
    float v = 0.0f;
    int rc = wm_vec(w, &t, WM_REQUIRED, 1, e, "%s.mlp.act_fn.%s", pre, name);
    if (rc < 0)
        return rc;
    dtype_to_f32_ref(&v, t.data, t.dtype, 1);
    if (!isfinite(v))
        return err_setf(e, ERR_FORMAT, "tensor '%s.mlp.act_fn.%s' is not finite", pre, name);
    *out = v;
    return 0;
}

static double softplus(double x)
{
    return x > 30.0 ? x : log1p(exp(x));
}

/* The layer's xIELU constants (transformers XIELUActivation._xielu_python), in double. */
static int map_xielu(struct wmap *w, struct layer *L, const char *pre, struct err *e)
{
    double ap, an, beta, eps;
    int rc;
    if ((rc = act_param(w, pre, "alpha_p", &ap, e)) < 0 || (rc = act_param(w, pre, "alpha_n", &an, e)) < 0 ||
        (rc = act_param(w, pre, "beta", &beta, e)) < 0 || (rc = act_param(w, pre, "eps", &eps, e)) < 0)
        return rc;
    L->xielu = (struct xielu_params){
        .alpha_p = (float)softplus(ap),
        .alpha_n = (float)(beta + softplus(an)),
        .beta = (float)beta,
        .eps = (float)eps,
    };
    return 0;
}

static int apertus_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    int rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        int64_t ff = hp->layer[il].n_ff;
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d", il);
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, d, e, "%s.attention_layernorm.weight", p)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_norm, WM_REQUIRED, d, e, "%s.feedforward_layernorm.weight", p)) < 0 ||
            (rc = hf_map_attention(&w, hp, L, il, e)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.mlp.up_proj", p)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.mlp.down_proj", p)) < 0 ||
            (hp->layer[il].act == ACT_XIELU && (rc = map_xielu(&w, L, p, e)) < 0))
            return rc;
    }
    return 0;
}

static const char *const apertus_archs[] = {"ApertusForCausalLM", NULL};

const struct model_ops apertus_ops = {
    .family = "apertus",
    .description = "Apertus: per-head q/k RMSNorm, non-gated MLP with learned xIELU, llama3 rope",
    .architectures = apertus_archs,
    .parse_config = apertus_parse_config,
    .map_weights = apertus_map_weights,
    .forward = decoder_forward,
};
