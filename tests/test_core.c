/*
 * Core suites:
 *   dtype       names/sizes/parse, f16 and bf16 conversions checked against
 *               known bit patterns and exhaustively over all 65536 inputs
 *               (round trips, and rounding at every midpoint between
 *               neighbouring values, which covers ties-to-even, subnormals
 *               and overflow to inf).
 *   tensor      tensor_init strides, slice0, storage bytes, quantized layout.
 *   threadpool  tpool_run runs each ith exactly once per call, repeatedly and
 *               across pool sizes; results written by workers are visible to
 *               the caller; tpool_range partitions exactly; tpool_claim_guided
 *               hands out shrinking pieces, each unit once across threads;
 *               a worker held outside any job (blocked in a signal handler)
 *               holds up no job: the caller claims its parts.
 *   json        json_parse_object takes exactly one object plus JSON
 *               whitespace: trailing junk, a second value, NUL bytes and
 *               other control bytes are refused at the right byte offset,
 *               and the safetensors header parser accepts and refuses
 *               exactly the same documents (it is the same reader).
 *   fileio      file_read_all and file_map_all: contents, the size cap,
 *               empty, missing and non-regular files; mem_huge_alloc and
 *               mem_anon_alloc start large blocks on a huge-page boundary.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base64.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "core/fscan.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "core/termsafe.h"
#include "core/threadpool.h"
#include "st_build.h"
#include "test.h"

// ---- base64 ----

/* RFC 4648 section 10's vectors both ways, every length round-tripped, and the refusals
 * of each mode with the offset they name. */
static void test_base64(void **state)
{
    (void)state;
    static const char *const k_vec[][2] = {{"", ""},         {"f", "Zg=="},     {"fo", "Zm8="},
                                           {"foo", "Zm9v"},  {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                           {"foobar", "Zm9vYmFy"}};
    unsigned char out[64];
    char enc[64];
    size_t len, bad;
    for (size_t i = 0; i < sizeof k_vec / sizeof k_vec[0]; i++) {
        const char *plain = k_vec[i][0], *b64 = k_vec[i][1];
        b64_encode((const unsigned char *)plain, strlen(plain), enc);
        assert_string_equal(enc, b64);
        assert_int_equal(b64_encoded_len(strlen(plain)), strlen(b64));
        for (unsigned fl = 0; fl < 4; fl++) {
            assert_int_equal(b64_decode(b64, strlen(b64), fl, out, &len, &bad), 0);
            assert_int_equal(len, strlen(plain));
            assert_memory_equal(out, plain, len);
        }
        /* unpadded, as data: URLs may come */
        size_t n = strlen(b64);
        while (n && b64[n - 1] == '=')
            n--;
        assert_true(len <= b64_decoded_max(n));
        assert_int_equal(b64_decode(b64, n, 0, out, &len, &bad), 0);
        assert_int_equal(len, strlen(plain));
        if (n % 4)
            assert_int_equal(b64_decode(b64, n, B64_PADDED, out, &len, &bad), -1);
    }
    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)(255 - i);
    for (size_t n = 0; n <= 256; n += 17) {
        char e[400];
        unsigned char d[256];
        b64_encode(all, n, e);
        assert_int_equal(b64_decode(e, strlen(e), B64_PADDED, d, &len, &bad), 0);
        assert_int_equal(len, n);
        assert_memory_equal(d, all, n);
    }
    /* the URL-safe alphabet only when asked */
    assert_int_equal(b64_decode("-_-_", 4, B64_URLSAFE, out, &len, &bad), 0);
    assert_int_equal(len, 3);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(b64_decode("-_-_", 4, 0, out, &len, &bad), -1);
    assert_int_equal(bad, 0);
    /* refusals and where */
    assert_int_equal(b64_decode("Zm9v$mFy", 8, 0, out, &len, &bad), -1);
    assert_int_equal(bad, 4);
    assert_int_equal(b64_decode("Zm9vY", 5, 0, out, &len, &bad), -1);   /* one char left over */
    assert_int_equal(bad, 5);
    assert_int_equal(b64_decode("Zm9vYg=", 7, B64_PADDED, out, &len, &bad), -1);
    assert_int_equal(bad, 7);
    assert_int_equal(b64_decode("Zg===", 5, 0, out, &len, &bad), -1);   /* a third '=' */
    assert_int_equal(bad, 2);
    assert_int_equal(b64_decode("Zm=v", 4, B64_PADDED, out, &len, &bad), -1);   /* '=' inside */
    assert_int_equal(bad, 2);
    assert_int_equal(b64_decode("====", 4, B64_PADDED, out, &len, &bad), -1);
    assert_int_equal(bad, 0);
}

// ---- dtype ----

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

static void test_dtype_names(void **state)
{
    (void)state;
    static const struct {
        enum dtype t;
        const char *name;
        size_t size;
    } k[] = {
        {DTYPE_F32, "F32", 4}, {DTYPE_F16, "F16", 2}, {DTYPE_BF16, "BF16", 2},
        {DTYPE_U32, "U32", 4}, {DTYPE_I32, "I32", 4}, {DTYPE_U8, "U8", 1},
        {DTYPE_I8, "I8", 1},   {DTYPE_F64, "F64", 8}, {DTYPE_I64, "I64", 8},
        {DTYPE_U16, "U16", 2}, {DTYPE_I16, "I16", 2}, {DTYPE_BOOL, "BOOL", 1},
    };
    assert_int_equal(sizeof k / sizeof k[0], DTYPE_COUNT);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        enum dtype t = DTYPE_COUNT;
        assert_string_equal(dtype_name(k[i].t), k[i].name);
        assert_int_equal(dtype_size(k[i].t), k[i].size);
        assert_int_equal(dtype_parse(k[i].name, &t), 0);
        assert_int_equal(t, k[i].t);
    }
    enum dtype t = DTYPE_F32;
    assert_int_equal(dtype_parse("bf16", &t), -1); /* names are case-sensitive */
    assert_int_equal(dtype_parse("F8_E4M3", &t), -1);
    assert_int_equal(dtype_parse("", &t), -1);
    assert_int_equal(t, DTYPE_F32); /* untouched on failure */
    assert_string_equal(dtype_name(DTYPE_COUNT), "?");
    assert_string_equal(dtype_name((enum dtype)-1), "?");
    assert_int_equal(dtype_size(DTYPE_COUNT), 0);
    assert_true(dtype_is_float(DTYPE_F32));
    assert_true(dtype_is_float(DTYPE_F16));
    assert_true(dtype_is_float(DTYPE_BF16));
    assert_false(dtype_is_float(DTYPE_F64));
    assert_false(dtype_is_float(DTYPE_U32));
}

