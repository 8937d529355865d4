/*
 * json: parsing untrusted JSON documents whose top level must be an object
 * (config.json, tokenizer.json, tokenizer_config.json, chat_template.json),
 * with errors that name the file and the byte where parsing stopped.
 */
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse len bytes (not NUL-terminated) into *out (owned by the caller).
 * Invalid JSON or a top level that is not an object -> -ERR_FORMAT naming `what`. */
int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e);
/* Read path (at most max bytes, file_read_all's errors) and parse it as above. */
int json_load_object(const char *path, size_t max, cJSON **out, struct err *e);

#ifdef __cplusplus
}
#endif
