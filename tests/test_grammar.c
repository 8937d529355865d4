/*
 * grammar: structured output with real tokenizers. A constrained random walk
 * (random logits, mask, a random allowed id biased towards closing tokens so
 * documents end, accept, until end of sequence) must always produce text that
 * parses with cJSON and validates against the schema (a small validator below
 * for the supported subset), for many seeds and several schemas, with the
 * byte-level llama-tiny (2k) and Qwen3 (151k) vocabularies and the
 * SentencePiece llama2 one. tok_token_bytes must agree with tok_decode.
 * Unsupported keywords and hostile schemas must fail fast with the right code.
 * grammar/mask_cost prints the mean mask time per token (not asserted).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"
#include "grammar/grammar.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- fixtures ---- */

static struct tokenizer *load_tiny(void)
{
    struct tokenizer *t = NULL;
    struct err e = {0};
    if (tok_load(&t, test_path("models/llama-tiny"), &e) < 0)
        fail_msg("tok_load: %s", e.msg);
    return t;
}

/* ---- a validator for the supported subset ---- */

static const cJSON *resolve_ref(const cJSON *root, const char *ref)
{
    const cJSON *cur = root;
    char seg[256];
    const char *p = ref + 1;
    while (*p == '/') {
        size_t k = 0;
        for (p++; *p && *p != '/' && k + 1 < sizeof seg; p++)
            seg[k++] = *p;
        seg[k] = '\0';
        cur = cJSON_GetObjectItemCaseSensitive(cur, seg);
    }
    return cur;
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool type_ok(const cJSON *v, const char *t)
{
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    return false;
}

static bool valid(const cJSON *v, const cJSON *s, const cJSON *root, int depth);

static bool valid_object(const cJSON *v, const cJSON *s, const cJSON *root, int depth)
{
    const cJSON *props = cJSON_GetObjectItem(s, "properties"), *it;
    const cJSON *addl = cJSON_GetObjectItem(s, "additionalProperties");
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(s, "required"))
        if (!cJSON_GetObjectItemCaseSensitive(v, it->valuestring))
            return false;
    cJSON_ArrayForEach(it, v) {
        const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, it->string) : NULL;
        if (ps ? !valid(it, ps, root, depth + 1)
               : (cJSON_IsFalse(addl) || (cJSON_IsObject(addl) && !valid(it, addl, root, depth + 1))))
            return false;
    }
    return true;
}

static bool valid_array(const cJSON *v, const cJSON *s, const cJSON *root, int depth)
{
    const cJSON *pre = cJSON_GetObjectItem(s, "prefixItems"), *items = cJSON_GetObjectItem(s, "items");
    const cJSON *mn = cJSON_GetObjectItem(s, "minItems"), *mx = cJSON_GetObjectItem(s, "maxItems");
    int n = cJSON_GetArraySize(v), npre = pre ? cJSON_GetArraySize(pre) : 0;
    if ((mn && n < mn->valueint) || (mx && n > mx->valueint))
        return false;
    for (int i = 0; i < n; i++) {
        const cJSON *it = cJSON_GetArrayItem(v, i);
        const cJSON *sub = i < npre ? cJSON_GetArrayItem(pre, i) : items;
        if (cJSON_IsFalse(sub) || (cJSON_IsObject(sub) && !valid(it, sub, root, depth + 1)))
            return false;
    }
    return true;
}

static bool valid_scalar(const cJSON *v, const cJSON *s)
{
    const cJSON *b;
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        if ((b = cJSON_GetObjectItem(s, "minLength")) && n < (size_t)b->valueint)
            return false;
        if ((b = cJSON_GetObjectItem(s, "maxLength")) && n > (size_t)b->valueint)
            return false;
    }
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (((b = cJSON_GetObjectItem(s, "minimum")) && x < b->valuedouble) ||
            ((b = cJSON_GetObjectItem(s, "maximum")) && x > b->valuedouble) ||
            ((b = cJSON_GetObjectItem(s, "exclusiveMinimum")) && x <= b->valuedouble) ||
            ((b = cJSON_GetObjectItem(s, "exclusiveMaximum")) && x >= b->valuedouble))
            return false;
    }
    return true;
}

