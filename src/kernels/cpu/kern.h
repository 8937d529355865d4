/*
 * kern: the CPU kernel dispatch table (internal to src/kernels/cpu/).
 *
 * backend_cpu.c owns the threading: it splits every op by (ith, nth) on the
 * one pool and calls, per thread, the single-threaded kernels listed in
 * struct cpu_kernels. dispatch.c fills the table once at backend creation:
 * first with the scalar references (kern_ref.c, always built, the test
 * oracle), then overlays the entries an ISA variant implements
 * (kern_avx2.c, kern_avx512.c; each file has its own target flags and is
 * only called after CPUID + xgetbv say the CPU and OS can run it).
 *
 * Weights reach the kernels as a struct wmat: a row-major [out, in] matrix in
 * its stored dtype (F32/F16/BF16), or MLX quantized: U32 words holding a
 * little-endian bit stream of qbits-bit codes per row, one scale (and for
 * affine one bias) per group of qgroup elements, decoded per qmode
 * (../shared/docs/mlx-quantization.md sections 2-4):
 *   affine  w = s * q + b          s, b F32/F16/BF16 (s may be negative)
 *   mxfp4   w = e2m1(q) * e8m0(s)  s U8, group 32
 *   mxfp8   w = e4m3(q) * e8m0(s)  s U8, group 32
 *   nvfp4   w = e2m1(q) * e4m3(s)  s U8, group 16
 * kern_qscale() and kern_qval() below are the exact scalar definitions.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../core/dtype.h"
#include "../../core/tensor.h"

/* Largest token tile of a GEMM microkernel (ukernel's mr <= GEMM_MR_MAX). */
#define GEMM_MR_MAX 8
/* Contraction block of the GEMM driver: a packed panel is GEMM_KC x nr f32
 * (32 KiB at nr = 32, L1-resident). A multiple of 128 so that every MLX
 * group (32/64/128) and every 3/5/6-bit packing period starts inside a block
 * at a group boundary. */
#define GEMM_KC 256
/* Float weights against many tokens (ADR 0144): GEMM_NP panels packed at once for a
 * contraction block, then the tokens in blocks of GEMM_MC rows (GEMM_MC x GEMM_KC of x, 96 KiB,
 * stays in L2 while every panel of the group runs over it); from GEMM_MC_MIN tokens. */
#define GEMM_NP 8
#define GEMM_MC 96
#define GEMM_MC_MIN 192
/* Rows of x permuted by qxperm are padded with zeros to a multiple of this
 * (the largest block of codes any variant unpacks at once). */
#define QX_PAD 256

/* The gated delta rule (Qwen3-Next's linear attention; backend_cpu_gdn.c, kern_gdn.h):
 * transformers' l2norm epsilon (FLA's default), the rows per block of the block form
 * (transformers' and FLA's chunk size) and the shortest run of one sequence's rows that takes
 * it (decode rows and short runs step). */
#define GDN_L2_EPS 1e-6
#define GDN_BLOCK 64
#define GDN_BLOCK_MIN 4

struct cpu_kernels;
struct gdn_ctx {
    const struct cpu_kernels *k;   /* the table whose gdn_rows runs it */
    float *y;
    const float *x, *ab;
    size_t ldy, ldx, ldab;
    const float *a_log, *dt_bias;  /* [n_v_head] */
    float *st;                     /* [seqs][n_v_head][k_dim][v_dim] */
    const int32_t *pos, *seq;
    float **scr;                   /* per thread: gdn_block's planes / gdn_step's vectors, doubles */
    int n_tok, nk, nv, dk, dv;
};

/* The causal depthwise convolution (backend_cpu_rec.c, kern_conv.h): its arguments as the
 * op received them. */
struct conv_ctx {
    const struct cpu_kernels *k;   /* the table whose conv_rows runs it (silu_mul from it) */
    float *y;
    const float *x;
    size_t ldy, ldx;
    const float *w, *b;            /* [n_ch, K], [n_ch] or NULL */
    float *st;                     /* [seqs][K - 1][n_ch] */
    const int32_t *pos, *seq;
    int n_tok, n_ch, K;
    bool silu;
};

