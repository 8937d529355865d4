/*
 * kern_rglru.h: Griffin's RG-LRU's body (backend.h rglru; backend_cpu_rglru.c has the threading
 * and the checks). Static functions, included once per ISA by kern_rec_ref.c, kern_rec_avx2.c
 * and kern_rec_avx512.c (their flags and -fvect-cost-model=dynamic). Per row and head, the
 * input and recurrence gates of the head's channels in [c0, c1) are one pass over the head's
 * bw inputs, each adding input k times the weights' row k across the channels (a vector);
 * each gate still sums bias, then k = 0, 1, ... as the per-channel loop did, so every ISA
 * gives the same sums. The per-channel transcendentals stay scalar libm calls.
 *
 * The including file defines KERN_RGLRU_ENTRY, the name of its kern.h rglru_rows.
 */
#include <math.h>
#include <string.h>

#include "kern.h"

/* Channels per pass: the gates of at most this many channels of one head at a time. */
#define RGLRU_SEG 16

/* torch's softplus: x above 20 passes through */
static float rglru_softplus(float v)
{
    return v > 20.0f ? v : log1pf(expf(v));
}

/* Channels [c0, c1) of head h (all in it), row i. */
static void rglru_seg(const struct rglru_ctx *rc, int i, int h, int c0, int c1)
{
    int bw = rc->bw, n = c1 - c0, j0 = c0 - h * bw;
    float *st = rc->st + (size_t)rc->seq[i] * rc->width;
    const float *x = rc->x + (size_t)i * rc->ldx, *xh = x + (size_t)h * bw;
    const float *wi = rc->wi + (size_t)h * bw * bw + j0, *wa = rc->wa + (size_t)h * bw * bw + j0;
    float gi[RGLRU_SEG], ga[RGLRU_SEG];
    for (int jj = 0; jj < n; jj++) {
        gi[jj] = rc->bi[c0 + jj];
        ga[jj] = rc->ba[c0 + jj];
    }
    for (int k = 0; k < bw; k++) {
        float xk = xh[k];
        const float *restrict wik = wi + (size_t)k * bw, *restrict wak = wa + (size_t)k * bw;
        for (int jj = 0; jj < n; jj++) {
            gi[jj] += xk * wik[jj];
            ga[jj] += xk * wak[jj];
        }
    }
    float *y = rc->y + (size_t)i * rc->ldy;
    bool reset = rc->pos[i] == 0;
    for (int jj = 0; jj < n; jj++) {
        int c = c0 + jj;
        float g_i = 1.0f / (1.0f + expf(-gi[jj])), g_a = 1.0f / (1.0f + expf(-ga[jj]));
        float log_a = -8.0f * g_a * rglru_softplus(rc->ap[c]);
        float a = expf(log_a);
        float u = x[c] * g_i;
        float hv = reset ? u : a * st[c] + u * sqrtf(1.0f - expf(2.0f * log_a));
        st[c] = hv;
        y[c] = hv;
    }
}

void KERN_RGLRU_ENTRY(const struct rglru_ctx *rc, int c0, int c1)
{
    int bw = rc->bw;
    for (int i = 0; i < rc->n_tok; i++)
        for (int c = c0; c < c1;) {
            int h = c / bw, end = (h + 1) * bw < c1 ? (h + 1) * bw : c1;
            if (end - c > RGLRU_SEG)
                end = c + RGLRU_SEG;
            rglru_seg(rc, i, h, c, end);
            c = end;
        }
}
