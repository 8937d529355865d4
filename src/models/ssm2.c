/*
 * ssm2: the Mamba-2 mixer's config and weights for the families built on it (ssm2.h).
 */
#include "ssm2.h"

#include <math.h>
#include <string.h>

#include <stdio.h>

#include "../loading/config.h"
#include "blocks.h"

/* One bound of time_step_limit: a number, or transformers 5's {"__float__": "Infinity"}
 * ("-Infinity", "NaN" likewise). */
static int limit_value(const cJSON *v, int i, float *out, struct err *e)
{
    if (cJSON_IsNumber(v)) {
        *out = (float)v->valuedouble;
        return 0;
    }
    const cJSON *f = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "__float__") : NULL;
    const char *s = cJSON_IsString(f) ? f->valuestring : "";
    if (strcmp(s, "Infinity") == 0 || strcmp(s, "inf") == 0)
        *out = INFINITY;
    else if (strcmp(s, "-Infinity") == 0 || strcmp(s, "-inf") == 0)
        *out = -INFINITY;
    else
        return err_setf(e, ERR_CONFIG, "config field 'time_step_limit'[%d] must be a number", i);
    return 0;
}

static int parse_limit(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    hp->ssm.dt_min = 0.0f;
    hp->ssm.dt_max = INFINITY;
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(cfg, "time_step_limit");
    if (!l || cJSON_IsNull(l))
        return 0;
    int rc;
    if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != 2)
        return err_setf(e, ERR_CONFIG, "config field 'time_step_limit' must be a list of 2 numbers");
    if ((rc = limit_value(cJSON_GetArrayItem(l, 0), 0, &hp->ssm.dt_min, e)) < 0 ||
        (rc = limit_value(cJSON_GetArrayItem(l, 1), 1, &hp->ssm.dt_max, e)) < 0)
        return rc;
    if (isnan(hp->ssm.dt_min) || isnan(hp->ssm.dt_max) || hp->ssm.dt_min > hp->ssm.dt_max)
        return err_setf(e, ERR_CONFIG, "config field 'time_step_limit' = [%g, %g] must be an "
                        "ordered pair", (double)hp->ssm.dt_min, (double)hp->ssm.dt_max);
    return 0;
}

/* cfg_opt_int / _bool / _float under key, or the default when the family has no key */
static int opt_int(const cJSON *cfg, const char *key, int def, int *out, struct err *e)
{
    if (!key) {
        *out = def;
        return 0;
    }
    return cfg_opt_int(cfg, key, def, out, e);
}

static int opt_bool(const cJSON *cfg, const char *key, bool def, bool *out, struct err *e)
{
    if (!key) {
        *out = def;
        return 0;
    }
    return cfg_opt_bool(cfg, key, def, out, e);
}

