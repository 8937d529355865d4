/*
 * convert: planning, quantizing and writing MLX checkpoints (convert.h).
 *
 * Memory: float tensors stream through one chunk buffer (CK_CHUNK_BYTES);
 * a quantized tensor is held packed (about bits/16 of its bf16 size, plus
 * scales) from its first entry to its last, which are adjacent in name order
 * (P.biases < P.scales < P.weight, and every name between two "P." names
 * starts with "P."). Sources are read through the caller's reader, so an
 * mmapped checkpoint or a random generator look the same here. A view
 * tensor (a family's reordering, ck_view_rule) holds one source slab (an
 * expert or a head) at a time and gathers from it; a tensor the family's
 * predicate gave its own parameters is quantized with them and named in
 * config.json's quantization.
 */
#include "convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/fileio.h"
#include "../core/st_write.h"
#include "../core/threadpool.h"
#include "config.h"
#include "quant.h"

/* bytes per streamed piece: large enough for sequential I/O, small next to any model */
#define CK_CHUNK_BYTES   (8u << 20)
/* layer and expert indices in names; far above any real model */
#define CK_MAX_INDEX     1000000
#define CK_MAX_NAME      1024
/* metadata files copied by convert (tokenizer.json of large vocabularies is ~30 MB) */
#define CK_MAX_META      (256ull << 20)

/* ---- planning ---- */

/* Match name against fmt (literal text and two "%d"); on success *suffix points after
 * the '.' that must follow the formatted part. */
