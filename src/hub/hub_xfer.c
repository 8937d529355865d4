/*
 * hub_xfer: the parallel file transfers of a pull (hub_http_transfer in
 * hub_impl.h). One curl_multi loop in the calling thread drives at most
 * `jobs` transfers; no threads, so no locks.
 *
 * Each file goes to blobs/<etag>.incomplete, opened append-only and
 * flock'ed. An attempt asks for Range: bytes=<on disk>- ; a 206 must start
 * there, a 200 means the server ignored the range (the file restarts), a
 * 416 means the file may already be whole. Bytes past the declared size are
 * refused (an endless body). A dropped connection, 429 or 5xx schedules a
 * retry after a doubling delay, resuming from what is on disk; 401/403/404,
 * a redirect loop or a second error kind ends the pull. A finished file is
 * checked for its size and, for LFS files, its sha256 (a mismatch deletes
 * it), flushed, and renamed to blobs/<etag>.
 */
#include "hub_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/fileio.h"
#include "../core/sha256.h"

#define PROGRESS_MS 100
#define HASH_CHUNK  (1u << 20)

struct xfer {
    struct hub_file *f;
    CURL *h;
    struct curl_slist *hdrs;
    int fd;                    /* the .incomplete file, -1 when closed */
    int64_t start;             /* bytes on disk when this attempt began */
    int64_t got;               /* body bytes written by this attempt */
    int attempts;
    int64_t not_before;        /* retry time (hub_now_ms) */
    bool checked;              /* the response status was looked at (first body bytes) */
    bool too_long, bad_range, io_failed;
    int io_errno;              /* errno of the failed write or truncate */
    struct hub_headers hd;
    struct hub_header_state hs;
    char errbuf[CURL_ERROR_SIZE];
    char path[4700];           /* blobs/<etag>.incomplete */
};

static size_t on_data(char *data, size_t size, size_t nitems, void *ud)
{
    struct xfer *x = ud;
    size_t n = size * nitems;
    long status = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200 && status != 206)
        return n;  /* an error page: dropped, the status decides */
    if (!x->checked) {
        x->checked = true;
        if (status == 200 && x->start > 0) {
            /* the server ignored Range: start over */
            if (ftruncate(x->fd, 0) < 0) {
                x->io_failed = true;
                x->io_errno = errno;
                return 0;
            }
            x->start = 0;
        } else if (status == 206) {
            long long first = -1;
            if (sscanf(x->hd.content_range, "bytes %lld-", &first) != 1 || first != x->start) {
                x->bad_range = true;
                return 0;
            }
        }
    }
    if (x->start + x->got + (int64_t)n > x->f->size) {
        x->too_long = true;
        return 0;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(x->fd, data + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            x->io_failed = true;
            x->io_errno = w < 0 ? errno : ENOSPC;
            return 0;
        }
        off += (size_t)w;
    }
    x->got += (int64_t)n;
    x->f->done = x->start + x->got;
    return n;
}

