/*
 * safetensors: the checkpoint reader (see safetensors.h for the file format).
 *
 * Think of it as three layers:
 *   1. st_header_parse() turns one untrusted JSON header into validated
 *      st_tensor records (the JSON itself is read by core/json, the same
 *      reader as every other JSON document). It knows nothing about files;
 *      every check that can be made from the header and the data-section
 *      length is made here, so the fuzz target can drive it directly.
 *   2. shard_open() maps one file read-only (core/fileio), bounds the 8-byte
 *      header length against the file size and ST_MAX_HEADER, and calls
 *      layer 1. Error messages get the file path prefixed.
 *   3. st_set_open() decides which files make up the checkpoint (index or
 *      discovery, see below), opens them and merges their tensors into one
 *      array sorted by name, so lookup is a bsearch (checkpoints can hold
 *      100k tensors) and duplicate names across shards sit side by side.
 *
 * Shard selection: model.safetensors.index.json wins when every shard it
 * names exists; each weight_map entry must then be found in the shard it
 * names. If a named shard is missing, the index may just be stale (a folder
 * re-saved as one file): we fall back to discovery and accept it, with a
 * warning, only if discovery holds every tensor the index lists; otherwise
 * the missing shard is the error. Discovery opens every *.safetensors file
 * except golden.safetensors (reference outputs that our fixtures keep beside
 * the weights), in name order.
 *
 * Ownership: the set owns the mappings, the file paths and the tensor names;
 * tensor data are views into the read-only mappings and live until
 * st_set_free(). Tensor data are not aligned beyond what the file gives:
 * writers pad the header to 8 bytes, but nothing forces them to.
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "json.h"
#include "log.h"

#define ST_INDEX_NAME  "model.safetensors.index.json"
#define ST_GOLDEN_NAME "golden.safetensors"
#define ST_SUFFIX      ".safetensors"
/* cJSON holds numbers as doubles, which represent every integer up to 2^53
 * exactly; anything larger may already have been rounded, so we reject it. */
#define ST_MAX_JSON_INT (UINT64_C(1) << 53)
/* An index lists one short line per tensor; 100k tensors is ~10 MB. */
#define ST_MAX_INDEX   ST_MAX_HEADER

struct st_file {
    char *path;             /* owned */
    const char *base;       /* file-name part of path, for index comparisons */
    const void *map;        /* the whole file, read-only (file_map_all); owned */
    size_t map_len;
    const uint8_t *data;    /* start of the data section inside map */
    uint64_t data_len;
};

struct st_set {
    char *where;            /* folder or file it was opened from, for messages; owned */
    struct st_file *files;  /* [n_files] */
    size_t n_files;
    struct st_tensor *t;    /* [n], sorted by name (strcmp) */
    size_t n;
    bool recording;         /* st_set_new_recording: no files, tensors from st_set_record */
    const char *const *prefer;  /* recording: layout suffixes answered as present; borrowed */
};

// ---- header parsing ----

/* A JSON number that is an integer in [0, 2^53]; false for anything else. */
static bool json_to_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v <= (double)ST_MAX_JSON_INT)) /* also rejects NaN */
        return false;
    uint64_t u = (uint64_t)v;
    if ((double)u != v)
        return false;
    *out = u;
    return true;
}

static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t w = 0;
    w += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && w < cap; i++)
        w += (size_t)snprintf(buf + w, cap - w, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (w < cap)
        snprintf(buf + w, cap - w, "]");
}

