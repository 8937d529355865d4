/*
 * selftest: small helpers for the family self-tests (<family>_tests.c),
 * which the registry suite runs (test binary only). They parse
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

/* The routing op of a one-thread CPU backend for one token: hp's router kind, n_expert,
 * n_expert_used and jitter; 0 or the backend's error. */
int stest_route(const struct hparams *hp, const float *logits, int32_t *sel, float *w, struct err *e);

/* One model on one backend with a one-sequence cache, for tests that feed tokens
 * and read logits (the batch / KV plumbing in one place). */
struct stest_run {
    struct model *m;           /* owned when loaded by stest_run_open */
    struct model_ctx *c;
    struct kv_cache *kv;
    struct batch *b;
    int pos;                   /* tokens fed so far */
};
/* Load dir (or use m when dir is NULL: borrowed), prepare it for be, cache of n_tokens. */
int stest_run_open(struct stest_run *r, const char *dir, struct model *m, struct backend *be,
                   int n_tokens, struct err *e);
/* Feed n ids at the next positions: logits [n, n_vocab] when all, else [n_vocab] of the last. */
int stest_run_feed(struct stest_run *r, const int32_t *ids, int n, bool all, float *logits,
                   struct err *e);
void stest_run_close(struct stest_run *r);

#ifdef __cplusplus
}
#endif
