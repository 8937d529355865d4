/*
 * allocfail suite: out-of-memory injection in the manner of SQLite's OOM
 * tests. Each operation (model_load of a checkpoint; the engine: backend,
 * prepare, context, paged cache, a prefill, a fork and a batched decode;
 * tok_load plus an encode/decode; chat_tmpl_load plus a render;
 * oai_request_parse of a chat and a completions body plus the error JSON of
 * a rejected one) first runs once with the hook only counting (that run
 * also sets up anything lazily initialised), then
 * runs again with allocation N failing, for N = 1, 2, 3, ... until a run
 * completes with no failure injected, which must succeed with the expected
 * result (the golden output, or what a load without the hook gave).
 *
 * Every run with an injected failure must return -ERR_NOMEM with a message
 * in struct err, leave its out-pointer NULL, and give back every block it
 * took (alloc_hook_live() == 0, checked at the failing N; under ASan,
 * LeakSanitizer checks again at exit). A crash, abort or ASan report fails
 * the suite outright.
 *
 * Only our code's allocations are injected (tests/alloc_hook.c wraps the
 * allocators at link time, and cJSON is pointed at the wrappers); PCRE2 and
 * utf8proc allocate inside their shared libraries, out of reach.
 *
 * The large tokenizer fixtures run with a stride (test_tokenizer says why);
 * MLXCEL_ALLOCFAIL_FULL=1 in the environment fails every allocation of
 * every fixture instead (test_tokenizer alone: about 27 minutes on two
 * shared cores in a release build, longer under ASan).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "alloc_hook.h"
#include "core/fileio.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/vision.h"
#include "server/oai_request.h"
#include "template/template.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* One operation under test, performed on arg; on success it calls
 * alloc_hook_stop(), checks its results and frees them. On failure it frees
 * whatever the test itself held and returns the operation's status. */
typedef int (*alloc_op)(const void *arg, struct err *e);

/* Call sites already failed at least once by this process, so that a
 * fixture looped with a stride still fails every site no earlier loop did. */
static struct alloc_site g_failed_sites[4096];
static size_t g_n_failed_sites;
/* File-scope so that teardown frees them when an assertion fails mid-loop. */
static bool *g_plan;     /* [total + 1] the n to fail */
static cJSON *g_golden;  /* golden.json of the fixture under test */

/* Marks s as failed; true when it had not been before (or the table is full). */
static bool site_mark(struct alloc_site s)
{
    for (size_t i = 0; i < g_n_failed_sites; i++)
        if (g_failed_sites[i].at == s.at && g_failed_sites[i].from == s.from)
            return false;
    if (g_n_failed_sites < sizeof g_failed_sites / sizeof g_failed_sites[0])
        g_failed_sites[g_n_failed_sites++] = s;
    return true;
}

/* Runs op with allocation n failing, for n = 1, 2, 3, ... until a run sees
 * no failure injected. With max_runs > 0 (for fixtures whose every run is
 * slow), n steps by a stride instead, giving about max_runs runs, plus the
 * first allocation of every call site (alloc_hook_site) not failed before. */
static void check_alloc_failures(const char *what, alloc_op op, const void *arg, long max_runs)
{
    struct err e = {0};
    alloc_hook_arm(0);
    int rc = op(arg, &e);
    long total = alloc_hook_count();
    alloc_hook_disarm();
    if (rc < 0)
        fail_msg("%s: counting run failed: %s", what, e.msg);
    if (getenv("MLXCEL_ALLOCFAIL_FULL"))
        max_runs = 0;
    long stride = max_runs > 0 && total > max_runs ? total / max_runs : 1;
    free(g_plan);
    g_plan = calloc((size_t)total + 1, sizeof *g_plan);
    assert_non_null(g_plan);
    for (long i = 1; i <= total; i++)
        g_plan[i] = site_mark(alloc_hook_site(i)) || (i - 1) % stride == 0;
    long n, runs = 0;
    for (n = 1;; n++) {
        if (n <= total && !g_plan[n])
            continue;
        runs++;
        err_clear(&e);
        alloc_hook_arm(n);
        rc = op(arg, &e);
        bool injected = alloc_hook_injected();
        size_t live = alloc_hook_live();
        alloc_hook_disarm();
        if (live)
            fail_msg("%s: allocation %ld of %ld failed: %zu blocks leaked (rc %d: %s)", what, n, total, live,
                     rc, e.msg);
        if (!injected) {
            if (rc < 0)
                fail_msg("%s: run without a failure failed: %s", what, e.msg);
            break;
        }
        if (rc >= 0)
            fail_msg("%s: allocation %ld of %ld failed, yet the operation succeeded", what, n, total);
        if (rc != -ERR_NOMEM || e.code != ERR_NOMEM || !e.msg[0])
            fail_msg("%s: allocation %ld of %ld failed: rc %d, error %s '%s' (want out of memory)", what, n,
                     total, rc, err_code_name(e.code), e.msg);
    }
    free(g_plan);
    g_plan = NULL;
    fprintf(stderr, "allocfail: %s: %ld allocations, %ld runs, %zu sites\n", what, total, runs, g_n_failed_sites);
}