static int parse_shape(const cJSON *js, const char *name, struct st_tensor *t, struct err *e)
{
    if (!cJSON_IsArray(js))
        return err_setf(e, ERR_FORMAT, "tensor '%s': \"shape\" must be an array of integers", name);
    int ndim = cJSON_GetArraySize(js);
    if (ndim > ST_MAX_DIMS)
        return err_setf(e, ERR_FORMAT, "tensor '%s': shape has %d dims, at most %d allowed",
                        name, ndim, ST_MAX_DIMS);
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, js) {
        uint64_t v;
        if (!json_to_u64(d, &v))
            return err_setf(e, ERR_FORMAT,
                            "tensor '%s': shape[%d] must be an integer in [0, 2^53], got %g",
                            name, i, cJSON_IsNumber(d) ? d->valuedouble : -1.0);
        t->shape[i++] = (int64_t)v;
    }
    t->ndim = ndim;
    return 0;
}

static int parse_offsets(const cJSON *jo, const char *name, struct st_tensor *t, struct err *e)
{
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
        !json_to_u64(cJSON_GetArrayItem(jo, 0), &t->begin) ||
        !json_to_u64(cJSON_GetArrayItem(jo, 1), &t->end))
        return err_setf(e, ERR_FORMAT,
                        "tensor '%s': \"data_offsets\" must be [begin, end] integers in [0, 2^53]",
                        name);
    if (t->begin > t->end)
        return err_setf(e, ERR_FORMAT, "tensor '%s': data_offsets begin %llu > end %llu", name,
                        (unsigned long long)t->begin, (unsigned long long)t->end);
    return 0;
}

