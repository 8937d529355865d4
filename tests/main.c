/*
 * The one test runner. `run_tests` runs every suite; `run_tests NAME...`
 * runs the suites whose name contains one of the NAMEs, and if none matches,
 * the tests whose name contains it (cmocka's filter). Family self-tests run
 * through the registry suite (one per model_ops entry), so adding a family
 * never edits this file. The golden, batch and convert suites read their
 * cases from the folders of tests/fixtures/golden (golden_cases.c): one
 * test per case, golden_<case> and batched_<case>, so `run_tests
 * golden_llama` runs the cases whose name contains llama (llama,
 * llama3_rope, llama_dynamic), and a new folder is a new case.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/boolenv.h"
#include "kernels/backend.h"
#include "test.h"

#define SUITES(X) \
    X(dtype)      \
    X(tensor)     \
    X(threadpool) \
    X(json)       \
    X(fileio)     \
    X(safetensors) \
    X(corrupt)    \
    X(hybrid_input) \
    X(kernels)    \
    X(kernel_ops) \
    X(linear_plan) \
    X(config)     \
    X(registry)   \
    X(golden)     \
    X(batch)      \
    X(sched)      \
    X(prefix)     \
    X(prepare)    \
    X(window)     \
    X(server)     \
    X(router)     \
    X(quant)      \
    X(sampler)    \
    X(models)     \
    X(tokenizer_parts) \
    X(tokenizer)  \
    X(tokenizer_enc) \
    X(template)   \
    X(quantize)   \
    X(convert)    \
    X(oai_request) \
    X(outparse)   \
    X(responses)  \
    X(anthropic)  \
    X(hub)        \
    X(grammar)    \
    X(allocfail)  \
    X(image)      \
    X(preprocess) \
    X(spec)       \
    X(mtp)        \
    X(multimodal) \
    X(embed)      \
    X(embed_dec)  \
    X(embed_batch) \
    X(vision)     \
    X(lora)       \
    X(qwen_vl)    \
    X(llava)      \
    X(idefics3)   \
    X(mistral3)   \
    X(tp)         \
    X(cuda)

#define DECLARE(n) extern const struct test_suite n##_suite;
SUITES(DECLARE)
#undef DECLARE

#define ENTRY(n) &n##_suite,
static const struct test_suite *k_suites[] = {SUITES(ENTRY)};
#undef ENTRY

const char *test_path(const char *rel)
{
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ % 8];
    if (access(rel, F_OK) == 0)
        snprintf(b, sizeof buf[0], "%s", rel);
    else
        snprintf(b, sizeof buf[0], "%s/%s", MLXCEL_SOURCE_DIR, rel);
    return b;
}

int test_argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

double test_row_rel_err(const float *got, const float *ref, int n)
{
    double mx = 0.0, ma = 0.0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        mx = d > mx ? d : mx;
        ma = fabs(ref[i]) > ma ? fabs(ref[i]) : ma;
    }
    return ma > 0 ? mx / ma : mx;
}

/* The runner's backend options: the defaults, then the variables the CLI reads for the
 * same options (src/cli/config.c), so `MLXCEL_ISA=avx2 run_tests golden` runs what
 * `MLXCEL_ISA=avx2 mlxcel ...` runs. Read once, before any suite. */
static struct backend_opts g_opts = BACKEND_OPTS_DEFAULT;

