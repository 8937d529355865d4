/*
 * backend: the backend-independent part of the compute seam (backend.h).
 */
#include "backend.h"

void backend_free(struct backend *be)
{
    if (be)
        be->ops->destroy(be);
}
