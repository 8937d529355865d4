/*
 * tp: tensor parallelism over n ranks (tp.h, ADR 0139): the split of a loaded model into
 * rank models, their contexts, the forward of one chunk on every rank and the in-process
 * all-reduce of virtual ranks.
 */
#include "tp.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"

/* ---- owned copies of row and column ranges ---- */

static bool inner_contiguous(const struct tensor *t)
{
    return t->ndim >= 1 && t->stride[t->ndim - 1] == 1 && !t->packed;
}

/* A range of rows (of a 1-D tensor: elements). */
struct seg {
    int64_t r0, n;
};

/* dst = an owned contiguous copy of the rows of segments s[0..ns) of the 2-D t, one after
 * another (a 1-D t: its elements). */
static int copy_segs(struct model *rm, struct tensor *dst, const struct tensor *t, const struct seg *s, int ns,
                     struct err *e)
{
    const char *nm = t->name ? t->name : "?";
    int64_t n = 0;
    for (int k = 0; k < ns; k++) {
        if (s[k].r0 < 0 || s[k].n <= 0 || s[k].r0 + s[k].n > t->shape[0])
            return err_setf(e, ERR_FORMAT, "tensor parallel: cannot take rows %lld..%lld of %s",
                            (long long)s[k].r0, (long long)(s[k].r0 + s[k].n), nm);
        n += s[k].n;
    }
    /* 3-D: a float tensor of contiguous [rows, a, b] (RG-LRU's per-head gates) */
    bool d3 = t->ndim == 3 && !t->qbits && tensor_is_contiguous(t);
    if (!inner_contiguous(t) || (t->ndim > 2 && !d3) || (t->ndim == 1 && t->qbits))
        return err_setf(e, ERR_FORMAT, "tensor parallel: cannot take rows of %s (its layout)", nm);
    size_t es = dtype_size(t->dtype);
    int64_t rs = t->ndim == 1 ? 1 : d3 ? t->shape[1] * t->shape[2] : tensor_row_storage(t);
    size_t gb = t->qbits ? (size_t)(t->shape[1] / t->qgroup) * dtype_size(t->qsdtype) : 0;
    size_t data = (size_t)n * (size_t)rs * es, aux = (size_t)n * gb;
    char *p;
    int rc = model_alloc_owned(rm, data + (t->qbiases ? 2 : 1) * aux, (void **)&p, e);
    if (rc < 0)
        return rc;
    int64_t i = 0;
    for (int k = 0; k < ns; k++)
        for (int64_t j = s[k].r0; j < s[k].r0 + s[k].n; j++, i++) {
            size_t src = t->ndim == 1 ? (size_t)j : (size_t)(j * t->stride[0]);  /* 3-D: rs */
            memcpy(p + (size_t)i * rs * es, (const char *)t->data + src * es, (size_t)rs * es);
            if (t->qbits) {
                memcpy(p + data + (size_t)i * gb, (const char *)t->qscales + (size_t)j * gb, gb);
                if (t->qbiases)
                    memcpy(p + data + aux + (size_t)i * gb, (const char *)t->qbiases + (size_t)j * gb, gb);
            }
        }
    *dst = *t;
    dst->data = p;
    dst->shape[0] = n;
    if (t->ndim >= 2)
        dst->stride[0] = rs;
    dst->stride[t->ndim - 1] = 1;
    if (t->qbits) {
        dst->qscales = p + data;
        dst->qbiases = t->qbiases ? p + data + aux : NULL;
    }
    return 0;
}

/* dst = an owned contiguous copy of rows [r0, r0 + n) of the 2-D t (a 1-D t: its elements). */
static int copy_rows(struct model *rm, struct tensor *dst, const struct tensor *t, int64_t r0, int64_t n,
                     struct err *e)
{
    struct seg s = {r0, n};
    return copy_segs(rm, dst, t, &s, 1, e);
}

/* Whether columns [c0, c0 + n) of the 2-D t can be copied alone (quantized: whole groups). */
static bool cols_ok(const struct tensor *t, int64_t c0, int64_t n)
{
    if (!tensor_is_present(t))
        return true;
    if (t->ndim != 2 || !inner_contiguous(t) || c0 < 0 || n <= 0 || c0 + n > t->shape[1])
        return false;
    return !t->qbits || (c0 % t->qgroup == 0 && n % t->qgroup == 0 && (t->qgroup * t->qbits) % 32 == 0);
}

/* dst = an owned contiguous copy of columns [c0, c0 + n) of the 2-D t (cols_ok). */
static int copy_cols(struct model *rm, struct tensor *dst, const struct tensor *t, int64_t c0, int64_t n,
                     struct err *e)
{
    if (!cols_ok(t, c0, n))
        return err_setf(e, ERR_FORMAT, "tensor parallel: cannot take columns %lld..%lld of %s",
                        (long long)c0, (long long)(c0 + n), t->name ? t->name : "?");
    size_t es = dtype_size(t->dtype), R = (size_t)t->shape[0];
    int64_t w0 = t->qbits ? c0 * t->qbits / 32 : c0, nw = t->qbits ? n * t->qbits / 32 : n;
    size_t qs = t->qbits ? dtype_size(t->qsdtype) : 0;
    int64_t G = t->qbits ? t->shape[1] / t->qgroup : 0, g0 = t->qbits ? c0 / t->qgroup : 0,
            ng = t->qbits ? n / t->qgroup : 0;
    size_t data = R * (size_t)nw * es, aux = R * (size_t)ng * qs;
    char *p;
    int rc = model_alloc_owned(rm, data + (t->qbiases ? 2 : 1) * aux, (void **)&p, e);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < R; i++) {
        memcpy(p + i * (size_t)nw * es, (const char *)t->data + ((size_t)i * (size_t)t->stride[0] + (size_t)w0) * es,
               (size_t)nw * es);
        if (t->qbits) {
            memcpy(p + data + i * (size_t)ng * qs, (const char *)t->qscales + (i * (size_t)G + (size_t)g0) * qs,
                   (size_t)ng * qs);
            if (t->qbiases)
                memcpy(p + data + aux + i * (size_t)ng * qs,
                       (const char *)t->qbiases + (i * (size_t)G + (size_t)g0) * qs, (size_t)ng * qs);
        }
    }
    *dst = *t;
    dst->data = p;
    dst->shape[1] = n;
    dst->stride[0] = nw;
    dst->stride[1] = 1;
    if (t->qbits) {
        dst->qscales = p + data;
        dst->qbiases = t->qbiases ? p + data + aux : NULL;
    }
    return 0;
}

/* rows of t in place (absent: nothing) */
static int take_rows(struct model *rm, struct tensor *t, int64_t r0, int64_t n, struct err *e)
{
    return tensor_is_present(t) ? copy_rows(rm, t, t, r0, n, e) : 0;
}

/* segments' rows of t in place (absent: nothing) */
static int take_segs(struct model *rm, struct tensor *t, const struct seg *s, int ns, struct err *e)
{
    struct tensor v = *t;
    return tensor_is_present(t) ? copy_segs(rm, t, &v, s, ns, e) : 0;
}