static void test_f16_known(void **state)
{
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } k[] = {
        {0.0f, 0x0000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.5f, 0x3800},
        {0.1f, 0x2e66},
        {1.0f / 3.0f, 0x3555},
        {65504.0f, 0x7bff},                 /* largest finite */
        {65519.0f, 0x7bff},                 /* below the overflow midpoint */
        {65520.0f, 0x7c00},                 /* the midpoint ties to even: inf */
        {1e6f, 0x7c00},
        {-1e6f, 0xfc00},
        {0x1p-14f, 0x0400},                 /* smallest normal */
        {0x1p-24f, 0x0001},                 /* smallest subnormal */
        {0x1p-25f, 0x0000},                 /* half of it ties to even: 0 */
        {0x1.8p-25f, 0x0001},
        {-0x1p-26f, 0x8000},                /* underflow keeps the sign */
        {0x3ffp-24f, 0x03ff},               /* largest subnormal */
        {0x7ff.0p-25f, 0x0400},             /* 1023.5 x 2^-24 ties up into the normals */
        {1.0f + 0x1p-11f, 0x3c00},          /* tie, stays even */
        {1.0f + 0x3p-11f, 0x3c02},          /* tie, rounds up to even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above the tie */
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        uint16_t got = f32_to_f16(k[i].f);
        if (got != k[i].h)
            fail_msg("f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)k[i].f, got, k[i].h);
    }
    assert_int_equal(f32_to_f16(-0.0f), 0x8000);
    assert_true(f16_is_nan(f32_to_f16(NAN)));
    assert_true(f16_is_nan(f32_to_f16(bits_f32(0x7f800001u)))); /* signalling NaN stays NaN */
    assert_true(f16_is_nan(f32_to_f16(bits_f32(0xffc00000u))));

    assert_true(f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(f16_to_f32(0x8001) == -0x1p-24f);
    assert_true(f16_to_f32(0x03ff) == 0x3ffp-24f);
    assert_true(f16_to_f32(0x7bff) == 65504.0f);
    assert_true(f16_to_f32(0x3555) == 0x555p-12f);
    assert_int_equal(f32_bits(f16_to_f32(0x8000)), 0x80000000u);
    assert_true(isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0);
    assert_true(isnan(f16_to_f32(0x7e00)));
    assert_true(isnan(f16_to_f32(0x7c01)));
}

/* Every f16: widening matches the textbook formula, and narrowing back is exact. */
static void test_f16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 0x10000u; i++) {
        uint16_t h = (uint16_t)i;
        float f = f16_to_f32(h);
        if (f16_is_nan(h)) {
            assert_true(isnan(f));
            assert_true(f16_is_nan(f32_to_f16(f)));
            continue;
        }
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        float want = e == 0x1f ? INFINITY
                     : e == 0  ? ldexpf((float)m, -24)
                               : ldexpf((float)(1024 + m), e - 25);
        if (h & 0x8000)
            want = -want;
        if (f32_bits(f) != f32_bits(want))
            fail_msg("f16_to_f32(0x%04x) = %a, want %a", h, (double)f, (double)want);
        if (f32_to_f16(f) != h)
            fail_msg("f16 0x%04x does not round-trip (got 0x%04x)", h, f32_to_f16(f));
    }
}

/* Between every two neighbouring positive f16 values a < b (including the
 * last finite one and inf): below the midpoint -> a, above -> b, on it -> the
 * even one. Negative values mirror. */
static void test_f16_midpoints(void **state)
{
    (void)state;
    for (uint16_t h = 0; h < 0x7c00; h++) {
        float a = f16_to_f32(h);
        float b = h == 0x7bff ? 65536.0f : f16_to_f32((uint16_t)(h + 1));
        float m = a + (b - a) / 2; /* exact: f16 has 11 significant bits, f32 24 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
        uint16_t lo = f32_to_f16(nextafterf(m, 0.0f));
        uint16_t hi = f32_to_f16(nextafterf(m, INFINITY));
        uint16_t at = f32_to_f16(m);
        if (lo != h || hi != h + 1 || at != even)
            fail_msg("f16 midpoint after 0x%04x: below 0x%04x above 0x%04x at 0x%04x", h, lo, hi,
                     at);
        if (f32_to_f16(-m) != (at | 0x8000))
            fail_msg("f16 midpoint after 0x%04x: negative side differs", h);
    }
}

static void test_bf16_known(void **state)
{
    (void)state;
    static const struct {
        uint32_t f;  /* f32 bits */
        uint16_t h;
    } k[] = {
        {0x3f800000u, 0x3f80},  /* 1.0 */
        {0xc0000000u, 0xc000},  /* -2.0 */
        {0x40400000u, 0x4040},  /* 3.0 */
        {0x3f808000u, 0x3f80},  /* 1 + 2^-8: tie, stays even */
        {0x3f818000u, 0x3f82},  /* 1 + 3 x 2^-8: tie, rounds up to even */
        {0x3f808001u, 0x3f81},  /* just above the tie */
        {0x3f807fffu, 0x3f80},  /* just below */
        {0x7f7fffffu, 0x7f80},  /* FLT_MAX rounds to inf */
        {0x7f7f7fffu, 0x7f7f},
        {0x7f800000u, 0x7f80},  /* inf */
        {0xff800000u, 0xff80},  /* -inf */
        {0x00000001u, 0x0000},  /* f32 subnormals round like any other value */
        {0x00008000u, 0x0000},
        {0x00018000u, 0x0002},
        {0x00008001u, 0x0001},
        {0x80000000u, 0x8000},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        uint16_t got = f32_to_bf16(bits_f32(k[i].f));
        if (got != k[i].h)
            fail_msg("f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x", k[i].f, got, k[i].h);
    }
    /* NaNs are quieted, never rounded into inf */
    assert_int_equal(f32_to_bf16(bits_f32(0x7fc00000u)), 0x7fc0);
    assert_int_equal(f32_to_bf16(bits_f32(0x7f800001u)), 0x7fc0);
    assert_int_equal(f32_to_bf16(bits_f32(0xff800001u)), 0xffc0);
    assert_int_equal(f32_to_bf16(bits_f32(0x7fffffffu)), 0x7fff);
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
    assert_true(bf16_to_f32(0x0001) == bits_f32(0x00010000u));
    assert_true(isnan(bf16_to_f32(0x7fc1)));
}

