/*
 * json: bounded JSON object documents (json.h).
 *
 * cJSON stops at the end of the first value and, given a length, never reads
 * past it; what comes after that value is checked here. The NUL scan comes
 * first because cJSON would otherwise hand back strings cut at the NUL.
 *
 * cJSON is looser than RFC 8259 in two ways that matter: its numbers are
 * whatever strtod takes from a run of [0-9+-.eE] ("02", "1.", "-.5" all
 * parse), and an object may hold a key twice (cJSON_GetObjectItem then finds
 * the first, where Python's json keeps the last). After cJSON has accepted a
 * document, json_check_numbers walks its bytes once more, tracking the path,
 * and refuses every number outside the RFC grammar; duplicate keys are found
 * on the tree (each object's keys sorted) and, by the caller's policy, kept,
 * dropped but the last, or refused.
 */
#include "json.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

#define JSON_PATH_DEPTH 1024   /* levels tracked for paths (cJSON nests at most 1000) */
#define JSON_PATH_KEY   64     /* bytes of one key shown in a path */

/* JSON's four whitespace bytes (RFC 8259 section 2); cJSON's own skipping is
 * looser (every byte <= 0x20), so trailing bytes are checked against these. */
static bool is_json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* RFC 8259 section 6: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static bool number_ok(const char *p, size_t n)
{
    size_t i = 0, s;
    if (i < n && p[i] == '-')
        i++;
    if (i < n && p[i] == '0')
        i++;
    else if (i < n && p[i] >= '1' && p[i] <= '9')
        while (i < n && is_digit(p[i]))
            i++;
    else
        return false;
    if (i < n && p[i] == '.') {
        for (s = ++i; i < n && is_digit(p[i]);)
            i++;
        if (i == s)
            return false;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        if (++i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        for (s = i; i < n && is_digit(p[i]);)
            i++;
        if (i == s)
            return false;
    }
    return i == n;
}

/* ---- paths ---- */

struct pframe {
    bool obj;
    bool want_key;      /* object: the next string is a key */
    size_t idx;         /* array: the element's index */
    const char *key;    /* object: the current key's raw bytes */
    size_t key_len;
};

/* Appends one path step to out[*n .. cap): ".key" (no dot first) or "[i]". */
static void path_step(char *out, size_t cap, size_t *n, bool obj, const char *key, size_t key_len,
                      size_t idx)
{
    int k;
    if (*n >= cap)
        return;
    if (obj)
        k = snprintf(out + *n, cap - *n, "%s%.*s%s", *n ? "." : "", (int)(key_len > JSON_PATH_KEY ? JSON_PATH_KEY : key_len),
                     key, key_len > JSON_PATH_KEY ? "..." : "");
    else
        k = snprintf(out + *n, cap - *n, "[%zu]", idx);
    if (k > 0)
        *n = *n + (size_t)k < cap ? *n + (size_t)k : cap - 1;
}

int json_check_numbers(const char *buf, size_t len, char *path, size_t cap, size_t *at)
{
    struct pframe *st = malloc(JSON_PATH_DEPTH * sizeof *st);
    size_t depth = 0, i = 0;
    int rc = 0;
    if (!st)
        return -ERR_NOMEM;
    while (i < len && rc == 0) {
        char c = buf[i];
        struct pframe *f = depth && depth <= JSON_PATH_DEPTH ? &st[depth - 1] : NULL;
        if (c == '"') {
            size_t s = ++i;
            while (i < len && buf[i] != '"')
                i += buf[i] == '\\' ? 2 : 1;
            if (f && f->obj && f->want_key) {
                f->key = buf + s;
                f->key_len = (i < len ? i : len) - s;
                f->want_key = false;
            }
            i++;
        } else if (c == '{' || c == '[') {
            if (depth < JSON_PATH_DEPTH)
                st[depth] = (struct pframe){.obj = c == '{', .want_key = c == '{'};
            depth++;
            i++;
        } else if (c == '}' || c == ']') {
            depth -= depth > 0;
            i++;
        } else if (c == ',') {
            if (f && f->obj)
                f->want_key = true;
            else if (f)
                f->idx++;
            i++;
        } else if (c == '-' || is_digit(c)) {
            size_t s = i;
            while (i < len && (is_digit(buf[i]) || strchr("+-.eE", buf[i])))
                i++;
            if (!number_ok(buf + s, i - s)) {
                size_t n = 0;
                if (cap)
                    path[0] = '\0';
                for (size_t d = 0; d < depth && d < JSON_PATH_DEPTH; d++)
                    path_step(path, cap, &n, st[d].obj, st[d].key, st[d].key_len, st[d].idx);
                *at = s;
                rc = -ERR_FORMAT;
            }
        } else {
            i++;
        }
    }
    free(st);
    return rc;
}

/* ---- duplicate keys ---- */

struct kpos {
    cJSON *item;
    size_t pos;
};

static int kpos_cmp(const void *a, const void *b)
{
    const struct kpos *x = a, *y = b;
    int c = strcmp(x->item->string, y->item->string);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Handles the duplicate keys of object o (and of everything below it) by policy;
 * path[0 .. n) names o. */
static int dups_walk(cJSON *o, enum json_dups policy, char *path, size_t cap, size_t n, int depth)
{
    size_t count = 0, k = 0;
    int rc = 0;
    if (depth > JSON_PATH_DEPTH)
        return 0;
    for (cJSON *c = o->child; c; c = c->next) {
        size_t m = n;
        if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            if (cap)
                path[n] = '\0';
            path_step(path, cap, &m, cJSON_IsObject(o), c->string ? c->string : "",
                      c->string ? strlen(c->string) : 0, count);
            if ((rc = dups_walk(c, policy, path, cap, m, depth + 1)) != 0)
                return rc;
        }
        count++;
    }
    if (!cJSON_IsObject(o) || count < 2)
        return 0;
    struct kpos *a = malloc(count * sizeof *a);
    if (!a)
        return -ERR_NOMEM;
    for (cJSON *c = o->child; c; c = c->next, k++)
        a[k] = (struct kpos){c, k};
    qsort(a, count, sizeof *a, kpos_cmp);
    for (k = 0; k + 1 < count && rc == 0; k++) {
        if (strcmp(a[k].item->string, a[k + 1].item->string) != 0)
            continue;
        if (policy == JSON_DUPS_REFUSE) {
            if (cap)
                path[n] = '\0';
            path_step(path, cap, &n, true, a[k].item->string, strlen(a[k].item->string), 0);
            rc = 1;
        } else {  /* the later one of the pair stays: the run's last survives */
            cJSON_Delete(cJSON_DetachItemViaPointer(o, a[k].item));
        }
    }
    free(a);
    return rc;
}

int json_find_duplicate(const cJSON *root, char *path, size_t cap)
{
    if (cap)
        path[0] = '\0';
    return root ? dups_walk((cJSON *)root, JSON_DUPS_REFUSE, path, cap, 0, 0) : 0;
}

/* ---- documents ---- */

int json_parse_doc(const char *buf, size_t len, const char *what, enum json_dups dups, cJSON **out,
                   struct err *e)
{
    const char *end = NULL;
    char path[256];
    size_t bad_at = 0;
    int rc;
    *out = NULL;
    const char *nul = len ? memchr(buf, '\0', len) : NULL;
    if (nul)
        return err_setf(e, ERR_FORMAT, "%s is not valid JSON (error at byte %zu of %zu: NUL byte)",
                        what, (size_t)(nul - buf), len);
    errno = 0;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    /* cJSON returns NULL for bad syntax and a failed allocation alike; malloc sets ENOMEM */
    if (!root && errno == ENOMEM)
        return err_setf(e, ERR_NOMEM, "%s: out of memory parsing JSON", what);
    if (!root) {
        size_t off = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        return err_setf(e, ERR_FORMAT, "%s is not valid JSON (error at byte %zu of %zu)", what,
                        off, len);
    }
    size_t at = (size_t)(end - buf);
    while (at < len && is_json_space(buf[at]))
        at++;
    if (at != len) {
        rc = err_setf(e, ERR_FORMAT,
                      "%s is not valid JSON (error at byte %zu of %zu: trailing bytes after the "
                      "top-level value)", what, at, len);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        rc = err_setf(e, ERR_FORMAT, "%s is not a JSON object", what);
        goto fail;
    }
    if ((rc = json_check_numbers(buf, len, path, sizeof path, &bad_at)) < 0) {
        rc = rc == -ERR_NOMEM ? err_setf(e, ERR_NOMEM, "%s: out of memory parsing JSON", what)
                              : err_setf(e, ERR_FORMAT, "%s is not valid JSON (error at byte %zu of %zu: "
                                         "not a JSON number, at '%s')", what, bad_at, len, path);
        goto fail;
    }
    if (dups != JSON_DUPS_KEEP && (rc = dups_walk(root, dups, path, sizeof path, 0, 0)) != 0) {
        rc = rc < 0 ? err_setf(e, ERR_NOMEM, "%s: out of memory parsing JSON", what)
                    : err_setf(e, ERR_FORMAT, "%s: the key '%s' appears twice", what, path);
        goto fail;
    }
    *out = root;
    return 0;
fail:
    cJSON_Delete(root);
    return rc;
}

int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e)
{
    return json_parse_doc(buf, len, what, JSON_DUPS_KEEP, out, e);
}

int json_load_object(const char *path, enum file_scope scope, size_t max, cJSON **out,
                     struct err *e)
{
    char *buf = NULL;
    size_t n = 0;
    *out = NULL;
    int rc = file_read_scoped(path, scope, max, &buf, &n, e);
    if (rc < 0)
        return rc;
    rc = json_parse_doc(buf, n, path, JSON_DUPS_LAST, out, e);
    free(buf);
    return rc;
}
