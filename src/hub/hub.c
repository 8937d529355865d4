/*
 * hub: a pull from start to end (hub.h). The steps, in order:
 *   1. check the repository name and revision; find the endpoint, the cache
 *      folder and the token;
 *   2. GET the listing (/api/models/<repo>/revision/<rev>?blobs=true): the
 *      commit and every file with its size and, for LFS files, its sha256;
 *      keep the wanted files (--include/--exclude or the inference set);
 *   3. HEAD each wanted file's resolve URL at that commit for its etag (the
 *      blob name) and size, which must agree with the listing; a blob
 *      already in blobs/ with the right size is not fetched again;
 *   4. check the free disk space against what is left to fetch;
 *   5. transfer (hub_xfer.c);
 *   6. only then write the snapshot links and refs/<revision>, so a failed
 *      pull leaves blobs/<etag>.incomplete to resume from but never a snapshot
 *      with missing or unverified files.
 * Offline (opts.offline: --offline or $HF_HUB_OFFLINE in the CLI) only resolves what the cache has.
 */
#include "hub.h"
#include "hub_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../core/fileio.h"

#define TOKEN_FILE_MAX 4096

// ---- local files ----

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* mkdir -p path (0755). */
static int mkdir_p(const char *path, struct err *e)
{
    char buf[4800];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return err_setf(e, ERR_ARG, "path too long: %.200s", path);
    for (char *s = buf + 1;; s++) {
        if (*s != '/' && *s)
            continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return err_setf(e, ERR_IO, "cannot create %s: %s", buf, strerror(errno));
        if (!is_dir(buf))
            return err_setf(e, ERR_IO, "%s exists and is not a folder", buf);
        *s = saved;
        if (!saved)
            return 0;
    }
}

/* The token: opts' token, else the token file opts names (the CLI resolves both from
 * $HF_TOKEN, $HUGGING_FACE_HUB_TOKEN, $HF_TOKEN_PATH and $HF_HOME as huggingface_hub does). */
static int find_token(const struct hub_opts *o, char *buf, size_t cap, struct err *e)
{
    const char *t = o->token;
    char *text = NULL;
    if ((!t || !*t) && o->token_path && *o->token_path) {
        const char *path = o->token_path;
        if (access(path, F_OK) == 0 && file_read_all(path, TOKEN_FILE_MAX, &text, NULL, e) < 0)
            return err_prefix(e, "reading the token file: ");
        t = text;
    }
    buf[0] = '\0';
    if (t) {
        size_t n = strcspn(t, "\r\n");
        while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\t'))
            n--;
        while (n > 0 && (*t == ' ' || *t == '\t'))
            t++, n--;
        bool ok = n < cap;
        for (size_t i = 0; i < n && ok; i++)
            ok = t[i] > 0x20 && t[i] < 0x7f;
        if (!ok) {
            free(text);
            return err_setf(e, ERR_ARG, "the Hugging Face token is not one line of printable ASCII");
        }
        snprintf(buf, cap, "%.*s", (int)n, t);
    }
    free(text);
    return 0;
}

// ---- plan ----

/* Keep the wanted files of l (freeing the others). */
static int keep_wanted(struct hub_listing *l, const struct hub_opts *o, const char *repo, struct err *e)
{
    size_t k = 0;
    for (size_t i = 0; i < l->n_files; i++) {
        if (hub_name_is_wanted(l->files[i].name, o->include, o->n_include, o->exclude, o->n_exclude))
            l->files[k++] = l->files[i];
        else
            free(l->files[i].name);
    }
    l->n_files = k;
    if (k == 0)
        return err_setf(e, ERR_MISSING, "%s: no file matches%s", repo,
                        o->n_include ? " --include" : " the default set (*.safetensors, *.json, tokenizer files)");
    return 0;
}

/* HEAD f's resolve URL: its etag and size, held to the listing. */
static int head_file(const struct hub_client *c, struct hub_pull *p, struct hub_file *f, struct err *e)
{
    char url[8192], what[HUB_NAME_MAX + 32];
    struct hub_headers h;
    int rc;
    snprintf(url, sizeof url, "%s/%s/resolve/%s/", c->endpoint, p->repo, p->list.commit);
    hub_url_escape(url, sizeof url, f->name, true);
    snprintf(what, sizeof what, "%s", f->name);
    if ((rc = hub_http_head(c, url, what, &h, e)) < 0)
        return rc;
    if (h.commit[0] && strcmp(h.commit, p->list.commit) != 0)
        return err_setf(e, ERR_FORMAT, "%s: the server resolved commit %.64s, the listing said %s; run the pull again",
                        f->name, h.commit, p->list.commit);
    if (!hub_hex_is_valid(h.etag, 32, 128))
        return err_setf(e, ERR_FORMAT, "%s: the server gave no usable ETag ('%.64s')", f->name, h.etag);
    if (f->sha256[0] && strcmp(h.etag, f->sha256) != 0)
        return err_setf(e, ERR_FORMAT, "%s: the ETag %s is not the listing's sha256 %s", f->name, h.etag, f->sha256);
    if (!f->sha256[0] && h.linked_etag && strlen(h.etag) == 64)
        snprintf(f->sha256, sizeof f->sha256, "%s", h.etag);
    snprintf(f->etag, sizeof f->etag, "%s", h.etag);
    if (h.size >= 0 && f->size >= 0 && h.size != f->size)
        return err_setf(e, ERR_FORMAT, "%s: the server declares %lld bytes, the listing %lld", f->name,
                        (long long)h.size, (long long)f->size);
    if (f->size < 0)
        f->size = h.size;
    if (f->size < 0 || f->size > HUB_FILE_MAX)
        return err_setf(e, ERR_FORMAT, "%s: no size, or a size over %lld bytes", f->name, (long long)HUB_FILE_MAX);
    return 0;
}

