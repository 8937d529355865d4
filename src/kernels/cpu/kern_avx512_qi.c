/*
 * kern_avx512_qi: the integer matvec (kern.h, "qi") with AVX-512 VNNI, for
 * the weights kern_avx2_qi.c takes (affine 4/8-bit, groups 32/64/128) and
 * from the same prepared x (its qi_prep stays in the table): only the
 * products change, so both variants compute the same integers. Rows in the
 * stored layout a few tokens at a time go through kern_avx512_qv.c's
 * 4-row blocks; this file holds the 4-bit GEMM of 16-row panels (QG16,
 * packed at load or per call) and the dispatch over the kernel the plan
 * named (linear_plan.h). Only called after dispatch.c has seen AVX512_VNNI
 * in CPUID. mxfp4 rows, which kern_avx2_qi.c also takes, stay with its
 * matvec.
 */
#include "kern.h"
#include "linear_plan.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#include "kern_qi.h"

/* ---- 4-bit GEMM: 16 rows in the lanes, up to 8 tokens a tile ----
 * For more than one token (batched decode, prefill) the rows go into the
 * lanes instead: a panel holds, for each 4-byte word of codes (8 codes) of
 * a column chunk, that word of 16 rows side by side, so one vpdpbusd
 * multiplies 4 codes of 16 rows by 4 bytes of one token's limbs,
 * broadcast from the prepared x (the same layout kern_avx2_qi.c writes:
 * the low nibbles of word l of a 64-code piece are its even codes 8l ..
 * 8l+6, whose limbs are bytes 4l .. 4l+3 of the piece's "even" parts). A
 * lane then sums one row's whole group in int32, and the group costs one
 * convert and two FMAs per token for 16 rows, where the matvec pays them
 * per 128 codes of each row. The weights of a panel are decoded once per
 * 4 codes and reused by every token of the tile. The integers are those of
 * the matvec; only the f32 summation order differs (|I| of a group can pass
 * 2^24: its conversion rounds like an f32 sum would). */
#define QG_TILE 8
_Static_assert(QG_TILE == LP_VNNI_QG_TILE, "below one tile of tokens the plan takes qg_rows16n");
_Static_assert(QI_CH == QG16_CH, "a QG16 chunk is one column chunk of the tiles");
/* Bytes ahead prefetched in each of a per-call pack's 16 rows (the best of 0 B to 1 KiB;
 * ADR 0055, "Measurements moved out of the kernels"). */
#define QG_PF 256

/* What a tile reads for one chunk of a panel: the words (from a chunk packed per call, or
 * straight from QG16 memory), the scales and biases as stored (sb: [gn][16] scales, then
 * [gn][16] biases, of dtype sdt; widened per group as the tile reaches it, so a miss on
 * them waits behind the group's products, not before the chunk's), and for QG16 what to
 * prefetch meanwhile (pf NULL: nothing). The codes are asked for pf_ahead bytes ahead of
 * those the tile reads, one line per 64 bytes of codes; past this chunk's codes (pf_codes
 * bytes) the walk steps over its scales and biases (pf_skip bytes) into the next chunk's
 * codes, when that chunk is this thread's (pfs set). The next chunk's scales and biases (pfs), which its tiles widen before reading
 * a code, are asked for pf_sb bytes per group of this chunk. */
struct qg_ops {
    const uint32_t (*w)[16];
    const uint8_t *sb;
    enum dtype sdt;
    int gn;
    const char *pf, *pfs;
    size_t pf_ahead, pf_codes, pf_skip;
    int pf_sb;
};

/* The prefetch of the codes o bytes into the chunk's code stream (qg_ops); past its codes
 * only when a next chunk is this thread's (pfs), so the walk never leaves the rows it reads. */
AI void qg_pf_codes(const struct qg_ops *p, size_t o)
{
    o += p->pf_ahead;
    if (o >= p->pf_codes) {
        if (!p->pfs)
            return;
        o += p->pf_skip;
    }
    _mm_prefetch(p->pf + o, _MM_HINT_T0);
}

/* Group g's share of the next chunk's scales and biases (qg_ops). */
AI void qg_pf_sb(const struct qg_ops *p, int g)
{
    if (p->pfs)
        for (int l = 0; l < p->pf_sb; l += 64)
            _mm_prefetch(p->pfs + (size_t)g * (size_t)p->pf_sb + l, _MM_HINT_T0);
}

