/*
 * bench_cuda_linear: the CUDA backend's decode GEMV against the device's copy
 * bandwidth (never linked into the product).
 *
 *   copy   device-to-device copy of 1 GiB through the backend's copy op:
 *          GB/s counting bytes read plus bytes written (the roofline of
 *          ADR 0021 and docs/benchmarks.md)
 *   gemv   linear() at n_tok = 1 (and 8) over a rotating set of copies of one
 *          weight shape, at least 1 GiB together so nothing is served from
 *          the 60 MB L2; GB/s counts weight storage (codes + scales +
 *          biases) per product; each row also checks one product against the
 *          CPU scalar backend (max |diff| / max |ref|)
 *
 * Build (from the repo root, after building build/ with -DMLXCEL_CUDA=ON):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc dev/kernels/bench_cuda_linear.c build/libmlxcel_lib.a \
 *       -o build/bench_cuda_linear -lm -lpthread -ldl
 *   build/bench_cuda_linear [BITS...]   (widths: 4 8 0 = bf16 by default; libmlxcel-cuda.so
 *                                        beside it, or MLXCEL_CUDA_PLUGIN;
 *                                        MLXCEL_CUDA_QI=0 / _QI_MIN_ROWS=N as the CLI's)
 *   build/bench_cuda_linear gemm [BITS...]
 *          the products of 16 to 2048 tokens on the Llama-3.2-1B and 3.1-8B shapes (affine, 4 bits
 *          by default) with the tensor-core product over the codes (mma.cu, ADR 0074) and
 *          with the decoded bf16 planes (cuda_mma off, ADR 0054): TFLOP/s, GB/s of weights
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/backend.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

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

struct shape {
    int out, in;
};

/* A host weight [out, in]: bf16 when bits == 0, else MLX affine with bf16 scales. */
static void make_weight(struct tensor *w, void *bufs[3], int out, int in, int bits, int group)
{
    int64_t shape[2] = {out, in};
    memset(bufs, 0, 3 * sizeof *bufs);
    if (!bits) {
        size_t n = (size_t)out * in;
        uint16_t *p = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            p[i] = f32_to_bf16(frnd(-1.0f, 1.0f));
        bufs[0] = p;
        tensor_init(w, DTYPE_BF16, p, 2, shape);
        return;
    }
    size_t words = (size_t)out * in / 32 * bits, ng = (size_t)out * (in / group);
    uint32_t *q = malloc(words * 4);
    uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
    for (size_t i = 0; i < words; i++)
        q[i] = rnd32() ^ (rnd32() << 21);
    for (size_t i = 0; i < ng; i++) {
        s[i] = f32_to_bf16(frnd(0.001f, 0.05f));
        b[i] = f32_to_bf16(frnd(-0.3f, 0.3f));
    }
    int64_t pshape[2] = {out, (int64_t)in * bits / 32};
    tensor_init(w, DTYPE_U32, q, 2, pshape);
    w->shape[1] = in;
    w->qbits = bits;
    w->qgroup = group;
    w->qmode = QMODE_AFFINE;
    w->qsdtype = DTYPE_BF16;
    w->qscales = s;
    w->qbiases = b;
    bufs[0] = q;
    bufs[1] = s;
    bufs[2] = b;
}

static size_t weight_bytes(int out, int in, int bits, int group)
{
    if (!bits)
        return (size_t)out * in * 2;
    return (size_t)out * in / 8 * bits + (size_t)out * (in / group) * 4;
}

static double copy_bw(struct backend *be)
{
    struct err e = {0};
    size_t n = (size_t)1 << 30;
    void *a, *b;
    if (be->ops->buf_alloc(be, n, &a, &e) < 0 || be->ops->buf_alloc(be, n, &b, &e) < 0)
        return 0;
    be->ops->copy(be, b, a, n);
    backend_sync(be, &e);
    double t = now();
    for (int i = 0; i < 10; i++)
        be->ops->copy(be, b, a, n);
    backend_sync(be, &e);
    t = now() - t;
    be->ops->buf_free(be, a);
    be->ops->buf_free(be, b);
    return 2.0 * n * 10 / t / 1e9;
}