/* golden.json of a tokenizer fixture, parsed into g_golden. */
static cJSON *load_golden(const char *dir)
{
    char path[4200], *text = NULL;
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (file_read_all(path, 1u << 20, &text, NULL, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON_Delete(g_golden);
    g_golden = cJSON_Parse(text);
    free(text);
    assert_non_null(g_golden);
    return g_golden;
}

/* ---- model load ---- */

struct model_case {
    const char *dir;
    int64_t n_params;      /* of a load without the hook */
    uint64_t weight_bytes;
};

static int op_model_load(const void *arg, struct err *e)
{
    const struct model_case *c = arg;
    struct model *m = NULL;
    int rc = model_load(&m, c->dir, e);
    if (rc < 0) {
        assert_null(m);
        return rc;
    }
    alloc_hook_stop();
    assert_int_equal(model_n_params(m), c->n_params);
    assert_int_equal(model_weight_bytes(m), c->weight_bytes);
    model_free(m);
    return 0;
}

static void test_model_load(void **state)
{
    (void)state;
    static const char *const dirs[] = {
        "models/llama-tiny",
        "tests/fixtures/models/phixtral-tiny",    /* MoE, per-expert tensors */
        "models/phixtral-tiny-4bit",              /* mlx 4-bit */
        "tests/fixtures/golden/llama",            /* sharded: 9 files and an index */
        "tests/fixtures/golden/phixtral_mlx_q4",  /* mlx 4-bit, stacked experts */
        "tests/fixtures/golden/gemma3_vision",    /* a text model with its vision tower (ADR 0088) */
        "tests/fixtures/golden/qwen2_5_vl",       /* M-RoPE text model, windowed tower (ADR 0094, 0095) */
    };
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        struct model_case c = {test_path(dirs[i]), 0, 0};
        struct model *m = NULL;
        struct err e = {0};
        if (model_load(&m, c.dir, &e) < 0)
            fail_msg("%s", e.msg);
        c.n_params = model_n_params(m);
        c.weight_bytes = model_weight_bytes(m);
        model_free(m);
        check_alloc_failures(dirs[i], op_model_load, &c, 0);
    }
}

/* ---- images: every format's decoder, EXIF transposes, 16-bit and interlaced PNG ---- */

static int op_image(const void *arg, struct err *e)
{
    struct image im;
    int rc = image_load(&im, arg, NULL, e);
    if (rc == 0)
        image_free(&im);
    return rc;
}

static void test_image(void **state)
{
    (void)state;
    static const char *const files[] = {"photo.jpg", "cmyk.jpg", "exif6.jpg", "interlaced.png", "gray16.png",
                                        "exif8.png", "photo.webp", "animated.webp", "animated.gif"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tests/fixtures/images/%s", files[i]);
        check_alloc_failures(files[i], op_image, test_path(rel), 0);
    }
}

/* ---- image processors: every kind, both backends, crops, tiles, padding ---- */

struct preprocess_case {
    struct image_proc_config cfg;
    struct image im;
};

static int op_preprocess(const void *arg, struct err *e)
{
    const struct preprocess_case *c = arg;
    struct image_pixels px;
    int rc = image_preprocess(&px, &c->cfg, &c->im, e);
    if (rc == 0)
        image_pixels_free(&px);
    return rc;
}

static void test_preprocess(void **state)
{
    (void)state;
    struct preprocess_case c = {.im = {45, 20, malloc(45 * 20 * 3), IMAGE_PNG}};
    assert_non_null(c.im.rgb);
    for (size_t i = 0; i < 45 * 20 * 3; i++)
        c.im.rgb[i] = (uint8_t)(i * 7);
    static const enum image_proc_kind kinds[] = {IMAGE_PROC_GEMMA3, IMAGE_PROC_QWEN2VL, IMAGE_PROC_CLIP,
                                                 IMAGE_PROC_SIGLIP, IMAGE_PROC_PIXTRAL, IMAGE_PROC_IDEFICS3};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int b = 0; b < 2; b++) {
            image_proc_config_default(&c.cfg, kinds[k]);
            c.cfg.backend = b ? IMAGE_BACKEND_PIL : IMAGE_BACKEND_TORCHVISION;
            c.cfg.height = c.cfg.width = 16;            /* Gemma 3, SigLIP */
            c.cfg.do_pan_and_scan = true;               /* Gemma 3: 2 crops */
            c.cfg.pas_min_crop_size = 8;
            c.cfg.shortest_edge = 12;                   /* CLIP: crop larger than the image: padding */
            c.cfg.crop_height = c.cfg.crop_width = 14;
            c.cfg.max_pixels = 28 * 28 * 4;             /* Qwen */
            c.cfg.longest_edge = 40;                    /* Pixtral, Idefics3: 2 x 3 tiles */
            c.cfg.max_image_size = 16;
            char what[64];
            snprintf(what, sizeof what, "preprocess kind %d backend %d", (int)kinds[k], b);
            check_alloc_failures(what, op_preprocess, &c, 0);
        }
    free(c.im.rgb);
}

