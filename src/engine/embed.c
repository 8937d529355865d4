/*
 * embed: sentence-transformers' modules around an encoder (embed.h): reading the folder's
 * module list and configs, then pooling, Dense layers and normalization per sequence, and a
 * cross-encoder's activation. Everything here runs on the host in double: it is a few
 * vectors per sequence.
 *
 * Cross-encoder scores follow CrossEncoder's get_default_activation_fn: an activation_fn
 * stated by the checkpoint (config.json "sentence_transformers": {"activation_fn": ...}, the
 * older "sbert_ce_default_activation_function", or config_sentence_transformers.json's
 * "activation_fn") is used when it is torch's Sigmoid, Identity or Tanh; otherwise sigmoid
 * for a single label and the raw logit for more.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/dtype.h"
#include "../core/fileio.h"
#include "../core/safetensors.h"
#include "../loading/config.h"
#include "embed.h"

#define EMB_MAX_PROMPT_BYTES 4096

/* Whether the class path s ends with the class name cls ("...models.Pooling"). */
static bool ends_with_class(const char *s, const char *cls)
{
    size_t n = strlen(s), k = strlen(cls);
    return n >= k && strcmp(s + n - k, cls) == 0 && (n == k || s[n - k - 1] == '.');
}

/* A JSON file of dir/sub/name, or *out = NULL when it does not exist. */
static int load_opt(const char *dir, const char *sub, const char *name, cJSON **out, struct err *e)
{
    char path[4096 + 256];
    *out = NULL;
    if (snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, *sub ? "/" : "", name) >= (int)sizeof path)
        return err_setf(e, ERR_ARG, "path too long: %s/%s", dir, sub);
    int rc = cfg_load_file(path, FILE_FOLDER, out, e);
    if (rc == -ERR_MISSING) {
        err_clear(e);
        return 0;
    }
    return rc;
}

/* torch activation class path -> enum emb_act */
static int parse_act(const char *s, enum emb_act *out, const char *where, struct err *e)
{
    if (ends_with_class(s, "Identity"))
        *out = EMB_ACT_IDENTITY;
    else if (ends_with_class(s, "Sigmoid"))
        *out = EMB_ACT_SIGMOID;
    else if (ends_with_class(s, "Tanh"))
        *out = EMB_ACT_TANH;
    else
        return err_setf(e, ERR_UNSUPPORTED, "%s: activation '%s' is not supported (Identity, "
                        "Sigmoid, Tanh)", where, s);
    return 0;
}

// ---- modules ----

/* A pooling mode's name (ST's POOLING_MODES) -> enum emb_pool, 0 when unknown. */
static enum emb_pool pool_mode(const char *s)
{
    static const struct { const char *name; enum emb_pool mode; } k[] = {
        {"cls", EMB_POOL_CLS}, {"max", EMB_POOL_MAX}, {"mean", EMB_POOL_MEAN},
        {"mean_sqrt_len_tokens", EMB_POOL_MEAN_SQRT}, {"weightedmean", EMB_POOL_WEIGHTED_MEAN},
        {"lasttoken", EMB_POOL_LAST},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(s, k[i].name) == 0)
            return k[i].mode;
    return (enum emb_pool)0;
}

/* pooling_mode (a string or a list), else the legacy booleans (ST's
 * _convert_legacy_pooling_kwargs: their order, none set -> mean). */
