/*
 * backend_cuda: struct backend_ops on an NVIDIA GPU (backend.h, ADR 0021):
 * lifetime, memory, weights, errors, and the plugin's one exported symbol.
 *
 * Memory is device memory (cudaMalloc, never managed memory). upload copies
 * from pageable host memory (the runtime stages it, so the caller may reuse
 * its buffer at once), download waits for the copy (a large one, the logits,
 * through a pinned staging buffer allocated once), copy is device to
 * device; all run on the backend's one stream, in order with the ops.
 * prepare_weight uploads each weight once at load (data, and scales/biases
 * of quantized weights) in its stored layout and points the view at the
 * device copy; the backend frees those copies when it is destroyed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend_plugin.h"
#include "cuda_impl.h"

// ---- errors and scratch ----

void cu_fail(struct cuda_backend *c, const char *what, cudaError_t rc)
{
    if (c->err_rc)
        return;
    c->err_rc = rc == cudaErrorMemoryAllocation ? -ERR_NOMEM : -ERR_INTERNAL;
    snprintf(c->err_msg, sizeof c->err_msg, "cuda backend: %s: %s", what, cudaGetErrorString(rc));
}

bool cu_not_capturable(struct cuda_backend *c, const char *what)
{
    if (!c->capturing)
        return false;
    if (!c->cap_bad) {
        c->cap_bad = true;
        cu_fail(c, what, cudaErrorStreamCaptureUnsupported);
    }
    return true;
}

bool cu_check(struct cuda_backend *c, const char *what)
{
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        cu_fail(c, what, rc);
    return c->err_rc == 0;
}

/* Scratch is never recorded into a graph: a later growth would free what the graph names. */
float *cu_scratch(struct cuda_backend *c, size_t n)
{
    if (cu_not_capturable(c, "scratch in a graph"))
        return NULL;
    if (n > c->scr_cap) {
        cudaFree(c->scr);
        c->scr = NULL;
        c->scr_cap = 0;
        cudaError_t rc = cudaMalloc(&c->scr, n * sizeof(float));
        if (rc != cudaSuccess) {
            c->scr = NULL;
            cu_fail(c, "scratch", rc);
            return NULL;
        }
        c->scr_cap = n;
    }
    return c->scr;
}

int32_t *cu_iscratch(struct cuda_backend *c, size_t n)
{
    if (cu_not_capturable(c, "scratch in a graph"))
        return NULL;
    if (n > c->iscr_cap) {
        cudaFree(c->iscr);
        c->iscr = NULL;
        c->iscr_cap = 0;
        cudaError_t rc = cudaMalloc(&c->iscr, (n + 256) * sizeof(int32_t));
        if (rc != cudaSuccess) {
            c->iscr = NULL;
            cu_fail(c, "scratch", rc);
            return NULL;
        }
        c->iscr_cap = n + 256;
    }
    return c->iscr;
}

// ---- memory ----

static int cuda_buf_alloc(struct backend *be, size_t bytes, void **out, struct err *e)
{
    struct cuda_backend *c = cu_of(be);
    cudaError_t rc = cudaMalloc(out, bytes ? bytes : 64);
    if (rc != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        *out = NULL;
        return err_setf(e, ERR_NOMEM, "cuda:%d: cannot allocate %.2f GiB of device memory "
                        "(%.2f GiB free of %.2f GiB)", c->dev, bytes / 1073741824.0,
                        fr / 1073741824.0, tot / 1073741824.0);
    }
    return 0;
}

static void cuda_buf_free(struct backend *be, void *p)
{
    (void)be;
    if (p)
        cudaFree(p);
}

static void cuda_upload(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || !bytes || cu_not_capturable(c, "upload in a graph"))
        return;
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st);
    if (rc != cudaSuccess)
        cu_fail(c, "upload", rc);
}

/* Downloads from this size on go through the pinned staging buffer: one DMA at full speed
 * and a host copy, where a pageable copy is staged by the driver in small pieces. */
#define PIN_MIN_BYTES ((size_t)64 << 10)

/* The pinned staging buffer of at least bytes (allocated on the first large download, so the
 * logits of every later step reuse it), or NULL: copy directly. */
static void *pinned(struct cuda_backend *c, size_t bytes)
{
    if (bytes < PIN_MIN_BYTES)
        return NULL;
    if (bytes > c->pin_cap) {
        cudaFreeHost(c->pin);
        c->pin = NULL;
        c->pin_cap = 0;
        if (cudaMallocHost(&c->pin, bytes) != cudaSuccess) {
            cudaGetLastError();
            c->pin = NULL;
            return NULL;
        }
        c->pin_cap = bytes;
    }
    return c->pin;
}

