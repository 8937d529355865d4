/*
 * backend_cpu_rglru: Griffin's RG-LRU on the CPU (backend.h rglru); the loops are
 * kern_rglru.h, compiled per ISA (kern.h rglru_rows).
 * Work splits over channels: a thread owns its channels' state in every sequence and walks
 * the chunk's rows in order, so each sequence's rows see the state its earlier rows left,
 * wherever other sequences' rows sit between them. A channel's gates read its head's
 * block of the row's inputs (x is read only; y is another buffer).
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

static void rglru_task(void *arg, int ith, int nth)
{
    const struct rglru_ctx *rc = arg;
    long lo, hi, blocks = (rc->width + 15) / 16;
    tpool_range(blocks, ith, nth, &lo, &hi);
    int c0 = (int)(lo * 16), c1 = (int)(hi * 16 < rc->width ? hi * 16 : rc->width);
    if (c0 < c1)
        rc->k->rglru_rows(rc, c0, c1);
}

static bool f32_n(const struct tensor *t, int64_t n)
{
    return t && tensor_is_present(t) && t->dtype == DTYPE_F32 && tensor_nelem(t) == n;
}

void cpu_rglru(struct backend *be, float *y, int ldy, const float *x, int ldx,
               const struct rglru_params *p, const struct kv_layer *st, const struct kv_rows *rows,
               int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    int64_t w = p->width, bw = p->n_head > 0 ? w / p->n_head : 0;
    if (p->n_head < 1 || w < 1 || w % p->n_head != 0 || !f32_n(p->wi, p->n_head * bw * bw) ||
        !f32_n(p->wa, p->n_head * bw * bw) || !f32_n(p->bi, w) || !f32_n(p->ba, w) ||
        !f32_n(p->a_param, w) || (int64_t)st->v_dim != w) {
        cpu_fail(c, "rglru: F32 [n_head, bw, bw] gates, [width] biases and a_param, and a "
                    "state of width floats", 0);
        return;
    }
    struct rglru_ctx rc = {
        .k = &c->k, .y = y, .x = x, .ldy = (size_t)ldy, .ldx = (size_t)ldx,
        .wi = p->wi->data, .bi = p->bi->data, .wa = p->wa->data, .ba = p->ba->data,
        .ap = p->a_param->data, .st = st->v, .pos = rows->pos, .seq = rows->state,
        .n_tok = n_tok, .width = (int)w, .bw = (int)bw,
    };
    if ((size_t)n_tok * w * bw < 32768)
        rglru_task(&rc, 0, 1);
    else
        tpool_run(c->pool, rglru_task, &rc);
}