/* Griffin's RG-LRU (backend_cpu_rglru.c, kern_rglru.h): its arguments as the op received
 * them. */
struct rglru_ctx {
    const struct cpu_kernels *k;   /* the table whose rglru_rows runs it */
    float *y;
    const float *x;
    size_t ldy, ldx;
    const float *wi, *bi, *wa, *ba, *ap;
    float *st;                /* [seqs][width] */
    const int32_t *pos, *seq;
    int n_tok, width, bw;
};

/* A weight matrix [out, in] as the kernels see it. */
struct wmat {
    const uint8_t *data;      /* row r starts at data + r * row_bytes */
    size_t row_bytes;
    enum dtype dt;            /* F32/F16/BF16; U32 when qbits != 0 */
    int in;                   /* logical elements per row */
    int out;                  /* rows */
    int qbits;                /* 0: not quantized; else 2..8 */
    int qgroup;               /* elements per scale/bias group (16, 32, 64, 128) */
    enum qmode qmode;         /* how a code and its group scale make a value */
    enum dtype qsdt;          /* dtype of scales/biases: F32/F16/BF16 affine, U8 fp modes */
    const uint8_t *qs;        /* row r's scales at qs + r * qrow_bytes */
    const uint8_t *qb;        /* row r's biases at qb + r * qrow_bytes; NULL for fp modes */
    size_t qrow_bytes;
    /* QG16 (below): data holds panels of 16 rows, qg16_panel bytes apart; row_bytes,
     * qs, qb and qrow_bytes are then unused. */
    bool qg16;
    size_t qg16_panel;
    /* FPAN (below): float data holds panels of FPAN_R rows, fpan_panel bytes apart;
     * row_bytes is then unused. */
    bool fpan;
    size_t fpan_panel;
    /* The kernel the weight's plan chose for this call's token count (enum lp_kernel,
     * linear_plan.h): the matvec entries below run that one, and decide nothing. */
    uint8_t kid;
};

struct cpu_kernels {
    const char *name;         /* "scalar", "avx2", "avx512" */

