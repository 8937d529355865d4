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

/* The model_type of the family that lists arch among its architectures, or NULL. */
static const char *type_of_architecture(const char *arch)
{
    const struct model_ops *ops = find_by_architecture(arch);
    for (size_t i = 0; ops && i < N_MODELS; i++)
        if (k_models[i].ops == ops)
            return k_models[i].model_type;
    return NULL;
}

/* Resolution is by model_type alone, as transformers' AutoConfig and mlx-lm do: the
 * architectures list names classes, and a family it names (LlamaForCausalLM under
 * model_type llama4) is not the model the config describes. An unknown model_type is
 * refused naming it; a missing one too (AutoConfig only guesses from the folder's
 * name), with the model_type its architectures suggest as a hint. */
int registry_resolve(const cJSON *cfg, const struct model_ops **out, struct err *e)
{
    char names[1024];
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    *out = NULL;
    registry_names(names, sizeof names);
    if (mt && !cJSON_IsString(mt))
        return err_setf(e, ERR_CONFIG, "config.json: model_type must be a string");
    if (mt) {
        if ((*out = registry_find(mt->valuestring)))
            return 0;
        return err_setf(e, ERR_UNSUPPORTED, "unsupported model_type '%.64s' (supported, as `mlxcel arch` "
                        "lists them: %s)", mt->valuestring, names);
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *a;
    cJSON_ArrayForEach(a, archs) {
        const char *t = cJSON_IsString(a) ? type_of_architecture(a->valuestring) : NULL;
        if (t)
            return err_setf(e, ERR_CONFIG, "config.json has no model_type (transformers and mlx-lm need it "
                            "too); its architectures name %.64s: add \"model_type\": \"%s\" if that is "
                            "the model", a->valuestring, t);
    }
    return err_setf(e, ERR_CONFIG, "config.json has no model_type (supported, as `mlxcel arch` lists them: %s)",
                    names);
}
