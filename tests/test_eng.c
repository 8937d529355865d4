/*
 * test_eng: the engine set-up the golden and batch suites share (test.h):
 * a model loaded and prepared, an activation context, a paged KV cache and
 * a batch.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/batch.h"
#include "engine/kvcache.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "test.h"

enum dtype test_kv_dtype = DTYPE_F32;

void test_eng_open(struct test_eng *g, const char *dir, struct backend *be, int n_batch, int n_tokens,
                   int max_seqs, int block)
{
    struct err e = {0};
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = max_seqs, .block_size = block,
                           .dtype = test_kv_dtype};
    memset(g, 0, sizeof *g);
    g->own_be = !be;
    g->be = be;
    g->b = calloc(1, sizeof *g->b);
    assert_non_null(g->b);
    if ((!be && test_backend_new(&g->be, 2, &e) < 0) || model_load(&g->m, dir, &e) < 0 ||
        model_prepare(g->m, g->be, &e) < 0 || model_ctx_new(&g->c, g->m, g->be, n_batch, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
    /* the sliding pool sized for the context's chunks, as the CLI sizes it (ADR 0023) */
    kp.n_batch = g->c->n_batch;
    if (kv_cache_new(&g->kv, g->m, g->be, &kp, &e) < 0 || batch_init(g->b, 512, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
}

bool test_model_any_matrix(const struct model *m, bool (*pred)(const struct tensor *t))
{
    if (pred(&m->lm_head))
        return true;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct layer *l = &m->layers[il];
#define MATRIX(name) &l->name,
        const struct tensor *mats[] = {LAYER_MATRICES(MATRIX)};
#undef MATRIX
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++)
            if (pred(mats[k]))
                return true;
        const struct expert_linear *el[] = {&l->ex.up, &l->ex.gate, &l->ex.down, &l->ex.gate_up};
        for (size_t k = 0; k < 4; k++)
            if (el[k]->w && pred(&el[k]->w[0]))
                return true;
    }
    return false;
}

void test_eng_close(struct test_eng *g)
{
    batch_free(g->b);
    free(g->b);
    kv_cache_free(g->kv);
    model_ctx_free(g->c);
    model_free(g->m);
    if (g->own_be)
        backend_free(g->be);
    memset(g, 0, sizeof *g);
}

void test_model_open(struct test_model *f, const char *dir)
{
    struct err e = {0};
    memset(f, 0, sizeof *f);
    if (test_backend_new(&f->be, 2, &e) < 0 || model_load(&f->m, test_path(dir), &e) < 0 ||
        model_prepare(f->m, f->be, &e) < 0 || model_ctx_new(&f->c, f->m, f->be, 0, &e) < 0)
        fail_msg("%s: %s", dir, e.msg);
}

void test_model_close(struct test_model *f)
{
    model_ctx_free(f->c);
    model_free(f->m);
    backend_free(f->be);
    memset(f, 0, sizeof *f);
}

struct kv_cache *test_kv_new(const struct test_model *f, int n_tokens, int max_seqs, int block)
{
    struct err e = {0};
    struct kv_cache *kv = NULL;
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = max_seqs, .block_size = block,
                           .dtype = DTYPE_F32, .n_batch = f->c->n_batch};
    if (kv_cache_new(&kv, f->m, f->be, &kp, &e) < 0)
        fail_msg("%s", e.msg);
    return kv;
}
