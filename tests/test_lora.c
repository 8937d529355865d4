/*
 * lora: LoRA adapters over the tiny llama golden base (issue 46 item 2, ADR 0103).
 *
 * The references are tests/fixtures/golden/lora_ref (tests/fixtures/gen/gen_lora.py): a PEFT
 * adapter on every linear (peft_a), a PEFT rsLoRA adapter on q / v (peft_rs) and an mlx-lm
 * adapter on q / v / down of the last layer only (mlx_a), with float64 logits of the base
 * with each merged (and, for PEFT, peft's own unmerged forward agreeing to ~1e-15).
 *
 *   lora_ref_*        the adapter applied unmerged at run time equals the float64 reference
 *                     within 1e-4 (every prefill row); the base alone still equals its own
 *   lora_mixed_batch  four sequences with different adapters (and scales) in one batch equal
 *                     each run alone (CPU: 1e-6 relative, a GPU 5e-4) and the references
 *   lora_fuse_f32     convert --fuse-lora's merged checkpoint (f32) equals the unmerged run
 *                     within 1e-4
 *   lora_quantized    an 8-bit base with the adapter unmerged against the merged-then-quantized
 *                     checkpoint, within twice the base's own quantization error
 *   lora_fuse_quantized  convert --fuse-lora over an 8-bit folder (dequantize, add, requantize)
 *                     against the adapter unmerged on it
 *   lora_hostile      adapters that do not fit the base fail naming the tensor or field
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "loading/convert.h"
#include "models/lora.h"
#include "models/model.h"
#include "st_build.h"
#include "test.h"

#define BASE "tests/fixtures/golden/llama"
#define REF "tests/fixtures/golden/lora_ref"
/* The CPU's bound (issue 46: 1e-4 against float64). A GPU's bf16 products are held to the
 * golden suite's rule instead, 1e-3 x max |logit| (tol_ref). */
#define TOL_REF 1e-4
static double g_tol = TOL_REF;

static const char *const k_cases[] = {"peft_a", "peft_rs", "mlx_a"};

struct ref {
    struct st_set *st;
    int32_t ids[64];
    int n;
    int V;
};

static void ref_open(struct ref *r)
{
    struct err e = {0};
    if (st_set_open_file(&r->st, test_path(REF "/lora_ref.safetensors"), &e) < 0)
        fail_msg("%s", e.msg);
    const struct st_tensor *t = st_set_find(r->st, "input_ids");
    assert_non_null(t);
    assert_true(t->dtype == DTYPE_I32 && t->shape[0] <= 64);
    r->n = (int)t->shape[0];
    memcpy(r->ids, t->data, (size_t)r->n * sizeof(int32_t));
    const struct st_tensor *lb = st_set_find(r->st, "logits_base");
    r->V = (int)lb->shape[1];
    double mx = 0.0;
    for (size_t i = 0; i < (size_t)r->n * r->V; i++)
        mx = fabs(((const double *)lb->data)[i]) > mx ? fabs(((const double *)lb->data)[i]) : mx;
    struct backend *be = NULL;
    if (test_backend_new(&be, 1, &e) < 0)
        fail_msg("%s", e.msg);
    g_tol = backend_is_cpu(be) ? TOL_REF : 1e-3 * mx;
    backend_free(be);
}

/* max |got - ref| over rows x V, ref F64 logits_<name> */
static double ref_diff(const struct ref *r, const char *name, const float *got, int rows)
{
    char key[64];
    snprintf(key, sizeof key, "logits_%s", name);
    const struct st_tensor *t = st_set_find(r->st, key);
    if (!t)
        fail_msg("%s: no %s", REF, key);
    assert_true(t->dtype == DTYPE_F64 && t->shape[0] == r->n && t->shape[1] == r->V);
    const double *want = t->data;
    double mx = 0.0;
    for (size_t i = 0; i < (size_t)rows * r->V; i++) {
        double d = fabs((double)got[i] - want[i]);
        mx = d > mx ? d : mx;
    }
    return mx;
}

static struct lora_adapter *load(const struct model *m, struct backend *be, const char *name)
{
    char path[512];
    struct err e = {0};
    struct lora_adapter *a = NULL;
    snprintf(path, sizeof path, "%s/%s", test_path(REF), name);
    if (lora_load(&a, m, path, &e) < 0 || lora_prepare(a, be, &e) < 0)
        fail_msg("%s: %s", path, e.msg);
    return a;
}

