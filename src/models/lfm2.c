/*
 * lfm2: Liquid LFM2 (Lfm2ForCausalLM). Short gated convolutions beside attention
 * (ADR 0057):
 *
 *   block(x) = h + ffn(ffn_norm(h)),  h = x + op(operator_norm(x))    RMSNorm everywhere
 *   op       = attention on "full_attention" layers: q/k/v/out_proj, per-head RMSNorm of q
 *              and k (q_layernorm / k_layernorm) before rotate-half RoPE on every dim
 *            | the gated short conv on "conv" layers: B | C | x = in_proj(h);
 *              out_proj(C * conv(B * x)), conv depthwise causal of width conv_L_cache whose
 *              state is the last conv_L_cache - 1 products B * x of the sequence
 *   ffn      = w2(silu(w1 x) * w3 x); with block_auto_adjust_ff_dim its width is
 *              int(2 * intermediate_size / 3), then (block_ffn_dim_multiplier set) times the
 *              multiplier, rounded up to block_multiple_of
 *   head     = lm_head(embedding_norm(x)) (the final norm keeps its historical name),
 *              tied by default
 *
 * Config (Lfm2Config): vocab_size, hidden_size, intermediate_size (or the original
 * block_ff_dim), num_hidden_layers, num_attention_heads, num_key_value_heads (8),
 * max_position_embeddings, norm_eps (1e-5), rope_parameters / rope_theta (or theta; 1e6),
 * tie_word_embeddings (or tie_embedding; true), conv_bias (false: in_proj, out_proj and
 * the conv), conv_L_cache (3), block_* above (256, 1.0, true), layer_types or full_attn_idxs
 * (neither: every layer attends).
 * Tensors: model.embed_tokens, model.embedding_norm, model.layers.N.{operator_norm,
 * ffn_norm, feed_forward.{w1,w2,w3}, self_attn.{q,k,v,out}_proj, self_attn.{q,k}_layernorm,
 * conv.{in_proj, out_proj, conv}}; conv.conv.weight [hidden, 1, L] (transformers) or
 * [hidden, L, 1] (mlx-lm), the same bytes. lm_head.weight when untied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"

static const struct hf_defaults lfm2_defaults = {
    .eps_key = "norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 1e6f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = true,
};

/* The original LFM2 config names transformers also reads: block_ff_dim, theta,
 * tie_embedding, copied under the standard names when those are absent. */
static int with_aliases(const cJSON *cfg, cJSON **out, struct err *e)
{
    static const char *const alias[][2] = {
        {"block_ff_dim", "intermediate_size"}, {"theta", "rope_theta"},
        {"tie_embedding", "tie_word_embeddings"},
    };
    *out = cJSON_Duplicate(cfg, 1);
    if (!*out)
        return err_setf(e, ERR_NOMEM, "lfm2 config: out of memory");
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, alias[i][0]);
        if (!v || cJSON_IsNull(v) || cfg_has(cfg, alias[i][1]))
            continue;
        cJSON *c = cJSON_Duplicate(v, 1);
        if (!c || !cJSON_AddItemToObject(*out, alias[i][1], c)) {
            cJSON_Delete(c);
            cJSON_Delete(*out);
            *out = NULL;
            return err_setf(e, ERR_NOMEM, "lfm2 config: out of memory");
        }
    }
    return 0;
}

/* The FFN width Lfm2MLP computes from intermediate_size. */
static int ffn_width(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    bool adjust;
    int mult_of, rc;
    float mult = 1.0f;
    if ((rc = cfg_opt_bool(cfg, "block_auto_adjust_ff_dim", true, &adjust, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "block_multiple_of", 256, &mult_of, e)) < 0)
        return rc;
    bool has_mult = !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, "block_ffn_dim_multiplier"));
    if (has_mult && (rc = cfg_opt_float(cfg, "block_ffn_dim_multiplier", 1.0f, &mult, e)) < 0)
        return rc;
    if (!adjust)
        return 0;
    if ((rc = hparams_check_dim(mult_of, "block_multiple_of", 1, 1 << 16, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_ff, "intermediate_size", 1, HP_MAX_DIM, e)) < 0)
        return rc;
    if (!(mult > 0.0f && mult <= 64.0f))
        return err_setf(e, ERR_CONFIG, "config field 'block_ffn_dim_multiplier' = %g must be in "
                        "(0, 64]", (double)mult);
    int64_t ff = (int64_t)(2.0 * hp->n_ff / 3.0);
    if (has_mult) {
        ff = (int64_t)((double)mult * (double)ff);
        ff = mult_of * ((ff + mult_of - 1) / mult_of);
    }
    if ((rc = hparams_check_dim(ff, "intermediate_size (adjusted)", 1, HP_MAX_DIM, e)) < 0)
        return rc;
    hp->n_ff = (int)ff;
    return 0;
}

