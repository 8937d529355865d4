/*
 * bench_linear: throughput of the CPU backend's linear op (never linked into
 * the product).
 *
 *   membw    streaming read of a 1 GiB buffer on all threads (the roofline
 *            for decode: a matvec must stream every weight byte once)
 *   matvec   n_tok = 1 over a rotating set of weight matrices whose total
 *            size (>= 1.5 GiB) defeats every cache level; GB/s counts weight
 *            storage bytes (codes + scales + biases for quantized)
 *   prefill  n_tok = 4..512 on one matrix (BENCH_PF_TOK=N: N alone; BENCH_PF_SHAPE=OUTxIN:
 *            bf16 of that shape); GFLOP/s = 2 n_tok in out / t
 *   q / ql2  matvec of every quantized mode and bit width (affine 2-8 bit,
 *            mxfp4, mxfp8, nvfp4) on 10240x2560 and 2560x10240 from DRAM,
 *            or 64x4096 from L2 (BENCH_Q=q4g64,q8g64 restricts the list)
 *
 * Build (from the repo root, after building the library in build/):
 *   gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc dev/kernels/bench_linear.c build/libmlxcel_lib.a \
 *       $(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd libcurl) \
 *       -o /tmp/bench_linear -lpthread -lm -ldl
 *   /tmp/bench_linear [threads] [isa] [bw,mv,l2,pf,at,q,ql2]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "kernels/backend.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cputime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ---- memory bandwidth ----

struct bw_ctx {
    const uint8_t *buf;
    size_t n;
    double sink[64];
};

/* 16-byte vectors (GCC vector extension, SSE2 baseline): 2 loads per cycle
 * read far more than one core's share of DRAM bandwidth. */
typedef long long v2i64 __attribute__((vector_size(16)));

static void bw_task(void *arg, int ith, int nth)
{
    struct bw_ctx *c = arg;
    long lo, hi;
    tpool_range((long)(c->n / 4096), ith, nth, &lo, &hi);
    v2i64 a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0;
    for (const uint8_t *p = c->buf + lo * 4096; p < c->buf + hi * 4096; p += 64) {
        a0 += *(const v2i64 *)p;
        a1 += *(const v2i64 *)(p + 16);
        a2 += *(const v2i64 *)(p + 32);
        a3 += *(const v2i64 *)(p + 48);
    }
    a0 += a1 + a2 + a3;
    c->sink[ith] = (double)(a0[0] + a0[1]);
}

static double membw(struct tpool *pool)
{
    size_t n = (size_t)1 << 30;
    uint8_t *buf = aligned_alloc(4096, n);
    memset(buf, 1, n);
    struct bw_ctx c = {buf, n, {0}};
    double best = 0;
    for (int it = 0; it < 5; it++) {
        double t0 = now();
        tpool_run(pool, bw_task, &c);
        double gbs = n / (now() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
}

// ---- weights ----

struct wset {
    struct tensor *w;
    int n;
    size_t bytes_each;
};

static uint64_t g_rng = 88172645463325252ull;

static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)g_rng;
}

/* Quantization of a benchmark matrix: bits 0 = float. */
struct qspec {
    int bits, group;
    enum qmode mode;
};

/* dt F32/F16/BF16, or quantized per q (affine: bf16 scales/biases; fp
 * modes: U8 scales near 1). Codes are random bits. */
static struct tensor wmake_q(enum dtype dt, struct qspec q, int out, int in)
{
    struct tensor t;
    int64_t shape[2] = {out, in};
    int qbits = q.bits;
    size_t row = qbits ? (size_t)in * qbits / 8 : (size_t)in * dtype_size(dt);
    uint8_t *d = aligned_alloc(64, (row * out + 63) / 64 * 64);
    for (size_t i = 0; i < row * out / 4; i++)
        ((uint32_t *)d)[i] = rnd();
    if (dt == DTYPE_BF16 || dt == DTYPE_F16) /* keep values finite and small */
        for (size_t i = 0; i < row * out / 2; i++)
            ((uint16_t *)d)[i] = (uint16_t)(dt == DTYPE_BF16 ? 0x3c00 | (rnd() & 0x80ff)
                                                             : 0x2000 | (rnd() & 0x83ff));
    if (dt == DTYPE_F32)
        for (size_t i = 0; i < row * out / 4; i++)
            ((float *)d)[i] = (float)(rnd() % 1000) * 1e-5f;
    tensor_init(&t, qbits ? DTYPE_U32 : dt, d, 2, shape);
    if (qbits) {
        t.stride[0] = (int64_t)in * qbits / 32;
        t.qbits = qbits;
        t.qgroup = q.group;
        t.qmode = q.mode;
        size_t ng = (size_t)out * in / q.group;
        if (q.mode == QMODE_AFFINE) {
            t.qsdtype = DTYPE_BF16;
            uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
            for (size_t i = 0; i < ng; i++) {
                s[i] = 0x3c00;
                b[i] = 0xbc00;
            }
            t.qscales = s;
            t.qbiases = b;
        } else {
            t.qsdtype = DTYPE_U8;
            uint8_t *s = malloc(ng);
            for (size_t i = 0; i < ng; i++)
                s[i] = q.mode == QMODE_NVFP4 ? 0x30 : 120;
            t.qscales = s;
            t.qbiases = NULL;
        }
    }
    return t;
}

