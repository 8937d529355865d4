/*
 * pull: `mlxcel pull owner/name` downloads a model repository from the
 * Hugging Face Hub into the shared Hugging Face cache (src/hub/hub.h does the
 * work; this file parses flags and shows progress).
 *
 * Output: the snapshot folder on stdout (or a JSON summary with --json). On a
 * terminal, stderr shows a bar per running transfer plus a total, redrawn in
 * place; in a pipe pull is quiet. cli_pull_model is the same pull for the
 * commands that take -m owner/name and find it in no cache: it says what it
 * fetches, one line per file.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/termsafe.h"
#include "../hub/hub.h"
#include "cli.h"
#include "config.h"

#define MAX_GLOBS 64
#define BAR_WIDTH 24

static const char *k_help =
    "usage: mlxcel pull owner/name [options]\n"
    "\n"
    "Download a model from the Hugging Face Hub into the Hugging Face cache\n"
    "($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub), laid out as huggingface_hub\n"
    "lays it out, and print the snapshot folder. Transfers resume after an interruption,\n"
    "large files are checked against their sha256, files already there are not fetched again.\n"
    "By default it fetches what inference needs: *.safetensors, *.json, tokenizer files,\n"
    "chat templates (*.jinja), *.txt and README.md.\n"
    "  --revision REV   branch, tag or commit (default main)\n"
    "  --include GLOB   fetch only matching files (repeatable; replaces the default set)\n"
    "  --exclude GLOB   skip matching files (repeatable)\n"
    "  --token T        Hub token (default $HF_TOKEN, else the `huggingface-cli login` file)\n"
    "  --jobs N         parallel transfers (default 4)\n"
    "  --offline        only look in the cache (also HF_HUB_OFFLINE=1)\n"
    "  --json           print a JSON summary\n"
    "  -h, --help       show this help\n"
    "A request that does not connect, or then receives nothing, for 10 s fails its attempt\n"
    "(huggingface_hub's timeouts); each is tried 5 times with doubling delays, said on stderr.\n"
    "Environment: HF_ENDPOINT (default https://huggingface.co), HF_HOME, HF_HUB_CACHE, HF_TOKEN,\n"
    "HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT (seconds, default 10: listing and HEAD\n"
    "requests, file transfers).\n";

// ---- progress ----

struct pull_view {
    bool tty;           /* bars on stderr */
    bool lines;         /* one line per fetched file (automatic pulls in a pipe) */
    int drawn;          /* lines drawn last time (tty) */
    bool *told;         /* per file: its line was printed (lines mode) */
    size_t n_told;
};

static void draw_bar(const char *label, int64_t done, int64_t total)
{
    char a[32], b[32], bar[BAR_WIDTH + 1];
    int fill = total > 0 ? (int)(done * BAR_WIDTH / total) : BAR_WIDTH;
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    cli_format_bytes((uint64_t)done, a, sizeof a);
    cli_format_bytes((uint64_t)total, b, sizeof b);
    fprintf(stderr, "\033[K%-32.32s [%s] %3d%% %s / %s\n", label, bar,
            total > 0 ? (int)(done * 100 / total) : 100, a, b);
}

