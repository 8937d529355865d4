/*
 * rec: the ops of recurrent layers on the GPU (backend.h, ADR 0057), with the CPU
 * reference's arithmetic (backend_cpu_rec.c). conv1d: one thread per channel walks the
 * chunk's rows in order (a sequence's rows see the state its earlier rows left), the
 * state in registers between rows of the same sequence is not worth it at K <= 4.
 */
#include <math.h>

#include "cuda_impl.h"

__global__ void conv1d_kernel(float *y, size_t ldy, const float *x, size_t ldx, const float *w,
                              const float *b, float *st, const int32_t *pos, const int32_t *seq,
                              int n_tok, int n_ch, int K, bool silu)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_ch)
        return;
    int km = K - 1;
    size_t sd = (size_t)km * n_ch;
    for (int i = 0; i < n_tok; i++) {
        float *s = st + (size_t)seq[i] * sd;
        if (pos[i] == 0)
            for (int j = 0; j < km; j++)
                s[(size_t)j * n_ch + c] = 0.0f;
        float xc = x[(size_t)i * ldx + c], acc = b ? b[c] : 0.0f;
        const float *wc = w + (size_t)c * K;
        for (int j = 0; j < km; j++)
            acc += wc[j] * s[(size_t)j * n_ch + c];
        acc += wc[km] * xc;
        for (int j = 0; j + 1 < km; j++)
            s[(size_t)j * n_ch + c] = s[(size_t)(j + 1) * n_ch + c];
        if (km > 0)
            s[(size_t)(km - 1) * n_ch + c] = xc;
        y[(size_t)i * ldy + c] = silu ? acc / (1.0f + expf(-acc)) : acc;
    }
}

void cu_conv1d(struct backend *be, float *y, int ldy, const float *x, int ldx,
               const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
               const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu)
{
    struct cuda_backend *c = cu_of(be);
    if (c->err_rc || n_tok <= 0 || n_ch <= 0)
        return;
    bool has_b = b && tensor_is_present(b);
    if (w->dtype != DTYPE_F32 || (has_b && b->dtype != DTYPE_F32) || K < 1 ||
        st->k_dim != (K - 1) * n_ch) {
        cu_fail(c, "conv1d: F32 weights and a state of (K - 1) * channels floats",
                cudaErrorInvalidValue);
        return;
    }
    cu_launch(c, conv1d_kernel, dim3((n_ch + 127) / 128), dim3(128), y, (size_t)ldy, x,
              (size_t)ldx, (const float *)w->data, has_b ? (const float *)b->data : (const float *)NULL,
              (float *)st->k, rows->pos, rows->state, n_tok, n_ch, K, silu);
    cu_check(c, "conv1d");
}

// ---- the plan of a chunked prefill (ADR 0132) ----

#define PLAN_THREADS 1024

/* Row i continues row i - 1's run: the same sequence at the next position. */
__device__ __forceinline__ bool plan_cont(const int32_t *pos, const int32_t *seq, int i)
{
    return i > 0 && pos[i] != 0 && seq[i] == seq[i - 1] && pos[i] == pos[i - 1] + 1;
}

/* Inclusive scan (max, or sum) of v over the block of PLAN_THREADS threads; *tot: the
 * whole block's. sh: 32 ints. Every thread of the block calls it. */
template <bool MAX>
__device__ int plan_scan(int v, int *sh, int *tot)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v = MAX ? max(v, u) : v + u;
    }
    if (lane == 31)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        int u = sh[lane];
        for (int o = 1; o < 32; o <<= 1) {
            int t = __shfl_up_sync(0xffffffffu, u, o);
            if (lane >= o)
                u = MAX ? max(u, t) : u + t;
        }
        sh[lane] = u;
    }
    __syncthreads();
    if (w > 0)
        v = MAX ? max(v, sh[w - 1]) : v + sh[w - 1];
    *tot = sh[31];
    __syncthreads();
    return v;
}

/* One block. First pass: rs[i] the first row of row i's run, rl[rs[i]] the run's length.
 * Second: the items and chunks in row order (cu_rec_plan). */