/* dt F32/F16/BF16, or qbits 4/8 with group 64 and bf16 scales. */
static struct tensor wmake(enum dtype dt, int qbits, int out, int in)
{
    return wmake_q(dt, (struct qspec){qbits, 64, QMODE_AFFINE}, out, in);
}

static struct wset wset_make(enum dtype dt, struct qspec q, int out, int in, size_t min_total)
{
    struct wset s;
    struct tensor t0 = wmake_q(dt, q, out, in);
    s.bytes_each = tensor_storage_bytes(&t0);
    s.n = (int)((min_total + s.bytes_each - 1) / s.bytes_each);
    s.n = s.n > 0 ? s.n : 1;
    s.w = calloc((size_t)s.n, sizeof *s.w);
    s.w[0] = t0;
    for (int i = 1; i < s.n; i++)
        s.w[i] = wmake_q(dt, q, out, in);
    return s;
}

static void wset_free(struct wset *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->w[i].data);
        free((void *)s->w[i].qscales);
        free((void *)s->w[i].qbiases);
    }
    free(s->w);
}

// ---- runs ----

static void bench_matvec_q(struct backend *be, const char *label, enum dtype dt, struct qspec q,
                           int out, int in, size_t total)
{
    struct wset s = wset_make(dt, q, out, in, total);
    /* the weights as the backend prepares them at load (repacked where it does:
     * MLXCEL_REPACK=0 keeps the stored layout); s.w keeps the allocations */
    struct tensor *pw = malloc((size_t)s.n * sizeof *pw);
    for (int i = 0; i < s.n; i++) {
        struct err e = {0};
        pw[i] = s.w[i];
        if (be->ops->prepare_weight(be, &pw[i], PREP_REPACK_BESIDE, &e) < 0) {
            fprintf(stderr, "%s\n", e.msg);
            exit(1);
        }
    }
    /* BENCH_TOK=N: N tokens a product (batched decode); GB/s then counts the
     * weights once per token, so N times the ceiling of one token is perfect */
    const int nt = getenv("BENCH_TOK") ? atoi(getenv("BENCH_TOK")) : 1;
    float *x = malloc((size_t)in * nt * 4), *y = malloc((size_t)out * nt * 4);
    for (size_t i = 0; i < (size_t)in * nt; i++)
        x[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < s.n; i++) /* warm-up: page in */
        be->ops->linear(be, y, (int)s.w[i].shape[0], x, &pw[i], NULL, nt);
    double best = 1e9;
    int inner = s.n == 1 ? 200 : 1;
    /* in-cache runs on one thread are timed in thread CPU time (the caller
     * runs the op itself): on a shared machine, time spent descheduled is
     * not the kernel's */
    bool cpu = s.n == 1 && be->n_threads == 1;
    for (int rep = 0; rep < (s.n == 1 ? 20 : 5); rep++) {
        double t0 = cpu ? cputime() : now();
        for (int k = 0; k < inner; k++)
            for (int i = 0; i < s.n; i++)
                be->ops->linear(be, y, (int)s.w[i].shape[0], x, &pw[i], NULL, nt);
        double t = ((cpu ? cputime() : now()) - t0) / s.n / inner;
        best = t < best ? t : best;
    }
    printf("  matvec%s %-8s %5d x %-5d x%-3d %7.1f us  %6.1f GB/s\n", s.n == 1 ? "*" : " ", label, out,
           in, nt, best * 1e6, s.bytes_each * nt / best / 1e9);
    free(x);
    free(y);
    free(pw);
    wset_free(&s);
}