static void on_progress(void *ud, const struct hub_pull *p)
{
    struct pull_view *v = ud;
    const struct hub_listing *l = &p->list;
    if (v->lines && !v->told && l->n_files) {
        v->told = calloc(l->n_files, sizeof *v->told);
        v->n_told = v->told ? l->n_files : 0;
    }
    if (v->lines) {
        for (size_t i = 0; i < v->n_told; i++) {
            if (l->files[i].state == HUB_FILE_DONE && !v->told[i]) {
                char b[32];
                cli_format_bytes((uint64_t)l->files[i].size, b, sizeof b);
                char name[1024];
                fprintf(stderr, "mlxcel: fetched %s/%s (%s)\n", p->repo,
                        termsafe_str(l->files[i].name, name, sizeof name), b);
                v->told[i] = true;
            }
        }
        return;
    }
    if (!v->tty)
        return;
    if (v->drawn)
        fprintf(stderr, "\033[%dA", v->drawn);
    int n = 0;
    int64_t done = 0;
    for (size_t i = 0; i < l->n_files; i++) {
        const struct hub_file *f = &l->files[i];
        if (f->state == HUB_FILE_ACTIVE) {
            char name[512];  /* a name from the Hub's listing: escaped (C1, bidi) */
            draw_bar(termsafe_str(f->name, name, sizeof name), f->done, f->size);
            n++;
        }
        if (f->state != HUB_FILE_CACHED)
            done += f->done;
    }
    char label[64];
    snprintf(label, sizeof label, "total (%zu files)", l->n_files - p->n_cached);
    draw_bar(label, done, p->fetch_bytes);
    n++;
    fprintf(stderr, "\033[J");
    fflush(stderr);
    v->drawn = n;
}

/* A retry: said on stderr whether or not it is a terminal (a silent wait reads as a hang);
 * the bars, if drawn, are cleared first and redrawn below it at the next progress call. */
static void on_notice(void *ud, const char *line)
{
    struct pull_view *v = ud;
    if (v->drawn)
        fprintf(stderr, "\033[%dA\033[J", v->drawn);
    v->drawn = 0;
    fprintf(stderr, "mlxcel: %s\n", line);
}

/* $HF_HUB_ETAG_TIMEOUT and $HF_HUB_DOWNLOAD_TIMEOUT as huggingface_hub reads them (whole
 * seconds); a value that is not a positive integer is said and the default kept. */
static void env_timeouts(struct hub_opts *o)
{
    static const char *const k_env[] = {"HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"};
    const char *k_val[] = {cli_cfg()->hf_etag_timeout, cli_cfg()->hf_download_timeout};
    int *k_dst[] = {&o->etag_timeout_s, &o->download_timeout_s};
    for (int i = 0; i < 2; i++) {
        const char *v = k_val[i];
        if (!v)
            continue;
        char *end;
        errno = 0;
        long t = strtol(v, &end, 10);
        if (errno || *end || t <= 0 || t > 86400) {
            fprintf(stderr, "mlxcel: %s='%.32s' is not a number of seconds in [1, 86400]; using %d\n", k_env[i], v,
                    HUB_TIMEOUT_S_DEFAULT);
            continue;
        }
        *k_dst[i] = (int)t;
    }
}

// ---- output ----

static int print_json(const struct hub_pull *p, struct err *e)
{
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateArray();
    if (root && files) {
        cJSON_AddStringToObject(root, "repo", p->repo);
        cJSON_AddStringToObject(root, "revision", p->revision);
        cJSON_AddStringToObject(root, "commit", p->list.commit);
        cJSON_AddStringToObject(root, "snapshot", p->snapshot);
        cJSON_AddNumberToObject(root, "n_fetched", (double)p->n_fetched);
        cJSON_AddNumberToObject(root, "n_cached", (double)p->n_cached);
        cJSON_AddNumberToObject(root, "bytes_fetched", (double)p->fetched_bytes);
        cJSON_AddNumberToObject(root, "bytes_total", (double)p->total_bytes);
        for (size_t i = 0; i < p->list.n_files; i++) {
            const struct hub_file *f = &p->list.files[i];
            cJSON *o = cJSON_CreateObject();
            if (!o)
                break;
            cJSON_AddStringToObject(o, "name", f->name);
            cJSON_AddNumberToObject(o, "size", (double)f->size);
            cJSON_AddStringToObject(o, "etag", f->etag);
            cJSON_AddBoolToObject(o, "fetched", f->state == HUB_FILE_DONE);
            cJSON_AddItemToArray(files, o);
        }
    }
    cJSON_AddItemToObject(root, "files", files);
    return cli_print_json(root, e);
}

// ---- command ----

