/*
 * chat: a checkpoint's chat templates, found and rendered the way
 * transformers' tokenizer (PreTrainedTokenizerBase.from_pretrained and
 * apply_chat_template) does (template.h has the contract).
 *
 * Sources, the first that exists wins as a whole (docs/adr/0050):
 *   1. the --chat-template-file override: the one template;
 *   2. template files: chat_template.jinja ("default") and
 *      additional_chat_templates/<name>.jinja (named <name>); when any of
 *      them exists, tokenizer_config.json's chat_template is not read at all
 *      ("independent chat template files take priority", transformers 4.5x);
 *   3. tokenizer_config.json's chat_template: a string ("default") or a list
 *      of {"name", "template"};
 *   4. chat_template.json {"chat_template": ...}, the processor's legacy file
 *      (AutoProcessor reads it; AutoTokenizer does not), as a last resort.
 * Several templates are kept by name; apply picks as transformers does:
 * "tool_use" when tools are given and it exists, else "default", else an
 * error naming the templates there are.
 *
 * Loading also reads tokenizer_config.json's special token strings, which
 * become template variables (bos_token, eos_token, unk_token, pad_token,
 * sep_token, cls_token, mask_token; each a string or an {"content": ...}
 * object; null or absent ones are left undefined, as transformers'
 * special_tokens_map leaves them out).
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/fileio.h"
#include "../core/json.h"
#include "../core/log.h"
#include "template.h"

#define CHAT_FILE_MAX (16u << 20)
/* Named templates kept at most (a few in practice: default, tool_use, rag). */
#define CHAT_MAX_TEMPLATES 32
#define CHAT_NAME_MAX 128

struct chat_one {
    char name[CHAT_NAME_MAX];
    struct tmpl *t;
    char *src;        /* the template text, NUL-terminated */
};

struct chat_tmpl {
    struct chat_one v[CHAT_MAX_TEMPLATES];
    int n;
    const char *from; /* which source won, for the log */
    cJSON *special;   /* object: token name -> string */
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

/* Parse len bytes of src (from `what`, for messages) as the template called name. */
static int add_template(struct chat_tmpl *c, const char *name, const char *src, size_t len, const char *what,
                        struct err *e)
{
    int rc, at = c->n;
    if (!name[0] || strlen(name) >= CHAT_NAME_MAX)
        return err_setf(e, ERR_FORMAT, "%s: a chat template name must have 1 to %d bytes", what,
                        CHAT_NAME_MAX - 1);
    /* a name given twice keeps the later template, as transformers' dict does (a list's
     * {name: template} comprehension; additional_chat_templates/default.jinja after
     * chat_template.jinja) */
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->v[i].name, name) == 0)
            at = i;
    if (at == CHAT_MAX_TEMPLATES)
        return err_setf(e, ERR_RANGE, "%s: more than %d chat templates", what, CHAT_MAX_TEMPLATES);
    /* an empty template renders no prompt at all: refuse it rather than fail later on
     * "the prompt encodes to no tokens" */
    size_t blank = 0;
    while (blank < len && (src[blank] == ' ' || src[blank] == '\t' || src[blank] == '\r' || src[blank] == '\n'))
        blank++;
    if (blank == len)
        return err_setf(e, ERR_FORMAT, "%s: the chat template is empty", what);
    struct tmpl *t = NULL;
    char *copy = NULL;
    if ((rc = tmpl_parse(&t, src, len, NULL, e)) < 0)
        return err_prefix(e, "%s", what);
    if (!(copy = malloc(len + 1))) {
        tmpl_free(t);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    memcpy(copy, src, len);
    copy[len] = 0;
    struct chat_one *o = &c->v[at];
    if (at < c->n) {
        tmpl_free(o->t);
        free(o->src);
    } else {
        c->n++;
    }
    o->t = t;
    o->src = copy;
    snprintf(o->name, sizeof o->name, "%s", name);
    return 0;
}

/* A template file of the folder (path under dir, FILE_FOLDER rules) as template name:
 * 1 when it does not exist. */