static bool valid(const cJSON *v, const cJSON *s, const cJSON *root, int depth)
{
    const cJSON *k, *it;
    if (depth > 100)
        return false;
    if (cJSON_IsTrue(s))
        return true;
    if ((k = cJSON_GetObjectItem(s, "$ref")))
        return valid(v, resolve_ref(root, k->valuestring), root, depth + 1);
    if ((k = cJSON_GetObjectItem(s, "anyOf")) || (k = cJSON_GetObjectItem(s, "oneOf"))) {
        cJSON_ArrayForEach(it, k)
            if (valid(v, it, root, depth + 1))
                return true;
        return false;
    }
    if ((k = cJSON_GetObjectItem(s, "enum"))) {
        cJSON_ArrayForEach(it, k)
            if (cJSON_Compare(v, it, true))
                return true;
        return false;
    }
    if ((k = cJSON_GetObjectItem(s, "const")))
        return cJSON_Compare(v, k, true);
    if ((k = cJSON_GetObjectItem(s, "type"))) {
        bool any = false;
        if (cJSON_IsString(k))
            any = type_ok(v, k->valuestring);
        if (cJSON_IsArray(k))
            cJSON_ArrayForEach(it, k)
                any |= type_ok(v, it->valuestring);
        if (!any)
            return false;
    }
    if (cJSON_IsObject(v))
        return valid_object(v, s, root, depth);
    if (cJSON_IsArray(v))
        return valid_array(v, s, root, depth);
    return valid_scalar(v, s);
}

/* ---- the constrained walk ---- */

struct walk_out {
    char text[1 << 16];
    size_t len;
    int n_tok;
    double mask_s;  /* time in mask */
};

/* Bytes that only close values: picked half of the time so that
 * random documents end. */
static bool closing(const char *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i] != '"' && p[i] != '}' && p[i] != ']')
            return false;
    return n > 0;
}

static void walk(const struct grammar *g, const struct tokenizer *t, uint64_t seed, int max_steps,
                 struct walk_out *o)
{
    struct grammar_state *st = NULL;
    struct err e = {0};
    int nv = tok_vocab_size(t) + 7;  /* the model's vocabulary may be padded */
    float *logits = malloc((size_t)nv * sizeof *logits);
    int32_t *ok = malloc((size_t)nv * sizeof *ok), *cl = malloc((size_t)nv * sizeof *cl);
    char buf[TOK_TOKEN_BYTES_MAX];
    struct rng r;
    rng_seed(&r, seed);
    assert_int_equal(grammar_state_new(&st, g, &e), 0);
    o->len = 0;
    o->n_tok = 0;
    o->mask_s = 0;
    int step = 0;
    for (; step < max_steps; step++) {
        for (int i = 0; i < nv; i++)
            logits[i] = (float)rng_uniform(&r);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        grammar_constraint_ops.mask(st, logits, nv);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        o->mask_s += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        int n_ok = 0, n_cl = 0;
        bool eos_ok = false;
        for (int i = 0; i < nv; i++) {
            if (isinf(logits[i]))
                continue;
            if (i == tok_eos_id(t))
                eos_ok = true;
            ok[n_ok++] = i;
            int n = tok_token_bytes(t, i, buf, sizeof buf);
            if (n > 0 && closing(buf, n))
                cl[n_cl++] = i;
        }
        if (n_ok == 0)
            fail_msg("seed %llu step %d: nothing allowed after '%.*s'", (unsigned long long)seed, step,
                     (int)o->len, o->text);
        int32_t id;
        if (eos_ok && (n_ok == 1 || rng_uniform(&r) < 0.5))
            id = tok_eos_id(t);
        else if (n_cl > 0 && rng_uniform(&r) < (step < 100 ? 0.5 : 0.95))
            id = cl[rng_next(&r) % (uint64_t)n_cl];
        else
            id = ok[rng_next(&r) % (uint64_t)n_ok];
        if (grammar_constraint_ops.accept(st, id) < 0)
            fail_msg("seed %llu: accept refused id %d that the mask allowed", (unsigned long long)seed, id);
        if (id == tok_eos_id(t))
            break;
        int n = tok_token_bytes(t, id, buf, sizeof buf);
        assert_true(n >= 0 && o->len + (size_t)n < sizeof o->text);
        memcpy(o->text + o->len, buf, (size_t)n);
        o->len += (size_t)n;
        o->n_tok++;
    }
    o->text[o->len] = '\0';
    if (step == max_steps)
        fail_msg("seed %llu: no end after %d tokens: ...%s", (unsigned long long)seed, max_steps, o->text + (o->len > 300 ? o->len - 300 : 0));
    assert_true(grammar_state_complete(st));
    assert_false(grammar_state_cut(st));
    grammar_state_free(st);
    free(logits);
    free(ok);
    free(cl);
}

