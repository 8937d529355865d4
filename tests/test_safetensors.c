/*
 * safetensors suite: the loader on valid input. Files are written by
 * st_build into a fresh /tmp folder per test (single file, discovery,
 * index, stale index, zero-sized and scalar tensors, 100k tensors), plus the
 * committed golden llama checkpoint (9 shards + index) under tests/fixtures.
 * Corrupt input lives in test_corrupt.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/log.h"
#include "core/safetensors.h"
#include "st_build.h"
#include "test.h"

static const float k_f32[6] = {0.5f, 1.0f, -2.0f, 3.25f, 4.0f, -5.5f};
static const uint16_t k_bf16[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
static const int32_t k_i32[1] = {-7};

static void write_basic(const char *path)
{
    struct stb_tensor t[] = {
        {"w.f32", "F32", 2, {2, 3}, k_f32, sizeof k_f32},
        {"a.bf16", "BF16", 1, {4}, k_bf16, sizeof k_bf16},
        {"s.scalar", "I32", 0, {0}, k_i32, sizeof k_i32},
    };
    assert_int_equal(stb_write(path, t, 3), 0);
}

/* One shard of the synthetic two-shard model: tensors "<prefix>.k" for k in 0..n-1,
 * each F32 [2] holding {k, -k}. */
static void write_shard(const char *path, const char *prefix, int n)
{
    struct stb_tensor t[8];
    float v[8][2];
    char names[8][64];
    assert_true(n <= 8);
    for (int k = 0; k < n; k++) {
        v[k][0] = (float)k;
        v[k][1] = (float)-k;
        snprintf(names[k], sizeof names[k], "%s.%d", prefix, k);
        t[k] = (struct stb_tensor){names[k], "F32", 1, {2}, v[k], sizeof v[k]};
    }
    assert_int_equal(stb_write(path, t, (size_t)n), 0);
}

static void test_single_file(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "model.safetensors");
    write_basic(path);

    struct st_set *s;
    struct err e = {0};
    assert_int_equal(st_set_open_file(&s, path, &e), 0);
    assert_int_equal(st_set_count(s), 3);
    assert_int_equal(st_set_n_files(s), 1);
    assert_string_equal(st_set_file_path(s, 0), path);
    assert_null(st_set_file_path(s, 1));
    assert_int_equal(st_set_data_bytes(s), sizeof k_f32 + sizeof k_bf16 + sizeof k_i32);

    /* st_set_at walks names in strcmp order */
    assert_string_equal(st_set_at(s, 0)->name, "a.bf16");
    assert_string_equal(st_set_at(s, 1)->name, "s.scalar");
    assert_string_equal(st_set_at(s, 2)->name, "w.f32");
    assert_null(st_set_at(s, 3));

    const struct st_tensor *w = st_set_find(s, "w.f32");
    assert_non_null(w);
    assert_int_equal(w->dtype, DTYPE_F32);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 3);
    assert_int_equal(w->begin, 0);
    assert_int_equal(w->end, 24);
    assert_int_equal(w->file, 0);
    assert_false(w->consumed);
    assert_memory_equal(w->data, k_f32, sizeof k_f32);

    const struct st_tensor *a = st_set_find(s, "a.bf16");
    assert_non_null(a);
    assert_int_equal(a->dtype, DTYPE_BF16);
    assert_memory_equal(a->data, k_bf16, sizeof k_bf16);

    const struct st_tensor *sc = st_set_find(s, "s.scalar");
    assert_non_null(sc);
    assert_int_equal(sc->ndim, 0);
    assert_int_equal(*(const int32_t *)sc->data, -7);

    assert_null(st_set_find(s, "missing"));
    assert_null(st_set_find(s, ""));
    st_set_free(s);
    stb_rmtree(dir);
}