/* Validate one header entry into *t (name not yet set). */
static int parse_entry(const cJSON *item, uint64_t data_len, struct st_tensor *t, struct err *e)
{
    const char *name = item->string;
    int rc;
    if (!cJSON_IsObject(item))
        return err_setf(e, ERR_FORMAT, "tensor '%s': entry is not a JSON object", name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    if (!cJSON_IsString(jd))
        return err_setf(e, ERR_FORMAT, "tensor '%s': \"dtype\" missing or not a string", name);
    if (dtype_parse(jd->valuestring, &t->dtype) < 0)
        return err_setf(e, ERR_UNSUPPORTED, "tensor '%s': unknown dtype '%s'", name,
                        jd->valuestring);
    if ((rc = parse_shape(cJSON_GetObjectItemCaseSensitive(item, "shape"), name, t, e)) < 0)
        return rc;
    if ((rc = parse_offsets(cJSON_GetObjectItemCaseSensitive(item, "data_offsets"), name, t, e)) < 0)
        return rc;

    /* shape x itemsize in checked arithmetic: dims up to 2^53 overflow easily */
    uint64_t bytes = dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        if (__builtin_mul_overflow(bytes, (uint64_t)t->shape[i], &bytes)) {
            char sh[160];
            format_shape(sh, sizeof sh, t->shape, t->ndim);
            return err_setf(e, ERR_FORMAT, "tensor '%s': shape %s x %zu bytes overflows 64 bits",
                            name, sh, dtype_size(t->dtype));
        }
    }
    if (bytes != t->end - t->begin) {
        char sh[160];
        format_shape(sh, sizeof sh, t->shape, t->ndim);
        return err_setf(e, ERR_FORMAT,
                        "tensor '%s': data_offsets [%llu, %llu] span %llu bytes, expected %llu "
                        "(%s shape %s)", name, (unsigned long long)t->begin,
                        (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                        (unsigned long long)bytes, dtype_name(t->dtype), sh);
    }
    if (t->end > data_len)
        return err_setf(e, ERR_FORMAT,
                        "tensor '%s': data_offsets end %llu is past the data section (%llu bytes)",
                        name, (unsigned long long)t->end, (unsigned long long)data_len);
    return 0;
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

/* Name, then shard: makes duplicate reports name the shards in a fixed order. */
static int cmp_by_name_file(const void *a, const void *b)
{
    int c = cmp_by_name(a, b);
    if (c)
        return c;
    return ((const struct st_tensor *)a)->file - ((const struct st_tensor *)b)->file;
}

static int cmp_by_offsets(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Sort t by name and reject duplicate names and overlapping byte ranges.
 * Empty tensors cover no bytes and cannot overlap anything. */
static int check_names_and_overlap(struct st_tensor *t, size_t n, struct err *e)
{
    qsort(t, n, sizeof *t, cmp_by_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[i - 1].name, t[i].name) == 0)
            return err_setf(e, ERR_FORMAT, "duplicate tensor name '%s'", t[i].name);

    const struct st_tensor **by_off = malloc((n ? n : 1) * sizeof *by_off);
    if (!by_off)
        return err_setf(e, ERR_NOMEM, "out of memory sorting %zu tensors", n);
    for (size_t i = 0; i < n; i++)
        by_off[i] = &t[i];
    qsort(by_off, n, sizeof *by_off, cmp_by_offsets);
    const struct st_tensor *last = NULL; /* non-empty tensor with the largest end so far */
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *c = by_off[i];
        if (c->begin == c->end)
            continue;
        if (last && c->begin < last->end) {
            rc = err_setf(e, ERR_FORMAT, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                          last->name, (unsigned long long)last->begin,
                          (unsigned long long)last->end, c->name,
                          (unsigned long long)c->begin, (unsigned long long)c->end);
            break;
        }
        if (!last || c->end > last->end)
            last = c;
    }
    free(by_off);
    return rc;
}

int st_header_parse(const char *json, size_t json_len, uint64_t data_len,
                    struct st_tensor **out, size_t *n_out, struct err *e)
{
    struct st_tensor *t = NULL;
    size_t n = 0;
    cJSON *root = NULL;
    int rc;

    *out = NULL;
    *n_out = 0;
    if (json_len > ST_MAX_HEADER)
        return err_setf(e, ERR_FORMAT, "header is %zu bytes, more than the %u-byte cap",
                        json_len, ST_MAX_HEADER);
    if ((rc = json_parse_object(json, json_len, "header", &root, e)) < 0)
        return rc;

    size_t cap = (size_t)cJSON_GetArraySize(root);
    t = calloc(cap ? cap : 1, sizeof *t);
    if (!t) {
        rc = err_setf(e, ERR_NOMEM, "out of memory for %zu tensors", cap);
        goto out_free;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        /* free-form string map; we neither need nor police it */
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        if ((rc = parse_entry(item, data_len, &t[n], e)) < 0)
            goto out_free;
        t[n].name = strdup(item->string);
        if (!t[n].name) {
            rc = err_setf(e, ERR_NOMEM, "out of memory for tensor names");
            goto out_free;
        }
        n++;
    }
    if ((rc = check_names_and_overlap(t, n, e)) < 0)
        goto out_free;
    *out = t;
    *n_out = n;
    t = NULL;
    rc = 0;
out_free:
    st_tensors_free(t, n);
    cJSON_Delete(root);
    return rc;
}

void st_tensors_free(struct st_tensor *t, size_t n)
{
    if (!t)
        return;
    for (size_t i = 0; i < n; i++)
        free(t[i].name);
    free(t);
}

// ---- one file ----

bool st_set_holds(const struct st_set *s, const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; s && i < s->n_files; i++) {
        uintptr_t d = (uintptr_t)s->files[i].data;
        if (a >= d && a - d <= s->files[i].data_len && len <= s->files[i].data_len - (a - d))
            return true;
    }
    return false;
}

