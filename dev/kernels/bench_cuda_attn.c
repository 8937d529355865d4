/*
 * bench_cuda_attn: the CUDA backend's decode attention, flash-decoding (ADR 0105) against ADR
 * 0028's cluster per query head (never linked into the product).
 *
 * For the Llama-3.1-8B (32 query heads, 8 KV heads, head_dim 128) and Llama-3.2-1B (32 / 8 / 64)
 * shapes, depths 512, 4096 and 16384, 1 and 16 rows (each row its own sequence at that depth,
 * paged in blocks of 16), F32 and F16 caches: attention() of one decode step timed over as
 * many layers' caches as a 32-layer model has (at most 32, fewer where they pass 4 GiB), so
 * the L2 serves little; microseconds a call and GB/s of K and V read (rows x depth x kv heads x
 * head_dim x 2 x element size a call), new / old, and the largest difference between the two
 * kernels' outputs over the largest output.
 *
 * Build and run (from the repo root, after configuring a build with -DMLXCEL_CUDA=ON):
 *   cmake --build build --target mlxcel-cuda bench_cuda_attn
 *   build/bench_cuda_attn            (libmlxcel-cuda.so beside it, or MLXCEL_CUDA_PLUGIN)
 *   build/bench_cuda_attn f16        (one cache type: f32, f16 or bf16)
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

static float frnd(float lo, float hi)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 11) & 0xffffff) / 16777216.0f;
}

struct shape {
    const char *name;
    int n_head, n_kv, hd;
};

#define BS 16
#define MAX_LAYERS 32

static void *dev_alloc(struct backend *be, size_t n)
{
    struct err e = {0};
    void *p = NULL;
    if (be->ops->buf_alloc(be, n, &p, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    return p;
}

/* One case on one backend: microseconds a call; its output of layer 0 into out. */
struct setup {
    int n_layer, rows, depth;
    void *k[MAX_LAYERS], *v[MAX_LAYERS];
    void *meta, *tables, *q, *o;
};

static void setup_make(struct backend *be, struct setup *s, const struct shape *sh, enum dtype dt,
                       int rows, int depth)
{
    struct err e = {0};
    const int kvd = sh->n_kv * sh->hd, qd = sh->n_head * sh->hd;
    const int nb = (depth + BS - 1) / BS;
    size_t es = dtype_size(dt), slots = (size_t)rows * nb * BS, layer = slots * kvd * es;
    int n_layer = (int)(((size_t)4 << 30) / (2 * layer));
    n_layer = n_layer < 1 ? 1 : n_layer > MAX_LAYERS ? MAX_LAYERS : n_layer;
    s->n_layer = n_layer;
    s->rows = rows;
    s->depth = depth;
    /* the same data for both kernels: random pieces of K and V repeated through every layer */
    g_rng = 0x9e3779b97f4a7c15ull;
    size_t chunk = ((size_t)1 << 24) + 4096; /* elements: not a multiple of a row */
    char *hk = malloc(chunk * es), *hv = malloc(chunk * es);
    for (size_t i = 0; i < chunk; i++) {
        dtype_store_f32(dt, hk, (int64_t)i, frnd(-1.0f, 1.0f));
        dtype_store_f32(dt, hv, (int64_t)i, frnd(-1.0f, 1.0f));
    }
    for (int l = 0; l < n_layer; l++) {
        s->k[l] = dev_alloc(be, layer);
        s->v[l] = dev_alloc(be, layer);
        for (size_t off = 0; off < layer; off += chunk * es) {
            size_t n = layer - off < chunk * es ? layer - off : chunk * es;
            be->ops->upload(be, (char *)s->k[l] + off, hk, n);
            be->ops->upload(be, (char *)s->v[l] + off, hv, n);
        }
        if (backend_sync(be, &e) < 0) { /* the runtime stages pageable uploads */
            fprintf(stderr, "upload: %s\n", e.msg);
            exit(1);
        }
    }
    free(hk);
    free(hv);
    /* row r: sequence r at position depth - 1, its blocks r * nb .. in order */
    int32_t *tab = malloc((size_t)rows * nb * sizeof *tab);
    for (int i = 0; i < rows * nb; i++)
        tab[i] = i;
    int32_t *meta = malloc((size_t)rows * 5 * sizeof *meta);
    for (int r = 0; r < rows; r++) {
        meta[r] = depth - 1;                                          /* pos */
        meta[rows + r] = r * nb * BS + (depth - 1);                   /* slot */
        meta[2 * rows + r] = r * nb;                                  /* table */
        meta[3 * rows + r] = depth;                                   /* seq_end */
        meta[4 * rows + r] = r;                                       /* state */
    }
    float *q = malloc((size_t)rows * qd * sizeof *q);
    for (size_t i = 0; i < (size_t)rows * qd; i++)
        q[i] = frnd(-1.0f, 1.0f);
    s->tables = dev_alloc(be, (size_t)rows * nb * sizeof *tab);
    s->meta = dev_alloc(be, (size_t)rows * 5 * sizeof *meta);
    s->q = dev_alloc(be, (size_t)rows * qd * sizeof *q);
    s->o = dev_alloc(be, (size_t)rows * qd * sizeof *q);
    be->ops->upload(be, s->tables, tab, (size_t)rows * nb * sizeof *tab);
    be->ops->upload(be, s->meta, meta, (size_t)rows * 5 * sizeof *meta);
    be->ops->upload(be, s->q, q, (size_t)rows * qd * sizeof *q);
    if (backend_sync(be, &e) < 0) {
        fprintf(stderr, "setup: %s\n", e.msg);
        exit(1);
    }
    free(tab);
    free(meta);
    free(q);
}

