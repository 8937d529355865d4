/*
 * selftest: helpers for family self-tests (selftest.h).
 */
#include "selftest.h"

#include <math.h>
#include <string.h>

#include <stdlib.h>

#include "../engine/batch.h"
#include "../engine/kvcache.h"
#include "../loading/config.h"

int stest_parse(const struct model_ops *ops, const char *json, struct hparams *hp, struct err *e)
{
    cJSON *cfg = NULL;
    int rc = cfg_parse(json, strlen(json), "config.json", &cfg, e);
    if (rc < 0)
        return rc;
    hparams_init(hp);
    rc = ops->parse_config(hp, cfg, e);
    if (rc == 0)
        rc = hparams_validate(hp, e);
    cJSON_Delete(cfg);
    return rc;
}

int stest_parse_fails(const struct model_ops *ops, const char *json, const char *substr,
                      struct err *e)
{
    struct hparams hp;
    struct err pe = {0};
    if (stest_parse(ops, json, &hp, &pe) == 0)
        return err_setf(e, ERR_INTERNAL, "%s: config was accepted, expected an error about '%s'",
                        ops->family, substr);
    if (!strstr(pe.msg, substr))
        return err_setf(e, ERR_INTERNAL, "%s: error '%s' does not mention '%s'", ops->family,
                        pe.msg, substr);
    return 0;
}

int stest_check(bool ok, const char *what, struct err *e)
{
    return ok ? 0 : err_setf(e, ERR_INTERNAL, "self-test failed: %s", what);
}

bool stest_near(double a, double b, double tol)
{
    return fabs(a - b) <= tol;
}

int stest_route(const struct hparams *hp, const float *logits, int32_t *sel, float *w, struct err *e)
{
    struct backend *be = NULL;
    int rc = backend_cpu_new(&be, 1, "scalar", e);
    if (rc < 0)
        return rc;
    be->ops->moe_route(be, hp->router, sel, w, logits, 1, hp->n_expert, hp->n_expert_used,
                       hp->router_jitter);
    rc = backend_sync(be, e);
    backend_free(be);
    return rc;
}

// ---- one-sequence runner ----

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
