/*
 * config: the one reader of the global flags and the documented environment
 * (config.h, ADR 0056). cli_config_load runs once in main(); every command reads
 * the result through cli_cfg() and hands the library its options as arguments.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "../core/boolenv.h"
#include "../core/termsafe.h"
#include "../hub/hub.h"

static struct cli_config g_cfg = {.be = BACKEND_OPTS_DEFAULT, .hub_backoff_ms = -1};

const struct cli_config *cli_cfg(void)
{
    return &g_cfg;
}

/* $name, NULL when unset or empty. */
static const char *env_str(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

// ---- the global flags ----

/* Which global flags argv held (a flag wins over its variable). */
struct flags_seen {
    bool fast, mmap, offline;
};

/* argv[*i] as `flag VALUE` or `flag=VALUE` into *dst: 1 taken (*i past it), 0 another
 * argument, -1 the value missing. */
static int take_value(int argc, char **argv, int *i, const char *flag, const char **dst)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0 || (argv[*i][n] != '=' && argv[*i][n] != '\0'))
        return 0;
    if (argv[*i][n] == '=') {
        *dst = argv[*i] + n + 1;
        return 1;
    }
    if (*i + 1 >= argc)
        return -1;
    *dst = argv[++*i];
    return 1;
}

/* --offline, --[no-]mmap, --device, --kv-type, --tensor-parallel and --fast are understood by
 * every command (--tensor-parallel: refused by those that run no engine, cli_tensor_parallel):
 * they are taken out of argv (before a "--") into g_cfg. */
static int strip_global(int *argc, char **argv, struct flags_seen *seen, struct err *e)
{
    int k = 2, rc;
    bool tail = false;
    for (int i = 2; i < *argc; i++) {
        tail = tail || strcmp(argv[i], "--") == 0;
        if (tail) {
            argv[k++] = argv[i];
        } else if (strcmp(argv[i], "--offline") == 0) {
            g_cfg.offline = seen->offline = true;
        } else if (strcmp(argv[i], "--fast") == 0) {
            g_cfg.be.fast = seen->fast = true;
        } else if (strcmp(argv[i], "--mmap") == 0 || strcmp(argv[i], "--no-mmap") == 0) {
            g_cfg.be.copy = argv[i][2] == 'n' ? BACKEND_COPY_ALL : BACKEND_COPY_NONE;
            seen->mmap = true;
        } else if ((rc = take_value(*argc, argv, &i, "--device", &g_cfg.device)) != 0) {
            if (rc < 0)
                return err_setf(e, ERR_ARG, "--device needs a value (auto, cpu, cuda or cuda:N)");
        } else if ((rc = take_value(*argc, argv, &i, "--kv-type", &g_cfg.kv_type)) != 0) {
            if (rc < 0)
                return err_setf(e, ERR_ARG, "--kv-type needs a value (f32, f16 or bf16)");
        } else if ((rc = take_value(*argc, argv, &i, "--tensor-parallel", &g_cfg.tensor_parallel)) != 0 ||
                   (rc = take_value(*argc, argv, &i, "-tp", &g_cfg.tensor_parallel)) != 0) {
            if (rc < 0)
                return err_setf(e, ERR_ARG, "--tensor-parallel needs a value (the number of ranks)");
        } else {
            argv[k++] = argv[i];
        }
    }
    argv[k] = NULL;
    *argc = k;
    return 0;
}

// ---- the environment ----

/* An on/off variable into *dst (left alone when unset or empty): a value that is not one
 * of boolenv's eight words is refused rather than read as on or as the default. */
static int env_bool(const char *name, bool *dst, struct err *e)
{
    const char *v = env_str(name);
    if (!v)
        return 0;
    int b = boolenv_parse(v);
    if (b < 0) {
        char esc[256];
        return err_setf(e, ERR_ARG, "%s='%s' is neither on nor off (1/0, true/false, yes/no, on/off)",
                        name, termsafe_str(v, esc, sizeof esc));
    }
    *dst = b == 1;
    return 0;
}

/* The backend's options: the variables a flag did not set. */
static int read_backend(const struct flags_seen *seen, struct err *e)
{
    static const struct {
        const char *name;
        size_t off;
    } k_bool[] = {
        {"MLXCEL_FUSED_MOE", offsetof(struct backend_opts, fused_moe)},
        {"MLXCEL_REPACK", offsetof(struct backend_opts, repack)},
        {"MLXCEL_CUDA_PDL", offsetof(struct backend_opts, cuda_pdl)},
        {"MLXCEL_CUDA_QI", offsetof(struct backend_opts, cuda_qi)},
        {"MLXCEL_CUDA_ATTN_SPLIT", offsetof(struct backend_opts, cuda_attn_split)},
        {"MLXCEL_CUDA_ATTN_FLASH", offsetof(struct backend_opts, cuda_attn_flash)},
        {"MLXCEL_CUDA_ATTN_FA2", offsetof(struct backend_opts, cuda_attn_fa2)},
        {"MLXCEL_CUDA_GRAPHS", offsetof(struct backend_opts, cuda_graphs)},
        {"MLXCEL_CUDA_MMA", offsetof(struct backend_opts, cuda_mma)},
        {"MLXCEL_CUDA_MMQ", offsetof(struct backend_opts, cuda_mmq)},
        {"MLXCEL_CUDA_CHUNKED", offsetof(struct backend_opts, cuda_chunked)},
        {"MLXCEL_CUDA_MOE_DEV", offsetof(struct backend_opts, cuda_moe_dev)},
    };
    int rc;
    /* MLXCEL_ISA is kept as given (even empty, which is auto): the backend says what is wrong */
    g_cfg.be.isa = getenv("MLXCEL_ISA");
    g_cfg.be.cuda_plugin = env_str("MLXCEL_CUDA_PLUGIN");
    if (!g_cfg.device)
        g_cfg.device = getenv("MLXCEL_DEVICE");
    if (!g_cfg.kv_type)
        g_cfg.kv_type = getenv("MLXCEL_KV_TYPE");
    if (!seen->fast && (rc = env_bool("MLXCEL_FAST", &g_cfg.be.fast, e)) < 0)
        return rc;
    if (!seen->mmap) {
        bool mm = false, set = env_str("MLXCEL_MMAP") != NULL;
        if ((rc = env_bool("MLXCEL_MMAP", &mm, e)) < 0)
            return rc;
        if (set)
            g_cfg.be.copy = mm ? BACKEND_COPY_NONE : BACKEND_COPY_ALL;
    }
    for (size_t i = 0; i < sizeof k_bool / sizeof k_bool[0]; i++)
        if ((rc = env_bool(k_bool[i].name, (bool *)((char *)&g_cfg.be + k_bool[i].off), e)) < 0)
            return rc;
    static const struct {
        const char *name;
        size_t off;
    } k_int[] = {
        {"MLXCEL_CUDA_MMA_MAX_TOKENS", offsetof(struct backend_opts, cuda_mma_max_tokens)},
        {"MLXCEL_CUDA_QI_MIN_ROWS", offsetof(struct backend_opts, cuda_qi_min_rows)},
    };
    for (size_t i = 0; i < sizeof k_int / sizeof k_int[0]; i++) {
        const char *v = env_str(k_int[i].name);
        long n;
        if (v && (rc = cli_parse_int(k_int[i].name, v, 0, 1 << 24, &n, e)) < 0)
            return rc;
        if (v)
            *(int *)((char *)&g_cfg.be + k_int[i].off) = (int)n;
    }
    return 0;
}

