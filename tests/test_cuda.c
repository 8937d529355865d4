/*
 * test_cuda: the CUDA backend's products against the CPU scalar reference
 * on awkward shapes, every weight format (F32/F16/BF16, MLX affine 2..8 bits
 * x groups 32/64/128 with F16/BF16/F32 scales, mxfp4, mxfp8, nvfp4), token
 * counts on both sides of the GEMV/GEMM switch (2-8 tokens on tensor cores, ADR 0115),
 * with and without bias, the
 * tensor-core product over affine codes at its tile edges (and with it off), and
 * the embedding of quantized rows. Attention (tiled prefill and decode, every
 * cache element type, mixed sequences, windows, soft-capping, sinks) against
 * the same. Data goes through buf_alloc / upload /
 * download as a model's would. Then decode steps replayed from a CUDA graph
 * against the same steps run op by op (recurrent models too). Mamba-2's SSD scan and the
 * gated delta rule against the CPU on mixed sequences, in their recurrent and chunked forms
 * (ADR 0132), and the hybrid golden models' logits with the chunked prefill against the
 * recurrence. The ops the backend fuses when issued back to back (a residual add and
 * the next norm, RoPE and the KV store; ADR 0138) against the same ops one by one, bit for
 * bit, and against the CPU. Skipped where no CUDA device is
 * usable; the golden suite on MLXCEL_DEVICE=cuda covers every other op end
 * to end.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "test.h"

static uint64_t g_rng = 88172645463325252ull;

static uint32_t rnd32(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

static float frnd(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd32() & 0xffffff) / 16777216.0f;
}

/* A random element of a scale/bias or weight array of dtype dt. */
static void put(void *p, enum dtype dt, size_t i, float v)
{
    if (dt == DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == DTYPE_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = f32_to_bf16(v);
}

struct wcase {
    const char *name;
    enum dtype dt;           /* float weights; U32 when quantized */
    int bits, group;
    enum qmode mode;
    enum dtype sdt;          /* scales (affine) */
    int out, in;
};

/* Host weight of the case; the buffers are returned for freeing. */
static void make_weight(struct tensor *w, void **bufs, const struct wcase *wc)
{
    int64_t shape[2] = {wc->out, wc->in};
    memset(bufs, 0, 3 * sizeof *bufs);
    if (!wc->bits) {
        size_t n = (size_t)wc->out * wc->in;
        bufs[0] = malloc(n * dtype_size(wc->dt));
        for (size_t i = 0; i < n; i++)
            put(bufs[0], wc->dt, i, frnd(-1.0f, 1.0f));
        tensor_init(w, wc->dt, bufs[0], 2, shape);
        return;
    }
    size_t words = (size_t)wc->out * wc->in * wc->bits / 32, ng = (size_t)wc->out * (wc->in / wc->group);
    bufs[0] = malloc(words * 4);
    for (size_t i = 0; i < words; i++)
        ((uint32_t *)bufs[0])[i] = rnd32() ^ (rnd32() << 21);
    int64_t pshape[2] = {wc->out, wc->in * wc->bits / 32};
    tensor_init(w, DTYPE_U32, bufs[0], 2, pshape);
    w->shape[1] = wc->in;
    w->qbits = wc->bits;
    w->qgroup = wc->group;
    w->qmode = wc->mode;
    if (wc->mode == QMODE_AFFINE) {
        w->qsdtype = wc->sdt;
        bufs[1] = malloc(ng * 4);
        bufs[2] = malloc(ng * 4);
        for (size_t i = 0; i < ng; i++) {
            put(bufs[1], wc->sdt, i, frnd(0.001f, 0.05f));
            put(bufs[2], wc->sdt, i, frnd(-0.3f, 0.3f));
        }
        w->qbiases = bufs[2];
    } else {
        w->qsdtype = DTYPE_U8;
        bufs[1] = malloc(ng);
        for (size_t i = 0; i < ng; i++)  /* e8m0 near 2^0, e4m3 in [2^-4, 2^2) */
            ((uint8_t *)bufs[1])[i] = (uint8_t)(wc->mode == QMODE_NVFP4 ? 0x18 + rnd32() % 0x30
                                                                          : 120 + rnd32() % 10);
    }
    w->qscales = bufs[1];
    (void)shape;
}

/* y = x Wᵀ (+ b) on both backends; the worst |diff| / max|ref| over all outputs. */
static double linear_case(struct backend *cpu, struct backend *gpu, const struct wcase *wc, int n_tok,
                          bool with_bias)
{
    struct err e = {0};
    struct tensor w, wg, b, bg;
    void *bufs[3];
    make_weight(&w, bufs, wc);
    float *bias = malloc((size_t)wc->out * sizeof *bias);
    for (int i = 0; i < wc->out; i++)
        bias[i] = frnd(-1.0f, 1.0f);
    int64_t bshape[1] = {wc->out};
    tensor_init(&b, DTYPE_F32, bias, 1, bshape);
    wg = w;
    bg = b;
    assert_int_equal(gpu->ops->prepare_weight(gpu, &wg, 0, &e), 0);
    assert_int_equal(gpu->ops->prepare_weight(gpu, &bg, 0, &e), 0);
    int ldy = wc->out + 3;
    size_t nx = (size_t)n_tok * wc->in, ny = (size_t)n_tok * ldy;
    float *x = malloc(nx * sizeof *x), *yc = calloc(ny, sizeof *yc), *yg = calloc(ny, sizeof *yg);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    cpu->ops->linear(cpu, yc, ldy, x, &w, with_bias ? &b : NULL, n_tok);
    void *dx, *dy;
    assert_int_equal(gpu->ops->buf_alloc(gpu, nx * 4, &dx, &e), 0);
    assert_int_equal(gpu->ops->buf_alloc(gpu, ny * 4, &dy, &e), 0);
    gpu->ops->upload(gpu, dx, x, nx * 4);
    gpu->ops->upload(gpu, dy, yg, ny * 4);
    gpu->ops->linear(gpu, dy, ldy, dx, &wg, with_bias ? &bg : NULL, n_tok);
    gpu->ops->download(gpu, yg, dy, ny * 4);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("%s: %s", wc->name, e.msg);
    double mx = 0, md = 0;
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < wc->out; r++) {
            size_t i = (size_t)t * ldy + r;
            mx = fmax(mx, fabs(yc[i]));
            md = fmax(md, fabs((double)yc[i] - yg[i]));
        }
    gpu->ops->buf_free(gpu, dx);
    gpu->ops->buf_free(gpu, dy);
    free(x);
    free(yc);
    free(yg);
    free(bias);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
    return mx > 0 ? md / mx : md;
}

static const struct wcase k_cases[] = {
    {"f32", DTYPE_F32, 0, 0, 0, 0, 67, 256},
    {"f32 in=100", DTYPE_F32, 0, 0, 0, 0, 33, 100},
    {"f16", DTYPE_F16, 0, 0, 0, 0, 67, 320},
    {"bf16", DTYPE_BF16, 0, 0, 0, 0, 67, 320},
    {"bf16 in=72", DTYPE_BF16, 0, 0, 0, 0, 9, 72},
    {"q2 g32 bf16", DTYPE_U32, 2, 32, QMODE_AFFINE, DTYPE_BF16, 67, 384},
    {"q3 g64 f16", DTYPE_U32, 3, 64, QMODE_AFFINE, DTYPE_F16, 67, 384},
    {"q4 g32 f16", DTYPE_U32, 4, 32, QMODE_AFFINE, DTYPE_F16, 67, 384},
    {"q4 g64 bf16", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_BF16, 67, 384},
    {"q4 g128 f32", DTYPE_U32, 4, 128, QMODE_AFFINE, DTYPE_F32, 67, 384},
    {"q5 g64 bf16", DTYPE_U32, 5, 64, QMODE_AFFINE, DTYPE_BF16, 67, 384},
    {"q6 g32 f16", DTYPE_U32, 6, 32, QMODE_AFFINE, DTYPE_F16, 67, 384},
    {"q8 g64 bf16", DTYPE_U32, 8, 64, QMODE_AFFINE, DTYPE_BF16, 67, 384},
    {"q8 g128 f16", DTYPE_U32, 8, 128, QMODE_AFFINE, DTYPE_F16, 67, 384},
    /* the affine 4/8-bit GEMV: pieces past 32 per lane, a last warp's rows cut short */
    {"q4 g32 bf16 wide", DTYPE_U32, 4, 32, QMODE_AFFINE, DTYPE_BF16, 133, 2080},
    {"q8 g32 f32 wide", DTYPE_U32, 8, 32, QMODE_AFFINE, DTYPE_F32, 130, 1088},
    /* ... and its split over K (>= 8 pieces a lane, 2 pieces past them) */
    {"q4 g64 f16 split", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_F16, 37, 8256},
    {"q8 g128 bf16 split", DTYPE_U32, 8, 128, QMODE_AFFINE, DTYPE_BF16, 21, 4224},
    /* the integer GEMV's other shapes: 4 pieces a lane at once, >= 8192 rows, and rows longer
     * than its shared memory takes (the float GEMV then) */
    {"q4 g128 bf16 in=3200", DTYPE_U32, 4, 128, QMODE_AFFINE, DTYPE_BF16, 45, 3200},
    {"q4 g64 bf16 rows=8200", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_BF16, 8200, 256},
    {"q4 g32 f32 in=16416", DTYPE_U32, 4, 32, QMODE_AFFINE, DTYPE_F32, 3, 16416},
    /* 2-8 tokens on tensor cores (mmv.cu): 4 tiles a warp from 16896 rows (a last block of
     * 1 and 7 rows past its tiles), 8-bit groups of 128 one group a load */
    {"q4 g64 bf16 rows=16897", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_BF16, 16897, 192},
    {"q8 g128 f16 rows=16903", DTYPE_U32, 8, 128, QMODE_AFFINE, DTYPE_F16, 16903, 256},
    {"mxfp4", DTYPE_U32, 4, 32, QMODE_MXFP4, DTYPE_U8, 67, 384},
    {"mxfp8", DTYPE_U32, 8, 32, QMODE_MXFP8, DTYPE_U8, 67, 384},
    {"nvfp4", DTYPE_U32, 4, 16, QMODE_NVFP4, DTYPE_U8, 67, 384},
    {"nvfp4 in=400", DTYPE_U32, 4, 16, QMODE_NVFP4, DTYPE_U8, 31, 400},
};

/* The tensor-core product over affine 4/8-bit codes (mma.cu, more than 8 tokens): groups 32,
 * 64 and 128, f16/bf16/f32 scales, out past a 128-row tile (300, 129: one row in the last
 * tile; 13, 31, 45, 67: one short tile) and in not a multiple of 128. Short rows (96, 160, 384
 * at g128) run K whole; the others split K over blocks in whole groups (on an H100: 4160 at
 * g32 = 130 groups in 15 splits of 9, the last of 4; at g64 13 splits of 5; 1472 at g64 = 23
 * groups in 8 splits of 3, the last of 2), 4 steps a group at g128. */
static const struct wcase k_mma_cases[] = {
    {"q4 g32 bf16 300x96", DTYPE_U32, 4, 32, QMODE_AFFINE, DTYPE_BF16, 300, 96},
    {"q8 g32 f16 31x160", DTYPE_U32, 8, 32, QMODE_AFFINE, DTYPE_F16, 31, 160},
    {"q8 g128 bf16 300x384", DTYPE_U32, 8, 128, QMODE_AFFINE, DTYPE_BF16, 300, 384},
    {"q4 g32 f32 45x4160", DTYPE_U32, 4, 32, QMODE_AFFINE, DTYPE_F32, 45, 4160},
    {"q8 g64 f16 13x4160", DTYPE_U32, 8, 64, QMODE_AFFINE, DTYPE_F16, 13, 4160},
    {"q4 g128 f16 129x1024", DTYPE_U32, 4, 128, QMODE_AFFINE, DTYPE_F16, 129, 1024},
    {"q8 g64 f32 67x640", DTYPE_U32, 8, 64, QMODE_AFFINE, DTYPE_F32, 67, 640},
    {"q4 g64 bf16 40x1472", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_BF16, 40, 1472},
};

