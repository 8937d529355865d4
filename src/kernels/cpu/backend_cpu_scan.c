/*
 * backend_cpu_scan: Mamba's selective scan on the CPU (backend.h selective_scan): one
 * recurrent step per row, in f32, as transformers' slow_forward writes it, each channel's
 * steps by the ISA's scan_rows kernel (kern.h; the scalar one is the reference, AVX-512 keeps
 * Mamba's 16 states of a channel in one register over a run of rows). Work splits over blocks of channels: a thread owns its channels' states in every
 * sequence, so it walks the chunk's rows in order and each sequence's rows see the state its
 * earlier rows left, wherever other sequences' rows sit between them (mixed batches); a row at
 * position 0 starts its sequence from a zero state. A = -exp(A_log) is computed once per block
 * of channels, not per row.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* channels per block: A of a block ([SCAN_BLOCK][d_state]) lives on the stack */
#define SCAN_BLOCK 8

struct scan_ctx {
    const struct cpu_kernels *k;
    float *y;
    const float *x, *dt, *B, *C, *z;
    size_t ldy, ldx, lddt, ldbc, ldz;
    const float *A_log, *D;   /* [d_inner, d_state], [d_inner] or NULL */
    float *st;                /* [seqs][d_inner][d_state] */
    const int32_t *pos, *seq;
    int n_tok, d_inner, d_state;
};

/* Rows per piece of a run: their deltas and sums live on the stack. */
#define SCAN_ROWS 64

/* Channels [c0, c1) (at most SCAN_BLOCK) of every row: runs of consecutive rows of one
 * sequence, in pieces of up to SCAN_ROWS rows; per piece the deltas (softplus of dt) of the
 * block's channels, then each channel's recurrence by the ISA's scan_rows (kern.h), then the
 * D skip and the gate. */
static void scan_block(const struct scan_ctx *sc, int c0, int c1)
{
    float a[SCAN_BLOCK * BACKEND_SCAN_MAX_STATE];
    float delta[SCAN_ROWS * SCAN_BLOCK], acc[SCAN_ROWS * SCAN_BLOCK];
    int ds = sc->d_state, nc = c1 - c0;
    size_t sd = (size_t)sc->d_inner * ds;
    for (int c = c0; c < c1; c++)
        for (int s = 0; s < ds; s++)
            a[(c - c0) * ds + s] = -expf(sc->A_log[(size_t)c * ds + s]);
    for (int i = 0; i < sc->n_tok;) {
        int j = i + 1;
        while (j < sc->n_tok && j - i < SCAN_ROWS && sc->seq[j] == sc->seq[i] && sc->pos[j] != 0)
            j++;
        float *h0 = sc->st + (size_t)sc->seq[i] * sd;
        if (sc->pos[i] == 0)
            memset(h0 + (size_t)c0 * ds, 0, (size_t)nc * ds * sizeof *h0);
        for (int t = i; t < j; t++)
            sc->k->softplus(delta + (t - i) * SCAN_BLOCK, sc->dt + (size_t)t * sc->lddt + c0, nc);
        for (int c = c0; c < c1; c++)
            sc->k->scan_rows(h0 + (size_t)c * ds, ds, a + (c - c0) * ds, sc->B + (size_t)i * sc->ldbc,
                             sc->C + (size_t)i * sc->ldbc, sc->ldbc, sc->x + (size_t)i * sc->ldx + c,
                             sc->ldx, delta + c - c0, SCAN_BLOCK, acc + c - c0, SCAN_BLOCK, j - i);
        for (int t = i; t < j; t++) {
            float *v = acc + (t - i) * SCAN_BLOCK, *y = sc->y + (size_t)t * sc->ldy + c0;
            if (sc->D)
                for (int c = c0; c < c1; c++)
                    v[c - c0] += sc->D[c] * sc->x[(size_t)t * sc->ldx + c];
            /* y may be x: row t's x is spent */
            if (sc->z)
                sc->k->silu_mul(y, sc->z + (size_t)t * sc->ldz + c0, v, (size_t)nc);
            else
                memcpy(y, v, (size_t)nc * sizeof *y);
        }
        i = j;
    }
}

static void scan_task(void *arg, int ith, int nth)
{
    const struct scan_ctx *sc = arg;
    long lo, hi, blocks = (sc->d_inner + SCAN_BLOCK - 1) / SCAN_BLOCK;
    tpool_range(blocks, ith, nth, &lo, &hi);
    for (long b = lo; b < hi; b++) {
        int c0 = (int)(b * SCAN_BLOCK), c1 = c0 + SCAN_BLOCK < sc->d_inner ? c0 + SCAN_BLOCK : sc->d_inner;
        scan_block(sc, c0, c1);
    }
}

void cpu_selective_scan(struct backend *be, float *y, int ldy, const float *x, int ldx,
                        const float *dt, int lddt, const float *B, const float *C, int ldbc,
                        const float *z, int ldz, const struct tensor *A_log, const struct tensor *D,
                        const struct kv_layer *st, const struct kv_rows *rows, int n_tok,
                        int d_inner, int d_state)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc || n_tok <= 0 || d_inner <= 0)
        return;
    bool has_d = D && tensor_is_present(D);
    if (A_log->dtype != DTYPE_F32 || (has_d && D->dtype != DTYPE_F32) || d_state < 1 ||
        d_state > BACKEND_SCAN_MAX_STATE || st->v_dim != d_inner * d_state) {
        cpu_fail(c, "selective_scan: F32 A_log / D, 1..256 states and a state of d_inner * "
                 "d_state floats", 0);
        return;
    }
    struct scan_ctx sc = {
        .k = &c->k, .y = y, .x = x, .dt = dt, .B = B, .C = C, .z = z,
        .ldy = (size_t)ldy, .ldx = (size_t)ldx, .lddt = (size_t)lddt, .ldbc = (size_t)ldbc,
        .ldz = (size_t)ldz,
        .A_log = A_log->data, .D = has_d ? D->data : NULL,
        .st = st->v, .pos = rows->pos, .seq = rows->state,
        .n_tok = n_tok, .d_inner = d_inner, .d_state = d_state,
    };
    if ((size_t)n_tok * d_inner * d_state < 32768)
        scan_task(&sc, 0, 1);
    else
        tpool_run(c->pool, scan_task, &sc);
}
