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
#include <errno.h>
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
#include "../server/router.h"
#include "../server/server.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "config.h"

static const char *k_help =
    "usage: mlxcel serve [-m MODEL] [options]\n"
    "       mlxcel serve --models-dir DIR | -m [NAME=]MODEL -m [NAME=]MODEL ... [options]\n"
    "\n"
    "Serve a model over an OpenAI-compatible HTTP API (docs/server.md):\n"
    "/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics,\n"
    "/tokenize, /detokenize, /apply-template; llama-server's /completion,\n"
    "/infill, /props and /slots; a chat page at /; GET /models,\n"
    "POST /models/load and /models/unload in router mode.\n"
    "\n"
    "  -m, --model MODEL          checkpoint folder or owner/name (default: the embedded model);\n"
    "                             given more than once (or with --models-dir), router mode:\n"
    "                             each request's \"model\" picks one; NAME=MODEL names it (else\n"
    "                             the folder's name, or owner/name as given)\n"
    "\n"
    "Router mode (several models, as llama-server's; docs/server.md):\n"
    "      --models-dir DIR       serve every subfolder of DIR holding a config.json, named by\n"
    "                             the folder (owner/name for DIR/owner/name; a Hugging Face hub\n"
    "                             cache's models--OWNER--NAME: its main snapshot as OWNER/NAME);\n"
    "                             symlinks leading out of DIR are skipped\n"
    "      --models-max N         models loaded at once, least recently used unloaded first\n"
    "                             (default 4; 0: no limit); --max-loaded is the same flag\n"
    "      --memory-budget BYTES  bytes of loaded models (weights + KV cache; K, M, G suffixes;\n"
    "                             default: no limit)\n"
    "      --no-models-autoload   load models only through POST /models/load (default: a\n"
    "                             request's first use loads its model); --models-autoload: on\n"
    "      --models-preset FILE   per-model defaults: llama-server's INI ([*], [NAME]; keys\n"
    "                             ctx-size, parallel, temp, top-p, top-k, min-p, repeat-penalty,\n"
    "                             chat-template-file, lora, load-on-startup, model) or the same\n"
    "                             as JSON\n"
    "      --models-load-timeout S  a request waits S seconds for its model to load, then 503\n"
    "                             (default 600)\n"
    "\n"
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
    "      --served-model-name NAME  the model's id in the API (default: the folder or owner/name);\n"
    "                             -a, --alias is the same flag (llama-server's name)\n"
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
    "                             GLM-4.5, GLM-4.7-Flash, Qwen3-Next, Qwen3.5); the same output,\n"
    "                             fewer steps when drafts are often right (counted in /metrics)\n"
    "  -md, --model-draft MODEL   the draft model of --spec draft (implies it): a smaller\n"
    "                             checkpoint with the same vocabulary (folder or owner/name)\n"
    "      --draft-max N          tokens drafted per step at most (default 16, up to 64)\n"
    "      --draft-min N          decode plainly when fewer are drafted (default 1)\n"
    "      --spec-gate on|off     a request's drafting steps timed against plain ones on the\n"
    "                             steps it has to itself, drafting paused while plain decoding\n"
    "                             is faster (default on)\n"
    "      --lora PATH[:S]        a LoRA adapter (mlx-lm adapters.safetensors or PEFT\n"
    "                             adapter_model.safetensors, with adapter_config.json) served\n"
    "                             unmerged at global scale S (default 1); repeatable: ids 0, 1, ..\n"
    "                             (GET/POST /lora-adapters; a request's \"lora\": [{\"id\", \"scale\"}])\n"
    "      --lora-scaled PATH S   the same at scale S (llama.cpp's form)\n"
    "      --lora-init-without-apply  load the adapters at scale 0\n"
    "      --reranker qwen3       serve the model (a causal LM) as Qwen3-Reranker: /v1/rerank scores\n"
    "                             P(\"yes\") of its prompt (docs/server.md)\n"
    "      --kv-type f32|f16|bf16 KV cache element type (default f32; f16 and bf16 halve it)\n"
    "      --fast                 4-bit products on x rounded to 8 bits per group (not exact;\n"
    "                             AVX2 / AVX-512 CPUs; default off)\n"
    "  -t, --threads N            CPU threads (default: all online CPUs)\n"
    "      --props                accept POST /props (llama-server's; default: answered 501)\n"
    "      --slots, --no-slots    GET /slots on (default) or answered 501\n"
    "      --log-format text|json access log format on stderr (default text)\n"
    "  -v, --verbose              log loading details to stderr\n"
    "  -h, --help                 show this help\n"
    "\n"
    "llama-server's environment variables set the flags they name when the command\n"
    "line does not give the flag (a flag wins; the variable is then not read):\n"
    "  LLAMA_ARG_MODEL (-m), LLAMA_ARG_HOST, LLAMA_ARG_PORT, LLAMA_ARG_N_PARALLEL (-np),\n"
    "  LLAMA_ARG_CTX_SIZE (-c), LLAMA_ARG_UBATCH (-ub), LLAMA_ARG_THREADS (-t),\n"
    "  LLAMA_API_KEY (--api-key, before $MLXCEL_API_KEY), LLAMA_ARG_ALIAS (--alias),\n"
    "  LLAMA_ARG_TIMEOUT, LLAMA_ARG_MODEL_DRAFT or LLAMA_ARG_SPEC_DRAFT_MODEL (-md),\n"
    "  LLAMA_ARG_DRAFT_MAX or LLAMA_ARG_SPEC_DRAFT_N_MAX, LLAMA_ARG_DRAFT_MIN or\n"
    "  LLAMA_ARG_SPEC_DRAFT_N_MIN, and on/off (true/1/on/enabled, false/0/off/disabled):\n"
    "  LLAMA_ARG_ENDPOINT_SLOTS (--slots), LLAMA_ARG_NO_ENDPOINT_SLOTS (--no-slots),\n"
    "  LLAMA_ARG_ENDPOINT_PROPS (--props).\n";

