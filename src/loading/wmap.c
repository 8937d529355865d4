/*
 * wmap: checked binding of checkpoint tensors (wmap.h).
 */
#include "wmap.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define NAME_MAX_LEN 512

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

static int check_shape(const struct tensor *t, const char *name, int ndim, const int64_t *shape,
                       struct err *e)
{
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (ok)
        return 0;
    char want[128], got[128];
    fmt_shape(want, sizeof want, ndim, shape);
    fmt_shape(got, sizeof got, t->ndim, t->shape);
    return err_setf(e, ERR_FORMAT, "tensor '%s': expected shape %s, got %s", name, want, got);
}

/* Kernels read elements through typed pointers: a file whose header is not padded to
 * a multiple of 8 bytes (legal, but no known writer does it) is refused, not misread. */
static int check_aligned(const struct tensor *t, const char *name, struct err *e)
{
    size_t a = dtype_size(t->dtype);
    if (a > 1 && (uintptr_t)t->data % a != 0)
        return err_setf(e, ERR_UNSUPPORTED, "tensor '%s': data is not %zu-byte aligned in the file", name, a);
    return 0;
}

static int take(struct wmap *w, const char *name, bool required, struct tensor *out, struct err *e)
{
    int rc = required ? st_set_take(w->st, name, out, e) : st_set_take_opt(w->st, name, out, e);
    if (rc < 0 || out->ndim == 0)
        return rc;
    return check_aligned(out, name, e);
}

static int take_float(struct wmap *w, const char *name, bool required, int ndim,
                      const int64_t *shape, struct tensor *out, struct err *e)
{
    int rc;
    /* `mlxcel synth`: a recording set learns the tensor from this request */
    if (st_set_is_recording(w->st) && (rc = st_set_record(w->st, name, DTYPE_F32, ndim, shape, e)) < 0)
        return rc;
    rc = take(w, name, required, out, e);
    if (rc < 0 || out->ndim == 0)
        return rc;
    if (!dtype_is_float(out->dtype))
        return err_setf(e, ERR_FORMAT, "tensor '%s': dtype %s is not F32, F16 or BF16", name,
                        dtype_name(out->dtype));
    return check_shape(out, name, ndim, shape, e);
}

int wm_tensor(struct wmap *w, struct tensor *out, bool required, int ndim, const int64_t *shape,
              struct err *e, const char *fmt, ...)
{
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return take_float(w, name, required, ndim, shape, out, e);
}

int wm_vec(struct wmap *w, struct tensor *out, bool required, int64_t n, struct err *e,
           const char *fmt, ...)
{
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return take_float(w, name, required, 1, &n, out, e);
}

