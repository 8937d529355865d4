/*
 * prepare: model_prepare's bookkeeping around backends that repack weights
 * (QG16, ADR 0029; FPAN, ADR 0039) or copy them out of the mapping (ADR 0037).
 *
 * The trained 4-bit Phixtral (every linear affine 4-bit, experts stacked
 * mlx-lm style) is prepared for the default CPU backend and for one that
 * keeps the stored layout (MLXCEL_REPACK=0); both give the same greedy
 * continuation and logits within the integer kernels' rounding. Where the
 * backend repacks (AVX-512 VNNI), the repacked views are marked. The same
 * model is then prepared again for a new backend (the views restored as
 * bound, their given-back pages read from the file again, repacked again)
 * and gives the same logits bit for bit. (Resident memory is measured by
 * `mlxcel bench`, against its weights + KV + 64 MiB budget: this model's
 * 3.5 MB is below the noise of a test's RSS. What the checkpoint's mapping
 * still holds after preparation is checked here, on a synthesized one:
 * given_back_pages, ADR 0044.)
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/selftest.h"
#include "models/synth.h"
#include "st_build.h"
#include "test.h"

#define MODEL "models/phixtral-tiny-4bit"
#define NTOK  6

/* Logits of NTOK prompt tokens (all rows) for m on a new CPU backend made with the run's
 * options but repack and copy as given (MLXCEL_REPACK, MLXCEL_MMAP in the CLI); *n_packed:
 * views repacked, *n_copied: linear views no longer in the checkpoint's mapping. */
static float *run_opts(struct model *m, bool repack, enum backend_copy copy, int *n_packed,
                       int *n_copied, int *n_lin)
{
    static const int32_t ids[NTOK] = {5, 17, 42, 8, 99, 3};
    struct backend *be = NULL;
    struct stest_run r = {0};
    struct err e = {0};
    struct backend_opts o = *test_backend_opts();
    o.repack = repack;
    o.copy = copy;
    if (backend_cpu_new(&be, 2, NULL, &o, &e) < 0)
        fail_msg("%s", e.msg);
    float *logits = malloc((size_t)NTOK * m->hp.n_vocab * sizeof *logits);
    assert_non_null(logits);
    if (stest_run_open(&r, NULL, m, be, NTOK, &e) < 0 || stest_run_feed(&r, ids, NTOK, true, logits, &e) < 0)
        fail_msg("%s: %s", MODEL, e.msg);
    const struct tensor *lin[5 * 64 + 1];
    int n = 0;
    for (int il = 0; il < m->hp.n_layer && il < 64; il++) {
        const struct layer *l = &m->layers[il];
        lin[n++] = &l->wq, lin[n++] = &l->wk, lin[n++] = &l->wv, lin[n++] = &l->wqkv;
        lin[n++] = &l->wo;
    }
    lin[n++] = &m->lm_head;
    *n_packed = *n_copied = *n_lin = 0;
    for (int i = 0; i < n; i++) {
        *n_packed += lin[i]->packed != 0;
        *n_lin += tensor_is_present(lin[i]);
        *n_copied += tensor_is_present(lin[i]) && !st_set_holds(m->st, lin[i]->data, 1);
    }
    stest_run_close(&r);
    backend_free(be);
    return logits;
}

/* Worst |a - ref| over max|ref| of NTOK rows of V logits; fails where their greedy tokens
 * differ. */
static double close_greedy(const float *ref, const float *a, int V)
{
    double worst = 0, mx = 0;
    for (size_t i = 0; i < (size_t)NTOK * V; i++) {
        mx = fmax(mx, fabs(ref[i]));
        worst = fmax(worst, fabs((double)a[i] - ref[i]));
    }
    for (int t = 0; t < NTOK; t++) { /* the same greedy token at every position */
        int ia = 0, ir = 0;
        for (int v = 1; v < V; v++) {
            ia = a[(size_t)t * V + v] > a[(size_t)t * V + ia] ? v : ia;
            ir = ref[(size_t)t * V + v] > ref[(size_t)t * V + ir] ? v : ir;
        }
        assert_int_equal(ia, ir);
    }
    return worst / mx;
}

static float *run(struct model *m, bool repack, int *n_packed)
{
    int n_copied, n_lin;
    return run_opts(m, repack, BACKEND_COPY_AUTO, n_packed, &n_copied, &n_lin);
}