int ssm2_parse(struct hparams *hp, const cJSON *cfg, const struct ssm2_keys *k, struct err *e)
{
    int rc, inner = 0;
    float expand = k->def_expand;
    char act[32];
    /* Bamba's mamba_d_head may be "auto": the inner width over the heads (below) */
    const cJSON *hd = k->head_dim ? cJSON_GetObjectItemCaseSensitive(cfg, k->head_dim) : NULL;
    bool hd_auto = (cJSON_IsString(hd) && strcmp(hd->valuestring, "auto") == 0) ||
                   ((!hd || cJSON_IsNull(hd)) && k->def_head_dim == 0);
    if ((rc = opt_int(cfg, k->n_head, k->def_n_head, &hp->ssm.n_head, e)) < 0 ||
        (!hd_auto && (rc = opt_int(cfg, k->head_dim, k->def_head_dim, &hp->ssm.head_dim, e)) < 0) ||
        (rc = opt_int(cfg, k->d_state, k->def_d_state, &hp->ssm.d_state, e)) < 0 ||
        (rc = opt_int(cfg, k->n_group, k->def_n_group, &hp->ssm.n_group, e)) < 0 ||
        (rc = opt_int(cfg, k->d_conv, k->def_d_conv, &hp->ssm.d_conv, e)) < 0 ||
        (rc = opt_int(cfg, k->chunk, k->def_chunk, &hp->ssm.chunk, e)) < 0 ||
        (rc = opt_bool(cfg, k->conv_bias, k->def_conv_bias, &hp->ssm.conv_bias, e)) < 0 ||
        (rc = opt_bool(cfg, k->proj_bias, k->def_proj_bias, &hp->ssm.proj_bias, e)) < 0 ||
        (k->expand && (rc = cfg_opt_float(cfg, k->expand, k->def_expand, &expand, e)) < 0) ||
        (k->eps && (rc = cfg_opt_float(cfg, k->eps, k->def_eps, &hp->ssm.norm_eps, e)) < 0) ||
        (k->inner && cfg_has(cfg, k->inner) && (rc = cfg_int(cfg, k->inner, &inner, e)) < 0) ||
        (rc = cfg_opt_str(cfg, k->act ? k->act : "hidden_act", "silu", act, sizeof act, e)) < 0 ||
        (rc = parse_limit(hp, cfg, e)) < 0)
        return rc;
    if (!k->eps)
        hp->ssm.norm_eps = k->def_eps;
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "config field '%s' = '%s' is not supported (silu only)",
                        k->act ? k->act : "hidden_act", act);
    if (!inner) {
        double di = (double)expand * hp->n_embd;
        if (!(di >= 1.0 && di <= HP_MAX_DIM))
            return err_setf(e, ERR_CONFIG, "config field '%s' = %g gives an inner width out of "
                            "range", k->expand ? k->expand : "expand", (double)expand);
        inner = (int)di;
    }
    hp->ssm.d_inner = inner;
    if (hd_auto)
        hp->ssm.head_dim = hp->ssm.n_head > 0 ? inner / hp->ssm.n_head : 0;
    const char *kh = k->n_head ? k->n_head : "num_heads", *kp = k->head_dim ? k->head_dim : "head_dim";
    const char *kg = k->n_group ? k->n_group : "n_groups";
    if ((rc = hparams_check_dim(hp->ssm.n_head, kh, 1, HP_MAX_HEADS, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.head_dim, kp, 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.d_state, k->d_state ? k->d_state : "state_size", 1, 256,
                                e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.n_group, kg, 1, hp->ssm.n_head, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.d_conv, k->d_conv ? k->d_conv : "conv_kernel", 1, 64,
                                e)) < 0 ||
        (rc = hparams_check_dim(inner, k->inner ? k->inner : "expand * hidden_size", 1, HP_MAX_DIM,
                                e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.chunk, k->chunk ? k->chunk : "chunk_size", 1, HP_MAX_CTX,
                                e)) < 0)  /* transformers' chunked scan divides by it */
        return rc;
    if ((int64_t)hp->ssm.n_head * hp->ssm.head_dim != inner)
        return err_setf(e, ERR_CONFIG, "config fields '%s' x '%s' = %d x %d must equal the "
                        "mixer's inner width %d (%s)", kh, kp, hp->ssm.n_head, hp->ssm.head_dim,
                        inner, k->inner && cfg_has(cfg, k->inner) ? k->inner
                        : k->expand ? "expand x hidden_size" : "2 x hidden_size");
    if (hp->ssm.n_head % hp->ssm.n_group != 0)
        return err_setf(e, ERR_CONFIG, "config field '%s' = %d must divide '%s' = %d", kg,
                        hp->ssm.n_group, kh, hp->ssm.n_head);
    if (!(hp->ssm.norm_eps > 0.0f) || !isfinite(hp->ssm.norm_eps))
        return err_setf(e, ERR_CONFIG, "config field '%s' must be a positive number",
                        k->eps ? k->eps : "layer_norm_epsilon");
    /* the states per sequence: the conv's last d_conv - 1 inputs of x | B | C, and
     * [n_head][head_dim][d_state] */
    int64_t cd = inner + 2 * (int64_t)hp->ssm.n_group * hp->ssm.d_state;
    int64_t sc = (hp->ssm.d_conv - 1) * cd, sr = (int64_t)inner * hp->ssm.d_state;
    if (sc > HP_MAX_STATE || sr > HP_MAX_STATE || cd > HP_MAX_DIM)
        return err_setf(e, ERR_CONFIG, "Mamba-2 state of %lld + %lld floats per sequence (from "
                        "'%s', '%s', '%s') exceeds %d", (long long)sc, (long long)sr, kh,
                        k->d_state ? k->d_state : "state_size", kg, HP_MAX_STATE);
    hp->ssm.norm_groups = k->norm_per_group ? hp->ssm.n_group : 1;
    return 0;
}