__global__ void rec_plan_kernel(const int32_t *pos, const int32_t *seq, int n_tok, int32_t *rs,
                                int32_t *rl, int4 *items, int2 *chunks, int32_t *cnt)
{
    __shared__ int sh[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    int carry = -1, tot;
    for (int b = 0; b < n_tok; b += PLAN_THREADS) {
        int i = b + threadIdx.x;
        int v = i < n_tok && !plan_cont(pos, seq, i) ? i : -1;
        v = max(plan_scan<true>(v, sh, &tot), carry);
        carry = max(carry, tot);
        if (i < n_tok) {
            rs[i] = v;
            if (i + 1 == n_tok || !plan_cont(pos, seq, i + 1))
                rl[v] = i - v + 1;
        }
    }
    __syncthreads();  /* rs and rl, written by other threads, are read below */
    int ni = 0, nc = 0;
    for (int b = 0; b < n_tok; b += PLAN_THREADS) {
        int i = b + threadIdx.x, it = 0, ch = 0, len = 0;
        if (i < n_tok) {
            int s = rs[i], L = rl[s], o = i - s;
            if (L < REC_CHUNK_MIN) {
                it = o == 0;
                len = L;
            } else {
                /* k chunks: chunk q holds offsets [q L / k, (q + 1) L / k) */
                long long k = (L + REC_CHUNK - 1) / REC_CHUNK;
                int q = (int)(((long long)(o + 1) * k - 1) / L);
                int a = (int)((long long)q * L / k);
                it = ch = o == a;
                len = (int)((long long)(q + 1) * L / k) - a;
            }
        }
        int ti, tc;
        int xi = plan_scan<false>(it, sh, &ti) - it + ni;
        int xc = plan_scan<false>(ch, sh, &tc) - ch + nc;
        if (it)
            items[xi] = make_int4(i, len, ch ? xc : -1, 0);
        if (ch)
            chunks[xc] = make_int2(i, len);
        ni += ti;
        nc += tc;
    }
    if (threadIdx.x == 0) {
        cnt[0] = ni;
        cnt[1] = nc;
    }
}

bool cu_rec_smem(struct cuda_backend *c, int k, const void *fn, size_t bytes)
{
    if (bytes <= c->rec_smem[k])
        return true;
    cudaError_t rc = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (rc != cudaSuccess) {
        cu_fail(c, "shared memory of a chunked recurrent kernel", rc);
        return false;
    }
    c->rec_smem[k] = bytes;
    return true;
}

bool cu_rec_plan(struct cuda_backend *c, const struct kv_rows *rows, int n_tok, size_t floats,
                 struct rec_plan *pl)
{
    if (cu_not_capturable(c, "a chunked recurrent prefill in a graph"))
        return false;
    int maxc = n_tok / REC_CHUNK_MIN;
    /* cnt (4 ints) | items (int4) | chunks (int2) | rs | rl | pad to 16 bytes | floats */
    size_t ints = 4 + 4 * (size_t)n_tok + 2 * (size_t)maxc + 2 * (size_t)n_tok;
    ints = (ints + 3) & ~(size_t)3;
    size_t bytes = (ints + floats) * 4;
    if (bytes > c->rscr_cap) {
        cudaFree(c->rscr);
        c->rscr = NULL;
        c->rscr_cap = 0;
        cudaError_t rc = cudaMalloc(&c->rscr, bytes);
        if (rc != cudaSuccess) {
            c->rscr = NULL;
            cu_fail(c, "recurrent scratch", rc);
            return false;
        }
        c->rscr_cap = bytes;
    }
    int32_t *base = (int32_t *)c->rscr, *cnt = base;
    int4 *items = (int4 *)(base + 4);
    int2 *chunks = (int2 *)(base + 4 + 4 * (size_t)n_tok);
    int32_t *rs = base + 4 + 4 * (size_t)n_tok + 2 * (size_t)maxc, *rl = rs + n_tok;
    pl->cnt = cnt;
    pl->items = items;
    pl->chunks = chunks;
    pl->f = (float *)(base + ints);
    pl->max_chunks = maxc;
    cu_launch(c, rec_plan_kernel, dim3(1), dim3(PLAN_THREADS), rows->pos, rows->state, n_tok, rs,
              rl, items, chunks, cnt);
    return cu_check(c, "recurrent plan");
}