static void test_bf16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 0x10000u; i++) {
        uint16_t h = (uint16_t)i;
        float f = bf16_to_f32(h);
        assert_int_equal(f32_bits(f), i << 16);
        if (bf16_is_nan(h))
            assert_true(bf16_is_nan(f32_to_bf16(f)));
        else if (f32_to_bf16(f) != h)
            fail_msg("bf16 0x%04x does not round-trip", h);
    }
    /* midpoints, in bits: a bf16 is the top half of an f32 */
    for (uint32_t h = 0; h < 0x7f80u; h++) {
        uint32_t m = (h << 16) | 0x8000u;
        uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        uint16_t lo = f32_to_bf16(bits_f32(m - 1));
        uint16_t hi = f32_to_bf16(bits_f32(m + 1));
        uint16_t at = f32_to_bf16(bits_f32(m));
        if (lo != h || hi != h + 1 || at != even)
            fail_msg("bf16 midpoint after 0x%04x: below 0x%04x above 0x%04x at 0x%04x", h, lo,
                     hi, at);
        if (f32_to_bf16(bits_f32(m | 0x80000000u)) != (at | 0x8000))
            fail_msg("bf16 midpoint after 0x%04x: negative side differs", h);
    }
}

static void test_dtype_to_f32(void **state)
{
    (void)state;
    static const float f32[3] = {1.5f, -0.0f, 3e38f};
    static const uint16_t f16[3] = {0x3c00, 0x0001, 0xfc00};
    static const uint16_t bf16[3] = {0x3f80, 0xc000, 0x7f80};
    float out[3];
    dtype_to_f32_ref(out, f32, DTYPE_F32, 3);
    assert_memory_equal(out, f32, sizeof f32);
    dtype_to_f32_ref(out, f16, DTYPE_F16, 3);
    assert_true(out[0] == 1.0f && out[1] == 0x1p-24f && isinf(out[2]) && out[2] < 0);
    dtype_to_f32_ref(out, bf16, DTYPE_BF16, 3);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && isinf(out[2]));
    static const uint32_t u32[3] = {1, 2, 3};
    dtype_to_f32_ref(out, u32, DTYPE_U32, 3); /* not a float type: zeros by contract */
    assert_true(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f);
}

// ---- tensor ----

static void test_tensor_init(void **state)
{
    (void)state;
    float buf[24];
    struct tensor t;
    tensor_init(&t, DTYPE_F32, buf, 3, (const int64_t[]){2, 3, 4});
    assert_int_equal(t.ndim, 3);
    assert_int_equal(t.stride[0], 12);
    assert_int_equal(t.stride[1], 4);
    assert_int_equal(t.stride[2], 1);
    assert_int_equal(t.shape[3], 0);
    assert_int_equal(t.stride[3], 0);
    assert_int_equal(tensor_nelem(&t), 24);
    assert_int_equal(tensor_row_storage(&t), 4);
    assert_int_equal(tensor_storage_bytes(&t), sizeof buf);
    assert_true(tensor_is_contiguous(&t));
    assert_true(tensor_is_present(&t));
    assert_null(t.name);
    assert_int_equal(t.qbits, 0);

    /* a transposed view is not contiguous */
    struct tensor tr = t;
    tr.shape[1] = 4;
    tr.shape[2] = 3;
    tr.stride[1] = 1;
    tr.stride[2] = 4;
    assert_false(tensor_is_contiguous(&tr));

    struct tensor absent;
    memset(&absent, 0, sizeof absent);
    assert_int_equal(tensor_nelem(&absent), 0);
    assert_int_equal(tensor_storage_bytes(&absent), 0);
    assert_int_equal(tensor_row_storage(&absent), 0);
    assert_false(tensor_is_present(&absent));

    struct tensor h;
    tensor_init(&h, DTYPE_BF16, buf, 2, (const int64_t[]){5, 7});
    assert_int_equal(tensor_storage_bytes(&h), 5 * 7 * 2);
    tensor_init(&h, DTYPE_F32, buf, 2, (const int64_t[]){0, 7});
    assert_int_equal(tensor_nelem(&h), 0);
    assert_int_equal(tensor_storage_bytes(&h), 0);
}

static void test_tensor_slice0(void **state)
{
    (void)state;
    float buf[24];
    for (int i = 0; i < 24; i++)
        buf[i] = (float)i;
    struct tensor t;
    tensor_init(&t, DTYPE_F32, buf, 3, (const int64_t[]){2, 3, 4});
    t.name = "x";
    struct tensor s = tensor_slice0(&t, 1);
    assert_ptr_equal(s.data, buf + 12);
    assert_int_equal(s.ndim, 2);
    assert_int_equal(s.shape[0], 3);
    assert_int_equal(s.shape[1], 4);
    assert_int_equal(s.shape[2], 0);
    assert_int_equal(s.stride[0], 4);
    assert_int_equal(s.stride[1], 1);
    assert_int_equal(s.stride[2], 0);
    assert_string_equal(s.name, "x");
    assert_true(tensor_is_contiguous(&s));
    assert_int_equal(tensor_storage_bytes(&s), 12 * sizeof(float));
    struct tensor r = tensor_slice0(&s, 2);
    assert_int_equal(r.ndim, 1);
    assert_int_equal(r.shape[0], 4);
    assert_true(((float *)r.data)[0] == 20.0f);
    struct tensor e = tensor_slice0(&r, 3);
    assert_int_equal(e.ndim, 0);
    assert_true(*(float *)e.data == 23.0f);
}

/* MLX affine 4-bit, groups of 64: each logical row of 128 is 16 packed U32
 * words plus 2 scales and 2 biases (BF16). */