/* 16 x 16 transpose of 32-bit words: v[i] lane j <- v[j] lane i. */
AI void qg_transpose16(__m512i v[16])
{
    __m512i u[16];
    for (int a = 0; a < 4; a++) { /* 4 x 4 blocks inside each 128-bit lane */
        __m512i t0 = _mm512_unpacklo_epi32(v[4 * a], v[4 * a + 1]),
                t1 = _mm512_unpackhi_epi32(v[4 * a], v[4 * a + 1]),
                t2 = _mm512_unpacklo_epi32(v[4 * a + 2], v[4 * a + 3]),
                t3 = _mm512_unpackhi_epi32(v[4 * a + 2], v[4 * a + 3]);
        u[4 * a] = _mm512_unpacklo_epi64(t0, t2);     /* column 4L + 0 of rows 4a .. 4a+3 */
        u[4 * a + 1] = _mm512_unpackhi_epi64(t0, t2); /* 4L + 1 */
        u[4 * a + 2] = _mm512_unpacklo_epi64(t1, t3); /* 4L + 2 */
        u[4 * a + 3] = _mm512_unpackhi_epi64(t1, t3); /* 4L + 3 */
    }
    for (int c = 0; c < 4; c++) { /* then a 4 x 4 transpose of the 128-bit lanes */
        __m512i s0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44),
                s1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee),
                s2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                s3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        v[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        v[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
        v[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        v[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
    }
}

/* One QG16 chunk (kern.h) of rows r0 .. r0+nr (nr <= 16; missing rows zero) at dst, for
 * codes c0 .. c0+cn of B-bit W: each 16 32-bit units (4-bit: a word of 8 codes; 8-bit: 4
 * codes, split into two pairs) of the 16 rows by one 16 x 16 transpose, scales and biases
 * moved as they are stored. pf: bytes ahead to prefetch in each row (0: none). */
QI_NOSAN static void qg16_pack_chunk(uint8_t *dst, const struct wmat *w, int r0, int nr, int c0,
                                     int cn, size_t pf)
{
    const int G = w->qgroup, bits = w->qbits, nu = cn * bits / 32, gn = cn / G;
    const size_t ssz = dtype_size(w->qsdt);
    uint8_t *sd = dst + (size_t)cn * 2 * (size_t)bits, *bd = sd + (size_t)gn * 16 * ssz;
    const uint8_t *rw[16];
    for (int j = 0; j < nr; j++)
        rw[j] = w->data + (size_t)(r0 + j) * w->row_bytes + (size_t)c0 * (size_t)bits / 8;
    int i = 0;
    for (; i + 16 <= nu; i += 16) {
        __m512i v[16];
        for (int j = 0; j < 16; j++) {
            if (j >= nr) {
                v[j] = _mm512_setzero_si512();
                continue;
            }
            if (pf)
                _mm_prefetch((const char *)rw[j] + 4 * (size_t)i + pf, _MM_HINT_T0);
            v[j] = _mm512_loadu_si512(rw[j] + 4 * (size_t)i);
        }
        qg_transpose16(v);
        for (int j = 0; j < 16; j++) {
            uint8_t *o = dst + (size_t)(i + j) * 64;
            if (bits == 4) {
                _mm512_store_si512(o, v[j]);
                continue;
            }
            /* unit i+j holds code pairs 2(i+j) (low halves) and 2(i+j)+1 (high) */
            _mm256_store_si256((__m256i *)o, _mm512_cvtepi32_epi16(v[j]));
            _mm256_store_si256((__m256i *)(o + 32), _mm512_cvtepi32_epi16(_mm512_srli_epi32(v[j], 16)));
        }
    }
    for (; i < nu; i++)
        for (int j = 0; j < 16; j++) {
            uint32_t v = 0;
            if (j < nr)
                memcpy(&v, rw[j] + 4 * (size_t)i, 4);
            if (bits == 4) {
                memcpy(dst + (size_t)i * 64 + 4 * (size_t)j, &v, 4);
            } else {
                uint16_t lo = (uint16_t)v, hi = (uint16_t)(v >> 16);
                memcpy(dst + (size_t)i * 64 + 2 * (size_t)j, &lo, 2);
                memcpy(dst + (size_t)i * 64 + 32 + 2 * (size_t)j, &hi, 2);
            }
        }
    if (nr < 16)
        memset(sd, 0, 2 * (size_t)gn * 16 * ssz);
    for (int j = 0; j < nr; j++) {
        const size_t r = (size_t)(r0 + j), o = (size_t)(c0 / G) * ssz;
        const uint8_t *rs = w->qs + r * w->qrow_bytes + o, *rb = w->qb + r * w->qrow_bytes + o;
        if (ssz == 2) /* 16-bit scales: copies of a known size (this runs per call unpacked) */
            for (int g = 0; g < gn; g++) {
                memcpy(sd + ((size_t)g * 16 + (size_t)j) * 2, rs + (size_t)g * 2, 2);
                memcpy(bd + ((size_t)g * 16 + (size_t)j) * 2, rb + (size_t)g * 2, 2);
            }
        else
            for (int g = 0; g < gn; g++) {
                memcpy(sd + ((size_t)g * 16 + (size_t)j) * 4, rs + (size_t)g * 4, 4);
                memcpy(bd + ((size_t)g * 16 + (size_t)j) * 4, rb + (size_t)g * 4, 4);
            }
    }
}

/* The codes the next per-call pack (qg_rows) reads (rows r0 .. r0+16 clipped to r1, codes c0 ..), asked
 * for one 64-byte line per word a tile decodes, so the requests spread over its work. */
struct qg_pf {
    const char *row[16];
    int n_rows, row_len; /* rows, and bytes of codes per row in the chunk */
    int r, o;            /* the next line to ask for */
};

QI_NOSAN static void qg_pf_init(struct qg_pf *pf, const struct wmat *w, int r0, int r1, int c0)
{
    const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH;
    pf->n_rows = r1 - r0 < 16 ? r1 - r0 : 16;
    pf->row_len = cn / 2;
    pf->r = pf->o = 0;
    for (int j = 0; j < pf->n_rows; j++)
        pf->row[j] = (const char *)w->data + (size_t)(r0 + j) * w->row_bytes + (size_t)c0 / 2;
}

AI void qg_pf_step(struct qg_pf *pf)
{
    if (pf->r >= pf->n_rows)
        return;
    _mm_prefetch(pf->row[pf->r] + pf->o, _MM_HINT_T0);
    if ((pf->o += 64) >= pf->row_len) {
        pf->o = 0;
        pf->r++;
    }
}

AI __m512i qg_bcast(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Tokens t0 .. t0+T of a tile: each one's prepared x of the chunk from c0 (xc), its group
 * scales (xs) and sums (xm) from group g0, and its zeroed f32 accumulator. */
AI void qg_tile_open(const uint8_t *xq, size_t ldxq, size_t hdr, int t0, int c0, int g0,
                     const uint8_t **xc, const float **xs, const float **xm, __m512 *f, const int T)
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const uint8_t *xt = xq + (size_t)(t0 + t) * ldxq;
        xs[t] = (const float *)xt + g0;
        xm[t] = (const float *)(xt + hdr) + g0;
        xc[t] = xt + 2 * hdr + 2 * (size_t)c0;
        f[t] = _mm512_setzero_ps();
    }
}

/* Row i of the chunk's [2 gn][16] scales and biases (qg_ops) widened to f32. */
AI __m512 qg_ld_sb(const struct qg_ops *p, int i)
{
    if (p->sdt == DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_load_si256((const __m256i *)p->sb + i)), 16));
    if (p->sdt == DTYPE_F16)
        return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p->sb + i));
    return _mm512_load_ps((const float *)p->sb + 16 * (size_t)i);
}

/* Group g's integer sums of each token (i32[t]) into its accumulator: f += I s xs + b xm. */
AI void qg_tile_group(__m512 *f, const __m512i *i32, const struct qg_ops *p, int g,
                      const float *const *xs, const float *const *xm, const int T)
{
    const __m512 sv = qg_ld_sb(p, g), bv = qg_ld_sb(p, p->gn + g);
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32[t]), _mm512_mul_ps(sv, _mm512_set1_ps(xs[t][g])),
                               f[t]);
        f[t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xm[t][g]), f[t]);
    }
}

/* The tile's rows (lanes rm from row r0) of each token into y, added to it when acc. */
AI void qg_tile_store(float *y, size_t ldy, int t0, int r0, __mmask16 rm, bool acc, const __m512 *f,
                      const int T)
{
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        float *yo = y + (size_t)(t0 + t) * ldy + r0;
        __m512 v = acc ? _mm512_add_ps(f[t], _mm512_maskz_loadu_ps(rm, yo)) : f[t];
        _mm512_mask_storeu_ps(yo, rm, v);
    }
}

/* Tokens t0 .. t0+T of the panel's rows (lanes in rm) over the chunk of codes
 * from c0 (groups g0 .. g0+gn): y (+)= the products (accumulate when acc). */
