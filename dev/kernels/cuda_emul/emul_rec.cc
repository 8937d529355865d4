/*
 * emul_rec: the CUDA backend's ssd_scan and gated_delta (rec.cu, ssm.cu, gdn.cu compiled
 * unchanged on cuda_impl.h's host stand-in) against the CPU scalar backend, on the cases of
 * tests/test_cuda.c's test_ssd_chunked / test_gated_delta_chunked, chunked form on and off.
 * Build and run: dev/kernels/cuda_emul/run.sh (after a build of build/libmlxcel_lib.a).
 */
#include "cuda_impl.h"
#include "core/tensor.h"

extern long emul_launches;

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

#define RC_MAX_RUNS 8
struct rc_case {
    const char *what;
    int runs[RC_MAX_RUNS][2];
    int cut;
    bool slow;
    int h, p, n, g;
    bool inplace;
};

static int rc_rows(const rc_case *rc, int32_t *pos, int32_t *seq)
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

static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return m > 0 ? d / m : d;
}

static struct cuda_backend g_cu;

static double ssd_case(struct backend *cpu, const rc_case *rc, bool chunked)
{
    int H = rc->h, P = rc->p, N = rc->n, G = rc->g, n_tok = rc_rows(rc, NULL, NULL);
    int di = H * P, ldx = di + 2 * G * N, n_seq = 4;
    size_t sd = (size_t)H * P * N, nst = sd * n_seq, nx = (size_t)n_tok * ldx, ny = (size_t)n_tok * di;
    float *x = (float *)malloc(nx * 4), *dt = (float *)malloc((size_t)n_tok * H * 4);
    float *yc = (float *)malloc(ny * 4), *yg = (float *)malloc(ny * 4), *st = (float *)malloc(nst * 4);
    float *stc = (float *)malloc(nst * 4), *par = (float *)malloc((size_t)3 * H * 4);
    int32_t *rows = (int32_t *)malloc((size_t)n_tok * 2 * 4), *pos = rows, *seq = rows + n_tok;
    rc_rows(rc, pos, seq);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n_tok * H; i++)
        dt[i] = rc->slow ? frnd(-5.0f, -1.0f) : frnd(-4.0f, 3.0f);
    for (size_t i = 0; i < nst; i++)
        st[i] = stc[i] = frnd(-1.0f, 1.0f);
    for (int h = 0; h < H; h++) {
        par[h] = rc->slow ? frnd(-3.0f, -0.5f) : frnd(-2.0f, 1.5f);
        par[H + h] = frnd(-1.0f, 1.0f);
        par[2 * H + h] = frnd(-1.0f, 1.0f);
    }
    struct ssd_params sp = {H, P, N, G, 0.0f, INFINITY};
    int64_t shape[1] = {H};
    struct tensor t[3];
    for (int k = 0; k < 3; k++)
        tensor_init(&t[k], DTYPE_F32, par + (size_t)k * H, 1, shape);
    struct kv_layer kv = {NULL, stc, 0, (int)sd, DTYPE_F32};
    struct kv_rows kr = {};
    kr.pos = pos;
    kr.state = seq;
    cpu->ops->ssd_scan(cpu, yc, di, x, x + di, x + di + G * N, ldx, dt, H, &t[0], &t[1], &t[2],
                       &kv, &kr, n_tok, &sp);
    struct err e = {};
    if (backend_sync(cpu, &e) < 0)
        exit(1);
    g_cu.chunked = chunked;
    struct kv_layer gkv = {NULL, st, 0, (int)sd, DTYPE_F32};
    long l0 = emul_launches;
    for (int c = 0; c < 2; c++) {
        int r0 = c ? rc->cut : 0, m = rc->cut > 0 ? (c ? n_tok - rc->cut : rc->cut) : (c ? 0 : n_tok);
        if (m <= 0)
            continue;
        float *gx = x + (size_t)r0 * ldx;
        struct kv_rows gkr = {};
        gkr.pos = pos + r0;
        gkr.state = seq + r0;
        float *gy = rc->inplace ? gx : yg + (size_t)r0 * di;
        cu_ssd_scan(&g_cu.be, gy, rc->inplace ? ldx : di, gx, gx + di, gx + di + G * N, ldx,
                    dt + (size_t)r0 * H, H, &t[0], &t[1], &t[2], &gkv, &gkr, m, &sp);
    }
    if (rc->inplace)
        for (int i = 0; i < n_tok; i++)
            memcpy(yg + (size_t)i * di, x + (size_t)i * ldx, (size_t)di * 4);
    if (g_cu.err_rc) {
        printf("ssd %s: %s\n", rc->what, g_cu.err_msg);
        exit(1);
    }
    double ry = rel_err(yc, yg, ny), rs = rel_err(stc, st, nst);
    printf("ssd_scan %s, %s: %d rows, %ld launches, rel err y %.2e, state %.2e\n",
           chunked ? "chunked" : "recurrent", rc->what, n_tok, emul_launches - l0, ry, rs);
    free(x), free(dt), free(yc), free(yg), free(st), free(stc), free(par), free(rows);
    return fmax(ry, rs);
}

