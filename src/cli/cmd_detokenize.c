/*
 * detokenize: `mlxcel detokenize -m DIR --ids 1,2,3 [--skip-special]`
 * prints the text of token ids (the inverse of `mlxcel tokenize`), through
 * the tokenizer's decoder exactly as HF's decode. --stream decodes id by id
 * through the streaming decoder instead (what `generate` prints), and
 * --json prints {"text": ..., "pieces": [...]} with each streamed chunk, so
 * scripts can see where the stream held text back.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel detokenize [-m MODEL] --ids 1,2,3 [--skip-special] [--stream] [--json]\n"
    "\n"
    "Print the text of token ids.\n"
    "  -m, --model MODEL   folder with tokenizer.json (default: the embedded model)\n"
    "  -i, --ids LIST      ids: \"1,2,3\", \"1 2 3\" or a JSON array\n"
    "      --skip-special  leave out special tokens (BOS, EOS, chat markers)\n"
    "      --stream        decode one id at a time (as generate prints)\n"
    "      --json          print {\"text\": ..., \"pieces\": [...]} (pieces: streamed chunks)\n";

/* Streams ids through tok_stream; the chunks are appended to text and, when
 * pieces is set, each one to it. */
static int stream_ids(const struct tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                      char **text, size_t *text_len, cJSON *pieces, struct err *e)
{
    struct tok_stream s;
    static char chunk[TOK_STREAM_CAP];
    size_t len = 0;
    char *out = malloc(1);
    if (!out)
        return err_setf(e, ERR_NOMEM, "out of memory");
    tok_stream_init(&s, tok, skip);
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof chunk, e)
                      : tok_stream_flush(&s, chunk, sizeof chunk);
        if (w < 0) {
            free(out);
            return i < n ? w : err_setf(e, -w, "stream flush failed");
        }
        char *no = realloc(out, len + (size_t)w + 1);
        if (!no) {
            free(out);
            return err_setf(e, ERR_NOMEM, "out of memory");
        }
        out = no;
        memcpy(out + len, chunk, (size_t)w);
        len += (size_t)w;
        if (pieces) {  /* a piece may hold a NUL byte: quoted by hand, not by cJSON */
            char *q = cli_json_quote(chunk, (size_t)w);
            cJSON_AddItemToArray(pieces, q ? cJSON_CreateRaw(q) : NULL);
            free(q);
        }
    }
    out[len] = '\0';
    *text = out;
    *text_len = len;
    return 0;
}

int cmd_detokenize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"ids", required_argument, 0, 'i'},
        {"skip-special", no_argument, 0, 's'}, {"stream", no_argument, 0, 'S'},
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL, *ids_arg = NULL;
    bool skip = false, stream = false, json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:i:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'i': ids_arg = optarg; break;
        case 's': skip = true; break;
        case 'S': stream = true; break;
        case 'j': json = true; break;
        case 'h': cli_help(k_help, CLI_GLOBAL_MODEL); return CLI_EXIT_OK;
        case ':': return cli_usage_error("detokenize", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("detokenize", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("detokenize", "unexpected argument '%s'", argv[optind]);
    if (!ids_arg)
        return cli_usage_error("detokenize", "--ids is required");

    struct err e = {0};
    char dir[4096];
    struct tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    size_t text_len = 0;
    cJSON *root = NULL, *pieces = NULL;
    int status = CLI_EXIT_ERROR;
    if (cli_parse_ids(ids_arg, &ids, &n, &e) < 0)
        goto out;
    if (cli_resolve_model(model, dir, sizeof dir, &e) < 0 || tok_load(&tok, dir, &e) < 0)
        goto out;
    if (json) {
        root = cJSON_CreateObject();
        pieces = cJSON_CreateArray();
        if (!root || !pieces) {
            err_setf(&e, ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    if (stream || json) {
        if (stream_ids(tok, ids, n, skip, &text, &text_len, pieces, &e) < 0)
            goto out;
        if (!stream) {  /* --json alone: the text is the full decode */
            free(text);
            text = NULL;
        }
    }
    if (!text && tok_decode_len(tok, ids, n, skip, &text, &text_len, &e) < 0)
        goto out;
    if (json) {
        /* the text keeps its NUL bytes (transformers' decode does): quoted by hand */
        char *q = cli_json_quote(text, text_len);
        if (!q || !cJSON_AddRawToObject(root, "text", q)) {
            free(q);
            err_setf(&e, ERR_NOMEM, "out of memory");
            goto out;
        }
        free(q);
        cJSON_AddItemToObject(root, "pieces", pieces);
        pieces = NULL;
        int rc = cli_print_json(root, &e);
        root = NULL;
        if (rc < 0)
            goto out;
    } else {
        fwrite(text, 1, text_len, stdout);
        fputc('\n', stdout);
    }
    status = CLI_EXIT_OK;
out:
    if (status != CLI_EXIT_OK)
        cli_fail("detokenize", &e);
    cJSON_Delete(root);
    cJSON_Delete(pieces);
    free(text);
    free(ids);
    tok_free(tok);
    return status;
}