AI void qg_tile(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                const struct qg_ops *p, int r0, __mmask16 rm, int c0, int gn, bool acc,
                struct qg_pf *pf, const int T, const int G, const int L)
{
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const uint8_t *xc[QG_TILE];
    const float *xs[QG_TILE], *xm[QG_TILE];
    __m512 f[QG_TILE];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f, T);
    for (int g = 0; g < gn; g++) {
        __m512i ih[QG_TILE], il[QG_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            ih[t] = il[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int u = 0; u < G / 8; u++) {
            const int wi = g * (G / 8) + u;
            if (pf)
                qg_pf_step(pf);
            const __m512i v = _mm512_load_si512(p->w[wi]);
            if (p->pf) /* QG16: the codes ahead, one line per word */
                qg_pf_codes(p, (size_t)wi * 64);
            const __m512i lo = _mm512_and_si512(v, m0f),
                          hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m0f);
            const size_t xo = (size_t)(wi / 8) * 128 + 4 * (size_t)(wi % 8);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                ih[t] = _mm512_dpbusd_epi32(ih[t], lo, qg_bcast(xc[t] + xo));
                if (L == 2) {
                    ih[t] = _mm512_dpbusd_epi32(ih[t], hi, qg_bcast(xc[t] + xo + 32));
                    il[t] = _mm512_dpbusd_epi32(il[t], lo, qg_bcast(xc[t] + xo + 64));
                    il[t] = _mm512_dpbusd_epi32(il[t], hi, qg_bcast(xc[t] + xo + 96));
                } else { /* the high nibbles' products in a second chain: two per token */
                    il[t] = _mm512_dpbusd_epi32(il[t], hi, qg_bcast(xc[t] + xo + 32));
                }
            }
        }
        if (p->pf)
            qg_pf_sb(p, g);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) /* I = (hi << 8) + lo; --fast (L 1): hi << 8 */
            ih[t] = L == 2 ? _mm512_add_epi32(_mm512_slli_epi32(ih[t], 8), il[t])
                           : _mm512_slli_epi32(_mm512_add_epi32(ih[t], il[t]), 8);
        qg_tile_group(f, ih, p, g, xs, xm, T);
    }
    qg_tile_store(y, ldy, t0, r0, rm, acc, f, T);
}

/* The 8-bit tile: a QG16 chunk's code pairs ([cn/2][16] u16) widened to 16 bits, so one
 * vpdpwssd multiplies 2 codes of 16 rows by one token's pair of 16-bit x (the natural-order
 * q16 the preparation writes for 8-bit), two accumulators per token to hide latency. The
 * integers are the matvec's (qv8_step); the rest is qg_tile's. */
AI void qg_tile8(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                 const struct qg_ops *p, int r0, __mmask16 rm, int c0, int gn, bool acc,
                 const int T, const int G)
{
    const uint8_t *xc[QG_TILE], *wb = (const uint8_t *)p->w;
    const float *xs[QG_TILE], *xm[QG_TILE];
    __m512 f[QG_TILE];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f, T);
    for (int g = 0; g < gn; g++) {
        __m512i a0[QG_TILE], a1[QG_TILE];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a0[t] = a1[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int u = 0; u < G / 2; u += 2) {
            const int pi = g * (G / 2) + u;
            if (p->pf) /* one line per two pairs */
                qg_pf_codes(p, (size_t)pi * 32);
            const __m512i v0 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(wb + (size_t)pi * 32))),
                          v1 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(wb + (size_t)pi * 32 + 32)));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                a0[t] = _mm512_dpwssd_epi32(a0[t], v0, qg_bcast(xc[t] + 4 * (size_t)pi));
                a1[t] = _mm512_dpwssd_epi32(a1[t], v1, qg_bcast(xc[t] + 4 * (size_t)pi + 4));
            }
        }
        if (p->pf)
            qg_pf_sb(p, g);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            a0[t] = _mm512_add_epi32(a0[t], a1[t]);
        qg_tile_group(f, a0, p, g, xs, xm, T);
    }
    qg_tile_store(y, ldy, t0, r0, rm, acc, f, T);
}

/* One tile of 4-bit (B 4: qg_tile) or 8-bit (B 8, QG16 only: qg_tile8) codes. */
AI void qg_tile_b(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                  const struct qg_ops *p, int r0, __mmask16 rm, int c0, int gn, bool acc,
                  struct qg_pf *pf, const int T, const int B, const int G, const int L)
{
    if (B == 8)
        qg_tile8(y, ldy, xq, ldxq, hdr, t0, p, r0, rm, c0, gn, acc, T, G);
    else
        qg_tile(y, ldy, xq, ldxq, hdr, t0, p, r0, rm, c0, gn, acc, pf, T, G, L);
}

/* The 4-bit tile of three panels at once: tokens t0 .. t0+T (T <= 2) of 48 rows (panel i's
 * chunk from c0 in p[i]) over the chunk's groups g0 .. g1, each row and token's f32 sum carried
 * in fs ([T][3] vectors) from the groups before. Each token's limbs of a word are broadcast
 * once for the three panels' words, where qg_tile broadcasts them for each panel: 11 loads per
 * 24 products instead of 33 per 32 (ADR 0034). The integers and the f32 steps of each row and
 * token are qg_tile's, in the same order: the same bits. */
AI void qg_tile3(const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                 const struct qg_ops *const p[3], int c0, int g0, int g1, __m512 *fs,
                 const int T, const int G, const int L)
{
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const uint8_t *xc[2];
    const float *xs[2], *xm[2];
    __m512 f[3][2];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f[0], T);
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int i = 0; i < 3; i++)
            f[i][t] = fs[3 * t + i];
    for (int g = g0; g < g1; g++) {
        __m512i ih[3][2], il[3][2];
#pragma GCC unroll 4
        for (int i = 0; i < 3; i++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                ih[i][t] = il[i][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int u = 0; u < G / 8; u++) {
            const int wi = g * (G / 8) + u;
            const size_t xo = (size_t)(wi / 8) * 128 + 4 * (size_t)(wi % 8);
            __m512i xb[2][4];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
#pragma GCC unroll 4
                for (int o = 0; o < 2 * L; o++)
                    xb[t][o] = qg_bcast(xc[t] + xo + 32 * (size_t)o);
#pragma GCC unroll 3
            for (int i = 0; i < 3; i++) {
                const __m512i v = _mm512_load_si512(p[i]->w[wi]);
                const __m512i lo = _mm512_and_si512(v, m0f),
                              hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m0f);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    ih[i][t] = _mm512_dpbusd_epi32(ih[i][t], lo, xb[t][0]);
                    if (L == 2) {
                        ih[i][t] = _mm512_dpbusd_epi32(ih[i][t], hi, xb[t][1]);
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], lo, xb[t][2]);
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], hi, xb[t][3]);
                    } else {
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], hi, xb[t][1]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 3; i++) {
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                ih[i][t] = L == 2 ? _mm512_add_epi32(_mm512_slli_epi32(ih[i][t], 8), il[i][t])
                                  : _mm512_slli_epi32(_mm512_add_epi32(ih[i][t], il[i][t]), 8);
            qg_tile_group(f[i], ih[i], p[i], g, xs, xm, T);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 4
        for (int i = 0; i < 3; i++)
            fs[3 * t + i] = f[i][t];
}

/* Below QG_TILE tokens, two QG16 panels are read together, a pair of tokens at a time
 * (qg_panelsn, ADR 0040): every word's limbs broadcast once for both panels' words and four
 * or eight integer chains side by side, where the one-panel tiles of 1-2 tokens wait on
 * vpdpbusd's latency and those of 4 reload a limb per product. From LP_VNNI_QG_T4 tokens
 * four at a time (qg_panels4n, ADR 0043). The plan chooses (linear_plan.h has the
 * measurements). */
#define QGN_NP 2

