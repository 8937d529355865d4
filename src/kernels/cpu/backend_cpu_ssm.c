/*
 * backend_cpu_ssm: Mamba-2's SSD scan on the CPU (backend.h ssd_scan), the scalar
 * reference of the recurrence. Work splits over (head, channel) pairs: a thread owns the
 * d_state floats of its pairs' state rows in every sequence, so it walks the chunk's rows
 * in order and each sequence's rows see the state its earlier rows left, wherever other
 * sequences' rows sit between them; a row at position 0 clears its own state rows first.
 * B and C rows are shared by the heads of a group and only read.
 *
 * Prefill: a chunk holding a run of SSD_CHUNK_MIN or more consecutive positions of one
 * sequence takes the chunked form of the scan (the SSD paper's block decomposition) for
 * blocks of up to SSD_CHUNK rows of such runs, threaded over heads: with the log decays
 * cum[t] = sum_{s <= t} A dt_s of the block and its incoming state S0,
 *   y_t = e^{cum[t]} C_t . S0 + sum_{s <= t} e^{cum[t] - cum[s]} dt_s (C_t . B_s) x_s + D x_t
 *   S   = e^{cum[T-1]} S0 + sum_s e^{cum[T-1] - cum[s]} dt_s x_s B_s^T
 * (every exponent <= 0), products over whole blocks instead of a loop carried row by row;
 * rows outside long runs (decode rows of a mixed batch) take the recurrence.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* rows per block of the chunked form, and the shortest run that takes it */
#define SSD_CHUNK 64
#define SSD_CHUNK_MIN 8

