/*
 * fileio: the one place that opens files the program reads (fileio.c holds
 * the only open() of a named input). Small files (JSON configs,
 * tokenizer.json, safetensors index files, templates, prompt and id files)
 * are read whole, with a size cap; weights are mapped read-only
 * (file_map_all) and stay in the page cache, never copied.
 *
 * The opening rule (file_open), for every path:
 *   - open non-blocking, so a FIFO or a device cannot hang the open, then
 *     fstat the descriptor and refuse anything but a regular file
 *     ("PATH is not a regular file (a FIFO)"); reads then block normally;
 *   - FILE_FOLDER paths (DIR/NAME named by a model folder) follow a symlink
 *     only when it resolves inside DIR or, for a Hugging Face snapshot
 *     (.../models--owner--name/snapshots/<rev>/), inside the repository
 *     folder models--owner--name (its blobs/); a link elsewhere is an error
 *     naming the file and its target. The resolved file is opened with
 *     O_NOFOLLOW, so a link swapped in after the check is refused too.
 *   - FILE_USER paths (named on the command line) follow symlinks.
 * Every error names the path.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who named a path, which decides whether a symlink may lead outside its folder. */
enum file_scope {
    FILE_USER   = 0,  /* the user (a CLI flag): symlinks followed */
    FILE_FOLDER = 1,  /* a model folder: DIR/NAME, symlinks confined to DIR (or its HF repo) */
};

/* Open path for reading under the rule above: *fd (the caller closes it) is a regular
 * file, blocking, close-on-exec; *st (may be NULL) receives its fstat. A missing file
 * (or a dangling link) is -ERR_MISSING, a non-regular file or a link leaving the folder
 * -ERR_IO, with the path in the message. */
int file_open(const char *path, enum file_scope scope, int *fd, struct stat *st, struct err *e);

/* Read fd to its end, at most max bytes, into a malloc'd NUL-terminated buffer (*out, owned
 * by the caller; *len bytes, len may be NULL); name is used in messages. More than max
 * bytes is -ERR_RANGE. Works on pipes (standard input) as well as regular files. */
int file_read_fd(int fd, const char *name, size_t max, char **out, size_t *len, struct err *e);

/* file_open + file_read_fd: a file of at most max bytes. */
int file_read_scoped(const char *path, enum file_scope scope, size_t max, char **out, size_t *len,
                     struct err *e);
/* file_read_scoped of a file the user named (FILE_USER). */
int file_read_all(const char *path, size_t max, char **out, size_t *len, struct err *e);

/* Map a whole regular file read-only: *map (NULL for an empty file) and *len bytes,
 * released with file_unmap (the caller owns the mapping). Writing through it faults.
 * Errors as file_open's. */
int file_map_all(const char *path, enum file_scope scope, const void **map, size_t *len,
                 struct err *e);
/* Release a file_map_all mapping; a NULL map is a no-op. */
void file_unmap(const void *map, size_t len);

/* Give back the whole pages inside [p, p + len) (madvise MADV_DONTNEED): the
 * process stops holding them, a file mapping reads them from the file again if
 * touched, anonymous memory reads zeros. Only for bytes nothing reads again. */
void mem_release(const void *p, size_t len);

/* len bytes of anonymous memory (NULL when out of memory), and its release: from 2 MiB on
 * it starts on a huge-page boundary, huge pages advised; below, 4 KiB aligned. */
void *mem_anon_alloc(size_t len);
void mem_anon_free(void *p, size_t len);
/* bytes of heap memory released with free() (64-byte aligned; NULL when out of memory or
 * too large): from 2 MiB on it starts on a huge-page boundary, huge pages advised. */
void *mem_huge_alloc(size_t bytes);

/* The memory the kernel reports available to new allocations (MemAvailable of
 * /proc/meminfo: free memory plus what reclaim would give, the page cache included);
 * 0 when it cannot be read. */
uint64_t mem_available_bytes(void);

#ifdef __cplusplus
}
#endif
