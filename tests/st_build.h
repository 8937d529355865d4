/*
 * st_build: helpers for the safetensors and corrupt-input suites. They write
 * small safetensors files (valid ones from a tensor list, or a verbatim header
 * for corrupt cases) into throwaway folders under /tmp made with mkdtemp.
 * Test code only: failures are reported by return value and the caller
 * asserts on them.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct stb_tensor {
    const char *name;
    const char *dtype;     /* safetensors dtype name, written verbatim */
    int ndim;
    int64_t shape[8];
    const void *data;      /* nbytes of payload; NULL writes zeros */
    size_t nbytes;
};

/* A fresh folder /tmp/mlxcel-st-XXXXXX; malloc'd path, NULL on failure. */
char *stb_tmpdir(void);
/* Remove the files in dir (one level deep), dir itself, and free the path. */
void stb_rmtree(char *dir);
/* "dir/name" in a rotating static buffer (8 slots). */
const char *stb_path(const char *dir, const char *name);
/* Write a valid file: tensors stored back to back in list order, header
 * padded with spaces to a multiple of 8 bytes. Returns 0 or -1. */
int stb_write(const char *path, const struct stb_tensor *t, size_t n);
/* Write the 8-byte length of json, json verbatim, then data_len zero bytes. */
int stb_write_header(const char *path, const char *json, size_t data_len);
/* Write n raw bytes. */
int stb_write_raw(const char *path, const void *buf, size_t n);
/* Write a text file (an index). */
int stb_write_text(const char *path, const char *text);
/* Cut the file at path to n bytes. */
int stb_truncate(const char *path, long n);

struct st_wentry;
struct err;
/* Write dst/model.safetensors from n entries and their payloads through the loader's own
 * writer (st_writer), then free names[i], data[i] and the three arrays, whatever the outcome
 * (the checkpoints the vision suites rewrite into mlx-vlm's layout). 0, or -1 with *e. */
int stb_write_model(const char *dst, struct st_wentry *ents, char **names, void **data, size_t n,
                    struct err *e);
