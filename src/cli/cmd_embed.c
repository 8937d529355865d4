/*
 * embed / rerank: `mlxcel embed -m M -f lines.txt [--json]` prints one vector per input
 * line, as SentenceTransformer(M).encode(lines) gives it (pooling, Dense, Normalize and
 * prompts from the folder's sentence-transformers files); `mlxcel rerank -m M -q QUERY -f
 * docs.txt [--top-n N] [--json]` scores each document line against the query with a
 * cross-encoder, as CrossEncoder(M).predict gives it, best first.
 *
 * Inputs are lines (a trailing newline ends the last one; an empty line is an input, the
 * empty text) or, with --ids-file, one JSON array of token ids per line (used as they are,
 * no special tokens added; for rerank the whole pair). Texts over the model's limit are
 * truncated as sentence-transformers truncates them, or refused with --no-truncate.
 * Progress goes to a terminal's stderr; nothing but the results goes to stdout.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/log.h"
#include "../engine/embedder.h"
#include "../kernels/backend.h"
#include "../models/model.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "config.h"

#define EMB_CLI_MAX_INPUT (256u << 20)
#define EMB_CLI_STEP      64   /* inputs per engine call (progress granularity) */

static const char *k_help_embed =
    "usage: mlxcel embed [-m MODEL] (-f FILE | --ids-file FILE) [options]\n"
    "\n"
    "Print one embedding per input line (sentence-transformers' encode).\n"
    "  -m, --model MODEL      checkpoint folder or owner/name (an encoder: BERT, XLM-RoBERTa, ModernBERT;\n"
    "                         a decoder's sentence-transformers folder: Qwen3-Embedding, EmbeddingGemma)\n"
    "  -f, --file FILE        texts, one per line (- reads standard input)\n"
    "      --ids-file FILE    token ids instead: one JSON array per line, used as they are\n"
    "      --json             print {\"model\", \"dim\", \"data\": [{\"index\", \"embedding\", \"n_tokens\"}]}\n"
    "      --normalize        scale every vector to unit length\n"
    "      --no-normalize     leave them as the model makes them (default: the model's Normalize\n"
    "                         module decides)\n"
    "      --dimensions N     keep the first N dimensions (Matryoshka), renormalized if normalized\n"
    "      --prompt-name NAME prefix each text with the model's prompt NAME (e.g. query)\n"
    "      --prompt TEXT      prefix each text with TEXT\n"
    "      --no-truncate      refuse a text longer than the model's limit (default: truncate it)\n"
    "  -t, --threads N        CPU threads (default: all online CPUs)\n"
    "  -v, --verbose          log the backend, threads and load times to stderr\n";

static const char *k_help_rerank =
    "usage: mlxcel rerank [-m MODEL] -q QUERY (-f FILE | --ids-file FILE) [options]\n"
    "\n"
    "Score each document line against the query with a cross-encoder, best first.\n"
    "  -m, --model MODEL      a cross-encoder folder (BERT / XLM-RoBERTa / ModernBERT ForSequenceClassification),\n"
    "                         or an LM reranker (Qwen3-Reranker: --reranker qwen3)\n"
    "  -q, --query QUERY      the query\n"
    "  -f, --file FILE        documents, one per line (- reads standard input)\n"
    "      --ids-file FILE    whole query/document pairs as token ids, one JSON array per line\n"
    "                         (or {\"ids\": [...], \"token_type_ids\": [...]}); no -q then\n"
    "      --top-n N          print the N best only (default: all)\n"
    "      --json             print {\"model\", \"results\": [{\"index\", \"relevance_score\", \"document\"}]}\n"
    "      --no-truncate      refuse a pair longer than the model's limit (default: truncate it)\n"
    "      --reranker qwen3   score with the causal LM's \"yes\" / \"no\" logits in Qwen3-Reranker's\n"
    "                         prompt (a config.json with \"classifier_from_token\": [\"no\", \"yes\"]\n"
    "                         needs no flag)\n"
    "      --instruction TEXT the LM reranker's task instruction (default: \"Given a web search query,\n"
    "                         retrieve relevant passages that answer the query\")\n"
    "  -t, --threads N        CPU threads (default: all online CPUs)\n"
    "  -v, --verbose          log the backend, threads and load times to stderr\n";

