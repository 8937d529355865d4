/*
 * lora: loading mlx-lm and PEFT adapters into one canonical form, and adding their low-rank
 * products to the base's at run time (lora.h, ADR 0103).
 *
 * Loading reads adapter_config.json, then every tensor of the adapter's safetensors: its name
 * says the layer and the module (model.layers.N.<self_attn|mlp>.<proj>.<lora_a|lora_A.weight..>),
 * the module a slot of struct layer (lora_slot), and its shape must match that base tensor's
 * [out, in] and the configured rank. Values are widened to F32 and checked finite. Nothing is
 * accepted half: any tensor that does not fit fails the whole adapter, naming it.
 *
 * Applying composes existing backend ops (linear, mul, axpy) per targeted product and active
 * adapter; the per-row scales S [n_batch][r] of each adapter are staged per chunk.
 */
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../core/dtype.h"
#include "../core/fileio.h"
#include "../core/json.h"
#include "../core/safetensors.h"
#include "../loading/quant.h"
#include "blocks.h"

/* ---- slots ---- */

static const char *const k_slot_names[LORA_N_SLOTS] = {
    "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj",
    "down_proj",
};

const char *lora_slot_name(enum lora_slot s)
{
    return s >= 0 && s < LORA_N_SLOTS ? k_slot_names[s] : "?";
}

const struct tensor *lora_slot_tensor(const struct layer *L, enum lora_slot s)
{
    switch (s) {
    case LORA_WQ: return &L->wq;
    case LORA_WK: return &L->wk;
    case LORA_WV: return &L->wv;
    case LORA_WQKV: return &L->wqkv;
    case LORA_WO: return &L->wo;
    case LORA_GATE: return &L->gate;
    case LORA_UP: return &L->up;
    case LORA_GATE_UP: return &L->gate_up;
    case LORA_DOWN: return &L->down;
    default: return NULL;
    }
}

static int slot_of_name(const char *s, size_t len)
{
    for (int i = 0; i < LORA_N_SLOTS; i++)
        if (strlen(k_slot_names[i]) == len && memcmp(k_slot_names[i], s, len) == 0)
            return i;
    return -1;
}

static bool slot_is_attention(int s)
{
    return s <= LORA_WO;
}

/* ---- config ---- */

struct lora_cfg {
    bool mlx;
    int rank;
    float scale;
    int first_layer;             /* mlx num_layers: the adapted layers are [first_layer, n_layer) */
};

static int cfg_number(const cJSON *o, const char *key, const char *path, double *v, struct err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it)
        return err_setf(e, ERR_CONFIG, "%s: missing field '%s'", path, key);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return err_setf(e, ERR_CONFIG, "%s: '%s' is not a finite number", path, key);
    *v = it->valuedouble;
    return 0;
}

static int cfg_rank(double r, const char *path, const char *key, struct err *e)
{
    if (r != floor(r) || r < 1 || r > LORA_MAX_RANK)
        return err_setf(e, ERR_CONFIG, "%s: '%s' is %g, expected an integer in [1, %d]", path, key,
                        r, LORA_MAX_RANK);
    return 0;
}

/* A target module name ("q_proj", or mlx's "self_attn.q_proj") is one of the slots. */
static int check_target(const char *t, const char *path, struct err *e)
{
    const char *dot = strrchr(t, '.');
    const char *leaf = dot ? dot + 1 : t;
    if (slot_of_name(leaf, strlen(leaf)) < 0)
        return err_setf(e, ERR_UNSUPPORTED,
                        "%s: unsupported target module '%s' (adapters may target q_proj, k_proj, "
                        "v_proj, qkv_proj, o_proj, gate_proj, up_proj, gate_up_proj, down_proj)",
                        path, t);
    return 0;
}

static int cfg_targets(const cJSON *list, const char *path, const char *key, struct err *e)
{
    if (!list || cJSON_IsNull(list) || cJSON_IsString(list)) /* PEFT's regex form: names decide */
        return 0;
    if (!cJSON_IsArray(list))
        return err_setf(e, ERR_CONFIG, "%s: '%s' is not a list of module names", path, key);
    const cJSON *it;
    int rc;
    cJSON_ArrayForEach(it, list) {
        if (!cJSON_IsString(it))
            return err_setf(e, ERR_CONFIG, "%s: '%s' holds a value that is not a string", path, key);
        if ((rc = check_target(it->valuestring, path, e)) < 0)
            return rc;
    }
    return 0;
}

