/*
 * kern_avx512_mv: the AVX-512 matvecs (kern.h matvec, qxperm, wrow_f32): float rows one
 * token at a time or in blocks of tokens, quantized rows decoded in lane order against x
 * permuted once per call, or generically. The plan (linear_plan.h) names the kernel of a
 * call in wmat.kid. See kern_avx512.c for the file's place among the variants.
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kern_avx512.h"

// ---- quantized weights ----

/*
 * Codes are unpacked in one of two orders.
 *
 * Natural order (wrow_f32: GEMM panels, embedding rows): the 16 codes
 * c .. c+15 (c a multiple of 16, so they start on a byte) fill 2*bits
 * bytes; a masked load reads exactly those, vbroadcasti32x4 copies them to
 * every 128-bit lane, vpshufb moves the one or two bytes code i straddles
 * into dword i, vpsrlvd aligns it, an AND keeps its bits.
 *
 * Lane order (matvec): a block is 16 dword lanes, lane i holding the cpl
 * consecutive codes cpl*i .. cpl*i+cpl-1 at bit offsets bits*j, so
 * extraction j (a shift and an AND, or a table lookup) yields code
 * cpl*i + j of every lane at once. 2/4/8-bit blocks are one 64-byte load
 * (a word is a lane); 3- and 6-bit blocks put 3 bytes in each lane (8 or 4
 * codes) and 5-bit blocks 5 bytes in each pair of lanes (4 codes each, the
 * odd lane shifted by 4): per 128-bit lane one masked 16-byte load of the
 * next 12 (10) bytes and one vpshufb for the whole block. The matvec takes
 * x permuted to match (a512_qxperm). A lane never straddles a group (cpl
 * divides 16), so each lane has one scale; lanes of a block are weighted
 * by a per-lane scale vector built with one vpermps. 8-bit rows (affine and
 * mxfp8) skip the lane order: one zero-/sign-extending load per 16 codes
 * already gives natural order (qdec8_nat).
 */

/* Codes per lane of the lane order. */
static inline int q_cpl(int bits)
{
    return bits == 2 ? 16 : bits == 3 || bits == 4 ? 8 : 4;
}

/* Lane-order matvec applies when every lane lies in one group (and groups
 * are powers of two, as MLX's all are). */
/* x permuted to lane order: block of B = 16 cpl codes, dst[b + 16 j + i] =
 * x[b + cpl i + j]; lanes past `in` and the padding to QX_PAD are 0. */
void a512_qxperm(float *dst, const float *x, const struct wmat *w)
{
    int in = w->in, bits = w->qbits, group = w->qgroup;
    size_t len = kern_qx_len(in);
    if (group % 16 || (group & (group - 1)) || in % 16) {
        memcpy(dst, x, (size_t)in * sizeof *x);
        memset(dst + in, 0, (len - (size_t)in) * sizeof *dst);
        return;
    }
    if (bits == 8) {
        /* natural order; mxfp8 x times 2^8, which its f16 decode leaves out */
        __m512 k = _mm512_set1_ps(w->qmode == QMODE_MXFP8 ? 256.0f : 1.0f);
        for (size_t i = 0; i < len; i += 16) {
            __mmask16 m = tail_mask(in - (int)i > 0 ? in - (int)i : 0);
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), k));
        }
        return;
    }
    int cpl = q_cpl(bits), bc = 16 * cpl;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i step = _mm512_mullo_epi32(iota, _mm512_set1_epi32(cpl)); /* lane i reads cpl i + j */
    for (size_t b = 0; b < len; b += (size_t)bc)
        for (int j = 0; j < cpl; j++) {
            __m512i idx = _mm512_add_epi32(step, _mm512_set1_epi32(j));
            /* lanes whose source lies past `in` read nothing and are 0 */
            __mmask16 m = _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(in - (int)b));
            __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, x + b, 4);
            _mm512_storeu_ps(dst + b + 16 * (size_t)j, v);
        }
}

AI __mmask16 bmask16(int nbytes)
{
    return nbytes >= 16 ? (__mmask16)0xffff : nbytes <= 0 ? 0 : (__mmask16)((1u << nbytes) - 1);
}

/* One lane-order block of `bits`-bit codes: nb valid bytes at p (a full
 * block is 2 bits words = 16 cpl codes); nothing past p + nb is read. */
