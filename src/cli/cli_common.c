/*
 * cli_common: helpers shared by the commands (cli.h): argument parsing with
 * range checks, file reading with a size cap, model-folder resolution.
 *
 * Everything the CLI prints about untrusted names goes through one of two
 * filters: messages on stderr (cli_fail, cli_usage_error) and names in text
 * tables are escaped by src/core/termsafe (control bytes and bytes that are
 * not UTF-8 as \n, \t, \xNN, C1 and bidi controls as \uNNNN), so a message
 * is always one line of valid UTF-8 that cannot drive the terminal; JSON on
 * stdout (cli_print_json) replaces bytes that are not UTF-8 with \ufffd, since
 * cJSON copies strings as they are and its output would otherwise not be
 * JSON, and writes C1 and bidi controls as \u escapes (cJSON escapes C0).
 */
#include "cli.h"
#include "config.h"

#include <cjson/cJSON.h>

#include "../core/fileio.h"
#include "../core/termsafe.h"
#include "../engine/kvcache.h"
#include "../engine/sampler.h"
#include "../hub/hub.h"
#include "../core/log.h"
#include "../kernels/backend.h"
#include "../kernels/backend_plugin.h"
#include "../models/model.h"
#include "../models/tp.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MLXCEL_SOURCE_DIR
#define MLXCEL_SOURCE_DIR "."
#endif
#define DEFAULT_MODEL "models/phixtral-tiny-4bit"
#define MAX_IDS (1 << 24)

/* Length of the valid UTF-8 character at s (n bytes left), 0 when s[0] starts none. */
static size_t utf8_char_len(const char *s, size_t n)
{
    return termsafe_utf8_len(s, n);
}

/* s as one line of valid UTF-8 on f that cannot drive a terminal (termsafe.h). */
static void put_escaped(FILE *f, const char *s)
{
    termsafe_fputs(s, f);
}

int cli_fail(const char *cmd, const struct err *e)
{
    fprintf(stderr, "mlxcel %s: error: ", cmd);
    put_escaped(stderr, e->msg[0] ? e->msg : err_code_name(e->code));
    fputc('\n', stderr);
    return CLI_EXIT_ERROR;
}

void cli_on_swept(void *ud, const char *path, const char *why)
{
    fprintf(stderr, "mlxcel %s: removed %s, the staging folder of a run that did not finish (%s)\n",
            (const char *)ud, path, why);
}

/* errno of the first failed stdout write or flush seen, 0 while none has failed: ferror()
 * keeps only that a write failed, and errno is overwritten by later calls. */
static int g_stdout_errno;

/* fputs to stdout, keeping the errno of a failure (a text longer than stdio's buffer is
 * written, and may fail, inside fputs). */
static void out_puts(const char *s)
{
    if (fputs(s, stdout) == EOF && !g_stdout_errno)
        g_stdout_errno = errno;
}

_Static_assert(sizeof ((struct cli_engine *)0)->tp_be / sizeof(struct backend *) == TP_MAX_RANKS,
               "cli_engine.tp_be holds TP_MAX_RANKS backends");

int cli_tensor_parallel(int *n, struct err *e)
{
    const char *v = cli_cfg()->tensor_parallel;
    long k = 1;
    *n = 1;
    if (!v)
        return 0;
    int rc = cli_parse_int("--tensor-parallel", v, 1, TP_MAX_RANKS, &k, e);
    if (rc < 0)
        return rc;
    *n = (int)k;
    return 0;
}