static void cuda_download(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || !bytes || cu_not_capturable(c, "download in a graph"))
        return;
    void *pin = pinned(c, bytes);
    cudaError_t rc = cudaMemcpyAsync(pin ? pin : dst, src, bytes, cudaMemcpyDeviceToHost, c->st);
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(c->st);
    if (rc != cudaSuccess)
        cu_fail(c, "download", rc);
    else if (pin)
        memcpy(dst, pin, bytes);
}

static void cuda_copy(struct backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || !bytes)
        return;
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st);
    if (rc != cudaSuccess)
        cu_fail(c, "copy", rc);
}

static int cuda_sync(struct backend *be, struct err *e)
{
    struct cuda_backend *c = cu_of(be);
    cudaError_t rc = cudaStreamSynchronize(c->st);
    if (rc != cudaSuccess)
        cu_fail(c, "sync", rc);
    int r = c->err_rc;
    if (r)
        err_setf(e, -r, "%s", c->err_msg);
    c->err_rc = 0;
    return r;
}

// ---- weights ----

void cu_wmat_from(struct cu_wmat *m, const struct tensor *w)
{
    int nd = w->ndim;
    memset(m, 0, sizeof *m);
    m->data = (const uint8_t *)w->data;
    m->dt = w->dtype;
    m->in = (int)w->shape[nd - 1];
    m->out = 1;
    for (int d = 0; d < nd - 1; d++)
        m->out *= (int)w->shape[d];
    int64_t row_elems = nd >= 2 ? w->stride[nd - 2] : tensor_row_storage(w);
    m->row_bytes = (size_t)row_elems * dtype_size(w->dtype);
    if (w->qbits) {
        m->qbits = w->qbits;
        m->qgroup = w->qgroup;
        m->qmode = w->qmode;
        m->qsdt = w->qsdtype;
        m->qs = (const uint8_t *)w->qscales;
        m->qb = w->qmode == QMODE_AFFINE ? (const uint8_t *)w->qbiases : NULL;
        m->qrow_bytes = (size_t)(m->in / m->qgroup) * dtype_size(w->qsdtype);
    }
}

/* A device copy of bytes at src, owned by the backend (freed at destroy). */
static int weight_upload(struct cuda_backend *c, const void *src, size_t bytes, void **out,
                         const char *name, struct err *e)
{
    struct cu_alloc *a = (struct cu_alloc *)calloc(1, sizeof *a);
    if (!a)
        return err_setf(e, ERR_NOMEM, "cuda backend: out of memory");
    int rc = cuda_buf_alloc(&c->be, bytes, &a->p, e);
    if (rc < 0) {
        free(a);
        return err_prefix(e, "weight %s: ", name ? name : "?");
    }
    a->next = c->weights;
    c->weights = a;
    cudaError_t cr = cudaMemcpy(a->p, src, bytes, cudaMemcpyHostToDevice);
    if (cr != cudaSuccess)
        return err_setf(e, ERR_INTERNAL, "cuda backend: uploading %s: %s", name ? name : "?",
                        cudaGetErrorString(cr));
    *out = a->p;
    return 0;
}

static int cuda_prepare_weight(struct backend *be, struct tensor *w, unsigned flags, struct err *e)
{
    struct cuda_backend *c = cu_of(be);
    (void)flags; /* the host copy stays mapped: not measured on a GPU yet whether to drop it */
    struct cu_wmat m;
    cu_wmat_from(&m, w);
    void *d;
    int rc;
    /* every row [out] of its stride, the last one only as long as a row's storage */
    size_t bytes = (size_t)(m.out - 1) * m.row_bytes +
                   (size_t)tensor_row_storage(w) * dtype_size(w->dtype);
    if ((rc = weight_upload(c, w->data, bytes, &d, w->name, e)) < 0)
        return rc;
    w->data = d;
    if (!w->qbits)
        return 0;
    size_t sb = (size_t)m.out * m.qrow_bytes;
    if ((rc = weight_upload(c, w->qscales, sb, &d, w->name, e)) < 0)
        return rc;
    w->qscales = d;
    if (m.qb) {
        if ((rc = weight_upload(c, w->qbiases, sb, &d, w->name, e)) < 0)
            return rc;
        w->qbiases = d;
    }
    return 0;
}

// ---- lifetime ----

