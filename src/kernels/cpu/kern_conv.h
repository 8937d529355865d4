/*
 * kern_conv.h: the causal depthwise convolution's body (backend.h conv1d; backend_cpu_rec.c
 * has the threading). Static functions, included once per ISA by kern_rec_ref.c,
 * kern_rec_avx2.c and kern_rec_avx512.c (their flags and -fvect-cost-model=dynamic): blocks of
 * CONV_BLK channels, the block's taps transposed on the stack so that each tap is one vector
 * across the channels. Each output is b + the taps over the state's rows, oldest first, then
 * the input's (the order the scalar loop had), so every ISA gives the same sums; the silu is
 * the table's silu_mul (times 1). Widths above CONV_KMAX take the plain per-channel loop.
 *
 * The including file defines KERN_CONV_ENTRY, the name of its kern.h conv_rows.
 */
#include <math.h>
#include <string.h>

#include "kern.h"

#define CONV_BLK 16
#define CONV_KMAX 16

static const float conv_ones[CONV_BLK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* Channels [c0, c0 + nc), nc <= CONV_BLK, of every row. */
static void conv_block(const struct conv_ctx *cc, int c0, int nc)
{
    int K = cc->K, km = K - 1;
    size_t n_ch = (size_t)cc->n_ch, sd = (size_t)km * n_ch;
    float wT[CONV_KMAX][CONV_BLK], b[CONV_BLK];
    memset(wT, 0, sizeof wT);
    for (int c = 0; c < CONV_BLK; c++)
        b[c] = cc->b && c < nc ? cc->b[c0 + c] : 0.0f;
    for (int c = 0; c < nc; c++)
        for (int j = 0; j < K; j++)
            wT[j][c] = cc->w[(size_t)(c0 + c) * K + j];
    for (int i = 0; i < cc->n_tok; i++) {
        float *st = cc->st + (size_t)cc->seq[i] * sd + c0;
        const float *x = cc->x + (size_t)i * cc->ldx + c0;
        float *y = cc->y + (size_t)i * cc->ldy + c0, acc[CONV_BLK], xv[CONV_BLK];
        if (cc->pos[i] == 0)
            for (int j = 0; j < km; j++)
                memset(st + (size_t)j * n_ch, 0, (size_t)nc * sizeof *st);
        if (nc == CONV_BLK) {
            for (int c = 0; c < CONV_BLK; c++) {
                acc[c] = b[c];
                xv[c] = x[c];   /* y may be x */
            }
            for (int j = 0; j < km; j++) {
                const float *restrict sj = st + (size_t)j * n_ch;
                for (int c = 0; c < CONV_BLK; c++)
                    acc[c] += wT[j][c] * sj[c];
            }
            for (int c = 0; c < CONV_BLK; c++)
                acc[c] += wT[km][c] * xv[c];
            for (int j = 0; j + 1 < km; j++) {
                float *restrict d = st + (size_t)j * n_ch;
                const float *restrict sj = d + n_ch;
                for (int c = 0; c < CONV_BLK; c++)
                    d[c] = sj[c];
            }
            if (km > 0)
                memcpy(st + (size_t)(km - 1) * n_ch, xv, sizeof xv);
        } else {
            for (int c = 0; c < nc; c++) {
                acc[c] = b[c];
                xv[c] = x[c];
            }
            for (int j = 0; j < km; j++)
                for (int c = 0; c < nc; c++)
                    acc[c] += wT[j][c] * st[(size_t)j * n_ch + c];
            for (int c = 0; c < nc; c++)
                acc[c] += wT[km][c] * xv[c];
            for (int j = 0; j + 1 < km; j++)
                memmove(st + (size_t)j * n_ch, st + (size_t)(j + 1) * n_ch, (size_t)nc * sizeof *st);
            if (km > 0)
                memcpy(st + (size_t)(km - 1) * n_ch, xv, (size_t)nc * sizeof *xv);
        }
        if (cc->silu)
            cc->k->silu_mul(y, acc, conv_ones, (size_t)nc);
        else
            memcpy(y, acc, (size_t)nc * sizeof *y);
    }
}

/* Widths past CONV_KMAX: one channel at a time. */
static void conv_wide(const struct conv_ctx *cc, int c0, int c1)
{
    int K = cc->K, km = K - 1, nc = c1 - c0;
    size_t sd = (size_t)km * cc->n_ch;
    for (int i = 0; i < cc->n_tok; i++) {
        float *st = cc->st + (size_t)cc->seq[i] * sd;
        const float *x = cc->x + (size_t)i * cc->ldx;
        float *y = cc->y + (size_t)i * cc->ldy;
        if (cc->pos[i] == 0)
            for (int j = 0; j < km; j++)
                memset(st + (size_t)j * cc->n_ch + c0, 0, (size_t)nc * sizeof *st);
        for (int c = c0; c < c1; c++) {
            const float *w = cc->w + (size_t)c * K;
            float xc = x[c], acc = cc->b ? cc->b[c] : 0.0f;
            for (int j = 0; j < km; j++)
                acc += w[j] * st[(size_t)j * cc->n_ch + c];
            acc += w[km] * xc;
            for (int j = 0; j + 1 < km; j++)
                st[(size_t)j * cc->n_ch + c] = st[(size_t)(j + 1) * cc->n_ch + c];
            if (km > 0)
                st[(size_t)(km - 1) * cc->n_ch + c] = xc;
            if (cc->silu)
                cc->k->silu_mul(&y[c], &acc, conv_ones, 1);
            else
                y[c] = acc;
        }
    }
}

void KERN_CONV_ENTRY(const struct conv_ctx *cc, int c0, int c1)
{
    if (cc->K > CONV_KMAX) {
        conv_wide(cc, c0, c1);
        return;
    }
    for (int c = c0; c < c1; c += CONV_BLK)
        conv_block(cc, c, c1 - c < CONV_BLK ? c1 - c : CONV_BLK);
}
