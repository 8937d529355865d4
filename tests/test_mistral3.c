/*
 * mistral3: Mistral 3 (Mistral3ForConditionalGeneration) and LLaVA with a Pixtral tower
 * (Pixtral-12B's layout) against their float64 references (ADR 0123), one test
 * mistral3_<case> per golden folder "mistral3" / "pixtral" (tests/fixtures/gen/gen_mistral3.py):
 *   pixels     the case's image decoded and preprocessed (PixtralImageProcessor from the
 *              folder's preprocessor_config.json, at its own size) equals the processor's
 *              pixel_values, and the processor's expansion (per merged row its [IMG] tokens and
 *              [IMG_BREAK], the last [IMG_END]) is the prompt's image run
 *   tower      the image's patch grid through the Pixtral tower up to
 *              hidden_states[vision_feature_layer] against vision_hidden, and the run's [IMG]
 *              rows against the projector's image_features
 *   prompt     prefill with the run's rows in place, every row within 1e-3 x max|logit|, then
 *              greedy decoding: the reference ids and logits
 *   batched    beside the text prompt in the same forward steps (both orders; the text one
 *              equals itself alone); then in chunks of 7 rows (which cut the image)
 * Then mistral3_mlx_vlm_layout (vision_tower.vision_model.*, the patch conv channels-last,
 * language_model.model.*), mistral3_image_runs (vision_image_run on runs with breaks) and
 * mistral3_bad_configs (configs the family refuses, the error naming the field).
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
#include "engine/kvcache.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/vision.h"
#include "st_build.h"
#include "test.h"

#define REL_TOL 1e-3
#define FEAT_TOL 1e-4

struct mgold {
    struct st_set *st;
    struct tensor ids, tt, px, vh, feat, prefill, greedy, decode, text_ids;
    cJSON *meta;
    int L, N, n_text;
    int32_t grid[3];   /* (1, H / p, W / p) */
    int run_at, run_len;
};

static int meta_int(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j))
        fail_msg("golden.json: no number %s", key);
    return (int)j->valuedouble;
}

