/*
 * backend_cpu_attn: rotary embedding, the paged KV store and attention on
 * the CPU (backend.h). The cache is a pool of blocks of block_size slots;
 * a sequence's positions reach their slots through its block table
 * (struct kv_rows), so attention gathers keys block by block.
 *
 * Work splits:
 *   rope       (token, head) pairs, contiguous
 *   kv_store   rows, on the caller (a copy of two rows per token)
 *   attention  items of (tile of consecutive query rows of one sequence,
 *              kv head), round-robin over threads (causal rows grow); a
 *              row alone in its tile (decode) instead gets one item per
 *              ATTN_DC keys (split-K, every head at once), merged after
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"

// ---- rope ----

struct rope_ctx {
    const struct rope_params *rp;
    const struct kv_rows *rows;
    struct cpu_backend *c;
    float *x;
    size_t ld;
    int n_tok, n_head, head_dim;
};

/* cos/sin table of one position: angles in double (positions reach 1e5 and
 * a float product pos * inv_freq would lose ~1e-2 rad there), then cast. */
static void rope_table(float *cs, const struct rope_params *rp, const float *inv, int pos)
{
    int half = rp->n_rot / 2;
    for (int j = 0; j < half; j++) {
        double a = (double)pos * (double)inv[j];
        cs[j] = (float)(cos(a) * rp->mscale);
        cs[half + j] = (float)(sin(a) * rp->mscale);
    }
}

/* dynamic NTK (transformers _compute_dynamic_ntk_parameters at the sequence's
 * length seq_end): base^(-2j/d) becomes (base * s^(d/(d-2)))^(-2j/d), i.e.
 * inv[j] * s^(-2j/(d-2)). */
static void rope_ntk(float *out, const struct rope_params *rp, int seq_end)
{
    int half = rp->n_rot / 2;
    double f = rp->ntk_factor;
    double s = f * seq_end / rp->long_after - (f - 1.0);
    for (int j = 0; j < half; j++)
        out[j] = (float)((double)rp->inv_freq[j] * pow(s, -2.0 * j / (rp->n_rot - 2)));
}

static void rope_task(void *arg, int ith, int nth)
{
    struct rope_ctx *rc = arg;
    const struct rope_params *rp = rc->rp;
    float *cs = rc->c->scr[ith];
    float *ntk = cs + rp->n_rot;
    int half = rp->n_rot / 2, cur = -1;
    long lo, hi;
    tpool_range((long)rc->n_tok * rc->n_head, ith, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
        int t = (int)(it / rc->n_head), h = (int)(it % rc->n_head);
        if (t != cur) {
            /* longrope: the long factors once the sequence passes the original context
             * in this call, as transformers' dynamic update does */
            int seq_end = rc->rows->seq_end[t];
            const float *inv = rp->inv_long && seq_end > rp->long_after ? rp->inv_long : rp->inv_freq;
            if (rp->ntk_factor > 0.0f && seq_end > rp->long_after) {
                rope_ntk(ntk, rp, seq_end);
                inv = ntk;
            }
            rope_table(cs, rp, inv, rc->rows->pos[t]);
            cur = t;
        }
        float *xh = rc->x + (size_t)t * rc->ld + (size_t)h * rc->head_dim;
        /* frequency j rotates dims (a, a + step): (j, j + half) or (2j, 2j + 1) */
        int pairs = rp->style == ROPE_STYLE_PAIRS, step = pairs ? 1 : half;
        for (int j = 0; j < half; j++) {
            int a = pairs ? 2 * j : j;
            float x1 = xh[a], x2 = xh[a + step];
            float cj = cs[j], sj = cs[half + j];
            xh[a] = x1 * cj - x2 * sj;
            xh[a + step] = x2 * cj + x1 * sj;
        }
    }
}

void cpu_rope(struct backend *be, float *x, int ld, int n_tok, int n_head, int head_dim,
              const struct rope_params *rp, const struct kv_rows *rows)
{
    struct cpu_backend *c = cpu_of(be);
    struct rope_ctx rc = {rp, rows, c, x, (size_t)ld, n_tok, n_head, head_dim};
    if (c->err_rc || rp->n_rot <= 0 || !cpu_scratch_ensure(c, (size_t)rp->n_rot * 3 / 2))
        return;
    if (n_tok == 1)
        rope_task(&rc, 0, 1);
    else
        tpool_run(c->pool, rope_task, &rc);
}

// ---- KV store ----

