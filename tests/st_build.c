/*
 * st_build: writers for test safetensors files (see st_build.h). The header
 * is built with cJSON, the same library the loader parses it with, so these
 * files exercise the loader's checks rather than a second JSON dialect.
 */
#include "st_build.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/err.h"
#include "core/st_write.h"
#include "models/selftest.h"

/* the family self-tests' own (src/models/selftest.c), so both make and remove alike */
char *stb_tmpdir(void)
{
    return stest_tmpdir();
}

void stb_rmtree(char *dir)
{
    stest_rmtree(dir);
}

const char *stb_path(const char *dir, const char *name)
{
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_file(const char *path, const char *json, size_t json_len, size_t pad,
                      const struct stb_tensor *t, size_t n, size_t zeros)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint64_t hlen = json_len + pad;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(hlen >> (8 * i));
    int rc = write_all(f, le, 8);
    rc |= write_all(f, json, json_len);
    for (size_t i = 0; i < pad; i++)
        rc |= fputc(' ', f) == EOF ? -1 : 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i].data)
            rc |= write_all(f, t[i].data, t[i].nbytes);
        else
            zeros += t[i].nbytes;
    }
    for (size_t i = 0; i < zeros; i++)
        rc |= fputc(0, f) == EOF ? -1 : 0;
    rc |= fclose(f) == 0 ? 0 : -1;
    return rc;
}

int stb_write(const char *path, const struct stb_tensor *t, size_t n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(o, "dtype", t[i].dtype);
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += t[i].nbytes;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json)
        return -1;
    size_t len = strlen(json);
    int rc = write_file(path, json, len, (8 - len % 8) % 8, t, n, 0);
    free(json);
    return rc;
}

int stb_write_header(const char *path, const char *json, size_t data_len)
{
    return write_file(path, json, strlen(json), 0, NULL, 0, data_len);
}

int stb_write_raw(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int rc = write_all(f, buf, n);
    rc |= fclose(f) == 0 ? 0 : -1;
    return rc;
}

int stb_write_text(const char *path, const char *text)
{
    return stb_write_raw(path, text, strlen(text));
}

int stb_truncate(const char *path, long n)
{
    return truncate(path, n);
}

int stb_write_model(const char *dst, struct st_wentry *ents, char **names, void **data, size_t n,
                    struct err *e)
{
    struct st_writer *w = NULL;
    int rc = st_writer_open(&w, stb_path(dst, "model.safetensors"), ents, n, e);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = st_writer_write(w, data[i], st_wentry_bytes(&ents[i]), e);
    if (w && st_writer_close(w, rc == 0 ? e : &(struct err){0}) < 0)
        rc = -1;
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
        free(data[i]);
    }
    free(names);
    free(data);
    free(ents);
    return rc < 0 ? -1 : 0;
}
