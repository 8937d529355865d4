/*
 * list: `mlxcel list [--json]` shows the checkpoints `-m owner/name` can
 * resolve, from two roots (the same ones cli_resolve_model searches):
 *
 *   mlxcel  cli_models_dir()/<owner>/<name>/config.json
 *   hf      cli_hf_hub_dir()/models--<owner>--<name>/snapshots/<rev>/ (read-only;
 *           the snapshot is the one cli_hf_snapshot picks: refs/main, else any)
 *
 * For each: model_type and our family from config.json, quantization, the
 * size of its *.safetensors files (stat follows symlinks, so HF snapshot links
 * into blobs/ count the blob), and the folder. Folders are untrusted: only two
 * levels are walked (no recursion, so symlink loops cannot trap us), entries
 * are capped at LIST_MAX_ENTRIES, unreadable ones are skipped, and a broken
 * config.json is reported as "invalid config" rather than failing the listing.
 * A supported model with files missing (cli_snapshot_check: shards its index
 * names, weights, link targets, unfinished downloads) is "partial", with a hint
 * to pull it again on stderr.
 */
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../core/termsafe.h"
#include "../loading/config.h"
#include "../loading/quant.h"
#include "../models/registry.h"
#include "cli.h"

#define LIST_MAX_ENTRIES 10000
/* Files looked at per model folder when summing weight sizes. */
#define LIST_MAX_FILES   100000
#define LIST_PATH_MAX    4096

static const char *k_help =
    "usage: mlxcel list [--json]\n"
    "\n"
    "List downloaded models that `-m owner/name` can use:\n"
    "  mlxcel  $MLXCEL_MODELS_DIR/<owner>/<name>/ (default ~/.cache/mlxcel/models)\n"
    "  hf      the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub)\n"
    "STATUS is ok, partial (files missing: `mlxcel pull owner/name` completes it),\n"
    "unsupported (a model_type mlxcel does not run) or invalid config.\n"
    "  --json    print a JSON array\n"
    "  -h, --help show this help\n";

enum list_status { LIST_OK = 0, LIST_UNSUPPORTED = 1, LIST_INVALID = 2, LIST_PARTIAL = 3 };

struct list_entry {
    char name[512];            /* owner/name */
    const char *source;        /* "mlxcel" or "hf" */
    char path[LIST_PATH_MAX];
    char model_type[64];       /* "" when config.json has none */
    const char *family;        /* NULL unless LIST_OK or LIST_PARTIAL */
    enum list_status status;
    char missing[320];         /* LIST_PARTIAL: what is missing (cli_snapshot_describe) */
    struct qparams q;          /* top-level quantization; bits 0: none or invalid */
    int q_n_ov;                /* per-module overrides */
    uint64_t size;             /* bytes of *.safetensors */
};

struct list {
    struct list_entry *v;
    size_t n, cap;
    bool truncated;
};

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- one model folder ---- */

