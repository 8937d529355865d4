/*
 * synth: recording a family's tensor list and writing random checkpoints
 * (synth.h). Each value is a function of (seed, tensor name, index) alone:
 * a tensor is cut into blocks of SYNTH_BLOCK elements, each with its own
 * stream, so one read is generated block by block on all the pool's threads
 * (and quantized on them, convert.c) with the same bytes for any thread
 * count, and any range can be read in any order.
 */
#include "synth.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/rng.h"
#include "../core/threadpool.h"
#include "../loading/config.h"
#include "registry.h"
#include "vision.h"

/* the HF initializer_range; biases a tenth of it so they stay small */
#define SYNTH_STD_WEIGHT 0.02f
#define SYNTH_STD_BIAS   0.002f

/* Where an image-text checkpoint's vision tower and projector live in transformers 5's
 * layout: a recording set answers "present" to the loader's probe for these (vision_load
 * tries several layouts), so synth writes that one. */
static const char *const k_vision_prefer[] = {
    "model.vision_tower.vision_model.embeddings.patch_embedding.weight",  /* SigLIP / CLIP towers */
    "model.visual.patch_embed.proj.weight",                              /* Qwen2/2.5/3-VL */
    NULL,
};

/* The tower and projector tensors: float in a quantized output, as mlx-vlm converts them. */
static const char *const k_vision_prefixes[] = {
    "model.vision_tower.", "model.visual.", "model.multi_modal_projector.", "model.vision_model.",
    "model.connector.", "vision_tower.", "visual.", "multi_modal_projector.", "vision_model.", "connector.", NULL,
};

bool synth_is_vision(const char *name)
{
    for (size_t i = 0; k_vision_prefixes[i]; i++)
        if (strncmp(name, k_vision_prefixes[i], strlen(k_vision_prefixes[i])) == 0)
            return true;
    return false;
}

/* An image-text checkpoint's tower and projector, recorded by the wrapper's vision family
 * (vision_load) into a set of its own, then added to rec; the text model's tensors, recorded
 * under the text family's names, move to transformers 5's "model.language_model." first. */
static int record_vision(struct model *m, struct st_set *rec, const cJSON *outer, struct err *e)
{
    struct st_set *vs = NULL;
    int rc;
    if ((rc = st_set_rename_prefix(rec, "model.", "model.language_model.", e)) < 0 ||
        (rc = st_set_new_recording(&vs, k_vision_prefer, e)) < 0)
        return rc;
    /* vision_load's steps, without its "runs text only" for a tower it does not find */
    const struct vision_ops *vo = vision_find(m->multimodal);
    struct vision *v = vo ? calloc(1, sizeof *v) : NULL;
    if (vo && !v)
        rc = err_setf(e, ERR_NOMEM, "out of memory");
    else if (vo) {
        v->ops = vo;
        m->st = vs;
        rc = vo->load(v, m, outer, e);
        m->st = NULL;
        if (rc < 0)
            err_prefix(e, "%s vision tower", m->multimodal);
        m->vision = v;  /* freed with m */
    }
    if (rc > 0 || (rc == 0 && !vo))
        rc = err_setf(e, ERR_UNSUPPORTED, "%s: synth cannot write this family's vision tower yet (it writes "
                      "gemma3's, llava's and the Qwen-VL ones)", m->multimodal);
    for (size_t i = 0; rc == 0 && i < st_set_count(vs); i++) {
        const struct st_tensor *t = st_set_at(vs, i);
        rc = st_set_record(rec, t->name, t->dtype, t->ndim, t->shape, e);
    }
    st_set_free(vs);
    return rc;
}

int synth_record(const cJSON *cfg_in, struct st_set **out, const struct model_ops **ops, struct err *e)
{
    struct model *m = calloc(1, sizeof *m);
    struct st_set *st = NULL;
    cJSON *cfg = cJSON_Duplicate(cfg_in, true), *outer = NULL;
    int rc;
    *out = NULL;
    if (!m || !cfg) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    hparams_init(&m->hp);
    /* an image-text wrapper (gemma3, qwen2_5_vl, ...): its text model, then its tower */
    if ((rc = model_nest_config(&cfg, &outer, m->multimodal, sizeof m->multimodal, e)) < 0 ||
        (rc = registry_resolve(cfg, &m->ops, e)) < 0 ||
        (rc = m->ops->parse_config(&m->hp, cfg, e)) < 0 ||
        (rc = hparams_validate(&m->hp, e)) < 0)
        goto out;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = st_set_new_recording(&st, m->ops->synth_prefer, e)) < 0 || (rc = m->ops->map_weights(m, st, e)) < 0 ||
        (m->multimodal[0] && (rc = record_vision(m, st, outer, e)) < 0))
        goto out;
    *ops = m->ops;
    *out = st;
    st = NULL;
out:
    st_set_free(st);
    model_free(m);  /* m->st is NULL: the recording set is not the model's */
    cJSON_Delete(cfg);
    cJSON_Delete(outer);
    return rc;
}

/* ---- generator ---- */

/* Elements per block of a tensor: each block draws from its own stream, so blocks are
 * generated on any thread in any order with the same result. Block 0's stream is the one
 * that used to cover the whole tensor, so tensors of at most this many elements keep the
 * bytes synth wrote before it ran on several threads. */
