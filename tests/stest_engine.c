/*
 * stest_engine: the family self-tests' calls into the engine (declared in
 * src/models/selftest.h). They live here, in the test binary, because models
 * sits below engine: the self-tests under src/models/ include nothing from
 * src/engine/ (tests/cli/src_includes.sh checks the layer order).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/batch.h"
#include "engine/kvcache.h"
#include "models/selftest.h"

int stest_run_open(struct stest_run *r, const char *dir, struct model *m, struct backend *be,
                   int n_tokens, struct err *e)
{
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = 1, .dtype = DTYPE_F32};
    int rc;
    memset(r, 0, sizeof *r);
    r->b = calloc(1, sizeof *r->b);
    if (!r->b)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((dir && (rc = model_load(&r->m, dir, e)) < 0) ||
        (rc = model_prepare(dir ? r->m : m, be, e)) < 0 ||
        (rc = model_ctx_new(&r->c, dir ? r->m : m, be, 0, e)) < 0 ||
        (rc = kv_cache_new(&r->kv, dir ? r->m : m, be, &kp, e)) < 0 ||
        (rc = batch_init(r->b, n_tokens, e)) < 0 || (rc = kv_seq_add(r->kv, 0, e)) < 0) {
        stest_run_close(r);
        return rc;
    }
    return 0;
}

int stest_run_feed(struct stest_run *r, const int32_t *ids, int n, bool all, float *logits,
                   struct err *e)
{
    int rc;
    batch_clear(r->b);
    for (int i = 0; i < n; i++)
        if ((rc = batch_add(r->b, ids[i], r->pos + i, 0, all || i == n - 1, e)) < 0)
            return rc;
    if ((rc = model_forward(r->c, r->b, r->kv, logits, e)) < 0)
        return rc;
    r->pos += n;
    return 0;
}

void stest_run_close(struct stest_run *r)
{
    if (r->b)
        batch_free(r->b);
    free(r->b);
    kv_cache_free(r->kv);
    model_ctx_free(r->c);
    model_free(r->m);
    memset(r, 0, sizeof *r);
}

int stest_kv_rows(const struct model *m, int *k_dim, bool *v_is_k, struct err *e)
{
    struct backend *be = NULL;
    struct kv_cache *kv = NULL;
    struct kv_params kp = {.n_tokens = 64, .max_seqs = 1, .dtype = DTYPE_F32};
    int rc;
    if ((rc = backend_cpu_new(&be, 1, "scalar", NULL, e)) == 0 &&
        (rc = kv_cache_new(&kv, m, be, &kp, e)) == 0)
        for (int il = 0; il < kv->n_layer; il++) {
            k_dim[il] = kv->layers[il].k_dim;
            v_is_k[il] = kv->layers[il].v == kv->layers[il].k;
        }
    kv_cache_free(kv);
    backend_free(be);
    return rc;
}