static bool json_true(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

/* A field that must be absent, null, empty or false for the adapter to mean plain LoRA. */
static bool json_set(const cJSON *o, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it || cJSON_IsNull(it) || cJSON_IsFalse(it))
        return false;
    if ((cJSON_IsObject(it) || cJSON_IsArray(it)) && !it->child)
        return false;
    return true;
}

static int parse_mlx(struct lora_cfg *c, const cJSON *j, const char *path, int n_layer,
                     struct err *e)
{
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(j, "fine_tune_type");
    const char *type = cJSON_IsString(ft) ? ft->valuestring : "lora";
    if (ft && !cJSON_IsString(ft))
        return err_setf(e, ERR_CONFIG, "%s: 'fine_tune_type' is not a string", path);
    if (strcmp(type, "dora") == 0)
        return err_setf(e, ERR_UNSUPPORTED, "%s: fine_tune_type 'dora': DoRA adapters are not "
                        "supported (LoRA only)", path);
    if (strcmp(type, "lora") != 0)
        return err_setf(e, ERR_UNSUPPORTED, "%s: fine_tune_type '%s' is not an adapter (only "
                        "'lora' is)", path, type);
    double nl, r, s;
    int rc;
    if ((rc = cfg_number(j, "num_layers", path, &nl, e)) < 0)
        return rc;
    if (nl != floor(nl) || fabs(nl) > 1e9)
        return err_setf(e, ERR_CONFIG, "%s: 'num_layers' is %g, not an integer", path, nl);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(j, "lora_parameters");
    if (!cJSON_IsObject(lp))
        return err_setf(e, ERR_CONFIG, "%s: missing field 'lora_parameters' (an object)", path);
    if ((rc = cfg_number(lp, "rank", path, &r, e)) < 0 || (rc = cfg_rank(r, path, "rank", e)) < 0 ||
        (rc = cfg_number(lp, "scale", path, &s, e)) < 0)
        return rc;
    if (fabs(s) > 1e6)
        return err_setf(e, ERR_CONFIG, "%s: lora_parameters.scale %g is out of [-1e6, 1e6]", path, s);
    if ((rc = cfg_targets(cJSON_GetObjectItemCaseSensitive(lp, "keys"), path,
                          "lora_parameters.keys", e)) < 0)
        return rc;
    c->mlx = true;
    c->rank = (int)r;
    c->scale = (float)s;
    /* mlx-lm converts model.layers[-max(num_layers, 0):]: 0 (and below) means every layer */
    c->first_layer = nl <= 0 || nl >= n_layer ? 0 : n_layer - (int)nl;
    return 0;
}