#define SYNTH_BLOCK ((int64_t)1 << 16)

struct nrng {
    struct rng r;
    float spare;
    bool has_spare;
};

/* FNV-1a of a tensor name, mixed into the seed: one family of streams per tensor. */
static uint64_t name_key(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    return seed ^ h;
}

/* Block b's stream. rng_seed takes 4 splitmix64 steps from its seed, so seeds 4 golden-ratio
 * steps apart give blocks disjoint state words. */
static void rng_init(struct nrng *r, uint64_t key, int64_t b)
{
    rng_seed(&r->r, key + (uint64_t)b * 4u * 0x9e3779b97f4a7c15ull);
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

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* One read split over the pool: elements [elem0, elem0 + n) of one tensor, block by block
 * (a block cut by the range's ends is generated from its start, values skipped). */
struct gen_job {
    uint64_t key;
    float std;
    enum dtype dt;
    int64_t elem0, n;
    void *dst;
    long n_blocks;            /* blocks the range touches */
    atomic_long next;         /* next of them to claim */
};

static void gen_block(const struct gen_job *j, int64_t b)
{
    int64_t lo = b * SYNTH_BLOCK, hi = lo + SYNTH_BLOCK;
    if (lo < j->elem0)
        lo = j->elem0;
    if (hi > j->elem0 + j->n)
        hi = j->elem0 + j->n;
    struct nrng r;
    rng_init(&r, j->key, b);
    /* element i of a block is the cosine (even i) or sine (odd i) half of pair i / 2,
     * and each pair takes two draws */
    for (int64_t i = b * SYNTH_BLOCK; i + 1 < lo; i += 2) {
        rng_next(&r.r);
        rng_next(&r.r);
    }
    if ((lo - b * SYNTH_BLOCK) % 2)
        (void)rng_normal(&r);
    for (int64_t i = lo; i < hi; i++)
        dtype_store_f32(j->dt, j->dst, i - j->elem0, j->std * rng_normal(&r));
}

static void gen_run(void *ctx, int ith, int nth)
{
    struct gen_job *j = ctx;
    int64_t b0 = j->elem0 / SYNTH_BLOCK;
    long lo, hi;
    (void)ith;
    while (tpool_claim_guided(&j->next, j->n_blocks, nth, &lo, &hi))
        for (long k = lo; k < hi; k++)
            gen_block(j, b0 + k);
}

struct gen {
    uint64_t seed;
    struct tpool *pool;       /* borrowed; NULL: the caller's thread */
};

/* ck_reader.read: any range of any tensor, in any order; each value depends on (seed,
 * tensor name, index) only. */
static int gen_read(void *ud, const void *handle, enum dtype dt, int64_t elem0, int64_t n, void *dst,
                    struct err *e)
{
    struct gen *g = ud;
    const struct st_tensor *t = handle;
    if (!dtype_is_float(dt))
        return err_setf(e, ERR_INTERNAL, "synth: cannot generate %s data", dtype_name(dt));
    if (n <= 0)
        return 0;
    if (t->ndim == 1 && ends_with(t->name, ".weight")) {  /* norms: ones */
        for (int64_t i = 0; i < n; i++)
            dtype_store_f32(dt, dst, i, 1.0f);
        return 0;
    }
    struct gen_job j = {
        .key = name_key(g->seed, t->name),
        .std = ends_with(t->name, ".bias") ? SYNTH_STD_BIAS : SYNTH_STD_WEIGHT,
        .dt = dt, .elem0 = elem0, .n = n, .dst = dst,
        .n_blocks = (long)((elem0 + n - 1) / SYNTH_BLOCK - elem0 / SYNTH_BLOCK + 1),
    };
    atomic_init(&j.next, 0);
    if (g->pool && j.n_blocks > 1)
        tpool_run(g->pool, gen_run, &j);
    else
        gen_run(&j, 0, 1);
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
    struct tpool *pool = NULL;
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
    for (size_t i = 0; i < nt; i++)  /* an image-text checkpoint's tower stays float (mlx-vlm's) */
        if (synth_is_vision(t[i].name))
            t[i].quantize = t[i].has_qp = false;
    int nth = o->n_threads > 0 ? o->n_threads : tpool_default_threads();
    if ((rc = tpool_new(&pool, nth < CK_MAX_THREADS ? nth : CK_MAX_THREADS, e)) < 0)
        goto out;
    struct gen g = {o->seed, pool};
    struct ck_reader rd = {gen_read, &g};
    bool tower = false;
    for (size_t i = 0; i < nt && !tower; i++)
        tower = synth_is_vision(t[i].name);
    struct ck_folder f = {o->dst, o->tokenizer ? copy_tokenizer : NULL, (void *)o->tokenizer,
                          o->q, &rd, o->progress, o->progress_ud, pool, tower};
    rc = ck_write_folder(&f, t, nt, cfg, &st->ck, e);
out:
    tpool_free(pool);
    ck_tensors_free(t, nt);
    free(in);
    st_set_free(rec);
    cJSON_Delete(cfg);
    return rc;
}
