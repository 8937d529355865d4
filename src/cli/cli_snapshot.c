/*
 * cli_snapshot: is a model folder whole? `list` shows a folder with files
 * missing as "partial" and `-m owner/name` refuses one with a hint to pull it
 * again, instead of a load error about some shard.
 *
 * cli_model_load is model_load with that hint when the load fails.
 *
 * A folder is partial when the safetensors index names a shard that is not a
 * regular file there, when it has no index and no *.safetensors at all, when a
 * file in it is a symlink to nothing (an HF snapshot whose blob is gone), or,
 * for an HF repository folder, when blobs/ holds a *.incomplete download (an
 * interrupted huggingface_hub or mlxcel pull). Only the folder itself is read
 * (no recursion); the index is read through the folder-confined file reader
 * with the loader's size bound.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "../core/fileio.h"
#include "../core/json.h"
#include "../core/log.h"
#include "../models/model.h"
#include "cli.h"

#define SNAP_MAX_ENTRIES 100000      /* entries looked at in one folder */
#define SNAP_INDEX_MAX   (64u << 20) /* bytes of model.safetensors.index.json */

/* Note one missing file: count it, keep the first name. */
static void note_missing(struct cli_snapshot_check *c, const char *name)
{
    if (c->n_missing++ == 0)
        snprintf(c->first_missing, sizeof c->first_missing, "%s", name);
}

static bool is_regular(const char *dir, const char *name)
{
    char p[8192];
    struct stat st;
    return (size_t)snprintf(p, sizeof p, "%s/%s", dir, name) < sizeof p && stat(p, &st) == 0 &&
           S_ISREG(st.st_mode);
}

/* The shards the index names that are not there. -1: the index is unreadable (the loader
 * says why; that is not this check's business). */
static int check_index(struct cli_snapshot_check *c, const char *dir)
{
    char p[8192];
    cJSON *root = NULL;
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (json_load_object(p, FILE_FOLDER, SNAP_INDEX_MAX, &root, NULL) < 0)
        return -1;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map"), *it;
    cJSON_ArrayForEach(it, wm) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || !it->valuestring[0])
            continue;
        /* the same shard is named by many tensors: count it once (first occurrence) */
        const cJSON *prev;
        bool seen = false;
        for (prev = wm->child; prev != it && !seen; prev = prev->next)
            seen = cJSON_IsString(prev) && strcmp(prev->valuestring, it->valuestring) == 0;
        if (!seen && !is_regular(dir, it->valuestring))
            note_missing(c, it->valuestring);
    }
    cJSON_Delete(root);
    return 0;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Dangling symlinks in dir, and whether it holds a *.safetensors file. */
static void check_entries(struct cli_snapshot_check *c, const char *dir, bool *weights)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    for (size_t seen = 0; seen < SNAP_MAX_ENTRIES && (de = readdir(d)); seen++) {
        char p[8192];
        struct stat st;
        if (de->d_name[0] == '.' || (size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= sizeof p)
            continue;
        if (lstat(p, &st) == 0 && S_ISLNK(st.st_mode) && stat(p, &st) != 0)
            note_missing(c, de->d_name);
        else if (has_suffix(de->d_name, ".safetensors") && S_ISREG(st.st_mode))
            *weights = true;
    }
    closedir(d);
}

/* blobs/ of the HF repository that holds snapshot dir (<repo>/snapshots/<rev>), if it is one. */
static void check_blobs(struct cli_snapshot_check *c, const char *dir)
{
    char blobs[8192];
    const char *s = strstr(dir, "/snapshots/");
    if (!s || strchr(s + 11, '/'))
        return;
    snprintf(blobs, sizeof blobs, "%.*s/blobs", (int)(s - dir), dir);
    DIR *d = opendir(blobs);
    if (!d)
        return;
    struct dirent *de;
    for (size_t seen = 0; seen < SNAP_MAX_ENTRIES && (de = readdir(d)); seen++)
        if (has_suffix(de->d_name, ".incomplete"))
            c->n_incomplete++;
    closedir(d);
}

void cli_snapshot_check(const char *dir, struct cli_snapshot_check *c)
{
    memset(c, 0, sizeof *c);
    bool weights = false;
    check_entries(c, dir, &weights);
    if (is_regular(dir, "model.safetensors.index.json"))
        (void)check_index(c, dir);
    else if (!weights && c->n_missing == 0)
        note_missing(c, "*.safetensors");
    check_blobs(c, dir);
}

bool cli_snapshot_is_partial(const struct cli_snapshot_check *c)
{
    return c->n_missing > 0 || c->n_incomplete > 0;
}

void cli_snapshot_describe(const struct cli_snapshot_check *c, char *buf, size_t cap)
{
    if (c->n_missing > 1)
        snprintf(buf, cap, "%s and %zu more file(s) missing", c->first_missing, c->n_missing - 1);
    else if (c->n_missing == 1)
        snprintf(buf, cap, "%s missing", c->first_missing);
    else
        snprintf(buf, cap, "%zu unfinished download(s) in blobs/", c->n_incomplete);
}

/* The repository of dir for the hint, false when dir is none: owner/name from
 * <cache>/models--owner--name/snapshots/<rev>, or from <models dir>/owner/name (where
 * `-m owner/name` finds a converted model). A folder elsewhere is the user's own: its last two
 * components name no repository (a pull of them would fetch something unrelated). */
static bool repo_of(const char *dir, char *buf, size_t cap)
{
    const char *s = strstr(dir, "/models--"), *snap = s ? strstr(s, "/snapshots/") : NULL;
    const char *sep = s && snap ? strstr(s + 9, "--") : NULL;
    if (sep && sep < snap) {
        snprintf(buf, cap, "%.*s/%.*s", (int)(sep - (s + 9)), s + 9, (int)(snap - (sep + 2)), sep + 2);
        return true;
    }
    char md[PATH_MAX], rmd[PATH_MAX], rdir[PATH_MAX];
    cli_models_dir(md, sizeof md);
    if (!realpath(md, rmd) || !realpath(dir, rdir))
        return false;
    size_t n = strlen(rmd);
    if (strncmp(rdir, rmd, n) != 0 || rdir[n] != '/')
        return false;
    const char *rest = rdir + n + 1, *slash = strchr(rest, '/');
    if (!slash || slash == rest || !slash[1] || strchr(slash + 1, '/'))
        return false;
    snprintf(buf, cap, "%s", rest);
    return true;
}

void cli_hint_partial(const char *dir, struct err *e)
{
    struct cli_snapshot_check sc;
    if (!e)
        return;
    cli_snapshot_check(dir, &sc);
    if (!cli_snapshot_is_partial(&sc))
        return;
    char what[320], repo[512], msg[sizeof e->msg];
    cli_snapshot_describe(&sc, what, sizeof what);
    snprintf(msg, sizeof msg, "%s", e->msg);
    if (repo_of(dir, repo, sizeof repo))
        err_setf(e, e->code, "%s; the model folder is incomplete (%s): `mlxcel pull %s` completes it", msg, what,
                 repo);
    else
        err_setf(e, e->code, "%s; the model folder is incomplete (%s)", msg, what);
}

int cli_model_load(struct model **m, const char *dir, struct err *e)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = model_load(m, dir, e);
    if (rc < 0) {
        cli_hint_partial(dir, e);
        return rc;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    LOG_INFO("loaded %s in %.3f s", dir, (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    return rc;
}
