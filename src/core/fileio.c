/*
 * fileio: opening, reading and mapping input files (fileio.h). file_open is
 * the single opening routine: reads and mappings start from it, so they
 * agree on which files they accept (regular files, symlinks confined for
 * folder files) and on how they report the ones they refuse.
 */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- opening ---- */

static const char *kind_name(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a plain file";
}

/* Cut the last component off buf (a path); returns a pointer to it, or NULL. */
static char *cut_last(char *buf)
{
    char *s = strrchr(buf, '/');
    if (!s || s == buf)
        return NULL;
    *s = '\0';
    return s + 1;
}

/* The folder a link in path's folder may point into (resolved, into root): the folder, or
 * the repository folder when the folder is a Hugging Face snapshot. */
static int confine_root(const char *path, char root[PATH_MAX], struct err *e)
{
    char dir[PATH_MAX], repo[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if ((size_t)(slash - path) >= sizeof dir)
        return err_setf(e, ERR_ARG, "path too long: %s", path);
    else
        snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    if (!realpath(dir, root))
        return err_setf(e, ERR_IO, "cannot resolve the folder of %s: %s", path, strerror(errno));
    /* root = .../models--owner--name/snapshots/<rev>[/sub/...] -> .../models--owner--name
     * (a snapshot's subfolders, additional_chat_templates/, link into blobs/ too) */
    char up[PATH_MAX];
    memcpy(up, root, sizeof up);
    for (int depth = 0; depth < 8; depth++) {
        const char *snaps, *owner;
        memcpy(repo, up, sizeof repo);
        if (cut_last(repo) && (snaps = cut_last(repo)) && strcmp(snaps, "snapshots") == 0 &&
            (owner = strrchr(repo, '/')) && strncmp(owner + 1, "models--", 8) == 0) {
            memcpy(root, repo, strlen(repo) + 1);
            break;
        }
        if (!cut_last(up))
            break;
    }
    return 0;
}

/* path is a symlink named by its folder: its target, resolved, into target when it lies
 * inside the folder's confinement root. */
static int resolve_in_folder(const char *path, char target[PATH_MAX], struct err *e)
{
    char root[PATH_MAX];
    int rc;
    if (!realpath(path, target))
        return err_setf(e, errno == ENOENT ? ERR_MISSING : ERR_IO, "cannot resolve symlink %s: %s",
                        path, strerror(errno));
    if ((rc = confine_root(path, root, e)) < 0)
        return rc;
    size_t n = strlen(root);
    bool inside = n == 1 || (strncmp(target, root, n) == 0 && target[n] == '/');
    if (!inside)
        return err_setf(e, ERR_IO, "%s is a symlink to %s, outside the model folder %s", path,
                        target, root);
    return 0;
}

int file_open(const char *path, enum file_scope scope, int *fd, struct stat *st, struct err *e)
{
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
    char target[PATH_MAX];
    const char *p = path;
    struct stat sb;
    int rc;

    *fd = -1;
    if (scope == FILE_FOLDER) {
        flags |= O_NOFOLLOW;
        if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
            if ((rc = resolve_in_folder(path, target, e)) < 0)
                return rc;
            p = target;  /* realpath: no link left to follow */
        }
    }
    int f = open(p, flags);
    if (f < 0) {
        if (errno == ELOOP && scope == FILE_FOLDER)
            return err_setf(e, ERR_IO, "%s became a symlink while it was opened", path);
        return err_setf(e, errno == ENOENT ? ERR_MISSING : ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
    }
    if (fstat(f, &sb) != 0) {
        rc = err_setf(e, ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = err_setf(e, ERR_IO, "%s is not a regular file (%s)", path, kind_name(sb.st_mode));
        goto fail;
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        rc = err_setf(e, ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (st)
        *st = sb;
    *fd = f;
    return 0;
fail:
    close(f);
    return rc;
}

/* ---- reading ---- */

int file_read_fd(int fd, const char *name, size_t max, char **out, size_t *len, struct err *e)
{
    struct stat sb;
    size_t cap = 4096, got = 0;
    char *buf;
    int rc = 0;

    *out = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((uint64_t)sb.st_size > max)
            return err_setf(e, ERR_RANGE, "%s: %llu bytes exceeds the %zu-byte limit", name,
                            (unsigned long long)sb.st_size, max);
        cap = (size_t)sb.st_size + 1;  /* one more, to see the end */
    }
    if (!(buf = malloc(cap)))
        return err_setf(e, ERR_NOMEM, "%s: out of memory for %zu bytes", name, cap);
    for (;;) {
        if (got == cap) {
            size_t ncap = cap > max / 2 ? max + 1 : cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                rc = err_setf(e, ERR_NOMEM, "%s: out of memory for %zu bytes", name, ncap);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = err_setf(e, ERR_IO, "%s: read failed after %zu bytes: %s", name, got,
                          strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
        if (got > max) {
            rc = err_setf(e, ERR_RANGE, "%s: more than the %zu-byte limit", name, max);
            goto out;
        }
    }
    if (got == cap) {  /* room for the NUL */
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            rc = err_setf(e, ERR_NOMEM, "%s: out of memory for %zu bytes", name, cap + 1);
            goto out;
        }
        buf = nb;
    }
    buf[got] = '\0';
    *out = buf;
    buf = NULL;
    if (len)
        *len = got;
out:
    free(buf);
    return rc;
}

int file_read_scoped(const char *path, enum file_scope scope, size_t max, char **out, size_t *len,
                     struct err *e)
{
    int fd, rc;
    *out = NULL;
    if ((rc = file_open(path, scope, &fd, NULL, e)) < 0)
        return rc;
    rc = file_read_fd(fd, path, max, out, len, e);
    close(fd);
    return rc;
}

int file_read_all(const char *path, size_t max, char **out, size_t *len, struct err *e)
{
    return file_read_scoped(path, FILE_USER, max, out, len, e);
}

/* ---- mapping ---- */

int file_map_all(const char *path, enum file_scope scope, const void **map, size_t *len,
                 struct err *e)
{
    struct stat sb;
    int fd, rc;

    *map = NULL;
    *len = 0;
    if ((rc = file_open(path, scope, &fd, &sb, e)) < 0)
        return rc;
    uint64_t size = (uint64_t)sb.st_size;
    if (size > SIZE_MAX) {
        rc = err_setf(e, ERR_IO, "%s: file of %llu bytes cannot be mapped", path,
                      (unsigned long long)size);
        goto out_close;
    }
    if (size > 0) {  /* mmap refuses a zero length */
        void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = err_setf(e, ERR_IO, "%s: mmap of %llu bytes failed: %s", path,
                          (unsigned long long)size, strerror(errno));
            goto out_close;
        }
        *map = p;
        *len = (size_t)size;
    }
out_close:
    close(fd);
    return rc;
}

void file_unmap(const void *map, size_t len)
{
    if (map)
        munmap((void *)(uintptr_t)map, len);
}

#define HUGE_PAGE (2u << 20)

/* The system's page size in bytes (4096 when it cannot be read). */
static uintptr_t page_bytes(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (uintptr_t)pg : 4096u;
}

void mem_release(const void *p, size_t len)
{
    const uintptr_t ps = page_bytes();
    uintptr_t a = ((uintptr_t)p + ps - 1) & ~(ps - 1), z = ((uintptr_t)p + len) & ~(ps - 1);
    if (len && z > a)
        madvise((void *)a, z - a, MADV_DONTNEED); /* advice: on failure the pages stay */
}

void *mem_anon_alloc(size_t len)
{
    if (len < HUGE_PAGE) {
        void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    if (len > SIZE_MAX - 2 * HUGE_PAGE)
        return NULL;
    /* Map a huge page more and unmap the ends, so that the mapping starts on a huge-page
     * boundary: the kernel backs only the aligned 2 MiB stretches of a mapping with huge
     * pages. */
    const size_t ps = page_bytes(), n = (len + ps - 1) & ~(ps - 1), span = n + HUGE_PAGE;
    uint8_t *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    const size_t head = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
    if (head)
        munmap(p, head);
    if (span - head - n)
        munmap(p + head + n, span - head - n);
    p += head;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP it is plain pages */
#endif
    return p;
}

void *mem_huge_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE)
        return aligned_alloc(64, bytes ? (bytes + 63) & ~(size_t)63 : 64);
    if (bytes > SIZE_MAX - HUGE_PAGE)
        return NULL;
    size_t n = (bytes + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
    void *p = aligned_alloc(HUGE_PAGE, n);
#ifdef MADV_HUGEPAGE
    if (p)
        madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP it is plain pages */
#endif
    return p;
}

void mem_anon_free(void *p, size_t len)
{
    if (p)
        munmap(p, len ? len : 1);
}

/* Read with file_open into a buffer on the stack: nothing allocated, so no allocation
 * failure to lose (MemAvailable is the third line of a file of ~1.5 KiB). */
uint64_t mem_available_bytes(void)
{
    char buf[4096];
    struct err e = {0};
    int fd;
    if (file_open("/proc/meminfo", FILE_USER, &fd, NULL, &e) < 0)
        return 0;
    size_t n = 0;
    for (ssize_t k; n < sizeof buf - 1 && (k = read(fd, buf + n, sizeof buf - 1 - n)) > 0;)
        n += (size_t)k;
    close(fd);
    buf[n] = '\0';
    const char *at = strstr(buf, "MemAvailable:");
    unsigned long long kib = 0;
    if (!at || sscanf(at, "MemAvailable: %llu kB", &kib) != 1)
        kib = 0;
    return kib <= UINT64_MAX / 1024 ? (uint64_t)kib * 1024 : 0;
}