static void file_close(struct st_file *f)
{
    file_unmap(f->map, f->map_len);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Map path read-only and parse its header. On success f owns the mapping and
 * *t and *n hold the tensors with data pointers set (file index 0). On failure f
 * is left empty and the message starts with the path. */
static int shard_open(struct st_file *f, const char *path, struct st_tensor **t, size_t *n,
                      struct err *e)
{
    int rc;

    memset(f, 0, sizeof *f);
    *t = NULL;
    *n = 0;
    f->path = strdup(path);
    if (!f->path)
        return err_setf(e, ERR_NOMEM, "%s: out of memory", path);
    const char *slash = strrchr(f->path, '/');
    f->base = slash ? slash + 1 : f->path;

    if ((rc = file_map_all(path, FILE_FOLDER, &f->map, &f->map_len, e)) < 0)
        goto fail;
    uint64_t size = f->map_len;
    if (size < 8) {
        rc = err_setf(e, ERR_FORMAT, "%s: file is %llu bytes, shorter than the 8-byte header length",
                      path, (unsigned long long)size);
        goto fail;
    }

    const uint8_t *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)  /* little-endian regardless of host */
        hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER) {
        rc = err_setf(e, ERR_FORMAT, "%s: header length %llu exceeds the %u-byte cap", path,
                      (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > size - 8) {
        rc = err_setf(e, ERR_FORMAT,
                      "%s: header length %llu exceeds the %llu bytes left in the file (truncated?)",
                      path, (unsigned long long)hlen, (unsigned long long)(size - 8));
        goto fail;
    }
    f->data = p + 8 + hlen;
    f->data_len = size - 8 - hlen;
    if ((rc = st_header_parse((const char *)p + 8, (size_t)hlen, f->data_len, t, n, e)) < 0) {
        err_prefix(e, "%s", path);
        goto fail;
    }
    for (size_t i = 0; i < *n; i++)
        (*t)[i].data = f->data + (*t)[i].begin;
    return 0;
fail:
    file_close(f);
    return rc;
}

// ---- sets ----

static struct st_tensor *set_find(const struct st_set *s, const char *name)
{
    struct st_tensor key = {.name = (char *)name};
    if (!s || !name || s->n == 0)
        return NULL;
    return bsearch(&key, s->t, s->n, sizeof key, cmp_by_name);
}

/* Open the n files at paths (caller keeps paths) as one set described by `where`. */
static int set_build(struct st_set **out, const char *where, char *const *paths, size_t n,
                     struct err *e)
{
    struct st_set *s;
    struct st_tensor *ft = NULL;
    size_t fn = 0;
    int rc;

    *out = NULL;
    if (n > ST_MAX_FILES)
        return err_setf(e, ERR_FORMAT, "%s: %zu files, at most %d supported", where, n,
                        ST_MAX_FILES);
    s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "%s: out of memory", where);
    s->where = strdup(where);
    s->files = calloc(n ? n : 1, sizeof *s->files);
    if (!s->where || !s->files) {
        rc = err_setf(e, ERR_NOMEM, "%s: out of memory", where);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if ((rc = shard_open(&s->files[i], paths[i], &ft, &fn, e)) < 0)
            goto fail;
        s->n_files++;
        struct st_tensor *grown = reallocarray(s->t, s->n + fn + 1, sizeof *s->t);
        if (!grown) {
            rc = err_setf(e, ERR_NOMEM, "%s: out of memory for %zu tensors", where, s->n + fn);
            goto fail;
        }
        s->t = grown;
        for (size_t j = 0; j < fn; j++) {
            ft[j].file = (int)i;
            s->t[s->n++] = ft[j];  /* names move to the set */
        }
        free(ft);
        ft = NULL;
        fn = 0;
    }
    qsort(s->t, s->n, sizeof *s->t, cmp_by_name_file);
    for (size_t i = 1; i < s->n; i++) {
        if (strcmp(s->t[i - 1].name, s->t[i].name) == 0) {
            rc = err_setf(e, ERR_FORMAT, "%s: duplicate tensor '%s' in %s and %s", where,
                          s->t[i].name, s->files[s->t[i - 1].file].base,
                          s->files[s->t[i].file].base);
            goto fail;
        }
    }
    *out = s;
    return 0;
fail:
    st_tensors_free(ft, fn);
    st_set_free(s);
    return rc;
}

static int path_join(char *buf, size_t cap, const char *dir, const char *name, struct err *e)
{
    int w = snprintf(buf, cap, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= cap)
        return err_setf(e, ERR_ARG, "path longer than %zu bytes: %s/%s", cap - 1, dir, name);
    return 0;
}

