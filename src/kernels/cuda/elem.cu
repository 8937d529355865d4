/*
 * elem: norms and the elementwise ops on the GPU (backend.h), with the CPU
 * reference's arithmetic (backend_cpu.c): RMS x / sqrt(mean(x²) + eps) *
 * (w + w_off); layer norm with a two-pass mean and biased variance.
 *
 * Norms: one block per row, of about n / 2 threads (up to NORM_THREADS), a
 * block reduction (warp shuffles, then one warp over the per-warp partials). Elementwise ops: a 2-D grid,
 * x = columns (256 per block), y = rows (grid-stride).
 */
#include <math.h>

#include "cuda_impl.h"

#define NORM_THREADS 1024

/* The residual add y + s * x of axpy, in one rounding: the fused norm (cu_norm_res) and
 * axpy share it, so fusing them changes no bit. */
__device__ __forceinline__ float axpy_f(float y, float s, float x)
{
    return __fmaf_rn(s, x, y);
}

// ---- norms ----

/* Sum of v over the block (every thread gets it); red holds 32 floats. */
__device__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    v = cu_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[wid] = v;
    __syncthreads();
    float s = lane < (int)(blockDim.x / 32) ? red[lane] : 0.0f;
    return cu_warp_sum(s);
}

/* grid: one block per row r of n_rows = n_tok * per_tok. res non-NULL (per_tok 1, x the
 * residual stream h): x[r] += rs * res[r] first, each thread on the elements it normalizes
 * after (so no barrier is needed between). */
__global__ void norm_kernel(float *y, const float *x, int ld, const void *w, int wdt, size_t w_row,
                            float w_off, const void *b, int bdt, float eps, int per_tok, int n,
                            bool layer, float *h, const float *res, size_t ldres, float rs)
{
    __shared__ float red[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    int r = blockIdx.x;
    size_t off = (size_t)(r / per_tok) * ld + (size_t)(r % per_tok) * n;
    if (res) {
        float *hr = h + off;
        const float *rr = res + (size_t)r * ldres;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            hr[i] = axpy_f(hr[i], rs, rr[i]);
    }
    const float *xr = x + off;
    float *yr = y + off;
    size_t wo = w_row ? (size_t)(r % per_tok) * w_row : 0;
    float mean = 0.0f;
    if (layer) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            s += xr[i];
        mean = block_sum(s, red) / (float)n;
    }
    float q = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        q += (xr[i] - mean) * (xr[i] - mean);
    float a = 1.0f / sqrtf(block_sum(q, red) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (xr[i] - mean) * a * (cu_ld(w, wdt, wo + i) + w_off);
        yr[i] = b ? v + cu_ld(b, bdt, (size_t)i) : v;
    }
}

/* The norm, after the residual add h += rs * res when res is non-NULL (h == x, per_tok 1). */
static void norm_run(struct cuda_backend *c, float *y, const float *x, int ld, const struct tensor *w,
                     float w_off, const struct tensor *b, float eps, int n_tok, int per_tok, int n,
                     bool layer, float *h, const float *res, int ldres, float rs)
{
    int rows = n_tok * per_tok;
    if (c->err_rc || rows <= 0)
        return;
    /* one weight row per head when w holds per_tok rows of n */
    size_t w_row = per_tok > 1 && tensor_nelem(w) == (int64_t)per_tok * n ? (size_t)n : 0;
    /* about two elements a thread: each pass is one round of loads, not a chain of them */
    int threads = (n / 2 + 31) / 32 * 32;
    threads = threads < 32 ? 32 : threads > NORM_THREADS ? NORM_THREADS : threads;
    cu_launch(c, norm_kernel, dim3(rows), dim3(threads), y, x, ld, w->data, (int)w->dtype, w_row,
              w_off, b ? b->data : NULL, b ? (int)b->dtype : 0, eps, per_tok, n, layer, h, res,
              (size_t)ldres, rs);
    cu_check(c, res ? "residual add + norm" : "norm");
}

void cu_rmsnorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                float w_off, float eps, int n_tok, int per_tok, int n)
{
    norm_run(cu_of(be), y, x, ld, w, w_off, NULL, eps, n_tok, per_tok, n, false, NULL, NULL, 0,
             0.0f);
}

