/*
 * mamba: MambaForCausalLM (state-spaces Mamba, transformers modeling_mamba.py; mlx-lm
 * models/mamba.py), and the Mamba mixer the hybrids share (mamba.h).
 *
 *   x     = embeddings(ids)
 *   layer = x + mixer(rms(x))            no FFN (FFN_NONE); residual in f32 (ours always is)
 *   mixer = out_proj(scan(silu(conv1d(in_proj_x(h))), x_proj, dt_proj, A_log, D) * silu(z))
 *           (blk_mamba; hidden_act is the conv's and the gate's activation: silu only)
 *   head  = lm_head(rms(x)), tied to the embeddings unless tie_word_embeddings is false
 *
 * Config (MambaConfig, transformers 5 defaults): vocab_size 50280, hidden_size 768,
 * state_size 16, num_hidden_layers 32, layer_norm_epsilon 1e-5, expand 2 (intermediate_size =
 * int(expand * hidden_size); a stated intermediate_size must agree), conv_kernel 4,
 * use_bias false (in / out projections), use_conv_bias true, hidden_act silu, time_step_rank
 * "auto" = ceil(hidden_size / 16), tie_word_embeddings true. residual_in_fp32, use_mambapy and
 * use_associative_scan choose precisions or training / compile paths of the same function
 * (accepted); the time_step_* / initializer fields only initialize weights. Mamba has no
 * position limit: the context defaults to 2^20 positions, as llama.cpp's converter writes
 * for it. Attention dims are 1 (no attention layer; hparams_validate's minimum).
 *
 * Weights: backbone.embeddings (the original checkpoints' backbone.embedding: transformers'
 * load hook renames it), backbone.layers.N.{norm, mixer.*}, backbone.norm_f, lm_head. MLX
 * checkpoints store conv1d.weight as [d_inner, d_conv, 1] (mlx-lm sanitize), the same memory
 * as transformers' [d_inner, 1, d_conv]; both load.
 */
#include "mamba.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/convert.h"
#include "blocks.h"
#include "hf_common.h"

/* ---- the mixer, shared with the hybrids ---- */

/* An int, or "auto" = ceil(hidden / 16) (transformers' time_step_rank / mamba_dt_rank). */
static int parse_rank(const cJSON *cfg, const char *key, int hidden, int *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v) || (cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0)) {
        *out = (hidden + 15) / 16;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > HP_MAX_DIM)
        return err_setf(e, ERR_CONFIG, "config field '%s' must be \"auto\" or an integer in [1, %d]",
                        key, HP_MAX_DIM);
    *out = (int)v->valuedouble;
    return 0;
}

int mamba_parse_ssm(struct hparams *hp, const cJSON *cfg, const struct mamba_fields *f,
                    struct err *e)
{
    float expand;
    int rc;
    if ((rc = cfg_opt_float(cfg, f->expand, f->expand_def, &expand, e)) < 0 ||
        (rc = cfg_opt_int(cfg, f->d_state, f->d_state_def, &hp->ssm.d_state, e)) < 0 ||
        (rc = cfg_opt_int(cfg, f->d_conv, f->d_conv_def, &hp->ssm.d_conv, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, f->conv_bias, f->conv_bias_def, &hp->ssm.conv_bias, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, f->proj_bias, f->proj_bias_def, &hp->ssm.proj_bias, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = parse_rank(cfg, f->dt_rank, hp->n_embd, &hp->ssm.dt_rank, e)) < 0)
        return rc;
    /* int(expand * hidden_size), bounded before narrowing */
    double di = floor((double)expand * hp->n_embd);
    if (!(expand > 0.0f) || !(di >= 1.0) || di > HP_MAX_DIM)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %g gives an inner width of %.0f "
                        "(hidden_size %d), outside [1, %d]", f->expand, (double)expand, di,
                        hp->n_embd, HP_MAX_DIM);
    hp->ssm.d_inner = (int)di;
    if ((rc = hparams_check_dim(hp->ssm.d_state, f->d_state, 1, BACKEND_SCAN_MAX_STATE, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.d_conv, f->d_conv, 1, 64, e)) < 0)
        return rc;
    /* floats of one sequence's states: bounded here (HP_MAX_STATE), before any is sized */
    int64_t conv = (int64_t)(hp->ssm.d_conv - 1) * hp->ssm.d_inner;
    int64_t scan = (int64_t)hp->ssm.d_inner * hp->ssm.d_state;
    if (conv > HP_MAX_STATE || scan > HP_MAX_STATE)
        return err_setf(e, ERR_CONFIG, "config fields '%s' / '%s' / '%s': a state of %lld + %lld "
                        "floats per layer exceeds %d", f->expand, f->d_state, f->d_conv,
                        (long long)conv, (long long)scan, HP_MAX_STATE);
    hp->rec_scratch = 4 * hp->ssm.d_inner + hp->ssm.dt_rank + 2 * hp->ssm.d_state;
    return 0;
}