/* The lines of text (in place: each '\n' becomes a NUL, a '\r' before it too). */
static int split_lines(char *text, size_t len, char ***lines, int *n, struct err *e)
{
    int cap = 0;
    *lines = NULL;
    *n = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n')
            j++;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(*lines, (size_t)cap * sizeof *p);
            if (!p)
                return err_setf(e, ERR_NOMEM, "out of memory reading lines");
            *lines = p;
        }
        size_t k = j;
        if (k > i && text[k - 1] == '\r')
            k--;
        if (memchr(text + i, 0, k - i))
            return err_setf(e, ERR_ARG, "line %d holds a NUL byte", *n + 1);
        text[k] = 0;
        (*lines)[(*n)++] = text + i;
        i = j + 1;
    }
    return 0;
}

/* One --ids-file line: an array of ids, or {"ids": [...], "token_type_ids": [...]}. */
static int parse_ids_line(const struct embedder *em, const char *line, int no, bool truncate,
                          struct emb_item *it, struct err *e)
{
    cJSON *j = cJSON_Parse(line), *ids = j, *types = NULL;
    int rc = 0;
    if (cJSON_IsObject(j)) {
        ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
        types = cJSON_GetObjectItemCaseSensitive(j, "token_type_ids");
        types = cJSON_IsNull(types) ? NULL : types;
    }
    int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
    if (n < 1 || n > (1 << 20) || (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n))) {
        cJSON_Delete(j);
        return err_setf(e, ERR_ARG, "--ids-file line %d: expected a non-empty JSON array of token ids "
                        "(and token_type_ids of the same length)", no);
    }
    int32_t *v = malloc((size_t)n * 2 * sizeof *v);
    if (!v) {
        cJSON_Delete(j);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n && rc == 0; i++) {
        const cJSON *a = cJSON_GetArrayItem(ids, i), *b = types ? cJSON_GetArrayItem(types, i) : NULL;
        if (!cJSON_IsNumber(a) || a->valuedouble != (double)(int32_t)a->valuedouble ||
            (b && (!cJSON_IsNumber(b) || b->valuedouble != (double)(int32_t)b->valuedouble)))
            rc = err_setf(e, ERR_ARG, "--ids-file line %d: element %d is not an integer", no, i);
        v[i] = a && cJSON_IsNumber(a) ? (int32_t)a->valuedouble : 0;
        v[n + i] = b && cJSON_IsNumber(b) ? (int32_t)b->valuedouble : 0;
    }
    if (rc == 0 && (rc = embedder_ids(em, v, n, truncate, it, e)) == 0 && types)
        memcpy(it->types, v + n, (size_t)it->n * sizeof *v);
    free(v);
    cJSON_Delete(j);
    return rc;
}

struct emb_run {
    struct model *m;
    struct backend *be;
    struct tokenizer *tok;
    struct embedder *em;
    char *text;
    char **lines;
    int n_lines;
};

static void run_close(struct emb_run *r)
{
    embedder_free(r->em);
    backend_free(r->be);
    model_free(r->m);
    tok_free(r->tok);
    free(r->lines);
    free(r->text);
}

/* Model, backend, tokenizer (for texts), embedder and the input lines. */
int cli_reranker_apply(struct model *m, const char *kind, struct err *e)
{
    if (!kind)
        return 0;
    if (strcmp(kind, "qwen3") != 0)
        return err_setf(e, ERR_ARG, "--reranker '%s': the one LM reranker format is qwen3 (Qwen3-Reranker's "
                        "yes/no prompt)", kind);
    return model_set_lm_reranker(m, e);
}