void cu_layernorm(struct backend *be, float *y, const float *x, int ld, const struct tensor *w,
                  float w_off, const struct tensor *b, float eps, int n_tok, int per_tok, int n)
{
    norm_run(cu_of(be), y, x, ld, w, w_off, b && tensor_is_present(b) ? b : NULL, eps, n_tok,
             per_tok, n, true, NULL, NULL, 0, 0.0f);
}

void cu_norm_res(struct cuda_backend *c, float *y, float *h, const float *res, int ldres, float rs,
                 int ld, const struct tensor *w, float w_off, const struct tensor *b, float eps,
                 int n_tok, int n, bool layer)
{
    norm_run(c, y, h, ld, w, w_off, b && tensor_is_present(b) ? b : NULL, eps, n_tok, 1, n, layer,
             h, res, ldres, rs);
}

// ---- elementwise ----

enum elem_op { EL_ACT, EL_GLU, EL_GLU_CLAMPED, EL_AXPY, EL_SIGMOID_AXPY, EL_GATHER, EL_SCALE,
               EL_SOFTCAP, EL_MUL, EL_XIELU, EL_ATTN_TEMP };

struct elem_args {
    int op, act;
    float *y;
    const float *x;
    const int32_t *idx;
    const float *g;
    const float *x2;
    size_t ldy, ldx, ldx2;
    float s, alpha;
    struct xielu_params xp;
    bool interleaved;
    int n_rows, n, div;
};

__device__ __forceinline__ float act_f(int act, float v)
{
    switch (act) {
    case ACT_GELU_TANH:
        return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case ACT_GELU_ERF:
        return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case ACT_RELU:
        return v > 0.0f ? v : 0.0f;
    case ACT_RELU2:
        return v > 0.0f ? v * v : 0.0f;
    case ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-v));
    default:
        return v / (1.0f + expf(-v));
    }
}

__global__ void elem_kernel(elem_args a)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= a.n)
        return;
    for (int r = blockIdx.y; r < a.n_rows; r += gridDim.y) {
        float *y = a.y + (size_t)r * a.ldy + j;
        const float *xr = a.x ? a.x + (size_t)r * a.ldx : NULL;
        switch (a.op) {
        case EL_ACT:
            *y = act_f(a.act, *y);
            break;
        case EL_GLU:
            *y = act_f(a.act, xr[j]) * xr[a.n + j];
            break;
        case EL_GLU_CLAMPED: {
            float g = a.interleaved ? xr[2 * j] : xr[j];
            float u = a.interleaved ? xr[2 * j + 1] : xr[a.n + j], lim = a.s;
            g = g < lim ? g : lim;
            u = u < -lim ? -lim : u > lim ? lim : u;
            *y = (u + 1.0f) * (g / (1.0f + expf(-a.alpha * g)));
            break;
        }
        case EL_AXPY:
            *y = axpy_f(*y, a.s, xr[j]);
            break;
        case EL_SIGMOID_AXPY:
            *y += (float)(1.0 / (1.0 + exp(-(double)a.g[r]))) * xr[j];
            break;
        case EL_SCALE:
            *y *= a.s;
            break;
        case EL_SOFTCAP:
            *y = a.s * tanhf(*y / a.s);
            break;
        case EL_GATHER:
            *y = a.x[(size_t)(a.idx[r] / a.div) * a.ldx + j];
            break;
        case EL_MUL:
            *y = xr[j] * a.x2[(size_t)r * a.ldx2 + j];
            break;
        case EL_XIELU: {
            float v = *y;
            *y = v > 0.0f ? a.xp.alpha_p * v * v + a.xp.beta * v
                          : (expm1f(v < a.xp.eps ? v : a.xp.eps) - v) * a.xp.alpha_n + a.xp.beta * v;
            break;
        }
        case EL_ATTN_TEMP: /* idx: positions, div: floor_scale, s: attn_scale (the CPU's double) */
            *y = (float)(*y * (1.0 + a.s * log(floor((a.idx[r] + 1.0) / a.div) + 1.0)));
            break;
        }
    }
}

static void elem_run(struct backend *be, elem_args *a)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || a->n_rows <= 0 || a->n <= 0)
        return;
    dim3 grid((a->n + 255) / 256, a->n_rows < 65535 ? a->n_rows : 65535);
    cu_launch(c, elem_kernel, grid, dim3(256), *a);
    cu_check(c, "elementwise");
}

