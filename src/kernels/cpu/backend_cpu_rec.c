/*
 * backend_cpu_rec: the CPU's ops of recurrent layers (backend.h, ADR 0057): the causal
 * depthwise convolution with a carried state. Work splits over channels: a thread owns
 * its channels' state in every sequence, so it walks the chunk's rows in order and each
 * sequence's rows see the state its earlier rows left, wherever other sequences' rows
 * sit between them.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

struct conv_ctx {
    float *y;
    const float *x;
    size_t ldy, ldx;
    const float *w, *b;       /* [n_ch, K], [n_ch] or NULL */
    float *st;                /* [seqs][K - 1][n_ch] */
    const int32_t *pos, *seq;
    int n_tok, n_ch, K;
    bool silu;
};

/* Channels [c0, c1) of every row. */
static void conv_range(const struct conv_ctx *cc, int c0, int c1)
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
            y[c] = cc->silu ? acc / (1.0f + expf(-acc)) : acc;
        }
    }
}

static void conv_task(void *arg, int ith, int nth)
{
    const struct conv_ctx *cc = arg;
    long lo, hi, blocks = (cc->n_ch + 15) / 16;
    tpool_range(blocks, ith, nth, &lo, &hi);
    int c0 = (int)(lo * 16), c1 = (int)(hi * 16 < cc->n_ch ? hi * 16 : cc->n_ch);
    if (c0 < c1)
        conv_range(cc, c0, c1);
}

void cpu_conv1d(struct backend *be, float *y, int ldy, const float *x, int ldx,
                const struct tensor *w, const struct tensor *b, const struct kv_layer *st,
                const struct kv_rows *rows, int n_tok, int n_ch, int K, bool silu)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || n_tok <= 0 || n_ch <= 0)
        return;
    if (w->dtype != DTYPE_F32 || (b && tensor_is_present(b) && b->dtype != DTYPE_F32) || K < 1 ||
        st->k_dim != (K - 1) * n_ch) {
        cpu_fail(c, "conv1d: F32 weights and a state of (K - 1) * channels floats", 0);
        return;
    }
    struct conv_ctx cc = {
        .y = y, .x = x, .ldy = (size_t)ldy, .ldx = (size_t)ldx,
        .w = w->data, .b = b && tensor_is_present(b) ? b->data : NULL,
        .st = st->k, .pos = rows->pos, .seq = rows->state,
        .n_tok = n_tok, .n_ch = n_ch, .K = K, .silu = silu,
    };
    if ((size_t)n_tok * n_ch * K < 32768)
        conv_task(&cc, 0, 1);
    else
        tpool_run(c->pool, conv_task, &cc);
}
