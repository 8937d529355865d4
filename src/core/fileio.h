/*
 * fileio: the one place that opens untrusted files. Small ones (JSON configs,
 * tokenizer.json, safetensors index files, prompt and id files) are read
 * whole, with a size cap; weights are mapped read-only (file_map_all) and
 * stay in the page cache, never copied. Both refuse anything but a regular
 * file and name the path in every error.
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

/* Map a whole regular file read-only: *map (NULL for an empty file) and *len bytes,
 * released with file_unmap (the caller owns the mapping). Writing through it faults.
 * Errors as file_read_all's (no size cap). */
int file_map_all(const char *path, const void **map, size_t *len, struct err *e);
/* Release a file_map_all mapping; a NULL map is a no-op. */
void file_unmap(const void *map, size_t len);

#ifdef __cplusplus
}
#endif