static void bench_matvec(struct backend *be, const char *label, enum dtype dt, int qbits, int out,
                         int in, size_t total)
{
    bench_matvec_q(be, label, dt, (struct qspec){qbits, 64, QMODE_AFFINE}, out, in, total);
}

/* Every quantized mode on the two shapes of a 2560-wide model's MLP. */
static void bench_quant(struct backend *be, size_t total)
{
    static const struct {
        const char *label;
        struct qspec q;
    } qs[] = {
        {"q2g64", {2, 64, QMODE_AFFINE}}, {"q3g64", {3, 64, QMODE_AFFINE}},
        {"q4g64", {4, 64, QMODE_AFFINE}}, {"q4g32", {4, 32, QMODE_AFFINE}},
        {"q5g64", {5, 64, QMODE_AFFINE}}, {"q6g64", {6, 64, QMODE_AFFINE}},
        {"q8g64", {8, 64, QMODE_AFFINE}}, {"mxfp4", {4, 32, QMODE_MXFP4}},
        {"mxfp8", {8, 32, QMODE_MXFP8}}, {"nvfp4", {4, 16, QMODE_NVFP4}},
    };
    const char *only = getenv("BENCH_Q");
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        if (only && !strstr(only, qs[i].label))
            continue;
        bench_matvec_q(be, qs[i].label, DTYPE_U32, qs[i].q, 10240, 2560, total);
        bench_matvec_q(be, qs[i].label, DTYPE_U32, qs[i].q, 2560, 10240, total);
    }
}

