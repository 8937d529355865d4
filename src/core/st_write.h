/*
 * st_write: writing one .safetensors file the way MLX does, streaming.
 *
 * The caller declares every tensor up front (name, dtype, shape); the header
 * is then written at once: compact JSON {"name":{"dtype":..,"shape":[..],
 * "data_offsets":[b,e]},...,"__metadata__":{"format":"mlx"}} in the order
 * given, padded with spaces so the data section starts 8-byte aligned (the
 * readers map tensors in place). Data follows in the same order, fed in
 * pieces of any size with st_writer_write; the writer counts bytes and
 * refuses too many or too few. Everything goes to PATH.tmp, which is
 * flushed, fsync'ed and renamed to PATH only by a successful close, so a
 * crashed or failed write never leaves a truncated PATH behind.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "err.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

struct st_wentry {
    const char *name;            /* borrowed until st_writer_open returns */
    enum dtype dtype;
    int ndim;                    /* 0..ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
};

struct st_writer;

/* Bytes of an entry's data (0 on overflow or a negative dim; st_writer_open refuses those). */
uint64_t st_wentry_bytes(const struct st_wentry *t);

/* Create PATH.tmp and write the header for the n entries (names unique, non-empty,
 * at most 1024 bytes). On failure nothing is left on disk. The caller owns *out. */
int st_writer_open(struct st_writer **out, const char *path, const struct st_wentry *ents, size_t n,
                   struct err *e);
/* Append n bytes of tensor data (in entry order; pieces may span entries). Writing past
 * the declared total -> -ERR_INTERNAL; an I/O failure -> -ERR_IO. */
int st_writer_write(struct st_writer *w, const void *data, size_t n, struct err *e);
/* Index of the entry the next byte belongs to (n when complete). */
size_t st_writer_cursor(const struct st_writer *w);
/* All data written: flush, fsync, close and rename PATH.tmp to PATH; frees w either way
 * (on failure PATH.tmp is removed). Missing bytes -> -ERR_INTERNAL. */
int st_writer_close(struct st_writer *w, struct err *e);
/* Give up: close and remove PATH.tmp, free w. NULL is a no-op. */
void st_writer_abort(struct st_writer *w);

#ifdef __cplusplus
}
#endif