static int take_cols(struct model *rm, struct tensor *t, int64_t c0, int64_t n, struct err *e)
{
    return tensor_is_present(t) ? copy_cols(rm, t, t, c0, n, e) : 0;
}

/* A mixer's output projection (ssm_out): columns [c0, c0 + n); its bias on rank 0 alone. */
static int take_out(struct model *rm, struct layer *L, int r, int64_t c0, int64_t n, int rc, struct err *e)
{
    if (rc == 0)
        rc = take_cols(rm, &L->ssm_out, c0, n, e);
    if (r > 0)
        memset(&L->ssm_out_b, 0, sizeof L->ssm_out_b);
    return rc;
}

/* rows [r0, r0 + n) of each of the k tensors ts in place, while rc is 0 */
static int take_rows_of(struct model *rm, struct tensor *const *ts, size_t k, int64_t r0, int64_t n, int rc,
                        struct err *e)
{
    for (size_t i = 0; i < k && rc == 0; i++)
        rc = take_rows(rm, ts[i], r0, n, e);
    return rc;
}

/* ---- the plan: which blocks split ---- */

struct rank_plan {
    int n, r;
    bool attn;     /* attention split by heads ... */
    bool latent;   /* ... latent attention's way */
    bool mamba2;   /* Mamba-2 mixers split by heads */
    bool deltanet; /* gated DeltaNet mixers split by value heads */
    bool shortconv;/* short convolutions split by channels */
    bool mamba;    /* Mamba's mixers split by channels */
    bool rglru;    /* Griffin's recurrent blocks split by heads */
    bool head;     /* the LM head's rows [v0, v0 + nv) */
    bool qk_full;  /* the layer being split has a q / k norm over the whole width */
    int64_t v0, nv;
};


static bool is_attention(const struct layer_spec *ls)
{
    return ls->mixer == MIXER_ATTENTION && (ls->kv == KV_FULL || ls->kv == KV_SLIDING);
}

static bool is_latent(const struct layer_spec *ls)
{
    return ls->mixer == MIXER_ATTENTION && ls->kv == KV_LATENT;
}

/* Latent (MLA) attention splits when every attention layer is latent: the rank's heads'
 * per-head products (mla_heads), o's columns of their values; the latent row (wkv_a, its
 * norm) and q's low-rank input (wq_a) replicated, so each rank caches the same latent rows
 * (vLLM's replicated latent cache). */
static bool latent_splits(const struct model *m, int n)
{
    const struct hparams *hp = &m->hp;
    int H = hp->n_head, any = 0;
    if (H <= 0 || H % n != 0)
        return false;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        const struct layer *L = &m->layers[il];
        if (is_attention(ls))
            return false;
        if (!is_latent(ls))
            continue;
        any = 1;
        if (!L->mla_heads || !tensor_is_present(&L->wo) || !cols_ok(&L->wo, 0, (int64_t)(H / n) * hp->v_head_dim))
            return false;
    }
    return any;
}

/* Per-head tensors (norm weights, sinks) a head split reads as [n_head, ...] or one [head_dim]
 * for every head: the heads' rows, or the tensor as it is. */
static int64_t heads_of(const struct tensor *t, int n_head, int head_dim)
{
    if (!tensor_is_present(t))
        return 0;
    int64_t n = tensor_nelem(t);
    return n == (int64_t)n_head * head_dim || n == n_head ? n_head : 0;
}

/* Attention splits when every attention layer of m does: n_head and n_kv_head divide (or are
 * divided by) n, no norm over the whole q / k width, o's columns of a rank whole groups. */
static bool attn_splits(const struct model *m, int n)
{
    const struct hparams *hp = &m->hp;
    int H = hp->n_head, KV = hp->n_kv_head, hd = hp->head_dim, any = 0;
    if (H <= 0 || KV <= 0 || H % n != 0 || (KV % n != 0 && n % KV != 0) || H % KV != 0)
        return false;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        const struct layer *L = &m->layers[il];
        if (is_latent(ls))
            return false;  /* latent layers split their own way (latent_splits) */
        if (!is_attention(ls))
            continue;
        any = 1;
        /* a norm over the whole q / k width: RMS over rows gathered from the ranks */
        if (ls->qk_norm && ls->qk_norm_full && hp->norm != NORM_RMS)
            return false;
        int64_t cols = (int64_t)(H / n) * hd;
        if (!cols_ok(&L->wo, 0, cols) || !tensor_is_present(&L->wo))
            return false;
        /* per-head norms: one weight for every head, or one per head */
        if (ls->qk_norm && tensor_is_present(&L->q_norm) && tensor_nelem(&L->q_norm) != hd &&
            !heads_of(&L->q_norm, H, hd))
            return false;
        if (ls->qk_norm && tensor_is_present(&L->k_norm) && tensor_nelem(&L->k_norm) != hd &&
            !heads_of(&L->k_norm, KV, hd))
            return false;
    }
    return any;
}

/* Whether the mixers of kind k split over n ranks: there is one, and every one passes ok (hp.ssm
 * is the model's, so they split together or not at all). */
static bool mixers_split(const struct model *m, enum mixer_kind k, int n,
                         bool (*ok)(const struct hparams *hp, const struct layer *L, int n))
{
    int any = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->hp.layer[il].mixer != k)
            continue;
        any = 1;
        if (!ok(&m->hp, &m->layers[il], n))
            return false;
    }
    return any;
}

/* Mamba-2 mixers split by heads when every one does (hp.ssm is the model's): heads divide,
 * B/C groups divide (or each rank takes the one group of its heads, as KV heads), the gated
 * norm's groups divide (one group: the rows gathered for it, model_tp_rmsnorm_full), ssm_out's
 * columns of a rank whole quantization groups. */
static bool mamba2_layer_ok(const struct hparams *hp, const struct layer *L, int n)
{
    int H = hp->ssm.n_head, G = hp->ssm.n_group, NG = hp->ssm.norm_groups;
    return H > 0 && G > 0 && H % n == 0 && H % G == 0 && (G % n == 0 || n % G == 0) &&
           (hp->ssm.norm_off || (NG > 0 && (NG == 1 || NG % n == 0))) &&
           hp->ssm.d_inner == H * hp->ssm.head_dim && tensor_is_present(&L->ssm_in) && L->ssm_in.ndim == 2 &&
           L->ssm_conv.ndim == 2 && cols_ok(&L->ssm_out, 0, hp->ssm.d_inner / n);
}

/* Rank p->r's heads of a Mamba-2 mixer: the input projection's z | x | B | C | dt rows of
 * them (B / C: their groups), the convolution's x | B | C channels, A, D, dt bias and the
 * norm weight of them, ssm_out's columns (its bias on rank 0). */