    /* ---- weights ---- */
    /* dst[0..n) = W[r, k0 .. k0+n) widened (or dequantized) to f32.
     * For quantized W, k0 is a multiple of 16. */
    void (*wrow_f32)(float *dst, const struct wmat *w, int r, int k0, int n);
    /* Widen n elements of an F32/F16/BF16 vector to f32. */
    void (*to_f32)(float *dst, const void *src, enum dtype dt, size_t n);
    /* y[t*ldy + r] = sum_i x[t*ldx + i] * W[r, i] for t < n_tok, r0 <= r < r1
     * (overwrites y). Streams W straight from memory: the decode path.
     * xsum [n_tok, in/qgroup] (row stride ldxs) holds per-group sums of x
     * when W is affine quantized (kernels may use sum(s*q+b)x = s*sum(qx) +
     * b*sum(x)); NULL otherwise. For quantized W on a variant with qxperm,
     * x comes permuted by it (ldx >= kern_qx_len(in)). */
    void (*matvec)(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                   const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs);
    /* Optional: for quantized W, matvec receives each token's x prepared by
     * this: permuted into the lane order the kernel unpacks codes in (and
     * possibly scaled by a power of two that the kernel's decode undoes):
     * dst[0 .. kern_qx_len(w->in)) from x[0 .. w->in), zero padded. */
    void (*qxperm)(float *dst, const float *x, const struct wmat *w);
    /* GEMM microkernel: y[m*ldy + j] (+)= sum_k x[m*ldx + k] * bp[k*nr + j] for
     * m < mr (<= GEMM_MR_MAX), j < nv (<= gemm_nr); accumulate into y when acc.
     * bp is a packed panel [kc][gemm_nr], 64-byte aligned. NULL: no GEMM path. */
    void (*ukernel)(float *y, size_t ldy, const float *x, size_t ldx, int mr,
                    const float *bp, int kc, int nv, bool acc);
    /* Transpose nv (<= nr) rows of kc f32 (row stride ldr) into a panel:
     * bp[k*nr + j] = rows[j*ldr + k], zero for nv <= j < nr. */
    void (*pack_t)(float *bp, int nr, const float *rows, size_t ldr, int nv, int kc);
    /* Optional (NULL: wrow_f32 + pack_t): the panel block of float (not
     * quantized) W rows [r0, r0+nv) x [k0, k0+kc) straight into bp [kc][nr] (the
     * caller asks for the next block's lines while the microkernel runs). */
    void (*pack_w)(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc);
    /* Optional integer matvec (qi) for the affine / mxfp4 W that qi_ok accepts; see
     * "integer quantized matvec" below. qi_prep writes one token's x as
     * kern_qi_len(w) bytes at dst; matvec_qi is matvec over prepared x
     * (row stride ldxq bytes), without xsum (the preparation carries it). */
    bool (*qi_ok)(const struct wmat *w);
    void (*qi_prep)(uint8_t *dst, const float *x, const struct wmat *w);
    void (*matvec_qi)(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                      const struct wmat *w, int r0, int r1);
    /* Optional: matvec_qi as --fast asks (MLXCEL_FAST): where the variant has a faster
     * form with coarser x (affine 4-bit, AVX2 and VNNI: x's high limb alone, 8 significant bits
     * per group), that one; the backend puts it in matvec_qi's place. */
    void (*matvec_qi_fast)(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                           const struct wmat *w, int r0, int r1);
    int gemm_nr;              /* panel width of ukernel */
    int gemm_mr;              /* token rows per ukernel call (<= GEMM_MR_MAX) */
    /* Use the GEMM path from this many tokens on (float / quantized W; the values and their
     * measurements are linear_plan.h's table). Below it the matvec, which reads each weight
     * row once per call and re-reads it from L1 per token, is faster: the GEMM pays a fixed
     * cost to widen and transpose every panel. */
    int gemm_min_tok;
    int gemm_min_tok_q;
    int gemm_min_tok_qi;      /* quantized W that the integer matvec takes */
    /* Optional: true for the W of those that matvec_qi runs at any token
     * count, faster than the GEMM path (the VNNI 4-bit GEMM). */
    bool (*qi_any_tok)(const struct wmat *w);
    /* Optional: panels [p0, p1) of w (stored layout) as QG16 (below) into dst, which holds
     * every panel; set when matvec_qi also reads QG16 W, at any token count. */
    void (*qg16_pack)(uint8_t *dst, const struct wmat *w, int p0, int p1);
    /* Optional: y[t*ldy + r] = sum_i x[t*ldx + i] * W[r, i] for t < n_tok, r0 <= r < r1
     * (overwrites y), for float W in the FPAN layout (below), at any token count. Each
     * output is the same sum whatever n_tok and the row range (kern.h FPAN). Set by the
     * variants that read FPAN; the backend then repacks float W into it at load. */
    void (*fpan_linear)(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                        const struct wmat *w, int r0, int r1);