static void paths_free(char **p, size_t n)
{
    if (!p)
        return;
    for (size_t i = 0; i < n; i++)
        free(p[i]);
    free(p);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Folders named *.safetensors are skipped; anything else found is opened, and
 * file_open refuses what is not a regular file (a FIFO would otherwise hang). */
static bool is_directory(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_present(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static bool is_weight_file_name(const char *name)
{
    size_t len = strlen(name), sl = strlen(ST_SUFFIX);
    return len > sl && strcmp(name + len - sl, ST_SUFFIX) == 0 &&
           strcmp(name, ST_GOLDEN_NAME) != 0;
}

/* Every *.safetensors entry in dir but folders and golden.safetensors, sorted.
 * *out is a malloc'd array of malloc'd full paths (free with paths_free). */
static int discover(const char *dir, char ***out, size_t *n_out, struct err *e)
{
    char **p = NULL;
    size_t n = 0;
    char path[PATH_MAX];
    int rc = 0;

    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d)
        return err_setf(e, errno == ENOENT ? ERR_MISSING : ERR_IO, "cannot open directory %s: %s",
                        dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!is_weight_file_name(de->d_name))
            continue;
        if ((rc = path_join(path, sizeof path, dir, de->d_name, e)) < 0)
            goto fail;
        if (is_directory(path))
            continue;
        if (n == ST_MAX_FILES) {
            rc = err_setf(e, ERR_FORMAT, "more than %d *.safetensors files in %s", ST_MAX_FILES,
                          dir);
            goto fail;
        }
        char **grown = reallocarray(p, n + 1, sizeof *p);
        if (!grown || !(grown[n] = strdup(path))) {
            if (grown)
                p = grown;
            rc = err_setf(e, ERR_NOMEM, "out of memory listing %s", dir);
            goto fail;
        }
        p = grown;
        n++;
    }
    if (n == 0) {
        rc = err_setf(e, ERR_MISSING, "no *.safetensors files in %s", dir);
        goto fail;
    }
    qsort(p, n, sizeof *p, cmp_str);
    closedir(d);
    *out = p;
    *n_out = n;
    return 0;
fail:
    closedir(d);
    paths_free(p, n);
    return rc;
}

static int open_discovered(struct st_set **out, const char *dir, struct err *e)
{
    char **paths;
    size_t n;
    int rc = discover(dir, &paths, &n, e);
    if (rc < 0)
        return rc;
    rc = set_build(out, dir, paths, n, e);
    paths_free(paths, n);
    return rc;
}

// ---- index ----

/* Parse the index at path; *root owns the JSON, *wm points at its weight_map
 * object whose values have all been checked to be plain file names. */
static int index_load(const char *path, cJSON **root, const cJSON **wm, struct err *e)
{
    char *buf, what[PATH_MAX + 16];
    size_t len = 0;
    cJSON *r;
    int rc;

    *root = NULL;
    if ((rc = file_read_scoped(path, FILE_FOLDER, ST_MAX_INDEX, &buf, &len, e)) < 0)
        return rc;
    snprintf(what, sizeof what, "%s: index", path);
    rc = json_parse_object(buf, len, what, &r, e);
    free(buf);
    if (rc < 0)
        return rc;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "weight_map");
    if (!cJSON_IsObject(m) || !m->child) {
        rc = err_setf(e, ERR_FORMAT, "%s: index has no non-empty \"weight_map\" object", path);
        goto fail;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        const char *v = cJSON_IsString(it) ? it->valuestring : NULL;
        /* shard names are plain names inside the folder: no path traversal */
        if (!v || !v[0] || strchr(v, '/') || strcmp(v, ".") == 0 || strcmp(v, "..") == 0) {
            rc = err_setf(e, ERR_FORMAT, "%s: weight_map entry '%s' is not a shard file name",
                          path, it->string);
            goto fail;
        }
    }
    *root = r;
    *wm = m;
    return 0;
fail:
    cJSON_Delete(r);
    return rc;
}