void cli_help(const char *help, unsigned which)
{
    out_puts(help);
    if (!which)
        return;
    out_puts("\nGlobal options (any position; also as environment variables):\n");
    if (which & CLI_GLOBAL_MODEL)
        out_puts("      --offline          never download: -m owner/name only from the caches (HF_HUB_OFFLINE=1)\n");
    if (which & CLI_GLOBAL_KV)
        out_puts("      --kv-type T        KV cache element type: f32 (default, exact), f16, bf16 (MLXCEL_KV_TYPE)\n");
    if ((which & CLI_GLOBAL_ALL) == CLI_GLOBAL_ALL)
        out_puts("  -tp, --tensor-parallel N  split the model over N ranks (1-8): attention heads, FFN\n"
                 "                         widths and experts' rows, an all-reduce after each (CPU ranks,\n"
                 "                         threads shared among them; default 1)\n");
    if (which & CLI_GLOBAL_RUN)
        out_puts("      --device D         auto, cpu, cuda or cuda:N (MLXCEL_DEVICE; default cpu; auto takes a\n"
                 "                         usable GPU, else the CPU)\n"
                 "      --fast             4-bit products with x rounded to 8 bits, as llama.cpp (MLXCEL_FAST=1)\n"
                 "      --mmap, --no-mmap  read the weights through the file mapping, or copy them into memory\n"
                 "                         whatever its size (MLXCEL_MMAP=1 / 0; default: copy while they fit)\n");
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "mlxcel %s: ", cmd);
    put_escaped(stderr, msg);
    fprintf(stderr, "\nRun `mlxcel %s --help` for usage.\n", cmd);
    return CLI_EXIT_USAGE;
}

int cli_spec_flag(const char *flag, const char *arg, struct spec_params *p, struct err *e)
{
    long v = 0;
    int rc;
    if (strcmp(flag, "spec") == 0) {
        if (strcmp(arg, "ngram") == 0)
            p->mode = SPEC_NGRAM;
        else if (strcmp(arg, "draft") == 0)
            p->mode = SPEC_DRAFT;
        else if (strcmp(arg, "mtp") == 0)
            p->mode = SPEC_MTP;
        else if (strcmp(arg, "none") == 0)
            p->mode = SPEC_NONE;
        else
            return err_setf(e, ERR_ARG, "--spec: '%s' is not none, ngram, draft or mtp", arg);
        return 0;
    }
    if (strcmp(flag, "spec-gate") == 0) {
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0)
            return err_setf(e, ERR_ARG, "--spec-gate: '%s' is not on or off", arg);
        p->gate = strcmp(arg, "on") == 0;
        return 0;
    }
    bool max = strcmp(flag, "draft-max") == 0;
    if ((rc = cli_parse_int(max ? "--draft-max" : "--draft-min", arg, max ? 1 : 0, SPEC_DRAFT_MAX_LIMIT, &v, e)) < 0)
        return rc;
    *(max ? &p->draft_max : &p->draft_min) = (int)v;
    return 0;
}

int cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out, struct err *e)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end)
        return err_setf(e, ERR_ARG, "%s: '%s' is not an integer", flag, s);
    if (v < lo || v > hi)
        return err_setf(e, ERR_ARG, "%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
    *out = v;
    return 0;
}

int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out, struct err *e)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return err_setf(e, ERR_ARG, "%s: '%s' is not a number", flag, s);
    if (v < lo || v > hi)
        return err_setf(e, ERR_ARG, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
    *out = v;
    return 0;
}

int cli_parse_ids(const char *s, int32_t **ids, size_t *n, struct err *e)
{
    size_t cap = 64, len = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return err_setf(e, ERR_NOMEM, "out of memory");
    const char *p = s;
    while (*p && isspace((unsigned char)*p))
        p++;
    bool bracket = *p == '[';
    if (bracket)
        p++;
    for (;;) {
        while (*p && (isspace((unsigned char)*p) || *p == ','))
            p++;
        if (!*p || (bracket && *p == ']'))
            break;
        /* the token runs to the next separator; all of it must be the number */
        size_t tok = strcspn(p, " \t\n\r\v\f,]");
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (tok == 0 || end != p + tok || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return err_setf(e, ERR_ARG, "token ids: '%.*s' (id %zu) is not a non-negative integer id",
                            (int)(tok ? (tok < 40 ? tok : 40) : 1), p, len + 1);
        }
        if (len == cap) {
            if (cap >= MAX_IDS) {
                free(v);
                return err_setf(e, ERR_ARG, "token ids: more than %d ids", MAX_IDS);
            }
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                return err_setf(e, ERR_NOMEM, "out of memory");
            }
            v = nv;
            cap *= 2;
        }
        v[len++] = (int32_t)x;
        p = end;
    }
    if (bracket) {
        if (*p != ']') {
            free(v);
            return err_setf(e, ERR_ARG, "token ids: missing closing ']'");
        }
        p++;
        while (*p && isspace((unsigned char)*p))
            p++;
        if (*p) {
            free(v);
            return err_setf(e, ERR_ARG, "token ids: unexpected text after ']'");
        }
    }
    *ids = v;
    *n = len;
    return 0;
}