struct ssd_ctx {
    float **scr;                        /* per-thread scratch (chunked form) */
    const int32_t *run;                 /* [n_tok] consecutive rows of row i's sequence from i */
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

/* The (head, channel) pairs [u0, u1) of every row. */
static void ssd_range(const struct ssd_ctx *sc, long u0, long u1)
{
    const struct ssd_params *p = &sc->p;
    int P = p->head_dim, N = p->d_state, rep = p->n_head / p->n_group;
    size_t sd = (size_t)p->n_head * P * N;
    for (int i = 0; i < sc->n_tok; i++) {
        float *S = sc->st + (size_t)sc->seq[i] * sd;
        const float *x = sc->x + (size_t)i * sc->ldx;
        const float *Bi = sc->B + (size_t)i * sc->ldx, *Ci = sc->C + (size_t)i * sc->ldx;
        float *y = sc->y + (size_t)i * sc->ldy;
        if (sc->pos[i] == 0)
            memset(S + (size_t)u0 * N, 0, (size_t)(u1 - u0) * N * sizeof *S);
        int h_prev = -1;
        float dt = 0.0f, a = 0.0f, dh = 0.0f;
        for (long u = u0; u < u1; u++) {
            int h = (int)(u / P), g = h / rep;
            if (h != h_prev) {
                dt = ssd_dt(sc->dt[(size_t)i * sc->lddt + h] + sc->dt_bias[h], p->dt_min, p->dt_max);
                a = expf(-expf(sc->a_log[h]) * dt);
                dh = sc->d ? sc->d[h] : 0.0f;
                h_prev = h;
            }
            const float *b = Bi + (size_t)g * N, *c = Ci + (size_t)g * N;
            float *s = S + (size_t)u * N, xv = x[u], dx = dt * xv, acc = 0.0f;
            for (int n = 0; n < N; n++) {
                s[n] = a * s[n] + dx * b[n];
                acc += s[n] * c[n];
            }
            y[u] = acc + dh * xv;
        }
    }
}

/* Head h of row i by the recurrence (S: the head's [P][N] state of row i's sequence). */
static void ssd_head_step(const struct ssd_ctx *sc, int h, int i, float *S)
{
    const struct ssd_params *p = &sc->p;
    int P = p->head_dim, N = p->d_state, g = h / (p->n_head / p->n_group);
    float d = ssd_dt(sc->dt[(size_t)i * sc->lddt + h] + sc->dt_bias[h], p->dt_min, p->dt_max);
    float a = expf(-expf(sc->a_log[h]) * d), dh = sc->d ? sc->d[h] : 0.0f;
    const float *x = sc->x + (size_t)i * sc->ldx + (size_t)h * P;
    const float *b = sc->B + (size_t)i * sc->ldx + (size_t)g * N;
    const float *c = sc->C + (size_t)i * sc->ldx + (size_t)g * N;
    float *y = sc->y + (size_t)i * sc->ldy + (size_t)h * P;
    for (int q = 0; q < P; q++) {
        float *sr = S + (size_t)q * N, xv = x[q], dx = d * xv, acc = 0.0f;
        for (int n = 0; n < N; n++) {
            sr[n] = a * sr[n] + dx * b[n];
            acc += sr[n] * c[n];
        }
        y[q] = acc + dh * xv;
    }
}

static float dotf(const float *a, const float *b, int n)
{
    float acc = 0.0f;
    for (int k = 0; k < n; k++)
        acc += a[k] * b[k];
    return acc;
}

/* Head h of rows [i, i + T) of one sequence by the chunked form (S: that head's state).
 * scr: 2 T + T^2 + T * head_dim floats. */
static void ssd_head_block(const struct ssd_ctx *sc, int h, int i, int T, float *S, float *scr)
{
    const struct ssd_params *p = &sc->p;
    int P = p->head_dim, N = p->d_state, g = h / (p->n_head / p->n_group);
    float A = -expf(sc->a_log[h]), dh = sc->d ? sc->d[h] : 0.0f, acc = 0.0f;
    float *cum = scr, *dts = scr + T, *G = scr + 2 * T, *Y = G + (size_t)T * T;
    size_t ldx = sc->ldx;
    const float *x = sc->x + (size_t)i * ldx + (size_t)h * P;
    const float *B = sc->B + (size_t)i * ldx + (size_t)g * N;
    const float *C = sc->C + (size_t)i * ldx + (size_t)g * N;
    for (int t = 0; t < T; t++) {
        dts[t] = ssd_dt(sc->dt[(size_t)(i + t) * sc->lddt + h] + sc->dt_bias[h], p->dt_min, p->dt_max);
        acc += A * dts[t];
        cum[t] = acc;
    }
    /* G[t][s] = e^{cum[t] - cum[s]} dt_s (C_t . B_s), s <= t */
    for (int t = 0; t < T; t++)
        for (int s2 = 0; s2 <= t; s2++)
            G[(size_t)t * T + s2] = expf(cum[t] - cum[s2]) * dts[s2] *
                                    dotf(C + (size_t)t * ldx, B + (size_t)s2 * ldx, N);
    /* y_t from the incoming state and the block's own rows */
    for (int t = 0; t < T; t++) {
        float e0 = expf(cum[t]);
        const float *ct = C + (size_t)t * ldx, *gt = G + (size_t)t * T;
        float *yt = Y + (size_t)t * P;
        for (int q = 0; q < P; q++)
            yt[q] = e0 * dotf(ct, S + (size_t)q * N, N) + dh * x[(size_t)t * ldx + q];
        for (int s2 = 0; s2 <= t; s2++) {
            const float *xs = x + (size_t)s2 * ldx;
            for (int q = 0; q < P; q++)
                yt[q] += gt[s2] * xs[q];
        }
    }
    /* the state after the block; dts becomes each row's weight e^{cum[T-1] - cum[s]} dt_s */
    float eT = expf(cum[T - 1]);
    for (int s2 = 0; s2 < T; s2++)
        dts[s2] *= expf(cum[T - 1] - cum[s2]);
    for (int q = 0; q < P; q++) {
        float *sr = S + (size_t)q * N;
        for (int n = 0; n < N; n++)
            sr[n] *= eT;
        for (int s2 = 0; s2 < T; s2++) {
            float w = dts[s2] * x[(size_t)s2 * ldx + q];
            const float *bs = B + (size_t)s2 * ldx;
            for (int n = 0; n < N; n++)
                sr[n] += w * bs[n];
        }
    }
    /* y last: it may be x */
    for (int t = 0; t < T; t++)
        memcpy(sc->y + (size_t)(i + t) * sc->ldy + (size_t)h * P, Y + (size_t)t * P,
               (size_t)P * sizeof *Y);
}

/* Every row of heads [h0, h1): blocks of long runs chunked, other rows recurrent. */
static void ssd_heads(const struct ssd_ctx *sc, int h0, int h1, float *scr)
{
    const struct ssd_params *p = &sc->p;
    size_t hs = (size_t)p->head_dim * p->d_state, sd = (size_t)p->n_head * hs;
    for (int h = h0; h < h1; h++)
        for (int i = 0; i < sc->n_tok;) {
            float *S = sc->st + (size_t)sc->seq[i] * sd + (size_t)h * hs;
            if (sc->pos[i] == 0)
                memset(S, 0, hs * sizeof *S);
            int T = sc->run[i] < SSD_CHUNK ? sc->run[i] : SSD_CHUNK;
            if (T < SSD_CHUNK_MIN) {
                ssd_head_step(sc, h, i, S);
                i++;
            } else {
                ssd_head_block(sc, h, i, T, S, scr);
                i += T;
            }
        }
}

static void ssd_chunked_task(void *arg, int ith, int nth)
{
    const struct ssd_ctx *sc = arg;
    long lo, hi;
    tpool_range(sc->p.n_head, ith, nth, &lo, &hi);
    if (lo < hi)
        ssd_heads(sc, (int)lo, (int)hi, sc->scr[ith]);
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
        .y = y, .x = x, .B = B, .C = C, .dt = dt,
        .ldy = (size_t)ldy, .ldx = (size_t)ldx, .lddt = (size_t)lddt,
        .a_log = a_log->data, .d = has_d ? d->data : NULL, .dt_bias = dt_bias->data,
        .st = st->v, .pos = rows->pos, .seq = rows->state, .n_tok = n_tok, .p = *p,
    };
    /* runs of consecutive positions of one sequence, from each row on */
    int32_t *run = cpu_iscratch_ensure(c, (size_t)n_tok);
    if (!run)
        return;
    int longest = 0;
    for (int i = n_tok - 1; i >= 0; i--) {
        bool next = i + 1 < n_tok && rows->state[i + 1] == rows->state[i] &&
                    rows->pos[i + 1] == rows->pos[i] + 1;
        run[i] = next ? run[i + 1] + 1 : 1;
        longest = run[i] > longest ? run[i] : longest;
    }
    if (longest >= SSD_CHUNK_MIN) {
        size_t need = 2 * SSD_CHUNK + (size_t)SSD_CHUNK * SSD_CHUNK + (size_t)SSD_CHUNK * p->head_dim;
        if (!cpu_scratch_ensure(c, need))
            return;
        sc.scr = c->scr;
        sc.run = run;
        tpool_run(c->pool, ssd_chunked_task, &sc);
        return;
    }
    if ((size_t)n_tok * p->n_head * p->head_dim * p->d_state < 32768)
        ssd_task(&sc, 0, 1);
    else
        tpool_run(c->pool, ssd_task, &sc);
}