static void test_tensor_quantized(void **state)
{
    (void)state;
    static uint32_t w[2 * 3 * 16];
    static uint16_t sc[2 * 3 * 2], bi[2 * 3 * 2];
    struct tensor t;
    tensor_init(&t, DTYPE_U32, w, 3, (const int64_t[]){2, 3, 16});
    t.shape[2] = 128; /* logical */
    t.qbits = 4;
    t.qgroup = 64;
    t.qsdtype = DTYPE_BF16;
    t.qscales = sc;
    t.qbiases = bi;
    assert_int_equal(tensor_row_storage(&t), 16);
    assert_true(tensor_is_contiguous(&t));
    assert_int_equal(tensor_nelem(&t), 2 * 3 * 128);
    assert_int_equal(tensor_storage_bytes(&t), 6 * 16 * 4 + 2 * 6 * 2 * 2);
    assert_int_equal(tensor_data_extent(&t), 6 * 16 * 4);
    assert_int_equal(tensor_qaux_bytes(&t), 6 * 2 * 2);

    struct tensor s = tensor_slice0(&t, 1);
    assert_int_equal(s.ndim, 2);
    assert_int_equal(s.shape[0], 3);
    assert_int_equal(s.shape[1], 128);
    assert_int_equal(s.qbits, 4);
    assert_ptr_equal(s.data, w + 48);
    assert_ptr_equal(s.qscales, sc + 6);
    assert_ptr_equal(s.qbiases, bi + 6);
    assert_int_equal(tensor_storage_bytes(&s), 3 * 16 * 4 + 2 * 3 * 2 * 2);
    /* a view whose rows are apart: [3 of every 2nd row of 16 words] ends with its last row */
    struct tensor gap = s;
    gap.stride[0] = 32;
    assert_int_equal(tensor_data_extent(&gap), (2 * 32 + 16) * 4);
    gap.shape[0] = 0;
    assert_int_equal(tensor_data_extent(&gap), 0);

    struct tensor row = tensor_slice0(&s, 2);
    assert_ptr_equal(row.data, w + 48 + 32);
    assert_ptr_equal(row.qscales, sc + 6 + 4);

    /* the plain 2-D case: [8, 128] */
    struct tensor q;
    tensor_init(&q, DTYPE_U32, w, 2, (const int64_t[]){8, 16});
    q.shape[1] = 128;
    q.qbits = 4;
    q.qgroup = 64;
    q.qsdtype = DTYPE_BF16;
    q.qscales = sc;
    q.qbiases = bi;
    assert_int_equal(tensor_storage_bytes(&q), 8 * 16 * 4 + 2 * 8 * 2 * 2);
    /* fp modes have U8 scales and no biases */
    q.qmode = QMODE_MXFP4;
    q.qgroup = 32;
    q.qsdtype = DTYPE_U8;
    q.qbiases = NULL;
    assert_int_equal(tensor_storage_bytes(&q), 8 * 16 * 4 + 8 * 4 * 1);
    struct tensor r1 = tensor_slice0(&q, 1);
    assert_ptr_equal(r1.qscales, (const uint8_t *)sc + 4);
    assert_null(r1.qbiases);
}

// ---- threadpool ----

#define TP_MAX 8

struct tp_count {
    atomic_int hits[TP_MAX];
    atomic_int bad_nth;
    int nth;
};

static void tp_count_fn(void *ctx, int ith, int nth)
{
    struct tp_count *c = ctx;
    if (nth != c->nth || ith < 0 || ith >= nth)
        atomic_fetch_add(&c->bad_nth, 1);
    else
        atomic_fetch_add(&c->hits[ith], 1);
}

static void test_tpool_every_ith(void **state)
{
    (void)state;
    enum { RUNS = 1000 };
    for (int n = 1; n <= 4; n++) {
        struct tpool *p;
        struct err e = {0};
        assert_int_equal(tpool_new(&p, n, &e), 0);
        assert_int_equal(tpool_size(p), n);
        struct tp_count c = {.nth = n};
        for (int r = 0; r < RUNS; r++) {
            tpool_run(p, tp_count_fn, &c);
            /* after each return, every thread has run exactly once more */
            for (int i = 0; i < n; i++)
                if (atomic_load(&c.hits[i]) != r + 1)
                    fail_msg("pool %d run %d: thread %d ran %d times", n, r, i,
                             atomic_load(&c.hits[i]));
        }
        assert_int_equal(atomic_load(&c.bad_nth), 0);
        tpool_free(p);
    }
}

struct tp_sum {
    const int64_t *x;
    long n;
    int64_t partial[TP_MAX]; /* plain stores: the pool must publish them */
};

static void tp_sum_fn(void *ctx, int ith, int nth)
{
    struct tp_sum *s = ctx;
    long lo, hi;
    tpool_range(s->n, ith, nth, &lo, &hi);
    int64_t acc = 0;
    for (long i = lo; i < hi; i++)
        acc += s->x[i];
    s->partial[ith] = acc;
}

static void test_tpool_results_visible(void **state)
{
    (void)state;
    enum { N = 1001, RUNS = 1000 };
    int64_t *x = malloc(N * sizeof *x);
    assert_non_null(x);
    for (int n = 2; n <= 4; n++) {
        struct tpool *p;
        assert_int_equal(tpool_new(&p, n, NULL), 0);
        for (int r = 0; r < RUNS; r++) {
            for (int i = 0; i < N; i++)
                x[i] = r + i;
            struct tp_sum s = {.x = x, .n = N};
            tpool_run(p, tp_sum_fn, &s);
            int64_t total = 0;
            for (int i = 0; i < n; i++)
                total += s.partial[i];
            assert_int_equal(total, (int64_t)N * r + (int64_t)N * (N - 1) / 2);
        }
        tpool_free(p);
    }
    free(x);
}

static void test_tpool_lifecycle(void **state)
{
    (void)state;
    struct tpool *p;
    struct err e = {0};
    /* no pool: the caller runs the job as thread 0 of 1 */
    struct tp_count c = {.nth = 1};
    tpool_run(NULL, tp_count_fn, &c);
    assert_int_equal(atomic_load(&c.hits[0]), 1);
    assert_int_equal(tpool_size(NULL), 1);
    tpool_free(NULL);

    assert_true(tpool_default_threads() >= 1);
    assert_int_equal(tpool_new(&p, 0, &e), 0);
    assert_int_equal(tpool_size(p), tpool_default_threads());
    tpool_free(p);

    assert_int_equal(tpool_new(&p, 5000, &e), -ERR_ARG);
    assert_null(p);
    assert_non_null(strstr(e.msg, "5000"));

    /* create and destroy quickly: workers may not have started yet */
    for (int i = 0; i < 200; i++) {
        assert_int_equal(tpool_new(&p, 1 + i % 4, &e), 0);
        if (i % 2) {
            struct tp_count k = {.nth = 1 + i % 4};
            tpool_run(p, tp_count_fn, &k);
            assert_int_equal(atomic_load(&k.bad_nth), 0);
        }
        tpool_free(p);
    }
}