static int split_mamba2(struct model *rm, struct layer *L, const struct hparams *hp, const struct rank_plan *p,
                        struct err *e)
{
    int64_t H = hp->ssm.n_head, hd = hp->ssm.head_dim, ds = hp->ssm.d_state, G = hp->ssm.n_group;
    int64_t di = hp->ssm.d_inner, gn = G * ds, n = p->n, r = p->r;
    int64_t Hr = H / n, h0 = r * Hr, Gr = G >= n ? G / n : 1, g0 = G >= n ? r * Gr : r / (n / G);
    int64_t dr = Hr * hd, c0 = h0 * hd;
    struct seg in[5] = {{c0, dr}, {di + c0, dr}, {2 * di + g0 * ds, Gr * ds}, {2 * di + gn + g0 * ds, Gr * ds},
                        {2 * di + 2 * gn + h0, Hr}};
    struct seg cv[3] = {{c0, dr}, {di + g0 * ds, Gr * ds}, {di + gn + g0 * ds, Gr * ds}};
    int rc = take_segs(rm, &L->ssm_in, in, 5, e);
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_in_b, in, 5, e);
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_conv, cv, 3, e);
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_conv_b, cv, 3, e);
    struct tensor *heads[] = {&L->ssm_a, &L->ssm_d, &L->ssm_dt_b};
    rc = take_rows_of(rm, heads, 3, h0, Hr, rc, e);
    if (rc == 0 && hp->ssm.norm_groups != 1)   /* one group: the whole weight (gathered rows) */
        rc = take_rows(rm, &L->ssm_norm, c0, dr, e);
    return take_out(rm, L, r, c0, dr, rc, e);
}

/* Gated DeltaNet mixers split by value heads when every one does: value heads divide, key
 * heads divide (or each rank takes the one key head of its value heads), ssm_out's columns of a
 * rank whole quantization groups; the norm weight is one per value head's width (shared). */
static bool deltanet_layer_ok(const struct hparams *hp, const struct layer *L, int n)
{
    int nk = hp->ssm.n_group, nv = hp->ssm.n_head;
    return nk > 0 && nv > 0 && nv % nk == 0 && nv % n == 0 && (nk % n == 0 || n % nk == 0) &&
           L->ssm_conv.ndim == 2 && tensor_nelem(&L->ssm_norm) == hp->ssm.head_dim &&
           cols_ok(&L->ssm_out, 0, (int64_t)(nv / n) * hp->ssm.head_dim);
}

/* Rank p->r's value heads of a DeltaNet mixer and their key heads: q | k | v rows of the input
 * projection and channels of the convolution, z, b and a rows, A_log and dt bias, ssm_out's
 * columns. */
static int split_deltanet(struct model *rm, struct layer *L, const struct hparams *hp, const struct rank_plan *p,
                          struct err *e)
{
    int64_t nk = hp->ssm.n_group, nv = hp->ssm.n_head, dk = hp->ssm.k_head_dim, dv = hp->ssm.head_dim;
    int64_t n = p->n, r = p->r, nvr = nv / n, v0 = r * nvr;
    int64_t nkr = nk >= n ? nk / n : 1, k0 = nk >= n ? r * nkr : r / (n / nk);
    struct seg in[3] = {{k0 * dk, nkr * dk}, {nk * dk + k0 * dk, nkr * dk}, {2 * nk * dk + v0 * dv, nvr * dv}};
    int rc = take_segs(rm, &L->ssm_in, in, 3, e);
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_conv, in, 3, e);
    if (rc == 0)
        rc = take_rows(rm, &L->ssm_z, v0 * dv, nvr * dv, e);
    struct tensor *heads[] = {&L->ssm_x, &L->ssm_xa, &L->ssm_a, &L->ssm_dt_b};  /* b, a, A_log, dt bias */
    rc = take_rows_of(rm, heads, 4, v0, nvr, rc, e);
    return take_out(rm, L, (int)r, v0 * dv, nvr * dv, rc, e);
}

/* LFM2's short convolutions split by channels when every one does: the B | C | x rows of
 * the rank's channels, their convolution, out_proj's columns. */
static bool shortconv_layer_ok(const struct hparams *hp, const struct layer *L, int n)
{
    int d = hp->n_embd;
    return d % n == 0 && L->ssm_conv.ndim == 2 && L->ssm_conv.shape[0] == d && cols_ok(&L->ssm_out, 0, d / n);
}

static int split_shortconv(struct model *rm, struct layer *L, const struct hparams *hp, const struct rank_plan *p,
                           struct err *e)
{
    int64_t d = hp->n_embd, dr = d / p->n, c0 = p->r * dr;
    struct seg in[3] = {{c0, dr}, {d + c0, dr}, {2 * d + c0, dr}};
    int rc = take_segs(rm, &L->ssm_in, in, 3, e);
    struct tensor *rows[] = {&L->ssm_conv, &L->ssm_conv_b};
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_in_b, in, 3, e);
    rc = take_rows_of(rm, rows, 2, c0, dr, rc, e);
    return take_out(rm, L, p->r, c0, dr, rc, e);
}

/* Mamba's mixers split by channels when every one does: x / z rows and the convolution of
 * the rank's channels, x_proj's columns of them (its dt / B / C partial sums all-reduced, then
 * every rank holds them whole), dt_proj's rows, A and D of them, out_proj's columns. */
static bool mamba_layer_ok(const struct hparams *hp, const struct layer *L, int n)
{
    int di = hp->ssm.d_inner;
    return di % n == 0 && hp->ssm.dt_rank <= hp->n_embd && 2 * hp->ssm.d_state <= hp->n_embd &&
           L->ssm_conv.ndim == 2 && L->ssm_a.ndim == 2 && cols_ok(&L->ssm_x, 0, di / n) &&
           cols_ok(&L->ssm_xbc, 0, di / n) && cols_ok(&L->ssm_out, 0, di / n);
}

static int split_mamba(struct model *rm, struct layer *L, const struct hparams *hp, const struct rank_plan *p,
                       struct err *e)
{
    int64_t di = hp->ssm.d_inner, dr = di / p->n, c0 = p->r * dr;
    struct seg in[2] = {{c0, dr}, {di + c0, dr}};
    int rc = take_segs(rm, &L->ssm_in, in, 2, e);
    if (rc == 0)
        rc = take_segs(rm, &L->ssm_in_b, in, 2, e);
    struct tensor *rows[] = {&L->ssm_conv, &L->ssm_conv_b, &L->ssm_dt, &L->ssm_dt_b, &L->ssm_a, &L->ssm_d};
    rc = take_rows_of(rm, rows, 6, c0, dr, rc, e);
    if (rc == 0)   /* x_proj: its dt / B / C products' columns of the rank's channels */
        rc = take_cols(rm, &L->ssm_x, c0, dr, e);
    if (rc == 0)
        rc = take_cols(rm, &L->ssm_xbc, c0, dr, e);
    return take_out(rm, L, p->r, c0, dr, rc, e);
}

/* Griffin's recurrent blocks (RecurrentGemma) split by heads when every one does: linear_y and
 * linear_x rows, the convolution's channels, the per-head gates, a, linear_out's columns. */