/* Each case at each token count against the CPU scalar backend; worst rel err returned. */
static double linear_list(struct backend *cpu, struct backend *gpu, const char *what,
                          const struct wcase *cases, size_t n_cases, const int *toks, size_t n_toks)
{
    double worst = 0;
    for (size_t c = 0; c < n_cases; c++) {
        double wc = 0;
        for (size_t t = 0; t < n_toks; t++) {
            double r = linear_case(cpu, gpu, &cases[c], toks[t], t % 2 == 1);
            if (r > 1e-4)
                fail_msg("linear%s %s n_tok=%d: rel err %.3g", what, cases[c].name, toks[t], r);
            wc = fmax(wc, r);
        }
        printf("cuda linear%s %-20s max rel err %.2e\n", what, cases[c].name, wc);
        worst = fmax(worst, wc);
    }
    printf("cuda linear%s: %zu formats x %zu token counts, worst rel err %.2e\n", what, n_cases,
           n_toks, worst);
    return worst;
}

/* Every format at token counts on both sides of the GEMV / GEMM switch (65: one past a
 * 64-token tile), then the affine cases of the tensor-core product at its tile edges. */
static void linear_formats(struct backend *cpu, struct backend *gpu, const char *what)
{
    static const int toks[] = {1, 2, 3, 5, 8, 9, 33, 65};
    static const int mma_toks[] = {9, 16, 32, 33, 64, 65, 130, 300};
    char mw[64];
    linear_list(cpu, gpu, what, k_cases, sizeof k_cases / sizeof k_cases[0], toks,
                sizeof toks / sizeof toks[0]);
    snprintf(mw, sizeof mw, "%s mma shapes", what);
    linear_list(cpu, gpu, mw, k_mma_cases, sizeof k_mma_cases / sizeof k_mma_cases[0], mma_toks,
                sizeof mma_toks / sizeof mma_toks[0]);
}

static void test_linear_formats(void **state)
{
    (void)state;
    struct backend *gpu = NULL, *cpu = NULL;
    struct err e = {0};
    /* every affine product of > 8 tokens on the tensor-core product over the codes (whatever
     * its size: the tile edges up to 300 tokens), then the default split at 128 tokens with
     * one token's 4-bit GEMV on 16-bit integer x (cuda_qi, the CLI's MLXCEL_CUDA_QI=1), then
     * affine products of > 8 tokens on decoded bf16 planes (cuda_mma off, MLXCEL_CUDA_MMA=0),
     * then on int8 tensor cores (cuda_mmq, MLXCEL_CUDA_MMQ=1) */
    struct backend_opts o = *test_backend_opts();
    o.cuda_qi = false;
    o.cuda_mma = true;
    o.cuda_mma_max_tokens = 1 << 24;
    if (backend_new(&gpu, "cuda", 1, &o, &e) < 0) {
        printf("cuda: %s\n", e.msg);
        skip();
    }
    assert_int_equal(backend_cpu_new(&cpu, 1, "scalar", test_backend_opts(), &e), 0);
    linear_formats(cpu, gpu, "");
    backend_free(gpu);
    o.cuda_qi = true;
    o.cuda_qi_min_rows = 0;     /* every shape's one token on it, whatever its rows */
    o.cuda_mma_max_tokens = BACKEND_OPTS_MMA_MAX_TOKENS;
    assert_int_equal(backend_new(&gpu, "cuda", 1, &o, &e), 0);
    linear_formats(cpu, gpu, " (qi)");
    backend_free(gpu);
    o.cuda_qi = false;
    o.cuda_mma = false;
    assert_int_equal(backend_new(&gpu, "cuda", 1, &o, &e), 0);
    linear_formats(cpu, gpu, " (no mma)");
    backend_free(gpu);
    /* every affine product of > 8 tokens on int8 tensor cores (mmq.cu, ADR 0147) */
    o.cuda_mmq = true;
    assert_int_equal(backend_new(&gpu, "cuda", 1, &o, &e), 0);
    linear_formats(cpu, gpu, " (mmq)");
    backend_free(cpu);
    backend_free(gpu);
}

// ---- experts ----

static void open_pair(struct backend **gpu, struct backend **cpu);

/* linear_experts on both backends: E experts of wc's format (each its own prepared tensor,
 * as a checkpoint's views are), n_el products of the same x (gate | up) or one (down), the
 * slots' expert counts cnt[E] (zeros: empty experts). With prepare_experts the GPU finds the
 * experts on the device for few slots (ADR 0143); past CU_EXPERT_DEV_SLOTS, or without a
 * table, it groups on the host. The worst |diff| / max|cpu|. */
static double experts_case(struct backend *cpu, struct backend *gpu, const struct wcase *wc, int E,
                           const int *cnt, int n_el, bool table, bool biased)
{
    struct err e = {0};
    struct tensor w[2][8], wg[2][8], b[2][8], bg[2][8];
    void *bufs[2][8][3];
    float *bb[2][8] = {{NULL}};
    struct expert_linear elc[2], elg[2];
    int32_t off[9] = {0};
    assert_true(E <= 8 && n_el <= 2);
    for (int x = 0; x < E; x++)
        off[x + 1] = off[x] + cnt[x];
    const int n_slot = off[E], ldy = n_el * wc->out + 5;
    for (int i = 0; i < n_el; i++) {
        for (int x = 0; x < E; x++) {
            make_weight(&w[i][x], bufs[i][x], wc);
            wg[i][x] = w[i][x];
            assert_int_equal(gpu->ops->prepare_weight(gpu, &wg[i][x], 0, &e), 0);
            if (biased) { /* an output bias per expert (Phixtral's experts have them) */
                int64_t bshape[1] = {wc->out};
                bb[i][x] = malloc((size_t)wc->out * sizeof *bb[i][x]);
                for (int r = 0; r < wc->out; r++)
                    bb[i][x][r] = frnd(-0.5f, 0.5f);
                tensor_init(&b[i][x], DTYPE_F32, bb[i][x], 1, bshape);
                bg[i][x] = b[i][x];
                assert_int_equal(gpu->ops->prepare_weight(gpu, &bg[i][x], 0, &e), 0);
            }
        }
        elc[i] = (struct expert_linear){w[i], biased ? b[i] : NULL};
        elg[i] = (struct expert_linear){wg[i], biased ? bg[i] : NULL};
        if (table)
            assert_int_equal(gpu->ops->prepare_experts(gpu, &elg[i], E, &e), 0);
    }
    size_t nx = (size_t)n_slot * wc->in, ny = (size_t)n_slot * ldy;
    float *x = malloc(nx * sizeof *x), *yc = calloc(ny, sizeof *yc), *yg = calloc(ny, sizeof *yg);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    cpu->ops->linear_experts(cpu, yc, ldy, x, elc, n_el, off, E, n_slot);
    void *dx, *dy, *doff;
    assert_int_equal(gpu->ops->buf_alloc(gpu, nx * 4, &dx, &e), 0);
    assert_int_equal(gpu->ops->buf_alloc(gpu, ny * 4, &dy, &e), 0);
    assert_int_equal(gpu->ops->buf_alloc(gpu, sizeof off, &doff, &e), 0);
    gpu->ops->upload(gpu, dx, x, nx * 4);
    gpu->ops->upload(gpu, dy, yg, ny * 4);
    gpu->ops->upload(gpu, doff, off, sizeof off);
    gpu->ops->linear_experts(gpu, dy, ldy, dx, elg, n_el, doff, E, n_slot);
    gpu->ops->download(gpu, yg, dy, ny * 4);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("experts %s: %s", wc->name, e.msg);
    double mx = 0, md = 0;
    for (int r = 0; r < n_slot; r++)
        for (int j = 0; j < n_el * wc->out; j++) {
            size_t i = (size_t)r * ldy + j;
            mx = fmax(mx, fabs(yc[i]));
            md = fmax(md, fabs((double)yc[i] - yg[i]));
        }
    gpu->ops->buf_free(gpu, dx);
    gpu->ops->buf_free(gpu, dy);
    gpu->ops->buf_free(gpu, doff);
    free(x);
    free(yc);
    free(yg);
    for (int i = 0; i < n_el; i++)
        for (int x = 0; x < E; x++) {
            for (int k = 0; k < 3; k++)
                free(bufs[i][x][k]);
            free(bb[i][x]);
        }
    return mx > 0 ? md / mx : md;
}