static double gdn_case(struct backend *cpu, const rc_case *rc, bool chunked)
{
    int NK = rc->h, NV = rc->p, DK = rc->n, DV = rc->g, n_tok = rc_rows(rc, NULL, NULL);
    int ldx = 2 * NK * DK + NV * DV, vdim = NV * DK * DV, n_seq = 4;
    size_t nx = (size_t)n_tok * ldx, nab = (size_t)n_tok * 2 * NV, ny = (size_t)n_tok * NV * DV;
    size_t nst = (size_t)n_seq * vdim;
    float *x = (float *)malloc(nx * 4), *ab = (float *)malloc(nab * 4), *st = (float *)malloc(nst * 4);
    float *stc = (float *)malloc(nst * 4), *yc = (float *)malloc(ny * 4), *yg = (float *)malloc(ny * 4);
    float *par = (float *)malloc((size_t)2 * NV * 4);
    int32_t *meta = (int32_t *)malloc((size_t)2 * n_tok * 4);
    rc_rows(rc, meta, meta + n_tok);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    for (int i = 0; i < n_tok; i++)
        for (int h = 0; h < NV; h++) {
            ab[(size_t)i * 2 * NV + h] = frnd(-3.0f, 3.0f);
            ab[(size_t)i * 2 * NV + NV + h] = rc->slow ? frnd(-5.0f, -1.0f) : frnd(-3.0f, 3.0f);
        }
    for (size_t i = 0; i < nst; i++)
        st[i] = stc[i] = frnd(-0.5f, 0.5f);
    for (int h = 0; h < NV; h++) {
        par[h] = rc->slow ? frnd(-3.0f, -1.0f) : frnd(-1.0f, 1.0f);
        par[NV + h] = frnd(-1.0f, 1.0f);
    }
    struct tensor ta, td;
    int64_t shape[1] = {NV};
    tensor_init(&ta, DTYPE_F32, par, 1, shape);
    tensor_init(&td, DTYPE_F32, par + NV, 1, shape);
    struct gdn_params p = {NK, NV, DK, DV, &ta, &td};
    struct kv_layer kv = {NULL, stc, 0, vdim, DTYPE_F32};
    struct kv_rows kr = {};
    kr.pos = meta;
    kr.state = meta + n_tok;
    cpu->ops->gated_delta(cpu, yc, NV * DV, x, ldx, ab, 2 * NV, &p, &kv, &kr, n_tok);
    struct err e = {};
    if (backend_sync(cpu, &e) < 0)
        exit(1);
    g_cu.chunked = chunked;
    struct kv_layer gkv = {NULL, st, 0, vdim, DTYPE_F32};
    long l0 = emul_launches;
    for (int c = 0; c < 2; c++) {
        int r0 = c ? rc->cut : 0, m = rc->cut > 0 ? (c ? n_tok - rc->cut : rc->cut) : (c ? 0 : n_tok);
        if (m <= 0)
            continue;
        struct kv_rows gkr = {};
        gkr.pos = meta + r0;
        gkr.state = meta + n_tok + r0;
        cu_gated_delta(&g_cu.be, yg + (size_t)r0 * NV * DV, NV * DV, x + (size_t)r0 * ldx, ldx,
                       ab + (size_t)r0 * 2 * NV, 2 * NV, &p, &gkv, &gkr, m);
    }
    if (g_cu.err_rc) {
        printf("gdn %s: %s\n", rc->what, g_cu.err_msg);
        exit(1);
    }
    double ry = rel_err(yc, yg, ny), rs = rel_err(stc, st, nst);
    printf("gated_delta %s, %s: %d rows, %ld launches, rel err y %.2e, state %.2e\n",
           chunked ? "chunked" : "recurrent", rc->what, n_tok, emul_launches - l0, ry, rs);
    free(x), free(ab), free(st), free(stc), free(yc), free(yg), free(par), free(meta);
    return fmax(ry, rs);
}