/* Tokens t0 .. t0+T (T <= 2) of QGN_NP consecutive 4-bit panels (op[i], each with the
 * prefetches of its own stream ahead when op[i]->pf) over the chunk from c0: each word's
 * limbs are broadcast once for the panels' words, and the panels' integer chains run
 * side by side, where the one-panel tile's chains wait on vpdpbusd's latency at one or two
 * tokens. Each row's f32 steps are qg_tile's, in the same order: the same bits. */
AI void qg_tilen(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                 const struct qg_ops *const *p, int r0, const __mmask16 *rm, int c0, int gn,
                 bool acc, const int T, const int G, const int L)
{
    enum { NP = QGN_NP };
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const uint8_t *xc[2];
    const float *xs[2], *xm[2];
    __m512 f[NP][2];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f[0], T);
#pragma GCC unroll 4
    for (int i = 1; i < NP; i++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            f[i][t] = _mm512_setzero_ps();
    for (int g = 0; g < gn; g++) {
        __m512i ih[NP][2], il[NP][2];
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++)
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                ih[i][t] = il[i][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int u = 0; u < G / 8; u++) {
            const int wi = g * (G / 8) + u;
            const size_t xo = (size_t)(wi / 8) * 128 + 4 * (size_t)(wi % 8);
            __m512i xb[2][4];
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
#pragma GCC unroll 4
                for (int o = 0; o < 2 * L; o++)
                    xb[t][o] = qg_bcast(xc[t] + xo + 32 * (size_t)o);
#pragma GCC unroll 4
            for (int i = 0; i < NP; i++) {
                const __m512i v = _mm512_load_si512(p[i]->w[wi]);
                if (p[i]->pf)
                    qg_pf_codes(p[i], (size_t)wi * 64);
                const __m512i lo = _mm512_and_si512(v, m0f),
                              hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m0f);
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    ih[i][t] = _mm512_dpbusd_epi32(ih[i][t], lo, xb[t][0]);
                    if (L == 2) {
                        ih[i][t] = _mm512_dpbusd_epi32(ih[i][t], hi, xb[t][1]);
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], lo, xb[t][2]);
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], hi, xb[t][3]);
                    } else {
                        il[i][t] = _mm512_dpbusd_epi32(il[i][t], hi, xb[t][1]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++) {
            if (p[i]->pf)
                qg_pf_sb(p[i], g);
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                ih[i][t] = L == 2 ? _mm512_add_epi32(_mm512_slli_epi32(ih[i][t], 8), il[i][t])
                                  : _mm512_slli_epi32(_mm512_add_epi32(ih[i][t], il[i][t]), 8);
            qg_tile_group(f[i], ih[i], p[i], g, xs, xm, T);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NP; i++)
        qg_tile_store(y, ldy, t0, r0 + 16 * i, rm[i], acc, f[i], T);
}

/* Tokens t0 .. t0+T (T <= 2) of QGN_NP consecutive 8-bit panels: qg_tile8's integers and f32
 * steps (the same bits), each word pair's x broadcast once for the panels (qg_tilen). */
AI void qg_tile8n(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                  const struct qg_ops *const *p, int r0, const __mmask16 *rm, int c0, int gn,
                  bool acc, const int T, const int G)
{
    enum { NP = QGN_NP };
    const uint8_t *xc[2];
    const float *xs[2], *xm[2];
    __m512 f[NP][2];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f[0], T);
#pragma GCC unroll 4
    for (int i = 1; i < NP; i++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++)
            f[i][t] = _mm512_setzero_ps();
    for (int g = 0; g < gn; g++) {
        __m512i a0[NP][2], a1[NP][2];
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++)
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                a0[i][t] = a1[i][t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int u = 0; u < G / 2; u += 2) {
            const int pi = g * (G / 2) + u;
            __m512i x0[2], x1[2];
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                x0[t] = qg_bcast(xc[t] + 4 * (size_t)pi);
                x1[t] = qg_bcast(xc[t] + 4 * (size_t)pi + 4);
            }
#pragma GCC unroll 4
            for (int i = 0; i < NP; i++) {
                const uint8_t *wb = (const uint8_t *)p[i]->w + (size_t)pi * 32;
                if (p[i]->pf)
                    qg_pf_codes(p[i], (size_t)pi * 32);
                const __m512i v0 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)wb)),
                              v1 = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(wb + 32)));
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    a0[i][t] = _mm512_dpwssd_epi32(a0[i][t], v0, x0[t]);
                    a1[i][t] = _mm512_dpwssd_epi32(a1[i][t], v1, x1[t]);
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++) {
            if (p[i]->pf)
                qg_pf_sb(p[i], g);
#pragma GCC unroll 2
            for (int t = 0; t < T; t++)
                a0[i][t] = _mm512_add_epi32(a0[i][t], a1[i][t]);
            qg_tile_group(f[i], a0[i], p[i], g, xs, xm, T);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NP; i++)
        qg_tile_store(y, ldy, t0, r0 + 16 * i, rm[i], acc, f[i], T);
}

/* Four tokens of QGN_NP consecutive B-bit panels (qg_panels4n, ADR 0043): both panels' words
 * are decoded first (8-bit: widened), then each token's limbs (8-bit: its x pairs) are
 * broadcast once and multiplied into both, so a broadcast feeds two products and 16 integer
 * chains run side by side. The integers and each row's f32 steps are qg_tilen's and
 * qg_tile8n's, in the same order: the same bits. */
AI void qg_tile4n(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int t0,
                  const struct qg_ops *const *p, int r0, const __mmask16 *rm, int c0, int gn,
                  bool acc, const int B, const int G, const int L)
{
    enum { NP = QGN_NP, T = 4 };
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const uint8_t *xc[T];
    const float *xs[T], *xm[T];
    __m512 f[NP][T];
    qg_tile_open(xq, ldxq, hdr, t0, c0, c0 / G, xc, xs, xm, f[0], T);
#pragma GCC unroll 4
    for (int i = 1; i < NP; i++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            f[i][t] = _mm512_setzero_ps();
    for (int g = 0; g < gn; g++) {
        __m512i ih[NP][T], il[NP][T]; /* 8-bit: the two pair chains */
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++)
#pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                ih[i][t] = il[i][t] = _mm512_setzero_si512();
        if (B == 4) {
#pragma GCC unroll 8
            for (int u = 0; u < G / 8; u++) {
                const int wi = g * (G / 8) + u;
                const size_t xo = (size_t)(wi / 8) * 128 + 4 * (size_t)(wi % 8);
                __m512i lo[NP], hi[NP];
#pragma GCC unroll 4
                for (int i = 0; i < NP; i++) {
                    const __m512i v = _mm512_load_si512(p[i]->w[wi]);
                    if (p[i]->pf)
                        qg_pf_codes(p[i], (size_t)wi * 64);
                    lo[i] = _mm512_and_si512(v, m0f);
                    hi[i] = _mm512_and_si512(_mm512_srli_epi32(v, 4), m0f);
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i b0 = qg_bcast(xc[t] + xo), b1 = qg_bcast(xc[t] + xo + 32);
                    if (L == 1) { /* --fast: the high nibbles' products in a second chain */
#pragma GCC unroll 4
                        for (int i = 0; i < NP; i++) {
                            ih[i][t] = _mm512_dpbusd_epi32(ih[i][t], lo[i], b0);
                            il[i][t] = _mm512_dpbusd_epi32(il[i][t], hi[i], b1);
                        }
                        continue;
                    }
#pragma GCC unroll 4
                    for (int i = 0; i < NP; i++)
                        ih[i][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ih[i][t], lo[i], b0), hi[i], b1);
                    const __m512i b2 = qg_bcast(xc[t] + xo + 64), b3 = qg_bcast(xc[t] + xo + 96);
#pragma GCC unroll 4
                    for (int i = 0; i < NP; i++)
                        il[i][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(il[i][t], lo[i], b2), hi[i], b3);
                }
            }
        } else {
#pragma GCC unroll 4
            for (int u = 0; u < G / 2; u += 2) {
                const int pi = g * (G / 2) + u;
                __m512i v0[NP], v1[NP];
#pragma GCC unroll 4
                for (int i = 0; i < NP; i++) {
                    const uint8_t *wb = (const uint8_t *)p[i]->w + (size_t)pi * 32;
                    if (p[i]->pf)
                        qg_pf_codes(p[i], (size_t)pi * 32);
                    v0[i] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)wb));
                    v1[i] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *)(wb + 32)));
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i x0 = qg_bcast(xc[t] + 4 * (size_t)pi),
                                  x1 = qg_bcast(xc[t] + 4 * (size_t)pi + 4);
