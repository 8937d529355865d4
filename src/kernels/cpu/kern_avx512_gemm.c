/*
 * kern_avx512_gemm: the AVX-512 GEMM pieces (kern.h ukernel, pack_t, pack_w: 8 tokens x 32
 * outputs, 16 zmm accumulators, over a packed panel) and the FPAN product (float W in
 * panels of 32 rows, every token count: kern.h FPAN, ADR 0039). See kern_avx512.c.
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kern_avx512.h"

// ---- GEMM panel ----

/* In-register 16x16 transpose: r[i] lane j <- r[j] lane i (unpack 32-bit,
 * unpack 64-bit, then two rounds of 128-bit lane shuffles). */
AI void tr16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Full 16 x 16 block: rows[j*ldr + i] -> bp[i*nr + j]. */
AI void pack16(float *bp, int nr, const float *rows, size_t ldr)
{
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        r[j] = _mm512_loadu_ps(rows + (size_t)j * ldr);
    tr16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        _mm512_store_ps(bp + (size_t)i * nr, r[i]);
}

void a512_pack_t(float *bp, int nr, const float *rows, size_t ldr, int nv, int kc)
{
    for (int h = 0; h < nr; h += 16) {
        int k = 0;
        if (h + 16 <= nv)
            for (; k + 16 <= kc; k += 16)
                pack16(bp + (size_t)k * nr + h, nr, rows + (size_t)h * ldr + k, ldr);
        /* edges: missing rows are zero, short blocks stop at kc */
        for (; k < kc; k++)
            for (int j = h; j < h + 16; j++)
                bp[(size_t)k * nr + j] = j < nv ? rows[(size_t)j * ldr + k] : 0.0f;
    }
}

/* Panel block straight from float weights: W rows [r0, r0 + nv) x columns
 * [k0, k0 + kc) widened in registers and transposed into bp [kc][nr]. The
 * caller (gemm_rows) asks for the block's lines beforehand. */
AI void pack_w_t(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc,
                 enum dtype dt)
{
    const uint8_t *base = w->data + (size_t)r0 * w->row_bytes;
    for (int h = 0; h < nr; h += 16) {
        int k = 0;
        if (h + 16 <= nv) {
            for (; k + 16 <= kc; k += 16) {
                __m512 r[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++)
                    r[j] = ld16f(base + (size_t)(h + j) * w->row_bytes, dt, (size_t)(k0 + k));
                tr16(r);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    _mm512_store_ps(bp + (size_t)(k + i) * nr + h, r[i]);
            }
        }
        for (; k < kc; k++)
            for (int j = h; j < h + 16; j++)
                bp[(size_t)k * nr + j] =
                    j < nv ? kern_ld(base + (size_t)j * w->row_bytes, dt, (size_t)(k0 + k)) : 0.0f;
    }
}

void a512_pack_w(float *bp, int nr, const struct wmat *w, int r0, int nv, int k0, int kc)
{
    switch (w->dt) {
    case DTYPE_BF16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_BF16);
        break;
    case DTYPE_F16:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_F16);
        break;
    default:
        pack_w_t(bp, nr, w, r0, nv, k0, kc, DTYPE_F32);
        break;
    }
}

// ---- GEMM microkernel ----

/* mr x 32 tile: c[m] (2 zmm each) += x[m, k] * bp[k, 0..32). */
AI void uk(float *y, size_t ldy, const float *x, size_t ldx, const int mr, const float *bp,
           int kc, int nv, bool acc)
{
    __m512 c[8][2];
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++)
        c[m][0] = c[m][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_load_ps(bp + (size_t)k * 32), b1 = _mm512_load_ps(bp + (size_t)k * 32 + 16);
#pragma GCC unroll 8
        for (int m = 0; m < mr; m++) {
            __m512 a = _mm512_set1_ps(x[(size_t)m * ldx + k]);
            c[m][0] = _mm512_fmadd_ps(a, b0, c[m][0]);
            c[m][1] = _mm512_fmadd_ps(a, b1, c[m][1]);
        }
    }
    __mmask16 m0 = tail_mask(nv), m1 = tail_mask(nv - 16 > 0 ? nv - 16 : 0);
#pragma GCC unroll 8
    for (int m = 0; m < mr; m++) {
        float *ym = y + (size_t)m * ldy;
        if (acc) {
            c[m][0] = _mm512_add_ps(c[m][0], _mm512_maskz_loadu_ps(m0, ym));
            c[m][1] = _mm512_add_ps(c[m][1], _mm512_maskz_loadu_ps(m1, ym + 16));
        }
        _mm512_mask_storeu_ps(ym, m0, c[m][0]);
        _mm512_mask_storeu_ps(ym + 16, m1, c[m][1]);
    }
}

