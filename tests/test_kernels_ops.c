/*
 * kernel_ops: the backend ops around the matrix products, each on every ISA
 * this CPU runs (x threads {1, 3}) against a double-precision reference:
 *   attention   paged (a block table that is not the identity), causal, GQA,
 *               sliding window, softcap and sinks vs brute-force masked attention
 *   elementwise activations, GLU with gate | up halves of one row, gpt-oss's clamped GLU
 *               (halves and interleaved pairs), axpy
 *   moe         routing rules (top-k ties to the lower index, softmax over the
 *               chosen logits, sparsemixer), grouping by expert, the grouped
 *               expert linears (fused and per-expert dispatch) and the combine
 * The shared fixtures are in kern_check.c; the products in test_kernels.c.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "kern_check.h"
#include "kernels/cpu/kern.h"

// ---- attention ----

/* Brute-force causal attention over positions [0, pos0 + n_tok) in dense k/v [n_ctx][n_kv*hd]
 * with every mask and option applied the textbook way: scores, softcap, -inf outside the
 * window, softmax with an optional sink logit per head. */
static void attn_ref_span(double *out, const float *q, const float *k, const float *v, int n_tok,
                          int pos0, int n_head, int n_kv, int hd, const struct attn_params *ap,
                          const int32_t *span)
{
    size_t qs = (size_t)n_head * hd, kvs = (size_t)n_kv * hd;
    double *s = malloc((size_t)(pos0 + n_tok) * sizeof *s);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            int g = h / (n_head / n_kv), p = pos0 + t, n_ctx = span && span[2 * t + 1] > p ? span[2 * t + 1] + 1 : p + 1;
            double m = ap->sinks ? ap->sinks[h] : -INFINITY, sum = 0;
            for (int j = 0; j < n_ctx; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)q[t * qs + h * hd + i] * k[j * kvs + g * hd + i];
                d *= ap->scale;
                if (ap->softcap > 0)
                    d = ap->softcap * tanh(d / ap->softcap);
                bool in_span = span && j >= span[2 * t] && j <= span[2 * t + 1];
                if (ap->window > 0 && p - j >= ap->window && !in_span)
                    d = -INFINITY;
                if (ap->chunk > 0 && j / ap->chunk != p / ap->chunk && !in_span)
                    d = -INFINITY;
                if (j > p && !in_span)
                    d = -INFINITY;
                s[j] = d;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < n_ctx; j++)
                sum += (s[j] = exp(s[j] - m));
            if (ap->sinks)
                sum += exp(ap->sinks[h] - m);
            for (int i = 0; i < hd; i++) {
                double acc = 0;
                for (int j = 0; j < n_ctx; j++)
                    acc += s[j] * v[j * kvs + g * hd + i];
                out[t * qs + h * hd + i] = acc / sum;
            }
        }
    free(s);
}

static void attn_ref(double *out, const float *q, const float *k, const float *v, int n_tok,
                     int pos0, int n_head, int n_kv, int hd, const struct attn_params *ap)
{
    attn_ref_span(out, q, k, v, n_tok, pos0, n_head, n_kv, hd, ap, NULL);
}

/* KV element types the attention tests store the cache in. */
static const enum dtype k_kv_types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};

/* n values of src written as dt at dst (the cache's rounding: nearest even). */
static void kv_put(void *dst, const float *src, size_t n, enum dtype dt)
{
    for (size_t i = 0; i < n; i++)
        dtype_store_f32(dt, dst, (int64_t)i, src[i]);
}

/* x rounded to dt and back: the values a dt cache holds (the reference computes on them). */
static void kv_round(float *x, size_t n, enum dtype dt)
{
    for (size_t i = 0; i < n && dt != DTYPE_F32; i++)
        x[i] = dt == DTYPE_F16 ? f16_to_f32(f32_to_f16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
}

/* Dense k/v scattered into a paged pool of 4-slot blocks in reverse block order
 * (a table that is not the identity), the n_tok query rows at positions
 * pos0.. of one sequence; the pool's elements are dt. */
struct paged {
    struct kv_layer kv;
    int32_t *pos, *slot, *table, *tables, *end;
    struct kv_rows rows;
};

static void paged_open(struct paged *pg, const float *k, const float *v, int n_ctx, int kvd,
                       int pos0, int n_tok, enum dtype dt)
{
    int bs = 4, nb = (n_ctx + bs - 1) / bs;
    size_t es = dtype_size(dt);
    pg->kv = (struct kv_layer){calloc((size_t)nb * bs * kvd, es), calloc((size_t)nb * bs * kvd, es),
                               kvd, kvd, dt};
    pg->tables = malloc((size_t)nb * sizeof *pg->tables);
    for (int b = 0; b < nb; b++)
        pg->tables[b] = nb - 1 - b;
    for (int j = 0; j < n_ctx; j++) {
        size_t sl = (size_t)pg->tables[j / bs] * bs + j % bs;
        kv_put((char *)pg->kv.k + sl * kvd * es, k + (size_t)j * kvd, (size_t)kvd, dt);
        kv_put((char *)pg->kv.v + sl * kvd * es, v + (size_t)j * kvd, (size_t)kvd, dt);
    }
    pg->pos = malloc((size_t)n_tok * sizeof(int32_t));
    pg->slot = malloc((size_t)n_tok * sizeof(int32_t));
    pg->table = calloc((size_t)n_tok, sizeof(int32_t));
    pg->end = malloc((size_t)n_tok * sizeof(int32_t));
    for (int t = 0; t < n_tok; t++) {
        pg->pos[t] = pos0 + t;
        pg->slot[t] = pg->tables[(pos0 + t) / bs] * bs + (pos0 + t) % bs;
        pg->end[t] = n_ctx;
    }
    pg->rows = (struct kv_rows){pg->pos, pg->slot, pg->table, pg->tables, pg->end, bs, NULL, NULL};
}

static void paged_close(struct paged *pg)
{
    free(pg->kv.k);
    free(pg->kv.v);
    free(pg->pos);
    free(pg->slot);
    free(pg->table);
    free(pg->tables);
    free(pg->end);
}

static void attn_case_chunk(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int pos0, int n_head,
                            int n_kv, int hd, float amp, int window, float softcap, bool sinks,
                            int chunk)
{
    int n_ctx = pos0 + n_tok;
    size_t nq = (size_t)n_tok * n_head * hd, nkv = (size_t)n_ctx * n_kv * hd;
    float *q = kc_fvec(nq, -amp, amp), *k = kc_fvec(nkv, -amp, amp), *v = kc_fvec(nkv, -1, 1);
    float *sk = sinks ? kc_fvec((size_t)n_head, -2, 2) : NULL;
    float *out = malloc(nq * sizeof *out);
    double *ref = malloc(nq * sizeof *ref);
    struct attn_params ap = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd), softcap, window, sk, chunk};
    for (size_t ti = 0; ti < sizeof k_kv_types / sizeof k_kv_types[0]; ti++) {
        enum dtype dt = k_kv_types[ti];
        struct paged pg;
        kv_round(k, nkv, dt);  /* k and v as a dt cache holds them, for the reference too */
        kv_round(v, nkv, dt);
        attn_ref(ref, q, k, v, n_tok, pos0, n_head, n_kv, hd, &ap);
        paged_open(&pg, k, v, n_ctx, n_kv * hd, pos0, n_tok, dt);
        for (int i = 0; i < bs->n; i++) {
            memset(out, 0xff, nq * sizeof *out);
            bs->be[i]->ops->attention(bs->be[i], out, n_head * hd, q, n_head * hd, &pg.kv,
                                      &pg.rows, n_tok, &ap);
            kc_check(es, "attention", bs->be[i], out, ref, nq, 1e-10, 1e-4);
        }
        paged_close(&pg);
    }
    free(q);
    free(k);
    free(v);
    free(sk);
    free(out);
    free(ref);
}

static void attn_case_opts(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int pos0, int n_head,
                           int n_kv, int hd, float amp, int window, float softcap, bool sinks)
{
    attn_case_chunk(bs, es, n_tok, pos0, n_head, n_kv, hd, amp, window, softcap, sinks, 0);
}

static void attn_case(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int pos0, int n_head,
                      int n_kv, int hd, float amp)
{
    attn_case_opts(bs, es, n_tok, pos0, n_head, n_kv, hd, amp, 0, 0.0f, false);
}

