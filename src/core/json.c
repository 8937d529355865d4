/*
 * json: bounded JSON object documents (json.h).
 *
 * cJSON stops at the end of the first value and, given a length, never reads
 * past it; what comes after that value is checked here. The NUL scan comes
 * first because cJSON would otherwise hand back strings cut at the NUL.
 */
#include "json.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

/* JSON's four whitespace bytes (RFC 8259 section 2); cJSON's own skipping is
 * looser (every byte <= 0x20), so trailing bytes are checked against these. */
static bool is_json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e)
{
    const char *end = NULL;
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
        cJSON_Delete(root);
        return err_setf(e, ERR_FORMAT,
                        "%s is not valid JSON (error at byte %zu of %zu: trailing bytes after the "
                        "top-level value)", what, at, len);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_setf(e, ERR_FORMAT, "%s is not a JSON object", what);
    }
    *out = root;
    return 0;
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
    rc = json_parse_object(buf, n, path, out, e);
    free(buf);
    return rc;
}