static int parse_peft(struct lora_cfg *c, const cJSON *j, const char *path, struct err *e)
{
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (pt && (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0))
        return err_setf(e, ERR_UNSUPPORTED, "%s: peft_type %s is not LORA", path,
                        cJSON_IsString(pt) ? pt->valuestring : "(not a string)");
    if (json_true(j, "use_dora"))
        return err_setf(e, ERR_UNSUPPORTED, "%s: use_dora: DoRA adapters are not supported "
                        "(LoRA only)", path);
    if (json_true(j, "fan_in_fan_out"))
        return err_setf(e, ERR_UNSUPPORTED, "%s: fan_in_fan_out (GPT-2 Conv1D layers) is not "
                        "supported", path);
    /* anything but plain LoRA on whole linears: per-module ranks, extra trained modules,
     * biases, parameter (expert) targets, aLoRA, QA-LoRA, Arrow routing (peft 0.21's fields) */
    static const char *const refused[] = {"rank_pattern", "alpha_pattern", "modules_to_save",
                                          "layer_replication", "trainable_token_indices",
                                          "lora_bias", "target_parameters",
                                          "alora_invocation_tokens", "use_qalora", "use_bdlora",
                                          "arrow_config"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (json_set(j, refused[i]))
            return err_setf(e, ERR_UNSUPPORTED, "%s: '%s' is not supported", path, refused[i]);
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (bias && !cJSON_IsNull(bias) && (!cJSON_IsString(bias) || strcmp(bias->valuestring, "none")))
        return err_setf(e, ERR_UNSUPPORTED, "%s: bias '%s': adapters with bias terms are not "
                        "supported", path, cJSON_IsString(bias) ? bias->valuestring : "?");
    double r, alpha;
    int rc;
    if ((rc = cfg_number(j, "r", path, &r, e)) < 0 || (rc = cfg_rank(r, path, "r", e)) < 0 ||
        (rc = cfg_number(j, "lora_alpha", path, &alpha, e)) < 0)
        return rc;
    if (fabs(alpha) > 1e6)
        return err_setf(e, ERR_CONFIG, "%s: lora_alpha %g is out of [-1e6, 1e6]", path, alpha);
    if ((rc = cfg_targets(cJSON_GetObjectItemCaseSensitive(j, "target_modules"), path,
                          "target_modules", e)) < 0)
        return rc;
    c->mlx = false;
    c->rank = (int)r;
    /* peft LoraLayer.update_layer: scaling = lora_alpha / sqrt(r) with use_rslora, else / r */
    c->scale = (float)(json_true(j, "use_rslora") ? alpha / sqrt(r) : alpha / r);
    c->first_layer = 0;
    return 0;
}

/* ---- tensors ---- */

/* Split an adapter tensor name into layer, slot and which matrix (0: A, 1: B). */
static int parse_name(const char *name, bool mlx, int *il, int *slot, int *ab, struct err *e,
                      const char *file)
{
    const char *p = name;
    if (!mlx) {
        if (strncmp(p, "base_model.model.", 17) != 0)
            return err_setf(e, ERR_FORMAT, "%s: tensor '%s' does not start with "
                            "'base_model.model.' (PEFT's prefix)", file, name);
        p += 17;
    }
    if (strncmp(p, "model.layers.", 13) != 0)
        goto unsupported;
    p += 13;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l > 100000)
        goto unsupported;
    p = end + 1;
    if (strncmp(p, "self_attn.", 10) == 0)
        p += 10;
    else if (strncmp(p, "mlp.", 4) == 0)
        p += 4;
    else
        goto unsupported;
    const char *dot = strchr(p, '.');
    if (!dot)
        goto unsupported;
    int s = slot_of_name(p, (size_t)(dot - p));
    const char *suf = dot + 1;
    if (strstr(suf, "magnitude") || (mlx && strcmp(suf, "m") == 0))
        return err_setf(e, ERR_UNSUPPORTED, "%s: tensor '%s' is DoRA's magnitude: DoRA adapters "
                        "are not supported", file, name);
    if (s < 0)
        goto unsupported;
    if (mlx ? strcmp(suf, "lora_a") == 0 : strcmp(suf, "lora_A.weight") == 0)
        *ab = 0;
    else if (mlx ? strcmp(suf, "lora_b") == 0 : strcmp(suf, "lora_B.weight") == 0)
        *ab = 1;
    else
        goto unsupported;
    *il = (int)l;
    *slot = s;
    return 0;
unsupported:
    return err_setf(e, ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA matrix of a supported "
                    "module (model.layers.N.<self_attn|mlp>.<q|k|v|qkv|o|gate|up|gate_up|down>_proj)",
                    file, name);
}

/* Whether layer il of m runs slot s through blocks.c's products (lora_apply's seams). */
static int check_layer_slot(const struct model *m, int il, int s, const char *file,
                            const char *name, int64_t *out, int64_t *in, struct err *e)
{
    const struct layer_spec *ls = &m->hp.layer[il];
    const struct layer *L = &m->layers[il];
    if (slot_is_attention(s)) {
        if (ls->mixer != MIXER_ATTENTION || ls->kv == KV_LATENT || ls->kv == KV_RECURRENT)
            return err_setf(e, ERR_UNSUPPORTED, "%s: tensor '%s': layer %d has no standard "
                            "attention (latent or recurrent) for %s", file, name, il,
                            lora_slot_name(s));
    } else if (ls->moe || (ls->ffn != FFN_GLU && ls->ffn != FFN_MLP) ||
               tensor_is_present(&L->gate_b)) {
        return err_setf(e, ERR_UNSUPPORTED, "%s: tensor '%s': layer %d's FFN (experts or a "
                        "biased / clamped GLU) does not take adapters", file, name, il);
    }
    const struct tensor *w = lora_slot_tensor(L, s);
    if (!tensor_is_present(w) || w->ndim != 2)
        return err_setf(e, ERR_MISSING, "%s: tensor '%s': the base model has no %s in layer %d",
                        file, name, lora_slot_name(s), il);
    *out = w->shape[0];
    *in = w->shape[1];
    return 0;
}