/* The distinct shard names of wm, sorted; *out is a malloc'd array of
 * pointers into the JSON. */
static int index_shards(const cJSON *wm, const char *ipath, const char ***out, size_t *n_out,
                        struct err *e)
{
    size_t n = (size_t)cJSON_GetArraySize(wm), u = 0;
    const char **s = malloc(n * sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "%s: out of memory", ipath);
    const cJSON *it;
    size_t i = 0;
    cJSON_ArrayForEach(it, wm)
        s[i++] = it->valuestring;
    qsort(s, n, sizeof *s, cmp_str);
    for (i = 0; i < n; i++)
        if (u == 0 || strcmp(s[u - 1], s[i]) != 0)
            s[u++] = s[i];
    if (u > ST_MAX_FILES) {
        free(s);
        return err_setf(e, ERR_FORMAT, "%s: index names %zu shards, at most %d supported", ipath,
                        u, ST_MAX_FILES);
    }
    *out = s;
    *n_out = u;
    return 0;
}

/* Every weight_map entry must be in the shard it names. */
static int index_check(const struct st_set *s, const cJSON *wm, const char *ipath, struct err *e)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, wm) {
        const struct st_tensor *t = set_find(s, it->string);
        if (!t)
            return err_setf(e, ERR_FORMAT, "%s: index maps tensor '%s' to shard %s, which does "
                            "not contain it", ipath, it->string, it->valuestring);
        if (strcmp(s->files[t->file].base, it->valuestring) != 0)
            return err_setf(e, ERR_FORMAT, "%s: index maps tensor '%s' to shard %s, but it is "
                            "in %s", ipath, it->string, it->valuestring,
                            s->files[t->file].base);
    }
    return 0;
}

/* The index names `missing`, which does not exist. Accept discovery instead
 * if it holds every indexed tensor (a stale index); else report the shard. */
static int open_stale(struct st_set **out, const char *dir, const char *ipath, const cJSON *wm,
                      const char *missing, struct err *e)
{
    struct err sub = {0};
    struct st_set *s;
    if (open_discovered(&s, dir, &sub) < 0)
        return err_setf(e, ERR_MISSING, "%s names shard %s which is missing (the other "
                        "*.safetensors files did not open either: %s)", ipath, missing, sub.msg);
    const cJSON *it;
    cJSON_ArrayForEach(it, wm) {
        if (!set_find(s, it->string)) {
            st_set_free(s);
            return err_setf(e, ERR_MISSING, "%s names shard %s which is missing, and tensor "
                            "'%s' is in no other *.safetensors file", ipath, missing,
                            it->string);
        }
    }
    LOG_WARN("%s names shard %s which is missing; every indexed tensor is in the other "
             "*.safetensors files, so the index is treated as stale", ipath, missing);
    *out = s;
    return 0;
}

static int open_indexed(struct st_set **out, const char *dir, const char *ipath, struct err *e)
{
    cJSON *root;
    const cJSON *wm;
    const char **shards = NULL;
    char **paths = NULL;
    size_t n = 0, n_paths = 0;
    char path[PATH_MAX];
    int rc;

    if ((rc = index_load(ipath, &root, &wm, e)) < 0)
        return rc;
    if ((rc = index_shards(wm, ipath, &shards, &n, e)) < 0)
        goto out;
    paths = calloc(n, sizeof *paths);
    if (!paths) {
        rc = err_setf(e, ERR_NOMEM, "%s: out of memory", ipath);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if ((rc = path_join(path, sizeof path, dir, shards[i], e)) < 0)
            goto out;
        if (!is_present(path)) {
            rc = open_stale(out, dir, ipath, wm, shards[i], e);
            goto out;
        }
        if (!(paths[n_paths++] = strdup(path))) {
            rc = err_setf(e, ERR_NOMEM, "%s: out of memory", ipath);
            goto out;
        }
    }
    if ((rc = set_build(out, dir, paths, n_paths, e)) < 0)
        goto out;
    if ((rc = index_check(*out, wm, ipath, e)) < 0) {
        st_set_free(*out);
        *out = NULL;
    }
out:
    paths_free(paths, n_paths);
    free(shards);
    cJSON_Delete(root);
    return rc;
}