static void repack_and_again(void **state)
{
    (void)state;
    struct model *m = NULL, *ms = NULL;
    struct err e = {0};
    if (model_load(&m, test_path(MODEL), &e) < 0 || model_load(&ms, test_path(MODEL), &e) < 0)
        fail_msg("%s", e.msg);
    int np = 0, nps = 0, np2 = 0;
    float *stored = run(ms, false, &nps);
    float *a = run(m, true, &np);
    float *b = run(m, true, &np2); /* prepared again, for a new backend */
    assert_int_equal(nps, 0);
    assert_int_equal(np, np2);
    const int V = m->hp.n_vocab;
    const double rel = close_greedy(stored, a, V);
    printf("    %s: %d repacked views, logits vs stored layout %.2e of max|logit|\n", MODEL, np, rel);
    assert_true(rel <= 1e-4);
    assert_memory_equal(a, b, (size_t)NTOK * V * sizeof *a);
    free(stored);
    free(a);
    free(b);
    model_free(m);
    model_free(ms);
}

/* The float phixtral-tiny (bf16 weights). */
static struct model *load_float_tiny(void)
{
    struct model *m = NULL;
    struct err e = {0};
    if (model_load(&m, test_path("tests/fixtures/models/phixtral-tiny"), &e) < 0)
        fail_msg("%s", e.msg);
    return m;
}

/* Float weights kept in their stored layout (MLXCEL_REPACK=0, ADR 0037): by default and
 * with MLXCEL_MMAP=0 the backend copies every linear into memory of its own, with
 * MLXCEL_MMAP=1 it reads the mapping; the logits are the same bits all three ways (the same
 * bytes, the same kernels), and again after the model is prepared for a new backend (the
 * mapping's given-back pages read from the file). */
static void copy_and_again(void **state)
{
    (void)state;
    struct model *m = load_float_tiny();
    int np, nc, nl;
    float *mapped = run_opts(m, false, BACKEND_COPY_NONE, &np, &nc, &nl);
    assert_true(nl > m->hp.n_layer);
    assert_int_equal(np, 0);
    assert_int_equal(nc, 0);
    float *copied = run_opts(m, false, BACKEND_COPY_AUTO, &np, &nc, &nl);
    assert_int_equal(np, 0);
    assert_int_equal(nc, nl);
    float *forced = run_opts(m, false, BACKEND_COPY_ALL, &np, &nc, &nl);
    assert_int_equal(nc, nl);
    float *again = run_opts(m, false, BACKEND_COPY_NONE, &np, &nc, &nl);
    assert_int_equal(nc, 0);
    const size_t n = (size_t)NTOK * m->hp.n_vocab * sizeof *mapped;
    assert_memory_equal(mapped, copied, n);
    assert_memory_equal(mapped, forced, n);
    assert_memory_equal(mapped, again, n);
    free(mapped);
    free(copied);
    free(forced);
    free(again);
    model_free(m);
}

/* Float weights repacked as FPAN (kern.h) where the variant reads it (AVX-512): every
 * float linear view in the list is marked packed (none where the variant has no FPAN
 * kernel, and none with MLXCEL_MMAP=1, which keeps the mapping); the logits agree with the
 * stored layout's within the float rounding of another summation order, with the same
 * greedy tokens, and are the same bits when the model is prepared again. An embedding table
 * is repacked only when it is the head's twin (llama-tiny), not when untied (phixtral-tiny). */
static void fpan_and_again(void **state)
{
    (void)state;
    struct model *m = load_float_tiny();
    struct backend *be = NULL;
    struct err e = {0};
    if (backend_cpu_new(&be, 1, NULL, test_backend_opts(), &e) < 0)
        fail_msg("%s", e.msg);
    const bool fpan = strcmp(be->name, "cpu-avx512") == 0;
    backend_free(be);
    int np, nc, nl, np2, nps;
    float *stored = run(m, false, &nps);
    float *a = run(m, true, &np);
    /* its embedding table is not tied to the head: no product reads it, it stays as stored */
    assert_int_equal(m->tok_embd.packed, 0);
    assert_int_equal(m->lm_head.packed != 0, fpan);
    float *b = run_opts(m, true, BACKEND_COPY_AUTO, &np2, &nc, &nl); /* prepared again */
    assert_int_equal(nps, 0);
    assert_int_equal(np, fpan ? nl : 0);
    assert_int_equal(np2, np);
    float *mapped = run_opts(m, true, BACKEND_COPY_NONE, &np, &nc, &nl);
    assert_int_equal(np, 0);
    const int V = m->hp.n_vocab;
    const double rel = close_greedy(stored, a, V);
    printf("    phixtral-tiny: %d FPAN views, logits vs stored layout %.2e of max|logit|\n", np2, rel);
    assert_true(rel <= 1e-5);
    const size_t n = (size_t)NTOK * V * sizeof *a;
    assert_memory_equal(a, b, n);
    assert_memory_equal(stored, mapped, n);
    /* a head tied to the embedding (llama-tiny): the one table is repacked, and its lookups
     * read the rows back */
    struct model *tied = NULL;
    if (model_load(&tied, test_path("models/llama-tiny"), &e) < 0)
        fail_msg("%s", e.msg);
    float *t = run_opts(tied, true, BACKEND_COPY_AUTO, &np, &nc, &nl);
    assert_int_equal(tied->tok_embd.packed != 0, fpan);
    assert_int_equal(tied->lm_head.packed != 0, fpan);
    free(t);
    model_free(tied);
    free(stored);
    free(a);
    free(b);
    free(mapped);
    model_free(m);
}