AI __m512i qload_lanes(const uint8_t *p, const int bits, int nb)
{
    if (bits == 2 || bits == 4 || bits == 8) {
        if (nb >= 64)
            return _mm512_loadu_si512(p);
        return _mm512_maskz_loadu_epi32(tail_mask(nb / 4), p);
    }
    const int sb = bits == 5 ? 10 : 12; /* bytes per 128-bit lane */
    __m512i v = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(bmask16(nb < sb ? nb : sb), p));
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(bmask16(nb - sb < sb ? nb - sb : sb), p + sb), 1);
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(bmask16(nb - 2 * sb < sb ? nb - 2 * sb : sb), p + 2 * sb), 2);
    v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi8(bmask16(nb - 3 * sb < sb ? nb - 3 * sb : sb), p + 3 * sb), 3);
    const __m512i pat3 = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1));
    const __m512i pat5 = _mm512_broadcast_i32x4(
        _mm_setr_epi8(0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1));
    if (bits == 5)
        return _mm512_srlv_epi32(_mm512_shuffle_epi8(v, pat5),
                                 _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
    return _mm512_shuffle_epi8(v, pat3);
}

/* E4M3 byte in bits 0-7 of each dword (higher bits ignored) -> f32: sign to
 * bit 31, the 7 magnitude bits to bits 20-26, times 2^120 (exact, also for
 * subnormals; see kern_e4m3). */
AI __m512 e4m3_ps(__m512i d)
{
    __m512i sgn = _mm512_slli_epi32(d, 24);
    __m512i mag = _mm512_srli_epi32(_mm512_slli_epi32(d, 25), 5);
    __m512i f = _mm512_ternarylogic_epi32(sgn, mag, _mm512_set1_epi32((int)0x80000000u), 0xe4);
    return _mm512_mul_ps(_mm512_castsi512_ps(f), _mm512_set1_ps(0x1p120f));
}

/* Values of extraction j of a lane-order block, before the group scale:
 * the code as f32 (affine), e2m1 (fp4: vpermps reads index bits 0-3 only,
 * so no mask) or e4m3 (fp8). */
AI __m512 qdec_lanes(__m512i v, const int bits, const int j, const enum qmode mode, __m512 lut)
{
    if (mode == QMODE_MXFP8) {
        /* byte j: sign bit 8j+7 -> 31, magnitude bits 8j..8j+6 -> 20..26 */
        __m512i sgn = 24 - 8 * j > 0 ? _mm512_slli_epi32(v, 24 - 8 * j) : v;
        __m512i mag = 20 - 8 * j > 0 ? _mm512_slli_epi32(v, 20 - 8 * j) : _mm512_srli_epi32(v, 8 * j - 20);
        mag = _mm512_and_si512(mag, _mm512_set1_epi32(0x07f00000));
        __m512i f = _mm512_ternarylogic_epi32(sgn, mag, _mm512_set1_epi32((int)0x80000000u), 0xe4);
        return _mm512_mul_ps(_mm512_castsi512_ps(f), _mm512_set1_ps(0x1p120f));
    }
    __m512i t = j ? _mm512_srli_epi32(v, bits * j) : v;
    if (mode != QMODE_AFFINE || bits <= 4) /* table of 16: fp4 values, or k & (2^bits - 1) */
        return _mm512_permutexvar_ps(t, lut);
    const int lane_bits = bits == 5 ? 0 : bits == 6 ? 24 : 32;
    if (bits * (j + 1) != lane_bits)
        t = _mm512_and_si512(t, _mm512_set1_epi32((1 << bits) - 1));
    return _mm512_cvtepi32_ps(t);
}

/* The 16-entry table qdec_lanes looks codes up in. */
AI __m512 qlut(const int bits, const enum qmode mode)
{
    if (mode == QMODE_MXFP4 || mode == QMODE_NVFP4)
        return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                              -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    __m512i k = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_cvtepi32_ps(_mm512_and_si512(k, _mm512_set1_epi32(bits < 4 ? (1 << bits) - 1 : 15)));
}

/* n scales of a row (starting at group g0) as f32 into dst, and 16 zeros after. */
static void qscales_f32(float *dst, const struct wmat *w, const uint8_t *s, int g0, int n)
{
    if (w->qmode == QMODE_AFFINE) {
        a512_to_f32(dst, s + (size_t)g0 * dtype_size(w->qsdt), w->qsdt, (size_t)n);
    } else {
        for (int i = 0; i < n; i += 16) {
            __mmask16 m = tail_mask(n - i);
            __m512i d = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s + g0 + i));
            __m512 v;
            if (w->qmode == QMODE_NVFP4) {
                v = e4m3_ps(d);
            } else { /* e8m0: s << 23; 0 -> 2^-127; 255 << 23 is +inf already */
                __m512i e = _mm512_slli_epi32(d, 23);
                e = _mm512_mask_mov_epi32(e, _mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()),
                                          _mm512_set1_epi32(0x00400000));
                v = _mm512_castsi512_ps(e);
            }
            _mm512_mask_storeu_ps(dst + i, m, v);
        }
    }
    _mm512_storeu_ps(dst + n, _mm512_setzero_ps());
}

