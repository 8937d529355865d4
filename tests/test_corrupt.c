/*
 * corrupt suite: hostile and broken checkpoints driven through the real
 * loader (st_set_open on a throwaway folder, so the file, index and
 * discovery layers all run). Every case must fail with a specific error code
 * and a message holding a specific substring (the tensor, the file or the
 * problem), leave *out NULL, and leak nothing (the suite runs under ASan and
 * LeakSanitizer).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"
#include "core/safetensors.h"
#include "st_build.h"
#include "test.h"

#define MODEL "model.safetensors"

/* The same folder through the CLI: with a valid config.json beside the weights,
 * `mlxcel inspect` and `mlxcel generate` reach the loader and must fail with one
 * clear error line (exit 1) carrying the same detail. */
static void expect_cli_fail(const char *dir, const char *sub)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "cp %s %s/config.json", test_path("tests/fixtures/golden/llama/config.json"), dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "inspect -m %s", dir);
    cli_expect_error(cmd, sub ? sub : "");
    snprintf(cmd, sizeof cmd, "generate -m %s --prompt-ids 1,2 -n 1 --output-ids", dir);
    cli_expect_error(cmd, sub ? sub : "");
    snprintf(cmd, sizeof cmd, "%s/config.json", dir);
    unlink(cmd);
}

/* Open dir and require code plus every non-NULL substring in the message; then
 * the same through the CLI. */
static void expect_open_fail(const char *dir, int code, const char *sub1, const char *sub2)
{
    struct st_set *s = (struct st_set *)&s; /* poison: must come back NULL */
    struct err e = {0};
    int rc = st_set_open(&s, dir, &e);
    if (rc != -code || (sub1 && !strstr(e.msg, sub1)) || (sub2 && !strstr(e.msg, sub2)))
        fail_msg("rc %d (want %d), message \"%s\" (want \"%s\", \"%s\")", rc, -code, e.msg,
                 sub1 ? sub1 : "", sub2 ? sub2 : "");
    assert_null(s);
    if (strlen(dir) < 4000 && access(dir, W_OK) == 0) /* a missing folder: see tests/cli/errors.sh */
        expect_cli_fail(dir, sub1);
}

/* A folder with one model.safetensors holding `json` and data_len zero bytes
 * must fail with code and a message naming the file and holding sub. */
static void expect_header_fail(const char *json, size_t data_len, int code, const char *sub)
{
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    assert_int_equal(stb_write_header(stb_path(dir, MODEL), json, data_len), 0);
    expect_open_fail(dir, code, sub, MODEL);
    stb_rmtree(dir);
}

/* A folder with one model.safetensors of raw bytes. */
static void expect_raw_fail(const void *buf, size_t n, int code, const char *sub)
{
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    assert_int_equal(stb_write_raw(stb_path(dir, MODEL), buf, n), 0);
    expect_open_fail(dir, code, sub, MODEL);
    stb_rmtree(dir);
}

static void write_valid(const char *path)
{
    static const float v[6] = {1, 2, 3, 4, 5, 6};
    struct stb_tensor t[] = {
        {"first", "F32", 1, {2}, v, 8},
        {"w.last", "F32", 2, {2, 2}, v + 2, 16},
    };
    assert_int_equal(stb_write(path, t, 2), 0);
}

// ---- file framing ----

static void test_truncated_data(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, MODEL);
    write_valid(path);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    assert_int_equal(stb_truncate(path, size - 4), 0);
    expect_open_fail(dir, ERR_FORMAT, "'w.last'", "past the data section");
    stb_rmtree(dir);
}

static void test_truncated_header(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, MODEL);
    write_valid(path);
    assert_int_equal(stb_truncate(path, 8 + 20), 0);
    expect_open_fail(dir, ERR_FORMAT, "header length", "truncated");
    stb_rmtree(dir);
}

static void test_short_file(void **state)
{
    (void)state;
    static const uint8_t five[5] = {2, 0, 0, 0, 0};
    expect_raw_fail(five, sizeof five, ERR_FORMAT, "shorter than the 8-byte header length");
    expect_raw_fail(five, 0, ERR_FORMAT, "file is 0 bytes");
}

static void test_header_len_past_file(void **state)
{
    (void)state;
    uint8_t buf[8 + 2] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'}; /* claims 1000 bytes */
    expect_raw_fail(buf, sizeof buf, ERR_FORMAT, "header length 1000 exceeds the 2 bytes");
}

