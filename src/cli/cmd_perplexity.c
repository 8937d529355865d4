/*
 * perplexity: `mlxcel perplexity -m DIR (-f TEXT | --ids-file FILE) [--ctx N] [--json]`
 *
 * The ids are cut into windows of --ctx ids (default: the model's context);
 * each window starts from an empty cache and scores every position after
 * its first: NLL(id[j+1] | id[..j]). ppl = exp(mean NLL over all scored ids).
 * Logits are produced in chunks of the context's batch size, so memory stays
 * at one chunk of [n_batch, n_vocab] whatever the window.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/log.h"
#include "../engine/batch.h"
#include "../tokenizer/tokenizer.h"
#include "../models/model.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel perplexity [-m MODEL] (-f TEXT_FILE | --ids-file FILE) [options]\n"
    "\n"
    "Perplexity of a text: windows of --ctx ids, each scoring every position after its first.\n"
    "  -m, --model MODEL   checkpoint folder or owner/name (default: the embedded model)\n"
    "  -f, --file FILE     text file (encoded with the model's tokenizer; - reads stdin)\n"
    "      --ids-file FILE token ids: a JSON array, or ids separated by whitespace\n"
    "  -c, --ctx-size, --ctx N  window size in ids (default: the model's context)\n"
    "  -t, --threads N     CPU threads (default: all online CPUs)\n"
    "  -v, --verbose       log the backend, threads, load times and loading details to stderr\n"
    "      --json          print {\"ppl\": ..., \"nll\": ..., \"n_tokens\": ...} (\"tokens\" too, the\n"
    "                      older name)\n"
    CLI_LORA_HELP;

/* -log softmax(logits)[target], in double */
static double nll_of(const float *logits, int V, int32_t target)
{
    double mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) + mx - logits[target];
}

/* Score one window as a fresh sequence 0: chunks of at most n_out rows, all with logits. */
static int score_window(struct cli_engine *en, struct batch *b, const int32_t *ids, int n, float *logits,
                        double *nll, long *count, struct err *e)
{
    int V = en->ctx->m->hp.n_vocab, rc;
    kv_seq_remove(en->kv, 0);
    if ((rc = kv_seq_add(en->kv, 0, e)) < 0)
        return rc;
    for (int done = 0; done < n;) {
        int k = n - done < b->cap ? n - done : b->cap;
        batch_clear(b);
        for (int j = 0; j < k; j++)
            batch_add(b, ids[done + j], done + j, 0, true, NULL);
        if ((rc = model_forward(en->ctx, b, en->kv, logits, e)) < 0)
            return rc;
        for (int j = 0; j < k; j++) {
            int pos = done + j;
            if (pos + 1 >= n)
                break;
            double x = nll_of(logits + (size_t)j * V, V, ids[pos + 1]);
            if (!isfinite(x))
                return err_setf(e, ERR_FORMAT, "the NLL of the token at position %d is not finite "
                                "(the model produced NaN or inf logits)", pos + 1);
            *nll += x;
            (*count)++;
        }
        done += k;
    }
    return 0;
}