#pragma GCC unroll 4
                    for (int i = 0; i < NP; i++) {
                        ih[i][t] = _mm512_dpwssd_epi32(ih[i][t], v0[i], x0);
                        il[i][t] = _mm512_dpwssd_epi32(il[i][t], v1[i], x1);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < NP; i++) {
            if (p[i]->pf)
                qg_pf_sb(p[i], g);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) /* 4-bit I = (hi << 8) + lo (--fast: hi << 8); 8-bit the sum */
                ih[i][t] = B == 8   ? _mm512_add_epi32(ih[i][t], il[i][t])
                           : L == 2 ? _mm512_add_epi32(_mm512_slli_epi32(ih[i][t], 8), il[i][t])
                                    : _mm512_slli_epi32(_mm512_add_epi32(ih[i][t], il[i][t]), 8);
            qg_tile_group(f[i], ih[i], p[i], g, xs, xm, T);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NP; i++)
        qg_tile_store(y, ldy, t0, r0 + 16 * i, rm[i], acc, f[i], T);
}

/* The tiles of one chunk over every token: tiles of 8, the last 1-7 tokens as tiles of 4,
 * 2 and 1 (fewer copies of the tile to compile). The tile of token pf_at issues
 * pf's or (QG16) op1's prefetches; the others run with op (no prefetch). */
AI void qg_tiles(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, size_t hdr, int n_tok,
                 const struct qg_ops *op, const struct qg_ops *op1, int r, __mmask16 rm, int c0,
                 int gn, bool acc, struct qg_pf *pf, int pf_at, const int B, const int G, const int L)
{
    int t = 0;
    for (; t + QG_TILE <= n_tok; t += QG_TILE)
        qg_tile_b(y, ldy, xq, ldxq, hdr, t, t == pf_at ? op1 : op, r, rm, c0, gn, acc,
                  t == pf_at ? pf : NULL, QG_TILE, B, G, L);
    for (int tn = 4; tn >= 1; tn /= 2)
        if (n_tok - t >= tn) {
            const struct qg_ops *o = t == pf_at ? op1 : op;
            struct qg_pf *tpf = t == pf_at ? pf : NULL;
            if (tn == 4)
                qg_tile_b(y, ldy, xq, ldxq, hdr, t, o, r, rm, c0, gn, acc, tpf, 4, B, G, L);
            else if (tn == 2)
                qg_tile_b(y, ldy, xq, ldxq, hdr, t, o, r, rm, c0, gn, acc, tpf, 2, B, G, L);
            else
                qg_tile_b(y, ldy, xq, ldxq, hdr, t, o, r, rm, c0, gn, acc, tpf, 1, B, G, L);
            t += tn;
        }
}

/* Bytes ahead of the tile that the QG16 stream is prefetched: farther below
 * LP_VNNI_QG16_PF_NEAR tokens, where one token consumes it faster (linear_plan.h). */
#define QG_PF16(n_tok) ((n_tok) >= LP_VNNI_QG16_PF_NEAR ? 2048 : 4096)

/* Rows r0 .. r1 of a 4-bit affine W in its stored layout (not repacked at load): each
 * block of 16 rows and chunk packed as QG16 on the stack, then the same tiles. */
AI void qg_rows(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                const struct wmat *w, int r0, int r1, const int G, const int L)
{
    _Alignas(64) uint8_t pc[QI_CH * 8 + 2 * (QI_CH / 32) * 16 * sizeof(float)];
    const size_t hdr = kern_qi_hdr(w);
    for (int r = r0; r < r1; r += 16) {
        const int nr = r1 - r < 16 ? r1 - r : 16;
        const __mmask16 rm = (__mmask16)((1u << nr) - 1);
        for (int c0 = 0; c0 < w->in; c0 += QI_CH) {
            const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
            qg16_pack_chunk(pc, w, r, nr, c0, cn, QG_PF);
            const struct qg_ops op = {.w = (const uint32_t (*)[16])pc, .sb = pc + (size_t)cn * 8,
                                      .sdt = w->qsdt, .gn = gn};
            /* the next pack's codes are asked for during the third tile from the end (the
             * only one at decode), so that the x the later tiles stream does not evict them */
            const int nc0 = c0 + QI_CH < w->in ? c0 + QI_CH : 0, nr0 = nc0 ? r : r + 16;
            const int n_tiles = (n_tok + QG_TILE - 1) / QG_TILE,
                      pf_at = (n_tiles > 3 ? n_tiles - 3 : 0) * QG_TILE;
            struct qg_pf pf;
            if (nr0 < r1)
                qg_pf_init(&pf, w, nr0, r1, nc0);
            qg_tiles(y, ldy, xq, ldxq, hdr, n_tok, &op, &op, r, rm, c0, gn, c0 > 0,
                     nr0 < r1 ? &pf : NULL, pf_at, 4, G, L);
        }
    }
}

/* The chunk of panel p (of w, B-bit codes) from c0 (cn codes: cb bytes of codes, then sbb of
 * scales and biases) as a tile reads it, plain (op) and, when op1 is not NULL, with the
 * prefetches of the stream ahead (op1): its codes, then the next chunk's, which is this
 * panel's next one or, after its last, panel np's first (np < 0: none of this thread's). */