bool wm_has(struct wmap *w, const char *fmt, ...)
{
    char name[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return st_set_find(w->st, name) != NULL || st_set_record_prefers(w->st, name);
}

/* MLX quantized module PREFIX with parameters p (validated by quant.c):
 *   PREFIX.weight  U32 [.., out, in * bits / 32]
 *   PREFIX.scales  [.., out, in / group]: F32/F16/BF16 (affine) or U8 (fp modes)
 *   PREFIX.biases  like scales, affine only (fp modes must not have one) */
static int take_quantized(struct wmap *w, const char *prefix, const struct qparams *p, int ndim,
                          const int64_t *shape, struct tensor *out, struct err *e)
{
    char name[NAME_MAX_LEN + 16];
    int64_t n_in = shape[ndim - 1];
    if (n_in % p->group != 0 || (n_in * p->bits) % 32 != 0)
        return err_setf(e, ERR_FORMAT,
                        "tensor '%s': input width %lld is not a multiple of the group size %d (%s, %d-bit)",
                        prefix, (long long)n_in, p->group, qmode_name(p->mode), p->bits);
    int64_t packed[TENSOR_MAX_DIMS], grouped[TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        packed[i] = grouped[i] = shape[i];
    packed[ndim - 1] = n_in * p->bits / 32;
    grouped[ndim - 1] = n_in / p->group;

    struct tensor wt, sc, bi = {0};
    int rc;
    snprintf(name, sizeof name, "%s.weight", prefix);
    if ((rc = take(w, name, true, &wt, e)) < 0)
        return rc;
    if (wt.dtype != DTYPE_U32)
        return err_setf(e, ERR_FORMAT, "tensor '%s': quantized weight must be U32, got %s", name,
                        dtype_name(wt.dtype));
    if ((rc = check_shape(&wt, name, ndim, packed, e)) < 0)
        return err_prefix(e, "%s, %d-bit group %d", qmode_name(p->mode), p->bits, p->group);
    snprintf(name, sizeof name, "%s.scales", prefix);
    if (p->mode == QMODE_AFFINE) {
        if ((rc = take_float(w, name, true, ndim, grouped, &sc, e)) < 0)
            return rc;
        snprintf(name, sizeof name, "%s.biases", prefix);
        if ((rc = take_float(w, name, true, ndim, grouped, &bi, e)) < 0)
            return rc;
        if (sc.dtype != bi.dtype)
            return err_setf(e, ERR_FORMAT, "tensor '%s': scales and biases differ in dtype", prefix);
    } else {
        if ((rc = take(w, name, true, &sc, e)) < 0)
            return rc;
        if (sc.dtype != DTYPE_U8)
            return err_setf(e, ERR_FORMAT, "tensor '%s': %s scales must be U8, got %s", name,
                            qmode_name(p->mode), dtype_name(sc.dtype));
        if ((rc = check_shape(&sc, name, ndim, grouped, e)) < 0)
            return rc;
        snprintf(name, sizeof name, "%s.biases", prefix);
        if (st_set_find(w->st, name))
            return err_setf(e, ERR_FORMAT, "tensor '%s': %s has no biases", name, qmode_name(p->mode));
    }
    *out = wt;
    for (int i = 0; i < ndim; i++)
        out->shape[i] = shape[i];
    out->qbits = p->bits;
    out->qgroup = p->group;
    out->qmode = p->mode;
    out->qsdtype = sc.dtype;
    out->qscales = sc.data;
    out->qbiases = p->mode == QMODE_AFFINE ? bi.data : NULL;
    return 0;
}

int wm_linear(struct wmap *w, struct tensor *out, bool required, int64_t n_lead, int64_t n_out,
              int64_t n_in, struct err *e, const char *fmt, ...)
{
    char prefix[NAME_MAX_LEN], name[NAME_MAX_LEN + 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    int64_t shape[3];
    int ndim = 0;
    if (n_lead > 0)
        shape[ndim++] = n_lead;
    shape[ndim++] = n_out;
    shape[ndim++] = n_in;

    /* Quantized iff PREFIX.scales exists and PREFIX.weight is U32; the config must agree. */
    snprintf(name, sizeof name, "%s.weight", prefix);
    const struct st_tensor *wt = st_set_find(w->st, name);
    snprintf(name, sizeof name, "%s.scales", prefix);
    const struct st_tensor *sc = st_set_find(w->st, name);
    const struct qoverride *ov = qconfig_find(w->qc, prefix);
    bool packed = wt && wt->dtype == DTYPE_U32;
    if (sc || packed) {
        if (!wt)
            return err_setf(e, ERR_MISSING, "tensor '%s.weight' is missing (its .scales exist)", prefix);
        if (!sc)
            return err_setf(e, ERR_FORMAT, "tensor '%s.weight' is U32 (quantized) but '%s.scales' is missing",
                            prefix, prefix);
        if (!packed)
            return err_setf(e, ERR_FORMAT, "tensor '%s.scales' exists but '%s.weight' is %s, not U32",
                            prefix, prefix, dtype_name(wt->dtype));
        if (!w->qc->present)
            return err_setf(e, ERR_CONFIG, "'%s' is quantized but config.json has no 'quantization'", prefix);
        if (ov && ov->p.bits == 0)
            return err_setf(e, ERR_CONFIG,
                            "config.json quantization says '%s' is float (false) but the checkpoint has it quantized",
                            prefix);
        struct qparams p = ov ? ov->p : w->qc->top;
        return take_quantized(w, prefix, &p, ndim, shape, out, e);
    }
    if (ov && ov->p.bits > 0 && wt)
        return err_setf(e, ERR_CONFIG,
                        "config.json quantization lists '%s' as quantized but '%s.weight' is %s with no .scales",
                        prefix, prefix, dtype_name(wt->dtype));
    snprintf(name, sizeof name, "%s.weight", prefix);
    return take_float(w, name, required, ndim, shape, out, e);
}
