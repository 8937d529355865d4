/*
 * json: bounded JSON object documents (json.h).
 */
#include "json.h"

#include <errno.h>
#include <stdlib.h>

#include "fileio.h"

int json_parse_object(const char *buf, size_t len, const char *what, cJSON **out, struct err *e)
{
    const char *end = NULL;
    *out = NULL;
    errno = 0;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    /* cJSON returns NULL for bad syntax and a failed allocation alike; malloc sets ENOMEM */
    if (!root && errno == ENOMEM)
        return err_setf(e, ERR_NOMEM, "%s: out of memory parsing JSON", what);
    if (!root) {
        size_t off = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
        return err_setf(e, ERR_FORMAT, "%s: invalid JSON near byte %zu", what, off);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_setf(e, ERR_FORMAT, "%s: top level is not a JSON object", what);
    }
    *out = root;
    return 0;
}

int json_load_object(const char *path, size_t max, cJSON **out, struct err *e)
{
    char *buf = NULL;
    size_t n = 0;
    *out = NULL;
    int rc = file_read_all(path, max, &buf, &n, e);
    if (rc < 0)
        return rc;
    rc = json_parse_object(buf, n, path, out, e);
    free(buf);
    return rc;
}