/* Bytes ahead prefetched in each of the 4 weight rows a matvec step reads:
 * the same offset of the next block of 4 rows, at most 16 KiB (a fixed 1 KiB
 * only reached into the neighbouring row, which its own stream was already
 * reading; measured on the AVX2 twin, kern_qi.h). */
#define MV_PF_MAX 16384
AI size_t mv_pf(const struct wmat *w)
{
    return 4 * w->row_bytes < MV_PF_MAX ? 4 * w->row_bytes : MV_PF_MAX;
}

/* Codes per matvec chunk: scales of 4 rows for one chunk are widened to the
 * stack at a time (a multiple of every block size and group size). */
#define QCH 2048

/* 8-bit rows are not in lane order but natural order (faster in L2 than
 * lane order for q8: no shift/mask, one zero-extending load per vector):
 * vector jj of a 64-code block is codes 16 jj .. 16 jj + 15, zero-extended
 * straight from memory (vpmovzxbd), and x is not permuted for them. nb
 * valid bytes from p. */
AI __m512 qdec8_nat(const uint8_t *p, int nb, const enum qmode mode)
{
    __m128i b = nb >= 16 ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(bmask16(nb), p);
    if (mode == QMODE_MXFP8) {
        /* e4m3 -> f16 exactly, 2^-8 too small (f16 bias 15, e4m3 bias 7;
         * e4m3 subnormals land on f16 subnormals): sign-extend each byte to
         * 16 bits, shift left by 7 (sign to bit 15, magnitude to bits
         * 7-13) and clear bit 14; vcvtph2ps is exact. x comes times 2^8
         * (a512_qxperm), so every product equals e4m3(q) * x in f32. */
        __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
        h = _mm256_and_si256(h, _mm256_set1_epi16((short)0xbf80));
        return _mm512_cvtph_ps(h);
    }
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

/* One lane-order block of 4 rows against x (xb: this block's 16 cpl
 * permuted x values): acc[j] += sv[j] * sum_jj dec(v[j], jj) * x_jj with two
 * partial sums per row (8 independent FMA chains hide the FMA latency). */
AI void mvq_step(__m512 acc[4], const uint8_t *const p[4], int nb, const float *xb,
                 const float *sf[4], int gb, __m512i sidx, bool lanes, const int bits,
                 const enum qmode mode, __m512 lut)
{
    const int cpl = q_cpl(bits);
    const bool nat = bits == 8;
    __m512i v[4];
    if (!nat)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            v[j] = qload_lanes(p[j], bits, nb);
    __m512 ga[4][2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        ga[j][0] = ga[j][1] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int jj = 0; jj < cpl; jj++) {
        __m512 xj = _mm512_loadu_ps(xb + 16 * jj);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            if (nat)
                ga[j][jj >> 1] = _mm512_fmadd_ps(qdec8_nat(p[j] + 16 * jj, nb - 16 * jj, mode), xj,
                                                 ga[j][jj >> 1]);
            else
                ga[j][jj & 1] = _mm512_fmadd_ps(qdec_lanes(v[j], bits, jj, mode, lut), xj, ga[j][jj & 1]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (nat && lanes) { /* natural 8-bit, groups of 32: vectors 0-1 and 2-3 */
            acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(sf[j][gb]), ga[j][0], acc[j]);
            acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(sf[j][gb + 1]), ga[j][1], acc[j]);
            continue;
        }
        __m512 sv = lanes ? _mm512_permutexvar_ps(sidx, _mm512_loadu_ps(sf[j] + gb))
                          : _mm512_set1_ps(sf[j][gb]);
        acc[j] = _mm512_fmadd_ps(sv, _mm512_add_ps(ga[j][0], ga[j][1]), acc[j]);
    }
}

