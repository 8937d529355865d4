/*
 * backend: the backend-independent part of the compute seam (backend.h):
 * the one factory every command and test creates a backend through, and
 * the lifetime helpers.
 */
#include "backend.h"

#include <string.h>

int backend_new(struct backend **out, const char *name, int n_threads, struct err *e)
{
    *out = NULL;
    if (!name || !strcmp(name, "auto") || !strcmp(name, "cpu"))
        return backend_cpu_new(out, n_threads, NULL, e);
    if (!strncmp(name, "cpu-", 4))
        return backend_cpu_new(out, n_threads, name + 4, e);
    return err_setf(e, ERR_ARG, "unknown device '%s' (expected auto, cpu, cpu-scalar, cpu-avx2 or "
                    "cpu-avx512)", name);
}

void backend_free(struct backend *be)
{
    if (be)
        be->ops->destroy(be);
}

int backend_sync(struct backend *be, struct err *e)
{
    return be ? be->ops->sync(be, e) : 0;
}
