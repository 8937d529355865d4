/*
 * config: JSON field accessors with errors that name the field (config.h).
 * Numbers must be finite and integers must be integral and fit in int32.
 */
#include "config.h"

#include "../core/dtype.h"
#include "../core/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int cfg_parse(const char *buf, size_t len, const char *what, cJSON **out, struct err *e)
{
    return json_parse_object(buf, len, what, out, e);
}

int cfg_load_file(const char *path, enum file_scope scope, cJSON **out, struct err *e)
{
    return json_load_object(path, scope, CFG_MAX_BYTES, out, e);
}

bool cfg_has(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v && !cJSON_IsNull(v);
}

static int number_to_int(const cJSON *v, const char *key, int *out, struct err *e)
{
    if (!cJSON_IsNumber(v))
        return err_setf(e, ERR_CONFIG, "config field '%s': expected an integer", key);
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < -2147483648.0 || d > 2147483647.0)
        return err_setf(e, ERR_CONFIG, "config field '%s': %g is not a 32-bit integer", key, d);
    *out = (int)d;
    return 0;
}

int cfg_int(const cJSON *o, const char *key, int *out, struct err *e)
{
    if (!cfg_has(o, key))
        return err_setf(e, ERR_CONFIG, "config is missing required field '%s'", key);
    return number_to_int(cJSON_GetObjectItemCaseSensitive(o, key), key, out, e);
}

int cfg_opt_int(const cJSON *o, const char *key, int def, int *out, struct err *e)
{
    if (!cfg_has(o, key)) {
        *out = def;
        return 0;
    }
    return number_to_int(cJSON_GetObjectItemCaseSensitive(o, key), key, out, e);
}

static int number_to_float(const cJSON *v, const char *key, float *out, struct err *e)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return err_setf(e, ERR_CONFIG, "config field '%s': expected a finite number", key);
    *out = (float)v->valuedouble;
    return 0;
}

int cfg_float(const cJSON *o, const char *key, float *out, struct err *e)
{
    if (!cfg_has(o, key))
        return err_setf(e, ERR_CONFIG, "config is missing required field '%s'", key);
    return number_to_float(cJSON_GetObjectItemCaseSensitive(o, key), key, out, e);
}

int cfg_opt_float(const cJSON *o, const char *key, float def, float *out, struct err *e)
{
    if (!cfg_has(o, key)) {
        *out = def;
        return 0;
    }
    return number_to_float(cJSON_GetObjectItemCaseSensitive(o, key), key, out, e);
}

int cfg_opt_bool(const cJSON *o, const char *key, bool def, bool *out, struct err *e)
{
    if (!cfg_has(o, key)) {
        *out = def;
        return 0;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsBool(v))
        return err_setf(e, ERR_CONFIG, "config field '%s': expected true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int cfg_opt_str(const cJSON *o, const char *key, const char *def, char *buf, size_t cap,
                struct err *e)
{
    const char *s = def;
    if (cfg_has(o, key)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
        if (!cJSON_IsString(v))
            return err_setf(e, ERR_CONFIG, "config field '%s': expected a string", key);
        s = v->valuestring;
    }
    if (!s)
        s = "";
    if (strlen(s) >= cap)
        return err_setf(e, ERR_CONFIG, "config field '%s': string longer than %zu bytes", key,
                        cap - 1);
    memcpy(buf, s, strlen(s) + 1);
    return 0;
}

int cfg_opt_ids(const cJSON *o, const char *key, int32_t *ids, int cap, int *n, struct err *e)
{
    *n = 0;
    if (!cfg_has(o, key))
        return 0;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    int id, rc;
    if (cJSON_IsNumber(v)) {
        if ((rc = number_to_int(v, key, &id, e)) < 0)
            return rc;
        ids[(*n)++] = id;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return err_setf(e, ERR_CONFIG, "config field '%s': expected an integer or a list", key);
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (*n >= cap)
            return err_setf(e, ERR_CONFIG, "config field '%s': more than %d ids", key, cap);
        if ((rc = number_to_int(it, key, &id, e)) < 0)
            return rc;
        ids[(*n)++] = id;
    }
    return 0;
}

int cfg_float_array(const cJSON *o, const char *key, float *out, int n, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return err_setf(e, ERR_CONFIG, "config is missing required field '%s'", key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n)
        return err_setf(e, ERR_CONFIG, "config field '%s': expected a list of %d numbers", key,
                        n);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        int rc = number_to_float(it, key, &out[i++], e);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the model dtype ---- */

/* Every dtype name torch has (torch.<name> is a torch.dtype), which transformers accepts in
 * a config: those mlxcel casts to, then the rest. */
static const struct {
    const char *name;
    int dtype;
} k_torch_dtypes[] = {
    {"float32", DTYPE_F32}, {"float", DTYPE_F32}, {"float16", DTYPE_F16}, {"half", DTYPE_F16},
    {"bfloat16", DTYPE_BF16}, {"auto", -1},
    {"float64", -1}, {"double", -1}, {"complex32", -1}, {"complex64", -1}, {"complex128", -1},
    {"cfloat", -1}, {"cdouble", -1}, {"chalf", -1}, {"uint8", -1}, {"uint16", -1}, {"uint32", -1},
    {"uint64", -1}, {"int8", -1}, {"int16", -1}, {"short", -1}, {"int32", -1}, {"int", -1},
    {"int64", -1}, {"long", -1}, {"bool", -1}, {"float8_e4m3fn", -1}, {"float8_e4m3fnuz", -1},
    {"float8_e5m2", -1}, {"float8_e5m2fnuz", -1}, {"float8_e8m0fnu", -1}, {"float4_e2m1fn_x2", -1},
};

int cfg_model_dtype(const cJSON *o, int *out, struct err *e)
{
    const char *key = cfg_has(o, "dtype") ? "dtype" : "torch_dtype";
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = -1;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return err_setf(e, ERR_CONFIG, "config field '%s': expected a dtype name such as \"bfloat16\"", key);
    /* transformers also takes "torch.bfloat16", the repr of a torch.dtype */
    const char *name = strncmp(v->valuestring, "torch.", 6) == 0 ? v->valuestring + 6 : v->valuestring;
    for (size_t i = 0; i < sizeof k_torch_dtypes / sizeof k_torch_dtypes[0]; i++) {
        if (strcmp(name, k_torch_dtypes[i].name) == 0) {
            *out = k_torch_dtypes[i].dtype;
            return 0;
        }
    }
    return err_setf(e, ERR_CONFIG, "config field '%s': '%.64s' is not a torch dtype (float32, float16, bfloat16, "
                    "float64, float8_e4m3fn, ...)", key, v->valuestring);
}
