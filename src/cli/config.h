/*
 * config: the one reader of the settings every command shares (ADR 0056).
 *
 * The global flags (--device, --kv-type, --fast, --[no-]mmap, --offline) and
 * every environment variable mlxcel documents are read here, once, when main()
 * starts; nothing else in the program calls getenv, and the library below
 * src/cli never does: it receives what it needs as arguments (struct
 * backend_opts for backend_new, struct hub_opts for the Hub, the KV type in
 * struct kv_params). A flag wins over its variable. On/off variables follow
 * src/core/boolenv.h (1/0, true/false, yes/no, on/off; empty is unset; any
 * other value is refused before a command runs); HF_HUB_OFFLINE follows
 * huggingface_hub (1/true/yes/on is on, anything else off).
 *
 * The table of variables is in README.md ("Environment"); the developer
 * switches (MLXCEL_ISA, MLXCEL_REPACK, MLXCEL_FUSED_MOE, MLXCEL_CUDA_*) are
 * code-path choices for measurements and tests, listed there too.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "../core/err.h"
#include "../kernels/backend.h"

struct hub_opts;

/* How many variables llama_env.def lists. */
#define LLAMA_ENV(var, flag, neg, is_bool) 1 +
enum { CLI_N_LLAMA_ENV = (
#include "llama_env.def"
    0) };
#undef LLAMA_ENV

struct cli_config {
    const char *device;       /* --device / $MLXCEL_DEVICE; NULL: "cpu" */
    const char *kv_type;      /* --kv-type / $MLXCEL_KV_TYPE as given; NULL: f32 (cli_kv_dtype) */
    const char *tensor_parallel; /* --tensor-parallel / -tp as given; NULL: one rank
                                  * (cli_tensor_parallel parses it) */
    struct backend_opts be;   /* --fast, --[no-]mmap, $MLXCEL_ISA, _REPACK, _FUSED_MOE, _CUDA_* */
    bool offline;             /* --offline / $HF_HUB_OFFLINE */
    /* the Hugging Face settings, resolved as huggingface_hub does */
    char hf_cache[4096];      /* $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub */
    char hf_endpoint[512];    /* $HF_ENDPOINT without trailing '/', else HUB_DEFAULT_ENDPOINT */
    const char *hf_token;     /* $HF_TOKEN, else $HUGGING_FACE_HUB_TOKEN; NULL: none */
    char hf_token_path[4200]; /* $HF_TOKEN_PATH, else $HF_HOME/token, else ~/.cache/huggingface/token */
    const char *hf_etag_timeout;     /* $HF_HUB_ETAG_TIMEOUT as given (cmd_pull parses it) */
    const char *hf_download_timeout; /* $HF_HUB_DOWNLOAD_TIMEOUT as given */
    long hub_backoff_ms;      /* $MLXCEL_HUB_BACKOFF_MS (tests); -1: the Hub client's default */
    /* mlxcel's own folders and server */
    char models_dir[4096];    /* $MLXCEL_MODELS_DIR, else ~/.cache/mlxcel/models */
    const char *default_model;/* $MLXCEL_DEFAULT_MODEL; NULL: beside the executable */
    const char *api_key;      /* $MLXCEL_API_KEY (serve, when --api-key is absent); NULL: none */
    /* llama-server's variables for serve's flags, in llama_env.def's order, as given (NULL:
     * unset or empty); cmd_serve checks and applies them */
    const char *llama_env[CLI_N_LLAMA_ENV];
};

/* Read the environment and take the global flags out of argv[2..] (before a "--"), then
 * argv[*argc] = NULL. 0; -ERR_ARG with the message in e (a global flag without its value,
 * an on/off variable that is neither). The result is what cli_cfg() returns from then on. */
int cli_config_load(int *argc, char **argv, struct err *e);
/* The settings cli_config_load read (the defaults before it ran). */
const struct cli_config *cli_cfg(void);
/* The Hub's settings of the config into o (cache, endpoint, token, token file, offline,
 * backoff); the caller's own fields (revision, globs, callbacks) are left alone. */
void cli_hub_opts(struct hub_opts *o);