void a512_ukernel(float *y, size_t ldy, const float *x, size_t ldx, int mr,
                         const float *bp, int kc, int nv, bool acc)
{
    switch (mr) {
    case 8: uk(y, ldy, x, ldx, 8, bp, kc, nv, acc); break;
    case 7: uk(y, ldy, x, ldx, 7, bp, kc, nv, acc); break;
    case 6: uk(y, ldy, x, ldx, 6, bp, kc, nv, acc); break;
    case 5: uk(y, ldy, x, ldx, 5, bp, kc, nv, acc); break;
    case 4: uk(y, ldy, x, ldx, 4, bp, kc, nv, acc); break;
    case 3: uk(y, ldy, x, ldx, 3, bp, kc, nv, acc); break;
    case 2: uk(y, ldy, x, ldx, 2, bp, kc, nv, acc); break;
    default: uk(y, ldy, x, ldx, 1, bp, kc, nv, acc); break;
    }
}

// ---- FPAN: float W in panels of 32 rows (kern.h) ----

/* Lines ahead of the k-line in use that a tile asks for (its panel's own stream). */
#define FPAN_PF_BYTES 2048

/* K-line i of a panel as f32: rows 0-15 in *lo, 16-31 in *hi. */
AI void fpan_line(const uint8_t *pp, size_t i, enum dtype dt, __m512 *lo, __m512 *hi)
{
    if (dt == DTYPE_BF16) {
        const __m512i v = _mm512_load_si512((const void *)(pp + i * 64));
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else if (dt == DTYPE_F16) {
        *lo = _mm512_cvtph_ps(_mm256_load_si256((const void *)(pp + i * 64)));
        *hi = _mm512_cvtph_ps(_mm256_load_si256((const void *)(pp + i * 64 + 32)));
    } else {
        *lo = _mm512_load_ps((const float *)(pp + i * 128));
        *hi = _mm512_load_ps((const float *)(pp + i * 128 + 64));
    }
}

/* NP panels (from pp, panel bytes apart) x T tokens over inputs [k0, k0 + kc): per token and
 * row the block's products summed in order from 0, then stored into y (k0 == 0) or added to
 * it; rows where m[p][0 / 1] (rows 0-15 / 16-31 of panel p) is clear are neither read nor
 * written. pf: also ask for the panels' lines FPAN_PF_BYTES ahead (the first token group). */
AI void fpan_tile(float *y, size_t ldy, const float *x, size_t ldx, const uint8_t *pp,
                  size_t panel, __mmask16 m[][2], int k0, int kc, bool pf,
                  enum dtype dt, const int NP, const int T)
{
    __m512 c[4][8][2];
    const size_t line = dt == DTYPE_F32 ? 128 : 64;
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            c[p][t][0] = c[p][t][1] = _mm512_setzero_ps();
    for (int i = k0; i < k0 + kc; i++) {
        __m512 lo[4], hi[4];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            if (pf)
                _mm_prefetch((const char *)pp + (size_t)p * panel + (size_t)i * line + FPAN_PF_BYTES,
                             _MM_HINT_T0);
            fpan_line(pp + (size_t)p * panel, (size_t)i, dt, &lo[p], &hi[p]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const __m512 a = _mm512_set1_ps(x[(size_t)t * ldx + (size_t)i]);
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                c[p][t][0] = _mm512_fmadd_ps(a, lo[p], c[p][t][0]);
                c[p][t][1] = _mm512_fmadd_ps(a, hi[p], c[p][t][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * ldy + (size_t)p * FPAN_R;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512 v = c[p][t][h];
                if (k0)
                    v = _mm512_add_ps(_mm512_maskz_loadu_ps(m[p][h], yt + 16 * h), v);
                _mm512_mask_storeu_ps(yt + 16 * h, m[p][h], v);
            }
        }
}

/* Panels read together for a group of t tokens: about 8 accumulator pairs or more. */
AI int fpan_np(int t)
{
    return t <= 2 ? 4 : t <= 4 ? 2 : 1;
}

#define FPAN_T(NP, T) fpan_tile(yt, ldy, xt, ldx, pp, w->fpan_panel, m, k0, kc, tg == tb, dt, NP, T)

/* Tokens a pass over K takes at once (a multiple of both tile heights, 6 and 8): their outputs
 * (96 x 64 floats for two panels) stay in cache from one block of FPAN_KC inputs to the next,
 * where a pass over every token (4096 patches of a vision tower) read and wrote them back from
 * memory at each block (10 % of the tower's time in the tiles' stores on an AVX-512 host). The
 * sums are the same: each output still adds its blocks in order. */
#define FPAN_TB 96

/* np panels from pp (rows p0 * FPAN_R .. of y at yp; m their row masks) for tokens [tb, te):
 * tiles of TG tokens, block by block of FPAN_KC inputs. */
AI void fpan_tokens(float *yp, size_t ldy, const float *x, size_t ldx, const uint8_t *pp,
                    const struct wmat *w, __mmask16 m[][2], int np, int TG, int tb, int te,
                    enum dtype dt)
{
    for (int k0 = 0; k0 < w->in; k0 += FPAN_KC) {
        const int kc = w->in - k0 < FPAN_KC ? w->in - k0 : FPAN_KC;
        for (int tg = tb; tg < te; tg += TG) {
            const int T = te - tg < TG ? te - tg : TG;
            float *yt = yp + (size_t)tg * ldy;
            const float *xt = x + (size_t)tg * ldx;
            if (np == 4 && T == 1) FPAN_T(4, 1);
            else if (np == 4 && T == 2) FPAN_T(4, 2);
            else if (np == 2 && T == 3) FPAN_T(2, 3);
            else if (np == 2 && T == 4) FPAN_T(2, 4);
            else if (np == 2 && T == 6) FPAN_T(2, 6);
            else if (np == 2 && T == 5) FPAN_T(2, 5);
            else /* one panel at a time (also the last panels of a range) */
                for (int p = 0; p < np; p++) {
                    const uint8_t *ppp = pp + (size_t)p * w->fpan_panel;
                    float *ytp = yt + (size_t)p * FPAN_R;
                    __mmask16(*mp)[2] = m + p;
#define FPAN_T1(T) fpan_tile(ytp, ldy, xt, ldx, ppp, w->fpan_panel, mp, k0, kc, tg == tb, dt, 1, T)
                    switch (T) {
                    case 1: FPAN_T1(1); break;
                    case 2: FPAN_T1(2); break;
                    case 3: FPAN_T1(3); break;
                    case 4: FPAN_T1(4); break;
                    case 5: FPAN_T1(5); break;
                    case 6: FPAN_T1(6); break;
                    case 7: FPAN_T1(7); break;
                    default: FPAN_T1(8); break;
                    }
#undef FPAN_T1
                }
        }
    }
}
#undef FPAN_T

/* Rows [r0, r1) of an FPAN W: tiles of 1-4 panels by up to 8 tokens, or (the plan's
 * avx512.fpan_rows6, from LP_FPAN_SIX_MIN tokens) 2 panels by 6 tokens: 24 accumulators, a
 * broadcast of x per 4 products where the tiles of 8 take one per 2. */
AI void fpan_rows(float *y, size_t ldy, const float *x, size_t ldx, int n_tok, const struct wmat *w,
                  int r0, int r1, enum dtype dt)
{
    const bool six = w->kid == LK_A512_FPAN6;
    const int NPmax = six ? 2 : fpan_np(n_tok < 8 ? n_tok : 8), pe = (r1 + FPAN_R - 1) / FPAN_R,
              TG = six ? 6 : 8;
    for (int p0 = r0 / FPAN_R; p0 < pe; p0 += NPmax) {
        const int np = pe - p0 < NPmax ? pe - p0 : NPmax;
        __mmask16 m[4][2];
        for (int p = 0; p < np; p++)
            for (int h = 0; h < 2; h++) {
                const int a = (p0 + p) * FPAN_R + 16 * h; /* rows a .. a+16 of this half */
                const int lo = r0 > a ? r0 - a : 0, hi = r1 - a < 16 ? r1 - a : 16;
                m[p][h] = hi > lo ? (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : 0;
            }
        const uint8_t *pp = w->data + (size_t)p0 * w->fpan_panel;
        for (int tb = 0; tb < n_tok; tb += FPAN_TB)
            fpan_tokens(y + (size_t)p0 * FPAN_R, ldy, x, ldx, pp, w, m, np, TG, tb,
                        n_tok - tb < FPAN_TB ? n_tok : tb + FPAN_TB, dt);
    }
}

void a512_fpan_linear(float *y, size_t ldy, const float *x, size_t ldx, int n_tok,
                             const struct wmat *w, int r0, int r1)
{
    switch (w->dt) {
    case DTYPE_BF16: fpan_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_BF16); break;
    case DTYPE_F16: fpan_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F16); break;
    default: fpan_rows(y, ldy, x, ldx, n_tok, w, r0, r1, DTYPE_F32); break;
    }
}

#endif