/* Resident bytes of the mapping of this process that holds address a (/proc/self/smaps), or
 * -1 where it cannot be read. */
static long long mapping_rss(const void *a)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool in = false;
    long long rss = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        long long kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line */
            in = (uintptr_t)a >= lo && (uintptr_t)a < hi;
        else if (in && sscanf(line, "Rss: %lld kB", &kb) == 1) {
            rss = kb * 1024;
            break;
        }
    }
    fclose(f);
    return rss;
}

/* Sources given back stay given back. A fault in one weight's pages maps the page-cache folio
 * around it, and once the file has been read sequentially (readahead builds folios of up to
 * 2 MiB) that reaches into its neighbours, whose pages their own preparation gave back:
 * phi-2 bf16 held 46 MiB of them, a 2 MiB folio at each fc1 / fc2 seam. A phi-shaped bf16
 * checkpoint (1024 wide, 4096 in the MLP, 2 layers: 8 MiB matrices) is synthesized, read once
 * with read(), loaded and prepared for the CPU backend, which copies or repacks every view
 * out of the mapping; the mapping may then hold a page at each end of every view (and the
 * header's), no more. Before model_prepare released the neighbours again it held 10.5 MiB.
 * Skipped where /proc/self/smaps cannot be read. */
static void given_back_pages(void **state)
{
    (void)state;
    char *dir = stb_tmpdir();
    assert_non_null(dir);
    const char *cfg = stb_path(dir, "shape.json"), *ck = stb_path(dir, "ck");
    assert_int_equal(stb_write_text(cfg, "{\"architectures\": [\"PhiForCausalLM\"], \"model_type\": \"phi\", "
                                         "\"hidden_size\": 1024, \"intermediate_size\": 4096, "
                                         "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, "
                                         "\"num_key_value_heads\": 16, \"vocab_size\": 4096, "
                                         "\"max_position_embeddings\": 256, \"partial_rotary_factor\": 0.5, "
                                         "\"layer_norm_eps\": 1e-5, \"hidden_act\": \"gelu_new\", "
                                         "\"torch_dtype\": \"bfloat16\", \"tie_word_embeddings\": false}"),
                     0);
    struct err e = {0};
    struct synth_opts o = {.config = cfg, .dst = ck, .dtype = -1, .seed = 7};
    struct synth_stats ss;
    if (synth_checkpoint(&o, &ss, &e) < 0)
        fail_msg("%s", e.msg);
    /* the file written back, dropped from the page cache and read sequentially into it, as a
     * first load or a copy reads it */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", ck);
    const int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
    struct model *m = NULL;
    struct backend *be = NULL;
    if (model_load(&m, ck, &e) < 0)
        fail_msg("%s", e.msg);
    const void *src = m->layers[0].up.data; /* a view's bytes as stored, in the mapping */
    if (backend_cpu_new(&be, 2, NULL, test_backend_opts(), &e) < 0 || model_prepare(m, be, &e) < 0)
        fail_msg("%s", e.msg);
    int n_views = 0, n_kept = 0;
    const struct tensor *tv[] = {&m->tok_embd, &m->out_norm, &m->out_norm_b, &m->lm_head, &m->lm_head_b};
    for (size_t i = 0; i < sizeof tv / sizeof tv[0]; i++) {
        n_views += tensor_is_present(tv[i]);
        n_kept += tensor_is_present(tv[i]) && st_set_holds(m->st, tv[i]->data, 1);
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct layer *L = &m->layers[il];
#define LAYER_PTR(name) &L->name,
        const struct tensor *ts[] = {LAYER_TENSORS(LAYER_PTR)};
#undef LAYER_PTR
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
            n_views += tensor_is_present(ts[i]);
            n_kept += tensor_is_present(ts[i]) && st_set_holds(m->st, ts[i]->data, 1);
        }
    }
    const long long rss = mapping_rss(src), bound = (2LL * n_views + 2) * 4096;
    printf("    synthesized phi bf16: %d views, %d left in the mapping, which holds %lld bytes "
           "(at most %lld)\n", n_views, n_kept, rss, bound);
    assert_int_equal(n_kept, 0);
    backend_free(be);
    model_free(m);
    stb_rmtree(strdup(ck));
    stb_rmtree(dir);
    if (rss < 0)
        skip();
    assert_true(rss <= bound);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(repack_and_again),
    cmocka_unit_test(copy_and_again),
    cmocka_unit_test(fpan_and_again),
    cmocka_unit_test(given_back_pages),
};

TEST_SUITE(prepare, tests);
