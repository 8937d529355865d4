/*
 * dtype: names, sizes and scalar conversions. The f16 conversion is the
 * classic bit-exact one (handles subnormals, inf, NaN) so it can serve as the
 * oracle for the F16C kernel path.
 */
#include "dtype.h"

static const struct {
    const char *name;
    size_t size;
} k_dtypes[DTYPE_COUNT] = {
    [DTYPE_F32] = {"F32", 4},  [DTYPE_F16] = {"F16", 2}, [DTYPE_BF16] = {"BF16", 2},
    [DTYPE_U32] = {"U32", 4},  [DTYPE_I32] = {"I32", 4}, [DTYPE_U8] = {"U8", 1},
    [DTYPE_I8] = {"I8", 1},    [DTYPE_F64] = {"F64", 8}, [DTYPE_I64] = {"I64", 8},
    [DTYPE_U16] = {"U16", 2},  [DTYPE_I16] = {"I16", 2}, [DTYPE_BOOL] = {"BOOL", 1},
};

size_t dtype_size(enum dtype t)
{
    return (unsigned)t < DTYPE_COUNT ? k_dtypes[t].size : 0;
}

const char *dtype_name(enum dtype t)
{
    return (unsigned)t < DTYPE_COUNT ? k_dtypes[t].name : "?";
}

int dtype_parse(const char *name, enum dtype *out)
{
    for (int i = 0; i < DTYPE_COUNT; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *out = (enum dtype)i;
            return 0;
        }
    }
    return -1;
}

int dtype_is_float(enum dtype t)
{
    return t == DTYPE_F32 || t == DTYPE_F16 || t == DTYPE_BF16;
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) /* inf / NaN */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* may carry into the exponent, which is the correct rounding */
    return (uint16_t)h;
}

void dtype_to_f32_ref(float *dst, const void *src, enum dtype t, size_t n)
{
    switch (t) {
    case DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(s[i]);
        break;
    }
    case DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(s[i]);
        break;
    }
    default:
        for (size_t i = 0; i < n; i++)
            dst[i] = 0.0f;
        break;
    }
}

void dtype_store_f32(enum dtype t, void *dst, int64_t i, float v)
{
    if (t == DTYPE_F32)
        ((float *)dst)[i] = v;
    else if (t == DTYPE_F16)
        ((uint16_t *)dst)[i] = f32_to_f16(v);
    else
        ((uint16_t *)dst)[i] = f32_to_bf16(v);
}
