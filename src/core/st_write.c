/*
 * st_write: streaming safetensors writer (st_write.h). The header is built
 * in memory (bounded by ST_MAX_HEADER like the reader's), the data streams
 * through stdio with every call checked.
 */
#include "st_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ST_W_MAX_NAME 1024

struct st_writer {
    FILE *f;
    char *path, *tmp;         /* owned */
    uint64_t *ends;           /* [n] cumulative end offset of each entry */
    size_t n, cur;            /* entries, entry of the next byte */
    uint64_t written, total;  /* data bytes */
};

uint64_t st_wentry_bytes(const struct st_wentry *t)
{
    uint64_t n = dtype_size(t->dtype);
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || n == 0)
        return 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || (t->shape[i] > 0 && n > UINT64_MAX / 2 / (uint64_t)t->shape[i]))
            return 0;
        n *= (uint64_t)t->shape[i];
    }
    return n;
}

/* ---- header JSON ---- */

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = cap <= ST_MAX_HEADER + 16 ? realloc(b->p, cap) : NULL;
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(struct sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_u64(struct sbuf *b, uint64_t v)
{
    char t[32];
    int k = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_put(b, t, (size_t)k);
}

/* A JSON string: quotes, backslashes and control bytes escaped; other bytes as is. */
static void sb_json_str(struct sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char t[8];
        if (*p == '"' || *p == '\\') {
            t[0] = '\\';
            t[1] = (char)*p;
            sb_put(b, t, 2);
        } else if (*p < 0x20) {
            snprintf(t, sizeof t, "\\u%04x", *p);
            sb_put(b, t, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_entries(const char *path, const struct st_wentry *ents, size_t n, struct err *e)
{
    for (size_t i = 0; i < n; i++) {
        const struct st_wentry *t = &ents[i];
        size_t len = t->name ? strlen(t->name) : 0;
        if (len == 0 || len > ST_W_MAX_NAME)
            return err_setf(e, ERR_ARG, "%s: tensor %zu has an empty or over-long name", path, i);
        if (strcmp(t->name, "__metadata__") == 0)
            return err_setf(e, ERR_ARG, "%s: '__metadata__' is not a tensor name", path);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS || dtype_size(t->dtype) == 0)
            return err_setf(e, ERR_ARG, "%s: tensor '%s': bad dtype or %d dims", path, t->name, t->ndim);
        bool empty = false;
        for (int d = 0; d < t->ndim; d++)
            empty |= t->shape[d] == 0;
        if (!empty && st_wentry_bytes(t) == 0)
            return err_setf(e, ERR_ARG, "%s: tensor '%s': shape overflows or is negative", path, t->name);
    }
    /* duplicates: sort the names and compare neighbours */
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names)
        return err_setf(e, ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++)
        names[i] = ents[i].name;
    qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = err_setf(e, ERR_ARG, "%s: duplicate tensor '%s'", path, names[i]);
    free(names);
    return rc;
}

static int build_header(struct sbuf *b, const struct st_wentry *ents, size_t n, uint64_t *ends)
{
    uint64_t off = 0;
    sb_put(b, "{", 1);
    for (size_t i = 0; i < n; i++) {
        const struct st_wentry *t = &ents[i];
        uint64_t sz = st_wentry_bytes(t);
        if (off > UINT64_MAX / 2 - sz)
            return -1;
        sb_json_str(b, t->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, dtype_name(t->dtype));
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d)
                sb_put(b, ",", 1);
            sb_u64(b, (uint64_t)t->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_u64(b, off);
        sb_put(b, ",", 1);
        off += sz;
        sb_u64(b, off);
        sb_str(b, "]},");
        ends[i] = off;
    }
    sb_str(b, "\"__metadata__\":{\"format\":\"mlx\"}}");
    while (!b->oom && b->len % 8 != 0)  /* 8 + len is then a multiple of 8 too */
        sb_put(b, " ", 1);
    return b->oom || b->len > ST_MAX_HEADER ? -1 : 0;
}

/* ---- writer ---- */

static void writer_free(struct st_writer *w)
{
    free(w->path);
    free(w->tmp);
    free(w->ends);
    free(w);
}

void st_writer_abort(struct st_writer *w)
{
    if (!w)
        return;
    if (w->f)
        fclose(w->f);
    unlink(w->tmp);
    writer_free(w);
}

int st_writer_open(struct st_writer **out, const char *path, const struct st_wentry *ents, size_t n,
                   struct err *e)
{
    struct sbuf hb = {0};
    int rc;
    *out = NULL;
    if ((rc = check_entries(path, ents, n, e)) < 0)
        return rc;
    struct st_writer *w = calloc(1, sizeof *w);
    if (!w)
        return err_setf(e, ERR_NOMEM, "%s: out of memory", path);
    size_t plen = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(plen + 8);
    w->ends = calloc(n ? n : 1, sizeof *w->ends);
    if (!w->path || !w->tmp || !w->ends) {
        writer_free(w);
        return err_setf(e, ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp, plen + 8, "%s.tmp", path);
    w->n = n;
    if (build_header(&hb, ents, n, w->ends) < 0) {
        free(hb.p);
        writer_free(w);
        return err_setf(e, ERR_RANGE, "%s: header of %zu tensors is too large (at most %u bytes)",
                        path, n, ST_MAX_HEADER);
    }
    w->total = n ? w->ends[n - 1] : 0;
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        rc = err_setf(e, ERR_IO, "cannot create %s: %s", w->tmp, strerror(errno));
        free(hb.p);
        writer_free(w);
        return rc;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hb.len >> (8 * i));
    if (fwrite(len8, 1, 8, w->f) != 8 || fwrite(hb.p, 1, hb.len, w->f) != hb.len) {
        rc = err_setf(e, ERR_IO, "writing %s: %s", w->tmp, strerror(errno));
        free(hb.p);
        st_writer_abort(w);
        return rc;
    }
    free(hb.p);
    while (w->cur < w->n && w->ends[w->cur] == 0)
        w->cur++;
    *out = w;
    return 0;
}

int st_writer_write(struct st_writer *w, const void *data, size_t n, struct err *e)
{
    if (n > w->total - w->written)
        return err_setf(e, ERR_INTERNAL, "%s: %zu bytes more than the %llu declared", w->tmp, n,
                        (unsigned long long)w->total);
    if (n && fwrite(data, 1, n, w->f) != n)
        return err_setf(e, ERR_IO, "writing %s: %s", w->tmp, strerror(errno));
    w->written += n;
    while (w->cur < w->n && w->ends[w->cur] <= w->written)
        w->cur++;
    return 0;
}

size_t st_writer_cursor(const struct st_writer *w)
{
    return w->cur;
}

int st_writer_close(struct st_writer *w, struct err *e)
{
    int rc = 0;
    if (w->written != w->total) {
        rc = err_setf(e, ERR_INTERNAL, "%s: %llu of %llu data bytes written", w->tmp,
                      (unsigned long long)w->written, (unsigned long long)w->total);
        st_writer_abort(w);
        return rc;
    }
    FILE *f = w->f;
    w->f = NULL;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = err_setf(e, ERR_IO, "writing %s: %s", w->tmp, strerror(errno));
        fclose(f);
    } else if (fclose(f) != 0) {
        rc = err_setf(e, ERR_IO, "closing %s: %s", w->tmp, strerror(errno));
    } else if (rename(w->tmp, w->path) != 0) {
        rc = err_setf(e, ERR_IO, "renaming %s to %s: %s", w->tmp, w->path, strerror(errno));
    }
    if (rc < 0)
        unlink(w->tmp);
    writer_free(w);
    return rc;
}