/* Bidirectional blocks (kv_rows.span, ADR 0087): rows [b0, b1) of a prefill chunk at
 * positions pos0.. form one block (an image's tokens), the others plain causal rows; with a
 * window shorter than the block (Gemma 3's sliding layers: the block reaches back past it)
 * and without. whole: every row's block is the whole chunk (a vision tower, pos0 0). */
static void attn_case_span(struct kc_bes *bs, struct kc_errstat *es, int n_tok, int pos0, int b0, int b1,
                           int n_head, int n_kv, int hd, int window, bool whole)
{
    int n_ctx = pos0 + n_tok;
    size_t nq = (size_t)n_tok * n_head * hd, nkv = (size_t)n_ctx * n_kv * hd;
    float *q = kc_fvec(nq, -2, 2), *k = kc_fvec(nkv, -2, 2), *v = kc_fvec(nkv, -1, 1);
    float *out = malloc(nq * sizeof *out);
    double *ref = malloc(nq * sizeof *ref);
    int32_t *span = malloc(2 * (size_t)n_tok * sizeof *span);
    for (int t = 0; t < n_tok; t++) {
        bool in = whole || (t >= b0 && t < b1);
        span[2 * t] = whole ? pos0 : in ? pos0 + b0 : pos0 + t;
        span[2 * t + 1] = whole ? pos0 + n_tok - 1 : in ? pos0 + b1 - 1 : pos0 + t;
    }
    struct attn_params ap = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd), 0.0f, window, NULL, 0};
    for (size_t ti = 0; ti < sizeof k_kv_types / sizeof k_kv_types[0]; ti++) {
        enum dtype dt = k_kv_types[ti];
        struct paged pg;
        kv_round(k, nkv, dt);
        kv_round(v, nkv, dt);
        attn_ref_span(ref, q, k, v, n_tok, pos0, n_head, n_kv, hd, &ap, span);
        paged_open(&pg, k, v, n_ctx, n_kv * hd, pos0, n_tok, dt);
        pg.rows.span = span;
        for (int i = 0; i < bs->n; i++) {
            memset(out, 0xff, nq * sizeof *out);
            bs->be[i]->ops->attention(bs->be[i], out, n_head * hd, q, n_head * hd, &pg.kv, &pg.rows,
                                      n_tok, &ap);
            kc_check(es, "attention_span", bs->be[i], out, ref, nq, 1e-10, 1e-4);
        }
        paged_close(&pg);
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(ref);
    free(span);
}

static void test_attention_span(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    attn_case_span(&bs, &es, 30, 0, 6, 22, 4, 2, 16, 0, false);   /* an image of 16 in a prompt */
    attn_case_span(&bs, &es, 30, 0, 6, 22, 4, 2, 16, 8, false);   /* ... sliding window 8 */
    attn_case_span(&bs, &es, 24, 9, 0, 20, 4, 1, 64, 5, false);   /* after cached rows, window 5 */
    attn_case_span(&bs, &es, 20, 3, 19, 20, 2, 2, 8, 0, false);   /* a block of one row */
    attn_case_span(&bs, &es, 64, 0, 0, 0, 2, 2, 16, 0, true);     /* a vision tower's 8 x 8 patches */
    attn_case_span(&bs, &es, 49, 0, 0, 0, 3, 3, 24, 0, true);     /* odd counts */
    kc_report("attention_span", &es);
    kc_close(&bs);
}

static void test_attention(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    attn_case(&bs, &es, 1, 0, 1, 1, 8, 1.0f);
    attn_case(&bs, &es, 1, 17, 4, 2, 64, 1.0f);      /* decode, GQA */
    attn_case(&bs, &es, 7, 0, 4, 4, 64, 1.0f);       /* prefill, MHA */
    attn_case(&bs, &es, 9, 5, 6, 1, 80, 2.0f);       /* chunked prefill, MQA */
    attn_case(&bs, &es, 13, 3, 8, 2, 7, 3.0f);       /* odd head_dim */
    attn_case(&bs, &es, 40, 100, 4, 2, 128, 4.0f);   /* peaked softmax */
    attn_case(&bs, &es, 1, 300, 2, 1, 96, 1.0f);
    attn_case(&bs, &es, 3, 2, 130, 1, 8, 1.0f);      /* more query heads per kv head than a tile */
    attn_case(&bs, &es, 1, 255, 8, 2, 64, 3.0f);     /* decode: two whole key chunks */
    attn_case(&bs, &es, 1, 700, 4, 1, 32, 4.0f);     /* decode: six chunks, the last partial */
    attn_case(&bs, &es, 1, 200, 6, 3, 7, 2.0f);      /* decode, odd head_dim */
    /* decode: query heads per kv head not a multiple of 4, head_dim past 64 and off the
     * 16-lane grid, keys not a multiple of 4 */
    attn_case(&bs, &es, 1, 150, 10, 2, 80, 2.0f);    /* 5 per kv head, head_dim 80 */
    attn_case(&bs, &es, 1, 333, 32, 4, 128, 2.0f);   /* 8 per kv head, head_dim 128 */
    attn_case(&bs, &es, 1, 61, 6, 1, 72, 3.0f);      /* 6 per kv head, head_dim 72 */
    kc_report("attention", &es);
    kc_close(&bs);
}

/* The many-head attention kernels (attn_scores_heads, attn_accum_heads) of every ISA this CPU
 * runs that has them, against one call of its one-head kernel per head: the same bits, on head
 * counts around the kernels' groups of 4 (and 2), key counts around their 4, head_dims
 * on and off the 16-lane grid and past 128, rows strided wider than a head, accumulating or
 * not. */
static void test_attention_heads(void **state)
{
    (void)state;
    static const int nqs[] = {1, 2, 3, 4, 5, 6, 7, 8}, ns[] = {1, 3, 4, 7, 11, 12, 16, 17},
                     hds[] = {7, 16, 64, 72, 80, 96, 112, 128, 144};
    int n_checked = 0;
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best(); isa++) {
        struct cpu_kernels k;
        if (!cpu_kernels_init(&k, (enum cpu_isa)isa) || !k.attn_scores_heads ||
            !k.attn_accum_heads)
            continue;
        for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
            for (size_t b = 0; b < sizeof nqs / sizeof nqs[0]; b++)
                for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
                    const int hd = hds[a], nq = nqs[b], n = ns[c];
                    const size_t ld = (size_t)hd + 5, lds = (size_t)n + 3, ldo = (size_t)hd + 2;
                    float *q = kc_fvec((size_t)nq * hd, -2, 2);
                    float *kv = kc_fvec((size_t)n * ld, -2, 2);
                    float *s1 = kc_fvec((size_t)nq * lds, -1, 1);
                    float *s2 = malloc((size_t)nq * lds * sizeof *s2);
                    float *o1 = kc_fvec((size_t)nq * ldo, -1, 1);
                    float *o2 = malloc((size_t)nq * ldo * sizeof *o2);
                    assert_non_null(s2);
                    assert_non_null(o2);
                    memcpy(s2, s1, (size_t)nq * lds * sizeof *s2);
                    k.attn_scores_heads(s1, lds, q, nq, kv, ld, n, hd, 0.125f);
                    for (int h = 0; h < nq; h++)
                        k.attn_scores(s2 + (size_t)h * lds, q + (size_t)h * hd, kv, ld, n, hd,
                                      0.125f);
                    if (memcmp(s1, s2, (size_t)nq * lds * sizeof *s1))
                        fail_msg("%s attn_scores_heads hd %d nq %d n %d: not the one-head bits",
                                 cpu_isa_name((enum cpu_isa)isa), hd, nq, n);
                    for (int acc = 0; acc < 2; acc++) {
                        memcpy(o2, o1, (size_t)nq * ldo * sizeof *o2);
                        k.attn_accum_heads(o1, ldo, s1, lds, nq, kv, ld, n, hd, acc);
                        for (int h = 0; h < nq; h++)
                            k.attn_accum(o2 + (size_t)h * ldo, s2 + (size_t)h * lds, kv, ld, n,
                                         hd, acc);
                        if (memcmp(o1, o2, (size_t)nq * ldo * sizeof *o1))
                            fail_msg("%s attn_accum_heads hd %d nq %d n %d acc %d: not the "
                                     "one-head bits", cpu_isa_name((enum cpu_isa)isa), hd, nq, n,
                                     acc);
                    }
                    n_checked++;
                    free(q);
                    free(kv);
                    free(s1);
                    free(s2);
                    free(o1);
                    free(o2);
                }
    }
    printf("    many-head attention kernels: %d shapes bit-identical to one head at a time\n",
           n_checked);
}

