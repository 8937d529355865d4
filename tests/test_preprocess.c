/*
 * preprocess: pixel_values equal transformers 5.17's (tests/fixtures/golden/vision_proc, made by
 * tests/fixtures/gen/gen_vision_proc.py on the GPU machine: per processor config and image, the
 * torchvision and PIL backends' float32 output and grid / crop data), the image token counts
 * and prompt expansion follow the processors, and hostile configs and sizes give clear errors
 * without allocating what they ask for.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/sha256.h"
#include "image/preprocess.h"
#include "test.h"

#define REF_DIR "tests/fixtures/golden/vision_proc"

static cJSON *load_json(const char *path)
{
    char *txt = NULL;
    size_t n = 0;
    struct err e = {0};
    if (file_read_all(path, 1 << 22, &txt, &n, &e) < 0)
        fail_msg("%s", e.msg);
    cJSON *j = cJSON_ParseWithLength(txt, n);
    free(txt);
    if (!j)
        fail_msg("%s is not JSON", path);
    return j;
}

static void hex_sha(const struct image *im, char hex[65])
{
    struct sha256 s;
    sha256_init(&s);
    sha256_update(&s, im->rgb, (size_t)im->w * im->h * 3);
    sha256_final_hex(&s, hex);
}

/* Compare one reference; returns the max abs difference, counts values not bit-equal. */
static double compare_one(const char *case_dir, const cJSON *ref, const struct image_pixels *px,
                          const char *what, size_t *n_diff)
{
    const cJSON *shape = cJSON_GetObjectItem(ref, "shape");
    const cJSON *file = cJSON_GetObjectItem(ref, "file");
    assert_true(cJSON_IsArray(shape) && cJSON_IsString(file));
    assert_string_equal(cJSON_GetObjectItem(ref, "dtype")->valuestring, "float32");
    size_t n = 1;
    for (int i = 0; i < cJSON_GetArraySize(shape); i++)
        n *= (size_t)cJSON_GetArrayItem(shape, i)->valuedouble;
    if (n != px->n_values)
        fail_msg("%s: %zu values, transformers has %zu", what, px->n_values, n);
    int nd = cJSON_GetArraySize(shape);
    if (px->patch_dim) {
        assert_int_equal(nd, 2);
        assert_int_equal((int)cJSON_GetArrayItem(shape, 0)->valuedouble, px->n_patches);
        const cJSON *g = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "image_grid_thw"), 0);
        assert_non_null(g);
        assert_int_equal((int)cJSON_GetArrayItem(g, 0)->valuedouble, px->grid_t);
        assert_int_equal((int)cJSON_GetArrayItem(g, 1)->valuedouble, px->grid_h);
        assert_int_equal((int)cJSON_GetArrayItem(g, 2)->valuedouble, px->grid_w);
    } else {
        /* [n_images, 3, H, W], Idefics3's with a batch dimension in front */
        int o = nd == 5 ? 1 : 0;
        assert_int_equal(nd, 4 + o);
        assert_int_equal((int)cJSON_GetArrayItem(shape, o)->valuedouble, px->n_images);
        assert_int_equal((int)cJSON_GetArrayItem(shape, o + 2)->valuedouble, px->height);
        assert_int_equal((int)cJSON_GetArrayItem(shape, o + 3)->valuedouble, px->width);
        const cJSON *rows = cJSON_GetObjectItem(ref, "rows"), *cols = cJSON_GetObjectItem(ref, "cols");
        while (cJSON_IsArray(rows))
            rows = cJSON_GetArrayItem(rows, 0);
        while (cJSON_IsArray(cols))
            cols = cJSON_GetArrayItem(cols, 0);
        if (rows && cols) {
            assert_int_equal((int)rows->valuedouble, px->rows);
            assert_int_equal((int)cols->valuedouble, px->cols);
        }
        const cJSON *nc = cJSON_GetObjectItem(ref, "num_crops");
        if (nc) {
            const cJSON *v = cJSON_IsArray(nc) ? cJSON_GetArrayItem(nc, 0) : nc;
            if (cJSON_IsArray(v))
                v = cJSON_GetArrayItem(v, 0);
            assert_int_equal((int)v->valuedouble, px->num_crops);
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", case_dir, file->valuestring);
    char *raw = NULL;
    size_t len = 0;
    struct err e = {0};
    if (file_read_all(path, (size_t)1 << 28, &raw, &len, &e) < 0)
        fail_msg("%s", e.msg);
    assert_int_equal(len, n * sizeof(float));
    double worst = 0;
    size_t at = 0;
    *n_diff = 0;
    for (size_t i = 0; i < n; i++) {
        float r;
        memcpy(&r, raw + i * 4, 4);
        double d = fabs((double)r - px->pixel_values[i]);
        if (memcmp(&r, &px->pixel_values[i], 4) != 0)
            (*n_diff)++;
        if (d > worst) {
            worst = d;
            at = i;
        }
    }
    if (worst > 1e-5) {
        float r;
        memcpy(&r, raw + at * 4, 4);
        fail_msg("%s: max |diff| %g at value %zu (ours %.9g, transformers %.9g), %zu of %zu differ", what, worst,
                 at, px->pixel_values[at], r, *n_diff, n);
    }
    free(raw);
    return worst;
}

static void test_references(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/index.json", test_path(REF_DIR));
    cJSON *top = load_json(path);
    const cJSON *cases = cJSON_GetObjectItem(top, "cases"), *images = cJSON_GetObjectItem(top, "images");
    int n_checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        char cdir[1024];
        snprintf(cdir, sizeof cdir, "%s/%s", test_path(REF_DIR), c->string);
        struct image_proc_config cfg;
        struct err e = {0};
        if (image_proc_config_load(&cfg, cdir, NULL, &e) < 0)
            fail_msg("%s: %s", c->string, e.msg);
        const cJSON *im_ref;
        cJSON_ArrayForEach(im_ref, cJSON_GetObjectItem(c, "images")) {
            char ipath[512];
            snprintf(ipath, sizeof ipath, "tests/fixtures/images/%s", im_ref->string);
            struct image im = {0};
            if (image_load(&im, test_path(ipath), NULL, &e) < 0)
                fail_msg("%s: %s", im_ref->string, e.msg);
            char hex[65];
            hex_sha(&im, hex);
            const cJSON *want = cJSON_GetObjectItem(cJSON_GetObjectItem(images, im_ref->string), "sha256");
            if (!cJSON_IsString(want) || strcmp(hex, want->valuestring) != 0)
                fail_msg("%s: our RGB bytes differ from the generator's PIL (decoder, not processor)", im_ref->string);
            static const char *backends[2] = {"torchvision", "pil"};
            for (int b = 0; b < 2; b++) {
                const cJSON *ref = cJSON_GetObjectItem(im_ref, backends[b]);
                if (!ref)
                    continue;
                cfg.backend = b ? IMAGE_BACKEND_PIL : IMAGE_BACKEND_TORCHVISION;
                struct image_pixels px;
                char what[256];
                snprintf(what, sizeof what, "%s/%s/%s", c->string, im_ref->string, backends[b]);
                if (cJSON_GetObjectItem(ref, "error")) {
                    /* transformers refuses it (an image that shrinks to nothing): so must we */
                    if (image_preprocess(&px, &cfg, &im, &e) == 0)
                        fail_msg("%s: transformers fails (%s), we do not", what,
                                 cJSON_GetObjectItem(ref, "error")->valuestring);
                    printf("  %-50s refused as by transformers: %s\n", what, e.msg);
                    continue;
                }
                if (image_preprocess(&px, &cfg, &im, &e) < 0)
                    fail_msg("%s: %s", what, e.msg);
                size_t n_diff = 0;
                double worst = compare_one(cdir, ref, &px, what, &n_diff);
                if (n_diff)
                    printf("  %-50s max |diff| %.3g, %zu values not bit-equal\n", what, worst, n_diff);
                image_pixels_free(&px);
                n_checked++;
            }
            image_free(&im);
        }
    }
    printf("  %d references checked\n", n_checked);
    assert_true(n_checked > 50);
    cJSON_Delete(top);
}