static bool match_rule(const char *fmt, const char *name, int ids[2], const char **suffix)
{
    int k = 0;
    const char *f = fmt, *s = name;
    while (*f) {
        if (f[0] == '%' && f[1] == 'd') {
            if (k >= 2 || *s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
                return false;
            long v = 0;
            while (*s >= '0' && *s <= '9' && v <= CK_MAX_INDEX)
                v = v * 10 + (*s++ - '0');
            if (v > CK_MAX_INDEX)
                return false;
            ids[k++] = (int)v;
            f += 2;
        } else if (*f++ != *s++) {
            return false;
        }
    }
    if (k != 2 || *s != '.' || !s[1])
        return false;
    *suffix = s + 1;
    return true;
}

struct member {
    size_t in;       /* input index */
    int rule, layer, expert;
    const char *suffix;
};

static int cmp_member(const void *a, const void *b)
{
    const struct member *x = a, *y = b;
    if (x->rule != y->rule)
        return x->rule < y->rule ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    int c = strcmp(x->suffix, y->suffix);
    if (c)
        return c;
    return x->expert < y->expert ? -1 : x->expert > y->expert;
}

static bool is_dropped(const char *name, const char *const *drop)
{
    for (size_t i = 0; drop && drop[i]; i++)
        if (strcmp(drop[i], name) == 0)
            return true;
    return false;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* A norm module's weight (RMSNorm, LayerNorm, Cohere's per-head [n_head, head_dim] ones):
 * never an nn.Linear, so mlx-lm never quantizes it whatever its shape. */
static bool is_norm(const char *name)
{
    const char *dot = strrchr(name, '.'), *p = dot;
    while (p && p > name && p[-1] != '.')
        p--;
    for (; p && p < dot; p++)
        if (strncmp(p, "norm", 4) == 0)
            return true;
    return false;
}

/* A tensor mlx-lm's convert leaves in its source dtype: the cast_predicate of every family
 * that routes with a correction bias (deepseek_v3, dots1, glm4_moe, minimax_m2) keeps
 * e_score_correction_bias (published F32) out of the cast, since rounding it to bf16 moves
 * the expert choices it exists to make. */
static bool keeps_source_dtype(const char *name)
{
    return strstr(name, "e_score_correction_bias") != NULL;
}

/* Fill the dtype and quantize flag of an output tensor from its source dtype; the
 * family's predicate has the last word on a candidate. */
static void finish_tensor(struct ck_tensor *t, enum dtype src_dt, const struct ck_plan_opts *o)
{
    t->dtype = dtype_is_float(src_dt) && o->dtype >= 0 && !keeps_source_dtype(t->name)
                   ? (enum dtype)o->dtype : src_dt;
    t->quantize = o->q && dtype_is_float(t->dtype) && ends_with(t->name, ".weight") &&
                  !is_norm(t->name) && quant_shape_ok(o->q, t->ndim, t->shape);
    if (!t->quantize || !o->predicate)
        return;
    char module[CK_MAX_NAME + 64];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    switch (o->predicate(module, o->q, &t->qp)) {
    case CK_Q_FLOAT:
        t->quantize = false;
        break;
    case CK_Q_OVERRIDE:
        t->has_qp = true;
        t->quantize = quant_shape_ok(&t->qp, t->ndim, t->shape);
        break;
    default:
        break;
    }
}

static int add_single(struct ck_tensor *t, const struct ck_input *in, const struct ck_plan_opts *o,
                      struct err *e)
{
    t->name = strdup(in->name);
    t->parts = malloc(sizeof *t->parts);
    if (!t->name || !t->parts)
        return err_setf(e, ERR_NOMEM, "out of memory");
    t->parts[0] = in->handle;
    t->n_parts = 1;
    t->ndim = in->ndim;
    memcpy(t->shape, in->shape, sizeof t->shape);
    finish_tensor(t, in->dtype, o);
    return 0;
}

/* Members m[0..k) are one (rule, layer, suffix) group sorted by expert. */
static int add_stacked(struct ck_tensor *t, const struct ck_input *in, const struct member *m,
                       size_t k, const struct ck_plan_opts *o, struct err *e)
{
    const struct ck_input *first = &in[m[0].in];
    for (size_t x = 0; x < k; x++) {
        const struct ck_input *p = &in[m[x].in];
        if (m[x].expert != (int)x)
            return err_setf(e, ERR_FORMAT, "expert %zu of '%s' is missing (found expert %d)", x,
                            first->name, m[x].expert);
        bool same = p->dtype == first->dtype && p->ndim == first->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = p->shape[d] == first->shape[d];
        if (!same)
            return err_setf(e, ERR_FORMAT, "tensor '%s' differs in dtype or shape from '%s'", p->name,
                            first->name);
    }
    if (first->ndim + 1 > ST_MAX_DIMS)
        return err_setf(e, ERR_FORMAT, "tensor '%s': too many dims to stack", first->name);
    char name[CK_MAX_NAME + 64];
    int w = snprintf(name, sizeof name, o->rules[m[0].rule].stacked, m[0].layer);
    if (w < 0 || (size_t)w >= sizeof name - strlen(m[0].suffix) - 2)
        return err_setf(e, ERR_FORMAT, "stacked name for '%s' is too long", first->name);
    snprintf(name + w, sizeof name - (size_t)w, ".%s", m[0].suffix);
    t->name = strdup(name);
    t->parts = malloc(k * sizeof *t->parts);
    if (!t->name || !t->parts)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (size_t x = 0; x < k; x++)
        t->parts[x] = in[m[x].in].handle;
    t->n_parts = (int)k;
    t->ndim = first->ndim + 1;
    t->shape[0] = (int64_t)k;
    for (int d = 0; d < first->ndim; d++)
        t->shape[d + 1] = first->shape[d];
    finish_tensor(t, first->dtype, o);
    return 0;
}

/* name matches fmt (literal text around one "%d", the layer)? */
static bool match_layer(const char *fmt, const char *name)
{
    const char *d = strstr(fmt, "%d");
    size_t pre = d ? (size_t)(d - fmt) : 0;
    if (!d || strncmp(fmt, name, pre) != 0)
        return false;
    const char *s = name + pre;
    if (*s < '0' || *s > '9')
        return false;
    while (*s >= '0' && *s <= '9')
        s++;
    return strcmp(s, d + 2) == 0;
}

/* Output t: input `in` through rule r (the layer number is copied from the input name). */
static int add_view(struct ck_tensor *t, const struct ck_input *in, const struct ck_view_rule *r,
                    const struct ck_plan_opts *o, struct err *e)
{
    const char *d = strstr(r->in, "%d");
    const char *num = in->name + (d - r->in), *end = num;
    while (*end >= '0' && *end <= '9')
        end++;
    const char *od = strstr(r->out, "%d");
    char name[CK_MAX_NAME + 64];
    snprintf(name, sizeof name, "%.*s%.*s%s", (int)(od - r->out), r->out, (int)(end - num), num, od + 2);
    bool three = r->view == CK_VIEW_T || r->view == CK_VIEW_T_EVEN || r->view == CK_VIEW_T_ODD ||
                 r->view == CK_VIEW_T_LO || r->view == CK_VIEW_T_HI;
    bool two = r->view == CK_VIEW_EVEN || r->view == CK_VIEW_ODD;
    bool heads = r->view == CK_VIEW_HEAD_K_T || r->view == CK_VIEW_HEAD_V;
    if ((three && in->ndim != 3) || (two && in->ndim != 2) ||
        ((three || two) && r->view != CK_VIEW_T && in->shape[in->ndim - 1] % 2 != 0) ||
        (heads && (in->ndim != 2 || r->a < 1 || r->b < 1 || in->shape[0] % (r->a + r->b) != 0)))
        return err_setf(e, ERR_FORMAT, "tensor '%s': shape does not fit mlx-lm's sanitize into '%s'",
                        in->name, name);
    t->name = strdup(name);
    t->parts = malloc(sizeof *t->parts);
    if (!t->name || !t->parts)
        return err_setf(e, ERR_NOMEM, "out of memory");
    t->parts[0] = in->handle;
    t->n_parts = 1;
    t->ndim = in->ndim;
    memcpy(t->shape, in->shape, sizeof t->shape);
    if (three) {
        memcpy(t->src_shape, in->shape, sizeof t->src_shape);
        t->shape[1] = in->shape[2] / (r->view == CK_VIEW_T ? 1 : 2);
        t->shape[2] = in->shape[1];
    } else if (heads) {
        /* each head's a + b rows of C, as slabs of [a + b, C] */
        t->src_shape[0] = in->shape[0] / (r->a + r->b);
        t->src_shape[1] = r->a + r->b;
        t->src_shape[2] = in->shape[1];
        t->ndim = 3;
        t->shape[0] = t->src_shape[0];
        t->shape[1] = r->view == CK_VIEW_HEAD_K_T ? in->shape[1] : r->b;
        t->shape[2] = r->view == CK_VIEW_HEAD_K_T ? r->a : in->shape[1];
        t->head_a = r->a;
    } else if (two) {
        t->src_shape[0] = in->shape[0];
        t->src_shape[1] = 1;
        t->src_shape[2] = in->shape[1];
        t->shape[1] = in->shape[1] / 2;
    }
    t->view = r->view == CK_VIEW_RENAME ? CK_VIEW_NONE : r->view;
    finish_tensor(t, in->dtype, o);
    return 0;
}

int ck_plan(const struct ck_input *in, size_t n, const struct ck_plan_opts *o, struct ck_tensor **out,
            size_t *n_out, struct err *e)
{
    struct member *mem = malloc((n ? n : 1) * sizeof *mem);
    size_t n_views = 0;
    for (size_t r = 0; o->views && o->views[r].in; r++)
        n_views++;
    /* a view rule may turn one input into two outputs */
    struct ck_tensor *t = calloc(n ? 2 * n : 1, sizeof *t);
    bool *stacked = calloc(n ? n : 1, sizeof *stacked);
    size_t nm = 0, nt = 0;
    int rc = 0;
    *out = NULL;
    *n_out = 0;
    if (!mem || !t || !stacked) {
        rc = err_setf(e, ERR_NOMEM, "out of memory planning %zu tensors", n);
        goto done;
    }
    for (size_t i = 0; i < n && o->rules; i++) {
        if (strlen(in[i].name) > CK_MAX_NAME || is_dropped(in[i].name, o->drop))
            continue;
        for (int r = 0; o->rules[r].per_expert; r++) {
            int ids[2];
            const char *suffix;
            if (match_rule(o->rules[r].per_expert, in[i].name, ids, &suffix)) {
                mem[nm++] = (struct member){i, r, ids[0], ids[1], suffix};
                stacked[i] = true;
                break;
            }
        }
    }
    for (size_t i = 0; i < n && n_views && rc == 0; i++) {
        if (strlen(in[i].name) > CK_MAX_NAME || is_dropped(in[i].name, o->drop))
            continue;
        for (size_t r = 0; r < n_views && rc == 0; r++) {
            if (!match_layer(o->views[r].in, in[i].name))
                continue;
            rc = add_view(&t[nt++], &in[i], &o->views[r], o, e);
            stacked[i] = true;
        }
    }
    qsort(mem, nm, sizeof *mem, cmp_member);
    for (size_t a = 0; a < nm && rc == 0;) {
        size_t b = a + 1;
        while (b < nm && mem[b].rule == mem[a].rule && mem[b].layer == mem[a].layer &&
               strcmp(mem[b].suffix, mem[a].suffix) == 0)
            b++;
        rc = add_stacked(&t[nt++], in, mem + a, b - a, o, e);
        a = b;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (stacked[i] || is_dropped(in[i].name, o->drop))
            continue;
        if (strlen(in[i].name) > CK_MAX_NAME) {
            rc = err_setf(e, ERR_FORMAT, "tensor name of %zu bytes is too long", strlen(in[i].name));
            break;
        }
        rc = add_single(&t[nt++], &in[i], o, e);
    }
done:
    free(mem);
    free(stacked);
    if (rc < 0) {
        ck_tensors_free(t, nt);
        return rc;
    }
    *out = t;
    *n_out = nt;
    return 0;
}

void ck_tensors_free(struct ck_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++) {
        free(t[i].name);
        free(t[i].parts);
    }
    free(t);
}