    /* ---- vectors ---- */
    float (*dot)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, size_t n);
    /* y *= a */
    void (*scale)(float *y, float a, size_t n);
    float (*sum)(const float *x, int n);
    /* sum (x - c)^2 */
    float (*sumsq)(const float *x, float c, int n);
    /* y = (x - c) * a * (w + w_off) (+ b); w, b in their dtype; b may be NULL. */
    void (*norm_apply)(float *y, const float *x, float c, float a, const void *w, enum dtype wdt,
                       float w_off, const void *b, enum dtype bdt, int n);
    float (*max)(const float *x, int n);
    /* y = exp(x - m); returns sum y. y may equal x. */
    float (*exp_sum)(float *y, const float *x, float m, int n);
    /* Attention pieces over n K or V rows of hd floats, ld floats apart:
     * s[j] = scale * q . k_j for j < n;  o (+)= sum_j p_j v_j (overwrite
     * unless acc). */
    void (*attn_scores)(float *s, const float *q, const float *k, size_t ld, int n, int hd,
                        float scale);
    void (*attn_accum)(float *o, const float *p, const float *v, size_t ld, int n, int hd,
                       bool acc);
    /* Optional: the two above for nq query heads over the same rows (the query heads of one
     * kv head): head i's q at q + i hd and scores at s + i lds; its probabilities at
     * p + i ldp and output at o + i ldo. The same bits as nq calls of the one-head kernels,
     * which the backend makes where these are NULL. */
    void (*attn_scores_heads)(float *s, size_t lds, const float *q, int nq, const float *k,
                              size_t ld, int n, int hd, float scale);
    void (*attn_accum_heads)(float *o, size_t ldo, const float *p, size_t ldp, int nq,
                             const float *v, size_t ld, int n, int hd, bool acc);
    /* y = silu(g) * u; y may equal g. */
    void (*silu_mul)(float *y, const float *g, const float *u, size_t n);
    void (*gelu_tanh)(float *x, size_t n);
    void (*gelu_erf)(float *x, size_t n);
    /* Mamba-2's SSD recurrence for one (head, channel) pair over n rows of one sequence
     * (backend_cpu_ssm.c). Row i: with dt = dtd[i ldd], a = dtd[i ldd + 1] (the decay) and
     * v = x[i ldx], s = a s + (dt v) b and y[i ldy] = s . c + dskip v, where b = B + i ldbc and
     * c = C + i ldbc hold N floats; s [N] is the pair's state row, updated in place. y may
     * alias x (row i's y is written after its x is read). A pair's arithmetic does not depend
     * on n: rows given in one call or one at a time give the same bits. */
    void (*ssd_rows)(float *s, int N, const float *B, const float *C, size_t ldbc,
                     const float *x, size_t ldx, const float *dtd, size_t ldd, float *y,
                     size_t ldy, float dskip, int n);
    /* The gated delta rule of value head h over rows [i, i + T) of g, one sequence at
     * consecutive positions (backend_cpu_gdn.c): one block when T >= GDN_BLOCK_MIN, else T
     * steps; scr: the thread's scratch of doubles. kern_gdn.h, the same bits on every ISA. */
    void (*gdn_rows)(const struct gdn_ctx *g, double *scr, int i, int T, int h);
    /* The convolution of channels [c0, c1) over every row of cc (backend.h conv1d): kern_conv.h,
     * vectorized across channels; each output sums its taps in the op's order. */
    void (*conv_rows)(const struct conv_ctx *cc, int c0, int c1);
    /* The RG-LRU of channels [c0, c1) over every row of rc (backend.h rglru): kern_rglru.h,
     * the gates' block-diagonal products vectorized across a head's channels. */
    void (*rglru_rows)(const struct rglru_ctx *rc, int c0, int c1);
    /* Mamba's selective scan of one channel over n rows of one sequence
     * (backend_cpu_scan.c). Row i: with d = delta[i ldd] (softplus of dt, computed by the
     * caller) and v = x[i ldx], h = exp(d a) * h + (d v) b and acc[i lda] = h . c, where
     * b = B + i ldbc and c = C + i ldbc hold ds floats and a [ds] is the channel's -exp(A_log);
     * h [ds] is the channel's state, updated in place. Rows in one call or one at a time give
     * the same bits. */
    void (*scan_rows)(float *h, int ds, const float *a, const float *B, const float *C,
                      size_t ldbc, const float *x, size_t ldx, const float *delta, size_t ldd,
                      float *acc, size_t lda, int n);
    /* y = softplus(x) over n (torch's: beta 1, x itself above 20); y may equal x. The ISA
     * variants: max(x, 0) + log1p(exp(-|x|)), log1p by Cephes' logf of 1 + u with Goldberg's
     * correction (relative error ~1e-7). */
    void (*softplus)(float *y, const float *x, int n);
};

