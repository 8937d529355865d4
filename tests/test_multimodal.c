/*
 * multimodal: a multimodal checkpoint's text model loads and runs as the text family
 * (model.c's nest_text_config / nest_weights). Each case wraps a golden text checkpoint
 * the way a published multimodal one holds it: config.json with the outer model_type and the
 * text config under text_config (quantization, tied embeddings and special ids at the top,
 * where the wrappers keep them), every tensor renamed under the wrapper's prefix
 * (transformers 5's model.language_model.*, mlx-vlm's language_model.model.* with
 * language_model.lm_head.*, Idefics3's model.text_model.*), plus vision-tower and projector
 * tensors. The text model must match the golden's float64 reference exactly as the plain
 * checkpoint does. Errors: a text_config no family reads, and a tensor stored under both names.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/st_write.h"
#include "models/model.h"
#include "test.h"

struct nest_case {
    const char *golden, *wrapper, *prefix, *head_prefix;
};

static const struct nest_case k_cases[] = {
    {"qwen3_5_text", "qwen3_5", "model.language_model.", "lm_head."},
    {"gemma3_text", "gemma3", "language_model.model.", "language_model.lm_head."},
    {"llama", "llava", "model.language_model.", "lm_head."},
    {"mistral", "idefics3", "model.text_model.", "lm_head."},
    /* mlx-vlm's 4-bit layout: per-module quantization entries name the wrapper's modules */
    {"qwen3_moe_mlx_q4", "qwen3_vl_moe", "language_model.model.", "language_model.lm_head."},
};