static void test_header_len_cap(void **state)
{
    (void)state;
    uint64_t over = (uint64_t)ST_MAX_HEADER + 1;
    uint8_t buf[10] = {0};
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(over >> (8 * i));
    buf[8] = '{';
    buf[9] = '}';
    expect_raw_fail(buf, sizeof buf, ERR_FORMAT, "cap");
    memset(buf, 0xff, 8); /* 2^64 - 1: must not wrap any size arithmetic */
    expect_raw_fail(buf, sizeof buf, ERR_FORMAT, "18446744073709551615");

    /* the parser applies the same cap when called directly */
    struct st_tensor *t;
    size_t n;
    struct err e = {0};
    assert_int_equal(st_header_parse("{}", (size_t)ST_MAX_HEADER + 1, 0, &t, &n, &e), -ERR_FORMAT);
    assert_null(t);
    assert_non_null(strstr(e.msg, "cap"));
}

static void test_not_a_file(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    struct st_set *s;
    struct err e = {0};
    assert_int_equal(st_set_open_file(&s, dir, &e), -ERR_IO);
    assert_null(s);
    assert_non_null(strstr(e.msg, "not a regular file"));
    assert_int_equal(st_set_open_file(&s, stb_path(dir, "absent.safetensors"), &e), -ERR_MISSING);
    assert_non_null(strstr(e.msg, "absent.safetensors"));
    stb_rmtree(dir);
}

// ---- header JSON ----

static void test_invalid_json(void **state)
{
    (void)state;
    expect_header_fail("{\"w\": {\"dtype\": ", 0, ERR_FORMAT, "not valid JSON");
    expect_header_fail("", 0, ERR_FORMAT, "not valid JSON");
    expect_header_fail("{} trailing", 0, ERR_FORMAT, "not valid JSON (error at byte 3");
    /* an embedded NUL must not end the header early */
    static const uint8_t nul[8 + 4] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, '}'};
    expect_raw_fail(nul, sizeof nul, ERR_FORMAT, "not valid JSON");
    /* nesting deeper than cJSON's limit fails cleanly instead of recursing */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 40);
    assert_non_null(deep);
    size_t w = (size_t)sprintf(deep, "{\"__metadata__\":");
    memset(deep + w, '[', depth);
    memset(deep + w + depth, ']', depth);
    strcpy(deep + w + 2 * depth, "}");
    expect_header_fail(deep, 0, ERR_FORMAT, "not valid JSON");
    free(deep);
}

static void test_not_object(void **state)
{
    (void)state;
    expect_header_fail("[1, 2]", 0, ERR_FORMAT, "header is not a JSON object");
    expect_header_fail("\"w\"", 0, ERR_FORMAT, "header is not a JSON object");
    expect_header_fail("{\"w\": 5}", 0, ERR_FORMAT, "tensor 'w': entry is not a JSON object");
    expect_header_fail("{\"w\": [\"F32\"]}", 0, ERR_FORMAT, "tensor 'w': entry is not");
}

static void test_bad_fields(void **state)
{
    (void)state;
    expect_header_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
                       "tensor 'w': \"dtype\" missing");
    expect_header_fail("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
                       "tensor 'w': \"dtype\" missing or not a string");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
                       "tensor 'w': \"shape\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4,
                       ERR_FORMAT, "tensor 'w': \"shape\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, ERR_FORMAT,
                       "tensor 'w': \"data_offsets\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"data_offsets\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"data_offsets\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8,
                       ERR_FORMAT, "tensor 'w': \"data_offsets\"");
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,18446744073709551615]}}",
                       8, ERR_FORMAT, "tensor 'w': \"data_offsets\"");
}

static void test_unknown_dtype(void **state)
{
    (void)state;
    expect_header_fail("{\"ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"w.fp8\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[4,8]}}",
                       8, ERR_UNSUPPORTED, "tensor 'w.fp8': unknown dtype 'F8_E4M3'");
    expect_header_fail("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                       ERR_UNSUPPORTED, "unknown dtype 'f32'");
}

// ---- shapes ----

static void test_shape_overflow(void **state)
{
    (void)state;
    /* (2^40)^3 x 4 bytes wraps 64 bits; the product must not be computed unchecked */
    expect_header_fail("{\"big\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,"
                       "1099511627776],\"data_offsets\":[0,0]}}",
                       0, ERR_FORMAT, "tensor 'big': shape [1099511627776, 1099511627776, "
                                      "1099511627776] x 4 bytes overflows");
    expect_header_fail("{\"big\":{\"dtype\":\"U8\",\"shape\":[9007199254740992,"
                       "9007199254740992],\"data_offsets\":[0,0]}}",
                       0, ERR_FORMAT, "overflows");
    /* 2^62 elements fit in 64 bits; 2^62 x 4 bytes do not */
    expect_header_fail("{\"big\":{\"dtype\":\"F32\",\"shape\":[4194304,4194304,262144],"
                       "\"data_offsets\":[0,0]}}",
                       0, ERR_FORMAT, "overflows");
}

