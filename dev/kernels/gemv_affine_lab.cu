/*
 * gemv_affine_lab: versions of the affine 4-bit decode GEMV (n_tok = 1) with
 * reference, validation and timing in one file (never linked into the
 * product; the winner lives in src/kernels/cuda/linear.cu).
 *
 * Every version: warp = R rows, lane l takes the rows' 16-byte pieces
 * l, l + 32, ..., U pieces per row loaded before the first is used, codes
 * widened exactly through the float bit pattern 2^23 + q (byte permute +
 * add), s * Σ q x + b * Σ x per piece. They differ in R, U, the register cap
 * (minimum blocks per SM) and PIPE: the next iteration's loads issued before
 * this one's arithmetic.
 *
 * Reference: one thread per row in double. Weights are random codes with
 * bf16 scales and biases (group 64), rotated over copies totalling > 1 GiB so
 * the 60 MB L2 serves nothing. Time: CUDA events around 200 launches, median
 * of 5; GB/s counts codes + scales + biases.
 *
 * Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o gemv_lab dev/kernels/gemv_affine_lab.cu
 */
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(x) \
    do { \
        cudaError_t rc_ = (x); \
        if (rc_ != cudaSuccess) { \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(rc_)); \
            exit(1); \
        } \
    } while (0)

#define GROUP 64
#define WARPS 4

__device__ __forceinline__ float bf(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

template <int K>
__device__ __forceinline__ float code_f(uint32_t b)
{
    return __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7540u | K)) - 8388608.0f;
}

__device__ __forceinline__ float piece_dot4(uint4 q, const float *x)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = u[i] & 0x0f0f0f0fu, hi = (u[i] >> 4) & 0x0f0f0f0fu;
        d0 += code_f<0>(lo) * x[8 * i] + code_f<1>(lo) * x[8 * i + 2] + code_f<2>(lo) * x[8 * i + 4] +
              code_f<3>(lo) * x[8 * i + 6];
        d1 += code_f<0>(hi) * x[8 * i + 1] + code_f<1>(hi) * x[8 * i + 3] +
              code_f<2>(hi) * x[8 * i + 5] + code_f<3>(hi) * x[8 * i + 7];
    }
    return d0 + d1;
}

/* FMA decoding: code q as the float 0.5 + q / 32 (q in the top 4 mantissa bits under the
 * exponent of 0.5: one byte permute after the masks), accumulated straight into the dot:
 * returns F = Σ (0.5 + q / 32) x, so Σ q x = 32 F - 16 Σ x. */
template <int K>
__device__ __forceinline__ float half_code(uint32_t b)
{
    return __uint_as_float(__byte_perm(b, 0x3F000000u, 0x7054u | (K << 8)));
}

__device__ __forceinline__ float piece_fdot4(uint4 q, const float *x)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = (u[i] << 3) & 0x78787878u, hi = (u[i] >> 1) & 0x78787878u;
        d0 = fmaf(half_code<0>(lo), x[8 * i], d0);
        d1 = fmaf(half_code<0>(hi), x[8 * i + 1], d1);
        d0 = fmaf(half_code<1>(lo), x[8 * i + 2], d0);
        d1 = fmaf(half_code<1>(hi), x[8 * i + 3], d1);
        d0 = fmaf(half_code<2>(lo), x[8 * i + 4], d0);
        d1 = fmaf(half_code<2>(hi), x[8 * i + 5], d1);
        d0 = fmaf(half_code<3>(lo), x[8 * i + 6], d0);
        d1 = fmaf(half_code<3>(hi), x[8 * i + 7], d1);
    }
    return d0 + d1;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* y[out] = W x; W codes [out][in / 8] words, s / b [out][in / GROUP] bf16. */
template <int R, int U, int MINB, bool FMA>
__global__ void __launch_bounds__(32 * WARPS, MINB)
gemv4(float *y, const float *__restrict__ x, const uint32_t *__restrict__ wq,
      const uint16_t *__restrict__ ws, const uint16_t *__restrict__ wb, int out, int in)
{
    const int lane = threadIdx.x % 32, r0 = (blockIdx.x * WARPS + threadIdx.x / 32) * R;
    if (r0 >= out)
        return;
    const int n_p = in / 32, ng = in / GROUP;
    const size_t rw = (size_t)in / 8;   /* words per row */
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int p0 = lane; p0 < n_p; p0 += 32 * U) {
        uint4 q[U][R];
        float sc[U][R], bi[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + 32 * u;
            bool ok = p < n_p;
#pragma unroll
            for (int r = 0; r < R; r++) {
                size_t rr = (size_t)min(r0 + r, out - 1);
                q[u][r] = ok ? __ldg((const uint4 *)(wq + rr * rw) + p) : make_uint4(0, 0, 0, 0);
                sc[u][r] = ok ? bf(__ldg(ws + rr * ng + p / 2)) : 0.0f;
                bi[u][r] = ok ? bf(__ldg(wb + rr * ng + p / 2)) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int p = p0 + 32 * u;
            if (p >= n_p)
                break;
            const float4 *xp = (const float4 *)(x + (size_t)p * 32);
            float xv[32], xs = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 f = __ldg(xp + i);
                xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
                xs += (f.x + f.y) + (f.z + f.w);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (FMA)
                    acc[r] += 32.0f * sc[u][r] * piece_fdot4(q[u][r], xv) + (bi[u][r] - 16.0f * sc[u][r]) * xs;
                else
                    acc[r] += sc[u][r] * piece_dot4(q[u][r], xv) + bi[u][r] * xs;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < out)
            y[r0 + r] = v;
    }
}