AI void qg_chunk_ops(struct qg_ops *op, struct qg_ops *op1, const struct wmat *w, int p, int c0,
                     int np, int n_tok, const int B, const int G)
{
    const size_t ssz = dtype_size(w->qsdt);
    const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
    const size_t cb = (size_t)cn * 2 * B, sbb = 2 * (size_t)gn * 16 * ssz;
    const uint8_t *pc = w->data + (size_t)p * w->qg16_panel + kern_qg16_bytes(c0, B, G, ssz);
    *op = (struct qg_ops){.w = (const uint32_t (*)[16])pc, .sb = pc + cb, .sdt = w->qsdt, .gn = gn};
    if (!op1)
        return;
    /* the next chunk (its codes from nc, then its scales and biases) */
    const bool same = c0 + QI_CH < w->in;
    const int nn = same ? w->in - c0 - QI_CH : np >= 0 ? w->in : 0, ncn = nn < QI_CH ? nn : QI_CH;
    const uint8_t *nc = same ? pc + cb + sbb : w->data + (size_t)(np >= 0 ? np : 0) * w->qg16_panel;
    *op1 = *op;
    op1->pf = (const char *)pc;
    op1->pfs = ncn ? (const char *)nc + (size_t)ncn * 2 * B : NULL;
    op1->pf_ahead = QG_PF16(n_tok);
    op1->pf_codes = cb;
    op1->pf_skip = ncn ? (size_t)(nc - (pc + cb)) : 0;
    op1->pf_sb = (int)(32 * ssz);
}