static int run_open(struct emb_run *r, const char *model, const char *file, bool need_tok, long threads,
                    const char *reranker, struct err *e)
{
    char dir[4096];
    int rc;
    memset(r, 0, sizeof *r);
    size_t len;
    if ((rc = cli_resolve_model(model, dir, sizeof dir, e)) < 0 ||
        (rc = cli_read_input(file, EMB_CLI_MAX_INPUT, &r->text, &len, e)) < 0 ||
        (rc = split_lines(r->text, len, &r->lines, &r->n_lines, e)) < 0)
        return rc;
    if (r->n_lines == 0)
        return err_setf(e, ERR_ARG, "%s: no input lines", file);
    if ((rc = cli_model_load(&r->m, dir, e)) < 0 || (rc = cli_reranker_apply(r->m, reranker, e)) < 0)
        return rc;
    if (!r->m->hp.encoder)
        return err_setf(e, ERR_ARG, "%s is a '%s' model, not an encoder: embed and rerank need an embedding "
                        "model or a cross-encoder (BERT, XLM-RoBERTa, ModernBERT; a decoder's "
                        "sentence-transformers folder: Qwen3-Embedding, EmbeddingGemma) or an LM reranker "
                        "(--reranker qwen3)", dir, r->m->hp.model_type);
    if ((need_tok || r->m->hp.lm_rerank) && (rc = tok_load(&r->tok, dir, e)) < 0)
        return rc;
    if ((rc = backend_new(&r->be, cli_cfg()->device, (int)threads, &cli_cfg()->be, e)) < 0 ||
        (rc = model_prepare(r->m, r->be, e)) < 0 || (rc = embedder_new(&r->em, r->m, r->be, r->tok, e)) < 0)
        return rc;
    return 0;
}

static void progress(bool on, const char *what, int done, int n)
{
    if (on)
        fprintf(stderr, "\r%s %d/%d", what, done, n);
    if (on && done == n)
        fputc('\n', stderr);
}

static void print_vec(const float *v, int k)
{
    for (int j = 0; j < k; j++)
        printf(j ? " %.9g" : "%.9g", (double)v[j]);
    putchar('\n');
}

/* ---- embed ---- */

struct embed_opts {
    const char *model, *file, *ids_file, *prompt_name, *prompt;
    long threads, dims;
    int normalize;  /* -1: the model's, 0 / 1: forced */
    bool json, no_truncate;
};

static int embed_run(const struct embed_opts *o, struct err *e)
{
    struct emb_run r;
    float *out = NULL;
    struct emb_item *items = NULL;
    int rc, n_items = 0;
    if ((rc = run_open(&r, o->model, o->ids_file ? o->ids_file : o->file, !o->ids_file, o->threads, NULL,
                       e)) < 0)
        goto out;
    if (embedder_is_reranker(r.em)) {
        rc = err_setf(e, ERR_ARG, "this model is a cross-encoder (reranker): use mlxcel rerank");
        goto out;
    }
    const char *prompt = o->prompt;
    if (o->prompt_name && !(prompt = emb_prompt_find(&r.em->cfg, o->prompt_name))) {
        rc = err_setf(e, ERR_ARG, "--prompt-name '%s': the model has no such prompt", o->prompt_name);
        goto out;
    }
    if (!prompt && !o->prompt_name && r.em->cfg.default_prompt[0])
        prompt = emb_prompt_find(&r.em->cfg, r.em->cfg.default_prompt);
    bool model_norm = r.em->cfg.normalize;
    if (o->normalize >= 0)   /* the flags replace the model's Normalize module */
        r.em->cfg.normalize = false;
    int dim = r.em->cfg.dim, k = o->dims > 0 ? (int)o->dims : dim;
    if (k > dim) {
        rc = err_setf(e, ERR_ARG, "--dimensions %d exceeds the model's %d", k, dim);
        goto out;
    }
    items = calloc((size_t)r.n_lines, sizeof *items);
    out = malloc((size_t)r.n_lines * dim * sizeof *out);
    if (!items || !out) {
        rc = err_setf(e, ERR_NOMEM, "out of memory for %d inputs", r.n_lines);
        goto out;
    }
    for (; n_items < r.n_lines; n_items++) {
        const char *l = r.lines[n_items];
        rc = o->ids_file ? parse_ids_line(r.em, l, n_items + 1, !o->no_truncate, &items[n_items], e)
                         : embedder_tokenize(r.em, prompt, l, strlen(l), !o->no_truncate, &items[n_items], e);
        if (rc < 0) {
            err_prefix(e, "line %d", n_items + 1);
            goto out;
        }
    }
    bool tty = cli_stderr_is_tty() && !o->json;
    for (int i = 0; i < n_items; i += EMB_CLI_STEP) {
        int k1 = n_items - i < EMB_CLI_STEP ? n_items - i : EMB_CLI_STEP;
        if ((rc = embedder_embed(r.em, items + i, k1, out + (size_t)i * dim, e)) < 0)
            goto out;
        progress(tty, "embedded", i + k1, n_items);
    }
    /* --normalize, or the model's Normalize with --dimensions: unit length over the kept k */
    bool norm = o->normalize < 0 ? model_norm && k < dim : o->normalize == 1;
    for (int i = 0; norm && i < n_items; i++)
        emb_renormalize(out + (size_t)i * dim, k);
    if (!o->json) {
        for (int i = 0; i < n_items; i++)
            print_vec(out + (size_t)i * dim, k);
        rc = cli_stdout_check(e);
        goto out;
    }
    cJSON *root = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddStringToObject(root, "model", r.m->dir);
    cJSON_AddNumberToObject(root, "dim", k);
    for (int i = 0; data && i < n_items; i++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddItemToArray(data, it);
        cJSON_AddNumberToObject(it, "index", i);
        cJSON_AddNumberToObject(it, "n_tokens", items[i].n);
        cJSON *v = cJSON_AddArrayToObject(it, "embedding");
        for (int j = 0; v && j < k; j++)
            cJSON_AddItemToArray(v, cJSON_CreateNumber((double)out[(size_t)i * dim + j]));
    }
    rc = cli_print_json(root, e);
out:
    for (int i = 0; items && i < n_items; i++)
        emb_item_deinit(&items[i]);
    free(items);
    free(out);
    run_close(&r);
    return rc;
}

