/*
 * serve: `mlxcel serve [-m MODEL] [--host H] [--port P] [--parallel N] ...`
 * The OpenAI-compatible server (src/server/, docs/server.md) over one
 * model: the HTTP side starts first (GET /health is 503 while the model
 * loads), then the model, its tokenizer and chat template, a paged KV cache
 * of --ctx-size tokens for --parallel sequences, and the engine thread
 * (src/engine/runner.c). The ready line on stdout gives the URL.
 * SIGINT/SIGTERM stop it: no new connections, in-flight requests cancelled,
 * every thread joined, everything freed, exit 0.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <curl/curl.h>

#include "../core/log.h"
#include "../core/termsafe.h"
#include "../engine/embedder.h"
#include "../engine/image_input.h"
#include "../engine/runner.h"
#include "../kernels/backend.h"
#include "../models/model.h"
#include "../grammar/grammar.h"
#include "../server/outparse.h"
#include "../server/server.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "config.h"

static const char *k_help =
    "usage: mlxcel serve [-m MODEL] [options]\n"
    "\n"
    "Serve a model over an OpenAI-compatible HTTP API (docs/server.md):\n"
    "/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics,\n"
    "/tokenize, /detokenize, /apply-template; a chat page at /.\n"
    "\n"
    "  -m, --model MODEL          checkpoint folder or owner/name (default: the embedded model)\n"
    "      --host ADDR            address to listen on (default 127.0.0.1; an IPv4 or IPv6 literal)\n"
    "      --port N               port (default 8080; 0 picks a free one)\n"
    "  -np, --parallel N          sequences decoded together in one batch (default 4)\n"
    "  -ub, --ubatch-size N       rows (decode tokens, then prompt chunks) in one engine step,\n"
    "                             1 to 512 (default: on the CPU 128 or 2 x --parallel if more,\n"
    "                             so a prompt never stalls the streams for long; else 512)\n"
    "  -c, --ctx-size N           KV cache tokens shared by all sequences (default: the model's\n"
    "                             context, at most 8192, times --parallel; the model's context is\n"
    "                             max_position_embeddings, x rope_scaling.factor for dynamic NTK\n"
    "                             rope); one request holds at most min(N, the model's context,\n"
    "                             or for dynamic NTK its limit); --ctx is the same flag\n"
    "      --api-key KEY          require 'Authorization: Bearer KEY' (or $MLXCEL_API_KEY)\n"
    "      --served-model-name NAME  the model's id in the API (default: the folder or owner/name)\n"
    "      --max-queue N          requests waiting beyond --parallel before 429 (default 64);\n"
    "                             a request with n choices takes n places\n"
    "      --max-body BYTES       largest request body (default 4194304)\n"
    "      --timeout S            close connections idle for S seconds (default 600)\n"
    "      --header-timeout S     a request's line and headers must arrive within S seconds\n"
    "                             (default 60; then 408)\n"
    "      --request-timeout S    a whole request, body included, must arrive within S seconds\n"
    "                             (default 300; then 408)\n"
    "      --max-connections N    connections served at once (default 256); 64 more are\n"
    "                             accepted to answer 503 (GET /health normally); more get\n"
    "                             503 as they open\n"
    "      --allowed-host NAME    accept this Host name besides IP addresses and localhost\n"
    "                             (repeatable; '.example.org' for it and its subdomains; '*' any)\n"
    "      --cors-origin ORIGIN   allow cross-origin requests from ORIGIN, e.g.\n"
    "                             http://localhost:3000 (repeatable; '*' any); without it a\n"
    "                             request with another site's Origin is refused 403\n"
    "      --no-prefix-cache      recompute shared prompt prefixes instead of reusing their KV\n"
    "      --allow-image-urls     fetch image parts' http(s) URLs (at most 20 MiB, 10 s, 3 redirects,\n"
    "                             nothing of the request forwarded); without it they answer 400\n"
    "      --spec MODE            speculative decoding of every request: none (default), ngram\n"
    "                             (prompt lookup), draft (a draft model) or mtp (the\n"
    "                             checkpoint's own multi-token-prediction layer: DeepSeek-V3,\n"
    "                             GLM-4.5, GLM-4.7-Flash); the same output, fewer steps when\n"
    "                             drafts are often right (counted in /metrics)\n"
    "  -md, --model-draft MODEL   the draft model of --spec draft (implies it): a smaller\n"
    "                             checkpoint with the same vocabulary (folder or owner/name)\n"
    "      --draft-max N          tokens drafted per step at most (default 16, up to 64)\n"
    "      --draft-min N          decode plainly when fewer are drafted (default 1)\n"
    "      --kv-type f32|f16|bf16 KV cache element type (default f32; f16 and bf16 halve it)\n"
    "      --fast                 4-bit products on x rounded to 8 bits per group (not exact;\n"
    "                             AVX2 / AVX-512 CPUs; default off)\n"
    "  -t, --threads N            CPU threads (default: all online CPUs)\n"
    "      --log-format text|json access log format on stderr (default text)\n"
    "  -v, --verbose              log loading details to stderr\n"
    "  -h, --help                 show this help\n";

enum {
    OPT_HOST = 256, OPT_PORT, OPT_API_KEY, OPT_NAME, OPT_MAX_QUEUE, OPT_MAX_BODY, OPT_TIMEOUT, OPT_LOG_FORMAT,
    OPT_MAX_CONN, OPT_NO_PREFIX, OPT_ALLOW_IMAGE_URLS, OPT_UBATCH, OPT_HEADER_TIMEOUT, OPT_REQUEST_TIMEOUT, OPT_ALLOWED_HOST,
    OPT_CORS_ORIGIN, OPT_SPEC, OPT_DRAFT_MAX, OPT_DRAFT_MIN, OPT_MODEL_DRAFT,
};

#define SERVE_MAX_LIST 32  /* --allowed-host and --cors-origin values, each */