enum {
    OPT_HOST = 256, OPT_PORT, OPT_API_KEY, OPT_NAME, OPT_MAX_QUEUE, OPT_MAX_BODY, OPT_TIMEOUT, OPT_LOG_FORMAT,
    OPT_MAX_CONN, OPT_NO_PREFIX, OPT_ALLOW_IMAGE_URLS, OPT_UBATCH, OPT_HEADER_TIMEOUT, OPT_REQUEST_TIMEOUT, OPT_ALLOWED_HOST,
    OPT_CORS_ORIGIN, OPT_SPEC, OPT_DRAFT_MAX, OPT_DRAFT_MIN, OPT_SPEC_GATE, OPT_MODEL_DRAFT, OPT_PROPS, OPT_SLOTS, OPT_NO_SLOTS,
    OPT_MODELS_DIR, OPT_MODELS_MAX, OPT_MEMORY_BUDGET, OPT_AUTOLOAD, OPT_NO_AUTOLOAD, OPT_MODELS_PRESET,
    OPT_LOAD_TIMEOUT, OPT_RERANKER,
    OPT_END,
};

#define SERVE_MAX_LIST 32  /* --allowed-host and --cors-origin values, each */

struct serve_cli {
    const char *model, *host, *api_key, *name, *model_draft, *reranker;
    long port, parallel, ctx_size, max_queue, max_body, timeout, threads, max_conn, ubatch;
    long header_timeout, request_timeout;
    bool log_json, no_prefix_cache, allow_image_urls, props, no_slots;
    bool seen[OPT_END];          /* the options the command line gave (by getopt code) */
    struct spec_params spec;
    const char *allowed_hosts[SERVE_MAX_LIST], *cors_origins[SERVE_MAX_LIST];
    int n_allowed_hosts, n_cors_origins;
    /* router mode: every -m, --models-dir and its limits */
    const char *models[SERVE_MAX_LIST];
    int n_models;
    const char *models_dir, *models_preset;
    long models_max, load_timeout;
    unsigned long long memory_budget;
    bool no_autoload;
    const char *chat_template_file;  /* a preset's chat-template-file (router mode) */
    struct cli_lora lora;            /* the flags (paths, scales); loaded into served.lora */
};