/* Prefill of ids as sequence seq with every row's logits into out; scale: the batch's
 * per-sequence table (NULL: the context's global scales). */
static void prefill(struct test_eng *g, int seq, const int32_t *ids, int n, const float *scale,
                    int n_lora, float *out)
{
    struct err e = {0};
    batch_clear(g->b);
    for (int i = 0; i < n; i++)
        assert_int_equal(batch_add(g->b, ids[i], i, seq, true, &e), 0);
    g->b->lora = scale;
    g->b->n_lora = n_lora;
    if (model_forward(g->c, g->b, g->kv, out, &e) < 0)
        fail_msg("%s", e.msg);
    g->b->lora = NULL;
    g->b->n_lora = 0;
}

static void lora_ref_cases(void **state)
{
    (void)state;
    struct ref r;
    struct test_eng g;
    struct err e = {0};
    ref_open(&r);
    test_eng_open(&g, test_path(BASE), NULL, 0, 256, 4, 16);
    float *out = malloc((size_t)r.n * r.V * sizeof *out);
    assert_non_null(out);
    for (size_t k = 0; k < sizeof k_cases / sizeof *k_cases; k++) {
        struct lora_adapter *a = load(g.m, g.be, k_cases[k]);
        assert_int_equal(model_ctx_set_lora(g.c, &a, 1, &e), 0);
        assert_int_equal(kv_seq_add(g.kv, 0, &e), 0);
        prefill(&g, 0, r.ids, r.n, NULL, 0, out);
        double d = ref_diff(&r, k_cases[k], out, r.n), d0 = ref_diff(&r, "base", out, r.n);
        printf("lora %-8s (%s, r %d, scale %g, %d linears): max |logit - f64| %.2e (base alone "
               "would be %.2e off)\n", k_cases[k], a->format, a->rank, (double)a->scale,
               a->n_targets, d, d0);
        assert_true(d < g_tol);
        assert_true(d0 > 100 * g_tol);  /* the adapter matters: the test can fail */
        kv_seq_remove(g.kv, 0);
        /* global scale 0: the base alone, exactly as without adapters */
        float zero = 0.0f;
        assert_int_equal(model_ctx_set_lora_scales(g.c, &zero, 1, &e), 0);
        assert_int_equal(kv_seq_add(g.kv, 0, &e), 0);
        prefill(&g, 0, r.ids, r.n, NULL, 0, out);
        assert_true(ref_diff(&r, "base", out, r.n) < g_tol);
        kv_seq_remove(g.kv, 0);
        assert_int_equal(model_ctx_set_lora(g.c, NULL, 0, &e), 0);
        lora_free(a);
    }
    free(out);
    test_eng_close(&g);
    st_set_free(r.st);
}

/* Four sequences: peft_a, mlx_a, none, and peft_a at 0.5 with peft_rs at 2 */
#define N_MIX 4
static const float k_mix[N_MIX][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 0}, {0.5f, 0, 2}};