/*
 * Rows r0 .. r0+nr (nr <= 4; a missing row repeats the last one, computed
 * but not stored) for every token. Per block, each row's codes are decoded
 * in registers and multiplied into per-block partial sums against the
 * shared x vectors (one load per 16 x values for 4 rows); the block sum is
 * then weighted by the per-lane scales (one FMA) into the row's
 * accumulator: sum_g s_g sum_{i in g} v(q_i) x_i. Affine adds
 * sum_g b_g sum_{i in g} x_i from the precomputed group sums of x.
 */
AI void mvq_block(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                  const struct wmat *w, int r0, int nr, const float *xsum, size_t ldxs,
                  const int bits, const enum qmode mode)
{
    const int cpl = q_cpl(bits), bc = 16 * cpl, bb = bc * bits / 8;
    const int in = w->in, g = w->qgroup;
    const bool aff = mode == QMODE_AFFINE, lanes = bc > g;
    const int gshift = __builtin_ctz((unsigned)g); /* g is a power of two (kern_q_lanes_ok) */
    const size_t pfd = mv_pf(w);
    const uint8_t *rw[4], *rs[4], *rb[4];
    float sfb[4][QCH / 16 + 16], bf[4][QCH / 16 + 16];
    const float *sf[4] = {sfb[0], sfb[1], sfb[2], sfb[3]};
    const __m512 lut = qlut(bits, mode);
    /* lane i of a block reads scale (cpl i) / g of the block's first group */
    __m512i sidx = _mm512_setzero_si512();
    if (lanes) {
        int ix[16];
        for (int i = 0; i < 16; i++)
            ix[i] = cpl * i / g;
        sidx = _mm512_loadu_si512(ix);
    }
    for (int j = 0; j < 4; j++) {
        int r = r0 + (j < nr ? j : nr - 1);
        rw[j] = w->data + (size_t)r * w->row_bytes;
        rs[j] = w->qs + (size_t)r * w->qrow_bytes;
        rb[j] = aff ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    }
    for (int c0 = 0; c0 < in; c0 += QCH) {
        int cn = in - c0 < QCH ? in - c0 : QCH, g0 = c0 / g, gn = cn / g;
        for (int j = 0; j < 4; j++) {
            qscales_f32(sfb[j], w, rs[j], g0, gn);
            if (aff)
                qscales_f32(bf[j], w, rb[j], g0, gn);
        }
        int nfull = cn / bc;
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx + c0;
            const uint8_t *p[4];
            __m512 acc[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                acc[j] = _mm512_setzero_ps();
                p[j] = rw[j] + (size_t)c0 * bits / 8;
            }
            int b = 0;
            if (t == 0) {
                for (; b < nfull; b++) {
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        _mm_prefetch((const char *)p[j] + pfd, _MM_HINT_T0);
                    mvq_step(acc, p, bb, xt + b * bc, sf, (b * bc) >> gshift, sidx, lanes, bits,
                             mode, lut);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        p[j] += bb;
                }
            } else {
                for (; b < nfull; b++) {
                    mvq_step(acc, p, bb, xt + b * bc, sf, (b * bc) >> gshift, sidx, lanes, bits,
                             mode, lut);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        p[j] += bb;
                }
            }
            if (b * bc < cn) { /* partial block: masked loads, zero x past the end */
                int nb = (cn - b * bc) * bits / 8;
                mvq_step(acc, p, nb, xt + b * bc, sf, (b * bc) >> gshift, sidx, lanes, bits, mode,
                         lut);
            }
            for (int j = 0; j < nr; j++) {
                float v = _mm512_reduce_add_ps(acc[j]);
                if (aff) {
                    const float *xs = xsum + (size_t)t * ldxs + g0;
                    __m512 bs = _mm512_setzero_ps();
                    for (int i = 0; i < gn; i += 16) {
                        __mmask16 m = tail_mask(gn - i);
                        bs = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bf[j] + i),
                                             _mm512_maskz_loadu_ps(m, xs + i), bs);
                    }
                    v += _mm512_reduce_add_ps(bs);
                }
                float *yo = y + (size_t)t * ldy + (size_t)(r0 + j);
                *yo = c0 ? *yo + v : v;
            }
        }
    }
}