/* Several sequences in one call, as a server's step has them: decode rows (one query
 * each) beside a prefill chunk, each sequence's blocks scattered through one pool.
 * Every row against the reference, and each decode row bit-identical to the same row
 * computed alone (a row's result never depends on the batch around it). */
static void test_attention_batch(void **state)
{
    (void)state;
    enum { NS = 4 };
    /* the prefill chunk fills a whole item (16 tokens x 4 heads) and decode rows follow it: the
     * item must end where its sequence's rows do (an item that ran on to the next tile's start
     * took the decode rows too, 18 tokens x 4 heads, past its 64 rows) */
    static const int pos0[NS] = {300, 10, 41, 129}, ntok[NS] = {1, 16, 1, 1};
    int n_head = 8, n_kv = 2, hd = 32, bs = 16, kvd = n_kv * hd;
    float sinks_v[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -2.0f, 0.25f, 3.0f};
    struct kc_bes bes;
    struct kc_errstat es = {0};
    kc_open(&bes);
    for (int vi = 0; vi < 6; vi++) {
        /* variants 1, 3, 5: a window, softcap and sinks; the cache f32, f16, bf16 */
        int variant = vi % 2;
        enum dtype dt = k_kv_types[vi / 2];
        size_t esz = dtype_size(dt);
        struct attn_params ap = {n_head, n_kv, hd, 1.0f / sqrtf((float)hd),
                                 variant ? 20.0f : 0.0f, variant ? 150 : 0,
                                 variant ? sinks_v : NULL, 0};
        int nb[NS], b0[NS], nblk = 0, n_rows = 0;
        for (int s = 0; s < NS; s++) {
            nb[s] = (pos0[s] + ntok[s] + bs - 1) / bs;
            b0[s] = nblk;
            nblk += nb[s];
            n_rows += ntok[s];
        }
        /* block j of sequence s is pool block (b0 + j) * 7 % nblk (7 is prime to nblk) */
        int32_t *tables = malloc((size_t)nblk * sizeof *tables);
        for (int i = 0; i < nblk; i++)
            tables[i] = (int32_t)((size_t)i * 7 % (size_t)nblk);
        assert_true(nblk % 7 != 0);
        char *kp = calloc((size_t)nblk * bs * kvd, esz), *vp = calloc((size_t)nblk * bs * kvd, esz);
        int32_t pos[32], slot[32], tab[32], end[32], row0[NS];
        float *q = kc_fvec((size_t)n_rows * n_head * hd, -3, 3);
        float *out = malloc((size_t)n_rows * n_head * hd * sizeof *out);
        float *solo = malloc((size_t)n_head * hd * sizeof *solo);
        double *ref = malloc((size_t)16 * n_head * hd * sizeof *ref);
        float *ks[NS], *vs[NS];
        for (int s = 0, r = 0; s < NS; s++) {
            int n_ctx = pos0[s] + ntok[s];
            ks[s] = kc_fvec((size_t)n_ctx * kvd, -3, 3);
            vs[s] = kc_fvec((size_t)n_ctx * kvd, -1, 1);
            kv_round(ks[s], (size_t)n_ctx * kvd, dt);
            kv_round(vs[s], (size_t)n_ctx * kvd, dt);
            for (int j = 0; j < n_ctx; j++) {
                size_t sl = (size_t)tables[b0[s] + j / bs] * bs + j % bs;
                kv_put(kp + sl * kvd * esz, ks[s] + (size_t)j * kvd, (size_t)kvd, dt);
                kv_put(vp + sl * kvd * esz, vs[s] + (size_t)j * kvd, (size_t)kvd, dt);
            }
            row0[s] = r;
            for (int t = 0; t < ntok[s]; t++, r++) {
                pos[r] = pos0[s] + t;
                slot[r] = tables[b0[s] + pos[r] / bs] * bs + pos[r] % bs;
                tab[r] = b0[s];
                end[r] = n_ctx;
            }
        }
        struct kv_layer kv = {kp, vp, kvd, kvd, dt};
        struct kv_rows rows = {pos, slot, tab, tables, end, bs, NULL, NULL};
        size_t qs = (size_t)n_head * hd;
        for (int i = 0; i < bes.n; i++) {
            struct backend *be = bes.be[i];
            memset(out, 0xff, (size_t)n_rows * qs * sizeof *out);
            be->ops->attention(be, out, (int)qs, q, (int)qs, &kv, &rows, n_rows, &ap);
            for (int s = 0; s < NS; s++) {
                attn_ref(ref, q + row0[s] * qs, ks[s], vs[s], ntok[s], pos0[s], n_head, n_kv, hd,
                         &ap);
                kc_check(&es, "attention_batch", be, out + row0[s] * qs, ref, ntok[s] * qs, 1e-10,
                         1e-4);
                if (ntok[s] != 1)
                    continue;
                struct kv_rows one = {pos + row0[s], slot + row0[s], tab + row0[s], tables,
                                      end + row0[s], bs, NULL, NULL};
                be->ops->attention(be, solo, (int)qs, q + row0[s] * qs, (int)qs, &kv, &one, 1, &ap);
                if (memcmp(solo, out + row0[s] * qs, qs * sizeof *solo) != 0)
                    fail_msg("attention_batch on %s: sequence %d's decode row differs alone", be->name,
                             s);
            }
        }
        for (int s = 0; s < NS; s++) {
            free(ks[s]);
            free(vs[s]);
        }
        free(tables);
        free(kp);
        free(vp);
        free(q);
        free(out);
        free(solo);
        free(ref);
    }
    kc_report("attention_batch", &es);
    kc_close(&bes);
}

/* A prompt's rows attended in one call and in chunks of other sizes (as a prompt split by
 * the batch budget, or resumed after a cached prefix, reaches them): each row the same bits,
 * on every backend, and the whole call against the reference (items of up to 64 rows over
 * many 64-key gather blocks). MHA with head_dim 80 (phi-2's) and GQA; chunks that cut the
 * 4-key groups and the 64-key gather blocks at different places. The whole call and the
 * last chunk have 4 items a kv head or more, so the CPU backend widens their keys and values
 * once (attn_pack); the small chunks gather theirs item by item. */
static void test_attention_chunks(void **state)
{
    (void)state;
    struct kc_errstat es = {0};
    static const struct {
        int n_head, n_kv, hd;
    } shapes[] = {{4, 4, 80}, {8, 2, 64}, {3, 3, 7}};
    /* no chunk of one row: a decode item */
    static const int cuts[] = {0, 5, 22, 24, 70, 97, 100, 300};
    enum { N_TOK = 300 };
    struct kc_bes bs;
    kc_open(&bs);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int nh = shapes[si].n_head, nkv = shapes[si].n_kv, hd = shapes[si].hd;
        const size_t qs = (size_t)nh * hd, nkvs = (size_t)N_TOK * nkv * hd;
        float *q = kc_fvec(N_TOK * qs, -3, 3), *k = kc_fvec(nkvs, -3, 3), *v = kc_fvec(nkvs, -1, 1);
        float *whole = malloc(N_TOK * qs * sizeof *whole), *part = malloc(N_TOK * qs * sizeof *part);
        assert_non_null(whole);
        assert_non_null(part);
        double *ref = malloc(N_TOK * qs * sizeof *ref);
        assert_non_null(ref);
        struct attn_params ap = {nh, nkv, hd, 1.0f / sqrtf((float)hd), 0.0f, 0, NULL, 0};
        struct paged pg;
        attn_ref(ref, q, k, v, N_TOK, 0, nh, nkv, hd, &ap);
        paged_open(&pg, k, v, N_TOK, nkv * hd, 0, N_TOK, DTYPE_F32);
        for (int i = 0; i < bs.n; i++) {
            struct backend *be = bs.be[i];
            be->ops->attention(be, whole, (int)qs, q, (int)qs, &pg.kv, &pg.rows, N_TOK, &ap);
            kc_check(&es, "attention_chunks", be, whole, ref, N_TOK * qs, 1e-10, 1e-4);
            for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
                const int t0 = cuts[c], n = cuts[c + 1] - t0;
                struct kv_rows sub = {pg.pos + t0, pg.slot + t0, pg.table + t0, pg.tables,
                                      pg.end + t0, pg.rows.block_size, NULL, NULL};
                be->ops->attention(be, part + t0 * qs, (int)qs, q + t0 * qs, (int)qs, &pg.kv, &sub,
                                   n, &ap);
            }
            for (int t = 0; t < N_TOK; t++)
                if (memcmp(whole + t * qs, part + t * qs, qs * sizeof *part) != 0)
                    fail_msg("attention on %s, %d heads / %d kv of %d: row %d differs in chunks",
                             be->name, nh, nkv, hd, t);
        }
        paged_close(&pg);
        free(q);
        free(k);
        free(v);
        free(whole);
        free(part);
        free(ref);
    }
    kc_report("attention_chunks", &es);
    kc_close(&bs);
}