static void lora_mixed_batch(void **state)
{
    (void)state;
    struct ref r;
    struct test_eng g;
    struct err e = {0};
    ref_open(&r);
    test_eng_open(&g, test_path(BASE), NULL, 0, 512, N_MIX, 16);
    int V = r.V, n = r.n;
    struct lora_adapter *ad[3] = {load(g.m, g.be, "peft_a"), load(g.m, g.be, "mlx_a"),
                                  load(g.m, g.be, "peft_rs")};
    assert_int_equal(model_ctx_set_lora(g.c, ad, 3, &e), 0);
    float table[N_MIX][3];
    memcpy(table, k_mix, sizeof table);
    float *alone = malloc((size_t)N_MIX * n * V * sizeof(float));
    float *mixed = malloc((size_t)N_MIX * n * V * sizeof(float));
    assert_true(alone && mixed);
    for (int s = 0; s < N_MIX; s++) {
        assert_int_equal(kv_seq_add(g.kv, s, &e), 0);
        prefill(&g, s, r.ids, n, &table[0][0], 3, alone + (size_t)s * n * V);
        kv_seq_remove(g.kv, s);
    }
    /* all four interleaved row by row in one batch */
    batch_clear(g.b);
    for (int s = 0; s < N_MIX; s++)
        assert_int_equal(kv_seq_add(g.kv, s, &e), 0);
    for (int i = 0; i < n; i++)
        for (int s = 0; s < N_MIX; s++)
            assert_int_equal(batch_add(g.b, r.ids[i], i, s, true, &e), 0);
    g.b->lora = &table[0][0];
    g.b->n_lora = 3;
    float *rows = malloc((size_t)N_MIX * n * V * sizeof(float));
    assert_non_null(rows);
    if (model_forward(g.c, g.b, g.kv, rows, &e) < 0)
        fail_msg("%s", e.msg);
    g.b->lora = NULL;
    g.b->n_lora = 0;
    for (int i = 0; i < n; i++)
        for (int s = 0; s < N_MIX; s++)
            memcpy(mixed + ((size_t)s * n + i) * V, rows + ((size_t)i * N_MIX + s) * V,
                   (size_t)V * sizeof(float));
    double worst = 0.0;
    for (int s = 0; s < N_MIX; s++)
        for (int i = 0; i < n; i++) {
            double d = test_row_rel_err(mixed + ((size_t)s * n + i) * V,
                                        alone + ((size_t)s * n + i) * V, V);
            worst = d > worst ? d : worst;
        }
    double tol = backend_is_cpu(g.be) ? 1e-6 : 5e-4;
    double d0 = ref_diff(&r, "peft_a", mixed, n), d1 = ref_diff(&r, "mlx_a", mixed + (size_t)n * V, n);
    double d2 = ref_diff(&r, "base", mixed + (size_t)2 * n * V, n);
    printf("lora mixed batch: max rel diff vs alone %.2e; peft_a %.2e, mlx_a %.2e, base %.2e "
           "from f64\n", worst, d0, d1, d2);
    assert_true(worst < tol);
    assert_true(d0 < g_tol && d1 < g_tol && d2 < g_tol);
    /* the fourth differs from every single-adapter run: its scales were applied */
    assert_true(ref_diff(&r, "peft_a", mixed + (size_t)3 * n * V, n) > 100 * g_tol);
    /* a table for another adapter count is refused */
    g.b->lora = &table[0][0];
    g.b->n_lora = 2;
    assert_true(model_forward(g.c, g.b, g.kv, rows, &e) < 0);
    assert_non_null(strstr(e.msg, "adapters"));
    g.b->lora = NULL;
    g.b->n_lora = 0;
    free(rows);
    free(alone);
    free(mixed);
    test_eng_close(&g);
    for (int i = 0; i < 3; i++)
        lora_free(ad[i]);
    st_set_free(r.st);
}

/* convert (dtype dt, quantized with q when not NULL) of the checkpoint src, fused with adapter
 * name at scale 1 when name is not NULL, into a fresh folder (caller's, rm_out) */
static char *convert_from(const char *src, const char *name, int dt, const struct quant_params *q)
{
    struct err e = {0};
    struct model *m = NULL;
    struct lora_adapter *a = NULL;
    struct lora_fused *f = NULL;
    char *tmp = stb_tmpdir();
    assert_non_null(tmp);
    char *dst = malloc(strlen(tmp) + 8);
    sprintf(dst, "%s/out", tmp);
    float one = 1.0f;
    if (model_load(&m, src, &e) < 0)
        fail_msg("%s", e.msg);
    if (name) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", test_path(REF), name);
        if (lora_load(&a, m, path, &e) < 0 || lora_fused_new(&f, m, &a, &one, 1, &e) < 0)
            fail_msg("%s", e.msg);
    }
    struct convert_opts o = {.src = src, .dst = dst, .dtype = dt, .q = q,
                             .replace = f ? lora_fused_find : NULL, .replace_ud = f};
    struct convert_stats st;
    if (convert_checkpoint(&o, &st, &e) < 0)
        fail_msg("convert: %s", e.msg);
    lora_fused_free(f);
    lora_free(a);
    model_free(m);
    free(tmp);
    return dst;
}

static char *convert_fused(const char *name, int dt, const struct quant_params *q)
{
    return convert_from(test_path(BASE), name, dt, q);
}

static void rm_out(char *dst)
{
    char *tmp = strdup(dst);
    *strrchr(tmp, '/') = 0;
    stb_rmtree(dst);
    stb_rmtree(tmp);
}