/* ---- writing ---- */

enum role { ROLE_FLOAT, ROLE_QWEIGHT, ROLE_QSCALES, ROLE_QBIASES };

struct entry {
    char *name;
    size_t t;        /* tensor index */
    enum role role;
    struct st_wentry w;
};

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static int64_t n_elems(const struct ck_tensor *t)
{
    int64_t k = 1;
    for (int d = 0; d < t->ndim; d++)
        k *= t->shape[d];
    return k;
}

/* The one quantized tensor held between its entries. */
struct qcache {
    size_t t;            /* tensor index, or SIZE_MAX */
    uint32_t *wq;
    uint8_t *sc, *bi;
    size_t wq_bytes, s_bytes;
};

static void qcache_clear(struct qcache *c)
{
    free(c->wq);
    free(c->sc);
    free(c->bi);
    memset(c, 0, sizeof *c);
    c->t = SIZE_MAX;
}

/* One chunk of rows split over the pool; each thread quantizes a contiguous row range. */
struct qjob {
    const struct quant_params *q;
    enum dtype dt;
    const uint8_t *src;           /* [rows, n_in] in dt */
    int64_t rows, n_in;
    uint32_t *wq;
    uint8_t *sc, *bi;
    size_t esz, ssz;
    int rc[CK_MAX_THREADS];       /* per thread */
    struct err e[CK_MAX_THREADS];
};

struct wctx {
    struct tpool *pool;          /* quantizes row ranges in parallel; NULL: one thread */
    const struct ck_tensor *t;
    const struct quant_params *q;
    const struct ck_reader *rd;
    struct st_writer *w;
    uint8_t *buf;
    size_t buf_cap;
    uint8_t *vbuf;               /* one source slab of a view tensor */
    size_t vbuf_cap;
    const struct ck_tensor *vbuf_t;  /* whose slab vbuf holds (NULL: none) */
    int64_t vbuf_x;
    ck_progress_fn progress;
    void *pud;
    uint64_t done, total;
    struct qjob job;
};

static int ensure_buf(struct wctx *c, size_t need, struct err *e)
{
    if (need <= c->buf_cap)
        return 0;
    uint8_t *p = realloc(c->buf, need);
    if (!p)
        return err_setf(e, ERR_NOMEM, "out of memory for a %zu-byte buffer", need);
    c->buf = p;
    c->buf_cap = need;
    return 0;
}

static int put(struct wctx *c, const void *data, size_t n, struct err *e)
{
    int rc = st_writer_write(c->w, data, n, e);
    c->done += n;
    if (rc == 0 && c->progress)
        c->progress(c->pud, c->done, c->total);
    return rc;
}

/* Elements [e0, e0 + k) of part p of t in t->dtype: a plain read, or for a view the
 * gathered elements of its source, one source slab (expert) held in c->vbuf at a time
 * and read whole. */
static int read_part(struct wctx *c, const struct ck_tensor *t, int p, int64_t e0, int64_t k,
                     uint8_t *dst, struct err *e)
{
    if (t->view == CK_VIEW_NONE)
        return c->rd->read(c->rd->ud, t->parts[p], t->dtype, e0, k, dst, e);
    size_t esz = dtype_size(t->dtype);
    int64_t A = t->src_shape[1], B = t->src_shape[2], slab = A * B;
    int64_t R = t->shape[t->ndim - 2 < 1 ? 1 : t->ndim - 2], C = t->shape[t->ndim - 1];
    int64_t out_slab = t->ndim == 3 ? R * C : C;
    int rc;
    if (c->vbuf_cap < (size_t)slab * esz) {
        uint8_t *nb = realloc(c->vbuf, (size_t)slab * esz);
        if (!nb)
            return err_setf(e, ERR_NOMEM, "out of memory reordering '%s'", t->name);
        c->vbuf = nb;
        c->vbuf_cap = (size_t)slab * esz;
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t o = e0 + i, x = o / out_slab, w = o % out_slab, src;
        if (c->vbuf_t != t || c->vbuf_x != x) {
            if ((rc = c->rd->read(c->rd->ud, t->parts[p], t->dtype, x * slab, slab, c->vbuf, e)) < 0)
                return rc;
            c->vbuf_t = t;
            c->vbuf_x = x;
        }
        int64_t r = w / C, col = w % C;
        if (t->view == CK_VIEW_HEAD_K_T) {
            src = col * B + r;                       /* out [x][i][j] = in [x][j][i], j < a */
        } else if (t->view == CK_VIEW_HEAD_V) {
            src = (t->head_a + r) * B + col;         /* out [x][p][i] = in [x][a + p][i] */
        } else if (t->ndim == 3) {
            /* out [x][r][col] from in [x][col][r'] */
            int64_t rr = t->view == CK_VIEW_T || t->view == CK_VIEW_T_LO ? r
                         : t->view == CK_VIEW_T_HI ? R + r
                         : t->view == CK_VIEW_T_EVEN ? 2 * r : 2 * r + 1;
            src = col * B + rr;
        } else {
            src = t->view == CK_VIEW_EVEN ? 2 * w : 2 * w + 1;
        }
        memcpy(dst + (size_t)i * esz, c->vbuf + (size_t)src * esz, esz);
    }
    return 0;
}

