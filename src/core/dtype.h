/*
 * dtype: element types of stored tensors and the scalar conversions between
 * them. Compute is f32; weights stay in their stored dtype (F16/BF16/F32, or
 * packed integers for quantized weights) and are widened inside kernels.
 * The numeric values are persisted nowhere but are kept stable anyway.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum dtype {
    DTYPE_F32  = 0,
    DTYPE_F16  = 1,
    DTYPE_BF16 = 2,
    DTYPE_U32  = 3,
    DTYPE_I32  = 4,
    DTYPE_U8   = 5,
    DTYPE_I8   = 6,
    DTYPE_F64  = 7,   /* storage only: accepted in files, never computed on */
    DTYPE_I64  = 8,
    DTYPE_U16  = 9,
    DTYPE_I16  = 10,
    DTYPE_BOOL = 11,
    DTYPE_COUNT
};

/* Bytes per element. */
size_t dtype_size(enum dtype t);
/* safetensors name ("BF16"), or "?" */
const char *dtype_name(enum dtype t);
/* Parse a safetensors dtype name; returns 0 and sets *out, or -1 if unknown. */
int dtype_parse(const char *name, enum dtype *out);
/* True for the types kernels compute with directly (F32/F16/BF16). */
int dtype_is_float(enum dtype t);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even, NaN preserved (as torch does). */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* Store v as element i of a F32/F16/BF16 array (round to nearest even). */
void dtype_store_f32(enum dtype t, void *dst, int64_t i, float v);

/* Widen n elements of a float dtype to f32 (scalar reference; kernels have SIMD versions). */
void dtype_to_f32_ref(float *dst, const void *src, enum dtype t, size_t n);

#ifdef __cplusplus
}
#endif
