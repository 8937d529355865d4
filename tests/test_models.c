/*
 * models: the trained checkpoints, driven through the real `mlxcel` binary
 * (cli_run.h).
 *
 * For models/llama-tiny, tests/fixtures/models/phixtral-tiny and models/phixtral-tiny-4bit, golden.json
 * holds five prompts with their float64 greedy continuations (48 ids and the
 * text) and 512 held-out ids with the reference perplexity. We require:
 * the prompt text tokenizes to the reference prompt ids; greedy generation
 * reproduces every continuation exactly (ids and text); perplexity is within
 * 0.5 % of the reference; MoE checkpoints also with MLXCEL_FUSED_MOE=0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli_run.h"
#include "test.h"

/* Run `mlxcel <args>` with env, capturing stdout; returns the exit status. */
static int run(const char *env, const char *args, char **out)
{
    return cli_run(env, args, out, NULL);
}

static cJSON *load_golden(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *g = cJSON_Parse(buf);
    free(buf);
    assert_non_null(g);
    return g;
}

/* "[1, 2, 3]" of a JSON int array, into buf */
static void ids_csv(const cJSON *arr, char *buf, size_t cap, const char *sep)
{
    size_t len = 0;
    const cJSON *it;
    buf[0] = '\0';
    cJSON_ArrayForEach(it, arr) {
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? sep : "", it->valueint);
        assert_true(len < cap);
    }
}

/* single-quote a string for sh */
static void shell_quote(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[n++] = '\'';
    for (; *s && n + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *s;
        }
    }
    buf[n++] = '\'';
    buf[n] = '\0';
}

/* Perplexity of the model in dir over its golden's 511 held-out ids (one window), run
 * with env. */
static double val_ppl(const char *dir, const char *env, const cJSON *g)
{
    char cmd[8192], ids_path[] = "/tmp/mlxcel-val-XXXXXX";
    int fd = mkstemp(ids_path);
    assert_true(fd >= 0);
    static char ids[16384];
    ids_csv(cJSON_GetObjectItem(g, "val_ids"), ids, sizeof ids, " ");
    assert_int_equal(write(fd, ids, strlen(ids)), (ssize_t)strlen(ids));
    close(fd);
    snprintf(cmd, sizeof cmd, "perplexity -m %s --ids-file %s --json", dir, ids_path);
    char *out;
    assert_int_equal(run(env, cmd, &out), 0);
    unlink(ids_path);
    cJSON *r = cJSON_Parse(out);
    assert_non_null(r);
    double ppl = cJSON_GetObjectItem(r, "ppl")->valuedouble;
    assert_int_equal(cJSON_GetObjectItem(r, "tokens")->valueint, 511);
    cJSON_Delete(r);
    free(out);
    return ppl;
}

static void check_model(const char *rel, const char *env)
{
    char dir[1024], cmd[8192], want[4096], got[4096], q[1024];
    snprintf(dir, sizeof dir, "%s", test_path(rel));
    cJSON *g = load_golden(dir);
    const cJSON *conts = cJSON_GetObjectItem(g, "continuations"), *c;
    int i = 0;
    cJSON_ArrayForEach(c, conts) {
        const char *prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        char *out;
        shell_quote(prompt, q, sizeof q);

        /* the prompt text must encode to the reference prompt ids */
        snprintf(cmd, sizeof cmd, "tokenize -m %s -p %s", dir, q);
        assert_int_equal(run(NULL, cmd, &out), 0);
        ids_csv(cJSON_GetObjectItem(c, "prompt_ids"), want, sizeof want, ", ");
        snprintf(got, sizeof got, "[%s]\n", want);
        if (strcmp(out, got) != 0)
            fail_msg("%s prompt %d: tokenize gave %s, reference [%s]", rel, i, out, want);
        free(out);

        /* greedy ids through --output-ids (raw continuations: --no-chat, as these
         * models ship a chat template that generate would otherwise apply) */
        snprintf(cmd, sizeof cmd, "generate -m %s -p %s --no-chat -n 48 --temp 0 --ignore-eos --output-ids", dir, q);
        assert_int_equal(run(env, cmd, &out), 0);
        ids_csv(cJSON_GetObjectItem(c, "greedy_ids"), want, sizeof want, ", ");
        snprintf(got, sizeof got, "[%s]\n", want);
        if (strcmp(out, got) != 0)
            fail_msg("%s prompt %d (%s): generated %s, reference %s", rel, i, env, out, got);
        free(out);

        /* and the streamed text */
        snprintf(cmd, sizeof cmd, "generate -m %s -p %s --no-chat -n 48 --temp 0 --ignore-eos", dir, q);
        assert_int_equal(run(env, cmd, &out), 0);
        snprintf(got, sizeof got, "%s\n", cJSON_GetObjectItem(c, "greedy_text")->valuestring);
        if (strcmp(out, got) != 0)
            fail_msg("%s prompt %d: text '%s', reference '%s'", rel, i, out, got);
        free(out);
        i++;
    }
    assert_int_equal(i, 5);

    double ppl = val_ppl(dir, env, g), ref = cJSON_GetObjectItem(g, "val_ppl")->valuedouble;
    printf("%s %s: perplexity %.4f, reference %.4f (%.3f %%), tokens 511\n", rel, env, ppl, ref,
           100.0 * fabs(ppl - ref) / ref);
    assert_true(fabs(ppl - ref) <= 0.005 * ref);
    cJSON_Delete(g);
}