static void test_header_parse_direct(void **state)
{
    (void)state;
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"b\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[8,16]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                       "\"z\":{\"dtype\":\"F64\",\"shape\":[0,3],\"data_offsets\":[16,16]}}   \n";
    struct st_tensor *t;
    size_t n;
    struct err e = {0};
    assert_int_equal(st_header_parse(json, strlen(json), 16, &t, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_string_equal(t[0].name, "a");
    assert_string_equal(t[1].name, "b");
    assert_string_equal(t[2].name, "z");
    assert_int_equal(t[1].dtype, DTYPE_F16);
    assert_int_equal(t[1].begin, 8);
    assert_null(t[1].data);
    assert_int_equal(t[2].ndim, 2);
    st_tensors_free(t, n);

    /* the same header against a data section one byte short */
    assert_int_equal(st_header_parse(json, strlen(json), 15, &t, &n, &e), -ERR_FORMAT);
    assert_null(t);
    assert_int_equal(n, 0);
    assert_non_null(strstr(e.msg, "'b'"));

    /* only metadata: a valid, empty checkpoint header */
    const char *empty = "{\"__metadata__\":{}}";
    assert_int_equal(st_header_parse(empty, strlen(empty), 0, &t, &n, &e), 0);
    assert_int_equal(n, 0);
    st_tensors_free(t, n);
    st_tensors_free(NULL, 0);
}

static void test_metadata_lenient(void **state)
{
    (void)state;
    /* __metadata__ that is not an object of strings is skipped, not rejected */
    const char *json = "{\"__metadata__\":[1,{\"x\":2}],"
                       "\"w\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[0,3],\"extra\":1}}";
    struct st_tensor *t;
    size_t n;
    struct err e = {0};
    assert_int_equal(st_header_parse(json, strlen(json), 3, &t, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_int_equal(t[0].dtype, DTYPE_I8);
    st_tensors_free(t, n);
}

static void test_discovery(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "model-b.safetensors"), "b", 3);
    write_shard(stb_path(dir, "model-a.safetensors"), "a", 2);
    write_shard(stb_path(dir, "golden.safetensors"), "golden", 2); /* reference data: skipped */
    assert_int_equal(stb_write_text(stb_path(dir, "config.json"), "{}"), 0);
    assert_int_equal(mkdir(stb_path(dir, "sub.safetensors"), 0700), 0); /* not a file: skipped */

    struct st_set *s;
    struct err e = {0};
    assert_int_equal(st_set_open(&s, dir, &e), 0);
    assert_int_equal(st_set_n_files(s), 2);
    assert_string_equal(st_set_file_path(s, 0), stb_path(dir, "model-a.safetensors"));
    assert_string_equal(st_set_file_path(s, 1), stb_path(dir, "model-b.safetensors"));
    assert_int_equal(st_set_count(s), 5);
    assert_null(st_set_find(s, "golden.0"));
    const struct st_tensor *t = st_set_find(s, "b.2");
    assert_non_null(t);
    assert_int_equal(t->file, 1);
    assert_true(((const float *)t->data)[0] == 2.0f);
    assert_true(((const float *)t->data)[1] == -2.0f);
    assert_int_equal(st_set_find(s, "a.1")->file, 0);
    st_set_free(s);
    stb_rmtree(dir);
}

static const char k_index[] =
    "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
    "\"a.0\":\"model-00001-of-00002.safetensors\","
    "\"a.1\":\"model-00001-of-00002.safetensors\","
    "\"b.0\":\"model-00002-of-00002.safetensors\","
    "\"b.1\":\"model-00002-of-00002.safetensors\","
    "\"b.2\":\"model-00002-of-00002.safetensors\"}}";

static void test_index(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "model-00001-of-00002.safetensors"), "a", 2);
    write_shard(stb_path(dir, "model-00002-of-00002.safetensors"), "b", 3);
    /* a leftover consolidated copy holding the same names: the index keeps it out */
    write_shard(stb_path(dir, "consolidated.safetensors"), "b", 3);
    assert_int_equal(stb_write_text(stb_path(dir, "model.safetensors.index.json"), k_index), 0);

    struct st_set *s;
    struct err e = {0};
    assert_int_equal(st_set_open(&s, dir, &e), 0);
    assert_int_equal(st_set_n_files(s), 2);
    assert_int_equal(st_set_count(s), 5);
    assert_int_equal(st_set_data_bytes(s), 40);
    assert_int_equal(st_set_find(s, "b.1")->file, 1);
    assert_string_equal(st_set_file_path(s, 1), stb_path(dir, "model-00002-of-00002.safetensors"));
    st_set_free(s);
    stb_rmtree(dir);
}

