/*
 * backend_cpu_rglru: Griffin's RG-LRU on the CPU (backend.h rglru), the scalar reference.
 * Work splits over channels: a thread owns its channels' state in every sequence and walks
 * the chunk's rows in order, so each sequence's rows see the state its earlier rows left,
 * wherever other sequences' rows sit between them. A channel's gates read its head's
 * block of the row's inputs (x is read only; y is another buffer).
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

struct rglru_ctx {
    float *y;
    const float *x;
    size_t ldy, ldx;
    const float *wi, *bi, *wa, *ba, *ap;
    float *st;                /* [seqs][width] */
    const int32_t *pos, *seq;
    int n_tok, width, bw;
};

/* torch's softplus: x above 20 passes through */
static float softplus_t(float v)
{
    return v > 20.0f ? v : log1pf(expf(v));
}

static void rglru_range(const struct rglru_ctx *rc, int c0, int c1)
{
    int bw = rc->bw;
    for (int i = 0; i < rc->n_tok; i++) {
        float *st = rc->st + (size_t)rc->seq[i] * rc->width;
        const float *x = rc->x + (size_t)i * rc->ldx;
        float *y = rc->y + (size_t)i * rc->ldy;
        bool reset = rc->pos[i] == 0;
        for (int c = c0; c < c1; c++) {
            int h = c / bw, j = c % bw;
            const float *xh = x + (size_t)h * bw;
            const float *wi = rc->wi + (size_t)h * bw * bw + j, *wa = rc->wa + (size_t)h * bw * bw + j;
            float gi = rc->bi[c], ga = rc->ba[c];
            for (int k = 0; k < bw; k++) {
                gi += xh[k] * wi[(size_t)k * bw];
                ga += xh[k] * wa[(size_t)k * bw];
            }
            gi = 1.0f / (1.0f + expf(-gi));
            ga = 1.0f / (1.0f + expf(-ga));
            float log_a = -8.0f * ga * softplus_t(rc->ap[c]);
            float a = expf(log_a);
            float u = x[c] * gi;
            float hv = reset ? u : a * st[c] + u * sqrtf(1.0f - expf(2.0f * log_a));
            st[c] = hv;
            y[c] = hv;
        }
    }
}

static void rglru_task(void *arg, int ith, int nth)
{
    const struct rglru_ctx *rc = arg;
    long lo, hi, blocks = (rc->width + 15) / 16;
    tpool_range(blocks, ith, nth, &lo, &hi);
    int c0 = (int)(lo * 16), c1 = (int)(hi * 16 < rc->width ? hi * 16 : rc->width);
    if (c0 < c1)
        rglru_range(rc, c0, c1);
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
        .y = y, .x = x, .ldy = (size_t)ldy, .ldx = (size_t)ldx,
        .wi = p->wi->data, .bi = p->bi->data, .wa = p->wa->data, .ba = p->ba->data,
        .ap = p->a_param->data, .st = st->v, .pos = rows->pos, .seq = rows->state,
        .n_tok = n_tok, .width = (int)w, .bw = (int)bw,
    };
    if ((size_t)n_tok * w * bw < 32768)
        rglru_task(&rc, 0, 1);
    else
        tpool_run(c->pool, rglru_task, &rc);
}