/* Walks n_seeds times and checks each document against schema (NULL: any object). */
static void check_schema(const struct tokenizer *t, const char *schema_text, const char *prefix,
                         const char *suffix, int n_seeds)
{
    cJSON *schema = schema_text ? cJSON_Parse(schema_text) : NULL;
    struct grammar *g = NULL;
    struct err e = {0};
    int32_t eos = tok_eos_id(t);
    struct grammar_opts o = {.prefix = prefix, .suffix = suffix, .eos_ids = &eos, .n_eos = 1,
                             .any_object = !schema_text};
    assert_true(!schema_text || schema);
    if (grammar_compile(&g, schema, t, &o, &e) < 0)
        fail_msg("compile %s: %s", schema_text, e.msg);
    static struct walk_out w;
    size_t pl = prefix ? strlen(prefix) : 0, sl = suffix ? strlen(suffix) : 0;
    for (int seed = 1; seed <= n_seeds; seed++) {
        walk(g, t, (uint64_t)seed * 7919u, 3000, &w);
        assert_true(w.len >= pl + sl);
        assert_memory_equal(w.text, prefix ? prefix : "", pl);
        assert_memory_equal(w.text + w.len - sl, suffix ? suffix : "", sl);
        w.text[w.len - sl] = '\0';
        cJSON *doc = cJSON_Parse(w.text + pl);
        if (!doc)
            fail_msg("seed %d: does not parse: '%s'", seed, w.text + pl);
        if (schema ? !valid(doc, schema, schema, 0) : !cJSON_IsObject(doc))
            fail_msg("seed %d: does not validate: '%s'", seed, w.text + pl);
        cJSON_Delete(doc);
    }
    grammar_free(g);
    cJSON_Delete(schema);
}

static const char k_nested[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":3},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":5}},\"required\":[\"city\"],"
    "\"additionalProperties\":false},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"address\"],\"additionalProperties\":false}";
static const char k_enum_any[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"color\":{\"enum\":[\"red\",\"green\",\"blue\",1,null,\"r\\\"q\"]},\"kind\":{\"const\":\"fixed\"},"
    "\"v\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},"
    "{\"type\":\"string\",\"maxLength\":3},{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},"
    "\"required\":[\"x\"],\"additionalProperties\":false},"
    "{\"type\":\"object\",\"properties\":{\"y\":{\"type\":\"null\"}},\"additionalProperties\":false}]}},"
    "\"required\":[\"color\",\"kind\",\"v\"],\"additionalProperties\":false}";
static const char k_ref[] =
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"val\":{\"type\":\"integer\"},"
    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
    "\"required\":[\"val\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
static const char k_numbers[] =
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":-1.5,\"maximum\":2.25},"
    "\"b\":{\"type\":\"integer\",\"exclusiveMinimum\":10,\"maximum\":1000},"
    "\"c\":{\"type\":\"number\",\"exclusiveMaximum\":0},\"d\":{\"type\":\"number\"},"
    "\"e\":{\"type\":\"integer\",\"minimum\":-300,\"maximum\":-200}},"
    "\"required\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"additionalProperties\":false}";
static const char k_array[] =
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
    "\"items\":{\"type\":[\"boolean\",\"null\"]},\"minItems\":2,\"maxItems\":5}";
static const char k_addl[] =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},"
    "\"additionalProperties\":{\"type\":\"string\",\"maxLength\":4}}";

static const char *const k_schemas[] = {k_nested, k_enum_any, k_ref, k_numbers, k_array, k_addl};

