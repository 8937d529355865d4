/*
 * fileio: whole-file reads with a size cap (fileio.h).
 */
#include "fileio.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int file_read_all(const char *path, size_t max, char **out, size_t *len, struct err *e)
{
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return err_setf(e, errno == ENOENT ? ERR_MISSING : ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = err_setf(e, ERR_IO, "%s is not a regular file", path);
        goto out_close;
    }
    if ((uint64_t)st.st_size > max) {
        rc = err_setf(e, ERR_RANGE, "%s: %lld bytes exceeds the %zu-byte limit", path,
                      (long long)st.st_size, max);
        goto out_close;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        rc = err_setf(e, ERR_NOMEM, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
        goto out_close;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    if (n != (size_t)st.st_size) {
        rc = err_setf(e, ERR_IO, "%s: short read (%zu of %lld bytes)", path, n, (long long)st.st_size);
        free(buf);
        goto out_close;
    }
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
out_close:
    fclose(f);
    return rc;
}