/* HF_HUB_OFFLINE as huggingface_hub reads it: 1/true/yes/on (any case) is on. */
static bool hf_true(const char *v)
{
    return v && (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 ||
                 strcasecmp(v, "on") == 0);
}

/* The Hugging Face variables and mlxcel's folders. */
static void read_paths(const struct flags_seen *seen)
{
    const char *home = env_str("HOME"), *hf_home = env_str("HF_HOME"), *v;
    if (!home)
        home = ".";
    if ((v = env_str("HF_HUB_CACHE")))
        snprintf(g_cfg.hf_cache, sizeof g_cfg.hf_cache, "%s", v);
    else if (hf_home)
        snprintf(g_cfg.hf_cache, sizeof g_cfg.hf_cache, "%s/hub", hf_home);
    else
        snprintf(g_cfg.hf_cache, sizeof g_cfg.hf_cache, "%s/.cache/huggingface/hub", home);
    v = env_str("HF_ENDPOINT");
    snprintf(g_cfg.hf_endpoint, sizeof g_cfg.hf_endpoint, "%s", v ? v : HUB_DEFAULT_ENDPOINT);
    size_t n = strlen(g_cfg.hf_endpoint);
    while (n > 0 && g_cfg.hf_endpoint[n - 1] == '/')
        g_cfg.hf_endpoint[--n] = '\0';
    g_cfg.hf_token = env_str("HF_TOKEN");
    if (!g_cfg.hf_token)
        g_cfg.hf_token = env_str("HUGGING_FACE_HUB_TOKEN");
    if ((v = env_str("HF_TOKEN_PATH")))
        snprintf(g_cfg.hf_token_path, sizeof g_cfg.hf_token_path, "%s", v);
    else if (hf_home)
        snprintf(g_cfg.hf_token_path, sizeof g_cfg.hf_token_path, "%s/token", hf_home);
    else
        snprintf(g_cfg.hf_token_path, sizeof g_cfg.hf_token_path, "%s/.cache/huggingface/token", home);
    g_cfg.hf_etag_timeout = env_str("HF_HUB_ETAG_TIMEOUT");
    g_cfg.hf_download_timeout = env_str("HF_HUB_DOWNLOAD_TIMEOUT");
    if (!seen->offline)
        g_cfg.offline = hf_true(getenv("HF_HUB_OFFLINE"));
    if ((v = getenv("MLXCEL_HUB_BACKOFF_MS")) && atol(v) >= 0)
        g_cfg.hub_backoff_ms = atol(v);
    if ((v = env_str("MLXCEL_MODELS_DIR")))
        snprintf(g_cfg.models_dir, sizeof g_cfg.models_dir, "%s", v);
    else
        snprintf(g_cfg.models_dir, sizeof g_cfg.models_dir, "%s/.cache/mlxcel/models", home);
    g_cfg.default_model = env_str("MLXCEL_DEFAULT_MODEL");
    g_cfg.api_key = env_str("MLXCEL_API_KEY");
    static const char *const k_llama[] = {
#define LLAMA_ENV(var, flag, neg, is_bool) var,
#include "llama_env.def"
#undef LLAMA_ENV
    };
    for (int i = 0; i < CLI_N_LLAMA_ENV; i++)
        g_cfg.llama_env[i] = env_str(k_llama[i]);
}

int cli_config_load(int *argc, char **argv, struct err *e)
{
    struct flags_seen seen = {0};
    int rc;
    if ((rc = strip_global(argc, argv, &seen, e)) < 0)
        return rc;
    read_paths(&seen);
    return read_backend(&seen, e);
}

void cli_hub_opts(struct hub_opts *o)
{
    o->cache_dir = g_cfg.hf_cache;
    o->endpoint = g_cfg.hf_endpoint;
    if (!o->token || !*o->token)
        o->token = g_cfg.hf_token;
    o->token_path = g_cfg.hf_token_path;
    o->offline = o->offline || g_cfg.offline;
    o->backoff_ms = g_cfg.hub_backoff_ms;
}
