/*
 * selftest: small helpers for the family self-tests (<family>_tests.c),
 * which the registry suite runs (test binary only). They parse
 * config.json text through a family's parse_config + hparams_validate, so a
 * family's normalization rules are tested without files; load changed copies
 * of the golden fixtures (a config key replaced, a tensor left out), so its
 * weight mapping is tested against the published layout; and run a fixed
 * prompt through a model, so a test can show that a config field or a
 * layer_spec field changes what the forward computes. Fixture names are
 * folders under tests/fixtures/golden/ (the tests run from the repo root).
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
/* A config that must be rejected, and what its error must mention (the field). */
struct stest_bad {
    const char *json;
    const char *substr;
};
/* stest_parse_fails for each of the n cases; the first failure names its case. */
int stest_parse_fails_all(const struct model_ops *ops, const struct stest_bad *cases, size_t n,
                          struct err *e);
/* 0 when ok; otherwise an error "what" (for chaining in a test body). */
int stest_check(bool ok, const char *what, struct err *e);
/* Float comparison within tol. */
bool stest_near(double a, double b, double tol);

/* The routing op of a one-thread CPU backend for one token: hp's router kind, n_expert,
 * n_expert_used and jitter; 0 or the backend's error. */
int stest_route(const struct hparams *hp, const float *logits, int32_t *sel, float *w, struct err *e);

/* hp's router (softmax over all experts, top 2) on a fixed 8-logit vector: picks experts 2
 * and 4 with softmax weights over all 8, renormalized over the two when renorm. */
int stest_route_softmax_top2(const struct hparams *hp, bool renorm, struct err *e);

/* ---- calls into the engine ----
 * models sits below engine, so these are defined in the test binary
 * (tests/stest_engine.c) and this header needs only the engine's struct names. */
struct kv_cache;
struct batch;

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
/* The rows of the KV cache m gets on a one-thread CPU backend (64 tokens, one sequence, f32):
 * per layer il (m->hp.n_layer of them, caller's arrays) its K row width and whether V shares
 * K's row (a latent layer). 0 or the backend's / the cache's error. */
int stest_kv_rows(const struct model *m, int *k_dim, bool *v_is_k, struct err *e);

/* ---- changed copies of the golden fixtures ---- */

#define STEST_GOLDEN "tests/fixtures/golden/"
/* A fresh folder /tmp/mlxcel-st-XXXXXX (malloc'd path), or NULL. */
char *stest_tmpdir(void);
/* Remove the files in dir (one level deep) and dir, and free the path (NULL: no-op). */
void stest_rmtree(char *dir);

/* Load golden fixture `fixture` changed: the keys of patch (a JSON object text; NULL: none)
 * replace or add config.json keys, and its tensors are rewritten without `drop` (NULL: all;
 * a name the fixture lacks is an error). The copy is a temporary folder removed before
 * returning (the model keeps its mappings); with neither change the fixture itself loads.
 * 0 and *m (caller frees), or model_load's error. */
int stest_load_variant(struct model **m, const char *fixture, const char *patch, const char *drop,
                       struct err *e);
/* Load golden fixture `fixture` converted to mlx-lm's stacked expert layout (`mlxcel convert`
 * with its family's expert_stacking, float), from a temporary folder removed before returning. */
int stest_load_stacked(struct model **m, const char *fixture, struct err *e);
/* stest_load_stacked, the converted checkpoint's tensor drop (its stacked name) left out. */
int stest_load_stacked_without(struct model **m, const char *fixture, const char *drop,
                               struct err *e);
/* 0 when loading that variant fails with a message containing substr; an error otherwise. */
int stest_load_fails(const char *fixture, const char *patch, const char *drop, const char *substr,
                     struct err *e);
/* 0 when leaving out each of names (NULL-terminated) in turn makes fixture fail to load with
 * an error naming that tensor. */
int stest_missing_named(const char *fixture, const char *const *names, struct err *e);
/* 0 when fixture and its stacked conversion (stest_load_stacked), which must hold the tensor
 * stacked_name, consume every tensor and bind byte-identical expert views. */
int stest_stacked_agrees(const char *fixture, const char *stacked_name, struct err *e);
/* Last-position logits ([n_vocab], caller's) of m for a fixed 12-token prompt, one-thread CPU.
 * m's layer specs may be changed between calls (each call makes a fresh context). */
int stest_prompt_logits(struct model *m, float *out, struct err *e);
/* 0 when edit(m), which changes m (its layer specs), changes m's prompt logits by more than
 * 1e-3 (so the forward reads what edit changed); an error naming what otherwise. */
int stest_edit_changes_logits(struct model *m, void (*edit)(struct model *m), const char *what,
                              struct err *e);
/* 0 when the config patch changes fixture's prompt logits by more than 1e-3 (the field reaches
 * the forward); an error naming the patch otherwise. */
int stest_patch_changes_logits(const char *fixture, const char *patch, struct err *e);
/* 0 when fixture loads with every tensor consumed and leaving out each of names (as
 * stest_missing_named) fails naming it. */
int stest_all_bound(const char *fixture, const char *const *names, struct err *e);
/* src/config.json with the keys of patch (a JSON object) replaced or added, or removed where
 * the value is the string "$delete", written to dst/config.json. */
int stest_write_config(const char *src, const char *dst, const char *patch, struct err *e);
/* 0 when zeroing the oldest tap of every conv layer (ssm_conv) of fixture changes its prompt
 * logits: the convolution's carried state reaches the forward. */
int stest_conv_state_reaches_logits(const char *fixture, struct err *e);
/* Every expert view of every layer (gate, up, down; weights and biases) of a and b has the
 * same dtype, shape and bytes, and the two models' views are distinct memory. */
bool stest_same_experts(const struct model *a, const struct model *b);

#ifdef __cplusplus
}
#endif