struct serve_cli {
    const char *model, *host, *api_key, *name, *model_draft;
    long port, parallel, ctx_size, max_queue, max_body, timeout, threads, max_conn, ubatch;
    long header_timeout, request_timeout;
    bool log_json, no_prefix_cache, allow_image_urls;
    struct spec_params spec;
    const char *allowed_hosts[SERVE_MAX_LIST], *cors_origins[SERVE_MAX_LIST];
    int n_allowed_hosts, n_cors_origins;
};

/* Appends --allowed-host NAME: a host name (no scheme, port or path), '.name' or '*'. */
static int add_allowed_host(struct serve_cli *o, const char *v, struct err *e)
{
    if (o->n_allowed_hosts == SERVE_MAX_LIST)
        return err_setf(e, ERR_ARG, "--allowed-host: at most %d", SERVE_MAX_LIST);
    size_t n = strlen(v);
    bool ok = n > 0 && n < 256;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)v[i] > ' ' && (unsigned char)v[i] < 0x7f && !strchr("/:@\\[]", v[i]);
    if (!ok)
        return err_setf(e, ERR_ARG, "--allowed-host '%.64s' is not a host name (no scheme, port or path; "
                        "IP addresses are always accepted)", v);
    o->allowed_hosts[o->n_allowed_hosts++] = v;
    return 0;
}

/* Appends --cors-origin ORIGIN: '*', 'null' or scheme://host[:port] as browsers send it. */
static int add_cors_origin(struct serve_cli *o, const char *v, struct err *e)
{
    if (o->n_cors_origins == SERVE_MAX_LIST)
        return err_setf(e, ERR_ARG, "--cors-origin: at most %d", SERVE_MAX_LIST);
    const char *auth = strstr(v, "://");
    size_t n = strlen(v);
    bool ok = strcmp(v, "*") == 0 || strcmp(v, "null") == 0;
    if (!ok && auth && auth > v && n < 200) {
        ok = auth[3] != 0;
        for (const char *p = auth + 3; ok && *p; p++)
            ok = (unsigned char)*p > ' ' && (unsigned char)*p < 0x7f && (*p != '/' || p[1] == 0);
    }
    if (!ok)
        return err_setf(e, ERR_ARG, "--cors-origin '%.64s' is not an origin (scheme://host[:port], e.g. "
                        "http://localhost:3000, or '*')", v);
    o->cors_origins[o->n_cors_origins++] = v;
    return 0;
}