static int adapter_files(const char *path, char *cfg, char *st, size_t cap, struct err *e)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return err_setf(e, ERR_IO, "lora adapter %s: no such file or folder", path);
    char dir[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        snprintf(dir, sizeof dir, "%s", path);
        char *sl = strrchr(dir, '/');
        if (sl)
            *sl = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    if ((size_t)snprintf(cfg, cap, "%s/adapter_config.json", dir) >= cap)
        return err_setf(e, ERR_ARG, "lora adapter path is too long");
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(st, cap, "%s", path);
        return 0;
    }
    static const char *const names[] = {"adapters.safetensors", "adapter_model.safetensors"};
    for (int i = 0; i < 2; i++) {
        if ((size_t)snprintf(st, cap, "%s/%s", dir, names[i]) >= cap)
            return err_setf(e, ERR_ARG, "lora adapter path is too long");
        if (stat(st, &sb) == 0)
            return 0;
    }
    return err_setf(e, ERR_MISSING, "lora adapter %s: neither adapters.safetensors (mlx-lm) nor "
                    "adapter_model.safetensors (PEFT) is there", path);
}

/* Shape [r, in] / [out, r] (canonical) of tensor t per layout, checked against the base. */
static int check_shape(const struct st_tensor *t, bool mlx, int ab, int rank, int64_t out,
                       int64_t in, const char *file, struct err *e)
{
    if (t->ndim != 2)
        return err_setf(e, ERR_FORMAT, "%s: tensor '%s' has %d dims, expected 2", file, t->name,
                        t->ndim);
    if (t->dtype != DTYPE_F32 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_BF16)
        return err_setf(e, ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 "
                        "expected)", file, t->name, dtype_name(t->dtype));
    /* canonical: A [rank, in], B [out, rank]; mlx stores both transposed */
    int64_t want0 = ab == 0 ? rank : out, want1 = ab == 0 ? in : rank;
    int64_t got0 = mlx ? t->shape[1] : t->shape[0], got1 = mlx ? t->shape[0] : t->shape[1];
    if (got0 != want0 || got1 != want1) {
        if (mlx)
            return err_setf(e, ERR_FORMAT, "%s: tensor '%s' is [%lld, %lld], expected [%lld, %lld] "
                            "(rank %d against the base's [%lld, %lld])", file, t->name,
                            (long long)t->shape[0], (long long)t->shape[1], (long long)want1,
                            (long long)want0, rank, (long long)out, (long long)in);
        return err_setf(e, ERR_FORMAT, "%s: tensor '%s' is [%lld, %lld], expected [%lld, %lld] "
                        "(rank %d against the base's [%lld, %lld])", file, t->name,
                        (long long)t->shape[0], (long long)t->shape[1], (long long)want0,
                        (long long)want1, rank, (long long)out, (long long)in);
    }
    return 0;
}

/* Widen t into dst in canonical layout (transposing mlx's), checking every value finite. */
static int widen(float *dst, const struct st_tensor *t, bool mlx, float *tmp, const char *file,
                 struct err *e)
{
    size_t r0 = (size_t)t->shape[0], r1 = (size_t)t->shape[1], n = r0 * r1;
    dtype_to_f32_ref(mlx ? tmp : dst, t->data, t->dtype, n);
    const float *src = mlx ? tmp : dst;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i]))
            return err_setf(e, ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g) at "
                            "element %zu", file, t->name, (double)src[i], i);
    if (mlx)
        for (size_t i = 0; i < r0; i++)
            for (size_t j = 0; j < r1; j++)
                dst[j * r0 + i] = tmp[i * r1 + j];
    return 0;
}