int cmd_embed(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
        {"ids-file", required_argument, 0, 'I'}, {"json", no_argument, 0, 'J'},
        {"normalize", no_argument, 0, 'N'}, {"no-normalize", no_argument, 0, 'n'},
        {"dimensions", required_argument, 0, 'D'}, {"prompt-name", required_argument, 0, 'P'},
        {"prompt", required_argument, 0, 'p'}, {"no-truncate", no_argument, 0, 'T'},
        {"threads", required_argument, 0, 't'}, {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    struct embed_opts o = {.normalize = -1};
    struct err e = {0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:f:t:vh", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'f': o.file = optarg; break;
        case 'I': o.ids_file = optarg; break;
        case 'J': o.json = true; break;
        case 'N': o.normalize = 1; break;
        case 'n': o.normalize = 0; break;
        case 'D': rc = cli_parse_int("--dimensions", optarg, 1, 1 << 20, &o.dims, &e); break;
        case 'P': o.prompt_name = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'T': o.no_truncate = true; break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &o.threads, &e); break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'h': cli_help(k_help_embed, CLI_GLOBAL_MODEL | CLI_GLOBAL_RUN); return CLI_EXIT_OK;
        case ':': return cli_usage_error("embed", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("embed", "unknown option %s", argv[optind - 1]);
        }
        if (rc < 0)
            return cli_usage_error("embed", "%s", e.msg);
    }
    if (optind < argc)
        return cli_usage_error("embed", "unexpected argument '%s'", argv[optind]);
    if (!!o.file + !!o.ids_file != 1)
        return cli_usage_error("embed", "give exactly one of -f or --ids-file");
    if (o.prompt && o.prompt_name)
        return cli_usage_error("embed", "give at most one of --prompt and --prompt-name");
    if (o.ids_file && (o.prompt || o.prompt_name))
        return cli_usage_error("embed", "--prompt and --prompt-name need texts, not --ids-file");
    if (embed_run(&o, &e) < 0)
        return cli_fail("embed", &e);
    return CLI_EXIT_OK;
}

/* ---- rerank ---- */

struct rerank_opts {
    const char *model, *query, *file, *ids_file, *reranker, *instruction;
    long threads, top_n;
    bool json, no_truncate;
};