/* The sliding-window kind, soft-capping and sinks against the brute-force masked reference:
 * windows shorter than, equal to and longer than the context, across block boundaries. */
static void test_attention_window(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    attn_case_opts(&bs, &es, 1, 40, 4, 2, 16, 1.0f, 8, 0.0f, false);     /* decode, window 8 */
    attn_case_opts(&bs, &es, 20, 0, 4, 1, 16, 1.0f, 8, 0.0f, false);     /* prefill past it */
    attn_case_opts(&bs, &es, 70, 30, 2, 2, 32, 2.0f, 5, 0.0f, false);    /* keys > one gather block */
    /* 5 items a head: the CPU backend widens keys and values [101, 500) once (attn_pack) */
    attn_case_opts(&bs, &es, 300, 200, 2, 2, 32, 2.0f, 100, 0.0f, false);
    attn_case_opts(&bs, &es, 6, 3, 4, 4, 8, 1.0f, 9, 0.0f, false);       /* window = context */
    attn_case_opts(&bs, &es, 5, 0, 4, 4, 8, 1.0f, 1, 0.0f, false);       /* only itself */
    attn_case_opts(&bs, &es, 9, 7, 4, 2, 16, 6.0f, 0, 3.0f, false);      /* softcap */
    attn_case_opts(&bs, &es, 9, 7, 4, 2, 16, 1.0f, 4, 0.0f, true);       /* sinks + window */
    /* Llama 4's chunked attention: a query sees only its chunk [p - p % chunk, p] */
    attn_case_chunk(&bs, &es, 20, 0, 4, 2, 16, 1.0f, 0, 0.0f, false, 8);   /* prefill over 3 chunks */
    attn_case_chunk(&bs, &es, 1, 37, 4, 1, 16, 1.0f, 0, 0.0f, false, 8);   /* decode mid-chunk */
    attn_case_chunk(&bs, &es, 1, 40, 4, 1, 16, 1.0f, 0, 0.0f, false, 8);   /* decode at a chunk start */
    attn_case_chunk(&bs, &es, 70, 30, 2, 2, 64, 2.0f, 24, 0.0f, false, 24); /* window = chunk (the pool) */
    attn_case_chunk(&bs, &es, 9, 7, 4, 2, 16, 1.0f, 6, 0.0f, true, 5);     /* window and chunk, sinks */
    kc_report("attention_window", &es);
    kc_close(&bs);
}

// ---- elementwise ----

static double gelu_tanh_d(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double gelu_erf_d(double x)
{
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

/* The softplus kernel of every ISA this CPU runs (Mamba's deltas) against double precision:
 * relative error within 2e-6 over [-100, 100] (tiny outputs included: log1p's correction),
 * outputs below FLT_MIN within FLT_MIN (AVX2's exp stops at FLT_MIN), x itself above 20, NaN
 * through; tails around the 8 and 16 lanes. */
static void test_softplus(void **state)
{
    (void)state;
    static const int ns[] = {1, 7, 8, 9, 15, 16, 17, 33, 4001};
    int n_checked = 0;
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best(); isa++) {
        struct cpu_kernels k;
        if (!cpu_kernels_init(&k, (enum cpu_isa)isa) || !k.softplus)
            continue;
        for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
            int n = ns[c];
            float *x = kc_fvec((size_t)n, -100, 100), *y = malloc((size_t)n * sizeof *y);
            assert_non_null(y);
            if (n > 8) {
                x[0] = 20.0f;
                x[1] = 20.5f;
                x[2] = -1e-8f;
                x[3] = 0.0f;
                x[4] = -87.0f;
                x[5] = 1e-3f;
                x[6] = -17.0f;
                x[7] = 19.9f;
            }
            k.softplus(y, x, n);
            for (int i = 0; i < n; i++) {
                double r = x[i] > 20.0f ? x[i] : log1p(exp((double)x[i]));
                if (fabs(y[i] - r) > 2e-6 * fabs(r) + FLT_MIN)
                    fail_msg("%s softplus(%.9g) = %.9g, want %.9g", cpu_isa_name((enum cpu_isa)isa),
                             x[i], y[i], r);
            }
            x[n - 1] = NAN;
            k.softplus(x, x, n);  /* in place */
            if (!isnan(x[n - 1]))
                fail_msg("%s softplus(NaN) = %g", cpu_isa_name((enum cpu_isa)isa), x[n - 1]);
            n_checked++;
            free(x);
            free(y);
        }
    }
    printf("    softplus: %d sizes within 2e-6 of double\n", n_checked);
}

/* The gated delta rule's body (kern_gdn.h) compiled per ISA gives the scalar file's bits:
 * steps (T < GDN_BLOCK_MIN) and blocks, two value heads per key head, dims off the vector
 * widths. */
static void test_gdn_isa_bits(void **state)
{
    (void)state;
    enum { NK = 2, NV = 4, DK = 20, DV = 13, N = 40 };
    const int ldx = 2 * NK * DK + NV * DV + 3, ldab = 2 * NV + 1, ldy = NV * DV + 2;
    float *x = kc_fvec((size_t)N * ldx, -1, 1), *ab = kc_fvec((size_t)N * ldab, -2, 2);
    float *alog = kc_fvec(NV, -1, 1), *dtb = kc_fvec(NV, -1, 1);
    float *st0 = kc_fvec((size_t)NV * DK * DV, -0.5f, 0.5f);
    size_t scr_n = (size_t)GDN_BLOCK * (2 * DK + 2 * DV + 2) + DV;
    double *scr = malloc(scr_n * sizeof *scr);
    float *ys[CPU_ISA_AVX512 + 1] = {0}, *sts[CPU_ISA_AVX512 + 1] = {0};
    int32_t pos[N], seq[N];
    assert_non_null(scr);
    for (int i = 0; i < N; i++) {
        pos[i] = 5 + i;
        seq[i] = 0;
    }
    int n_isa = 0;
    for (int isa = CPU_ISA_SCALAR; isa <= (int)cpu_isa_best(); isa++) {
        struct cpu_kernels k;
        if (!cpu_kernels_init(&k, (enum cpu_isa)isa) || !k.gdn_rows)
            continue;
        float *y = calloc((size_t)N * ldy, sizeof *y), *st = malloc((size_t)NV * DK * DV * sizeof *st);
        assert_true(y && st);
        memcpy(st, st0, (size_t)NV * DK * DV * sizeof *st);
        struct gdn_ctx g = {.k = &k, .y = y, .x = x, .ab = ab, .ldy = ldy, .ldx = ldx, .ldab = ldab,
                            .a_log = alog, .dt_bias = dtb, .st = st, .pos = pos, .seq = seq,
                            .n_tok = N, .nk = NK, .nv = NV, .dk = DK, .dv = DV};
        /* rows 0-2 as steps, 3-39 as one block, per head */
        for (int h = 0; h < NV; h++) {
            k.gdn_rows(&g, scr, 0, 3, h);
            k.gdn_rows(&g, scr, 3, N - 3, h);
        }
        ys[isa] = y;
        sts[isa] = st;
        if (isa != CPU_ISA_SCALAR) {
            if (memcmp(y, ys[CPU_ISA_SCALAR], (size_t)N * ldy * sizeof *y))
                fail_msg("%s gdn_rows: outputs differ from the scalar file's", cpu_isa_name((enum cpu_isa)isa));
            if (memcmp(st, sts[CPU_ISA_SCALAR], (size_t)NV * DK * DV * sizeof *st))
                fail_msg("%s gdn_rows: state differs from the scalar file's", cpu_isa_name((enum cpu_isa)isa));
        }
        n_isa++;
    }
    printf("    gated delta rule: %d ISAs, the same bits\n", n_isa);
    for (int i = 0; i <= CPU_ISA_AVX512; i++) {
        free(ys[i]);
        free(sts[i]);
    }
    free(x);
    free(ab);
    free(alog);
    free(dtb);
    free(st0);
    free(scr);
}

