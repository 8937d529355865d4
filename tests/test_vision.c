/*
 * vision: image-text checkpoints against their float64 references (ADR 0087). The cases are
 * the golden folders whose golden.json has "n_images" (tests/fixtures/gen/gen_vision_models.py:
 * a tiny random Gemma3ForConditionalGeneration; golden_image_cases()), one test
 * vision_<case> each:
 *   tower      each image's pixel_values through the SigLIP tower and the projector, against
 *              transformers' vision_hidden and image_features
 *   prompt     the prompt's prefill with the image rows in place of the placeholders (every
 *              position within 1e-3 x max|logit| of the reference), then greedy decoding: the
 *              reference ids, each step's logits within the same bound
 *   causal     the same prefill with the bidirectional image mask off equals transformers'
 *              run without token_type_ids: the mask is what makes the difference
 *   chunks     a context of 20-row chunks, the first of which would cut an image: it ends before it
 *   batched    the image prompt and a text-only sequence in the same forward steps, prefill
 *              and decode: the image one still meets the reference, the text one equals
 *              itself run alone
 * Then: mlx-vlm's layout (language_model.model.* 8-bit affine, vision_tower.vision_model.*
 * float with the patch conv channels-last, multi_modal_projector.*), the CLI's path from
 * pixel_values (cli_generate_images), the refusals, and the scheduler's images (ADR 0090:
 * the encode step, the prefix key by content hash; two images in one prompt equal the prompt's
 * forward with both).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/st_write.h"
#include "engine/batch.h"
#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "kernels/backend.h"
#include "loading/quantize.h"
#include "models/model.h"
#include "models/vision.h"
#include "st_build.h"
#include "test.h"

#define REL_TOL 1e-3
/* The tower and projector in f32 against float64, on bf16 weights: rounding only. */
#define FEAT_TOL 1e-4

struct vgold {
    struct st_set *st;
    struct tensor ids, tt, px, vh, feat, prefill, causal, greedy, decode;
    int L, N, n_img;
};