// ---- public ----

int st_set_open(struct st_set **out, const char *dir, struct err *e)
{
    char ipath[PATH_MAX];
    int rc;

    *out = NULL;
    if ((rc = path_join(ipath, sizeof ipath, dir, ST_INDEX_NAME, e)) < 0)
        return rc;
    if (access(ipath, F_OK) == 0)
        return open_indexed(out, dir, ipath, e);
    return open_discovered(out, dir, e);
}

int st_set_open_file(struct st_set **out, const char *path, struct err *e)
{
    char *const paths[1] = {(char *)path};
    *out = NULL;
    return set_build(out, path, paths, 1, e);
}

void st_set_free(struct st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_files; i++)
        file_close(&s->files[i]);
    st_tensors_free(s->t, s->n);
    free(s->files);
    free(s->where);
    free(s);
}

size_t st_set_count(const struct st_set *s)
{
    return s ? s->n : 0;
}

const struct st_tensor *st_set_at(const struct st_set *s, size_t i)
{
    return s && i < s->n ? &s->t[i] : NULL;
}

const struct st_tensor *st_set_find(const struct st_set *s, const char *name)
{
    return set_find(s, name);
}

size_t st_set_n_files(const struct st_set *s)
{
    return s ? s->n_files : 0;
}

const char *st_set_file_path(const struct st_set *s, size_t i)
{
    return s && i < s->n_files ? s->files[i].path : NULL;
}

uint64_t st_set_data_bytes(const struct st_set *s)
{
    uint64_t b = 0;
    for (size_t i = 0; s && i < s->n; i++)
        b += s->t[i].end - s->t[i].begin;
    return b;
}

static int take(struct st_set *s, const char *name, struct tensor *out, bool optional,
                struct err *e)
{
    static const int64_t scalar_shape[1] = {1};
    memset(out, 0, sizeof *out);
    struct st_tensor *t = set_find(s, name);
    if (!t) {
        if (optional)
            return 0;
        return err_setf(e, ERR_MISSING, "missing tensor '%s' in %s", name,
                        s ? s->where : "(no checkpoint)");
    }
    if (t->ndim > TENSOR_MAX_DIMS)
        return err_setf(e, ERR_FORMAT, "tensor '%s' in %s has %d dims, at most %d supported",
                        name, s->files[t->file].path, t->ndim, TENSOR_MAX_DIMS);
    /* the mapping is PROT_READ: writing through data faults */
    void *data = (void *)(uintptr_t)t->data;
    if (t->ndim == 0)  /* a scalar is [1], since ndim 0 means "absent" */
        tensor_init(out, t->dtype, data, 1, scalar_shape);
    else
        tensor_init(out, t->dtype, data, t->ndim, t->shape);
    out->name = t->name;
    t->consumed = true;
    return 0;
}

int st_set_take(struct st_set *s, const char *name, struct tensor *out, struct err *e)
{
    return take(s, name, out, false, e);
}

int st_set_take_opt(struct st_set *s, const char *name, struct tensor *out, struct err *e)
{
    return take(s, name, out, true, e);
}

void st_set_mark(struct st_set *s, const char *name)
{
    struct st_tensor *t = set_find(s, name);
    if (t)
        t->consumed = true;
}

size_t st_set_n_unused(const struct st_set *s)
{
    size_t n = 0;
    for (size_t i = 0; s && i < s->n; i++)
        n += !s->t[i].consumed;
    return n;
}