static void test_elementwise(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 15, 16, 1000, 40007};
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    for (size_t si = 0; si < 5; si++) {
        size_t n = sizes[si];
        float *a = kc_fvec(n, -9, 9), *b = kc_fvec(n, -2, 2), *y = malloc(n * sizeof *y);
        float *gu = malloc(2 * n * sizeof *gu);
        double *r1 = malloc(n * sizeof *r1), *r2 = malloc(n * sizeof *r2),
               *r3 = malloc(n * sizeof *r3), *r4 = malloc(n * sizeof *r4),
               *r5 = malloc(n * sizeof *r5);
        for (size_t i = 0; i < n; i++) {
            r1[i] = gelu_tanh_d(a[i]);
            r2[i] = gelu_erf_d(a[i]);
            r3[i] = a[i] / (1 + exp(-(double)a[i])) * b[i];
            r4[i] = b[i] + 0.37 * (double)a[i];
            r5[i] = gelu_erf_d(a[i]) * b[i];
        }
        for (int i = 0; i < bs.n; i++) {
            struct backend *be = bs.be[i];
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_GELU_TANH, y, (int)n, 1, (int)n);
            kc_check(&es, "gelu_tanh", be, y, r1, n, 1e-11, 1e-5);
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_GELU_ERF, y, (int)n, 1, (int)n);
            kc_check(&es, "gelu_erf", be, y, r2, n, 1e-11, 1e-5);
            /* sigmoid (output gates) */
            double *rs = malloc(n * sizeof *rs);
            for (size_t i = 0; i < n; i++)
                rs[i] = 1.0 / (1.0 + exp(-(double)a[i]));
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_SIGMOID, y, (int)n, 1, (int)n);
            kc_check(&es, "sigmoid", be, y, rs, n, 1e-11, 1e-5);
            free(rs);
            /* relu2 (Nemotron-H): relu(x)^2 */
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_RELU2, y, (int)n, 1, (int)n);
            for (size_t k = 0; k < n; k++)
                r4[k] = a[k] > 0.0f ? (double)a[k] * a[k] : 0.0;
            kc_check(&es, "relu2", be, y, r4, n, 1e-11, 1e-6);
            for (size_t k = 0; k < n; k++)
                r4[k] = b[k] + 0.37 * (double)a[k];
            /* glu: one row [gate | up], written over the gate half */
            memcpy(gu, a, n * sizeof *gu);
            memcpy(gu + n, b, n * sizeof *gu);
            be->ops->glu(be, ACT_SILU, gu, (int)(2 * n), gu, (int)(2 * n), 1, (int)n);
            kc_check(&es, "glu silu", be, gu, r3, n, 1e-11, 1e-5);
            memcpy(gu, a, n * sizeof *gu);
            memcpy(gu + n, b, n * sizeof *gu);
            be->ops->glu(be, ACT_GELU_ERF, y, (int)n, gu, (int)(2 * n), 1, (int)n);
            kc_check(&es, "glu gelu", be, y, r5, n, 1e-11, 1e-5);
            /* glu_clamped (gpt-oss): gate a, up 4b (both reach past the limit 7), from the
             * halves and from interleaved pairs, over two rows where n is even */
            {
                size_t rows = n % 2 == 0 ? 2 : 1, w = n / rows;
                for (size_t i = 0; i < n; i++) {
                    double g = a[i] < 7.0f ? a[i] : 7.0, u = 4.0 * b[i];
                    u = u < -7.0 ? -7.0 : u > 7.0 ? 7.0 : u;
                    r5[i] = (u + 1.0) * g / (1.0 + exp(-1.702 * g));
                }
                for (size_t r = 0; r < rows; r++)
                    for (size_t i = 0; i < w; i++) {
                        gu[r * 2 * w + i] = a[r * w + i];
                        gu[r * 2 * w + w + i] = 4.0f * b[r * w + i];
                    }
                be->ops->glu_clamped(be, y, (int)w, gu, (int)(2 * w), (int)rows, (int)w, 1.702f,
                                     7.0f, false);
                kc_check(&es, "glu_clamped halves", be, y, r5, n, 1e-11, 1e-5);
                for (size_t r = 0; r < rows; r++)
                    for (size_t i = 0; i < w; i++) {
                        gu[r * 2 * w + 2 * i] = a[r * w + i];
                        gu[r * 2 * w + 2 * i + 1] = 4.0f * b[r * w + i];
                    }
                be->ops->glu_clamped(be, y, (int)w, gu, (int)(2 * w), (int)rows, (int)w, 1.702f,
                                     7.0f, true);
                kc_check(&es, "glu_clamped interleaved", be, y, r5, n, 1e-11, 1e-5);
            }
            memcpy(y, b, n * sizeof *y);
            be->ops->axpy(be, y, (int)n, 0.37f, a, (int)n, 1, (int)n);
            kc_check(&es, "axpy", be, y, r4, n, 1e-12, 1e-6);
            /* sigmoid_axpy: y = b + sigmoid(g) a, one gate per row (two rows of n / 2) */
            memcpy(y, b, n * sizeof *y);
            float g2[2] = {-0.8f, 1.3f};
            size_t hn = n / 2;
            be->ops->sigmoid_axpy(be, y, (int)hn, g2, a, (int)hn, 2, (int)hn);
            for (size_t i = 0; i < 2 * hn; i++)
                r5[i] = b[i] + (double)a[i] / (1.0 + exp(-(double)g2[i / hn]));
            if (hn > 0)
                kc_check(&es, "sigmoid_axpy", be, y, r5, 2 * hn, 1e-12, 1e-6);
            /* scale: y = -1.5 a */
            memcpy(y, a, n * sizeof *y);
            be->ops->scale(be, y, (int)n, -1.5f, 1, (int)n);
            for (size_t i = 0; i < n; i++)
                r5[i] = -1.5 * (double)a[i];
            kc_check(&es, "scale", be, y, r5, n, 1e-14, 1e-7);
            /* softcap: y = 4 tanh(a / 4) */
            memcpy(y, a, n * sizeof *y);
            be->ops->softcap(be, y, (int)n, 4.0f, 1, (int)n);
            for (size_t i = 0; i < n; i++)
                r5[i] = 4.0 * tanh((double)a[i] / 4.0);
            kc_check(&es, "softcap", be, y, r5, n, 1e-12, 1e-6);
            /* relu2 (Arcee): max(a, 0)², alone and as a GLU's gate */
            memcpy(y, a, n * sizeof *y);
            be->ops->act(be, ACT_RELU2, y, (int)n, 1, (int)n);
            for (size_t i = 0; i < n; i++)
                r5[i] = a[i] > 0 ? (double)a[i] * a[i] : 0.0;
            kc_check(&es, "relu2", be, y, r5, n, 1e-12, 1e-6);
            memcpy(gu, a, n * sizeof *gu);
            memcpy(gu + n, b, n * sizeof *gu);
            be->ops->glu(be, ACT_RELU2, y, (int)n, gu, (int)(2 * n), 1, (int)n);
            for (size_t i = 0; i < n; i++)
                r5[i] *= b[i];
            kc_check(&es, "glu relu2", be, y, r5, n, 1e-12, 1e-6);
            /* xielu (Apertus) over a with the first entries inside (eps, 0] and at 0, two rows */
            {
                const struct xielu_params xp = {0.9f, 1.1f, 0.5f, -1e-6f};
                size_t rows = n % 2 == 0 ? 2 : 1, w = n / rows;
                memcpy(y, a, n * sizeof *y);
                if (n >= 2) {
                    y[0] = -4e-7f;
                    y[1] = 0.0f;
                }
                for (size_t i = 0; i < n; i++) {
                    double v = y[i], m = v < xp.eps ? v : (double)xp.eps;
                    r5[i] = v > 0 ? (double)xp.alpha_p * v * v + (double)xp.beta * v
                                  : (expm1(m) - v) * xp.alpha_n + (double)xp.beta * v;
                }
                be->ops->xielu(be, y, (int)w, (int)rows, (int)w, &xp);
                kc_check(&es, "xielu", be, y, r5, n, 1e-11, 1e-5);
                /* act / glu refuse xIELU (its constants come only through xielu) */
                struct err e = {0};
                be->ops->act(be, ACT_XIELU, y, (int)n, 1, (int)n);
                assert_true(be->ops->sync(be, &e) < 0);
                assert_non_null(strstr(e.msg, "xielu"));
            }
            for (size_t i = 0; i < n; i++)
                r5[i] = gelu_erf_d(a[i]) * b[i];
        }
        free(a);
        free(b);
        free(y);
        free(r1);
        free(r2);
        free(r3);
        free(r4);
        free(r5);
        free(gu);
    }
    kc_report("elementwise", &es);
    kc_close(&bs);
}