static uint64_t safetensors_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    uint64_t total = 0;
    struct dirent *de;
    for (size_t seen = 0; seen < LIST_MAX_FILES && (de = readdir(d)); seen++) {
        char p[LIST_PATH_MAX + 256];
        struct stat st;
        if (!has_suffix(de->d_name, ".safetensors"))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
            total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* The loader's own parser: a quantization object it would refuse reads as an invalid config. */
static void read_quantization(struct list_entry *le, const cJSON *cfg)
{
    struct qconfig qc;
    if (qconfig_parse(&qc, cfg, NULL) < 0) {
        le->status = LIST_INVALID;
        return;
    }
    le->q = qc.top;
    le->q_n_ov = qc.n_ov;
    qconfig_free(&qc);
}

/* Fill model_type, family, quantization and size from the folder's files. */
static void describe(struct list_entry *le)
{
    char p[LIST_PATH_MAX + 32];
    cJSON *cfg = NULL;
    const struct model_ops *ops = NULL;
    snprintf(p, sizeof p, "%s/config.json", le->path);
    le->size = safetensors_bytes(le->path);
    if (cfg_load_file(p, FILE_FOLDER, &cfg, NULL) < 0) {
        le->status = LIST_INVALID;
        return;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (cJSON_IsString(mt))
        snprintf(le->model_type, sizeof le->model_type, "%s", mt->valuestring);
    if (registry_resolve(cfg, &ops, NULL) == 0 && ops) {
        le->status = LIST_OK;
        le->family = ops->family;
    } else {
        le->status = LIST_UNSUPPORTED;
    }
    read_quantization(le, cfg);
    cJSON_Delete(cfg);
    struct cli_snapshot_check sc;
    cli_snapshot_check(le->path, &sc);
    if (le->status == LIST_OK && cli_snapshot_is_partial(&sc)) {
        le->status = LIST_PARTIAL;
        cli_snapshot_describe(&sc, le->missing, sizeof le->missing);
    }
}

static void add(struct list *l, const char *owner, int owner_len, const char *name,
                const char *source, const char *path)
{
    if (l->n == LIST_MAX_ENTRIES) {
        l->truncated = true;
        return;
    }
    if (strlen(path) >= LIST_PATH_MAX || (size_t)owner_len + strlen(name) + 2 > sizeof l->v->name)
        return;
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 32;
        struct list_entry *v = realloc(l->v, nc * sizeof *v);
        if (!v) {
            l->truncated = true;
            return;
        }
        l->v = v;
        l->cap = nc;
    }
    struct list_entry *le = &l->v[l->n++];
    memset(le, 0, sizeof *le);
    snprintf(le->name, sizeof le->name, "%.*s/%s", owner_len, owner, name);
    le->source = source;
    snprintf(le->path, sizeof le->path, "%s", path);
    describe(le);
}

/* ---- roots ---- */

/* <root>/<owner>/<name>/config.json */
static void scan_models_dir(struct list *l, const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return;
    struct dirent *o;
    while (!l->truncated && (o = readdir(d))) {
        char owner_dir[LIST_PATH_MAX];
        if (o->d_name[0] == '.')
            continue;
        if ((size_t)snprintf(owner_dir, sizeof owner_dir, "%s/%s", root, o->d_name) >= sizeof owner_dir ||
            !is_dir(owner_dir))
            continue;
        DIR *od = opendir(owner_dir);
        if (!od)
            continue;
        struct dirent *n;
        while (!l->truncated && (n = readdir(od))) {
            char model_dir[LIST_PATH_MAX], cfg[LIST_PATH_MAX + 16];
            struct stat st;
            if (n->d_name[0] == '.')
                continue;
            if ((size_t)snprintf(model_dir, sizeof model_dir, "%s/%s", owner_dir, n->d_name) >=
                sizeof model_dir)
                continue;
            snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
            if (is_dir(model_dir) && stat(cfg, &st) == 0)
                add(l, o->d_name, (int)strlen(o->d_name), n->d_name, "mlxcel", model_dir);
        }
        closedir(od);
    }
    closedir(d);
}

/* <hub>/models--<owner>--<name>/snapshots/<rev>/ */
static void scan_hf_hub(struct list *l, const char *hub)
{
    static const char prefix[] = "models--";
    DIR *d = opendir(hub);
    if (!d)
        return;
    struct dirent *de;
    while (!l->truncated && (de = readdir(d))) {
        char repo[LIST_PATH_MAX], snap[LIST_PATH_MAX];
        if (strncmp(de->d_name, prefix, sizeof prefix - 1) != 0)
            continue;
        const char *id = de->d_name + sizeof prefix - 1;
        const char *sep = strstr(id, "--");
        if (!sep || sep == id || !sep[2])
            continue;
        if ((size_t)snprintf(repo, sizeof repo, "%s/%s", hub, de->d_name) >= sizeof repo ||
            !is_dir(repo) || cli_hf_snapshot(repo, snap, sizeof snap) != 0)
            continue;
        add(l, id, (int)(sep - id), sep + 2, "hf", snap);
    }
    closedir(d);
}

static int cmp_entry(const void *a, const void *b)
{
    const struct list_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->source, y->source);
}

/* ---- output ---- */

static const char *family_text(const struct list_entry *le)
{
    switch (le->status) {
    case LIST_OK: return le->family;
    case LIST_UNSUPPORTED: return "unsupported";
    case LIST_INVALID: return "invalid config";
    case LIST_PARTIAL: return "partial";
    }
    return "?";
}

