/*
 * model: loading a checkpoint folder into the canonical layout, and the
 * per-request context (KV cache + activation arena) that runs it.
 *
 * model_load: config.json -> registry -> parse_config -> quantization and
 * generation_config.json -> hparams_validate -> st_set_open -> map_weights.
 * Weights are never copied: every slot is a view into the mmap.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/log.h"
#include "../loading/config.h"
#include "../loading/convert.h"
#include "registry.h"

/* ---- loading ---- */

/* generation_config.json (optional): eos ids override config.json; sampling defaults. */
static int parse_generation(struct model *m, const char *dir, struct err *e)
{
    char path[4200];
    struct generation_defaults *g = &m->gen;
    g->temperature = -1.0f;
    g->top_p = -1.0f;
    g->top_k = -1;
    g->min_p = -1.0f;
    g->repeat_penalty = -1.0f;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    cJSON *cfg = NULL;
    int rc, n = 0;
    bool do_sample;
    int32_t ids[HP_MAX_EOS];
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) == -ERR_MISSING) {
        err_clear(e);  /* optional */
        return 0;
    }
    if (rc < 0)
        return rc;
    if ((rc = cfg_opt_ids(cfg, "eos_token_id", ids, HP_MAX_EOS, &n, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "do_sample", false, &do_sample, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "temperature", -1.0f, &g->temperature, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "top_p", -1.0f, &g->top_p, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "top_k", -1, &g->top_k, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "min_p", -1.0f, &g->min_p, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "repetition_penalty", -1.0f, &g->repeat_penalty, e)) < 0) {
        cJSON_Delete(cfg);
        return err_prefix(e, "%s", path);
    }
    /* transformers samples only with do_sample; otherwise its default is greedy */
    if (!do_sample)
        g->temperature = 0.0f;
    if (n > 0) {
        memcpy(m->hp.eos_ids, ids, (size_t)n * sizeof ids[0]);
        m->hp.n_eos = n;
    }
    cJSON_Delete(cfg);
    return 0;
}

static int parse_common_ids(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = cfg_opt_int(cfg, "bos_token_id", -1, &hp->bos_id, e)) < 0)
        return rc;
    return cfg_opt_ids(cfg, "eos_token_id", hp->eos_ids, HP_MAX_EOS, &hp->n_eos, e);
}

/* Drop eos ids that cannot be produced (outside the vocabulary). */
static void filter_eos(struct hparams *hp)
{
    int n = 0;
    for (int i = 0; i < hp->n_eos; i++) {
        if (hp->eos_ids[i] >= 0 && hp->eos_ids[i] < hp->n_vocab)
            hp->eos_ids[n++] = hp->eos_ids[i];
        else
            LOG_WARN("ignoring eos_token_id %d outside the vocabulary", hp->eos_ids[i]);
    }
    hp->n_eos = n;
}

/* Tensors the family did not map usually mean the config and the checkpoint disagree (fewer
 * layers declared than stored, a renamed module): say so at the default level, with names. */
static void warn_unused(const struct model *m)
{
    size_t n = st_set_n_unused(m->st), shown = 0;
    if (n == 0)
        return;
    char names[256] = "";
    for (size_t i = 0; i < st_set_count(m->st) && shown < 3; i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (t->consumed)
            continue;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s'%s'", shown ? ", " : "", t->name);
        shown++;
    }
    LOG_WARN("%zu checkpoint tensors are not used by the %s config (%s%s): does config.json "
             "match the checkpoint? (see `mlxcel inspect`)", n, m->ops->family, names,
             n > shown ? ", ..." : "");
}

int model_load(struct model **out, const char *dir, struct err *e)
{
    char path[4200];
    cJSON *cfg = NULL;
    int rc;
    *out = NULL;
    if (strlen(dir) >= sizeof((struct model *)0)->dir)
        return err_setf(e, ERR_ARG, "model path is too long");
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return err_setf(e, ERR_NOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);

    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0)
        goto fail;
    if ((rc = registry_resolve(cfg, &m->ops, e)) < 0)
        goto fail_prefix;
    hparams_init(&m->hp);
    if ((rc = cfg_opt_str(cfg, "model_type", "", m->hp.model_type, sizeof m->hp.model_type, e)) < 0 ||
        (rc = m->ops->parse_config(&m->hp, cfg, e)) < 0 ||
        (rc = parse_common_ids(&m->hp, cfg, e)) < 0 ||
        (rc = qconfig_parse(&m->hp.quant, cfg, e)) < 0)
        goto fail_prefix;
    if ((rc = parse_generation(m, dir, e)) < 0)
        goto fail;
    if ((rc = hparams_validate(&m->hp, e)) < 0)
        goto fail_prefix;
    filter_eos(&m->hp);
    cJSON_Delete(cfg);
    cfg = NULL;

    if ((rc = st_set_open(&m->st, dir, e)) < 0)
        goto fail;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = m->ops->map_weights(m, m->st, e)) < 0) {
        err_prefix(e, "%s", dir);
        goto fail;
    }
    warn_unused(m);
    *out = m;
    return 0;

fail_prefix:
    err_prefix(e, "%s", path);
fail:
    cJSON_Delete(cfg);
    model_free(m);
    return rc;
}