int cli_read_input(const char *path, size_t max, char **out, size_t *len, struct err *e)
{
    struct stat st;
    if (strcmp(path, "-") == 0 || strcmp(path, "/dev/stdin") == 0 || strcmp(path, "/dev/fd/0") == 0)
        return file_read_fd(STDIN_FILENO, "standard input", max, out, len, e);
    /* other special files (a FIFO waits for a writer that may never come) are refused by
     * the one opening rule (ADR 0017); the message says how to pipe instead */
    int rc = file_read_all(path, max, out, len, e);
    if (rc < 0 && e && stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        char old[sizeof e->msg];
        snprintf(old, sizeof old, "%s", e->msg);
        err_setf(e, e->code, "%s; `-f -` reads standard input (cat FILE | mlxcel ... -f -)", old);
    }
    return rc;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void cli_models_dir(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", cli_cfg()->models_dir);
}

void cli_hf_hub_dir(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", cli_cfg()->hf_cache);
}

int cli_hf_snapshot(const char *repo_dir, char *buf, size_t cap)
{
    char path[4200], rev[128] = "", *text = NULL;
    snprintf(path, sizeof path, "%s/refs/main", repo_dir);
    if (file_read_scoped(path, FILE_FOLDER, 4096, &text, NULL, NULL) == 0) {
        snprintf(rev, sizeof rev, "%s", text);
        free(text);
        rev[strcspn(rev, "\r\n")] = '\0';
        /* a revision is a hex hash; anything else (a path) is ignored */
        for (char *c = rev; *c; c++)
            if (!isxdigit((unsigned char)*c))
                rev[0] = '\0';
        if (rev[0]) {
            snprintf(path, sizeof path, "%s/snapshots/%s", repo_dir, rev);
            if (is_dir(path) && strlen(path) < cap) {
                snprintf(buf, cap, "%s", path);
                return 0;
            }
        }
    }
    snprintf(path, sizeof path, "%s/snapshots", repo_dir);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *de;
    int found = -1;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char snap[4500];
        snprintf(snap, sizeof snap, "%s/%s", path, de->d_name);
        if (is_dir(snap) && strlen(snap) < cap) {
            snprintf(buf, cap, "%s", snap);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

/* The embedded default model: $MLXCEL_DEFAULT_MODEL, else relative to the executable
 * (/proc/self/exe): <bin>/../models/NAME (the build tree: build/mlxcel) or
 * <bin>/../share/mlxcel/models/NAME (an installed prefix), else in the source tree the
 * binary was built from (baked in, a last resort: it moves or goes away). */
static int default_model(char *buf, size_t cap, struct err *e)
{
    static const char *const k_rel[] = {"../" DEFAULT_MODEL, "../share/mlxcel/" DEFAULT_MODEL};
    const char *env = cli_cfg()->default_model;
    if (env) {
        snprintf(buf, cap, "%s", env);
        return 0;
    }
    char exe[PATH_MAX], bin[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(bin, sizeof bin, "%s", exe);
        }
    }
    for (size_t i = 0; bin[0] && i < sizeof k_rel / sizeof k_rel[0]; i++) {
        if ((size_t)snprintf(buf, cap, "%s/%s", bin, k_rel[i]) < cap && is_dir(buf))
            return 0;
    }
    if ((size_t)snprintf(buf, cap, "%s/%s", MLXCEL_SOURCE_DIR, DEFAULT_MODEL) < cap && is_dir(buf))
        return 0;
    return err_setf(e, ERR_MISSING, "no -m given and the embedded default model was not found (looked in "
                    "%s/../%s, %s/../share/mlxcel/%s and %s/%s; $MLXCEL_DEFAULT_MODEL names another)",
                    bin[0] ? bin : "?", DEFAULT_MODEL, bin[0] ? bin : "?", DEFAULT_MODEL, MLXCEL_SOURCE_DIR,
                    DEFAULT_MODEL);
}

int cli_resolve_model(const char *arg, char *buf, size_t cap, struct err *e)
{
    if (!arg)
        return default_model(buf, cap, e);
    if (strlen(arg) >= cap)
        return err_setf(e, ERR_ARG, "model path is too long");
    if (is_dir(arg)) {
        snprintf(buf, cap, "%s", arg);
        return 0;
    }
    /* owner/name: exactly one slash, no path tricks */
    const char *slash = strchr(arg, '/');
    bool repo_id = slash && slash != arg && slash[1] && !strchr(slash + 1, '/') && !strstr(arg, "..");
    if (!repo_id)
        return err_setf(e, ERR_MISSING, "model '%s' is not a folder", arg);
    char root[4096], path[4200];
    cli_models_dir(root, sizeof root);
    snprintf(path, sizeof path, "%s/%s", root, arg);
    if (is_dir(path) && strlen(path) < cap) {
        snprintf(buf, cap, "%s", path);
        return 0;
    }
    char hub[4096], repo[4400];
    cli_hf_hub_dir(hub, sizeof hub);
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - arg), arg, slash + 1);
    if (is_dir(repo) && cli_hf_snapshot(repo, buf, cap) == 0)
        return 0;
    if (cli_cfg()->offline || hub_repo_check(arg, NULL) < 0)
        return err_setf(e, ERR_MISSING, "model '%s' not found (looked in %s and %s)%s", arg, path, repo,
                        cli_cfg()->offline ? "; offline, so not downloading it" : "");
    return cli_pull_model(arg, buf, cap, e);
}

