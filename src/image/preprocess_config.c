/*
 * preprocess_config: preprocessor_config.json / processor_config.json to struct
 * image_proc_config, as transformers 5's image processor classes read them (ADR 0085).
 *
 * The file is untrusted: every number is checked for type, integrality where the processor
 * needs an int, and the bounds in preprocess.h before it can size anything. A key transformers
 * would accept as null ("do_pan_and_scan": null) keeps the class default, as there. The
 * processor class comes from image_processor_type ("Gemma3ImageProcessor", "...Fast",
 * "...Pil") or, failing that, from the model_type the caller passes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "image/preprocess.h"

/* OPENAI_CLIP_MEAN / _STD and IMAGENET_STANDARD_MEAN / _STD of transformers.image_utils */
static const double k_clip_mean[3] = {0.48145466, 0.4578275, 0.40821073};
static const double k_clip_std[3] = {0.26862954, 0.26130258, 0.27577711};

#define CFG_MAX_BYTES ((size_t)1 << 20)

void image_proc_config_default(struct image_proc_config *cfg, enum image_proc_kind kind)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->backend = IMAGE_BACKEND_TORCHVISION;
    cfg->do_resize = cfg->do_rescale = cfg->do_normalize = true;
    cfg->rescale_factor = 1.0 / 255;
    for (int c = 0; c < 3; c++) {
        bool clip = kind == IMAGE_PROC_QWEN2VL || kind == IMAGE_PROC_CLIP || kind == IMAGE_PROC_PIXTRAL;
        cfg->image_mean[c] = clip ? k_clip_mean[c] : 0.5;
        cfg->image_std[c] = clip ? k_clip_std[c] : 0.5;
    }
    switch (kind) {
    case IMAGE_PROC_GEMMA3:
        /* Gemma3ImageProcessor's class defaults; Gemma3Processor's images_kwargs for the
         * pan-and-scan numbers; Gemma3Processor's image_seq_length */
        cfg->resample = IMAGE_RESAMPLE_BILINEAR;
        cfg->height = cfg->width = 224;
        cfg->pas_min_crop_size = 256;
        cfg->pas_max_num_crops = 4;
        cfg->pas_min_ratio = 1.2;
        cfg->image_seq_length = 256;
        break;
    case IMAGE_PROC_QWEN2VL:
        cfg->resample = IMAGE_RESAMPLE_BICUBIC;
        cfg->min_pixels = 56 * 56;
        cfg->max_pixels = 28 * 28 * 1280;
        cfg->patch_size = 14;
        cfg->temporal_patch_size = 2;
        cfg->merge_size = 2;
        break;
    case IMAGE_PROC_CLIP:
        cfg->resample = IMAGE_RESAMPLE_BICUBIC;
        cfg->shortest_edge = 224;
        cfg->do_center_crop = true;
        cfg->crop_height = cfg->crop_width = 224;
        cfg->num_additional_image_tokens = 0;
        break;
    case IMAGE_PROC_SIGLIP:
        cfg->resample = IMAGE_RESAMPLE_BICUBIC;
        cfg->height = cfg->width = 224;
        break;
    case IMAGE_PROC_PIXTRAL:
        cfg->resample = IMAGE_RESAMPLE_BICUBIC;
        cfg->longest_edge = 1024;
        cfg->patch_size = 16;
        cfg->spatial_merge_size = 1;
        break;
    case IMAGE_PROC_IDEFICS3:
        /* Idefics3ImageProcessor's defaults; transformers picks its PIL backend by default
         * (DEFAULT_TO_PIL_BACKEND_IMAGE_PROCESSORS: torchvision has no Lanczos) */
        cfg->backend = IMAGE_BACKEND_PIL;
        cfg->resample = IMAGE_RESAMPLE_LANCZOS;
        cfg->longest_edge = 4 * 364;
        cfg->max_image_size = 364;
        cfg->do_image_splitting = true;
        cfg->image_seq_length = 169;
        break;
    default:
        break;
    }
}