static void test_tpool_range(void **state)
{
    (void)state;
    for (long n = 0; n <= 130; n++) {
        for (int nth = 1; nth <= 9; nth++) {
            long next = 0;
            for (int ith = 0; ith < nth; ith++) {
                long lo, hi;
                tpool_range(n, ith, nth, &lo, &hi);
                /* chunks are contiguous, in order, and never larger than ceil(n/nth) */
                if (lo != next || hi < lo || hi - lo > (n + nth - 1) / nth)
                    fail_msg("n %ld nth %d ith %d: [%ld, %ld) after %ld", n, nth, ith, lo, hi,
                             next);
                next = hi;
            }
            if (next != n)
                fail_msg("n %ld nth %d: chunks end at %ld", n, nth, next);
        }
    }
}

/* tpool_claim_guided from one thread: contiguous pieces from 0 to n that never grow, each
 * what is left over 2 nth, at least 1 unit. */
static void test_tpool_claim_guided_shape(void **state)
{
    (void)state;
    for (long n = 0; n <= 300; n += 7) {
        for (int nth = 1; nth <= 4; nth++) {
            atomic_long next = 0;
            long lo, hi, end = 0, last = n + 1;
            while (tpool_claim_guided(&next, n, nth, &lo, &hi)) {
                long want = (n - lo) / (2L * nth);
                want = want > 1 ? want : 1;
                if (lo != end || hi <= lo || hi > n || hi - lo > last || hi - lo != want)
                    fail_msg("n %ld nth %d: [%ld, %ld) after %ld", n, nth, lo, hi, end);
                end = hi;
                last = hi - lo;
            }
            if (end != n)
                fail_msg("n %ld nth %d: pieces end at %ld", n, nth, end);
        }
    }
}

struct tp_guided {
    atomic_long next;
    long n;
    atomic_int *hits;
};

static void tp_guided_fn(void *ctx, int ith, int nth)
{
    (void)ith;
    struct tp_guided *g = ctx;
    long lo, hi;
    while (tpool_claim_guided(&g->next, g->n, nth, &lo, &hi))
        for (long i = lo; i < hi; i++)
            atomic_fetch_add(&g->hits[i], 1);
}

/* Threads claiming together take every unit exactly once. */
static void test_tpool_claim_guided_pool(void **state)
{
    (void)state;
    enum { N = 4099, RUNS = 200 };
    atomic_int *hits = calloc(N, sizeof *hits);
    assert_non_null(hits);
    for (int n = 2; n <= 4; n++) {
        struct tpool *p;
        assert_int_equal(tpool_new(&p, n, NULL), 0);
        for (int r = 0; r < RUNS; r++) {
            struct tp_guided g = {.n = N - r, .hits = hits};
            atomic_init(&g.next, 0);
            tpool_run(p, tp_guided_fn, &g);
            for (long i = 0; i < N; i++)
                if (atomic_load(&hits[i]) != (i < N - r))
                    fail_msg("pool %d run %d: unit %ld claimed %d times", n, r, i,
                             atomic_load(&hits[i]));
            for (long i = 0; i < N; i++)
                atomic_store(&hits[i], 0);
        }
        tpool_free(p);
    }
    free(hits);
}

/* A worker held outside any job (blocked in a signal handler, as if the host had descheduled
 * it) stalls nothing: the parts are claimed, so the caller runs the held worker's part of
 * every job, and after a window of such jobs runs stretches of them alone. The handler lets
 * go by itself after TP_HOLD_S, so a pool that waits for every worker (the one before ADR
 * 0052) finishes the test too, late, and fails its check that the jobs ran while the
 * worker was held. */
#define TP_HOLD_S 10

static atomic_int g_tp_held, g_tp_release;

static void tp_hold_handler(int sig)
{
    (void)sig;
    atomic_store(&g_tp_held, 1);
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < TP_HOLD_S * 1000 && !atomic_load(&g_tp_release); i++)
        nanosleep(&ts, NULL);
    atomic_store(&g_tp_held, 0);
}

struct tp_hold {
    atomic_int hits[2];
    atomic_int bad;
    atomic_int have_worker;
    pthread_t caller, worker;
};

static void tp_hold_fn(void *ctx, int ith, int nth)
{
    struct tp_hold *h = ctx;
    if (nth != 2 || ith < 0 || ith > 1) {
        atomic_fetch_add(&h->bad, 1);
        return;
    }
    atomic_fetch_add(&h->hits[ith], 1);
    if (!pthread_equal(pthread_self(), h->caller)) {
        if (!atomic_load(&h->have_worker)) {
            h->worker = pthread_self();
            atomic_store(&h->have_worker, 1);
        }
        return;
    }
    /* until the worker is known, the caller's part waits for it (up to 100 ms) so that it
     * claims the other part even on a loaded machine, where the caller would take both */
    struct timespec ts = {0, 100000};
    for (int i = 0; i < 1000 && !atomic_load(&h->have_worker); i++)
        nanosleep(&ts, NULL);
}

static void test_tpool_held_worker(void **state)
{
    (void)state;
    enum { JOBS = 1000, WARM_MAX = 1000 };
    struct tp_hold h = {.caller = pthread_self()};
    struct sigaction sa = {.sa_handler = tp_hold_handler}, old;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    atomic_store(&g_tp_held, 0);
    atomic_store(&g_tp_release, 0);
    struct tpool *p;
    assert_int_equal(tpool_new(&p, 2, NULL), 0);
    int runs = 0;
    /* until the worker has run a part, which tells its thread */
    while (!atomic_load(&h.have_worker) && runs < WARM_MAX) {
        tpool_run(p, tp_hold_fn, &h);
        runs++;
    }
    assert_true(atomic_load(&h.have_worker));
    assert_int_equal(pthread_kill(h.worker, SIGUSR1), 0);
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 10000 && !atomic_load(&g_tp_held); i++)
        nanosleep(&ts, NULL);
    assert_true(atomic_load(&g_tp_held));

    struct tpool_stats before, after;
    tpool_get_stats(p, &before);
    for (int j = 0; j < JOBS; j++, runs++)
        tpool_run(p, tp_hold_fn, &h);
    tpool_get_stats(p, &after);
    int still_held = atomic_load(&g_tp_held);
    atomic_store(&g_tp_release, 1);
    tpool_free(p);
    sigaction(SIGUSR1, &old, NULL);

    assert_int_equal(atomic_load(&h.bad), 0);
    assert_int_equal(atomic_load(&h.hits[0]), runs);
    assert_int_equal(atomic_load(&h.hits[1]), runs);
    if (!still_held)
        fail_msg("the %d jobs waited for the held worker (it was let go after %d s)", JOBS, TP_HOLD_S);
    uint64_t shared = after.shared_jobs - before.shared_jobs, alone = after.solo_jobs - before.solo_jobs;
    uint64_t stolen = after.parts_stolen - before.parts_stolen;
    /* every shared job: the caller ran the held worker's part itself */
    assert_int_equal(shared + alone, JOBS);
    assert_int_equal(stolen, shared);
    /* a window of lone jobs starts a stretch of jobs run alone */
    assert_true(after.solo_stretches > before.solo_stretches);
    assert_true(alone > 0);
}

