/*
 * idefics3: Idefics3 and SmolVLM (SigLIP-like tower with bucketed position ids, pixel-shuffle
 * connector, llama; ADR 0126) against their float64 references, one test idefics3_<case> per
 * golden folder whose name starts with "idefics3" or "smolvlm" (tests/fixtures/gen/gen_idefics3.py):
 *   prompt     the case's image decoded, split into tiles and preprocessed (the folder's
 *              preprocessor_config.json, the PIL backend transformers picks) equals the
 *              processor's pixel_values tile for tile; the prompt transformers rendered, its
 *              <image> replaced by our expansion (fake tokens, <row_R_col_C>, <global-img>,
 *              image_seq_len <image> a tile) and tokenized, equals the processor's input_ids
 *   tower      each tile through the tower (bucketed position ids) and the connector against
 *              vision_hidden and image_features
 *   prompt     prefill with each tile's rows in place of its run of <image> tokens, every row
 *              within 1e-3 x max|logit|, then greedy decoding: the reference ids and logits
 *   text       the prompt without its image: its last row against transformers'
 *   batched    the image prompt and the text prompt in the same forward steps (both orders),
 *              prefill and decode; then the image prompt in chunks of 7 rows (which cut tiles)
 *   scheduler  the tiles as the server submits them (sched_submit_images: pixels, one tower
 *              image a tile, encoded one a step): the reference ids and logits alone, beside a
 *              text request in the same steps, and with a step budget of 5 rows (tiles cut
 *              between steps)
 * Then idefics3_positions (the bucketed position ids against torch's own, for many grid sides),
 * idefics3_mlx_vlm_layout (mlx-vlm's names: vision_model.*, connector.*, language_model.*, the
 * patch conv channels-last) and idefics3_bad_configs.
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
#include "engine/image_input.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/vision.h"
#include "st_build.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define REL_TOL 1e-3
#define FEAT_TOL 1e-4
#define MAX_TILES 64

struct igold {
    struct st_set *st;
    struct tensor ids, px, vh, feat, prefill, greedy, decode, text_ids;
    cJSON *meta;
    int L, N, n_text, n_tiles;
};

static void igold_open(struct igold *g, const char *dir)
{
    char path[700], *txt = NULL;
    size_t len = 0;
    struct err e = {0};
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_set_open_file(&g->st, path, &e) < 0)
        fail_msg("%s", e.msg);
    const char *names[] = {"input_ids", "pixel_values", "vision_hidden", "image_features", "prefill_logits",
                           "greedy_ids", "decode_logits", "text_ids"};
    struct tensor *ts[] = {&g->ids, &g->px, &g->vh, &g->feat, &g->prefill, &g->greedy, &g->decode, &g->text_ids};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (st_set_take(g->st, names[i], ts[i], &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
    g->L = (int)g->ids.shape[0];
    g->N = (int)g->greedy.shape[0];
    g->n_text = (int)g->text_ids.shape[0];
    g->n_tiles = (int)g->px.shape[0];
    assert_true(g->n_tiles >= 1 && g->n_tiles <= MAX_TILES);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    assert_int_equal(file_read_all(path, 1 << 24, &txt, &len, &e), 0);
    g->meta = cJSON_Parse(txt);
    free(txt);
    assert_non_null(g->meta);
}

static void igold_close(struct igold *g)
{
    cJSON_Delete(g->meta);
    st_set_free(g->st);
}

/* Each tile's run of image tokens in the prompt as seq's batch_images (tile k's rows at
 * embd + k T D). */
static int prompt_images(const struct igold *g, struct batch_image *img, int seq, const float *embd, int T, int D,
                         int32_t image_id)
{
    const int32_t *ids = g->ids.data;
    int n = 0;
    for (int i = 0; i < g->L;) {
        if (ids[i] != image_id) {
            i++;
            continue;
        }
        int len = 0;
        while (i + len < g->L && ids[i + len] == image_id)
            len++;
        assert_int_equal(len, T);
        assert_true(n < g->n_tiles);
        img[n] = (struct batch_image){seq, i, len, embd + (size_t)n * T * D, 0, 0, 0};
        n++;
        i += len;
    }
    assert_int_equal(n, g->n_tiles);
    return n;
}