static enum image_proc_kind kind_of_class(const char *s)
{
    static const struct { const char *name; enum image_proc_kind kind; } k[] = {
        {"Gemma3ImageProcessor", IMAGE_PROC_GEMMA3},
        {"Qwen2VLImageProcessor", IMAGE_PROC_QWEN2VL},
        {"CLIPImageProcessor", IMAGE_PROC_CLIP},
        {"SiglipImageProcessor", IMAGE_PROC_SIGLIP},
        {"PixtralImageProcessor", IMAGE_PROC_PIXTRAL},
        {"Idefics3ImageProcessor", IMAGE_PROC_IDEFICS3},
        {"SmolVLMImageProcessor", IMAGE_PROC_IDEFICS3},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t n = strlen(k[i].name);
        if (strncmp(s, k[i].name, n) == 0 &&
            (!s[n] || strcmp(s + n, "Fast") == 0 || strcmp(s + n, "Pil") == 0))
            return k[i].kind;
    }
    return IMAGE_PROC_NONE;
}

static enum image_proc_kind kind_of_model(const char *mt)
{
    static const struct { const char *name; enum image_proc_kind kind; } k[] = {
        {"gemma3", IMAGE_PROC_GEMMA3},        {"qwen2_vl", IMAGE_PROC_QWEN2VL},
        {"qwen2_5_vl", IMAGE_PROC_QWEN2VL},   {"qwen3_vl", IMAGE_PROC_QWEN2VL},
        {"qwen3_vl_moe", IMAGE_PROC_QWEN2VL}, {"llava", IMAGE_PROC_CLIP},
        {"siglip", IMAGE_PROC_SIGLIP},         {"pixtral", IMAGE_PROC_PIXTRAL},
        {"mistral3", IMAGE_PROC_PIXTRAL},      {"idefics3", IMAGE_PROC_IDEFICS3},
        {"smolvlm", IMAGE_PROC_IDEFICS3},
    };
    for (size_t i = 0; mt && i < sizeof k / sizeof k[0]; i++)
        if (strcmp(mt, k[i].name) == 0)
            return k[i].kind;
    return IMAGE_PROC_NONE;
}

/* ---- typed, bounded readers: absent or null keeps *v; 0 or -ERR_CONFIG ---- */

static int get_bool(const cJSON *o, const char *key, bool *v, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsBool(j))
        return err_setf(e, ERR_CONFIG, "image processor config: %s must be true or false", key);
    *v = cJSON_IsTrue(j);
    return 0;
}

static int num_in(const cJSON *j, const char *key, double lo, double hi, bool integer, double *v,
                  struct err *e)
{
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return err_setf(e, ERR_CONFIG, "image processor config: %s must be a number", key);
    double d = j->valuedouble;
    if (integer && d != floor(d))
        return err_setf(e, ERR_CONFIG, "image processor config: %s must be an integer, got %g", key, d);
    if (!(d >= lo && d <= hi))
        return err_setf(e, ERR_CONFIG, "image processor config: %s = %g is outside [%g, %g]", key, d, lo, hi);
    *v = d;
    return 0;
}

static int get_u32(const cJSON *o, const char *key, uint32_t lo, uint32_t hi, uint32_t *v, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    double d;
    int rc;
    if (!j || cJSON_IsNull(j))
        return 0;
    if ((rc = num_in(j, key, lo, hi, true, &d, e)) < 0)
        return rc;
    *v = (uint32_t)d;
    return 0;
}

static int get_u64(const cJSON *o, const char *key, uint64_t hi, uint64_t *v, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    double d;
    int rc;
    if (!j || cJSON_IsNull(j))
        return 0;
    if ((rc = num_in(j, key, 0, (double)hi, true, &d, e)) < 0)
        return rc;
    *v = (uint64_t)d;
    return 0;
}