/* Quantized rows on the lane-order path, one instantiation per (bits, mode). */
static void mv_quant(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                     const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
#define MVQ(B, M) mvq_block(y, ldy, x, ldx, n_tok, w, r, nr, xsum, ldxs, B, M)
    for (int r = r0; r < r1; r += 4) {
        int nr = r1 - r < 4 ? r1 - r : 4;
        switch (w->qmode) {
        case QMODE_MXFP4:
        case QMODE_NVFP4:
            MVQ(4, QMODE_MXFP4);
            break;
        case QMODE_MXFP8:
            MVQ(8, QMODE_MXFP8);
            break;
        default:
            switch (w->qbits) {
            case 2: MVQ(2, QMODE_AFFINE); break;
            case 3: MVQ(3, QMODE_AFFINE); break;
            case 4: MVQ(4, QMODE_AFFINE); break;
            case 5: MVQ(5, QMODE_AFFINE); break;
            case 6: MVQ(6, QMODE_AFFINE); break;
            default: MVQ(8, QMODE_AFFINE); break;
            }
        }
    }
#undef MVQ
}

/* Quantized rows the lane path cannot take (group not a multiple of 16):
 * dequantize 256 at a time (natural order, x not permuted), then dot. */
static void mv_qgeneric(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                        const struct wmat *w, int r0, int r1)
{
    float buf[256] __attribute__((aligned(64)));
    for (int r = r0; r < r1; r++) {
        for (int t = 0; t < n_tok; t++) {
            const float *xt = x + (size_t)t * ldx;
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < w->in; c += 256) {
                int len = w->in - c < 256 ? w->in - c : 256;
                kern_ref_wrow_f32(buf, w, r, c, len);
                for (int i = 0; i < len; i += 16) {
                    __mmask16 m = tail_mask(len - i);
                    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, buf + i),
                                          _mm512_maskz_loadu_ps(m, xt + c + i), acc);
                }
            }
            y[(size_t)t * ldy + (size_t)r] = _mm512_reduce_add_ps(acc);
        }
    }
}

/* Dequantize W[r, k0 .. k0+n) (k0 a multiple of 16) in natural order, 16
 * codes per step (see the top of this section); the last step is masked. */
AI void wrow_q_t(float *dst, const struct wmat *w, int r, int k0, int n, const int bits,
                 const enum qmode mode)
{
    const uint8_t *row = w->data + (size_t)r * w->row_bytes;
    const uint8_t *s = w->qs + (size_t)r * w->qrow_bytes;
    const uint8_t *bq = w->qb ? w->qb + (size_t)r * w->qrow_bytes : NULL;
    uint8_t pat[64];
    int sh[16];
    for (int i = 0; i < 16; i++) {
        int o = i * bits, b0 = o >> 3;
        sh[i] = o & 7;
        for (int k = 0; k < 4; k++)
            pat[4 * i + k] = k == 0 ? (uint8_t)b0 : k == 1 && b0 + 1 < 16 ? (uint8_t)(b0 + 1) : 0x80;
    }
    /* vpshufb indexes within each 128-bit lane; the broadcast makes all 16 bytes present in each */
    const __m512i vpat = _mm512_loadu_si512(pat), vsh = _mm512_loadu_si512(sh);
    const __m512i vmask = _mm512_set1_epi32((1 << bits) - 1);
    const __m512 lut = qlut(4, mode);
    for (int i = 0; i < n; i += 16) {
        int c = k0 + i, nc = n - i < 16 ? n - i : 16, grp = c / w->qgroup;
        __m128i raw = _mm_maskz_loadu_epi8(bmask16((nc * bits + 7) / 8), row + (size_t)c * bits / 8);
        __m512i q = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), vpat), vsh), vmask);
        __m512 v;
        if (mode == QMODE_AFFINE)
            v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(kern_ld(s, w->qsdt, (size_t)grp)),
                                _mm512_set1_ps(kern_ld(bq, w->qsdt, (size_t)grp)));
        else
            v = _mm512_mul_ps(mode == QMODE_MXFP8 ? e4m3_ps(q) : _mm512_permutexvar_ps(q, lut),
                              _mm512_set1_ps(kern_qscale(w, s, (size_t)grp)));
        _mm512_mask_storeu_ps(dst + i, tail_mask(nc), v);
    }
}