/* ---- the engine: backend, context, paged cache, batched forwards, fork ---- */

struct engine_case {
    struct model *m;        /* loaded outside the hook */
    float want[2];          /* logits[0] of the two sequences after the fork, from a clean run */
    bool have_want;
};

/* Everything a server step does with memory: create the backend, prepare the model, make a
 * context and a paged cache, prefill a prompt, fork the sequence, decode one token on each. */
static int op_engine(const void *arg, struct err *e)
{
    struct engine_case *c = (struct engine_case *)arg;
    static const int32_t prompt[6] = {5, 17, 42, 8, 99, 3};
    struct kv_params kp = {.n_tokens = 32, .max_seqs = 2, .block_size = 4, .dtype = DTYPE_F32};
    struct backend *be = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_cache *kv = NULL;
    struct batch b = {0};
    float *logits = NULL;
    int rc;
    if ((rc = backend_new(&be, "cpu", 1, test_backend_opts(), e)) < 0 || (rc = model_prepare(c->m, be, e)) < 0 ||
        (rc = model_ctx_new(&ctx, c->m, be, 0, e)) < 0 || (rc = kv_cache_new(&kv, c->m, be, &kp, e)) < 0 ||
        (rc = batch_init(&b, 8, e)) < 0)
        goto out;
    logits = malloc(2 * (size_t)c->m->hp.n_vocab * sizeof *logits);
    if (!logits) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = kv_seq_add(kv, 0, e)) < 0 || (rc = batch_add_seq(&b, prompt, 6, 0, 0, true, e)) < 0 ||
        (rc = model_forward(ctx, &b, kv, logits, e)) < 0 || (rc = kv_seq_fork(kv, 0, 1, e)) < 0)
        goto out;
    batch_clear(&b);
    if ((rc = batch_add(&b, 7, 6, 0, true, e)) < 0 || (rc = batch_add(&b, 9, 6, 1, true, e)) < 0 ||
        (rc = model_forward(ctx, &b, kv, logits, e)) < 0)
        goto out;
    alloc_hook_stop();
    float got[2] = {logits[0], logits[c->m->hp.n_vocab]};
    if (c->have_want) {
        assert_true(got[0] == c->want[0] && got[1] == c->want[1]);
    } else {
        memcpy(c->want, got, sizeof got);
        c->have_want = true;
    }
out:
    free(logits);
    batch_free(&b);
    kv_cache_free(kv);
    model_ctx_free(ctx);
    backend_free(be);
    return rc;
}

/* The scheduler: two requests through continuous batching; a failure in a request ends it
 * with the error (on_done), which the op reports. On a recurrent model (LFM2) with one
 * prefix-cache snapshot slot: kv_cache_new's snapshot bookkeeping, and the slot's buffer taken
 * at the first snapshot (whose failure the scheduler survives: reported by the op). */
struct sched_out {
    int n_done, rc;
    struct err e;
};

static void sched_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct sched_out *o = ud;
    (void)st;
    o->n_done++;
    if (rc < 0 && o->rc == 0) {
        o->rc = rc;
        o->e = *e;
    }
}