/* image_mean / image_std: three numbers or one (for every channel) */
static int get_triple(const cJSON *o, const char *key, bool nonzero, double v[3], struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    double t[3];
    int rc;
    if (!j || cJSON_IsNull(j))
        return 0;
    if (cJSON_IsNumber(j)) {
        if ((rc = num_in(j, key, -1e6, 1e6, false, &t[0], e)) < 0)
            return rc;
        t[1] = t[2] = t[0];
    } else if (cJSON_IsArray(j) && cJSON_GetArraySize(j) == 3) {
        for (int c = 0; c < 3; c++)
            if ((rc = num_in(cJSON_GetArrayItem(j, c), key, -1e6, 1e6, false, &t[c], e)) < 0)
                return rc;
    } else {
        return err_setf(e, ERR_CONFIG, "image processor config: %s must be a number or a list of 3 numbers", key);
    }
    for (int c = 0; c < 3; c++) {
        if (nonzero && (float)t[c] == 0.0f)
            return err_setf(e, ERR_CONFIG, "image processor config: %s[%d] is zero (a division by zero)", key, c);
        v[c] = t[c];
    }
    return 0;
}

/* "size" / "crop_size": an int or an object; the keys each processor reads */
static int get_size(const cJSON *o, struct image_proc_config *cfg, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "size");
    int rc;
    if (!j || cJSON_IsNull(j))
        return 0;
    if (cJSON_IsNumber(j)) {
        uint32_t n = 0;
        if ((rc = get_u32(o, "size", 1, IMAGE_PROC_MAX_SIDE, &n, e)) < 0)
            return rc;
        if (cfg->kind == IMAGE_PROC_CLIP)
            cfg->shortest_edge = n;  /* default_to_square=False */
        else if (cfg->kind == IMAGE_PROC_PIXTRAL)
            cfg->longest_edge = n;   /* {height: n, width: n}: the same bound on both sides */
        else if (cfg->kind == IMAGE_PROC_QWEN2VL || cfg->kind == IMAGE_PROC_IDEFICS3)
            return err_setf(e, ERR_CONFIG, "image processor config: size must be an object holding %s",
                            cfg->kind == IMAGE_PROC_QWEN2VL ? "shortest_edge and longest_edge" : "longest_edge");
        else
            cfg->height = cfg->width = n;
        return 0;
    }
    if (!cJSON_IsObject(j))
        return err_setf(e, ERR_CONFIG, "image processor config: size must be a number or an object");
    if (cfg->kind == IMAGE_PROC_QWEN2VL) {
        if ((rc = get_u64(j, "shortest_edge", IMAGE_PROC_MAX_PIXELS, &cfg->min_pixels, e)) < 0 ||
            (rc = get_u64(j, "longest_edge", IMAGE_PROC_MAX_PIXELS, &cfg->max_pixels, e)) < 0 ||
            (rc = get_u64(j, "min_pixels", IMAGE_PROC_MAX_PIXELS, &cfg->min_pixels, e)) < 0 ||
            (rc = get_u64(j, "max_pixels", IMAGE_PROC_MAX_PIXELS, &cfg->max_pixels, e)) < 0)
            return rc;
        return 0;
    }
    if (cfg->kind == IMAGE_PROC_PIXTRAL || cfg->kind == IMAGE_PROC_IDEFICS3) {
        uint32_t le = 0, h = 0, w = 0;
        if ((rc = get_u32(j, "longest_edge", 1, IMAGE_PROC_MAX_SIDE, &le, e)) < 0 ||
            (rc = get_u32(j, "height", 1, IMAGE_PROC_MAX_SIDE, &h, e)) < 0 ||
            (rc = get_u32(j, "width", 1, IMAGE_PROC_MAX_SIDE, &w, e)) < 0)
            return rc;
        if (le) {
            cfg->longest_edge = le;
            return 0;
        }
        if (h && w && h == w && cfg->kind == IMAGE_PROC_PIXTRAL) {
            cfg->longest_edge = h;  /* a square bound: (h, w) with h == w is longest_edge's pair */
            return 0;
        }
        return err_setf(e, ERR_UNSUPPORTED, "image processor config: size must hold longest_edge");
    }
    uint32_t h = 0, w = 0, se = 0;
    if ((rc = get_u32(j, "height", 1, IMAGE_PROC_MAX_SIDE, &h, e)) < 0 ||
        (rc = get_u32(j, "width", 1, IMAGE_PROC_MAX_SIDE, &w, e)) < 0 ||
        (rc = get_u32(j, "shortest_edge", 1, IMAGE_PROC_MAX_SIDE, &se, e)) < 0)
        return rc;
    if (h && w && !se) {
        cfg->height = h;
        cfg->width = w;
        cfg->shortest_edge = 0;  /* CLIP with height/width: a fixed resize, as transformers */
        return 0;
    }
    if (se && cfg->kind == IMAGE_PROC_CLIP && !cJSON_GetObjectItemCaseSensitive(j, "longest_edge")) {
        cfg->shortest_edge = se;
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "image processor config: this size form is not supported for %s",
                    cfg->kind == IMAGE_PROC_CLIP ? "CLIPImageProcessor" : "a fixed-size processor");
}