static int write_float(struct wctx *c, const struct ck_tensor *t, struct err *e)
{
    size_t esz = dtype_size(t->dtype);
    int64_t part = n_elems(t) / t->n_parts, step = (int64_t)(CK_CHUNK_BYTES / esz);
    int rc;
    if ((rc = ensure_buf(c, CK_CHUNK_BYTES, e)) < 0)
        return rc;
    for (int p = 0; p < t->n_parts; p++) {
        for (int64_t e0 = 0; e0 < part; e0 += step) {
            int64_t k = part - e0 < step ? part - e0 : step;
            if ((rc = read_part(c, t, p, e0, k, c->buf, e)) < 0 ||
                (rc = put(c, c->buf, (size_t)k * esz, e)) < 0)
                return rc;
        }
    }
    return 0;
}

static void qjob_run(void *ctx, int ith, int nth)
{
    struct qjob *j = ctx;
    long lo, hi;
    tpool_range((long)j->rows, ith, nth, &lo, &hi);
    int64_t words = quant_row_words(j->q, j->n_in), groups = quant_row_groups(j->q, j->n_in);
    j->rc[ith] = hi <= lo ? 0
                          : quant_rows(j->q, j->dt, j->src + (size_t)(lo * j->n_in) * j->esz, hi - lo,
                                       j->n_in, j->wq + lo * words, j->sc + (size_t)(lo * groups) * j->ssz,
                                       j->bi ? j->bi + (size_t)(lo * groups) * j->ssz : NULL, &j->e[ith]);
}

/* nvfp4's largest magnitude: e2m1's 6 times the e4m3 group scale's 448. */
#define CK_NVFP4_MAX (6.0f * 448.0f)

/* nvfp4 cannot hold a weight beyond +-2688: its group's scale saturates at 448 and the weight
 * would be written as +-2688 (mlx clips it the same, silently). Refused, as non-finite
 * weights are (issue 39 item 14), naming the tensor, the element (idx, flat, of t) and the
 * value, with the modes that hold it. n elements of t->dtype at buf. */
static int nvfp4_range_check(const struct ck_tensor *t, const void *buf, int64_t idx0, int64_t n, struct err *e)
{
    float tmp[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        dtype_to_f32_ref(tmp, (const uint8_t *)buf + (size_t)i0 * dtype_size(t->dtype), t->dtype, (size_t)k);
        for (int64_t i = 0; i < k; i++) {
            if (!(fabsf(tmp[i]) > CK_NVFP4_MAX))
                continue;
            char at[160];
            int64_t c[ST_MAX_DIMS] = {0}, idx = idx0 + i0 + i;
            for (int d = t->ndim - 1; d >= 0; d--) {
                int64_t dim = t->shape[d] > 0 ? t->shape[d] : 1;
                c[d] = idx % dim;
                idx /= dim;
            }
            size_t len = (size_t)snprintf(at, sizeof at, "[");
            for (int d = 0; d < t->ndim && len < sizeof at; d++)
                len += (size_t)snprintf(at + len, sizeof at - len, "%s%lld", d ? ", " : "", (long long)c[d]);
            if (len < sizeof at)
                snprintf(at + len, sizeof at - len, "]");
            return err_setf(e, ERR_RANGE, "tensor '%s': element %s (%g) is beyond nvfp4's range (+-2688: 6 times "
                            "the largest e4m3 group scale, 448) and would be clipped; use --q-mode mxfp4, mxfp8 "
                            "or affine", t->name, at, (double)tmp[i]);
        }
    }
    return 0;
}

static int quantize_tensor(struct wctx *c, size_t ti, struct qcache *qc, struct err *e)
{
    const struct ck_tensor *t = &c->t[ti];
    const struct quant_params *q = t->has_qp ? &t->qp : c->q;
    size_t esz = dtype_size(t->dtype), ssz = dtype_size(quant_scale_dtype(q, t->dtype));
    int64_t n_in = t->shape[t->ndim - 1], rows = n_elems(t) / n_in, part_rows = rows / t->n_parts;
    int64_t words = quant_row_words(q, n_in), groups = quant_row_groups(q, n_in);
    int64_t step = (int64_t)(CK_CHUNK_BYTES / esz) / n_in;
    int rc;
    if (step < 1)
        step = 1;
    qcache_clear(qc);
    qc->wq_bytes = (size_t)(rows * words) * sizeof(uint32_t);
    qc->s_bytes = (size_t)(rows * groups) * ssz;
    qc->wq = malloc(qc->wq_bytes ? qc->wq_bytes : 1);
    qc->sc = malloc(qc->s_bytes ? qc->s_bytes : 1);
    qc->bi = q->mode == QMODE_AFFINE ? malloc(qc->s_bytes ? qc->s_bytes : 1) : NULL;
    if (!qc->wq || !qc->sc || (q->mode == QMODE_AFFINE && !qc->bi))
        return err_setf(e, ERR_NOMEM, "out of memory quantizing '%s'", t->name);
    if ((rc = ensure_buf(c, (size_t)(step * n_in) * esz, e)) < 0)
        return rc;
    for (int p = 0; p < t->n_parts; p++) {
        for (int64_t r0 = 0; r0 < part_rows; r0 += step) {
            int64_t k = part_rows - r0 < step ? part_rows - r0 : step, row = p * part_rows + r0;
            if ((rc = read_part(c, t, p, r0 * n_in, k * n_in, c->buf, e)) < 0)
                return rc;
            if (q->mode == QMODE_NVFP4 && (rc = nvfp4_range_check(t, c->buf, row * n_in, k * n_in, e)) < 0)
                return rc;
            struct qjob *j = &c->job;
            j->q = q;
            j->dt = t->dtype;
            j->src = c->buf;
            j->rows = k;
            j->n_in = n_in;
            j->wq = qc->wq + row * words;
            j->sc = qc->sc + (size_t)(row * groups) * ssz;
            j->bi = qc->bi ? qc->bi + (size_t)(row * groups) * ssz : NULL;
            j->esz = esz;
            j->ssz = ssz;
            int nth = c->pool ? tpool_size(c->pool) : 1;
            if (c->pool)
                tpool_run(c->pool, qjob_run, j);
            else
                qjob_run(j, 0, 1);
            for (int i = 0; i < nth; i++) {
                if (j->rc[i] < 0) {
                    if (e)
                        *e = j->e[i];
                    return err_prefix(e, "quantizing '%s'", t->name);
                }
            }
        }
    }
    qc->t = ti;
    return 0;
}