static void bench_prefill(struct backend *be, const char *label, enum dtype dt, int qbits,
                          int out, int in, int n_tok)
{
    const struct tensor w0 = wmake(dt, qbits, out, in);
    struct tensor w = w0; /* prepared as at load (FPAN, QG16 where the backend repacks) */
    struct err e = {0};
    if (be->ops->prepare_weight(be, &w, PREP_REPACK_BESIDE | PREP_MATRIX, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    float *x = malloc((size_t)in * n_tok * 4), *y = malloc((size_t)out * n_tok * 4);
    for (size_t i = 0; i < (size_t)in * n_tok; i++)
        x[i] = (float)(i % 7) * 0.1f;
    be->ops->linear(be, y, (int)w.shape[0], x, &w, NULL, n_tok);
    double best = 1e9;
    int reps = getenv("BENCH_REPS") ? atoi(getenv("BENCH_REPS")) : n_tok >= 128 ? 3 : 10;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now();
        be->ops->linear(be, y, (int)w.shape[0], x, &w, NULL, n_tok);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    printf("  prefill %-6s %5d x %-5d n_tok %4d  %8.2f ms  %6.1f GFLOP/s\n", label, out, in, n_tok,
           best * 1e3, 2.0 * n_tok * in * out / best / 1e9);
    free(x);
    free(y);
    free(w0.data);
    free((void *)w0.qscales);
    free((void *)w0.qbiases);
}

/* Attention: decode of n_seq sequences (1 query each at position n_ctx-1, their
 * cache blocks interleaved in the pool as a server's are) or prefill of one
 * sequence (n_tok from 0), nh query heads over nkv kv heads of hd. Decode
 * rotates over enough layers (>= 256 MiB of K and V) to run from DRAM. GB/s
 * counts the K and V bytes read; GFLOP/s counts 4 hd flops per (query, key).
 * BENCH_KV=f16|bf16 stores the cache in that type. */
static void bench_attn(struct backend *be, int n_seq, int n_tok, int n_ctx, int nh, int nkv,
                       int hd)
{
    const char *kvt = getenv("BENCH_KV");
    enum dtype dt = kvt && !strcmp(kvt, "f16") ? DTYPE_F16 : kvt && !strcmp(kvt, "bf16") ? DTYPE_BF16
                                                                                        : DTYPE_F32;
    size_t es = dtype_size(dt);
    int bs = 16, nblk = (n_ctx + bs - 1) / bs, n_rows = n_seq * n_tok;
    size_t nq = (size_t)n_rows * nh * hd, nk = (size_t)n_seq * nblk * bs * nkv * hd;
    int n_layer = n_tok == 1 ? (int)((256u << 20) / (2 * nk * es) + 1) : 1;
    float *q = malloc(nq * 4), *o = malloc(nq * 4);
    char *k = malloc(nk * es * n_layer), *v = malloc(nk * es * n_layer);
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < nk * n_layer; i++) {
        float a = (float)(i % 11) * 0.01f, b = (float)(i % 7) * 0.1f;
        if (dt == DTYPE_F32) {
            ((float *)k)[i] = a;
            ((float *)v)[i] = b;
        } else {
            ((uint16_t *)k)[i] = dt == DTYPE_F16 ? f32_to_f16(a) : f32_to_bf16(a);
            ((uint16_t *)v)[i] = dt == DTYPE_F16 ? f32_to_f16(b) : f32_to_bf16(b);
        }
    }
    int pos0 = n_ctx - n_tok, reps = n_tok == 1 ? 50 : 3;
    double best = 1e9;
    /* sequence s's block j is pool block j * n_seq + s */
    int32_t *pos = malloc((size_t)n_rows * 4), *slot = malloc((size_t)n_rows * 4);
    int32_t *tab = malloc((size_t)n_rows * 4), *end = malloc((size_t)n_rows * 4);
    int32_t *tables = malloc((size_t)n_seq * nblk * 4);
    for (int s = 0; s < n_seq; s++)
        for (int j = 0; j < nblk; j++)
            tables[s * nblk + j] = j * n_seq + s;
    for (int s = 0; s < n_seq; s++)
        for (int t = 0; t < n_tok; t++) {
            int i = s * n_tok + t, p = pos0 + t;
            pos[i] = p;
            slot[i] = tables[s * nblk + p / bs] * bs + p % bs;
            tab[i] = s * nblk;
            end[i] = n_ctx;
        }
    struct kv_rows rows = {pos, slot, tab, tables, end, bs};
    struct attn_params ap = {nh, nkv, hd, 0.088f, 0.0f, 0, NULL, 0};
    for (int r = 0; r < reps; r++) {
        struct kv_layer kv = {k + nk * es * (r % n_layer), v + nk * es * (r % n_layer), nkv * hd,
                              nkv * hd, dt};
        double t0 = now();
        be->ops->attention(be, o, nh * hd, q, nh * hd, &kv, &rows, n_rows, &ap);
        double t = now() - t0;
        best = t < best ? t : best;
    }
    double pairs = 0;
    for (int t = 0; t < n_tok; t++)
        pairs += n_seq * (pos0 + t + 1);
    double kv_bytes = 2.0 * n_seq * n_ctx * nkv * hd * es;
    printf("  attn    seqs %2d n_tok %4d n_ctx %5d heads %d/%d hd %3d  %8.3f ms  %6.1f GB/s(kv)"
           "  %6.1f GFLOP/s\n",
           n_seq, n_tok, n_ctx, nh, nkv, hd, best * 1e3, kv_bytes / best / 1e9,
           4.0 * hd * nh * pairs / best / 1e9);
    free(q);
    free(o);
    free(k);
    free(v);
    free(pos);
    free(slot);
    free(tab);
    free(end);
    free(tables);
}

/* Quantized modes in L2: 64 rows x 4096 inputs (about 128-256 KiB). */
static void bench_quant_l2(struct backend *be)
{
    static const struct {
        const char *label;
        struct qspec q;
    } qs[] = {
        {"q2g64", {2, 64, QMODE_AFFINE}}, {"q3g64", {3, 64, QMODE_AFFINE}},
        {"q4g64", {4, 64, QMODE_AFFINE}}, {"q5g64", {5, 64, QMODE_AFFINE}},
        {"q6g64", {6, 64, QMODE_AFFINE}}, {"q8g64", {8, 64, QMODE_AFFINE}},
        {"mxfp4", {4, 32, QMODE_MXFP4}}, {"mxfp8", {8, 32, QMODE_MXFP8}},
        {"nvfp4", {4, 16, QMODE_NVFP4}},
    };
    const char *only = getenv("BENCH_Q");
    /* BENCH_ROWS: rows of the in-cache matrix (default 64: L2; 1024 of 4-bit is in L3) */
    const int rows = getenv("BENCH_ROWS") ? atoi(getenv("BENCH_ROWS")) : 64;
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
        if (!only || strstr(only, qs[i].label))
            bench_matvec_q(be, qs[i].label, DTYPE_U32, qs[i].q, rows, 4096, 0);
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? atoi(argv[1]) : 0;
    const char *isa = argc > 2 ? argv[2] : NULL;
    const char *only = argc > 3 ? argv[3] : "";
    struct err e = {0};
    struct backend *be;
    struct tpool *pool;
    /* the library reads no environment (ADR 0056): MLXCEL_REPACK=0 is this lab's to pass on */
    struct backend_opts bo = BACKEND_OPTS_DEFAULT;
    bo.repack = !getenv("MLXCEL_REPACK") || strcmp(getenv("MLXCEL_REPACK"), "0") != 0;
    if (backend_cpu_new(&be, nth, isa, &bo, &e) < 0 || tpool_new(&pool, nth, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    printf("%s, %d threads\n", be->name, be->n_threads);
    if (!*only || strstr(only, "bw"))
        printf("  membw   %.1f GB/s (1 GiB streaming read)\n", membw(pool));
    tpool_free(pool);
    /* BENCH_MB: total MiB of rotating weights per matvec line (default 1536;
     * anything well past the LLC works, 256 makes a run 6x shorter) */
    size_t big = (size_t)(getenv("BENCH_MB") ? atoi(getenv("BENCH_MB")) : 1536) << 20;
    if (!*only || strstr(only, "mv")) {
        bench_matvec(be, "bf16", DTYPE_BF16, 0, 4096, 4096, big);
        bench_matvec(be, "f16", DTYPE_F16, 0, 4096, 4096, big);
        bench_matvec(be, "f32", DTYPE_F32, 0, 4096, 4096, big);
        bench_matvec(be, "q4g64", DTYPE_U32, 4, 4096, 4096, big);
        bench_matvec(be, "q8g64", DTYPE_U32, 8, 4096, 4096, big);
        bench_matvec(be, "bf16", DTYPE_BF16, 0, 14336, 4096, big);
        bench_matvec(be, "bf16", DTYPE_BF16, 0, 4096, 14336, big);
    }
    /* every quantized mode, from DRAM ("q") and from L2 ("ql2": 256 KiB-ish
     * weights, the compute ceiling, marked '*'); BENCH_Q=q4g64,mxfp4 picks */
    if (strstr(only, "q") && !strstr(only, "ql2"))
        bench_quant(be, big);
    if (strstr(only, "ql2"))
        bench_quant_l2(be);
    /* in-cache (L2) matvec: the compute ceiling of each kernel, marked '*' */
    if (strstr(only, "l2") && !strstr(only, "ql2")) {
        bench_matvec(be, "bf16", DTYPE_BF16, 0, 64, 4096, 0);
        bench_matvec(be, "f16", DTYPE_F16, 0, 64, 4096, 0);
        bench_matvec(be, "f32", DTYPE_F32, 0, 32, 4096, 0);
        bench_matvec(be, "q4g64", DTYPE_U32, 4, 256, 4096, 0);
        bench_matvec(be, "q8g64", DTYPE_U32, 8, 128, 4096, 0);
    }
    if (!*only || strstr(only, "pf")) {
        static const int toks[] = {4, 8, 16, 64, 512};
        /* BENCH_PF_TOK=N: bf16 at N tokens alone; BENCH_PF_SHAPE=OUTxIN: that shape (default
         * 4096x4096) */
        const int pt = getenv("BENCH_PF_TOK") ? atoi(getenv("BENCH_PF_TOK")) : 0;
        int po = 4096, pi = 4096;
        if (getenv("BENCH_PF_SHAPE") && (sscanf(getenv("BENCH_PF_SHAPE"), "%dx%d", &po, &pi) != 2 ||
                                         po < 1 || pi < 1)) {
            fprintf(stderr, "BENCH_PF_SHAPE: OUTxIN, e.g. 3840x1280\n");
            return 1;
        }
        for (int i = 0; i < 5; i++)
            bench_prefill(be, "bf16", DTYPE_BF16, 0, po, pi, pt ? pt : toks[i]);
        if (!pt) {
            bench_prefill(be, "f16", DTYPE_F16, 0, 4096, 4096, 512);
            bench_prefill(be, "f32", DTYPE_F32, 0, 4096, 4096, 512);
            bench_prefill(be, "q4g64", DTYPE_U32, 4, 4096, 4096, 512);
        }
    }
    if (!*only || strstr(only, "at")) {
        bench_attn(be, 1, 1, 512, 32, 8, 128);
        bench_attn(be, 1, 1, 4096, 32, 8, 128);
        bench_attn(be, 1, 1, 4096, 32, 8, 64);
        bench_attn(be, 16, 1, 512, 32, 8, 64);
        bench_attn(be, 16, 1, 512, 32, 32, 80);
        bench_attn(be, 1, 512, 512, 32, 8, 128);
        bench_attn(be, 1, 512, 512, 32, 32, 80); /* phi-2 prefill: one query head per kv head */
    }
    backend_free(be);
    return 0;
}