// ---- json ----

/* One document for json_parse_object and st_header_parse (as a header with an
 * empty data section): sub NULL means both accept it, else both refuse it with
 * -ERR_FORMAT and sub right after the document's name ("doc" / "header"). */
struct json_case {
    const char *text;
    size_t len;
    const char *sub;
};

static void json_case_run(const struct json_case *c)
{
    cJSON *o = (cJSON *)&o; /* poison: must come back NULL on failure */
    struct st_tensor *t = NULL;
    size_t n = 1;
    struct err e = {0}, he = {0};
    char want[200];
    int rc = json_parse_object(c->text, c->len, "doc", &o, &e);
    int hrc = st_header_parse(c->text, c->len, 0, &t, &n, &he);
    if (!c->sub) {
        if (rc != 0 || hrc != 0)
            fail_msg("'%s': json %d (%s), header %d (%s), want both 0", c->text, rc, e.msg, hrc,
                     he.msg);
        assert_true(cJSON_IsObject(o));
        cJSON_Delete(o);
        st_tensors_free(t, n);
        return;
    }
    snprintf(want, sizeof want, "doc %s", c->sub);
    if (rc != -ERR_FORMAT || !strstr(e.msg, want))
        fail_msg("'%s': json rc %d, message \"%s\", want \"%s\"", c->text, rc, e.msg, want);
    assert_null(o);
    snprintf(want, sizeof want, "header %s", c->sub);
    if (hrc != -ERR_FORMAT || !strstr(he.msg, want))
        fail_msg("'%s': header rc %d, message \"%s\", want \"%s\"", c->text, hrc, he.msg, want);
    assert_null(t);
}

#define JSON_CASE(lit, sub) {lit, sizeof lit - 1, sub}

static void test_json_trailing(void **state)
{
    (void)state;
    static const struct json_case k_cases[] = {
        JSON_CASE("{\"__metadata__\":{}} junk",
                  "is not valid JSON (error at byte 20 of 24: trailing bytes"),
        JSON_CASE("{\"__metadata__\":{}}{\"__metadata__\":{}}",
                  "is not valid JSON (error at byte 19 of 38: trailing bytes"),
        JSON_CASE("{}[]", "is not valid JSON (error at byte 2 of 4: trailing bytes"),
        JSON_CASE("{}0", "is not valid JSON (error at byte 2 of 3: trailing bytes"),
        /* cJSON skips every byte <= 0x20 as space; JSON has four */
        JSON_CASE("{\"__metadata__\":{}}\v", "is not valid JSON (error at byte 19 of 20: trailing"),
        JSON_CASE("{\"__metadata__\":{}} \t\r\n", NULL),
        JSON_CASE(" \n{}", NULL),
        JSON_CASE("{}", NULL),
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        json_case_run(&k_cases[i]);
}

static void test_json_nul(void **state)
{
    (void)state;
    static const struct json_case k_cases[] = {
        /* a NUL inside a string would otherwise come back as a shorter string */
        JSON_CASE("{\"__metadata__\":{\"k\":\"a\0b\"}}",
                  "is not valid JSON (error at byte 23 of 28: NUL byte)"),
        JSON_CASE("{}\0", "is not valid JSON (error at byte 2 of 3: NUL byte)"),
        JSON_CASE("{} \0 ", "is not valid JSON (error at byte 3 of 5: NUL byte)"),
        JSON_CASE("\0{}", "is not valid JSON (error at byte 0 of 3: NUL byte)"),
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        json_case_run(&k_cases[i]);
}

static void test_json_invalid(void **state)
{
    (void)state;
    static const struct json_case k_cases[] = {
        JSON_CASE("", "is not valid JSON (error at byte 0 of 0)"),
        JSON_CASE("{\"a\": ", "is not valid JSON (error at byte"),
        JSON_CASE("[]", "is not a JSON object"),
        JSON_CASE("\"{}\"", "is not a JSON object"),
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        json_case_run(&k_cases[i]);
    /* len bounds the document: the bytes after it are never looked at */
    static const char k_longer[] = "{\"__metadata__\":{}} junk";
    struct json_case prefix = {k_longer, 19, NULL};
    json_case_run(&prefix);
}

/* Numbers as RFC 8259 (and Python's json) write them: cJSON alone takes these. */
static void test_json_numbers(void **state)
{
    (void)state;
    static const struct json_case k_cases[] = {
        JSON_CASE("{\"a\":02}", "is not valid JSON (error at byte 5 of 8: not a JSON number, at 'a')"),
        JSON_CASE("{\"a\":{\"b\":[1,2,-01]}}", "is not valid JSON (error at byte 15 of 21: not a JSON number, at 'a.b[2]')"),
        JSON_CASE("{\"a\":1.}", "is not valid JSON (error at byte 5 of 8: not a JSON number, at 'a')"),
        JSON_CASE("{\"a\":-.5}", "is not valid JSON (error at byte 5 of 9: not a JSON number, at 'a')"),
        JSON_CASE("{\"a\":1.e5}", "is not valid JSON (error at byte 5 of 10: not a JSON number, at 'a')"),
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        json_case_run(&k_cases[i]);
    static const char *const k_ok[] = {"{\"a\":[0.5,-0,1e5,1E+5,-2.5e-3,10,0e0]}", "{\"a\":\"02 1. -.5\"}"};
    for (size_t i = 0; i < sizeof k_ok / sizeof k_ok[0]; i++) {
        cJSON *o = NULL;
        struct err e = {0};
        if (json_parse_object(k_ok[i], strlen(k_ok[i]), "doc", &o, &e) != 0)
            fail_msg("'%s': %s", k_ok[i], e.msg);
        cJSON_Delete(o);
    }
}

/* A key twice: config files keep the last (Python's json, as transformers reads them);
 * json_parse_object keeps both (its readers refuse duplicates themselves); the refusing
 * policy names the key's path. */
static void test_json_duplicates(void **state)
{
    (void)state;
    static const char k_doc[] = "{\"a\":1,\"b\":{\"c\":1,\"c\":2,\"c\":3},\"a\":2}";
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "config.json");
    cJSON *o = NULL;
    struct err e = {0};
    assert_int_equal(stb_write_text(path, k_doc), 0);
    assert_int_equal(json_load_object(path, FILE_USER, 256, &o, &e), 0);
    assert_int_equal(cJSON_GetArraySize(o), 2);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(o, "a")->valueint, 2);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "b");
    assert_int_equal(cJSON_GetArraySize(b), 1);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(b, "c")->valueint, 3);
    cJSON_Delete(o);
    assert_int_equal(json_parse_object(k_doc, strlen(k_doc), "doc", &o, &e), 0);
    assert_int_equal(cJSON_GetArraySize(o), 3);
    cJSON_Delete(o);
    assert_int_equal(json_parse_doc(k_doc, strlen(k_doc), "doc", JSON_DUPS_REFUSE, &o, &e), -ERR_FORMAT);
    assert_null(o);
    assert_non_null(strstr(e.msg, "doc: the key 'b.c' appears twice"));
    stb_rmtree(dir);
}