static char *read_text(const char *path)
{
    char *t = NULL;
    size_t n = 0;
    struct err e = {0};
    if (file_read_all(path, 1 << 22, &t, &n, &e) < 0)
        return NULL;
    return t;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

/* The golden checkpoint's tensors under the wrapper's names (one file), plus two tensors
 * of a vision tower and a projector; `twice`: one tensor also under its plain name. */
static void write_weights(const char *src, const char *dst, const struct nest_case *c, bool twice)
{
    struct st_set *s = NULL;
    struct err e = {0};
    if (st_set_open(&s, src, &e) < 0)
        fail_msg("%s", e.msg);
    size_t n = st_set_count(s), m = n + 2 + (twice ? 1 : 0);
    struct st_wentry *ents = calloc(m, sizeof *ents);
    char **names = calloc(m, sizeof *names);
    assert_true(ents && names);
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        names[i] = malloc(strlen(t->name) + 64);
        bool head = strncmp(t->name, "lm_head.", 8) == 0;
        sprintf(names[i], "%s%s", head ? c->head_prefix : c->prefix,
                t->name + (head ? 8 : strncmp(t->name, "model.", 6) == 0 ? 6 : 0));
        ents[i] = (struct st_wentry){names[i], t->dtype, t->ndim, {0}};
        memcpy(ents[i].shape, t->shape, sizeof t->shape);
    }
    /* a tower tensor that no vision family takes for its tower's first (Qwen's towers start
     * from patch_embed.proj.weight): the tensors beside the text model are ignored */
    names[n] = strdup("model.visual.merger.linear_fc1.weight");
    names[n + 1] = strdup("multi_modal_projector.linear_1.weight");
    for (size_t i = n; i < n + 2; i++)
        ents[i] = (struct st_wentry){names[i], DTYPE_F32, 2, {4, 4}};
    const struct st_tensor *dup = twice ? st_set_find(s, "model.norm.weight") : NULL;
    if (twice) {
        assert_non_null(dup);
        names[n + 2] = strdup(dup->name);
        ents[n + 2] = (struct st_wentry){names[n + 2], dup->dtype, dup->ndim, {0}};
        memcpy(ents[n + 2].shape, dup->shape, sizeof dup->shape);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    struct st_writer *w = NULL;
    if (st_writer_open(&w, path, ents, m, &e) < 0)
        fail_msg("%s", e.msg);
    struct tensor t;
    for (size_t i = 0; i < m; i++) {
        if (i >= n && i < n + 2) {
            float z[16] = {0};
            assert_int_equal(st_writer_write(w, z, sizeof z, &e), 0);
            continue;
        }
        const struct st_tensor *st = i < n ? st_set_at(s, i) : dup;
        assert_int_equal(st_set_take(s, st->name, &t, &e), 0);
        assert_int_equal(st_writer_write(w, t.data, st_wentry_bytes(&ents[i]), &e), 0);
    }
    if (st_writer_close(w, &e) < 0)
        fail_msg("%s", e.msg);
    for (size_t i = 0; i < m; i++)
        free(names[i]);
    free(names);
    free(ents);
    st_set_free(s);
}

/* dst: the golden folder of case c as a multimodal checkpoint; text_mt overrides the
 * text config's model_type when not NULL. */
static void make_nested(const struct nest_case *c, const char *dst, const char *text_mt, bool twice)
{
    const char *src = golden_case_dir(c->golden);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", src);
    char *txt = read_text(path);
    assert_non_null(txt);
    cJSON *text = cJSON_Parse(txt), *outer = cJSON_CreateObject();
    free(txt);
    assert_true(text && outer);
    if (text_mt)
        cJSON_ReplaceItemInObject(text, "model_type", cJSON_CreateString(text_mt));
    /* what wrappers keep at the top: the checkpoint-wide keys */
    static const char *const top[] = {"tie_word_embeddings", "eos_token_id", "bos_token_id", "torch_dtype"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        cJSON *v = cJSON_DetachItemFromObject(text, top[i]);
        if (v)
            cJSON_AddItemToObject(outer, top[i], v);
    }
    /* the quantization, with its per-module entries under the wrapper's module names */
    static const char *const qkeys[] = {"quantization", "quantization_config"};
    for (size_t i = 0; i < 2; i++) {
        cJSON *q = cJSON_DetachItemFromObject(text, qkeys[i]), *nq = q ? cJSON_CreateObject() : NULL;
        cJSON *it;
        cJSON_ArrayForEach(it, q) {
            char key[512];
            bool head = strncmp(it->string, "lm_head", 7) == 0;
            bool mod = strncmp(it->string, "model.", 6) == 0;
            snprintf(key, sizeof key, "%s%s", head ? c->head_prefix : mod ? c->prefix : "",
                     it->string + (head ? 8 : mod ? 6 : 0));
            if (head && !it->string[7])
                snprintf(key, sizeof key, "%.*s", (int)strlen(c->head_prefix) - 1, c->head_prefix);
            cJSON_AddItemToObject(nq, key, cJSON_Duplicate(it, true));
        }
        if (q) {
            cJSON_AddItemToObject(outer, qkeys[i], nq);
            cJSON_Delete(q);
        }
    }
    char arch[96];
    snprintf(arch, sizeof arch, "%sForConditionalGeneration", c->wrapper);
    cJSON_AddStringToObject(outer, "model_type", c->wrapper);
    cJSON *a = cJSON_AddArrayToObject(outer, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
    cJSON_AddItemToObject(outer, "text_config", text);
    cJSON *vc = cJSON_AddObjectToObject(outer, "vision_config");
    cJSON_AddNumberToObject(vc, "hidden_size", 4);
    char *out = cJSON_Print(outer);
    snprintf(path, sizeof path, "%s/config.json", dst);
    write_text(path, out);
    free(out);
    cJSON_Delete(outer);
    /* the generation config, as the checkpoint ships it */
    snprintf(path, sizeof path, "%s/generation_config.json", src);
    if ((txt = read_text(path))) {
        snprintf(path, sizeof path, "%s/generation_config.json", dst);
        write_text(path, txt);
        free(txt);
    }
    write_weights(src, dst, c, twice);
}

static void rm_dir(const char *dir)
{
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    char path[600];
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void text_model_of_multimodal(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char dir[] = "/tmp/mlxcel-mm-XXXXXX";
        assert_non_null(mkdtemp(dir));
        make_nested(&k_cases[i], dir, NULL, false);
        struct model *m = NULL;
        struct err e = {0};
        if (model_load(&m, dir, &e) < 0)
            fail_msg("%s as %s: %s", k_cases[i].golden, k_cases[i].wrapper, e.msg);
        assert_string_equal(m->multimodal, k_cases[i].wrapper);
        assert_int_equal(st_set_n_unused(m->st), 0);  /* the vision tensors are marked, not unused */
        model_free(m);
        double err = golden_check_model(dir, golden_case_dir(k_cases[i].golden), true);
        printf("multimodal %-9s (%s, %s...): text model within %.2e of the golden\n", k_cases[i].wrapper,
               k_cases[i].golden, k_cases[i].prefix, err);
        rm_dir(dir);
    }
}

static void multimodal_errors(void **state)
{
    (void)state;
    char dir[] = "/tmp/mlxcel-mm-XXXXXX";
    struct model *m = NULL;
    struct err e = {0};
    /* a text config no family reads: the outer type is what is unsupported */
    assert_non_null(mkdtemp(dir));
    make_nested(&k_cases[2], dir, "no_such_vl_text", false);
    assert_int_equal(model_load(&m, dir, &e), -ERR_UNSUPPORTED);
    assert_null(m);
    assert_non_null(strstr(e.msg, "'llava'"));
    rm_dir(dir);
    /* a tensor stored both under the wrapper's name and the plain one */
    strcpy(dir, "/tmp/mlxcel-mm-XXXXXX");
    assert_non_null(mkdtemp(dir));
    make_nested(&k_cases[2], dir, NULL, true);
    err_clear(&e);
    assert_int_equal(model_load(&m, dir, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "stored twice"));
    rm_dir(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(text_model_of_multimodal),
    cmocka_unit_test(multimodal_errors),
};

TEST_SUITE(multimodal, tests);