static void llama_tiny(void **state)
{
    (void)state;
    check_model("models/llama-tiny", "");
}

static void phixtral_tiny(void **state)
{
    (void)state;
    check_model("tests/fixtures/models/phixtral-tiny", "MLXCEL_FUSED_MOE=1");
    check_model("tests/fixtures/models/phixtral-tiny", "MLXCEL_FUSED_MOE=0");
}

/* MLX affine 4-bit (g64) conversion of the same model, mlx-lm stacked layout; the
 * reference ran on the dequantized weights. */
static void phixtral_tiny_4bit(void **state)
{
    (void)state;
    check_model("models/phixtral-tiny-4bit", "MLXCEL_FUSED_MOE=1");
    check_model("models/phixtral-tiny-4bit", "MLXCEL_FUSED_MOE=0");
}

/* --fast (MLXCEL_FAST=1: x at 8 bits per group in the 4-bit products, on AVX2 / AVX-512
 * hosts; elsewhere it changes nothing) on the trained 4-bit model: perplexity within 1 % of
 * the reference (measured +0.34 % with AVX-512, +0.48 % with AVX2: the rounding of x to 8 bits
 * is discontinuous, so the ISAs' last-bit differences upstream pick other roundings and another
 * draw of its noise; docs/benchmarks.md). Greedy ids are not held to the reference: on the
 * first prompt they match for 31 tokens, then repeat a phrase once more than it does. */
static void phixtral_tiny_4bit_fast(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", test_path("models/phixtral-tiny-4bit"));
    cJSON *g = load_golden(dir);
    double ref = cJSON_GetObjectItem(g, "val_ppl")->valuedouble, ppl = val_ppl(dir, "MLXCEL_FAST=1", g);
    printf("models/phixtral-tiny-4bit --fast: perplexity %.4f, reference %.4f (%+.3f %%)\n", ppl, ref,
           100.0 * (ppl - ref) / ref);
    assert_true(fabs(ppl - ref) <= 0.01 * ref);
    cJSON_Delete(g);
}

/* Sampling from the trained model: exits 0 and prints Shakespeare-like text. */
static void romeo_sampling(void **state)
{
    (void)state;
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "generate -m %s -p 'ROMEO:' -n 64 --seed 7",
             test_path("tests/fixtures/models/phixtral-tiny"));
    assert_int_equal(run(NULL, cmd, &out), 0);
    size_t letters = 0, n = strlen(out);
    for (size_t i = 0; i < n; i++)
        letters += (out[i] >= 'a' && out[i] <= 'z') || (out[i] >= 'A' && out[i] <= 'Z') || out[i] == ' ';
    printf("ROMEO sample: %s", out);
    assert_true(n > 64);
    assert_true(letters * 10 >= n * 7); /* mostly words, not byte soup */
    free(out);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(llama_tiny),
    cmocka_unit_test(phixtral_tiny),
    cmocka_unit_test(phixtral_tiny_4bit), cmocka_unit_test(phixtral_tiny_4bit_fast),
    cmocka_unit_test(romeo_sampling),
};

TEST_SUITE(models, tests);