static void vgold_open(struct vgold *g, const char *dir)
{
    char path[600];
    struct err e = {0};
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_set_open_file(&g->st, path, &e) < 0)
        fail_msg("%s", e.msg);
    const char *names[] = {"input_ids", "token_type_ids", "pixel_values", "vision_hidden", "image_features",
                           "prefill_logits", "prefill_logits_causal", "greedy_ids", "decode_logits"};
    struct tensor *ts[] = {&g->ids, &g->tt, &g->px, &g->vh, &g->feat, &g->prefill, &g->causal, &g->greedy,
                           &g->decode};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (st_set_take(g->st, names[i], ts[i], &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
    g->L = (int)g->ids.shape[0];
    g->N = (int)g->greedy.shape[0];
    g->n_img = (int)g->px.shape[0];
}

/* The images of the prompt: runs of token_type_ids 1, image k's rows from embd. */
static int prompt_images(const struct vgold *g, struct batch_image *img, int seq, const float *embd, int T,
                         int D)
{
    const int32_t *tt = g->tt.data;
    int n = 0;
    for (int i = 0; i < g->L; i++) {
        if (tt[i] != 1 || (i > 0 && tt[i - 1] == 1))
            continue;
        int len = 0;
        while (i + len < g->L && tt[i + len] == 1)
            len++;
        assert_int_equal(len, T);
        img[n] = (struct batch_image){seq, i, len, embd + (size_t)n * T * D, 0, 0, 0};
        n++;
    }
    assert_int_equal(n, g->n_img);
    return n;
}

/* Every image through the tower and projector into backend memory (*embd, the caller frees
 * with buf_free), each checked against the reference intermediates. */
static float *encode_checked(struct test_eng *r, const struct vgold *g, const char *name)
{
    struct err e = {0};
    struct vision_ctx *vc = NULL;
    const struct vision *v = r->m->vision;
    int T = v->info.tokens_per_image, D = r->m->hp.n_embd, P = v->vh.n_patch, dv = v->vh.n_embd;
    float *embd = NULL;
    if (vision_ctx_new(&vc, r->m, r->be, &e) < 0 ||
        r->be->ops->buf_alloc(r->be, (size_t)g->n_img * T * D * sizeof(float), (void **)&embd, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    assert_int_equal(g->feat.shape[1], T);
    assert_int_equal(g->feat.shape[2], D);
    assert_int_equal(g->vh.shape[1], P);
    float *hid = malloc((size_t)P * dv * sizeof *hid), *feat = malloc((size_t)T * D * sizeof *feat);
    assert_true(hid && feat);
    size_t px = vision_pixel_bytes(v) / sizeof(float);
    double wh = 0, wf = 0;
    for (int i = 0; i < g->n_img; i++) {
        if (vision_encode(vc, embd + (size_t)i * T * D, (const float *)g->px.data + i * px, 1, &e) < 0)
            fail_msg("%s: %s", name, e.msg);
        r->be->ops->download(r->be, hid, vc->vit->b.x, (size_t)P * dv * sizeof *hid);
        r->be->ops->download(r->be, feat, embd + (size_t)i * T * D, (size_t)T * D * sizeof *feat);
        assert_int_equal(backend_sync(r->be, &e), 0);
        double eh = test_row_rel_err(hid, (const float *)g->vh.data + (size_t)i * P * dv, P * dv);
        double ef = test_row_rel_err(feat, (const float *)g->feat.data + (size_t)i * T * D, T * D);
        wh = eh > wh ? eh : wh;
        wf = ef > wf ? ef : wf;
        if (eh > FEAT_TOL || ef > FEAT_TOL)
            fail_msg("%s: image %d: vision tower relative error %.3g, projector %.3g (> %.0e)", name, i, eh,
                     ef, FEAT_TOL);
    }
    printf("vision %-20s tower max rel err %.2e, projector %.2e\n", name, wh, wf);
    free(hid);
    free(feat);
    vision_ctx_free(vc);
    return embd;
}

/* Prefill of the golden prompt as sequence seq (a fresh one), all rows' logits, against ref. */
static double prefill_check(struct test_eng *r, const struct vgold *g, const float *embd, const float *ref,
                            const char *what, double tol)
{
    struct err e = {0};
    struct batch_image img[8];
    const struct vision *v = r->m->vision;
    int V = r->m->hp.n_vocab, n = prompt_images(g, img, 0, embd, v->info.tokens_per_image, r->m->hp.n_embd);
    float *logits = malloc((size_t)g->L * V * sizeof *logits);
    assert_non_null(logits);
    kv_seq_remove(r->kv, 0);
    assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
    batch_clear(r->b);
    assert_int_equal(batch_add_seq(r->b, g->ids.data, g->L, 0, 0, false, &e), 0);
    for (int i = 0; i < g->L; i++)
        r->b->logits[i] = true;
    r->b->img = img;
    r->b->n_img = n;
    if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
        fail_msg("%s: %s", what, e.msg);
    double worst = 0;
    for (int i = 0; i < g->L; i++) {
        double rr = test_row_rel_err(logits + (size_t)i * V, ref + (size_t)i * V, V);
        worst = rr > worst ? rr : worst;
        if (rr > tol)
            fail_msg("%s: prefill position %d: relative error %.3g > %.0e", what, i, rr, tol);
    }
    free(logits);
    return worst;
}

/* Greedy decoding after prefill_check's prompt: the reference ids and logits. */
static double decode_check(struct test_eng *r, const struct vgold *g, const char *what, double tol)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    const int32_t *greedy = g->greedy.data;
    const float *ref = g->decode.data, *last = (const float *)g->prefill.data + (size_t)(g->L - 1) * V;
    assert_non_null(logits);
    int next = test_argmax(last, V);
    double worst = 0;
    for (int s = 0; s < g->N; s++) {
        if (next != greedy[s])
            fail_msg("%s: greedy step %d: got id %d, reference %d", what, s, next, greedy[s]);
        batch_clear(r->b);
        assert_int_equal(batch_add(r->b, greedy[s], g->L + s, 0, true, &e), 0);
        if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
            fail_msg("%s: %s", what, e.msg);
        double rr = test_row_rel_err(logits, ref + (size_t)s * V, V);
        worst = rr > worst ? rr : worst;
        if (rr > tol)
            fail_msg("%s: decode step %d: relative error %.3g > %.0e", what, s, rr, tol);
        next = test_argmax(logits, V);
    }
    free(logits);
    return worst;
}

/* The image prompt (seq 0) and a text-only prompt (seq 1: the prompt's text ids, no image)
 * prefilled in one batch, rows interleaved in two runs, then decoded side by side: seq 0
 * against the reference, seq 1 against itself alone. */
static void batched_check(struct test_eng *r, const struct vgold *g, const float *embd, const char *name)
{
    struct err e = {0};
    const struct vision *v = r->m->vision;
    int V = r->m->hp.n_vocab, L = g->L, N = g->N;
    const int32_t *ids = g->ids.data, *tt = g->tt.data, *greedy = g->greedy.data;
    int32_t text[512];
    int n_text = 0;
    for (int i = 0; i < L && n_text < 40; i++)
        if (tt[i] == 0 && ids[i] != v->info.boi_token_id && ids[i] != v->info.eoi_token_id)
            text[n_text++] = ids[i];
    float *alone = malloc((size_t)(N + 1) * V * sizeof *alone), *logits = malloc((size_t)(L + 1) * V * sizeof *logits);
    int32_t alone_ids[64];
    assert_true(alone && logits && N < 64);
    /* seq 1 alone: prefill, then N greedy steps */
    kv_seq_remove(r->kv, 0);
    kv_seq_remove(r->kv, 1);
    assert_int_equal(kv_seq_add(r->kv, 1, &e), 0);
    batch_clear(r->b);
    assert_int_equal(batch_add_seq(r->b, text, n_text, 0, 1, true, &e), 0);
    assert_int_equal(model_forward(r->c, r->b, r->kv, alone, &e), 0);
    for (int s = 0; s < N; s++) {
        alone_ids[s] = test_argmax(alone + (size_t)s * V, V);
        batch_clear(r->b);
        assert_int_equal(batch_add(r->b, alone_ids[s], n_text + s, 1, true, &e), 0);
        assert_int_equal(model_forward(r->c, r->b, r->kv, alone + (size_t)(s + 1) * V, &e), 0);
    }
    for (int order = 0; order < 2; order++) {
        struct batch_image img[8];
        int n = prompt_images(g, img, 0, embd, v->info.tokens_per_image, r->m->hp.n_embd);
        kv_seq_remove(r->kv, 0);
        kv_seq_remove(r->kv, 1);
        assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
        assert_int_equal(kv_seq_add(r->kv, 1, &e), 0);
        batch_clear(r->b);
        /* order 0: the text sequence's rows first; 1: after */
        if (order == 0)
            assert_int_equal(batch_add_seq(r->b, text, n_text, 0, 1, true, &e), 0);
        assert_int_equal(batch_add_seq(r->b, ids, L, 0, 0, true, &e), 0);
        if (order == 1)
            assert_int_equal(batch_add_seq(r->b, text, n_text, 0, 1, true, &e), 0);
        r->b->img = img;
        r->b->n_img = n;
        if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
            fail_msg("%s batched: %s", name, e.msg);
        const float *img_row = logits + (size_t)(1 - order) * V, *txt_row = logits + (size_t)order * V;
        double ri = test_row_rel_err(img_row, (const float *)g->prefill.data + (size_t)(L - 1) * V, V);
        double rt = test_row_rel_err(txt_row, alone, V);
        if (ri > REL_TOL || rt > 1e-5)
            fail_msg("%s batched (order %d): image prompt's last row %.3g (> %.0e), text prompt's %.3g "
                     "from alone", name, order, ri, REL_TOL, rt);
        /* decode both in one step each */
        for (int s = 0; s < N; s++) {
            batch_clear(r->b);
            assert_int_equal(batch_add(r->b, greedy[s], L + s, 0, true, &e), 0);
            assert_int_equal(batch_add(r->b, alone_ids[s], n_text + s, 1, true, &e), 0);
            assert_int_equal(model_forward(r->c, r->b, r->kv, logits, &e), 0);
            ri = test_row_rel_err(logits, (const float *)g->decode.data + (size_t)s * V, V);
            rt = test_row_rel_err(logits + V, alone + (size_t)(s + 1) * V, V);
            if (ri > REL_TOL || rt > 1e-5 || (s + 1 < N && test_argmax(logits, V) != greedy[s + 1]))
                fail_msg("%s batched decode step %d: image prompt %.3g, text prompt %.3g", name, s, ri, rt);
        }
    }
    kv_seq_remove(r->kv, 1);
    free(alone);
    free(logits);
}

static void check_case(void **state)
{
    const char *name = *state;
    const char *dir = golden_case_dir(name);
    struct vgold g;
    struct test_eng r;
    vgold_open(&g, dir);
    test_eng_open(&r, dir, NULL, 0, 2 * (g.L + g.N) + 64, 2, 4);
    if (!r.m->vision)
        fail_msg("%s: the vision tower did not load", name);
    const struct vision_info *vi = &r.m->vision->info;
    assert_int_equal(vi->tokens_per_image, (int)g.feat.shape[1]);
    assert_true(vi->bidirectional);
    float *embd = encode_checked(&r, &g, name);

    double wp = prefill_check(&r, &g, embd, g.prefill.data, name, REL_TOL);
    double wd = decode_check(&r, &g, name, REL_TOL);
    /* the image mask off: transformers without token_type_ids */
    r.m->vision->info.bidirectional = false;
    double wc = prefill_check(&r, &g, embd, g.causal.data, "causal", REL_TOL);
    r.m->vision->info.bidirectional = true;
    double gap = 0;
    int V = r.m->hp.n_vocab;
    for (int i = 0; i < g.L; i++) {
        double d = test_row_rel_err((const float *)g.prefill.data + (size_t)i * V,
                                    (const float *)g.causal.data + (size_t)i * V, V);
        gap = d > gap ? d : gap;
    }
    assert_true(gap > 10 * REL_TOL);  /* the reference's mask matters, so the check above can fail */
    batched_check(&r, &g, embd, name);
    printf("vision %-20s prefill %d + decode %d tokens: max rel err %.2e / %.2e, causal %.2e (the mask "
           "moves logits by %.2e)\n", name, g.L, g.N, wp, wd, wc, gap);
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);

    /* chunks of 20 rows: the first would cut the (first) image, so it ends before it */
    test_eng_open(&r, dir, NULL, 20, 2 * (g.L + g.N) + 64, 2, 4);
    embd = encode_checked(&r, &g, name);
    prefill_check(&r, &g, embd, g.prefill.data, "chunks of 20", REL_TOL);
    decode_check(&r, &g, "chunks of 20", REL_TOL);
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);
    st_set_free(g.st);
}