/* kern_rec_{ref,avx2,avx512}.c: kern_gdn.h, kern_conv.h and kern_rglru.h compiled for each ISA. */
void kern_gdn_rows_ref(const struct gdn_ctx *g, double *scr, int i, int T, int h);
void kern_gdn_rows_avx2(const struct gdn_ctx *g, double *scr, int i, int T, int h);
void kern_gdn_rows_avx512(const struct gdn_ctx *g, double *scr, int i, int T, int h);
void kern_rglru_rows_ref(const struct rglru_ctx *rc, int c0, int c1);
void kern_rglru_rows_avx2(const struct rglru_ctx *rc, int c0, int c1);
void kern_rglru_rows_avx512(const struct rglru_ctx *rc, int c0, int c1);
void kern_conv_rows_ref(const struct conv_ctx *cc, int c0, int c1);
void kern_conv_rows_avx2(const struct conv_ctx *cc, int c0, int c1);
void kern_conv_rows_avx512(const struct conv_ctx *cc, int c0, int c1);

/* ---- kern_ref.c ---- */
/* Fill k with the scalar reference kernels. */
void cpu_kernels_ref_init(struct cpu_kernels *k);
/* The reference wrow_f32 (ISA variants fall back to it for rare bit widths). */
void kern_ref_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n);
/* Code j of a packed quantized row (bits <= 8), portable byte read. */
static inline unsigned kern_qcode(const uint8_t *row, int bits, size_t j)
{
    size_t o = j * (size_t)bits;
    unsigned v = row[o >> 3];
    if ((o & 7) + (size_t)bits > 8)
        v |= (unsigned)row[(o >> 3) + 1] << 8;
    return (v >> (o & 7)) & ((1u << bits) - 1);
}
/* FP4 E2M1 code (bit 3 sign, 2 exponent bits, 1 mantissa bit) as f32. */
static inline float kern_e2m1(unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}
/* FP8 E4M3 byte as f32, MLX flavour (no NaN: 0x7f is 480). The 7 magnitude
 * bits are placed at the f32 exponent/mantissa boundary (a value 2^-120
 * times too small; subnormals land on f32 subnormals) and rescaled by an
 * exact power-of-two multiply. */