/* --memory-budget: bytes, with an optional K, M, G or T (powers of 1024). */
static int parse_bytes(const char *v, unsigned long long *out, struct err *e)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10;
    else if (*end == 'M' || *end == 'm') shift = 20;
    else if (*end == 'G' || *end == 'g') shift = 30;
    else if (*end == 'T' || *end == 't') shift = 40;
    if (shift)
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (errno || end == v || *end || v[0] == '-' || x == 0 || x > (~0ULL >> shift))
        return err_setf(e, ERR_ARG, "--memory-budget '%.32s' is not a byte count (e.g. 8G, 512M, 1073741824)", v);
    *out = x << shift;
    return 0;
}

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
    {"alias", required_argument, NULL, OPT_NAME},
    {"a", required_argument, NULL, OPT_NAME},
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
    {"props", no_argument, NULL, OPT_PROPS},
    {"slots", no_argument, NULL, OPT_SLOTS},
    {"no-slots", no_argument, NULL, OPT_NO_SLOTS},
    {"spec", required_argument, NULL, OPT_SPEC},
    {"draft-max", required_argument, NULL, OPT_DRAFT_MAX},
    {"draft-min", required_argument, NULL, OPT_DRAFT_MIN},
    {"spec-gate", required_argument, NULL, OPT_SPEC_GATE},
    {"model-draft", required_argument, NULL, OPT_MODEL_DRAFT},
    {"md", required_argument, NULL, OPT_MODEL_DRAFT},
    {"reranker", required_argument, NULL, OPT_RERANKER},
    {"models-dir", required_argument, NULL, OPT_MODELS_DIR},
    {"models-max", required_argument, NULL, OPT_MODELS_MAX},
    {"max-loaded", required_argument, NULL, OPT_MODELS_MAX},
    {"memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET},
    {"models-autoload", no_argument, NULL, OPT_AUTOLOAD},
    {"no-models-autoload", no_argument, NULL, OPT_NO_AUTOLOAD},
    {"models-preset", required_argument, NULL, OPT_MODELS_PRESET},
    {"models-load-timeout", required_argument, NULL, OPT_LOAD_TIMEOUT},
    {"threads", required_argument, NULL, 't'},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},
    CLI_LORA_OPTIONS,
    {NULL, 0, NULL, 0},
};