// ---- mixture of experts ----

/* Grouping: every slot appears once, runs are by ascending expert, slots ascend inside a
 * run, offsets delimit the runs. */
// ---- recurrent ops ----

/* conv1d with its state against the textbook convolution over each whole sequence: S
 * sequences of T positions, their rows interleaved (row order: position-major, so every
 * sequence's rows sit between the others'), fed in chunks of `chunk` rows, so the state
 * carries both within a chunk and across chunks; a sequence restarted at position 0 forgets
 * what its slot held. */
static void conv_case(struct kc_bes *bs, struct kc_errstat *es, int S, int T, int C, int K,
                      int chunk, bool silu, bool bias)
{
    int n = S * T;
    float *x = kc_fvec((size_t)n * C, -2, 2), *wv = kc_fvec((size_t)C * K, -1, 1);
    float *bv = kc_fvec((size_t)C, -1, 1), *y = malloc((size_t)n * C * sizeof *y);
    double *ref = malloc((size_t)n * C * sizeof *ref);
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = malloc((size_t)n * sizeof *seq);
    for (int t = 0; t < T; t++)
        for (int s = 0; s < S; s++) {
            int r = t * S + s;
            pos[r] = t;
            seq[r] = (s * 5 + 3) % S;  /* slots not in row order */
        }
    for (int r = 0; r < n; r++)
        for (int c = 0; c < C; c++) {
            double acc = bias ? bv[c] : 0.0;
            for (int j = 0; j < K; j++) {
                int t = pos[r] - K + 1 + j;
                if (t >= 0)
                    acc += (double)wv[(size_t)c * K + j] * x[((size_t)t * S + r % S) * C + c];
            }
            ref[(size_t)r * C + c] = silu ? acc / (1.0 + exp(-acc)) : acc;
        }
    int64_t ws[2] = {C, K}, bsz[1] = {C};
    struct tensor w, b;
    tensor_init(&w, DTYPE_F32, wv, 2, ws);
    tensor_init(&b, DTYPE_F32, bv, 1, bsz);
    size_t sd = (size_t)(K - 1) * C;
    float *st = malloc((size_t)S * (sd ? sd : 1) * sizeof *st);
    struct kv_layer kl = {.k = st, .v = NULL, .k_dim = (int)sd, .v_dim = 0, .dtype = DTYPE_F32};
    for (int i = 0; i < bs->n; i++) {
        struct backend *be = bs->be[i];
        for (size_t q = 0; q < (size_t)S * sd; q++)
            st[q] = 1e3f;  /* garbage a restarted sequence must not see */
        for (int r0 = 0; r0 < n; r0 += chunk) {
            int m = n - r0 < chunk ? n - r0 : chunk;
            struct kv_rows rows = {.pos = pos + r0, .state = seq + r0};
            /* in place, as the families call it */
            memcpy(y + (size_t)r0 * C, x + (size_t)r0 * C, (size_t)m * C * sizeof *y);
            be->ops->conv1d(be, y + (size_t)r0 * C, C, y + (size_t)r0 * C, C, &w, bias ? &b : NULL,
                            &kl, &rows, m, C, K, silu);
        }
        struct err e = {0};
        assert_int_equal(backend_sync(be, &e), 0);
        kc_check(es, "conv1d", be, y, ref, (size_t)n * C, 1e-12, 1e-5);
    }
    free(x), free(wv), free(bv), free(y), free(ref), free(pos), free(seq), free(st);
}

static void test_conv1d(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    conv_case(&bs, &es, 1, 12, 64, 3, 12, false, false);   /* LFM2's shape, one chunk */
    conv_case(&bs, &es, 3, 9, 40, 4, 5, true, true);       /* Mamba's: silu, bias, chunks of 5 */
    conv_case(&bs, &es, 8, 6, 1000, 4, 7, true, false);    /* threads split the channels */
    conv_case(&bs, &es, 2, 5, 16, 1, 3, false, true);      /* width 1: no state */
    conv_case(&bs, &es, 2, 7, 23, 4, 4, true, true);       /* 16 channels and a tail of 7 */
    conv_case(&bs, &es, 2, 24, 37, 18, 7, true, true);     /* wider than the kernels' taps */
    kc_report("conv1d", &es);
    kc_close(&bs);
}

static void test_mul(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    const int rows = 7, n = 1001, lda = 1100, ldb = 1003;
    float *a = kc_fvec((size_t)rows * lda, -3, 3), *b = kc_fvec((size_t)rows * ldb, -3, 3);
    float *y = malloc((size_t)rows * n * sizeof *y), *yb = malloc((size_t)rows * ldb * sizeof *yb);
    double *ref = malloc((size_t)rows * n * sizeof *ref);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++)
            ref[(size_t)r * n + j] = (double)a[(size_t)r * lda + j] * b[(size_t)r * ldb + j];
    for (int i = 0; i < bs.n; i++) {
        struct backend *be = bs.be[i];
        be->ops->mul(be, y, n, a, lda, b, ldb, rows, n);
        kc_check(&es, "mul", be, y, ref, (size_t)rows * n, 1e-14, 1e-6);
        /* in place over the second factor */
        memcpy(yb, b, (size_t)rows * ldb * sizeof *yb);
        be->ops->mul(be, yb, ldb, a, lda, yb, ldb, rows, n);
        for (int r = 0; r < rows; r++)
            memcpy(y + (size_t)r * n, yb + (size_t)r * ldb, (size_t)n * sizeof *y);
        kc_check(&es, "mul in place", be, y, ref, (size_t)rows * n, 1e-14, 1e-6);
    }
    kc_report("mul", &es);
    free(a), free(b), free(y), free(yb), free(ref);
    kc_close(&bs);
}

static void test_moe_group(void **state)
{
    (void)state;
    struct kc_bes bs;
    kc_open(&bs);
    enum { N_SLOT = 37, E = 5 };
    int32_t sel[N_SLOT], order[N_SLOT], off[E + 1];
    for (int i = 0; i < N_SLOT; i++)
        sel[i] = (int32_t)kc_urand(E - 1);   /* expert E - 1 stays empty */
    for (int b = 0; b < bs.n; b++) {
        bs.be[b]->ops->moe_group(bs.be[b], order, off, sel, N_SLOT, E);
        assert_int_equal(off[0], 0);
        assert_int_equal(off[E], N_SLOT);
        assert_int_equal(off[E - 1], off[E]);
        for (int e = 0; e < E; e++)
            for (int r = off[e]; r < off[e + 1]; r++) {
                assert_int_equal(sel[order[r]], e);
                if (r > off[e])
                    assert_true(order[r] > order[r - 1]);
            }
    }
    kc_close(&bs);
}

/* Routing: softmax over the top-k (Phixtral) equals softmax-all, top-k, renormalize
 * (Mixtral); ties go to the lower index; sparsemixer picks the max first. */
static void test_moe_route(void **state)
{
    (void)state;
    struct kc_bes bs;
    kc_open(&bs);
    float logits[2][6] = {{0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f}, {3.0f, -2.0f, 0.1f, 0.2f, 2.9f, 1.0f}};
    int32_t sel[4];
    float w[4];
    for (int b = 0; b < bs.n; b++) {
        struct backend *be = bs.be[b];
        for (int kind = ROUTER_TOPK_SOFTMAX; kind <= ROUTER_SOFTMAX_TOPK; kind++) {
            be->ops->moe_route(be, (enum router_kind)kind, sel, w, &logits[0][0], 2, 6, 2, 0.0f);
            assert_int_equal(sel[0], 1);   /* tie between 1 and 3: the lower first */
            assert_int_equal(sel[1], 3);
            assert_true(fabsf(w[0] - 0.5f) < 1e-6f && fabsf(w[1] - 0.5f) < 1e-6f);
            assert_int_equal(sel[2], 0);
            assert_int_equal(sel[3], 4);
            double want = 1.0 / (1.0 + exp(-0.1));
            assert_true(fabs(w[2] - want) < 1e-6 && fabs(w[3] - (1.0 - want)) < 1e-6);
        }
        be->ops->moe_route(be, ROUTER_SPARSEMIXER, sel, w, &logits[1][0], 1, 6, 2, 0.01f);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 4);
        /* without renormalization: each chosen weight is its softmax over all six */
        be->ops->moe_route(be, ROUTER_SOFTMAX_TOPK_RAW, sel, w, &logits[1][0], 1, 6, 2, 0.0f);
        double z = 0.0;
        for (int i = 0; i < 6; i++)
            z += exp((double)logits[1][i]);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 4);
        assert_true(fabs(w[0] - exp(3.0) / z) < 1e-6 && fabs(w[1] - exp(2.9) / z) < 1e-6);
        /* Llama 4: the top logits, each weighted by its own sigmoid (no normalization) */
        be->ops->moe_route(be, ROUTER_TOPK_SIGMOID, sel, w, &logits[1][0], 1, 6, 2, 0.0f);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 4);
        assert_true(fabs(w[0] - 1.0 / (1.0 + exp(-3.0))) < 1e-6 &&
                    fabs(w[1] - 1.0 / (1.0 + exp(-2.9))) < 1e-6);
        assert_int_equal(backend_sync(be, NULL), 0);
    }
    kc_close(&bs);
}