static void test_experts(void **state)
{
    (void)state;
    static const struct wcase wcs[] = {
        {"q4 g64 bf16", DTYPE_U32, 4, 64, QMODE_AFFINE, DTYPE_BF16, 96, 256},
        {"q8 g32 f16", DTYPE_U32, 8, 32, QMODE_AFFINE, DTYPE_F16, 64, 128},
        {"bf16", DTYPE_BF16, 0, 0, 0, 0, 48, 64},
        {"f32 (host grouping)", DTYPE_F32, 0, 0, 0, 0, 40, 64},
        {"mxfp4 (host grouping)", DTYPE_U32, 4, 32, QMODE_MXFP4, DTYPE_U8, 64, 128},
    };
    /* one token's 8 slots over 8 experts with empty ones, 16 slots, and 40 (past the
     * device dispatch: grouped on the host) */
    static const int c8[8] = {2, 0, 1, 0, 0, 3, 1, 1}, c16[8] = {0, 4, 2, 2, 0, 0, 5, 3},
                     c40[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    static const int *const cnts[] = {c8, c16, c40};
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    double worst = 0;
    for (size_t w = 0; w < sizeof wcs / sizeof wcs[0]; w++)
        for (size_t c = 0; c < 3; c++)
            for (int n_el = 1; n_el <= 2; n_el++)
                for (int table = 0; table < 2; table++)
                    for (int biased = 0; biased < 2; biased++) {
                        double r = experts_case(cpu, gpu, &wcs[w], 8, cnts[c], n_el, table, biased);
                        if (r > 1e-4)
                            fail_msg("experts %s, count set %zu, %d products, table %d, biases %d: rel "
                                     "err %.3g", wcs[w].name, c, n_el, table, biased, r);
                        worst = fmax(worst, r);
                    }
    printf("cuda experts: %zu formats x 3 slot sets x 1-2 products, with and without tables and "
           "biases, worst rel err %.2e\n", sizeof wcs / sizeof wcs[0], worst);
    backend_free(gpu);
    backend_free(cpu);
}

// ---- attention ----

/* One attention call on both backends over a paged cache of 4-slot blocks holding two
 * sequences: rows [0, split) are positions pos0.. of sequence A, rows [split, n_tok)
 * positions pos1.. of sequence B (split == n_tok: one sequence). The blocks of each
 * sequence lie in reverse order in the pool. The worst |diff| / max|cpu| is returned. */
struct attn_tc {
    int n_tok, split, pos0, pos1, n_head, n_kv, hd, window;
    float softcap;
    bool sinks;
    int chunk;      /* Llama 4's chunked attention (0: none) */
    int b0, b1;     /* rows [b0, b1) of sequence A attend each other both ways (kv_rows.span,
                     * an image's tokens; b1 <= b0: none) */
};

/* The GPU (skip the test without one) and the CPU scalar backend it is compared with. */
static void open_pair(struct backend **gpu, struct backend **cpu)
{
    struct err e = {0};
    if (backend_new(gpu, "cuda", 1, test_backend_opts(), &e) < 0) {
        printf("cuda: %s\n", e.msg);
        skip();
    }
    assert_int_equal(backend_cpu_new(cpu, 1, "scalar", test_backend_opts(), &e), 0);
}

/* *gpu again with the test's options but the switch at byte off of backend_opts off. */
static void reopen_without(struct backend **gpu, size_t off)
{
    struct backend_opts o = *test_backend_opts();
    struct err e = {0};
    *(bool *)((char *)&o + off) = false;
    backend_free(*gpu);
    assert_int_equal(backend_new(gpu, "cuda", 1, &o, &e), 0);
}

static double attn_case(struct backend *cpu, struct backend *gpu, const struct attn_tc *tc,
                        enum dtype dt)
{
    const int bs = 4, kvd = tc->n_kv * tc->hd, qd = tc->n_head * tc->hd;
    int len[2] = {tc->pos0 + tc->split, tc->pos1 + (tc->n_tok - tc->split)};
    int nb[2] = {(len[0] + bs - 1) / bs, (len[1] + bs - 1) / bs}, nbt = nb[0] + nb[1];
    size_t es = dtype_size(dt), pool = (size_t)nbt * bs * kvd;
    char *kc = calloc(pool, es), *vc = calloc(pool, es);
    int32_t *tables = malloc((size_t)nbt * sizeof *tables);
    for (int b = 0; b < nbt; b++)   /* A's blocks, then B's, each in reverse */
        tables[b] = b < nb[0] ? nb[0] - 1 - b : nb[0] + nb[1] - 1 - (b - nb[0]);
    for (int sq = 0; sq < 2; sq++)
        for (int j = 0; j < len[sq]; j++) {
            size_t sl = (size_t)tables[(sq ? nb[0] : 0) + j / bs] * bs + j % bs;
            for (int i = 0; i < kvd; i++) {
                dtype_store_f32(dt, kc, (int64_t)(sl * kvd + i), frnd(-2.0f, 2.0f));
                dtype_store_f32(dt, vc, (int64_t)(sl * kvd + i), frnd(-1.0f, 1.0f));
            }
        }
    int32_t *rows = malloc((size_t)tc->n_tok * 6 * sizeof *rows);
    int32_t *pos = rows, *slot = rows + tc->n_tok, *tab = slot + tc->n_tok, *end = tab + tc->n_tok;
    int32_t *span = end + tc->n_tok;
    for (int t = 0; t < tc->n_tok; t++) {
        int sq = t >= tc->split, p = sq ? tc->pos1 + (t - tc->split) : tc->pos0 + t;
        bool in = t >= tc->b0 && t < tc->b1 && t < tc->split;
        pos[t] = p;
        tab[t] = sq ? nb[0] : 0;
        slot[t] = tables[tab[t] + p / bs] * bs + p % bs;
        end[t] = len[sq];
        span[2 * t] = in ? tc->pos0 + tc->b0 : p;
        span[2 * t + 1] = in ? tc->pos0 + (tc->b1 < tc->split ? tc->b1 : tc->split) - 1 : p;
    }
    bool spans = tc->b1 > tc->b0;
    size_t nq = (size_t)tc->n_tok * qd;
    float *q = malloc(nq * sizeof *q), *oc = malloc(nq * sizeof *oc), *og = malloc(nq * sizeof *og);
    float sk[64];
    for (size_t i = 0; i < nq; i++)
        q[i] = frnd(-2.0f, 2.0f);
    for (int h = 0; h < tc->n_head && h < 64; h++)
        sk[h] = frnd(-2.0f, 2.0f);
    struct attn_params ap = {tc->n_head, tc->n_kv, tc->hd, 1.0f / sqrtf((float)tc->hd),
                             tc->softcap, tc->window, tc->sinks ? sk : NULL, tc->chunk};
    struct kv_layer kv = {kc, vc, kvd, kvd, dt};
    struct kv_rows kr = {pos, slot, tab, tables, end, bs, NULL, spans ? span : NULL};
    cpu->ops->attention(cpu, oc, qd, q, qd, &kv, &kr, tc->n_tok, &ap);
    /* the same on the GPU, every array uploaded */
    struct err e = {0};
    void *d[8];
    size_t sz[8] = {pool * es, pool * es, (size_t)nbt * 4, (size_t)tc->n_tok * 24, nq * 4, nq * 4,
                    sizeof sk, 0};
    for (int i = 0; i < 7; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], kc, sz[0]);
    gpu->ops->upload(gpu, d[1], vc, sz[1]);
    gpu->ops->upload(gpu, d[2], tables, sz[2]);
    gpu->ops->upload(gpu, d[3], rows, sz[3]);
    gpu->ops->upload(gpu, d[4], q, sz[4]);
    gpu->ops->upload(gpu, d[6], sk, sz[6]);
    int32_t *dr = d[3];
    struct kv_layer gkv = {d[0], d[1], kvd, kvd, dt};
    struct kv_rows gkr = {dr, dr + tc->n_tok, dr + 2 * tc->n_tok, d[2], dr + 3 * tc->n_tok, bs, NULL,
                          spans ? dr + 4 * tc->n_tok : NULL};
    struct attn_params gap = ap;
    gap.sinks = tc->sinks ? d[6] : NULL;
    gpu->ops->attention(gpu, d[5], qd, d[4], qd, &gkv, &gkr, tc->n_tok, &gap);
    gpu->ops->download(gpu, og, d[5], sz[5]);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("attention: %s", e.msg);
    double mx = 0, md = 0;
    for (size_t i = 0; i < nq; i++) {
        mx = fmax(mx, fabs(oc[i]));
        md = fmax(md, fabs((double)oc[i] - og[i]));
    }
    for (int i = 0; i < 7; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(kc);
    free(vc);
    free(tables);
    free(rows);
    free(q);
    free(oc);
    free(og);
    return mx > 0 ? md / mx : md;
}

/* Prefill-sized calls (the tiled tensor-core kernel from 32 rows, its head_dims 64/80/128; the
 * per-row kernels for the others) and decode ones, against the CPU scalar backend, for every
 * cache element type: one sequence, chunks after cached tokens, two sequences in one batch
 * (a tile whose rows have different tables), windows, soft-capping, sinks, chunks; with F16 /
 * BF16 caches on ADR 0146's kernel, then all of it again with that kernel off. */
static void test_attention(void **state)
{
    (void)state;
    static const struct attn_tc cases[] = {
        {100, 100, 0, 0, 8, 2, 64, 0, 0.0f, false, 0, 0, 0},     /* one sequence, GQA */
        {70, 70, 37, 0, 8, 2, 128, 0, 0.0f, false, 0, 0, 0},    /* a chunk after 37 cached tokens */
        {40, 40, 0, 0, 4, 4, 80, 0, 0.0f, false, 0, 0, 0},      /* MHA, head_dim 80 */
        {33, 33, 200, 0, 4, 1, 64, 50, 0.0f, false, 0, 0, 0},   /* window, a tile of one row past 32 */
        {96, 96, 10, 0, 8, 4, 128, 0, 30.0f, true, 0, 0, 0},    /* soft-cap and sinks */
        {90, 50, 5, 0, 8, 2, 64, 0, 0.0f, false, 0, 0, 0},      /* two sequences, a tile across both */
        {128, 64, 0, 300, 4, 2, 64, 100, 0.0f, true, 0, 0, 0},  /* two sequences on tile bounds */
        {48, 48, 0, 0, 4, 2, 96, 0, 0.0f, false, 0, 0, 0},      /* head_dim 96: flash at 128, zeros past 96 */
        {5, 3, 20, 40, 8, 2, 64, 0, 0.0f, false, 0, 0, 0},      /* decode-sized */
        {100, 100, 0, 0, 8, 2, 64, 0, 0.0f, false, 24, 0, 0},     /* chunks of 24 across tiles */
        {70, 40, 13, 90, 4, 2, 128, 32, 0.0f, true, 32, 0, 0},   /* two sequences, window = chunk */
        {3, 2, 47, 64, 8, 2, 96, 0, 0.0f, false, 16, 0, 0},      /* decode-sized, at and past a chunk start */
        /* bidirectional blocks (ADR 0087): an image's rows in a prompt, tiled and per row */
        {100, 100, 0, 0, 8, 2, 64, 0, 0.0f, false, 0, 20, 60},
        {100, 100, 0, 0, 8, 2, 64, 16, 0.0f, false, 0, 20, 60},   /* window 16 < the block */
        {40, 40, 7, 0, 4, 4, 80, 0, 0.0f, false, 0, 5, 35},
        {20, 20, 0, 0, 4, 2, 96, 0, 0.0f, false, 0, 2, 18},       /* under 32 rows: per-row kernels */
        {64, 64, 0, 0, 2, 2, 16, 0, 0.0f, false, 0, 0, 64},       /* a vision tower's image (flash at 64) */
        {150, 150, 0, 0, 4, 4, 72, 0, 0.0f, false, 0, 0, 150},    /* SigLIP's head_dim 72: flash at 80 */
        {40, 40, 0, 0, 2, 2, 256, 0, 0.0f, false, 0, 0, 0},       /* head_dim 256: the per-row kernel */
        {90, 50, 5, 0, 8, 2, 64, 0, 0.0f, false, 0, 10, 30},      /* beside another sequence */
        /* ADR 0146's kernel: many key tiles (both stages in turn), a long cached prefix, a
         * window that skips whole tiles for some warps, a row count off the 16-row warps */
        {300, 300, 0, 0, 4, 1, 128, 0, 0.0f, false, 0, 0, 0},
        {77, 77, 1500, 0, 8, 2, 128, 0, 0.0f, true, 0, 0, 0},
        {200, 200, 100, 0, 4, 2, 64, 40, 0.0f, false, 0, 0, 0},
        {129, 129, 3, 0, 4, 2, 80, 0, 20.0f, false, 0, 0, 0},
    };
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    for (int fa2 = 1; fa2 >= 0; fa2--) {
        if (!fa2) /* the same on ADR 0054's kernel for every cache type */
            reopen_without(&gpu, offsetof(struct backend_opts, cuda_attn_fa2));
        double worst = 0;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
                double r = attn_case(cpu, gpu, &cases[c], dts[i]);
                if (r > 1e-4)
                    fail_msg("attention case %zu (%d rows, head_dim %d) %s, fa2 %d: rel err %.3g",
                             c, cases[c].n_tok, cases[c].hd, dtype_name(dts[i]), fa2, r);
                worst = fmax(worst, r);
            }
        printf("cuda attention (registers layout %s): %zu cases x 3 cache types, worst rel err "
               "%.2e\n", fa2 ? "on" : "off", sizeof cases / sizeof cases[0], worst);
    }
    backend_free(cpu);
    backend_free(gpu);
}

/* Decode-sized calls (fewer than 32 rows) at long contexts: the flash-decoding kernel (ADR
 * 0105, backend_opts.cuda_attn_flash), whose clusters split a row's keys into shares of at
 * least one pass of a block (64 keys at head_dim 128 and 4 heads a group, 128 at head_dim 64),
 * so the contexts sit on both sides of a pass and of 16 passes (the largest split); then the
 * same cases with the option off (ADR 0028's kernel). GQA groups of 1 to 12 heads (tiles of 8),
 * head_dims 16 to 256 (80: idle lanes), windows, sinks, soft-capping, chunks, bidirectional
 * blocks and rows of two sequences of different lengths in one call. */
