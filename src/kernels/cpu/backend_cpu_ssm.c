/*
 * backend_cpu_ssm: Mamba-2's SSD scan on the CPU (backend.h ssd_scan): the recurrence, per
 * (head, channel) pair by the ISA's ssd_rows kernel (kern.h; the scalar one is the
 * reference, AVX-512 keeps the pair's state row in registers over a run of rows). Work
 * splits over (head, channel) pairs: a thread owns the
 * d_state floats of its pairs' state rows in every sequence, so it walks the chunk's rows
 * in order and each sequence's rows see the state its earlier rows left, wherever other
 * sequences' rows sit between them; a row at position 0 clears its own state rows first.
 * B and C rows are shared by the heads of a group and only read.
 *
 * Prefill takes the same recurrence, walked per (head, channel) pair over the chunk's rows
 * (the pair's state row stays in cache), so the chunk's rows are sequential only within a
 * pair. The chunked SSD form (the paper's block decomposition: C.B products weighted by
 * the block's decays, the incoming state's share, the outgoing state) was written and
 * measured here: on a 33M-parameter Mamba-2 (24 heads of 64, state 128; 2 threads,
 * AVX-512 host) pp256 ran at 660 tokens/s against 1210 for this recurrence, since on a CPU
 * it adds the C.B and intra-block products to the same state products (its gain is a
 * GPU's tensor cores); it is in the history (ADR 0066), not here.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

struct ssd_ctx {
    const struct cpu_kernels *k;
    const float *dtd;                   /* [n_tok][n_head][2]: dt and exp(A dt) */
    float *y;
    const float *x, *B, *C, *dt;
    size_t ldy, ldx, lddt;
    const float *a_log, *d, *dt_bias;   /* [n_head], d may be NULL */
    float *st;                          /* [seqs][n_head][head_dim][d_state] */
    const int32_t *pos, *seq;
    int n_tok;
    struct ssd_params p;
};

/* torch.nn.functional.softplus (beta 1, threshold 20), then the time_step_limit clamp */
static float ssd_dt(float v, float lo, float hi)
{
    float s = v > 20.0f ? v : log1pf(expf(v));
    return fminf(fmaxf(s, lo), hi);
}

/* The (head, channel) pairs [u0, u1) of every row: a pair's state row stays in cache (or
 * registers: kern.h ssd_rows) while its rows go by, one call per run of consecutive rows of
 * one sequence; dtd holds each row's and head's dt and decay. */
static void ssd_range(const struct ssd_ctx *sc, long u0, long u1)
{
    const struct ssd_params *p = &sc->p;
    int P = p->head_dim, N = p->d_state, H = p->n_head, rep = H / p->n_group;
    size_t sd = (size_t)H * P * N;
    for (long u = u0; u < u1; u++) {
        int h = (int)(u / P), g = h / rep;
        float dh = sc->d ? sc->d[h] : 0.0f;
        for (int i = 0; i < sc->n_tok;) {
            int j = i + 1;
            while (j < sc->n_tok && sc->seq[j] == sc->seq[i] && sc->pos[j] != 0)
                j++;
            float *s = sc->st + (size_t)sc->seq[i] * sd + (size_t)u * N;
            if (sc->pos[i] == 0)
                memset(s, 0, (size_t)N * sizeof *s);
            sc->k->ssd_rows(s, N, sc->B + (size_t)i * sc->ldx + (size_t)g * N,
                            sc->C + (size_t)i * sc->ldx + (size_t)g * N, sc->ldx,
                            sc->x + (size_t)i * sc->ldx + u, sc->ldx,
                            sc->dtd + ((size_t)i * H + h) * 2, (size_t)H * 2,
                            sc->y + (size_t)i * sc->ldy + u, sc->ldy, dh, j - i);
            i = j;
        }
    }
}

static void ssd_task(void *arg, int ith, int nth)
{
    const struct ssd_ctx *sc = arg;
    long lo, hi, units = (long)sc->p.n_head * sc->p.head_dim;
    tpool_range(units, ith, nth, &lo, &hi);
    if (lo < hi)
        ssd_range(sc, lo, hi);
}

static bool f32_vec(const struct tensor *t, int n)
{
    return t && tensor_is_present(t) && t->dtype == DTYPE_F32 && tensor_nelem(t) == n;
}

void cpu_ssd_scan(struct backend *be, float *y, int ldy, const float *x, const float *B,
                  const float *C, int ldx, const float *dt, int lddt, const struct tensor *a_log,
                  const struct tensor *d, const struct tensor *dt_bias, const struct kv_layer *st,
                  const struct kv_rows *rows, int n_tok, const struct ssd_params *p)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || n_tok <= 0)
        return;
    bool has_d = d && tensor_is_present(d);
    if (p->n_head < 1 || p->head_dim < 1 || p->d_state < 1 || p->n_group < 1 ||
        p->n_head % p->n_group != 0 || !f32_vec(a_log, p->n_head) ||
        !f32_vec(dt_bias, p->n_head) || (has_d && !f32_vec(d, p->n_head)) ||
        (int64_t)st->v_dim != (int64_t)p->n_head * p->head_dim * p->d_state) {
        cpu_fail(c, "ssd_scan: F32 [n_head] A_log / D / dt_bias and a state of "
                    "n_head * head_dim * d_state floats", 0);
        return;
    }
    struct ssd_ctx sc = {
        .k = &c->k, .y = y, .x = x, .B = B, .C = C, .dt = dt,
        .ldy = (size_t)ldy, .ldx = (size_t)ldx, .lddt = (size_t)lddt,
        .a_log = a_log->data, .d = has_d ? d->data : NULL, .dt_bias = dt_bias->data,
        .st = st->v, .pos = rows->pos, .seq = rows->state, .n_tok = n_tok, .p = *p,
    };
    /* each row's and head's dt and decay, once */
    float *dtd = cpu_shared_ensure(c, (size_t)n_tok * p->n_head * 2);
    if (!dtd)
        return;
    for (int i = 0; i < n_tok; i++)
        for (int h = 0; h < p->n_head; h++) {
            float d = ssd_dt(dt[(size_t)i * lddt + h] + sc.dt_bias[h], p->dt_min, p->dt_max);
            dtd[((size_t)i * p->n_head + h) * 2] = d;
            dtd[((size_t)i * p->n_head + h) * 2 + 1] = expf(-expf(sc.a_log[h]) * d);
        }
    sc.dtd = dtd;
    if ((size_t)n_tok * p->n_head * p->head_dim * p->d_state < 32768)
        ssd_task(&sc, 0, 1);
    else
        tpool_run(c->pool, ssd_task, &sc);
}
