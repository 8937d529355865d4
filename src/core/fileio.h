/*
 * fileio: reading small untrusted files (JSON configs, tokenizer.json,
 * prompt and id files) whole, with a size cap. Weights are never read this
 * way: they are mmapped by safetensors.c.
 */
#pragma once
#include <stddef.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Read a regular file of at most max bytes into a malloc'd NUL-terminated buffer
 * (*out, owned by the caller; *len bytes, len may be NULL). A missing file is
 * -ERR_MISSING, a larger one -ERR_RANGE, anything else unreadable -ERR_IO; the
 * message names the path. */
int file_read_all(const char *path, size_t max, char **out, size_t *len, struct err *e);

#ifdef __cplusplus
}
#endif
