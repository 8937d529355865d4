/*
 * registry: the lookup table generated from registry.def (X-macro). No other
 * code lists families or switches on them.
 */
#include "registry.h"

#include <stdio.h>
#include <string.h>

#define MODEL(name, ops) extern const struct model_ops ops;
#define ALIAS(name, to)
#include "registry.def"
#undef MODEL
#undef ALIAS

#define MODEL(name, ops) {name, &ops, NULL},
#define ALIAS(name, to) {name, NULL, to},
static const struct registry_entry k_models[] = {
#include "registry.def"
};
#undef MODEL
#undef ALIAS

#define N_MODELS (sizeof k_models / sizeof k_models[0])

size_t registry_count(void) { return N_MODELS; }

const struct registry_entry *registry_at(size_t i)
{
    return i < N_MODELS ? &k_models[i] : NULL;
}

const struct model_ops *registry_find(const char *model_type)
{
    /* an alias resolves in one step: registry tests check no alias points at an alias */
    for (size_t i = 0; i < N_MODELS; i++) {
        if (strcmp(k_models[i].model_type, model_type) != 0)
            continue;
        if (k_models[i].ops)
            return k_models[i].ops;
        for (size_t j = 0; j < N_MODELS; j++)
            if (k_models[j].ops && strcmp(k_models[j].model_type, k_models[i].alias_of) == 0)
                return k_models[j].ops;
        return NULL;
    }
    return NULL;
}

void registry_names(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_MODELS && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", k_models[i].model_type);
        if (w < 0)
            break;
        len += (size_t)w;
    }
}

static const struct model_ops *find_by_architecture(const char *arch)
{
    for (size_t i = 0; i < N_MODELS; i++) {
        const struct model_ops *ops = k_models[i].ops;
        if (!ops || !ops->architectures)
            continue;
        for (const char *const *a = ops->architectures; *a; a++)
            if (strcmp(*a, arch) == 0)
                return ops;
    }
    return NULL;
}

int registry_resolve(const cJSON *cfg, const struct model_ops **out, struct err *e)
{
    char names[1024];
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    *out = type ? registry_find(type) : NULL;
    if (*out)
        return 0;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *a;
    cJSON_ArrayForEach(a, archs) {
        if (cJSON_IsString(a) && (*out = find_by_architecture(a->valuestring)))
            return 0;
    }
    registry_names(names, sizeof names);
    if (type)
        return err_setf(e, ERR_UNSUPPORTED, "unsupported model_type '%s' (supported: %s)", type,
                        names);
    return err_setf(e, ERR_CONFIG,
                    "config.json has no usable model_type or architectures (supported: %s)",
                    names);
}
