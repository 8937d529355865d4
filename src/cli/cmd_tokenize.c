/*
 * tokenize: `mlxcel tokenize -m DIR (-p TEXT | -f FILE)` prints the ids as a
 * JSON array. Needs only the tokenizer files, not the weights.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel tokenize [-m MODEL] (-p TEXT | -f FILE) [--no-special]\n"
    "\n"
    "Print the token ids of a text as a JSON array.\n"
    "  -m, --model MODEL   folder with tokenizer.json (default: the embedded model)\n"
    "  -p, --prompt TEXT   text to encode\n"
    "  -f, --file FILE     read the text from a file\n"
    "      --no-special    do not add the tokenizer's special tokens (BOS...)\n";

int cmd_tokenize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'}, {"no-special", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL, *text = NULL, *file = NULL;
    bool special = true;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:p:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': text = optarg; break;
        case 'f': file = optarg; break;
        case 'S': special = false; break;
        case 'h': fputs(k_help, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("tokenize", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("tokenize", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("tokenize", "unexpected argument '%s'", argv[optind]);
    if (!!text + !!file != 1)
        return cli_usage_error("tokenize", "give exactly one of -p or -f");

    struct err e = {0};
    char dir[4096];
    struct tokenizer *tok = NULL;
    char *buf = NULL;
    size_t len = text ? strlen(text) : 0, n = 0;
    int32_t *ids = NULL;
    int status = CLI_EXIT_ERROR;
    if (cli_resolve_model(model, dir, sizeof dir, &e) < 0 || tok_load(&tok, dir, &e) < 0)
        goto out;
    if (file && file_read_all(file, 64u << 20, &buf, &len, &e) < 0)
        goto out;
    if (tok_encode(tok, file ? buf : text, len, special, &ids, &n, &e) < 0)
        goto out;
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    fputs("]\n", stdout);
    status = CLI_EXIT_OK;
out:
    if (status != CLI_EXIT_OK)
        cli_fail("tokenize", &e);
    free(ids);
    free(buf);
    tok_free(tok);
    return status;
}
