/*
 * test.h: the shared shape of a test suite for the one runner (tests/main.c).
 * Each tests/test_<topic>.c defines one `const struct test_suite <topic>_suite`
 * and tests/main.c lists it. Tests find fixtures relative to the repository
 * root (the runner's working directory; MLXCEL_SOURCE_DIR as a fallback).
 */
#pragma once
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/dtype.h"

struct test_suite {
    const char *name;
    const struct CMUnitTest *tests;
    size_t n_tests;
    /* Or, for a suite whose tests come from the fixture folders (one per golden case):
     * its tests, built at run time (the array lives as long as the process). */
    void (*build)(const struct CMUnitTest **tests, size_t *n_tests);
};

#define TEST_SUITE(sname, arr) \
    const struct test_suite sname##_suite = {#sname, arr, sizeof(arr) / sizeof((arr)[0]), NULL}
#define TEST_SUITE_BUILT(sname, fn) const struct test_suite sname##_suite = {#sname, NULL, 0, fn}

/* Absolute path of a file under the repository root (static buffer per call site is not
 * thread-safe; tests are single-threaded). */
const char *test_path(const char *rel);

#include <stdbool.h>
/* Load the model in model_dir and hold it to the float64 reference in
 * golden_dir/golden.safetensors (prefill + greedy decode, 1e-3 x max|logit|);
 * fails the test otherwise. Returns the worst relative error. (test_golden.c) */
double golden_check_model(const char *model_dir, const char *golden_dir, bool fused);

/* The golden cases: every folder of tests/fixtures/golden holding a golden.json, by
 * name, sorted (golden_cases.c). golden_cases_scan reads the folders of root (-1: root
 * cannot be read); golden_cases() is the repository's, read once (n == 0 when none). */
struct golden_cases {
    size_t n;
    char **names;
};
int golden_cases_scan(const char *root, struct golden_cases *out);
void golden_cases_deinit(struct golden_cases *gc);
const struct golden_cases *golden_cases(void);
/* The image cases (golden.json with "n_images"), which golden_cases() leaves out: the
 * vision suite's (test_vision.c). */
const struct golden_cases *golden_image_cases(void);
/* The input_ids of golden case name (3 to 63 of them): *gs holds the opened golden.safetensors
 * (the caller st_set_frees it, ids viewing into it); fails the test otherwise. */
struct st_set;
struct tensor;
void golden_case_input_ids(const char *name, struct st_set **gs, struct tensor *ids);
/* tests/fixtures/golden/<name> as test_path gives it (a static buffer, 4 in rotation). */
const char *golden_case_dir(const char *name);
/* Whether the case in dir is one the convert suite quantizes: a golden2 case
 * (golden.json records attended_keys_last_query, which only the golden2 generator
 * writes) in the Hugging Face layout (no "layout" key: not an mlx-lm or per-expert
 * layout case). -1 when golden.json cannot be read or is not an object. */
int golden_case_is_convert_q(const char *dir, bool *out);
/* One test per golden case, named prefix<case>, running fn with the case name as its
 * state, then the n_extra tests of extra; a single failing test when there is no case.
 * *tests is allocated (for the life of the process). */
void golden_case_tests(const char *prefix, CMUnitTestFunction fn, const struct CMUnitTest *extra,
                       size_t n_extra, struct CMUnitTest **tests, size_t *n_tests);

/* Index of the largest of v[0 .. n) (the first on ties). (main.c) */
int test_argmax(const float *v, int n);
/* The backend the model-level suites run on: $MLXCEL_DEVICE (the ctest cuda gates set
 * it), else the CPU. */
struct backend;
struct err;
int test_backend_new(struct backend **be, int n_threads, struct err *e);
/* The backend options of the run: the defaults, then $MLXCEL_ISA, $MLXCEL_FAST,
 * $MLXCEL_REPACK, $MLXCEL_FUSED_MOE, $MLXCEL_MMAP and $MLXCEL_CUDA_* as the CLI reads
 * them (read once by main.c; the library reads no environment). (main.c) */
struct backend_opts;
const struct backend_opts *test_backend_opts(void);
/* A tokenizer.json given as text, loaded through a temporary file; must_load fails the test
 * on error. (test_tokenizer_components.c) */
struct tokenizer;
int test_tok_load_json(const char *json, struct tokenizer **t, struct err *e);
struct tokenizer *test_tok_must_load(const char *json);
/* max |got - ref| / max |ref| over one row of n (max |got - ref| when ref is all zero). */
double test_row_rel_err(const float *got, const float *ref, int n);

/* A model ready to run: dir loaded and prepared for be (NULL: a 2-thread CPU backend the
 * struct owns), a context of n_batch rows (<= 0: default), a paged cache of n_tokens slots
 * for max_seqs sequences in blocks of block, and a batch of 512 rows. Fails the test on
 * error. (test_eng.c) */
struct backend;
struct model;
struct model_ctx;
struct kv_cache;
struct batch;
struct test_eng {
    struct backend *be;
    bool own_be;
    struct model *m;
    struct model_ctx *c;
    struct kv_cache *kv;
    struct batch *b;
};
void test_eng_open(struct test_eng *g, const char *dir, struct backend *be, int n_batch, int n_tokens,
                   int max_seqs, int block);
/* Whether any matrix m's products read (the LM head, the layers' LAYER_MATRICES, each expert
 * set's first view) satisfies pred. (test_eng.c) */
struct tensor;
bool test_model_any_matrix(const struct model *m, bool (*pred)(const struct tensor *t));
/* The KV cache element type test_eng_open uses (F32 unless a test sets it). */
extern enum dtype test_kv_dtype;
void test_eng_close(struct test_eng *g);

/* A model ready to run, without a cache: dir (relative to the repository root) loaded and
 * prepared for a 2-thread test backend, with a default context. Fails the test on error.
 * (test_eng.c) */
struct test_model {
    struct backend *be;
    struct model *m;
    struct model_ctx *c;
};
void test_model_open(struct test_model *f, const char *dir);
void test_model_close(struct test_model *f);
/* A paged cache of n_tokens slots for max_seqs sequences in blocks of block (f32). */
struct kv_cache *test_kv_new(const struct test_model *f, int n_tokens, int max_seqs, int block);

/* The tokenizer of a committed fixture folder whose tokenizer.json is xz-compressed (relative to the
 * repository root). (test_tokenizer.c) */
struct tokenizer;
struct tokenizer *test_tok_load_gz(const char *dir);