static int rerank_run(const struct rerank_opts *o, struct err *e)
{
    struct emb_run r;
    struct emb_item *items = NULL;
    float *scores = NULL;
    struct emb_ranked *rk = NULL;
    int rc, n = 0;
    if ((rc = run_open(&r, o->model, o->ids_file ? o->ids_file : o->file, !o->ids_file, o->threads,
                       o->reranker, e)) < 0)
        goto out;
    if (o->instruction && (rc = embedder_set_instruction(r.em, o->instruction, e)) < 0)
        goto out;
    if (!embedder_is_reranker(r.em)) {
        rc = err_setf(e, ERR_ARG, "this model embeds texts; rerank needs a cross-encoder "
                      "(a *ForSequenceClassification checkpoint)");
        goto out;
    }
    items = calloc((size_t)r.n_lines, sizeof *items);
    scores = malloc((size_t)r.n_lines * sizeof *scores);
    rk = malloc((size_t)r.n_lines * sizeof *rk);
    if (!items || !scores || !rk) {
        rc = err_setf(e, ERR_NOMEM, "out of memory for %d documents", r.n_lines);
        goto out;
    }
    for (; n < r.n_lines; n++) {
        const char *l = r.lines[n];
        rc = o->ids_file ? parse_ids_line(r.em, l, n + 1, !o->no_truncate, &items[n], e)
                         : embedder_tokenize_pair(r.em, o->query, strlen(o->query), l, strlen(l),
                                                  !o->no_truncate, &items[n], e);
        if (rc < 0) {
            err_prefix(e, "line %d", n + 1);
            goto out;
        }
    }
    bool tty = cli_stderr_is_tty() && !o->json;
    for (int i = 0; i < n; i += EMB_CLI_STEP) {
        int k = n - i < EMB_CLI_STEP ? n - i : EMB_CLI_STEP;
        if ((rc = embedder_score(r.em, items + i, k, scores + i, e)) < 0)
            goto out;
        progress(tty, "scored", i + k, n);
    }
    for (int i = 0; i < n; i++)
        rk[i] = (struct emb_ranked){i, scores[i]};
    emb_rank_sort(rk, n);
    int top = o->top_n > 0 && o->top_n < n ? (int)o->top_n : n;
    if (!o->json) {
        for (int i = 0; i < top; i++)
            printf("%d\t%.9g\t%s\n", rk[i].index, (double)rk[i].score, o->ids_file ? "" : r.lines[rk[i].index]);
        rc = cli_stdout_check(e);
        goto out;
    }
    cJSON *root = cJSON_CreateObject(), *res = cJSON_AddArrayToObject(root, "results");
    cJSON_AddStringToObject(root, "model", r.m->dir);
    for (int i = 0; res && i < top; i++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddItemToArray(res, it);
        cJSON_AddNumberToObject(it, "index", rk[i].index);
        cJSON_AddNumberToObject(it, "relevance_score", (double)rk[i].score);
        if (!o->ids_file)
            cJSON_AddStringToObject(it, "document", r.lines[rk[i].index]);
    }
    rc = cli_print_json(root, e);
out:
    for (int i = 0; items && i < n; i++)
        emb_item_deinit(&items[i]);
    free(items);
    free(scores);
    free(rk);
    run_close(&r);
    return rc;
}

int cmd_rerank(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"query", required_argument, 0, 'q'},
        {"file", required_argument, 0, 'f'}, {"ids-file", required_argument, 0, 'I'},
        {"top-n", required_argument, 0, 'k'}, {"json", no_argument, 0, 'J'},
        {"no-truncate", no_argument, 0, 'T'}, {"threads", required_argument, 0, 't'},
        {"reranker", required_argument, 0, 'R'}, {"instruction", required_argument, 0, 'i'},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    struct rerank_opts o = {0};
    struct err e = {0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:q:f:t:vh", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'q': o.query = optarg; break;
        case 'f': o.file = optarg; break;
        case 'I': o.ids_file = optarg; break;
        case 'k': rc = cli_parse_int("--top-n", optarg, 1, 1L << 30, &o.top_n, &e); break;
        case 'J': o.json = true; break;
        case 'T': o.no_truncate = true; break;
        case 'R': o.reranker = optarg; break;
        case 'i': o.instruction = optarg; break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &o.threads, &e); break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'h': cli_help(k_help_rerank, CLI_GLOBAL_MODEL | CLI_GLOBAL_RUN); return CLI_EXIT_OK;
        case ':': return cli_usage_error("rerank", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("rerank", "unknown option %s", argv[optind - 1]);
        }
        if (rc < 0)
            return cli_usage_error("rerank", "%s", e.msg);
    }
    if (optind < argc)
        return cli_usage_error("rerank", "unexpected argument '%s'", argv[optind]);
    if (!!o.file + !!o.ids_file != 1)
        return cli_usage_error("rerank", "give exactly one of -f or --ids-file");
    if (!o.ids_file && !o.query)
        return cli_usage_error("rerank", "give the query (-q)");
    if (o.ids_file && o.query)
        return cli_usage_error("rerank", "--ids-file holds whole pairs: no -q with it");
    if (rerank_run(&o, &e) < 0)
        return cli_fail("rerank", &e);
    return CLI_EXIT_OK;
}