static int pool_modes(struct emb_config *c, const cJSON *j, const char *sub, struct err *e)
{
    static const struct { const char *key; enum emb_pool mode; } legacy[] = {
        {"pooling_mode_cls_token", EMB_POOL_CLS}, {"pooling_mode_max_tokens", EMB_POOL_MAX},
        {"pooling_mode_mean_tokens", EMB_POOL_MEAN}, {"pooling_mode_mean_sqrt_len_tokens", EMB_POOL_MEAN_SQRT},
        {"pooling_mode_weightedmean_tokens", EMB_POOL_WEIGHTED_MEAN}, {"pooling_mode_lasttoken", EMB_POOL_LAST},
    };
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(j, "pooling_mode"), *it;
    int rc;
    bool on;
    c->n_pool = 0;
    if (pm && !cJSON_IsNull(pm)) {
        int n = cJSON_IsString(pm) ? 1 : cJSON_IsArray(pm) ? cJSON_GetArraySize(pm) : 0;
        if (n < 1 || n > EMB_MAX_POOL)
            return err_setf(e, ERR_CONFIG, "%s/config.json: pooling_mode must be a mode or a list of 1 to "
                            "%d modes", sub, EMB_MAX_POOL);
        for (int i = 0; i < n; i++) {
            it = cJSON_IsString(pm) ? pm : cJSON_GetArrayItem(pm, i);
            enum emb_pool m = cJSON_IsString(it) ? pool_mode(it->valuestring) : (enum emb_pool)0;
            if (!m)
                return err_setf(e, ERR_CONFIG, "%s/config.json: pooling_mode %d is not one of cls, max, "
                                "mean, mean_sqrt_len_tokens, weightedmean, lasttoken", sub, i);
            c->pool[c->n_pool++] = m;
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        if ((rc = cfg_opt_bool(j, legacy[i].key, false, &on, e)) < 0)
            return rc;
        if (on)
            c->pool[c->n_pool++] = legacy[i].mode;
    }
    if (c->n_pool == 0)
        c->pool[c->n_pool++] = EMB_POOL_MEAN;
    return 0;
}

static int load_pooling(struct emb_config *c, const char *dir, const char *sub,
                        const struct hparams *hp, struct err *e)
{
    cJSON *j;
    int rc, wdim;
    if ((rc = load_opt(dir, sub, "config.json", &j, e)) < 0)
        return rc;
    if (!j)
        return err_setf(e, ERR_MISSING, "%s/%s/config.json: the Pooling module's config is missing",
                        dir, sub);
    /* embedding_dimension (sentence-transformers 6), word_embedding_dimension before */
    const char *dkey = cfg_has(j, "embedding_dimension") ? "embedding_dimension" : "word_embedding_dimension";
    if ((rc = pool_modes(c, j, sub, e)) < 0 ||
        (rc = cfg_opt_bool(j, "include_prompt", true, &c->include_prompt, e)) < 0 ||
        (rc = cfg_opt_int(j, dkey, hp->n_embd, &wdim, e)) < 0)
        goto out;
    if (wdim != hp->n_embd)
        rc = err_setf(e, ERR_CONFIG, "%s/config.json: %s %d is not the model's hidden_size %d", sub, dkey,
                      wdim, hp->n_embd);
    else
        c->dim = c->n_pool * hp->n_embd;
out:
    cJSON_Delete(j);
    return rc;
}

/* A float tensor of st as n f32 values into a new buffer. */
static int dense_tensor(struct st_set *st, const char *name, int rows, int cols, float **out,
                        const char *sub, struct err *e)
{
    const struct st_tensor *t = st_set_find(st, name);
    if (!t)
        return err_setf(e, ERR_MISSING, "%s/model.safetensors: tensor '%s' is missing", sub, name);
    int64_t want[2] = {rows, cols};
    int nd = cols > 0 ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1]))
        return err_setf(e, ERR_FORMAT, "%s/model.safetensors: tensor '%s' has the wrong shape "
                        "(expected [%d%s%d])", sub, name, rows, nd == 2 ? ", " : "", nd == 2 ? cols : 0);
    if (t->dtype != DTYPE_F32 && t->dtype != DTYPE_F16 && t->dtype != DTYPE_BF16)
        return err_setf(e, ERR_UNSUPPORTED, "%s/model.safetensors: tensor '%s' is not a float tensor",
                        sub, name);
    size_t n = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    if (!(*out = malloc(n * sizeof(float))))
        return err_setf(e, ERR_NOMEM, "out of memory reading %s", name);
    dtype_to_f32_ref(*out, t->data, t->dtype, n);
    return 0;
}

