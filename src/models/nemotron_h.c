/*
 * nemotron_h: NemotronHForCausalLM (NVIDIA Nemotron-H). Each layer is one block
 * x += mixer(rmsnorm(x)) whose mixer is, by layers_block_type: a Mamba-2 mixer
 * ("linear_attention"), attention without positional encoding ("full_attention"), or a
 * relu² MLP up -> relu(.)^2 -> down ("mlp"). On the shared decoder: Mamba-2 and attention
 * layers have no FFN, MLP layers no mixer (their norm is the FFN's).
 *
 * Config (transformers NemotronHConfig, defaults): vocab_size 131072, hidden_size 4096,
 * layers_block_type (alias layer_types; else hybrid_override_pattern of M / * / - / E;
 * else ["linear_attention", "moe", "full_attention", "mlp"]), num_attention_heads 32,
 * num_key_value_heads 8, head_dim 128, max_position_embeddings 4096, attention_bias false,
 * sliding_window null, intermediate_size 21504, mlp_hidden_act relu2, mlp_bias false,
 * ssm_state_size 128, mamba_num_heads 128, mamba_head_dim 64, mamba_hidden_act silu,
 * n_groups 8, conv_kernel 4, expand 2, time_step_limit [0, inf], use_conv_bias true,
 * chunk_size 128, use_bias false (the mixer's in / out projections), layer_norm_epsilon
 * 1e-5, tie_word_embeddings false; the legacy names mamba_n_groups, mamba_d_conv,
 * mamba_expand, mamba_dt_limit, mamba_conv_bias, mamba_chunk_size as transformers maps
 * them. The gated norm works per group of d_inner / n_groups, as NemotronH's mixer does.
 * Refused: "moe" layers and a sliding_window (not implemented), and a num_hidden_layers
 * that differs from the pattern's length (transformers only warns and takes the pattern).
 * Not read: num_nextn_predict_layers / mtp_* (the multi-token-prediction layers are not
 * loaded, as transformers' CausalLM does not), residual_in_fp32, mamba_ssm_cache_dtype
 * (states stay f32), time_step_min / _max / _floor, rescale_prenorm_residual.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"
#include "ssm2.h"

enum nh_layer { NH_MAMBA, NH_ATTN, NH_MLP, NH_MOE };

/* A config key or its legacy name (transformers' __post_init__ renames) */
static const char *key_or_legacy(const cJSON *cfg, const char *key, const char *legacy)
{
    return cfg_has(cfg, legacy) ? legacy : key;
}

static int layer_kind(const char *s, enum nh_layer *out)
{
    static const struct { const char *name; enum nh_layer k; } map[] = {
        {"linear_attention", NH_MAMBA}, {"mamba", NH_MAMBA}, {"M", NH_MAMBA},
        {"full_attention", NH_ATTN}, {"attention", NH_ATTN}, {"*", NH_ATTN},
        {"mlp", NH_MLP}, {"-", NH_MLP}, {"moe", NH_MOE}, {"E", NH_MOE},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i].name) == 0) {
            *out = map[i].k;
            return 0;
        }
    return -1;
}

/* The layer pattern into kinds[], its length into *n. */
static int parse_pattern(const cJSON *cfg, enum nh_layer *kinds, int *n, const char **field,
                         struct err *e)
{
    const char *key = cfg_has(cfg, "layers_block_type") ? "layers_block_type"
                      : cfg_has(cfg, "layer_types") ? "layer_types" : NULL;
    *field = key ? key : "hybrid_override_pattern";
    const cJSON *lt = key ? cJSON_GetObjectItemCaseSensitive(cfg, key) : NULL;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cfg, "hybrid_override_pattern");
    char one[2] = {0};
    *n = 0;
    if (lt) {
        if (!cJSON_IsArray(lt))
            return err_setf(e, ERR_CONFIG, "config field '%s' must be a list of layer types", key);
        const cJSON *t;
        cJSON_ArrayForEach(t, lt) {
            if (*n >= HP_MAX_LAYERS)
                return err_setf(e, ERR_CONFIG, "config field '%s' lists more than %d layers", key,
                                HP_MAX_LAYERS);
            if (!cJSON_IsString(t) || layer_kind(t->valuestring, &kinds[*n]) < 0)
                return err_setf(e, ERR_CONFIG, "config field '%s'[%d] is not one of mlp, "
                                "linear_attention, full_attention, moe", key, *n);
            (*n)++;
        }
    } else if (cJSON_IsString(pat)) {
        for (const char *c = pat->valuestring; *c; c++) {
            one[0] = *c;
            if (*n >= HP_MAX_LAYERS || layer_kind(one, &kinds[*n]) < 0)
                return err_setf(e, ERR_CONFIG, "config field 'hybrid_override_pattern'[%d] = "
                                "'%c' is not one of M * - E (or too long)", *n, *c);
            (*n)++;
        }
    } else {
        static const enum nh_layer def[] = {NH_MAMBA, NH_MOE, NH_ATTN, NH_MLP};
        memcpy(kinds, def, sizeof def);
        *n = 4;
    }
    if (*n < 1)
        return err_setf(e, ERR_CONFIG, "config field '%s' lists no layer", *field);
    return 0;
}