static int op_sched(const void *arg, struct err *e)
{
    const struct engine_case *c = arg;
    static const int32_t prompt[5] = {5, 17, 42, 8, 99};
    /* one prefix-cache snapshot slot (recurrent models): its buffer is all or nothing */
    struct kv_params kp = {.n_tokens = 32, .max_seqs = 2, .block_size = 4, .dtype = DTYPE_F32, .n_snap = 1};
    struct gen_params gp = {.n_predict = 3, .ignore_eos = true};
    struct backend *be = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_cache *kv = NULL;
    struct sched *s = NULL;
    struct sched_out o = {0};
    int rc;
    sampler_params_default(&gp.sampling);
    if ((rc = backend_new(&be, "cpu", 1, test_backend_opts(), e)) < 0 || (rc = model_prepare(c->m, be, e)) < 0 ||
        (rc = model_ctx_new(&ctx, c->m, be, 0, e)) < 0 || (rc = kv_cache_new(&kv, c->m, be, &kp, e)) < 0 ||
        (rc = sched_new(&s, ctx, kv, NULL, e)) < 0 ||
        (rc = sched_submit(s, prompt, 5, &gp, &(struct sched_cb){.on_done = sched_done, .ud = &o}, NULL, e)) < 0 ||
        (rc = sched_submit(s, prompt, 3, &gp, &(struct sched_cb){.on_done = sched_done, .ud = &o}, NULL, e)) < 0)
        goto out;
    while (sched_step(s, e) > 0)
        ;
    if (o.rc < 0) {
        rc = o.rc;
        *e = o.e;
        goto out;
    }
    if (kv->snap.failed) {
        /* the scheduler warns and goes on without prefix hits (ADR 0129): the one allocation
         * whose failure is not an error; reported here so that the run counts as failed */
        rc = err_setf(e, ERR_NOMEM, "prefix-cache snapshots: out of memory (the requests ran without them)");
        goto out;
    }
    alloc_hook_stop();
    assert_int_equal(o.n_done, 2);
    if (kv_has_recurrent(kv))
        assert_int_equal(kv_n_snapshots(kv), 1);
out:
    sched_free(s);
    kv_cache_free(kv);
    model_ctx_free(ctx);
    backend_free(be);
    return rc;
}

static void test_engine(void **state)
{
    (void)state;
    static const char *const dirs[] = {"models/llama-tiny", "tests/fixtures/golden/phixtral_mlx_q4",
                                       "tests/fixtures/golden/lfm2"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        struct engine_case c = {0};
        struct err e = {0};
        if (model_load(&c.m, test_path(dirs[i]), &e) < 0)
            fail_msg("%s", e.msg);
        assert_int_equal(op_engine(&c, &e), 0);
        check_alloc_failures(dirs[i], op_engine, &c, 0);
        check_alloc_failures(dirs[i], op_sched, &c, 0);
        model_free(c.m);
    }
}

/* ---- an image prompt: the vision tower's context and encoding, a prefill with its rows ---- */

struct vision_case {
    struct model *m;        /* gemma3_vision, loaded outside the hook */
    const float *pixels;    /* its golden pixel_values, image 0 */
    const int32_t *ids;     /* its golden prompt */
    int n_ids, img_pos;     /* the prompt's length, its image's first position */
    float want;             /* the last row's logits[0] of a clean run */
    bool have_want;
};

