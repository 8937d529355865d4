/*
 * selftest: small helpers for the family self-tests (<family>_tests.c),
 * which run through model_ops.self_test from the registry suite. They parse
 * config.json text through a family's parse_config + hparams_validate, so a
 * family's normalization rules are tested without files.
 */
#pragma once
#include <stdbool.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse JSON text as config.json for ops (hparams_init, parse_config, validate). */
int stest_parse(const struct model_ops *ops, const char *json, struct hparams *hp, struct err *e);
/* 0 when parsing fails with a message containing substr; an error otherwise. */
int stest_parse_fails(const struct model_ops *ops, const char *json, const char *substr,
                      struct err *e);
/* 0 when ok; otherwise an error "what" (for chaining in a test body). */
int stest_check(bool ok, const char *what, struct err *e);
/* Float comparison within tol. */
bool stest_near(double a, double b, double tol);

#ifdef __cplusplus
}
#endif