/* ---- configs ---- */

static int parse(const char *json, struct image_proc_config *cfg, struct err *e)
{
    return image_proc_config_parse(cfg, json, strlen(json), NULL, e);
}

static void test_config_parse(void **state)
{
    (void)state;
    struct image_proc_config cfg;
    struct err e = {0};
    /* Gemma 3's own preprocessor_config.json (nulls keep the defaults) */
    assert_int_equal(parse("{\"image_processor_type\":\"Gemma3ImageProcessor\",\"do_pan_and_scan\":null,"
                           "\"size\":{\"height\":896,\"width\":896},\"resample\":2,\"image_mean\":[0.5,0.5,0.5],"
                           "\"image_seq_length\":256,\"pan_and_scan_min_crop_size\":null}", &cfg, &e), 0);
    assert_int_equal(cfg.kind, IMAGE_PROC_GEMMA3);
    assert_int_equal(cfg.height, 896);
    assert_int_equal(cfg.pas_min_crop_size, 256);
    assert_false(cfg.do_pan_and_scan);
    /* Qwen2-VL's min/max_pixels, Qwen3-VL's size form, the Fast suffix */
    assert_int_equal(parse("{\"image_processor_type\":\"Qwen2VLImageProcessorFast\",\"min_pixels\":100,"
                           "\"max_pixels\":5000}", &cfg, &e), 0);
    assert_int_equal(cfg.min_pixels, 100);
    assert_int_equal(cfg.max_pixels, 5000);
    assert_int_equal(parse("{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"patch_size\":16,"
                           "\"size\":{\"shortest_edge\":65536,\"longest_edge\":16777216}}", &cfg, &e), 0);
    assert_int_equal(cfg.min_pixels, 65536);
    assert_int_equal(cfg.max_pixels, 16777216);
    assert_int_equal(cfg.patch_size, 16);
    /* CLIP: ints for size and crop_size; model_type when no class is named */
    const char *llava = "{\"size\":336,\"crop_size\":336}";
    assert_int_equal(image_proc_config_parse(&cfg, llava, strlen(llava), "llava", &e), 0);
    assert_int_equal(cfg.kind, IMAGE_PROC_CLIP);
    assert_int_equal(cfg.shortest_edge, 336);
    assert_int_equal(cfg.crop_width, 336);
    /* processor_config.json with a nested image_processor and LLaVA's token keys */
    const char *pc = "{\"image_processor\":{\"image_processor_type\":\"CLIPImageProcessor\",\"crop_size\":"
                     "{\"height\":336,\"width\":336}},\"patch_size\":14,\"num_additional_image_tokens\":1,"
                     "\"vision_feature_select_strategy\":\"default\"}";
    assert_int_equal(parse(pc, &cfg, &e), 0);
    assert_int_equal(cfg.patch_size, 14);
    assert_int_equal(cfg.num_additional_image_tokens, 1);
    assert_true(cfg.drop_cls);
    /* Pixtral: an int size bounds both sides, as {height: n, width: n} does */
    assert_int_equal(parse("{\"image_processor_type\":\"PixtralImageProcessorFast\",\"size\":512}", &cfg, &e), 0);
    assert_int_equal(cfg.longest_edge, 512);
    assert_int_equal(parse("{\"image_processor_type\":\"PixtralImageProcessor\",\"size\":{\"height\":256,"
                           "\"width\":256},\"patch_size\":{\"height\":14,\"width\":14}}", &cfg, &e), 0);
    assert_int_equal(cfg.longest_edge, 256);
    assert_int_equal(cfg.patch_size, 14);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A folder: processor_config.json's nested image_processor wins; a legacy processor_config.json
 * (no nested object) still gives the processor's own keys beside preprocessor_config.json. */
static void test_config_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-preproc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct image_proc_config cfg;
    struct err e = {0};
    write_file(dir, "preprocessor_config.json",
               "{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":{\"height\":896,\"width\":896}}");
    write_file(dir, "processor_config.json", "{\"processor_class\":\"Gemma3Processor\",\"image_seq_length\":64}");
    assert_int_equal(image_proc_config_load(&cfg, dir, NULL, &e), 0);
    assert_int_equal(cfg.kind, IMAGE_PROC_GEMMA3);
    assert_int_equal(cfg.height, 896);
    assert_int_equal(cfg.image_seq_length, 64);
    write_file(dir, "processor_config.json",
               "{\"image_processor\":{\"image_processor_type\":\"SiglipImageProcessor\",\"size\":{\"height\":384,"
               "\"width\":384}},\"image_seq_length\":729}");
    assert_int_equal(image_proc_config_load(&cfg, dir, NULL, &e), 0);
    assert_int_equal(cfg.kind, IMAGE_PROC_SIGLIP);
    assert_int_equal(cfg.width, 384);
    assert_int_equal(cfg.image_seq_length, 729);
    write_file(dir, "processor_config.json", "{\"image_processor\":{\"size\":{\"height\":-1}}}");
    assert_int_equal(image_proc_config_load(&cfg, dir, "siglip", &e), -ERR_CONFIG);
    char path[512];
    snprintf(path, sizeof path, "%s/processor_config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    unlink(path);
    assert_int_equal(image_proc_config_load(&cfg, dir, NULL, &e), -ERR_MISSING);
    assert_int_equal(rmdir(dir), 0);
}

static void test_config_hostile(void **state)
{
    (void)state;
    static const struct { const char *json; int code; } bad[] = {
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":{\"height\":0,\"width\":896}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":{\"height\":1e9,\"width\":896}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":{\"height\":-4,\"width\":4}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":{\"height\":8.5,\"width\":4}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"size\":\"big\"}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"image_std\":[0.5,0,0.5]}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"image_mean\":[0.5,0.5]}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"do_resize\":\"yes\"}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"resample\":7}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"resample\":0}", ERR_UNSUPPORTED},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"rescale_factor\":0}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\",\"pan_and_scan_max_num_crops\":100000}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"min_pixels\":9000,\"max_pixels\":100}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"max_pixels\":1e15}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"patch_size\":0}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"merge_size\":4096}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Qwen2VLImageProcessor\",\"size\":224}", ERR_CONFIG},
        {"{\"image_processor_type\":\"CLIPImageProcessor\",\"crop_size\":{\"height\":3}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"MllamaImageProcessor\"}", ERR_UNSUPPORTED},
        {"{\"image_processor_type\":\"PixtralImageProcessor\",\"patch_size\":{\"height\":16,\"width\":14}}", ERR_UNSUPPORTED},
        {"{\"image_processor_type\":\"Idefics3ImageProcessor\",\"max_image_size\":{\"longest_edge\":0}}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Idefics3ImageProcessor\",\"size\":{\"height\":64,\"width\":64}}", ERR_UNSUPPORTED},
        {"{\"image_processor_type\":\"Idefics3ImageProcessor\",\"size\":64}", ERR_CONFIG},
        {"{\"image_processor_type\":\"Gemma3ImageProcessorSlow\"}", ERR_UNSUPPORTED},
        {"{\"image_processor\":[1,2]}", ERR_CONFIG},
        {"{}", ERR_UNSUPPORTED},
        {"[]", ERR_FORMAT},
        {"{\"image_processor_type\":\"Gemma3ImageProcessor\"", ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct image_proc_config cfg;
        struct err e = {0};
        int rc = parse(bad[i].json, &cfg, &e);
        if (rc != -bad[i].code)
            fail_msg("%s: got %d (%s), want %d", bad[i].json, rc, e.msg, -bad[i].code);
        assert_true(e.msg[0] != 0);
    }
    struct image_proc_config cfg;
    struct err e = {0};
    assert_int_equal(image_proc_config_load(&cfg, test_path("tests/fixtures/images"), NULL, &e), -ERR_MISSING);
}

/* ---- sizes ---- */

static struct image solid(uint32_t w, uint32_t h)
{
    struct image im = {w, h, malloc((size_t)w * h * 3), IMAGE_PNG};
    assert_non_null(im.rgb);
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        im.rgb[i] = (uint8_t)(i * 37);
    return im;
}

static void test_hostile_sizes(void **state)
{
    (void)state;
    struct image_proc_config cfg;
    struct image_pixels px;
    struct err e = {0};
    /* Qwen: an aspect ratio over 200 is refused, as smart_resize raises */
    struct image thin = solid(603, 3);
    image_proc_config_default(&cfg, IMAGE_PROC_QWEN2VL);
    assert_int_equal(image_preprocess(&px, &cfg, &thin, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "aspect ratio"));
    assert_null(px.pixel_values);
    /* 1x1 grows to min_pixels: 56x56, 16 patches, 4 tokens */
    struct image one = solid(1, 1);
    assert_int_equal(image_preprocess(&px, &cfg, &one, &e), 0);
    assert_int_equal(px.grid_h, 4);
    assert_int_equal(px.grid_w, 4);
    assert_int_equal(px.n_image_tokens, 4);
    assert_int_equal(px.patch_dim, 3 * 2 * 14 * 14);
    image_pixels_free(&px);
    /* Gemma 3 at the largest side with the most crops: over the value limit, refused before
     * any allocation */
    struct image wide = solid(4000, 500);
    image_proc_config_default(&cfg, IMAGE_PROC_GEMMA3);
    cfg.height = cfg.width = IMAGE_PROC_MAX_SIDE;
    cfg.do_pan_and_scan = true;
    cfg.pas_min_crop_size = 16;
    cfg.pas_max_num_crops = IMAGE_PROC_MAX_CROPS;
    assert_int_equal(image_preprocess(&px, &cfg, &wide, &e), -ERR_RANGE);
    assert_null(px.pixel_values);
    /* pan-and-scan crops laid on ceil(W / n) columns can run past the image: an empty crop
     * (transformers fails there too) is an error, not a read past the pixels */
    struct image nine = solid(9, 2);
    cfg.height = cfg.width = 8;
    cfg.pas_min_crop_size = 2;
    cfg.pas_max_num_crops = 4;
    assert_int_equal(image_preprocess(&px, &cfg, &nine, &e), -ERR_RANGE);
    /* with fewer crops the same image works: 3 crops of 3 columns */
    cfg.pas_max_num_crops = 3;
    assert_int_equal(image_preprocess(&px, &cfg, &nine, &e), 0);
    assert_int_equal(px.num_crops, 3);
    assert_int_equal(px.n_images, 4);
    assert_int_equal(px.n_image_tokens, 4 * 256);
    image_pixels_free(&px);
    /* no image */
    struct image none = {0};
    assert_int_equal(image_preprocess(&px, &cfg, &none, &e), -ERR_ARG);
    /* torchvision has no box filter */
    image_proc_config_default(&cfg, IMAGE_PROC_SIGLIP);
    cfg.resample = IMAGE_RESAMPLE_BOX;
    assert_int_equal(image_preprocess(&px, &cfg, &one, &e), -ERR_UNSUPPORTED);
    cfg.backend = IMAGE_BACKEND_PIL;
    assert_int_equal(image_preprocess(&px, &cfg, &one, &e), 0);
    image_pixels_free(&px);
    image_free(&thin);
    image_free(&one);
    image_free(&wide);
    image_free(&nine);
}

/* ---- prompt expansion ---- */

static void test_prompt(void **state)
{
    (void)state;
    struct image_proc_config cfg;
    struct image_pixels px = {0};
    struct err e = {0};
    static const int32_t nl2[] = {108}, intro[] = {1, 2, 3}, crops[] = {4, 5}, space[] = {6};
    struct image_prompt_ids ids = {.image = 262144, .boi = 255999, .eoi = 256000, .nl2 = nl2, .n_nl2 = 1,
                                   .pas_intro = intro, .n_pas_intro = 3, .pas_crops = crops, .n_pas_crops = 2,
                                   .space = space, .n_space = 1};
    int32_t out[2048];
    size_t n = 0;
    /* Gemma 3: "\n\n" <start_of_image> <image_soft_token> x 256 <end_of_image> "\n\n" */
    image_proc_config_default(&cfg, IMAGE_PROC_GEMMA3);
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), 0);
    assert_int_equal(n, 260);
    assert_int_equal(out[0], 108);
    assert_int_equal(out[1], 255999);
    assert_int_equal(out[2], 262144);
    assert_int_equal(out[257], 262144);
    assert_int_equal(out[258], 256000);
    assert_int_equal(out[259], 108);
    /* with 2 crops: intro full crops-sentence full space full */
    px.num_crops = 2;
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), 0);
    assert_int_equal(n, 3 + 260 + 2 + 260 + 1 + 260);
    assert_int_equal(out[3 + 260], 4);
    assert_int_equal(out[3 + 260 + 2 + 260], 6);
    assert_int_equal(image_prompt_expand(out, 10, &n, &cfg, &px, &ids, &e), -ERR_RANGE);
    assert_int_equal(n, 786);
    struct image_prompt_strings s = {.image = "<image_soft_token>", .boi = "<start_of_image>",
                                     .eoi = "<end_of_image>"};
    char *t = NULL;
    assert_int_equal(image_prompt_text(&t, &cfg, &px, &s, &e), 0);
    assert_true(strncmp(t, "Here is the original image \n\n<start_of_image><image_soft_token>", 63) == 0);
    assert_non_null(strstr(t, "<end_of_image>\n\n and here are some crops to help you see better \n\n<start_of_image>"));
    assert_non_null(strstr(t, "<end_of_image>\n\n \n\n<start_of_image>"));
    free(t);
    /* Qwen: <|image_pad|> x (t h w / merge^2) */
    image_proc_config_default(&cfg, IMAGE_PROC_QWEN2VL);
    struct image one = solid(1, 1);
    assert_int_equal(image_preprocess(&px, &cfg, &one, &e), 0);
    ids.image = 151655;
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), 0);
    assert_int_equal(n, 4);
    assert_int_equal(out[3], 151655);
    s.image = "<|image_pad|>";
    assert_int_equal(image_prompt_text(&t, &cfg, &px, &s, &e), 0);
    assert_string_equal(t, "<|image_pad|><|image_pad|><|image_pad|><|image_pad|>");
    free(t);
    image_pixels_free(&px);
    /* LLaVA 1.5: 336 / 14 = 24, 576 patches + 1 CLS - 1 for the "default" strategy */
    image_proc_config_default(&cfg, IMAGE_PROC_CLIP);
    cfg.shortest_edge = cfg.crop_height = cfg.crop_width = 336;
    cfg.patch_size = 14;
    cfg.num_additional_image_tokens = 1;
    cfg.drop_cls = true;
    assert_int_equal(image_preprocess(&px, &cfg, &one, &e), 0);
    assert_int_equal(px.n_image_tokens, 576);
    image_pixels_free(&px);
    /* Pixtral: 70x40 in patches of 16 -> 80x48; with spatial merge 2 the processor counts
     * 48 // 32 = 1 row of 80 // 32 = 2 (floor, as PixtralProcessor) */
    struct image r = solid(70, 40);
    image_proc_config_default(&cfg, IMAGE_PROC_PIXTRAL);
    cfg.spatial_merge_size = 2;
    assert_int_equal(image_preprocess(&px, &cfg, &r, &e), 0);
    assert_int_equal(px.width, 80);
    assert_int_equal(px.height, 48);
    assert_int_equal(px.n_image_tokens, 1 * (2 + 1));
    image_pixels_free(&px);
    /* rows of [IMG] x cols then [IMG_BREAK], the last [IMG_END]: 3 x 2 at merge 1 of 40x20 */
    struct image q = solid(40, 20);
    cfg.spatial_merge_size = 1;
    assert_int_equal(image_preprocess(&px, &cfg, &q, &e), 0);
    assert_int_equal(px.width, 48);
    assert_int_equal(px.height, 32);
    ids.image = 10;
    ids.img_break = 12;
    ids.img_end = 13;
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), 0);
    static const int32_t pix[] = {10, 10, 10, 12, 10, 10, 10, 13};
    assert_int_equal(n, 8);
    assert_memory_equal(out, pix, sizeof pix);
    s.image = "[IMG]";
    s.img_break = "[IMG_BREAK]";
    s.img_end = "[IMG_END]";
    assert_int_equal(image_prompt_text(&t, &cfg, &px, &s, &e), 0);
    assert_string_equal(t, "[IMG][IMG][IMG][IMG_BREAK][IMG][IMG][IMG][IMG_END]");
    free(t);
    image_pixels_free(&px);
    image_free(&q);
    /* Idefics3: 70x40 -> longest edge 1456 (1456x832) -> multiples of 364 (1456x832 -> 1456x
     * 1092): 3 rows x 4 cols of tiles + the global image */
    image_proc_config_default(&cfg, IMAGE_PROC_IDEFICS3);
    assert_int_equal(image_preprocess(&px, &cfg, &r, &e), 0);
    assert_int_equal(px.rows, 3);
    assert_int_equal(px.cols, 4);
    assert_int_equal(px.n_images, 13);
    assert_int_equal(px.n_image_tokens, 13 * 169);
    static const int32_t nl[] = {198}, nl2b[] = {271};
    int32_t rc_ids[36];
    for (int i = 0; i < 36; i++)
        rc_ids[i] = 1000 + i;
    ids.image = 7;
    ids.fake_around = 8;
    ids.global_img = 9;
    ids.row_col = rc_ids;
    ids.row_col_dim = 6;
    ids.nl = nl;
    ids.n_nl = 1;
    ids.nl2 = nl2b;
    ids.n_nl2 = 1;
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), -ERR_RANGE);
    int32_t *big = malloc(4096 * sizeof *big);
    assert_non_null(big);
    assert_int_equal(image_prompt_expand(big, 4096, &n, &cfg, &px, &ids, &e), 0);
    assert_int_equal(n, 12 * (2 + 169) + 3 + 3 + 169);
    assert_int_equal(big[0], 8);
    assert_int_equal(big[1], 1000);       /* <row_1_col_1> */
    assert_int_equal(big[171 + 1], 1001); /* <row_1_col_2> */
    assert_int_equal(big[4 * 171], 198);  /* "\n" after the first row */
    assert_int_equal(big[4 * 171 + 1 + 1], 1006); /* <row_2_col_1> */
    assert_int_equal(big[12 * 171 + 2], 271);     /* "\n\n" after the last row */
    assert_int_equal(big[12 * 171 + 3 + 1], 9);   /* <global-img> */
    assert_int_equal(big[n - 1], 8);
    free(big);
    s.image = "<image>";
    s.fake_around = "<fake_token_around_image>";
    s.global_img = "<global-img>";
    assert_int_equal(image_prompt_text(&t, &cfg, &px, &s, &e), 0);
    assert_true(strncmp(t, "<fake_token_around_image><row_1_col_1><image><image>", 52) == 0);
    assert_non_null(strstr(t, "<image>\n<fake_token_around_image><row_2_col_1><image>"));
    assert_non_null(strstr(t, "<row_3_col_4>"));
    assert_non_null(strstr(t, "<image>\n\n<fake_token_around_image><global-img><image>"));
    free(t);
    image_pixels_free(&px);
    /* not split: the one image, <fake_token_around_image><global-img><image>*n<fake...> */
    cfg.do_image_splitting = false;
    assert_int_equal(image_preprocess(&px, &cfg, &r, &e), 0);
    assert_int_equal(px.rows, 0);
    assert_int_equal(px.n_images, 1);
    assert_int_equal(px.height, 364);
    assert_int_equal(image_prompt_expand(out, 2048, &n, &cfg, &px, &ids, &e), 0);
    assert_int_equal(n, 3 + 169);
    image_pixels_free(&px);
    image_free(&r);
    image_free(&one);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_references),
    cmocka_unit_test(test_config_parse),
    cmocka_unit_test(test_config_load),
    cmocka_unit_test(test_config_hostile),
    cmocka_unit_test(test_hostile_sizes),
    cmocka_unit_test(test_prompt),
};

TEST_SUITE(preprocess, tests);
