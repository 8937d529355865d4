/*
 * arch: `mlxcel arch [--json]` prints the family catalog straight from the
 * registry table (src/models/registry.def), aliases included, then the image-text
 * wrappers of src/models/vision.def (their text model's family, their tower).
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../models/registry.h"
#include "../models/vision.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel arch [--json]\n"
    "\n"
    "List the supported model_type values and the family that runs each; image-text\n"
    "checkpoints (their outer model_type) with the text family and the vision tower.\n"
    "  --json    machine-readable output\n";

static const struct model_ops *entry_ops(const struct registry_entry *r)
{
    return r->ops ? r->ops : registry_find(r->model_type);
}

/* The text family of image-text wrapper mt: "<mt>_text" (Gemma 3, Qwen2-VL's). */
static const struct model_ops *wrapper_text(const char *mt)
{
    char t[96];
    snprintf(t, sizeof t, "%s_text", mt);
    return registry_find(t);
}

int cmd_arch(int argc, char **argv)
{
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(k_help, stdout);
            return CLI_EXIT_OK;
        } else
            return cli_usage_error("arch", "unknown argument '%s'", argv[i]);
    }
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < registry_count(); i++) {
            const struct registry_entry *r = registry_at(i);
            const struct model_ops *ops = entry_ops(r);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model_type", r->model_type);
            cJSON_AddStringToObject(o, "family", ops ? ops->family : "?");
            if (r->alias_of)
                cJSON_AddStringToObject(o, "alias_of", r->alias_of);
            cJSON_AddStringToObject(o, "description", ops ? ops->description : "");
            cJSON_AddItemToArray(arr, o);
        }
        for (size_t i = 0; i < vision_count(); i++) {
            const struct vision_ops *v = vision_at(i);
            const struct model_ops *t = wrapper_text(v->model_type);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model_type", v->model_type);
            cJSON_AddStringToObject(o, "family", t ? t->family : v->text_family ? v->text_family : "?");
            cJSON_AddBoolToObject(o, "images", true);
            cJSON_AddStringToObject(o, "description", v->description);
            cJSON_AddItemToArray(arr, o);
        }
        struct err e = {0};
        return cli_print_json(arr, &e) < 0 ? cli_fail("arch", &e) : CLI_EXIT_OK;
    }
    printf("%-14s %-10s %s\n", "MODEL_TYPE", "FAMILY", "DESCRIPTION");
    for (size_t i = 0; i < registry_count(); i++) {
        const struct registry_entry *r = registry_at(i);
        const struct model_ops *ops = entry_ops(r);
        char desc[256];
        if (r->alias_of)
            snprintf(desc, sizeof desc, "alias of %s", r->alias_of);
        else
            snprintf(desc, sizeof desc, "%s", ops->description);
        printf("%-14s %-10s %s\n", r->model_type, ops ? ops->family : "?", desc);
    }
    /* image-text checkpoints: the text family runs the language model, the tower the images */
    for (size_t i = 0; i < vision_count(); i++) {
        const struct vision_ops *v = vision_at(i);
        const struct model_ops *t = wrapper_text(v->model_type);
        printf("%-14s %-10s images: %s\n", v->model_type, t ? t->family : v->text_family ? v->text_family : "?",
               v->description);
    }
    return CLI_EXIT_OK;
}