int cli_pull_model(const char *repo, char *buf, size_t cap, struct err *e)
{
    struct pull_view v = {.tty = cli_stderr_is_tty()};
    v.lines = !v.tty;
    struct hub_opts o = {.progress = on_progress, .notice = on_notice, .ud = &v};
    struct hub_pull p;
    env_timeouts(&o);
    cli_hub_opts(&o);
    fprintf(stderr, "mlxcel: %s is not in the cache; pulling it from %s (--offline or HF_HUB_OFFLINE=1 "
            "turns this off)\n", repo, o.endpoint);
    int rc = hub_pull_run(&p, repo, &o, e);
    if (rc == 0) {
        if ((size_t)snprintf(buf, cap, "%s", p.snapshot) >= cap)
            rc = err_setf(e, ERR_ARG, "snapshot path too long");
        else
            fprintf(stderr, "mlxcel: pulled %s (%zu files) into %s\n", repo, p.list.n_files, p.snapshot);
    }
    free(v.told);
    hub_pull_deinit(&p);
    return rc;
}

int cmd_pull(int argc, char **argv)
{
    static const struct option opts[] = {
        {"revision", required_argument, 0, 'r'}, {"include", required_argument, 0, 'i'},
        {"exclude", required_argument, 0, 'x'},  {"token", required_argument, 0, 't'},
        {"jobs", required_argument, 0, 'j'},     {"offline", no_argument, 0, 'O'},
        {"json", no_argument, 0, 'J'},           {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *include[MAX_GLOBS], *exclude[MAX_GLOBS];
    struct hub_opts o = {.include = include, .exclude = exclude};
    struct err e = {0};
    bool json = false;
    long jobs = 4;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'r': o.revision = optarg; break;
        case 'i':
        case 'x':
            if ((c == 'i' ? o.n_include : o.n_exclude) >= MAX_GLOBS)
                return cli_usage_error("pull", "at most %d --include and %d --exclude", MAX_GLOBS, MAX_GLOBS);
            if (c == 'i')
                include[o.n_include++] = optarg;
            else
                exclude[o.n_exclude++] = optarg;
            break;
        case 't': o.token = optarg; break;
        case 'j':
            if (cli_parse_int("--jobs", optarg, 1, 64, &jobs, &e) < 0)
                return cli_usage_error("pull", "%s", e.msg);
            break;
        case 'O': o.offline = true; break;
        case 'J': json = true; break;
        case 'h': fputs(k_help, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("pull", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("pull", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage_error("pull", "missing the repository (owner/name)");
    if (optind + 1 < argc)
        return cli_usage_error("pull", "unexpected argument '%s'", argv[optind + 1]);
    const char *repo = argv[optind];
    if (hub_repo_check(repo, &e) < 0 || (o.revision && hub_revision_check(o.revision, &e) < 0))
        return cli_usage_error("pull", "%s", e.msg);
    o.jobs = (int)jobs;

    struct pull_view v = {.tty = cli_stderr_is_tty()};
    o.progress = on_progress;
    o.notice = on_notice;
    o.ud = &v;
    env_timeouts(&o);
    cli_hub_opts(&o);
    struct hub_pull p;
    int status = CLI_EXIT_OK;
    if (hub_pull_run(&p, repo, &o, &e) < 0) {
        if (v.drawn)
            fprintf(stderr, "\033[%dA\033[J", v.drawn);
        status = cli_fail("pull", &e);
    } else if (json) {
        if (print_json(&p, &e) < 0)
            status = cli_fail("pull", &e);
    } else {
        if (v.tty) {
            char b[32];
            cli_format_bytes((uint64_t)p.fetched_bytes, b, sizeof b);
            fprintf(stderr, "pulled %s at %.12s: %zu files fetched (%s), %zu already cached\n", repo,
                    p.list.commit, p.n_fetched, b, p.n_cached);
        }
        printf("%s\n", p.snapshot);
    }
    hub_pull_deinit(&p);
    return status;
}