static int load_dense(struct emb_config *c, const char *dir, const char *sub, struct err *e)
{
    cJSON *j;
    char act[256], path[4096 + 256];
    struct st_set *st = NULL;
    bool bias, resid;
    int rc;
    if (c->n_dense == EMB_MAX_DENSE)
        return err_setf(e, ERR_UNSUPPORTED, "modules.json: more than %d Dense modules", EMB_MAX_DENSE);
    struct emb_dense *d = &c->dense[c->n_dense];
    if ((rc = load_opt(dir, sub, "config.json", &j, e)) < 0)
        return rc;
    if (!j)
        return err_setf(e, ERR_MISSING, "%s/%s/config.json: the Dense module's config is missing", dir, sub);
    if ((rc = cfg_int(j, "in_features", &d->n_in, e)) < 0 || (rc = cfg_int(j, "out_features", &d->n_out, e)) < 0 ||
        (rc = cfg_opt_bool(j, "bias", true, &bias, e)) < 0 ||
        (rc = cfg_opt_bool(j, "use_residual", false, &resid, e)) < 0 ||
        (rc = cfg_opt_str(j, "activation_function", "torch.nn.modules.activation.Tanh", act, sizeof act, e)) < 0)
        goto out;
    if (resid) {
        rc = err_setf(e, ERR_UNSUPPORTED, "%s/config.json: use_residual is not supported", sub);
        goto out;
    }
    if (d->n_in != c->dim || d->n_out < 1 || d->n_out > HP_MAX_DIM) {
        rc = err_setf(e, ERR_CONFIG, "%s/config.json: in_features %d / out_features %d do not follow "
                      "the previous module's %d", sub, d->n_in, d->n_out, c->dim);
        goto out;
    }
    if ((rc = parse_act(act, &d->act, sub, e)) < 0)
        goto out;
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
    if ((rc = st_set_open_file(&st, path, e)) < 0 ||
        (rc = dense_tensor(st, "linear.weight", d->n_out, d->n_in, &d->w, sub, e)) < 0 ||
        (bias && (rc = dense_tensor(st, "linear.bias", d->n_out, 0, &d->b, sub, e)) < 0))
        goto out;
    c->dim = d->n_out;
    c->n_dense++;
out:
    if (rc < 0 && c->n_dense < EMB_MAX_DENSE) {
        free(d->w);
        free(d->b);
        d->w = d->b = NULL;
    }
    st_set_free(st);
    cJSON_Delete(j);
    return rc;
}

/* One modules.json entry. */
static int load_module(struct emb_config *c, const char *dir, const cJSON *mod, int idx,
                       const struct hparams *hp, struct err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(mod, "type");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(mod, "path");
    if (!cJSON_IsString(type) || (path && !cJSON_IsString(path)))
        return err_setf(e, ERR_FORMAT, "modules.json: entry %d needs a string \"type\" and \"path\"", idx);
    const char *p = path ? path->valuestring : "", *t = type->valuestring;
    if (strstr(p, "..") || p[0] == '/')
        return err_setf(e, ERR_FORMAT, "modules.json: entry %d: path '%s' leaves the folder", idx, p);
    if (idx == 0)
        return ends_with_class(t, "Transformer") ? 0
               : err_setf(e, ERR_UNSUPPORTED, "modules.json: the first module is '%s', not a Transformer", t);
    if (ends_with_class(t, "Transformer"))
        return err_setf(e, ERR_UNSUPPORTED, "modules.json: a second Transformer (entry %d)", idx);
    if (c->normalize)
        return err_setf(e, ERR_UNSUPPORTED, "modules.json: module '%s' after Normalize", t);
    if (ends_with_class(t, "Pooling"))
        return c->dim ? err_setf(e, ERR_UNSUPPORTED, "modules.json: a second Pooling (entry %d)", idx)
                      : load_pooling(c, dir, p, hp, e);
    if (!c->dim)
        return err_setf(e, ERR_UNSUPPORTED, "modules.json: module '%s' before Pooling", t);
    if (ends_with_class(t, "Dense"))
        return load_dense(c, dir, p, e);
    if (ends_with_class(t, "Normalize")) {
        c->normalize = true;
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "modules.json: module '%s' (entry %d) is not supported "
                    "(Transformer, Pooling, Dense, Normalize)", t, idx);
}

