/*
 * selftest: helpers for family self-tests (selftest.h). Changed copies of
 * the fixtures are written with the library's own writers (st_write,
 * ck_config_write, convert_checkpoint) into temporary folders (stest_tmpdir),
 * so what the loader reads is what `mlxcel convert` would write.
 */
#include "selftest.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/st_write.h"
#include "../loading/config.h"
#include "../loading/convert.h"
#include "registry.h"

char *stest_tmpdir(void)
{
    char tmpl[] = "/tmp/mlxcel-st-XXXXXX";
    return mkdtemp(tmpl) ? strdup(tmpl) : NULL;
}

void stest_rmtree(char *dir)
{
    if (!dir)
        return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[4096];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (unlink(p) != 0)
                rmdir(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

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

int stest_parse_fails_all(const struct model_ops *ops, const struct stest_bad *cases, size_t n,
                          struct err *e)
{
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = stest_parse_fails(ops, cases[i].json, cases[i].substr, e);
    return rc;
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
    int rc = backend_cpu_new(&be, 1, "scalar", NULL, e);
    if (rc < 0)
        return rc;
    be->ops->moe_route(be, hp->router, sel, w, logits, 1, hp->n_expert, hp->n_expert_used,
                       hp->router_jitter);
    rc = backend_sync(be, e);
    backend_free(be);
    return rc;
}

int stest_route_softmax_top2(const struct hparams *hp, bool renorm, struct err *e)
{
    float logits[8] = {0.3f, -1.2f, 2.2f, 0.9f, 1.7f, -0.4f, 0.0f, 1.1f};
    int32_t sel[2];
    float w[2];
    int rc;
    if ((rc = stest_route(hp, logits, sel, w, e)) < 0)
        return rc;
    double z = 0.0;
    for (int i = 0; i < 8; i++)
        z += exp(logits[i]);
    double p2 = exp(2.2) / z, p4 = exp(1.7) / z, d = renorm ? p2 + p4 : 1.0;
    return stest_check(sel[0] == 2 && sel[1] == 4 && stest_near(w[0], p2 / d, 1e-6) &&
                           stest_near(w[1], p4 / d, 1e-6),
                       renorm ? "softmax, top-k, renormalize" : "softmax over all, top-k, not renormalized",
                       e);
}

// ---- changed copies of the golden fixtures ----

int stest_write_config(const char *src, const char *dst, const char *patch, struct err *e)
{
    char path[4200];
    cJSON *cfg = NULL, *p = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/config.json", src);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0)
        return rc;
    if (patch && (rc = cfg_parse(patch, strlen(patch), "config patch", &p, e)) < 0)
        goto out;
    for (const cJSON *it = p ? p->child : NULL; it; it = it->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, it->string);
        if (cJSON_IsString(it) && strcmp(it->valuestring, "$delete") == 0)
            continue;
        cJSON *copy = cJSON_Duplicate(it, true);
        if (!copy || !cJSON_AddItemToObject(cfg, it->string, copy)) {
            cJSON_Delete(copy);
            rc = err_setf(e, ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    rc = ck_config_write(dst, cfg, NULL, e);
out:
    cJSON_Delete(p);
    cJSON_Delete(cfg);
    return rc;
}

/* The tensors of checkpoint src, but drop, as one dst/model.safetensors. */
static int write_tensors(const char *src, const char *dst, const char *drop, struct err *e)
{
    char path[4200];
    struct st_set *s = NULL;
    struct st_writer *w = NULL;
    struct st_wentry *ents = NULL;
    size_t n = 0, k = 0;
    int rc;
    if ((rc = st_set_open(&s, src, e)) < 0)
        return rc;
    n = st_set_count(s);
    if (!(ents = calloc(n ? n : 1, sizeof *ents))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        if (drop && strcmp(t->name, drop) == 0)
            continue;
        ents[k] = (struct st_wentry){t->name, t->dtype, t->ndim, {0}};
        memcpy(ents[k++].shape, t->shape, sizeof t->shape);
    }
    if (drop && k == n) {
        rc = err_setf(e, ERR_ARG, "%s has no tensor '%s' to leave out", src, drop);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    if ((rc = st_writer_open(&w, path, ents, k, e)) < 0)
        goto out;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const struct st_tensor *t = st_set_at(s, i);
        if (!drop || strcmp(t->name, drop) != 0)
            rc = st_writer_write(w, t->data, (size_t)(t->end - t->begin), e);
    }
    rc = rc == 0 ? st_writer_close(w, e) : (st_writer_abort(w), rc);
out:
    free(ents);
    st_set_free(s);
    return rc;
}

int stest_load_variant(struct model **m, const char *fixture, const char *patch, const char *drop,
                       struct err *e)
{
    char src[512], *tmp;
    int rc;
    *m = NULL;
    snprintf(src, sizeof src, STEST_GOLDEN "%s", fixture);
    if (!patch && !drop)
        return model_load(m, src, e);
    if (!(tmp = stest_tmpdir()))
        return err_setf(e, ERR_IO, "cannot make a temporary folder");
    if ((rc = stest_write_config(src, tmp, patch, e)) == 0 && (rc = write_tensors(src, tmp, drop, e)) == 0)
        rc = model_load(m, tmp, e);
    stest_rmtree(tmp);
    return rc;
}

int stest_load_stacked(struct model **m, const char *fixture, struct err *e)
{
    return stest_load_stacked_without(m, fixture, NULL, e);
}

int stest_load_stacked_without(struct model **m, const char *fixture, const char *drop,
                               struct err *e)
{
    char src[512], *tmp = stest_tmpdir(), *tmp2 = NULL;
    const struct model_ops *ops = NULL;
    cJSON *cfg = NULL;
    int rc;
    *m = NULL;
    if (!tmp)
        return err_setf(e, ERR_IO, "cannot make a temporary folder");
    snprintf(src, sizeof src, STEST_GOLDEN "%s/config.json", fixture);
    if ((rc = cfg_load_file(src, FILE_FOLDER, &cfg, e)) == 0 && (rc = registry_resolve(cfg, &ops, e)) == 0) {
        snprintf(src, sizeof src, STEST_GOLDEN "%s", fixture);
        struct ck_view_rule vbuf[CK_MAX_VIEWS];
        struct convert_opts o = {src, tmp, ops->expert_stacking, NULL, -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        struct convert_stats st;
        if ((rc = model_convert_views(ops, cfg, vbuf, &o.views, e)) == 0 &&
            (rc = convert_checkpoint(&o, &st, e)) == 0 && drop) {
            /* the converted folder again, without drop */
            if (!(tmp2 = stest_tmpdir()))
                rc = err_setf(e, ERR_IO, "cannot make a temporary folder");
            else if ((rc = stest_write_config(tmp, tmp2, NULL, e)) == 0)
                rc = write_tensors(tmp, tmp2, drop, e);
        }
        if (rc == 0)
            rc = model_load(m, tmp2 ? tmp2 : tmp, e);
    }
    cJSON_Delete(cfg);
    stest_rmtree(tmp);
    if (tmp2)
        stest_rmtree(tmp2);
    return rc;
}

int stest_load_fails(const char *fixture, const char *patch, const char *drop, const char *substr,
                     struct err *e)
{
    struct model *m = NULL;
    struct err le = {0};
    int rc = stest_load_variant(&m, fixture, patch, drop, &le);
    model_free(m);
    if (rc == 0)
        return err_setf(e, ERR_INTERNAL, "%s: the variant loaded, expected an error about '%s'",
                        fixture, substr);
    if (!strstr(le.msg, substr))
        return err_setf(e, ERR_INTERNAL, "%s: error '%s' does not mention '%s'", fixture, le.msg,
                        substr);
    return 0;
}

int stest_missing_named(const char *fixture, const char *const *names, struct err *e)
{
    int rc = 0;
    for (const char *const *n = names; *n && rc == 0; n++)
        rc = stest_load_fails(fixture, NULL, *n, *n, e);
    return rc;
}

int stest_stacked_agrees(const char *fixture, const char *stacked_name, struct err *e)
{
    struct model *pub = NULL, *mlx = NULL;
    int rc;
    if ((rc = stest_load_variant(&pub, fixture, NULL, NULL, e)) == 0 && (rc = stest_load_stacked(&mlx, fixture, e)) == 0)
        rc = stest_check(st_set_find(mlx->st, stacked_name) && st_set_n_unused(pub->st) == 0 &&
                             st_set_n_unused(mlx->st) == 0 && stest_same_experts(pub, mlx),
                         "per-expert and stacked layouts bind identical expert views, every tensor", e);
    model_free(pub);
    model_free(mlx);
    return rc;
}

int stest_prompt_logits(struct model *m, float *out, struct err *e)
{
    static const int32_t ids[12] = {5, 17, 42, 7, 99, 3, 64, 21, 250, 8, 31, 77};
    struct backend *be = NULL;
    struct stest_run r;
    int rc;
    if ((rc = backend_cpu_new(&be, 1, NULL, NULL, e)) < 0)
        return rc;
    if ((rc = stest_run_open(&r, NULL, m, be, 16, e)) == 0) {
        rc = stest_run_feed(&r, ids, 12, false, out, e);
        stest_run_close(&r);
    }
    backend_free(be);
    return rc;
}

/* 0 when the logits differ by more than 1e-3 (and are finite); an error naming what otherwise. */
static int check_changed(const float *a, const float *b, int n, const char *what, struct err *e)
{
    double d = 0.0;
    for (int i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    if (d > 1e-3 && isfinite(d))
        return 0;
    return err_setf(e, ERR_INTERNAL, "self-test failed: %s does not change the logits (max diff %g)",
                    what, d);
}

int stest_edit_changes_logits(struct model *m, void (*edit)(struct model *m), const char *what,
                              struct err *e)
{
    int nv = m->hp.n_vocab, rc;
    float *l = malloc(2 * (size_t)nv * sizeof *l);
    if (!l)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = stest_prompt_logits(m, l, e)) == 0) {
        edit(m);
        if ((rc = stest_prompt_logits(m, l + nv, e)) == 0)
            rc = check_changed(l, l + nv, nv, what, e);
    }
    free(l);
    return rc;
}

int stest_patch_changes_logits(const char *fixture, const char *patch, struct err *e)
{
    struct model *a = NULL, *b = NULL;
    float *l = NULL;
    int rc;
    if ((rc = stest_load_variant(&a, fixture, NULL, NULL, e)) < 0 ||
        (rc = stest_load_variant(&b, fixture, patch, NULL, e)) < 0)
        goto out;
    int nv = a->hp.n_vocab;
    if (!(l = malloc(2 * (size_t)nv * sizeof *l))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = stest_prompt_logits(a, l, e)) == 0 && (rc = stest_prompt_logits(b, l + nv, e)) == 0)
        rc = check_changed(l, l + nv, nv, patch, e);
out:
    free(l);
    model_free(a);
    model_free(b);
    return rc;
}

int stest_all_bound(const char *fixture, const char *const *names, struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, fixture, NULL, NULL, e);
    if (rc < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0, "every tensor consumed", e);
    model_free(m);
    return rc < 0 ? rc : stest_missing_named(fixture, names, e);
}

/* The oldest tap of every conv layer zeroed (F32 [channels, K] ssm_conv, model-owned): only
 * positions before the current one see it. */
static void drop_oldest_tap(struct model *m)
{
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct tensor *w = &m->layers[il].ssm_conv;
        if (!tensor_is_present(w))
            continue;
        float *f = w->data;
        for (int64_t c = 0; c < w->shape[0]; c++)
            f[c * w->shape[1]] = 0.0f;
    }
}

int stest_conv_state_reaches_logits(const char *fixture, struct err *e)
{
    struct model *m = NULL;
    int rc;
    if ((rc = stest_load_variant(&m, fixture, NULL, NULL, e)) < 0)
        return rc;
    rc = stest_edit_changes_logits(m, drop_oldest_tap, "the conv state's oldest input", e);
    model_free(m);
    return rc;
}

static bool same_tensor(const struct tensor *a, const struct tensor *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype || (a->ndim > 0 && a->data == b->data))
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return memcmp(a->data, b->data, tensor_storage_bytes(a)) == 0;
}

static bool same_linear(const struct expert_linear *a, const struct expert_linear *b, int n_expert)
{
    if (!a->w != !b->w || !a->b != !b->b)
        return false;
    for (int x = 0; a->w && x < n_expert; x++)
        if (!same_tensor(&a->w[x], &b->w[x]) || (a->b && !same_tensor(&a->b[x], &b->b[x])))
            return false;
    return true;
}

bool stest_same_experts(const struct model *a, const struct model *b)
{
    if (a->hp.n_layer != b->hp.n_layer || a->hp.n_expert != b->hp.n_expert)
        return false;
    for (int il = 0; il < a->hp.n_layer; il++) {
        const struct experts *x = &a->layers[il].ex, *y = &b->layers[il].ex;
        if (!same_linear(&x->gate, &y->gate, a->hp.n_expert) || !same_linear(&x->up, &y->up, a->hp.n_expert) ||
            !same_linear(&x->down, &y->down, a->hp.n_expert))
            return false;
    }
    return true;
}