/* Dequantize W[r, k0 .. k0+n) (k0 a multiple of 16). */
void a512_wrow_f32(float *dst, const struct wmat *w, int r, int k0, int n)
{
    if (!w->qbits) {
        a512_to_f32(dst, w->data + (size_t)r * w->row_bytes + (size_t)k0 * dtype_size(w->dt),
                    w->dt, (size_t)n);
        return;
    }
    if ((k0 & 15) || w->qgroup % 16) {
        kern_ref_wrow_f32(dst, w, r, k0, n);
        return;
    }
    switch (w->qmode) {
    case QMODE_MXFP4:
    case QMODE_NVFP4:
        wrow_q_t(dst, w, r, k0, n, 4, QMODE_MXFP4);
        break;
    case QMODE_MXFP8:
        wrow_q_t(dst, w, r, k0, n, 8, QMODE_MXFP8);
        break;
    default:
        switch (w->qbits) {
        case 2: wrow_q_t(dst, w, r, k0, n, 2, QMODE_AFFINE); break;
        case 3: wrow_q_t(dst, w, r, k0, n, 3, QMODE_AFFINE); break;
        case 4: wrow_q_t(dst, w, r, k0, n, 4, QMODE_AFFINE); break;
        case 5: wrow_q_t(dst, w, r, k0, n, 5, QMODE_AFFINE); break;
        case 6: wrow_q_t(dst, w, r, k0, n, 6, QMODE_AFFINE); break;
        default: wrow_q_t(dst, w, r, k0, n, 8, QMODE_AFFINE); break;
        }
    }
}

// ---- matvec ----


/* Row r for one token, one row at a time: the matrix is then one sequential stream, which
 * the hardware prefetcher follows across rows; four rows side by side were four streams a
 * page apart, and slower (ADR 0036). Even and odd pieces of 32 in two accumulators (the
 * FMA chains), the masked tail into the even one, then one reduce. */