static int parse_args(int argc, char **argv, struct serve_cli *o, struct err *e)
{
    int c, rc = 0;
    opterr = 0;
    optind = 1;
    /* getopt_long_only: -np like llama-server (and every long option with one dash) */
    while (rc == 0 && (c = getopt_long_only(argc, argv, ":m:c:t:vh", k_opts, NULL)) != -1) {
        if (c >= 0 && c < OPT_END)
            o->seen[c] = true;
        switch (c) {
        case 'm':
            if (o->n_models == SERVE_MAX_LIST)
                rc = err_setf(e, ERR_ARG, "-m: at most %d (use --models-dir for more)", SERVE_MAX_LIST);
            else
                o->model = o->models[o->n_models++] = optarg;
            break;
        case OPT_MODELS_DIR: o->models_dir = optarg; break;
        case OPT_MODELS_MAX: rc = cli_parse_int("--models-max", optarg, 0, ROUTER_MAX_MODELS, &o->models_max, e); break;
        case OPT_MEMORY_BUDGET: rc = parse_bytes(optarg, &o->memory_budget, e); break;
        case OPT_AUTOLOAD: o->no_autoload = false; break;
        case OPT_NO_AUTOLOAD: o->no_autoload = true; break;
        case OPT_MODELS_PRESET: o->models_preset = optarg; break;
        case OPT_LOAD_TIMEOUT: rc = cli_parse_int("--models-load-timeout", optarg, 1, 86400, &o->load_timeout, e); break;
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
        case OPT_PROPS: o->props = true; break;
        case OPT_SLOTS: o->no_slots = false; break;
        case OPT_NO_SLOTS: o->no_slots = true; break;
        case OPT_SPEC: rc = cli_spec_flag("spec", optarg, &o->spec, e); break;
        case OPT_DRAFT_MAX: rc = cli_spec_flag("draft-max", optarg, &o->spec, e); break;
        case OPT_DRAFT_MIN: rc = cli_spec_flag("draft-min", optarg, &o->spec, e); break;
        case OPT_SPEC_GATE: rc = cli_spec_flag("spec-gate", optarg, &o->spec, e); break;
        case OPT_MODEL_DRAFT: o->model_draft = optarg; break;
        case CLI_OPT_LORA:
        case CLI_OPT_LORA_SCALED:
        case CLI_OPT_LORA_NO_APPLY: rc = cli_lora_flag(&o->lora, c, optarg, argc, argv, e); break;
        case OPT_RERANKER: o->reranker = optarg; break;
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
    bool router = o->models_dir || o->n_models > 1;
    if (!router && o->models_preset)
        return err_setf(e, ERR_ARG, "--models-preset: presets are for router mode (--models-dir or several -m)");
    if (router && o->model_draft)
        return err_setf(e, ERR_ARG, "--model-draft: one draft model does not fit several models (router mode)");
    if (router && o->lora.n > 0)
        return err_setf(e, ERR_ARG, "--lora: adapters belong to one base model and router mode serves several: "
                        "serve the adapters' base model alone (one -m)");
    if (router && o->reranker)
        return err_setf(e, ERR_ARG, "--reranker: it names one model's kind (router mode: write "
                        "\"classifier_from_token\": [\"no\", \"yes\"] and \"is_original_qwen3_reranker\": true "
                        "into that model's config.json)");
    if (router && o->name)
        return err_setf(e, ERR_ARG, "--served-model-name: in router mode models are named by their folder "
                        "or by -m NAME=MODEL");
    if (o->spec.mode == SPEC_NGRAM)
        return spec_params_check(&o->spec, e);
    return 0;
}

// ---- llama-server's environment variables ----

static const struct {
    const char *var, *flag, *neg;
    bool is_bool;
} k_llama_env[] = {
#define LLAMA_ENV(var, flag, neg, is_bool) {var, flag, neg, is_bool},
#include "llama_env.def"
#undef LLAMA_ENV
};

/* The getopt code of long option name (-1: none). */
static int opt_code(const char *name)
{
    for (const struct option *p = k_opts; p->name; p++)
        if (strcmp(p->name, name) == 0)
            return p->val;
    return -1;
}

/* llama.cpp's on/off words (common/arg.cpp is_truthy / is_falsey): 1 on, 0 off, -1 neither. */
static int llama_bool(const char *v)
{
    static const char *const k_on[] = {"on", "enabled", "true", "1"}, *const k_off[] = {"off", "disabled", "false", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(v, k_on[i]) == 0)
            return 1;
        if (strcmp(v, k_off[i]) == 0)
            return 0;
    }
    return -1;
}

/* The variables of llama_env.def (read by config.c) whose flag the command line did not give,
 * applied as that flag (and checked as it is); a bad value is an error naming the variable.
 * Both of a pair (LLAMA_ARG_ENDPOINT_SLOTS and LLAMA_ARG_NO_ENDPOINT_SLOTS) count as one
 * flag: --slots or --no-slots on the command line replaces both. */
static int apply_llama_env(struct serve_cli *o, struct err *e)
{
    char esc[256];
    for (int i = 0; i < CLI_N_LLAMA_ENV; i++) {
        const char *v = cli_cfg()->llama_env[i], *flag = k_llama_env[i].flag;
        int code = opt_code(flag), neg = k_llama_env[i].neg ? opt_code(k_llama_env[i].neg) : -1;
        if (!v || code < 0 || o->seen[code] || (neg >= 0 && o->seen[neg]))
            continue;
        char opt[64];
        char *argv[4] = {"serve", opt, (char *)v, NULL};
        int argc = 3;
        if (k_llama_env[i].is_bool) {
            int b = llama_bool(v);
            if (b < 0)
                return err_setf(e, ERR_ARG, "%s='%s' is neither on nor off (true/1/on/enabled, "
                                "false/0/off/disabled)", k_llama_env[i].var, termsafe_str(v, esc, sizeof esc));
            if (!b && !k_llama_env[i].neg)
                continue;  /* off: the flag's default */
            flag = b ? flag : k_llama_env[i].neg;
            argc = 2;
            argv[2] = NULL;
        }
        snprintf(opt, sizeof opt, "--%s", flag);
        struct err fe = {0};
        bool seen[OPT_END];
        memcpy(seen, o->seen, sizeof seen);
        int rc = parse_args(argc, argv, o, &fe);
        memcpy(o->seen, seen, sizeof seen);  /* a variable is not the command line */
        if (rc != 0)
            return err_setf(e, ERR_ARG, "%s='%s': %s", k_llama_env[i].var, termsafe_str(v, esc, sizeof esc),
                            rc > 0 ? "not a value" : fe.msg);
    }
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
    struct cli_lora lora;            /* the adapters served (--lora), owned */
    char lora_spec[4096];            /* router mode: the preset's "lora" list, which lora.path
                                      * points into for the model's lifetime */
};

static void served_free(struct served *sv)
{
    embedder_free(sv->em);
    backend_free(sv->enc_be);
    runner_free(sv->run);
    grammar_vocab_free(sv->gvocab);
    cli_draft_close(&sv->draft);  /* before the engine whose backend it borrows */
    cli_engine_close(&sv->en);
    cli_lora_free(&sv->lora);
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
    if ((rc = model_load(&sv->m, dir, e)) < 0 || (rc = cli_reranker_apply(sv->m, o->reranker, e)) < 0)
        return rc;
    if (sv->m->hp.encoder && o->lora.n > 0)
        return err_setf(e, ERR_UNSUPPORTED, "--lora: '%s' is an encoder; adapters apply to "
                        "generating models only", sv->m->hp.model_type);
    if (sv->m->hp.encoder && cli_cfg()->tensor_parallel)
        return err_setf(e, ERR_UNSUPPORTED, "--tensor-parallel: '%s' is an encoder; embedding models "
                        "are not split", sv->m->hp.model_type);
    if (sv->m->hp.encoder)
        return load_encoder(o, dir, sv, sm, e);
    if ((rc = cli_check_generation_config(sv->m, e)) < 0 || (rc = tok_load(&sv->tok, dir, e)) < 0)
        return rc;
    rc = chat_tmpl_load(&sv->tmpl, dir, o->chat_template_file, e);
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
    sv->lora = o->lora;
    if ((rc = cli_lora_attach(&sv->lora, sv->m, &sv->en, e)) < 0)
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
                                .n_ctx = (int)max_len, .hp = hp, .gen = sv->m->gen, .spec = spec,
                                .lora_ctx = sv->en.ctx, .lora_paths = sv->lora.path, .n_lora = sv->lora.n};
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
        fprintf(stderr, "mlxcel serve: --spec: this model decodes without speculation (its rope follows the "
                "sequence's length: dynamic NTK or LongRoPE)\n");
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


// ---- router mode ----

/* -m [NAME=]MODEL: an existing path is a model, whatever it holds; else NAME= before the
 * first '=' names it (NAME without '/'). *path points into arg; name "" when none. */
static void split_model_arg(const char *arg, char *name, size_t cap, const char **path)
{
    struct stat st;
    const char *eq = strchr(arg, '=');
    name[0] = 0;
    *path = arg;
    if (stat(arg, &st) == 0 || !eq || eq == arg || (size_t)(eq - arg) >= cap || memchr(arg, '/', (size_t)(eq - arg)))
        return;
    snprintf(name, cap, "%.*s", (int)(eq - arg), arg);
    *path = eq + 1;
}

/* The loader of router mode (router.h): one model as a single-model serve loads it, with
 * its preset's context, parallel sequences, chat template and sampling defaults. ud: the
 * serve flags (struct serve_cli), outliving the server. */
static int router_load(void *ud, const struct router_spec *spec, struct server_model *out, void **handle,
                       uint64_t *bytes, struct err *e)
{
    struct serve_cli o = *(const struct serve_cli *)ud;
    const struct router_preset *p = &spec->preset;
    if (p->set & ROUTER_SET_CTX)
        o.ctx_size = p->ctx_size;
    if (p->set & ROUTER_SET_PARALLEL)
        o.parallel = p->parallel;
    o.chat_template_file = p->set & ROUTER_SET_TEMPLATE ? p->chat_template_file : NULL;
    struct served *sv = calloc(1, sizeof *sv);
    if (!sv)
        return err_setf(e, ERR_NOMEM, "out of memory");
    int rc = 0;
    /* the preset's adapters, each as --lora PATH[:S] would give it (--lora itself is refused
     * in router mode: adapters belong to one base model) */
    memset(&o.lora, 0, sizeof o.lora);
    if (p->set & ROUTER_SET_LORA) {
        snprintf(sv->lora_spec, sizeof sv->lora_spec, "%s", p->lora);
        char *save = NULL;
        for (char *t = strtok_r(sv->lora_spec, ",", &save); t && rc == 0; t = strtok_r(NULL, ",", &save)) {
            while (*t == ' ' || *t == '\t')
                t++;
            rc = *t ? cli_lora_flag(&o.lora, CLI_OPT_LORA, t, 0, NULL, e) : 0;
        }
        if (rc < 0)
            err_prefix(e, "preset 'lora' of model '%s'", spec->name);
    }
    if (rc == 0)
        rc = load(&o, spec->path, sv, out, e);
    if (rc < 0) {
        served_free(sv);
        free(sv);
        return rc;
    }
    struct generation_defaults *g = &out->gen;
    if (p->set & ROUTER_SET_TEMP) g->temperature = p->temp;
    if (p->set & ROUTER_SET_TOP_P) g->top_p = p->top_p;
    if (p->set & ROUTER_SET_TOP_K) g->top_k = p->top_k;
    if (p->set & ROUTER_SET_MIN_P) g->min_p = p->min_p;
    if (p->set & ROUTER_SET_REPEAT_PENALTY) g->repeat_penalty = p->repeat_penalty;
    /* its memory: the weights, and the KV cache of --ctx-size tokens */
    uint64_t kv = 0;
    if (sv->en.kv) {
        long ctx = o.ctx_size > 0 ? o.ctx_size : (long)out->n_ctx * o.parallel;
        kv = model_kv_bytes_per_token(sv->m, sv->en.kv->dtype) * (uint64_t)ctx;
    }
    *bytes = model_weight_bytes(sv->m) + kv;
    *handle = sv;
    return 0;
}

static void router_unload(void *ud, void *handle)
{
    (void)ud;
    served_free(handle);
    free(handle);
}

/* The models of router mode: every -m (resolved as a single -m is), then --models-dir's,
 * then the presets (which may add models); each one's parallel made explicit for /metrics. */
static int router_models(struct serve_cli *o, struct router_list *l, char (*dirs)[4096], struct err *e)
{
    int rc;
    for (int i = 0; i < o->n_models; i++) {
        char name[ROUTER_NAME_MAX];
        const char *path;
        split_model_arg(o->models[i], name, sizeof name, &path);
        if ((rc = cli_resolve_model(path, dirs[i], sizeof dirs[i], e)) < 0)
            return rc;
        if (!name[0]) {
            struct serve_cli one = {.model = path};
            model_id(&one, dirs[i], name, sizeof name);
        }
        if ((rc = router_list_add(l, name, dirs[i], e)) < 0)
            return err_prefix(e, "-m %s", o->models[i]);
    }
    int found = 0;
    if (o->models_dir && (rc = router_scan_dir(l, o->models_dir, &found, e)) < 0)
        return rc;
    if (o->models_dir && found == 0)
        fprintf(stderr, "mlxcel serve: --models-dir %s: no folder holding a config.json\n", o->models_dir);
    if (o->models_preset && (rc = router_presets_load(l, o->models_preset, e)) < 0)
        return rc;
    if (l->n == 0)
        return err_setf(e, ERR_ARG, "no model to serve");
    for (int i = 0; i < l->n; i++)
        if (!(l->v[i].preset.set & ROUTER_SET_PARALLEL))
            l->v[i].preset.parallel = o->parallel;
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    struct serve_cli o = {.port = 8080, .parallel = 4, .max_queue = 64, .max_body = 4L << 20, .timeout = 600,
                          .header_timeout = 60, .request_timeout = 300, .max_conn = 256, .models_max = 4,
                          .load_timeout = 600};
    struct err e = {0};
    char dir[4096], id[256], name[ROUTER_NAME_MAX];
    char (*dirs)[4096] = NULL;       /* router mode: each -m's folder */
    struct router_list models = {0};
    struct served sv = {0};
    struct server *srv = NULL;
    struct server_model sm;
    spec_params_default(&o.spec);
    int rc = parse_args(argc, argv, &o, &e), status = CLI_EXIT_ERROR;
    if (rc > 0)
        return CLI_EXIT_OK;
    if (rc < 0 || (rc = apply_llama_env(&o, &e)) < 0)
        return cli_usage_error("serve", "%s", e.msg);
    if (!o.api_key)
        o.api_key = cli_cfg()->api_key;
    bool router = o.models_dir || o.n_models > 1;
    if (router) {
        if (!(dirs = calloc((size_t)(o.n_models ? o.n_models : 1), sizeof *dirs)) ||
            router_models(&o, &models, dirs, &e) < 0) {
            if (!dirs)
                err_setf(&e, ERR_NOMEM, "out of memory");
            free(dirs);
            router_list_free(&models);
            return cli_fail("serve", &e);
        }
    } else {
        if (o.model) {
            split_model_arg(o.model, name, sizeof name, &o.model);
            if (name[0] && !o.name)
                o.name = name;  /* -m NAME=MODEL: NAME is its id */
        }
        if ((rc = cli_resolve_model(o.model, dir, sizeof dir, &e)) < 0)
            return cli_fail("serve", &e);
        model_id(&o, dir, id, sizeof id);
    }

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
                             .cors_origins = o.cors_origins, .n_cors_origins = o.n_cors_origins,
                             .endpoint_props = o.props, .no_slots = o.no_slots,
                             .build_info = "mlxcel " MLXCEL_VERSION};
    /* libcurl's global state before any connection thread fetches an image URL */
    if (o.allow_image_urls && !(curl_on = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)) {
        rc = err_setf(&e, ERR_NOMEM, "--allow-image-urls: libcurl did not start");
        goto out;
    }
    if ((rc = server_start(&srv, &so, &e)) < 0)
        goto out;
    bool v6 = strchr(so.host, ':') != NULL;
    if (router) {
        struct router_opts ro = {.max_loaded = (int)o.models_max, .memory_budget = o.memory_budget,
                                 .autoload = !o.no_autoload, .load_timeout_s = (int)o.load_timeout};
        struct router_loader ld = {.ud = &o, .load = router_load, .unload = router_unload};
        if ((rc = server_set_router(srv, &models, &ro, &ld, &e)) < 0)
            goto out;
        printf("mlxcel serve: listening on http://%s%s%s:%d (router: %d models, at most %ld loaded%s)\n",
               v6 ? "[" : "", so.host, v6 ? "]" : "", server_port(srv), models.n, o.models_max,
               o.no_autoload ? ", no autoload" : "");
        goto ready;
    }
    if ((rc = load(&o, dir, &sv, &sm, &e)) < 0)
        goto out;
    sm.id = id;
    sm.path = dir;
    server_set_model(srv, &sm);
    enum dtype kvt = sv.en.kv ? sv.en.kv->dtype : DTYPE_F32;
    char id_esc[1024];  /* the id is the folder's name unless --alias: escaped (termsafe.h) */
    printf("mlxcel serve: listening on http://%s%s%s:%d (model %s, %ld parallel, %d tokens per request%s%s%s)\n",
           v6 ? "[" : "", so.host, v6 ? "]" : "", server_port(srv), termsafe_str(id, id_esc, sizeof id_esc),
           o.parallel, sm.n_ctx,
           kvt == DTYPE_F32 ? "" : ", kv ", kvt == DTYPE_F32 ? "" : cli_kv_dtype_name(kvt),
           sv.en.be && sv.en.be->fast ? ", fast" : "");
ready:
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
    server_free(srv);  /* in router mode, unloads every model (router_unload) */
    served_free(&sv);
    router_list_free(&models);
    free(dirs);
    if (curl_on)
        curl_global_cleanup();
    if (status != CLI_EXIT_OK)
        return cli_fail("serve", &e);
    return status;
}
