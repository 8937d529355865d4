/*
 * json: the one reader of untrusted JSON documents whose top level must be an
 * object (config.json, tokenizer.json, tokenizer_config.json,
 * chat_template.json, safetensors headers and index files). A document is
 * exactly one object plus optional JSON whitespace: trailing bytes (a second
 * value, junk) and NUL bytes anywhere are errors, so every reader accepts
 * the same documents. Numbers follow RFC 8259 exactly ("02", "1.", "-.5",
 * "+1" are errors, as in Python's json). Errors name the document and the
 * byte where it went wrong.
 *
 * Duplicate keys: json_parse_object keeps every member (readers that walk
 * the members, such as safetensors headers and tokenizer.json's vocab, refuse
 * duplicates themselves); json_load_object (config.json,
 * generation_config.json, tokenizer_config.json, chat_template.json: files
 * transformers reads with Python's json) keeps the last, as Python does; the
 * server refuses them in requests (json_find_duplicate).
 */
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "err.h"
#include "fileio.h"

#ifdef __cplusplus
extern "C" {
#endif

enum json_dups {
    JSON_DUPS_KEEP = 0,     /* every member stays, in document order */
    JSON_DUPS_LAST = 1,     /* Python's json: the last of a key's members wins */
    JSON_DUPS_REFUSE = 2,   /* -ERR_FORMAT "<what>: the key '<path>' appears twice" */
};

/* Whether every number in the len bytes of an (already parsed) JSON document follows
 * RFC 8259: 0, or -ERR_FORMAT with *at the number's byte offset and path[cap] its place
 * ("messages[2].content", "" at the top), or -ERR_NOMEM. */
int json_check_numbers(const char *buf, size_t len, char *path, size_t cap, size_t *at);
/* Whether some object in root holds a key twice: 1 with path[cap] naming the key
 * ("tools[0].function.name"), 0 when none, -ERR_NOMEM. */
int json_find_duplicate(const cJSON *root, char *path, size_t cap);
/* json_parse_object with a duplicate-key policy. */
int json_parse_doc(const char *buf, size_t len, const char *what, enum json_dups dups, cJSON **out,
                   struct err *e);

/* Parse len bytes (need not be NUL-terminated) into *out (owned by the caller;
 * NULL on failure). Invalid JSON, a NUL byte, non-whitespace after the object or a
 * top level that is not an object -> -ERR_FORMAT, "<what> is not valid JSON (error
 * at byte N of LEN[: reason])" or "<what> is not a JSON object". */
int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e);
/* Read path (at most max bytes, file_read_all's errors and scope) and parse it as above,
 * naming path in messages, the last of duplicate keys winning (JSON_DUPS_LAST). */
int json_load_object(const char *path, enum file_scope scope, size_t max, cJSON **out,
                     struct err *e);

#ifdef __cplusplus
}
#endif