static void test_json_load(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "config.json");
    cJSON *o = NULL;
    struct err e = {0};
    assert_int_equal(stb_write_text(path, "{\"a\": 1}\n"), 0);
    assert_int_equal(json_load_object(path, FILE_USER, 64, &o, &e), 0);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(o, "a")->valueint, 1);
    cJSON_Delete(o);
    assert_int_equal(stb_write_text(path, "{\"a\": 1}\n{\"b\": 2}\n"), 0);
    assert_int_equal(json_load_object(path, FILE_USER, 64, &o, &e), -ERR_FORMAT);
    assert_null(o);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "error at byte 9 of 18: trailing bytes"));
    stb_rmtree(dir);
}

// ---- fileio ----

static void test_file_read_all(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "f.txt");
    char *buf = NULL;
    size_t len = 0;
    struct err e = {0};
    assert_int_equal(stb_write_text(path, "hello"), 0);
    assert_int_equal(file_read_all(path, 5, &buf, &len, &e), 0);
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello"); /* NUL-terminated */
    free(buf);
    assert_int_equal(file_read_all(path, 4, &buf, &len, &e), -ERR_RANGE);
    assert_null(buf);
    assert_non_null(strstr(e.msg, path));
    assert_non_null(strstr(e.msg, "5 bytes exceeds the 4-byte limit"));
    stb_rmtree(dir);
}

static void test_file_map_all(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "f.bin");
    static const uint8_t k_bytes[5] = {1, 0, 2, 0, 3};
    const void *map = NULL;
    size_t len = 0;
    struct err e = {0};
    assert_int_equal(stb_write_raw(path, k_bytes, sizeof k_bytes), 0);
    assert_int_equal(file_map_all(path, FILE_USER, &map, &len, &e), 0);
    assert_int_equal(len, sizeof k_bytes);
    assert_memory_equal(map, k_bytes, sizeof k_bytes);
    file_unmap(map, len);
    /* an empty file maps to nothing, successfully (mmap itself refuses length 0) */
    assert_int_equal(stb_write_raw(path, k_bytes, 0), 0);
    assert_int_equal(file_map_all(path, FILE_USER, &map, &len, &e), 0);
    assert_null(map);
    assert_int_equal(len, 0);
    file_unmap(map, len);
    stb_rmtree(dir);
}

/* Reading and mapping refuse the same files with the same error. */
static void expect_refused(const char *path, int code, const char *sub)
{
    char *buf = (char *)&buf; /* poison: must come back NULL */
    const void *map = &map;
    size_t len = 0;
    struct err e = {0};
    if (file_read_scoped(path, FILE_FOLDER, 64, &buf, &len, &e) != -code || !strstr(e.msg, sub))
        fail_msg("file_read_scoped(%s): \"%s\", want code %d and \"%s\"", path, e.msg, code, sub);
    assert_null(buf);
    if (file_map_all(path, FILE_FOLDER, &map, &len, &e) != -code || !strstr(e.msg, sub))
        fail_msg("file_map_all(%s): \"%s\", want code %d and \"%s\"", path, e.msg, code, sub);
    assert_null(map);
}

static void test_file_refused(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    expect_refused(stb_path(dir, "absent"), ERR_MISSING, "absent");
    expect_refused(dir, ERR_IO, "not a regular file");
    stb_rmtree(dir);
}

/* mem_huge_alloc: small sizes 64-byte aligned, 2 MiB and more on a huge-page boundary and
 * writable to the end, a size whose rounding would wrap refused; MemAvailable is read. */
static void test_mem_huge_alloc(void **state)
{
    (void)state;
    uint8_t *s = mem_huge_alloc(100), *h = mem_huge_alloc((3u << 20) + 5);
    assert_non_null(s);
    assert_non_null(h);
    assert_int_equal((uintptr_t)s % 64, 0);
    assert_int_equal((uintptr_t)h % (2u << 20), 0);
    memset(s, 1, 100);
    memset(h, 2, (3u << 20) + 5);
    assert_int_equal(h[(3u << 20) + 4], 2);
    free(s);
    free(h);
    assert_null(mem_huge_alloc(SIZE_MAX - 1));
    assert_true(mem_available_bytes() > 0);
    /* mem_anon_alloc: from 2 MiB on on a huge-page boundary, every byte writable */
    for (size_t len = (2u << 20) - 4096; len <= (6u << 20) + 3; len += (2u << 20) + 4097) {
        uint8_t *a = mem_anon_alloc(len);
        assert_non_null(a);
        if (len >= (2u << 20))
            assert_int_equal((uintptr_t)a % (2u << 20), 0);
        assert_int_equal((uintptr_t)a % 4096, 0);
        memset(a, 3, len);
        assert_int_equal(a[len - 1], 3);
        mem_anon_free(a, len);
    }
    assert_null(mem_anon_alloc(SIZE_MAX - 1));
}

static const struct CMUnitTest k_dtype_tests[] = {
    cmocka_unit_test(test_dtype_names),
    cmocka_unit_test(test_f16_known),
    cmocka_unit_test(test_f16_exhaustive),
    cmocka_unit_test(test_f16_midpoints),
    cmocka_unit_test(test_bf16_known),
    cmocka_unit_test(test_bf16_exhaustive),
    cmocka_unit_test(test_dtype_to_f32),
};