static int op_vision(const void *arg, struct err *e)
{
    struct vision_case *c = (struct vision_case *)arg;
    struct kv_params kp = {.n_tokens = 64, .max_seqs = 1, .block_size = 4, .dtype = DTYPE_F32};
    struct backend *be = NULL;
    struct vision_ctx *vc = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_cache *kv = NULL;
    struct batch b = {0};
    float *embd = NULL, *logits = NULL;
    int rc, T = c->m->vision->info.tokens_per_image;
    if ((rc = backend_new(&be, "cpu", 1, test_backend_opts(), e)) < 0 || (rc = model_prepare(c->m, be, e)) < 0 ||
        (rc = vision_ctx_new(&vc, c->m, be, e)) < 0 ||
        (rc = be->ops->buf_alloc(be, vision_embd_bytes(c->m), (void **)&embd, e)) < 0 ||
        (rc = vision_encode(vc, embd, c->pixels, 1, e)) < 0 || (rc = model_ctx_new(&ctx, c->m, be, 0, e)) < 0 ||
        (rc = kv_cache_new(&kv, c->m, be, &kp, e)) < 0 || (rc = batch_init(&b, 64, e)) < 0)
        goto out;
    if (!(logits = malloc((size_t)c->m->hp.n_vocab * sizeof *logits))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    struct batch_image img = {0, c->img_pos, T, embd, 0, 0, 0};
    if ((rc = kv_seq_add(kv, 0, e)) < 0 || (rc = batch_add_seq(&b, c->ids, c->n_ids, 0, 0, true, e)) < 0)
        goto out;
    b.img = &img;
    b.n_img = 1;
    if ((rc = model_forward(ctx, &b, kv, logits, e)) < 0)
        goto out;
    alloc_hook_stop();
    if (c->have_want) {
        assert_true(logits[0] == c->want);
    } else {
        c->want = logits[0];
        c->have_want = true;
    }
out:
    free(logits);
    batch_free(&b);
    kv_cache_free(kv);
    model_ctx_free(ctx);
    if (embd)
        be->ops->buf_free(be, embd);
    vision_ctx_free(vc);
    backend_free(be);
    return rc;
}

static void test_vision(void **state)
{
    (void)state;
    const char *dir = test_path("tests/fixtures/golden/gemma3_vision");
    char path[4200];
    struct vision_case c = {0};
    struct st_set *gs = NULL;
    struct tensor px, ids;
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (model_load(&c.m, dir, &e) < 0 || st_set_open_file(&gs, path, &e) < 0 ||
        st_set_take(gs, "pixel_values", &px, &e) < 0 || st_set_take(gs, "input_ids", &ids, &e) < 0)
        fail_msg("%s", e.msg);
    c.pixels = px.data;
    c.ids = ids.data;
    c.n_ids = (int)ids.shape[0];
    while (c.img_pos < c.n_ids && c.ids[c.img_pos] != c.m->vision->info.image_token_id)
        c.img_pos++;
    assert_int_equal(op_vision(&c, &e), 0);
    check_alloc_failures("gemma3_vision", op_vision, &c, 0);
    st_set_free(gs);
    model_free(c.m);
}

/* ---- a Qwen2.5-VL image prompt: its tower's buffers grown to the image, the window order, the
 * M-RoPE positions, a prefill with the image's rows (ADR 0094, 0095) ---- */

struct qwen_case {
    struct model *m;        /* qwen2_5_vl, loaded outside the hook */
    const float *pixels;    /* its golden pixel_values (image 0) */
    int32_t grid[3];        /* image 0's grid */
    const int32_t *ids;
    int n_ids, img_pos, n_tok;
    float want;
    bool have_want;
};

static int op_qwen(const void *arg, struct err *e)
{
    struct qwen_case *c = (struct qwen_case *)arg;
    struct kv_params kp = {.n_tokens = 128, .max_seqs = 1, .block_size = 4, .dtype = DTYPE_F32};
    struct backend *be = NULL;
    struct vision_ctx *vc = NULL;
    struct model_ctx *ctx = NULL;
    struct kv_cache *kv = NULL;
    struct batch b = {0};
    float *embd = NULL, *logits = NULL;
    int32_t *p3 = NULL, delta;
    int rc, D = c->m->hp.n_embd, merge = c->m->vision->info.merge;
    int32_t gm[2] = {c->grid[1] / merge, c->grid[2] / merge};
    if ((rc = backend_new(&be, "cpu", 1, test_backend_opts(), e)) < 0 || (rc = model_prepare(c->m, be, e)) < 0 ||
        (rc = vision_ctx_new(&vc, c->m, be, e)) < 0 ||
        (rc = be->ops->buf_alloc(be, (size_t)c->n_tok * D * sizeof(float), (void **)&embd, e)) < 0 ||
        (rc = vision_encode_grid(vc, embd, c->pixels, c->grid, e)) < 0 ||
        (rc = model_ctx_new(&ctx, c->m, be, 0, e)) < 0 || (rc = kv_cache_new(&kv, c->m, be, &kp, e)) < 0 ||
        (rc = batch_init(&b, 128, e)) < 0)
        goto out;
    logits = malloc((size_t)c->m->hp.n_vocab * sizeof *logits);
    p3 = malloc((size_t)c->n_ids * 3 * sizeof *p3);
    if (!logits || !p3) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    struct batch_image img = {0, c->img_pos, c->n_tok, embd, gm[0], gm[1], 0};
    if ((rc = vision_mrope_positions(p3, &delta, c->ids, c->n_ids, c->m->vision->info.image_token_id, gm, 1, e)) < 0 ||
        (rc = kv_seq_add(kv, 0, e)) < 0 || (rc = batch_add_seq(&b, c->ids, c->n_ids, 0, 0, true, e)) < 0 ||
        (rc = batch_rope_set(&b, 0, c->n_ids, p3, 0, e)) < 0)
        goto out;
    b.img = &img;
    b.n_img = 1;
    if ((rc = model_forward(ctx, &b, kv, logits, e)) < 0)
        goto out;
    alloc_hook_stop();
    if (c->have_want) {
        assert_true(logits[0] == c->want);
    } else {
        c->want = logits[0];
        c->have_want = true;
    }
out:
    free(logits);
    free(p3);
    batch_free(&b);
    kv_cache_free(kv);
    model_ctx_free(ctx);
    if (embd)
        be->ops->buf_free(be, embd);
    vision_ctx_free(vc);
    backend_free(be);
    return rc;
}

static void test_qwen_vision(void **state)
{
    (void)state;
    const char *dir = test_path("tests/fixtures/golden/qwen2_5_vl");
    char path[4200];
    struct qwen_case c = {0};
    struct st_set *gs = NULL;
    struct tensor px, ids, grid;
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (model_load(&c.m, dir, &e) < 0 || st_set_open_file(&gs, path, &e) < 0 ||
        st_set_take(gs, "pixel_values", &px, &e) < 0 || st_set_take(gs, "input_ids", &ids, &e) < 0 ||
        st_set_take(gs, "image_grid_thw", &grid, &e) < 0)
        fail_msg("%s", e.msg);
    c.pixels = px.data;
    c.ids = ids.data;
    c.n_ids = (int)ids.shape[0];
    memcpy(c.grid, grid.data, sizeof c.grid);
    while (c.img_pos < c.n_ids && c.ids[c.img_pos] != c.m->vision->info.image_token_id)
        c.img_pos++;
    while (c.img_pos + c.n_tok < c.n_ids && c.ids[c.img_pos + c.n_tok] == c.m->vision->info.image_token_id)
        c.n_tok++;
    assert_int_equal(c.n_tok, vision_grid_tokens(c.m->vision, c.grid, &e));
    assert_int_equal(op_qwen(&c, &e), 0);
    check_alloc_failures("qwen2_5_vl", op_qwen, &c, 0);
    st_set_free(gs);
    model_free(c.m);
}

/* ---- tokenizer load, encode, decode ---- */

/* golden.json encode cases run after loading: accented words (normalizers,
 * multi-byte pieces) and an added token between two words. */
static const int k_tok_cases[] = {19, 32};
#define N_TOK_CASES (int)(sizeof k_tok_cases / sizeof k_tok_cases[0])

struct tok_case {
    char json[128];         /* the decompressed tokenizer.json */
    char config[4200];      /* tokenizer_config.json */
    const cJSON *golden[N_TOK_CASES];
};

/* Every id of got equals want (a JSON array). */
static void assert_ids(const int32_t *got, size_t n, const cJSON *want)
{
    assert_int_equal(n, (size_t)cJSON_GetArraySize(want));
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], cJSON_GetArrayItem(want, (int)i)->valueint);
}