static void setup_free(struct backend *be, struct setup *s)
{
    for (int l = 0; l < s->n_layer; l++) {
        be->ops->buf_free(be, s->k[l]);
        be->ops->buf_free(be, s->v[l]);
    }
    be->ops->buf_free(be, s->tables);
    be->ops->buf_free(be, s->meta);
    be->ops->buf_free(be, s->q);
    be->ops->buf_free(be, s->o);
}

static void call(struct backend *be, const struct setup *s, const struct shape *sh, enum dtype dt,
                 int l)
{
    const int kvd = sh->n_kv * sh->hd, qd = sh->n_head * sh->hd;
    const int32_t *m = s->meta;
    struct kv_layer kv = {s->k[l], s->v[l], kvd, kvd, dt};
    struct kv_rows kr = {m, m + s->rows, m + 2 * s->rows, s->tables, m + 3 * s->rows, BS,
                         m + 4 * s->rows, NULL};
    struct attn_params ap = {sh->n_head, sh->n_kv, sh->hd, 1.0f / sqrtf((float)sh->hd), 0.0f, 0,
                             NULL, 0};
    be->ops->attention(be, s->o, qd, s->q, qd, &kv, &kr, s->rows, &ap);
}

/* Microseconds a call (all layers in turn, at least 50 ms of calls); layer 0's output in out. */
static double time_calls(struct backend *be, const struct setup *s, const struct shape *sh,
                         enum dtype dt, float *out)
{
    struct err e = {0};
    size_t no = (size_t)s->rows * sh->n_head * sh->hd;
    for (int l = 0; l < s->n_layer; l++)
        call(be, s, sh, dt, l);
    call(be, s, sh, dt, 0);
    be->ops->download(be, out, s->o, no * sizeof *out);
    if (backend_sync(be, &e) < 0) {
        fprintf(stderr, "attention: %s\n", e.msg);
        exit(1);
    }
    int reps = s->n_layer;
    double t;
    for (;;) {
        t = now();
        for (int i = 0; i < reps; i++)
            call(be, s, sh, dt, i % s->n_layer);
        backend_sync(be, &e);
        t = now() - t;
        if (t > 0.05 || reps > 100000)
            break;
        reps *= 4;
    }
    return t / reps * 1e6;
}

int main(int argc, char **argv)
{
    struct err e = {0};
    struct backend_opts bo = BACKEND_OPTS_DEFAULT, bo_old;
    bo.cuda_plugin = getenv("MLXCEL_CUDA_PLUGIN");
    bo_old = bo;
    bo_old.cuda_attn_flash = false;
    struct backend *gpu, *old;
    if (backend_new(&gpu, "cuda", 1, &bo, &e) < 0 || backend_new(&old, "cuda", 1, &bo_old, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    static const struct shape shapes[] = {{"8B", 32, 8, 128}, {"1B", 32, 8, 64}};
    static const int depths[] = {512, 4096, 16384}, batches[] = {1, 16};
    enum dtype dts[3] = {DTYPE_F32, DTYPE_F16};
    int n_dt = 2;
    if (argc > 1) {
        n_dt = 1;
        dts[0] = strcmp(argv[1], "f32") == 0 ? DTYPE_F32
                 : strcmp(argv[1], "bf16") == 0 ? DTYPE_BF16 : DTYPE_F16;
    }
    printf("%-5s %5s %4s %6s %7s | %9s %8s | %9s %8s | %6s %9s\n", "shape", "kv", "rows", "depth",
           "layers", "new us", "GB/s", "old us", "GB/s", "x", "diff");
    for (int di = 0; di < n_dt; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
                for (size_t pi = 0; pi < sizeof depths / sizeof depths[0]; pi++) {
                    const struct shape *sh = &shapes[si];
                    int rows = batches[bi], depth = depths[pi];
                    size_t no = (size_t)rows * sh->n_head * sh->hd;
                    float *a = malloc(no * sizeof *a), *b = malloc(no * sizeof *b);
                    struct setup sn, so;
                    setup_make(gpu, &sn, sh, dts[di], rows, depth);
                    double tn = time_calls(gpu, &sn, sh, dts[di], a);
                    setup_free(gpu, &sn);
                    setup_make(old, &so, sh, dts[di], rows, depth);
                    double to = time_calls(old, &so, sh, dts[di], b);
                    double mx = 0, md = 0;
                    for (size_t i = 0; i < no; i++) {
                        mx = fmax(mx, fabs(b[i]));
                        md = fmax(md, fabs((double)a[i] - b[i]));
                    }
                    double bytes = (double)rows * depth * sh->n_kv * sh->hd * 2 * dtype_size(dts[di]);
                    printf("%-5s %5s %4d %6d %7d | %9.1f %8.0f | %9.1f %8.0f | %6.2f %9.2e\n",
                           sh->name, dtype_name(dts[di]), rows, depth, so.n_layer, tn,
                           bytes / tn / 1e3, to, bytes / to / 1e3, to / tn, mx > 0 ? md / mx : md);
                    fflush(stdout);
                    setup_free(old, &so);
                    free(a);
                    free(b);
                }
    backend_free(old);
    backend_free(gpu);
    return 0;
}