/* The image through image_input (what `generate --image` and the server run): its tiles equal
 * the processor's pixel_values, and the prompt with its <image> replaced by our expansion
 * tokenizes to the processor's input_ids. */
static void prompt_check(const struct igold *g, const struct model *m, const char *dir, const char *name)
{
    struct err e = {0};
    struct tokenizer *tok = NULL;
    struct image_setup su;
    struct image_input in;
    struct image im = {0};
    char path[700], *text = NULL;
    size_t tlen = 0, n_ids = 0;
    int32_t *ids = NULL;
    if (tok_load(&tok, dir, &e) < 0 || image_setup_init(&su, dir, m, tok, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    const cJSON *ims = cJSON_GetObjectItemCaseSensitive(g->meta, "images");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(g->meta, "prompt");
    assert_true(cJSON_IsArray(ims) && cJSON_GetArraySize(ims) == 1 && cJSON_IsString(pr));
    snprintf(path, sizeof path, "%s/%s", test_path("tests/fixtures/images"), cJSON_GetArrayItem(ims, 0)->valuestring);
    image_input_init(&in, &su);
    if (image_load(&im, path, NULL, &e) < 0 || image_input_add(&in, &im, &e) < 0)
        fail_msg("%s: %s: %s", name, path, e.msg);
    assert_int_equal(in.n_img, g->n_tiles);
    assert_int_equal((int64_t)in.n_values, tensor_nelem(&g->px));
    double worst = 0;
    for (size_t i = 0; i < in.n_values; i++)
        worst = fmax(worst, fabs((double)in.pixels[i] - ((const float *)g->px.data)[i]));
    if (worst > 1e-5)
        fail_msg("%s: pixel_values differ from the processor's by %.3g", name, worst);
    if (image_input_substitute(&in, pr->valuestring, strlen(pr->valuestring), &text, &tlen, &e) < 0 ||
        tok_encode(tok, text, tlen, false, &ids, &n_ids, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    if ((int)n_ids != g->L || memcmp(ids, g->ids.data, n_ids * sizeof *ids) != 0) {
        size_t k = 0;
        while (k < n_ids && (int)k < g->L && ids[k] == ((const int32_t *)g->ids.data)[k])
            k++;
        fail_msg("%s: our expansion tokenizes to %zu ids, the processor's has %d (first difference at %zu)", name,
                 n_ids, g->L, k);
    }
    int32_t pos[MAX_TILES];
    if (image_input_runs(&in, ids, n_ids, pos, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    printf("idefics3 %-10s %d tiles: pixel_values max abs diff %.2e; the prompt's %zu ids equal the processor's\n",
           name, in.n_img, worst, n_ids);
    free(ids);
    free(text);
    image_input_free(&in);
    image_free(&im);
    /* a large image (vis_photo640.jpg, 640x480) at 5 tiles a side: 4 x 5 tiles + the global one,
     * more tower images than one prompt took before (16) */
    struct image_setup big = su;
    big.cfg.longest_edge = 5 * big.cfg.max_image_size;
    snprintf(path, sizeof path, "%s/vis_photo640.jpg", test_path("tests/fixtures/images"));
    image_input_init(&in, &big);
    if (image_load(&im, path, NULL, &e) < 0 || image_input_add(&in, &im, &e) < 0)
        fail_msg("%s: a 640x480 image in 21 tiles: %s", name, e.msg);
    assert_int_equal(in.n_img, 21);
    /* the prompt's pixel values are bounded: 20 tiles' worth refuses the 21 */
    size_t tile = in.n_values / 21;
    image_input_free(&in);
    image_input_init(&in, &big);
    in.max_values = 20 * tile;
    assert_int_equal(image_input_add(&in, &im, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "pixel values"));
    assert_int_equal(in.n_img, 0);
    image_input_free(&in);
    image_free(&im);
    tok_free(tok);
}

/* Every tile through the tower and connector into backend memory (the caller frees it),
 * checked against vision_hidden and image_features. */
static float *encode_checked(struct test_eng *r, const struct igold *g, const char *name)
{
    struct err e = {0};
    struct vision_ctx *vc = NULL;
    const struct vision *v = r->m->vision;
    int T = v->info.tokens_per_image, D = r->m->hp.n_embd, P = v->vh.n_pos, dv = v->vh.n_embd, n = g->n_tiles;
    size_t px1 = vision_pixel_bytes(v) / sizeof(float);
    float *embd = NULL;
    if (vision_ctx_new(&vc, r->m, r->be, &e) < 0 ||
        r->be->ops->buf_alloc(r->be, (size_t)n * T * D * sizeof(float), (void **)&embd, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    assert_int_equal(g->feat.shape[0], n);
    assert_int_equal(g->feat.shape[1], T);
    assert_int_equal(g->feat.shape[2], D);
    assert_int_equal(g->vh.shape[1], P);
    assert_int_equal(g->vh.shape[2], dv);
    assert_int_equal((int64_t)px1 * n, tensor_nelem(&g->px));
    float *hid = malloc((size_t)P * dv * sizeof *hid), *feat = malloc((size_t)T * D * sizeof *feat);
    assert_true(hid && feat);
    double eh = 0, ef = 0;
    for (int k = 0; k < n; k++) {
        float *out = embd + (size_t)k * T * D;
        if (vision_encode(vc, out, (const float *)g->px.data + (size_t)k * px1, 1, &e) < 0)
            fail_msg("%s: %s", name, e.msg);
        r->be->ops->download(r->be, hid, vc->vit->b.x, (size_t)P * dv * sizeof *hid);
        r->be->ops->download(r->be, feat, out, (size_t)T * D * sizeof *feat);
        assert_int_equal(backend_sync(r->be, &e), 0);
        eh = fmax(eh, test_row_rel_err(hid, (const float *)g->vh.data + (size_t)k * P * dv, P * dv));
        ef = fmax(ef, test_row_rel_err(feat, (const float *)g->feat.data + (size_t)k * T * D, T * D));
    }
    printf("idefics3 %-10s tower (%d tiles of %d patches) max rel err %.2e, connector %.2e\n", name, n, P, eh, ef);
    if (eh > FEAT_TOL || ef > FEAT_TOL)
        fail_msg("%s: vision tower relative error %.3g, connector %.3g (> %.0e)", name, eh, ef, FEAT_TOL);
    free(hid);
    free(feat);
    vision_ctx_free(vc);
    return embd;
}

static double prefill_check(struct test_eng *r, const struct igold *g, const float *embd, const char *what)
{
    struct err e = {0};
    struct batch_image img[MAX_TILES];
    const struct vision_info *vi = &r->m->vision->info;
    int V = r->m->hp.n_vocab;
    int n = prompt_images(g, img, 0, embd, vi->tokens_per_image, r->m->hp.n_embd, vi->image_token_id);
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
        double rr = test_row_rel_err(logits + (size_t)i * V, (const float *)g->prefill.data + (size_t)i * V, V);
        worst = rr > worst ? rr : worst;
        if (rr > REL_TOL)
            fail_msg("%s: prefill position %d: relative error %.3g > %.0e", what, i, rr, REL_TOL);
    }
    free(logits);
    return worst;
}

static double decode_check(struct test_eng *r, const struct igold *g, const char *what)
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

/* The text prompt alone (seq 1): its last row against transformers', then N greedy steps
 * (alone[0..N], alone_ids) for the batched comparison. */
static void text_alone(struct test_eng *r, const struct igold *g, float *alone, int32_t *alone_ids)
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
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(g->meta, "text_last_logits");
    assert_true(cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == V);
    int i = 0;
    const cJSON *it;
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

static void batched_check(struct test_eng *r, const struct igold *g, const float *embd, const char *name)
{
    struct err e = {0};
    const struct vision_info *vi = &r->m->vision->info;
    int V = r->m->hp.n_vocab, L = g->L, N = g->N;
    const int32_t *greedy = g->greedy.data;
    float *alone = malloc((size_t)(N + 1) * V * sizeof *alone), *logits = malloc((size_t)2 * V * sizeof *logits);
    int32_t alone_ids[64];
    assert_true(alone && logits && N < 64);
    text_alone(r, g, alone, alone_ids);
    for (int order = 0; order < 2; order++) {
        struct batch_image img[MAX_TILES];
        int n = prompt_images(g, img, 0, embd, vi->tokens_per_image, r->m->hp.n_embd, vi->image_token_id);
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
        r->b->img = img;
        r->b->n_img = n;
        if (model_forward(r->c, r->b, r->kv, logits, &e) < 0)
            fail_msg("%s batched: %s", name, e.msg);
        const float *img_row = logits + (size_t)(1 - order) * V, *txt_row = logits + (size_t)order * V;
        double ri = test_row_rel_err(img_row, (const float *)g->prefill.data + (size_t)(L - 1) * V, V);
        double rt = test_row_rel_err(txt_row, alone, V);
        if (ri > REL_TOL || rt > 1e-5)
            fail_msg("%s batched (order %d): image prompt's last row %.3g (> %.0e), text prompt's %.3g from "
                     "alone", name, order, ri, REL_TOL, rt);
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

// ---- the scheduler (the server's path) ----

/* One scheduler request's output: its greedy ids and the logits rows they came from. */
struct sq_out {
    int32_t ids[64];
    float *logits;  /* [N, V] */
    int n, V, rc;
    bool done;
};

static int sq_token(void *ud, int32_t id, const float *logits)
{
    struct sq_out *o = ud;
    if (o->n < 64) {
        o->ids[o->n] = id;
        memcpy(o->logits + (size_t)o->n * o->V, logits, (size_t)o->V * sizeof *logits);
    }
    o->n++;
    return 0;
}

static void sq_done(void *ud, const struct gen_stats *st, int rc, const struct err *e)
{
    struct sq_out *o = ud;
    (void)st;
    (void)e;
    o->rc = rc;
    o->done = true;
}

static void sq_submit(struct sched *sc, const int32_t *ids, int L, const struct sched_image *im, int n_img, int N,
                      int V, struct sq_out *o)
{
    struct err e = {0};
    struct gen_params gp = {.n_predict = N, .ignore_eos = true};
    sampler_params_default(&gp.sampling);
    gp.sampling.temperature = 0;
    memset(o, 0, sizeof *o);
    o->V = V;
    o->logits = malloc((size_t)N * V * sizeof *o->logits);
    assert_non_null(o->logits);
    if (sched_submit_images(sc, ids, L, &gp, im, n_img, &(struct sched_cb){sq_token, sq_done, o}, NULL, &e) < 0)
        fail_msg("sched_submit_images: %s", e.msg);
}

/* The tiles through the scheduler, as the server submits them (src/server/gen.c: each tile a
 * sched_image at its run of <image> tokens): with the default step budget and with one of 5 rows
 * (each tile's 4 or more rows cut between steps), the second beside a text request in the same
 * steps. Each tile is encoded in a step of its own, so a prompt chunk ends before the next tile
 * not yet encoded while holding the encoded ones before it: their rows must be the tower's (a
 * chunk that fed them as the <image> token's embedding answered other ids). */
static void sched_check(struct test_eng *r, const struct igold *g, const char *name)
{
    struct err e = {0};
    const struct vision_info *vi = &r->m->vision->info;
    const int32_t *ids = g->ids.data, *greedy = g->greedy.data;
    int V = r->m->hp.n_vocab, L = g->L, N = g->N < 64 ? g->N : 64, n = 0;
    size_t px1 = vision_pixel_bytes(r->m->vision) / sizeof(float);
    struct sched_image im[MAX_TILES];
    for (int i = 0; i < L; i++)
        if (ids[i] == vi->image_token_id && (i == 0 || ids[i - 1] != vi->image_token_id)) {
            assert_true(n < g->n_tiles);
            im[n] = (struct sched_image){i, (const float *)g->px.data + (size_t)n * px1, {0, 0, 0}};
            n++;
        }
    assert_int_equal(n, g->n_tiles);
    kv_seq_remove(r->kv, 0);
    kv_seq_remove(r->kv, 1);
    for (int pass = 0; pass < 2; pass++) {
        struct sched *sc = NULL;
        struct sched_params sp = {.no_prefix_cache = true, .max_batch_tokens = pass ? 5 : 0};
        struct sq_out o, t;
        assert_int_equal(sched_new(&sc, r->c, r->kv, &sp, &e), 0);
        sq_submit(sc, ids, L, im, n, N, V, &o);
        if (pass)
            sq_submit(sc, g->text_ids.data, g->n_text, NULL, 0, N, V, &t);
        int rc, steps = 0;
        while ((rc = sched_step(sc, &e)) == 1 && steps++ < 4 * (L + N))
            ;
        if (rc != 0)
            fail_msg("%s scheduler: %s", name, e.msg);
        assert_true(o.done && o.rc == 0 && o.n == N);
        assert_int_equal(sched_n_encoded(sc), n);
        for (int s = 0; s < N; s++) {
            const float *want = s == 0 ? (const float *)g->prefill.data + (size_t)(L - 1) * V
                                       : (const float *)g->decode.data + (size_t)(s - 1) * V;
            double rr = test_row_rel_err(o.logits + (size_t)s * V, want, V);
            if (o.ids[s] != greedy[s] || rr > REL_TOL)
                fail_msg("%s scheduler (budget %d%s): token %d is %d (reference %d), its logits %.3g from the "
                         "reference", name, sp.max_batch_tokens, pass ? ", beside a text request" : "", s,
                         o.ids[s], greedy[s], rr);
        }
        if (pass) {
            assert_true(t.done && t.rc == 0 && t.n == N);
            free(t.logits);
        }
        free(o.logits);
        sched_free(sc);
    }
    printf("idefics3 %-10s scheduler: %d tiles, %d tokens as the reference (also in steps of 5 rows beside a "
           "text request)\n", name, n, N);
}

/* The whole check of a checkpoint dir against the golden folder gdir. */
static void run_golden(const char *dir, const char *gdir, const char *name, bool full)
{
    struct igold g;
    struct test_eng r;
    igold_open(&g, gdir);
    test_eng_open(&r, dir, NULL, 0, 2 * (g.L + g.N) + 64, 2, 4);
    if (!r.m->vision)
        fail_msg("%s: the vision tower did not load", name);
    const struct vision_info *vi = &r.m->vision->info;
    assert_int_equal(vi->tokens_per_image, (int)g.feat.shape[1]);
    assert_false(vi->bidirectional);
    assert_int_equal(vi->image_token_id, (int)cJSON_GetObjectItemCaseSensitive(g.meta, "image_token_id")->valuedouble);
    if (full)
        prompt_check(&g, r.m, gdir, name);
    float *embd = encode_checked(&r, &g, name);
    double wp = prefill_check(&r, &g, embd, name);
    double wd = decode_check(&r, &g, name);
    if (full) {
        batched_check(&r, &g, embd, name);
        sched_check(&r, &g, name);
    }
    printf("idefics3 %-10s prefill %d + decode %d tokens: max rel err %.2e / %.2e%s\n", name, g.L, g.N, wp, wd,
           full ? ", batched beside a text prompt" : "");
    r.be->ops->buf_free(r.be, embd);
    test_eng_close(&r);
    if (full) {
        /* chunks of 7 rows: tiles are cut across chunks (causal attention: allowed) */
        test_eng_open(&r, dir, NULL, 7, 2 * (g.L + g.N) + 64, 2, 4);
        embd = encode_checked(&r, &g, name);
        prefill_check(&r, &g, embd, "chunks of 7");
        decode_check(&r, &g, "chunks of 7");
        r.be->ops->buf_free(r.be, embd);
        test_eng_close(&r);
    }
    igold_close(&g);
}

static void check_case(void **state)
{
    const char *name = *state;
    run_golden(golden_case_dir(name), golden_case_dir(name), name, true);
}

static bool is_case(const char *name)
{
    return !strncmp(name, "idefics3", 8) || !strncmp(name, "smolvlm", 7);
}

static const char *first_case(void)
{
    const struct golden_cases *gc = golden_image_cases();
    for (size_t i = 0; i < gc->n; i++)
        if (is_case(gc->names[i]))
            return gc->names[i];
    fail_msg("no idefics3 / smolvlm golden case (cmake unpacks tests/fixtures/golden/*.tar.xz)");
    return NULL;
}

// ---- bucketed position ids ----

/* vit_bucket_positions against torch's own bucketize (gen_idefics3.py's positions.json: every
 * side 1..96 with a full grid, every partial grid of sides up to 24): aten's arange in vectors of
 * 8 floats (what the AVX-512 machine ran; 16 lanes would differ). Full grids of some sides are not 0..n-1 (25, 29, 31, ...). */
static void positions(void **state)
{
    (void)state;
    struct err e = {0};
    char *txt = NULL;
    size_t len = 0;
    const char *path = test_path("tests/fixtures/idefics3_positions.json");
    if (file_read_all(path, 1 << 22, &txt, &len, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    const cJSON *cap = cJSON_GetObjectItemCaseSensitive(j, "cpu_capability");
    assert_true(cJSON_IsString(cap));
    /* aten's arange vectorizes 8 floats at a time on the AVX-512 reference machine too (16 lanes
     * would put row 12 of side 19 one bucket higher: checked below) */
    int lanes = 8, n_other = 0;
    int n_checked = 0, n_not_identity = 0;
    static const char *const kinds[] = {"full", "partial"};
    for (int k = 0; k < 2; k++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, kinds[k]), *it;
        assert_true(cJSON_IsObject(o));
        cJSON_ArrayForEach(it, o) {
            int nb, side;
            if (k == 0) {
                side = nb = atoi(it->string);
            } else {
                assert_int_equal(sscanf(it->string, "%d/%d", &nb, &side), 2);
            }
            int32_t got[128];
            assert_int_equal(vit_bucket_positions(got, nb, 1, side, lanes), 0);
            assert_int_equal(cJSON_GetArraySize(it), nb);
            bool identity = true;
            for (int y = 0; y < nb; y++) {
                int want = cJSON_GetArrayItem(it, y)->valueint;
                if (got[y] != want * side)
                    fail_msg("positions %s (%d lanes): row %d buckets to %d, torch %d", it->string, lanes, y,
                             got[y] / side, want);
                identity = identity && want == y;
            }
            n_not_identity += k == 0 && !identity;
            int32_t o16[128];
            assert_int_equal(vit_bucket_positions(o16, nb, 1, side, 16), 0);
            n_other += memcmp(o16, got, (size_t)nb * sizeof *got) != 0;
            n_checked++;
        }
    }
    /* a 2-D grid: row buckets x side + column buckets */
    int32_t g2[4 * 6], h1[4], w1[6];
    assert_int_equal(vit_bucket_positions(g2, 4, 6, 6, lanes), 0);
    assert_int_equal(vit_bucket_positions(h1, 4, 1, 6, lanes), 0);
    assert_int_equal(vit_bucket_positions(w1, 6, 1, 6, lanes), 0);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 6; x++)
            assert_int_equal(g2[y * 6 + x], h1[y] + w1[x] / 6);
    assert_int_equal(vit_bucket_positions(g2, 7, 2, 6, lanes), -ERR_ARG);
    assert_int_equal(vit_bucket_positions(g2, 1, 1, 129, lanes), -ERR_ARG);
    printf("idefics3 positions: %d grids equal torch's (%s, %d lanes); %d full grids are not 0..n-1\n", n_checked,
           cap->valuestring, lanes, n_not_identity);
    assert_true(n_not_identity > 0);
    assert_true(n_other > 0);
    cJSON_Delete(j);
}

// ---- mlx-vlm's layout ----

/* Case name's checkpoint as mlx-vlm stores it, at dst: model.vision_model. -> vision_model.
 * (the patch conv channels-last [out, p, p, C]), model.connector. -> connector.,
 * model.text_model. -> language_model., lm_head. -> language_model.lm_head. */
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
        {"model.vision_model.", "vision_model."}, {"model.connector.", "connector."},
        {"model.text_model.", "language_model."}, {"lm_head.", "language_model.lm_head."},
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
        if (strstr(rest, "patch_embedding.weight")) { /* [O, C, p, p] -> [O, p, p, C] */
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

static void mlx_vlm_layout(void **state)
{
    (void)state;
    const char *name = first_case();
    char dir[] = "/tmp/mlxcel-i3vlm-XXXXXX";
    struct err e = {0};
    struct model *m = NULL;
    assert_non_null(mkdtemp(dir));
    write_mlx_vlm(name, dir);
    if (model_load(&m, dir, &e) < 0)
        fail_msg("%s in mlx-vlm's layout: %s", name, e.msg);
    assert_non_null(m->vision);
    assert_int_equal(m->vision->vw.layout, VIT_PATCH_HWC);
    assert_int_equal(st_set_n_unused(m->st), 0);
    model_free(m);
    run_golden(dir, golden_case_dir(name), "mlx-vlm", false);
    rm_ckpt(dir);
}

// ---- refusals ----

/* Configs the family must refuse, on the first case's weights: each patch sets one key of the
 * top object or of vision_config, and names what the error says. */
static void bad_configs(void **state)
{
    (void)state;
    const char *src = golden_case_dir(first_case());
    static const char *const patches[][4] = {
        /* object, key, value, the error says */
        {"", "scale_factor", "4", "scale_factor 4"},
        {"", "scale_factor", "0", "scale_factor 0"},
        {"", "scale_factor", "\"2\"", "scale_factor"},
        {"", "image_token_id", "100000", "image_token_id 100000"},
        {"", "image_token_id", "-1", "image_token_id -1"},
        {"vision_config", "hidden_act", "\"swiglu\"", "swiglu"},
        {"vision_config", "num_attention_heads", "3", "num_attention_heads 3"},
        {"vision_config", "image_size", "44", "image_size 44"},
        {"vision_config", "hidden_size", "48", "48"},
        {"vision_config", "patch_size", "0", "patch_size 0"},
    };
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++) {
        char dir[] = "/tmp/mlxcel-i3bad-XXXXXX", path[700], *txt = NULL;
        size_t len = 0;
        struct err e = {0};
        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/config.json", src);
        assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
        cJSON *cfg = cJSON_Parse(txt);
        free(txt);
        assert_non_null(cfg);
        cJSON *obj = patches[i][0][0] ? cJSON_GetObjectItemCaseSensitive(cfg, patches[i][0]) : cfg;
        assert_non_null(obj);
        cJSON_DeleteItemFromObjectCaseSensitive(obj, patches[i][1]);
        cJSON_AddItemToObject(obj, patches[i][1], cJSON_Parse(patches[i][2]));
        char *out = cJSON_Print(cfg);
        assert_int_equal(stb_write_text(stb_path(dir, "config.json"), out), 0);
        free(out);
        cJSON_Delete(cfg);
        snprintf(path, sizeof path, "%s/model.safetensors", src);
        assert_int_equal(file_read_all(path, 64u << 20, &txt, &len, &e), 0);
        FILE *f = fopen(stb_path(dir, "model.safetensors"), "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(txt, 1, len, f), len);
        fclose(f);
        free(txt);
        struct model *m = NULL;
        if (model_load(&m, dir, &e) >= 0)
            fail_msg("%s.%s = %s loaded", patches[i][0], patches[i][1], patches[i][2]);
        printf("idefics3 bad config %s.%s = %s: %s\n", patches[i][0], patches[i][1], patches[i][2], e.msg);
        if (!strstr(e.msg, patches[i][3]))
            fail_msg("%s.%s = %s: '%s' does not say '%s'", patches[i][0], patches[i][1], patches[i][2], e.msg,
                     patches[i][3]);
        rm_ckpt(dir);
    }
}

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static struct CMUnitTest *t; /* built once, for the life of the process */
    static size_t n;
    if (!t) {
        const struct golden_cases *gc = golden_image_cases();
        t = calloc(gc->n + 4, sizeof *t);
        if (!t) {
            *tests = NULL;
            *n_tests = 0;
            return;
        }
        for (size_t i = 0; i < gc->n; i++) {
            if (!is_case(gc->names[i]))
                continue;
            size_t len = strlen(gc->names[i]) + 10;
            char *nm = malloc(len);
            snprintf(nm, len, "idefics3_%s", gc->names[i]);
            t[n++] = (struct CMUnitTest){.name = nm, .test_func = check_case, .initial_state = gc->names[i]};
        }
        t[n++] = (struct CMUnitTest){.name = "idefics3_positions", .test_func = positions};
        /* these fail (naming the missing case) when no idefics3 golden is unpacked */
        t[n++] = (struct CMUnitTest){.name = "idefics3_mlx_vlm_layout", .test_func = mlx_vlm_layout};
        t[n++] = (struct CMUnitTest){.name = "idefics3_bad_configs", .test_func = bad_configs};
    }
    *tests = t;
    *n_tests = n;
}

TEST_SUITE_BUILT(idefics3, build_tests);
