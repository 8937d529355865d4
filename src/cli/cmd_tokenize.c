/*
 * tokenize: `mlxcel tokenize -m DIR (-p TEXT | -f FILE) [--special]` prints
 * the ids as a JSON array (or, with --json, an object with the ids and each
 * id's piece). Needs only the tokenizer files, not the weights.
 *
 * Without --special the ids are the text's alone (HF's
 * add_special_tokens=False); --special applies the post-processor (BOS/EOS
 * as the checkpoint's template and tokenizer_config.json specify).
 * --no-special is the old spelling of the default and still accepted.
 * --stats measures the tokenizer: load time, encode time and throughput,
 * best of --repeat runs, on stderr (or inside the --json object), which is
 * what docs/benchmarks.md quotes.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tokenizer/tokenizer.h"
#include "../engine/generate.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel tokenize [-m MODEL] (-p TEXT | -f FILE) [--special] [--json] [--stats]\n"
    "\n"
    "Print the token ids of a text as a JSON array.\n"
    "  -m, --model MODEL   folder with tokenizer.json (default: the embedded model)\n"
    "  -p, --prompt TEXT   text to encode\n"
    "  -f, --file FILE     read the text from a file (- reads standard input)\n"
    "      --special       add the tokenizer's special tokens (BOS/EOS per its template)\n"
    "      --no-special    do not add them (the default)\n"
    "      --json          print {\"ids\": [...], \"pieces\": [...], \"n_tokens\": N}\n"
    "      --stats         print load time, bytes, tokens and MB/s (stderr, or in --json)\n"
    "  -r, --repetitions, --repeat N  with --stats: encode N times, report the fastest (default 3)\n";

/* Wall-clock and this thread's CPU time: on a shared machine the CPU time
 * is what one core would take without the others' load. */
struct tok_stats {
    double load_s, load_cpu_s;
    double encode_s, encode_cpu_s;  /* the fastest of the repeats (by wall clock) */
    size_t bytes, tokens;
};

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

static void print_array(const int32_t *ids, size_t n)
{
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    fputs("]\n", stdout);
}

static int print_json(const struct tokenizer *tok, const int32_t *ids, size_t n,
                      const struct tok_stats *st, struct err *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(root, "ids");
    cJSON *p = cJSON_AddArrayToObject(root, "pieces");
    for (size_t i = 0; a && p && i < n; i++) {
        const char *piece = tok_id_to_piece(tok, ids[i]);
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
        cJSON_AddItemToArray(p, cJSON_CreateString(piece ? piece : ""));
    }
    cJSON_AddNumberToObject(root, "n_tokens", (double)n);
    if (st) {
        cJSON *s = cJSON_AddObjectToObject(root, "stats");
        cJSON_AddNumberToObject(s, "load_s", st->load_s);
        cJSON_AddNumberToObject(s, "load_cpu_s", st->load_cpu_s);
        cJSON_AddNumberToObject(s, "encode_s", st->encode_s);
        cJSON_AddNumberToObject(s, "encode_cpu_s", st->encode_cpu_s);
        cJSON_AddNumberToObject(s, "bytes", (double)st->bytes);
        cJSON_AddNumberToObject(s, "tokens", (double)st->tokens);
        cJSON_AddNumberToObject(s, "mb_per_s", st->encode_s > 0 ? st->bytes / st->encode_s / 1e6 : 0);
    }
    return cli_print_json(root, e);
}

/* Encodes repeat times (fastest time in st->encode_s); *ids holds the last result. */
static int encode_timed(const struct tokenizer *tok, const char *text, size_t len, bool special,
                        long repeat, int32_t **ids, size_t *n, struct tok_stats *st, struct err *e)
{
    for (long r = 0; r < repeat; r++) {
        free(*ids);
        *ids = NULL;
        double t0 = gen_now(), c0 = cpu_s();
        int rc = tok_encode(tok, text, len, special, ids, n, e);
        double dt = gen_now() - t0, dc = cpu_s() - c0;
        if (rc < 0)
            return rc;
        if (r == 0 || dt < st->encode_s) {
            st->encode_s = dt;
            st->encode_cpu_s = dc;
        }
    }
    st->bytes = len;
    st->tokens = *n;
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'}, {"special", no_argument, 0, 's'},
        {"no-special", no_argument, 0, 'S'}, {"json", no_argument, 0, 'j'},
        {"stats", no_argument, 0, 't'}, {"repeat", required_argument, 0, 'r'}, {"repetitions", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL, *text = NULL, *file = NULL, *repeat_arg = NULL;
    bool special = false, json = false, stats = false;
    long repeat = 3;
    int c;
    struct err e = {0};
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:p:f:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': text = optarg; break;
        case 'f': file = optarg; break;
        case 's': special = true; break;
        case 'S': special = false; break;
        case 'j': json = true; break;
        case 't': stats = true; break;
        case 'r': repeat_arg = optarg; break;
        case 'h': cli_help(k_help, CLI_GLOBAL_MODEL); return CLI_EXIT_OK;
        case ':': return cli_usage_error("tokenize", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("tokenize", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("tokenize", "unexpected argument '%s'", argv[optind]);
    if (!!text + !!file != 1)
        return cli_usage_error("tokenize", "give exactly one of -p or -f");
    if (repeat_arg && cli_parse_int("--repeat", repeat_arg, 1, 1000, &repeat, &e) < 0)
        return cli_usage_error("tokenize", "%s", e.msg);
    if (!stats)
        repeat = 1;

    char dir[4096];
    struct tokenizer *tok = NULL;
    struct tok_stats st = {0};
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0, n = 0;
    int32_t *ids = NULL;
    int status = CLI_EXIT_ERROR;
    if (cli_resolve_model(model, dir, sizeof dir, &e) < 0)
        goto out;
    double t0 = gen_now(), c0 = cpu_s();
    if (tok_load(&tok, dir, &e) < 0)
        goto out;
    st.load_s = gen_now() - t0;
    st.load_cpu_s = cpu_s() - c0;
    if (file && cli_read_input(file, 64u << 20, &buf, &len, &e) < 0)
        goto out;
    if (encode_timed(tok, file ? buf : text, len, special, repeat, &ids, &n, &st, &e) < 0)
        goto out;
    if (json) {
        if (print_json(tok, ids, n, stats ? &st : NULL, &e) < 0)
            goto out;
    } else {
        print_array(ids, n);
    }
    if (stats && !json)
        fprintf(stderr,
                "load %.3f s (cpu %.3f s), %zu bytes -> %zu tokens in %.4f s (cpu %.4f s) "
                "(best of %ld): %.1f MB/s\n",
                st.load_s, st.load_cpu_s, st.bytes, st.tokens, st.encode_s, st.encode_cpu_s,
                repeat, st.encode_s > 0 ? (double)st.bytes / st.encode_s / 1e6 : 0.0);
    status = CLI_EXIT_OK;
out:
    if (status != CLI_EXIT_OK)
        cli_fail("tokenize", &e);
    free(ids);
    free(buf);
    tok_free(tok);
    return status;
}