int lora_load(struct lora_adapter **out, const struct model *m, const char *path, struct err *e)
{
    char cfg_path[4096], st_path[4096];
    cJSON *j = NULL;
    struct st_set *st = NULL;
    struct lora_adapter *a = NULL;
    float *tmp = NULL;
    struct lora_cfg c = {0};
    int rc, n_layer = m->hp.n_layer;
    *out = NULL;
    if (m->ops->forward != decoder_forward || m->hp.encoder)
        return err_setf(e, ERR_UNSUPPORTED, "lora adapter %s: the %s family's forward does not "
                        "take adapters (decoder families only)", path, m->ops->family);
    if ((rc = adapter_files(path, cfg_path, st_path, sizeof cfg_path, e)) < 0 ||
        (rc = json_load_object(cfg_path, FILE_USER, LORA_CONFIG_MAX, &j, e)) < 0)
        return rc;
    bool mlx = cJSON_GetObjectItemCaseSensitive(j, "lora_parameters") ||
               cJSON_GetObjectItemCaseSensitive(j, "fine_tune_type");
    rc = mlx ? parse_mlx(&c, j, cfg_path, n_layer, e) : parse_peft(&c, j, cfg_path, e);
    cJSON_Delete(j);
    if (rc < 0)
        return rc;
    if ((rc = st_set_open_file(&st, st_path, e)) < 0)
        return rc;
    size_t n_t = st_set_count(st);
    a = calloc(1, sizeof *a);
    if (!a || !(a->d = calloc((size_t)n_layer * LORA_N_SLOTS, sizeof *a->d))) {
        rc = err_setf(e, ERR_NOMEM, "lora adapter: out of memory");
        goto fail;
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    a->format = c.mlx ? "mlx" : "peft";
    a->rank = c.rank;
    a->scale = c.scale;
    a->n_layer = n_layer;
    /* pass 1: names, shapes and sizes */
    size_t total = 0, most = 0;
    for (size_t i = 0; i < n_t; i++) {
        const struct st_tensor *t = st_set_at(st, i);
        int il, s, ab;
        int64_t o = 0, in = 0;
        if ((rc = parse_name(t->name, c.mlx, &il, &s, &ab, e, st_path)) < 0)
            goto fail;
        if (il >= n_layer) {
            rc = err_setf(e, ERR_FORMAT, "%s: tensor '%s' names layer %d of a %d-layer base",
                          st_path, t->name, il, n_layer);
            goto fail;
        }
        if (il < c.first_layer) {
            rc = err_setf(e, ERR_FORMAT, "%s: tensor '%s' is in layer %d, outside the last "
                          "num_layers (%d) layers", st_path, t->name, il, n_layer - c.first_layer);
            goto fail;
        }
        if ((rc = check_layer_slot(m, il, s, st_path, t->name, &o, &in, e)) < 0 ||
            (rc = check_shape(t, c.mlx, ab, c.rank, o, in, st_path, e)) < 0)
            goto fail;
        struct lora_delta *d = &a->d[(size_t)il * LORA_N_SLOTS + s];
        struct tensor *dt = ab == 0 ? &d->a : &d->b;
        if (dt->ndim) {
            rc = err_setf(e, ERR_FORMAT, "%s: tensor '%s' appears twice", st_path, t->name);
            goto fail;
        }
        int64_t shape[2] = {ab == 0 ? c.rank : o, ab == 0 ? in : c.rank};
        tensor_init(dt, DTYPE_F32, NULL, 2, shape);
        size_t ne = (size_t)shape[0] * (size_t)shape[1];
        most = ne > most ? ne : most;
    }
    /* every targeted linear has both matrices */
    for (int il = 0; il < n_layer; il++)
        for (int s = 0; s < LORA_N_SLOTS; s++) {
            struct lora_delta *d = &a->d[(size_t)il * LORA_N_SLOTS + s];
            if (!d->a.ndim && !d->b.ndim)
                continue;
            if (!d->a.ndim || !d->b.ndim) {
                rc = err_setf(e, ERR_MISSING, "%s: layer %d's %s has lora_%s but not lora_%s",
                              st_path, il, lora_slot_name(s), d->a.ndim ? "A" : "B",
                              d->a.ndim ? "B" : "A");
                goto fail;
            }
            total += (size_t)tensor_nelem(&d->a) + (size_t)tensor_nelem(&d->b);
            a->n_targets++;
            if (d->b.shape[0] > a->max_out)
                a->max_out = (int)d->b.shape[0];
        }
    if (a->n_targets == 0) {
        rc = err_setf(e, ERR_MISSING, "%s: no LoRA matrices in the adapter", st_path);
        goto fail;
    }
    a->store = malloc(total * sizeof(float));
    tmp = malloc(most * sizeof(float));
    if (!a->store || !tmp) {
        rc = err_setf(e, ERR_NOMEM, "lora adapter: out of memory (%zu floats)", total);
        goto fail;
    }
    /* pass 2: values */
    size_t at = 0;
    for (int il = 0; il < n_layer; il++)
        for (int s = 0; s < LORA_N_SLOTS; s++) {
            struct lora_delta *d = &a->d[(size_t)il * LORA_N_SLOTS + s];
            if (!d->a.ndim)
                continue;
            d->a.data = a->store + at;
            at += (size_t)tensor_nelem(&d->a);
            d->b.data = a->store + at;
            at += (size_t)tensor_nelem(&d->b);
        }
    for (size_t i = 0; i < n_t; i++) {
        const struct st_tensor *t = st_set_at(st, i);
        int il, s, ab;
        parse_name(t->name, c.mlx, &il, &s, &ab, e, st_path);
        struct lora_delta *d = &a->d[(size_t)il * LORA_N_SLOTS + s];
        if ((rc = widen((ab == 0 ? d->a : d->b).data, t, c.mlx, tmp, st_path, e)) < 0)
            goto fail;
    }
    free(tmp);
    st_set_free(st);
    *out = a;
    return 0;
fail:
    free(tmp);
    st_set_free(st);
    lora_free(a);
    return rc;
}

void lora_free(struct lora_adapter *a)
{
    if (!a)
        return;
    free(a->store);
    free(a->d);
    free(a);
}

int lora_prepare(struct lora_adapter *a, struct backend *be, struct err *e)
{
    int rc;
    for (size_t i = 0; i < (size_t)a->n_layer * LORA_N_SLOTS; i++) {
        struct lora_delta *d = &a->d[i];
        if (!d->a.ndim)
            continue;
        if ((rc = be->ops->prepare_weight(be, &d->a, PREP_MATRIX, e)) < 0 ||
            (rc = be->ops->prepare_weight(be, &d->b, PREP_MATRIX, e)) < 0)
            return err_prefix(e, "lora adapter %s", a->path);
    }
    return 0;
}

void lora_merge_into(const struct lora_delta *d, float scale, float *w, int out, int in)
{
    const float *A = d->a.data, *B = d->b.data;
    int r = (int)d->a.shape[0];
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++)
                acc += (double)B[(size_t)o * r + k] * A[(size_t)k * in + i];
            w[(size_t)o * in + i] = (float)((double)w[(size_t)o * in + i] + scale * acc);
        }
}