static bool rglru_layer_ok(const struct hparams *hp, const struct layer *L, int n)
{
    int w = hp->ssm.d_inner, H = hp->ssm.n_head;
    return H > 0 && H % n == 0 && w % H == 0 && L->ssm_conv.ndim == 2 && L->rg_wi.ndim == 3 &&
           L->rg_wa.ndim == 3 && cols_ok(&L->ssm_out, 0, w / n);
}

static int split_rglru(struct model *rm, struct layer *L, const struct hparams *hp, const struct rank_plan *p,
                       struct err *e)
{
    int64_t w = hp->ssm.d_inner, H = hp->ssm.n_head, Hr = H / p->n, h0 = p->r * Hr, bw = w / H;
    int64_t c0 = h0 * bw, dr = Hr * bw;
    int rc = 0;
    struct tensor *chans[] = {&L->rg_y, &L->rg_y_b, &L->ssm_in, &L->ssm_in_b, &L->ssm_conv, &L->ssm_conv_b, &L->rg_a};
    struct tensor *heads[] = {&L->rg_wi, &L->rg_bi, &L->rg_wa, &L->rg_ba};
    rc = take_rows_of(rm, chans, 7, c0, dr, rc, e);
    rc = take_rows_of(rm, heads, 4, h0, Hr, rc, e);
    return take_out(rm, L, p->r, c0, dr, rc, e);
}

static bool down_splits(const struct tensor *down, int n_ff, int n)
{
    if (!tensor_is_present(down) || n_ff % n != 0)
        return false;
    int64_t c = n_ff / n;
    return cols_ok(down, 0, c) && (!down->qbits || c % down->qgroup == 0);
}

/* Whether layer il's FFN splits over n ranks: every part's width divides into whole groups. */
static bool ffn_splits(const struct model *m, int il, int n)
{
    const struct layer_spec *ls = &m->hp.layer[il];
    const struct layer *L = &m->layers[il];
    if (ls->moe) {
        if (!L->ex.down.w || !down_splits(&L->ex.down.w[0], ls->n_ff, n))
            return false;
        if (ls->n_ff_shexp > 0 && !down_splits(&L->shexp_down, ls->n_ff_shexp, n))
            return false;
        return true;
    }
    if (ls->ffn == FFN_NONE)
        return false;
    return down_splits(&L->down, ls->n_ff, n);
}

/* ---- a rank's model ---- */


static int split_attention(struct model *rm, struct layer *L, const struct hparams *hp,
                           const struct rank_plan *p, struct err *e)
{
    int H = hp->n_head, KV = hp->n_kv_head, hd = hp->head_dim, n = p->n, r = p->r;
    int Hr = H / n, kv0, nkv;
    if (KV >= n) {
        nkv = KV / n;
        kv0 = r * nkv;
    } else {
        nkv = 1;
        kv0 = r / (n / KV);
    }
    int64_t q0 = (int64_t)r * Hr * hd, qn = (int64_t)Hr * hd, k0 = (int64_t)kv0 * hd, kn = (int64_t)nkv * hd;
    int rc;
    if (tensor_is_present(&L->wqkv)) {
        /* fused q | k | v rows: taken apart, each part's rank rows */
        struct tensor qkv = L->wqkv, bqkv = L->bqkv;
        if ((rc = copy_rows(rm, &L->wq, &qkv, q0, qn, e)) < 0 ||
            (rc = copy_rows(rm, &L->wk, &qkv, (int64_t)H * hd + k0, kn, e)) < 0 ||
            (rc = copy_rows(rm, &L->wv, &qkv, (int64_t)(H + KV) * hd + k0, kn, e)) < 0)
            return rc;
        if (tensor_is_present(&bqkv) &&
            ((rc = copy_rows(rm, &L->bq, &bqkv, q0, qn, e)) < 0 ||
             (rc = copy_rows(rm, &L->bk, &bqkv, (int64_t)H * hd + k0, kn, e)) < 0 ||
             (rc = copy_rows(rm, &L->bv, &bqkv, (int64_t)(H + KV) * hd + k0, kn, e)) < 0))
            return rc;
        memset(&L->wqkv, 0, sizeof L->wqkv);
        memset(&L->bqkv, 0, sizeof L->bqkv);
    } else if ((rc = take_rows(rm, &L->wq, q0, qn, e)) < 0 || (rc = take_rows(rm, &L->bq, q0, qn, e)) < 0 ||
               (rc = take_rows(rm, &L->wk, k0, kn, e)) < 0 || (rc = take_rows(rm, &L->bk, k0, kn, e)) < 0 ||
               (rc = take_rows(rm, &L->wv, k0, kn, e)) < 0 || (rc = take_rows(rm, &L->bv, k0, kn, e)) < 0) {
        return rc;
    }
    if ((rc = take_rows(rm, &L->wq_gate, q0, qn, e)) < 0)
        return rc;
    /* per-head weights: the rank's heads' rows (a weight shared by every head stays; a norm
     * over the whole width keeps its whole weight: model_tp_rmsnorm_full) */
    if (!p->qk_full && heads_of(&L->q_norm, H, hd) && tensor_nelem(&L->q_norm) != hd) {
        int64_t per = tensor_nelem(&L->q_norm) / H;
        struct tensor t = L->q_norm;
        if (t.ndim == 2)
            rc = copy_rows(rm, &L->q_norm, &t, (int64_t)r * Hr, Hr, e);
        else
            rc = copy_rows(rm, &L->q_norm, &t, (int64_t)r * Hr * per, (int64_t)Hr * per, e);
        if (rc < 0)
            return rc;
    }
    if (!p->qk_full && heads_of(&L->k_norm, KV, hd) && tensor_nelem(&L->k_norm) != hd) {
        int64_t per = tensor_nelem(&L->k_norm) / KV;
        struct tensor t = L->k_norm;
        if (t.ndim == 2)
            rc = copy_rows(rm, &L->k_norm, &t, kv0, nkv, e);
        else
            rc = copy_rows(rm, &L->k_norm, &t, (int64_t)kv0 * per, (int64_t)nkv * per, e);
        if (rc < 0)
            return rc;
    }
    if ((rc = take_rows(rm, &L->sinks, (int64_t)r * Hr, Hr, e)) < 0 || (rc = take_cols(rm, &L->wo, q0, qn, e)) < 0)
        return rc;
    if (r > 0)
        memset(&L->bo, 0, sizeof L->bo);
    return 0;
}

/* One expert_linear's views (rows or columns [a, a + n) of each of the E experts), its
 * biases' rows or (drop) none. */
static int split_experts(struct model *rm, struct expert_linear *el, int E, bool cols, int64_t a, int64_t n,
                         bool drop_b, struct err *e)
{
    int rc;
    for (int x = 0; el->w && x < E; x++)
        if ((rc = cols ? take_cols(rm, &el->w[x], a, n, e) : take_rows(rm, &el->w[x], a, n, e)) < 0)
            return rc;
    if (el->b && drop_b)
        el->b = NULL;
    else
        for (int x = 0; el->b && !cols && x < E; x++)
            if ((rc = take_rows(rm, &el->b[x], a, n, e)) < 0)
                return rc;
    return 0;
}

