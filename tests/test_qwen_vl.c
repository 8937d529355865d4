/*
 * qwen_vl: Qwen2-VL / Qwen2.5-VL's M-RoPE (ADR 0094) and towers.
 *   positions     vision_mrope_positions against get_rope_index's rule on a hand example (text,
 *                 an image of 2 x 3 merged tokens, text; two images), and its refusals
 *   text          the qwen2 golden checkpoint relabelled qwen2_vl_text (mrope_section [2, 3, 3]):
 *                 a text prompt's logits equal qwen2's bit for bit (three equal positions are plain
 *                 rope), and 3-D positions change them
 *   batched       an image-shaped prompt (3-D positions on a run of rows) prefilled at once, in
 *                 chunks of 8 rows, and interleaved with a text sequence in the same steps, then
 *                 decoded from max position + 1: every way gives the same logits
 * Then one test per Qwen image golden case (tests/fixtures/gen/gen_qwen_vl.py: golden.json
 * "model_type" qwen2_vl / qwen2_5_vl), qwen_vl_<case>:
 *   pixels        the case's images decoded and preprocessed equal the processor's pixel_values
 *   positions     vision_mrope_positions of the prompt equal transformers' position_ids
 *   tower         each image's patches through the ViT and merger against vision_hidden and
 *                 image_features
 *   prompt        prefill with the image rows in place of the <|image_pad|> tokens, every row
 *                 within 1e-3 x max|logit|, then greedy decoding: the reference ids and logits
 *   text          the prompt without its images: its last row against transformers'
 *   batched       the image prompt and the text prompt in the same forward steps, each still
 *                 meets its reference; in chunks of 7 rows, which cut the images
 * and qwen_vl_mlx_vlm_layout: one case of each family rewritten as mlx-vlm stores it (flat
 * config.json, vision_tower.* / language_model.*, the Conv3d weight channels-last) meets the
 * same reference; qwen_vl_bad_configs: vision_config values the towers refuse, naming them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "image/image.h"
#include "image/preprocess.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/vision.h"
#include "st_build.h"
#include "test.h"
#include "core/st_write.h"

// ---- positions ----

static void mrope_positions_rule(void **state)
{
    (void)state;
    struct err e = {0};
    enum { I = 9 };
    /* t t [vision_start] I x 6 (2 x 3) [vision_end] t */
    const int32_t ids[] = {1, 2, 3, I, I, I, I, I, I, 4, 5};
    const int32_t grid[] = {2, 3};
    const int32_t want[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {3, 3, 4}, {3, 3, 5},
                               {3, 4, 3}, {3, 4, 4}, {3, 4, 5}, {6, 6, 6}, {7, 7, 7}};
    int32_t pos[11][3], delta = -1;
    assert_int_equal(vision_mrope_positions(&pos[0][0], &delta, ids, 11, I, grid, 1, &e), 0);
    assert_memory_equal(pos, want, sizeof want);
    assert_int_equal(delta, 8 - 11);   /* the next row (position 11) turns at 8 */
    /* two images back to back, the second taller than wide: each advances by its longer side */
    const int32_t ids2[] = {1, I, I, I, I, I, I, 2};
    const int32_t grid2[] = {1, 2, 2, 2};
    const int32_t want2[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 1, 2}, {3, 3, 3}, {3, 3, 4}, {3, 4, 3}, {3, 4, 4},
                                {5, 5, 5}};
    int32_t pos2[8][3];
    assert_int_equal(vision_mrope_positions(&pos2[0][0], &delta, ids2, 8, I, grid2, 2, &e), 0);
    assert_memory_equal(pos2, want2, sizeof want2);
    assert_int_equal(delta, 6 - 8);
    /* text only: plain positions, no shift */
    assert_int_equal(vision_mrope_positions(&pos2[0][0], &delta, ids, 3, I, NULL, 0, &e), 0);
    assert_int_equal(pos2[2][1], 2);
    assert_int_equal(delta, 0);
    /* refusals: a run shorter than its grid, image tokens with no image, an image with none */
    assert_int_equal(vision_mrope_positions(&pos[0][0], &delta, ids, 8, I, grid, 1, &e), -ERR_ARG);
    assert_int_equal(vision_mrope_positions(&pos[0][0], &delta, ids, 11, I, grid, 0, &e), -ERR_ARG);
    assert_int_equal(vision_mrope_positions(&pos[0][0], &delta, ids, 3, I, grid, 1, &e), -ERR_ARG);
    const int32_t grid_short[] = {1, 4};   /* 4 tokens, then two more image tokens: a second run */
    assert_int_equal(vision_mrope_positions(&pos[0][0], &delta, ids, 11, I, grid_short, 1, &e), -ERR_ARG);
}

// ---- the qwen2 golden as qwen2_vl_text ----

/* dst: the golden case's checkpoint with model_type mt and mrope_section sec (rope_scaling),
 * the weights copied. */