int st_set_rename_prefix(struct st_set *s, const char *from, const char *to, struct err *e)
{
    size_t nf = strlen(from), nt = strlen(to);
    int n = 0;
    for (size_t i = 0; i < s->n; i++) {
        const char *name = s->t[i].name;
        if (strncmp(name, from, nf) != 0)
            continue;
        size_t rest = strlen(name + nf);
        char *nn = malloc(nt + rest + 1);
        if (!nn)
            return err_setf(e, ERR_NOMEM, "out of memory renaming tensors");
        memcpy(nn, to, nt);
        memcpy(nn + nt, name + nf, rest + 1);
        free(s->t[i].name);
        s->t[i].name = nn;
        n++;
    }
    if (n == 0)
        return 0;
    qsort(s->t, s->n, sizeof *s->t, cmp_by_name);
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->t[i - 1].name, s->t[i].name) == 0)
            return err_setf(e, ERR_FORMAT, "%s: tensor '%.200s' is stored twice (once as '%s...')", s->where,
                            s->t[i].name, from);
    return n;
}

size_t st_set_mark_prefix(struct st_set *s, const char *prefix)
{
    size_t np = strlen(prefix), n = 0;
    for (size_t i = 0; s && i < s->n; i++)
        if (strncmp(s->t[i].name, prefix, np) == 0 && !s->t[i].consumed) {
            s->t[i].consumed = true;
            n++;
        }
    return n;
}

// ---- recording sets ----

int st_set_new_recording(struct st_set **out, const char *const *prefer, struct err *e)
{
    struct st_set *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s || !(s->where = strdup("(recording)"))) {
        free(s);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    s->recording = true;
    s->prefer = prefer;
    *out = s;
    return 0;
}

bool st_set_record_prefers(const struct st_set *s, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; st_set_is_recording(s) && s->prefer && s->prefer[i]; i++) {
        size_t k = strlen(s->prefer[i]);
        if (n >= k && strcmp(name + n - k, s->prefer[i]) == 0)
            return true;
    }
    return false;
}

bool st_set_is_recording(const struct st_set *s)
{
    return s && s->recording;
}

int st_set_record(struct st_set *s, const char *name, enum dtype dt, int ndim, const int64_t *shape,
                  struct err *e)
{
    /* what recorded views point at: aligned for every dtype, never read */
    static const uint64_t k_dummy[8];
    if (!st_set_is_recording(s))
        return err_setf(e, ERR_INTERNAL, "st_set_record on a set read from files");
    if (set_find(s, name))
        return 0;
    /* a stored entry's dims: wmap's tensors have at most TENSOR_MAX_DIMS, Qwen-VL's Conv3d 5 */
    if (ndim < 1 || ndim > ST_MAX_DIMS || dtype_size(dt) == 0)
        return err_setf(e, ERR_INTERNAL, "tensor '%s': cannot record %d dims", name, ndim);
    uint64_t bytes = dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || (uint64_t)shape[i] > (UINT64_C(1) << 40) / bytes)
            return err_setf(e, ERR_RANGE, "tensor '%s': dim %d = %lld is out of range", name, i,
                            (long long)shape[i]);
        bytes *= (uint64_t)shape[i];
    }
    struct st_tensor *grown = reallocarray(s->t, s->n + 1, sizeof *s->t);
    if (!grown)
        return err_setf(e, ERR_NOMEM, "out of memory recording '%s'", name);
    s->t = grown;
    size_t at = 0;
    while (at < s->n && strcmp(s->t[at].name, name) < 0)
        at++;
    struct st_tensor t = {.dtype = dt, .ndim = ndim, .data = k_dummy};
    if (!(t.name = strdup(name)))
        return err_setf(e, ERR_NOMEM, "out of memory recording '%s'", name);
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    t.begin = st_set_data_bytes(s);
    t.end = t.begin + bytes;
    memmove(&s->t[at + 1], &s->t[at], (s->n - at) * sizeof *s->t);
    s->t[at] = t;
    s->n++;
    return 0;
}