static int split_ffn(struct model *rm, struct layer *L, struct layer_spec *ls, int E, const struct rank_plan *p,
                     struct err *e)
{
    int n = p->n, r = p->r, rc;
    if (ls->moe) {
        int64_t fr = ls->n_ff / n, j0 = (int64_t)r * fr;
        struct experts *x = &L->ex;
        if ((rc = split_experts(rm, &x->up, E, false, j0, fr, false, e)) < 0 ||
            (rc = split_experts(rm, &x->gate, E, false, j0, fr, false, e)) < 0 ||
            (rc = split_experts(rm, &x->gate_up, E, false, 2 * j0, 2 * fr, false, e)) < 0 ||
            (rc = split_experts(rm, &x->down, E, true, j0, fr, r > 0, e)) < 0)
            return rc;
        ls->n_ff = (int)fr;
        if (ls->n_ff_shexp > 0) {
            int64_t sr = ls->n_ff_shexp / n, s0 = (int64_t)r * sr;
            if ((rc = take_rows(rm, &L->shexp_gate, s0, sr, e)) < 0 ||
                (rc = take_rows(rm, &L->shexp_up, s0, sr, e)) < 0 ||
                (rc = take_cols(rm, &L->shexp_down, s0, sr, e)) < 0)
                return rc;
            ls->n_ff_shexp = (int)sr;
        }
        return 0;
    }
    int64_t fr = ls->n_ff / n, j0 = (int64_t)r * fr;
    if (tensor_is_present(&L->gate_up)) {
        /* Phi-3's fused rows: [0, n_ff) the gate, [n_ff, 2 n_ff) the up */
        struct tensor gu = L->gate_up;
        if ((rc = copy_rows(rm, &L->gate, &gu, j0, fr, e)) < 0 ||
            (rc = copy_rows(rm, &L->up, &gu, ls->n_ff + j0, fr, e)) < 0)
            return rc;
        memset(&L->gate_up, 0, sizeof L->gate_up);
    } else if ((rc = take_rows(rm, &L->gate, j0, fr, e)) < 0 || (rc = take_rows(rm, &L->up, j0, fr, e)) < 0) {
        return rc;
    }
    if ((rc = take_rows(rm, &L->gate_b, j0, fr, e)) < 0 || (rc = take_rows(rm, &L->up_b, j0, fr, e)) < 0 ||
        (rc = take_cols(rm, &L->down, j0, fr, e)) < 0)
        return rc;
    if (r > 0)
        memset(&L->down_b, 0, sizeof L->down_b);
    ls->n_ff = (int)fr;
    return 0;
}

/* Rank r's model: m's views, its own arrays of them, the split blocks' shares. */
static int rank_model(const struct model *m, const struct rank_plan *p, const bool *ffn_split,
                      struct model **out, struct err *e)
{
    struct model *rm = calloc(1, sizeof *rm);
    int rc = 0;
    *out = rm;
    if (!rm)
        return err_setf(e, ERR_NOMEM, "tensor parallel: out of memory");
    *rm = *m;
    rm->st = NULL;
    rm->prepared = NULL;
    rm->n_prepared = rm->cap_prepared = 0;
    rm->vision = NULL;
    rm->derived = NULL;
    rm->owned = NULL;
    rm->n_owned = 0;
    rm->tp = NULL;
    memset(&rm->hp.quant, 0, sizeof rm->hp.quant);
    rm->layers = NULL;
    rm->expert_views = NULL;
    int nl = m->hp.n_layer;
    rm->layers = malloc((size_t)nl * sizeof *rm->layers);
    rm->expert_views = m->n_expert_views ? malloc(m->n_expert_views * sizeof *rm->expert_views) : NULL;
    if (!rm->layers || (m->n_expert_views && !rm->expert_views))
        return err_setf(e, ERR_NOMEM, "tensor parallel: out of memory");
    memcpy(rm->layers, m->layers, (size_t)nl * sizeof *rm->layers);
    if (m->n_expert_views)
        memcpy(rm->expert_views, m->expert_views, m->n_expert_views * sizeof *rm->expert_views);
    for (int il = 0; il < nl && rc == 0; il++) {
        struct layer *L = &rm->layers[il];
        struct layer_spec *ls = &rm->hp.layer[il];
        /* the expert arrays: this model's copies of the views */
        struct expert_linear *els[] = {&L->ex.up, &L->ex.gate, &L->ex.down, &L->ex.gate_up};
        for (size_t k = 0; k < 4; k++) {
            if (els[k]->w)
                els[k]->w = rm->expert_views + (els[k]->w - m->expert_views);
            if (els[k]->b)
                els[k]->b = rm->expert_views + (els[k]->b - m->expert_views);
        }
        if (L->mla_heads) {
            /* this model's views of them: the rank's heads' when latent attention splits */
            struct tensor *h;
            int H = m->hp.n_head, h0 = p->attn && is_latent(ls) ? p->r * (H / p->n) : 0;
            size_t nh = 4 * (size_t)(p->attn && is_latent(ls) ? H / p->n : H);
            if ((rc = model_alloc_owned(rm, nh * sizeof *h, (void **)&h, e)) < 0)
                break;
            memcpy(h, L->mla_heads + 4 * (size_t)h0, nh * sizeof *h);
            L->mla_heads = h;
        }
        ls->tp_mix = p->attn && (is_attention(ls) || is_latent(ls));
        ls->tp_ffn = ffn_split[il];
        if (ls->tp_mix && is_latent(ls)) {
            int Hr = m->hp.n_head / p->n, vd = m->hp.v_head_dim;
            rc = take_cols(rm, &L->wo, (int64_t)p->r * Hr * vd, (int64_t)Hr * vd, e);
            if (p->r > 0)
                memset(&L->bo, 0, sizeof L->bo);
        } else if (ls->tp_mix) {
            struct rank_plan pl = *p;
            pl.qk_full = ls->qk_norm && ls->qk_norm_full;
            rc = split_attention(rm, L, &m->hp, &pl, e);
        } else if (p->mamba2 && ls->mixer == MIXER_MAMBA2) {
            ls->tp_mix = true;
            rc = split_mamba2(rm, L, &m->hp, p, e);
        } else if (p->deltanet && ls->mixer == MIXER_DELTANET) {
            ls->tp_mix = true;
            rc = split_deltanet(rm, L, &m->hp, p, e);
        } else if (p->rglru && ls->mixer == MIXER_RGLRU) {
            ls->tp_mix = true;
            ls->state_conv /= p->n;
            ls->state_rec /= p->n;
            rc = split_rglru(rm, L, &m->hp, p, e);
        } else if (p->mamba && ls->mixer == MIXER_MAMBA) {
            ls->tp_mix = true;
            ls->state_conv /= p->n;
            ls->state_rec /= p->n;
            rc = split_mamba(rm, L, &m->hp, p, e);
        } else if (p->shortconv && ls->mixer == MIXER_SHORTCONV) {
            ls->tp_mix = true;
            ls->state_conv /= p->n;
            rc = split_shortconv(rm, L, &m->hp, p, e);
        }
        if (rc == 0 && ls->tp_ffn)
            rc = split_ffn(rm, L, ls, m->hp.n_expert, p, e);
    }
    if (rc == 0 && p->head)
        rc = copy_rows(rm, &rm->lm_head, &m->lm_head, p->v0, p->nv, e);
    if (rc == 0 && p->head && tensor_is_present(&m->lm_head_b))
        rc = copy_rows(rm, &rm->lm_head_b, &m->lm_head_b, p->v0, p->nv, e);
    if (rc < 0)
        return rc;
    if (p->mamba2) {   /* the rank's share of the mixers' sizes and states */
        const struct hparams *hp = &m->hp;
        int n = p->n, G = hp->ssm.n_group;
        struct hparams *rh = &rm->hp;
        rh->ssm.n_head = hp->ssm.n_head / n;
        rh->ssm.d_inner = rh->ssm.n_head * hp->ssm.head_dim;
        rh->ssm.n_group = G >= n ? G / n : 1;
        if (!hp->ssm.norm_off && hp->ssm.norm_groups == 1)
            rh->ssm.tp_norm_full = true;
        else if (!hp->ssm.norm_off)
            rh->ssm.norm_groups = hp->ssm.norm_groups / n;
        for (int il = 0; il < hp->n_layer; il++) {
            struct layer_spec *ls = &rh->layer[il];
            if (ls->mixer != MIXER_MAMBA2)
                continue;
            ls->state_conv = (hp->ssm.d_conv - 1) * (rh->ssm.d_inner + 2 * rh->ssm.n_group * hp->ssm.d_state);
            ls->state_rec = rh->ssm.d_inner * hp->ssm.d_state;
        }
    }
    if (p->rglru) {
        rm->hp.ssm.d_inner = m->hp.ssm.d_inner / p->n;
        rm->hp.ssm.n_head = m->hp.ssm.n_head / p->n;
    }
    if (p->mamba) {
        rm->hp.ssm.d_inner = m->hp.ssm.d_inner / p->n;
        rm->hp.ssm.tp_reduce_xproj = true;
    }
    if (p->deltanet) {
        const struct hparams *hp = &m->hp;
        int n = p->n, nk = hp->ssm.n_group;
        struct hparams *rh = &rm->hp;
        rh->ssm.n_head = hp->ssm.n_head / n;
        rh->ssm.n_group = nk >= n ? nk / n : 1;
        for (int il = 0; il < hp->n_layer; il++) {
            struct layer_spec *ls = &rh->layer[il];
            if (ls->mixer != MIXER_DELTANET)
                continue;
            ls->state_conv = (hp->ssm.d_conv - 1) *
                             (2 * rh->ssm.n_group * hp->ssm.k_head_dim + rh->ssm.n_head * hp->ssm.head_dim);
            ls->state_rec = rh->ssm.n_head * hp->ssm.k_head_dim * hp->ssm.head_dim;
        }
    }
    if (p->attn) {
        int KV = m->hp.n_kv_head;
        rm->hp.n_head = m->hp.n_head / p->n;
        if (!p->latent)
            rm->hp.n_kv_head = KV >= p->n ? KV / p->n : 1;
    }
    return 0;
}