/* Mark f cached when blobs/<etag> is there with its size (or another file of this pull
 * brings the same blob); add what is left to fetch to *need. */
static void plan_file(struct hub_pull *p, size_t i, uint64_t *need)
{
    struct hub_file *f = &p->list.files[i];
    char path[4800];
    struct stat st;
    snprintf(path, sizeof path, "%s/blobs/%s", p->repo_dir, f->etag);
    bool have = stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == f->size;
    for (size_t j = 0; j < i && !have; j++)
        have = strcmp(p->list.files[j].etag, f->etag) == 0;
    p->total_bytes += f->size;
    if (have) {
        f->state = HUB_FILE_CACHED;
        f->done = f->size;
        p->n_cached++;
        return;
    }
    f->state = HUB_FILE_PENDING;
    p->fetch_bytes += f->size;
    snprintf(path, sizeof path, "%s/blobs/%s.incomplete", p->repo_dir, f->etag);
    int64_t part = stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= f->size ? st.st_size : 0;
    f->done = part;
    *need += (uint64_t)(f->size - part);
}

static int check_space(const struct hub_pull *p, uint64_t need, struct err *e)
{
    char blobs[4200];
    struct statvfs vfs;
    snprintf(blobs, sizeof blobs, "%s/blobs", p->repo_dir);
    if (statvfs(blobs, &vfs) < 0)
        return 0;  /* unknown: let the writes tell */
    uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    if (need > avail)
        return err_setf(e, ERR_IO, "not enough disk space in %s: the download needs %llu bytes, %llu are free",
                        blobs, (unsigned long long)need, (unsigned long long)avail);
    return 0;
}

// ---- snapshot ----

/* snapshots/<commit>/<name> -> ../../blobs/<etag> (one more ../ per folder in name),
 * written beside and renamed over, so a link is never half there. */
static int write_link(const struct hub_pull *p, const struct hub_file *f, struct err *e)
{
    char path[4800 + HUB_NAME_MAX], tmp[4900 + HUB_NAME_MAX], target[4096] = "";
    int rc;
    snprintf(path, sizeof path, "%s/%s", p->snapshot, f->name);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    if ((rc = mkdir_p(path, e)) < 0)
        return rc;
    *slash = '/';
    for (const char *s = f->name; (s = strchr(s, '/')); s++)
        strcat(target, "../");
    snprintf(target + strlen(target), sizeof target - strlen(target), "../../blobs/%s", f->etag);
    char cur[4096];
    ssize_t n = readlink(path, cur, sizeof cur - 1);
    if (n >= 0) {
        cur[n] = '\0';
        if (strcmp(cur, target) == 0)
            return 0;
    }
    snprintf(tmp, sizeof tmp, "%s.mlxcel-link", path);
    unlink(tmp);
    if (symlink(target, tmp) < 0 || rename(tmp, path) < 0) {
        rc = err_setf(e, ERR_IO, "cannot link %s: %s", path, strerror(errno));
        unlink(tmp);
        return rc;
    }
    return 0;
}