/* layer_types ("full_attention" / "conv"), else full_attn_idxs, else every layer attends. */
static int layer_kinds(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(cfg, "full_attn_idxs");
    bool *conv = hp->n_layer > 0 ? calloc((size_t)hp->n_layer, sizeof *conv) : NULL;
    if (!conv)
        return err_setf(e, ERR_NOMEM, "lfm2 config: out of memory");
    int rc = 0;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer) {
            rc = err_setf(e, ERR_CONFIG, "config field 'layer_types' must list %d layer types "
                          "(num_hidden_layers)", hp->n_layer);
            goto out;
        }
        int il = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, lt) {
            const char *s = cJSON_IsString(t) ? t->valuestring : "(not a string)";
            if (strcmp(s, "conv") == 0) {
                conv[il] = true;
            } else if (strcmp(s, "full_attention") != 0) {
                rc = err_setf(e, ERR_UNSUPPORTED, "config field 'layer_types'[%d] = '%s' is not "
                              "supported (full_attention, conv)", il, s);
                goto out;
            }
            il++;
        }
    } else if (idx && !cJSON_IsNull(idx)) {
        if (!cJSON_IsArray(idx)) {
            rc = err_setf(e, ERR_CONFIG, "config field 'full_attn_idxs' must be a list of layer "
                          "indices");
            goto out;
        }
        for (int il = 0; il < hp->n_layer; il++)
            conv[il] = true;
        const cJSON *t;
        cJSON_ArrayForEach(t, idx) {
            double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
            if (!(v >= 0.0 && v < hp->n_layer) || v != (double)(int)v) {
                rc = err_setf(e, ERR_CONFIG, "config field 'full_attn_idxs' holds %g, not a "
                              "layer index in [0, %d)", v, hp->n_layer);
                goto out;
            }
            conv[(int)v] = false;
        }
    }
    for (int il = 0; il < hp->n_layer; il++) {
        if (!conv[il])
            continue;
        struct layer_spec *ls = &hp->layer[il];
        ls->mixer = MIXER_SHORTCONV;
        ls->kv = KV_RECURRENT;
        ls->n_rot = 0;
        ls->qk_norm = false;
        ls->state_conv = (hp->ssm.d_conv - 1) * hp->n_embd;
        ls->state_rec = 0;
        hp->rec_scratch = 4 * hp->n_embd;  /* blk_shortconv: B | C | x, then B * x */
    }
out:
    free(conv);
    return rc;
}

static int lfm2_parse_config(struct hparams *hp, const cJSON *cfg0, struct err *e)
{
    cJSON *cfg;
    int rc = with_aliases(cfg0, &cfg, e);
    if (rc < 0)
        return rc;
    bool conv_bias;
    if ((rc = hf_parse_decoder(hp, cfg, &lfm2_defaults, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "conv_L_cache", 3, &hp->ssm.d_conv, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "conv_bias", false, &conv_bias, e)) < 0 ||
        (rc = ffn_width(hp, cfg, e)) < 0)
        goto out;
    /* the width of every layer's depthwise conv (its state: d_conv - 1 inputs) */
    if ((rc = hparams_check_dim(hp->ssm.d_conv, "conv_L_cache", 2, 64, e)) < 0)
        goto out;
    hp->ssm.conv_bias = hp->ssm.proj_bias = conv_bias;
    hp->qk_norm = true;
    hparams_fill_layers(hp);
    rc = layer_kinds(hp, cfg, e);
out:
    cJSON_Delete(cfg);
    return rc;
}

static int map_attention(struct wmap *w, const struct hparams *hp, struct layer *L, int il,
                         struct err *e)
{
    int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_kv_head * hd;
    const char *p = "model.layers.%d.self_attn";
    char pre[64];
    snprintf(pre, sizeof pre, p, il);
    int rc;
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, hp->n_embd, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, hp->n_embd, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, hp->n_embd, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, hp->n_embd, qd, e, "%s.out_proj", pre)) < 0 ||
        (rc = wm_vec(w, &L->q_norm, WM_REQUIRED, hd, e, "%s.q_layernorm.weight", pre)) < 0 ||
        (rc = wm_vec(w, &L->k_norm, WM_REQUIRED, hd, e, "%s.k_layernorm.weight", pre)) < 0)
        return rc;
    return 0;
}