int model_tp_split(struct model *m, int n_rank, struct err *e)
{
    if (n_rank < 2 || n_rank > TP_MAX_RANKS)
        return err_setf(e, ERR_ARG, "tensor parallel: %d ranks (2 to %d)", n_rank, TP_MAX_RANKS);
    if (m->tp)
        return err_setf(e, ERR_ARG, "tensor parallel: the model is split already");
    if (m->n_prepared > 0)
        return err_setf(e, ERR_ARG, "tensor parallel: split a model before preparing it");
    if (m->ops->forward != decoder_forward && !m->ops->tp_reduces)
        return err_setf(e, ERR_UNSUPPORTED,
                        "tensor parallel: the %s family runs a forward of its own, which does not "
                        "split yet",
                        m->ops->family);
    if (m->vision)
        return err_setf(e, ERR_UNSUPPORTED, "tensor parallel: models with an image tower are not split yet");
    int nl = m->hp.n_layer;
    bool *ffn = calloc((size_t)(nl > 0 ? nl : 1), sizeof *ffn);
    struct model_tp *tp = calloc(1, sizeof *tp);
    if (!ffn || !tp) {
        free(ffn);
        free(tp);
        return err_setf(e, ERR_NOMEM, "tensor parallel: out of memory");
    }
    tp->n_rank = n_rank;
    bool latent = latent_splits(m, n_rank);
    bool rec_mamba2 = mixers_split(m, MIXER_MAMBA2, n_rank, mamba2_layer_ok),
         rec_deltanet = mixers_split(m, MIXER_DELTANET, n_rank, deltanet_layer_ok);
    bool rec_conv = mixers_split(m, MIXER_SHORTCONV, n_rank, shortconv_layer_ok);
    bool rec_mamba = mixers_split(m, MIXER_MAMBA, n_rank, mamba_layer_ok);
    bool rec_rglru = mixers_split(m, MIXER_RGLRU, n_rank, rglru_layer_ok);
    tp->rec_split = rec_mamba2 || rec_deltanet || rec_conv || rec_mamba || rec_rglru;
    tp->attn_split = latent || attn_splits(m, n_rank);
    for (int il = 0; il < nl; il++) {
        ffn[il] = ffn_splits(m, il, n_rank);
        tp->n_ffn_split += ffn[il];
    }
    /* the LM head by vocabulary (a generating model whose head is n_vocab rows): as even as
     * the rows go, the first ranks one row more */
    int V = m->hp.n_vocab;
    tp->head_split = !m->hp.encoder && !m->hp.lm_rerank && tensor_is_present(&m->lm_head) &&
                     m->lm_head.ndim == 2 && m->lm_head.shape[0] == V && V >= n_rank &&
                     inner_contiguous(&m->lm_head);
    for (int r = 0, v = 0; r < n_rank; r++) {
        tp->vocab0[r] = v;
        tp->n_vocab_r[r] = tp->head_split ? V / n_rank + (r < V % n_rank) : V;
        v += tp->n_vocab_r[r];
    }
    int rc = 0;
    for (int r = 0; r < n_rank && rc == 0; r++) {
        struct rank_plan p = {.n = n_rank, .r = r, .attn = tp->attn_split, .latent = latent,
                              .mamba2 = rec_mamba2, .deltanet = rec_deltanet, .shortconv = rec_conv,
                              .mamba = rec_mamba, .rglru = rec_rglru,
                              .head = tp->head_split, .v0 = tp->vocab0[r], .nv = tp->n_vocab_r[r]};
        rc = rank_model(m, &p, ffn, &tp->rank[r], e);
    }
    free(ffn);
    if (rc < 0) {
        model_tp_free(tp);
        return err_prefix(e, "tensor parallel over %d ranks", n_rank);
    }
    m->tp = tp;
    return 0;
}