/* logits of the prompt's rows on the model in dir, with adapter name (NULL: none) */
static void run_model(const char *dir, const char *name, const struct ref *r, float *out)
{
    struct test_eng g;
    struct err e = {0};
    struct lora_adapter *a = NULL;
    test_eng_open(&g, dir, NULL, 0, 256, 2, 16);
    if (name) {
        a = load(g.m, g.be, name);
        assert_int_equal(model_ctx_set_lora(g.c, &a, 1, &e), 0);
    }
    assert_int_equal(kv_seq_add(g.kv, 0, &e), 0);
    prefill(&g, 0, r->ids, r->n, NULL, 0, out);
    test_eng_close(&g);
    lora_free(a);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++)
        mx = fabs((double)a[i] - b[i]) > mx ? fabs((double)a[i] - b[i]) : mx;
    return mx;
}

static void lora_fuse_f32(void **state)
{
    (void)state;
    struct ref r;
    ref_open(&r);
    size_t N = (size_t)r.n * r.V;
    float *unmerged = malloc(N * sizeof(float)), *merged = malloc(N * sizeof(float));
    assert_true(unmerged && merged);
    for (size_t k = 0; k < sizeof k_cases / sizeof *k_cases; k++) {
        run_model(test_path(BASE), k_cases[k], &r, unmerged);
        char *dst = convert_fused(k_cases[k], DTYPE_F32, NULL);
        run_model(dst, NULL, &r, merged);
        double d = max_abs_diff(unmerged, merged, N), dr = ref_diff(&r, k_cases[k], merged, r.n);
        printf("lora fuse %-8s (f32): max |merged - unmerged| %.2e, merged vs f64 %.2e\n",
               k_cases[k], d, dr);
        assert_true(d < g_tol && dr < g_tol);
        rm_out(dst);
    }
    free(unmerged);
    free(merged);
    st_set_free(r.st);
}

/* A quantized base (8-bit affine, group 32) + the adapter unmerged, against the
 * merged-then-quantized checkpoint: both carry rounding of the weights to 8 bits, of different
 * matrices (W vs W + s B A), so they differ by about the quantization error itself. The
 * stated tolerance: within twice the base's own quantization error (the 8-bit base alone
 * against the float64 base), and well under the adapter's own effect. (4 bits on this tiny
 * random model err by a quarter of the logits' range: too coarse to say anything.) */
static void lora_quantized(void **state)
{
    (void)state;
    struct ref r;
    ref_open(&r);
    size_t N = (size_t)r.n * r.V;
    float *unm = malloc(N * sizeof(float)), *mer = malloc(N * sizeof(float));
    float *base = malloc(N * sizeof(float));
    assert_true(unm && mer && base);
    struct quant_params q = {.mode = QMODE_AFFINE, .bits = 8, .group = 32};
    char *qbase = convert_fused(NULL, -1, &q), *qmerged = convert_fused("peft_a", -1, &q);
    run_model(qbase, "peft_a", &r, unm);
    run_model(qmerged, NULL, &r, mer);
    run_model(qbase, NULL, &r, base);
    double d = max_abs_diff(unm, mer, N), eq = ref_diff(&r, "base", base, r.n);
    double effect = max_abs_diff(base, mer, N), vs_ref = ref_diff(&r, "peft_a", unm, r.n);
    printf("lora on an 8-bit base: max |unmerged - merged-then-quantized| %.3g (the 8-bit base's "
           "own error %.3g); unmerged vs f64 %.3g; the adapter moves the base by %.3g\n", d, eq,
           vs_ref, effect);
    assert_true(d <= 2 * eq);
    assert_true(vs_ref <= 2 * eq);
    assert_true(effect > 10 * d);
    rm_out(qbase);
    rm_out(qmerged);
    free(unm);
    free(mer);
    free(base);
    st_set_free(r.st);
}

/* convert --fuse-lora over the 8-bit folder itself, as mlx-lm's fuse does for a quantized base:
 * dequantize, add, quantize again with the folder's parameters (modules it left float stay
 * float). Against the adapter unmerged on that 8-bit base: one more rounding to 8 bits, held
 * to the same bound as lora_quantized (twice the base's own quantization error). */