static void print_text(const struct list *l)
{
    int wn = 4;
    for (size_t i = 0; i < l->n; i++)
        if ((int)strlen(l->v[i].name) > wn)
            wn = (int)strlen(l->v[i].name);
    printf("%-*s  %-6s  %-14s  %-14s  %-12s  %10s  %s\n", wn, "NAME", "SOURCE", "MODEL_TYPE",
           "FAMILY/STATUS", "QUANT", "SIZE", "PATH");
    for (size_t i = 0; i < l->n; i++) {
        const struct list_entry *le = &l->v[i];
        char quant[32], size[32];
        if (le->q.bits && le->q.mode == QMODE_AFFINE)
            snprintf(quant, sizeof quant, "%d-bit g%d%s", le->q.bits, le->q.group, le->q_n_ov ? "+" : "");
        else if (le->q.bits)
            snprintf(quant, sizeof quant, "%s%s", qmode_name(le->q.mode), le->q_n_ov ? "+" : "");
        else
            snprintf(quant, sizeof quant, "none");
        cli_format_bytes(le->size, size, sizeof size);
        /* names, model_type and paths come from the disk: escaped (termsafe.h) */
        char name[1024], mt[256], path[4200];
        printf("%-*s  %-6s  %-14s  %-14s  %-12s  %10s  %s\n", wn, termsafe_str(le->name, name, sizeof name),
               le->source, le->model_type[0] ? termsafe_str(le->model_type, mt, sizeof mt) : "-",
               family_text(le), quant, size, termsafe_str(le->path, path, sizeof path));
    }
    if (l->n == 0)
        printf("(no models found)\n");
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].status == LIST_PARTIAL)
            fprintf(stderr, "mlxcel list: %s (%s) is partial: %s; `mlxcel pull %s` completes it\n", l->v[i].name,
                    l->v[i].source, l->v[i].missing, l->v[i].name);
}

static int print_json(const struct list *l, struct err *e)
{
    static const char *const k_status[] = {"ok", "unsupported", "invalid config", "partial"};
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < l->n; i++) {
        const struct list_entry *le = &l->v[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            break;
        cJSON_AddStringToObject(o, "name", le->name);
        cJSON_AddStringToObject(o, "source", le->source);
        if (le->model_type[0])
            cJSON_AddStringToObject(o, "model_type", le->model_type);
        else
            cJSON_AddNullToObject(o, "model_type");
        if (le->status == LIST_OK || le->status == LIST_PARTIAL)
            cJSON_AddStringToObject(o, "family", le->family);
        else
            cJSON_AddNullToObject(o, "family");
        cJSON_AddStringToObject(o, "status", k_status[le->status]);
        if (le->status == LIST_PARTIAL)
            cJSON_AddStringToObject(o, "missing", le->missing);
        if (le->q.bits) {
            cJSON *q = cJSON_AddObjectToObject(o, "quantization");
            if (q) {
                cJSON_AddStringToObject(q, "mode", qmode_name(le->q.mode));
                cJSON_AddNumberToObject(q, "bits", le->q.bits);
                cJSON_AddNumberToObject(q, "group_size", le->q.group);
                cJSON_AddNumberToObject(q, "overrides", le->q_n_ov);
            }
        } else {
            cJSON_AddNullToObject(o, "quantization");
        }
        /* weight_bytes as in `inspect` and `bench`; size_bytes, the older name, stays */
        cJSON_AddNumberToObject(o, "size_bytes", (double)le->size);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)le->size);
        cJSON_AddStringToObject(o, "path", le->path);
    }
    return cli_print_json(arr, e);
}

/* ---- command ---- */

int cmd_list(int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'J'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    bool json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'J': json = true; break;
        case 'h': fputs(k_help, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("list", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("list", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("list", "unexpected argument '%s'", argv[optind]);

    struct list l = {0};
    struct err e = {0};
    char root[LIST_PATH_MAX];
    cli_models_dir(root, sizeof root);
    scan_models_dir(&l, root);
    cli_hf_hub_dir(root, sizeof root);
    scan_hf_hub(&l, root);
    if (l.n > 1)
        qsort(l.v, l.n, sizeof *l.v, cmp_entry);

    int status = CLI_EXIT_OK;
    if (json) {
        if (print_json(&l, &e) < 0)
            status = cli_fail("list", &e);
    } else {
        print_text(&l);
    }
    if (l.truncated)
        fprintf(stderr, "mlxcel list: stopped after %zu entries\n", l.n);
    free(l.v);
    return status;
}
