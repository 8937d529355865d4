/*
 * hub_names: the pure parts of the Hub client (hub.h): repository, revision
 * and file-name checks, the include/exclude filter, the listing parser, and
 * where the cache and the endpoint are. Nothing here touches the network;
 * everything is unit-tested (tests/test_hub.c).
 *
 * The listing is untrusted: a file name becomes a path under
 * snapshots/<commit>/, so it must be relative and free of "." and ".."
 * components; a size becomes a disk-space reservation and a transfer bound,
 * so it must be a non-negative integer below HUB_FILE_MAX.
 */
#include "hub.h"
#include "hub_impl.h"

#include <ctype.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "../core/json.h"

/* Hub limits (huggingface_hub's validate_repo_id): 96 bytes per part. */
#define REPO_PART_MAX 96
#define REVISION_MAX  255
#define COMPONENT_MAX 255

// ---- names ----

static bool repo_char_ok(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

static int repo_part_check(const char *p, size_t n, const char *repo, struct err *e)
{
    if (n == 0 || n > REPO_PART_MAX)
        return err_setf(e, ERR_ARG, "repository '%s': each part of owner/name must be 1 to %d characters",
                        repo, REPO_PART_MAX);
    for (size_t i = 0; i < n; i++)
        if (!repo_char_ok(p[i]))
            return err_setf(e, ERR_ARG,
                            "repository '%s': only letters, digits, '-', '_' and '.' are allowed", repo);
    if (p[0] == '-' || p[0] == '.' || p[n - 1] == '-' || p[n - 1] == '.')
        return err_setf(e, ERR_ARG, "repository '%s': a part may not start or end with '-' or '.'", repo);
    return 0;
}

int hub_repo_check(const char *repo, struct err *e)
{
    const char *slash = strchr(repo, '/');
    if (!slash || strchr(slash + 1, '/'))
        return err_setf(e, ERR_ARG, "repository '%s' is not of the form owner/name", repo);
    if (strstr(repo, "--") || strstr(repo, ".."))
        return err_setf(e, ERR_ARG, "repository '%s': '--' and '..' are not allowed", repo);
    int rc;
    if ((rc = repo_part_check(repo, (size_t)(slash - repo), repo, e)) < 0)
        return rc;
    return repo_part_check(slash + 1, strlen(slash + 1), repo, e);
}

int hub_revision_check(const char *rev, struct err *e)
{
    size_t n = strlen(rev);
    if (n == 0 || n > REVISION_MAX)
        return err_setf(e, ERR_ARG, "revision must be 1 to %d characters", REVISION_MAX);
    for (size_t i = 0; i < n; i++)
        if (!repo_char_ok(rev[i]) && rev[i] != '/')
            return err_setf(e, ERR_ARG, "revision '%s': only letters, digits, '-', '_', '.' and '/' are allowed",
                            rev);
    if (rev[0] == '/' || rev[n - 1] == '/' || strstr(rev, "..") || strstr(rev, "//") ||
        rev[0] == '.' || strstr(rev, "/."))
        return err_setf(e, ERR_ARG, "revision '%s' is not a valid branch, tag or commit", rev);
    return 0;
}

bool hub_name_is_safe(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= HUB_NAME_MAX || name[0] == '/')
        return false;
    const char *c = name;
    for (;;) {
        size_t k = strcspn(c, "/");
        if (k == 0 || k > COMPONENT_MAX || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        for (size_t i = 0; i < k; i++)
            if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f || c[i] == '\\')
                return false;
        if (!c[k])
            return true;
        c += k + 1;
    }
}

bool hub_name_is_default(const char *name)
{
    /* what inference reads: weights, configs (config.json, tokenizer_config.json, the
     * safetensors index, generation_config.json), tokenizer vocabularies (tokenizer.json,
     * SentencePiece tokenizer.model, tiktoken files, vocab.txt/merges.txt), chat templates,
     * and the model card; not bin/pth/gguf/onnx/msgpack files or images */
    static const char *const k_default[] = {
        "*.safetensors", "*.json", "*.jinja", "tokenizer.model", "*.tiktoken", "tiktoken.model",
        "*.txt", "README.md",
    };
    for (size_t i = 0; i < sizeof k_default / sizeof k_default[0]; i++)
        if (fnmatch(k_default[i], name, 0) == 0)
            return true;
    return false;
}

bool hub_name_is_wanted(const char *name, const char *const *include, size_t n_include,
                        const char *const *exclude, size_t n_exclude)
{
    bool in = n_include == 0 && hub_name_is_default(name);
    for (size_t i = 0; i < n_include && !in; i++)
        in = fnmatch(include[i], name, 0) == 0;
    for (size_t i = 0; i < n_exclude && in; i++)
        in = fnmatch(exclude[i], name, 0) != 0;
    return in;
}