static void test_shape_values(void **state)
{
    (void)state;
    expect_header_fail("{\"neg\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", 8,
                       ERR_FORMAT, "tensor 'neg': shape[0] must be an integer");
    expect_header_fail("{\"flt\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}",
                       12, ERR_FORMAT, "tensor 'flt': shape[1] must be an integer");
    expect_header_fail("{\"str\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
                       8, ERR_FORMAT, "tensor 'str': shape[0]");
    expect_header_fail("{\"inf\":{\"dtype\":\"F32\",\"shape\":[1e999],\"data_offsets\":[0,8]}}", 8,
                       ERR_FORMAT, "tensor 'inf': shape[0]");
    expect_header_fail("{\"huge\":{\"dtype\":\"U8\",\"shape\":[9007199254740994],"
                       "\"data_offsets\":[0,0]}}",
                       0, ERR_FORMAT, "tensor 'huge': shape[0] must be an integer in [0, 2^53]");
    expect_header_fail("{\"deep\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                       "\"data_offsets\":[0,1]}}",
                       1, ERR_FORMAT, "tensor 'deep': shape has 9 dims, at most 8");
}

// ---- offsets ----

static void test_size_mismatch(void **state)
{
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
                       ERR_FORMAT, "tensor 'w': data_offsets [0, 8] span 8 bytes, expected 12");
    expect_header_fail("{\"z\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[0,2]}}", 2,
                       ERR_FORMAT, "expected 0");
}

static void test_offsets_out_of_range(void **state)
{
    (void)state;
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                       12, ERR_FORMAT, "tensor 'b': data_offsets end 16 is past the data section "
                                       "(12 bytes)");
    /* an empty tensor may sit at the very end, but not past it */
    expect_header_fail("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9,9]}}", 8,
                       ERR_FORMAT, "tensor 'e'");
}

static void test_begin_after_end(void **state)
{
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                       ERR_FORMAT, "tensor 'w': data_offsets begin 8 > end 0");
}

static void test_overlap(void **state)
{
    (void)state;
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                       12, ERR_FORMAT, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    expect_header_fail("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"y\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                       8, ERR_FORMAT, "overlap");
    /* a small tensor inside a big one, listed after a third that ends earlier */
    expect_header_fail("{\"big\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[0,64]},"
                       "\"mid\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]},"
                       "\"in\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[32,36]}}",
                       64, ERR_FORMAT, "'big' [0, 64) and 'mid' [8, 16) overlap");
}

static void test_duplicate_in_file(void **state)
{
    (void)state;
    expect_header_fail("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                       2, ERR_FORMAT, "duplicate tensor name 'w'");
}

// ---- folders and index ----

static void write_shard(const char *path, const char *name)
{
    static const float v[2] = {1, 2};
    struct stb_tensor t[] = {{name, "F32", 1, {2}, v, 8}};
    assert_int_equal(stb_write(path, t, 1), 0);
}

static void test_duplicate_across_shards(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "a.safetensors"), "shared.w");
    write_shard(stb_path(dir, "b.safetensors"), "shared.w");
    expect_open_fail(dir, ERR_FORMAT, "duplicate tensor 'shared.w' in a.safetensors and "
                                      "b.safetensors", NULL);
    stb_rmtree(dir);
}

static void test_bad_shard_among_good(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "a.safetensors"), "a.w");
    assert_int_equal(stb_write_header(stb_path(dir, "b.safetensors"), "{", 0), 0);
    write_shard(stb_path(dir, "c.safetensors"), "c.w");
    expect_open_fail(dir, ERR_FORMAT, "b.safetensors", "not valid JSON");
    stb_rmtree(dir);
}

static void write_index(const char *dir, const char *json)
{
    assert_int_equal(stb_write_text(stb_path(dir, "model.safetensors.index.json"), json), 0);
}

static void test_index_missing_shard(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "s1.safetensors"), "a.w");
    write_index(dir, "{\"weight_map\":{\"a.w\":\"s1.safetensors\",\"b.w\":\"s2.safetensors\"}}");
    expect_open_fail(dir, ERR_MISSING, "names shard s2.safetensors which is missing", "'b.w'");

    /* nothing else to fall back on at all */
    char *bare = stb_tmpdir();
    assert_non_null(bare);
    write_index(bare, "{\"weight_map\":{\"a.w\":\"s1.safetensors\"}}");
    expect_open_fail(bare, ERR_MISSING, "names shard s1.safetensors which is missing",
                     "no *.safetensors files");
    stb_rmtree(bare);
    stb_rmtree(dir);
}