// ---- mlx-vlm's layout ----

/* The checkpoint of case name in mlx-vlm's layout at dst: tensors renamed (language_model.model.,
 * vision_tower., multi_modal_projector.), the patch conv [out, p, p, C], the text model's
 * linears affine 8-bit (group 64) with "quantization" at the top of config.json. */
static void write_mlx_vlm(const char *name, const char *dst)
{
    struct err e = {0};
    const char *src = golden_case_dir(name);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", src);
    char *txt = NULL;
    size_t len = 0;
    assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
    cJSON *cfg = cJSON_Parse(txt);
    free(txt);
    assert_non_null(cfg);
    cJSON *q = cJSON_AddObjectToObject(cfg, "quantization");
    cJSON_AddNumberToObject(q, "group_size", 64);
    cJSON_AddNumberToObject(q, "bits", 8);
    char *out = cJSON_Print(cfg);
    assert_int_equal(stb_write_text(stb_path(dst, "config.json"), out), 0);
    free(out);
    cJSON_Delete(cfg);

    struct st_set *s = NULL;
    if (st_set_open(&s, src, &e) < 0)
        fail_msg("%s", e.msg);
    size_t n = st_set_count(s), m = 0;
    struct st_wentry *ents = calloc(3 * n, sizeof *ents);
    char **names = calloc(3 * n, sizeof *names);
    void **data = calloc(3 * n, sizeof *data);
    assert_true(ents && names && data);
    struct quant_params qp = {QMODE_AFFINE, 8, 64, QUANT_GPU};
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        struct tensor tv;
        assert_int_equal(st_set_take(s, t->name, &tv, &e), 0);
        /* the canonical part of the name under each of the layouts transformers writes */
        static const char *const from[][2] = {
            {"model.language_model.", "language_model.model."}, {"language_model.model.", "language_model.model."},
            {"model.vision_tower.vision_model.", "vision_tower.vision_model."},
            {"vision_tower.vision_model.", "vision_tower.vision_model."},
            {"model.vision_tower.", "vision_tower.vision_model."}, {"vision_tower.", "vision_tower.vision_model."},
            {"model.multi_modal_projector.", "multi_modal_projector."},
            {"multi_modal_projector.", "multi_modal_projector."},
        };
        const char *rest = t->name, *pre = "";
        for (size_t k = 0; k < sizeof from / sizeof from[0]; k++)
            if (!strncmp(t->name, from[k][0], strlen(from[k][0]))) {
                rest = t->name + strlen(from[k][0]);
                pre = from[k][1];
                break;
            }
        size_t nl = strlen(pre) + strlen(rest) + 16;
        char *nm = malloc(nl);
        snprintf(nm, nl, "%s%s", pre, rest);
        bool lin = !strcmp(pre, "language_model.model.") && tv.ndim == 2 && strstr(rest, "_proj.weight") &&
                   !strstr(rest, "embed");
        size_t bytes = (size_t)tensor_nelem(&tv) * dtype_size(tv.dtype);
        if (strstr(rest, "patch_embedding.weight")) { /* [O, C, p, p] -> [O, p, p, C] */
            int64_t O = tv.shape[0], C = tv.shape[1], p = tv.shape[2];
            size_t es = dtype_size(tv.dtype);
            char *d = malloc(bytes);
            for (int64_t o = 0; o < O; o++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t y = 0; y < p; y++)
                        for (int64_t x = 0; x < p; x++)
                            memcpy(d + (((o * p + y) * p + x) * C + c) * es,
                                   (const char *)tv.data + (((o * C + c) * p + y) * p + x) * es, es);
            ents[m] = (struct st_wentry){nm, tv.dtype, 4, {O, p, p, C}};
            names[m] = nm;
            data[m++] = d;
        } else if (lin) {
            int64_t R = tv.shape[0], I = tv.shape[1];
            uint32_t *wq = malloc((size_t)R * (I / 4) * sizeof *wq); /* 8 bits: 4 codes a word */
            void *sc = malloc((size_t)R * (I / 64) * dtype_size(tv.dtype));
            void *bi = malloc((size_t)R * (I / 64) * dtype_size(tv.dtype));
            if (quant_rows(&qp, tv.dtype, tv.data, R, I, wq, sc, bi, &e) < 0)
                fail_msg("%s", e.msg);
            ents[m] = (struct st_wentry){nm, DTYPE_U32, 2, {R, I / 4}};
            names[m] = nm;
            data[m++] = wq;
            const char *suf[2] = {"scales", "biases"};
            void *aux[2] = {sc, bi};
            for (int k = 0; k < 2; k++) {
                char *an = malloc(nl);
                snprintf(an, nl, "%.*s%s", (int)(strlen(nm) - 6), nm, suf[k]);
                ents[m] = (struct st_wentry){an, tv.dtype, 2, {R, I / 64}};
                names[m] = an;
                data[m++] = aux[k];
            }
        } else {
            void *d = malloc(bytes);
            memcpy(d, tv.data, bytes);
            ents[m] = (struct st_wentry){nm, tv.dtype, tv.ndim, {0}};
            memcpy(ents[m].shape, tv.shape, sizeof tv.shape);
            names[m] = nm;
            data[m++] = d;
        }
    }
    if (stb_write_model(dst, ents, names, data, m, &e) < 0)
        fail_msg("%s", e.msg);
    st_set_free(s);
}