/* Expand the tensors into file entries (quantized ones into three), sorted by name. */
static int build_entries(const struct ck_tensor *t, size_t n, const struct quant_params *q,
                         struct entry **out, size_t *n_out, struct err *e)
{
    struct entry *en = calloc(n * 3 + 1, sizeof *en);
    size_t k = 0;
    if (!en)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!t[i].quantize) {
            en[k] = (struct entry){strdup(t[i].name), i, ROLE_FLOAT, {0}};
            en[k].w.dtype = t[i].dtype;
            en[k].w.ndim = t[i].ndim;
            memcpy(en[k].w.shape, t[i].shape, sizeof en[k].w.shape);
            if (!en[k++].name)
                goto oom;
            continue;
        }
        size_t plen = strlen(t[i].name) - strlen(".weight");
        static const char *const suffix[] = {".weight", ".scales", ".biases"};
        const struct quant_params *tq = t[i].has_qp ? &t[i].qp : q;
        int n_roles = tq->mode == QMODE_AFFINE ? 3 : 2;
        for (int r = 0; r < n_roles; r++) {
            struct entry *x = &en[k++];
            x->name = malloc(plen + 8);
            if (!x->name)
                goto oom;
            memcpy(x->name, t[i].name, plen);
            strcpy(x->name + plen, suffix[r]);
            x->t = i;
            x->role = r == 0 ? ROLE_QWEIGHT : r == 1 ? ROLE_QSCALES : ROLE_QBIASES;
            x->w.ndim = t[i].ndim;
            memcpy(x->w.shape, t[i].shape, sizeof x->w.shape);
            int64_t last = t[i].shape[t[i].ndim - 1];
            x->w.shape[t[i].ndim - 1] = r == 0 ? quant_row_words(tq, last) : quant_row_groups(tq, last);
            x->w.dtype = r == 0 ? DTYPE_U32 : quant_scale_dtype(tq, t[i].dtype);
        }
    }
    qsort(en, k, sizeof *en, cmp_entry);
    for (size_t i = 0; i < k; i++)
        en[i].w.name = en[i].name;
    *out = en;
    *n_out = k;
    return 0;
oom:
    for (size_t i = 0; i < k; i++)
        free(en[i].name);
    free(en);
    return err_setf(e, ERR_NOMEM, "out of memory");
}

int ck_write(const char *path, const struct ck_tensor *t, size_t n, const struct quant_params *q,
             const struct ck_reader *rd, ck_progress_fn progress, void *progress_ud,
             struct tpool *pool, struct ck_stats *stats, struct err *e)
{
    struct entry *en = NULL;
    struct st_wentry *we = NULL;
    struct qcache qc = {.t = SIZE_MAX};
    struct wctx c;  /* ~40 KiB: per-thread error slots of the quantizer job */
    memset(&c, 0, sizeof c);
    size_t ne = 0, nq = 0;
    int rc;
    c.t = t;
    c.q = q;
    c.rd = rd;
    c.progress = progress;
    c.pud = progress_ud;
    for (size_t i = 0; i < n; i++) {
        if (t[i].quantize && !q && !t[i].has_qp)
            return err_setf(e, ERR_INTERNAL, "'%s' is marked for quantizing without parameters", t[i].name);
        if (t[i].quantize && (rc = quant_params_check(t[i].has_qp ? &t[i].qp : q, e)) < 0)
            return rc;
        nq += t[i].quantize;
    }
    if ((rc = build_entries(t, n, q, &en, &ne, e)) < 0)
        return rc;
    int nth = tpool_default_threads();
    if (pool && tpool_size(pool) > CK_MAX_THREADS) {
        rc = err_setf(e, ERR_INTERNAL, "a pool of %d threads for the quantizer (at most %d)",
                      tpool_size(pool), CK_MAX_THREADS);
        goto out;
    }
    if (pool)
        c.pool = pool;
    else if (nq > 0 && nth > 1 && (rc = tpool_new(&c.pool, nth < CK_MAX_THREADS ? nth : CK_MAX_THREADS, e)) < 0)
        goto out;
    we = malloc((ne ? ne : 1) * sizeof *we);
    if (!we) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ne; i++) {
        we[i] = en[i].w;
        c.total += st_wentry_bytes(&we[i]);
    }
    if ((rc = st_writer_open(&c.w, path, we, ne, e)) < 0)
        goto out;
    for (size_t i = 0; i < ne && rc == 0; i++) {
        const struct entry *x = &en[i];
        if (x->role == ROLE_FLOAT) {
            rc = write_float(&c, &t[x->t], e);
            continue;
        }
        if (qc.t != x->t && (rc = quantize_tensor(&c, x->t, &qc, e)) < 0)
            break;
        if (x->role == ROLE_QWEIGHT)
            rc = put(&c, qc.wq, qc.wq_bytes, e);
        else
            rc = put(&c, x->role == ROLE_QSCALES ? qc.sc : qc.bi, qc.s_bytes, e);
    }
    if (rc < 0) {
        st_writer_abort(c.w);
    } else {
        rc = st_writer_close(c.w, e);
    }
    if (rc == 0 && stats) {
        stats->n_tensors = ne;
        stats->n_quantized = nq;
        stats->bytes = c.total;
        stats->n_params = 0;
        for (size_t i = 0; i < n; i++)
            stats->n_params += n_elems(&t[i]);
    }
out:
    if (c.pool != pool)
        tpool_free(c.pool);
    qcache_clear(&qc);
    free(c.buf);
    free(c.vbuf);
    for (size_t i = 0; i < ne; i++)
        free(en[i].name);
    free(en);
    free(we);
    return rc;
}

/* ---- config and files ---- */

int ck_config_set_quant(cJSON *cfg, const struct quant_params *q, struct err *e)
{
    static const char *const keys[] = {"quantization", "quantization_config"};
    for (int k = 0; k < 2; k++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddNumberToObject(o, "group_size", q->group) ||
            !cJSON_AddNumberToObject(o, "bits", q->bits) ||
            !cJSON_AddStringToObject(o, "mode", qmode_name(q->mode))) {
            cJSON_Delete(o);
            return err_setf(e, ERR_NOMEM, "out of memory");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, keys[k]);
        cJSON_AddItemToObject(cfg, keys[k], o);
    }
    return 0;
}