static void test_index_wrong_shard(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    write_shard(stb_path(dir, "s1.safetensors"), "a", 2);
    write_shard(stb_path(dir, "s2.safetensors"), "b", 1);
    assert_int_equal(stb_write_text(stb_path(dir, "model.safetensors.index.json"),
                                    "{\"weight_map\":{\"a.0\":\"s1.safetensors\","
                                    "\"a.1\":\"s2.safetensors\",\"b.0\":\"s2.safetensors\"}}"),
                     0);
    struct st_set *s = (struct st_set *)1;
    struct err e = {0};
    assert_int_equal(st_set_open(&s, dir, &e), -ERR_FORMAT);
    assert_null(s);
    assert_non_null(strstr(e.msg, "'a.1'"));
    assert_non_null(strstr(e.msg, "s2.safetensors"));
    assert_non_null(strstr(e.msg, "s1.safetensors"));
    stb_rmtree(dir);
}

struct log_capture {
    int n;
    char last[512];
};

static void capture_sink(int level, const char *line, void *ud)
{
    struct log_capture *c = ud;
    if (level == LOG_LEVEL_WARN) {
        c->n++;
        snprintf(c->last, sizeof c->last, "%s", line);
    }
}

static void test_stale_index(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    /* the index describes a 2-shard layout; the folder was re-saved as 2 other files */
    write_shard(stb_path(dir, "model-a.safetensors"), "a", 2);
    write_shard(stb_path(dir, "model-b.safetensors"), "b", 3);
    assert_int_equal(stb_write_text(stb_path(dir, "model.safetensors.index.json"), k_index), 0);

    struct log_capture cap = {0};
    log_set_sink(capture_sink, &cap);
    struct st_set *s;
    struct err e = {0};
    int rc = st_set_open(&s, dir, &e);
    log_set_sink(NULL, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(st_set_n_files(s), 2);
    assert_int_equal(st_set_count(s), 5);
    assert_int_equal(cap.n, 1);
    assert_non_null(strstr(cap.last, "model-00001-of-00002.safetensors"));
    assert_non_null(strstr(cap.last, "stale"));
    st_set_free(s);
    stb_rmtree(dir);
}

static void test_take(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "model.safetensors");
    struct stb_tensor t[] = {
        {"w.f32", "F32", 2, {2, 3}, k_f32, sizeof k_f32},
        {"a.bf16", "BF16", 1, {4}, k_bf16, sizeof k_bf16},
        {"s.scalar", "I32", 0, {0}, k_i32, sizeof k_i32},
        {"five", "U8", 5, {1, 1, 1, 2, 1}, NULL, 2},
        {"four", "U8", 4, {1, 2, 1, 3}, NULL, 6},
    };
    assert_int_equal(stb_write(path, t, 5), 0);

    struct st_set *s;
    struct err e = {0};
    struct tensor v;
    assert_int_equal(st_set_open_file(&s, path, &e), 0);
    assert_int_equal(st_set_n_unused(s), 5);

    assert_int_equal(st_set_take(s, "w.f32", &v, &e), 0);
    assert_int_equal(v.dtype, DTYPE_F32);
    assert_int_equal(v.ndim, 2);
    assert_int_equal(v.shape[0], 2);
    assert_int_equal(v.shape[1], 3);
    assert_int_equal(v.stride[0], 3);
    assert_int_equal(v.stride[1], 1);
    assert_string_equal(v.name, "w.f32");
    assert_ptr_equal(v.data, st_set_find(s, "w.f32")->data);
    assert_true(((const float *)v.data)[5] == -5.5f);
    assert_int_equal(v.qbits, 0);
    assert_true(st_set_find(s, "w.f32")->consumed);
    assert_int_equal(st_set_n_unused(s), 4);

    /* a repeated take is fine and counts once */
    assert_int_equal(st_set_take(s, "w.f32", &v, &e), 0);
    assert_int_equal(st_set_n_unused(s), 4);

    assert_int_equal(st_set_take(s, "s.scalar", &v, &e), 0);
    assert_int_equal(v.ndim, 1);
    assert_int_equal(v.shape[0], 1);
    assert_true(tensor_is_present(&v));
    assert_int_equal(*(const int32_t *)v.data, -7);

    assert_int_equal(st_set_take(s, "four", &v, &e), 0);
    assert_int_equal(v.ndim, 4);
    assert_int_equal(v.stride[0], 6);

    assert_int_equal(st_set_take(s, "five", &v, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "'five'"));
    assert_non_null(strstr(e.msg, "5 dims"));
    assert_false(st_set_find(s, "five")->consumed);

    assert_int_equal(st_set_take(s, "nope", &v, &e), -ERR_MISSING);
    assert_non_null(strstr(e.msg, "missing tensor 'nope'"));
    assert_int_equal(v.ndim, 0);

    memset(&v, 0x5a, sizeof v);
    assert_int_equal(st_set_take_opt(s, "nope", &v, &e), 0);
    assert_int_equal(v.ndim, 0);
    assert_null(v.data);
    assert_false(tensor_is_present(&v));

    assert_int_equal(st_set_take_opt(s, "a.bf16", &v, &e), 0);
    assert_int_equal(v.ndim, 1);
    assert_int_equal(v.dtype, DTYPE_BF16);
    assert_int_equal(st_set_n_unused(s), 1);

    st_set_mark(s, "nope"); /* absent: no-op */
    st_set_mark(s, "five");
    assert_int_equal(st_set_n_unused(s), 0);
    st_set_free(s);
    stb_rmtree(dir);
}