/* GB/s of n_tok products over rotating copies; *rel: one product against the CPU. */
static double gemv_bw(struct backend *gpu, struct backend *cpu, struct shape sh, int bits, int n_tok,
                      double *rel)
{
    struct err e = {0};
    int group = 64;
    size_t wb = weight_bytes(sh.out, sh.in, bits, group);
    int n_copy = (int)(((size_t)1 << 30) / wb) + 1;
    n_copy = n_copy > 64 ? 64 : n_copy;
    struct tensor host, *dev = calloc((size_t)n_copy, sizeof *dev);
    void *bufs[3];
    make_weight(&host, bufs, sh.out, sh.in, bits, group);
    for (int i = 0; i < n_copy; i++) {
        dev[i] = host;
        if (gpu->ops->prepare_weight(gpu, &dev[i], 0, &e) < 0) {
            fprintf(stderr, "prepare: %s\n", e.msg);
            exit(1);
        }
    }
    size_t nx = (size_t)n_tok * sh.in, ny = (size_t)n_tok * sh.out;
    float *x = malloc(nx * 4), *yc = malloc(ny * 4), *yg = malloc(ny * 4);
    for (size_t i = 0; i < nx; i++)
        x[i] = frnd(-1.0f, 1.0f);
    void *dx, *dy;
    gpu->ops->buf_alloc(gpu, nx * 4, &dx, &e);
    gpu->ops->buf_alloc(gpu, ny * 4, &dy, &e);
    gpu->ops->upload(gpu, dx, x, nx * 4);
    /* check */
    cpu->ops->linear(cpu, yc, sh.out, x, &host, NULL, n_tok);
    gpu->ops->linear(gpu, dy, sh.out, dx, &dev[0], NULL, n_tok);
    gpu->ops->download(gpu, yg, dy, ny * 4);
    double mx = 0, md = 0;
    for (size_t i = 0; i < ny; i++) {
        mx = fmax(mx, fabs(yc[i]));
        md = fmax(md, fabs((double)yc[i] - yg[i]));
    }
    *rel = mx > 0 ? md / mx : md;
    /* time: warm-up, then reps products cycling through the copies */
    int reps = n_copy * 4 < 200 ? 200 : n_copy * 4;
    for (int i = 0; i < n_copy; i++)
        gpu->ops->linear(gpu, dy, sh.out, dx, &dev[i], NULL, n_tok);
    backend_sync(gpu, &e);
    double t = now();
    for (int i = 0; i < reps; i++)
        gpu->ops->linear(gpu, dy, sh.out, dx, &dev[i % n_copy], NULL, n_tok);
    if (backend_sync(gpu, &e) < 0) {
        fprintf(stderr, "gemv: %s\n", e.msg);
        exit(1);
    }
    t = now() - t;
    gpu->ops->buf_free(gpu, dx);
    gpu->ops->buf_free(gpu, dy);
    free(x);
    free(yc);
    free(yg);
    free(dev);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
    return (double)wb * reps / t / 1e9;
}