static void walk_tiny(void **st)
{
    (void)st;
    struct tokenizer *t = load_tiny();
    for (size_t i = 0; i < sizeof k_schemas / sizeof k_schemas[0]; i++)
        check_schema(t, k_schemas[i], NULL, NULL, 40);
    check_schema(t, NULL, NULL, NULL, 40);
    check_schema(t, k_enum_any, "<tool_call>\n", "\n</tool_call>", 20);
    tok_free(t);
}

static void walk_qwen3(void **st)
{
    (void)st;
    struct tokenizer *t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/qwen3"));
    check_schema(t, k_nested, NULL, NULL, 8);
    check_schema(t, k_ref, NULL, NULL, 8);
    check_schema(t, NULL, NULL, NULL, 8);
    check_schema(t, k_enum_any, "<tool_call>\n", "\n</tool_call>", 8);
    tok_free(t);
}

static void walk_llama2_spm(void **st)
{
    (void)st;
    struct tokenizer *t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/llama2"));
    check_schema(t, k_nested, NULL, NULL, 10);
    check_schema(t, k_numbers, NULL, NULL, 10);
    check_schema(t, k_addl, "x", "y", 10);
    tok_free(t);
}

/* tok_token_bytes agrees with tok_decode: decode(a, ids) == decode(a) + bytes(ids). */
static void token_bytes_match_decode(void **st)
{
    (void)st;
    struct tokenizer *ts[3] = {load_tiny(), test_tok_load_gz(test_path("tests/fixtures/tokenizers/llama2")),
                               test_tok_load_gz(test_path("tests/fixtures/tokenizers/qwen3"))};
    struct rng r;
    rng_seed(&r, 42);
    for (int k = 0; k < 3; k++) {
        struct tokenizer *t = ts[k];
        int32_t *lead = NULL;
        size_t n_lead = 0;
        assert_int_equal(tok_encode(t, "a", 1, false, &lead, &n_lead, NULL), 0);
        assert_true(n_lead >= 1);
        char *pre = NULL;
        assert_int_equal(tok_decode(t, lead, n_lead, false, &pre, NULL), 0);
        for (int trial = 0; trial < 300; trial++) {
            int32_t ids[9];
            char want[9 * TOK_TOKEN_BYTES_MAX + 64], buf[TOK_TOKEN_BYTES_MAX];
            size_t wl = strlen(pre);
            memcpy(want, pre, wl);
            ids[0] = lead[n_lead - 1];
            for (int i = 1; i < 9; i++) {
                ids[i] = (int32_t)(rng_next(&r) % (uint64_t)tok_vocab_size(t));
                int n = tok_token_bytes(t, ids[i], buf, sizeof buf);
                if (n < 0)
                    n = 0, ids[i] = ids[0];
                if (n == 0 && ids[i] == ids[0])
                    n = tok_token_bytes(t, ids[0], buf, sizeof buf);
                memcpy(want + wl, buf, (size_t)n);
                wl += (size_t)n;
            }
            want[wl] = '\0';
            char *got = NULL;
            assert_int_equal(tok_decode(t, ids, 9, false, &got, NULL), 0);
            if (!strstr(got, "\xEF\xBF\xBD") && strlen(want) == wl)
                assert_string_equal(got, want);
            free(got);
        }
        free(pre);
        free(lead);
        tok_free(t);
    }
}

/* ---- errors and hostile schemas ---- */

static int compile_text(const struct tokenizer *t, const char *text, struct err *e)
{
    cJSON *s = cJSON_Parse(text);
    struct grammar *g = NULL;
    struct grammar_opts o = {0};
    assert_non_null(s);
    int rc = grammar_compile(&g, s, t, &o, e);
    grammar_free(g);
    cJSON_Delete(s);
    return rc;
}