/* The lanes of panel p's rows inside r0 .. r1. */
AI __mmask16 qg_panel_mask(int p, int r0, int r1)
{
    const int lo = r0 > 16 * p ? r0 - 16 * p : 0, hi = r1 - 16 * p < 16 ? r1 - 16 * p : 16;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* The lines of a piece of three panels' QG16 stream that qg_panels3 asks for ahead: for each
 * panel a range of codes and the scales and biases of its groups. */
struct qg3_pf {
    const char *code[3], *sc[3], *bi[3];
    int code_len, sb_len; /* bytes of codes per panel, of scales (and of biases) per panel */
    int n, at;            /* lines in all, the next to ask for */
};

/* The groups from g0 (at most sg of them) of chunk c0 of panels p .. p+2 (all inside w). */
AI void qg3_pf_set(struct qg3_pf *q, const struct wmat *w, int p, int c0, int g0, int sg,
                   const int G)
{
    const size_t ssz = dtype_size(w->qsdt);
    struct qg_ops op; /* the panels' chunks have one layout: op.gn is each one's */
    for (int i = 0; i < 3; i++) {
        qg_chunk_ops(&op, NULL, w, p + i, c0, -1, 0, 4, G);
        q->code[i] = (const char *)op.w[g0 * (G / 8)];
        q->sc[i] = (const char *)op.sb + (size_t)g0 * 16 * ssz;
        q->bi[i] = q->sc[i] + (size_t)op.gn * 16 * ssz;
    }
    const int g1 = g0 + sg < op.gn ? g0 + sg : op.gn;
    q->code_len = (g1 - g0) * G * 8;
    q->sb_len = (int)((size_t)(g1 - g0) * 16 * ssz);
    q->n = 3 * ((q->code_len + 63) / 64 + 2 * ((q->sb_len + 63) / 64));
    q->at = 0;
}

/* Ask for k more lines of q. */
AI void qg3_pf_some(struct qg3_pf *q, int k)
{
    const int cl = (q->code_len + 63) / 64, sl = (q->sb_len + 63) / 64, per = cl + 2 * sl;
    for (int e = q->at + k < q->n ? q->at + k : q->n; q->at < e; q->at++) {
        const int i = q->at / per, l = q->at % per;
        const char *a = l < cl ? q->code[i] + 64 * (size_t)l
                        : l < cl + sl ? q->sc[i] + 64 * (size_t)(l - cl)
                                      : q->bi[i] + 64 * (size_t)(l - cl - sl);
        _mm_prefetch(a, _MM_HINT_T0);
    }
}

/* Three 4-bit panels p .. p+2 (each with rows inside r0 .. r1) over every token (n_tok >= 2).
 * Each chunk goes in pieces of QG3_SUB codes (12 KiB of codes for the three panels, so a
 * piece stays in L1 while every pair of tokens reads it), 64 tokens at a time; the tiles
 * keep their f32 sums in fb between pieces, so each row and token sums its groups in order,
 * as qg_tile does. While the pairs run over a piece, the next piece (the chunk's next, else
 * the next chunk's first, else the first of panels p+3 .. p+5 when they are this thread's)
 * is asked for, a share of its lines before each pair. */
#define QG3_SUB 512
AI void qg_panels3(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                   const struct wmat *w, int p, int r0, int r1, const int G, const int L)
{
    enum { TB = 64 };
    _Alignas(64) __m512 fb[TB * 3];
    const size_t hdr = kern_qi_hdr(w);
    const __mmask16 rm[3] = {qg_panel_mask(p, r0, r1), qg_panel_mask(p + 1, r0, r1),
                             qg_panel_mask(p + 2, r0, r1)};
    const int sg = QG3_SUB / G;
    const bool next3 = 16 * (p + 5) < r1;
    for (int c0 = 0; c0 < w->in; c0 += QI_CH) {
        const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
        struct qg_ops op[3];
        for (int i = 0; i < 3; i++)
            qg_chunk_ops(&op[i], NULL, w, p + i, c0, -1, n_tok, 4, G);
        const struct qg_ops *const po[3] = {&op[0], &op[1], &op[2]};
        for (int tb = 0; tb < n_tok; tb += TB) {
            const int nt = n_tok - tb < TB ? n_tok - tb : TB, n_calls = (nt + 1) / 2;
            for (int k = 0; k < 3 * nt; k++)
                fb[k] = _mm512_setzero_ps();
            for (int g0 = 0; g0 < gn; g0 += sg) {
                const int g1 = g0 + sg < gn ? g0 + sg : gn;
                struct qg3_pf q = {.n = 0};
                if (tb + TB >= n_tok) { /* the last token block: the next piece */
                    if (g1 < gn)
                        qg3_pf_set(&q, w, p, c0, g1, sg, G);
                    else if (c0 + QI_CH < w->in)
                        qg3_pf_set(&q, w, p, c0 + QI_CH, 0, sg, G);
                    else if (next3)
                        qg3_pf_set(&q, w, p + 3, 0, 0, sg, G);
                }
                const int per = (q.n + n_calls - 1) / n_calls;
                int t = 0;
                for (; t + 2 <= nt; t += 2) {
                    qg3_pf_some(&q, per);
                    qg_tile3(xq, ldxq, hdr, tb + t, po, c0, g0, g1, fb + 3 * t, 2, G, L);
                }
                if (t < nt) {
                    qg3_pf_some(&q, per);
                    qg_tile3(xq, ldxq, hdr, tb + t, po, c0, g0, g1, fb + 3 * t, 1, G, L);
                }
            }
            for (int t = 0; t < nt; t++)
                for (int i = 0; i < 3; i++)
                    qg_tile_store(y, ldy, tb + t, 16 * (p + i), rm[i], c0 > 0, &fb[3 * t + i], 1);
        }
    }
}


/* Every token of QGN_NP panels p .. (rows inside r0 .. r1), chunk by chunk, each panel's
 * stream prefetched ahead (by the first pair's tiles) into its next chunk, after its last
 * into panel p+QGN_NP+i's first. */
AI void qg_panelsn(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                   const struct wmat *w, int p, int r0, int r1, const int B, const int G,
                   const int L)
{
    enum { NP = QGN_NP };
    const size_t hdr = kern_qi_hdr(w);
    __mmask16 rm[NP];
    for (int i = 0; i < NP; i++)
        rm[i] = qg_panel_mask(p + i, r0, r1);
    for (int c0 = 0; c0 < w->in; c0 += QI_CH) {
        const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
        struct qg_ops op[NP], op1[NP];
        const struct qg_ops *po[NP], *po1[NP];
        for (int i = 0; i < NP; i++) {
            const int np = p + i + NP;
            qg_chunk_ops(&op[i], &op1[i], w, p + i, c0, 16 * np < r1 ? np : -1, n_tok, B, G);
            po[i] = &op[i];
            po1[i] = &op1[i];
        }
        for (int t = 0; t < n_tok; t += 2) {
            const struct qg_ops *const *o = t == 0 ? po1 : po;
            if (B == 8 && n_tok - t >= 2)
                qg_tile8n(y, ldy, xq, ldxq, hdr, t, o, 16 * p, rm, c0, gn, c0 > 0, 2, G);
            else if (B == 8)
                qg_tile8n(y, ldy, xq, ldxq, hdr, t, o, 16 * p, rm, c0, gn, c0 > 0, 1, G);
            else if (n_tok - t >= 2)
                qg_tilen(y, ldy, xq, ldxq, hdr, t, o, 16 * p, rm, c0, gn, c0 > 0, 2, G, L);
            else
                qg_tilen(y, ldy, xq, ldxq, hdr, t, o, 16 * p, rm, c0, gn, c0 > 0, 1, G, L);
        }
    }
}

/* Rows r0 .. r1 of a QG16 W of B-bit codes: each panel's chunks straight from memory,
 * streamed in order; with three (4-bit codes, the plan's qg_panels3) three panels at a time
 * where three are left. */
AI void qg_rows16(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                  const struct wmat *w, int r0, int r1, const int B, const int G, const int L,
                  const bool three)
{
    const size_t hdr = kern_qi_hdr(w);
    const int n_tiles = (n_tok + QG_TILE - 1) / QG_TILE,
              pf_at = (n_tiles > 3 ? n_tiles - 3 : 0) * QG_TILE;
    r1 = r1 < w->out ? r1 : w->out;
    for (int p = r0 / 16; p * 16 < r1;) {
        if (B == 4 && three && 16 * (p + 2) < r1) {
            qg_panels3(y, ldy, xq, ldxq, n_tok, w, p, r0, r1, G, L);
            p += 3;
            continue;
        }
        const __mmask16 rm = qg_panel_mask(p, r0, r1);
        for (int c0 = 0; c0 < w->in; c0 += QI_CH) {
            const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
            struct qg_ops op, op1;
            qg_chunk_ops(&op, &op1, w, p, c0, 16 * (p + 1) < r1 ? p + 1 : -1, n_tok, B, G);
            qg_tiles(y, ldy, xq, ldxq, hdr, n_tok, &op, &op1, 16 * p, rm, c0, gn, c0 > 0, NULL,
                     pf_at, B, G, L);
        }
        p++;
    }
}

/* Rows r0 .. r1 of a QG16 W for fewer than QG_TILE tokens: two panels at a time
 * (qg_panelsn), a thread's odd last panel on its own (qg_rows16). */
AI void qg_rows16n(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                   const struct wmat *w, int r0, int r1, const int B, const int G, const int L)
{
    r1 = r1 < w->out ? r1 : w->out;
    int p = r0 / 16;
    for (; 16 * (p + QGN_NP - 1) < r1; p += QGN_NP)
        qg_panelsn(y, ldy, xq, ldxq, n_tok, w, p, r0, r1, B, G, L);
    if (16 * p < r1)
        qg_rows16(y, ldy, xq, ldxq, n_tok, w, 16 * p > r0 ? 16 * p : r0, r1, B, G, L, false);
}

/* qg_panelsn from LP_VNNI_QG_T4 tokens (qg_some): the tokens four at a time (qg_tile4n), the last
 * one to three as a pair and a single. The first tile streams each chunk with the
 * prefetches; the others read it from L1 or L2. Its set-up repeats qg_panelsn's rather than
 * sharing it: through a helper function or a flag on qg_panelsn, qg_few (one to three
 * tokens) compiled to different code, and such changes cost one sequence 2-6 % (ADR 0043). */
AI void qg_panels4n(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                    const struct wmat *w, int p, int r0, int r1, const int B, const int G,
                    const int L)
{
    enum { NP = QGN_NP };
    const size_t hdr = kern_qi_hdr(w);
    __mmask16 rm[NP];
    for (int i = 0; i < NP; i++)
        rm[i] = qg_panel_mask(p + i, r0, r1);
    for (int c0 = 0; c0 < w->in; c0 += QI_CH) {
        const int cn = w->in - c0 < QI_CH ? w->in - c0 : QI_CH, gn = cn / G;
        struct qg_ops op[NP], op1[NP];
        const struct qg_ops *po[NP], *po1[NP];
        for (int i = 0; i < NP; i++) {
            const int np = p + i + NP;
            qg_chunk_ops(&op[i], &op1[i], w, p + i, c0, 16 * np < r1 ? np : -1, n_tok, B, G);
            po[i] = &op[i];
            po1[i] = &op1[i];
        }
        int t = 0;
        for (; t + 4 <= n_tok; t += 4)
            qg_tile4n(y, ldy, xq, ldxq, hdr, t, t == 0 ? po1 : po, 16 * p, rm, c0, gn, c0 > 0, B,
                      G, L);
        for (; t < n_tok; t += 2) {
            const int tn = n_tok - t >= 2 ? 2 : 1;
            if (B == 8 && tn == 2)
                qg_tile8n(y, ldy, xq, ldxq, hdr, t, po, 16 * p, rm, c0, gn, c0 > 0, 2, G);
            else if (B == 8)
                qg_tile8n(y, ldy, xq, ldxq, hdr, t, po, 16 * p, rm, c0, gn, c0 > 0, 1, G);
            else if (tn == 2)
                qg_tilen(y, ldy, xq, ldxq, hdr, t, po, 16 * p, rm, c0, gn, c0 > 0, 2, G, L);
            else
                qg_tilen(y, ldy, xq, ldxq, hdr, t, po, 16 * p, rm, c0, gn, c0 > 0, 1, G, L);
        }
    }
}

/* Rows r0 .. r1 of a QG16 W for LP_VNNI_QG_T4 .. QG_TILE - 1 tokens: qg_rows16n with
 * qg_panels4n. */
AI void qg_rows16_4n(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                     const struct wmat *w, int r0, int r1, const int B, const int G, const int L)
{
    r1 = r1 < w->out ? r1 : w->out;
    int p = r0 / 16;
    for (; 16 * (p + QGN_NP - 1) < r1; p += QGN_NP)
        qg_panels4n(y, ldy, xq, ldxq, n_tok, w, p, r0, r1, B, G, L);
    if (16 * p < r1)
        qg_rows16(y, ldy, xq, ldxq, n_tok, w, 16 * p > r0 ? 16 * p : r0, r1, B, G, L, false);
}

/* The (bits, group) switch of qg_few and qg_some: CALL(B, G, L) for W's (fast: 4-bit W by
 * x's high limb alone, a5_matvec_qi_fast). */
#define QG_FEW_SWITCH(CALL)                                                                      \
    do {                                                                                         \
        if (fast)                                                                                \
            switch (w->qgroup) {                                                                 \
            case 32: CALL(4, 32, 1); break;                                                      \
            case 64: CALL(4, 64, 1); break;                                                      \
            default: CALL(4, 128, 1); break;                                                     \
            }                                                                                    \
        else                                                                                     \
            switch (w->qbits * 1000 + w->qgroup) {                                               \
            case 4032: CALL(4, 32, 2); break;                                                    \
            case 4064: CALL(4, 64, 2); break;                                                    \
            case 4128: CALL(4, 128, 2); break;                                                   \
            case 8032: CALL(8, 32, 2); break;                                                    \
            case 8064: CALL(8, 64, 2); break;                                                    \
            default: CALL(8, 128, 2); break;                                                     \
            }                                                                                    \
    } while (0)

/* A QG16 W for LP_VNNI_QG_T4 .. QG_TILE - 1 tokens, out of line on its own: compiled into qg_few,
 * the tiles of four cost one sequence 2-6 % (ADR 0043). */
QI_NOSAN __attribute__((noinline)) static void qg_some(float *y, size_t ldy, const uint8_t *xq,
                                                       size_t ldxq, int n_tok,
                                                       const struct wmat *w, int r0, int r1,
                                                       bool fast)
{
#define QG_SOME(B, G, L) qg_rows16_4n(y, ldy, xq, ldxq, n_tok, w, r0, r1, B, G, L)
    QG_FEW_SWITCH(QG_SOME);
#undef QG_SOME
}

/* A QG16 W for fewer than LP_VNNI_QG_T4 tokens, out of line: inlined beside the tiles of 8
 * in a5_matvec_qi_l, it cost those 7-10 % (ADR 0043). */
QI_NOSAN __attribute__((noinline)) static void qg_few(float *y, size_t ldy, const uint8_t *xq,
                                                      size_t ldxq, int n_tok, const struct wmat *w,
                                                      int r0, int r1, bool fast)
{
#define QG_FEW(B, G, L) qg_rows16n(y, ldy, xq, ldxq, n_tok, w, r0, r1, B, G, L)
    QG_FEW_SWITCH(QG_FEW);
#undef QG_FEW
}

/* QG16 panels [p0, p1) of w (kern.h), chunk by chunk. On this VM a load's packing time is
 * the stores to freshly mapped pages (perf: the same share as a plain copy loop's). */
QI_NOSAN static void a5_qg16_pack(uint8_t *dst, const struct wmat *w, int p0, int p1)
{
    const size_t ssz = dtype_size(w->qsdt);
    for (int p = p0; p < p1; p++)
        for (int c0 = 0; c0 < w->in; c0 += QI_CH)
            qg16_pack_chunk(dst + (size_t)p * w->qg16_panel + kern_qg16_bytes(c0, w->qbits, w->qgroup, ssz),
                            w, 16 * p, w->out - 16 * p < 16 ? w->out - 16 * p : 16, c0,
                            w->in - c0 < QI_CH ? w->in - c0 : QI_CH, 0);
}

/* Affine 4-bit W with L limbs of x per code (2: exact; 1: --fast), and for L 2 every other
 * W this variant takes: the kernel the plan named (w->kid, linear_plan.h). */
AI void a5_matvec_qi_l(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                       const struct wmat *w, int r0, int r1, const int L)
{
    const bool three = w->kid == LK_VNNI_QG_TILES3;
    switch (w->kid) {
    case LK_A2_QI: /* mxfp4 */
        kern_avx2_matvec_qi(y, ldy, xq, ldxq, n_tok, w, r0, r1);
        return;
    case LK_VNNI_QG_FEW:
        qg_few(y, ldy, xq, ldxq, n_tok, w, r0, r1, L == 1 && w->qbits == 4);
        return;
    case LK_VNNI_QG_SOME:
        qg_some(y, ldy, xq, ldxq, n_tok, w, r0, r1, L == 1 && w->qbits == 4);
        return;
    case LK_VNNI_QG_TILES:
    case LK_VNNI_QG_TILES3:
        switch (w->qbits * 1000 + w->qgroup) {
        case 4032: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 4, 32, L, three); break;
        case 4064: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 4, 64, L, three); break;
        case 4128: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 4, 128, L, three); break;
        case 8032: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 8, 32, 2, false); break;
        case 8064: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 8, 64, 2, false); break;
        default: qg_rows16(y, ldy, xq, ldxq, n_tok, w, r0, r1, 8, 128, 2, false); break;
        }
        return;
    default:
        break;
    }
    if (w->kid == LK_VNNI_QG_ROWS) {
        switch (w->qgroup) {
        case 32: qg_rows(y, ldy, xq, ldxq, n_tok, w, r0, r1, 32, L); break;
        case 64: qg_rows(y, ldy, xq, ldxq, n_tok, w, r0, r1, 64, L); break;
        default: qg_rows(y, ldy, xq, ldxq, n_tok, w, r0, r1, 128, L); break;
        }
        return;
    }
    kern_avx512_qv_rows(y, ldy, xq, ldxq, n_tok, w, r0, r1, L);
}