static void test_attention_decode(void **state)
{
    (void)state;
    static const struct attn_tc cases[] = {
        {1, 1, 0, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},        /* context 1, the 8B shape */
        {1, 1, 62, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},       /* 63: one pass - 1 */
        {1, 1, 64, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},       /* 65: one pass + 1 */
        {1, 1, 1022, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},     /* 1023: 16 passes - 1 */
        {1, 1, 1024, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},     /* 1025: 16 passes + 1 */
        {1, 1, 4999, 0, 32, 8, 128, 0, 0.0f, false, 0, 0, 0},     /* 5000 */
        {1, 1, 2046, 0, 32, 8, 64, 0, 0.0f, false, 0, 0, 0},      /* the 1B shape: 2047 */
        {1, 1, 2048, 0, 32, 8, 64, 0, 0.0f, false, 0, 0, 0},      /* 2049 */
        {1, 1, 4999, 0, 32, 8, 64, 0, 0.0f, false, 0, 0, 0},      /* 5000 */
        {5, 3, 4000, 100, 16, 4, 64, 0, 0.0f, false, 0, 0, 0},    /* rows of two lengths */
        {4, 2, 3000, 9, 8, 2, 128, 1000, 30.0f, true, 0, 0, 0},   /* window, soft-cap, sinks */
        {2, 2, 3000, 0, 8, 2, 64, 0, 0.0f, false, 1024, 0, 0},    /* chunks */
        {20, 20, 500, 0, 8, 2, 64, 0, 0.0f, false, 0, 5, 15},     /* a bidirectional block */
        {1, 1, 2000, 0, 16, 2, 128, 0, 0.0f, true, 0, 0, 0},      /* 8 heads a group */
        {2, 1, 1500, 40, 24, 2, 64, 0, 0.0f, false, 0, 0, 0},     /* 12: tiles of 8 and 4 */
        {3, 3, 700, 0, 4, 4, 64, 0, 0.0f, true, 0, 0, 0},         /* MHA */
        {2, 2, 900, 0, 6, 2, 32, 0, 0.0f, false, 0, 0, 0},        /* 3 heads a group */
        {2, 2, 1200, 0, 8, 2, 80, 64, 0.0f, false, 0, 0, 0},      /* head_dim 80 */
        {1, 1, 1500, 0, 8, 1, 256, 0, 50.0f, true, 0, 0, 0},      /* head_dim 256 */
        {2, 2, 600, 0, 4, 2, 16, 0, 0.0f, false, 0, 0, 0},        /* head_dim 16 */
        {31, 31, 3000, 0, 8, 2, 128, 0, 0.0f, false, 0, 0, 0},    /* 31 rows, the most */
    };
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    for (int flash = 1; flash >= 0; flash--) {
        if (!flash) /* the same on ADR 0028's kernel */
            reopen_without(&gpu, offsetof(struct backend_opts, cuda_attn_flash));
        double worst = 0;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
                double r = attn_case(cpu, gpu, &cases[c], dts[i]);
                if (r > 1e-4)
                    fail_msg("decode attention case %zu (%d rows at %d, head_dim %d) %s, flash %d: "
                             "rel err %.3g", c, cases[c].n_tok, cases[c].pos0, cases[c].hd,
                             dtype_name(dts[i]), flash, r);
                worst = fmax(worst, r);
            }
        printf("cuda decode attention (flash-decoding %s): %zu cases x 3 cache types, worst rel err "
               "%.2e\n", flash ? "on" : "off", sizeof cases / sizeof cases[0], worst);
    }
    backend_free(cpu);
    backend_free(gpu);
}

// ---- Mamba's selective scan ----

/* One case of the scan against the CPU scalar backend: n_tok rows of 3 sequences interleaved
 * (sequence 1 continuing a carried state, the others starting at 0 over garbage), the GPU's run
 * cut into two chunks at row cut; the rows' outputs and the states after both. */
static double scan_case(struct backend *cpu, struct backend *gpu, int di, int ds, int n, int cut)
{
    enum { S = 3 };
    struct err e = {0};
    int next[S] = {0, 5, 0};
    int32_t pos[64], seq[64];
    size_t nx = (size_t)n * di, nbc = (size_t)n * 2 * ds, nz = (size_t)n * 2 * di, nst = (size_t)S * di * ds;
    float *x = malloc(nx * 4), *dt = malloc(nx * 4), *bc = malloc(nbc * 4), *z = malloc(nz * 4);
    float *al = malloc((size_t)di * ds * 4), *dd = malloc((size_t)di * 4), *st = malloc(nst * 4);
    float *yc = malloc(nx * 4), *yg = malloc(nx * 4), *sg = malloc(nst * 4);
    for (size_t i = 0; i < nx; i++) {
        x[i] = frnd(-2.0f, 2.0f);
        dt[i] = frnd(-4.0f, 3.0f);
    }
    for (size_t i = 0; i < nbc; i++)
        bc[i] = frnd(-1.5f, 1.5f);
    for (size_t i = 0; i < nz; i++)
        z[i] = frnd(-3.0f, 3.0f);
    for (size_t i = 0; i < (size_t)di * ds; i++)
        al[i] = frnd(-1.0f, 2.8f);
    for (int i = 0; i < di; i++)
        dd[i] = frnd(-1.0f, 1.0f);
    for (size_t i = 0; i < nst; i++)
        st[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n; i++) {
        seq[i] = (int32_t)(rnd32() % S);
        pos[i] = next[seq[i]]++;
    }
    int64_t ashape[2] = {di, ds}, dshape[1] = {di};
    struct tensor a, d, ag, dg;
    tensor_init(&a, DTYPE_F32, al, 2, ashape);
    tensor_init(&d, DTYPE_F32, dd, 1, dshape);
    ag = a;
    dg = d;
    assert_int_equal(gpu->ops->prepare_weight(gpu, &ag, 0, &e), 0);
    assert_int_equal(gpu->ops->prepare_weight(gpu, &dg, 0, &e), 0);
    /* the GPU's copies, uploaded before the CPU changes the states */
    size_t sz[7] = {nx * 4, nx * 4, nbc * 4, nz * 4, nst * 4, 64 * 4, 64 * 4};
    void *g[7];
    for (int i = 0; i < 7; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &g[i], &e), 0);
    const void *src[7] = {x, dt, bc, z, st, pos, seq};
    for (int i = 0; i < 7; i++)
        gpu->ops->upload(gpu, g[i], src[i], sz[i]);
    struct kv_layer kv = {NULL, st, 0, di * ds, DTYPE_F32};
    struct kv_rows rows = {.pos = pos, .state = seq};
    cpu->ops->selective_scan(cpu, yc, di, x, di, dt, di, bc, bc + ds, 2 * ds, z + di, 2 * di, &a, &d, &kv,
                             &rows, n, di, ds);
    assert_int_equal(backend_sync(cpu, &e), 0);
    struct kv_layer gkv = {NULL, g[4], 0, di * ds, DTYPE_F32};
    float *gx = g[0], *gdt = g[1], *gbc = g[2], *gz = g[3];
    for (int c = 0; c < 2; c++) { /* rows [0, cut), then [cut, n), in place over x */
        int r0 = c ? cut : 0, r1 = c ? n : cut;
        struct kv_rows gr = {.pos = (int32_t *)g[5] + r0, .state = (int32_t *)g[6] + r0};
        gpu->ops->selective_scan(gpu, gx + (size_t)r0 * di, di, gx + (size_t)r0 * di, di, gdt + (size_t)r0 * di, di,
                                 gbc + (size_t)r0 * 2 * ds, gbc + (size_t)r0 * 2 * ds + ds, 2 * ds,
                                 gz + (size_t)r0 * 2 * di + di, 2 * di, &ag, &dg, &gkv, &gr, r1 - r0, di, ds);
    }
    gpu->ops->download(gpu, yg, g[0], nx * 4);
    gpu->ops->download(gpu, sg, g[4], nst * 4);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("selective_scan: %s", e.msg);
    double mx = 0, md = 0;
    for (size_t i = 0; i < nx; i++) {
        mx = fmax(mx, fabs(yc[i]));
        md = fmax(md, fabs((double)yc[i] - yg[i]));
    }
    double sx = 0, sd = 0;
    for (size_t i = 0; i < nst; i++) {
        sx = fmax(sx, fabs(st[i]));
        sd = fmax(sd, fabs((double)st[i] - sg[i]));
    }
    for (int i = 0; i < 7; i++)
        gpu->ops->buf_free(gpu, g[i]);
    float *bufs[] = {x, dt, bc, z, al, dd, st, yc, yg, sg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    return fmax(mx > 0 ? md / mx : md, sx > 0 ? sd / sx : sd);
}

/* The CUDA scan (a warp per channel, lanes over the states) against the CPU reference: one and
 * several lanes' states, a state size past 32, prefill- and decode-sized chunks. */
static void test_selective_scan(void **state)
{
    (void)state;
    static const int cases[][4] = {{300, 16, 37, 17}, {70, 40, 20, 1}, {9, 256, 12, 11}, {130, 1, 3, 2}};
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    double worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double r = scan_case(cpu, gpu, cases[c][0], cases[c][1], cases[c][2], cases[c][3]);
        if (r > 1e-5)
            fail_msg("selective_scan case %zu (d_inner %d, d_state %d): rel err %.3g", c, cases[c][0],
                     cases[c][1], r);
        worst = fmax(worst, r);
    }
    printf("cuda selective_scan: %zu cases, worst rel err %.2e\n", sizeof cases / sizeof cases[0], worst);
    backend_free(cpu);
    backend_free(gpu);
}

// ---- the gated delta rule ----

/* gated_delta on the GPU against the CPU scalar backend (its double-precision forms): three
 * sequences in runs of 5 rows (the CPU takes blocks and steps, the GPU steps), one from a
 * random state at position 1, one at position 0 over a garbage slot; the GPU in two calls
 * cut inside a run. Outputs and final states. */
static void test_gated_delta(void **state)
{
    (void)state;
    enum { NK = 2, NV = 4, DK = 32, DV = 160, N = 40, NSEQ = 3, CUT = 17 };
    const int ldx = 2 * NK * DK + NV * DV, vdim = NV * DK * DV;
    struct backend *gpu = NULL, *cpu = NULL;
    struct err e = {0};
    open_pair(&gpu, &cpu);
    size_t nx = (size_t)N * ldx, nab = (size_t)N * 2 * NV, ny = (size_t)N * NV * DV;
    size_t nst = (size_t)NSEQ * vdim;
    float *x = malloc(nx * 4), *ab = malloc(nab * 4), *st = malloc(nst * 4), *stc = malloc(nst * 4);
    float *stg = malloc(nst * 4), *yc = malloc(ny * 4), *yg = malloc(ny * 4), par[2 * NV];
    int32_t meta[2 * N], next[NSEQ] = {1, 0, 1};
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (size_t i = 0; i < nab; i++)
        ab[i] = frnd(-3.0f, 3.0f);
    for (size_t i = 0; i < nst; i++)
        st[i] = frnd(-0.5f, 0.5f);
    for (int i = 0; i < 2 * NV; i++)
        par[i] = frnd(-1.0f, 1.0f);  /* A_log | dt_bias */
    for (int i = 0; i < N; i++) {
        meta[N + i] = (i / 5) % NSEQ;  /* state slot (sequence) */
        meta[i] = next[meta[N + i]]++; /* position */
    }
    memcpy(stc, st, nst * 4);
    struct tensor ta, td;
    int64_t shape[1] = {NV};
    tensor_init(&ta, DTYPE_F32, par, 1, shape);
    tensor_init(&td, DTYPE_F32, par + NV, 1, shape);
    struct gdn_params p = {NK, NV, DK, DV, &ta, &td};
    struct kv_layer kv = {NULL, stc, 0, vdim, DTYPE_F32};
    struct kv_rows kr = {meta, NULL, NULL, NULL, NULL, 0, meta + N, NULL};
    cpu->ops->gated_delta(cpu, yc, NV * DV, x, ldx, ab, 2 * NV, &p, &kv, &kr, N);
    assert_int_equal(backend_sync(cpu, &e), 0);
    void *d[6];
    size_t sz[6] = {nx * 4, nab * 4, nst * 4, ny * 4, sizeof par, sizeof meta};
    for (int i = 0; i < 6; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], x, sz[0]);
    gpu->ops->upload(gpu, d[1], ab, sz[1]);
    gpu->ops->upload(gpu, d[2], st, sz[2]);
    gpu->ops->upload(gpu, d[4], par, sz[4]);
    gpu->ops->upload(gpu, d[5], meta, sz[5]);
    struct tensor ga = ta, gd = td;
    ga.data = d[4];
    gd.data = (float *)d[4] + NV;
    struct gdn_params gp = {NK, NV, DK, DV, &ga, &gd};
    struct kv_layer gkv = {NULL, d[2], 0, vdim, DTYPE_F32};
    int32_t *dm = d[5];
    for (int c = 0; c < 2; c++) {
        int r0 = c ? CUT : 0, m = c ? N - CUT : CUT;
        struct kv_rows gkr = {dm + r0, NULL, NULL, NULL, NULL, 0, dm + N + r0, NULL};
        gpu->ops->gated_delta(gpu, (float *)d[3] + (size_t)r0 * NV * DV, NV * DV,
                              (float *)d[0] + (size_t)r0 * ldx, ldx, (float *)d[1] + (size_t)r0 * 2 * NV,
                              2 * NV, &gp, &gkv, &gkr, m);
    }
    gpu->ops->download(gpu, yg, d[3], sz[3]);
    gpu->ops->download(gpu, stg, d[2], sz[2]);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("gated_delta: %s", e.msg);
    double my = 0, dy = 0, ms = 0, ds = 0;
    for (size_t i = 0; i < ny; i++) {
        my = fmax(my, fabs(yc[i]));
        dy = fmax(dy, fabs((double)yc[i] - yg[i]));
    }
    for (size_t i = 0; i < nst; i++) {
        ms = fmax(ms, fabs(stc[i]));
        ds = fmax(ds, fabs((double)stc[i] - stg[i]));
    }
    printf("cuda gated_delta: rel err y %.2e, state %.2e\n", dy / my, ds / ms);
    if (dy > 1e-4 * my || ds > 1e-4 * ms)
        fail_msg("gated_delta: rel err y %.3g, state %.3g", dy / my, ds / ms);
    for (int i = 0; i < 6; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(x), free(ab), free(st), free(stc), free(stg), free(yc), free(yg);
    backend_free(cpu);
    backend_free(gpu);
}