static int get_crop(const cJSON *o, struct image_proc_config *cfg, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "crop_size");
    int rc;
    if (!j || cJSON_IsNull(j))
        return 0;
    if (cJSON_IsNumber(j)) {
        uint32_t n = 0;
        if ((rc = get_u32(o, "crop_size", 1, IMAGE_PROC_MAX_SIDE, &n, e)) < 0)
            return rc;
        cfg->crop_height = cfg->crop_width = n;
        return 0;
    }
    if (!cJSON_IsObject(j) || !cJSON_GetObjectItemCaseSensitive(j, "height") ||
        !cJSON_GetObjectItemCaseSensitive(j, "width"))
        return err_setf(e, ERR_CONFIG, "image processor config: crop_size must be a number or {height, width}");
    if ((rc = get_u32(j, "height", 1, IMAGE_PROC_MAX_SIDE, &cfg->crop_height, e)) < 0 ||
        (rc = get_u32(j, "width", 1, IMAGE_PROC_MAX_SIDE, &cfg->crop_width, e)) < 0)
        return rc;
    return 0;
}

/* "patch_size" (int or {height, width}, square) and Idefics3's "max_image_size" */
static int get_square(const cJSON *o, const char *key, const char *sub, uint32_t hi, uint32_t *v, struct err *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    int rc;
    if (!j || cJSON_IsNull(j) || cJSON_IsNumber(j))
        return get_u32(o, key, 1, hi, v, e);
    if (!cJSON_IsObject(j))
        return err_setf(e, ERR_CONFIG, "image processor config: %s must be a number or an object", key);
    uint32_t a = 0, b = 0;
    if (sub) {
        if ((rc = get_u32(j, sub, 1, hi, &a, e)) < 0)
            return rc;
        b = a;
    } else if ((rc = get_u32(j, "height", 1, hi, &a, e)) < 0 || (rc = get_u32(j, "width", 1, hi, &b, e)) < 0) {
        return rc;
    }
    if (!a || a != b)
        return err_setf(e, ERR_UNSUPPORTED, "image processor config: %s must be square", key);
    *v = a;
    return 0;
}