/* Load, then encode (with special tokens) and decode (skipping them) each case. */
static int op_tokenizer(const void *arg, struct err *e)
{
    const struct tok_case *c = arg;
    struct tokenizer *t = NULL;
    int32_t *ids[N_TOK_CASES] = {0};
    size_t n[N_TOK_CASES] = {0};
    char *text[N_TOK_CASES] = {0};
    int rc = tok_load_files(&t, c->json, c->config, e);
    if (rc < 0) {
        assert_null(t);
        return rc;
    }
    for (int i = 0; i < N_TOK_CASES && rc == 0; i++) {
        const char *s = cJSON_GetObjectItem(c->golden[i], "text")->valuestring;
        if ((rc = tok_encode(t, s, strlen(s), true, &ids[i], &n[i], e)) == 0)
            rc = tok_decode(t, ids[i], n[i], true, &text[i], e);
    }
    if (rc == 0) {
        alloc_hook_stop();
        for (int i = 0; i < N_TOK_CASES; i++) {
            assert_ids(ids[i], n[i], cJSON_GetObjectItem(c->golden[i], "ids_with_special"));
            assert_string_equal(text[i], cJSON_GetObjectItem(c->golden[i], "decoded_skip_special")->valuestring);
        }
    }
    for (int i = 0; i < N_TOK_CASES; i++) {
        free(ids[i]);
        free(text[i]);
    }
    tok_free(t);
    return rc;
}

/* The fixture's tokenizer.json.xz is decompressed into a temporary folder,
 * as the tokenizer suite does. */