/* Llama 4's two ops. attn_temp: each row times 1 + s ln(floor((pos + 1) / floor) + 1) in
 * double, at positions on both sides of the floor steps, rows strided wider than n.
 * moe_weight_input: each gathered row times its slot's weight, then that weight 1 (order a
 * permutation that is not the identity). */
static void test_llama4_ops(void **state)
{
    (void)state;
    enum { T = 6, N = 20, LD = 24, SLOTS = 5 };
    static const int32_t pos[T] = {0, 6, 7, 8, 15, 1000};
    struct kv_rows rows = {.pos = pos, .block_size = 16};
    struct kc_bes bs;
    kc_open(&bs);
    float *x0 = kc_fvec((size_t)T * LD, -2, 2), *x = malloc((size_t)T * LD * sizeof *x);
    float *g0 = kc_fvec((size_t)SLOTS * N, -2, 2), *g = malloc((size_t)SLOTS * N * sizeof *g);
    static const int32_t order[SLOTS] = {3, 0, 4, 1, 2};
    static const float w0[SLOTS] = {0.5f, -1.5f, 2.0f, 0.25f, 3.0f};
    float w[SLOTS];
    for (int b = 0; b < bs.n; b++) {
        struct backend *be = bs.be[b];
        memcpy(x, x0, (size_t)T * LD * sizeof *x);
        be->ops->attn_temp(be, x, LD, T, N, &rows, 8, 0.1f);
        memcpy(g, g0, (size_t)SLOTS * N * sizeof *g);
        memcpy(w, w0, sizeof w);
        be->ops->moe_weight_input(be, g, order, w, SLOTS, N);
        assert_int_equal(backend_sync(be, NULL), 0);
        for (int t = 0; t < T; t++) {
            double f = 1.0 + 0.1 * log(floor((pos[t] + 1.0) / 8.0) + 1.0);
            for (int j = 0; j < LD; j++) {
                double want = j < N ? x0[t * LD + j] * f : x0[t * LD + j];
                assert_true(fabs(x[t * LD + j] - want) <= 1e-6 * fabs(want) + 1e-7);
            }
        }
        /* positions 0..6 keep their queries, 7 (pos + 1 = 8) is the first to grow */
        assert_true(x[1 * LD] == x0[1 * LD] && x[2 * LD] != x0[2 * LD]);
        for (int r = 0; r < SLOTS; r++) {
            for (int j = 0; j < N; j++)
                assert_true(fabsf(g[r * N + j] - g0[r * N + j] * w0[order[r]]) <= 1e-6f);
            assert_true(w[r] == 1.0f);
        }
    }
    free(x0);
    free(x);
    free(g0);
    free(g);
    kc_close(&bs);
}

/* Grouped routing (DeepSeek) reference: rank with a sort whose order is (value desc, index
 * asc), every score in double. */
struct rank_item { double v; int i; };

