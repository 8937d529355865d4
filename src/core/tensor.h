/*
 * tensor: a typed, strided view of memory. A tensor never owns its data:
 * weights point into the checkpoint's mmap (owned by struct st_set), and
 * activations point into a context's arena. Views (tensor_slice0) are plain
 * struct copies with an adjusted pointer and shape.
 *
 * Quantized weights (MLX formats, docs/mlx-quantization in ../shared/docs)
 * keep the logical shape [.., out, in] in shape[] while data holds the packed
 * U32 words; qbits != 0 marks them and qscales/qbiases point at the per-group
 * scale and bias tensors. qmode says how a code becomes a value:
 *   QMODE_AFFINE  w = scale * q + bias, bits 2..8, scales/biases F32/F16/BF16
 *   QMODE_MXFP4   w = e2m1(q) * 2^(s - 127), bits 4, group 32, scales U8, no biases
 *   QMODE_MXFP8   w = e4m3(q) * 2^(s - 127), bits 8, group 32, scales U8, no biases
 *   QMODE_NVFP4   w = e2m1(q) * e4m3(s),      bits 4, group 16, scales U8, no biases
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TENSOR_MAX_DIMS 4

enum qmode { QMODE_AFFINE = 0, QMODE_MXFP4, QMODE_MXFP8, QMODE_NVFP4 };

struct tensor {
    enum dtype dtype;                /* storage dtype of data */
    int ndim;                        /* 0 means "absent" (optional weight) */
    int64_t shape[TENSOR_MAX_DIMS];  /* logical elements per dim, outermost first */
    int64_t stride[TENSOR_MAX_DIMS]; /* storage elements per step of each dim */
    void *data;                      /* borrowed */
    const char *name;                /* borrowed, for messages; may be NULL */
    /* MLX quantization; qbits == 0 when not quantized. */
    int qbits;                       /* 2, 3, 4, 5, 6 or 8 */
    int qgroup;                      /* elements per scale/bias group */
    enum qmode qmode;                /* how codes decode (above) */
    enum dtype qsdtype;              /* dtype of qscales / qbiases (U8 for fp modes) */
    const void *qscales;             /* [.., out, in / qgroup] */
    const void *qbiases;             /* [.., out, in / qgroup]; NULL for fp modes */
    /* 0: data (and qscales/qbiases) in the stored layout above; else the backend that
     * prepared this view repacked it into a layout of its own (kernels/cpu/kern.h QG16),
     * which only that backend reads. */
    int packed;
};

/* Fill a contiguous tensor header over data. */
void tensor_init(struct tensor *t, enum dtype dt, void *data, int ndim, const int64_t *shape);
static inline bool tensor_is_present(const struct tensor *t) { return t->ndim > 0 && t->data; }
int64_t tensor_nelem(const struct tensor *t);
bool tensor_is_contiguous(const struct tensor *t);
/* View of t[i] (drops the outermost dim); works for quantized tensors too. */
struct tensor tensor_slice0(const struct tensor *t, int64_t i);
/* View of rows [r0, r0 + n) of a 2-D tensor [out, in]; works for quantized tensors too. */
struct tensor tensor_rows(const struct tensor *t, int64_t r0, int64_t n);
/* Bytes of storage the tensor spans, including quantization scales/biases. */
uint64_t tensor_storage_bytes(const struct tensor *t);
/* Storage elements per logical row of the innermost dim (packed words when quantized). */
int64_t tensor_row_storage(const struct tensor *t);
/* Bytes from t->data to the end of its last element, strides included (a view's extent;
 * 0 for a tensor with no elements). */
uint64_t tensor_data_extent(const struct tensor *t);
/* Bytes of a quantized tensor's scales (and as many of its biases): one group row per
 * logical row, contiguous; 0 when not quantized. */
uint64_t tensor_qaux_bytes(const struct tensor *t);

#ifdef __cplusplus
}
#endif