QI_NOSAN static void a5_matvec_qi(float *y, size_t ldy, const uint8_t *xq, size_t ldxq, int n_tok,
                                  const struct wmat *w, int r0, int r1)
{
    a5_matvec_qi_l(y, ldy, xq, ldxq, n_tok, w, r0, r1, 2);
}

/* --fast: affine 4-bit W by x's high limb alone, q = 256 hi (an int8 per code and a scale
 * per group: 8 significant bits, llama.cpp's Q8 activations), half the products of the
 * exact path; every other W as a5_matvec_qi. */
QI_NOSAN static void a5_matvec_qi_fast(float *y, size_t ldy, const uint8_t *xq, size_t ldxq,
                                       int n_tok, const struct wmat *w, int r0, int r1)
{
    if (w->qmode != QMODE_AFFINE || w->qbits != 4) {
        a5_matvec_qi(y, ldy, xq, ldxq, n_tok, w, r0, r1);
        return;
    }
    a5_matvec_qi_l(y, ldy, xq, ldxq, n_tok, w, r0, r1, 1);
}

static bool a5_qi_any_tok(const struct wmat *w)
{
    return w->qmode == QMODE_AFFINE && (w->qbits == 4 || w->qg16);
}

bool kern_avx512_qi_init(struct cpu_kernels *k)
{
    if (!k->qi_prep) /* the AVX2 preparation is the one this kernel reads */
        return false;
    k->matvec_qi = a5_matvec_qi;
    k->matvec_qi_fast = a5_matvec_qi_fast;
    k->qi_any_tok = a5_qi_any_tok; /* the 4-bit GEMM above also runs prefill */
    k->qg16_pack = a5_qg16_pack;   /* and reads weights repacked as QG16 */
    k->gemm_min_tok_qi = LP_VNNI_GEMM_QI;
    return true;
}

#else

bool kern_avx512_qi_init(struct cpu_kernels *k)
{
    (void)k;
    return false;
}

#endif