int model_tp_prepare(struct model *m, struct backend *const *be, struct err *e)
{
    struct model_tp *tp = m->tp;
    if (!tp)
        return err_setf(e, ERR_ARG, "tensor parallel: the model is not split");
    for (int r = 0; r < tp->n_rank; r++) {
        if (!be[r] || strcmp(be[r]->name, be[0]->name) != 0)
            return err_setf(e, ERR_UNSUPPORTED,
                            "tensor parallel: rank %d's backend is %s, rank 0's %s: the in-process "
                            "all-reduce needs ranks of one kind (CPU ranks, or CUDA ranks on one GPU; "
                            "NCCL ranks on several GPUs are not built yet)", r, be[r] ? be[r]->name : "none",
                            be[0] ? be[0]->name : "none");
        for (int q = 0; q < r; q++)
            if (be[q] == be[r])
                return err_setf(e, ERR_ARG, "tensor parallel: ranks %d and %d share a backend", q, r);
    }
    for (int r = 0; r < tp->n_rank; r++) {
        int rc = model_prepare(tp->rank[r], be[r], e);
        if (rc < 0)
            return err_prefix(e, "tensor parallel rank %d", r);
        tp->be[r] = be[r];
    }
    return 0;
}

void model_tp_free(struct model_tp *tp)
{
    if (!tp)
        return;
    for (int r = 0; r < tp->n_rank; r++)
        model_free(tp->rank[r]);
    free(tp);
}

/* ---- contexts, the forward and the all-reduce ---- */

struct tp_peer {
    struct tp_group *g;
    int rank;
    float *sum;         /* [n_batch, n_embd] this rank's sum, before it overwrites its partial
                         * (its backend's memory) */
    float *full;        /* [n_batch, gather width] rows gathered from every rank (backend memory) */
    float *zeros;       /* as many zeros */
    int rc;             /* the first error a sync inside the forward returned, in err */
    struct err err;
};

struct rank_job {
    struct model_ctx *c;
    struct fwd_chunk ch;
    struct err e;
    int rc;
};

/* Ranks 1.. run on threads of their own, started with the context: a forward hands each its
 * job (a new generation under mu), rank 0 runs on the caller's thread, and the caller waits
 * until every rank is done. */
struct tp_group {
    int n;
    int n_kv_head;                     /* the unsplit model's */
    struct model_ctx *rank[TP_MAX_RANKS];
    struct tp_peer peer[TP_MAX_RANKS];
    struct rank_job job[TP_MAX_RANKS];
    pthread_barrier_t bar;
    bool bar_ok, mu_ok;
    const float *part[TP_MAX_RANKS];   /* the partials of the all-reduce under way */
    pthread_t th[TP_MAX_RANKS];
    int n_threads;                     /* started: ranks 1 .. n_threads */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long gen;                 /* jobs handed out */
    int n_done;                        /* ranks past the current generation's job */
    bool quit;
};

static void *rank_loop(void *arg)
{
    struct tp_peer *p = arg;
    struct tp_group *g = p->g;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->quit && g->gen == seen)
            pthread_cond_wait(&g->go, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        struct rank_job *j = &g->job[p->rank];
        j->rc = j->c->m->ops->forward(j->c, &j->ch, &j->e);
        pthread_mutex_lock(&g->mu);
        if (++g->n_done == g->n - 1)
            pthread_cond_signal(&g->done);
        pthread_mutex_unlock(&g->mu);
    }
}

/* Floats per row the whole-row norms of split model m gather (0: none): Mamba-2's inner
 * width, OLMo 2's q and k. */
static size_t gather_width(const struct model *m)
{
    const struct hparams *hp = &m->hp;
    size_t w = 0;
    if (m->tp->rank[0]->hp.ssm.tp_norm_full)
        w = (size_t)hp->ssm.d_inner;
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].qk_norm_full && m->tp->attn_split) {
            size_t q = (size_t)hp->n_head * hp->head_dim, k = (size_t)hp->n_kv_head * hp->head_dim;
            w = w > q ? w : q;
            w = w > k ? w : k;
        }
    return w;
}

int model_tp_ctx_new(struct model_ctx *c, struct err *e)
{
    const struct model_tp *tp = c->m->tp;
    if (!tp->be[0])
        return err_setf(e, ERR_ARG, "tensor parallel: the model's ranks are not prepared (model_tp_prepare)");
    struct tp_group *g = calloc(1, sizeof *g);
    if (!g)
        return err_setf(e, ERR_NOMEM, "tensor parallel: out of memory");
    c->tp = g;
    g->n = tp->n_rank;
    g->n_kv_head = c->m->hp.n_kv_head;
    if (pthread_barrier_init(&g->bar, NULL, (unsigned)g->n) != 0)
        return err_setf(e, ERR_NOMEM, "tensor parallel: no barrier for %d ranks", g->n);
    g->bar_ok = true;
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        return err_setf(e, ERR_NOMEM, "tensor parallel: no mutex");
    if (pthread_cond_init(&g->go, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        return err_setf(e, ERR_NOMEM, "tensor parallel: no condition variable");
    }
    if (pthread_cond_init(&g->done, NULL) != 0) {
        pthread_cond_destroy(&g->go);
        pthread_mutex_destroy(&g->mu);
        return err_setf(e, ERR_NOMEM, "tensor parallel: no condition variable");
    }
    g->mu_ok = true;
    size_t d = (size_t)c->m->hp.n_embd;
    for (int r = 0; r < g->n; r++) {
        int rc = model_ctx_new(&g->rank[r], tp->rank[r], tp->be[r], c->n_batch, e);
        if (rc < 0)
            return err_prefix(e, "tensor parallel rank %d", r);
        g->peer[r] = (struct tp_peer){.g = g, .rank = r};
        if ((rc = tp->be[r]->ops->buf_alloc(tp->be[r], (size_t)c->n_batch * d * sizeof(float),
                                            (void **)&g->peer[r].sum, e)) < 0)
            return err_prefix(e, "tensor parallel rank %d's all-reduce buffer", r);
        size_t gw = gather_width(c->m);
        if (gw > 0) {
            size_t bytes = (size_t)c->n_batch * gw * sizeof(float);
            void *z = calloc(1, bytes);
            if (!z)
                return err_setf(e, ERR_NOMEM, "tensor parallel: out of memory");
            if ((rc = tp->be[r]->ops->buf_alloc(tp->be[r], bytes, (void **)&g->peer[r].full, e)) == 0 &&
                (rc = tp->be[r]->ops->buf_alloc(tp->be[r], bytes, (void **)&g->peer[r].zeros, e)) == 0)
                tp->be[r]->ops->upload(tp->be[r], g->peer[r].zeros, z, bytes);
            free(z);
            if (rc < 0)
                return err_prefix(e, "tensor parallel rank %d's gather buffers", r);
        }
        g->rank[r]->tp_peer = &g->peer[r];
    }
    for (int r = 1; r < g->n; r++) {
        if (pthread_create(&g->th[r], NULL, rank_loop, &g->peer[r]) != 0)
            return err_setf(e, ERR_NOMEM, "tensor parallel: cannot start rank %d's thread", r);
        g->n_threads = r;
    }
    return 0;
}

void model_tp_ctx_free(struct model_ctx *c)
{
    struct tp_group *g = c->tp;
    if (!g)
        return;
    if (g->mu_ok) {
        pthread_mutex_lock(&g->mu);
        g->quit = true;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->mu);
        for (int r = 1; r <= g->n_threads; r++)
            pthread_join(g->th[r], NULL);
        pthread_cond_destroy(&g->go);
        pthread_cond_destroy(&g->done);
        pthread_mutex_destroy(&g->mu);
    }
    for (int r = 0; r < g->n; r++) {
        struct backend *be = c->m->tp->be[r];
        float *bufs[] = {g->peer[r].sum, g->peer[r].full, g->peer[r].zeros};
        for (size_t k = 0; k < 3; k++)
            if (bufs[k])
                be->ops->buf_free(be, bufs[k]);
        model_ctx_free(g->rank[r]);
    }
    if (g->bar_ok)
        pthread_barrier_destroy(&g->bar);
    free(g);
    c->tp = NULL;
}

