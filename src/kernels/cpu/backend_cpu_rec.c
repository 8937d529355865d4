/*
 * backend_cpu_rec: the CPU's ops of recurrent layers (backend.h, ADR 0057): the causal
 * depthwise convolution with a carried state. Work splits over channels: a thread owns
 * its channels' state in every sequence, so it walks the chunk's rows in order and each
 * sequence's rows see the state its earlier rows left, wherever other sequences' rows
 * sit between them. The convolution itself is kern_conv.h, compiled per ISA (kern.h
 * conv_rows).
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

static void conv_task(void *arg, int ith, int nth)
{
    const struct conv_ctx *cc = arg;
    long lo, hi, blocks = (cc->n_ch + 15) / 16;
    tpool_range(blocks, ith, nth, &lo, &hi);
    int c0 = (int)(lo * 16), c1 = (int)(hi * 16 < cc->n_ch ? hi * 16 : cc->n_ch);
    if (c0 < c1)
        cc->k->conv_rows(cc, c0, c1);
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
        .k = &c->k, .y = y, .x = x, .ldy = (size_t)ldy, .ldx = (size_t)ldx,
        .w = w->data, .b = b && tensor_is_present(b) ? b->data : NULL,
        .st = st->k, .pos = rows->pos, .seq = rows->state,
        .n_tok = n_tok, .n_ch = n_ch, .K = K, .silu = silu,
    };
    if ((size_t)n_tok * n_ch * K < 32768)
        conv_task(&cc, 0, 1);
    else
        tpool_run(c->pool, conv_task, &cc);
}