/* Offset of the first \u0000 escape inside a JSON string of buf, or -1. */
static long find_nul_escape(const char *buf, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_str) {
            in_str = buf[i] == '"';
            continue;
        }
        if (buf[i] == '"') {
            in_str = false;
        } else if (buf[i] == '\\' && i + 1 < len) {
            if (buf[i + 1] == 'u' && i + 5 < len && memcmp(buf + i + 2, "0000", 4) == 0)
                return (long)i;
            i++;  /* the escaped character: \" does not end the string */
        }
    }
    return -1;
}

int cli_parse_json(const char *buf, size_t len, const char *what, cJSON **out, struct err *e)
{
    const char *nul = len ? memchr(buf, '\0', len) : NULL, *end = NULL;
    long esc = find_nul_escape(buf, len);
    *out = NULL;
    if (nul)
        return err_setf(e, ERR_ARG, "%s: a NUL byte at byte %zu (NUL characters cannot go through chat "
                        "templates; remove it)", what, (size_t)(nul - buf));
    if (esc >= 0)
        return err_setf(e, ERR_ARG, "%s: a \\u0000 (NUL) character at byte %ld (NUL characters cannot go "
                        "through chat templates, whose strings end at one; remove it)", what, esc);
    errno = 0;
    cJSON *v = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!v)
        return errno == ENOMEM ? err_setf(e, ERR_NOMEM, "%s: out of memory", what)
                               : err_setf(e, ERR_ARG, "%s is not valid JSON (error at byte %zu of %zu)", what,
                                          end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0, len);
    size_t at = (size_t)(end - buf);
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\n' || buf[at] == '\r'))
        at++;
    if (at != len) {
        cJSON_Delete(v);
        return err_setf(e, ERR_ARG, "%s is not valid JSON (trailing bytes at byte %zu of %zu)", what, at, len);
    }
    *out = v;
    return 0;
}

/* The letter of JSON's short escape of c (\b \f \n \r \t), or 0. */
static char short_escape(unsigned char c)
{
    switch (c) {
    case '\b': return 'b';
    case '\f': return 'f';
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    default: return 0;
    }
}

char *cli_json_quote(const char *s, size_t n)
{
    size_t cap = 6 * n + 3, k = 0;
    char *o = malloc(cap);
    if (!o)
        return NULL;
    o[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            o[k++] = '\\';
            o[k++] = (char)c;
        } else if (c < 0x20 && short_escape(c)) {  /* as cJSON writes them */
            o[k++] = '\\';
            o[k++] = short_escape(c);
        } else if (c < 0x20) {
            k += (size_t)snprintf(o + k, cap - k, "\\u%04x", c);
        } else {
            o[k++] = (char)c;
        }
    }
    o[k++] = '"';
    o[k] = '\0';
    return o;
}