static void cuda_destroy(struct backend *be)
{
    struct cuda_backend *c = cu_of(be);
    cudaStreamSynchronize(c->st);
    for (struct cu_alloc *a = c->weights, *n; a; a = n) {
        n = a->next;
        cudaFree(a->p);
        free(a);
    }
    for (struct cu_xtab *t = c->xtabs, *n; t; t = n) {
        n = t->next;
        cudaFree(t->dev);
        free(t);
    }
    cudaFree(c->scr);
    cudaFree(c->iscr);
    cudaFree(c->qi_x);
    cudaFree(c->rscr);
    free(c->h_off);
    cudaFreeHost(c->pin);
    if (c->blas)
        cublasDestroy(c->blas);
    cudaStreamDestroy(c->st);
    free(c);
}

/* An entry of the table that first launches the op fuse.cu holds back (cu_flush), so the
 * ops run in the order they were issued. */
template <typename F, F fn>
struct flushed;
template <typename R, typename... A, R (*fn)(struct backend *, A...)>
struct flushed<R (*)(struct backend *, A...), fn> {
    static R call(struct backend *be, A... a)
    {
        cu_flush(cu_of(be));
        return fn(be, a...);
    }
};
#define FLUSHED(fn) flushed<decltype(&fn), &fn>::call

/* axpy, the norms, rope and kv_store go through fuse.cu (ADR 0138) */
static const struct backend_ops k_cuda_ops = {
    /* .buf_alloc = */ FLUSHED(cuda_buf_alloc),
    /* .buf_free = */ FLUSHED(cuda_buf_free),
    /* .upload = */ FLUSHED(cuda_upload),
    /* .download = */ FLUSHED(cuda_download),
    /* .copy = */ FLUSHED(cuda_copy),
    /* .prepare_weight = */ FLUSHED(cuda_prepare_weight),
    /* .sync = */ FLUSHED(cuda_sync),
    /* .linear = */ FLUSHED(cu_linear),
    /* .linear_batch = */ FLUSHED(cu_linear_batch),
    /* .embed = */ FLUSHED(cu_embed),
    /* .rmsnorm = */ cu_fuse_rmsnorm,
    /* .layernorm = */ cu_fuse_layernorm,
    /* .rope = */ cu_fuse_rope,
    /* .kv_store = */ cu_fuse_kv_store,
    /* .attention = */ FLUSHED(cu_attention),
    /* .act = */ FLUSHED(cu_act),
    /* .glu = */ FLUSHED(cu_glu),
    /* .glu_clamped = */ FLUSHED(cu_glu_clamped),
    /* .scale = */ FLUSHED(cu_scale),
    /* .softcap = */ FLUSHED(cu_softcap),
    /* .axpy = */ cu_fuse_axpy,
    /* .sigmoid_axpy = */ FLUSHED(cu_sigmoid_axpy),
    /* .gather = */ FLUSHED(cu_gather),
    /* .moe_route = */ FLUSHED(cu_moe_route),
    /* .moe_route_grouped = */ FLUSHED(cu_moe_route_grouped),
    /* .moe_group = */ FLUSHED(cu_moe_group),
    /* .linear_experts = */ FLUSHED(cu_linear_experts),
    /* .moe_combine = */ FLUSHED(cu_moe_combine),
    /* .mul = */ FLUSHED(cu_mul),
    /* .conv1d = */ FLUSHED(cu_conv1d),
    /* .selective_scan = */ FLUSHED(cu_selective_scan),
    /* .gated_delta = */ FLUSHED(cu_gated_delta),
    /* .ssd_scan = */ FLUSHED(cu_ssd_scan),
    /* .rglru = */ FLUSHED(cu_rglru),
    /* .destroy = */ FLUSHED(cuda_destroy),
    /* .graph_begin = */ FLUSHED(cu_graph_begin),
    /* .graph_end = */ FLUSHED(cu_graph_end),
    /* .graph_launch = */ FLUSHED(cu_graph_launch),
    /* .graph_free = */ FLUSHED(cu_graph_free),
    /* .linear_plan = */ NULL, /* the CPU's plans only (mlxcel inspect --kernels) */
    /* .xielu = */ FLUSHED(cu_xielu),
    /* .attn_temp = */ FLUSHED(cu_attn_temp),
    /* .moe_weight_input = */ FLUSHED(cu_moe_weight_input),
    /* .prepare_experts = */ FLUSHED(cu_prepare_experts),
};