static int cmp_item(const void *a, const void *b)
{
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* Write buf to path through path.tmp (created with mode, less the umask) and a rename. */
static int write_file(const char *path, const char *buf, size_t n, mode_t mode, struct err *e)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) {
        int rc = err_setf(e, ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    bool ok = fwrite(buf, 1, n, f) == n;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int rc = err_setf(e, ERR_IO, "writing %s: %s", path, strerror(errno));
        unlink(tmp);
        return rc;
    }
    return 0;
}

/* ck_config_write; keep_vision: the checkpoint holds its vision tower (synth of an image-text
 * config), so vision_config stays. */
static int config_write(const char *dir, cJSON *cfg, const struct quant_params *q, bool keep_vision,
                        struct err *e)
{
    char path[4200];
    int rc;
    if (q && (rc = ck_config_set_quant(cfg, q, e)) < 0)
        return rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "_name_or_path");
    if (!keep_vision)
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "vision_config");
    int n = cJSON_GetArraySize(cfg);
    cJSON **items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
    if (!items)
        return err_setf(e, ERR_NOMEM, "out of memory");
    int k = 0;
    for (cJSON *it = cfg->child; it && k < n; it = it->next)
        items[k++] = it;
    qsort(items, (size_t)k, sizeof *items, cmp_item);
    for (int i = 0; i < k; i++)
        cJSON_DetachItemViaPointer(cfg, items[i]);
    for (int i = 0; i < k; i++)
        cJSON_AddItemToObject(cfg, items[i]->string, items[i]);
    free(items);
    char *s = cJSON_Print(cfg);
    if (!s)
        return err_setf(e, ERR_NOMEM, "out of memory printing %s", path);
    size_t len = strlen(s);
    char *t = realloc(s, len + 2);
    if (!t) {
        free(s);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    t[len] = '\n';
    rc = write_file(path, t, len + 1, 0666, e);
    free(t);
    return rc;
}

int ck_copy_file(const char *src, const char *dst, uint64_t max, struct err *e)
{
    struct stat sb;
    char *buf = NULL;
    size_t n = 0;
    int fd, rc;
    if ((rc = file_open(src, FILE_FOLDER, &fd, &sb, e)) < 0)
        return rc;
    rc = file_read_fd(fd, src, (size_t)max, &buf, &n, e);
    close(fd);
    if (rc == 0)  /* never wider than the source's permission bits */
        rc = write_file(dst, buf, n, sb.st_mode & 0666, e);
    free(buf);
    return rc;
}

int ck_copy_into(struct outdir *od, const char *src_dir, const char *name, struct err *e)
{
    char a[4200], b[4200];
    int rc;
    if ((size_t)snprintf(a, sizeof a, "%s/%s", src_dir, name) >= sizeof a)
        return err_setf(e, ERR_ARG, "path too long: %s/%s", src_dir, name);
    if ((rc = outdir_file(od, name, b, sizeof b, e)) < 0)
        return rc;
    return ck_copy_file(a, b, CK_MAX_META, e);
}

/* One per-module entry {"group_size", "bits"} (+ "mode" when not affine: mlx-lm's
 * predicates return none) in each quantization object of cfg, for every tensor quantized
 * with its own parameters, in plan order. */
static int config_add_overrides(cJSON *cfg, const struct ck_tensor *t, size_t n, struct err *e)
{
    static const char *const keys[] = {"quantization", "quantization_config"};
    for (size_t i = 0; i < n; i++) {
        if (!t[i].quantize || !t[i].has_qp)
            continue;
        char module[CK_MAX_NAME + 64];
        snprintf(module, sizeof module, "%.*s", (int)(strlen(t[i].name) - strlen(".weight")),
                 t[i].name);
        for (int k = 0; k < 2; k++) {
            cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, keys[k]), *o = cJSON_CreateObject();
            if (!q || !o || !cJSON_AddNumberToObject(o, "group_size", t[i].qp.group) ||
                !cJSON_AddNumberToObject(o, "bits", t[i].qp.bits) ||
                (t[i].qp.mode != QMODE_AFFINE &&
                 !cJSON_AddStringToObject(o, "mode", qmode_name(t[i].qp.mode)))) {
                cJSON_Delete(o);
                return err_setf(e, ERR_NOMEM, "out of memory");
            }
            cJSON_AddItemToObject(q, module, o);
        }
    }
    return 0;
}

int ck_config_write(const char *dir, cJSON *cfg, const struct quant_params *q, struct err *e)
{
    return config_write(dir, cfg, q, false, e);
}

int ck_write_folder(const struct ck_folder *f, const struct ck_tensor *t, size_t n, cJSON *cfg,
                    struct ck_stats *stats, struct err *e)
{
    struct outdir od;
    char path[PATH_MAX + 32];
    int rc;
    /* small files first (inputs that can fail), then the weights, config.json last */
    if ((rc = outdir_begin(&od, f->dst, e)) < 0)
        return rc;
    if ((f->copy && (rc = f->copy(f->copy_ud, &od, e)) < 0) ||
        (rc = outdir_file(&od, "model.safetensors", path, sizeof path, e)) < 0 ||
        (rc = ck_write(path, t, n, f->q, f->rd, f->progress, f->progress_ud, f->pool, stats, e)) < 0 ||
        (rc = outdir_file(&od, "config.json", path, sizeof path, e)) < 0 ||
        (f->q && (rc = ck_config_set_quant(cfg, f->q, e)) < 0) ||
        (f->q && (rc = config_add_overrides(cfg, t, n, e)) < 0) ||
        (rc = config_write(od.tmp, cfg, NULL, f->keep_vision_config, e)) < 0) {
        outdir_abort(&od);
        return rc;
    }
    return outdir_commit(&od, e);
}

int ck_dtype_parse(const char *s)
{
    if (!s)
        return -1;
    if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0)
        return DTYPE_BF16;
    if (strcmp(s, "f16") == 0 || strcmp(s, "float16") == 0)
        return DTYPE_F16;
    if (strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0)
        return DTYPE_F32;
    return -1;
}

/* ---- convert ---- */

/* Index of the first NaN or infinity among n elements of dt at p (exponent bits all ones),
 * or -1; integer dtypes have none. */