// ---- ssd scan ----

/* ssd_scan of n_tok rows of n_seq sequences (runs of one sequence with others' rows
 * between, some sequences from position 0, others from a random state) on the GPU against
 * the CPU scalar backend (its chunked form on the runs): outputs and states, as the worst
 * |diff| / max|cpu|. */
static double ssd_case(struct backend *cpu, struct backend *gpu, int n_tok, int n_seq, int H,
                       int P, int N, int G)
{
    int di = H * P, ldx = di + 2 * G * N, next[4] = {0, 5, 0, 9};
    size_t sd = (size_t)H * P * N, nst = sd * n_seq, nx = (size_t)n_tok * ldx;
    float *x = malloc(nx * sizeof *x), *dt = malloc((size_t)n_tok * H * sizeof *dt);
    float *yc = malloc((size_t)n_tok * di * sizeof *yc), *yg = malloc((size_t)n_tok * di * sizeof *yg);
    float *st = malloc(nst * sizeof *st), *stc = malloc(nst * sizeof *stc), *stg = malloc(nst * sizeof *stg);
    float par[3][64];
    int32_t *rows = malloc((size_t)n_tok * 2 * sizeof *rows), *pos = rows, *seq = rows + n_tok;
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n_tok * H; i++)
        dt[i] = frnd(-4.0f, 3.0f);
    for (size_t i = 0; i < nst; i++)
        st[i] = stc[i] = frnd(-1.0f, 1.0f);
    for (int h = 0; h < H && h < 64; h++) {
        par[0][h] = frnd(-2.0f, 1.5f);
        par[1][h] = frnd(-1.0f, 1.0f);
        par[2][h] = frnd(-1.0f, 1.0f);
    }
    for (int i = 0; i < n_tok; i++) {
        seq[i] = i % 7 == 3 ? (int32_t)(rnd32() % (unsigned)n_seq) : (int32_t)((int64_t)i * n_seq / n_tok);
        pos[i] = next[seq[i]]++;
    }
    struct ssd_params sp = {H, P, N, G, 0.0f, INFINITY};
    int64_t shape[1] = {H};
    struct tensor t[3];
    for (int k = 0; k < 3; k++)
        tensor_init(&t[k], DTYPE_F32, par[k], 1, shape);
    struct kv_layer kv = {NULL, stc, 0, (int)sd, DTYPE_F32};
    struct kv_rows kr = {.pos = pos, .state = seq};
    cpu->ops->ssd_scan(cpu, yc, di, x, x + di, x + di + G * N, ldx, dt, H, &t[0], &t[1], &t[2],
                       &kv, &kr, n_tok, &sp);
    struct err e = {0};
    assert_int_equal(backend_sync(cpu, &e), 0);
    void *d[5];
    size_t sz[5] = {nx * 4, (size_t)n_tok * H * 4, (size_t)n_tok * di * 4, nst * 4, (size_t)n_tok * 8};
    for (int i = 0; i < 5; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], x, sz[0]);
    gpu->ops->upload(gpu, d[1], dt, sz[1]);
    gpu->ops->upload(gpu, d[3], st, sz[3]);
    gpu->ops->upload(gpu, d[4], rows, sz[4]);
    for (int k = 0; k < 3; k++)
        assert_int_equal(gpu->ops->prepare_weight(gpu, &t[k], 0, &e), 0);
    float *gx = d[0];
    int32_t *gr = d[4];
    struct kv_layer gkv = {NULL, d[3], 0, (int)sd, DTYPE_F32};
    struct kv_rows gkr = {.pos = gr, .state = gr + n_tok};
    gpu->ops->ssd_scan(gpu, d[2], di, gx, gx + di, gx + di + G * N, ldx, d[1], H, &t[0], &t[1],
                       &t[2], &gkv, &gkr, n_tok, &sp);
    gpu->ops->download(gpu, yg, d[2], sz[2]);
    gpu->ops->download(gpu, stg, d[3], sz[3]);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("ssd_scan: %s", e.msg);
    double mx = 0, md = 0, sx = 0, smd = 0;
    for (int i = 0; i < n_tok * di; i++) {
        mx = fmax(mx, fabs(yc[i]));
        md = fmax(md, fabs((double)yc[i] - yg[i]));
    }
    for (size_t i = 0; i < nst; i++) {
        sx = fmax(sx, fabs(stc[i]));
        smd = fmax(smd, fabs((double)stc[i] - stg[i]));
    }
    for (int i = 0; i < 5; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(x);
    free(dt);
    free(yc);
    free(yg);
    free(st);
    free(stc);
    free(stg);
    free(rows);
    return fmax(mx > 0 ? md / mx : md, sx > 0 ? smd / sx : smd);
}

static void test_ssd_scan(void **state)
{
    (void)state;
    static const int cases[][6] = {
        {1, 1, 4, 8, 16, 1},      /* one decode row */
        {5, 4, 8, 16, 64, 2},     /* decode rows of 4 sequences */
        {150, 2, 8, 16, 128, 2},  /* prefill runs beside decode rows */
        {77, 3, 6, 10, 256, 3},   /* d_state 256: 8 floats a lane */
        {40, 2, 4, 7, 33, 1},     /* odd sizes */
    };
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    double worst = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int *k = cases[c];
        double r = ssd_case(cpu, gpu, k[0], k[1], k[2], k[3], k[4], k[5]);
        if (r > 1e-4)
            fail_msg("ssd_scan case %zu: rel err %.3g", c, r);
        worst = fmax(worst, r);
    }
    printf("cuda ssd_scan: %zu cases, worst rel err %.2e\n", sizeof cases / sizeof cases[0], worst);
    backend_free(cpu);
    backend_free(gpu);
}

// ---- the chunked prefill forms (ADR 0132) ----

/* A call's rows as runs {sequence, rows} in row order, each run at the next positions of
 * its sequence; sequences 1 and 3 continue from position 5 / 9 (a random carried state),
 * 0 and 2 start at position 0 (over a slot of garbage). */
#define RC_MAX_RUNS 8
struct rc_case {
    const char *what;
    int runs[RC_MAX_RUNS][2];
    int cut;                 /* > 0: the GPU takes rows [0, cut) and [cut, n) in two calls */
    bool slow;               /* mild decays: a state lives across many chunks */
    int h, p, n, g;          /* ssd: heads, head_dim, d_state, groups; gdn: nk, nv, dk, dv */
    bool inplace;            /* ssd: y written over x (ldy = ldx), as blk_mamba2 may */
};

static int rc_rows(const struct rc_case *rc, int32_t *pos, int32_t *seq)
{
    int next[4] = {0, 5, 0, 9}, n = 0;
    for (int r = 0; r < RC_MAX_RUNS && rc->runs[r][1] > 0; r++)
        for (int i = 0; i < rc->runs[r][1]; i++) {
            if (pos) {
                seq[n] = rc->runs[r][0];
                pos[n] = next[seq[n]]++;
            }
            n++;
        }
    return n;
}

/* |a - b| / max|a| over n floats */
static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return m > 0 ? d / m : d;
}

/* ssd_scan of one case on the GPU (in one or two calls) against the CPU scalar backend:
 * the worst relative error of the outputs and of the four sequences' states. */
static double ssd_chunk_case(struct backend *cpu, struct backend *gpu, const struct rc_case *rc)
{
    int H = rc->h, P = rc->p, N = rc->n, G = rc->g, n_tok = rc_rows(rc, NULL, NULL);
    int di = H * P, ldx = di + 2 * G * N, n_seq = 4;
    size_t sd = (size_t)H * P * N, nst = sd * n_seq, nx = (size_t)n_tok * ldx, ny = (size_t)n_tok * di;
    float *x = malloc(nx * 4), *dt = malloc((size_t)n_tok * H * 4), *yc = malloc(ny * 4);
    float *yg = malloc(ny * 4), *st = malloc(nst * 4), *stc = malloc(nst * 4), *stg = malloc(nst * 4);
    float *par = malloc((size_t)3 * H * 4);
    int32_t *rows = malloc((size_t)n_tok * 2 * 4), *pos = rows, *seq = rows + n_tok;
    rc_rows(rc, pos, seq);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n_tok * H; i++)
        dt[i] = rc->slow ? frnd(-5.0f, -1.0f) : frnd(-4.0f, 3.0f);
    for (size_t i = 0; i < nst; i++)
        st[i] = stc[i] = frnd(-1.0f, 1.0f);
    for (int h = 0; h < H; h++) {
        par[h] = rc->slow ? frnd(-3.0f, -0.5f) : frnd(-2.0f, 1.5f);  /* A_log */
        par[H + h] = frnd(-1.0f, 1.0f);                               /* D */
        par[2 * H + h] = frnd(-1.0f, 1.0f);                           /* dt_bias */
    }
    struct ssd_params sp = {H, P, N, G, 0.0f, INFINITY};
    int64_t shape[1] = {H};
    struct tensor t[3];
    for (int k = 0; k < 3; k++)
        tensor_init(&t[k], DTYPE_F32, par + (size_t)k * H, 1, shape);
    struct kv_layer kv = {NULL, stc, 0, (int)sd, DTYPE_F32};
    struct kv_rows kr = {.pos = pos, .state = seq};
    cpu->ops->ssd_scan(cpu, yc, di, x, x + di, x + di + G * N, ldx, dt, H, &t[0], &t[1], &t[2],
                       &kv, &kr, n_tok, &sp);
    struct err e = {0};
    assert_int_equal(backend_sync(cpu, &e), 0);
    void *d[5];
    size_t sz[5] = {nx * 4, (size_t)n_tok * H * 4, ny * 4, nst * 4, (size_t)n_tok * 8};
    for (int i = 0; i < 5; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], x, sz[0]);
    gpu->ops->upload(gpu, d[1], dt, sz[1]);
    gpu->ops->upload(gpu, d[3], st, sz[3]);
    gpu->ops->upload(gpu, d[4], rows, sz[4]);
    for (int k = 0; k < 3; k++)
        assert_int_equal(gpu->ops->prepare_weight(gpu, &t[k], 0, &e), 0);
    struct kv_layer gkv = {NULL, d[3], 0, (int)sd, DTYPE_F32};
    for (int c = 0; c < 2; c++) {
        int r0 = c ? rc->cut : 0, m = rc->cut > 0 ? (c ? n_tok - rc->cut : rc->cut) : (c ? 0 : n_tok);
        if (m <= 0)
            continue;
        float *gx = (float *)d[0] + (size_t)r0 * ldx;
        int32_t *gr = d[4];
        struct kv_rows gkr = {.pos = gr + r0, .state = gr + n_tok + r0};
        float *gy = rc->inplace ? gx : (float *)d[2] + (size_t)r0 * di;
        gpu->ops->ssd_scan(gpu, gy, rc->inplace ? ldx : di, gx, gx + di, gx + di + G * N, ldx,
                           (float *)d[1] + (size_t)r0 * H, H, &t[0], &t[1], &t[2], &gkv, &gkr, m,
                           &sp);
    }
    if (rc->inplace) {  /* y: the first di columns of the x rows */
        gpu->ops->download(gpu, x, d[0], sz[0]);
        for (int i = 0; i < n_tok; i++)
            memcpy(yg + (size_t)i * di, x + (size_t)i * ldx, (size_t)di * 4);
    } else {
        gpu->ops->download(gpu, yg, d[2], sz[2]);
    }
    gpu->ops->download(gpu, stg, d[3], sz[3]);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("ssd_scan %s: %s", rc->what, e.msg);
    double ry = rel_err(yc, yg, ny), rs = rel_err(stc, stg, nst);
    printf("cuda ssd_scan chunked, %s: %d rows, rel err y %.2e, state %.2e\n", rc->what, n_tok, ry, rs);
    for (int i = 0; i < 5; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(x), free(dt), free(yc), free(yg), free(st), free(stc), free(stg), free(par), free(rows);
    return fmax(ry, rs);
}