static int load_modules(struct emb_config *c, const char *dir, const struct hparams *hp, struct err *e)
{
    char path[4096 + 32], *buf = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/modules.json", dir);
    int rc = file_read_scoped(path, FILE_FOLDER, CFG_MAX_BYTES, &buf, &len, e);
    if (rc == -ERR_MISSING) {   /* a plain transformers model: ST adds mean pooling */
        err_clear(e);
        c->pool[0] = EMB_POOL_MEAN;
        c->n_pool = 1;
        c->dim = hp->n_embd;
        return 0;
    }
    if (rc < 0)
        return rc;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) < 1 || cJSON_GetArraySize(j) > 16) {
        cJSON_Delete(j);
        return err_setf(e, ERR_FORMAT, "%s: must be a JSON list of 1 to 16 modules", path);
    }
    int idx = 0;
    const cJSON *mod;
    cJSON_ArrayForEach(mod, j)
        if ((rc = load_module(c, dir, mod, idx++, hp, e)) < 0)
            break;
    cJSON_Delete(j);
    if (rc == 0 && !c->dim) {   /* Transformer alone: token embeddings only */
        rc = err_setf(e, ERR_UNSUPPORTED, "%s: no Pooling module (token embeddings are not served)",
                      path);
    }
    return rc;
}

// ---- sentence-transformers' own configs ----

static int load_prompts(struct emb_config *c, const cJSON *st, struct err *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(st, "prompts"), *it;
    int rc;
    cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsString(it) || !it->string)
            return err_setf(e, ERR_FORMAT, "config_sentence_transformers.json: prompts must map names "
                            "to strings");
        if (c->n_prompts == EMB_MAX_PROMPTS || strlen(it->string) >= sizeof c->prompts[0].name ||
            strlen(it->valuestring) > EMB_MAX_PROMPT_BYTES)
            return err_setf(e, ERR_RANGE, "config_sentence_transformers.json: at most %d prompts of "
                            "names under 64 bytes and texts up to %d bytes", EMB_MAX_PROMPTS,
                            EMB_MAX_PROMPT_BYTES);
        struct emb_prompt *q = &c->prompts[c->n_prompts];
        snprintf(q->name, sizeof q->name, "%s", it->string);
        if (!(q->text = strdup(it->valuestring)))
            return err_setf(e, ERR_NOMEM, "out of memory");
        c->n_prompts++;
    }
    if ((rc = cfg_opt_str(st, "default_prompt_name", "", c->default_prompt, sizeof c->default_prompt,
                          e)) < 0)
        return rc;
    if (c->default_prompt[0] && !emb_prompt_find(c, c->default_prompt))
        return err_setf(e, ERR_CONFIG, "config_sentence_transformers.json: default_prompt_name '%s' "
                        "is not one of the prompts", c->default_prompt);
    return 0;
}

/* The cross-encoder activation (file comment). */
static int load_score_act(struct emb_config *c, const char *dir, const cJSON *st, const struct hparams *hp,
                          struct err *e)
{
    cJSON *cfg;
    char act[256] = "";
    int rc = load_opt(dir, "", "config.json", &cfg, e);
    if (rc < 0)
        return rc;
    const cJSON *s = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "sentence_transformers") : NULL;
    const cJSON *a = s ? cJSON_GetObjectItemCaseSensitive(s, "activation_fn") : NULL;
    if (!cJSON_IsString(a) && cfg)
        a = cJSON_GetObjectItemCaseSensitive(cfg, "sbert_ce_default_activation_function");
    if (!cJSON_IsString(a) && st)
        a = cJSON_GetObjectItemCaseSensitive(st, "activation_fn");
    if (cJSON_IsString(a))
        snprintf(act, sizeof act, "%s", a->valuestring);
    cJSON_Delete(cfg);
    if (act[0] && strncmp(act, "torch.", 6) == 0)
        return parse_act(act, &c->score_act, "the cross-encoder's activation_fn", e);
    c->score_act = hp->n_cls == 1 ? EMB_ACT_SIGMOID : EMB_ACT_IDENTITY;
    return 0;
}