/* n f32 values stored as dt (F32, or F16 / BF16 rounded to nearest even). */
static void kv_put(void *dst, const float *src, enum dtype dt, size_t n)
{
    if (dt == DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            dtype_store_f32(dt, dst, (int64_t)i, src[i]);
}

void cpu_kv_store(struct backend *be, const struct kv_layer *kv, const float *k, int ldk,
                  const float *v, int ldv, const struct kv_rows *rows, int n_tok)
{
    struct cpu_backend *c = cpu_of(be);
    if (c->err_rc)
        return;
    size_t es = dtype_size(kv->dtype);
    for (int i = 0; i < n_tok; i++) {
        size_t s = (size_t)rows->slot[i];
        kv_put((char *)kv->k + s * kv->k_dim * es, k + (size_t)i * ldk, kv->dtype, (size_t)kv->k_dim);
        if (kv->v != kv->k)  /* a latent layer's one row is its K and V */
            kv_put((char *)kv->v + s * kv->v_dim * es, v + (size_t)i * ldv, kv->dtype,
                   (size_t)kv->v_dim);
    }
}

// ---- attention ----

/* Keys per block: a K or V block of ATTN_JB rows x head_dim f32 (32 KiB at
 * head_dim 128) is gathered into contiguous scratch and stays in L1 while
 * every query row of the item uses it. In the cache the rows of one head sit
 * k_dim floats apart (4 KiB for 8 x 128): rows at a power-of-two stride map to
 * the same L1 sets, so in place they would evict each other, and the
 * hardware prefetchers stop at page (and cache block) boundaries. */
#define ATTN_JB 64
/* Rows ahead of the copy to prefetch (8 rows of 512 B: ~64 lines in flight). */
#define ATTN_PF 8
/* Query tokens per item in prefill: an item's rows are tokens x (query heads
 * of one kv head), so GQA heads and neighbouring tokens share each K/V block.
 * As many tokens as fill ATTN_ROWS rows (16 x 4 heads for llama's GQA, 64 of
 * phi-2's one head per kv head), so each gathered block serves that many rows,
 * while their scores (a row of floats per key) fit ATTN_SCORES floats; at
 * least ATTN_TT tokens. */
#define ATTN_TT 4
/* Most query rows per item (tokens x heads per kv head). */
#define ATTN_ROWS 64
/* Most scores per item: 2 MiB of floats. */
#define ATTN_SCORES (1 << 19)
/* Keys per decode item: a row's keys split at multiples of ATTN_DC, each
 * chunk on one thread, the chunks merged in order. */
#define ATTN_DC 128
/* Rows of an f16 / bf16 cache block widened at a time in decode, every head at once:
 * widening one kv head's rows at a time, or fewer rows to stay in L1, made a call per
 * 64-80 values and was slower (ADR 0055, "Measurements moved out of the kernels"). */
#define ATTN_SEG 16

struct attn_ctx {
    struct cpu_backend *c;
    const struct attn_params *ap;
    const struct kv_layer *kv;
    const struct kv_rows *rows;
    float *out;
    const float *q;
    size_t ldo, ldq;
    const int32_t *tiles;     /* [n_tiles][2] first and end row of each tile (one sequence) */
    int n_tiles;
    const int32_t *dec;       /* [n_dec][3] decode items: row, first key, end key */
    int n_dec;
    float *part;              /* [n_dec][n_head][head_dim + 2] their partial outputs */
    int hc;                   /* query heads per item (n_rep, capped at ATTN_ROWS) */
    size_t ld_s;              /* scores row stride in scratch (max keys, padded) */
    int tt;                   /* most tokens per prefill item */
    float *pk, *pv;           /* [n_kv_head][pk_n][head_dim] keys and values [pk_lo, pk_lo + pk_n)
                               * of the prefill rows' one sequence, widened (attn_pack), or NULL */
    int pk_lo, pk_n;
};

/* Query rows i = ti * nh + r of one item: token t0 + ti, head g * n_rep + h0 + r. */
struct attn_rows {
    const float *q[ATTN_ROWS];
    float *o[ATTN_ROWS];
    int lo[ATTN_ROWS], hi[ATTN_ROWS];  /* key positions [lo, hi) the row attends */
    float sum[ATTN_ROWS];              /* softmax denominators */
    const float *sink[ATTN_ROWS];      /* the row's sink logit, or NULL */
    int n_rows, k_lo, k_hi;            /* union of the rows' key ranges */
    int nh;                            /* rows per token (its heads: q, o rows hd apart) */
};

/* Address of position j's row of kv head g in one cache array (k or v) of
 * dim elements of es bytes per slot. */
static const char *kv_row(const void *base, int dim, size_t es, const int32_t *table, int bs, int j,
                          int g, int hd)
{
    size_t slot = (size_t)table[j / bs] * (size_t)bs + (size_t)(j % bs);
    return (const char *)base + (slot * (size_t)dim + (size_t)g * hd) * es;
}

/* Gather positions [j0, j0 + nb) of kv head g into dst [nb][hd] (widened to
 * f32), prefetching ATTN_PF rows ahead (up to position j_end). */
static void attn_gather(const struct cpu_kernels *k, float *dst, const void *base, int dim,
                        enum dtype dt, const int32_t *table, int bs, int g, int hd, int j0, int nb,
                        int j_end)
{
    size_t es = dtype_size(dt);
    for (int r = 0; r < nb; r++) {
        if (j0 + r + ATTN_PF < j_end) {
            const char *p = kv_row(base, dim, es, table, bs, j0 + r + ATTN_PF, g, hd);
            for (size_t b = 0; b < (size_t)hd * es; b += 64)
                __builtin_prefetch(p + b, 0, 3);
        }
        const char *src = kv_row(base, dim, es, table, bs, j0 + r, g, hd);
        if (dt == DTYPE_F32)
            memcpy(dst + (size_t)r * hd, src, (size_t)hd * sizeof(float));
        else
            k->to_f32(dst + (size_t)r * hd, src, dt, (size_t)hd);
    }
}

/* The first key a query at position p attends: past the window (p - window, p] and the
 * chunk [p - p % chunk, p] where they are set (backend.h, struct attn_params). */
static int attn_lo(const struct attn_params *ap, int p)
{
    int lo = ap->window > 0 && p + 1 > ap->window ? p + 1 - ap->window : 0;
    int c0 = ap->chunk > 0 ? p - p % ap->chunk : 0;
    return c0 > lo ? c0 : lo;
}

/* Keys [lo, hi) of query row t: its causal range (window, chunk), widened to its
 * bidirectional block where the rows have one (kv_rows.span). */
static void attn_key_range(const struct attn_ctx *ac, int t, int *lo, int *hi)
{
    int p = ac->rows->pos[t];
    *hi = p + 1;
    *lo = attn_lo(ac->ap, p);
    if (ac->rows->span) {
        const int32_t *sp = ac->rows->span + 2 * (size_t)t;
        *lo = sp[0] < *lo ? sp[0] : *lo;
        *hi = sp[1] + 1 > *hi ? sp[1] + 1 : *hi;
    }
}

static void attn_setup_rows(const struct attn_ctx *ac, struct attn_rows *ar, int g, int h0, int nh,
                            int t0, int tt)
{
    const struct attn_params *ap = ac->ap;
    int hd = ap->head_dim, n_rep = ap->n_head / ap->n_kv_head;
    ar->n_rows = tt * nh;
    ar->nh = nh;
    ar->k_lo = 1 << 30;
    ar->k_hi = 0;
    for (int i = 0; i < ar->n_rows; i++) {
        int t = t0 + i / nh, h = g * n_rep + h0 + i % nh;
        ar->q[i] = ac->q + (size_t)t * ac->ldq + (size_t)h * hd;
        ar->o[i] = ac->out + (size_t)t * ac->ldo + (size_t)h * hd;
        attn_key_range(ac, t, &ar->lo[i], &ar->hi[i]);
        ar->sink[i] = ap->sinks ? &ap->sinks[h] : NULL;
        ar->k_lo = ar->lo[i] < ar->k_lo ? ar->lo[i] : ar->k_lo;
        ar->k_hi = ar->hi[i] > ar->k_hi ? ar->hi[i] : ar->k_hi;
    }
}

/* Softmax of one row's scores s [n] in place (softcap, max, optional sink); returns the sum. */
static float attn_softmax(const struct cpu_kernels *k, const struct attn_params *ap, float *s,
                          int n, const float *sink)
{
    if (ap->softcap > 0.0f)
        for (int j = 0; j < n; j++)
            s[j] = ap->softcap * tanhf(s[j] / ap->softcap);
    float m = k->max(s, n);
    if (sink && *sink > m)
        m = *sink;
    float sum = k->exp_sum(s, s, m, n);
    if (sink)
        sum += expf(*sink - m);
    return sum;
}

/* attn_scores of nq query heads that read the same keys (head i's q at q + i hd, scores at
 * s + i lds): the variant's kernel for many heads, else one call per head (the same bits). */
static void attn_scores_heads(const struct cpu_kernels *k, float *s, size_t lds, const float *q,
                              int nq, const float *rk, size_t ld, int n, int hd, float scale)
{
    if (k->attn_scores_heads) {
        k->attn_scores_heads(s, lds, q, nq, rk, ld, n, hd, scale);
        return;
    }
    for (int i = 0; i < nq; i++)
        k->attn_scores(s + (size_t)i * lds, q + (size_t)i * (size_t)hd, rk, ld, n, hd, scale);
}

/* attn_accum of nq query heads over the same rows of V (head i's output at o + i ldo, its
 * probabilities at p + i ldp), as attn_scores_heads. */
static void attn_accum_heads(const struct cpu_kernels *k, float *o, size_t ldo, const float *p,
                             size_t ldp, int nq, const float *rv, size_t ld, int n, int hd,
                             bool acc)
{
    if (k->attn_accum_heads) {
        k->attn_accum_heads(o, ldo, p, ldp, nq, rv, ld, n, hd, acc);
        return;
    }
    for (int i = 0; i < nq; i++)
        k->attn_accum(o + (size_t)i * ldo, p + (size_t)i * ldp, rv, ld, n, hd, acc);
}

/* The keys [j0, c) of a gathered block that every row of the item attends, c - j0 a
 * multiple of 4: one call of the many-row kernels takes them for all rows (attn_pass).
 * j0 (none) when the rows' windows start at different keys or past j0. */
static int attn_common(const struct attn_rows *ar, int j0, int nb)
{
    int c = j0 + nb;
    for (int i = 0; i < ar->n_rows; i += ar->nh) {
        if (ar->lo[i] != ar->lo[0] || ar->lo[i] > j0)
            return j0;
        c = ar->hi[i] < c ? ar->hi[i] : c;
    }
    return c > j0 ? j0 + ((c - j0) & ~3) : j0;
}

/* One pass over the item's keys in blocks of ATTN_JB gathered from the cache
 * array base (K or V): pass 1 writes every row's scores, pass 2 accumulates
 * the probability-weighted V rows into the outputs. The keys every row attends
 * go to the many-row kernels at once (scores: all rows, from the item's query
 * rows packed in qb; values: all rows when they are one head's, MHA, whose
 * outputs lie one token apart), the rest row by row. Per row and key the
 * products and sums are those of a call over its own range [a, z) alone: the
 * many-row kernels give the one-row bits, the common part ends on a multiple of
 * 4 keys from j0, as a one-row call's groups of 4 do, and the values are summed
 * over the keys in order either way. */
static void attn_pass(const struct attn_ctx *ac, const struct attn_rows *ar, float *scr, float *gath,
                      const float *qb, const int32_t *table, int g, bool values)
{
    const struct cpu_kernels *k = &ac->c->k;
    const struct attn_params *ap = ac->ap;
    int hd = ap->head_dim, bs = ac->rows->block_size;
    const void *base = values ? ac->kv->v : ac->kv->k;
    int dim = values ? ac->kv->v_dim : ac->kv->k_dim;
    const float *packed = values ? ac->pv : ac->pk;
    for (int j0 = ar->k_lo; j0 < ar->k_hi; j0 += ATTN_JB) {
        int nb = ar->k_hi - j0 < ATTN_JB ? ar->k_hi - j0 : ATTN_JB;
        const float *blk = gath;
        if (packed)
            blk = packed + ((size_t)g * (size_t)ac->pk_n + (size_t)(j0 - ac->pk_lo)) * (size_t)hd;
        else
            attn_gather(k, gath, base, dim, ac->kv->dtype, table, bs, g, hd, j0, nb, ar->k_hi);
        int c = ar->n_rows > ar->nh ? attn_common(ar, j0, nb) : j0;
        if (c > j0 && !values)
            attn_scores_heads(k, scr + (j0 - ar->k_lo), ac->ld_s, qb, ar->n_rows, blk, (size_t)hd,
                              c - j0, hd, ap->scale);
        else if (c > j0 && ar->nh == 1)
            attn_accum_heads(k, ar->o[0], ac->ldo, scr + (j0 - ar->k_lo), ac->ld_s, ar->n_rows,
                             blk, (size_t)hd, c - j0, hd, j0 > ar->lo[0]);
        else
            c = j0;
        for (int i = 0; i < ar->n_rows; i += ar->nh) { /* a token's heads: one key range */
            int a = ar->lo[i] > c ? ar->lo[i] : c, z = ar->hi[i] < j0 + nb ? ar->hi[i] : j0 + nb;
            float *s = scr + i * ac->ld_s + (a - ar->k_lo);
            const float *rows = blk + (size_t)(a - j0) * hd;
            if (a >= z)
                continue;
            if (values)
                attn_accum_heads(k, ar->o[i], (size_t)hd, s, ac->ld_s, ar->nh, rows, (size_t)hd,
                                 z - a, hd, a > ar->lo[i]);
            else
                attn_scores_heads(k, s, ac->ld_s, ar->q[i], ar->nh, rows, (size_t)hd, z - a, hd,
                                  ap->scale);
        }
    }
}

/* Causal attention for kv head g, its query heads [h0, h0 + hc) and tokens
 * [t0, t0 + tt) of one sequence: two passes over the keys (attn_pass), so
 * every K and V row is read from memory once per item, with a stable softmax
 * per row (max subtracted, f32) between them. Scores of key position j sit
 * at column j - k_lo. */
static void attn_item(const struct attn_ctx *ac, float *scr, int g, int h0, int t0, int tt)
{
    const struct cpu_kernels *k = &ac->c->k;
    const struct attn_params *ap = ac->ap;
    int hd = ap->head_dim, n_rep = ap->n_head / ap->n_kv_head;
    int nh = n_rep - h0 < ac->hc ? n_rep - h0 : ac->hc;
    const int32_t *table = ac->rows->tables + ac->rows->table[t0];
    float *blk = scr + (size_t)(ac->tt * ac->hc) * ac->ld_s, *qb = blk + (size_t)ATTN_JB * hd;
    struct attn_rows ar;
    attn_setup_rows(ac, &ar, g, h0, nh, t0, tt);
    if (ar.n_rows > ar.nh) /* attn_pass's many-row scores read the query rows side by side */
        for (int i = 0; i < ar.n_rows; i++)
            memcpy(qb + (size_t)i * hd, ar.q[i], (size_t)hd * sizeof *qb);
    attn_pass(ac, &ar, scr, blk, qb, table, g, false);
    for (int i = 0; i < ar.n_rows; i++)
        ar.sum[i] = attn_softmax(k, ap, scr + i * ac->ld_s + (ar.lo[i] - ar.k_lo),
                                 ar.hi[i] - ar.lo[i], ar.sink[i]);
    attn_pass(ac, &ar, scr, blk, qb, table, g, true);
    for (int i = 0; i < ar.n_rows; i++)
        k->scale(ar.o[i], 1.0f / ar.sum[i], (size_t)hd);
}

/* One decode item: every head of query row t over keys [a, z) (inside one
 * ATTN_DC chunk). The cache's blocks are read in place: a block's positions
 * are consecutive slots, so the rows of kv head g sit dim elements apart, and
 * the block's rows of all heads span one contiguous block_size x dim range
 * (an f16 / bf16 cache widens up to ATTN_SEG rows of it at a time into
 * scratch at wide). part receives per head its unnormalized output [hd],
 * max and sum. */
static void attn_dec_item(const struct attn_ctx *ac, float *s, float *wide, float *part, int t,
                          int a, int z)
{
    const struct cpu_kernels *k = &ac->c->k;
    const struct attn_params *ap = ac->ap;
    const struct kv_rows *rows = ac->rows;
    int hd = ap->head_dim, nh = ap->n_head, n_rep = nh / ap->n_kv_head, bs = rows->block_size;
    int n = z - a;
    enum dtype dt = ac->kv->dtype;
    size_t es = dtype_size(dt);
    const int32_t *table = rows->tables + rows->table[t];
    for (int pass = 0; pass < 2; pass++) {
        const char *base = pass ? ac->kv->v : ac->kv->k;
        size_t dim = (size_t)(pass ? ac->kv->v_dim : ac->kv->k_dim);
        for (int j0 = a; j0 < z;) {
            int j1 = (j0 / bs + 1) * bs < z ? (j0 / bs + 1) * bs : z;
            if (dt != DTYPE_F32 && j1 - j0 > ATTN_SEG)
                j1 = j0 + ATTN_SEG;
            const char *src = base + ((size_t)table[j0 / bs] * bs + (size_t)(j0 % bs)) * dim * es;
            const float *blk = (const float *)src;
            if (j1 < z && j1 % bs == 0) {  /* the next block, every head */
                const char *nx = base + (size_t)table[j1 / bs] * bs * dim * es;
                for (size_t o = 0; o < (size_t)bs * dim * es; o += 64)
                    __builtin_prefetch(nx + o, 0, 3);
            }
            if (dt != DTYPE_F32) {
                k->to_f32(wide, src, dt, (size_t)(j1 - j0) * dim);
                blk = wide;
            }
            for (int h = 0; h < nh; h += n_rep) { /* the query heads of each kv head */
                const float *rk = blk + (size_t)(h / n_rep) * hd;
                float *sh = s + (size_t)h * ATTN_DC + (j0 - a);
                if (pass)
                    attn_accum_heads(k, part + (size_t)h * (hd + 2), (size_t)hd + 2, sh, ATTN_DC,
                                     n_rep, rk, dim, j1 - j0, hd, j0 > a);
                else
                    attn_scores_heads(k, sh, ATTN_DC, ac->q + (size_t)t * ac->ldq + (size_t)h * hd,
                                      n_rep, rk, dim, j1 - j0, hd, ap->scale);
            }
            j0 = j1;
        }
        if (pass)
            break;
        for (int h = 0; h < nh; h++) {
            float *sh = s + (size_t)h * ATTN_DC, *ph = part + (size_t)h * (hd + 2);
            if (ap->softcap > 0.0f)
                for (int j = 0; j < n; j++)
                    sh[j] = ap->softcap * tanhf(sh[j] / ap->softcap);
            ph[hd] = k->max(sh, n);
            ph[hd + 1] = k->exp_sum(sh, sh, ph[hd], n);
        }
    }
}

static void attn_task(void *arg, int ith, int nth)
{
    struct attn_ctx *ac = arg;
    int n_rep = ac->ap->n_head / ac->ap->n_kv_head, n_hc = (n_rep + ac->hc - 1) / ac->hc;
    long per_tile = (long)ac->ap->n_kv_head * n_hc;
    long n_items = (long)ac->n_tiles * per_tile + ac->n_dec;
    size_t part_sz = (size_t)ac->ap->n_head * (ac->ap->head_dim + 2);
    /* round-robin: later tiles attend more keys, interleaving balances them */
    for (long it = ith; it < n_items; it += nth) {
        if (it >= (long)ac->n_tiles * per_tile) {
            long d = it - (long)ac->n_tiles * per_tile;
            const int32_t *di = ac->dec + 3 * d;
            float *s = ac->c->scr[ith];
            attn_dec_item(ac, s, s + (size_t)ac->ap->n_head * ATTN_DC, ac->part + (size_t)d * part_sz,
                          di[0], di[1], di[2]);
            continue;
        }
        int ti = (int)(it / per_tile);
        int g = (int)(it % per_tile / n_hc), h0 = (int)(it % n_hc) * ac->hc;
        int t0 = ac->tiles[2 * ti];
        attn_item(ac, ac->c->scr[ith], g, h0, t0, ac->tiles[2 * ti + 1] - t0);
    }
}

/* Outputs of the decode rows from their items' partials, chunk order fixed:
 * with m = the largest chunk max (and sink), o = sum_c e^(m_c - m) o_c / l,
 * l = sum_c e^(m_c - m) l_c (+ e^(sink - m)). */
static void attn_dec_merge(const struct attn_ctx *ac)
{
    const struct cpu_kernels *k = &ac->c->k;
    const struct attn_params *ap = ac->ap;
    int hd = ap->head_dim, nh = ap->n_head;
    size_t part_sz = (size_t)nh * (hd + 2);
    for (int d0 = 0; d0 < ac->n_dec;) {
        int t = ac->dec[3 * d0], d1 = d0 + 1;
        while (d1 < ac->n_dec && ac->dec[3 * d1] == t)
            d1++;
        for (int h = 0; h < nh; h++) {
            float *o = ac->out + (size_t)t * ac->ldo + (size_t)h * hd;
            float m = ap->sinks ? ap->sinks[h] : -INFINITY, l = 0.0f;
            for (int d = d0; d < d1; d++) {
                const float *ph = ac->part + (size_t)d * part_sz + (size_t)h * (hd + 2);
                m = ph[hd] > m ? ph[hd] : m;
            }
            for (int d = d0; d < d1; d++) {
                const float *ph = ac->part + (size_t)d * part_sz + (size_t)h * (hd + 2);
                l += expf(ph[hd] - m) * ph[hd + 1];
            }
            if (ap->sinks)
                l += expf(ap->sinks[h] - m);
            for (int d = d0; d < d1; d++) {
                const float *ph = ac->part + (size_t)d * part_sz + (size_t)h * (hd + 2);
                float w = expf(ph[hd] - m) / l;
                if (d == d0) {
                    memcpy(o, ph, (size_t)hd * sizeof(float));
                    k->scale(o, w, (size_t)hd);
                } else {
                    k->axpy(o, w, ph, (size_t)hd);
                }
            }
        }
        d0 = d1;
    }
}

/* Most floats of the widened keys and values attn_pack keeps (64 MiB). */
#define ATTN_PACK_MAX ((size_t)1 << 24)
/* Fewest prefill items per kv head for attn_pack: with fewer, each item's own gathers copy
 * about as much as the pack does once. */
#define ATTN_PACK_ITEMS 4

/* Keys and values [pk_lo, pk_lo + pk_n) of every kv head, widened into pk / pv in blocks of
 * ATTN_JB positions, the blocks dealt round-robin to the threads. */
static void attn_pack_task(void *arg, int ith, int nth)
{
    const struct attn_ctx *ac = arg;
    const struct kv_layer *kv = ac->kv;
    int hd = ac->ap->head_dim, bs = ac->rows->block_size, nkv = ac->ap->n_kv_head;
    int nblk = (ac->pk_n + ATTN_JB - 1) / ATTN_JB, arrays = ac->pv == ac->pk ? 1 : 2;
    const int32_t *table = ac->rows->tables + ac->rows->table[ac->tiles[0]];
    for (long it = ith; it < (long)arrays * nkv * nblk; it += nth) {
        int a = (int)(it / ((long)nkv * nblk)), g = (int)(it / nblk % nkv), b = (int)(it % nblk);
        int j0 = ac->pk_lo + b * ATTN_JB, end = ac->pk_lo + ac->pk_n;
        int nb = end - j0 < ATTN_JB ? end - j0 : ATTN_JB;
        float *dst = (a ? ac->pv : ac->pk) + ((size_t)g * ac->pk_n + (size_t)b * ATTN_JB) * hd;
        attn_gather(&ac->c->k, dst, a ? kv->v : kv->k, a ? kv->v_dim : kv->k_dim, kv->dtype, table,
                    bs, g, hd, j0, nb, end);
    }
}

/* When every prefill tile is of one sequence and each kv head has ATTN_PACK_ITEMS items or
 * more, the keys and values the tiles attend are widened once, head by head (attn_pack),
 * instead of every item gathering its blocks again: an image's 4096 patches in one
 * bidirectional span are read by 64 items a head. The items then read the same floats, so
 * the same bits. attn_pack_plan sets the range [pk_lo, pk_lo + pk_n) (the union of the tiles'
 * key ranges) and returns the floats the pack takes, 0 for none. */
static size_t attn_pack_plan(struct attn_ctx *ac)
{
    const struct attn_params *ap = ac->ap;
    int n_hc = (ap->n_head / ap->n_kv_head + ac->hc - 1) / ac->hc, lo = 1 << 30, hi = 0;
    if (ac->n_tiles == 0 || (long)ac->n_tiles * n_hc < ATTN_PACK_ITEMS)
        return 0;
    for (int ti = 0; ti < ac->n_tiles; ti++) {
        if (ac->rows->table[ac->tiles[2 * ti]] != ac->rows->table[ac->tiles[0]])
            return 0;
        for (int t = ac->tiles[2 * ti]; t < ac->tiles[2 * ti + 1]; t++) {
            int a, z;
            attn_key_range(ac, t, &a, &z);
            lo = a < lo ? a : lo;
            hi = z > hi ? z : hi;
        }
    }
    /* hi > lo: a tile has rows, and a row attends at least itself */
    size_t one = (size_t)(hi - lo) * (size_t)ap->n_kv_head * (size_t)ap->head_dim;
    size_t n = ac->kv->v == ac->kv->k ? one : 2 * one;
    if (n > ATTN_PACK_MAX)
        return 0;
    ac->pk_lo = lo;
    ac->pk_n = hi - lo;
    return n;
}

/* The pack attn_pack_plan planned, into buf. */
static void attn_pack(struct attn_ctx *ac, float *buf)
{
    ac->pk = buf;
    ac->pv = ac->kv->v == ac->kv->k
                 ? buf
                 : buf + (size_t)ac->pk_n * (size_t)ac->ap->n_kv_head * (size_t)ac->ap->head_dim;
    tpool_run(ac->c->pool, attn_pack_task, ac);
}

/* Whether row i continues row i - 1's tile: the same sequence, the next position. */
static bool attn_cont(const struct kv_rows *rows, int i)
{
    return i > 0 && rows->table[i] == rows->table[i - 1] && rows->pos[i] == rows->pos[i - 1] + 1;
}

/* Split the rows into tiles of at most tt consecutive rows of one sequence at
 * consecutive positions, leaving out the rows alone in theirs (decode rows:
 * attn_dec_items); tile k is rows [tiles[2k], tiles[2k + 1]). A tile ends where its
 * sequence's run does, not where the next tile starts: rows left out may follow it. */
static int attn_tiles(int32_t *tiles, const struct kv_rows *rows, int n_tok, int tt)
{
    int n = 0;
    for (int i = 0; i < n_tok; i++) {
        if (!attn_cont(rows, i) && !(i + 1 < n_tok && attn_cont(rows, i + 1)))
            continue;
        bool cont = n > 0 && tiles[2 * n - 1] == i && i - tiles[2 * n - 2] < tt && attn_cont(rows, i);
        if (!cont) {
            tiles[2 * n] = i;
            n++;
        }
        tiles[2 * n - 1] = i + 1;
    }
    return n;
}

/* The decode items of the rows alone in their tile: one per ATTN_DC-aligned
 * chunk of each row's keys (so a row's result depends on its own keys only,
 * never on the batch around it). Returns the count; dec may be NULL. */
static int attn_dec_items(int32_t *dec, const struct attn_ctx *ac, int n_tok)
{
    int n = 0;
    for (int i = 0; i < n_tok; i++) {
        if (attn_cont(ac->rows, i) || (i + 1 < n_tok && attn_cont(ac->rows, i + 1)))
            continue;
        int lo, hi;
        attn_key_range(ac, i, &lo, &hi);
        for (int a = lo; a < hi; a = (a / ATTN_DC + 1) * ATTN_DC, n++)
            if (dec) {
                dec[3 * n] = i;
                dec[3 * n + 1] = a;
                dec[3 * n + 2] = (a / ATTN_DC + 1) * ATTN_DC < hi ? (a / ATTN_DC + 1) * ATTN_DC : hi;
            }
    }
    return n;
}

void cpu_attention(struct backend *be, float *out, int ldo, const float *q, int ldq,
                   const struct kv_layer *kv, const struct kv_rows *rows, int n_tok,
                   const struct attn_params *ap)
{
    struct cpu_backend *c = cpu_of(be);
    int n_rep = ap->n_head / ap->n_kv_head, max_keys = 0;
    assert(n_rep >= 1 && ap->n_head % ap->n_kv_head == 0);
    if (c->err_rc || n_tok <= 0)
        return;
    struct attn_ctx ac = {.c = c, .ap = ap, .kv = kv, .rows = rows, .out = out, .q = q,
                          .ldo = (size_t)ldo, .ldq = (size_t)ldq};
    ac.hc = n_rep < ATTN_ROWS ? n_rep : ATTN_ROWS;
    for (int i = 0; i < n_tok; i++) {
        int lo, hi;
        attn_key_range(&ac, i, &lo, &hi);
        max_keys = hi > max_keys ? hi : max_keys;
    }
    /* padded to a cache line so score rows do not share lines */
    ac.ld_s = ((size_t)max_keys + 15) & ~(size_t)15;
    /* tokens per prefill item: as many as ATTN_ROWS rows and ATTN_SCORES scores hold, at
     * least ATTN_TT (rows permitting) */
    const size_t fit = ATTN_SCORES / (ac.ld_s * (size_t)ac.hc),
                 want = fit > ATTN_TT ? fit : ATTN_TT;
    const int most = ATTN_ROWS / ac.hc;
    ac.tt = want < (size_t)most ? (int)want : most;
    ac.n_dec = attn_dec_items(NULL, &ac, n_tok);
    int32_t *tiles = cpu_iscratch_ensure(c, 2 * (size_t)n_tok + 3 * (size_t)ac.n_dec);
    size_t scr = (ac.ld_s + (size_t)ap->head_dim) * (size_t)(ac.tt * ac.hc) +
                 (size_t)ATTN_JB * ap->head_dim;
    size_t scr_dec = (size_t)ap->n_head * ATTN_DC +
                     (kv->dtype == DTYPE_F32 ? 0
                                             : (size_t)ATTN_SEG * (kv->k_dim > kv->v_dim ? kv->k_dim
                                                                                         : kv->v_dim));
    if (!tiles || !cpu_scratch_ensure(c, scr > scr_dec ? scr : scr_dec))
        return;
    ac.n_tiles = attn_tiles(tiles, rows, n_tok, ac.tt);
    ac.tiles = tiles;
    size_t n_pack = attn_pack_plan(&ac), n_part = (size_t)ac.n_dec * ap->n_head * (ap->head_dim + 2);
    if (n_pack || n_part) { /* shared scratch: the packed keys and values, then the partials */
        float *sh = cpu_shared_ensure(c, n_pack + n_part);
        if (!sh)
            return;
        ac.part = sh + n_pack;
        if (n_pack)
            attn_pack(&ac, sh);
    }
    if (ac.n_dec) {
        int32_t *d = tiles + 2 * (size_t)n_tok;
        attn_dec_items(d, &ac, n_tok);
        ac.dec = d;
    }
    tpool_run(c->pool, attn_task, &ac);
    if (ac.n_dec)
        attn_dec_merge(&ac);
}
