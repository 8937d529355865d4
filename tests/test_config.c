/*
 * config: the typed JSON accessors that every family's normalization uses,
 * and model-level config handling (generation_config.json, quantization,
 * missing files) driven through model_load and the mlxcel CLI on temporary folders.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dirent.h>

#include "cli_run.h"
#include "core/dtype.h"
#include "core/fileio.h"
#include "loading/config.h"
#include "models/model.h"
#include "models/registry.h"
#include "test.h"

static cJSON *parse(const char *json)
{
    cJSON *c = NULL;
    struct err e = {0};
    assert_int_equal(cfg_parse(json, strlen(json), "test", &c, &e), 0);
    return c;
}

static void accessors(void **state)
{
    (void)state;
    struct err e = {0};
    cJSON *c = parse("{\"a\": 3, \"b\": null, \"f\": 1.5, \"s\": \"x\", \"t\": true, "
                     "\"big\": 1e12, \"frac\": 2.5, \"ids\": [1, 2], \"id\": 7}");
    int v;
    float f;
    bool b;
    char s[8];
    int32_t ids[4];
    int n;
    assert_int_equal(cfg_int(c, "a", &v, &e), 0);
    assert_int_equal(v, 3);
    assert_int_equal(cfg_opt_int(c, "b", 9, &v, &e), 0); /* null means default */
    assert_int_equal(v, 9);
    assert_int_equal(cfg_opt_int(c, "zz", 11, &v, &e), 0);
    assert_int_equal(v, 11);
    assert_int_equal(cfg_int(c, "zz", &v, &e), -ERR_CONFIG);
    assert_non_null(strstr(e.msg, "'zz'"));
    assert_int_equal(cfg_int(c, "big", &v, &e), -ERR_CONFIG);
    assert_non_null(strstr(e.msg, "big"));
    assert_int_equal(cfg_int(c, "frac", &v, &e), -ERR_CONFIG);
    assert_int_equal(cfg_int(c, "s", &v, &e), -ERR_CONFIG);
    assert_int_equal(cfg_float(c, "f", &f, &e), 0);
    assert_true(f == 1.5f);
    assert_int_equal(cfg_opt_bool(c, "t", false, &b, &e), 0);
    assert_true(b);
    assert_int_equal(cfg_opt_bool(c, "a", false, &b, &e), -ERR_CONFIG);
    assert_int_equal(cfg_opt_str(c, "s", "d", s, sizeof s, &e), 0);
    assert_string_equal(s, "x");
    assert_int_equal(cfg_opt_ids(c, "ids", ids, 4, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(cfg_opt_ids(c, "id", ids, 4, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 7);
    assert_int_equal(cfg_opt_ids(c, "ids", ids, 1, &n, &e), -ERR_CONFIG);
    cJSON_Delete(c);

    cJSON *bad = NULL;
    assert_int_equal(cfg_parse("{\"a\": ", 6, "cfg", &bad, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "not valid JSON"));
    assert_int_equal(cfg_parse("[1]", 3, "cfg", &bad, &e), -ERR_FORMAT);
    assert_null(bad);
}

/* A temporary checkpoint folder holding a copy of a golden case with one file replaced. */
static char *copy_case(const char *name)
{
    char tmpl[] = "/tmp/mlxcel-cfg-XXXXXX", cmd[1024];
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    snprintf(cmd, sizeof cmd, "cp %s/%s/* %s/", test_path("tests/fixtures/golden"), name, dir);
    assert_int_equal(system(cmd), 0);
    return strdup(dir);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_dir(char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static void load_expect(const char *dir, int code, const char *substr)
{
    struct model *m = NULL;
    struct err e = {0};
    int rc = model_load(&m, dir, &e);
    if (code == 0) {
        if (rc != 0)
            fail_msg("%s", e.msg);
        model_free(m);
        return;
    }
    assert_null(m);
    if (rc != -code || !strstr(e.msg, substr))
        fail_msg("expected code %d with '%s', got %d: %s", code, substr, rc, e.msg);
    /* and through the CLI: one error line naming the same thing, exit 1 */
    char args[600];
    snprintf(args, sizeof args, "inspect -m %s", dir);
    cli_expect_error(args, substr);
}

static void generation_config(void **state)
{
    (void)state;
    char *dir = copy_case("qwen2");
    struct model *m = NULL;
    struct err e = {0};
    write_file(dir, "generation_config.json",
               "{\"eos_token_id\": [2, 5], \"do_sample\": true, \"temperature\": 0.7, \"top_p\": 0.9}");
    assert_int_equal(model_load(&m, dir, &e), 0);
    assert_int_equal(m->hp.n_eos, 2);
    assert_int_equal(m->hp.eos_ids[1], 5);
    assert_true(m->gen.temperature == 0.7f && m->gen.top_p == 0.9f);
    model_free(m);
    /* without do_sample, transformers decodes greedily */
    write_file(dir, "generation_config.json", "{\"eos_token_id\": 2, \"temperature\": 0.7}");
    assert_int_equal(model_load(&m, dir, &e), 0);
    assert_true(m->gen.temperature == 0.0f);
    model_free(m);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": \"two\"}");
    load_expect(dir, ERR_CONFIG, "eos_token_id");

    /* values the sampler would refuse as flags are refused from the file too, naming the
     * file and the key (generate and serve check once the model is loaded) */
    char args[700], *out = NULL;
    static const char *const bad[][2] = {
        {"{\"do_sample\": true, \"temperature\": -1}", "temperature (--temp) = -1"},
        {"{\"do_sample\": true, \"min_p\": -1}", "min_p (--min-p) = -1"},
        {"{\"do_sample\": true, \"top_p\": 2}", "top_p (--top-p) = 2"},
        {"{\"do_sample\": true, \"top_k\": -1}", "top_k (--top-k) = -1"},
        {"{\"repetition_penalty\": 0}", "repetition_penalty (--repeat-penalty) = 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(dir, "generation_config.json", bad[i][0]);
        snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,2 -n 1 --output-ids", dir);
        cli_expect_error(args, bad[i][1]);
        cli_expect_error(args, "generation_config.json");
        snprintf(args, sizeof args, "serve -m %s --port 0", dir);
        cli_expect_error(args, bad[i][1]);
    }
    /* ...but without do_sample they are not used (greedy), as in transformers: a top_p of
     * 2 or a negative temperature beside do_sample false does not break greedy runs */
    write_file(dir, "generation_config.json", "{\"do_sample\": false, \"top_p\": 2, \"temperature\": -1, "
               "\"min_p\": -1, \"top_k\": -5}");
    assert_int_equal(model_load(&m, dir, &e), 0);
    assert_true(m->gen.temperature == 0.0f && isnan(m->gen.top_p) && isnan(m->gen.min_p));
    model_free(m);
    snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,2 -n 2 --output-ids", dir);
    if (cli_run(NULL, args, &out, NULL) != 0)
        fail_msg("a greedy run failed on unused sampling values");
    free(out);
    remove_dir(dir);
}

/* The model dtype: transformers 5's "dtype" or "torch_dtype", a torch dtype name or an
 * error naming it; and model_type alone picks the family, as AutoConfig. */
static void dtype_and_model_type(void **state)
{
    (void)state;
    char *dir = copy_case("llama");
    char path[1024], *text = NULL;
    size_t n = 0;
    struct err e = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(file_read_all(path, 1 << 20, &text, &n, &e), 0);
    cJSON *base = parse(text);
    free(text);
    cJSON_DeleteItemFromObjectCaseSensitive(base, "torch_dtype");
    static const struct {
        const char *dtype, *torch_dtype;  /* NULL: absent */
        int code;
        const char *sub;
    } k_cases[] = {
        {NULL, "float8", ERR_CONFIG, "'float8' is not a torch dtype"},
        {"bf16", NULL, ERR_CONFIG, "config field 'dtype': 'bf16'"},
        /* transformers 5's key wins over the old one */
        {"nope", "bfloat16", ERR_CONFIG, "'nope'"},
        {"bfloat16", "nope", 0, NULL},
        {NULL, "float8_e4m3fn", 0, NULL},
        {NULL, "torch.float16", 0, NULL},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        cJSON *c = cJSON_Duplicate(base, 1);
        if (k_cases[i].dtype)
            cJSON_AddStringToObject(c, "dtype", k_cases[i].dtype);
        if (k_cases[i].torch_dtype)
            cJSON_AddStringToObject(c, "torch_dtype", k_cases[i].torch_dtype);
        text = cJSON_Print(c);
        write_file(dir, "config.json", text);
        cJSON_free(text);
        cJSON_Delete(c);
        load_expect(dir, k_cases[i].code, k_cases[i].sub);
    }
    int dt = 0;
    cJSON *j = parse("{\"dtype\": \"half\"}");
    assert_int_equal(cfg_model_dtype(j, &dt, &e), 0);
    assert_int_equal(dt, DTYPE_F16);
    cJSON_Delete(j);
    j = parse("{\"torch_dtype\": \"float64\"}");
    assert_int_equal(cfg_model_dtype(j, &dt, &e), 0);
    assert_int_equal(dt, -1);
    cJSON_Delete(j);
    j = parse("{\"torch_dtype\": 16}");
    assert_int_equal(cfg_model_dtype(j, &dt, &e), -ERR_CONFIG);
    assert_non_null(strstr(e.msg, "torch_dtype"));
    cJSON_Delete(j);

    /* model_type alone picks the family: llama4 is refused though architectures names
     * LlamaForCausalLM; a missing one is an error whose hint comes from architectures */
    cJSON_DeleteItemFromObjectCaseSensitive(base, "model_type");
    text = cJSON_Print(base);
    write_file(dir, "config.json", text);
    cJSON_free(text);
    load_expect(dir, ERR_CONFIG, "no model_type");
    load_expect(dir, ERR_CONFIG, "\"model_type\": \"llama\"");
    cJSON_AddStringToObject(base, "model_type", "llama4");
    text = cJSON_Print(base);
    write_file(dir, "config.json", text);
    cJSON_free(text);
    load_expect(dir, ERR_UNSUPPORTED, "unsupported model_type 'llama4'");
    cJSON_Delete(base);
    remove_dir(dir);
}

static void bad_configs(void **state)
{
    (void)state;
    char *dir = copy_case("llama");
    write_file(dir, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 64}");
    load_expect(dir, ERR_CONFIG, "vocab_size");
    write_file(dir, "config.json", "{\"model_type\": \"mamba9\"}");
    load_expect(dir, ERR_UNSUPPORTED, "mamba9");
    write_file(dir, "config.json", "{not json");
    load_expect(dir, ERR_FORMAT, "not valid JSON");
    write_file(dir, "config.json",
               "{\"model_type\": \"llama\", \"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 176, "
               "\"max_position_embeddings\": 256, \"quantization\": {\"bits\": 7, \"group_size\": 64}}");
    load_expect(dir, ERR_CONFIG, "bits");
    /* a config whose shapes disagree with the weights: the tensor is named */
    write_file(dir, "config.json",
               "{\"model_type\": \"llama\", \"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 100, "
               "\"max_position_embeddings\": 256}");
    load_expect(dir, ERR_FORMAT, "mlp.gate_proj.weight");
    /* more layers than the checkpoint has: the missing tensor is named */
    write_file(dir, "config.json",
               "{\"model_type\": \"llama\", \"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 3, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 176, "
               "\"max_position_embeddings\": 256}");
    load_expect(dir, ERR_MISSING, "model.layers.2.");
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    load_expect(dir, ERR_MISSING, "config.json");
    remove_dir(dir);
}

/* cfg through every family's parse_config + hparams_validate, as model_load and fuzz_config
 * do. Under UBSan (the ASan build aborts on UB) an overflow in derived sizes fails here. */
static void parse_all_families(const cJSON *cfg)
{
    for (size_t i = 0; i < registry_count(); i++) {
        const struct registry_entry *r = registry_at(i);
        if (!r->ops)
            continue;
        struct hparams hp;
        struct err e = {0};
        hparams_init(&hp);
        if (r->ops->parse_config(&hp, cfg, &e) == 0 && hparams_validate(&hp, &e) == 0) {
            assert_true(hp.n_embd > 0 && hp.n_embd <= HP_MAX_DIM && hp.n_ff > 0 && hp.n_ff <= HP_MAX_DIM);
            assert_true(hp.head_dim > 0 && hp.head_dim <= HP_MAX_HEAD_DIM && hp.n_rot <= hp.head_dim);
        }
    }
}

/* The config fuzzer's seed corpus (fuzz/seeds/config: oversized and negative dimensions,
 * n_embd = 2^30, head_dim = 2^31 - 1, ...), then every dimension field of a valid
 * config set in turn to extreme values, through every family. */
static void oversized_dims(void **state)
{
    (void)state;
    const char *dir = test_path("fuzz/seeds/config");
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n_seeds = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".json"))
            continue;
        char path[4096], *text = NULL;
        size_t len = 0;
        struct err e = {0};
        cJSON *cfg = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        assert_int_equal(file_read_all(path, 1 << 20, &text, &len, &e), 0);
        assert_int_equal(cfg_parse(text, len, path, &cfg, &e), 0);
        parse_all_families(cfg);
        cJSON_Delete(cfg);
        free(text);
        n_seeds++;
    }
    closedir(d);
    assert_true(n_seeds >= 5);

    static const char *const fields[] = {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_head", "n_layer",
        "rotary_dim", "n_positions", "n_inner", "num_local_experts", "num_experts_per_tok",
        "sliding_window", "max_window_layers",
    };
    static const double values[] = {1073741824.0, 2147483647.0, -2147483648.0, -1.0, 0.0, 1048577.0};
    const char *base =
        "{\"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 128,"
        " \"n_embd\": 32, \"n_head\": 4, \"n_layer\": 2, \"rotary_dim\": 8, \"n_positions\": 128,"
        " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": 16}";
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            cJSON *cfg = parse(base);
            cJSON_DeleteItemFromObjectCaseSensitive(cfg, fields[f]);
            assert_non_null(cJSON_AddNumberToObject(cfg, fields[f], values[v]));
            parse_all_families(cfg);
            cJSON_Delete(cfg);
        }
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(oversized_dims),
    cmocka_unit_test(accessors),
    cmocka_unit_test(generation_config),
    cmocka_unit_test(dtype_and_model_type),
    cmocka_unit_test(bad_configs),
};

TEST_SUITE(config, tests);