static void lora_fuse_quantized(void **state)
{
    (void)state;
    struct ref r;
    ref_open(&r);
    size_t N = (size_t)r.n * r.V;
    float *unm = malloc(N * sizeof(float)), *fused = malloc(N * sizeof(float));
    float *base = malloc(N * sizeof(float));
    assert_true(unm && fused && base);
    struct quant_params q = {.mode = QMODE_AFFINE, .bits = 8, .group = 32};
    char *qbase = convert_fused(NULL, -1, &q), *qfused = convert_from(qbase, "mlx_a", -1, NULL);
    run_model(qbase, "mlx_a", &r, unm);
    run_model(qfused, NULL, &r, fused);
    run_model(qbase, NULL, &r, base);
    double d = max_abs_diff(unm, fused, N), eq = ref_diff(&r, "base", base, r.n);
    double effect = max_abs_diff(base, fused, N);
    printf("lora fused into an 8-bit folder: max |fused - unmerged| %.3g (the 8-bit base's own "
           "error %.3g); the adapter moves the base by %.3g\n", d, eq, effect);
    assert_true(d <= 2 * eq);
    assert_true(effect > 5 * d);
    /* -q or --dtype on a quantized source stays refused */
    struct err e = {0};
    struct convert_opts o = {.src = qbase, .dst = "/nonexistent/x", .dtype = DTYPE_F32};
    struct convert_stats st;
    assert_true(convert_checkpoint(&o, &st, &e) < 0);
    assert_non_null(strstr(e.msg, "already quantized"));
    rm_out(qbase);
    rm_out(qfused);
    free(unm);
    free(fused);
    free(base);
    st_set_free(r.st);
}

// ---- hostile adapters ----

struct hostile {
    const char *what;
    const char *config;          /* adapter_config.json */
    const char *tensor;          /* name of the one A tensor written (B beside it) */
    int64_t a0, a1, b0, b1;      /* shapes as stored (PEFT: A [r, in], B [out, r]) */
    bool nan;
    bool no_b;
    const char *file;            /* safetensors file name */
    const char *want;            /* substring of the error */
};

#define PEFT_CFG(extra) "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, " \
    "\"target_modules\": [\"q_proj\"]" extra "}"
#define Q0 "base_model.model.model.layers.0.self_attn.q_proj.lora_"
#define MLX_CFG(ft) "{\"fine_tune_type\": \"" ft "\", \"num_layers\": 2, \"lora_parameters\": " \
    "{\"rank\": 4, \"scale\": 2.0, \"dropout\": 0.0}}"

static const struct hostile k_hostile[] = {
    {"rank mismatch", PEFT_CFG(""), Q0 "%s.weight", 3, 64, 64, 3, false, false,
     "adapter_model.safetensors", "expected [4, 64]"},
    {"wrong out", PEFT_CFG(""), Q0 "%s.weight", 4, 64, 32, 4, false, false,
     "adapter_model.safetensors", "lora_B.weight' is [32, 4], expected [64, 4]"},
    {"missing alpha", "{\"r\": 4, \"target_modules\": [\"q_proj\"]}", Q0 "%s.weight", 4, 64, 64,
     4, false, false, "adapter_model.safetensors", "missing field 'lora_alpha'"},
    {"missing r", "{\"lora_alpha\": 4}", Q0 "%s.weight", 4, 64, 64, 4, false, false,
     "adapter_model.safetensors", "missing field 'r'"},
    {"nan", PEFT_CFG(""), Q0 "%s.weight", 4, 64, 64, 4, true, false, "adapter_model.safetensors",
     "non-finite"},
    {"dora", PEFT_CFG(", \"use_dora\": true"), Q0 "%s.weight", 4, 64, 64, 4, false, false,
     "adapter_model.safetensors", "DoRA"},
    {"mlx dora", MLX_CFG("dora"), "model.layers.1.self_attn.q_proj.lora_%s", 64, 4, 4, 64, false,
     false, "adapters.safetensors", "DoRA"},
    {"target", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"embed_tokens\"]}",
     Q0 "%s.weight", 4, 64, 64, 4, false, false, "adapter_model.safetensors",
     "unsupported target module 'embed_tokens'"},
    {"lm_head", PEFT_CFG(""), "base_model.model.lm_head.lora_%s.weight", 4, 64, 384, 4, false,
     false, "adapter_model.safetensors", "lm_head.lora_A.weight' is not a LoRA matrix"},
    {"layer", PEFT_CFG(""), "base_model.model.model.layers.7.self_attn.q_proj.lora_%s.weight", 4,
     64, 64, 4, false, false, "adapter_model.safetensors", "names layer 7 of a 2-layer base"},
    {"half", PEFT_CFG(""), Q0 "%s.weight", 4, 64, 64, 4, false, true, "adapter_model.safetensors",
     "has lora_A but not lora_B"},
    {"rank bound", "{\"r\": 100000, \"lora_alpha\": 8}", Q0 "%s.weight", 4, 64, 64, 4, false,
     false, "adapter_model.safetensors", "expected an integer in [1, 1024]"},
    {"mlx num_layers", "{\"fine_tune_type\": \"lora\", \"lora_parameters\": {\"rank\": 4, "
     "\"scale\": 1}}", "model.layers.1.self_attn.q_proj.lora_%s", 64, 4, 4, 64, false, false,
     "adapters.safetensors", "missing field 'num_layers'"},
    {"mlx outside num_layers", "{\"fine_tune_type\": \"lora\", \"num_layers\": 1, "
     "\"lora_parameters\": {\"rank\": 4, \"scale\": 1}}", "model.layers.0.self_attn.q_proj.lora_%s",
     64, 4, 4, 64, false, false, "adapters.safetensors", "outside the last num_layers (1)"},
    {"mlx shape", MLX_CFG("lora"), "model.layers.1.mlp.down_proj.lora_%s", 64, 4, 4, 64, false,
     false, "adapters.safetensors", "lora_a' is [64, 4], expected [176, 4]"},
    {"bias", PEFT_CFG(", \"bias\": \"all\""), Q0 "%s.weight", 4, 64, 64, 4, false, false,
     "adapter_model.safetensors", "bias 'all'"},
};

