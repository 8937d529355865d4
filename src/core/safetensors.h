/*
 * safetensors: mmap-backed reader for one checkpoint folder.
 *
 * A file is: u64 little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {...}}, then the data section. Every header is untrusted:
 * st_header_parse() checks the length against the file size and a cap, JSON
 * validity, dtype names, shape products for overflow, shape x itemsize ==
 * end - begin, offsets inside the data section, and no two tensors overlapping.
 *
 * struct st_set is one model's tensors across shards: from
 * model.safetensors.index.json when present and consistent, otherwise by
 * discovering every *.safetensors in the folder. Tensor data stays in the
 * mmap (owned by the set) in its stored dtype; nothing is copied.
 *
 * The set doubles as the weight map: st_set_take() marks a tensor consumed
 * so callers can report the ones a family did not use.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "err.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS        8
#define ST_MAX_HEADER      (100u << 20)  /* 100 MiB, as the reference implementation caps it */
#define ST_MAX_FILES       4096

struct st_tensor {
    char *name;                    /* owned by the set */
    enum dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;           /* byte offsets inside the file's data section */
    const void *data;              /* into the mmap; NULL before mapping */
    int file;                      /* index of the shard holding it */
    bool consumed;                 /* set by st_set_take* */
};

/* Parse a header JSON of json_len bytes for a data section of data_len bytes.
 * On success *out is a malloc'd array of *n_out tensors sorted by name (names
 * malloc'd; free with st_tensors_free), data pointers NULL, file 0; *out may
 * be non-NULL with *n_out == 0. On failure *out = NULL, *n_out = 0 and e names
 * the tensor and the expected versus actual value. Unknown dtype ->
 * -ERR_UNSUPPORTED; every other problem -> -ERR_FORMAT. */
int st_header_parse(const char *json, size_t json_len, uint64_t data_len,
                    struct st_tensor **out, size_t *n_out, struct err *e);
void st_tensors_free(struct st_tensor *t, size_t n);

struct st_set;

/* Open every shard of the checkpoint in dir (see above). On failure *out = NULL
 * and e names the file (and tensor); a folder without weights or an index
 * naming a missing shard -> -ERR_MISSING. The caller owns *out. */
int st_set_open(struct st_set **out, const char *dir, struct err *e);
/* Open a single .safetensors file (used for golden files and tests). */
int st_set_open_file(struct st_set **out, const char *path, struct err *e);
void st_set_free(struct st_set *s);

size_t st_set_count(const struct st_set *s);
/* Tensors are ordered by name (strcmp); i >= count -> NULL. */
const struct st_tensor *st_set_at(const struct st_set *s, size_t i);
const struct st_tensor *st_set_find(const struct st_set *s, const char *name);
size_t st_set_n_files(const struct st_set *s);
/* True when [p, p + len) lies inside the data section of one of s's files. */
bool st_set_holds(const struct st_set *s, const void *p, size_t len);
const char *st_set_file_path(const struct st_set *s, size_t i);
/* Sum of tensor byte sizes. */
uint64_t st_set_data_bytes(const struct st_set *s);

/* View of tensor `name` as a struct tensor (ndim <= TENSOR_MAX_DIMS), marked consumed.
 * data points into the read-only mapping (never write through it); name is the
 * set's. A 0-dim (scalar) tensor comes back as shape [1].
 * Missing -> -ERR_MISSING "missing tensor 'name'"; more than 4 dims -> -ERR_FORMAT. */
int st_set_take(struct st_set *s, const char *name, struct tensor *out, struct err *e);
/* Like st_set_take, but an absent tensor is not an error: out->ndim = 0, returns 0. */
int st_set_take_opt(struct st_set *s, const char *name, struct tensor *out, struct err *e);
/* Mark a tensor as consumed without viewing it (e.g. a dropped tied head). */
void st_set_mark(struct st_set *s, const char *name);
/* Number of tensors not consumed. */
size_t st_set_n_unused(const struct st_set *s);
/* Rename every tensor whose name starts with `from` to `to` + the rest (a multimodal
 * checkpoint's text model read under the text family's names). Returns how many were
 * renamed; two tensors under one name afterwards -> -ERR_FORMAT naming it, the set then
 * unusable. Not for recording sets. */
int st_set_rename_prefix(struct st_set *s, const char *from, const char *to, struct err *e);
/* Mark every tensor whose name starts with prefix as consumed (parts of a checkpoint that
 * are knowingly not loaded); returns how many. */
size_t st_set_mark_prefix(struct st_set *s, const char *prefix);

/* Recording sets (`mlxcel synth`): a set with no files that learns its tensors from the
 * requests a family's map_weights makes. wmap records each float tensor it is asked for
 * (name and expected shape) with st_set_record before taking it, so the take succeeds
 * and the set ends up listing exactly the tensors the loader needs. Recorded tensors
 * have dtype dt and a data pointer to a small dummy block that must never be read. */
int st_set_new_recording(struct st_set **out, const char *const *prefer, struct err *e);
bool st_set_is_recording(const struct st_set *s);
/* Where the loader probes for one of two layouts (wm_has), a recording set answers "present"
 * for names ending in one of the prefer suffixes given at creation (NULL-terminated, borrowed;
 * NULL: none), so synth records the layout published checkpoints use. */
bool st_set_record_prefers(const struct st_set *s, const char *name);
/* Add tensor name (no-op when present); ndim 1..TENSOR_MAX_DIMS, dims positive. */
int st_set_record(struct st_set *s, const char *name, enum dtype dt, int ndim, const int64_t *shape,
                  struct err *e);

#ifdef __cplusplus
}
#endif
