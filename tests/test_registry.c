/*
 * registry: the family table itself. Every entry's ops are complete, every
 * alias points at a real family (not at another alias), names are unique,
 * unknown or missing types are rejected with the list of supported ones (even when
 * architectures names a known class, as transformers does), and every family's self-test passes.
 */
#include <stdio.h>
#include <string.h>

#include "loading/config.h"
#include "models/registry.h"
#include "test.h"

static void table_is_consistent(void **state)
{
    (void)state;
    assert_true(registry_count() > 0);
    for (size_t i = 0; i < registry_count(); i++) {
        const struct registry_entry *r = registry_at(i);
        for (size_t j = i + 1; j < registry_count(); j++)
            assert_string_not_equal(r->model_type, registry_at(j)->model_type);
        if (r->alias_of) {
            assert_null(r->ops);
            const struct model_ops *target = registry_find(r->alias_of);
            assert_non_null(target);
            for (size_t j = 0; j < registry_count(); j++)
                if (strcmp(registry_at(j)->model_type, r->alias_of) == 0)
                    assert_null(registry_at(j)->alias_of);
            continue;
        }
        const struct model_ops *ops = r->ops;
        assert_non_null(ops->family);
        assert_non_null(ops->description);
        assert_non_null(ops->parse_config);
        assert_non_null(ops->map_weights);
        assert_non_null(ops->forward);
        assert_ptr_equal(registry_find(r->model_type), ops);
    }
}

/* Every family's tests (src/models/<family>_tests.c, linked into this binary only):
 * the registry list expanded once more, so a family without tests does not link. */
#define MODEL(name, ops) int ops##_self_test(struct err *e);
#define ALIAS(name, to)
#include "models/registry.def"
#undef MODEL
#undef ALIAS

static const struct {
    const char *family;
    int (*test)(struct err *e);
} k_family_tests[] = {
#define MODEL(name, ops) {name, ops##_self_test},
#define ALIAS(name, to)
#include "models/registry.def"
#undef MODEL
#undef ALIAS
};

static void every_family_self_test_passes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_family_tests / sizeof k_family_tests[0]; i++) {
        struct err e = {0};
        int rc = k_family_tests[i].test(&e);
        if (rc != 0)
            fail_msg("family %s: %s", k_family_tests[i].family, e.msg);
        printf("self-test %-10s ok\n", k_family_tests[i].family);
    }
}

static int resolve(const char *json, const struct model_ops **ops, struct err *e)
{
    cJSON *cfg = NULL;
    int rc = cfg_parse(json, strlen(json), "config.json", &cfg, e);
    if (rc == 0)
        rc = registry_resolve(cfg, ops, e);
    cJSON_Delete(cfg);
    return rc;
}

static void detection(void **state)
{
    (void)state;
    const struct model_ops *ops = NULL;
    struct err e = {0};
    assert_int_equal(resolve("{\"model_type\": \"mistral\"}", &ops, &e), 0);
    assert_string_equal(ops->family, "llama");
    /* model_type alone decides, as transformers' AutoConfig: missing, it is an error whose
     * hint is the type the architectures suggest */
    assert_int_equal(resolve("{\"architectures\": [\"Qwen3ForCausalLM\"]}", &ops, &e), -ERR_CONFIG);
    assert_null(ops);
    assert_non_null(strstr(e.msg, "no model_type"));
    assert_non_null(strstr(e.msg, "\"model_type\": \"qwen3\""));
    /* an unknown model_type is refused even when architectures names a family we have */
    assert_int_equal(resolve("{\"model_type\": \"llama4\", \"architectures\": [\"LlamaForCausalLM\"]}", &ops,
                             &e), -ERR_UNSUPPORTED);
    assert_null(ops);
    assert_non_null(strstr(e.msg, "'llama4'"));
    assert_non_null(strstr(e.msg, "mlxcel arch"));
    assert_int_equal(resolve("{\"model_type\": 7}", &ops, &e), -ERR_CONFIG);
    /* unknown type: error lists the supported names */
    assert_int_equal(resolve("{\"model_type\": \"gpt-neo-x9\"}", &ops, &e), -ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "gpt-neo-x9"));
    assert_non_null(strstr(e.msg, "llama"));
    assert_non_null(strstr(e.msg, "qwen3"));
    assert_true(resolve("{}", &ops, &e) < 0);
    assert_non_null(strstr(e.msg, "model_type"));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(table_is_consistent),
    cmocka_unit_test(every_family_self_test_passes),
    cmocka_unit_test(detection),
};

TEST_SUITE(registry, tests);