static void test_index_invalid(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "s1.safetensors"), "a.w");
    write_index(dir, "{\"weight_map\":{\"a.w\":\"s1.safetensors\",}");
    expect_open_fail(dir, ERR_FORMAT, "model.safetensors.index.json", "index is not valid JSON");
    write_index(dir, "{\"metadata\":{}}");
    expect_open_fail(dir, ERR_FORMAT, "\"weight_map\"", NULL);
    write_index(dir, "{\"weight_map\":{}}");
    expect_open_fail(dir, ERR_FORMAT, "\"weight_map\"", NULL);
    write_index(dir, "{\"weight_map\":[\"s1.safetensors\"]}");
    expect_open_fail(dir, ERR_FORMAT, "\"weight_map\"", NULL);
    write_index(dir, "{\"weight_map\":{\"a.w\":1}}");
    expect_open_fail(dir, ERR_FORMAT, "weight_map entry 'a.w' is not a shard file name", NULL);
    write_index(dir, "{\"weight_map\":{\"a.w\":\"../s1.safetensors\"}}");
    expect_open_fail(dir, ERR_FORMAT, "weight_map entry 'a.w' is not a shard file name", NULL);
    write_index(dir, "{\"weight_map\":{\"a.w\":\"\"}}");
    expect_open_fail(dir, ERR_FORMAT, "not a shard file name", NULL);
    write_index(dir, "[]");
    expect_open_fail(dir, ERR_FORMAT, "index is not a JSON object", NULL);
    /* the one JSON reader (core/json): nothing may follow the index object */
    write_index(dir, "{\"weight_map\":{\"a.w\":\"s1.safetensors\"}} {}");
    expect_open_fail(dir, ERR_FORMAT, "index is not valid JSON (error at byte 40 of 42: trailing",
                     NULL);
    /* an index entry for a tensor no shard holds */
    write_index(dir, "{\"weight_map\":{\"a.w\":\"s1.safetensors\",\"ghost\":\"s1.safetensors\"}}");
    expect_open_fail(dir, ERR_FORMAT, "'ghost'", "does not contain it");
    stb_rmtree(dir);
}

static void test_empty_dir(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    expect_open_fail(dir, ERR_MISSING, "no *.safetensors files in", dir);
    /* reference data alone is not a checkpoint */
    write_shard(stb_path(dir, "golden.safetensors"), "logits");
    expect_open_fail(dir, ERR_MISSING, "no *.safetensors files in", NULL);
    stb_rmtree(dir);
    expect_open_fail("/nonexistent/mlxcel-checkpoint", ERR_MISSING, "cannot open directory",
                     "/nonexistent/mlxcel-checkpoint");
}

static void test_path_too_long(void **state)
{
    (void)state;
    char *dir = malloc(8000);
    assert_non_null(dir);
    memset(dir, 'd', 7999);
    dir[0] = '/';
    dir[7999] = '\0';
    expect_open_fail(dir, ERR_ARG, "longer than", NULL);
    free(dir);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_truncated_data),
    cmocka_unit_test(test_truncated_header),
    cmocka_unit_test(test_short_file),
    cmocka_unit_test(test_header_len_past_file),
    cmocka_unit_test(test_header_len_cap),
    cmocka_unit_test(test_not_a_file),
    cmocka_unit_test(test_invalid_json),
    cmocka_unit_test(test_not_object),
    cmocka_unit_test(test_bad_fields),
    cmocka_unit_test(test_unknown_dtype),
    cmocka_unit_test(test_shape_overflow),
    cmocka_unit_test(test_shape_values),
    cmocka_unit_test(test_size_mismatch),
    cmocka_unit_test(test_offsets_out_of_range),
    cmocka_unit_test(test_begin_after_end),
    cmocka_unit_test(test_overlap),
    cmocka_unit_test(test_duplicate_in_file),
    cmocka_unit_test(test_duplicate_across_shards),
    cmocka_unit_test(test_bad_shard_among_good),
    cmocka_unit_test(test_index_missing_shard),
    cmocka_unit_test(test_index_invalid),
    cmocka_unit_test(test_empty_dir),
    cmocka_unit_test(test_path_too_long),
};

TEST_SUITE(corrupt, k_tests);