int model_alloc_owned(struct model *m, size_t bytes, void **out, struct err *e)
{
    void **list = realloc(m->owned, (m->n_owned + 1) * sizeof *list);
    if (!list)
        return err_setf(e, ERR_NOMEM, "out of memory for an owned weight");
    m->owned = list;
    if (!(*out = malloc(bytes ? bytes : 1)))
        return err_setf(e, ERR_NOMEM, "out of memory for an owned weight of %zu bytes", bytes);
    m->owned[m->n_owned++] = *out;
    return 0;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    st_set_free(m->st);
    free(m->layers);
    free(m->expert_views);
    free(m->derived);
    qconfig_free(&m->hp.quant);
    free(m);
}

int64_t model_n_params(const struct model *m)
{
    int64_t n = 0;
    for (size_t i = 0; i < st_set_count(m->st); i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (!t->consumed)
            continue;
        int64_t k = 1;
        for (int d = 0; d < t->ndim; d++)
            k *= t->shape[d];
        /* packed quantized words hold 32 / bits weights (wmap checked the
         * bits against the shapes); scales and biases are bookkeeping, not
         * parameters */
        size_t len = strlen(t->name);
        bool qaux = t->dtype != DTYPE_U32 && len > 7 &&
                    (strcmp(t->name + len - 7, ".scales") == 0 || strcmp(t->name + len - 7, ".biases") == 0);
        if (qaux)
            continue;
        if (t->dtype == DTYPE_U32 && len > 7 && strcmp(t->name + len - 7, ".weight") == 0) {
            char path[QCFG_MAX_PATH];
            snprintf(path, sizeof path, "%.*s", (int)(len - 7), t->name);
            struct qparams p = qconfig_resolve(&m->hp.quant, path);
            if (p.bits > 0)
                k = k * 32 / p.bits;
        }
        n += k;
    }
    return n;
}

uint64_t model_weight_bytes(const struct model *m)
{
    uint64_t b = 0;
    for (size_t i = 0; i < st_set_count(m->st); i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (t->consumed)
            b += t->end - t->begin;
    }
    return b;
}

static int prepare_one(struct backend *be, struct tensor *t, struct err *e)
{
    return tensor_is_present(t) ? be->ops->prepare_weight(be, t, e) : 0;
}

int model_weights_to_anon(struct model *m, struct err *e)
{
    if (m->weights_anon || !m->st)
        return 0;
    int rc = st_set_to_anon(m->st, e);
    m->weights_anon = rc == 0;
    return rc;
}

int model_prepare(struct model *m, struct backend *be, struct err *e)
{
    int rc;
    struct tensor *head[] = {&m->tok_embd, &m->out_norm, &m->out_norm_b, &m->lm_head, &m->lm_head_b};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        if ((rc = prepare_one(be, head[i], e)) < 0)
            return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
#define LAYER_PTR(name) &L->name,
        struct tensor *ts[] = {LAYER_TENSORS(LAYER_PTR)};
#undef LAYER_PTR
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            /* sinks are read on the host (model_ctx_new uploads them widened), never by an op */
            if (ts[i] != &L->sinks && (rc = prepare_one(be, ts[i], e)) < 0)
                return rc;
    }
    /* MLA per-head views */
    for (int il = 0; il < m->hp.n_layer; il++)
        for (int i = 0; m->layers[il].mla_heads && i < 4 * m->hp.n_head; i++)
            if ((rc = prepare_one(be, &m->layers[il].mla_heads[i], e)) < 0)
                return rc;
    /* expert views of every layer live in one store */
    for (size_t i = 0; i < m->expert_views_used; i++)
        if ((rc = prepare_one(be, &m->expert_views[i], e)) < 0)
            return rc;
    return 0;
}

int model_convert_views(const struct model_ops *ops, const cJSON *cfg, struct ck_view_rule *out,
                        const struct ck_view_rule **views, struct err *e)
{
    struct hparams hp;
    int rc;
    *views = NULL;
    if (!ops->convert_views)
        return 0;
    hparams_init(&hp);
    if ((rc = ops->parse_config(&hp, cfg, e)) < 0)
        return rc;
    ops->convert_views(&hp, out);
    *views = out;
    return 0;
}

void model_kv_sizes(const struct model *m, struct model_kv_sizes *out)
{
    const struct hparams *hp = &m->hp;
    memset(out, 0, sizeof *out);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        uint64_t row = ls->kv == KV_LATENT ? (uint64_t)(hp->kv_lora_rank + hp->qk_rope_dim)
                                           : 2ull * hp->n_kv_head * hp->head_dim;
        if (ls->kv == KV_SLIDING && ls->window > 0) {
            out->n_swa++;
            out->swa_per_token += row * sizeof(float);
            out->window = ls->window > out->window ? ls->window : out->window;
        } else {
            out->n_full++;
            out->full_per_token += row * sizeof(float);
        }
    }
}

uint64_t model_kv_bytes_per_token(const struct model *m)
{
    struct model_kv_sizes z;
    model_kv_sizes(m, &z);
    return z.full_per_token + z.swa_per_token;
}

int model_kv_window_positions(int window, int n_tokens, int block_size)
{
    int64_t most = ((int64_t)(window + block_size - 1) / block_size + 1) * block_size;
    return most < n_tokens ? (int)most : n_tokens;
}

uint64_t model_kv_bytes(const struct model *m, int n_tokens, int block_size)
{
    struct model_kv_sizes z;
    model_kv_sizes(m, &z);
    return z.full_per_token * (uint64_t)n_tokens +
           z.swa_per_token * (uint64_t)model_kv_window_positions(z.window, n_tokens, block_size);
}