/* PIPE: the loads of the lane's next piece of each row are in flight during this one's
 * arithmetic (registers double-buffered). */
template <int R, int MINB>
__global__ void __launch_bounds__(32 * WARPS, MINB)
gemv4_pipe(float *y, const float *__restrict__ x, const uint32_t *__restrict__ wq,
           const uint16_t *__restrict__ ws, const uint16_t *__restrict__ wb, int out, int in)
{
    const int lane = threadIdx.x % 32, r0 = (blockIdx.x * WARPS + threadIdx.x / 32) * R;
    if (r0 >= out)
        return;
    const int n_p = in / 32, ng = in / GROUP;
    const size_t rw = (size_t)in / 8;
    float acc[R];
    uint4 q[R];
    uint32_t sb[R];
    const uint32_t *base[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        acc[r] = 0.0f;
        base[r] = wq + (size_t)min(r0 + r, out - 1) * rw;
    }
    auto load = [&](int p, uint4 *qq, uint32_t *s2) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            size_t rr = (size_t)min(r0 + r, out - 1);
            bool ok = p < n_p;
            qq[r] = ok ? __ldg((const uint4 *)base[r] + p) : make_uint4(0, 0, 0, 0);
            s2[r] = ok ? (uint32_t)__ldg(ws + rr * ng + p / 2) | (uint32_t)__ldg(wb + rr * ng + p / 2) << 16
                       : 0u;
        }
    };
    load(lane, q, sb);
    for (int p = lane; p < n_p; p += 32) {
        uint4 qn[R];
        uint32_t sbn[R];
        load(p + 32, qn, sbn);
        const float4 *xp = (const float4 *)(x + (size_t)p * 32);
        float xv[32], xs = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 f = __ldg(xp + i);
            xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
            xs += (f.x + f.y) + (f.z + f.w);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] += bf((uint16_t)(sb[r] & 0xffff)) * piece_dot4(q[r], xv) + bf((uint16_t)(sb[r] >> 16)) * xs;
            q[r] = qn[r];
            sb[r] = sbn[r];
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < out)
            y[r0 + r] = v;
    }
}

__global__ void ref_kernel(double *y, const float *x, const uint32_t *wq, const uint16_t *ws,
                           const uint16_t *wb, int out, int in)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= out)
        return;
    double a = 0;
    for (int k = 0; k < in; k++) {
        uint32_t w = wq[(size_t)r * (in / 8) + k / 8];
        int q = (w >> (4 * (k % 8))) & 15;
        float s = bf(ws[(size_t)r * (in / GROUP) + k / GROUP]), b = bf(wb[(size_t)r * (in / GROUP) + k / GROUP]);
        a += (double)(s * q + b) * x[k];
    }
    y[r] = a;
}

__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = h;
    }
}

/* scales in [0.001, 0.05), biases in [-0.3, 0.3) as bf16 */
__global__ void fill_sb(uint16_t *s, uint16_t *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        float fs = 0.001f + 0.049f * (h & 0xffff) / 65536.0f, fb = -0.3f + 0.6f * (h >> 16) / 65536.0f;
        s[i] = (uint16_t)(__float_as_uint(fs) >> 16);
        b[i] = (uint16_t)(__float_as_uint(fb) >> 16);
    }
}

typedef void (*kern_t)(float *, const float *, const uint32_t *, const uint16_t *, const uint16_t *, int,
                       int);

struct version {
    const char *name;
    kern_t k;
    int rows_per_warp;
};