static int rank_cmp(const void *a, const void *b)
{
    const struct rank_item *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

static void rank_top(const double *v, int n, int k, int *out)
{
    struct rank_item it[64];
    for (int i = 0; i < n; i++)
        it[i] = (struct rank_item){v[i], i};
    qsort(it, (size_t)n, sizeof it[0], rank_cmp);
    for (int j = 0; j < k; j++)
        out[j] = it[j].i;
}

static void route_grouped_ref(enum router_kind kind, const float *lg, const float *bias, int n,
                              int k, int ng, int tg, bool norm, double scale, int *sel, double *w)
{
    double s[64], c[64], gsc[64];
    int gtop[64], two[2];
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += exp(lg[i]);
    for (int i = 0; i < n; i++) {
        s[i] = kind == ROUTER_GROUP_SOFTMAX ? exp(lg[i]) / z : 1.0 / (1.0 + exp(-(double)lg[i]));
        c[i] = s[i] + (bias ? bias[i] : 0.0);
    }
    int gs = n / ng;
    for (int g = 0; g < ng; g++) {
        rank_top(c + g * gs, gs, 2, two);
        gsc[g] = kind == ROUTER_GROUP_SIGMOID ? c[g * gs + two[0]] + c[g * gs + two[1]]
                                              : c[g * gs + two[0]];
    }
    rank_top(gsc, ng, tg, gtop);
    for (int g = 0; g < ng; g++) {
        bool keep = false;
        for (int t = 0; t < tg; t++)
            keep |= gtop[t] == g;
        for (int i = 0; i < gs && !keep; i++)
            c[g * gs + i] = -HUGE_VAL;
    }
    rank_top(c, n, k, sel);
    double sum = 0.0;
    for (int j = 0; j < k; j++)
        sum += s[sel[j]];
    for (int j = 0; j < k; j++)
        w[j] = (norm ? s[sel[j]] / (sum + 1e-20) : s[sel[j]]) * scale;
}

/* moe_route_grouped against the reference over random logits (softmax and sigmoid scores,
 * with and without groups, bias and renormalization); and by hand: the correction bias moves
 * the choice but the weights stay the chosen experts' own scores. */
static void test_moe_route_grouped(void **state)
{
    (void)state;
    struct kc_bes bs;
    kc_open(&bs);
    enum { E = 16, K = 3, T = 20 };
    float lg[T * E], bias_v[E];
    for (int i = 0; i < T * E; i++)
        lg[i] = kc_frand(-3.0f, 3.0f);
    for (int i = 0; i < E; i++)
        bias_v[i] = kc_frand(-0.5f, 0.5f);
    struct tensor bias;
    int64_t shape[1] = {E};
    tensor_init(&bias, DTYPE_F32, bias_v, 1, shape);
    int32_t sel[T * K];
    float w[T * K];
    for (int b = 0; b < bs.n; b++) {
        struct backend *be = bs.be[b];
        for (int kind = ROUTER_GROUP_SOFTMAX; kind <= ROUTER_GROUP_SIGMOID; kind++)
            for (int var = 0; var < 4; var++) {
                struct moe_group_params p = {var & 1 ? &bias : NULL, var & 2 ? 4 : 1,
                                             var & 2 ? 2 : 1, var == 3, 2.5f, 0.0f};
                be->ops->moe_route_grouped(be, (enum router_kind)kind, sel, w, lg, T, E, K, &p);
                assert_int_equal(backend_sync(be, NULL), 0);
                for (int t = 0; t < T; t++) {
                    int rs[K];
                    double rw[K];
                    route_grouped_ref((enum router_kind)kind, lg + t * E, var & 1 ? bias_v : NULL,
                                      E, K, p.n_group, p.topk_group, p.norm, 2.5, rs, rw);
                    for (int j = 0; j < K; j++) {
                        assert_int_equal(sel[t * K + j], rs[j]);
                        assert_true(fabs(w[t * K + j] - rw[j]) < 1e-6 * fmax(1.0, fabs(rw[j])));
                    }
                }
            }
        /* by hand, sigmoid: expert 0 has the best score, the bias moves the choice to 1 and
         * 2, whose weights stay sigmoid(logit) (no renormalization, scale 1) */
        float l4[4] = {2.0f, 1.0f, 0.5f, -1.0f}, b4[4] = {0.0f, 1.0f, 1.0f, 0.0f};
        struct tensor bt;
        int64_t s4[1] = {4};
        tensor_init(&bt, DTYPE_F32, b4, 1, s4);
        struct moe_group_params p = {&bt, 1, 1, false, 1.0f, 0.0f};
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SIGMOID, sel, w, l4, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        assert_int_equal(sel[0], 1);
        assert_int_equal(sel[1], 2);
        assert_true(fabs(w[0] - 1.0 / (1.0 + exp(-1.0))) < 1e-6);
        assert_true(fabs(w[1] - 1.0 / (1.0 + exp(-0.5))) < 1e-6);
        /* groups {0,1} {2,3} with top-1 group: the best single expert 0 lives in group 0, but
         * the sum of group 1's top two wins: experts 2, 3 */
        float l5[4] = {3.0f, -3.0f, 1.5f, 1.5f};
        p = (struct moe_group_params){NULL, 2, 1, true, 1.0f, 0.0f};
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SIGMOID, sel, w, l5, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        assert_int_equal(sel[0], 2);
        assert_int_equal(sel[1], 3);
        assert_true(fabs(w[0] - 0.5) < 1e-6 && fabs(w[1] - 0.5) < 1e-6);
        /* ... while the max rule (softmax kind) keeps group 0 */
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SOFTMAX, sel, w, l5, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 1);
        /* a kept group whose second choice score (0.5 - 1.0) is negative still supplies it:
         * the dropped group's experts are out (-inf), not 0, which would beat it
         * (transformers 5's Glm4Moe router; glm4_moe golden position 9) */
        float l6[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b6[4] = {-0.1f, -1.0f, -0.6f, -0.7f};
        tensor_init(&bt, DTYPE_F32, b6, 1, s4);
        p = (struct moe_group_params){&bt, 2, 1, true, 1.0f, 0.0f};
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SIGMOID, sel, w, l6, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        assert_int_equal(sel[0], 0);
        assert_int_equal(sel[1], 1);
        assert_true(fabs(w[0] - 0.5) < 1e-6 && fabs(w[1] - 0.5) < 1e-6);
        /* ERNIE 4.5's norm_min: softmax over {0, 0, -30, -30}; the bias chooses experts 2 and
         * 3, whose probabilities (about 4.7e-14 each) sum below norm_min 1e-12: each weight is
         * p / 1e-12, not the 0.5 that sum + 1e-20 would give */
        float l7[4] = {0.0f, 0.0f, -30.0f, -30.0f}, b7[4] = {0.0f, 0.0f, 1.0f, 1.0f};
        tensor_init(&bt, DTYPE_F32, b7, 1, s4);
        p = (struct moe_group_params){&bt, 1, 1, true, 1.0f, 1e-12f};
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SOFTMAX, sel, w, l7, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        double p7 = exp(-30.0) / (2.0 + 2.0 * exp(-30.0));
        assert_int_equal(sel[0], 2);
        assert_int_equal(sel[1], 3);
        assert_true(fabs(w[0] - p7 / (double)1e-12f) < 1e-5 * (p7 / 1e-12));
        assert_true(fabs(w[1] - p7 / (double)1e-12f) < 1e-5 * (p7 / 1e-12));
        /* above norm_min the division is by the sum, as without it */
        p.norm_min = 1e-20f;
        be->ops->moe_route_grouped(be, ROUTER_GROUP_SOFTMAX, sel, w, l7, 1, 4, 2, &p);
        assert_int_equal(backend_sync(be, NULL), 0);
        assert_true(fabs(w[0] - 0.5) < 1e-6 && fabs(w[1] - 0.5) < 1e-6);
    }
    kc_close(&bs);
}

/* The MoE pipeline of blk_moe on random experts against a direct double-precision sum:
 * route -> group -> gather -> linear_experts (gate and up in one call) -> glu ->
 * linear_experts (down) -> combine, with decode-sized groups (fused dispatch) and
 * prefill-sized ones, fused_moe on and off. */
static void moe_case(struct kc_bes *bs, struct kc_errstat *es, int n_tok, bool fused)
{
    enum { E = 4, K = 2, D = 24, FF = 40 };
    float *wg = kc_fvec((size_t)E * FF * D, -0.2f, 0.2f), *wu = kc_fvec((size_t)E * FF * D, -0.2f, 0.2f);
    float *wd = kc_fvec((size_t)E * D * FF, -0.2f, 0.2f), *x = kc_fvec((size_t)n_tok * D, -1, 1);
    float *lg = kc_fvec((size_t)n_tok * E, -2, 2);
    struct tensor tg[E], tu[E], td[E];
    const int64_t s_up[2] = {FF, D}, s_down[2] = {D, FF};
    for (int e = 0; e < E; e++) {
        tensor_init(&tg[e], DTYPE_F32, wg + (size_t)e * FF * D, 2, s_up);
        tensor_init(&tu[e], DTYPE_F32, wu + (size_t)e * FF * D, 2, s_up);
        tensor_init(&td[e], DTYPE_F32, wd + (size_t)e * D * FF, 2, s_down);
    }
    struct expert_linear gu[2] = {{tg, NULL}, {tu, NULL}}, down = {td, NULL};
    size_t ns = (size_t)n_tok * K;
    int32_t *sel = malloc(ns * 4), *order = malloc(ns * 4), off[E + 1];
    float *sw = malloc(ns * 4), *xg = malloc(ns * D * 4), *h = malloc(ns * 2 * FF * 4);
    float *h1 = malloc(ns * FF * 4), *yg = malloc(ns * D * 4), *y = malloc((size_t)n_tok * D * 4);
    double *ref = calloc((size_t)n_tok * D, sizeof *ref);
    for (int b = 0; b < bs->n; b++) {
        struct backend *be = bs->be[b];
        be->fused_moe = fused;
        be->ops->moe_route(be, ROUTER_SOFTMAX_TOPK, sel, sw, lg, n_tok, E, K, 0.0f);
        be->ops->moe_group(be, order, off, sel, (int)ns, E);
        be->ops->gather(be, xg, x, D, order, K, (int)ns, D);
        be->ops->linear_experts(be, h, 2 * FF, xg, gu, 2, off, E, (int)ns);
        be->ops->glu(be, ACT_SILU, h1, FF, h, 2 * FF, (int)ns, FF);
        be->ops->linear_experts(be, yg, D, h1, &down, 1, off, E, (int)ns);
        be->ops->moe_combine(be, y, yg, order, sw, K, (int)ns, D);
        assert_int_equal(backend_sync(be, NULL), 0);
        be->fused_moe = true;
        if (b == 0) {
            /* the reference from the routing the op chose (checked in test_moe_route) */
            for (size_t s = 0; s < ns; s++) {
                int t = (int)(s / K), e = sel[s];
                double hh[FF];
                for (int f = 0; f < FF; f++) {
                    double g = 0, u = 0;
                    for (int i = 0; i < D; i++) {
                        g += (double)wg[((size_t)e * FF + f) * D + i] * x[(size_t)t * D + i];
                        u += (double)wu[((size_t)e * FF + f) * D + i] * x[(size_t)t * D + i];
                    }
                    hh[f] = g / (1 + exp(-g)) * u;
                }
                for (int o = 0; o < D; o++) {
                    double acc = 0;
                    for (int f = 0; f < FF; f++)
                        acc += (double)wd[((size_t)e * D + o) * FF + f] * hh[f];
                    ref[(size_t)t * D + o] += sw[s] * acc;
                }
            }
        }
        kc_check(es, "moe", be, y, ref, (size_t)n_tok * D, 1e-10, 1e-4);
    }
    float *bufs[] = {wg, wu, wd, x, lg, sw, xg, h, h1, yg, y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(sel);
    free(order);
    free(ref);
}

static void test_moe(void **state)
{
    (void)state;
    struct kc_bes bs;
    struct kc_errstat es = {0};
    kc_open(&bs);
    for (int fused = 1; fused >= 0; fused--) {
        moe_case(&bs, &es, 1, fused);    /* decode: every group below the GEMM threshold */
        moe_case(&bs, &es, 3, fused);
        moe_case(&bs, &es, 80, fused);   /* prefill: groups past it */
    }
    kc_report("moe", &es);
    kc_close(&bs);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_attention),
    cmocka_unit_test(test_attention_span),
    cmocka_unit_test(test_attention_heads),
    cmocka_unit_test(test_attention_window),
    cmocka_unit_test(test_attention_batch),
    cmocka_unit_test(test_attention_chunks),
    cmocka_unit_test(test_elementwise),
    cmocka_unit_test(test_softplus),
    cmocka_unit_test(test_gdn_isa_bits),
    cmocka_unit_test(test_conv1d),
    cmocka_unit_test(test_mul),
    cmocka_unit_test(test_moe_group),
    cmocka_unit_test(test_moe_route),
    cmocka_unit_test(test_moe_route_grouped),
    cmocka_unit_test(test_moe),
    cmocka_unit_test(test_llama4_ops),
};

TEST_SUITE(kernel_ops, k_tests);
