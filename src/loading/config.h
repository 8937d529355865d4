/*
 * config: bounded reading of config.json / generation_config.json and typed
 * field accessors that families use in their parse_config.
 *
 * Every accessor names the field in its error. "opt" accessors treat an
 * absent key and a JSON null alike (HF writes null for "use the default")
 * and return the default given at the call site, which is where the family
 * documents it. Wrong JSON types and out-of-range numbers are errors.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "../core/err.h"
#include "../core/fileio.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CFG_MAX_BYTES (16u << 20)  /* config files are small; refuse anything larger */

/* Read and parse a JSON file (size-capped; scope as file_open's). *out is owned by the caller
 * (cJSON_Delete). */
int cfg_load_file(const char *path, enum file_scope scope, cJSON **out, struct err *e);
/* Parse a JSON buffer (not NUL-terminated); the root must be an object. */
int cfg_parse(const char *buf, size_t len, const char *what, cJSON **out, struct err *e);

bool cfg_has(const cJSON *o, const char *key);  /* present and not null */
int cfg_int(const cJSON *o, const char *key, int *out, struct err *e);
int cfg_opt_int(const cJSON *o, const char *key, int def, int *out, struct err *e);
int cfg_float(const cJSON *o, const char *key, float *out, struct err *e);
int cfg_opt_float(const cJSON *o, const char *key, float def, float *out, struct err *e);
int cfg_opt_bool(const cJSON *o, const char *key, bool def, bool *out, struct err *e);
/* String field copied into buf (truncation is an error). */
int cfg_opt_str(const cJSON *o, const char *key, const char *def, char *buf, size_t cap,
                struct err *e);
/* An int or a list of ints (eos_token_id); at most cap ids; absent -> *n = 0. */
int cfg_opt_ids(const cJSON *o, const char *key, int32_t *ids, int cap, int *n, struct err *e);
/* The model's dtype: transformers 5's "dtype", else the older "torch_dtype" ("dtype" wins
 * when both are given, as PretrainedConfig does); absent or null -> *out = -1. The names
 * mlxcel casts to give their enum dtype: float32 (float), float16 (half), bfloat16. Other
 * torch dtypes (float64, float8_e4m3fn, int8, ...) give -1 (no cast: weights keep their
 * stored dtypes, as mlx-lm keeps them), and so does "auto". Any other value is an error
 * (-ERR_CONFIG) naming the key and the value, as transformers refuses it
 * (getattr(torch, name) fails): "float8" is not a dtype. */
int cfg_model_dtype(const cJSON *o, int *out, struct err *e);
/* A list of exactly n numbers. */
int cfg_float_array(const cJSON *o, const char *key, float *out, int n, struct err *e);

#ifdef __cplusplus
}
#endif