/* The image processor's keys (o) and, from processor_config.json, the processor's (top). */
static int read_keys(struct image_proc_config *cfg, const cJSON *o, const cJSON *top, struct err *e)
{
    int rc;
    uint32_t resample = cfg->resample;
    double d;
    const cJSON *j;
    if ((rc = get_bool(o, "do_resize", &cfg->do_resize, e)) < 0 ||
        (rc = get_bool(o, "do_rescale", &cfg->do_rescale, e)) < 0 ||
        (rc = get_bool(o, "do_normalize", &cfg->do_normalize, e)) < 0 ||
        (rc = get_bool(o, "do_center_crop", &cfg->do_center_crop, e)) < 0 ||
        (rc = get_bool(o, "do_pan_and_scan", &cfg->do_pan_and_scan, e)) < 0 ||
        (rc = get_u32(o, "resample", 0, 5, &resample, e)) < 0 ||
        (rc = get_triple(o, "image_mean", false, cfg->image_mean, e)) < 0 ||
        (rc = get_triple(o, "image_std", true, cfg->image_std, e)) < 0 ||
        (rc = get_size(o, cfg, e)) < 0 || (rc = get_crop(o, cfg, e)) < 0 ||
        (rc = get_u64(o, "min_pixels", IMAGE_PROC_MAX_PIXELS, &cfg->min_pixels, e)) < 0 ||
        (rc = get_u64(o, "max_pixels", IMAGE_PROC_MAX_PIXELS, &cfg->max_pixels, e)) < 0 ||
        (rc = get_square(o, "patch_size", NULL, IMAGE_PROC_MAX_PATCH, &cfg->patch_size, e)) < 0 ||
        (rc = get_square(o, "max_image_size", "longest_edge", IMAGE_PROC_MAX_SIDE, &cfg->max_image_size, e)) < 0 ||
        (rc = get_bool(o, "do_image_splitting", &cfg->do_image_splitting, e)) < 0 ||
        (rc = get_u32(o, "temporal_patch_size", 1, IMAGE_PROC_MAX_MERGE, &cfg->temporal_patch_size, e)) < 0 ||
        (rc = get_u32(o, "merge_size", 1, IMAGE_PROC_MAX_MERGE, &cfg->merge_size, e)) < 0 ||
        (rc = get_u32(o, "pan_and_scan_min_crop_size", 1, IMAGE_PROC_MAX_SIDE, &cfg->pas_min_crop_size, e)) < 0 ||
        (rc = get_u32(o, "pan_and_scan_max_num_crops", 2, IMAGE_PROC_MAX_CROPS, &cfg->pas_max_num_crops, e)) < 0)
        return rc;
    cfg->resample = (enum image_resample)resample;
    if ((j = cJSON_GetObjectItemCaseSensitive(o, "rescale_factor")) && !cJSON_IsNull(j)) {
        if ((rc = num_in(j, "rescale_factor", 1e-12, 65536, false, &d, e)) < 0)
            return rc;
        cfg->rescale_factor = d;
    }
    if ((j = cJSON_GetObjectItemCaseSensitive(o, "pan_and_scan_min_ratio_to_activate")) && !cJSON_IsNull(j)) {
        if ((rc = num_in(j, "pan_and_scan_min_ratio_to_activate", 0, 1e6, false, &d, e)) < 0)
            return rc;
        cfg->pas_min_ratio = d;
    }
    if ((rc = get_u32(o, "image_seq_length", 1, IMAGE_PROC_MAX_SEQ, &cfg->image_seq_length, e)) < 0 ||
        (rc = get_u32(o, "image_seq_len", 1, IMAGE_PROC_MAX_SEQ, &cfg->image_seq_length, e)) < 0)
        return rc;
    if (top) {
        if ((rc = get_u32(top, "image_seq_length", 1, IMAGE_PROC_MAX_SEQ, &cfg->image_seq_length, e)) < 0 ||
            (rc = get_u32(top, "num_additional_image_tokens", 0, 16, &cfg->num_additional_image_tokens, e)) < 0)
            return rc;
        if ((rc = get_u32(top, "image_seq_len", 1, IMAGE_PROC_MAX_SEQ, &cfg->image_seq_length, e)) < 0 ||
            (rc = get_u32(top, "spatial_merge_size", 1, IMAGE_PROC_MAX_MERGE, &cfg->spatial_merge_size, e)) < 0)
            return rc;
        if ((cfg->kind == IMAGE_PROC_CLIP || cfg->kind == IMAGE_PROC_PIXTRAL) &&
            (rc = get_u32(top, "patch_size", 1, IMAGE_PROC_MAX_PATCH, &cfg->patch_size, e)) < 0)
            return rc;
        j = cJSON_GetObjectItemCaseSensitive(top, "vision_feature_select_strategy");
        cfg->drop_cls = cJSON_IsString(j) && strcmp(j->valuestring, "default") == 0;
    }
    return 0;
}