/* ---- run time ---- */

struct lora_run {
    const struct layer *layers;  /* the model's, to find a product's layer */
    int n_batch, max_rank, max_out;
    int n_ad;
    struct lora_adapter *ad[LORA_MAX_ADAPTERS];  /* borrowed */
    float *t;                    /* backend [n_batch][max_rank] */
    float *u;                    /* backend [n_batch][max_out] */
    float *s;                    /* backend [n_ad][n_batch][max_rank]: per-row scales */
    float *s_host;               /* [n_batch][max_rank] staging */
    float global[LORA_MAX_ADAPTERS]; /* scales of rows whose batch names none (user scale) */
    int n_active;
    int active[LORA_MAX_ADAPTERS];
};

void lora_run_free(struct lora_run *r, struct backend *be)
{
    if (!r)
        return;
    if (r->t)
        be->ops->buf_free(be, r->t);
    free(r->s_host);
    free(r);
}

int model_ctx_set_lora(struct model_ctx *c, struct lora_adapter *const *ad, int n, struct err *e)
{
    if (n < 0 || n > LORA_MAX_ADAPTERS)
        return err_setf(e, ERR_ARG, "lora: %d adapters (at most %d)", n, LORA_MAX_ADAPTERS);
    if (c->tp && n > 0)
        return err_setf(e, ERR_UNSUPPORTED, "lora: adapters on a tensor-parallel model are not split yet");
    lora_run_free(c->lora, c->be);
    c->lora = NULL;
    c->bufs.lora = NULL;
    if (n == 0)
        return 0;
    struct lora_run *r = calloc(1, sizeof *r);
    if (!r)
        return err_setf(e, ERR_NOMEM, "lora: out of memory");
    r->layers = c->m->layers;
    r->n_batch = c->n_batch;
    r->n_ad = n;
    for (int i = 0; i < n; i++) {
        if (ad[i]->n_layer != c->m->hp.n_layer) {
            free(r);
            return err_setf(e, ERR_ARG, "lora adapter %s was loaded for another model", ad[i]->path);
        }
        r->ad[i] = ad[i];
        r->global[i] = 1.0f;
        r->max_rank = ad[i]->rank > r->max_rank ? ad[i]->rank : r->max_rank;
        r->max_out = ad[i]->max_out > r->max_out ? ad[i]->max_out : r->max_out;
    }
    size_t B = (size_t)c->n_batch, R = (size_t)r->max_rank;
    size_t floats = B * R + B * (size_t)r->max_out + (size_t)n * B * R;
    int rc;
    r->s_host = malloc(B * R * sizeof(float));
    if (!r->s_host) {
        lora_run_free(r, c->be);
        return err_setf(e, ERR_NOMEM, "lora: out of memory");
    }
    if ((rc = c->be->ops->buf_alloc(c->be, floats * sizeof(float), (void **)&r->t, e)) < 0) {
        lora_run_free(r, c->be);
        return err_prefix(e, "lora scratch");
    }
    r->u = r->t + B * R;
    r->s = r->u + B * (size_t)r->max_out;
    c->lora = r;
    return 0;
}

int model_ctx_n_lora(const struct model_ctx *c)
{
    return c->lora ? c->lora->n_ad : 0;
}