/* The token limit: sentence_bert_config.json's max_seq_length (sentence-transformers before 6),
 * else tokenizer_config.json's model_max_length (where 6 keeps it, and CrossEncoder's
 * max_length); 0 when neither says (transformers writes 1e30 for "none"). */
static int load_max_len(struct emb_config *c, const char *dir, struct err *e)
{
    cJSON *sb = NULL, *tc = NULL;
    int rc;
    if ((rc = load_opt(dir, "", "sentence_bert_config.json", &sb, e)) < 0)
        return rc;
    if (sb && cfg_has(sb, "max_seq_length")) {
        rc = cfg_opt_int(sb, "max_seq_length", 0, &c->max_seq_length, e);
        if (rc == 0 && c->max_seq_length < 1)
            rc = err_setf(e, ERR_CONFIG, "sentence_bert_config.json: max_seq_length %d must be positive",
                          c->max_seq_length);
        goto out;
    }
    if ((rc = load_opt(dir, "", "tokenizer_config.json", &tc, e)) < 0)
        goto out;
    const cJSON *m = tc ? cJSON_GetObjectItemCaseSensitive(tc, "model_max_length") : NULL;
    if (cJSON_IsNumber(m) && m->valuedouble >= 1 && m->valuedouble <= HP_MAX_CTX)
        c->max_seq_length = (int)m->valuedouble;
out:
    cJSON_Delete(sb);
    cJSON_Delete(tc);
    return rc;
}

int emb_config_load(struct emb_config *c, const char *dir, const struct hparams *hp, struct err *e)
{
    cJSON *st = NULL;
    int rc;
    memset(c, 0, sizeof *c);
    c->include_prompt = true;
    if ((rc = load_opt(dir, "", "config_sentence_transformers.json", &st, e)) < 0)
        return rc;
    if (hp->n_cls > 0) {   /* a cross-encoder: no pooling modules, a score */
        c->dim = hp->n_cls;
        rc = load_score_act(c, dir, st, hp, e);
    } else if ((rc = load_modules(c, dir, hp, e)) == 0 && st) {
        rc = load_prompts(c, st, e);
    }
    if (rc == 0)
        rc = load_max_len(c, dir, e);
    cJSON_Delete(st);
    return rc;
}

void emb_config_deinit(struct emb_config *c)
{
    for (int i = 0; i < c->n_dense; i++) {
        free(c->dense[i].w);
        free(c->dense[i].b);
    }
    for (int i = 0; i < c->n_prompts; i++)
        free(c->prompts[i].text);
    memset(c, 0, sizeof *c);
}

const char *emb_prompt_find(const struct emb_config *c, const char *name)
{
    for (int i = 0; i < c->n_prompts; i++)
        if (strcmp(c->prompts[i].name, name) == 0)
            return c->prompts[i].text;
    return NULL;
}

// ---- the vectors ----

static double act_apply(enum emb_act a, double x)
{
    switch (a) {
    case EMB_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case EMB_ACT_TANH: return tanh(x);
    default: return x;
    }
}

/* ST's Pooling._forward_padded for one unpadded sequence of n rows: the modes concatenated in
 * their order; rows before skip (a prompt with include_prompt false) are masked out, so cls is
 * the first row after them, as ST's first unmasked token. */
