/*
 * fileio: capped whole-file reads and read-only whole-file mappings (fileio.h).
 * Both start from open_regular(), so the two agree on which files they accept
 * and on how they report the ones they refuse.
 */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Open path read-only; on success *fd is a regular file of *size bytes (the
 * caller closes it). */
static int open_regular(const char *path, int *fd, uint64_t *size, struct err *e)
{
    struct stat st;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return err_setf(e, errno == ENOENT ? ERR_MISSING : ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
    if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return err_setf(e, ERR_IO, "%s is not a regular file", path);
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

int file_read_all(const char *path, size_t max, char **out, size_t *len, struct err *e)
{
    uint64_t size;
    char *buf = NULL;
    size_t got = 0;
    int fd, rc;

    *out = NULL;
    if ((rc = open_regular(path, &fd, &size, e)) < 0)
        return rc;
    if (size > max) {
        rc = err_setf(e, ERR_RANGE, "%s: %llu bytes exceeds the %zu-byte limit", path,
                      (unsigned long long)size, max);
        goto out_close;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        rc = err_setf(e, ERR_NOMEM, "%s: out of memory for %llu bytes", path,
                      (unsigned long long)size);
        goto out_close;
    }
    while (got < (size_t)size) {
        ssize_t r = read(fd, buf + got, (size_t)size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = err_setf(e, ERR_IO, "%s: short read (%zu of %llu bytes)%s%s", path, got,
                          (unsigned long long)size, r < 0 ? ": " : "", r < 0 ? strerror(errno) : "");
            goto out_close;
        }
        got += (size_t)r;
    }
    buf[got] = '\0';
    *out = buf;
    buf = NULL;
    if (len)
        *len = got;
out_close:
    free(buf);
    close(fd);
    return rc;
}

int file_map_all(const char *path, const void **map, size_t *len, struct err *e)
{
    uint64_t size;
    int fd, rc;

    *map = NULL;
    *len = 0;
    if ((rc = open_regular(path, &fd, &size, e)) < 0)
        return rc;
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
