/*
 * quant: parsing and validating config.json "quantization" (quant.h).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_mode_names[] = {
    [QMODE_AFFINE] = "affine",
    [QMODE_MXFP4] = "mxfp4",
    [QMODE_MXFP8] = "mxfp8",
    [QMODE_NVFP4] = "nvfp4",
};
#define N_MODES ((int)(sizeof k_mode_names / sizeof k_mode_names[0]))

const char *qmode_name(enum qmode m)
{
    return (int)m >= 0 && (int)m < N_MODES ? k_mode_names[m] : "?";
}

int qmode_parse(const char *s, enum qmode *out, struct err *e)
{
    for (int i = 0; i < N_MODES; i++)
        if (strcmp(s, k_mode_names[i]) == 0) {
            *out = (enum qmode)i;
            return 0;
        }
    return err_setf(e, ERR_CONFIG, "unknown quantization mode '%.64s' (valid: affine, mxfp4, mxfp8, nvfp4)", s);
}

void qmode_defaults(enum qmode m, int *group, int *bits)
{
    switch (m) {
    case QMODE_MXFP4: *group = 32; *bits = 4; break;
    case QMODE_MXFP8: *group = 32; *bits = 8; break;
    case QMODE_NVFP4: *group = 16; *bits = 4; break;
    default:          *group = 64; *bits = 4; break;
    }
}

int qparams_validate(const struct qparams *p, struct err *e)
{
    if ((int)p->mode < 0 || (int)p->mode >= N_MODES)
        return err_setf(e, ERR_CONFIG, "quantization mode %d is not one of affine, mxfp4, mxfp8, nvfp4",
                        (int)p->mode);
    if (p->mode == QMODE_AFFINE) {
        int b = p->bits, g = p->group;
        if (b != 2 && b != 3 && b != 4 && b != 5 && b != 6 && b != 8)
            return err_setf(e, ERR_CONFIG, "bits = %d is not one of 2, 3, 4, 5, 6, 8 (affine)", b);
        if (g != 32 && g != 64 && g != 128)
            return err_setf(e, ERR_CONFIG, "group_size = %d is not 32, 64 or 128 (affine)", g);
        return 0;
    }
    int g, b;
    qmode_defaults(p->mode, &g, &b);
    if (p->bits != b || p->group != g)
        return err_setf(e, ERR_CONFIG, "%s needs group_size %d and bits %d, got %d and %d",
                        qmode_name(p->mode), g, b, p->group, p->bits);
    return 0;
}

/* An optional integer field: absent or null keeps *out. Must be integral and in int range. */
static int opt_int(const cJSON *o, const char *key, int *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > 1e9)
        return err_setf(e, ERR_CONFIG, "%s must be an integer", key);
    *out = (int)v->valuedouble;
    return 0;
}

/* One parameter object: mode first (its defaults fill in missing keys), then
 * group_size and bits; validated. */
static int parse_params(const cJSON *o, struct qparams *p, struct err *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "mode");
    p->mode = QMODE_AFFINE;
    int rc;
    if (m && !cJSON_IsNull(m)) {
        if (!cJSON_IsString(m))
            return err_setf(e, ERR_CONFIG, "mode must be a string");
        if ((rc = qmode_parse(m->valuestring, &p->mode, e)) < 0)
            return rc;
    }
    qmode_defaults(p->mode, &p->group, &p->bits);
    if ((rc = opt_int(o, "group_size", &p->group, e)) < 0 || (rc = opt_int(o, "bits", &p->bits, e)) < 0)
        return rc;
    return qparams_validate(p, e);
}

static bool is_top_key(const char *k)
{
    return strcmp(k, "group_size") == 0 || strcmp(k, "bits") == 0 || strcmp(k, "mode") == 0;
}

static int cmp_ov(const void *a, const void *b)
{
    return strcmp(((const struct qoverride *)a)->path, ((const struct qoverride *)b)->path);
}