bool hub_hex_is_valid(const char *s, size_t min, size_t max)
{
    size_t n = strlen(s);
    if (n < min || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
            return false;
    return true;
}

// ---- listing ----

void hub_listing_deinit(struct hub_listing *l)
{
    for (size_t i = 0; i < l->n_files; i++)
        free(l->files[i].name);
    free(l->files);
    memset(l, 0, sizeof *l);
}

/* A size field: absent -> -1, else a non-negative integer below HUB_FILE_MAX. */
static int size_field(const cJSON *o, const char *key, const char *file, int64_t *out, struct err *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = -1;
    if (!v || cJSON_IsNull(v))
        return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
    if (!(d >= 0.0 && d <= (double)HUB_FILE_MAX) || floor(d) != d)
        return err_setf(e, ERR_FORMAT, "listing: file '%.200s' declares a size outside [0, %lld bytes]", file,
                        (long long)HUB_FILE_MAX);
    *out = (int64_t)d;
    return 0;
}

static int parse_sibling(struct hub_file *f, const cJSON *s, struct err *e)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
    if (!cJSON_IsString(name))
        return err_setf(e, ERR_FORMAT, "listing: a sibling has no \"rfilename\" string");
    if (!hub_name_is_safe(name->valuestring))
        return err_setf(e, ERR_FORMAT, "listing: refusing unsafe file name '%.200s' (it would leave the snapshot)",
                        name->valuestring);
    int rc;
    int64_t lfs_size = -1;
    if ((rc = size_field(s, "size", name->valuestring, &f->size, e)) < 0)
        return rc;
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
    if (cJSON_IsObject(lfs)) {
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(lfs, "sha256");
        if (!cJSON_IsString(sha) || !hub_hex_is_valid(sha->valuestring, 64, 64))
            return err_setf(e, ERR_FORMAT, "listing: file '%.200s' has an LFS entry without a valid sha256",
                            name->valuestring);
        snprintf(f->sha256, sizeof f->sha256, "%s", sha->valuestring);
        if ((rc = size_field(lfs, "size", name->valuestring, &lfs_size, e)) < 0)
            return rc;
        if (lfs_size >= 0 && f->size >= 0 && lfs_size != f->size)
            return err_setf(e, ERR_FORMAT, "listing: file '%.200s' declares two sizes (%lld and %lld)",
                            name->valuestring, (long long)f->size, (long long)lfs_size);
        if (f->size < 0)
            f->size = lfs_size;
    }
    f->name = strdup(name->valuestring);
    return f->name ? 0 : err_setf(e, ERR_NOMEM, "out of memory");
}

static int cmp_name(const void *a, const void *b);

/* File i is listed once and no other file uses it (or any prefix of it) as a folder:
 * "a" beside "a/b" cannot both exist in the snapshot. The files are sorted by name. */
static int check_unique(const struct hub_listing *l, size_t i, struct err *e)
{
    const char *name = l->files[i].name;
    if (i > 0 && strcmp(l->files[i - 1].name, name) == 0)
        return err_setf(e, ERR_FORMAT, "listing: file '%.200s' is listed twice", name);
    char prefix[HUB_NAME_MAX];
    for (const char *s = strchr(name, '/'); s; s = strchr(s + 1, '/')) {
        snprintf(prefix, sizeof prefix, "%.*s", (int)(s - name), name);
        struct hub_file key = {.name = prefix};
        if (bsearch(&key, l->files, l->n_files, sizeof *l->files, cmp_name))
            return err_setf(e, ERR_FORMAT, "listing: '%.200s' is both a file and a folder", prefix);
    }
    return 0;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct hub_file *)a)->name, ((const struct hub_file *)b)->name);
}

/* The offset of the first \u0000 escape inside a JSON string of doc, or -1. The reader
 * ends its strings at a NUL, so such a file name would arrive cut short: "a.json\u0000../x"
 * as "a.json", another file than the one listed. Escaped backslashes are skipped. */
static long nul_escape_at(const char *doc, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) {
            in_str = doc[i] == '"';
        } else if (doc[i] == '"') {
            in_str = false;
        } else if (doc[i] == '\\' && i + 1 < len) {
            if (doc[i + 1] == 'u' && i + 5 < len && strncmp(doc + i + 2, "0000", 4) == 0)
                return (long)i;
            i++;
        }
    }
    return -1;
}

int hub_listing_parse(struct hub_listing *l, const char *doc, size_t len, struct err *e)
{
    cJSON *root = NULL;
    int rc;
    memset(l, 0, sizeof *l);
    if ((rc = json_parse_object(doc, len, "the repository listing", &root, e)) < 0)
        return rc;
    long nul = nul_escape_at(doc, len);
    if (nul >= 0) {
        cJSON_Delete(root);
        return err_setf(e, ERR_FORMAT, "listing: a string holds a NUL character (\\u0000 at byte %ld); refusing "
                        "it, since a file name would be cut there", nul);
    }
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(root, "sha");
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(root, "siblings");
    if (!cJSON_IsString(sha) || !hub_hex_is_valid(sha->valuestring, 40, 40)) {
        rc = err_setf(e, ERR_FORMAT, "listing: \"sha\" is not a 40-digit commit hash");
        goto out;
    }
    snprintf(l->commit, sizeof l->commit, "%s", sha->valuestring);
    if (!cJSON_IsArray(sib)) {
        rc = err_setf(e, ERR_FORMAT, "listing: \"siblings\" is not an array");
        goto out;
    }
    int n = cJSON_GetArraySize(sib);
    if (n > HUB_FILES_MAX) {
        rc = err_setf(e, ERR_FORMAT, "listing: %d files (more than %d)", n, HUB_FILES_MAX);
        goto out;
    }
    l->files = calloc(n ? (size_t)n : 1, sizeof *l->files);
    if (!l->files) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    const cJSON *s;
    cJSON_ArrayForEach(s, sib) {
        if ((rc = parse_sibling(&l->files[l->n_files], s, e)) < 0)
            goto out;
        l->n_files++;
    }
    qsort(l->files, l->n_files, sizeof *l->files, cmp_name);
    for (size_t i = 0; i < l->n_files; i++) {
        if ((rc = check_unique(l, i, e)) < 0)
            goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc < 0)
        hub_listing_deinit(l);
    return rc;
}