static void test_zero_sized(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *path = stb_path(dir, "model.safetensors");
    struct stb_tensor t[] = {
        {"empty.front", "F32", 2, {0, 4}, NULL, 0},
        {"w", "F32", 2, {2, 3}, k_f32, sizeof k_f32},
        {"empty.back", "BF16", 3, {3, 0, 2}, NULL, 0},
    };
    assert_int_equal(stb_write(path, t, 3), 0);
    struct st_set *s;
    struct err e = {0};
    struct tensor v;
    assert_int_equal(st_set_open_file(&s, path, &e), 0);
    assert_int_equal(st_set_count(s), 3);
    assert_int_equal(st_set_take(s, "empty.back", &v, &e), 0);
    assert_int_equal(v.ndim, 3);
    assert_int_equal(tensor_nelem(&v), 0);
    assert_int_equal(st_set_take(s, "w", &v, &e), 0);
    assert_true(((const float *)v.data)[0] == 0.5f);
    st_set_free(s);
    stb_rmtree(dir);
}

static void test_golden_fixture(void **state)
{
    (void)state;
    const char *dir = test_path("tests/fixtures/golden/llama");
    struct st_set *s;
    struct err e = {0};
    int rc = st_set_open(&s, dir, &e);
    if (rc < 0)
        fail_msg("%s", e.msg);
    assert_int_equal(st_set_n_files(s), 9);
    assert_int_equal(st_set_count(s), 21); /* 2 layers x 9 + embed + norm + lm_head */
    assert_int_equal(st_set_data_bytes(s), 283264); /* the index's metadata.total_size */
    assert_null(st_set_find(s, "prefill_logits")); /* golden.safetensors is not a shard */
    const struct st_tensor *emb = st_set_find(s, "model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, DTYPE_BF16);
    assert_int_equal(emb->shape[0], 384);
    assert_int_equal(emb->shape[1], 64);
    assert_non_null(strstr(st_set_file_path(s, (size_t)emb->file),
                           "model-00001-of-00009.safetensors"));
    const struct st_tensor *k = st_set_find(s, "model.layers.0.self_attn.k_proj.weight");
    assert_non_null(k);
    assert_int_equal(k->shape[0], 32);
    st_set_free(s);

    rc = st_set_open_file(&s, test_path("tests/fixtures/golden/llama/golden.safetensors"), &e);
    if (rc < 0)
        fail_msg("%s", e.msg);
    const struct st_tensor *pl = st_set_find(s, "prefill_logits");
    assert_non_null(pl);
    assert_int_equal(pl->dtype, DTYPE_F32);
    assert_int_equal(pl->shape[0], 12);
    assert_int_equal(pl->shape[1], 384);
    const struct st_tensor *ids = st_set_find(s, "input_ids");
    assert_non_null(ids);
    assert_int_equal(ids->dtype, DTYPE_I32);
    assert_int_equal(((const int32_t *)ids->data)[0], 242); /* golden.json input_ids[0] */
    st_set_free(s);
}

/* Checkpoints can hold 100k tensors: opening and looking all of them up must
 * stay well under a second even under ASan. */
static void test_many_tensors(void **state)
{
    (void)state;
    enum { N = 100000 };
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    struct stb_tensor *t = calloc(N, sizeof *t);
    char (*names)[48] = calloc(N, sizeof *names);
    assert_non_null(t);
    assert_non_null(names);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.experts.%d.w", i / 64, i % 64);
        t[i] = (struct stb_tensor){names[i], "F32", 1, {1}, NULL, 4};
    }
    const char *path = stb_path(dir, "model.safetensors");
    assert_int_equal(stb_write(path, t, N), 0);

    struct st_set *s;
    struct err e = {0};
    clock_t c0 = clock();
    assert_int_equal(st_set_open_file(&s, path, &e), 0);
    assert_int_equal(st_set_count(s), N);
    for (int i = 0; i < N; i++) {
        const struct st_tensor *x = st_set_find(s, names[i]);
        assert_non_null(x);
        assert_int_equal(x->begin, (uint64_t)i * 4);
    }
    assert_null(st_set_find(s, "model.layers.0.mlp.experts.64.w"));
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    assert_true(secs < 20.0);
    st_set_free(s);
    free(names);
    free(t);
    stb_rmtree(dir);
}

static void test_null_set(void **state)
{
    (void)state;
    st_set_free(NULL);
    assert_int_equal(st_set_count(NULL), 0);
    assert_int_equal(st_set_n_files(NULL), 0);
    assert_null(st_set_at(NULL, 0));
    assert_null(st_set_find(NULL, "x"));
    assert_null(st_set_file_path(NULL, 0));
    assert_int_equal(st_set_data_bytes(NULL), 0);
    assert_int_equal(st_set_n_unused(NULL), 0);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_single_file),
    cmocka_unit_test(test_header_parse_direct),
    cmocka_unit_test(test_metadata_lenient),
    cmocka_unit_test(test_discovery),
    cmocka_unit_test(test_index),
    cmocka_unit_test(test_index_wrong_shard),
    cmocka_unit_test(test_stale_index),
    cmocka_unit_test(test_take),
    cmocka_unit_test(test_zero_sized),
    cmocka_unit_test(test_golden_fixture),
    cmocka_unit_test(test_many_tensors),
    cmocka_unit_test(test_null_set),
};

TEST_SUITE(safetensors, k_tests);