static void rm_ckpt(const char *dir)
{
    unlink(stb_path(dir, "config.json"));
    unlink(stb_path(dir, "model.safetensors"));
    rmdir(dir);
}

/* An 8-bit text model: the reference within Q8_TOL (the quantization error of the random
 * weights, measured 3e-3 .. 6e-3), the same greedy ids; the float tower exact to FEAT_TOL. */
#define Q8_TOL 2e-2

static void mlx_vlm_layout(void **state)
{
    (void)state;
    const struct golden_cases *gc = golden_image_cases();
    if (gc->n == 0)
        fail_msg("no image golden cases");
    const char *name = gc->names[0];
    char dir[] = "/tmp/mlxcel-vlm-XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_mlx_vlm(name, dir);
    struct vgold g;
    struct test_eng r;
    vgold_open(&g, golden_case_dir(name));
    test_eng_open(&r, dir, NULL, 0, 2 * (g.L + g.N) + 64, 2, 4);
    assert_non_null(r.m->vision);
    assert_int_equal(r.m->vision->vw.layout, VIT_PATCH_HWC);
    assert_int_equal(r.m->layers[0].wq.qbits, 8);
    assert_int_equal(r.m->vision->vw.layers[0].wq.qbits, 0);
    assert_int_equal(st_set_n_unused(r.m->st), 0);
    float *embd = encode_checked(&r, &g, "mlx-vlm layout");
    double wp = prefill_check(&r, &g, embd, g.prefill.data, "mlx-vlm 8-bit", Q8_TOL);
    double wd = decode_check(&r, &g, "mlx-vlm 8-bit", Q8_TOL);
    printf("vision mlx-vlm layout (text 8-bit, tower float): max rel err %.2e / %.2e\n", wp, wd);
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);
    st_set_free(g.st);
    rm_ckpt(dir);
}

// ---- refusals ----

static void refusals(void **state)
{
    (void)state;
    struct err e = {0};
    const struct golden_cases *gc = golden_image_cases();
    if (gc->n == 0)
        fail_msg("no image golden cases");
    struct vgold g;
    struct test_eng r;
    vgold_open(&g, golden_case_dir(gc->names[0]));
    test_eng_open(&r, golden_case_dir(gc->names[0]), NULL, 16, 256, 2, 4);
    const struct vision *v = r.m->vision;
    int T = v->info.tokens_per_image, D = r.m->hp.n_embd;
    float *embd = NULL;
    assert_int_equal(r.be->ops->buf_alloc(r.be, (size_t)T * D * sizeof(float), (void **)&embd, &e), 0);
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = i < 2 || i >= 2 + T ? 5 : v->info.image_token_id;
    struct batch_image img = {0, 2, T, embd, 0, 0, 0};
    /* 1. an image larger than a chunk (n_batch 16 here, the image 16 rows starting at row 2:
     *    it fits only if chunks end before it) */
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    batch_clear(r.b);
    assert_int_equal(batch_add_seq(r.b, ids, 2 + T + 2, 0, 0, true, &e), 0);
    r.b->img = &img;
    r.b->n_img = 1;
    float *logits = malloc((size_t)4 * r.m->hp.n_vocab * sizeof *logits);
    assert_int_equal(model_forward(r.c, r.b, r.kv, logits, &e), 0);
    /* 2. rows that do not hold the image token */
    kv_seq_remove(r.kv, 0);
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    ids[5] = 7;
    batch_clear(r.b);
    assert_int_equal(batch_add_seq(r.b, ids, 2 + T + 2, 0, 0, true, &e), 0);
    r.b->img = &img;
    r.b->n_img = 1;
    assert_int_equal(model_forward(r.c, r.b, r.kv, logits, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "image token"));
    assert_int_equal(kv_seq_len(r.kv, 0), 0);
    ids[5] = v->info.image_token_id;
    /* 3. an image of more rows than a chunk holds */
    struct batch_image big = {0, 2, T + 1, embd, 0, 0, 0};
    ids[2 + T] = v->info.image_token_id;
    batch_clear(r.b);
    assert_int_equal(batch_add_seq(r.b, ids, 2 + T + 2, 0, 0, true, &e), 0);
    r.b->img = &big;
    r.b->n_img = 1;
    assert_int_equal(model_forward(r.c, r.b, r.kv, logits, &e), -ERR_ARG);
    /* 4. positions the batch lacks */
    struct batch_image off = {0, 30, T, embd, 0, 0, 0};
    r.b->img = &off;
    assert_int_equal(model_forward(r.c, r.b, r.kv, logits, &e), -ERR_ARG);
    /* 5. the scheduler refuses rows encoded elsewhere (gen_params.images carry no content hash
     *    for its prefix key; it takes pixels, sched_submit_images: sched_images below) */
    struct sched *sc = NULL;
    struct gen_params gp = {.n_predict = 1, .images = &img, .n_images = 1};
    sampler_params_default(&gp.sampling);
    kv_seq_remove(r.kv, 0);
    assert_int_equal(sched_new(&sc, r.c, r.kv, NULL, &e), 0);
    assert_int_equal(sched_submit(sc, ids, 2 + T + 2, &gp, &(struct sched_cb){0}, NULL, &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "images"));
    sched_free(sc);
    free(logits);
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);
    st_set_free(g.st);

    /* 6. a text model takes no images */
    struct test_eng t;
    test_eng_open(&t, golden_case_dir("gemma3_text"), NULL, 0, 64, 1, 4);
    assert_null(t.m->vision);
    struct vision_ctx *vc = NULL;
    assert_int_equal(vision_ctx_new(&vc, t.m, t.be, &e), -ERR_ARG);
    int32_t one = 3;
    float dummy[4];
    struct batch_image im1 = {0, 0, 1, dummy, 0, 0, 0};
    assert_int_equal(kv_seq_add(t.kv, 0, &e), 0);
    batch_clear(t.b);
    assert_int_equal(batch_add_seq(t.b, &one, 1, 0, 0, true, &e), 0);
    t.b->img = &im1;
    t.b->n_img = 1;
    float *l1 = malloc((size_t)t.m->hp.n_vocab * sizeof *l1);
    assert_int_equal(model_forward(t.c, t.b, t.kv, l1, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "does not take images"));
    free(l1);
    test_eng_close(&t);
}