static int parse_args(int argc, char **argv, struct serve_cli *o, struct err *e)
{
    static const struct option k_opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"host", required_argument, NULL, OPT_HOST},
        {"port", required_argument, NULL, OPT_PORT},
        {"parallel", required_argument, NULL, 'P'},
        {"np", required_argument, NULL, 'P'},
        {"ubatch-size", required_argument, NULL, OPT_UBATCH},
        {"ub", required_argument, NULL, OPT_UBATCH},
        {"ctx-size", required_argument, NULL, 'c'},
        {"ctx", required_argument, NULL, 'c'},
        {"api-key", required_argument, NULL, OPT_API_KEY},
        {"served-model-name", required_argument, NULL, OPT_NAME},
        {"max-queue", required_argument, NULL, OPT_MAX_QUEUE},
        {"max-body", required_argument, NULL, OPT_MAX_BODY},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"header-timeout", required_argument, NULL, OPT_HEADER_TIMEOUT},
        {"request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT},
        {"allowed-host", required_argument, NULL, OPT_ALLOWED_HOST},
        {"cors-origin", required_argument, NULL, OPT_CORS_ORIGIN},
        {"max-connections", required_argument, NULL, OPT_MAX_CONN},
        {"no-prefix-cache", no_argument, NULL, OPT_NO_PREFIX},
        {"allow-image-urls", no_argument, NULL, OPT_ALLOW_IMAGE_URLS},
        {"spec", required_argument, NULL, OPT_SPEC},
        {"draft-max", required_argument, NULL, OPT_DRAFT_MAX},
        {"draft-min", required_argument, NULL, OPT_DRAFT_MIN},
        {"model-draft", required_argument, NULL, OPT_MODEL_DRAFT},
        {"md", required_argument, NULL, OPT_MODEL_DRAFT},
        {"threads", required_argument, NULL, 't'},
        {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc = 0;
    opterr = 0;
    optind = 1;
    /* getopt_long_only: -np like llama-server (and every long option with one dash) */
    while (rc == 0 && (c = getopt_long_only(argc, argv, ":m:c:t:vh", k_opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case OPT_HOST: o->host = optarg; break;
        case OPT_PORT: rc = cli_parse_int("--port", optarg, 0, 65535, &o->port, e); break;
        case 'P': rc = cli_parse_int("--parallel", optarg, 1, 256, &o->parallel, e); break;
        case OPT_UBATCH: rc = cli_parse_int("--ubatch-size", optarg, 1, 512, &o->ubatch, e); break;
        case 'c': rc = cli_parse_int("--ctx-size", optarg, 1, 1L << 24, &o->ctx_size, e); break;
        case OPT_API_KEY: o->api_key = optarg; break;
        case OPT_NAME: o->name = optarg; break;
        case OPT_MAX_QUEUE: rc = cli_parse_int("--max-queue", optarg, 0, 1 << 16, &o->max_queue, e); break;
        case OPT_MAX_BODY: rc = cli_parse_int("--max-body", optarg, 1, 1L << 30, &o->max_body, e); break;
        case OPT_TIMEOUT: rc = cli_parse_int("--timeout", optarg, 1, 86400, &o->timeout, e); break;
        case OPT_HEADER_TIMEOUT: rc = cli_parse_int("--header-timeout", optarg, 1, 86400, &o->header_timeout, e); break;
        case OPT_REQUEST_TIMEOUT:
            rc = cli_parse_int("--request-timeout", optarg, 1, 86400, &o->request_timeout, e);
            break;
        case OPT_ALLOWED_HOST: rc = add_allowed_host(o, optarg, e); break;
        case OPT_CORS_ORIGIN: rc = add_cors_origin(o, optarg, e); break;
        case OPT_MAX_CONN: rc = cli_parse_int("--max-connections", optarg, 1, 4096, &o->max_conn, e); break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &o->threads, e); break;
        case OPT_NO_PREFIX: o->no_prefix_cache = true; break;
        case OPT_ALLOW_IMAGE_URLS: o->allow_image_urls = true; break;
        case OPT_SPEC: rc = cli_spec_flag("spec", optarg, &o->spec, e); break;
        case OPT_DRAFT_MAX: rc = cli_spec_flag("draft-max", optarg, &o->spec, e); break;
        case OPT_DRAFT_MIN: rc = cli_spec_flag("draft-min", optarg, &o->spec, e); break;
        case OPT_MODEL_DRAFT: o->model_draft = optarg; break;
        case OPT_LOG_FORMAT:
            if (strcmp(optarg, "json") == 0 || strcmp(optarg, "text") == 0)
                o->log_json = strcmp(optarg, "json") == 0;
            else
                rc = err_setf(e, ERR_ARG, "--log-format: '%s' is not text or json", optarg);
            break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'h': cli_help(k_help, CLI_GLOBAL_ALL); return 1;
        case ':': return err_setf(e, ERR_ARG, "option %s needs a value", argv[optind - 1]);
        default: return err_setf(e, ERR_ARG, "unknown option %s", argv[optind - 1]);
        }
    }
    if (rc < 0)
        return rc;
    if (optind < argc)
        return err_setf(e, ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (o->name && (!*o->name || strlen(o->name) > 200))
        return err_setf(e, ERR_ARG, "--served-model-name must have 1 to 200 bytes");
    if (o->api_key && !*o->api_key)
        return err_setf(e, ERR_ARG, "--api-key must not be empty");
    if (o->model_draft && (o->spec.mode == SPEC_NGRAM || o->spec.mode == SPEC_MTP))
        return err_setf(e, ERR_ARG, "--model-draft drafts with a model: it does not go with --spec %s",
                        o->spec.mode == SPEC_NGRAM ? "ngram" : "mtp");
    if (o->spec.mode == SPEC_DRAFT && !o->model_draft)
        return err_setf(e, ERR_ARG, "--spec draft needs a draft model (--model-draft)");
    if (o->model_draft)
        o->spec.mode = SPEC_DRAFT;
    if (o->spec.mode == SPEC_NGRAM)
        return spec_params_check(&o->spec, e);
    return 0;
}

/* The model's id: --served-model-name, else owner/name as given, else the folder's name. */
static void model_id(const struct serve_cli *o, const char *dir, char *buf, size_t cap)
{
    struct stat st;
    if (o->name) {
        snprintf(buf, cap, "%s", o->name);
    } else if (o->model && stat(o->model, &st) != 0) {
        snprintf(buf, cap, "%s", o->model);
    } else {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/')
            b--;
        snprintf(buf, cap, "%.*s", (int)(n - b), dir + b);
    }
}

struct served {
    struct grammar_vocab *gvocab;
    struct model *m;
    struct tokenizer *tok;
    struct chat_tmpl *tmpl;
    struct cli_engine en;
    struct cli_draft draft;          /* --model-draft: used by the runner's engine thread only */
    struct runner *run;
    struct backend *enc_be;          /* an encoder's backend (embeddings / rerank), owned */
    struct embedder *em;             /* an encoder served instead of a generating model */
    struct image_setup img;          /* a model with a vision tower: its image parts' setup */
    char img_err[400];               /* why it takes none, when it has a tower */
};

static void served_free(struct served *sv)
{
    embedder_free(sv->em);
    backend_free(sv->enc_be);
    runner_free(sv->run);
    grammar_vocab_free(sv->gvocab);
    cli_draft_close(&sv->draft);  /* before the engine whose backend it borrows */
    cli_engine_close(&sv->en);
    chat_tmpl_free(sv->tmpl);
    tok_free(sv->tok);
    model_free(sv->m);
}

/* Rows per engine step. A step runs as long as its rows take, so on a CPU (compute-bound at
 * a few dozen rows) a 512-row prompt chunk holds every stream's next token for its whole
 * prefill; 128 rows gave 16 clients the same throughput (within the noise), first tokens
 * 1.7-2.2x sooner and a p99 inter-token gap 20-44 % shorter (docs/benchmarks.md). A GPU
 * keeps the context's 512. At least 2 x --parallel, so every decoding sequence fits in one
 * step beside a chunk. */
static int serve_ubatch(const struct serve_cli *o, const struct backend *be)
{
    if (o->ubatch > 0)
        return (int)o->ubatch;
    if (!backend_is_cpu(be))
        return 0; /* the context's n_batch */
    long n = 2 * o->parallel > 128 ? 2 * o->parallel : 128;
    return (int)(n < 512 ? n : 512);
}

/* An encoder (hp.encoder): its backend, the embedder and, when it loads, the tokenizer (without
 * it, /v1/embeddings takes token ids only); no runner, no KV cache, no chat template. */
static int load_encoder(const struct serve_cli *o, const char *dir, struct served *sv, struct server_model *sm,
                        struct err *e)
{
    struct err te = {0};
    int rc;
    if (tok_load(&sv->tok, dir, &te) < 0)
        fprintf(stderr, "mlxcel serve: the tokenizer did not load (%s): texts will answer 400, token ids work\n",
                te.msg);
    if ((rc = backend_new(&sv->enc_be, cli_cfg()->device, (int)o->threads, &cli_cfg()->be, e)) < 0 ||
        (rc = model_prepare(sv->m, sv->enc_be, e)) < 0 ||
        (rc = embedder_new(&sv->em, sv->m, sv->enc_be, sv->tok, e)) < 0)
        return rc;
    *sm = (struct server_model){.tok = sv->tok, .n_vocab = sv->m->hp.n_vocab, .n_ctx = sv->em->max_len,
                                .hp = &sv->m->hp, .gen = sv->m->gen, .embedder = sv->em};
    return 0;
}

/* Loads the model, tokenizer, template, engine and runner. */
static int load(const struct serve_cli *o, const char *dir, struct served *sv, struct server_model *sm,
                struct err *e)
{
    int rc;
    if ((rc = model_load(&sv->m, dir, e)) < 0)
        return rc;
    if (sv->m->hp.encoder)
        return load_encoder(o, dir, sv, sm, e);
    if ((rc = cli_check_generation_config(sv->m, e)) < 0 || (rc = tok_load(&sv->tok, dir, e)) < 0)
        return rc;
    rc = chat_tmpl_load(&sv->tmpl, dir, NULL, e);
    if (rc == -ERR_MISSING)
        fprintf(stderr, "mlxcel serve: the model has no chat template: /v1/chat/completions will answer 400\n");
    else if (rc < 0)
        return err_prefix(e, "chat template");
    const struct hparams *hp = &sv->m->hp;
    /* a sequence may reach the model's default context (past max_position_embeddings for
     * dynamic NTK rope), or with --ctx-size its limit */
    long ctx = o->ctx_size > 0 ? hparams_ctx_limit(hp) : hparams_ctx_default(hp);
    long per_seq = ctx < 8192 ? ctx : 8192;
    long pool = o->ctx_size > 0 ? o->ctx_size : per_seq * o->parallel;
    long max_len = pool < ctx ? pool : ctx;
    if ((rc = cli_engine_open(&sv->en, sv->m, o->threads, (int)pool, (int)o->parallel, (int)max_len,
                               o->spec.mode != SPEC_NONE ? o->spec.draft_max : 0, e)) < 0)
        return rc;
    struct spec_params spec = o->spec;
    if (o->model_draft) {
        /* one draft sequence per sequence of the model's cache; drafts run on the engine thread */
        if ((rc = cli_draft_open(&sv->draft, o->model_draft, sv->m, &sv->en, (int)pool, (int)o->parallel,
                                 spec.draft_max, e)) < 0)
            return rc;
    }
    /* the MTP layer keeps one sequence per sequence of the model's cache, on the engine thread */
    if (spec.mode == SPEC_MTP && (rc = cli_mtp_open(&sv->draft, dir, sv->m, &sv->en, (int)pool, (int)o->parallel,
                                                    spec.draft_max, e)) < 0)
        return rc;
    if ((sv->draft.sm || sv->draft.mtp) && (rc = cli_draft_use(&sv->draft, &spec, e)) < 0)
        return rc;
    struct runner_params rp = {.max_jobs = (int)(o->parallel + o->max_queue), .no_prefix_cache = o->no_prefix_cache,
                               .max_batch_tokens = serve_ubatch(o, sv->en.be)};
    if ((rc = runner_new(&sv->run, sv->en.ctx, sv->en.kv, &rp, e)) < 0)
        return rc;
    *sm = (struct server_model){.tok = sv->tok, .tmpl = sv->tmpl, .runner = sv->run, .n_vocab = hp->n_vocab,
                                .n_ctx = (int)max_len, .hp = hp, .gen = sv->m->gen, .spec = spec};
    if (sv->m->vision) {
        /* image parts need the checkpoint's image processor; without it they answer 400 */
        struct err ie = {0};
        if (image_setup_init(&sv->img, dir, sv->m, sv->tok, &ie) == 0) {
            sm->images = &sv->img;
        } else {
            snprintf(sv->img_err, sizeof sv->img_err, "its image processor did not load: %s", ie.msg);
            sm->images_error = sv->img_err;
            fprintf(stderr, "mlxcel serve: image parts will answer 400: %s\n", sv->img_err);
        }
    }
    if (o->spec.mode != SPEC_NONE && !gen_spec_supported(sv->en.ctx, sv->en.kv))
        fprintf(stderr, "mlxcel serve: --spec: this model decodes without speculation (its recurrent layers "
                "cannot step back, or its rope follows the sequence's length)\n");
    /* every structured-output request masks through the vocabulary's byte trie: built once */
    if ((rc = grammar_vocab_new(&sv->gvocab, sv->tok, e)) < 0)
        return rc;
    sm->gvocab = sv->gvocab;
    if (sv->tmpl) {
        /* what the chat template teaches the model to emit: its tool-call format, <think> */
        const char *src = chat_tmpl_source(sv->tmpl);
        sm->tool_format = outparse_detect_format(src);
        sm->reasoning = outparse_detect_reasoning(src);
        LOG_INFO("chat template: tool calls %s, reasoning %s", outparse_format_name(sm->tool_format),
                 sm->reasoning ? "yes" : "no");
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct serve_cli o = {.port = 8080, .parallel = 4, .max_queue = 64, .max_body = 4L << 20, .timeout = 600,
                          .header_timeout = 60, .request_timeout = 300, .max_conn = 256};
    struct err e = {0};
    char dir[4096], id[256];
    struct served sv = {0};
    struct server *srv = NULL;
    struct server_model sm;
    spec_params_default(&o.spec);
    int rc = parse_args(argc, argv, &o, &e), status = CLI_EXIT_ERROR;
    if (rc > 0)
        return CLI_EXIT_OK;
    if (rc < 0)
        return cli_usage_error("serve", "%s", e.msg);
    if (!o.api_key)
        o.api_key = cli_cfg()->api_key;
    if ((rc = cli_resolve_model(o.model, dir, sizeof dir, &e)) < 0)
        return cli_fail("serve", &e);
    model_id(&o, dir, id, sizeof id);

    bool curl_on = false;
    /* every thread started from here on inherits the blocked signals; main waits for them */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct server_opts so = {.host = o.host ? o.host : "127.0.0.1", .port = (int)o.port, .api_key = o.api_key,
                             .parallel = (int)o.parallel, .max_queue = (int)o.max_queue,
                             .max_body = (size_t)o.max_body, .timeout_s = (int)o.timeout,
                             .header_timeout_s = (int)o.header_timeout, .request_timeout_s = (int)o.request_timeout,
                             .max_connections = (int)o.max_conn, .log_json = o.log_json,
                             .allow_image_urls = o.allow_image_urls,
                             .allowed_hosts = o.allowed_hosts, .n_allowed_hosts = o.n_allowed_hosts,
                             .cors_origins = o.cors_origins, .n_cors_origins = o.n_cors_origins};
    /* libcurl's global state before any connection thread fetches an image URL */
    if (o.allow_image_urls && !(curl_on = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)) {
        rc = err_setf(&e, ERR_NOMEM, "--allow-image-urls: libcurl did not start");
        goto out;
    }
    if ((rc = server_start(&srv, &so, &e)) < 0 || (rc = load(&o, dir, &sv, &sm, &e)) < 0)
        goto out;
    sm.id = id;
    server_set_model(srv, &sm);
    bool v6 = strchr(so.host, ':') != NULL;
    enum dtype kvt = sv.en.kv ? sv.en.kv->dtype : DTYPE_F32;
    char id_esc[1024];  /* the id is the folder's name unless --alias: escaped (termsafe.h) */
    printf("mlxcel serve: listening on http://%s%s%s:%d (model %s, %ld parallel, %d tokens per request%s%s%s)\n",
           v6 ? "[" : "", so.host, v6 ? "]" : "", server_port(srv), termsafe_str(id, id_esc, sizeof id_esc),
           o.parallel, sm.n_ctx,
           kvt == DTYPE_F32 ? "" : ", kv ", kvt == DTYPE_F32 ? "" : cli_kv_dtype_name(kvt),
           sv.en.be && sv.en.be->fast ? ", fast" : "");
    /* the ready line is what scripts wait for: a server that cannot say where it
     * listens stops rather than run unseen */
    if ((rc = cli_stdout_check(&e)) < 0)
        goto out;
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "mlxcel serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = CLI_EXIT_OK;
out:
    if (srv)
        server_begin_stop(srv);
    server_free(srv);
    served_free(&sv);
    if (curl_on)
        curl_global_cleanup();
    if (status != CLI_EXIT_OK)
        return cli_fail("serve", &e);
    return status;
}