void ssm2_layer(struct hparams *hp, int il)
{
    struct layer_spec *ls = &hp->layer[il];
    int cd = hp->ssm.d_inner + 2 * hp->ssm.n_group * hp->ssm.d_state;
    ls->mixer = MIXER_MAMBA2;
    ls->kv = KV_RECURRENT;
    ls->n_rot = 0;
    ls->state_conv = (hp->ssm.d_conv - 1) * cd;
    ls->state_rec = hp->ssm.d_inner * hp->ssm.d_state;
    int need = blk_mamba2_scratch(hp);
    if (hp->rec_scratch < need)
        hp->rec_scratch = need;
}

/* conv1d.weight as [ch, 1, K] (transformers) or [ch, K, 1] (mlx-lm's sanitize moves the
 * kernel axis), viewed as [ch, K]: the same memory order */
static int map_conv(struct wmap *w, struct tensor *t, const char *prefix, int64_t ch, int64_t K,
                    struct err *e)
{
    char name[320];
    snprintf(name, sizeof name, "%s.conv1d.weight", prefix);
    const struct st_tensor *st = st_set_find(w->st, name);
    bool mlx = st && st->ndim == 3 && K > 1 && st->shape[1] == K && st->shape[2] == 1;
    int64_t shape[3] = {ch, mlx ? K : 1, mlx ? 1 : K};
    int rc = wm_tensor(w, t, WM_REQUIRED, 3, shape, e, "%s", name);
    if (rc < 0)
        return rc;
    int64_t s2[2] = {ch, K};
    const char *nm = t->name;
    struct tensor v = *t;
    tensor_init(t, v.dtype, v.data, 2, s2);
    t->name = nm;
    return 0;
}

int ssm2_map(struct model *m, struct wmap *w, struct layer *L, const char *prefix,
             struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t di = hp->ssm.d_inner, H = hp->ssm.n_head, d = hp->n_embd;
    int64_t cd = di + 2 * (int64_t)hp->ssm.n_group * hp->ssm.d_state, proj = di + cd + H;
    bool pb = hp->ssm.proj_bias;
    int rc;
    if ((rc = wm_linear(w, &L->ssm_in, WM_REQUIRED, 0, proj, d, e, "%s.in_proj", prefix)) < 0 ||
        (pb && (rc = wm_vec(w, &L->ssm_in_b, WM_REQUIRED, proj, e, "%s.in_proj.bias", prefix)) < 0) ||
        (rc = map_conv(w, &L->ssm_conv, prefix, cd, hp->ssm.d_conv, e)) < 0 ||
        (hp->ssm.conv_bias &&
         (rc = wm_vec(w, &L->ssm_conv_b, WM_REQUIRED, cd, e, "%s.conv1d.bias", prefix)) < 0) ||
        (rc = wm_vec(w, &L->ssm_dt_b, WM_REQUIRED, H, e, "%s.dt_bias", prefix)) < 0 ||
        (rc = wm_vec(w, &L->ssm_a, WM_REQUIRED, H, e, "%s.A_log", prefix)) < 0 ||
        (rc = wm_vec(w, &L->ssm_d, WM_REQUIRED, H, e, "%s.D", prefix)) < 0 ||
        (!hp->ssm.norm_off &&
         (rc = wm_vec(w, &L->ssm_norm, WM_REQUIRED, di, e, "%s.norm.weight", prefix)) < 0) ||
        (rc = wm_linear(w, &L->ssm_out, WM_REQUIRED, 0, d, di, e, "%s.out_proj", prefix)) < 0 ||
        (pb && (rc = wm_vec(w, &L->ssm_out_b, WM_REQUIRED, d, e, "%s.out_proj.bias", prefix)) < 0))
        return rc;
    if ((rc = model_widen_f32(m, &L->ssm_conv, e)) < 0 ||
        (rc = model_widen_f32(m, &L->ssm_conv_b, e)) < 0 ||
        (rc = model_widen_f32(m, &L->ssm_dt_b, e)) < 0 ||
        (rc = model_widen_f32(m, &L->ssm_a, e)) < 0 || (rc = model_widen_f32(m, &L->ssm_d, e)) < 0)
        return rc;
    return 0;
}