static int map_conv(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, K = hp->ssm.d_conv;
    const char *p = "model.layers.%d.conv";
    char pre[64];
    snprintf(pre, sizeof pre, p, il);
    int rc;
    bool b = hp->ssm.proj_bias;
    if ((rc = wm_linear(w, &L->ssm_in, WM_REQUIRED, 0, 3 * d, d, e, "%s.in_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_out, WM_REQUIRED, 0, d, d, e, "%s.out_proj", pre)) < 0 ||
        (b && (rc = wm_vec(w, &L->ssm_in_b, WM_REQUIRED, 3 * d, e, "%s.in_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->ssm_out_b, WM_REQUIRED, d, e, "%s.out_proj.bias", pre)) < 0) ||
        (hp->ssm.conv_bias &&
         (rc = wm_vec(w, &L->ssm_conv_b, WM_REQUIRED, d, e, "%s.conv.bias", pre)) < 0))
        return rc;
    /* [d, 1, K] as transformers stores it, or [d, K, 1] as mlx-lm does: the same bytes */
    char name[80];
    snprintf(name, sizeof name, "%s.conv.weight", pre);
    const struct st_tensor *t = st_set_find(w->st, name);
    bool mlx = t && t->ndim == 3 && t->shape[1] == K && t->shape[2] == 1;
    int64_t shape3[3] = {d, mlx ? K : 1, mlx ? 1 : K};
    if ((rc = wm_tensor(w, &L->ssm_conv, WM_REQUIRED, 3, shape3, e, "%s", name)) < 0)
        return rc;
    int64_t shape[2] = {d, K};
    const char *tname = L->ssm_conv.name;
    tensor_init(&L->ssm_conv, L->ssm_conv.dtype, L->ssm_conv.data, 2, shape);
    L->ssm_conv.name = tname;
    if ((rc = model_widen_f32(m, &L->ssm_conv, e)) < 0 || (rc = model_widen_f32(m, &L->ssm_conv_b, e)) < 0)
        return rc;
    return 0;
}

static int lfm2_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        const char *p = "model.layers.%d";
        char pre[48];
        snprintf(pre, sizeof pre, p, il);
        int64_t d = hp->n_embd, ff = hp->n_ff;
        if ((rc = wm_vec(&w, &L->attn_norm, WM_REQUIRED, d, e, "%s.operator_norm.weight", pre)) < 0 ||
            (rc = wm_vec(&w, &L->ffn_norm, WM_REQUIRED, d, e, "%s.ffn_norm.weight", pre)) < 0 ||
            (rc = wm_linear(&w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.feed_forward.w1", pre)) < 0 ||
            (rc = wm_linear(&w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.feed_forward.w2", pre)) < 0 ||
            (rc = wm_linear(&w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.feed_forward.w3", pre)) < 0)
            return rc;
        rc = hp->layer[il].mixer == MIXER_SHORTCONV ? map_conv(m, &w, L, il, e)
                                                    : map_attention(&w, hp, L, il, e);
        if (rc < 0)
            return rc;
    }
    return hf_map_head(m, &w, "model.embed_tokens", "model.embedding_norm",
                       hp->tie_embd ? NULL : "lm_head", e);
}

/* mlx-lm's sanitize stores the depthwise conv as MLX's [out, K, in / groups]: [hidden, L, 1]. */
static const struct ck_view_rule lfm2_views[] = {
    {"model.layers.%d.conv.conv.weight", "model.layers.%d.conv.conv.weight", CK_VIEW_T, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void lfm2_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, lfm2_views, sizeof lfm2_views);
}

static const char *const lfm2_archs[] = {"Lfm2ForCausalLM", NULL};

const struct model_ops lfm2_ops = {
    .family = "lfm2",
    .description = "Liquid LFM2: gated short convolutions beside GQA attention with q/k RMSNorm",
    .architectures = lfm2_archs,
    .parse_config = lfm2_parse_config,
    .map_weights = lfm2_map_weights,
    .forward = decoder_forward,
    .convert_views = lfm2_convert_views,
};