int cli_print_json(struct cJSON *root, struct err *e)
{
    char *s = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return err_setf(e, ERR_NOMEM, "out of memory building the JSON output");
    /* outside strings cJSON writes ASCII, so any invalid byte is inside a string */
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len(s + i, n - i);
        unsigned cp = k ? termsafe_unicode_control(s + i, k) : 0;
        if (k == 0)
            fputs("\\ufffd", stdout);
        else if (cp)
            printf("\\u%04x", cp);
        else
            fwrite(s + i, 1, k, stdout);
        i += k ? k : 1;
    }
    fputc('\n', stdout);
    cJSON_free(s);
    return 0;
}

/* ---- standard output ---- */


static int stdout_error(struct err *e)
{
    return err_setf(e, ERR_IO, "writing standard output: %s",
                    g_stdout_errno ? strerror(g_stdout_errno) : "a write failed");
}

int cli_stdout_check(struct err *e)
{
    errno = 0;
    if (fflush(stdout) != 0 && !g_stdout_errno)
        g_stdout_errno = errno;
    return ferror(stdout) || g_stdout_errno ? stdout_error(e) : 0;
}

int cli_stdout_close(struct err *e)
{
    int rc = cli_stdout_check(e);
    errno = 0;
    if (fclose(stdout) != 0 && rc == 0) {
        g_stdout_errno = errno;
        rc = stdout_error(e);
    }
    return rc;
}

bool cli_stderr_is_tty(void)
{
    return isatty(STDERR_FILENO) == 1;
}

/* ---- formatting ---- */

void cli_format_count(int64_t n, char *buf, size_t cap)
{
    static const struct { double div; const char *suffix; } k_units[] = {
        {1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"},
    };
    for (size_t i = 0; i < sizeof k_units / sizeof k_units[0]; i++) {
        if ((double)n >= k_units[i].div) {
            snprintf(buf, cap, "%.1f%s", (double)n / k_units[i].div, k_units[i].suffix);
            return;
        }
    }
    snprintf(buf, cap, "%lld", (long long)n);
}

void cli_format_bytes(uint64_t n, char *buf, size_t cap)
{
    static const char *const k_units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (n < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)n);
        return;
    }
    double v = (double)n / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof k_units / sizeof k_units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, k_units[u]);
}

// ---- engine ----

int cli_check_generation_config(const struct model *m, struct err *e)
{
    const struct generation_defaults *g = &m->gen;
    const struct {
        enum sampler_field f;
        double v;
    } k_vals[] = {
        {SAMPLER_TEMPERATURE, g->temperature},
        {SAMPLER_TOP_K, g->top_k == GEN_TOP_K_ABSENT ? NAN : g->top_k},
        {SAMPLER_TOP_P, g->top_p},
        {SAMPLER_MIN_P, g->min_p},
        {SAMPLER_REPEAT_PENALTY, g->repeat_penalty},
    };
    char src[4200];
    snprintf(src, sizeof src, "%s/generation_config.json", m->dir);
    for (size_t i = 0; i < sizeof k_vals / sizeof k_vals[0]; i++) {
        int rc;
        if (!isnan(k_vals[i].v) && (rc = sampler_bound_check(k_vals[i].f, k_vals[i].v, src, e)) < 0)
            return rc;
    }
    return 0;
}

int cli_kv_dtype(enum dtype *out, struct err *e)
{
    const char *v = cli_cfg()->kv_type;
    *out = DTYPE_F32;
    if (!v || !*v || strcmp(v, "f32") == 0)
        return 0;
    if (strcmp(v, "f16") == 0)
        *out = DTYPE_F16;
    else if (strcmp(v, "bf16") == 0)
        *out = DTYPE_BF16;
    else
        return err_setf(e, ERR_ARG, "--kv-type: '%.64s' is not one of f32, f16, bf16", v);
    return 0;
}

const char *cli_kv_dtype_name(enum dtype t)
{
    return t == DTYPE_F16 ? "f16" : t == DTYPE_BF16 ? "bf16" : "f32";
}