/* One scheduler request's output: its ids and the logits rows they came from. */
#define SI_N 6
struct si_out {
    int32_t ids[SI_N];
    float *logits;  /* [SI_N, V] */
    int n, V, rc;
    bool done;
};

static int si_token(void *ud, int32_t id, const float *logits)
{
    struct si_out *o = ud;
    if (o->n < SI_N) {
        o->ids[o->n] = id;
        memcpy(o->logits + (size_t)o->n * o->V, logits, (size_t)o->V * sizeof *logits);
    }
    o->n++;
    return 0;
}

static void si_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct si_out *o = ud;
    (void)st;
    (void)e;
    o->rc = rc;
    o->done = true;
}

static void si_submit(struct sched *sc, const int32_t *ids, int L, int pos, const float *px, struct si_out *o,
                      int V)
{
    struct err e = {0};
    struct gen_params gp = {.n_predict = SI_N, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    memset(o, 0, sizeof *o);
    o->V = V;
    o->logits = malloc((size_t)SI_N * V * sizeof *o->logits);
    assert_non_null(o->logits);
    struct sched_image im = {pos, px, {0, 0, 0}};
    if (sched_submit_images(sc, ids, L, &gp, &im, 1, &(struct sched_cb){si_token, si_done, o}, NULL, &e) < 0)
        fail_msg("sched_submit_images: %s", e.msg);
}

static void si_run(struct sched *sc)
{
    struct err e = {0};
    int rc, steps = 0;
    while ((rc = sched_step(sc, &e)) == 1 && steps++ < 200) {
    }
    assert_int_equal(rc, 0);
}

/* The largest |a - b| over a's logits over the largest |a|. */
static double si_diff(const struct si_out *a, const struct si_out *b)
{
    double d = 0, mx = 0;
    for (size_t i = 0; i < (size_t)SI_N * a->V; i++) {
        double x = fabs((double)a->logits[i] - b->logits[i]);
        d = x > d ? x : d;
        mx = fabs(a->logits[i]) > mx ? fabs(a->logits[i]) : mx;
    }
    return d / (mx > 0 ? mx : 1);
}

/* One image prompt through a scheduler of its own, no prefix cache: the reference "alone". */
static void si_alone(struct test_eng *r, const int32_t *ids, int L, int pos, const float *px, struct si_out *o)
{
    struct err e = {0};
    struct sched *sc = NULL;
    struct sched_params sp = {.no_prefix_cache = true};
    assert_int_equal(sched_new(&sc, r->c, r->kv, &sp, &e), 0);
    si_submit(sc, ids, L, pos, px, o, r->m->hp.n_vocab);
    si_run(sc);
    assert_true(o->done && o->rc == 0 && o->n == SI_N);
    assert_int_equal(sched_n_encoded(sc), 1);
    sched_free(sc);
}

/* The scheduler's images (ADR 0090): two requests with the same text and different images
 * (running together, with the prefix cache on) each equal their own run alone, and share no
 * image block; the same image again shares the prefix through the image and is not encoded
 * again; a text request keeps decoding in the step that encodes an image. */
static void sched_images(void **state)
{
    (void)state;
    struct err e = {0};
    const struct golden_cases *gc = golden_image_cases();
    if (gc->n == 0)
        fail_msg("no image golden cases");
    struct vgold g;
    struct test_eng r;
    vgold_open(&g, golden_case_dir("gemma3_vision"));
    /* blocks of 4 rows: the image (rows 7 .. 22) starts and ends inside blocks */
    test_eng_open(&r, golden_case_dir("gemma3_vision"), NULL, 64, 256, 4, 4);
    const struct vision *v = r.m->vision;
    int T = v->info.tokens_per_image, L = g.L, V = r.m->hp.n_vocab, pos = -1;
    const int32_t *ids = g.ids.data;
    for (int i = 0; i < L && pos < 0; i++)
        if (ids[i] == v->info.image_token_id)
            pos = i;
    assert_int_equal(pos, 7);
    size_t npx = vision_pixel_bytes(v) / sizeof(float);
    const float *pxA = g.px.data;
    float *pxB = malloc(npx * sizeof *pxB), *pxA2 = malloc(npx * sizeof *pxA2);
    assert_true(pxB && pxA2);
    for (size_t i = 0; i < npx; i++)
        pxB[i] = -pxA[i];
    memcpy(pxA2, pxA, npx * sizeof *pxA2);
    struct si_out refA, refB, a, b, a2;
    si_alone(&r, ids, L, pos, pxA, &refA);
    si_alone(&r, ids, L, pos, pxB, &refB);
    /* the image matters: the two references differ far beyond the bound below */
    double apart = si_diff(&refA, &refB);
    if (apart < 1e-3)
        fail_msg("the two images give logits only %.3g apart", apart);
    /* the golden's greedy ids, from the scheduler */
    for (int i = 0; i < SI_N && i < g.N; i++)
        assert_int_equal(refA.ids[i], ((const int32_t *)g.greedy.data)[i]);

    struct sched *sc = NULL;
    uint64_t q0, h0, q1, h1, q2, h2;
    assert_int_equal(sched_new(&sc, r.c, r.kv, NULL, &e), 0);
    si_submit(sc, ids, L, pos, pxA, &a, V);
    si_run(sc);
    sched_prefix_stats(sc, &q0, &h0);
    assert_int_equal(h0, 0);
    /* B (another image, the same text) and A2 (A's pixels again) together */
    si_submit(sc, ids, L, pos, pxB, &b, V);
    si_run(sc);
    sched_prefix_stats(sc, &q1, &h1);
    /* B shares only the text blocks before the image's first block (rows 0 .. 3) */
    assert_int_equal(h1 - h0, 4);
    si_submit(sc, ids, L, pos, pxA2, &a2, V);
    si_run(sc);
    sched_prefix_stats(sc, &q2, &h2);
    /* A2 shares everything but the last block's worth (its last token is computed) */
    assert_int_equal(h2 - h1, (L - 1) / 4 * 4);
    assert_int_equal(sched_n_encoded(sc), 2);  /* A and B; A2's image was in the cache */
    struct si_out *outs[] = {&a, &b, &a2}, *refs[] = {&refA, &refB, &refA};
    for (int k = 0; k < 3; k++) {
        assert_true(outs[k]->done && outs[k]->rc == 0 && outs[k]->n == SI_N);
        assert_memory_equal(outs[k]->ids, refs[k]->ids, sizeof refs[k]->ids);
        double d = si_diff(outs[k], refs[k]);
        if (d > 1e-5)
            fail_msg("request %d: logits %.3g from its run alone", k, d);
    }
    for (int k = 0; k < 3; k++)
        free(outs[k]->logits);
    /* B and A2 at once, the cache dropped: each equals its own run alone */
    kv_prefix_clear(r.kv);
    si_submit(sc, ids, L, pos, pxB, &b, V);
    si_submit(sc, ids, L, pos, pxA2, &a2, V);
    si_run(sc);
    if (si_diff(&b, &refB) > 1e-5 || si_diff(&a2, &refA) > 1e-5)
        fail_msg("together: %.3g and %.3g from alone", si_diff(&b, &refB), si_diff(&a2, &refA));
    free(b.logits);
    free(a2.logits);

    /* a text request decodes in the step that encodes an image */
    struct si_out t;
    memset(&t, 0, sizeof t);
    t.V = V;
    t.logits = malloc((size_t)SI_N * V * sizeof *t.logits);
    struct gen_params gp = {.n_predict = SI_N, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    int32_t text[3] = {2, 65, 231};
    assert_int_equal(sched_submit(sc, text, 3, &gp, &(struct sched_cb){si_token, si_done, &t}, NULL, &e), 0);
    assert_int_equal(sched_step(sc, &e), 1);
    assert_int_equal(t.n, 1);
    kv_prefix_clear(r.kv);
    uint64_t enc = sched_n_encoded(sc);
    si_submit(sc, ids, L, pos, pxB, &b, V);
    assert_int_equal(sched_step(sc, &e), 1);
    assert_int_equal(sched_n_encoded(sc), enc + 1);
    assert_int_equal(t.n, 2);
    si_run(sc);
    assert_true(t.done && b.done && b.rc == 0);
    free(t.logits);
    free(b.logits);

    /* a step budget below an image's rows (8 < 16, as serve's 128 < Gemma 3's 256): the image
     * goes whole in one step past it, and the output is the same */
    {
        struct sched *small = NULL;
        struct sched_params sp8 = {.max_batch_tokens = 8, .no_prefix_cache = true};
        assert_int_equal(sched_new(&small, r.c, r.kv, &sp8, &e), 0);
        si_submit(small, ids, L, pos, pxA, &a, V);
        si_run(small);
        assert_true(a.done && a.rc == 0 && a.n == SI_N);
        if (si_diff(&a, &refA) > 1e-5)
            fail_msg("budget 8: logits %.3g from alone", si_diff(&a, &refA));
        free(a.logits);
        sched_free(small);
    }

    /* refusals: image tokens no image fills, an image off its tokens, a text model's */
    struct sched_image bad = {pos + 1, pxA, {0, 0, 0}};
    assert_int_equal(sched_submit(sc, ids, L, &gp, NULL, NULL, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "no image fills"));
    assert_int_equal(sched_submit_images(sc, ids, L, &gp, &bad, 1, NULL, NULL, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "not the image token"));
    assert_int_equal(sched_submit_images(sc, ids, pos + T, &gp, &(struct sched_image){pos, pxA, {0, 0, 0}}, 1, NULL, NULL, &e),
                     -ERR_ARG);
    sched_free(sc);
    free(refA.logits);
    free(refB.logits);
    free(pxB);
    free(pxA2);
    test_eng_close(&r);
    st_set_free(g.st);

    struct test_eng tm;
    test_eng_open(&tm, golden_case_dir("gemma3_text"), NULL, 0, 64, 1, 4);
    assert_int_equal(sched_new(&sc, tm.c, tm.kv, NULL, &e), 0);
    int32_t one[2] = {2, 5};
    float px1[4] = {0};
    assert_int_equal(sched_submit_images(sc, one, 2, &gp, &(struct sched_image){0, px1, {0, 0, 0}}, 1, NULL, NULL, &e),
                     -ERR_ARG);
    assert_non_null(strstr(e.msg, "does not take images"));
    sched_free(sc);
    test_eng_close(&tm);
}

/* Two images in one prompt through the scheduler (the encode step takes one image a step, so the
 * prompt chunk that reaches the second before it is encoded holds the first, encoded): every step
 * budget gives the ids and logits of the whole prompt's forward with both images' rows in one
 * batch, then greedy decoding (what generate does). A chunk that fed the first image as the image
 * token's embedding (it ended before the second and left the first out of the step's list) is far
 * off. Gemma 3's golden prompt twice (the second without its BOS), an image each: A's pixels, then
 * their negation. */
static void sched_two_images(void **state)
{
    (void)state;
    struct err e = {0};
    struct vgold g;
    struct test_eng r;
    struct vision_ctx *vc = NULL;
    vgold_open(&g, golden_case_dir("gemma3_vision"));
    test_eng_open(&r, golden_case_dir("gemma3_vision"), NULL, 64, 256, 4, 4);
    const struct vision *v = r.m->vision;
    int T = v->info.tokens_per_image, L = g.L, V = r.m->hp.n_vocab, D = r.m->hp.n_embd, pos = -1;
    const int32_t *ids = g.ids.data;
    for (int i = 0; i < L && pos < 0; i++)
        if (ids[i] == v->info.image_token_id)
            pos = i;
    assert_true(pos > 0);
    int L2 = 2 * L - 1;
    int32_t *ids2 = malloc((size_t)L2 * sizeof *ids2);
    size_t npx = vision_pixel_bytes(v) / sizeof(float);
    float *pxB = malloc(npx * sizeof *pxB), *embd = NULL;
    assert_true(ids2 && pxB);
    memcpy(ids2, ids, (size_t)L * sizeof *ids2);
    memcpy(ids2 + L, ids + 1, (size_t)(L - 1) * sizeof *ids2);
    for (size_t i = 0; i < npx; i++)
        pxB[i] = -((const float *)g.px.data)[i];
    const float *px[2] = {g.px.data, pxB};
    int at[2] = {pos, L - 1 + pos};

    /* the reference: both images encoded, the whole prompt in one batch, greedy steps */
    struct si_out ref;
    memset(&ref, 0, sizeof ref);
    ref.V = V;
    ref.logits = malloc((size_t)SI_N * V * sizeof *ref.logits);
    assert_non_null(ref.logits);
    assert_int_equal(vision_ctx_new(&vc, r.m, r.be, &e), 0);
    assert_int_equal(r.be->ops->buf_alloc(r.be, (size_t)2 * T * D * sizeof(float), (void **)&embd, &e), 0);
    struct batch_image img[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(vision_encode(vc, embd + (size_t)k * T * D, px[k], 1, &e), 0);
        img[k] = (struct batch_image){0, at[k], T, embd + (size_t)k * T * D, 0, 0, 0};
    }
    vision_ctx_free(vc);
    kv_seq_remove(r.kv, 0);
    assert_int_equal(kv_seq_add(r.kv, 0, &e), 0);
    batch_clear(r.b);
    assert_int_equal(batch_add_seq(r.b, ids2, L2, 0, 0, true, &e), 0);
    r.b->img = img;
    r.b->n_img = 2;
    if (model_forward(r.c, r.b, r.kv, ref.logits, &e) < 0)
        fail_msg("two images: %s", e.msg);
    for (int s = 0; s < SI_N; s++) {
        ref.ids[s] = test_argmax(ref.logits + (size_t)s * V, V);
        if (s + 1 == SI_N)
            break;
        batch_clear(r.b);
        assert_int_equal(batch_add(r.b, ref.ids[s], L2 + s, 0, true, &e), 0);
        assert_int_equal(model_forward(r.c, r.b, r.kv, ref.logits + (size_t)(s + 1) * V, &e), 0);
    }
    kv_seq_remove(r.kv, 0);

    /* the scheduler: the default budget, and one of 8 rows (each image's 16 go whole past it) */
    for (int pass = 0; pass < 2; pass++) {
        struct sched *sc = NULL;
        struct sched_params sp = {.no_prefix_cache = true, .max_batch_tokens = pass ? 8 : 0};
        struct gen_params gp = {.n_predict = SI_N, .ignore_eos = true};
        struct si_out o;
        sampler_params_default(&gp.sampling);
        gp.sampling.temperature = 0;
        memset(&o, 0, sizeof o);
        o.V = V;
        o.logits = malloc((size_t)SI_N * V * sizeof *o.logits);
        assert_non_null(o.logits);
        struct sched_image im[2] = {{at[0], px[0], {0, 0, 0}}, {at[1], px[1], {0, 0, 0}}};
        assert_int_equal(sched_new(&sc, r.c, r.kv, &sp, &e), 0);
        if (sched_submit_images(sc, ids2, L2, &gp, im, 2, &(struct sched_cb){si_token, si_done, &o}, NULL, &e) < 0)
            fail_msg("sched_submit_images: %s", e.msg);
        si_run(sc);
        assert_true(o.done && o.rc == 0 && o.n == SI_N);
        assert_int_equal(sched_n_encoded(sc), 2);
        double d = si_diff(&o, &ref);
        if (memcmp(o.ids, ref.ids, sizeof ref.ids) != 0 || d > 1e-5)
            fail_msg("two images, budget %d: ids %d %d %d.. (reference %d %d %d..), logits %.3g from the "
                     "reference", sp.max_batch_tokens, o.ids[0], o.ids[1], o.ids[2], ref.ids[0], ref.ids[1],
                     ref.ids[2], d);
        free(o.logits);
        sched_free(sc);
    }
    r.be->ops->buf_free(r.be, embd);
    free(ref.logits);
    free(ids2);
    free(pxB);
    test_eng_close(&r);
    st_set_free(g.st);
}

/* Configs a tower must refuse: mm_tokens_per_image no square dividing the grid, token ids
 * outside the vocabulary, a vision_config of impossible sizes. */
static void bad_configs(void **state)
{
    (void)state;
    const struct golden_cases *gc = golden_image_cases();
    if (gc->n == 0)
        fail_msg("no image golden cases");
    const char *src = golden_case_dir(gc->names[0]);
    static const char *const patches[][3] = {
        {"mm_tokens_per_image", "15", "mm_tokens_per_image 15"},
        {"mm_tokens_per_image", "9", "mm_tokens_per_image 9"},
        {"image_token_index", "100000", "image_token_index 100000"},
        {"vision_config", "{\"hidden_size\": 32, \"num_attention_heads\": 3, \"image_size\": 64, "
                          "\"patch_size\": 8, \"intermediate_size\": 64, \"num_hidden_layers\": 2}",
         "num_attention_heads 3"},
        {"vision_config", "{\"hidden_size\": 32, \"num_attention_heads\": 2, \"image_size\": 64, "
                          "\"patch_size\": 7, \"intermediate_size\": 64, \"num_hidden_layers\": 2}",
         "patch_size 7"},
        {"vision_config", "{\"hidden_size\": 32, \"num_attention_heads\": 2, \"image_size\": 64, "
                          "\"patch_size\": 8, \"intermediate_size\": 64, \"num_hidden_layers\": 3}",
         "layers.2"},
        {"vision_config", "\"none\"", "no vision_config object"},
        {"vision_config", "{\"hidden_size\": 32, \"num_attention_heads\": 2, \"image_size\": 64, "
                          "\"patch_size\": 8, \"intermediate_size\": 64, \"num_hidden_layers\": 2, "
                          "\"hidden_act\": \"quick_gelu\"}",
         "quick_gelu"},
    };
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++) {
        char dir[] = "/tmp/mlxcel-vbad-XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[600], *txt = NULL;
        size_t len = 0;
        struct err e = {0};
        snprintf(path, sizeof path, "%s/config.json", src);
        assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
        cJSON *cfg = cJSON_Parse(txt);
        free(txt);
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, patches[i][0]);
        cJSON_AddItemToObject(cfg, patches[i][0], cJSON_Parse(patches[i][1]));
        char *out = cJSON_Print(cfg);
        assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
        free(out);
        cJSON_Delete(cfg);
        /* a copy: the loader refuses a link out of the model's folder */
        snprintf(path, sizeof path, "%s/model.safetensors", src);
        char *w = NULL;
        size_t wl = 0;
        assert_int_equal(file_read_all(path, 64u << 20, &w, &wl, &e), 0);
        FILE *f = fopen(stb_path(dir, "model.safetensors"), "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(w, 1, wl, f), wl);
        fclose(f);
        free(w);
        struct model *m = NULL;
        int rc = model_load(&m, dir, &e);
        if (rc >= 0)
            fail_msg("config patch %s = %s loaded", patches[i][0], patches[i][1]);
        printf("vision bad config %s: %s\n", patches[i][0], e.msg);
        if (!strstr(e.msg, patches[i][2]))
            fail_msg("config patch %s = %s: '%s' does not say '%s'", patches[i][0], patches[i][1], e.msg,
                     patches[i][2]);
        rm_ckpt(dir);
    }
}

/* A bidirectional image is one forward chunk: the context's default chunk holds at least its
 * rows whatever the activation budget (Gemma-3-4B's 256 rows of 2560 were cut to 128 on the
 * CPU, and --image refused it); a causal tower's images are not a floor. */
static void auto_batch_holds_an_image(void **state)
{
    (void)state;
    struct model *m = NULL;
    struct err e = {0};
    if (model_load(&m, "tests/fixtures/golden/gemma3_vision", &e) < 0)
        fail_msg("%s", e.msg);
    assert_non_null(m->vision);
    assert_true(m->vision->info.bidirectional);
    int T = m->vision->info.tokens_per_image;
    assert_int_equal(model_ctx_auto_batch(m, (size_t)64 << 20), 512);  /* a tiny model: the most */
    assert_true(model_ctx_auto_batch(m, 1) >= T);
    m->vision->info.tokens_per_image = 256;  /* Gemma-3-4B's, over a budget that fits fewer rows */
    assert_int_equal(model_ctx_auto_batch(m, 1), 256);
    m->vision->info.tokens_per_image = 600;  /* more than the default chunk: a larger one */
    assert_int_equal(model_ctx_auto_batch(m, 1), 1024);
    m->vision->info.bidirectional = false;   /* causal: images are cut like text */
    assert_int_equal(model_ctx_auto_batch(m, 1), 32);
    model_free(m);
}

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static const struct CMUnitTest extra[] = {
        cmocka_unit_test(auto_batch_holds_an_image),
        cmocka_unit_test(mlx_vlm_layout),
        cmocka_unit_test(refusals),
        cmocka_unit_test(bad_configs),
        cmocka_unit_test(sched_images),
        cmocka_unit_test(sched_two_images),
    };
    static struct CMUnitTest *t; /* built once, for the life of the process */
    /* this suite's cases are Gemma 3's; the Qwen image cases run in the qwen_vl suite */
    static struct golden_cases gem;
    const struct golden_cases *all = golden_image_cases();
    if (!t) {
        gem.names = calloc(all->n ? all->n : 1, sizeof *gem.names);
        for (size_t i = 0; gem.names && i < all->n; i++)
            if (strncmp(all->names[i], "gemma3", 6) == 0)
                gem.names[gem.n++] = all->names[i];
    }
    const struct golden_cases *gc = &gem;
    size_t n = gc->n ? gc->n : 1, n_extra = sizeof extra / sizeof extra[0];
    if (t) {
        *tests = t;
        *n_tests = n + n_extra;
        return;
    }
    t = calloc(n + n_extra, sizeof *t);
    if (!t) {
        *tests = NULL;
        *n_tests = 0;
        return;
    }
    for (size_t i = 0; i < gc->n; i++) {
        size_t len = strlen(gc->names[i]) + 8;
        char *nm = malloc(len);
        snprintf(nm, len, "vision_%s", gc->names[i]);
        t[i] = (struct CMUnitTest){.name = nm, .test_func = check_case, .initial_state = gc->names[i]};
    }
    if (gc->n == 0)
        t[0] = (struct CMUnitTest){.name = "vision_cases_found", .test_func = refusals};
    memcpy(t + n, extra, sizeof extra);
    *tests = t;
    *n_tests = n + n_extra;
}

TEST_SUITE_BUILT(vision, build_tests);
