/*
 * synth: recording a family's tensor list and writing random checkpoints
 * (synth.h). The generator is read strictly in order per tensor (the
 * convert pipeline reads each part once, front to back), which the reader
 * checks, so a tensor's values are fixed by (seed, name) alone.
 */
#include "synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/rng.h"
#include "../loading/config.h"
#include "registry.h"

/* the HF initializer_range; biases a tenth of it so they stay small */
#define SYNTH_STD_WEIGHT 0.02f
#define SYNTH_STD_BIAS   0.002f

int synth_record(const cJSON *cfg, struct st_set **out, const struct model_ops **ops, struct err *e)
{
    struct model *m = calloc(1, sizeof *m);
    struct st_set *st = NULL;
    int rc;
    *out = NULL;
    if (!m)
        return err_setf(e, ERR_NOMEM, "out of memory");
    hparams_init(&m->hp);
    if ((rc = registry_resolve(cfg, &m->ops, e)) < 0 ||
        (rc = m->ops->parse_config(&m->hp, cfg, e)) < 0 ||
        (rc = hparams_validate(&m->hp, e)) < 0)
        goto out;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = st_set_new_recording(&st, m->ops->synth_prefer, e)) < 0 || (rc = m->ops->map_weights(m, st, e)) < 0)
        goto out;
    *ops = m->ops;
    *out = st;
    st = NULL;
out:
    st_set_free(st);
    model_free(m);  /* m->st is NULL: the recording set is not the model's */
    return rc;
}

/* ---- generator ---- */

struct nrng {
    struct rng r;
    float spare;
    bool has_spare;
};

/* One stream per tensor: FNV-1a of the name mixed into the seed. */
static void rng_init(struct nrng *r, uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    rng_seed(&r->r, seed ^ h);
    r->has_spare = false;
}

/* Standard normal by Box-Muller; u1 in (0, 1] so log() is finite. */
static float rng_normal(struct nrng *r)
{
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u1 = (double)((rng_next(&r->r) >> 11) + 1) * 0x1.0p-53;
    double u2 = rng_uniform(&r->r);
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    r->spare = (float)(rad * sin(th));
    r->has_spare = true;
    return (float)(rad * cos(th));
}

struct gen {
    uint64_t seed;
    const struct st_tensor *cur;  /* tensor being generated */
    int64_t next;                 /* its next element */
    struct nrng r;
};

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int gen_read(void *ud, const void *handle, enum dtype dt, int64_t elem0, int64_t n, void *dst,
                    struct err *e)
{
    struct gen *g = ud;
    const struct st_tensor *t = handle;
    if (!dtype_is_float(dt))
        return err_setf(e, ERR_INTERNAL, "synth: cannot generate %s data", dtype_name(dt));
    if (g->cur != t || elem0 == 0) {
        if (elem0 != 0)
            return err_setf(e, ERR_INTERNAL, "synth: '%s' read out of order", t->name);
        g->cur = t;
        g->next = 0;
        rng_init(&g->r, g->seed, t->name);
    }
    if (elem0 != g->next)
        return err_setf(e, ERR_INTERNAL, "synth: '%s' read out of order", t->name);
    bool ones = t->ndim == 1 && ends_with(t->name, ".weight");
    float std = ends_with(t->name, ".bias") ? SYNTH_STD_BIAS : SYNTH_STD_WEIGHT;
    for (int64_t i = 0; i < n; i++)
        dtype_store_f32(dt, dst, i, ones ? 1.0f : std * rng_normal(&g->r));
    g->next += n;
    return 0;
}

/* ---- checkpoint ---- */

static const char *torch_dtype_name(enum dtype dt)
{
    return dt == DTYPE_F32 ? "float32" : dt == DTYPE_F16 ? "float16" : "bfloat16";
}

/* ck_folder.copy for --tokenizer: the tokenizer files of folder ud (a path); only
 * tokenizer.json is required. */
static int copy_tokenizer(void *ud, struct outdir *od, struct err *e)
{
    const char *src = ud;
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int rc = ck_copy_into(od, src, files[i], e);
        if (rc == -ERR_MISSING && i > 0)
            continue;
        if (rc < 0)
            return err_prefix(e, "--tokenizer");
    }
    return 0;
}

int synth_checkpoint(const struct synth_opts *o, struct synth_stats *st, struct err *e)
{
    cJSON *cfg = NULL;
    struct st_set *rec = NULL;
    const struct model_ops *ops = NULL;
    struct ck_input *in = NULL;
    struct ck_tensor *t = NULL;
    size_t nt = 0, n = 0;
    int rc;
    memset(st, 0, sizeof *st);
    if (strlen(o->dst) > 4000)
        return err_setf(e, ERR_ARG, "output path too long");
    if ((rc = cfg_load_file(o->config, FILE_USER, &cfg, e)) < 0)
        return rc;
    if ((rc = synth_record(cfg, &rec, &ops, e)) < 0) {
        err_prefix(e, "%s", o->config);
        goto out;
    }
    st->family = ops->family;
    int dt = o->dtype;
    if (dt < 0 && (rc = cfg_model_dtype(cfg, &dt, e)) < 0) {
        err_prefix(e, "%s", o->config);
        goto out;
    }
    st->dtype = dt >= 0 ? (enum dtype)dt : DTYPE_BF16;

    n = st_set_count(rec);
    if (!(in = calloc(n ? n : 1, sizeof *in))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *s = st_set_at(rec, i);
        in[i] = (struct ck_input){s->name, s->dtype, s->ndim, {0}, s};
        memcpy(in[i].shape, s->shape, sizeof in[i].shape);
    }
    struct ck_view_rule vbuf[CK_MAX_VIEWS];
    const struct ck_view_rule *views = NULL;
    if (o->q && (rc = model_convert_views(ops, cfg, vbuf, &views, e)) < 0)
        goto out;
    struct ck_plan_opts po = {o->q ? ops->expert_stacking : NULL, (int)st->dtype, o->q, NULL,
                              ops->quant_predicate, views};
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "dtype");  /* transformers 5's key would win */
    if (!cJSON_AddStringToObject(cfg, "torch_dtype", torch_dtype_name(st->dtype))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = ck_plan(in, n, &po, &t, &nt, e)) < 0)
        goto out;
    struct gen g = {.seed = o->seed};
    struct ck_reader rd = {gen_read, &g};
    struct ck_folder f = {o->dst, o->tokenizer ? copy_tokenizer : NULL, (void *)o->tokenizer,
                          o->q, &rd, o->progress, o->progress_ud};
    rc = ck_write_folder(&f, t, nt, cfg, &st->ck, e);
out:
    ck_tensors_free(t, nt);
    free(in);
    st_set_free(rec);
    cJSON_Delete(cfg);
    return rc;
}