static int64_t first_nonfinite(enum dtype dt, const void *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t x;
        switch (dt) {
        case DTYPE_F32: {
            uint32_t b;
            memcpy(&b, (const uint8_t *)p + 4 * i, 4);
            if ((b & 0x7f800000u) == 0x7f800000u)
                return i;
            break;
        }
        case DTYPE_F16:
        case DTYPE_BF16: {
            uint16_t h;
            memcpy(&h, (const uint8_t *)p + 2 * i, 2);
            uint16_t m = dt == DTYPE_F16 ? 0x7c00 : 0x7f80;
            if ((h & m) == m)
                return i;
            break;
        }
        case DTYPE_F64:
            memcpy(&x, (const uint8_t *)p + 8 * i, 8);
            if ((x & 0x7ff0000000000000ull) == 0x7ff0000000000000ull)
                return i;
            break;
        default:
            return -1;
        }
    }
    return -1;
}

/* "[i, j, k]" of flat element idx of t into buf. */
static void element_coords(const struct st_tensor *t, int64_t idx, char *buf, size_t cap)
{
    int64_t c[8] = {0};
    int nd = t->ndim < 8 ? t->ndim : 8;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t dim = t->shape[d] > 0 ? t->shape[d] : 1;
        c[d] = idx % dim;
        idx /= dim;
    }
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < nd && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)c[d]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

/* A NaN or infinity in a weight is refused, naming the tensor and the element: quantized,
 * it would become a finite value (the group's minimum) and the model would run on without
 * a sign; cast, it would be copied into a checkpoint that produces NaN logits. mlx-lm
 * propagates it; refusing says where it is. */
static int nonfinite_error(const struct st_tensor *t, int64_t idx, float v, struct err *e)
{
    char at[160];
    element_coords(t, idx, at, sizeof at);
    return err_setf(e, ERR_FORMAT, "tensor '%s' holds %s at element %s: a checkpoint with non-finite weights "
                    "is not converted", t->name, isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf", at);
}

/* Reader over mmapped source tensors (handles are struct st_tensor *). Every element read is
 * checked: a non-finite source value is an error (nonfinite_error), and so is a finite
 * value that the cast to dt overflows (3.4e38 to f16, whose largest is 65504; to bf16 only
 * f32 values within half a bf16 step of FLT_MAX overflow). */
static int st_read(void *ud, const void *handle, enum dtype dt, int64_t elem0, int64_t n, void *dst,
                   struct err *e)
{
    (void)ud;
    const struct st_tensor *t = handle;
    size_t esz = dtype_size(t->dtype);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)elem0 * esz;
    int64_t bad;
    if (t->dtype == dt) {
        memcpy(dst, src, (size_t)n * esz);
        if ((bad = first_nonfinite(dt, dst, n)) >= 0) {
            const uint8_t *at = (const uint8_t *)dst + (size_t)bad * esz;
            double d = 0.0;
            float v;
            if (dt == DTYPE_F64)
                memcpy(&d, at, sizeof d);
            else
                dtype_to_f32_ref(&v, at, dt, 1);
            return nonfinite_error(t, elem0 + bad, dt == DTYPE_F64 ? (float)d : v, e);
        }
        return 0;
    }
    if (!dtype_is_float(t->dtype) || !dtype_is_float(dt))
        return err_setf(e, ERR_INTERNAL, "tensor '%s': cannot cast %s to %s", t->name,
                        dtype_name(t->dtype), dtype_name(dt));
    float tmp[256];
    size_t osz = dtype_size(dt);
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        int64_t k = n - i0 < 256 ? n - i0 : 256;
        if ((bad = first_nonfinite(t->dtype, src + (size_t)i0 * esz, k)) >= 0) {
            dtype_to_f32_ref(tmp, src + (size_t)i0 * esz, t->dtype, (size_t)k);
            return nonfinite_error(t, elem0 + i0 + bad, tmp[bad], e);
        }
        dtype_to_f32_ref(tmp, src + (size_t)i0 * esz, t->dtype, (size_t)k);
        for (int64_t i = 0; i < k; i++)
            dtype_store_f32(dt, dst, i0 + i, tmp[i]);
        if ((bad = first_nonfinite(dt, (uint8_t *)dst + (size_t)i0 * osz, k)) >= 0) {
            char at[160];
            element_coords(t, elem0 + i0 + bad, at, sizeof at);
            return err_setf(e, ERR_RANGE, "tensor '%s': element %s (%g) overflows %s (its largest finite "
                            "value is %g): keep the source dtype or use --dtype f32", t->name, at,
                            (double)tmp[bad], dtype_name(dt), dt == DTYPE_F16 ? 65504.0 : 3.3895313892515355e38);
        }
    }
    return 0;
}

/* st_read for --fuse-lora: a tensor the caller merged is read from its F32 values (cast to dt
 * and checked as st_read checks), the others as stored. */
static int fused_read(void *ud, const void *handle, enum dtype dt, int64_t elem0, int64_t n,
                      void *dst, struct err *e)
{
    const struct convert_opts *o = ud;
    const struct st_tensor *t = handle;
    const float *v = o->replace(o->replace_ud, t->name);
    if (!v)
        return st_read(NULL, handle, dt, elem0, n, dst, e);
    struct st_tensor f32 = *t;
    f32.dtype = DTYPE_F32;
    f32.data = v;
    return st_read(NULL, &f32, dt, elem0, n, dst, e);
}

/* One planned tensor read from source s (parts[0]). */
static int plan_one(struct ck_tensor *t, const struct st_tensor *s, enum dtype dt, struct err *e)
{
    memset(t, 0, sizeof *t);
    t->name = strdup(s->name);
    t->parts = malloc(sizeof *t->parts);
    if (!t->name || !t->parts)
        return err_setf(e, ERR_NOMEM, "out of memory");
    t->dtype = dt;
    t->ndim = s->ndim;
    memcpy(t->shape, s->shape, sizeof t->shape);
    t->n_parts = 1;
    t->parts[0] = s;
    return 0;
}

/* --fuse-lora over an MLX-quantized source (mlx-lm's fuse: dequantize, add, requantize): every
 * quantized weight the caller merged (o->replace) is planned as its logical [out, in] float
 * matrix in its scales' dtype, quantized again with the parameters config.json gives its
 * module, its old scales and biases dropped; a merged float weight (a module the source left
 * float) is written in its dtype; every other tensor is copied as stored. */
