/*
 * chat: a checkpoint's chat template, found and rendered the way
 * transformers' apply_chat_template does (template.h has the contract).
 *
 * Loading reads tokenizer_config.json once: the template source (unless an
 * override file is given or the config has none, in which case
 * chat_template.jinja, then chat_template.json are tried) and the special
 * token strings, which become template variables (bos_token, eos_token,
 * unk_token, pad_token, sep_token, cls_token, mask_token; each a string or
 * an {"content": ...} object; null or absent ones are left undefined, as
 * transformers' special_tokens_map leaves them out).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/fileio.h"
#include "../core/json.h"
#include "template.h"

#define CHAT_FILE_MAX (16u << 20)

struct chat_tmpl {
    struct tmpl *t;
    cJSON *special;   /* object: token name -> string */
    char *src;        /* the template text, NUL-terminated (chat_tmpl_source) */
};

static const char *const k_special[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                        "sep_token", "cls_token", "mask_token"};

/* Read dir/name parsed as JSON into *out; 1 when the file does not exist. */
static int read_json(const char *dir, const char *name, cJSON **out, struct err *e)
{
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = json_load_object(path, FILE_FOLDER, CHAT_FILE_MAX, out, e);
    return rc == -ERR_MISSING ? 1 : rc;
}

/* The template text in tokenizer_config.json's chat_template, or NULL. */
static int config_template(const cJSON *cfg, const char **src, struct err *e)
{
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    *src = NULL;
    if (!ct || cJSON_IsNull(ct))
        return 0;
    if (cJSON_IsString(ct)) {
        *src = ct->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(ct))
        return err_setf(e, ERR_FORMAT, "tokenizer_config.json: chat_template must be a string or a list");
    for (const cJSON *x = ct->child; x; x = x->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(x, "template");
        if (cJSON_IsString(n) && cJSON_IsString(t) && !strcmp(n->valuestring, "default")) {
            *src = t->valuestring;
            return 0;
        }
    }
    return err_setf(e, ERR_FORMAT, "tokenizer_config.json: chat_template lists named templates but none is 'default'");
}

static int add_special(cJSON *special, const cJSON *cfg)
{
    for (size_t i = 0; cfg && i < sizeof k_special / sizeof k_special[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, k_special[i]);
        if (cJSON_IsObject(v))
            v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(v) && !cJSON_AddStringToObject(special, k_special[i], v->valuestring))
            return -ERR_NOMEM;
    }
    return 0;
}

int chat_tmpl_load(struct chat_tmpl **out, const char *dir, const char *override_file, struct err *e)
{
    cJSON *cfg = NULL, *ctj = NULL;
    char *file_src = NULL, path[4352];
    const char *src = NULL, *what = NULL;
    size_t len = 0;
    int rc;
    *out = NULL;
    struct chat_tmpl *c = calloc(1, sizeof *c);
    if (!c || !(c->special = cJSON_CreateObject())) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = read_json(dir, "tokenizer_config.json", &cfg, e)) < 0)
        goto fail;
    if (add_special(c->special, cfg) < 0) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (override_file) {
        if ((rc = file_read_all(override_file, CHAT_FILE_MAX, &file_src, &len, e)) < 0)
            goto fail;
        src = file_src;
        what = override_file;
    } else if (cfg && ((rc = config_template(cfg, &src, e)) < 0)) {
        goto fail;
    } else if (src) {
        len = strlen(src);
        what = "tokenizer_config.json chat_template";
    } else {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        rc = file_read_scoped(path, FILE_FOLDER, CHAT_FILE_MAX, &file_src, &len, e);
        if (rc < 0 && rc != -ERR_MISSING)
            goto fail;
        if (rc == 0) {
            src = file_src;
            what = "chat_template.jinja";
        } else if ((rc = read_json(dir, "chat_template.json", &ctj, e)) < 0) {
            goto fail;
        } else if (rc == 0) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(ctj, "chat_template");
            if (!cJSON_IsString(t)) {
                rc = err_setf(e, ERR_FORMAT, "%s/chat_template.json: no \"chat_template\" string", dir);
                goto fail;
            }
            src = t->valuestring;
            len = strlen(src);
            what = "chat_template.json";
        }
    }
    if (!src) {
        rc = err_setf(e, ERR_MISSING, "%s has no chat template (tokenizer_config.json, chat_template.jinja, "
                      "chat_template.json)", dir);
        goto fail;
    }
    /* an empty template renders no prompt at all: refuse it rather than fail later on
     * "the prompt encodes to no tokens" */
    size_t blank = 0;
    while (blank < len && (src[blank] == ' ' || src[blank] == '\t' || src[blank] == '\r' || src[blank] == '\n'))
        blank++;
    if (blank == len) {
        rc = err_setf(e, ERR_FORMAT, "%s: the chat template is empty", what);
        goto fail;
    }
    if ((rc = tmpl_parse(&c->t, src, len, NULL, e)) < 0) {
        err_prefix(e, "%s", what);
        goto fail;
    }
    if (!(c->src = malloc(len + 1))) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto fail;
    }
    memcpy(c->src, src, len);
    c->src[len] = 0;
    cJSON_Delete(cfg);
    cJSON_Delete(ctj);
    free(file_src);
    *out = c;
    return 0;
fail:
    cJSON_Delete(cfg);
    cJSON_Delete(ctj);
    free(file_src);
    chat_tmpl_free(c);
    return rc;
}

void chat_tmpl_free(struct chat_tmpl *c)
{
    if (!c)
        return;
    tmpl_free(c->t);
    cJSON_Delete(c->special);
    free(c->src);
    free(c);
}

const char *chat_tmpl_source(const struct chat_tmpl *c)
{
    return c->src;
}

int chat_tmpl_apply(const struct chat_tmpl *c, const cJSON *messages, bool agp, const cJSON *extra,
                    char **out, size_t *len, struct err *e)
{
    *out = NULL;
    if (!cJSON_IsArray(messages))
        return err_setf(e, ERR_ARG, "messages must be a JSON array");
    if (extra && !cJSON_IsObject(extra))
        return err_setf(e, ERR_ARG, "extra template variables must be a JSON object");
    cJSON *vars = cJSON_Duplicate(c->special, 1), *msgs = cJSON_Duplicate(messages, 1);
    bool ok = vars && msgs && cJSON_AddItemToObject(vars, "messages", msgs);
    if (!ok)
        cJSON_Delete(msgs);  /* not attached to vars: still ours */
    ok = ok && cJSON_AddNullToObject(vars, "tools") && cJSON_AddNullToObject(vars, "documents") &&
              cJSON_AddBoolToObject(vars, "add_generation_prompt", agp);
    for (const cJSON *x = extra ? extra->child : NULL; ok && x; x = x->next) {
        /* delete and add, not cJSON_ReplaceItemInObject: cJSON 1.7.15 ignores a
         * failure to copy the key there and leaves a member without a name */
        cJSON *dup = cJSON_Duplicate(x, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(vars, x->string);
        ok = dup && cJSON_AddItemToObject(vars, x->string, dup);
        if (!ok)
            cJSON_Delete(dup);
    }
    if (!ok) {
        cJSON_Delete(vars);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    int rc = tmpl_render(c->t, vars, out, len, e);
    cJSON_Delete(vars);
    return rc;
}