/* gemm mode: the tensor-core product over the codes against the decoded planes. */
static int gemm_main(struct backend *gpu, struct backend *cpu, const struct backend_opts *bo,
                     int argc, char **argv)
{
    struct err e = {0};
    struct backend_opts off = *bo;
    off.cuda_mma = false;
    struct backend *old;
    if (backend_new(&old, "cuda", 1, &off, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    static const struct shape shapes[] = {{2048, 2048}, {512, 2048},  {8192, 2048},
                                          {2048, 8192}, {4096, 4096}, {1024, 4096},
                                          {14336, 4096}, {4096, 14336}};
    static const int toks[] = {16, 64, 128, 256, 512, 2048};
    int bits[4] = {4};
    int n_bits = 1;
    if (argc > 1) {
        n_bits = 0;
        for (int i = 1; i < argc && n_bits < 4; i++)
            bits[n_bits++] = atoi(argv[i]);
    }
    printf("%-12s %4s %4s %6s %9s %9s %9s\n", "shape", "fmt", "tok", "path", "TFLOP/s", "GB/s",
           "rel err");
    for (int b = 0; b < n_bits; b++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t t = 0; t < sizeof toks / sizeof toks[0]; t++)
                for (int m = 0; m < 2; m++) {
                    double rel, bw = gemv_bw(m ? old : gpu, cpu, shapes[s], bits[b], toks[t], &rel);
                    double wb = (double)weight_bytes(shapes[s].out, shapes[s].in, bits[b], 64);
                    double tf = bw * 1e9 / wb * 2.0 * shapes[s].out * shapes[s].in * toks[t] / 1e12;
                    char nm[32], fm[8];
                    snprintf(nm, sizeof nm, "%dx%d", shapes[s].out, shapes[s].in);
                    snprintf(fm, sizeof fm, "q%d", bits[b]);
                    printf("%-12s %4s %4d %6s %9.1f %9.0f %9.2e\n", nm, fm, toks[t],
                           m ? "planes" : "mma", tf, bw, rel);
                    fflush(stdout);
                }
    backend_free(old);
    backend_free(cpu);
    backend_free(gpu);
    return 0;
}

int main(int argc, char **argv)
{
    struct backend *gpu, *cpu;
    struct err e = {0};
    /* the library reads no environment (ADR 0056): this lab passes the plugin path and the
     * integer GEMV switch on */
    struct backend_opts bo = BACKEND_OPTS_DEFAULT;
    bo.cuda_plugin = getenv("MLXCEL_CUDA_PLUGIN");
    bo.cuda_qi = !getenv("MLXCEL_CUDA_QI") || strcmp(getenv("MLXCEL_CUDA_QI"), "0") != 0;
    if (getenv("MLXCEL_CUDA_QI_MIN_ROWS"))
        bo.cuda_qi_min_rows = atoi(getenv("MLXCEL_CUDA_QI_MIN_ROWS"));
    bo.cuda_mma_max_tokens = 1 << 24; /* gemm mode measures the kernel at every size */
    if (backend_new(&gpu, "cuda", 1, &bo, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    if (backend_cpu_new(&cpu, 0, NULL, NULL, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "gemm") == 0)
        return gemm_main(gpu, cpu, &bo, argc - 1, argv + 1);
    double cbw = copy_bw(gpu);
    printf("copy: %.0f GB/s (read + write)\n", cbw);
    static const struct shape shapes[] = {
        {2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048},
        {14336, 4096}, {4096, 14336}, {128256, 4096},
    };
    int bits[8] = {4, 8, 0};
    size_t n_bits = 3;
    if (argc > 1) {
        n_bits = 0;
        for (int i = 1; i < argc && n_bits < 8; i++)
            bits[n_bits++] = atoi(argv[i]);
    }
    printf("%-14s %5s %4s %9s %7s %9s\n", "shape", "fmt", "tok", "GB/s", "% copy", "rel err");
    for (size_t b = 0; b < n_bits; b++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int nt = 1; nt <= 8; nt += 7) {
                if (nt > 1 && shapes[s].out != 14336)
                    continue;
                double rel, bw = gemv_bw(gpu, cpu, shapes[s], bits[b], nt, &rel);
                char nm[32], fm[8];
                snprintf(nm, sizeof nm, "%dx%d", shapes[s].out, shapes[s].in);
                snprintf(fm, sizeof fm, bits[b] ? "q%d" : "bf16", bits[b]);
                printf("%-14s %5s %4d %9.0f %6.1f%% %9.2e\n", nm, fm, nt, bw, 100 * bw / cbw, rel);
                fflush(stdout);
            }
    backend_free(cpu);
    backend_free(gpu);
    return 0;
}
