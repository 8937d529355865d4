/*
 * router_scan: the router's list of servable models (router.h): the names given on the
 * command line, a bounded scan of --models-dir, and the per-model defaults of a presets
 * file (llama-server's INI format, or the same keys as JSON).
 *
 * Everything here reads what the user or the file system gives: a name is printable ASCII
 * from a short alphabet (it is echoed in JSON, logs and URLs), a scan reads at most
 * ROUTER_SCAN_MAX_ENTRIES directory entries and never follows a symlink out of the
 * directory, a presets file is read whole up to 1 MiB and every value is range-checked.
 */
#include "router.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../core/fileio.h"
#include "../core/log.h"

#define PRESETS_MAX_BYTES (1u << 20)

// ---- the list ----

/* A name the API can carry: 1 to ROUTER_NAME_MAX - 1 bytes of [A-Za-z0-9._:-] and '/' inside,
 * not starting with '.' or '/'. */
static bool name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= ROUTER_NAME_MAX || name[0] == '.' || name[0] == '/' || name[n - 1] == '/')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-' || c == ':' || c == '/';
        if (!ok)
            return false;
    }
    return true;
}

static struct router_spec *find_spec(struct router_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

int router_list_add(struct router_list *l, const char *name, const char *path, struct err *e)
{
    if (!name_ok(name))
        return err_setf(e, ERR_ARG, "model name '%.64s' is not valid (1 to %d bytes of letters, digits, "
                        "'.', '_', '-', ':' and '/')", name, ROUTER_NAME_MAX - 1);
    if (find_spec(l, name))
        return err_setf(e, ERR_ARG, "two models are named '%s' (name one with -m NAME=PATH)", name);
    if (l->n == ROUTER_MAX_MODELS)
        return err_setf(e, ERR_RANGE, "more than %d models", ROUTER_MAX_MODELS);
    if (strlen(path) >= sizeof l->v[0].path)
        return err_setf(e, ERR_ARG, "model '%s': its path is too long", name);
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        struct router_spec *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return err_setf(e, ERR_NOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    struct router_spec *sp = &l->v[l->n++];
    memset(sp, 0, sizeof *sp);
    snprintf(sp->name, sizeof sp->name, "%s", name);
    snprintf(sp->path, sizeof sp->path, "%s", path);
    return 0;
}

void router_list_free(struct router_list *l)
{
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

// ---- the scan ----

struct scan {
    struct router_list *l;
    char root[PATH_MAX];             /* the directory's real path */
    int n_entries;                   /* entries read so far, both levels */
    int n_found;
};

/* Whether real path p lies inside the scanned directory. */
static bool inside(const struct scan *sc, const char *p)
{
    size_t n = strlen(sc->root);
    return strncmp(p, sc->root, n) == 0 && (p[n] == '/' || (n == 1 && sc->root[0] == '/'));
}

static bool has_config(const char *dir)
{
    char p[PATH_MAX + 16];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A Hugging Face hub cache entry (models--OWNER--NAME, as huggingface_hub and `mlxcel pull`
 * write $HF_HOME/hub): its refs/main snapshot's real path into snap and "OWNER/NAME" into
 * name; false when entry is not one, or its snapshot is missing, outside the root or holds no
 * config.json. */
static bool hf_cache_entry(const struct scan *sc, const char *real, const char *entry, char *snap,
                           char *name, size_t name_cap)
{
    if (strncmp(entry, "models--", 8) != 0)
        return false;
    const char *owner = entry + 8, *sep = strstr(owner, "--");
    if (!*owner || (sep && (sep == owner || !sep[2])))
        return false;
    if (sep)
        snprintf(name, name_cap, "%.*s/%s", (int)(sep - owner), owner, sep + 2);
    else
        snprintf(name, name_cap, "%s", owner);
    char p[PATH_MAX + 64], *ref = NULL;
    size_t n = 0;
    struct err fe = {0};
    snprintf(p, sizeof p, "%s/refs/main", real);
    /* file_read_all: a regular file only (a FIFO there must not block the scan), bounded */
    if (file_read_all(p, 80, &ref, &n, &fe) < 0)
        return false;
    while (n > 0 && (ref[n - 1] == '\n' || ref[n - 1] == '\r' || ref[n - 1] == ' '))
        ref[--n] = 0;
    bool hash = n >= 7 && n <= 64 && strspn(ref, "0123456789abcdef") == n;
    if (hash)                           /* a commit hash, nothing else (no path in it) */
        snprintf(p, sizeof p, "%s/snapshots/%s", real, ref);
    free(ref);
    if (!hash)
        return false;
    return realpath(p, snap) && inside(sc, snap) && has_config(snap);
}

/* Reads the folders of dir (real path, inside the scan's root); name_prefix "" at the first
 * level, "owner/" at the second. */
static int scan_level(struct scan *sc, const char *dir, const char *name_prefix, int depth, struct err *e)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (depth == 0)
            return err_setf(e, ERR_IO, "--models-dir %s: %s", dir, strerror(errno));
        return 0;  /* an unreadable subfolder is no model */
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (++sc->n_entries > ROUTER_SCAN_MAX_ENTRIES) {
            rc = err_setf(e, ERR_RANGE, "--models-dir %s: more than %d entries; point it at a folder of "
                          "model folders", sc->root, ROUTER_SCAN_MAX_ENTRIES);
            break;
        }
        char child[PATH_MAX + 300], real[PATH_MAX], name[ROUTER_NAME_MAX * 2 + 8];
        snprintf(child, sizeof child, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(child, &st) != 0 || !S_ISDIR(st.st_mode) || !realpath(child, real))
            continue;
        if (!inside(sc, real)) {
            LOG_WARN("--models-dir: skipping %s: it leads out of the directory (%s)", child, real);
            continue;
        }
        snprintf(name, sizeof name, "%s%s", name_prefix, de->d_name);
        char snap[PATH_MAX];
        bool hf = depth == 0 && !has_config(real) && hf_cache_entry(sc, real, de->d_name, snap, name, sizeof name);
        if (hf)
            snprintf(real, sizeof real, "%s", snap);   /* the model is its main snapshot */
        if (hf || has_config(real)) {
            struct err ae = {0};
            if (!name_ok(name)) {
                LOG_WARN("--models-dir: skipping %s: '%s' is not a valid model name", child, name);
            } else if (router_list_add(sc->l, name, real, &ae) < 0) {
                if (ae.code == ERR_NOMEM || ae.code == ERR_RANGE) {
                    rc = err_setf(e, ae.code, "--models-dir: %s", ae.msg);
                    break;
                }
                LOG_WARN("--models-dir: skipping %s: %s", child, ae.msg);
            } else {
                sc->n_found++;
            }
        } else if (depth == 0 && strncmp(de->d_name, "models--", 8) != 0 && strlen(name) + 2 < ROUTER_NAME_MAX) {
            char prefix[ROUTER_NAME_MAX + 2];
            snprintf(prefix, sizeof prefix, "%s/", name);
            rc = scan_level(sc, real, prefix, 1, e);
        }
    }
    closedir(d);
    return rc;
}

int router_scan_dir(struct router_list *l, const char *dir, int *n_found, struct err *e)
{
    struct scan sc = {.l = l};
    *n_found = 0;
    if (!realpath(dir, sc.root))
        return err_setf(e, ERR_IO, "--models-dir %s: %s", dir, strerror(errno));
    int rc = scan_level(&sc, sc.root, "", 0, e);
    *n_found = sc.n_found;
    return rc;
}

// ---- presets ----

/* A number in [lo, hi] from v; -ERR_ARG naming the key otherwise. */
static int num_in(const char *where, const char *key, const char *v, double lo, double hi, bool integer,
                  double *out, struct err *e)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    while (*end == ' ' || *end == '\t')
        end++;
    if (errno || end == v || *end || !(x >= lo && x <= hi) || (integer && x != (double)(long)x))
        return err_setf(e, ERR_ARG, "%s: '%s' = '%.32s' is not %s in [%g, %g]", where, key, v,
                        integer ? "an integer" : "a number", lo, hi);
    *out = x;
    return 0;
}

/* One key of a preset; unknown keys (llama-server's other flags) are warned about and
 * ignored. model (the path) goes to *model_path. */
static int preset_set(struct router_preset *p, char *model_path, size_t model_cap, const char *where,
                      const char *key, const char *v, struct err *e)
{
    double x;
    int rc = 0;
    if (strcmp(key, "ctx-size") == 0 || strcmp(key, "c") == 0 || strcmp(key, "ctx") == 0) {
        if ((rc = num_in(where, key, v, 1, 1 << 24, true, &x, e)) == 0)
            p->ctx_size = (long)x, p->set |= ROUTER_SET_CTX;
    } else if (strcmp(key, "parallel") == 0 || strcmp(key, "np") == 0) {
        if ((rc = num_in(where, key, v, 1, 256, true, &x, e)) == 0)
            p->parallel = (long)x, p->set |= ROUTER_SET_PARALLEL;
    } else if (strcmp(key, "temp") == 0 || strcmp(key, "temperature") == 0) {
        if ((rc = num_in(where, key, v, 0, 2, false, &x, e)) == 0)
            p->temp = (float)x, p->set |= ROUTER_SET_TEMP;
    } else if (strcmp(key, "top-p") == 0) {
        if ((rc = num_in(where, key, v, 0, 1, false, &x, e)) == 0)
            p->top_p = (float)x, p->set |= ROUTER_SET_TOP_P;
    } else if (strcmp(key, "min-p") == 0) {
        if ((rc = num_in(where, key, v, 0, 1, false, &x, e)) == 0)
            p->min_p = (float)x, p->set |= ROUTER_SET_MIN_P;
    } else if (strcmp(key, "top-k") == 0) {
        if ((rc = num_in(where, key, v, 0, 1 << 24, true, &x, e)) == 0)
            p->top_k = (int)x, p->set |= ROUTER_SET_TOP_K;
    } else if (strcmp(key, "repeat-penalty") == 0) {
        if ((rc = num_in(where, key, v, 0.01, 10, false, &x, e)) == 0)
            p->repeat_penalty = (float)x, p->set |= ROUTER_SET_REPEAT_PENALTY;
    } else if (strcmp(key, "chat-template-file") == 0) {
        if (!*v || strlen(v) >= sizeof p->chat_template_file)
            return err_setf(e, ERR_ARG, "%s: '%s' must be a file path", where, key);
        snprintf(p->chat_template_file, sizeof p->chat_template_file, "%s", v);
        p->set |= ROUTER_SET_TEMPLATE;
    } else if (strcmp(key, "lora") == 0) {
        if (!*v || strlen(v) >= sizeof p->lora)
            return err_setf(e, ERR_ARG, "%s: '%s' must be adapter paths (PATH[:SCALE], comma-separated)",
                            where, key);
        snprintf(p->lora, sizeof p->lora, "%s", v);
        p->set |= ROUTER_SET_LORA;
    } else if (strcmp(key, "load-on-startup") == 0) {
        bool t = strcmp(v, "true") == 0 || strcmp(v, "1") == 0 || strcmp(v, "on") == 0;
        if (!t && strcmp(v, "false") != 0 && strcmp(v, "0") != 0 && strcmp(v, "off") != 0)
            return err_setf(e, ERR_ARG, "%s: '%s' must be true or false", where, key);
        p->load_on_startup = t;
        p->set |= ROUTER_SET_LOAD;
    } else if (strcmp(key, "model") == 0 || strcmp(key, "m") == 0) {
        if (!model_path || !*v || strlen(v) >= model_cap)
            return err_setf(e, ERR_ARG, "%s: '%s' must be a folder, in a model's section", where, key);
        snprintf(model_path, model_cap, "%s", v);
    } else if (strcmp(key, "version") != 0) {
        LOG_WARN("%s: '%s' is not a preset key mlxcel reads; ignored", where, key);
    }
    return rc;
}

/* Copies the values set in src over dst. */
static void preset_merge(struct router_preset *dst, const struct router_preset *src)
{
    if (src->set & ROUTER_SET_CTX) dst->ctx_size = src->ctx_size;
    if (src->set & ROUTER_SET_PARALLEL) dst->parallel = src->parallel;
    if (src->set & ROUTER_SET_TEMP) dst->temp = src->temp;
    if (src->set & ROUTER_SET_TOP_P) dst->top_p = src->top_p;
    if (src->set & ROUTER_SET_MIN_P) dst->min_p = src->min_p;
    if (src->set & ROUTER_SET_TOP_K) dst->top_k = src->top_k;
    if (src->set & ROUTER_SET_REPEAT_PENALTY) dst->repeat_penalty = src->repeat_penalty;
    if (src->set & ROUTER_SET_TEMPLATE) memcpy(dst->chat_template_file, src->chat_template_file,
                                               sizeof dst->chat_template_file);
    if (src->set & ROUTER_SET_LOAD) dst->load_on_startup = src->load_on_startup;
    if (src->set & ROUTER_SET_LORA) memcpy(dst->lora, src->lora, sizeof dst->lora);
    dst->set |= src->set;
}

/* One section's values: "*" to every model, else to the model named (added when the
 * section gives model = PATH and no such model is listed yet). */
static int section_apply(struct router_list *l, const char *where, const char *name, const struct router_preset *p,
                         const char *model_path, struct err *e)
{
    if (strcmp(name, "*") == 0) {
        if (*model_path)
            return err_setf(e, ERR_ARG, "%s: [*] cannot name a model folder", where);
        for (int i = 0; i < l->n; i++)
            preset_merge(&l->v[i].preset, p);
        return 0;
    }
    struct router_spec *sp = find_spec(l, name);
    if (!sp && *model_path) {
        int rc = router_list_add(l, name, model_path, e);
        if (rc < 0)
            return err_prefix(e, "%s", where);
        sp = &l->v[l->n - 1];
    }
    if (!sp)
        return err_setf(e, ERR_ARG, "%s: [%s] names no model served (add 'model = PATH' to serve one)", where, name);
    preset_merge(&sp->preset, p);
    return 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

/* The INI form. Two passes: the named sections, which may add models, then "[*]" and keys
 * before any section over every model; the named sections' values are applied again last
 * so that a model's own values win over [*]. */
static int presets_ini(struct router_list *l, const char *file, char *buf, struct err *e)
{
    struct router_preset *own = calloc((size_t)ROUTER_MAX_MODELS + 1, sizeof *own);
    char (*names)[ROUTER_NAME_MAX] = calloc((size_t)ROUTER_MAX_MODELS + 1, sizeof *names);
    int n_sec = 0, rc = 0, line = 0;
    struct router_preset global = {0};
    char model_path[4096];
    if (!own || !names) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    int cur = -1;  /* -1: global ([*] or before any section) */
    model_path[0] = 0;
    char where[600], sec_where[600] = "";
    for (char *p = buf, *next; rc == 0 && p && *p; p = next) {
        next = strchr(p, '\n');
        if (next)
            *next++ = 0;
        line++;
        char *s = trim(p);
        snprintf(where, sizeof where, "%s:%d", file, line);
        if (!*s || *s == '#' || *s == ';')
            continue;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (!end || *trim(end + 1))
                rc = err_setf(e, ERR_FORMAT, "%s: a section is [NAME]", where);
            if (rc == 0 && cur >= 0)
                rc = section_apply(l, sec_where, names[cur], &own[cur], model_path, e);
            if (rc < 0)
                break;
            *end = 0;
            char *name = trim(s + 1);
            model_path[0] = 0;
            snprintf(sec_where, sizeof sec_where, "%s", where);
            if (strcmp(name, "*") == 0) {
                cur = -1;
                continue;
            }
            if (n_sec == ROUTER_MAX_MODELS) {
                rc = err_setf(e, ERR_RANGE, "%s: more than %d sections", where, ROUTER_MAX_MODELS);
                break;
            }
            if (strlen(name) >= ROUTER_NAME_MAX) {
                rc = err_setf(e, ERR_ARG, "%s: the section name is too long", where);
                break;
            }
            cur = n_sec++;
            snprintf(names[cur], ROUTER_NAME_MAX, "%s", name);
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = err_setf(e, ERR_FORMAT, "%s: expected 'key = value'", where);
            break;
        }
        *eq = 0;
        const char *key = trim(s), *val = trim(eq + 1);
        if (cur < 0)
            rc = preset_set(&global, NULL, 0, where, key, val, e);
        else
            rc = preset_set(&own[cur], model_path, sizeof model_path, where, key, val, e);
    }
    if (rc == 0 && cur >= 0)
        rc = section_apply(l, sec_where, names[cur], &own[cur], model_path, e);
    if (rc == 0) {
        /* [*] under each model's own values */
        for (int i = 0; i < l->n; i++) {
            struct router_preset mine = l->v[i].preset;
            l->v[i].preset = global;
            preset_merge(&l->v[i].preset, &mine);
        }
    }
out:
    free(own);
    free(names);
    return rc;
}

/* A JSON value as the INI text of it. */
static int json_value_text(const cJSON *v, char *out, size_t cap)
{
    if (cJSON_IsString(v))
        snprintf(out, cap, "%s", v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(out, cap, "%.17g", v->valuedouble);
    else if (cJSON_IsBool(v))
        snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else
        return -1;
    return 0;
}

/* The JSON form: {"*": {...}, "NAME": {...}}. */
static int presets_json(struct router_list *l, const char *file, const char *buf, size_t len, struct err *e)
{
    cJSON *root = cJSON_ParseWithLength(buf, len), *sec, *kv;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_setf(e, ERR_FORMAT, "%s: not a JSON object of sections", file);
    }
    int rc = 0;
    struct router_preset global = {0};
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        cJSON_ArrayForEach(sec, root) {
            bool star = strcmp(sec->string, "*") == 0;
            if (star != (pass == 0))
                continue;
            char where[300], model_path[4096] = "", val[4096];
            snprintf(where, sizeof where, "%s: \"%.64s\"", file, sec->string);
            if (!cJSON_IsObject(sec)) {
                rc = err_setf(e, ERR_FORMAT, "%s: a section is an object", where);
                break;
            }
            struct router_preset p = {0};
            cJSON_ArrayForEach(kv, sec) {
                if (json_value_text(kv, val, sizeof val) < 0) {
                    rc = err_setf(e, ERR_FORMAT, "%s: \"%.64s\" must be a string, number or boolean", where, kv->string);
                    break;
                }
                if ((rc = preset_set(star ? &global : &p, star ? NULL : model_path, sizeof model_path, where,
                                     kv->string, val, e)) < 0)
                    break;
            }
            if (rc == 0 && !star)
                rc = section_apply(l, where, sec->string, &p, model_path, e);
            if (rc < 0)
                break;
        }
    }
    for (int i = 0; rc == 0 && i < l->n; i++) {
        struct router_preset mine = l->v[i].preset;
        l->v[i].preset = global;
        preset_merge(&l->v[i].preset, &mine);
    }
    cJSON_Delete(root);
    return rc;
}

int router_presets_load(struct router_list *l, const char *file, struct err *e)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = file_read_all(file, PRESETS_MAX_BYTES, &buf, &len, e);
    if (rc < 0)
        return err_prefix(e, "--models-preset");
    if (memchr(buf, 0, len)) {
        free(buf);
        return err_setf(e, ERR_FORMAT, "--models-preset %s: a NUL byte in the file", file);
    }
    const char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    rc = *p == '{' ? presets_json(l, file, buf, len, e) : presets_ini(l, file, buf, e);
    free(buf);
    return rc;
}