int main()
{
    static const version vs[] = {
        {"R4 U2 (src)", gemv4<4, 2, 1, false>, 4},
        {"R4 U2 minB4", gemv4<4, 2, 4, false>, 4},
        {"R8 U1", gemv4<8, 1, 1, false>, 8},
        {"R8 U2", gemv4<8, 2, 1, false>, 8},
        {"fma R4 U2", gemv4<4, 2, 1, true>, 4},
        {"fma R4 U2 mB4", gemv4<4, 2, 4, true>, 4},
        {"fma R8 U1", gemv4<8, 1, 1, true>, 8},
        {"fma R8 U2", gemv4<8, 2, 1, true>, 8},
        {"fma R8 U1 mB3", gemv4<8, 1, 3, true>, 8},
        {"fma R16 U1", gemv4<16, 1, 1, true>, 16},
    };
    static const int shapes[][2] = {{128256, 2048}, {14336, 4096}, {4096, 14336}, {8192, 2048},
                                    {2048, 8192}, {2048, 2048}, {512, 2048}};
    /* copy bandwidth */
    size_t cb = (size_t)1 << 30;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb));
    CK(cudaMalloc(&cbuf, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; i++)
        CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double copy = 2.0 * cb * 10 / (ms * 1e-3) / 1e9;
    printf("copy %.0f GB/s (read + write)\n", copy);
    CK(cudaFree(ca));
    CK(cudaFree(cbuf));
    printf("%-14s", "version");
    for (auto &s : shapes)
        printf(" %7dx%-6d", s[0], s[1]);
    printf("   (GB/s; %% of copy)\n");
    std::vector<std::vector<double>> res(sizeof vs / sizeof vs[0]);
    for (auto &s : shapes) {
        int out = s[0], in = s[1];
        size_t nw = (size_t)out * in / 8, ng = (size_t)out * in / GROUP;
        size_t bytes = nw * 4 + ng * 4;
        int nc = (int)std::min<size_t>(64, ((size_t)1 << 30) / bytes + 1);
        uint32_t *wq;
        uint16_t *ws, *wb;
        float *x, *y;
        double *yr;
        CK(cudaMalloc(&wq, nw * 4 * nc));
        CK(cudaMalloc(&ws, ng * 2 * nc));
        CK(cudaMalloc(&wb, ng * 2 * nc));
        CK(cudaMalloc(&x, in * 4));
        CK(cudaMalloc(&y, out * 4));
        CK(cudaMalloc(&yr, out * 8));
        fill<<<1024, 256>>>(wq, nw * nc, 7);
        fill_sb<<<1024, 256>>>(ws, wb, ng * nc);
        std::vector<float> hx(in);
        for (int i = 0; i < in; i++)
            hx[i] = (float)((i * 7919 % 2001) - 1000) / 1000.0f;
        CK(cudaMemcpy(x, hx.data(), in * 4, cudaMemcpyHostToDevice));
        ref_kernel<<<(out + 127) / 128, 128>>>(yr, x, wq, ws, wb, out, in);
        std::vector<double> hr(out);
        std::vector<float> hy(out);
        CK(cudaMemcpy(hr.data(), yr, out * 8, cudaMemcpyDeviceToHost));
        double mx = 0;
        for (double v : hr)
            mx = std::max(mx, fabs(v));
        for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
            int rows = vs[v].rows_per_warp * WARPS, nb = (out + rows - 1) / rows;
            CK(cudaMemset(y, 0xff, out * 4));
            vs[v].k<<<nb, 32 * WARPS>>>(y, x, wq, ws, wb, out, in);
            CK(cudaGetLastError());
            CK(cudaMemcpy(hy.data(), y, out * 4, cudaMemcpyDeviceToHost));
            double md = 0;
            for (int i = 0; i < out; i++)
                md = std::max(md, fabs(hy[i] - hr[i]));
            if (!(md / mx < 1e-5)) {
                printf("%s %dx%d: rel err %.3g\n", vs[v].name, out, in, md / mx);
                res[v].push_back(0);
                continue;
            }
            std::vector<float> t;
            for (int rep = 0; rep < 5; rep++) {
                CK(cudaEventRecord(e0));
                for (int i = 0; i < 200; i++) {
                    int c = i % nc;
                    vs[v].k<<<nb, 32 * WARPS>>>(y, x, wq + nw * c, ws + ng * c, wb + ng * c, out, in);
                }
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            res[v].push_back(bytes * 200.0 / (t[2] * 1e-3) / 1e9);
        }
        CK(cudaFree(wq));
        CK(cudaFree(ws));
        CK(cudaFree(wb));
        CK(cudaFree(x));
        CK(cudaFree(y));
        CK(cudaFree(yr));
    }
    for (size_t v = 0; v < sizeof vs / sizeof vs[0]; v++) {
        printf("%-14s", vs[v].name);
        for (double g : res[v])
            printf(" %6.0f %5.1f%%", g, 100 * g / copy);
        printf("\n");
    }
    return 0;
}