static void make_mrope_case(char *dst, const char *name, const char *mt, const int sec[3])
{
    const char *src = golden_case_dir(name);
    char path[700], link[700];
    char *txt = NULL;
    size_t n = 0;
    struct err e = {0};
    assert_non_null(mkdtemp(dst));
    snprintf(path, sizeof path, "%s/config.json", src);
    if (file_read_all(path, 1 << 20, &txt, &n, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    assert_non_null(c);
    cJSON_ReplaceItemInObject(c, "model_type", cJSON_CreateString(mt));
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddStringToObject(rs, "type", "mrope");
    cJSON_AddItemToObject(rs, "mrope_section", cJSON_CreateIntArray(sec, 3));
    cJSON_DeleteItemFromObject(c, "rope_scaling");
    cJSON_AddItemToObject(c, "rope_scaling", rs);
    char *out = cJSON_Print(c);
    cJSON_Delete(c);
    snprintf(path, sizeof path, "%s/config.json", dst);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
    free(out);
    /* the weights copied (the loader refuses a link out of the folder) */
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    snprintf(link, sizeof link, "%s/model.safetensors", dst);
    if (file_read_all(path, 1 << 26, &txt, &n, &e) < 0)
        fail_msg("%s", e.msg);
    f = fopen(link, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(txt, 1, n, f), n);
    fclose(f);
    free(txt);
}

/* tests/fixtures/golden/qwen2 as qwen2_vl_text, mrope_section [2, 3, 3] (its head_dim is 16). */
static void make_mrope_model(char *dst)
{
    static const int sec[3] = {2, 3, 3};
    make_mrope_case(dst, "qwen2", "qwen2_vl_text", sec);
}

static void rm_mrope_model(const char *dir)
{
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

/* All rows' logits of ids as a fresh sequence 0 of g, rope positions p3 (NULL: plain). */
static float *prefill_all(struct test_eng *g, const int32_t *ids, int n, const int32_t *p3)
{
    struct err e = {0};
    int V = g->m->hp.n_vocab;
    float *l = malloc((size_t)n * V * sizeof *l);
    assert_non_null(l);
    kv_seq_remove(g->kv, 0);
    assert_int_equal(kv_seq_add(g->kv, 0, &e), 0);
    batch_clear(g->b);
    assert_int_equal(batch_add_seq(g->b, ids, n, 0, 0, false, &e), 0);
    for (int i = 0; i < n; i++)
        g->b->logits[i] = true;
    if (p3)
        assert_int_equal(batch_rope_set(g->b, 0, n, p3, 0, &e), 0);
    if (model_forward(g->c, g->b, g->kv, l, &e) < 0)
        fail_msg("%s", e.msg);
    return l;
}

static void mrope_text_equals_rope(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-qvl-XXXXXX";
    struct st_set *gs = NULL;
    struct tensor ids;
    struct test_eng a, b;
    make_mrope_model(dir);
    golden_case_input_ids("qwen2", &gs, &ids);
    int n = (int)ids.shape[0];
    test_eng_open(&a, golden_case_dir("qwen2"), NULL, 0, 256, 2, 16);
    test_eng_open(&b, dir, a.be, 0, 256, 2, 16);
    assert_true(hparams_has_mrope(&b.m->hp));
    int V = a.m->hp.n_vocab;
    float *la = prefill_all(&a, ids.data, n, NULL), *lb = prefill_all(&b, ids.data, n, NULL);
    /* three equal positions turn each frequency once, by the same angle: the same floats */
    assert_memory_equal(la, lb, (size_t)n * V * sizeof *la);
    /* 3-D positions do turn it differently (rows 2..7 as a 2 x 3 image) */
    int32_t *p3 = malloc((size_t)n * 3 * sizeof *p3), *im = malloc((size_t)n * sizeof *im), delta;
    struct err e = {0};
    assert_true(p3 && im && n > 9);
    for (int i = 0; i < n; i++)
        im[i] = i >= 2 && i < 8 ? -7 : 1;
    const int32_t grid[] = {2, 3};
    assert_int_equal(vision_mrope_positions(p3, &delta, im, n, -7, grid, 1, &e), 0);
    float *lc = prefill_all(&b, ids.data, n, p3);
    assert_memory_equal(la, lc, (size_t)3 * V * sizeof *la);   /* rows before the image: as before */
    assert_true(test_row_rel_err(lc + (size_t)(n - 1) * V, la + (size_t)(n - 1) * V, V) > 1e-4);
    printf("qwen_vl text: qwen2_vl_text equals qwen2 bit for bit on %d rows; 3-D positions move the last "
           "row by %.2e\n", n, test_row_rel_err(lc + (size_t)(n - 1) * V, la + (size_t)(n - 1) * V, V));
    free(la);
    free(lb);
    free(lc);
    free(p3);
    free(im);
    test_eng_close(&b);
    test_eng_close(&a);
    st_set_free(gs);
    rm_mrope_model(dir);
}

/* Qwen3-VL's text model is Qwen3 with interleaved M-RoPE: the qwen3 golden relabelled
 * qwen3_vl_text (head_dim 32: mrope_section [6, 5, 5], Qwen3-VL's [24, 20, 20] / 4) gives a text
 * prompt qwen3's logits bit for bit, and its reference logits; 3-D positions move them. */
static void mrope_qwen3_text_equals_qwen3(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-q3vl-XXXXXX";
    static const int sec[3] = {6, 5, 5};
    struct st_set *gs = NULL;
    struct tensor ids;
    struct test_eng a, b;
    struct err e = {0};
    make_mrope_case(dir, "qwen3", "qwen3_vl_text", sec);
    golden_case_input_ids("qwen3", &gs, &ids);
    int n = (int)ids.shape[0];
    test_eng_open(&a, golden_case_dir("qwen3"), NULL, 0, 256, 2, 16);
    test_eng_open(&b, dir, a.be, 0, 256, 2, 16);
    assert_true(hparams_has_mrope(&b.m->hp) && b.m->hp.mrope_interleaved && b.m->hp.qk_norm);
    int V = a.m->hp.n_vocab;
    float *la = prefill_all(&a, ids.data, n, NULL), *lb = prefill_all(&b, ids.data, n, NULL);
    assert_memory_equal(la, lb, (size_t)n * V * sizeof *la);
    int32_t *p3 = malloc((size_t)n * 3 * sizeof *p3), *im = malloc((size_t)n * sizeof *im), delta;
    assert_true(p3 && im && n > 9);
    for (int i = 0; i < n; i++)
        im[i] = i >= 2 && i < 8 ? -7 : 1;
    const int32_t grid[] = {2, 3};
    assert_int_equal(vision_mrope_positions(p3, &delta, im, n, -7, grid, 1, &e), 0);
    float *lc = prefill_all(&b, ids.data, n, p3);
    double moved = test_row_rel_err(lc + (size_t)(n - 1) * V, la + (size_t)(n - 1) * V, V);
    assert_memory_equal(la, lc, (size_t)3 * V * sizeof *la);
    assert_true(moved > 1e-4);
    printf("qwen_vl text: qwen3_vl_text equals qwen3 bit for bit on %d rows; 3-D positions move the last row by "
           "%.2e\n", n, moved);
    free(la);
    free(lb);
    free(lc);
    free(p3);
    free(im);
    test_eng_close(&b);
    test_eng_close(&a);
    st_set_free(gs);
    rm_mrope_model(dir);
}

// ---- batched and chunked prefill ----

#define QVL_L 30
#define QVL_DEC 4
#define QVL_IMG_AT 6
#define QVL_GH 3
#define QVL_GW 4

/* The image-shaped prompt: ids (the image's rows hold id 5), its 3-D positions and delta. */
static void image_prompt(int32_t *ids, int32_t *p3, int32_t *delta, int V)
{
    struct err e = {0};
    int32_t mark[QVL_L];
    for (int i = 0; i < QVL_L; i++) {
        bool img = i >= QVL_IMG_AT && i < QVL_IMG_AT + QVL_GH * QVL_GW;
        ids[i] = img ? 5 : (int32_t)((i * 37 + 11) % V);
        mark[i] = img ? -1 : 0;
    }
    const int32_t grid[] = {QVL_GH, QVL_GW};
    assert_int_equal(vision_mrope_positions(p3, delta, mark, QVL_L, -1, grid, 1, &e), 0);
}

/* Prefill of the prompt as seq 0 (with text_seq: a text sequence 1 of the same ids
 * interleaved row by row, plain positions) then QVL_DEC greedy steps of both; the logits of
 * seq 0's last prompt row and its steps into out [(1 + QVL_DEC), V], seq 1's into out1. */
static void run_prompt(struct test_eng *g, bool text_seq, float *out, float *out1)
{
    struct err e = {0};
    int V = g->m->hp.n_vocab;
    int32_t ids[QVL_L], p3[QVL_L * 3], delta;
    image_prompt(ids, p3, &delta, V);
    float *l = malloc((size_t)2 * QVL_L * V * sizeof *l);
    assert_non_null(l);
    for (int s = 0; s < 2; s++) {
        kv_seq_remove(g->kv, s);
        assert_int_equal(kv_seq_add(g->kv, s, &e), 0);
    }
    batch_clear(g->b);
    for (int i = 0; i < QVL_L; i++) {
        assert_int_equal(batch_add(g->b, ids[i], i, 0, i == QVL_L - 1, &e), 0);
        assert_int_equal(batch_rope_set(g->b, g->b->n_tok - 1, 1, p3 + 3 * i, 0, &e), 0);
        if (text_seq)
            assert_int_equal(batch_add(g->b, ids[QVL_L - 1 - i], i, 1, i == QVL_L - 1, &e), 0);
    }
    if (model_forward(g->c, g->b, g->kv, l, &e) < 0)
        fail_msg("%s", e.msg);
    memcpy(out, l, (size_t)V * sizeof *l);
    if (text_seq)
        memcpy(out1, l + V, (size_t)V * sizeof *l);
    for (int t = 0; t < QVL_DEC; t++) {
        batch_clear(g->b);
        int next = test_argmax(out + (size_t)t * V, V);
        assert_int_equal(batch_add(g->b, next, QVL_L + t, 0, true, &e), 0);
        /* decode rows continue from max position + 1: pos + delta */
        assert_int_equal(batch_rope_set(g->b, 0, 1, NULL, delta, &e), 0);
        if (text_seq)
            assert_int_equal(batch_add(g->b, test_argmax(out1 + (size_t)t * V, V), QVL_L + t, 1, true, &e), 0);
        if (model_forward(g->c, g->b, g->kv, l, &e) < 0)
            fail_msg("%s", e.msg);
        memcpy(out + (size_t)(t + 1) * V, l, (size_t)V * sizeof *l);
        if (text_seq)
            memcpy(out1 + (size_t)(t + 1) * V, l + V, (size_t)V * sizeof *l);
    }
    free(l);
}

static void mrope_batched_chunked(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-qvl-XXXXXX";
    make_mrope_model(dir);
    struct test_eng one, chunked;
    test_eng_open(&one, dir, NULL, 0, 512, 2, 16);
    test_eng_open(&chunked, dir, one.be, 8, 512, 2, 16);
    int V = one.m->hp.n_vocab, R = 1 + QVL_DEC;
    float *a = malloc((size_t)R * V * sizeof *a), *b = malloc((size_t)R * V * sizeof *b);
    float *c = malloc((size_t)R * V * sizeof *c), *t1 = malloc((size_t)R * V * sizeof *t1);
    float *t0 = malloc((size_t)R * V * sizeof *t0);
    assert_true(a && b && c && t0 && t1);
    run_prompt(&one, false, a, NULL);
    run_prompt(&chunked, false, b, NULL);
    run_prompt(&one, true, c, t1);
    double tol = backend_is_cpu(one.be) ? 1e-5 : 5e-4, worst = 0;
    for (int r = 0; r < R; r++) {
        double db = test_row_rel_err(b + (size_t)r * V, a + (size_t)r * V, V);
        double dc = test_row_rel_err(c + (size_t)r * V, a + (size_t)r * V, V);
        worst = fmax(worst, fmax(db, dc));
        if (db > tol || dc > tol)
            fail_msg("row %d: chunked %.3g, batched %.3g from one-shot (> %.0e)", r, db, dc, tol);
    }
    /* the text sequence of the same batches equals itself alone (plain positions) */
    int32_t ids[QVL_L], p3[QVL_L * 3], delta;
    image_prompt(ids, p3, &delta, V);
    int32_t rev[QVL_L];
    for (int i = 0; i < QVL_L; i++)
        rev[i] = ids[QVL_L - 1 - i];
    float *alone = prefill_all(&one, rev, QVL_L, NULL);
    double dt = test_row_rel_err(t1, alone + (size_t)(QVL_L - 1) * V, V);
    assert_true(dt <= tol);
    printf("qwen_vl batched: chunks of 8 and a text neighbour within %.2e of one-shot (%d rows, %d steps)\n",
           fmax(worst, dt), QVL_L, QVL_DEC);
    free(alone);
    free(a);
    free(b);
    free(c);
    free(t0);
    free(t1);
    test_eng_close(&chunked);
    test_eng_close(&one);
    rm_mrope_model(dir);
}


// ---- the golden cases ----

#define QVL_REL_TOL 1e-3
#define QVL_FEAT_TOL 1e-4

#define QVL_MAX_DEEP 8

struct qgold {
    struct st_set *st;
    struct tensor ids, pos, px, grid, feat, hid, prefill, greedy, decode, tids;
    struct tensor deep[QVL_MAX_DEEP]; /* Qwen3-VL: deepstack_K [T, D], the planes after the rows */
    float *tlast;               /* golden.json's text_last_logits [V], or NULL */
    bool has_hid;
    int L, N, n_img, Lt, n_deep;
};

static void qgold_open(struct qgold *g, const char *dir)
{
    char path[700];
    struct err e = {0};
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_set_open_file(&g->st, path, &e) < 0)
        fail_msg("%s", e.msg);
    const char *names[] = {"input_ids", "position_ids", "pixel_values", "image_grid_thw", "image_features",
                           "prefill_logits", "greedy_ids", "decode_logits", "text_ids"};
    struct tensor *ts[] = {&g->ids, &g->pos, &g->px, &g->grid, &g->feat, &g->prefill, &g->greedy, &g->decode,
                           &g->tids};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        if (st_set_take(g->st, names[i], ts[i], &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
    g->has_hid = st_set_find(g->st, "vision_hidden") != NULL;
    if (g->has_hid && st_set_take(g->st, "vision_hidden", &g->hid, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
    for (char nm[32]; g->n_deep < QVL_MAX_DEEP; g->n_deep++) {
        snprintf(nm, sizeof nm, "deepstack_%d", g->n_deep);
        if (!st_set_find(g->st, nm))
            break;
        if (st_set_take(g->st, nm, &g->deep[g->n_deep], &e) < 0)
            fail_msg("%s: %s", dir, e.msg);
    }
    g->L = (int)g->ids.shape[0];
    g->N = (int)g->greedy.shape[0];
    g->n_img = (int)g->grid.shape[0];
    g->Lt = (int)g->tids.shape[0];
    /* transformers' last-row logits of the text prompt alone */
    char *txt = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (file_read_all(path, 1 << 22, &txt, &len, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON *j = cJSON_Parse(txt), *tl = j ? cJSON_GetObjectItemCaseSensitive(j, "text_last_logits") : NULL;
    free(txt);
    int V = (int)g->prefill.shape[1];
    if (cJSON_IsArray(tl) && cJSON_GetArraySize(tl) == V) {
        g->tlast = malloc((size_t)V * sizeof *g->tlast);
        assert_non_null(g->tlast);
        for (int i = 0; i < V; i++)
            g->tlast[i] = (float)cJSON_GetArrayItem(tl, i)->valuedouble;
    }
    cJSON_Delete(j);
}

static void qgold_close(struct qgold *g)
{
    free(g->tlast);
    st_set_free(g->st);
}

/* The merged grids [n_img][2] of the golden's images. */
static void merged_grids(const struct qgold *g, int merge, int32_t *out)
{
    const int32_t *thw = g->grid.data;
    for (int k = 0; k < g->n_img; k++) {
        out[2 * k] = thw[3 * k + 1] / merge;
        out[2 * k + 1] = thw[3 * k + 2] / merge;
    }
}

/* Every image through the tower into backend memory (the caller frees it): image k's
 * vision_image_floats after the ones before it, its rows [n_k, n_embd] then (Qwen3-VL) its
 * deepstack planes; checked against vision_hidden, image_features and deepstack_K. */
static float *qencode_checked(struct test_eng *r, const struct qgold *g, const char *name)
{
    struct err e = {0};
    struct vision_ctx *vc = NULL;
    const struct vision *v = r->m->vision;
    int D = r->m->hp.n_embd, T = (int)g->feat.shape[0], pd = v->info.patch_dim;
    assert_int_equal(g->px.shape[1], pd);
    assert_int_equal(g->feat.shape[1], D);
    float *embd = NULL;
    int nd = v->info.n_deepstack;
    if (nd != g->n_deep)
        fail_msg("%s: the tower gives %d deepstack planes, the reference %d", name, nd, g->n_deep);
    if (vision_ctx_new(&vc, r->m, r->be, &e) < 0 ||
        r->be->ops->buf_alloc(r->be, vision_image_floats(r->m, T) * sizeof(float), (void **)&embd, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    const int32_t *thw = g->grid.data;
    int tok = 0, patch = 0;
    size_t at = 0;   /* floats: image k's block */
    double wh = 0, wf = 0, wd = 0;
    for (int k = 0; k < g->n_img; k++) {
        int n = vision_grid_tokens(v, thw + 3 * k, &e), P = thw[3 * k] * thw[3 * k + 1] * thw[3 * k + 2];
        if (n < 0 || tok + n > T)
            fail_msg("%s: image %d: %s", name, k + 1, n < 0 ? e.msg : "more rows than image_features");
        if (vision_encode_grid(vc, embd + at, (const float *)g->px.data + (size_t)patch * pd, thw + 3 * k, &e) < 0)
            fail_msg("%s: image %d: %s", name, k + 1, e.msg);
        float *f = malloc((size_t)(1 + nd) * n * D * sizeof *f);
        assert_non_null(f);
        r->be->ops->download(r->be, f, embd + at, (size_t)(1 + nd) * n * D * sizeof *f);
        if (g->has_hid) {
            int dv = (int)g->hid.shape[1];
            float *h = malloc((size_t)P * dv * sizeof *h);
            assert_non_null(h);
            assert_int_equal(vc->n_hidden, P);
            r->be->ops->download(r->be, h, vc->hidden, (size_t)P * dv * sizeof *h);
            assert_int_equal(backend_sync(r->be, &e), 0);
            double eh = test_row_rel_err(h, (const float *)g->hid.data + (size_t)patch * dv, P * dv);
            wh = fmax(wh, eh);
            free(h);
            if (eh > QVL_FEAT_TOL)
                fail_msg("%s: image %d: vision tower relative error %.3g (> %.0e)", name, k + 1, eh, QVL_FEAT_TOL);
        }
        assert_int_equal(backend_sync(r->be, &e), 0);
        double ef = test_row_rel_err(f, (const float *)g->feat.data + (size_t)tok * D, n * D);
        wf = fmax(wf, ef);
        for (int j = 0; j < nd; j++) {
            double ed = test_row_rel_err(f + (size_t)(1 + j) * n * D, (const float *)g->deep[j].data + (size_t)tok * D,
                                         n * D);
            wd = fmax(wd, ed);
            if (ed > QVL_FEAT_TOL)
                fail_msg("%s: image %d: deepstack plane %d relative error %.3g (> %.0e)", name, k + 1, j, ed,
                         QVL_FEAT_TOL);
        }
        free(f);
        if (ef > QVL_FEAT_TOL)
            fail_msg("%s: image %d: merger relative error %.3g (> %.0e)", name, k + 1, ef, QVL_FEAT_TOL);
        tok += n;
        patch += P;
        at += vision_image_floats(r->m, n);
    }
    assert_int_equal(tok, T);
    assert_int_equal(patch, (int)g->px.shape[0]);
    if (nd > 0)
        printf("qwen_vl %-16s tower max rel err %.2e, merger %.2e, %d deepstack planes %.2e\n", name, wh, wf, nd,
               wd);
    else
        printf("qwen_vl %-16s tower max rel err %.2e, merger %.2e\n", name, wh, wf);
    vision_ctx_free(vc);
    return embd;
}

/* The image runs of ids as batch images of seq (embd: the images' blocks in order, as
 * qencode_checked writes them). */
static int image_runs(const struct qgold *g, const struct model *m, int seq, const float *embd,
                      const int32_t *grids, struct batch_image *out)
{
    const int32_t *ids = g->ids.data, img_tok = m->vision->info.image_token_id;
    int n = 0, D = m->hp.n_embd;
    size_t at = 0;
    for (int i = 0; i < g->L;) {
        if (ids[i] != img_tok) {
            i++;
            continue;
        }
        int len = 0;
        while (i + len < g->L && ids[i + len] == img_tok)
            len++;
        assert_true(n < 8);
        out[n] = (struct batch_image){seq, i, len, embd + at, grids[2 * n], grids[2 * n + 1], (size_t)len * D};
        n++;
        at += vision_image_floats(m, len);
        i += len;
    }
    assert_int_equal(n, g->n_img);
    return n;
}

/* Rows of the golden prompt (seq 0) and, with_text, the text prompt (seq 1) around it, into a
 * cleared batch; the image prompt's rows at its M-RoPE positions, all rows wanting logits. */
static void add_prompts(struct test_eng *r, const struct qgold *g, const int32_t *p3, bool with_text)
{
    struct err e = {0};
    batch_clear(r->b);
    const int32_t *ids = g->ids.data, *tids = g->tids.data;
    int half = with_text ? g->Lt / 2 : 0;
    /* the text prompt's first half, the image prompt (an image's rows are consecutive batch
     * rows), the text's second half */
    for (int i = 0; i < half; i++)
        assert_int_equal(batch_add(r->b, tids[i], i, 1, true, &e), 0);
    for (int i = 0; i < g->L; i++) {
        assert_int_equal(batch_add(r->b, ids[i], i, 0, true, &e), 0);
        assert_int_equal(batch_rope_set(r->b, r->b->n_tok - 1, 1, p3 + 3 * i, 0, &e), 0);
    }
    for (int i = half; with_text && i < g->Lt; i++)
        assert_int_equal(batch_add(r->b, tids[i], i, 1, true, &e), 0);
}

/* The text prompt alone as sequence 1: its logits [Lt, V] (malloc'd); the last row against
 * transformers' (golden.json) where the golden has it. */
static float *text_alone(struct test_eng *r, const struct qgold *g)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab;
    float *l = malloc((size_t)g->Lt * V * sizeof *l);
    assert_non_null(l);
    kv_seq_remove(r->kv, 1);
    assert_int_equal(kv_seq_add(r->kv, 1, &e), 0);
    batch_clear(r->b);
    assert_int_equal(batch_add_seq(r->b, g->tids.data, g->Lt, 0, 1, false, &e), 0);
    for (int i = 0; i < g->Lt; i++)
        r->b->logits[i] = true;
    if (model_forward(r->c, r->b, r->kv, l, &e) < 0)
        fail_msg("text alone: %s", e.msg);
    if (g->tlast) {
        double d = test_row_rel_err(l + (size_t)(g->Lt - 1) * V, g->tlast, V);
        if (d > QVL_REL_TOL)
            fail_msg("the text prompt alone: last row relative error %.3g > %.0e", d, QVL_REL_TOL);
    }
    return l;
}

/* Prefill (with_text: beside the text prompt) then greedy decode of seq 0 against the
 * reference; seq 1's prefill against the text prompt run alone. Returns the worst relative
 * error. */
static double prompt_check(struct test_eng *r, const struct qgold *g, const float *embd, const int32_t *p3,
                           const int32_t *grids, int32_t delta, bool with_text, const char *what)
{
    struct err e = {0};
    int V = r->m->hp.n_vocab;
    struct batch_image img[8];
    float *tref = with_text ? text_alone(r, g) : NULL;
    for (int s = 0; s < 2; s++) {
        kv_seq_remove(r->kv, s);
        assert_int_equal(kv_seq_add(r->kv, s, &e), 0);
    }
    add_prompts(r, g, p3, with_text);
    int n_img = image_runs(g, r->m, 0, embd, grids, img);
    r->b->img = img;
    r->b->n_img = n_img;
    float *l = malloc((size_t)r->b->n_tok * V * sizeof *l);
    assert_non_null(l);
    if (model_forward(r->c, r->b, r->kv, l, &e) < 0)
        fail_msg("%s: %s", what, e.msg);
    double worst = 0;
    int i0 = 0, i1 = 0;
    const float *ref = g->prefill.data;
    for (int row = 0; row < r->b->n_tok; row++) {
        bool text = r->b->seq[row] == 1;
        const float *want = text ? tref + (size_t)i1++ * V : ref + (size_t)i0++ * V;
        double d = test_row_rel_err(l + (size_t)row * V, want, V);
        worst = fmax(worst, d);
        if (d > QVL_REL_TOL)
            fail_msg("%s: prefill %s row %d: relative error %.3g > %.0e", what, text ? "text" : "image prompt",
                     text ? i1 - 1 : i0 - 1, d, QVL_REL_TOL);
    }
    /* greedy decoding of seq 0 from max position + 1 */
    const int32_t *greedy = g->greedy.data;
    const float *dref = g->decode.data;
    int next = test_argmax(ref + (size_t)(g->L - 1) * V, V);
    for (int s = 0; s < g->N; s++) {
        if (next != greedy[s])
            fail_msg("%s: greedy step %d: got id %d, reference %d", what, s, next, greedy[s]);
        batch_clear(r->b);
        assert_int_equal(batch_add(r->b, greedy[s], g->L + s, 0, true, &e), 0);
        assert_int_equal(batch_rope_set(r->b, 0, 1, NULL, delta, &e), 0);
        if (model_forward(r->c, r->b, r->kv, l, &e) < 0)
            fail_msg("%s: %s", what, e.msg);
        double d = test_row_rel_err(l, dref + (size_t)s * V, V);
        worst = fmax(worst, d);
        if (d > QVL_REL_TOL)
            fail_msg("%s: decode step %d: relative error %.3g > %.0e", what, s, d, QVL_REL_TOL);
        next = test_argmax(l, V);
    }
    free(l);
    free(tref);
    return worst;
}

/* The golden case in golden_dir run from the checkpoint in dir: positions, tower, prompt and
 * decode, text; with full also batched beside the text prompt and in chunks. */
/* DeepStack (ADR 0120): images without their planes are refused, and with planes of zeros (the
 * features not added) the prompt's last row leaves the reference: the planes are what the
 * check holds. */
static void deepstack_needed(struct test_eng *r, const struct qgold *g, const float *embd, const int32_t *p3,
                             const int32_t *grids, const char *name)
{
    struct err e = {0};
    struct batch_image img[8];
    int V = r->m->hp.n_vocab, D = r->m->hp.n_embd, T = (int)g->feat.shape[0];
    size_t all = vision_image_floats(r->m, T);
    float *l = malloc((size_t)g->L * V * sizeof *l), *host = malloc(all * sizeof *host), *zeroed = NULL;
    assert_true(l && host);
    kv_seq_remove(r->kv, 0);
    assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
    add_prompts(r, g, p3, false);
    int n_img = image_runs(g, r->m, 0, embd, grids, img);
    for (int k = 0; k < n_img; k++)
        img[k].deep_ld = 0;
    r->b->img = img;
    r->b->n_img = n_img;
    assert_int_equal(model_forward(r->c, r->b, r->kv, l, &e), -ERR_ARG);
    if (!strstr(e.msg, "deepstack"))
        fail_msg("%s: images without deepstack planes: '%s'", name, e.msg);
    /* the planes zeroed, the rows kept */
    r->be->ops->download(r->be, host, embd, all * sizeof *host);
    assert_int_equal(backend_sync(r->be, &e), 0);
    size_t at = 0;
    for (int k = 0; k < n_img; k++) {
        memset(host + at + (size_t)img[k].n_tok * D, 0, (vision_image_floats(r->m, img[k].n_tok) -
                                                       (size_t)img[k].n_tok * D) * sizeof *host);
        at += vision_image_floats(r->m, img[k].n_tok);
    }
    if (r->be->ops->buf_alloc(r->be, all * sizeof *host, (void **)&zeroed, &e) < 0)
        fail_msg("%s", e.msg);
    r->be->ops->upload(r->be, zeroed, host, all * sizeof *host);
    kv_seq_remove(r->kv, 0);
    assert_int_equal(kv_seq_add(r->kv, 0, &e), 0);
    add_prompts(r, g, p3, false);
    n_img = image_runs(g, r->m, 0, zeroed, grids, img);
    r->b->img = img;
    r->b->n_img = n_img;
    if (model_forward(r->c, r->b, r->kv, l, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    double d = test_row_rel_err(l + (size_t)(g->L - 1) * V, (const float *)g->prefill.data + (size_t)(g->L - 1) * V, V);
    printf("qwen_vl %-16s deepstack planes zeroed: last row %.2e from the reference (refused without them)\n", name,
           d);
    if (d <= QVL_REL_TOL)
        fail_msg("%s: the deepstack planes change nothing the check sees (%.3g)", name, d);
    r->be->ops->buf_free(r->be, zeroed);
    free(host);
    free(l);
}

static void run_golden(const char *dir, const char *golden_dir, const char *name, bool full)
{
    struct err e = {0};
    struct qgold g;
    struct test_eng r, rc;
    qgold_open(&g, golden_dir);
    test_eng_open(&r, dir, NULL, 0, 4 * (g.L + g.N) + 64, 2, 4);
    if (!r.m->vision)
        fail_msg("%s: the vision tower did not load", name);
    const struct vision_info *vi = &r.m->vision->info;
    assert_true(vi->merge > 0 && hparams_has_mrope(&r.m->hp));
    /* positions: as transformers' get_rope_index */
    int32_t grids[16], delta;
    assert_true(g.n_img <= 8);
    merged_grids(&g, vi->merge, grids);
    int32_t *p3 = malloc((size_t)g.L * 3 * sizeof *p3);
    assert_non_null(p3);
    if (vision_mrope_positions(p3, &delta, g.ids.data, g.L, vi->image_token_id, grids, g.n_img, &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    const int32_t *want = g.pos.data;
    for (int i = 0; i < g.L; i++)
        for (int s = 0; s < 3; s++)
            if (p3[3 * i + s] != want[(size_t)s * g.L + i])
                fail_msg("%s: row %d stream %d: position %d, transformers %d", name, i, s, p3[3 * i + s],
                         want[(size_t)s * g.L + i]);
    float *embd = qencode_checked(&r, &g, name);
    if (vi->n_deepstack > 0 && full)
        deepstack_needed(&r, &g, embd, p3, grids, name);
    double wp = prompt_check(&r, &g, embd, p3, grids, delta, false, name);
    if (!full) {
        printf("qwen_vl %-16s prefill %d + decode %d: max rel err %.2e\n", name, g.L, g.N, wp);
        r.be->ops->buf_free(r.be, embd);
        free(p3);
        test_eng_close(&r);
        qgold_close(&g);
        return;
    }
    double wb = prompt_check(&r, &g, embd, p3, grids, delta, true, "batched with text");
    /* chunks of 7 rows: images (causal in the text model) are cut between chunks */
    int chunk = 7;
    test_eng_open(&rc, dir, r.be, chunk, 4 * (g.L + g.N) + 64, 2, 4);
    float *embd_c = qencode_checked(&rc, &g, "chunked");
    double wc = prompt_check(&rc, &g, embd_c, p3, grids, delta, true, "chunked");
    printf("qwen_vl %-16s prefill %d (%d image%s) + decode %d: max rel err %.2e, batched %.2e, chunks of %d "
           "%.2e\n", name, g.L, g.n_img, g.n_img == 1 ? "" : "s", g.N, wp, wb, chunk, wc);
    rc.be->ops->buf_free(rc.be, embd_c);
    test_eng_close(&rc);
    r.be->ops->buf_free(r.be, embd);
    free(p3);
    test_eng_close(&r);
    qgold_close(&g);
}

/* The case's images (golden.json "images") decoded and through its preprocessor_config.json
 * equal the processor's pixel_values and grids (the torchvision backend's float math: 1e-5). */
static void pixels_check(const char *dir, const char *name)
{
    struct err e = {0};
    struct qgold g;
    struct image_proc_config cfg;
    char path[700], *txt = NULL;
    size_t len = 0;
    qgold_open(&g, dir);
    if (image_proc_config_load(&cfg, dir, "qwen2_vl", &e) < 0)
        fail_msg("%s: %s", name, e.msg);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
    cJSON *j = cJSON_Parse(txt), *ims = j ? cJSON_GetObjectItemCaseSensitive(j, "images") : NULL;
    free(txt);
    assert_true(cJSON_IsArray(ims) && cJSON_GetArraySize(ims) == g.n_img);
    const int32_t *thw = g.grid.data;
    size_t at = 0, pd = (size_t)g.px.shape[1];
    double worst = 0;
    for (int k = 0; k < g.n_img; k++) {
        struct image im = {0};
        struct image_pixels px = {0};
        snprintf(path, sizeof path, "%s", test_path("tests/fixtures/images"));
        size_t l = strlen(path);
        snprintf(path + l, sizeof path - l, "/%s", cJSON_GetArrayItem(ims, k)->valuestring);
        if (image_load(&im, path, NULL, &e) < 0 || image_preprocess(&px, &cfg, &im, &e) < 0)
            fail_msg("%s: %s: %s", name, path, e.msg);
        assert_int_equal(px.grid_t, thw[3 * k]);
        assert_int_equal(px.grid_h, thw[3 * k + 1]);
        assert_int_equal(px.grid_w, thw[3 * k + 2]);
        assert_int_equal(px.patch_dim, pd);
        const float *want = (const float *)g.px.data + at * pd;
        for (size_t i = 0; i < px.n_values; i++)
            worst = fmax(worst, fabs((double)px.pixel_values[i] - want[i]));
        at += px.n_patches;
        image_pixels_free(&px);
        image_free(&im);
    }
    assert_int_equal(at, g.px.shape[0]);
    printf("qwen_vl %-16s pixel_values of %d image%s: max abs diff %.2e\n", name, g.n_img, g.n_img == 1 ? "" : "s",
           worst);
    if (worst > 1e-5)
        fail_msg("%s: pixel_values differ from the processor's by %.3g", name, worst);
    cJSON_Delete(j);
    qgold_close(&g);
}

static void check_case(void **state)
{
    const char *name = *state;
    pixels_check(golden_case_dir(name), name);
    run_golden(golden_case_dir(name), golden_case_dir(name), name, true);
}

// ---- mlx-vlm's layout ----

/* Case name's checkpoint as mlx-vlm's convert writes a published Qwen2-VL one, at dst: a flat
 * config.json (the text config's keys at the top beside vision_config, model_type the
 * wrapper's), tensors renamed by its sanitize (visual -> vision_tower, model ->
 * language_model.model, lm_head -> language_model.lm_head), the Conv3d weight channels-last
 * [out, t, p, p, C]. */
static void write_mlx_vlm(const char *name, const char *dst)
{
    struct err e = {0};
    const char *src = golden_case_dir(name);
    char path[700], *txt = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", src);
    assert_int_equal(file_read_all(path, 1 << 22, &txt, &len, &e), 0);
    cJSON *cfg = cJSON_Parse(txt), *it;
    free(txt);
    assert_non_null(cfg);
    cJSON *tc = cJSON_DetachItemFromObject(cfg, "text_config");
    assert_non_null(tc);
    cJSON_ArrayForEach(it, tc)
        if (strcmp(it->string, "model_type") && !cJSON_GetObjectItemCaseSensitive(cfg, it->string))
            cJSON_AddItemToObject(cfg, it->string, cJSON_Duplicate(it, true));
    cJSON_Delete(tc);
    char *out = cJSON_Print(cfg);
    assert_int_equal(stb_write_text(stb_path(dst, "config.json"), out), 0);
    free(out);
    cJSON_Delete(cfg);
    static const char *const extra[] = {"preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", src, extra[i]);
        if (file_read_all(path, 1 << 24, &txt, &len, &e) == 0) {
            assert_int_equal(stb_write_text(stb_path(dst, extra[i]), txt), 0);
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
        {"model.language_model.", "language_model.model."}, {"model.visual.", "vision_tower."},
        {"lm_head.", "language_model.lm_head."}, {"visual.", "vision_tower."}, {"model.", "language_model.model."},
    };
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        struct tensor tv = {0};
        /* the five-dim Conv3d weight from the stored entry (struct tensor holds four dims) */
        tv.data = (void *)(uintptr_t)t->data;
        tv.dtype = t->dtype;
        tv.ndim = t->ndim;
        memcpy(tv.shape, t->shape, sizeof tv.shape);
        int64_t nelem = 1;
        for (int d = 0; d < t->ndim; d++)
            nelem *= t->shape[d];
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
        size_t bytes = (size_t)nelem * es;
        char *d = malloc(bytes);
        assert_non_null(d);
        if (strstr(rest, "patch_embed.proj.weight")) { /* [O, C, T, p, p] -> [O, T, p, p, C] */
            int64_t O = tv.shape[0], C = tv.shape[1], T = tv.shape[2], p = tv.shape[3];
            for (int64_t o = 0; o < O; o++)
                for (int64_t c = 0; c < C; c++)
                    for (int64_t tt = 0; tt < T; tt++)
                        for (int64_t y = 0; y < p; y++)
                            for (int64_t x = 0; x < p; x++)
                                memcpy(d + ((((o * T + tt) * p + y) * p + x) * C + c) * es,
                                       (const char *)tv.data + ((((o * C + c) * T + tt) * p + y) * p + x) * es, es);
            ents[i] = (struct st_wentry){names[i], tv.dtype, 5, {O, T, p, p, C}};
        } else {
            memcpy(d, tv.data, bytes);
            ents[i] = (struct st_wentry){names[i], t->dtype, t->ndim, {0}};
            memcpy(ents[i].shape, t->shape, sizeof t->shape);
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
                                        "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(stb_path(dir, files[i]));
    rmdir(dir);
}

/* One case of each family in mlx-vlm's layout (flat config, its names, the channels-last
 * Conv3d) meets the reference as the transformers checkpoint does, every tensor used. */
static void mlx_vlm_layout(void **state)
{
    (void)state;
    const struct golden_cases *gc = golden_image_cases();
    static const char *const fams[] = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"};
    int done = 0;
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        const char *name = NULL;
        for (size_t i = 0; i < gc->n && !name; i++)
            if (!strcmp(gc->names[i], fams[f]))
                name = gc->names[i];
        if (!name)
            continue;
        char dir[] = "/tmp/mlxcel-qvlm-XXXXXX";
        struct err e = {0};
        struct model *m = NULL;
        assert_non_null(mkdtemp(dir));
        write_mlx_vlm(name, dir);
        if (model_load(&m, dir, &e) < 0)
            fail_msg("%s in mlx-vlm's layout: %s", name, e.msg);
        assert_non_null(m->vision);
        assert_string_equal(m->multimodal, fams[f]);
        assert_int_equal(st_set_n_unused(m->st), 0);
        model_free(m);
        char label[64];
        snprintf(label, sizeof label, "%s mlx-vlm", name);
        run_golden(dir, golden_case_dir(name), label, false);
        rm_ckpt(dir);
        done++;
    }
    if (done == 0)
        fail_msg("no qwen2_vl / qwen2_5_vl golden case");
}

/* Each patch of the case's config.json ({object ("" the top), key, JSON value, what the error
 * says}) on its weights must fail to load, the error naming it. */
static void refuse_patches(const char *case_name, const char *const (*patches)[4], size_t n)
{
    const char *src = golden_case_dir(case_name);
    for (size_t i = 0; i < n; i++) {
        char dir[] = "/tmp/mlxcel-qbad-XXXXXX", path[700], *txt = NULL;
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
        printf("qwen_vl bad config %s.%s: %s\n", patches[i][0], patches[i][1], e.msg);
        if (!strstr(e.msg, patches[i][3]))
            fail_msg("%s.%s = %s: '%s' does not say '%s'", patches[i][0], patches[i][1], patches[i][2], e.msg,
                     patches[i][3]);
        rm_ckpt(dir);
    }
}

/* Configs the Qwen towers must refuse, on the qwen2_5_vl golden's weights: each patch sets one
 * key of vision_config (or of the top) and names what the error says. */
static void bad_configs(void **state)
{
    (void)state;
    static const char *const patches[][4] = {
        /* object, key, value, the error says */
        {"vision_config", "window_size", "12", "window_size 12"},
        {"vision_config", "fullatt_block_indexes", "[1, 9]", "fullatt_block_indexes"},
        {"vision_config", "out_hidden_size", "48", "the text model is"},
        {"vision_config", "hidden_act", "\"swiglu\"", "swiglu"},
        {"vision_config", "num_heads", "3", "3 heads"},
        {"vision_config", "depth", "5", "blocks.4"},
        {"", "image_token_id", "100000", "image_token_id 100000"},
        {"text_config", "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}",
         "mrope_section"},
    };
    refuse_patches("qwen2_5_vl", patches, sizeof patches / sizeof patches[0]);
}

/* Qwen3-VL's own keys, on the qwen3_vl golden's weights. */
static void bad_configs_qwen3(void **state)
{
    (void)state;
    static const char *const patches[][4] = {
        {"vision_config", "deepstack_visual_indexes", "[0, 3]", "deepstack_visual_indexes[1] = 3"},
        {"vision_config", "deepstack_visual_indexes", "[2, 2]", "names block 2 twice"},
        {"vision_config", "deepstack_visual_indexes", "[0, 1, 2, 0.5]", "each an integer"},
        {"vision_config", "num_position_embeddings", "15", "num_position_embeddings 15"},
        {"vision_config", "num_position_embeddings", "25", "pos_embed.weight: shape"},
        {"vision_config", "hidden_act", "\"relu2\"", "relu2"},
        {"vision_config", "out_hidden_size", "48", "the text model is"},
        {"text_config", "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}",
         "mrope_section"},
    };
    refuse_patches("qwen3_vl", patches, sizeof patches / sizeof patches[0]);
}

static const struct CMUnitTest k_fixed[] = {
    cmocka_unit_test(mrope_positions_rule),
    cmocka_unit_test(mrope_text_equals_rope),
    cmocka_unit_test(mrope_qwen3_text_equals_qwen3),
    cmocka_unit_test(mrope_batched_chunked),
};
#define N_FIXED (sizeof k_fixed / sizeof k_fixed[0])

static void build_tests(const struct CMUnitTest **tests, size_t *n_tests)
{
    static struct CMUnitTest *t; /* built once, for the life of the process */
    static size_t n;
    if (!t) {
        const struct golden_cases *gc = golden_image_cases();
        t = calloc(gc->n + N_FIXED + 3, sizeof *t);
        if (!t) {
            *tests = NULL;
            *n_tests = 0;
            return;
        }
        memcpy(t, k_fixed, sizeof k_fixed);
        n = N_FIXED;
        bool any = false, q3 = false;
        for (size_t i = 0; i < gc->n; i++) {
            if (strncmp(gc->names[i], "qwen", 4) != 0)
                continue;
            q3 = q3 || !strcmp(gc->names[i], "qwen3_vl");
            size_t len = strlen(gc->names[i]) + 9;
            char *nm = malloc(len);
            snprintf(nm, len, "qwen_vl_%s", gc->names[i]);
            t[n++] = (struct CMUnitTest){.name = nm, .test_func = check_case, .initial_state = gc->names[i]};
            any = true;
        }
        if (any) {
            t[n++] = (struct CMUnitTest){.name = "qwen_vl_mlx_vlm_layout", .test_func = mlx_vlm_layout};
            t[n++] = (struct CMUnitTest){.name = "qwen_vl_bad_configs", .test_func = bad_configs};
        }
        if (q3)
            t[n++] = (struct CMUnitTest){.name = "qwen_vl_bad_configs_qwen3", .test_func = bad_configs_qwen3};
    }
    *tests = t;
    *n_tests = n;
}

TEST_SUITE_BUILT(qwen_vl, build_tests);