int model_ctx_set_lora_scales(struct model_ctx *c, const float *scale, int n, struct err *e)
{
    if (n != model_ctx_n_lora(c))
        return err_setf(e, ERR_ARG, "lora: %d scales for %d adapters", n, model_ctx_n_lora(c));
    for (int i = 0; i < n; i++)
        if (!isfinite(scale[i]) || fabsf(scale[i]) > LORA_MAX_SCALE)
            return err_setf(e, ERR_RANGE, "lora: adapter %d's scale %g is not in [-%g, %g]", i,
                            (double)scale[i], (double)LORA_MAX_SCALE, (double)LORA_MAX_SCALE);
    for (int i = 0; i < n; i++)
        c->lora->global[i] = scale[i];
    return 0;
}

float model_ctx_lora_scale(const struct model_ctx *c, int i)
{
    return c->lora && i >= 0 && i < c->lora->n_ad ? c->lora->global[i] : 0.0f;
}

bool lora_stage(struct lora_run *r, struct backend *be, const int32_t *seq, int n,
                const float *scale, int n_lora)
{
    if (!r)
        return false;
    r->n_active = 0;
    size_t stride = (size_t)n_lora;
    if (!scale || n_lora <= 0) {
        scale = r->global; /* every row at the context's scales */
        stride = 0;
        n_lora = r->n_ad;
    }
    int n_ad = n_lora < r->n_ad ? n_lora : r->n_ad;
    for (int a = 0; a < n_ad; a++) {
        int R = r->ad[a]->rank;
        bool any = false;
        for (int i = 0; i < n; i++) {
            float v = scale[(size_t)seq[i] * stride + a];
            v = isfinite(v) ? v * r->ad[a]->scale : 0.0f;
            any |= v != 0.0f;
            for (int j = 0; j < R; j++)
                r->s_host[(size_t)i * R + j] = v;
        }
        if (!any)
            continue;
        be->ops->upload(be, r->s + (size_t)a * r->n_batch * r->max_rank, r->s_host,
                        (size_t)n * R * sizeof(float));
        r->active[r->n_active++] = a;
    }
    return r->n_active > 0;
}

void lora_apply(struct backend *be, const struct lora_run *r, float *y, int ldy, const float *x,
                const struct layer *L, const struct tensor *w, int n)
{
    if (!r || r->n_active == 0)
        return;
    int il = (int)(L - r->layers), slot = -1;
    for (int s = 0; s < LORA_N_SLOTS; s++)
        if (lora_slot_tensor(L, s) == w)
            slot = s;
    if (slot < 0 || il < 0)
        return;
    const struct backend_ops *op = be->ops;
    for (int k = 0; k < r->n_active; k++) {
        const struct lora_adapter *ad = r->ad[r->active[k]];
        const struct lora_delta *d = &ad->d[(size_t)il * LORA_N_SLOTS + slot];
        if (!d->a.ndim)
            continue;
        int R = ad->rank, out = (int)d->b.shape[0];
        const float *S = r->s + (size_t)r->active[k] * r->n_batch * r->max_rank;
        /* t = x Aᵀ; t *= the rows' scales; y += t Bᵀ */
        op->linear(be, r->t, R, x, &d->a, NULL, n);
        op->mul(be, r->t, R, r->t, R, S, R, n, R);
        op->linear(be, r->u, out, r->t, &d->b, NULL, n);
        op->axpy(be, y, ldy, 1.0f, r->u, out, n, out);
    }
}

/* ---- fusing (convert --fuse-lora) ---- */

struct lora_fused {
    size_t n;
    const char **name;           /* the base tensors' checkpoint names (borrowed from m) */
    float **w;                   /* merged [out * in], owned */
};

void lora_fused_free(struct lora_fused *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->w[i]);
    free(f->w);
    free(f->name);
    free(f);
}

/* An element of an affine-quantized row: code j of the little-endian bitstream row (MLX's
 * packing, as kern_qcode reads it) times its group's scale plus its bias. */
static float dequant_affine(const struct tensor *w, const uint8_t *row, const uint8_t *sc,
                            const uint8_t *bi, int64_t j)
{
    size_t o = (size_t)j * (size_t)w->qbits, g = (size_t)(j / w->qgroup);
    unsigned v = row[o >> 3];
    if ((o & 7) + (size_t)w->qbits > 8)
        v |= (unsigned)row[(o >> 3) + 1] << 8;
    unsigned q = (v >> (o & 7)) & ((1u << w->qbits) - 1);
    float s, b;
    size_t esz = dtype_size(w->qsdtype);
    dtype_to_f32_ref(&s, sc + g * esz, w->qsdtype, 1);
    dtype_to_f32_ref(&b, bi + g * esz, w->qsdtype, 1);
    return s * (float)q + b;
}