static void check_tokenizer(const char *name, long max_runs)
{
    char dir[64] = "/tmp/mlxcel_allocfail_XXXXXX", cmd[4600], rel[128];
    struct tok_case c;
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizers/%s", name);
    const char *src = test_path(rel);
    assert_non_null(mkdtemp(dir));
    snprintf(c.json, sizeof c.json, "%s/tokenizer.json", dir);
    snprintf(c.config, sizeof c.config, "%s/tokenizer_config.json", src);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/tokenizer.json.xz' > '%s'", src, c.json);
    assert_int_equal(system(cmd), 0);
    const cJSON *g = load_golden(src);
    for (int i = 0; i < N_TOK_CASES; i++)
        assert_non_null(c.golden[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "encode"), k_tok_cases[i]));
    check_alloc_failures(name, op_tokenizer, &c, max_runs);
    unlink(c.json);
    rmdir(dir);
}

/* Each fixture the tokenizer suite uses. Only shakespeare (2k vocab, a
 * few ms per load) fails every allocation; the others take 70-350 ms per
 * load under ASan, so they run with a stride (about max_runs runs) plus
 * the first allocation of every call site shakespeare did not reach (their
 * normalizers, pre-tokenizers and decoders), which keeps the suite within
 * half a minute on two cores. */
static void test_tokenizer(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        long max_runs;
    } k_fixtures[] = {
        {"shakespeare", 0}, {"gpt2", 24}, {"llama2", 24}, {"mistral_spm", 24}, {"llama3_1", 12}, {"qwen3", 12},
    };
    for (size_t i = 0; i < sizeof k_fixtures / sizeof k_fixtures[0]; i++)
        check_tokenizer(k_fixtures[i].name, k_fixtures[i].max_runs);
}

/* ---- encoder tokenizers: load, pair encode with truncation, decode ---- */

/* The decompressed tokenizer.json of an encoder fixture: WordPiece, Unigram
 * with a Precompiled charsmap, WordLevel. */
static int op_tokenizer_enc(const void *arg, struct err *e)
{
    static const char k_a[] = "Caf\xc3\xa9? \xef\xbc\xa1\xef\xbc\xa2 \xe4\xb8\xad\xe6\x96\x87 unbelievable!";
    static const char k_b[] = "What light through yonder window breaks? It is the east.";
    struct tok_encode_opts o = {.add_special = true, .max_length = 12};
    struct tok_encoding enc = {0};
    struct tokenizer *t = NULL;
    char *text = NULL;
    int rc = tok_load_files(&t, (const char *)arg, NULL, e);
    if (rc < 0) {
        assert_null(t);
        return rc;
    }
    if ((rc = tok_encode_pair(t, k_a, sizeof k_a - 1, k_b, sizeof k_b - 1, &o, &enc, e)) == 0) {
        assert_true(enc.n > 0 && enc.n <= 12);
        rc = tok_decode(t, enc.ids, enc.n, true, &text, e);
    } else {
        assert_null(enc.ids);
    }
    free(text);
    tok_encoding_deinit(&enc);
    tok_free(t);
    return rc;
}

/* The loads take a few ms each: 40 runs a fixture, plus the first
 * allocation of every call site. */
static void test_tokenizer_enc(void **state)
{
    (void)state;
    static const char *const k_fixtures[] = {"bert_uncased", "xlmr_unigram", "wordlevel"};
    for (size_t i = 0; i < sizeof k_fixtures / sizeof k_fixtures[0]; i++) {
        char dir[64] = "/tmp/mlxcel_allocfail_XXXXXX", cmd[4600], rel[128], json[128];
        snprintf(rel, sizeof rel, "tests/fixtures/tokenizers/%s", k_fixtures[i]);
        assert_non_null(mkdtemp(dir));
        snprintf(json, sizeof json, "%s/tokenizer.json", dir);
        snprintf(cmd, sizeof cmd, "xz -dc '%s/tokenizer.json.xz' > '%s'", test_path(rel), json);
        assert_int_equal(system(cmd), 0);
        check_alloc_failures(k_fixtures[i], op_tokenizer_enc, json, 40);
        unlink(json);
        rmdir(dir);
    }
}

/* ---- chat template render ---- */

struct chat_case {
    const char *dir;
    const cJSON *chat;  /* a golden.json chat case */
};

