/*
 * json: the one reader of untrusted JSON documents whose top level must be an
 * object (config.json, tokenizer.json, tokenizer_config.json,
 * chat_template.json, safetensors headers and index files). A document is
 * exactly one object plus optional JSON whitespace: trailing bytes (a second
 * value, junk) and NUL bytes anywhere are errors, so every reader accepts
 * the same documents. Errors name the document and the byte where it went wrong.
 */
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "fileio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse len bytes (need not be NUL-terminated) into *out (owned by the caller;
 * NULL on failure). Invalid JSON, a NUL byte, non-whitespace after the object or a
 * top level that is not an object -> -ERR_FORMAT, "<what> is not valid JSON (error
 * at byte N of LEN[: reason])" or "<what> is not a JSON object". */
int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e);
/* Read path (at most max bytes, file_read_all's errors and scope) and parse it as above,
 * naming path in messages. */
int json_load_object(const char *path, enum file_scope scope, size_t max, cJSON **out,
                     struct err *e);

#ifdef __cplusplus
}
#endif