static int add_file(struct chat_tmpl *c, const char *name, const char *path, const char *what, struct err *e)
{
    char *src = NULL;
    size_t len = 0;
    int rc = file_read_scoped(path, FILE_FOLDER, CHAT_FILE_MAX, &src, &len, e);
    if (rc == -ERR_MISSING) {
        err_clear(e);
        return 1;
    }
    if (rc == 0)
        rc = add_template(c, name, src, len, what, e);
    free(src);
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* additional_chat_templates/<name>.jinja of dir, in name order; 0 also when the folder does
 * not exist. The folder must lie inside dir (a link out of the model folder is refused, as
 * fileio refuses file links). */
static int add_folder(struct chat_tmpl *c, const char *dir, struct err *e)
{
    char sub[4352], real_dir[PATH_MAX], real_sub[PATH_MAX], path[4700], what[300];
    char *names[CHAT_MAX_TEMPLATES];
    int n = 0, rc = 0;
    struct stat sb;
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", dir);
    if (stat(sub, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return 0;
    if (!realpath(dir, real_dir) || !realpath(sub, real_sub))
        return err_setf(e, ERR_IO, "cannot resolve %s", sub);
    size_t rl = strlen(real_dir);
    if (strncmp(real_sub, real_dir, rl) != 0 || real_sub[rl] != '/')
        return err_setf(e, ERR_IO, "%s leads outside the model folder (to %s)", sub, real_sub);
    DIR *d = opendir(sub);
    if (!d)
        return err_setf(e, ERR_IO, "cannot open %s", sub);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len <= 6 || strcmp(de->d_name + len - 6, ".jinja") != 0)
            continue;
        if (n == CHAT_MAX_TEMPLATES) {
            rc = err_setf(e, ERR_RANGE, "%s: more than %d chat templates", sub, CHAT_MAX_TEMPLATES);
            break;
        }
        if (!(names[n] = strndup(de->d_name, len - 6))) {
            rc = err_setf(e, ERR_NOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_name);
    for (int i = 0; rc == 0 && i < n; i++) {
        snprintf(path, sizeof path, "%s/%s.jinja", sub, names[i]);
        snprintf(what, sizeof what, "additional_chat_templates/%.200s.jinja", names[i]);
        rc = add_file(c, names[i], path, what, e);
        if (rc == 1)
            rc = 0;  /* gone since the listing */
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    return rc;
}

/* tokenizer_config.json's chat_template: a string, or a list of {name, template}. */
static int add_config(struct chat_tmpl *c, const cJSON *cfg, struct err *e)
{
    static const char *const what = "tokenizer_config.json chat_template";
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (!ct || cJSON_IsNull(ct))
        return 0;
    if (cJSON_IsString(ct))
        return add_template(c, "default", ct->valuestring, strlen(ct->valuestring), what, e);
    if (!cJSON_IsArray(ct))
        return err_setf(e, ERR_FORMAT, "tokenizer_config.json: chat_template must be a string or a list");
    for (const cJSON *x = ct->child; x; x = x->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(x, "template");
        int rc;
        if (!cJSON_IsString(n) || !cJSON_IsString(t))
            return err_setf(e, ERR_FORMAT, "tokenizer_config.json: each chat_template entry needs a \"name\" and "
                            "a \"template\" string");
        if ((rc = add_template(c, n->valuestring, t->valuestring, strlen(t->valuestring), what, e)) < 0)
            return rc;
    }
    return 0;
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

/* The sources in transformers' order (the file comment); c->n stays 0 when there is none. */
static int find_templates(struct chat_tmpl *c, const char *dir, const char *override_file, const cJSON *cfg,
                          struct err *e)
{
    char path[4352];
    int rc;
    if (override_file) {
        char *src = NULL;
        size_t len = 0;
        if ((rc = file_read_all(override_file, CHAT_FILE_MAX, &src, &len, e)) == 0)
            rc = add_template(c, "default", src, len, override_file, e);
        free(src);
        c->from = "--chat-template-file";
        return rc;
    }
    c->from = "chat_template.jinja / additional_chat_templates/";
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if ((rc = add_file(c, "default", path, "chat_template.jinja", e)) < 0 || (rc = add_folder(c, dir, e)) < 0)
        return rc;
    if (c->n > 0)
        return 0;
    c->from = "tokenizer_config.json";
    if (cfg && (rc = add_config(c, cfg, e)) < 0)
        return rc;
    if (c->n > 0)
        return 0;
    c->from = "chat_template.json";
    cJSON *ctj = NULL;
    if ((rc = read_json(dir, "chat_template.json", &ctj, e)) != 0)
        return rc < 0 ? rc : 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ctj, "chat_template");
    if (!cJSON_IsString(t))
        rc = err_setf(e, ERR_FORMAT, "%s/chat_template.json: no \"chat_template\" string", dir);
    else
        rc = add_template(c, "default", t->valuestring, strlen(t->valuestring), "chat_template.json", e);
    cJSON_Delete(ctj);
    return rc;
}

int chat_tmpl_load(struct chat_tmpl **out, const char *dir, const char *override_file, struct err *e)
{
    cJSON *cfg = NULL;
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
    if ((rc = find_templates(c, dir, override_file, cfg, e)) < 0)
        goto fail;
    if (c->n == 0) {
        rc = err_setf(e, ERR_MISSING, "%s has no chat template (chat_template.jinja, additional_chat_templates/, "
                      "tokenizer_config.json, chat_template.json)", dir);
        goto fail;
    }
    char names[256];
    size_t len = 0;
    names[0] = 0;
    for (int i = 0; i < c->n && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", c->v[i].name);
    LOG_INFO("chat template%s %s from %s", c->n > 1 ? "s" : "", names, c->from);
    cJSON_Delete(cfg);
    *out = c;
    return 0;
fail:
    cJSON_Delete(cfg);
    chat_tmpl_free(c);
    return rc;
}

/* The template called name, or NULL. */
static const struct chat_one *find_one(const struct chat_tmpl *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->v[i].name, name) == 0)
            return &c->v[i];
    return NULL;
}

/* transformers' get_chat_template: one template is used whatever its name; of several,
 * "tool_use" when tools are given, else "default", else an error listing them. */
static const struct chat_one *pick(const struct chat_tmpl *c, bool tools, struct err *e)
{
    const struct chat_one *o;
    if (c->n == 1)
        return &c->v[0];
    if ((tools && (o = find_one(c, "tool_use"))) || (o = find_one(c, "default")))
        return o;
    char names[512];
    size_t len = 0;
    names[0] = 0;
    for (int i = 0; i < c->n && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", i ? ", " : "", c->v[i].name);
    err_setf(e, ERR_FORMAT, "this model has several chat templates (%s) and none is named 'default'%s", names,
             find_one(c, "tool_use") ? " ('tool_use' is used when tools are given)" : "");
    return NULL;
}

void chat_tmpl_free(struct chat_tmpl *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        tmpl_free(c->v[i].t);
        free(c->v[i].src);
    }
    cJSON_Delete(c->special);
    free(c);
}

const char *chat_tmpl_source(const struct chat_tmpl *c)
{
    const struct chat_one *o = c->n == 1 ? &c->v[0] : find_one(c, "default");
    return o ? o->src : c->v[0].src;
}

int chat_tmpl_apply(const struct chat_tmpl *c, const cJSON *messages, bool agp, const cJSON *extra,
                    char **out, size_t *len, struct err *e)
{
    *out = NULL;
    if (!cJSON_IsArray(messages))
        return err_setf(e, ERR_ARG, "messages must be a JSON array");
    if (extra && !cJSON_IsObject(extra))
        return err_setf(e, ERR_ARG, "extra template variables must be a JSON object");
    const cJSON *tools = extra ? cJSON_GetObjectItemCaseSensitive(extra, "tools") : NULL;
    const struct chat_one *one = pick(c, tools && !cJSON_IsNull(tools), e);
    if (!one)
        return -ERR_FORMAT;
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
    int rc = tmpl_render(one->t, vars, out, len, e);
    cJSON_Delete(vars);
    return rc;
}