/* Begin one attempt for x: open (or reopen) the partial file and add a GET to m. */
static int xfer_start(const struct hub_client *c, CURLM *m, struct xfer *x, const char *url, struct err *e)
{
    if (x->fd < 0) {
        x->fd = open(x->path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (x->fd < 0)
            return err_setf(e, ERR_IO, "%s: cannot open for writing: %s", x->path, strerror(errno));
        if (flock(x->fd, LOCK_EX | LOCK_NB) < 0)
            return err_setf(e, ERR_IO, "%s: another download of this file is running", x->f->name);
    }
    struct stat st;
    if (fstat(x->fd, &st) < 0 || !S_ISREG(st.st_mode))
        return err_setf(e, ERR_IO, "%s: not a regular file", x->path);
    if (st.st_size > x->f->size) {
        if (ftruncate(x->fd, 0) < 0)
            return err_setf(e, ERR_IO, "%s: cannot truncate: %s", x->path, strerror(errno));
        st.st_size = 0;
    }
    x->start = st.st_size;
    x->got = 0;
    x->f->done = x->start;
    x->checked = x->too_long = x->bad_range = x->io_failed = false;
    x->errbuf[0] = '\0';
    x->attempts++;
    x->h = hub_easy_new(c, url, &x->hdrs);
    if (!x->h)
        return err_setf(e, ERR_NOMEM, "out of memory");
    curl_easy_setopt(x->h, CURLOPT_CONNECTTIMEOUT, c->download_timeout_s);
    curl_easy_setopt(x->h, CURLOPT_LOW_SPEED_TIME, c->download_timeout_s);
    char range[64];
    snprintf(range, sizeof range, "Range: bytes=%lld-", (long long)x->start);
    if (x->start > 0) {
        struct curl_slist *nl = curl_slist_append(x->hdrs, range);
        if (!nl)
            return err_setf(e, ERR_NOMEM, "out of memory");
        x->hdrs = nl;
        curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->hdrs);
    }
    x->hs = (struct hub_header_state){.h = &x->hd};
    memset(&x->hd, 0, sizeof x->hd);
    curl_easy_setopt(x->h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(x->h, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(x->h, CURLOPT_HEADERFUNCTION, hub_on_header);
    curl_easy_setopt(x->h, CURLOPT_HEADERDATA, &x->hs);
    curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
    x->f->state = HUB_FILE_ACTIVE;
    if (curl_multi_add_handle(m, x->h) != CURLM_OK)
        return err_setf(e, ERR_INTERNAL, "curl_multi_add_handle failed");
    return 0;
}

static void xfer_stop(CURLM *m, struct xfer *x)
{
    if (x->h) {
        curl_multi_remove_handle(m, x->h);
        curl_easy_cleanup(x->h);
        x->h = NULL;
    }
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
}

/* sha256 of the file at path into hex. */
static int hash_file(const char *path, char hex[65], struct err *e)
{
    int fd, rc = 0;
    if ((rc = file_open(path, FILE_USER, &fd, NULL, e)) < 0)
        return rc;
    char *buf = malloc(HASH_CHUNK);
    if (!buf) {
        close(fd);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    struct sha256 s;
    sha256_init(&s);
    for (;;) {
        ssize_t n = read(fd, buf, HASH_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = err_setf(e, ERR_IO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        sha256_update(&s, buf, (size_t)n);
    }
    free(buf);
    close(fd);
    if (rc == 0)
        sha256_final_hex(&s, hex);
    return rc;
}

/* A whole file: check its sha256 (LFS), flush it and rename it into blobs/. */
static int xfer_finish(struct hub_pull *p, struct xfer *x, struct err *e)
{
    struct hub_file *f = x->f;
    int rc;
    if (f->sha256[0]) {
        char got[65];
        if ((rc = hash_file(x->path, got, e)) < 0)
            return rc;
        if (strcmp(got, f->sha256) != 0) {
            unlink(x->path);
            return err_setf(e, ERR_FORMAT, "%s: sha256 mismatch (expected %s, got %s); the download was deleted",
                            f->name, f->sha256, got);
        }
    }
    if (fsync(x->fd) < 0)
        return err_setf(e, ERR_IO, "%s: fsync failed: %s", x->path, strerror(errno));
    char blob[4700];
    snprintf(blob, sizeof blob, "%s/blobs/%s", p->repo_dir, f->etag);
    if (rename(x->path, blob) < 0)
        return err_setf(e, ERR_IO, "%s: cannot rename to %s: %s", x->path, blob, strerror(errno));
    close(x->fd);
    x->fd = -1;
    f->state = HUB_FILE_DONE;
    f->done = f->size;
    p->n_fetched++;
    return 0;
}

/* A transfer ended: finish the file, schedule a retry (returns 1), or fail. */
static int xfer_done(const struct hub_client *c, struct hub_pull *p, CURLM *m, struct xfer *x, CURLcode cc,
                     struct err *e)
{
    struct hub_file *f = x->f;
    hub_headers_finish(&x->hs, x->h);
    long status = x->hd.status;
    p->fetched_bytes += x->got;
    xfer_stop(m, x);
    /* a server that breaks the contract may have written anything: nothing of it is kept */
    if (x->too_long || x->bad_range)
        unlink(x->path);
    if (x->too_long)
        return err_setf(e, ERR_FORMAT,
                        "%s: the server sent more than the %lld bytes declared; the download was deleted", f->name,
                        (long long)f->size);
    if (x->bad_range)
        return err_setf(e, ERR_FORMAT, "%s: the server answered Range: bytes=%lld- with Content-Range '%s'", f->name,
                        (long long)x->start, x->hd.content_range);
    if (x->io_failed)
        return err_setf(e, ERR_IO, "%s: writing %s failed: %s", f->name, x->path, strerror(x->io_errno));
    int64_t on_disk = x->start + x->got;
    bool transient;
    if (cc == CURLE_OK && (status == 200 || status == 206 || status == 416)) {
        if (status == 416) {
            struct stat st;
            on_disk = fstat(x->fd, &st) == 0 ? st.st_size : -1;
            if (on_disk != f->size && ftruncate(x->fd, 0) < 0)
                return err_setf(e, ERR_IO, "%s: cannot truncate: %s", x->path, strerror(errno));
        }
        if (on_disk == f->size)
            return xfer_finish(p, x, e);
        transient = true;  /* a short body: resume */
    } else if (cc == CURLE_OK) {
        transient = hub_status_is_transient(status);
        if (!transient) {
            char what[HUB_NAME_MAX + 32];
            snprintf(what, sizeof what, "downloading %s", f->name);
            return hub_status_error(c, &x->hd, what, e);
        }
    } else {
        transient = hub_curl_is_transient(cc);
    }
    if (!transient || x->attempts >= HUB_ATTEMPTS) {
        char what[HUB_NAME_MAX + 32];
        snprintf(what, sizeof what, "downloading %s", f->name);
        if (cc == CURLE_OK && status != 200 && status != 206)
            return hub_status_error(c, &x->hd, what, e);
        if (cc == CURLE_OK)
            return err_setf(e, ERR_IO, "%s: got %lld of %lld bytes after %d attempts", what, (long long)on_disk,
                            (long long)f->size, x->attempts);
        return hub_curl_error(c, cc, x->errbuf, what, x->attempts, true, e);
    }
    f->state = HUB_FILE_PENDING;
    x->not_before = hub_now_ms() + hub_backoff_ms(c, x->attempts);
    char what[HUB_NAME_MAX + 32], reason[CURL_ERROR_SIZE + 64];
    snprintf(what, sizeof what, "downloading %s", f->name);
    if (cc != CURLE_OK)
        hub_curl_reason(reason, sizeof reason, cc, x->errbuf, c->download_timeout_s, true);
    else if (status == 200 || status == 206)
        snprintf(reason, sizeof reason, "got %lld of %lld bytes", (long long)on_disk, (long long)f->size);
    else
        snprintf(reason, sizeof reason, "HTTP %ld", status);
    hub_notice_retry(c, what, reason, x->attempts, hub_backoff_ms(c, x->attempts));
    return 1;
}

static void resolve_url(const struct hub_client *c, const struct hub_pull *p, const struct hub_file *f, char *url,
                        size_t cap)
{
    snprintf(url, cap, "%s/%s/resolve/%s/", c->endpoint, p->repo, p->list.commit);
    hub_url_escape(url, cap, f->name, true);
}

int hub_http_transfer(const struct hub_client *c, struct hub_pull *p, const struct hub_opts *o, struct err *e)
{
    size_t n = p->list.n_files, next = 0, active = 0, left = 0;
    int jobs = o->jobs > 0 ? o->jobs : 4, rc = 0;
    struct xfer *xs = calloc(n ? n : 1, sizeof *xs);
    CURLM *m = curl_multi_init();
    if (!xs || !m) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        xs[i].f = &p->list.files[i];
        xs[i].fd = -1;
        snprintf(xs[i].path, sizeof xs[i].path, "%s/blobs/%s.incomplete", p->repo_dir, xs[i].f->etag);
        left += xs[i].f->state == HUB_FILE_PENDING;
    }
    int64_t last_report = 0;
    while (left > 0) {
        /* start what may start: pending, past its retry time, within the job bound */
        int64_t now = hub_now_ms();
        for (size_t k = 0; k < n && (int)active < jobs; k++) {
            struct xfer *x = &xs[(next + k) % n];
            if (x->f->state != HUB_FILE_PENDING || x->h || x->not_before > now)
                continue;
            char url[8192];
            resolve_url(c, p, x->f, url, sizeof url);
            if ((rc = xfer_start(c, m, x, url, e)) < 0)
                goto out;
            active++;
        }
        next++;
        int running = 0;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct xfer *x = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            CURLcode cc = msg->data.result;
            active--;
            if ((rc = xfer_done(c, p, m, x, cc, e)) < 0)
                goto out;
            if (rc == 0)
                left--;
            rc = 0;
            if (o->progress)
                o->progress(o->ud, p);
        }
        if (o->progress && hub_now_ms() - last_report >= PROGRESS_MS) {
            last_report = hub_now_ms();
            o->progress(o->ud, p);
        }
        if (left > 0)
            curl_multi_poll(m, NULL, 0, active ? PROGRESS_MS : 20, NULL);
    }
out:
    for (size_t i = 0; xs && i < n; i++) {
        if (xs[i].h)
            p->fetched_bytes += xs[i].got;
        xfer_stop(m, &xs[i]);
        if (xs[i].fd >= 0)
            close(xs[i].fd);
        if (xs[i].f->state == HUB_FILE_ACTIVE)
            xs[i].f->state = HUB_FILE_PENDING;
    }
    if (m)
        curl_multi_cleanup(m);
    free(xs);
    return rc;
}