static int parse_act(const cJSON *cfg, enum act_kind *out, struct err *e)
{
    char act[32];
    int rc = cfg_opt_str(cfg, "mlp_hidden_act", "relu2", act, sizeof act, e);
    if (rc < 0)
        return rc;
    if (strcmp(act, "relu2") == 0)
        *out = ACT_RELU2;
    else if (strcmp(act, "relu") == 0)
        *out = ACT_RELU;
    else if (strcmp(act, "gelu") == 0)
        *out = ACT_GELU_ERF;
    else if (strcmp(act, "gelu_pytorch_tanh") == 0 || strcmp(act, "gelu_new") == 0)
        *out = ACT_GELU_TANH;
    else
        return err_setf(e, ERR_UNSUPPORTED, "config field 'mlp_hidden_act' = '%s' is not supported",
                        act);
    return 0;
}

static int nemotron_h_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    static enum nh_layer kinds[HP_MAX_LAYERS];
    const char *field;
    int rc, n_layer_cfg = 0;
    bool has_layers = cfg_has(cfg, "num_hidden_layers");
    struct ssm2_keys k = {
        .n_head = "mamba_num_heads", .head_dim = "mamba_head_dim", .d_state = "ssm_state_size",
        .n_group = key_or_legacy(cfg, "n_groups", "mamba_n_groups"),
        .d_conv = key_or_legacy(cfg, "conv_kernel", "mamba_d_conv"),
        .expand = key_or_legacy(cfg, "expand", "mamba_expand"), .inner = NULL,
        .conv_bias = key_or_legacy(cfg, "use_conv_bias", "mamba_conv_bias"),
        .proj_bias = "use_bias", .chunk = key_or_legacy(cfg, "chunk_size", "mamba_chunk_size"),
        .eps = "layer_norm_epsilon", .act = "mamba_hidden_act",
        .def_n_head = 128, .def_head_dim = 64, .def_d_state = 128, .def_n_group = 8,
        .def_d_conv = 4, .def_chunk = 128, .def_expand = 2.0f, .def_eps = 1e-5f,
        .def_conv_bias = true, .def_proj_bias = false, .norm_per_group = true,
    };
    bool mlp_bias;
    enum act_kind act = ACT_RELU2;
    if ((rc = cfg_opt_int(cfg, "vocab_size", 131072, &hp->n_vocab, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "hidden_size", 4096, &hp->n_embd, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_attention_heads", 32, &hp->n_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", 8, &hp->n_kv_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "head_dim", 128, &hp->head_dim, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "max_position_embeddings", 4096, &hp->n_ctx, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "intermediate_size", 21504, &hp->n_ff, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "attention_bias", false, &hp->qkv_bias, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mlp_bias", false, &mlp_bias, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", false, &hp->tie_embd, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "layer_norm_epsilon", 1e-5f, &hp->norm_eps, e)) < 0 ||
        (has_layers && (rc = cfg_int(cfg, "num_hidden_layers", &n_layer_cfg, e)) < 0) ||
        (rc = parse_act(cfg, &act, e)) < 0 ||
        (rc = parse_pattern(cfg, kinds, &hp->n_layer, &field, e)) < 0)
        return rc;
    if (has_layers && n_layer_cfg != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'num_hidden_layers' = %d does not match the "
                        "%d layers of '%s'", n_layer_cfg, hp->n_layer, field);
    if (cfg_has(cfg, "sliding_window"))
        return err_setf(e, ERR_UNSUPPORTED, "config field 'sliding_window' is not supported");
    if ((rc = hparams_check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->head_dim, "head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = ssm2_parse(hp, cfg, &k, e)) < 0)
        return rc;
    hp->out_bias = hp->qkv_bias;
    hp->ffn = FFN_MLP;
    hp->act = act;
    hp->ffn_bias = mlp_bias;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->n_rot = 0;  /* NemotronH attention has no positional encoding */
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        switch (kinds[il]) {
        case NH_MAMBA:
            ls->ffn = FFN_NONE;
            ssm2_layer(hp, il);
            break;
        case NH_ATTN:
            ls->ffn = FFN_NONE;
            break;
        case NH_MLP:
            ls->mixer = MIXER_NONE;
            break;
        case NH_MOE:
            return err_setf(e, ERR_UNSUPPORTED, "config field '%s'[%d] = moe: Nemotron-H MoE "
                            "layers are not supported", field, il);
        }
    }
    return 0;
}