static void unsupported(void **st)
{
    (void)st;
    struct tokenizer *t = load_tiny();
    struct err e = {0};
    assert_int_equal(compile_text(t, "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\","
                                     "\"pattern\":\"^a+$\"}}}", &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "'pattern'"));
    assert_non_null(strstr(e.msg, "/properties/x"));
    assert_int_equal(compile_text(t, "{\"if\":{\"type\":\"string\"},\"then\":{}}", &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "'if'"));
    assert_int_equal(compile_text(t, "{\"type\":\"strin\"}", &e), -ERR_ARG);
    assert_int_equal(compile_text(t, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", &e), -ERR_ARG);
    assert_int_equal(compile_text(t, "{\"type\":\"object\",\"required\":[\"a\"]}", &e), -ERR_ARG);
    assert_int_equal(compile_text(t, "{\"$ref\":\"http://x/y\"}", &e), -ERR_ARG);
    assert_int_equal(compile_text(t, "{\"enum\":[]}", &e), -ERR_ARG);
    assert_int_equal(compile_text(t, "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", &e), -ERR_ARG);
    tok_free(t);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void hostile(void **st)
{
    (void)st;
    struct tokenizer *t = load_tiny();
    struct grammar_vocab *v = NULL;
    struct err e = {0};
    struct grammar *g = NULL;
    assert_int_equal(grammar_vocab_new(&v, t, &e), 0);
    struct grammar_opts o = {.vocab = v};
    double t0 = now_s();
    /* 10^4-deep nesting, built without the parser (cJSON_Parse stops at 1000) */
    cJSON *deep = cJSON_CreateObject();
    for (int i = 0; i < 10000; i++) {
        cJSON *outer = cJSON_CreateObject();
        cJSON_AddItemToObject(outer, "items", deep);
        deep = outer;
    }
    assert_int_equal(grammar_compile(&g, deep, t, &o, &e), -ERR_RANGE);
    cJSON_Delete(deep);
    /* a 10^6-entry enum */
    int *nums = malloc(1000000 * sizeof *nums);
    for (int i = 0; i < 1000000; i++)
        nums[i] = i;
    cJSON *big = cJSON_CreateObject();
    cJSON_AddItemToObject(big, "enum", cJSON_CreateIntArray(nums, 1000000));
    free(nums);
    assert_int_equal(grammar_compile(&g, big, t, &o, &e), -ERR_RANGE);
    assert_non_null(strstr(e.msg, "'enum'"));
    cJSON_Delete(big);
    /* $ref cycles with no value in between */
    static const char *const cycles[] = {
        "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
        "{\"$ref\":\"#\"}",
        "{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},\"$ref\":\"#/$defs/a\"}",
    };
    /* each names the user's path of a $ref target in the cycle, not an internal node */
    static const char *const cycle_at[] = {
        "schema at /$defs/a: '$ref' cycle that never reaches a value (#/$defs/a -> #/$defs/b -> #/$defs/a)",
        "schema at /: '$ref' cycle that never reaches a value (# -> #)",
        "schema at /$defs/a: '$ref' cycle that never reaches a value (#/$defs/a -> #/$defs/a)",
    };
    for (size_t i = 0; i < sizeof cycles / sizeof cycles[0]; i++) {
        cJSON *s = cJSON_Parse(cycles[i]);
        assert_int_equal(grammar_compile(&g, s, t, &o, &e), -ERR_ARG);
        assert_string_equal(e.msg, cycle_at[i]);
        cJSON_Delete(s);
    }
    /* in a tool's parameters, the tool's path: tools[2].function.parameters.$defs.b */
    cJSON *cyc = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/b\"}},"
                             "\"$defs\":{\"b\":{\"anyOf\":[{\"$ref\":\"#/$defs/c\"}]},\"c\":{\"$ref\":\"#/$defs/b\"}}}");
    struct grammar_call call = {.name = "f", .params = cyc, .where = "tools[2].function.parameters"};
    struct grammar_opts oc = {.calls = &call, .n_calls = 1};
    assert_int_equal(grammar_compile(&g, NULL, t, &oc, &e), -ERR_ARG);
    assert_string_equal(e.msg, "schema at tools[2].function.parameters.$defs.b: '$ref' cycle that never reaches "
                               "a value (#/$defs/b -> #/$defs/c -> #/$defs/b)");
    cJSON_Delete(cyc);
    /* too many alternatives, too many properties */
    char txt[8192];
    size_t n = (size_t)snprintf(txt, sizeof txt, "{\"anyOf\":[");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(txt + n, sizeof txt - n, "%s{\"const\":%d}", i ? "," : "", i);
    snprintf(txt + n, sizeof txt - n, "]}");
    cJSON *s = cJSON_Parse(txt);
    assert_int_equal(grammar_compile(&g, s, t, &o, &e), -ERR_RANGE);
    cJSON_Delete(s);
    n = (size_t)snprintf(txt, sizeof txt, "{\"properties\":{");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(txt + n, sizeof txt - n, "%s\"k%d\":{}", i ? "," : "", i);
    snprintf(txt + n, sizeof txt - n, "}}");
    s = cJSON_Parse(txt);
    assert_int_equal(grammar_compile(&g, s, t, &o, &e), -ERR_RANGE);
    cJSON_Delete(s);
    /* a wide tree of $refs: each definition used many times, compiled once */
    n = (size_t)snprintf(txt, sizeof txt, "{\"$defs\":{");
    for (int i = 0; i < 20; i++)
        n += (size_t)snprintf(txt + n, sizeof txt - n,
                              "%s\"d%d\":{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#/$defs/d%d\"},"
                              "{\"$ref\":\"#/$defs/d%d\"}]}", i ? "," : "", i, i + 1, i + 1);
    n += (size_t)snprintf(txt + n, sizeof txt - n, ",\"d20\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/d0\"}");
    s = cJSON_Parse(txt);
    assert_non_null(s);
    assert_int_equal(grammar_compile(&g, s, t, &o, &e), 0);
    grammar_free(g);
    cJSON_Delete(s);
    double dt = now_s() - t0;
    assert_true(dt < 5.0);
    grammar_vocab_free(v);
    tok_free(t);
}

/* A required recursion deeper than the matcher can go: the mask still leaves
 * the end of sequence, never nothing. */
static void unreachable_end(void **st)
{
    (void)st;
    struct tokenizer *t = load_tiny();
    cJSON *s = cJSON_Parse("{\"$defs\":{\"a\":{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/a\"}},"
                           "\"required\":[\"x\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/a\"}");
    struct grammar *g = NULL;
    struct grammar_state *gs = NULL;
    struct err e = {0};
    assert_int_equal(grammar_compile(&g, s, t, NULL, &e), 0);
    assert_int_equal(grammar_state_new(&gs, g, &e), 0);
    int nv = tok_vocab_size(t);
    float *l = malloc((size_t)nv * sizeof *l);
    int steps = 0;
    for (; steps < 500; steps++) {
        for (int i = 0; i < nv; i++)
            l[i] = 0;
        grammar_constraint_ops.mask(gs, l, nv);
        int pick = -1;
        for (int i = 0; i < nv && pick < 0; i++)
            if (!isinf(l[i]))
                pick = i;
        assert_true(pick >= 0);
        assert_int_equal(grammar_constraint_ops.accept(gs, pick), 0);
        if (pick == tok_eos_id(t))
            break;
    }
    assert_true(steps < 500);
    assert_true(grammar_state_cut(gs));  /* the server says length, not stop */
    free(l);
    grammar_state_free(gs);
    grammar_free(g);
    cJSON_Delete(s);
    tok_free(t);
}

/* ---- numeric bounds: what compiles validates, what cannot be enforced is refused ---- */

/* Bounds at the edges of what a double and the output's digits hold: every walk's
 * document must validate (the validator compares as a double-based one does). */
static const char *const k_bound_ok[] = {
    "{\"type\":\"integer\",\"minimum\":1e15}",
    "{\"type\":\"integer\",\"maximum\":-1e15}",
    "{\"type\":\"integer\",\"minimum\":1e15,\"maximum\":1000000000000005}",
    "{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":-9007199254740985}",
    "{\"type\":\"integer\",\"exclusiveMinimum\":9007199254740990}",
    "{\"type\":\"integer\",\"minimum\":-1e300,\"maximum\":3}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1e-10}",
    "{\"type\":\"number\",\"minimum\":0.1,\"maximum\":0.100000000000001}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0.1,\"exclusiveMaximum\":0.10000000000002}",
    "{\"type\":\"number\",\"minimum\":123456.789,\"maximum\":123456.7891}",
    "{\"type\":\"number\",\"maximum\":-1e14}",
    "{\"type\":\"number\",\"minimum\":-1e300,\"maximum\":1e300}",
    "{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"exclusiveMaximum\":-0.4999999}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1e15},"
    "\"b\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1e-9}},"
    "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}",
};

/* Bounds no number the grammar writes can meet, or integer bounds a double does not hold
 * exactly: refused at compile time, naming the path. */
static const char *const k_bound_refused[] = {
    "{\"type\":\"integer\",\"minimum\":9007199254740993}",
    "{\"type\":\"integer\",\"maximum\":-9007199254740993}",
    "{\"type\":\"integer\",\"minimum\":1e19}",
    "{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1e-300}",
    "{\"type\":\"number\",\"minimum\":1e21}",
    "{\"type\":\"number\",\"maximum\":-1e20}",
    "{\"type\":\"number\",\"exclusiveMinimum\":0.1,\"exclusiveMaximum\":0.1000000000000001}",
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"minimum\":1e16}}}",
};

static void numeric_bounds(void **st)
{
    (void)st;
    struct tokenizer *t = load_tiny();
    struct err e = {0};
    for (size_t i = 0; i < sizeof k_bound_ok / sizeof k_bound_ok[0]; i++)
        check_schema(t, k_bound_ok[i], NULL, NULL, 60);
    for (size_t i = 0; i < sizeof k_bound_refused / sizeof k_bound_refused[0]; i++) {
        if (compile_text(t, k_bound_refused[i], &e) != -ERR_ARG)
            fail_msg("compiled: %s", k_bound_refused[i]);
        assert_non_null(strstr(e.msg, "schema at /"));
    }
    assert_non_null(strstr(e.msg, "/properties/x"));
    tok_free(t);
}

/* ---- forced tool calls ---- */

/* n tools named get_<letters>; tool i's one argument v is a $ref into its own $defs, an
 * integer in [10 i, 10 i + 5]: only the tool's own root resolves it to its own range. */
static cJSON *tool_params(int i)
{
    char txt[512];
    snprintf(txt, sizeof txt,
             "{\"type\":\"object\",\"properties\":{\"v\":{\"$ref\":\"#/$defs/val\"}},\"required\":[\"v\"],"
             "\"additionalProperties\":false,\"$defs\":{\"val\":{\"type\":\"integer\",\"minimum\":%d,"
             "\"maximum\":%d}}}", 10 * i, 10 * i + 5);
    return cJSON_Parse(txt);
}

static void forced_calls(void **st)
{
    (void)st;
    enum { N = 17 };
    struct tokenizer *t = load_tiny();
    struct grammar_call calls[GRAMMAR_MAX_CALLS + 1];
    char names[GRAMMAR_MAX_CALLS + 1][16], where[GRAMMAR_MAX_CALLS + 1][64];
    cJSON *params[GRAMMAR_MAX_CALLS + 1];
    for (int i = 0; i <= GRAMMAR_MAX_CALLS; i++) {
        snprintf(names[i], sizeof names[i], "get_%c%c", 'a' + i % 26, 'a' + i / 26);
        snprintf(where[i], sizeof where[i], "tools[%d].function.parameters", i);
        params[i] = tool_params(i);
        calls[i] = (struct grammar_call){.name = names[i], .params = params[i], .where = where[i]};
    }
    int32_t eos = tok_eos_id(t);
    struct grammar_opts o = {.prefix = "<tool_call>\n", .suffix = "\n</tool_call>", .eos_ids = &eos,
                             .n_eos = 1, .calls = calls, .n_calls = N};
    struct grammar *g = NULL;
    struct err e = {0};
    if (grammar_compile(&g, NULL, t, &o, &e) < 0)
        fail_msg("compile: %s", e.msg);
    static struct walk_out w;
    bool seen[N] = {0};
    for (int seed = 1; seed <= 120; seed++) {
        walk(g, t, (uint64_t)seed * 104729u, 3000, &w);
        w.text[w.len - strlen(o.suffix)] = '\0';
        cJSON *doc = cJSON_Parse(w.text + strlen(o.prefix));
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(doc, "arguments");
        if (!cJSON_IsString(name) || !cJSON_IsObject(args) || cJSON_GetArraySize(doc) != 2)
            fail_msg("seed %d: not a call: '%s'", seed, w.text);
        int k = 0;
        while (k < N && strcmp(names[k], name->valuestring) != 0)
            k++;
        assert_true(k < N);
        if (!valid(args, params[k], params[k], 0))
            fail_msg("seed %d: arguments do not validate against %s: '%s'", seed, names[k], w.text);
        seen[k] = true;
        cJSON_Delete(doc);
    }
    int n_seen = 0, n_late = 0;
    for (int k = 0; k < N; k++) {
        n_seen += seen[k];
        n_late += k >= 8 && seen[k];
    }
    assert_true(n_late > 0);  /* past the 8 parallel stacks an anyOf of calls could hold */
    assert_true(n_seen >= N / 2);
    grammar_free(g);
    /* the documented 128 tools compile, quickly; 129 do not */
    double t0 = now_s();
    o.n_calls = GRAMMAR_MAX_CALLS;
    o.args_key = "parameters";
    assert_int_equal(grammar_compile(&g, NULL, t, &o, &e), 0);
    grammar_free(g);
    assert_true(now_s() - t0 < 5.0);
    o.n_calls = GRAMMAR_MAX_CALLS + 1;
    assert_int_equal(grammar_compile(&g, NULL, t, &o, &e), -ERR_RANGE);
    /* errors name the caller's path of the tool, never an internal anyOf */
    cJSON_Delete(params[3]);
    params[3] = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"a\"}}}");
    calls[3].params = params[3];
    o.n_calls = N;
    assert_int_equal(grammar_compile(&g, NULL, t, &o, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "tools[3].function.parameters.properties.x"));
    assert_null(strstr(e.msg, "anyOf"));
    /* two tools of one name cannot be told apart */
    calls[3] = calls[4];
    assert_int_equal(grammar_compile(&g, NULL, t, &o, &e), -ERR_ARG);
    for (int i = 0; i <= GRAMMAR_MAX_CALLS; i++)
        cJSON_Delete(params[i]);
    tok_free(t);
}