int cli_engine_open(struct cli_engine *en, struct model *m, long threads, int n_tokens, int max_seqs,
                    int max_seq_len, int swa_slack, struct err *e)
{
    int rc;
    memset(en, 0, sizeof *en);
    if (m->hp.encoder)
        return err_setf(e, ERR_ARG, "'%s' is an encoder (embeddings / reranking): it does not generate "
                        "text; use mlxcel embed, mlxcel rerank or serve's /v1/embeddings", m->hp.model_type);
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = max_seqs, .max_seq_len = max_seq_len,
                           .dtype = DTYPE_F32, .swa_slack = swa_slack};
    if ((rc = cli_kv_dtype(&kp.dtype, e)) < 0)
        return rc;
    const char *dev = cli_cfg()->device;
    int n_tp = 1;
    if ((rc = cli_tensor_parallel(&n_tp, e)) < 0)
        return rc;
    long per = threads;
    if (n_tp > 1) {   /* the threads shared among the ranks */
        long all = threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN);
        per = all / n_tp > 0 ? all / n_tp : 1;
    }
    if ((rc = backend_new(&en->be, dev, (int)per, &cli_cfg()->be, e)) < 0)
        return rc;
    if (dev && strcmp(dev, "auto") == 0 && backend_is_cpu(en->be)) {
        /* auto means "a GPU if there is one": no CUDA at all is said at -v only, a CUDA
         * plugin that loaded but gave no usable GPU always (that is not what was meant) */
        struct err why = {0};
        if (backend_cuda_plugin(cli_cfg()->be.cuda_plugin, &why))
            fprintf(stderr, "mlxcel: warning: --device auto: CUDA is installed but no GPU could be used; "
                    "running on the CPU (--device cuda says why)\n");
        else
            LOG_INFO("--device auto: no CUDA backend (%s); running on the CPU", why.msg[0] ? why.msg : "not built");
    }
    LOG_INFO("backend %s, %d thread%s, KV cache %s", en->be->name, en->be->n_threads,
             en->be->n_threads == 1 ? "" : "s", cli_kv_dtype_name(kp.dtype));
    if (cli_cfg()->be.fast && !en->be->fast)
        fprintf(stderr, "mlxcel: --fast changes nothing on %s (only the CPU backend with AVX2 or "
                "AVX-512 has it); running exact\n", en->be->name);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (n_tp > 1 && !backend_is_cpu(en->be)) {
        /* the library runs CUDA ranks on one GPU (run_tests tp under MLXCEL_DEVICE=cuda checks
         * the split there), which only costs; ranks on several GPUs need NCCL, not built */
        rc = err_setf(e, ERR_UNSUPPORTED, "--tensor-parallel: ranks on %s are not offered (CPU ranks "
                      "only: ranks over several GPUs need NCCL, which is not built yet)", en->be->name);
    } else if (n_tp > 1) {
        en->tp_be[0] = en->be;
        en->n_tp = 1;
        rc = model_tp_split(m, n_tp, e);
        for (int r = 1; r < n_tp && rc == 0; r++)
            if ((rc = backend_new(&en->tp_be[r], dev, (int)per, &cli_cfg()->be, e)) == 0)
                en->n_tp++;
        if (rc == 0 && (rc = model_tp_prepare(m, en->tp_be, e)) == 0)
            LOG_INFO("tensor parallel over %d ranks: attention %s, recurrent mixers %s, the FFN split in "
                     "%d of %d layers, the LM head %s", n_tp,
                     m->tp->attn_split ? "split by heads" : "replicated",
                     m->tp->rec_split ? "split" : "replicated (or none)", m->tp->n_ffn_split, m->hp.n_layer,
                     m->tp->head_split ? "split by vocabulary" : "replicated");
    } else {
        rc = model_prepare(m, en->be, e);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0)
        LOG_INFO("weights ready on %s in %.3f s", en->be->name,
                 (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    if (rc < 0 ||
        (rc = model_ctx_new(&en->ctx, m, en->be, 0, e)) < 0 ||
        (kp.n_batch = en->ctx->n_batch, rc = kv_cache_new(&en->kv, m, en->be, &kp, e)) < 0) {
        cli_engine_close(en);
        return rc;
    }
    return 0;
}

int cli_engine_attach(struct cli_engine *en, const struct cli_engine *on, struct model *m, int n_tokens,
                      int max_seqs, int max_seq_len, int swa_slack, struct err *e)
{
    int rc;
    memset(en, 0, sizeof *en);
    en->be = on->be;
    en->be_borrowed = true;
    struct kv_params kp = {.n_tokens = n_tokens, .max_seqs = max_seqs, .max_seq_len = max_seq_len,
                           .dtype = DTYPE_F32, .swa_slack = swa_slack};
    if ((rc = cli_kv_dtype(&kp.dtype, e)) < 0 || (rc = model_prepare(m, en->be, e)) < 0 ||
        (rc = model_ctx_new(&en->ctx, m, en->be, 0, e)) < 0 ||
        (kp.n_batch = en->ctx->n_batch, rc = kv_cache_new(&en->kv, m, en->be, &kp, e)) < 0) {
        cli_engine_close(en);
        return rc;
    }
    return 0;
}

int cli_draft_open(struct cli_draft *d, const char *path, const struct model *target, const struct cli_engine *on,
                   int n_tokens, int max_seqs, int draft_max, struct err *e)
{
    char dir[4096];
    int rc;
    memset(d, 0, sizeof *d);
    if ((rc = cli_resolve_model(path, dir, sizeof dir, e)) < 0 || (rc = cli_model_load(&d->m, dir, e)) < 0 ||
        (rc = spec_model_check(target, d->m, NULL, e)) < 0)
        return err_prefix(e, "--model-draft %s", path);
    /* a draft model with a shorter context drafts only while the history fits it */
    int ctx = hparams_ctx_default(&d->m->hp) < on->kv->max_seq_len ? hparams_ctx_default(&d->m->hp)
                                                                   : on->kv->max_seq_len;
    if ((rc = cli_engine_attach(&d->en, on, d->m, n_tokens + max_seqs * SPEC_DRAFT_MAX_LIMIT, max_seqs, ctx,
                                draft_max, e)) < 0 ||
        (rc = spec_model_check(target, d->m, d->en.kv, e)) < 0 || (rc = spec_model_new(&d->sm, d->en.ctx, d->en.kv, e)) < 0)
        return err_prefix(e, "--model-draft %s", path);
    return 0;
}

int cli_mtp_open(struct cli_draft *d, const char *dir, const struct model *target, const struct cli_engine *on,
                 int n_tokens, int max_seqs, int draft_max, struct err *e)
{
    int rc;
    memset(d, 0, sizeof *d);
    /* the layer's cache follows the model's sequences, plus each one's chained drafts */
    if ((rc = model_load_mtp(&d->m, dir, e)) < 0 || (rc = spec_mtp_check(target, d->m, e)) < 0 ||
        (rc = cli_engine_attach(&d->en, on, d->m, n_tokens + max_seqs * SPEC_DRAFT_MAX_LIMIT, max_seqs,
                                on->kv->max_seq_len, draft_max, e)) < 0 ||
        (rc = spec_mtp_new(&d->mtp, d->en.ctx, d->en.kv, e)) < 0) {
        cli_draft_close(d);
        return err_prefix(e, "--spec mtp");
    }
    return 0;
}

int cli_draft_use(const struct cli_draft *d, struct spec_params *p, struct err *e)
{
    if (d->sm) {
        p->draft = spec_model_draft;
        p->prefill = spec_model_prefill;
        p->draft_ud = d->sm;
    } else if (d->mtp) {
        p->draft = spec_mtp_draft;
        p->observe = spec_mtp_observe;
        p->draft_ud = d->mtp;
    }
    return spec_params_check(p, e);
}

void cli_draft_close(struct cli_draft *d)
{
    spec_mtp_free(d->mtp);
    spec_model_free(d->sm);
    cli_engine_close(&d->en);
    model_free(d->m);
    memset(d, 0, sizeof *d);
}

void cli_engine_close(struct cli_engine *en)
{
    kv_cache_free(en->kv);
    model_ctx_free(en->ctx);
    for (int r = 1; r < en->n_tp; r++)
        backend_free(en->tp_be[r]);
    if (!en->be_borrowed)
        backend_free(en->be);
    memset(en, 0, sizeof *en);
}
