/*
 * golden_cases: the list of golden cases, read from the fixture folders
 * (test.h). A case is a folder of tests/fixtures/golden holding a
 * golden.json (the generator's description; golden.safetensors beside it
 * has the reference logits), named after the folder; adding a folder adds
 * the case to every suite that runs the cases (golden, batch, convert).
 * Names come sorted, so runs are in the same order on every machine.
 *
 * The suites that run one cmocka test per case build their test array
 * here at run time (test_suite.build), so each case keeps its own test
 * name (golden_<case>, batched_<case>) and `run_tests golden_llama`
 * still selects it. Image cases (golden.json with "n_images") are listed
 * apart (golden_image_cases): the vision suite runs them with their images.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/fileio.h"
#include "core/safetensors.h"
#include "test.h"

#define GOLDEN_DIR "tests/fixtures/golden"
#define MAX_CASES 512

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether the golden.json at path describes an image case (gen_vision_models.py writes
 * "n_images"): those run in the vision suite, with their pixel_values, not as text. */
static bool is_image_case(const char *path)
{
    char *text = NULL;
    size_t len = 0;
    struct err e = {0};
    if (file_read_all(path, 64u << 20, &text, &len, &e) < 0)
        return false;
    bool yes = strstr(text, "\"n_images\"") != NULL;
    free(text);
    return yes;
}

static int scan_kind(const char *root, bool images, struct golden_cases *out);

int golden_cases_scan(const char *root, struct golden_cases *out)
{
    return scan_kind(root, false, out);
}

static int scan_kind(const char *root, bool images, struct golden_cases *out)
{
    char path[4096];
    struct stat st;
    memset(out, 0, sizeof *out);
    DIR *d = opendir(root);
    if (!d)
        return -1;
    out->names = calloc(MAX_CASES, sizeof *out->names);
    if (!out->names) {
        closedir(d);
        return -1;
    }
    for (struct dirent *de; (de = readdir(d)) != NULL && out->n < MAX_CASES;) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s/golden.json", root, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || is_image_case(path) != images)
            continue;
        if (!(out->names[out->n] = strdup(de->d_name)))
            break;
        out->n++;
    }
    closedir(d);
    qsort(out->names, out->n, sizeof *out->names, cmp_name);
    return 0;
}

void golden_cases_deinit(struct golden_cases *gc)
{
    for (size_t i = 0; i < gc->n; i++)
        free(gc->names[i]);
    free(gc->names);
    memset(gc, 0, sizeof *gc);
}

const struct golden_cases *golden_cases(void)
{
    static struct golden_cases gc;
    static bool done;
    if (!done) {
        golden_cases_scan(test_path(GOLDEN_DIR), &gc);
        done = true;
    }
    return &gc;
}

const struct golden_cases *golden_image_cases(void)
{
    static struct golden_cases gc;
    static bool done;
    if (!done) {
        scan_kind(test_path(GOLDEN_DIR), true, &gc);
        done = true;
    }
    return &gc;
}

const char *golden_case_dir(const char *name)
{
    static char buf[4][4096];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", test_path(GOLDEN_DIR), name);
    return b;
}

int golden_case_is_convert_q(const char *dir, bool *out)
{
    char path[4200];
    char *text = NULL;
    size_t len = 0;
    struct err e = {0};
    *out = false;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (file_read_all(path, 64u << 20, &text, &len, &e) < 0)
        return -1;
    cJSON *g = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(g)) {
        cJSON_Delete(g);
        return -1;
    }
    *out = cJSON_HasObjectItem(g, "attended_keys_last_query") && !cJSON_HasObjectItem(g, "layout");
    cJSON_Delete(g);
    return 0;
}

static void no_cases(void **state)
{
    (void)state;
    fail_msg("no golden cases: no folder of %s holds a golden.json", test_path(GOLDEN_DIR));
}

void golden_case_tests(const char *prefix, CMUnitTestFunction fn, const struct CMUnitTest *extra,
                       size_t n_extra, struct CMUnitTest **tests, size_t *n_tests)
{
    const struct golden_cases *gc = golden_cases();
    size_t n = gc->n ? gc->n : 1;
    struct CMUnitTest *t = calloc(n + n_extra, sizeof *t);
    if (!t) {
        *tests = NULL;
        *n_tests = 0;
        return;
    }
    if (gc->n == 0)
        t[0] = (struct CMUnitTest){.name = "golden_cases_found", .test_func = no_cases};
    for (size_t i = 0; i < gc->n; i++) {
        size_t len = strlen(prefix) + strlen(gc->names[i]) + 1;
        char *name = malloc(len);
        if (!name) {
            fprintf(stderr, "golden cases: out of memory\n");
            exit(1);
        }
        snprintf(name, len, "%s%s", prefix, gc->names[i]);
        /* the case name travels as the test's initial state */
        t[i] = (struct CMUnitTest){.name = name, .test_func = fn, .initial_state = gc->names[i]};
    }
    if (n_extra)
        memcpy(t + n, extra, n_extra * sizeof *t);
    *tests = t;
    *n_tests = n + n_extra;
}

void golden_case_input_ids(const char *name, struct st_set **gs, struct tensor *ids)
{
    char path[600];
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.safetensors", golden_case_dir(name));
    if (st_set_open_file(gs, path, &e) < 0 || st_set_take(*gs, "input_ids", ids, &e) < 0)
        fail_msg("%s", e.msg);
    assert_true(ids->shape[0] >= 3 && ids->shape[0] < 64);
}