static int parse_overrides(struct qconfig *qc, const cJSON *q, struct err *e)
{
    int n = 0;
    for (const cJSON *it = q->child; it; it = it->next)
        if (it->string && !is_top_key(it->string) && ++n > QCFG_MAX_OVERRIDES)
            return err_setf(e, ERR_CONFIG, "more than %d per-module entries", QCFG_MAX_OVERRIDES);
    if (n == 0)
        return 0;
    qc->ov = calloc((size_t)n, sizeof *qc->ov);
    if (!qc->ov)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (const cJSON *it = q->child; it; it = it->next) {
        if (!it->string || is_top_key(it->string))
            continue;
        size_t len = strlen(it->string);
        if (len == 0 || len >= QCFG_MAX_PATH)
            return err_setf(e, ERR_CONFIG, "module path of %zu bytes (must be 1..%d)", len,
                            QCFG_MAX_PATH - 1);
        struct qoverride *o = &qc->ov[qc->n_ov];
        int rc;
        if (cJSON_IsFalse(it)) {
            o->p = (struct qparams){QMODE_AFFINE, 0, 0};
        } else if (cJSON_IsTrue(it)) {
            o->p = qc->top;
        } else if (cJSON_IsObject(it)) {
            if ((rc = parse_params(it, &o->p, e)) < 0)
                return err_prefix(e, "%s", it->string);
        } else {
            return err_setf(e, ERR_CONFIG, "%s must be an object, true or false", it->string);
        }
        if (!(o->path = strdup(it->string)))
            return err_setf(e, ERR_NOMEM, "out of memory");
        qc->n_ov++;
    }
    qsort(qc->ov, (size_t)qc->n_ov, sizeof *qc->ov, cmp_ov);
    for (int i = 1; i < qc->n_ov; i++)
        if (strcmp(qc->ov[i - 1].path, qc->ov[i].path) == 0)
            return err_setf(e, ERR_CONFIG, "module '%s' is listed twice", qc->ov[i].path);
    return 0;
}

int qconfig_parse(struct qconfig *qc, const cJSON *cfg, struct err *e)
{
    memset(qc, 0, sizeof *qc);
    const char *field = "quantization";
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, field);
    if (!q || cJSON_IsNull(q)) {
        field = "quantization_config";
        q = cJSON_GetObjectItemCaseSensitive(cfg, field);
    }
    if (!q || cJSON_IsNull(q))
        return 0;
    if (!cJSON_IsObject(q))
        return err_setf(e, ERR_CONFIG, "config field '%s' must be an object", field);
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    if (method && cJSON_IsString(method) && strcmp(method->valuestring, "mxfp4") == 0) {
        /* openai's gpt-oss checkpoints: MXFP4 expert blocks the family maps itself */
        qc->hf_mxfp4 = true;
        return 0;
    }
    if (method && !cJSON_IsNull(method))
        return err_setf(e, ERR_UNSUPPORTED,
                        "config field '%s': quant_method '%.64s' (Hugging Face quantization) is not "
                        "supported; use an MLX checkpoint (mlx_lm.convert -q or mlxcel convert -q)",
                        field, cJSON_IsString(method) ? method->valuestring : "?");
    int rc;
    qc->present = true;
    if ((rc = parse_params(q, &qc->top, e)) < 0 || (rc = parse_overrides(qc, q, e)) < 0) {
        qconfig_free(qc);
        return err_prefix(e, "config field '%s'", field);
    }
    return 0;
}

void qconfig_free(struct qconfig *qc)
{
    for (int i = 0; i < qc->n_ov; i++)
        free(qc->ov[i].path);
    free(qc->ov);
    memset(qc, 0, sizeof *qc);
}

const struct qoverride *qconfig_find(const struct qconfig *qc, const char *path)
{
    if (!qc->n_ov)
        return NULL;
    struct qoverride key = {.path = (char *)path};
    return bsearch(&key, qc->ov, (size_t)qc->n_ov, sizeof *qc->ov, cmp_ov);
}

struct qparams qconfig_resolve(const struct qconfig *qc, const char *path)
{
    const struct qoverride *o = qconfig_find(qc, path);
    return o ? o->p : qc->top;
}