static int map_layer(struct model *m, struct wmap *w, int il, struct err *e)
{
    const struct hparams *hp = &m->hp;
    const struct layer_spec *ls = &hp->layer[il];
    struct layer *L = &m->layers[il];
    int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    int64_t kvd = (int64_t)hp->n_kv_head * hp->head_dim, ff = ls->n_ff;
    char pre[128];
    int rc;
    snprintf(pre, sizeof pre, "backbone.layers.%d.mixer", il);
    /* the block's one norm: before the mixer, or before the FFN of an MLP layer */
    struct tensor *norm = ls->mixer == MIXER_NONE ? &L->ffn_norm : &L->attn_norm;
    if ((rc = wm_vec(w, norm, WM_REQUIRED, d, e, "backbone.layers.%d.norm.weight", il)) < 0)
        return rc;
    if (ls->mixer == MIXER_MAMBA2)
        return ssm2_map(m, w, L, pre, e);
    if (ls->mixer == MIXER_NONE) {
        bool b = hp->ffn_bias;
        if ((rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0 ||
            (b && (rc = wm_vec(w, &L->up_b, WM_REQUIRED, ff, e, "%s.up_proj.bias", pre)) < 0) ||
            (b && (rc = wm_vec(w, &L->down_b, WM_REQUIRED, d, e, "%s.down_proj.bias", pre)) < 0))
            return rc;
        return 0;
    }
    bool b = hp->qkv_bias;
    if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, d, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.o_proj", pre)) < 0 ||
        (b && (rc = wm_vec(w, &L->bq, WM_REQUIRED, qd, e, "%s.q_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->bk, WM_REQUIRED, kvd, e, "%s.k_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->bv, WM_REQUIRED, kvd, e, "%s.v_proj.bias", pre)) < 0) ||
        (b && (rc = wm_vec(w, &L->bo, WM_REQUIRED, d, e, "%s.o_proj.bias", pre)) < 0))
        return rc;
    return 0;
}

static int nemotron_h_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int rc;
    if ((rc = hf_map_head(m, &w, "backbone.embeddings", "backbone.norm_f", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++)
        if ((rc = map_layer(m, &w, il, e)) < 0)
            return rc;
    return 0;
}

/* mlx-lm's sanitize moves conv1d's kernel axis last but one: [ch, 1, K] -> [ch, K, 1] */
static void nemotron_h_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    out[0] = (struct ck_view_rule){"backbone.layers.%d.mixer.conv1d.weight", "backbone.layers.%d.mixer.conv1d.weight", CK_VIEW_T, 0, 0};
    out[1] = (struct ck_view_rule){NULL, NULL, CK_VIEW_NONE, 0, 0};
}

static const char *const nemotron_h_archs[] = {"NemotronHForCausalLM", NULL};

const struct model_ops nemotron_h_ops = {
    .family = "nemotron_h",
    .description = "Nemotron-H: Mamba-2, rope-free attention and relu² MLP layers, one norm each",
    .architectures = nemotron_h_archs,
    .parse_config = nemotron_h_parse_config,
    .map_weights = nemotron_h_map_weights,
    .convert_views = nemotron_h_convert_views,
    .forward = decoder_forward,
};