static const struct CMUnitTest k_tensor_tests[] = {
    cmocka_unit_test(test_tensor_init),
    cmocka_unit_test(test_tensor_slice0),
    cmocka_unit_test(test_tensor_quantized),
};

static const struct CMUnitTest k_threadpool_tests[] = {
    cmocka_unit_test(test_tpool_every_ith),
    cmocka_unit_test(test_tpool_results_visible),
    cmocka_unit_test(test_tpool_lifecycle),
    cmocka_unit_test(test_tpool_range),
    cmocka_unit_test(test_tpool_claim_guided_shape),
    cmocka_unit_test(test_tpool_claim_guided_pool),
    cmocka_unit_test(test_tpool_held_worker),
};

TEST_SUITE(dtype, k_dtype_tests);
TEST_SUITE(tensor, k_tensor_tests);
/* ---- termsafe: untrusted text for a terminal ---- */

static void expect_escaped(const char *in, size_t n, const char *want)
{
    char buf[256];
    size_t total = termsafe_escape(buf, sizeof buf, in, n);
    if (strcmp(buf, want) != 0)
        fail_msg("escape: got '%s', want '%s'", buf, want);
    assert_int_equal(total, strlen(want));
}

static void test_termsafe(void **state)
{
    (void)state;
    expect_escaped("plain caf\xc3\xa9", 11, "plain caf\xc3\xa9");
    /* OSC title, BEL, CSI, newline forging a second line, DEL, NUL inside */
    expect_escaped("a\x1b]0;t\x07" "b", 8, "a\\x1B]0;t\\x07b");
    expect_escaped("x\x1b[2J\ny\r\tz\x7f", 11, "x\\x1B[2J\\ny\\r\\tz\\x7F");
    expect_escaped("n\0ul", 4, "n\\x00ul");
    /* C1 CSI and bidi controls as \u; bytes that are not UTF-8 as \x */
    expect_escaped("\xc2\x9b" "1m \xe2\x80\xae" "x \xe2\x81\xa6", 13, "\\u009b1m \\u202ex \\u2066");
    expect_escaped("\xff\xc0\x80\xed\xa0\x80", 6, "\\xFF\\xC0\\x80\\xED\\xA0\\x80");
    /* cut output: never in the middle of an escape or a character, total still counted */
    char small[6];
    size_t total = termsafe_escape(small, sizeof small, "ab\x1b" "cd", 5);
    assert_string_equal(small, "ab");
    assert_int_equal(total, 8);
    total = termsafe_escape(small, sizeof small, "abcd\xc3\xa9", 6);
    assert_string_equal(small, "abcd");
    assert_int_equal(total, 6);
    assert_int_equal(termsafe_unicode_control("\xc2\x85", 2), 0x85);
    assert_int_equal(termsafe_unicode_control("\xc3\xa9", 2), 0);
    /* termsafe_fputs over many slices equals one termsafe_escape */
    char big[3000], want[12100], got[12100];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = "a\x1b\xc2\x9b\xe2\x80\xae\xff"[i % 8];
    big[sizeof big - 1] = 0;
    termsafe_escape(want, sizeof want, big, strlen(big));
    FILE *f = fmemopen(got, sizeof got, "w");
    assert_non_null(f);
    assert_true(termsafe_fputs(big, f) != EOF);
    fclose(f);
    assert_string_equal(got, want);
}

/* The plain loops fscan replaces: the greedy pick and the finite check. */
static int32_t plain_argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static bool plain_finite(const float *v, int n)
{
    for (int i = 0; i < n; i++)
        if (isnan(v[i]) || isinf(v[i]))
            return false;
    return true;
}

/* fscan equals the plain loops on every length 0..70 (the SIMD body and every tail), on
 * ties, signed zeros, NaNs (first or later), infinities and a long row with its maximum
 * in the last element. */
static void test_fscan(void **state)
{
    (void)state;
    uint64_t r = 0x243f6a8885a308d3ull;
    float v[200];
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, 3.5f};
    for (int trial = 0; trial < 4000; trial++) {
        int n = trial % 71;
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int pick = (int)(r >> 59);
            /* small integers make ties common; specials now and then */
            v[i] = pick < 3 ? specials[(r >> 40) % 8] : (float)((int)((r >> 33) % 9) - 4);
        }
        if (trial % 7 == 0 && n > 0)
            v[n - 1] = 100.0f;  /* the maximum in the tail */
        assert_int_equal(fscan_argmax(v, n), plain_argmax(v, n));
        assert_int_equal(fscan_finite(v, n), plain_finite(v, n));
    }
    /* -0 first, +0 later: equal, the first stays */
    float z[20] = {-0.0f};
    assert_int_equal(fscan_argmax(z, 20), 0);
    /* a NaN in the first element: the plain loop never moves */
    float big[1000];
    for (int i = 0; i < 1000; i++)
        big[i] = (float)i;
    assert_int_equal(fscan_argmax(big, 1000), 999);
    assert_true(fscan_finite(big, 1000));
    big[0] = NAN;
    assert_int_equal(fscan_argmax(big, 1000), 0);
    assert_false(fscan_finite(big, 1000));
    big[0] = 0.0f;
    big[997] = -INFINITY;
    assert_false(fscan_finite(big, 1000));
    assert_int_equal(fscan_argmax(big, 1000), 999);
}

static const struct CMUnitTest k_json_tests[] = {
    cmocka_unit_test(test_json_trailing),
    cmocka_unit_test(test_json_nul),
    cmocka_unit_test(test_json_invalid),
    cmocka_unit_test(test_json_numbers),
    cmocka_unit_test(test_json_duplicates),
    cmocka_unit_test(test_json_load),
    cmocka_unit_test(test_termsafe),
    cmocka_unit_test(test_base64),
    cmocka_unit_test(test_fscan),
};

static const struct CMUnitTest k_fileio_tests[] = {
    cmocka_unit_test(test_file_read_all),
    cmocka_unit_test(test_file_map_all),
    cmocka_unit_test(test_mem_huge_alloc),
    cmocka_unit_test(test_file_refused),
};

TEST_SUITE(threadpool, k_threadpool_tests);
TEST_SUITE(json, k_json_tests);
TEST_SUITE(fileio, k_fileio_tests);