/* Base tensor w widened into v [out * in]: a float's values, or (mlx-lm fuse's first step for
 * a quantized base) an affine-quantized one's dequantized values. */
static int widen_base(float *v, const struct tensor *w, const struct st_tensor *src, struct err *e)
{
    int64_t out = w->shape[0], in = w->shape[1];
    if (!w->qbits) {
        dtype_to_f32_ref(v, src->data, src->dtype, (size_t)(out * in));
        return 0;
    }
    if (w->qmode != QMODE_AFFINE || !w->qbiases || w->packed)
        return err_setf(e, ERR_UNSUPPORTED, "--fuse-lora: base tensor '%s' is quantized in mode %s: "
                        "only affine bases are dequantized", w->name, qmode_name(w->qmode));
    size_t rw = (size_t)tensor_row_storage(w) * sizeof(uint32_t);
    size_t rs = (size_t)(in / w->qgroup) * dtype_size(w->qsdtype);
    for (int64_t r = 0; r < out; r++)
        for (int64_t j = 0; j < in; j++)
            v[r * in + j] = dequant_affine(w, (const uint8_t *)w->data + (size_t)r * rw,
                                           (const uint8_t *)w->qscales + (size_t)r * rs,
                                           (const uint8_t *)w->qbiases + (size_t)r * rs, j);
    return 0;
}

/* The merged F32 copy of base tensor w, made once (the first adapter targeting it). */
static int fused_slot(struct lora_fused *f, const struct model *m, const struct tensor *w,
                      float **out, struct err *e)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->name[i], w->name) == 0) {
            *out = f->w[i];
            return 0;
        }
    const struct st_tensor *src = st_set_find(m->st, w->name);
    int64_t cols = w->qbits ? w->shape[1] * w->qbits / 32 : w->shape[1];
    if (!src || src->ndim != 2 || src->shape[0] != w->shape[0] || src->shape[1] != cols ||
        src->data != w->data || !tensor_is_contiguous(w))
        return err_setf(e, ERR_UNSUPPORTED, "--fuse-lora: base tensor '%s' is rearranged at load: "
                        "only checkpoints whose stored tensor is the product's weight are fused",
                        w->name ? w->name : "?");
    size_t ne = (size_t)w->shape[0] * (size_t)w->shape[1];
    float *v = malloc(ne * sizeof *v);
    const char **nn = realloc(f->name, (f->n + 1) * sizeof *nn);
    if (nn)
        f->name = nn;
    float **nw = nn ? realloc(f->w, (f->n + 1) * sizeof *nw) : NULL;
    if (nw)
        f->w = nw;
    if (!v || !nn || !nw) {
        free(v);
        return err_setf(e, ERR_NOMEM, "--fuse-lora: out of memory");
    }
    int rc = widen_base(v, w, src, e);
    if (rc < 0) {
        free(v);
        return rc;
    }
    f->name[f->n] = w->name;
    f->w[f->n++] = v;
    *out = v;
    return 0;
}

int lora_fused_new(struct lora_fused **out, const struct model *m, struct lora_adapter *const *ad,
                   const float *scale, int n, struct err *e)
{
    struct lora_fused *f = calloc(1, sizeof *f);
    int rc;
    *out = NULL;
    if (!f)
        return err_setf(e, ERR_NOMEM, "--fuse-lora: out of memory");
    for (int k = 0; k < n; k++)
        for (int il = 0; il < ad[k]->n_layer; il++)
            for (int s = 0; s < LORA_N_SLOTS; s++) {
                const struct lora_delta *d = &ad[k]->d[(size_t)il * LORA_N_SLOTS + s];
                if (!d->a.ndim)
                    continue;
                const struct tensor *w = lora_slot_tensor(&m->layers[il], s);
                float *v = NULL;
                if ((rc = fused_slot(f, m, w, &v, e)) < 0) {
                    lora_fused_free(f);
                    return rc;
                }
                lora_merge_into(d, scale[k] * ad[k]->scale, v, (int)w->shape[0], (int)w->shape[1]);
            }
    *out = f;
    return 0;
}

const float *lora_fused_find(void *ud, const char *name)
{
    const struct lora_fused *f = ud;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->name[i], name) == 0)
            return f->w[i];
    return NULL;
}