static int plan_fused_quantized(const struct st_set *set, const cJSON *cfg, const struct convert_opts *o,
                                struct ck_tensor **out, size_t *n_out, struct err *e)
{
    struct qconfig qc;
    size_t n = st_set_count(set), k = 0;
    int rc;
    if ((rc = qconfig_parse(&qc, cfg, e)) < 0)
        return rc;
    struct ck_tensor *t = calloc(n ? n : 1, sizeof *t);
    if (!t) {
        qconfig_free(&qc);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct st_tensor *s = st_set_at(set, i);
        char module[CK_MAX_NAME + 16];
        const char *dot = strrchr(s->name, '.');
        snprintf(module, sizeof module, "%.*s", dot ? (int)(dot - s->name) : 0, s->name);
        char wname[CK_MAX_NAME + 32];
        snprintf(wname, sizeof wname, "%s.weight", module);
        bool merged = o->replace(o->replace_ud, wname) != NULL;
        if (merged && (ends_with(s->name, ".scales") || ends_with(s->name, ".biases")))
            continue;  /* made again by the quantizer */
        const struct st_tensor *sc = NULL;
        if (!merged || !ends_with(s->name, ".weight") || dtype_is_float(s->dtype)) {
            /* copied as stored; a merged float weight (a module left float) reads its merge */
            rc = plan_one(&t[k++], s, s->dtype, e);
            continue;
        }
        snprintf(wname, sizeof wname, "%s.scales", module);
        struct qparams qp = qconfig_resolve(&qc, module);
        if (s->dtype != DTYPE_U32 || s->ndim != 2 || qp.bits <= 0 || qp.mode != QMODE_AFFINE ||
            !(sc = st_set_find(set, wname))) {
            rc = err_setf(e, ERR_UNSUPPORTED, "--fuse-lora: '%s' is not an affine-quantized weight "
                          "with its scales as config.json describes it", s->name);
            break;
        }
        if ((rc = plan_one(&t[k], s, sc->dtype, e)) < 0)
            break;
        t[k].shape[1] = s->shape[1] * 32 / qp.bits;  /* the logical width */
        t[k].quantize = true;
        t[k].has_qp = true;
        t[k].qp = (struct quant_params){.mode = qp.mode, .bits = qp.bits, .group = qp.group};
        k++;
    }
    qconfig_free(&qc);
    if (rc < 0) {
        ck_tensors_free(t, k);
        return rc;
    }
    *out = t;
    *n_out = k;
    return 0;
}

/* The files convert copies besides the weights: what Hugging Face and mlx-lm folders carry
 * for the tokenizer, generation and chat template, and the model card and licence texts. */
static bool is_metadata_file(const char *name)
{
    static const char *const names[] = {
        "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
        "added_tokens.json", "vocab.json", "merges.txt", "generation_config.json",
        "chat_template.jinja", "chat_template.json", "README.md", "USE_POLICY.md",
    };
    static const char *const prefixes[] = {"LICENSE", "LICENCE", "NOTICE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

struct metadata_copy {
    const char *src;
    size_t n_copied;
};

/* ck_folder.copy for convert: the allow-listed files of the source folder. */
static int copy_metadata(void *ud, struct outdir *od, struct err *e)
{
    struct metadata_copy *mc = ud;
    DIR *d = opendir(mc->src);
    int rc = 0;
    if (!d)
        return err_setf(e, ERR_IO, "cannot open %s: %s", mc->src, strerror(errno));
    for (struct dirent *de; rc == 0 && (de = readdir(d)) != NULL;) {
        if (is_metadata_file(de->d_name) && (rc = ck_copy_into(od, mc->src, de->d_name, e)) == 0)
            mc->n_copied++;
    }
    closedir(d);
    return rc;
}

int convert_checkpoint(const struct convert_opts *o, struct convert_stats *st, struct err *e)
{
    char path[4200];
    cJSON *cfg = NULL;
    struct st_set *set = NULL;
    struct ck_input *in = NULL;
    struct ck_tensor *t = NULL;
    size_t nt = 0;
    int rc;
    memset(st, 0, sizeof *st);
    if (strlen(o->src) > 4000 || strlen(o->dst) > 4000)
        return err_setf(e, ERR_ARG, "path too long");
    snprintf(path, sizeof path, "%s/config.json", o->src);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0)
        return rc;
    bool quantized = cfg_has(cfg, "quantization") || cfg_has(cfg, "quantization_config");
    if (quantized && (!o->replace || o->q || o->dtype >= 0)) {
        rc = err_setf(e, ERR_UNSUPPORTED, "%s is already quantized (re-quantizing is not supported%s)",
                      o->src, o->replace ? "; --fuse-lora keeps its quantization: drop -q and --dtype" : "");
        goto out;
    }
    /* the dtype mlx-lm casts to: the config's (a dtype that is none is refused) */
    int cfg_dt;
    if ((rc = cfg_model_dtype(cfg, &cfg_dt, e)) < 0) {
        err_prefix(e, "%s", path);
        goto out;
    }
    st->dtype = o->dtype >= 0 ? o->dtype : cfg_dt;
    if ((rc = st_set_open(&set, o->src, e)) < 0)
        goto out;
    st->n_inputs = st_set_count(set);
    in = calloc(st->n_inputs ? st->n_inputs : 1, sizeof *in);
    if (!in) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < st->n_inputs; i++) {
        const struct st_tensor *s = st_set_at(set, i);
        in[i] = (struct ck_input){s->name, s->dtype, s->ndim, {0}, s};
        memcpy(in[i].shape, s->shape, sizeof in[i].shape);
    }
    struct ck_plan_opts po = {o->rules, st->dtype, o->q, o->drop, o->predicate, o->views};
    if (quantized) {
        st->dtype = -1;
        if ((rc = plan_fused_quantized(set, cfg, o, &t, &nt, e)) < 0)
            goto out;
    } else if ((rc = ck_plan(in, st->n_inputs, &po, &t, &nt, e)) < 0) {
        goto out;
    }
    struct ck_reader rd = {o->replace ? fused_read : st_read, (void *)o};
    struct metadata_copy mc = {o->src, 0};
    struct ck_folder f = {o->dst, copy_metadata, &mc, o->q, &rd, o->progress, o->progress_ud, NULL, false};
    rc = ck_write_folder(&f, t, nt, cfg, &st->ck, e);
    st->n_copied = mc.n_copied;
out:
    ck_tensors_free(t, nt);
    free(in);
    st_set_free(set);
    cJSON_Delete(cfg);
    return rc;
}