static void mgold_open(struct mgold *g, const char *dir, int patch)
{
    char path[700], *txt = NULL;
    size_t len = 0;
    struct err e = {0};
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_set_open_file(&g->st, path, &e) < 0)
        fail_msg("%s", e.msg);
    const char *names[] = {"input_ids", "token_type_ids", "pixel_values", "vision_hidden", "image_features",
                           "prefill_logits", "greedy_ids", "decode_logits", "text_ids"};
    struct tensor *ts[] = {&g->ids, &g->tt, &g->px, &g->vh, &g->feat, &g->prefill, &g->greedy, &g->decode,
                           &g->text_ids};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (st_set_take(g->st, names[i], ts[i], &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
    g->L = (int)g->ids.shape[0];
    g->N = (int)g->greedy.shape[0];
    g->n_text = (int)g->text_ids.shape[0];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    assert_int_equal(file_read_all(path, 1 << 24, &txt, &len, &e), 0);
    g->meta = cJSON_Parse(txt);
    free(txt);
    assert_non_null(g->meta);
    assert_int_equal(g->px.ndim, 4);
    g->grid[0] = 1;
    g->grid[1] = (int32_t)(g->px.shape[2] / patch);
    g->grid[2] = (int32_t)(g->px.shape[3] / patch);
    /* the run: from the first [IMG] through [IMG_END] */
    const int32_t *ids = g->ids.data;
    int img = meta_int(g->meta, "image_token_id"), end = meta_int(g->meta, "image_end_token_id");
    g->run_at = -1;
    for (int i = 0; i < g->L; i++) {
        if (g->run_at < 0 && ids[i] == img)
            g->run_at = i;
        if (g->run_at >= 0 && ids[i] == end) {
            g->run_len = i + 1 - g->run_at;
            break;
        }
    }
    assert_true(g->run_at >= 0 && g->run_len > 0);
}

static void mgold_close(struct mgold *g)
{
    cJSON_Delete(g->meta);
    st_set_free(g->st);
}

static void pixels_check(const struct mgold *g, const char *dir, const char *name, const char *model_type)
{
    struct err e = {0};
    struct image_proc_config cfg;
    struct image im = {0};
    struct image_pixels px = {0};
    char path[700];
    if (image_proc_config_load(&cfg, dir, model_type, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    assert_int_equal(cfg.kind, IMAGE_PROC_PIXTRAL);
    const cJSON *ims = cJSON_GetObjectItemCaseSensitive(g->meta, "images");
    assert_true(cJSON_IsArray(ims) && cJSON_GetArraySize(ims) == 1);
    snprintf(path, sizeof path, "%s/%s", test_path("tests/fixtures/images"), cJSON_GetArrayItem(ims, 0)->valuestring);
    if (image_load(&im, path, NULL, &e) < 0 || image_preprocess(&px, &cfg, &im, &e) < 0)
        fail_msg("%s: %s: %s", name, path, e.msg);
    assert_int_equal(px.n_images, 1);
    assert_int_equal(px.height, g->px.shape[2]);
    assert_int_equal(px.width, g->px.shape[3]);
    assert_int_equal((int64_t)px.n_values, tensor_nelem(&g->px));
    assert_int_equal(px.grid_h, g->grid[1]);
    assert_int_equal(px.grid_w, g->grid[2]);
    double worst = 0;
    for (size_t i = 0; i < px.n_values; i++)
        worst = fmax(worst, fabs((double)px.pixel_values[i] - ((const float *)g->px.data)[i]));
    printf("mistral3 %-9s pixel_values %ux%u: max abs diff %.2e, %u prompt tokens\n", name, px.width, px.height,
           worst, px.n_image_tokens);
    if (worst > 1e-5)
        fail_msg("%s: pixel_values differ from the processor's by %.3g", name, worst);
    if ((int)px.n_image_tokens != g->run_len)
        fail_msg("%s: the processor's expansion gives %u tokens, the prompt's run has %d", name, px.n_image_tokens,
                 g->run_len);
    /* the expansion's ids are the prompt's run */
    int32_t out[4096];
    size_t n_out = 0;
    struct image_prompt_ids pid = {.image = meta_int(g->meta, "image_token_id"),
                                   .img_break = meta_int(g->meta, "image_break_token_id"),
                                   .img_end = meta_int(g->meta, "image_end_token_id"), .boi = -1, .eoi = -1};
    assert_int_equal(image_prompt_expand(out, 4096, &n_out, &cfg, &px, &pid, &e), 0);
    assert_int_equal((int)n_out, g->run_len);
    assert_memory_equal(out, (const int32_t *)g->ids.data + g->run_at, n_out * sizeof *out);
    image_pixels_free(&px);
    image_free(&im);
}

/* The image through the tower and projector into backend memory (the caller frees it): the
 * tower's output against vision_hidden, the run's [IMG] rows against image_features. */
static float *encode_checked(struct test_eng *r, const struct mgold *g, const char *name)
{
    struct err e = {0};
    struct vision_ctx *vc = NULL;
    const struct vision *v = r->m->vision;
    int D = r->m->hp.n_embd, T = g->run_len;
    int P = g->grid[1] * g->grid[2], dv = (int)g->vh.shape[2], nf = (int)g->feat.shape[0];
    float *embd = NULL;
    int rc = vision_grid_tokens(v, g->grid, &e);
    if (rc != T)
        fail_msg("%s: a %dx%d grid makes %d rows, the prompt's run has %d (%s)", name, g->grid[1], g->grid[2], rc, T,
                 e.msg);
    if (vision_ctx_new(&vc, r->m, r->be, &e) < 0 ||
        r->be->ops->buf_alloc(r->be, (size_t)T * D * sizeof(float), (void **)&embd, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    assert_int_equal(g->vh.shape[1], P);
    assert_int_equal(g->feat.shape[1], D);
    float *hid = malloc((size_t)P * dv * sizeof *hid), *run = malloc((size_t)T * D * sizeof *run);
    float *feat = malloc((size_t)nf * D * sizeof *feat);
    assert_true(hid && run && feat);
    if (vision_encode_grid(vc, embd, g->px.data, g->grid, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    assert_int_equal(vc->n_hidden, P);
    r->be->ops->download(r->be, hid, vc->hidden, (size_t)P * dv * sizeof *hid);
    r->be->ops->download(r->be, run, embd, (size_t)T * D * sizeof *run);
    assert_int_equal(backend_sync(r->be, &e), 0);
    /* the [IMG] rows of the run, in order, are the projector's rows */
    const int32_t *ids = (const int32_t *)g->ids.data + g->run_at;
    int k = 0;
    for (int i = 0; i < T; i++)
        if (ids[i] == v->info.image_token_id && k < nf)
            memcpy(feat + (size_t)k++ * D, run + (size_t)i * D, (size_t)D * sizeof *feat);
    assert_int_equal(k, nf);
    double eh = test_row_rel_err(hid, g->vh.data, P * dv);
    double ef = test_row_rel_err(feat, g->feat.data, nf * D);
    printf("mistral3 %-9s tower (%d patches) max rel err %.2e, projector (%d rows) %.2e\n", name, P, eh, nf, ef);
    if (eh > FEAT_TOL || ef > FEAT_TOL)
        fail_msg("%s: vision tower relative error %.3g, projector %.3g (> %.0e)", name, eh, ef, FEAT_TOL);
    free(hid);
    free(run);
    free(feat);
    vision_ctx_free(vc);
    return embd;
}

static double prefill_check(struct test_eng *r, const struct mgold *g, const float *embd, const char *what)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab;
    struct batch_image img = {0, g->run_at, g->run_len, embd, 0, 0, 0};
    float *logits = malloc((size_t)g->L * V * sizeof *logits);
    assert_non_null(logits);
    kv_seq_remove(r->kv, 0);
    assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
    batch_clear(r->b);
    assert_int_equal(batch_add_seq(r->b, g->ids.data, g->L, 0, 0, false, &e), 0);
    for (int i = 0; i < g->L; i++)
        r->b->logits[i] = true;
    r->b->img = &img;
    r->b->n_img = 1;
    if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
        fail_msg("%s: %s", what, e.msg);
    double worst = 0;
    for (int i = 0; i < g->L; i++) {
        double rr = test_row_rel_err(logits + (size_t)i * V, (const float *)g->prefill.data + (size_t)i * V, V);
        worst = rr > worst ? rr : worst;
        if (rr > REL_TOL)
            fail_msg("%s: prefill position %d: relative error %.3g > %.0e", what, i, rr, REL_TOL);
    }
    free(logits);
    return worst;
}

static double decode_check(struct test_eng *r, const struct mgold *g, const char *what)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    const int32_t *greedy = g->greedy.data;
    assert_non_null(logits);
    int next = test_argmax((const float *)g->prefill.data + (size_t)(g->L - 1) * V, V);
    double worst = 0;
    for (int s = 0; s < g->N; s++) {
        if (next != greedy[s])
            fail_msg("%s: greedy step %d: got id %d, reference %d", what, s, next, greedy[s]);
        batch_clear(r->b);
        assert_int_equal(batch_add(r->b, greedy[s], g->L + s, 0, true, &e), 0);
        if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
            fail_msg("%s: %s", what, e.msg);
        double rr = test_row_rel_err(logits, (const float *)g->decode.data + (size_t)s * V, V);
        worst = rr > worst ? rr : worst;
        if (rr > REL_TOL)
            fail_msg("%s: decode step %d: relative error %.3g > %.0e", what, s, rr, REL_TOL);
        next = test_argmax(logits, V);
    }
    free(logits);
    return worst;
}

/* The text prompt alone (seq 1): its last row against transformers', then N greedy steps. */
static void text_alone(struct test_eng *r, const struct mgold *g, float *alone, int32_t *alone_ids)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab, N = g->N, n = g->n_text;
    float *rows = malloc((size_t)V * sizeof *rows);
    assert_non_null(rows);
    kv_seq_remove(r->kv, 0);
    kv_seq_remove(r->kv, 1);
    assert_int_equal(kv_seq_add(r->kv, 1, &e), 0);
    batch_clear(r->b);
    assert_int_equal(batch_add_seq(r->b, g->text_ids.data, n, 0, 1, true, &e), 0);
    assert_int_equal(model_forward(r->c, r->b, r->kv, alone, &e), 0);
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(g->meta, "text_last_logits"), *it;
    assert_true(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == V);
    int i = 0;
    cJSON_ArrayForEach(it, tl) rows[i++] = (float)it->valuedouble;
    double rt = test_row_rel_err(alone, rows, V);
    if (rt > REL_TOL)
        fail_msg("text prompt's last row: relative error %.3g > %.0e", rt, REL_TOL);
    for (int s = 0; s < N; s++) {
        alone_ids[s] = test_argmax(alone + (size_t)s * V, V);
        batch_clear(r->b);
        assert_int_equal(batch_add(r->b, alone_ids[s], n + s, 1, true, &e), 0);
        assert_int_equal(model_forward(r->c, r->b, r->kv, alone + (size_t)(s + 1) * V, &e), 0);
    }
    free(rows);
}

static void batched_check(struct test_eng *r, const struct mgold *g, const float *embd, const char *name)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab, L = g->L, N = g->N;
    const int32_t *greedy = g->greedy.data;
    float *alone = malloc((size_t)(N + 1) * V * sizeof *alone), *logits = malloc((size_t)2 * V * sizeof *logits);
    int32_t alone_ids[64];
    assert_true(alone && logits && N < 64);
    text_alone(r, g, alone, alone_ids);
    for (int order = 0; order < 2; order++) {
        struct batch_image img = {0, g->run_at, g->run_len, embd, 0, 0, 0};
        kv_seq_remove(r->kv, 0);
        kv_seq_remove(r->kv, 1);
        assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
        assert_int_equal(kv_seq_add(r->kv, 1, &e), 0);
        batch_clear(r->b);
        if (order == 0)
            assert_int_equal(batch_add_seq(r->b, g->text_ids.data, g->n_text, 0, 1, true, &e), 0);
        assert_int_equal(batch_add_seq(r->b, g->ids.data, L, 0, 0, true, &e), 0);
        if (order == 1)
            assert_int_equal(batch_add_seq(r->b, g->text_ids.data, g->n_text, 0, 1, true, &e), 0);
        r->b->img = &img;
        r->b->n_img = 1;
        if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
            fail_msg("%s batched: %s", name, e.msg);
        const float *img_row = logits + (size_t)(1 - order) * V, *txt_row = logits + (size_t)order * V;
        double ri = test_row_rel_err(img_row, (const float *)g->prefill.data + (size_t)(L - 1) * V, V);
        double rt = test_row_rel_err(txt_row, alone, V);
        if (ri > REL_TOL || rt > 1e-5)
            fail_msg("%s batched (order %d): image prompt's last row %.3g (> %.0e), text prompt's %.3g from alone",
                     name, order, ri, REL_TOL, rt);
        for (int s = 0; s < N; s++) {
            batch_clear(r->b);
            assert_int_equal(batch_add(r->b, greedy[s], L + s, 0, true, &e), 0);
            assert_int_equal(batch_add(r->b, alone_ids[s], g->n_text + s, 1, true, &e), 0);
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

static const char *model_type_of(const struct mgold *g)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(g->meta, "model_type");
    assert_true(cJSON_IsString(mt));
    return mt->valuestring;
}

static int patch_of(const char *dir)
{
    char path[700], *txt = NULL;
    size_t len = 0;
    struct err e = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    int p = meta_int(cJSON_GetObjectItemCaseSensitive(c, "vision_config"), "patch_size");
    cJSON_Delete(c);
    return p;
}

/* The whole check of a checkpoint dir against the golden folder gdir. */
static void run_golden(const char *dir, const char *gdir, const char *name, bool full)
{
    struct mgold g;
    struct test_eng r;
    mgold_open(&g, gdir, patch_of(gdir));
    test_eng_open(&r, dir, NULL, 0, 2 * (g.L + g.N) + 64, 2, 4);
    if (!r.m->vision)
        fail_msg("%s: the vision tower did not load", name);
    const struct vision_info *vi = &r.m->vision->info;
    assert_false(vi->bidirectional);
    assert_true(vi->row_breaks && vi->merge > 0);
    assert_int_equal(vi->image_token_id, meta_int(g.meta, "image_token_id"));
    assert_int_equal(vi->break_token_id, meta_int(g.meta, "image_break_token_id"));
    assert_int_equal(vi->end_token_id, meta_int(g.meta, "image_end_token_id"));
    assert_int_equal((int)vision_image_run(vi, (const int32_t *)g.ids.data + g.run_at, (size_t)(g.L - g.run_at)),
                     g.run_len);
    if (full)
        pixels_check(&g, gdir, name, model_type_of(&g));
    float *embd = encode_checked(&r, &g, name);
    double wp = prefill_check(&r, &g, embd, name);
    double wd = decode_check(&r, &g, name);
    if (full)
        batched_check(&r, &g, embd, name);
    printf("mistral3 %-9s prefill %d + decode %d tokens: max rel err %.2e / %.2e%s\n", name, g.L, g.N, wp, wd,
           full ? ", batched beside a text prompt" : "");
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);
    if (full) {
        /* chunks of 7 rows: the image's run is cut across chunks */
        test_eng_open(&r, dir, NULL, 7, 2 * (g.L + g.N) + 64, 2, 4);
        embd = encode_checked(&r, &g, name);
        prefill_check(&r, &g, embd, "chunks of 7");
        decode_check(&r, &g, "chunks of 7");
        r.be->ops->buf_free(r.be, embd);
        test_eng_close(&r);
    }
    mgold_close(&g);
}

static void check_case(void **state)
{
    const char *name = *state;
    run_golden(golden_case_dir(name), golden_case_dir(name), name, true);
}

// ---- mlx-vlm's layout ----

/* Case name's checkpoint as mlx-vlm stores it, at dst: the tower under
 * vision_tower.vision_model. with its patch conv channels-last [out, p, p, C] (pixtral's
 * sanitize), the text model under language_model.model. / language_model.lm_head., the
 * projector under multi_modal_projector. */
static void write_mlx_vlm(const char *name, const char *dst)
{
    struct err e = {0};
    const char *src = golden_case_dir(name);
    char path[700], *txt = NULL;
    size_t len = 0;
    static const char *const files[] = {"config.json", "preprocessor_config.json", "processor_config.json",
                                        "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", src, files[i]);
        if (file_read_all(path, 1 << 24, &txt, &len, &e) == 0) {
            assert_int_equal(stb_write_text(stb_path(dst, files[i]), txt), 0);
            free(txt);
        }
        err_clear(&e);
    }
    struct st_set *s = NULL;
    if (st_set_open(&s, src, &e) < 0)
        fail_msg("%s", e.msg);
    size_t n = st_set_count(s);
    struct st_wentry *ents = calloc(n, sizeof *ents);
    char **names = calloc(n, sizeof *names);
    void **data = calloc(n, sizeof *data);
    assert_true(ents && names && data);
    static const char *const from[][2] = {
        {"model.language_model.", "language_model.model."}, {"language_model.model.", "language_model.model."},
        {"lm_head.", "language_model.lm_head."}, {"language_model.lm_head.", "language_model.lm_head."},
        {"model.vision_tower.", "vision_tower.vision_model."}, {"vision_tower.", "vision_tower.vision_model."},
        {"model.multi_modal_projector.", "multi_modal_projector."},
    };
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        struct tensor tv;
        assert_int_equal(st_set_take(s, t->name, &tv, &e), 0);
        const char *rest = t->name, *pre = "";
        for (size_t k = 0; k < sizeof from / sizeof from[0]; k++)
            if (!strncmp(t->name, from[k][0], strlen(from[k][0]))) {
                rest = t->name + strlen(from[k][0]);
                pre = from[k][1];
                break;
            }
        size_t nl = strlen(pre) + strlen(rest) + 1, es = dtype_size(tv.dtype);
        names[i] = malloc(nl);
        snprintf(names[i], nl, "%s%s", pre, rest);
        size_t bytes = (size_t)tensor_nelem(&tv) * es;
        char *d = malloc(bytes);
        assert_non_null(d);
        if (strstr(rest, "patch_conv.weight")) { /* [O, C, p, p] -> [O, p, p, C] */
            int64_t O = tv.shape[0], C = tv.shape[1], p = tv.shape[2];
            for (int64_t o = 0; o < O; o++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t y = 0; y < p; y++)
                        for (int64_t x = 0; x < p; x++)
                            memcpy(d + (((o * p + y) * p + x) * C + c) * es,
                                   (const char *)tv.data + (((o * C + c) * p + y) * p + x) * es, es);
            ents[i] = (struct st_wentry){names[i], tv.dtype, 4, {O, p, p, C}};
        } else {
            memcpy(d, tv.data, bytes);
            ents[i] = (struct st_wentry){names[i], tv.dtype, tv.ndim, {0}};
            memcpy(ents[i].shape, tv.shape, sizeof tv.shape);
        }
        data[i] = d;
    }
    if (stb_write_model(dst, ents, names, data, n, &e) < 0)
        fail_msg("%s", e.msg);
    st_set_free(s);
}

static void rm_ckpt(const char *dir)
{
    static const char *const files[] = {"config.json", "model.safetensors", "preprocessor_config.json",
                                        "processor_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(stb_path(dir, files[i]));
    rmdir(dir);
}

static const char *find_case(const char *want)
{
    const struct golden_cases *gc = golden_image_cases();
    for (size_t i = 0; i < gc->n; i++)
        if (!strcmp(gc->names[i], want))
            return gc->names[i];
    fail_msg("no %s golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)", want);
    return NULL;
}

static void mlx_vlm_layout(void **state)
{
    (void)state;
    static const char *const cases[] = {"mistral3", "pixtral"};
    for (size_t i = 0; i < 2; i++) {
        const char *name = find_case(cases[i]);
        char dir[] = "/tmp/mlxcel-m3vlm-XXXXXX";
        assert_non_null(mkdtemp(dir));
        write_mlx_vlm(name, dir);
        run_golden(dir, golden_case_dir(name), "mlx-vlm", false);
        rm_ckpt(dir);
    }
}

// ---- image runs ----

static void image_runs(void **state)
{
    (void)state;
    struct vision_info vi = {.image_token_id = 10, .row_breaks = true, .break_token_id = 12, .end_token_id = 13};
    const int32_t two[] = {10, 10, 12, 10, 10, 13, 10, 13, 5};
    assert_int_equal(vision_image_run(&vi, two, 9), 6);           /* through the first [IMG_END] */
    assert_int_equal(vision_image_run(&vi, two + 6, 3), 2);       /* the next image: one row */
    assert_int_equal(vision_image_run(&vi, two + 2, 7), 0);       /* a break starts no run */
    const int32_t open[] = {10, 10, 12, 12, 5};
    assert_int_equal(vision_image_run(&vi, open, 5), 2);          /* no end: the breaks are not its */
    assert_true(vision_is_image_row(&vi, 12) && vision_is_image_row(&vi, 13) && !vision_is_image_row(&vi, 5));
    vi.row_breaks = false;                                         /* Qwen / LLaVA: image tokens only */
    assert_int_equal(vision_image_run(&vi, two, 9), 2);
    assert_false(vision_is_image_row(&vi, 12));
}

// ---- refusals ----

/* Configs the family must refuse: each patch sets one key of the top object or of
 * vision_config of a case's config.json, and names what the error says. */
static void bad_configs(void **state)
{
    (void)state;
    static const char *const patches[][5] = {
        /* case, object, key, value, the error says */
        {"mistral3", "", "vision_feature_layer", "4", "vision_feature_layer 4"},
        {"mistral3", "", "vision_feature_layer", "[-2, -1]", "vision_feature_layer"},
        {"mistral3", "", "spatial_merge_size", "0", "spatial_merge_size 0"},
        {"mistral3", "", "spatial_merge_size", "3", "merging_layer"},
        {"mistral3", "", "projector_hidden_act", "\"swiglu\"", "projector_hidden_act 'swiglu'"},
        {"mistral3", "", "image_token_index", "100000", "image_token_index 100000"},
        {"mistral3", "vision_config", "hidden_act", "\"swiglu\"", "swiglu"},
        {"mistral3", "vision_config", "num_attention_heads", "3", "3 heads"},
        {"mistral3", "vision_config", "head_dim", "8", "head_dim 8"},
        {"mistral3", "vision_config", "patch_size", "0", "patch_size 0"},
        {"mistral3", "vision_config", "rope_parameters", "{\"rope_type\": \"yarn\"}", "rope_type 'yarn'"},
        {"pixtral", "", "vision_feature_select_strategy", "\"default\"", "vision_feature_select_strategy 'default'"},
        {"pixtral", "", "vision_feature_layer", "-5", "vision_feature_layer -5"},
    };
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++) {
        const char *src = golden_case_dir(find_case(patches[i][0]));
        char dir[] = "/tmp/mlxcel-m3bad-XXXXXX", path[700], *txt = NULL;
        size_t len = 0;
        struct err e = {0};
        assert_non_null(mkdtemp(dir));
        static const char *const copy[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                           "processor_config.json"};
        for (size_t k = 0; k < sizeof copy / sizeof copy[0]; k++) {
            snprintf(path, sizeof path, "%s/%s", src, copy[k]);
            if (file_read_all(path, 64u << 20, &txt, &len, &e) < 0) {
                err_clear(&e);
                continue;
            }
            FILE *f = fopen(stb_path(dir, copy[k]), "wb");
            assert_non_null(f);
            assert_int_equal(fwrite(txt, 1, len, f), len);
            fclose(f);
            free(txt);
        }
        snprintf(path, sizeof path, "%s/config.json", src);
        assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
        cJSON *cfg = cJSON_Parse(txt);
        free(txt);
        assert_non_null(cfg);
        cJSON *obj = patches[i][1][0] ? cJSON_GetObjectItemCaseSensitive(cfg, patches[i][1]) : cfg;
        assert_non_null(obj);
        if (!strncmp(patches[i][2], "image_token_", 12)) {
            cJSON_DeleteItemFromObjectCaseSensitive(obj, "image_token_id");
            cJSON_DeleteItemFromObjectCaseSensitive(obj, "image_token_index");
        }
        cJSON_DeleteItemFromObjectCaseSensitive(obj, patches[i][2]);
        cJSON_AddItemToObject(obj, patches[i][2], cJSON_Parse(patches[i][3]));
        char *out = cJSON_Print(cfg);
        assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
        free(out);
        cJSON_Delete(cfg);
        struct model *m = NULL;
        if (model_load(&m, dir, &e) >= 0)
            fail_msg("%s: %s.%s = %s loaded", patches[i][0], patches[i][1], patches[i][2], patches[i][3]);
        printf("mistral3 bad config %s %s.%s = %s: %s\n", patches[i][0], patches[i][1], patches[i][2],
               patches[i][3], e.msg);
        if (!strstr(e.msg, patches[i][4]))
            fail_msg("%s.%s = %s: '%s' does not say '%s'", patches[i][1], patches[i][2], patches[i][3], e.msg,
                     patches[i][4]);
        rm_ckpt(dir);
    }
}

/* A checkpoint whose tokenizer lacks [IMG_BREAK] cannot expand an image: refused at load. */
static void no_break_token(void **state)
{
    (void)state;
    const char *src = golden_case_dir(find_case("mistral3"));
    char dir[] = "/tmp/mlxcel-m3brk-XXXXXX", path[700], *txt = NULL;
    size_t len = 0;
    struct err e = {0};
    assert_non_null(mkdtemp(dir));
    static const char *const copy[] = {"model.safetensors", "config.json"};
    for (size_t k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", src, copy[k]);
        assert_int_equal(file_read_all(path, 64u << 20, &txt, &len, &e), 0);
        FILE *f = fopen(stb_path(dir, copy[k]), "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(txt, 1, len, f), len);
        fclose(f);
        free(txt);
    }
    assert_int_equal(stb_write_text(stb_path(dir, "processor_config.json"),
                                    "{\"image_break_token\": \"[NO_SUCH]\"}"),
                     0);
    struct model *m = NULL;
    if (model_load(&m, dir, &e) >= 0)
        fail_msg("a checkpoint without its break token loaded");
    printf("mistral3 without [IMG_BREAK]: %s\n", e.msg);
    assert_non_null(strstr(e.msg, "[NO_SUCH]"));
    rm_ckpt(dir);
}

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static struct CMUnitTest *t; /* built once, for the life of the process */
    static size_t n;
    if (!t) {
        const struct golden_cases *gc = golden_image_cases();
        t = calloc(gc->n + 5, sizeof *t);
        if (!t) {
            *tests = NULL;
            *n_tests = 0;
            return;
        }
        for (size_t i = 0; i < gc->n; i++) {
            if (strcmp(gc->names[i], "mistral3") && strcmp(gc->names[i], "pixtral"))
                continue;
            size_t len = strlen(gc->names[i]) + 10;
            char *nm = malloc(len);
            snprintf(nm, len, "mistral3_%s", gc->names[i]);
            t[n++] = (struct CMUnitTest){.name = nm, .test_func = check_case, .initial_state = gc->names[i]};
        }
        /* these fail (naming the missing case) when the golden folders are not unpacked */
        t[n++] = (struct CMUnitTest){.name = "mistral3_mlx_vlm_layout", .test_func = mlx_vlm_layout};
        t[n++] = (struct CMUnitTest){.name = "mistral3_image_runs", .test_func = image_runs};
        t[n++] = (struct CMUnitTest){.name = "mistral3_bad_configs", .test_func = bad_configs};
        t[n++] = (struct CMUnitTest){.name = "mistral3_no_break_token", .test_func = no_break_token};
    }
    *tests = t;
    *n_tests = n;
}

TEST_SUITE_BUILT(mistral3, build_tests);