/* Why no device can run: no device, a driver older than this runtime, or another error. */
static int device_count(int *n, struct err *e)
{
    cudaError_t rc = cudaGetDeviceCount(n);
    if (rc == cudaSuccess && *n > 0)
        return 0;
    if (rc == cudaErrorInsufficientDriver)
        return err_setf(e, ERR_UNSUPPORTED, "cuda: the NVIDIA driver is too old for CUDA %d.%d",
                        CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    if (rc == cudaSuccess || rc == cudaErrorNoDevice)
        return err_setf(e, ERR_UNSUPPORTED, "cuda: no CUDA device found");
    return err_setf(e, ERR_UNSUPPORTED, "cuda: cannot query devices: %s", cudaGetErrorString(rc));
}

static int cuda_create(struct backend **out, int dev, const struct backend_opts *o, struct err *e)
{
    int n = 0, rc;
    *out = NULL;
    if ((rc = device_count(&n, e)) < 0)
        return rc;
    if (dev >= n)
        return err_setf(e, ERR_ARG, "cuda:%d: there are only %d CUDA device(s)", dev, n);
    cudaError_t cr = cudaSetDevice(dev);
    if (cr != cudaSuccess)
        return err_setf(e, ERR_UNSUPPORTED, "cuda:%d: %s", dev, cudaGetErrorString(cr));
    struct cuda_backend *c = (struct cuda_backend *)calloc(1, sizeof *c);
    if (!c)
        return err_setf(e, ERR_NOMEM, "cuda backend: out of memory");
    c->dev = dev;
    if ((cr = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        return err_setf(e, ERR_UNSUPPORTED, "cuda:%d: %s", dev, cudaGetErrorString(cr));
    }
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(c->blas, c->st) != CUBLAS_STATUS_SUCCESS) {
        cuda_destroy(&c->be);
        return err_setf(e, ERR_UNSUPPORTED, "cuda:%d: cannot initialize cuBLAS", dev);
    }
    /* f32 products stay f32 (no TF32): the golden tolerance is set by the CPU */
    cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
    snprintf(c->name, sizeof c->name, "cuda:%d", dev);
    c->be.ops = &k_cuda_ops;
    c->be.name = c->name;
    c->be.kv_dtypes = 1u << DTYPE_F32 | 1u << DTYPE_F16 | 1u << DTYPE_BF16;
    c->be.n_threads = 1;
    c->be.fused_moe = o->fused_moe;
    /* opt-in: no faster inside the decode graphs on the H200 (docs/benchmarks.md) */
    c->pdl = o->cuda_pdl;
    /* on from 12k rows a launch: the H100's Llama-3.1-8B shape (8 layers) decodes 803 / 779
     * t/s without, 936 with (ADR 0026) */
    c->qi = o->cuda_qi;
    c->qi_min_rows = o->cuda_qi_min_rows;
    /* its prepared x lives outside the scratch, which a decode graph never records */
    if (c->qi && cudaMalloc(&c->qi_x, cu_qi_x_bytes()) != cudaSuccess) {
        cudaGetLastError();
        c->qi_x = NULL;
        c->qi = false;
    }
    c->attn_split = o->cuda_attn_split;
    c->mma = o->cuda_mma;
    c->mmq = o->cuda_mmq;
    c->moe_dev = o->cuda_moe_dev;
    c->mma_max_tok = o->cuda_mma_max_tokens;
    c->chunked = o->cuda_chunked;
    if (cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        c->n_sm = 0;
    c->attn_flash = o->cuda_attn_flash;
    c->attn_fa2 = o->cuda_attn_fa2;
    cu_attn_decode_init(c);
    c->be.graphs = o->cuda_graphs;
    c->be.impl = c;
    *out = &c->be;
    return 0;
}

static int cuda_describe(char *buf, size_t cap, struct err *e)
{
    int n = 0, rc, drv = 0;
    if ((rc = device_count(&n, e)) < 0)
        return rc;
    cudaDriverGetVersion(&drv);
    size_t off = 0;
    for (int d = 0; d < n && off < cap; d++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess)
            continue;
        int w = snprintf(buf + off, cap - off, "cuda:%d: %s, %.1f GiB, sm_%d%d (driver CUDA %d.%d)\n",
                         d, p.name, p.totalGlobalMem / 1073741824.0, p.major, p.minor, drv / 1000,
                         drv % 1000 / 10);
        off += w > 0 ? (size_t)w : 0;
    }
    return n;
}

static const struct backend_plugin k_plugin = {BACKEND_PLUGIN_ABI, sizeof(struct backend_opts), "cuda",
                                               cuda_create, cuda_describe};

extern "C" __attribute__((visibility("default"))) const struct backend_plugin *
mlxcel_backend_plugin(void)
{
    return &k_plugin;
}