static inline float kern_e4m3(unsigned b)
{
    union { uint32_t u; float f; } v = {.u = (b & 0x80u) << 24 | (b & 0x7fu) << 20};
    return v.f * 0x1p120f;
}
/* E8M0 byte as f32: 2^(b-127); 0 is 2^-127 (an f32 subnormal), 255 is +inf. */
static inline float kern_e8m0(unsigned b)
{
    union { uint32_t u; float f; } v = {.u = b == 0 ? 0x00400000u : b == 255 ? 0x7f800000u : b << 23};
    return v.f;
}
/* Element i of an F32/F16/BF16 vector as f32. */
static inline float kern_ld(const void *p, enum dtype dt, size_t i)
{
    switch (dt) {
    case DTYPE_F16:
        return f16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* Scale of group g of a quantized row whose scales start at s. */
static inline float kern_qscale(const struct wmat *w, const uint8_t *s, size_t g)
{
    switch (w->qmode) {
    case QMODE_MXFP4:
    case QMODE_MXFP8:
        return kern_e8m0(s[g]);
    case QMODE_NVFP4:
        return kern_e4m3(s[g]);
    default:
        return kern_ld(s, w->qsdt, g);
    }
}
/* Value of code q before its group scale for the fp modes: e2m1 / e4m3. */
static inline float kern_qval(const struct wmat *w, unsigned q)
{
    return w->qmode == QMODE_MXFP8 ? kern_e4m3(q) : kern_e2m1(q);
}
/* True for the quantized W whose codes the SIMD matvecs decode in lane order (mv_quant);
 * the others take mv_qgeneric. */
static inline bool kern_q_lanes_ok(const struct wmat *w)
{
    return w->qgroup % 16 == 0 && !(w->qgroup & (w->qgroup - 1)) && w->in % 16 == 0;
}
/* Floats per token of x permuted by qxperm. */
static inline size_t kern_qx_len(int in)
{
    return ((size_t)in + QX_PAD - 1) / QX_PAD * QX_PAD;
}

/*
 * ---- integer quantized matvec (qi) ----
 * Decode is bound by how many instructions a core spends per weight byte.
 * For affine W an ISA variant may therefore take x as 16-bit integers per
 * group g of the weight groups, x_i ~ xs_g q_i with
 *   xs_g = max_{i in g} |x_i| / KERN_QI_QMAX,  q_i = rint(x_i / xs_g),
 * so |x_i - xs_g q_i| <= xs_g / 2 (1.5e-5 of the group's largest |x|,
 * 16 significant bits, far finer than bf16), and compute
 *   y_r = sum_g ws_rg xs_g (sum_{i in g} code_i q_i) + b_rg sum_{i in g} x_i
 * with the integer sums exact (int16 / int8 dot-product instructions) and
 * sum x from the f32 x. KERN_QI_QMAX = 127 * 256 + 127 lets a kernel split q
 * into two int8 limbs, q = 256 hi + lo with hi = (q + 128) >> 8 in
 * [-127, 127] and lo in [-128, 127], for unsigned-by-signed byte products.
 * Non-finite x makes xs_g non-finite and the group's output NaN, as in f32.
 * mxfp4 W (AVX2) is the same with ws_rg = e8m0, code_i = 2 e2m1 + 12
 * (unsigned) and b_rg = -12 ws_rg / 2 (doubled values and the offset taken
 * back); its xsum[g] is xs_g sum_{i in g} q_i, x as rounded, so the offset
 * cancels to f32 rounding.
 *
 * One token's prepared x (kern_qi_len bytes, every part 32-byte aligned):
 *   f32 xs[ng] | f32 xsum[ng] | 2 * in_pad bytes of q in the kernel's order
 * (in_pad = in rounded up to 128, zero filled: the widest step reads 128 codes).
 */
#define KERN_QI_QMAX 32639
static inline size_t kern_qi_hdr(const struct wmat *w)
{
    return ((size_t)(w->in / w->qgroup) * 4 + 31) / 32 * 32;
}
static inline size_t kern_qi_len(const struct wmat *w)
{
    return 2 * kern_qi_hdr(w) + 2 * (((size_t)w->in + 127) / 128 * 128);
}

/* ---- QG16: 4- and 8-bit affine W repacked at load (kern_qpack.c) ----
 * The layout the VNNI GEMM reads (kern_avx512_qi.c), written once by the CPU
 * backend's prepare_weight in place of the stored rows, so no call transposes
 * weights and every product, one token or many, streams W sequentially:
 *   panels of 16 rows (the last zero-padded), one after another, each the
 *   chunks of QG16_CH codes in order, each chunk of cn codes (groups of G):
 *     codes  4-bit: [cn/8][16] u32, word i (codes 8i .. 8i+7 of the chunk,
 *            nibbles as stored) of the panel's 16 rows side by side;
 *            8-bit: [cn/2][16] u16, codes 2i and 2i+1 of the 16 rows
 *     scales [cn/G][16] in the stored dtype (F32/F16/BF16), group-major
 *     biases [cn/G][16]
 * So the bytes of the first c0 columns of a panel (c0 a multiple of QG16_CH)
 * are kern_qg16_bytes(c0, ..), and a panel's size is that of in. The bytes
 * are those of the stored tensor plus the padding rows. */
#define QG16_CH 2048
static inline size_t kern_qg16_bytes(int c0, int bits, int G, size_t ssz)
{
    return (size_t)c0 * 2 * (size_t)bits + 32 * ssz * (size_t)(c0 / G);
}
/* True for the W QG16 holds: affine 4/8-bit, groups 32/64/128, F32/F16/BF16 scales. */
bool kern_qg16_ok(const struct wmat *w);
/* Row r of a QG16 w back in the stored layout: in * bits / 8 bytes of codes, then in/G
 * scales, then in/G biases (ssz bytes each); returns the bytes written. */
size_t kern_qg16_unpack_row(uint8_t *dst, const struct wmat *w, int r);

/* ---- FPAN: float W (F32/F16/BF16) repacked at load (kern_fpan.c) ----
 * Panels of FPAN_R = 32 rows (the last zero-padded), one after another, each
 * in "k-lines" in order: k-line i holds W[32p + j, i] for j < 32 in the stored
 * dtype, 32 * element bytes (64 for F16/BF16, 128 for F32), at the slot
 * kern_fpan_slot gives: F32 and F16 in row order; BF16 rows j and 16 + j share
 * the 32-bit word j (j in the low half), so one shift and one mask make f32 of
 * both halves. A product then streams each panel once, sequentially, for any
 * number of tokens, with nothing to transpose. Every output is summed the same
 * way: over blocks of FPAN_KC inputs in order, each block's products added in
 * order into a block sum (fused multiply-add, from 0), the block sums added in
 * order into y; so a token's outputs do not depend on the tokens beside it. */
#define FPAN_R 32
#define FPAN_KC 256
static inline int kern_fpan_slot(enum dtype dt, int j)
{
    return dt == DTYPE_BF16 ? (j < 16 ? 2 * j : 2 * (j - 16) + 1) : j;
}
static inline size_t kern_fpan_bytes(int in, enum dtype dt)
{
    return (size_t)in * FPAN_R * dtype_size(dt);
}
/* True for the stored W that FPAN holds: F32/F16/BF16, not quantized. */
bool kern_fpan_ok(const struct wmat *w);
/* Panels [p0, p1) of w (stored layout) as FPAN into dst, which holds every panel. */
void kern_fpan_pack(uint8_t *dst, const struct wmat *w, int p0, int p1);
/* Row r of an FPAN w back in the stored layout (in elements of its dtype) at dst. */
void kern_fpan_unpack_row(uint8_t *dst, const struct wmat *w, int r);

/* ---- kern_avx2.c / kern_avx512.c ---- */
/* Overlay the variant's kernels on k; false when it was compiled out. */
bool cpu_kernels_avx2_init(struct cpu_kernels *k);
bool cpu_kernels_avx512_init(struct cpu_kernels *k);
/* kern_avx2_qi.c: the AVX2 integer matvec entries (qi_*); a no-op when compiled out. */
void kern_avx2_qi_init(struct cpu_kernels *k);
/* Its matvec_qi, which kern_avx512_qi.c calls for the modes it leaves to AVX2 (mxfp4). */
void kern_avx2_matvec_qi(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                         const struct wmat *w, int r0, int r1);
/* kern_avx512_qv.c: the VNNI integer matvec of rows [r0, r1) of a stored affine 4/8-bit w,
 * L limbs of x per 4-bit code (1: --fast); kern_avx512_qi.c's matvec_qi calls it. */
void kern_avx512_qv_rows(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                         const struct wmat *w, int r0, int r1, int L);
/* kern_avx512_qi.c: the VNNI matvec_qi over the AVX2 entries (call only when
 * cpu_has_avx512_vnni()); false when compiled out or without them. */
bool kern_avx512_qi_init(struct cpu_kernels *k);

/* ---- dispatch.c ---- */
enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2   = 1,
    CPU_ISA_AVX512 = 2,
};
/* AVX512_VNNI on top of the avx512 level (CPUID leaf 7, ECX bit 11). */
bool cpu_has_avx512_vnni(void);
/* Best ISA this CPU and OS can run (CPUID + xgetbv). */
enum cpu_isa cpu_isa_best(void);
const char *cpu_isa_name(enum cpu_isa isa);
/* Parse "scalar"/"avx2"/"avx512"/"auto" ("auto" -> best); -1 if unknown. */
int cpu_isa_parse(const char *s, enum cpu_isa *out);
/* Fill k for isa; false if the variant was compiled out. */
bool cpu_kernels_init(struct cpu_kernels *k, enum cpu_isa isa);