int cmd_perplexity(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
        {"ids-file", required_argument, 0, 'I'}, {"ctx", required_argument, 0, 'c'},
        {"ctx-size", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 't'}, {"json", no_argument, 0, 'J'},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, CLI_LORA_OPTIONS,
        {0, 0, 0, 0},
    };
    struct cli_lora lora = {0};
    const char *model = NULL, *file = NULL, *ids_file = NULL;
    long n_ctx = 0, threads = 0;
    bool json = false;
    struct err e = {0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:f:c:t:vh", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 'f': file = optarg; break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'I': ids_file = optarg; break;
        case 'c': rc = cli_parse_int("--ctx-size", optarg, 2, 1 << 24, &n_ctx, &e); break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &threads, &e); break;
        case 'J': json = true; break;
        case CLI_OPT_LORA:
        case CLI_OPT_LORA_SCALED:
        case CLI_OPT_LORA_NO_APPLY: rc = cli_lora_flag(&lora, c, optarg, argc, argv, &e); break;
        case 'h': cli_help(k_help, CLI_GLOBAL_ALL); return CLI_EXIT_OK;
        case ':': return cli_usage_error("perplexity", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("perplexity", "unknown option %s", argv[optind - 1]);
        }
        if (rc < 0)
            return cli_usage_error("perplexity", "%s", e.msg);
    }
    if (optind < argc)
        return cli_usage_error("perplexity", "unexpected argument '%s'", argv[optind]);
    if (!!file + !!ids_file != 1)
        return cli_usage_error("perplexity", "give exactly one of -f or --ids-file");

    char dir[4096];
    char *text = NULL;
    size_t len = 0, n_ids = 0;
    int32_t *ids = NULL;
    struct tokenizer *tok = NULL;
    struct model *m = NULL;
    struct cli_engine en = {0};
    struct batch b = {0};
    float *logits = NULL;
    int status = CLI_EXIT_ERROR;

    if (cli_resolve_model(model, dir, sizeof dir, &e) < 0)
        goto out;
    if (cli_read_input(file ? file : ids_file, 256u << 20, &text, &len, &e) < 0)
        goto out;
    /* ids are text: a NUL would end the list there and drop the ids after it */
    const char *nul = ids_file ? memchr(text, 0, len) : NULL;
    if (nul) {
        err_setf(&e, ERR_ARG, "%s: a NUL byte at byte %zu (token ids are text: numbers and separators)",
                 ids_file, (size_t)(nul - text));
        goto out;
    }
    if (ids_file ? cli_parse_ids(text, &ids, &n_ids, &e) < 0
                 : (tok_load(&tok, dir, &e) < 0 || tok_encode(tok, text, len, false, &ids, &n_ids, &e) < 0))
        goto out;
    if (n_ids < 2) {
        err_setf(&e, ERR_ARG, "need at least 2 ids to score, got %zu", n_ids);
        goto out;
    }
    if (cli_model_load(&m, dir, &e) < 0)
        goto out;
    /* a window longer than the model's context fails in the engine's context check */
    int win = n_ctx > 0 ? (int)n_ctx : m->hp.n_ctx;
    /* the cache only needs to hold one window, and never more than the input */
    int cache = (size_t)win < n_ids ? win : (int)n_ids;
    if (cli_engine_open(&en, m, threads, cache, 1, win, 0, &e) < 0 ||
        cli_lora_attach(&lora, m, &en, &e) < 0 || batch_init(&b, en.ctx->n_out, &e) < 0)
        goto out;
    logits = malloc((size_t)b.cap * m->hp.n_vocab * sizeof *logits);
    if (!logits) {
        err_setf(&e, ERR_NOMEM, "out of memory for logits");
        goto out;
    }
    double nll = 0.0;
    long count = 0;
    size_t n_win = (n_ids + (size_t)win - 1) / (size_t)win;
    bool progress = cli_stderr_is_tty() && !json;
    for (size_t w = 0; w < n_win; w++) {
        size_t start = w * (size_t)win;
        int n = (int)(n_ids - start < (size_t)win ? n_ids - start : (size_t)win);
        if (score_window(&en, &b, ids + start, n, logits, &nll, &count, &e) < 0)
            goto out;
        if (progress)
            fprintf(stderr, "\rwindow %zu/%zu  ppl %.4f", w + 1, n_win, exp(nll / (double)(count ? count : 1)));
    }
    if (progress)
        fputc('\n', stderr);
    double mean = nll / (double)count;
    if (json)
        printf("{\"ppl\": %.6f, \"nll\": %.6f, \"n_tokens\": %ld, \"tokens\": %ld}\n", exp(mean), mean, count, count);
    else
        printf("perplexity: %.4f  (mean NLL %.6f over %ld tokens, %zu windows of up to %d)\n",
               exp(mean), mean, count, n_win, win);
    status = CLI_EXIT_OK;
out:
    if (status != CLI_EXIT_OK)
        cli_fail("perplexity", &e);
    free(logits);
    batch_free(&b);
    cli_engine_close(&en);
    cli_lora_free(&lora);
    model_free(m);
    tok_free(tok);
    free(ids);
    free(text);
    return status;
}
