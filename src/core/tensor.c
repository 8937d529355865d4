/*
 * tensor: shape helpers for strided views (see tensor.h).
 */
#include "tensor.h"

#include <string.h>

void tensor_init(struct tensor *t, enum dtype dt, void *data, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->data = data;
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->stride[i] = s;
        s *= shape[i];
    }
}

int64_t tensor_nelem(const struct tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return t->ndim ? n : 0;
}

int64_t tensor_row_storage(const struct tensor *t)
{
    if (t->ndim == 0)
        return 0;
    int64_t in = t->shape[t->ndim - 1];
    return t->qbits ? in * t->qbits / 32 : in;
}

bool tensor_is_contiguous(const struct tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        int64_t n = (i == t->ndim - 1) ? tensor_row_storage(t) : t->shape[i];
        if (t->stride[i] != s)
            return false;
        s *= n;
    }
    return true;
}

struct tensor tensor_slice0(const struct tensor *t, int64_t i)
{
    struct tensor v = *t;
    v.data = (char *)t->data + (size_t)(i * t->stride[0]) * dtype_size(t->dtype);
    if (t->qbits) {
        /* scales/biases are contiguous [.., in/qgroup]: one group row per logical row */
        int64_t rows_per_slice = 1;
        for (int d = 1; d < t->ndim - 1; d++)
            rows_per_slice *= t->shape[d];
        int64_t groups = t->shape[t->ndim - 1] / t->qgroup;
        size_t off = (size_t)(i * rows_per_slice * groups) * dtype_size(t->qsdtype);
        v.qscales = (const char *)t->qscales + off;
        if (t->qbiases)
            v.qbiases = (const char *)t->qbiases + off;
    }
    for (int d = 1; d < t->ndim; d++) {
        v.shape[d - 1] = t->shape[d];
        v.stride[d - 1] = t->stride[d];
    }
    v.ndim = t->ndim - 1;
    v.shape[v.ndim] = 0;
    v.stride[v.ndim] = 0;
    return v;
}

struct tensor tensor_rows(const struct tensor *t, int64_t r0, int64_t n)
{
    struct tensor v = *t;
    v.data = (char *)t->data + (size_t)(r0 * t->stride[0]) * dtype_size(t->dtype);
    if (t->qbits) {
        size_t off = (size_t)(r0 * (t->shape[1] / t->qgroup)) * dtype_size(t->qsdtype);
        v.qscales = (const char *)t->qscales + off;
        if (t->qbiases)
            v.qbiases = (const char *)t->qbiases + off;
    }
    v.shape[0] = n;
    return v;
}

uint64_t tensor_storage_bytes(const struct tensor *t)
{
    if (t->ndim == 0)
        return 0;
    uint64_t rows = 1;
    for (int d = 0; d < t->ndim - 1; d++)
        rows *= (uint64_t)t->shape[d];
    return rows * (uint64_t)tensor_row_storage(t) * dtype_size(t->dtype) +
           (t->qbiases ? 2 : 1) * tensor_qaux_bytes(t);
}

uint64_t tensor_data_extent(const struct tensor *t)
{
    if (t->ndim == 0)
        return 0;
    uint64_t el = (uint64_t)tensor_row_storage(t);
    for (int d = 0; d < t->ndim - 1; d++) {
        if (t->shape[d] <= 0)
            return 0;
        el += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
    }
    return el * dtype_size(t->dtype);
}

uint64_t tensor_qaux_bytes(const struct tensor *t)
{
    if (t->ndim == 0 || !t->qbits || t->qgroup <= 0)
        return 0;
    uint64_t rows = 1;
    for (int d = 0; d < t->ndim - 1; d++)
        rows *= (uint64_t)t->shape[d];
    return rows * (uint64_t)(t->shape[t->ndim - 1] / t->qgroup) * dtype_size(t->qsdtype);
}