static int opts_read(void)
{
    static const struct {
        const char *name;
        bool *dst;
    } k_bool[] = {
        {"MLXCEL_FAST", &g_opts.fast},           {"MLXCEL_REPACK", &g_opts.repack},
        {"MLXCEL_FUSED_MOE", &g_opts.fused_moe}, {"MLXCEL_CUDA_QI", &g_opts.cuda_qi},
        {"MLXCEL_CUDA_PDL", &g_opts.cuda_pdl},   {"MLXCEL_CUDA_ATTN_SPLIT", &g_opts.cuda_attn_split},
        {"MLXCEL_CUDA_GRAPHS", &g_opts.cuda_graphs}, {"MLXCEL_CUDA_MMA", &g_opts.cuda_mma},
        {"MLXCEL_CUDA_MMQ", &g_opts.cuda_mmq},
        {"MLXCEL_CUDA_ATTN_FLASH", &g_opts.cuda_attn_flash},
        {"MLXCEL_CUDA_ATTN_FA2", &g_opts.cuda_attn_fa2},
        {"MLXCEL_CUDA_CHUNKED", &g_opts.cuda_chunked}, {"MLXCEL_CUDA_MOE_DEV", &g_opts.cuda_moe_dev},
    };
    for (size_t i = 0; i < sizeof k_bool / sizeof k_bool[0]; i++) {
        const char *v = getenv(k_bool[i].name);
        int b = boolenv_parse(v);
        if (v && *v && b < 0) {
            printf("%s='%s' is neither on nor off\n", k_bool[i].name, v);
            return -1;
        }
        if (b >= 0)
            *k_bool[i].dst = b == 1;
    }
    const char *mm = getenv("MLXCEL_MMAP");
    if (mm && *mm)
        g_opts.copy = boolenv_parse(mm) == 1 ? BACKEND_COPY_NONE : BACKEND_COPY_ALL;
    g_opts.isa = getenv("MLXCEL_ISA");
    g_opts.cuda_plugin = getenv("MLXCEL_CUDA_PLUGIN");
    return 0;
}

const struct backend_opts *test_backend_opts(void)
{
    return &g_opts;
}

int test_backend_new(struct backend **be, int n_threads, struct err *e)
{
    const char *dev = getenv("MLXCEL_DEVICE");
    return backend_new(be, dev && *dev ? dev : "cpu", n_threads, &g_opts, e);
}

/* A suite's tests: its static array, or those its build gives (the golden cases). */
static int run_suite(const struct test_suite *s)
{
    const struct CMUnitTest *tests = s->tests;
    size_t n_tests = s->n_tests;
    if (s->build)
        s->build(&tests, &n_tests);
    return _cmocka_run_group_tests(s->name, tests, n_tests, NULL, NULL);
}

int main(int argc, char **argv)
{
    if (opts_read() < 0)
        return 1;
    /* a device that cannot run here (no driver, no GPU, no plugin): skipped, not failed */
    if (getenv("MLXCEL_DEVICE") && *getenv("MLXCEL_DEVICE")) {
        struct backend *be = NULL;
        struct err e = {0};
        int rc = test_backend_new(&be, 1, &e);
        if (rc == -ERR_UNSUPPORTED) {
            printf("skipped: %s\n", e.msg);
            return 77;
        }
        if (rc < 0) {
            printf("MLXCEL_DEVICE: %s\n", e.msg);
            return 1;
        }
        printf("device: %s\n", be->name);
        backend_free(be);
    }
    /* a forced ISA this CPU cannot run: skipped (ctest SKIP_RETURN_CODE), not failed */
    if (getenv("MLXCEL_ISA")) {
        struct backend *be = NULL;
        struct err e = {0};
        if (backend_cpu_new(&be, 1, NULL, &g_opts, &e) == -ERR_UNSUPPORTED) {
            printf("skipped: %s\n", e.msg);
            return 77;
        }
        backend_free(be);
    }
    size_t n = sizeof k_suites / sizeof k_suites[0];
    int failed = 0, matched = 0;
    for (size_t i = 0; i < n; i++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++)
            if (strstr(k_suites[i]->name, argv[a]))
                run = 1;
        if (!run)
            continue;
        matched++;
        failed |= run_suite(k_suites[i]);
    }
    if (!matched && argc >= 2) {
        /* cmocka filters are globs over the whole test name */
        static char glob[256];
        snprintf(glob, sizeof glob, "*%s*", argv[1]);
        cmocka_set_test_filter(glob);
        for (size_t i = 0; i < n; i++)
            failed |= run_suite(k_suites[i]);
    }
    return failed ? 1 : 0;
}