void mamba_layer(struct hparams *hp, int il)
{
    struct layer_spec *ls = &hp->layer[il];
    ls->mixer = MIXER_MAMBA;
    ls->kv = KV_RECURRENT;
    ls->n_rot = 0;
    ls->state_conv = (hp->ssm.d_conv - 1) * hp->ssm.d_inner;
    ls->state_rec = hp->ssm.d_inner * hp->ssm.d_state;
}

/* conv1d.weight in either layout, as F32 [d_inner, d_conv] */
static int map_conv(struct model *m, struct wmap *w, struct tensor *t, const char *pre,
                    struct err *e)
{
    int64_t di = m->hp.ssm.d_inner, K = m->hp.ssm.d_conv;
    char name[512];
    snprintf(name, sizeof name, "%s.conv1d.weight", pre);
    const struct st_tensor *s = st_set_find(w->st, name);
    bool mlx = s && s->ndim == 3 && s->shape[1] == K && s->shape[2] == 1 && K != 1;
    int64_t shape[3] = {di, mlx ? K : 1, mlx ? 1 : K}, flat[2] = {di, K};
    int rc;
    if ((rc = wm_tensor(w, t, WM_REQUIRED, 3, shape, e, "%s", name)) < 0 ||
        (rc = model_widen_f32(m, t, e)) < 0)
        return rc;
    const char *tn = t->name;
    tensor_init(t, DTYPE_F32, t->data, 2, flat);
    t->name = tn;
    return 0;
}