/* xIELU needs its constants (the xielu op): act / glu record an error for it. */
static bool act_refused(struct backend *be, enum act_kind act)
{
    if (act != ACT_XIELU)
        return false;
    cu_fail(cu_of(be), "act / glu: xIELU goes through the xielu op", cudaErrorInvalidValue);
    return true;
}

void cu_act(struct backend *be, enum act_kind act, float *x, int ld, int n_rows, int n)
{
    if (act_refused(be, act))
        return;
    elem_args a = {};
    a.op = EL_ACT, a.act = act, a.y = x, a.ldy = (size_t)ld, a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_glu(struct backend *be, enum act_kind act, float *y, int ldy, const float *x, int ldx,
            int n_rows, int n)
{
    if (act_refused(be, act))
        return;
    elem_args a = {};
    a.op = EL_GLU, a.act = act, a.y = y, a.x = x, a.ldy = (size_t)ldy, a.ldx = (size_t)ldx;
    a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_glu_clamped(struct backend *be, float *y, int ldy, const float *x, int ldx, int n_rows,
                    int n, float alpha, float limit, bool interleaved)
{
    elem_args a = {};
    a.op = EL_GLU_CLAMPED, a.y = y, a.x = x, a.ldy = (size_t)ldy, a.ldx = (size_t)ldx;
    a.s = limit, a.alpha = alpha, a.interleaved = interleaved, a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_xielu(struct backend *be, float *x, int ld, int n_rows, int n, const struct xielu_params *p)
{
    elem_args a = {};
    a.op = EL_XIELU, a.y = x, a.xp = *p, a.ldy = (size_t)ld, a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_scale(struct backend *be, float *x, int ld, float s, int n_rows, int n)
{
    elem_args a = {};
    a.op = EL_SCALE, a.y = x, a.s = s, a.ldy = (size_t)ld, a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_softcap(struct backend *be, float *x, int ld, float cap, int n_rows, int n)
{
    elem_args a = {};
    a.op = EL_SOFTCAP, a.y = x, a.s = cap, a.ldy = (size_t)ld, a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_axpy(struct backend *be, float *y, int ldy, float s, const float *x, int ldx, int n_rows,
             int n)
{
    elem_args a = {};
    a.op = EL_AXPY, a.y = y, a.x = x, a.s = s, a.ldy = (size_t)ldy, a.ldx = (size_t)ldx;
    a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_attn_temp(struct backend *be, float *x, int ld, int n_tok, int n, const struct kv_rows *rows,
                  int floor_scale, float attn_scale)
{
    elem_args a = {};
    a.op = EL_ATTN_TEMP, a.y = x, a.idx = rows->pos, a.div = floor_scale, a.s = attn_scale;
    a.ldy = (size_t)ld, a.n_rows = n_tok, a.n = n;
    elem_run(be, &a);
}

void cu_sigmoid_axpy(struct backend *be, float *y, int ldy, const float *g, const float *x,
                     int ldx, int n_rows, int n)
{
    elem_args a = {};
    a.op = EL_SIGMOID_AXPY, a.y = y, a.x = x, a.g = g, a.ldy = (size_t)ldy, a.ldx = (size_t)ldx;
    a.n_rows = n_rows, a.n = n;
    elem_run(be, &a);
}

void cu_gather(struct backend *be, float *y, const float *x, int ldx, const int32_t *idx, int div,
               int n_rows, int n)
{
    elem_args a = {};
    a.op = EL_GATHER, a.y = y, a.x = NULL, a.idx = idx, a.div = div, a.ldy = (size_t)n;
    a.ldx = (size_t)ldx, a.n_rows = n_rows, a.n = n;
    /* the source rows are read through idx, not through x's own row */
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_rows <= 0 || n <= 0)
        return;
    a.x = x;
    dim3 grid((n + 255) / 256, n_rows < 65535 ? n_rows : 65535);
    cu_launch(c, elem_kernel, grid, dim3(256), a);
    cu_check(c, "gather");
}

void cu_mul(struct backend *be, float *y, int ldy, const float *a, int lda, const float *b, int ldb,
            int n_rows, int n)
{
    elem_args e = {};
    e.op = EL_MUL, e.y = y, e.x = a, e.x2 = b, e.ldy = (size_t)ldy, e.ldx = (size_t)lda;
    e.ldx2 = (size_t)ldb, e.n_rows = n_rows, e.n = n;
    elem_run(be, &e);
}