int main(int argc, char **argv)
{
    /* the cases of tests/test_cuda.c */
    static const rc_case ssd[] = {
        {"one prefill of 300 rows", {{0, 300}}, 0, true, 8, 16, 64, 2},
        {"517 rows after a carried state, cut at 150", {{1, 517}}, 150, true, 4, 64, 128, 1},
        {"chunks beside decode rows and short runs",
         {{0, 200}, {1, 1}, {2, 1}, {3, 75}, {1, 1}, {0, 33}, {2, 31}}, 0, true, 6, 10, 33, 3},
        {"head_dim 128, d_state 256", {{2, 130}, {3, 64}, {2, 1}}, 100, false, 2, 128, 256, 1},
        {"a sequence's runs with another's between", {{0, 100}, {1, 40}, {0, 100}, {1, 1}, {0, 1}},
         0, true, 4, 32, 16, 2},
        {"1000 rows of head_dim 7", {{1, 1000}}, 0, true, 3, 7, 16, 1},
        {"strong decays", {{3, 257}, {0, 64}}, 0, false, 4, 16, 32, 2},
        {"y over x", {{1, 150}, {2, 1}, {0, 90}}, 0, true, 4, 16, 32, 2, true},
        {"short runs only (no chunk)", {{0, 20}, {1, 20}, {2, 1}, {3, 10}}, 0, true, 4, 16, 32, 2, false},
        {"head_dim 130 (the recurrence)", {{0, 70}}, 0, true, 2, 130, 16, 1},
    };
    static const rc_case gdn[] = {
        {"chunks beside decode rows, cut at 120", {{0, 200}, {1, 1}, {2, 1}, {1, 70}}, 120, false, 2, 4, 32, 100},
        {"Qwen3-Next's head, 300 rows after a carried state", {{1, 300}}, 129, true, 1, 2, 128, 128},
        {"short runs between chunks",
         {{3, 40}, {0, 31}, {2, 96}, {0, 1}, {3, 1}, {2, 33}}, 0, true, 2, 2, 64, 48},
        {"k_dim 256", {{0, 100}, {1, 1}}, 0, true, 1, 1, 256, 64},
        {"a sequence's runs with another's between", {{1, 64}, {0, 50}, {1, 65}}, 0, false, 1, 3, 32, 32},
        {"1000 rows", {{3, 1000}}, 0, true, 1, 1, 32, 40},
        {"k_dim 16, as the golden fixtures", {{2, 90}, {1, 33}}, 50, true, 2, 4, 16, 16},
        {"short runs only (no chunk)", {{0, 20}, {1, 20}, {2, 1}, {3, 10}}, 0, true, 2, 4, 32, 32},
        {"k_dim 20 (the recurrence)", {{0, 80}}, 0, true, 1, 2, 20, 32},
    };
    const char *only = argc > 1 ? argv[1] : "";
    struct backend *cpu = NULL;
    struct err e = {};
    if (backend_cpu_new(&cpu, 1, "scalar", NULL, &e) < 0)
        return 1;
    g_cu.be.impl = &g_cu;
    double worst = 0;
    for (int chunked = 1; chunked >= 0; chunked--) {
        if (!*only || strcmp(only, "ssd") == 0)
            for (size_t c = 0; c < sizeof ssd / sizeof ssd[0]; c++)
                worst = fmax(worst, ssd_case(cpu, &ssd[c], chunked));
        if (!*only || strcmp(only, "gdn") == 0)
            for (size_t c = 0; c < sizeof gdn / sizeof gdn[0]; c++)
                worst = fmax(worst, gdn_case(cpu, &gdn[c], chunked));
    }
    printf("worst rel err %.2e: %s\n", worst, worst <= 1e-4 ? "ok" : "FAIL");
    backend_free(cpu);
    free(g_cu.rscr);
    return worst <= 1e-4 ? 0 : 1;
}