/* The SSD scan's chunked form (runs of >= 32 rows of one sequence in chunks of <= 64)
 * against the CPU's recurrence: long runs of odd lengths, several chunks, runs that
 * continue a carried state, a call cut inside a run (the second call continues from the
 * state the chunks left), decode rows and short runs beside chunks in one call, a
 * sequence's long runs with another's between, groups, head_dim and d_state at the
 * form's limits, a head_dim past them (the recurrence takes it). */
static void test_ssd_chunked(void **state)
{
    (void)state;
    static const struct rc_case cases[] = {
        {"one prefill of 300 rows", {{0, 300}}, 0, true, 8, 16, 64, 2, false},
        {"517 rows after a carried state, cut at 150", {{1, 517}}, 150, true, 4, 64, 128, 1, false},
        {"chunks beside decode rows and short runs",
         {{0, 200}, {1, 1}, {2, 1}, {3, 75}, {1, 1}, {0, 33}, {2, 31}}, 0, true, 6, 10, 33, 3, false},
        {"head_dim 128, d_state 256", {{2, 130}, {3, 64}, {2, 1}}, 100, false, 2, 128, 256, 1, false},
        {"a sequence's runs with another's between", {{0, 100}, {1, 40}, {0, 100}, {1, 1}, {0, 1}},
         0, true, 4, 32, 16, 2, false},
        {"1000 rows of head_dim 7", {{1, 1000}}, 0, true, 3, 7, 16, 1, false},
        {"strong decays", {{3, 257}, {0, 64}}, 0, false, 4, 16, 32, 2, false},
        {"y over x", {{1, 150}, {2, 1}, {0, 90}}, 0, true, 4, 16, 32, 2, true},
        {"short runs only (no chunk)", {{0, 20}, {1, 20}, {2, 1}, {3, 10}}, 0, true,
         4, 16, 32, 2, false},
        {"head_dim 130 (the recurrence)", {{0, 70}}, 0, true, 2, 130, 16, 1, false},
    };
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double r = ssd_chunk_case(cpu, gpu, &cases[c]);
        if (!(r <= 1e-4))
            fail_msg("ssd_scan chunked, %s: rel err %.3g", cases[c].what, r);
    }
    backend_free(cpu);
    backend_free(gpu);
}

/* gated_delta of one case on the GPU against the CPU scalar backend (double precision):
 * the worst relative error of the outputs and the states. */
static double gdn_chunk_case(struct backend *cpu, struct backend *gpu, const struct rc_case *rc)
{
    int NK = rc->h, NV = rc->p, DK = rc->n, DV = rc->g, n_tok = rc_rows(rc, NULL, NULL);
    int ldx = 2 * NK * DK + NV * DV, vdim = NV * DK * DV, n_seq = 4;
    size_t nx = (size_t)n_tok * ldx, nab = (size_t)n_tok * 2 * NV, ny = (size_t)n_tok * NV * DV;
    size_t nst = (size_t)n_seq * vdim;
    float *x = malloc(nx * 4), *ab = malloc(nab * 4), *st = malloc(nst * 4), *stc = malloc(nst * 4);
    float *stg = malloc(nst * 4), *yc = malloc(ny * 4), *yg = malloc(ny * 4);
    float *par = malloc((size_t)2 * NV * 4);
    int32_t *meta = malloc((size_t)2 * n_tok * 4);
    rc_rows(rc, meta, meta + n_tok);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n_tok; i++)
        for (int h = 0; h < NV; h++) {
            ab[(size_t)i * 2 * NV + h] = frnd(-3.0f, 3.0f);  /* b: beta */
            ab[(size_t)i * 2 * NV + NV + h] = rc->slow ? frnd(-5.0f, -1.0f) : frnd(-3.0f, 3.0f);
        }
    for (size_t i = 0; i < nst; i++)
        st[i] = stc[i] = frnd(-0.5f, 0.5f);
    for (int h = 0; h < NV; h++) {
        par[h] = rc->slow ? frnd(-3.0f, -1.0f) : frnd(-1.0f, 1.0f);  /* A_log */
        par[NV + h] = frnd(-1.0f, 1.0f);                              /* dt_bias */
    }
    struct tensor ta, td;
    int64_t shape[1] = {NV};
    tensor_init(&ta, DTYPE_F32, par, 1, shape);
    tensor_init(&td, DTYPE_F32, par + NV, 1, shape);
    struct gdn_params p = {NK, NV, DK, DV, &ta, &td};
    struct kv_layer kv = {NULL, stc, 0, vdim, DTYPE_F32};
    struct kv_rows kr = {.pos = meta, .state = meta + n_tok};
    cpu->ops->gated_delta(cpu, yc, NV * DV, x, ldx, ab, 2 * NV, &p, &kv, &kr, n_tok);
    struct err e = {0};
    assert_int_equal(backend_sync(cpu, &e), 0);
    void *d[6];
    size_t sz[6] = {nx * 4, nab * 4, nst * 4, ny * 4, (size_t)2 * NV * 4, (size_t)2 * n_tok * 4};
    for (int i = 0; i < 6; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], x, sz[0]);
    gpu->ops->upload(gpu, d[1], ab, sz[1]);
    gpu->ops->upload(gpu, d[2], st, sz[2]);
    gpu->ops->upload(gpu, d[4], par, sz[4]);
    gpu->ops->upload(gpu, d[5], meta, sz[5]);
    struct tensor ga = ta, gd = td;
    ga.data = d[4];
    gd.data = (float *)d[4] + NV;
    struct gdn_params gp = {NK, NV, DK, DV, &ga, &gd};
    struct kv_layer gkv = {NULL, d[2], 0, vdim, DTYPE_F32};
    int32_t *dm = d[5];
    for (int c = 0; c < 2; c++) {
        int r0 = c ? rc->cut : 0, m = rc->cut > 0 ? (c ? n_tok - rc->cut : rc->cut) : (c ? 0 : n_tok);
        if (m <= 0)
            continue;
        struct kv_rows gkr = {.pos = dm + r0, .state = dm + n_tok + r0};
        gpu->ops->gated_delta(gpu, (float *)d[3] + (size_t)r0 * NV * DV, NV * DV,
                              (float *)d[0] + (size_t)r0 * ldx, ldx,
                              (float *)d[1] + (size_t)r0 * 2 * NV, 2 * NV, &gp, &gkv, &gkr, m);
    }
    gpu->ops->download(gpu, yg, d[3], sz[3]);
    gpu->ops->download(gpu, stg, d[2], sz[2]);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("gated_delta %s: %s", rc->what, e.msg);
    double ry = rel_err(yc, yg, ny), rs = rel_err(stc, stg, nst);
    printf("cuda gated_delta chunked, %s: %d rows, rel err y %.2e, state %.2e\n", rc->what, n_tok,
           ry, rs);
    for (int i = 0; i < 6; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(x), free(ab), free(st), free(stc), free(stg), free(yc), free(yg), free(par), free(meta);
    return fmax(ry, rs);
}

/* The gated delta rule's chunked form (the WY / UT form: a triangular solve per chunk of
 * <= 64 rows, then the state carried chunk to chunk) against the CPU's double-precision
 * forms: the same shapes of calls as test_ssd_chunked, value heads sharing key heads,
 * value dims not a multiple of the pass's 32 columns, k_dim 16 to 256 (the form's limit),
 * a k_dim that is not a multiple of 8 (the recurrence takes it). */
static void test_gated_delta_chunked(void **state)
{
    (void)state;
    static const struct rc_case cases[] = {
        {"chunks beside decode rows, cut at 120", {{0, 200}, {1, 1}, {2, 1}, {1, 70}}, 120, false,
         2, 4, 32, 100, false},
        {"Qwen3-Next's head, 300 rows after a carried state", {{1, 300}}, 129, true, 1, 2, 128, 128, false},
        {"short runs between chunks",
         {{3, 40}, {0, 31}, {2, 96}, {0, 1}, {3, 1}, {2, 33}}, 0, true, 2, 2, 64, 48, false},
        {"k_dim 256", {{0, 100}, {1, 1}}, 0, true, 1, 1, 256, 64, false},
        {"a sequence's runs with another's between", {{1, 64}, {0, 50}, {1, 65}}, 0, false,
         1, 3, 32, 32, false},
        {"1000 rows", {{3, 1000}}, 0, true, 1, 1, 32, 40, false},
        {"k_dim 16, as the golden fixtures", {{2, 90}, {1, 33}}, 50, true, 2, 4, 16, 16, false},
        {"short runs only (no chunk)", {{0, 20}, {1, 20}, {2, 1}, {3, 10}}, 0, true,
         2, 4, 32, 32, false},
        {"k_dim 20 (the recurrence)", {{0, 80}}, 0, true, 1, 2, 20, 32, false},
    };
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double r = gdn_chunk_case(cpu, gpu, &cases[c]);
        if (!(r <= 1e-4))
            fail_msg("gated_delta chunked, %s: rel err %.3g", cases[c].what, r);
    }
    backend_free(cpu);
    backend_free(gpu);
}

/* One hybrid golden model on the GPU: two sequences prefilled in one call (150 and 40 rows),
 * then a call continuing the first by 70 rows beside one decode row of the second; every
 * row's logits into out [261][n_vocab]. */