static int op_chat(const void *arg, struct err *e)
{
    const struct chat_case *c = arg;
    struct chat_tmpl *ct = NULL;
    char *out = NULL;
    size_t len = 0;
    int rc = chat_tmpl_load(&ct, c->dir, NULL, e);
    if (rc < 0) {
        assert_null(ct);
        return rc;
    }
    rc = chat_tmpl_apply(ct, cJSON_GetObjectItem(c->chat, "messages"),
                         cJSON_IsTrue(cJSON_GetObjectItem(c->chat, "add_generation_prompt")),
                         cJSON_GetObjectItem(c->chat, "extra"), &out, &len, e);
    if (rc == 0) {
        alloc_hook_stop();
        assert_string_equal(out, cJSON_GetObjectItem(c->chat, "rendered")->valuestring);
    }
    free(out);
    chat_tmpl_free(ct);
    return rc;
}

static void check_chat(const char *name, int case_no)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizers/%s", name);
    struct chat_case c = {test_path(rel), NULL};
    const cJSON *g = load_golden(c.dir);
    assert_non_null(c.chat = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "chat"), case_no));
    snprintf(rel, sizeof rel, "chat %s case %d", name, case_no);
    check_alloc_failures(rel, op_chat, &c, 0);
}

/* Two real templates: Llama 3.1's (a system turn and a conversation) and
 * Qwen3's (a conversation; tools passed as an extra variable). */
static void test_chat(void **state)
{
    (void)state;
    check_chat("llama3_1", 4);
    check_chat("qwen3", 4);
    check_chat("qwen3", 9);
}

/* ---- the OpenAI request parser ---- */

/* A chat body using every allocating field, a completions body with token ids, and the
 * error JSON of a rejected body. A 500 from the parser is the out-of-memory error. */
static int op_oai_request(const void *arg, struct err *e)
{
    (void)arg;
    static const char *const bodies[2] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
        "\"stop\":[\"x\",\"yy\"],\"logit_bias\":{\"5\":1,\"6\":-2},\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true}}",
        "{\"prompt\":[1,2,3],\"stop\":\"\\n\",\"logit_bias\":{\"9\":3}}",
    };
    struct oai_request r[2], rejected;
    struct oai_error oe;
    int n = 0;
    for (; n < 2; n++)
        if (oai_request_parse(&r[n], n ? OAI_COMPLETIONS : OAI_CHAT, bodies[n], strlen(bodies[n]), 100, &oe) < 0)
            break;
    char *json = NULL;
    if (n == 2 && oai_request_parse(&rejected, OAI_CHAT, "{}", 2, 100, &oe) == 0)
        fail_msg("an empty chat body was accepted");
    if (n == 2 && oe.status == 400 && !(json = oai_error_json(&oe)))
        oai_errorf(&oe, 500, "server_error", NULL, NULL, "out of memory writing the error");
    int rc = 0;
    if (n < 2 || !json)
        rc = oe.status == 500 ? err_setf(e, ERR_NOMEM, "%s", oe.message) : err_setf(e, ERR_FORMAT, "%s", oe.message);
    else
        alloc_hook_stop();
    if (rc == 0) {
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(r[0].messages, 1), "content")->valuestring, "ab");
        assert_int_equal(r[0].n_stop, 2);
        assert_int_equal(r[1].n_prompt_ids, 3);
        assert_non_null(strstr(json, "\"param\":\"messages\""));
    }
    free(json);
    for (int i = 0; i < n; i++)
        oai_request_free(&r[i]);
    return rc;
}

static void test_oai_request(void **state)
{
    (void)state;
    check_alloc_failures("oai_request", op_oai_request, NULL, 0);
}

/* A failed assertion leaves op() early, possibly with the hook armed. */
static int disarm(void **state)
{
    (void)state;
    alloc_hook_disarm();
    free(g_plan);
    g_plan = NULL;
    cJSON_Delete(g_golden);
    g_golden = NULL;
    return 0;
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test_teardown(test_model_load, disarm),
    cmocka_unit_test_teardown(test_engine, disarm),
    cmocka_unit_test_teardown(test_vision, disarm),
    cmocka_unit_test_teardown(test_qwen_vision, disarm),
    cmocka_unit_test_teardown(test_tokenizer, disarm),
    cmocka_unit_test_teardown(test_tokenizer_enc, disarm),
    cmocka_unit_test_teardown(test_chat, disarm),
    cmocka_unit_test_teardown(test_oai_request, disarm),
    cmocka_unit_test_teardown(test_image, disarm),
    cmocka_unit_test_teardown(test_preprocess, disarm),
};

TEST_SUITE(allocfail, k_tests);