/* A sync inside a rank's forward: its error kept for model_tp_forward (the first one). */
static void rank_sync(const struct model_ctx *c, struct tp_peer *p)
{
    struct err se = {0};
    int rc = backend_sync(c->be, &se);
    if (rc < 0 && p->rc == 0) {
        p->rc = rc;
        p->err = se;
    }
}

/* The partials are read through the rank's own backend ops (copy, axpy): every rank's memory
 * is one the others' backends address (host memory, or one device), each rank's work up to its
 * partial finished (a sync) before it is published. */
int model_tp_kv_per(const struct model_ctx *c)
{
    if (!c->tp_peer)
        return 1;
    int n = c->tp_peer->g->n, main_kv = c->tp_peer->g->n_kv_head;
    return main_kv < n ? n / main_kv : 1;
}

void model_tp_reduce(const struct model_ctx *c, float *buf, int n)
{
    model_tp_reduce_cols(c, buf, n, c->m->hp.n_embd);
}

void model_tp_reduce_cols(const struct model_ctx *c, float *buf, int n, int cols)
{
    struct tp_peer *p = c->tp_peer;
    if (!p)
        return;
    struct tp_group *g = p->g;
    const struct backend_ops *op = c->be->ops;
    int d = cols;
    rank_sync(c, p);
    g->part[p->rank] = buf;
    pthread_barrier_wait(&g->bar);
    /* the same order on every rank: the same bits everywhere (1 * x is exact) */
    op->copy(c->be, p->sum, g->part[0], (size_t)n * d * sizeof(float));
    for (int q = 1; q < g->n; q++)
        op->axpy(c->be, p->sum, d, 1.0f, g->part[q], d, n, d);
    rank_sync(c, p);
    pthread_barrier_wait(&g->bar);  /* every rank has read every partial */
    op->copy(c->be, buf, p->sum, (size_t)n * d * sizeof(float));
}

void model_tp_rmsnorm_full(const struct model_ctx *c, float *y, int ldy, int cols, int per,
                           const struct tensor *w, float w_off, float eps, int n)
{
    struct tp_peer *p = c->tp_peer;
    const struct backend_ops *op = c->be->ops;
    if (!p) {
        op->rmsnorm(c->be, y, y, ldy, w, w_off, eps, n, 1, cols);
        return;
    }
    struct tp_group *g = p->g;
    int ns = g->n / per, D = cols * ns;
    rank_sync(c, p);
    g->part[p->rank] = y;
    pthread_barrier_wait(&g->bar);
    /* every slice's columns into a zeroed row (0 + x is x), in rank order */
    op->copy(c->be, p->full, p->zeros, (size_t)n * D * sizeof(float));
    for (int q = 0; q < ns; q++)
        op->axpy(c->be, p->full + (size_t)q * cols, D, 1.0f, g->part[q * per], ldy, n, cols);
    rank_sync(c, p);
    pthread_barrier_wait(&g->bar);  /* every rank has read every rank's columns */
    op->rmsnorm(c->be, p->full, p->full, D, w, w_off, eps, n, 1, D);
    op->scale(c->be, y, ldy, 0.0f, n, cols);
    op->axpy(c->be, y, ldy, 1.0f, p->full + (size_t)(p->rank / per) * cols, D, n, cols);
}

int model_tp_forward(struct model_ctx *c, const struct fwd_chunk *ch, const struct kv_layer *rank_kv,
                     struct err *e)
{
    struct tp_group *g = c->tp;
    int nl = c->m->hp.n_layer, rc = 0;
    /* the chunk's staged rows are the context's: uploaded before any rank reads them */
    if ((rc = backend_sync(c->be, e)) < 0)
        return rc;
    for (int r = 0; r < g->n; r++) {
        g->peer[r].rc = 0;
        g->job[r] = (struct rank_job){.c = g->rank[r], .ch = *ch};
        g->job[r].ch.kv = rank_kv + (size_t)r * nl;
        if (r > 0) {   /* rank 0 alone computes hidden states (and, head not split, logits) */
            if (!c->m->tp->head_split)
                g->job[r].ch.n_out = 0;
            g->job[r].ch.hidden = false;
        }
    }
    pthread_mutex_lock(&g->mu);
    g->n_done = 0;
    g->gen++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    struct rank_job *j0 = &g->job[0];
    j0->rc = j0->c->m->ops->forward(j0->c, &j0->ch, &j0->e);
    pthread_mutex_lock(&g->mu);
    while (g->n_done < g->n - 1)
        pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->n && rc == 0; r++) {
        if (g->job[r].rc < 0) {
            *e = g->job[r].e;
            rc = g->job[r].rc;
        } else if (g->peer[r].rc < 0) {
            *e = g->peer[r].err;
            rc = g->peer[r].rc;
        } else {
            rc = backend_sync(g->rank[r]->be, e);
        }
    }
    if (rc < 0)
        return rc;
    const struct backend_ops *op = c->be->ops;
    const struct model_tp *tp = c->m->tp;
    struct model_ctx *r0 = g->rank[0];
    size_t V = (size_t)c->m->hp.n_vocab;
    if (ch->n_out > 0 && !tp->head_split)
        op->copy(c->be, c->bufs.logits, r0->bufs.logits, (size_t)ch->n_out * V * sizeof(float));
    for (int r = 0; ch->n_out > 0 && tp->head_split && r < g->n; r++) {   /* the all-gather */
        size_t nv = (size_t)tp->n_vocab_r[r];
        for (int i = 0; i < ch->n_out; i++)
            op->copy(c->be, c->bufs.logits + (size_t)i * V + tp->vocab0[r], g->rank[r]->bufs.logits + (size_t)i * nv,
                     nv * sizeof(float));
    }
    if (ch->hidden)
        op->copy(c->be, c->bufs.o, r0->bufs.o, (size_t)ch->n_tok * c->m->hp.n_embd * sizeof(float));
    return 0;
}