static void rec_prefill_logits(const char *dir, struct backend *gpu, float *out, int *V)
{
    static const int len[2][2] = {{150, 40}, {70, 1}};
    struct test_eng g;
    struct err e = {0};
    test_eng_open(&g, dir, gpu, 0, 512, 2, 16);
    *V = g.m->hp.n_vocab;
    for (int s = 0; s < 2; s++)
        assert_int_equal(kv_seq_add(g.kv, s, &e), 0);
    size_t done = 0;
    for (int call = 0; call < 2; call++) {
        batch_clear(g.b);
        for (int s = 0; s < 2; s++)
            for (int i = 0, p0 = kv_seq_len(g.kv, s); i < len[call][s]; i++)
                assert_int_equal(batch_add(g.b, (7 * (p0 + i) + 3 + s) % *V, p0 + i, s, true, &e), 0);
        if (model_forward(g.c, g.b, g.kv, out + done * *V, &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
        done += (size_t)len[call][0] + len[call][1];
    }
    test_eng_close(&g);
}

/* The hybrid golden models end to end on the GPU with the chunked prefill (ADR 0132) against
 * the recurrence for every row (MLXCEL_CUDA_CHUNKED=0): the same logits on every row within
 * the batch suite's GPU bound, so the forms agree inside the families' own calls (xBC
 * columns of one buffer, y over x, groups, value heads sharing key heads). */
static void test_recurrent_prefill(void **state)
{
    (void)state;
    static const char *dirs[] = {"mamba2", "nemotron_h", "granitemoehybrid", "bamba", "falcon_h1",
                                 "qwen3_next", "qwen3_5_text"};
    struct backend *ch = NULL, *rec = NULL;
    struct err e = {0};
    struct backend_opts o = *test_backend_opts();
    o.cuda_chunked = true;
    if (backend_new(&ch, "cuda", 1, &o, &e) < 0) {
        printf("cuda: %s\n", e.msg);
        skip();
    }
    o.cuda_chunked = false;
    assert_int_equal(backend_new(&rec, "cuda", 1, &o, &e), 0);
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        char dir[128];
        snprintf(dir, sizeof dir, "tests/fixtures/golden/%s", dirs[d]);
        int V = 0;
        size_t n = (size_t)261 * 4096;
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        rec_prefill_logits(dir, ch, a, &V);
        assert_true(V <= 4096);
        rec_prefill_logits(dir, rec, b, &V);
        double r = rel_err(b, a, (size_t)261 * V);
        printf("cuda chunked prefill, %s: 261 rows' logits, rel err %.2e against the recurrence\n",
               dirs[d], r);
        if (!(r <= 5e-4))
            fail_msg("chunked prefill, %s: rel err %.3g", dirs[d], r);
        free(a);
        free(b);
    }
    backend_free(ch);
    backend_free(rec);
}

// ---- fused ops (ADR 0138) ----

/* A residual add h += rs * o and the norm after it: n_tok rows of n, h (and the norm) of
 * stride ld, o of stride ldo; the norm writes yw: 0 a buffer of its own, 1 h, 2 o. */
struct resnorm_tc {
    int n_tok, n, ld, ldo, yw;
    bool layer;
    float rs, w_off;
    enum dtype wdt;
    bool other;     /* the norm reads another buffer (h's old rows): no fusion */
};

/* The case on the GPU, the ops back to back (fused) or with a sync between (one by one):
 * h into hh [n_tok * ld], the norm's rows into hy (yw 2: [n_tok * ldo], else n_tok * ld). */
static void resnorm_gpu(struct backend *gpu, const struct resnorm_tc *tc, const float *h0,
                        const float *o0, const struct tensor *w, const struct tensor *b,
                        bool fused, float *hh, float *hy)
{
    struct err e = {0};
    size_t nh = (size_t)tc->n_tok * tc->ld, no = (size_t)tc->n_tok * tc->ldo;
    float *zero = calloc(nh, 4);
    void *d[4];
    size_t sz[4] = {nh * 4, no * 4, nh * 4, nh * 4};
    for (int i = 0; i < 4; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    float *dh = d[0], *dout = d[1], *dy = d[2], *dz = d[3];
    gpu->ops->upload(gpu, dh, h0, nh * 4);
    gpu->ops->upload(gpu, dout, o0, no * 4);
    gpu->ops->upload(gpu, dy, zero, nh * 4);
    gpu->ops->upload(gpu, dz, h0, nh * 4);
    float *y = tc->yw == 1 ? dh : tc->yw == 2 ? dout : dy;
    const float *x = tc->other ? dz : dh;
    gpu->ops->axpy(gpu, dh, tc->ld, tc->rs, dout, tc->ldo, tc->n_tok, tc->n);
    if (!fused && backend_sync(gpu, &e) < 0)
        fail_msg("axpy: %s", e.msg);
    if (tc->layer)
        gpu->ops->layernorm(gpu, y, x, tc->ld, w, tc->w_off, b, 1e-5f, tc->n_tok, 1, tc->n);
    else
        gpu->ops->rmsnorm(gpu, y, x, tc->ld, w, tc->w_off, 1e-5f, tc->n_tok, 1, tc->n);
    gpu->ops->download(gpu, hh, dh, nh * 4);
    gpu->ops->download(gpu, hy, y, tc->yw == 2 ? no * 4 : nh * 4);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("residual add + norm: %s", e.msg);
    for (int i = 0; i < 4; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(zero);
}

/* The worst relative error of the GPU's h and norm rows against the CPU scalar backend's;
 * the fused launch and the ops one by one agree bit for bit. */
static double resnorm_case(struct backend *cpu, struct backend *gpu, const struct resnorm_tc *tc)
{
    struct err e = {0};
    size_t nh = (size_t)tc->n_tok * tc->ld, no = (size_t)tc->n_tok * tc->ldo;
    size_t ny = tc->yw == 2 ? no : nh;
    float *h0 = malloc(nh * 4), *o0 = malloc(no * 4), *h = malloc(nh * 4), *o = malloc(no * 4);
    float *z = malloc(nh * 4), *yc = calloc(nh, 4), *bv = malloc((size_t)tc->n * 4);
    float *hf = malloc(nh * 4), *yf = malloc(ny * 4), *hu = malloc(nh * 4), *yu = malloc(ny * 4);
    void *wb = malloc((size_t)tc->n * 4);
    for (size_t i = 0; i < nh; i++)
        h0[i] = frnd(-3.0f, 3.0f);
    for (size_t i = 0; i < no; i++)
        o0[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < tc->n; i++) {
        put(wb, tc->wdt, (size_t)i, frnd(0.5f, 1.5f));
        bv[i] = frnd(-0.5f, 0.5f);
    }
    int64_t shape[1] = {tc->n};
    struct tensor w, b, gw, gb;
    tensor_init(&w, tc->wdt, wb, 1, shape);
    tensor_init(&b, DTYPE_F32, bv, 1, shape);
    gw = w;
    gb = b;
    assert_int_equal(gpu->ops->prepare_weight(gpu, &gw, PREP_REPACK_BESIDE, &e), 0);
    assert_int_equal(gpu->ops->prepare_weight(gpu, &gb, PREP_REPACK_BESIDE, &e), 0);
    memcpy(h, h0, nh * 4);
    memcpy(z, h0, nh * 4);
    memcpy(o, o0, no * 4);
    float *cy = tc->yw == 1 ? h : tc->yw == 2 ? o : yc;
    cpu->ops->axpy(cpu, h, tc->ld, tc->rs, o, tc->ldo, tc->n_tok, tc->n);
    if (tc->layer)
        cpu->ops->layernorm(cpu, cy, tc->other ? z : h, tc->ld, &w, tc->w_off, &b, 1e-5f,
                            tc->n_tok, 1, tc->n);
    else
        cpu->ops->rmsnorm(cpu, cy, tc->other ? z : h, tc->ld, &w, tc->w_off, 1e-5f, tc->n_tok, 1,
                          tc->n);
    resnorm_gpu(gpu, tc, h0, o0, &gw, &gb, true, hf, yf);
    resnorm_gpu(gpu, tc, h0, o0, &gw, &gb, false, hu, yu);
    if (memcmp(hf, hu, nh * 4) || memcmp(yf, yu, ny * 4))
        fail_msg("residual add + norm (%d rows of %d, ld %d, ldo %d, y %d, %s): fused and "
                 "one by one differ", tc->n_tok, tc->n, tc->ld, tc->ldo, tc->yw,
                 tc->layer ? "layer" : "rms");
    double r = fmax(rel_err(h, hf, nh), rel_err(cy, yf, ny));
    free(h0);
    free(o0);
    free(h);
    free(o);
    free(z);
    free(yc);
    free(bv);
    free(hf);
    free(yf);
    free(hu);
    free(yu);
    free(wb);
    return r;
}

/* RoPE of q | k (n_head + n_kv heads) and the KV store of k and v from one q | k | v row
 * (padded by pad columns), n_rot of hd dims rotated, into a cache of dt. */
struct ropestore_tc {
    int n_tok, n_head, n_kv, hd, n_rot, pad;
    enum rope_style style;
    float mscale;
    bool longrope;      /* inv_long for rows past long_after */
    enum dtype dt;
    bool apart;         /* v in a buffer of its own: no fusion */
};

#define RS_POOL_EXTRA 6

/* The case on the GPU, back to back or one by one: the q | k | v rows into hq, the caches
 * widened into hk, hv. */
static void ropestore_gpu(struct backend *gpu, const struct ropestore_tc *tc, const float *qkv,
                          const float *inv, const int32_t *ri, bool fused, float *hq, float *hk,
                          float *hv)
{
    struct err e = {0};
    int ld = (tc->n_head + 2 * tc->n_kv) * tc->hd + tc->pad, kvd = tc->n_kv * tc->hd;
    int pool = tc->n_tok + RS_POOL_EXTRA, half = tc->n_rot / 2;
    size_t nq = (size_t)tc->n_tok * ld, es = dtype_size(tc->dt), nc = (size_t)pool * kvd;
    void *d[6];
    size_t sz[6] = {nq * 4, nc * es, nc * es, (size_t)2 * half * 4, (size_t)tc->n_tok * 12,
                    nq * 4};
    char *zero = calloc(nc, es), *kc = malloc(nc * es), *vc = malloc(nc * es);
    for (int i = 0; i < 6; i++)
        assert_int_equal(gpu->ops->buf_alloc(gpu, sz[i], &d[i], &e), 0);
    gpu->ops->upload(gpu, d[0], qkv, nq * 4);
    gpu->ops->upload(gpu, d[1], zero, nc * es);
    gpu->ops->upload(gpu, d[2], zero, nc * es);
    gpu->ops->upload(gpu, d[3], inv, sz[3]);
    gpu->ops->upload(gpu, d[4], ri, sz[4]);
    gpu->ops->upload(gpu, d[5], qkv, nq * 4);
    float *q = d[0], *finv = d[3];
    int32_t *dr = d[4];
    struct rope_params rp = {tc->n_rot, finv, tc->longrope ? finv + half : NULL,
                             tc->longrope ? 9 : 1 << 30, 0.0f, tc->mscale, tc->style};
    struct kv_rows rows = {dr, dr + tc->n_tok, NULL, NULL, dr + 2 * tc->n_tok, 16, NULL, NULL};
    struct kv_layer kv = {d[1], d[2], kvd, kvd, tc->dt};
    const float *v = (tc->apart ? (float *)d[5] : q) + (size_t)(tc->n_head + tc->n_kv) * tc->hd;
    gpu->ops->rope(gpu, q, ld, tc->n_tok, tc->n_head + tc->n_kv, tc->hd, &rp, &rows);
    if (!fused && backend_sync(gpu, &e) < 0)
        fail_msg("rope: %s", e.msg);
    gpu->ops->kv_store(gpu, &kv, q + (size_t)tc->n_head * tc->hd, ld, v, ld, &rows, tc->n_tok);
    gpu->ops->download(gpu, hq, q, nq * 4);
    gpu->ops->download(gpu, kc, d[1], nc * es);
    gpu->ops->download(gpu, vc, d[2], nc * es);
    if (backend_sync(gpu, &e) < 0)
        fail_msg("rope + kv_store: %s", e.msg);
    dtype_to_f32_ref(hk, kc, tc->dt, nc);
    dtype_to_f32_ref(hv, vc, tc->dt, nc);
    for (int i = 0; i < 6; i++)
        gpu->ops->buf_free(gpu, d[i]);
    free(zero);
    free(kc);
    free(vc);
}

/* The worst relative error of the GPU's rows and caches against the CPU scalar backend's;
 * the fused launch and the ops one by one agree bit for bit. */
static double ropestore_case(struct backend *cpu, struct backend *gpu, const struct ropestore_tc *tc)
{
    int ld = (tc->n_head + 2 * tc->n_kv) * tc->hd + tc->pad, kvd = tc->n_kv * tc->hd;
    int pool = tc->n_tok + RS_POOL_EXTRA, half = tc->n_rot / 2;
    size_t nq = (size_t)tc->n_tok * ld, es = dtype_size(tc->dt), nc = (size_t)pool * kvd;
    float *qkv = malloc(nq * 4), *q = malloc(nq * 4), *inv = malloc((size_t)2 * half * 4);
    int32_t *ri = malloc((size_t)tc->n_tok * 12);
    char *kc = calloc(nc, es), *vc = calloc(nc, es);
    float *ck = malloc(nc * 4), *cv = malloc(nc * 4), *fq = malloc(nq * 4), *uq = malloc(nq * 4);
    float *fk = malloc(nc * 4), *fv = malloc(nc * 4), *uk = malloc(nc * 4), *uv = malloc(nc * 4);
    for (size_t i = 0; i < nq; i++)
        qkv[i] = frnd(-2.0f, 2.0f);
    for (int j = 0; j < half; j++) {
        inv[j] = (float)pow(10000.0, -2.0 * j / tc->n_rot);
        inv[half + j] = inv[j] / (1.0f + 0.25f * j);
    }
    for (int t = 0; t < tc->n_tok; t++) {
        ri[t] = 3 + 11 * t;                                  /* position */
        ri[tc->n_tok + t] = (5 * t + 2) % pool;              /* slot (pool is not a multiple of 5) */
        ri[2 * tc->n_tok + t] = 3 + 11 * t + 1;              /* the sequence's end */
    }
    memcpy(q, qkv, nq * 4);
    struct rope_params rp = {tc->n_rot, inv, tc->longrope ? inv + half : NULL,
                             tc->longrope ? 9 : 1 << 30, 0.0f, tc->mscale, tc->style};
    struct kv_rows rows = {ri, ri + tc->n_tok, NULL, NULL, ri + 2 * tc->n_tok, 16, NULL, NULL};
    struct kv_layer kv = {kc, vc, kvd, kvd, tc->dt};
    cpu->ops->rope(cpu, q, ld, tc->n_tok, tc->n_head + tc->n_kv, tc->hd, &rp, &rows);
    cpu->ops->kv_store(cpu, &kv, q + (size_t)tc->n_head * tc->hd, ld,
                       q + (size_t)(tc->n_head + tc->n_kv) * tc->hd, ld, &rows, tc->n_tok);
    dtype_to_f32_ref(ck, kc, tc->dt, nc);
    dtype_to_f32_ref(cv, vc, tc->dt, nc);
    ropestore_gpu(gpu, tc, qkv, inv, ri, true, fq, fk, fv);
    ropestore_gpu(gpu, tc, qkv, inv, ri, false, uq, uk, uv);
    if (memcmp(fq, uq, nq * 4) || memcmp(fk, uk, nc * 4) || memcmp(fv, uv, nc * 4))
        fail_msg("rope + kv_store (%d rows, %d + %d heads of %d, n_rot %d, %s): fused and one "
                 "by one differ", tc->n_tok, tc->n_head, tc->n_kv, tc->hd, tc->n_rot,
                 dtype_name(tc->dt));
    double r = fmax(rel_err(q, fq, nq), fmax(rel_err(ck, fk, nc), rel_err(cv, fv, nc)));
    free(qkv);
    free(q);
    free(inv);
    free(ri);
    free(kc);
    free(vc);
    free(ck);
    free(cv);
    free(fq);
    free(uq);
    free(fk);
    free(fv);
    free(uk);
    free(uv);
    return r;
}

/* The ops the CUDA backend fuses when they come back to back (fuse.cu, ADR 0138): a residual
 * add and the norm of its rows, RoPE and the KV store of the heads it rotated. Each case runs
 * back to back and with a sync between (the ops one by one), which must give the same bits,
 * and against the CPU scalar backend; cases that must not fuse (the norm of other rows, per
 * head, v apart) too. */
static void test_fused_ops(void **state)
{
    (void)state;
    static const struct resnorm_tc rn[] = {
        {1, 2048, 2048, 2048, 0, false, 1.0f, 0.0f, DTYPE_F32, false},   /* Llama decode */
        {3, 4096, 4096, 4096, 0, false, 1.0f, 0.0f, DTYPE_BF16, false},
        {1, 2304, 2304, 2304, 1, false, 0.22f, 1.0f, DTYPE_F32, false},  /* in place, Gemma */
        {2, 100, 100, 100, 2, false, 1.0f, 0.0f, DTYPE_F16, false},      /* into the added rows */
        {5, 3000, 3000, 3000, 0, true, 1.0f, 0.0f, DTYPE_F32, false},    /* layer norm */
        {4, 640, 700, 1280, 0, false, 0.5f, 0.0f, DTYPE_F32, false},     /* strides of their own */
        {2, 512, 512, 512, 0, false, 1.0f, 0.0f, DTYPE_F32, true},       /* another buffer */
        {1, 33, 33, 33, 0, true, 2.0f, 1.0f, DTYPE_BF16, false},
    };
    static const struct ropestore_tc rs[] = {
        {1, 32, 8, 64, 64, 0, ROPE_STYLE_HALF, 1.0f, false, DTYPE_F32, false},   /* Llama 1B */
        {1, 32, 8, 128, 128, 0, ROPE_STYLE_HALF, 1.0f, false, DTYPE_BF16, false},
        {3, 8, 2, 128, 64, 24, ROPE_STYLE_PAIRS, 1.2f, false, DTYPE_F16, false}, /* partial, pairs */
        {7, 4, 4, 80, 80, 0, ROPE_STYLE_HALF, 1.0f, true, DTYPE_F32, false},     /* longrope */
        {2, 16, 4, 96, 32, 8, ROPE_STYLE_HALF, 1.0f, false, DTYPE_BF16, false},
        {2, 8, 2, 64, 64, 0, ROPE_STYLE_HALF, 1.0f, false, DTYPE_F32, true},     /* v apart */
    };
    struct backend *gpu = NULL, *cpu = NULL;
    open_pair(&gpu, &cpu);
    double worst = 0;
    for (size_t i = 0; i < sizeof rn / sizeof rn[0]; i++) {
        double r = resnorm_case(cpu, gpu, &rn[i]);
        if (r > 1e-5)
            fail_msg("residual add + norm case %zu: rel err %.3g", i, r);
        worst = fmax(worst, r);
    }
    printf("cuda residual add + norm: %zu cases, fused = one by one, worst rel err %.2e\n",
           sizeof rn / sizeof rn[0], worst);
    worst = 0;
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        double r = ropestore_case(cpu, gpu, &rs[i]);
        /* an F16 / BF16 cache: a value within an ulp of a rounding edge may round apart */
        double tol = rs[i].dt == DTYPE_F32 ? 1e-5 : rs[i].dt == DTYPE_F16 ? 2e-3 : 1e-2;
        if (r > tol)
            fail_msg("rope + kv_store case %zu: rel err %.3g", i, r);
        worst = fmax(worst, r);
    }
    printf("cuda rope + kv_store: %zu cases, fused = one by one, worst rel err %.2e\n",
           sizeof rs / sizeof rs[0], worst);
    backend_free(cpu);
    backend_free(gpu);
}

// ---- decode graphs ----

#define GRAPH_STEPS 6

/* Two sequences prefilled, then GRAPH_STEPS decode steps of both in one batch (the shape
 * model_forward records as a graph); their logits into out [GRAPH_STEPS][2][n_vocab]. */
static void decode_steps(struct test_eng *g, bool graphs, float *out)
{
    static const int32_t p0[] = {1, 5, 9, 13, 17}, p1[] = {2, 6, 10};
    struct err e = {0};
    int V = g->m->hp.n_vocab;
    float *scratch = malloc((size_t)V * sizeof *scratch);
    g->be->graphs = graphs;
    for (int s = 0; s < 2; s++) {
        kv_seq_remove(g->kv, s);
        assert_int_equal(kv_seq_add(g->kv, s, &e), 0);
        batch_clear(g->b);
        assert_int_equal(batch_add_seq(g->b, s ? p1 : p0, s ? 3 : 5, 0, s, true, &e), 0);
        if (model_forward(g->c, g->b, g->kv, scratch, &e) < 0)
            fail_msg("%s", e.msg);
    }
    for (int t = 0; t < GRAPH_STEPS; t++) {
        batch_clear(g->b);
        for (int s = 0; s < 2; s++)
            assert_int_equal(batch_add(g->b, (7 * t + 3 * s + 1) % V, kv_seq_len(g->kv, s), s, true,
                                       &e), 0);
        if (model_forward(g->c, g->b, g->kv, out + (size_t)t * 2 * V, &e) < 0)
            fail_msg("%s", e.msg);
    }
    free(scratch);
}

/* Replayed graphs compute what the ops compute one by one, bit for bit; a model whose decode
 * step cannot be recorded (an op that needs the host) runs op by op. */
static void graph_case(const char *dir, bool want_graph)
{
    struct backend *gpu = NULL;
    struct err e = {0};
    if (backend_new(&gpu, "cuda", 1, test_backend_opts(), &e) < 0) {
        printf("cuda: %s\n", e.msg);
        skip();
    }
    struct test_eng g;
    test_eng_open(&g, dir, gpu, 0, 256, 2, 16);
    size_t n = (size_t)GRAPH_STEPS * 2 * g.m->hp.n_vocab;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    decode_steps(&g, false, a);
    decode_steps(&g, true, b);
    bool recorded = false;
    for (int i = 0; i < g.c->n_graphs; i++)
        recorded |= g.c->graphs[i].n_tok == 2 && g.c->graphs[i].graph;
    assert_true(recorded == want_graph);
    assert_memory_equal(a, b, n * sizeof *a);
    printf("cuda graph %s: %d decode steps %s\n", dir, GRAPH_STEPS,
           recorded ? "replayed, identical logits" : "op by op (not recordable), identical");
    free(a);
    free(b);
    test_eng_close(&g);
    backend_free(gpu);
}

static void test_graph_decode(void **state)
{
    (void)state;
    graph_case("models/llama-tiny", true);
    /* MoE: the experts found on the device (ADR 0143), the combine without scratch */
    graph_case("models/phixtral-tiny-4bit", true);
    graph_case("tests/fixtures/golden/mamba", true);  /* recurrent states in the graph */
    /* recurrent states: Mamba-2 alone, and beside attention */
    graph_case("tests/fixtures/golden/mamba2", true);
    graph_case("tests/fixtures/golden/nemotron_h", true);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_linear_formats),
    cmocka_unit_test(test_experts),
    cmocka_unit_test(test_attention),
    cmocka_unit_test(test_attention_decode),
    cmocka_unit_test(test_gated_delta),
    cmocka_unit_test(test_ssd_scan),
    cmocka_unit_test(test_ssd_chunked),
    cmocka_unit_test(test_gated_delta_chunked),
    cmocka_unit_test(test_recurrent_prefill),
    cmocka_unit_test(test_graph_decode),
    cmocka_unit_test(test_selective_scan),
    cmocka_unit_test(test_fused_ops),
};

TEST_SUITE(cuda, k_tests);
