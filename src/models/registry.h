/*
 * registry: model_type -> family ops, expanded from registry.def.
 * Detection uses config.json's "model_type" alone, as transformers' AutoConfig
 * does; an unknown or missing type is an error listing every supported name
 * ("architectures" only gives a hint when model_type is missing).
 */
#pragma once
#include <stddef.h>

#include <cjson/cJSON.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct registry_entry {
    const char *model_type;        /* name as it appears in config.json */
    const struct model_ops *ops;   /* NULL for an alias */
    const char *alias_of;          /* model_type this one maps to, or NULL */
};

size_t registry_count(void);
const struct registry_entry *registry_at(size_t i);
/* Family ops for a model_type (aliases resolved), or NULL. */
const struct model_ops *registry_find(const char *model_type);
/* Pick the family for a parsed config.json. */
int registry_resolve(const cJSON *cfg, const struct model_ops **out, struct err *e);
/* Comma-separated list of supported model_types into buf. */
void registry_names(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