/* Cross-key checks, after every key is read. */
static int validate(const struct image_proc_config *cfg, struct err *e)
{
    if (cfg->kind == IMAGE_PROC_QWEN2VL) {
        if (cfg->min_pixels > cfg->max_pixels)
            return err_setf(e, ERR_CONFIG, "image processor config: min_pixels %llu > max_pixels %llu",
                            (unsigned long long)cfg->min_pixels, (unsigned long long)cfg->max_pixels);
        if (!cfg->max_pixels)
            return err_setf(e, ERR_CONFIG, "image processor config: max_pixels is 0");
    }
    if (cfg->kind == IMAGE_PROC_IDEFICS3 && cfg->do_image_splitting && !cfg->max_image_size)
        return err_setf(e, ERR_CONFIG, "image processor config: max_image_size is missing");
    if (cfg->resample == IMAGE_RESAMPLE_NEAREST)
        return err_setf(e, ERR_UNSUPPORTED, "image processor config: resample 0 (nearest) is not supported");
    return 0;
}

static int parse_root(struct image_proc_config *cfg, const cJSON *root, const cJSON *top,
                      const char *model_type, struct err *e)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "image_processor_type");
    enum image_proc_kind kind = IMAGE_PROC_NONE;
    if (cJSON_IsString(t)) {
        kind = kind_of_class(t->valuestring);
        if (kind == IMAGE_PROC_NONE)
            return err_setf(e, ERR_UNSUPPORTED, "image processor '%.80s' is not supported (Gemma3ImageProcessor, "
                            "Qwen2VLImageProcessor, CLIPImageProcessor, SiglipImageProcessor are)", t->valuestring);
    } else {
        kind = kind_of_model(model_type);
        if (kind == IMAGE_PROC_NONE)
            return err_setf(e, ERR_UNSUPPORTED, "no image processor named and none known for model type '%.80s'",
                            model_type ? model_type : "");
    }
    image_proc_config_default(cfg, kind);
    if (cJSON_IsString(t) && strncmp(t->valuestring, "SmolVLM", 7) == 0) {
        cfg->longest_edge = 4 * 512;  /* SmolVLMImageProcessor's class defaults */
        cfg->max_image_size = 512;
        cfg->image_seq_length = 64;
    }
    int rc = read_keys(cfg, root, top, e);
    return rc < 0 ? rc : validate(cfg, e);
}

int image_proc_config_parse(struct image_proc_config *cfg, const char *json, size_t n, const char *model_type,
                            struct err *e)
{
    cJSON *root = NULL;
    int rc = json_parse_doc(json, n, "image processor config", JSON_DUPS_LAST, &root, e);
    if (rc < 0)
        return rc;
    const cJSON *ip = cJSON_GetObjectItemCaseSensitive(root, "image_processor");
    if (ip && !cJSON_IsObject(ip)) {
        cJSON_Delete(root);
        return err_setf(e, ERR_CONFIG, "image processor config: image_processor must be an object");
    }
    rc = parse_root(cfg, ip ? ip : root, ip ? root : NULL, model_type, e);
    cJSON_Delete(root);
    return rc;
}

int image_proc_config_load(struct image_proc_config *cfg, const char *dir, const char *model_type,
                           struct err *e)
{
    char path[4096];
    cJSON *proc = NULL, *pre = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/processor_config.json", dir);
    rc = json_load_object(path, FILE_FOLDER, CFG_MAX_BYTES, &proc, e);
    if (rc < 0 && rc != -ERR_MISSING)
        return rc;
    const cJSON *ip = proc ? cJSON_GetObjectItemCaseSensitive(proc, "image_processor") : NULL;
    if (ip && cJSON_IsObject(ip)) {
        rc = parse_root(cfg, ip, proc, model_type, e);
    } else {
        snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
        rc = json_load_object(path, FILE_FOLDER, CFG_MAX_BYTES, &pre, e);
        if (rc == -ERR_MISSING)
            err_setf(e, ERR_MISSING, "%s holds neither processor_config.json's image_processor nor "
                     "preprocessor_config.json", dir);
        if (rc >= 0)
            rc = parse_root(cfg, pre, proc, model_type, e);
    }
    cJSON_Delete(proc);
    cJSON_Delete(pre);
    return rc < 0 ? rc : 0;
}