/* ---- cost ---- */

static void mask_cost(void **st)
{
    (void)st;
    static const char *const names[] = {"tests/fixtures/tokenizers/qwen3", "tests/fixtures/tokenizers/llama2"};
    for (int k = 0; k < 2; k++) {
        struct tokenizer *t = test_tok_load_gz(test_path(names[k]));
        struct grammar_vocab *v = NULL;
        struct err e = {0};
        double t0 = now_s();
        assert_int_equal(grammar_vocab_new(&v, t, &e), 0);
        double t_voc = now_s() - t0;
        static const char *const sch[] = {k_nested, NULL};
        for (int j = 0; j < 2; j++) {
            cJSON *s = sch[j] ? cJSON_Parse(sch[j]) : NULL;
            int32_t eos = tok_eos_id(t);
            struct grammar_opts o = {.vocab = v, .eos_ids = &eos, .n_eos = 1, .any_object = !s};
            struct grammar *g = NULL;
            assert_int_equal(grammar_compile(&g, s, t, &o, &e), 0);
            static struct walk_out w;
            double tot = 0;
            int toks = 0;
            for (int seed = 1; seed <= 5; seed++) {
                walk(g, t, (uint64_t)seed, 3000, &w);
                tot += w.mask_s;
                toks += w.n_tok + 1;
            }
            printf("grammar mask: %-34s vocab %6d (trie built in %.0f ms) %-12s %.3f ms/token over %d tokens\n",
                   names[k], tok_vocab_size(t), 1e3 * t_voc, j ? "json_object" : "nested",
                   1e3 * tot / toks, toks);
            grammar_free(g);
            cJSON_Delete(s);
        }
        grammar_vocab_free(v);
        tok_free(t);
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(token_bytes_match_decode),
    cmocka_unit_test(walk_tiny),
    cmocka_unit_test(walk_qwen3),
    cmocka_unit_test(walk_llama2_spm),
    cmocka_unit_test(unsupported),
    cmocka_unit_test(hostile),
    cmocka_unit_test(unreachable_end),
    cmocka_unit_test(numeric_bounds),
    cmocka_unit_test(forced_calls),
    cmocka_unit_test(mask_cost),
};

TEST_SUITE(grammar, tests);