AI void mv_row(float *y, const float *x, const struct wmat *w, int r, enum dtype dt)
{
    const void *wr = w->data + (size_t)r * w->row_bytes;
    const int in = w->in;
    const size_t es = dt == DTYPE_F32 ? 4 : 2, pfd = mv_pf(w);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= in; i += 32) {
        _mm_prefetch((const char *)wr + (size_t)i * es + pfd, _MM_HINT_T0);
        if (es == 4)
            _mm_prefetch((const char *)wr + (size_t)i * es + pfd + 64, _MM_HINT_T0);
        a0 = _mm512_fmadd_ps(ld16f(wr, dt, (size_t)i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(ld16f(wr, dt, (size_t)i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < in; i += 16) {
        __mmask16 m = tail_mask(in - i);
        a0 = _mm512_fmadd_ps(ld16(wr, dt, (size_t)i, m), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* Rows r0, r0+1 (nr <= 2) for T (<= 4) tokens from x at once: each
 * 16-input piece of a row is widened once and multiplied by all T tokens,
 * instead of once per token as mv_row does (16 accumulators). Every
 * token's sum is formed exactly as mv_row forms it (even and odd pieces
 * of 32 in two accumulators, the masked tail into the even one, then one
 * reduce), so a token's outputs do not depend on the tokens beside it. */
AI void mv_block_t(float *y, size_t ldy, const float *x, size_t ldx, const struct wmat *w, int r0,
                   int nr, enum dtype dt, bool pf, const int T)
{
    const void *wr[2];
    int in = w->in;
    size_t es = dt == DTYPE_F32 ? 4 : 2;
    size_t pfd = 2 * w->row_bytes < MV_PF_MAX ? 2 * w->row_bytes : MV_PF_MAX;
    for (int j = 0; j < 2; j++)
        wr[j] = w->data + (size_t)(r0 + (j < nr ? j : nr - 1)) * w->row_bytes;
    __m512 a[2][4][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        a[0][t][0] = a[0][t][1] = a[1][t][0] = a[1][t][1] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= in; i += 32) {
        __m512 w0[2], w1[2];
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) {
            if (pf)
                _mm_prefetch((const char *)wr[j] + (size_t)i * es + pfd, _MM_HINT_T0);
            w0[j] = ld16f(wr[j], dt, (size_t)i);
            w1[j] = ld16f(wr[j], dt, (size_t)i + 16);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx + i;
            __m512 x0 = _mm512_loadu_ps(xt), x1 = _mm512_loadu_ps(xt + 16);
#pragma GCC unroll 2
            for (int j = 0; j < 2; j++) {
                a[j][t][0] = _mm512_fmadd_ps(w0[j], x0, a[j][t][0]);
                a[j][t][1] = _mm512_fmadd_ps(w1[j], x1, a[j][t][1]);
            }
        }
    }
    for (; i < in; i += 16) {
        __mmask16 m = tail_mask(in - i);
        __m512 w0[2] = {ld16(wr[0], dt, (size_t)i, m), ld16(wr[1], dt, (size_t)i, m)};
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + i);
            a[0][t][0] = _mm512_fmadd_ps(w0[0], x0, a[0][t][0]);
            a[1][t][0] = _mm512_fmadd_ps(w0[1], x0, a[1][t][0]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nr; j++)
            y[(size_t)t * ldy + (size_t)(r0 + j)] =
                _mm512_reduce_add_ps(_mm512_add_ps(a[j][t][0], a[j][t][1]));
}

/* mv_block_p: MVP_R rows by up to MVP_T tokens a pass, over blocks of MVP_KB inputs (x of
 * 8 tokens in a block is 16 KiB: it stays in L1 for both parities and every token group);
 * the plan takes it from LP_A512_MVP_MIN tokens (ADR 0038). */
#define MVP_R 4
#define MVP_T 6
#define MVP_KB 512

/* The next rows' bytes [p, end), asked for n lines a step of mv_block_p: spread over
 * every pass, since a burst of prefetches from DRAM (a row group's 32 KiB in one pass)
 * waits for miss buffers. */
struct mv_pfw {
    const char *p, *end;
    int n;
};

/* Rows r0 .. r0+nr (nr <= R, MVP_R) for T (<= MVP_T) tokens over inputs k0 .. k1, one
 * parity at a time: mv_row keeps two chains per row (the even 16-input
 * pieces of each 32 and the odd ones, the masked tail into the even chain),
 * which never meet before the reduce, so this walks the even pieces of the R
 * rows for every token, then the odd ones, with one accumulator per row and
 * token. Each piece of a row is widened once for the T tokens and each load of
 * x feeds R rows. The chains carry over blocks of inputs in acc ([2][R][T]:
 * zeroed when k0 is 0; reduced into y when k1 is the row's end), so x of a
 * block stays in L1 for every token group. A token's sums are mv_row's, so its
 * outputs do not depend on the tokens beside it. Each step of 32 inputs asks
 * for pf->n more lines of the rows ahead (mv_pfw). */
AI void mv_block_p(float *y, size_t ldy, const float *x, size_t ldx, const struct wmat *w, int r0,
                   int nr, enum dtype dt, int k0, int k1, __m512 *acc, struct mv_pfw *pf, const int T)
{
    enum { R = MVP_R };
    const char *wr[R];
    const int in = w->in;
    for (int j = 0; j < R; j++)
        wr[j] = (const char *)w->data + (size_t)(r0 + (j < nr ? j : nr - 1)) * w->row_bytes;
#pragma GCC unroll 2
    for (int par = 0; par < 2; par++) {
        __m512 a[R][MVP_T];
        __m512 *ap = acc + (size_t)par * R * T;
#pragma GCC unroll 4
        for (int j = 0; j < R; j++)
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
                a[j][t] = k0 ? ap[j * T + t] : _mm512_setzero_ps();
        int i = k0;
        for (; i + 32 <= k1; i += 32) {
            const size_t p = (size_t)i + 16 * (size_t)par;
            __m512 wv[R];
            for (int q = 0; q < pf->n && pf->p < pf->end; q++, pf->p += 64)
                _mm_prefetch(pf->p, _MM_HINT_T1);
#pragma GCC unroll 4
            for (int j = 0; j < R; j++)
                wv[j] = ld16f(wr[j], dt, p);
#pragma GCC unroll 6
            for (int t = 0; t < T; t++) {
                const __m512 xv = _mm512_loadu_ps(x + (size_t)t * ldx + p);
#pragma GCC unroll 4
                for (int j = 0; j < R; j++)
                    a[j][t] = _mm512_fmadd_ps(wv[j], xv, a[j][t]);
            }
        }
        if (!par)
            for (; i < k1; i += 16) {
                const __mmask16 m = tail_mask(k1 - i);
                __m512 wv[R];
#pragma GCC unroll 4
                for (int j = 0; j < R; j++)
                    wv[j] = ld16(wr[j], dt, (size_t)i, m);
#pragma GCC unroll 6
                for (int t = 0; t < T; t++) {
                    const __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)t * ldx + i);
#pragma GCC unroll 4
                    for (int j = 0; j < R; j++)
                        a[j][t] = _mm512_fmadd_ps(wv[j], xv, a[j][t]);
                }
            }
#pragma GCC unroll 4
        for (int j = 0; j < R; j++)
#pragma GCC unroll 6
            for (int t = 0; t < T; t++)
                ap[j * T + t] = a[j][t];
    }
    if (k1 < in)
        return;
#pragma GCC unroll 6
    for (int t = 0; t < T; t++)
        for (int j = 0; j < nr; j++)
            y[(size_t)t * ldy + (size_t)(r0 + j)] =
                _mm512_reduce_add_ps(_mm512_add_ps(acc[j * T + t], acc[(size_t)R * T + j * T + t]));
}

/* Float rows [r0, r1), by the kernel the plan named (w->kid): one token a row at a time
 * (mv_row, which streams them); up to 4 tokens a pass over a pair of rows, which stays in
 * L1 for the next 4 (mv_block_t); or mv_block_p. Only the first pass of mv_block_t
 * prefetches the next rows; mv_block_p spreads its prefetches over every pass. */
AI void mv_rows(float *y, size_t ldy, const float *x, size_t ldx, int n_tok, const struct wmat *w,
                int r0, int r1, enum dtype dt)
{
    if (w->kid == LK_A512_MV_ROW) {
        for (int r = r0; r < r1; r++)
            mv_row(y, x, w, r, dt);
        return;
    }
    if (w->kid == LK_A512_MV_BLOCK_T) {
        for (int r = r0; r < r1; r += 2) {
            int nr = r1 - r < 2 ? r1 - r : 2;
            for (int t = 0; t < n_tok; t += 4) {
                float *yt = y + (size_t)t * ldy;
                const float *xt = x + (size_t)t * ldx;
                switch (n_tok - t < 4 ? n_tok - t : 4) {
                case 1: mv_block_t(yt, ldy, xt, ldx, w, r, nr, dt, t == 0, 1); break;
                case 2: mv_block_t(yt, ldy, xt, ldx, w, r, nr, dt, t == 0, 2); break;
                case 3: mv_block_t(yt, ldy, xt, ldx, w, r, nr, dt, t == 0, 3); break;
                default: mv_block_t(yt, ldy, xt, ldx, w, r, nr, dt, t == 0, 4); break;
                }
            }
        }
        return;
    }
    __m512 acc[2 * MVP_R * 16];
    const size_t es = dt == DTYPE_F32 ? 4 : 2;
    /* lines of the next row group per step: its MVP_R rows of in * es bytes over the steps
     * of 32 inputs of every pass (two parities per group of tokens), rounded up */
    const int passes = 2 * (((n_tok < 16 ? n_tok : 16) + MVP_T - 1) / MVP_T);
    struct mv_pfw pf = {.n = (int)(((size_t)MVP_R * es + 2 * (size_t)passes - 1) / (2 * (size_t)passes))};
    for (int r = r0; r < r1; r += MVP_R) {
        int nr = r1 - r < MVP_R ? r1 - r : MVP_R, re = r1 - r < 2 * MVP_R ? r1 : r + 2 * MVP_R;
        pf.p = (const char *)w->data + (size_t)(r + nr) * w->row_bytes;
        pf.end = (const char *)w->data + (size_t)re * w->row_bytes;
        for (int tb = 0; tb < n_tok; tb += 16) { /* at most 16 tokens' chains in acc */
            const int te = n_tok - tb < 16 ? n_tok : tb + 16;
            for (int k0 = 0; k0 < w->in; k0 += MVP_KB) {
                const int k1 = w->in - k0 < MVP_KB ? w->in : k0 + MVP_KB;
                for (int t = tb; t < te; t += MVP_T) {
                    float *yt = y + (size_t)t * ldy;
                    const float *xt = x + (size_t)t * ldx;
                    __m512 *at = acc + 2 * MVP_R * (size_t)(t - tb);
                    switch (te - t < MVP_T ? te - t : MVP_T) {
                    case 1: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 1); break;
                    case 2: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 2); break;
                    case 3: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 3); break;
                    case 4: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 4); break;
                    case 5: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 5); break;
                    default: mv_block_p(yt, ldy, xt, ldx, w, r, nr, dt, k0, k1, at, &pf, 6); break;
                    }
                }
            }
        }
    }
}

void a512_matvec(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                        const struct wmat *w, int r0, int r1, const float *xsum, size_t ldxs)
{
    if (w->qbits) {
        if (w->kid == LK_A512_MV_QUANT)
            mv_quant(y, ldy, x, ldx, n_tok, w, r0, r1, xsum, ldxs);
        else
            mv_qgeneric(y, ldy, x, ldx, n_tok, w, r0, r1);
        return;
    }
    switch (w->dt) {
    case DTYPE_BF16: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_BF16); break;
    case DTYPE_F16: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F16); break;
    default: mv_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F32); break;
    }
}

#endif