/* refs/<revision> holds the commit (no newline, as huggingface_hub writes it). */
static int write_ref(const struct hub_pull *p, struct err *e)
{
    char path[4600], tmp[4700];
    int rc;
    if (strcmp(p->revision, p->list.commit) == 0)
        return 0;
    snprintf(path, sizeof path, "%s/refs/%s", p->repo_dir, p->revision);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    if ((rc = mkdir_p(path, e)) < 0)
        return rc;
    *slash = '/';
    snprintf(tmp, sizeof tmp, "%s.mlxcel-tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp)
        return err_setf(e, ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fputs(p->list.commit, fp) >= 0;
    ok = fclose(fp) == 0 && ok;
    if (!ok || rename(tmp, path) < 0) {
        unlink(tmp);
        return err_setf(e, ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

// ---- pull ----

static int pull_offline(struct hub_pull *p, struct err *e)
{
    char commit[128] = "", path[4600], *text = NULL;
    if (hub_hex_is_valid(p->revision, 40, 40)) {
        snprintf(commit, sizeof commit, "%s", p->revision);
    } else {
        snprintf(path, sizeof path, "%s/refs/%s", p->repo_dir, p->revision);
        if (file_read_scoped(path, FILE_USER, 256, &text, NULL, NULL) == 0) {
            snprintf(commit, sizeof commit, "%s", text);
            commit[strcspn(commit, "\r\n")] = '\0';
        }
        free(text);
    }
    if (hub_hex_is_valid(commit, 40, 40)) {
        snprintf(p->snapshot, sizeof p->snapshot, "%s/snapshots/%s", p->repo_dir, commit);
        snprintf(p->list.commit, sizeof p->list.commit, "%s", commit);
        if (is_dir(p->snapshot))
            return 0;
    }
    p->snapshot[0] = '\0';
    return err_setf(e, ERR_MISSING, "offline (HF_HUB_OFFLINE or --offline): %s at revision %s is not in the cache %s",
                    p->repo, p->revision, p->repo_dir);
}

static int pull_online(struct hub_pull *p, const struct hub_client *c, const struct hub_opts *o, struct err *e)
{
    char url[2048], what[512], *doc = NULL;
    size_t len = 0;
    int rc;
    snprintf(url, sizeof url, "%s/api/models/%s/revision/", c->endpoint, p->repo);
    hub_url_escape(url, sizeof url, p->revision, false);
    strncat(url, "?blobs=true", sizeof url - strlen(url) - 1);
    snprintf(what, sizeof what, "listing %s at %s", p->repo, p->revision);
    if ((rc = hub_http_get(c, url, HUB_LISTING_MAX, what, &doc, &len, e)) < 0)
        return rc;
    rc = hub_listing_parse(&p->list, doc, len, e);
    free(doc);
    if (rc < 0 || (rc = keep_wanted(&p->list, o, p->repo, e)) < 0)
        return rc;
    char dir[4400];
    static const char *const k_sub[] = {"blobs", "snapshots", "refs"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/%s", p->repo_dir, k_sub[i]);
        if ((rc = mkdir_p(dir, e)) < 0)
            return rc;
    }
    uint64_t need = 0;
    for (size_t i = 0; i < p->list.n_files; i++) {
        if ((rc = head_file(c, p, &p->list.files[i], e)) < 0)
            return rc;
        plan_file(p, i, &need);
    }
    if ((rc = check_space(p, need, e)) < 0)
        return rc;
    if (o->progress)
        o->progress(o->ud, p);
    if ((rc = hub_http_transfer(c, p, o, e)) < 0)
        return rc;
    snprintf(p->snapshot, sizeof p->snapshot, "%s/snapshots/%s", p->repo_dir, p->list.commit);
    for (size_t i = 0; i < p->list.n_files; i++)
        if ((rc = write_link(p, &p->list.files[i], e)) < 0)
            return rc;
    return write_ref(p, e);
}

int hub_pull_run(struct hub_pull *p, const char *repo, const struct hub_opts *o, struct err *e)
{
    struct hub_client c = {.backoff_ms = 500};
    char cache[4096];
    int rc;
    memset(p, 0, sizeof *p);
    const char *rev = o->revision ? o->revision : "main";
    if ((rc = hub_repo_check(repo, e)) < 0 || (rc = hub_revision_check(rev, e)) < 0)
        return rc;
    snprintf(p->repo, sizeof p->repo, "%s", repo);
    snprintf(p->revision, sizeof p->revision, "%s", rev);
    snprintf(p->endpoint, sizeof p->endpoint, "%s", o->endpoint ? o->endpoint : HUB_DEFAULT_ENDPOINT);
    snprintf(cache, sizeof cache, "%s", o->cache_dir ? o->cache_dir : ".");
    const char *slash = strchr(repo, '/');
    snprintf(p->repo_dir, sizeof p->repo_dir, "%s/models--%.*s--%s", cache, (int)(slash - repo), repo, slash + 1);
    if (o->offline)
        return pull_offline(p, e);
    if (strncmp(p->endpoint, "http://", 7) != 0 && strncmp(p->endpoint, "https://", 8) != 0)
        return err_setf(e, ERR_ARG, "HF_ENDPOINT '%s' is not an http:// or https:// URL", p->endpoint);
    snprintf(c.endpoint, sizeof c.endpoint, "%s", p->endpoint);
    snprintf(c.repo, sizeof c.repo, "%s", repo);
    if (o->backoff_ms >= 0)
        c.backoff_ms = o->backoff_ms;
    c.etag_timeout_s = o->etag_timeout_s > 0 ? o->etag_timeout_s : HUB_TIMEOUT_S_DEFAULT;
    c.download_timeout_s = o->download_timeout_s > 0 ? o->download_timeout_s : HUB_TIMEOUT_S_DEFAULT;
    c.notice = o->notice;
    c.ud = o->ud;
    if ((rc = find_token(o, c.token, sizeof c.token, e)) < 0)
        return rc;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return err_setf(e, ERR_INTERNAL, "libcurl failed to initialise");
    rc = pull_online(p, &c, o, e);
    curl_global_cleanup();
    if (rc < 0)
        p->snapshot[0] = '\0';
    return rc;
}

void hub_pull_deinit(struct hub_pull *p)
{
    hub_listing_deinit(&p->list);
}