static void pool(const struct emb_config *c, double *out, const float *h, int n, int d, int skip)
{
    int m = n - skip > 0 ? n - skip : 0;
    for (int p = 0; p < c->n_pool; p++, out += d) {
        switch (c->pool[p]) {
        case EMB_POOL_CLS:
            for (int j = 0; j < d; j++)
                out[j] = h[(size_t)(skip < n ? skip : 0) * d + j];
            break;
        case EMB_POOL_LAST:
            for (int j = 0; j < d; j++)
                out[j] = m > 0 ? h[(size_t)(n - 1) * d + j] : 0.0;
            break;
        case EMB_POOL_MAX:
            for (int j = 0; j < d; j++) {
                double v = -INFINITY;   /* ST 6: masked rows are -inf */
                for (int i = skip; i < n; i++)
                    v = h[(size_t)i * d + j] > v ? h[(size_t)i * d + j] : v;
                out[j] = v;
            }
            break;
        case EMB_POOL_MEAN:
        case EMB_POOL_MEAN_SQRT:
        case EMB_POOL_WEIGHTED_MEAN: {
            /* weights: 1 (means) or the row's position + 1 (weightedmean); the sum clamped at 1e-9 */
            bool wm = c->pool[p] == EMB_POOL_WEIGHTED_MEAN;
            double den = 0.0;
            for (int i = skip; i < n; i++)
                den += wm ? i + 1 : 1;
            den = den > 1e-9 ? den : 1e-9;
            den = c->pool[p] == EMB_POOL_MEAN_SQRT ? sqrt(den) : den;
            for (int j = 0; j < d; j++) {
                double s = 0.0;
                for (int i = skip; i < n; i++)
                    s += (wm ? i + 1 : 1) * (double)h[(size_t)i * d + j];
                out[j] = s / den;
            }
            break;
        }
        }
    }
}

void emb_finish(const struct emb_config *c, float *out, const float *hidden, int n, int n_embd, int skip)
{
    int cap = c->dim > EMB_MAX_POOL * n_embd ? c->dim : EMB_MAX_POOL * n_embd;
    for (int i = 0; i < c->n_dense; i++)
        cap = c->dense[i].n_out > cap ? c->dense[i].n_out : cap;
    double *a = calloc((size_t)cap, sizeof *a), *b = calloc((size_t)cap, sizeof *b);
    if (!a || !b) {
        for (int j = 0; j < c->dim; j++)
            out[j] = NAN;
        free(a);
        free(b);
        return;
    }
    pool(c, a, hidden, n, n_embd, c->include_prompt ? 0 : skip);
    for (int l = 0; l < c->n_dense; l++) {
        const struct emb_dense *dl = &c->dense[l];
        for (int o = 0; o < dl->n_out; o++) {
            double s = dl->b ? dl->b[o] : 0.0;
            const float *w = dl->w + (size_t)o * dl->n_in;
            for (int j = 0; j < dl->n_in; j++)
                s += (double)w[j] * a[j];
            b[o] = act_apply(dl->act, s);
        }
        double *t = a;
        a = b;
        b = t;
    }
    if (c->normalize) {   /* F.normalize: x / max(||x||, 1e-12) */
        double s = 0.0;
        for (int j = 0; j < c->dim; j++)
            s += a[j] * a[j];
        s = sqrt(s) > 1e-12 ? sqrt(s) : 1e-12;
        for (int j = 0; j < c->dim; j++)
            a[j] /= s;
    }
    for (int j = 0; j < c->dim; j++)
        out[j] = (float)a[j];
    free(a);
    free(b);
}

float emb_score(const struct emb_config *c, float logit)
{
    return (float)act_apply(c->score_act, logit);
}

void emb_renormalize(float *v, int k)
{
    double s = 0.0;
    for (int j = 0; j < k; j++)
        s += (double)v[j] * v[j];
    if (s <= 0.0)
        return;
    s = sqrt(s);
    for (int j = 0; j < k; j++)
        v[j] = (float)(v[j] / s);
}

static int ranked_cmp(const void *a, const void *b)
{
    const struct emb_ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return x->index - y->index;
}

void emb_rank_sort(struct emb_ranked *r, int n)
{
    if (n > 1)
        qsort(r, (size_t)n, sizeof *r, ranked_cmp);
}