static void lora_hostile(void **state)
{
    (void)state;
    struct err e = {0};
    struct model *m = NULL;
    if (model_load(&m, test_path(BASE), &e) < 0)
        fail_msg("%s", e.msg);
    for (size_t i = 0; i < sizeof k_hostile / sizeof *k_hostile; i++) {
        const struct hostile *h = &k_hostile[i];
        char *dir = stb_tmpdir();
        char an[256], bn[256];
        snprintf(an, sizeof an, h->tensor, strstr(h->file, "adapters") ? "a" : "A");
        snprintf(bn, sizeof bn, h->tensor, strstr(h->file, "adapters") ? "b" : "B");
        size_t na = (size_t)(h->a0 * h->a1), nb = (size_t)(h->b0 * h->b1);
        float *va = calloc(na, sizeof(float)), *vb = calloc(nb, sizeof(float));
        assert_true(dir && va && vb);
        for (size_t j = 0; j < na; j++)
            va[j] = 0.01f * (float)(j % 7);
        if (h->nan)
            va[na / 2] = NAN;
        struct stb_tensor t[2] = {
            {an, "F32", 2, {h->a0, h->a1}, va, na * sizeof(float)},
            {bn, "F32", 2, {h->b0, h->b1}, vb, nb * sizeof(float)},
        };
        assert_int_equal(stb_write(stb_path(dir, h->file), t, h->no_b ? 1 : 2), 0);
        assert_int_equal(stb_write_text(stb_path(dir, "adapter_config.json"), h->config), 0);
        struct lora_adapter *a = NULL;
        memset(&e, 0, sizeof e);
        int rc = lora_load(&a, m, dir, &e);
        printf("lora hostile %-22s -> %s\n", h->what, e.msg);
        assert_true(rc < 0);
        assert_null(a);
        if (!strstr(e.msg, h->want))
            fail_msg("%s: '%s' does not say '%s'", h->what, e.msg, h->want);
        free(va);
        free(vb);
        stb_rmtree(dir);
    }
    /* a folder with neither file */
    char *dir = stb_tmpdir();
    struct lora_adapter *a = NULL;
    assert_true(lora_load(&a, m, dir, &e) < 0);
    assert_non_null(strstr(e.msg, "neither adapters.safetensors"));
    stb_rmtree(dir);
    model_free(m);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(lora_ref_cases),
    cmocka_unit_test(lora_mixed_batch),
    cmocka_unit_test(lora_fuse_f32),
    cmocka_unit_test(lora_quantized),
    cmocka_unit_test(lora_fuse_quantized),
    cmocka_unit_test(lora_hostile),
};

TEST_SUITE(lora, k_tests);