int mamba_map_mixer(struct model *m, struct wmap *w, struct layer *L, int il, const char *prefix,
                    bool bcdt_norms, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t d = hp->n_embd, di = hp->ssm.d_inner, ds = hp->ssm.d_state, r = hp->ssm.dt_rank;
    int64_t a_shape[2] = {di, ds};
    char pre[256];
    int rc;
    snprintf(pre, sizeof pre, prefix, il);
    if ((rc = wm_linear(w, &L->ssm_in, WM_REQUIRED, 0, 2 * di, d, e, "%s.in_proj", pre)) < 0 ||
        (hp->ssm.proj_bias &&
         (rc = wm_vec(w, &L->ssm_in_b, WM_REQUIRED, 2 * di, e, "%s.in_proj.bias", pre)) < 0) ||
        (rc = wm_tensor(w, &L->ssm_a, WM_REQUIRED, 2, a_shape, e, "%s.A_log", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_d, WM_REQUIRED, di, e, "%s.D", pre)) < 0 ||
        (rc = map_conv(m, w, &L->ssm_conv, pre, e)) < 0 ||
        (hp->ssm.conv_bias &&
         (rc = wm_vec(w, &L->ssm_conv_b, WM_REQUIRED, di, e, "%s.conv1d.bias", pre)) < 0) ||
        (rc = wm_linear(w, &L->ssm_x, WM_REQUIRED, 0, r + 2 * ds, di, e, "%s.x_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_dt, WM_REQUIRED, 0, di, r, e, "%s.dt_proj", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_dt_b, WM_REQUIRED, di, e, "%s.dt_proj.bias", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_out, WM_REQUIRED, 0, d, di, e, "%s.out_proj", pre)) < 0 ||
        (hp->ssm.proj_bias &&
         (rc = wm_vec(w, &L->ssm_out_b, WM_REQUIRED, d, e, "%s.out_proj.bias", pre)) < 0))
        return rc;
    if (bcdt_norms &&
        ((rc = wm_vec(w, &L->ssm_dt_norm, WM_REQUIRED, r, e, "%s.dt_layernorm.weight", pre)) < 0 ||
         (rc = wm_vec(w, &L->ssm_b_norm, WM_REQUIRED, ds, e, "%s.b_layernorm.weight", pre)) < 0 ||
         (rc = wm_vec(w, &L->ssm_c_norm, WM_REQUIRED, ds, e, "%s.c_layernorm.weight", pre)) < 0))
        return rc;
    /* the kernels read these as F32 values */
    if ((rc = model_widen_f32(m, &L->ssm_conv_b, e)) < 0 || (rc = model_widen_f32(m, &L->ssm_a, e)) < 0 ||
        (rc = model_widen_f32(m, &L->ssm_d, e)) < 0)
        return rc;
    /* x_proj's rows: dt | B | C, each product into a buffer of its own (blk_mamba) */
    L->ssm_xbc = tensor_rows(&L->ssm_x, r, 2 * ds);
    L->ssm_x = tensor_rows(&L->ssm_x, 0, r);
    return 0;
}

/* ---- the family ---- */

static const struct mamba_fields mamba_fields = {
    .expand = "expand", .d_state = "state_size", .d_conv = "conv_kernel",
    .dt_rank = "time_step_rank", .conv_bias = "use_conv_bias", .proj_bias = "use_bias",
    .expand_def = 2.0f, .d_state_def = 16, .d_conv_def = 4,
    .conv_bias_def = true, .proj_bias_def = false,
};

/* The fields MambaConfig reads that change nothing here (precision, training and compile
 * paths): present, each must still be a boolean. */
static const char *const mamba_bool_fields[] = {"residual_in_fp32", "use_mambapy",
                                                "use_associative_scan", "use_cache", NULL};

static int mamba_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    char act[32];
    int rc, inter;
    bool b;
    if ((rc = cfg_opt_int(cfg, "vocab_size", 50280, &hp->n_vocab, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "hidden_size", 768, &hp->n_embd, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_hidden_layers", 32, &hp->n_layer, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "layer_norm_epsilon", 1e-5f, &hp->norm_eps, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", true, &hp->tie_embd, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "hidden_act", "silu", act, sizeof act, e)) < 0 ||
        (rc = mamba_parse_ssm(hp, cfg, &mamba_fields, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "intermediate_size", hp->ssm.d_inner, &inter, e)) < 0)
        return rc;
    for (int i = 0; mamba_bool_fields[i]; i++)
        if ((rc = cfg_opt_bool(cfg, mamba_bool_fields[i], true, &b, e)) < 0)
            return rc;
    if (inter != hp->ssm.d_inner)
        return err_setf(e, ERR_CONFIG, "config field 'intermediate_size' = %d disagrees with "
                        "expand x hidden_size = %d", inter, hp->ssm.d_inner);
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'hidden_act' = '%s': the Mamba mixer "
                        "is implemented with silu only", act);
    if ((rc = hparams_check_dim(hp->n_layer, "num_hidden_layers", 1, HP_MAX_LAYERS, e)) < 0)
        return rc;
    hp->n_head = hp->n_kv_head = hp->head_dim = 1;
    hp->n_ff = 1;
    hp->n_ctx = 1 << 20;
    hp->attn_scale = 1.0f;
    hp->norm = NORM_RMS;
    hp->ffn = FFN_NONE;
    hp->ssm.norm_eps = hp->norm_eps;
    hparams_fill_layers(hp);
    for (int il = 0; il < hp->n_layer; il++)
        mamba_layer(hp, il);
    return 0;
}

static int mamba_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    const char *embd = wm_has(&w, "backbone.embedding.weight") ? "backbone.embedding"
                                                                : "backbone.embeddings";
    int rc;
    if ((rc = hf_map_head(m, &w, embd, "backbone.norm_f", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        char norm[64];
        snprintf(norm, sizeof norm, "backbone.layers.%d.norm", il);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, norm, e)) < 0 ||
            (rc = mamba_map_mixer(m, &w, L, il, "backbone.layers.%d.mixer", false, e)) < 0)
            return rc;
    }
    return 0;
}

/* mlx-lm's sanitize: conv1d.weight [d_inner, 1, d_conv] moves its axes to [d_inner, d_conv, 1] */
static const struct ck_view_rule mamba_views[] = {
    {"backbone.layers.%d.mixer.conv1d.weight", "backbone.layers.%d.mixer.conv1d.weight", CK_VIEW_T, 0, 0},
    {NULL, NULL, CK_VIEW_NONE, 0, 0},
};

static void mamba_convert_views(const struct hparams *hp, struct ck_view_rule *out)
{
    (void)hp;
    memcpy(out, mamba_views, sizeof mamba_views);
}

static const char *const mamba_archs[] = {"MambaForCausalLM", NULL};

const struct model_ops mamba_ops = {
    .family = "mamba",
    .description = "Mamba: RMSNorm + selective-scan mixer (conv1d, x_proj, dt_proj, A_log, D), no FFN",
    .architectures = mamba_archs,
    .parse_config = mamba_parse_config,
    .map_weights = mamba_map_weights,
    .forward = decoder_forward,
    .convert_views = mamba_convert_views,
};
