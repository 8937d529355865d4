/*
 * mlxcel: command dispatch. Each command lives in cmd_<name>.c and parses
 * its own flags; `mlxcel <command> --help` documents it.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/boolenv.h"
#include "../core/termsafe.h"
#include "cli.h"
#include "kernels/backend_plugin.h"

#define MLXCEL_VERSION "0.1.0"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct command k_commands[] = {
    {"generate", cmd_generate, "generate text from a prompt"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"template", cmd_template, "render the chat template over a message list"},
    {"perplexity", cmd_perplexity, "perplexity of a text or id file"},
    {"inspect", cmd_inspect, "describe a checkpoint"},
    {"bench", cmd_bench, "prompt and generation throughput (llama-bench style)"},
    {"list", cmd_list, "list downloaded models"},
    {"pull", cmd_pull, "download a model from the Hugging Face Hub"},
    {"arch", cmd_arch, "list supported architectures"},
    {"convert", cmd_convert, "write an MLX checkpoint (optionally quantized)"},
    {"synth", cmd_synth, "write a random-weight checkpoint of any shape"},
    {"serve", cmd_serve, "serve a model over an OpenAI-compatible HTTP API"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mlxcel <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-11s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\nRun `mlxcel <command> --help` for the options of a command.\n"
               "-m owner/name pulls a model that is in no cache from the Hugging Face Hub;\n"
               "--offline (any command) or HF_HUB_OFFLINE=1 turns that off.\n"
               "--device auto|cpu|cuda[:N] (any command that runs a model; MLXCEL_DEVICE too)\n"
               "picks the backend: auto is a usable CUDA GPU when present, else the CPU.\n"
               "The CPU backend copies the weights into memory of its own (huge pages) at load\n"
               "while they fit in 3/4 of the available memory, the rest it reads through the file\n"
               "mapping; --mmap (MLXCEL_MMAP=1) reads them all through the mapping (a quicker\n"
               "load, a slower run), --no-mmap (MLXCEL_MMAP=0) copies them whatever the memory.\n"
               "--kv-type f32|f16|bf16 (MLXCEL_KV_TYPE) is the KV cache's element type: f32 (the\n"
               "default) keeps K and V exact; f16 and bf16 halve the cache (CPU and CUDA).\n"
               "--fast (MLXCEL_FAST=1) trades exactness for speed: 4-bit weights multiply x\n"
               "rounded to 8 bits per group, as llama.cpp does (AVX2 / AVX-512 CPUs; see\n"
               "docs/benchmarks.md for its perplexity cost). Off by default.\n"
               "On/off variables (MLXCEL_FAST, MLXCEL_MMAP, ...) take 1/0, true/false, yes/no\n"
               "or on/off; any other value is refused.\n");
}

/* --offline, --[no-]mmap, --device, --kv-type and --fast are understood by every command:
 * they are taken out of argv (before a "--") and become HF_HUB_OFFLINE=1, which the model
 * resolution and `pull` read, and MLXCEL_MMAP, MLXCEL_DEVICE, MLXCEL_KV_TYPE and
 * MLXCEL_FAST, which cli_engine_open and the backends read. 0; -1 when --device lacks its
 * value, -2 when --kv-type does. */
/* argv[*i] as `flag VALUE` or `flag=VALUE` into the environment variable env: 1 taken
 * (*i past it), 0 another argument, -1 the value missing. */
static int take_value(int argc, char **argv, int *i, const char *flag, const char *env)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0 || (argv[*i][n] != '=' && argv[*i][n] != '\0'))
        return 0;
    if (argv[*i][n] == '=') {
        setenv(env, argv[*i] + n + 1, 1);
        return 1;
    }
    if (*i + 1 >= argc)
        return -1;
    setenv(env, argv[++*i], 1);
    return 1;
}

static int strip_global(int *argc, char **argv)
{
    int k = 2, rc;
    bool tail = false;
    for (int i = 2; i < *argc; i++) {
        tail = tail || strcmp(argv[i], "--") == 0;
        if (tail) {
            argv[k++] = argv[i];
        } else if (strcmp(argv[i], "--offline") == 0) {
            setenv("HF_HUB_OFFLINE", "1", 1);
        } else if (strcmp(argv[i], "--fast") == 0) {
            setenv("MLXCEL_FAST", "1", 1);
        } else if (strcmp(argv[i], "--mmap") == 0 || strcmp(argv[i], "--no-mmap") == 0) {
            setenv("MLXCEL_MMAP", argv[i][2] == 'n' ? "0" : "1", 1);
        } else if ((rc = take_value(*argc, argv, &i, "--device", "MLXCEL_DEVICE")) != 0) {
            if (rc < 0)
                return -1;
        } else if ((rc = take_value(*argc, argv, &i, "--kv-type", "MLXCEL_KV_TYPE")) != 0) {
            if (rc < 0)
                return -2;
        } else {
            argv[k++] = argv[i];
        }
    }
    argv[k] = NULL;
    *argc = k;
    return 0;
}

/* The on/off environment settings the backends read (backend_env_flag): a value that is
 * not one of boolenv's eight words is refused here, before anything runs, rather than
 * read as on (MLXCEL_FAST=no turned fast mode on) or as the default. Empty is unset. */
static const char *const k_bool_env[] = {
    "MLXCEL_FAST", "MLXCEL_MMAP", "MLXCEL_FUSED_MOE", "MLXCEL_REPACK",
    "MLXCEL_CUDA_PDL", "MLXCEL_CUDA_QI", "MLXCEL_CUDA_ATTN_SPLIT", "MLXCEL_CUDA_GRAPHS",
};

static int check_bool_env(void)
{
    for (size_t i = 0; i < sizeof k_bool_env / sizeof k_bool_env[0]; i++) {
        const char *v = getenv(k_bool_env[i]);
        if (v && *v && boolenv_parse(v) < 0) {
            char esc[256];
            fprintf(stderr, "mlxcel: %s='%s' is neither on nor off (1/0, true/false, yes/no, on/off)\n",
                    k_bool_env[i], termsafe_str(v, esc, sizeof esc));
            return -1;
        }
    }
    return 0;
}

/* The exit status once stdout is closed: a command that succeeded but whose output
 * could not be written (a full disk, /dev/full, a closed descriptor) fails with a
 * message, as coreutils' close_stdout does; a failed command keeps its own status and
 * message. */
static int finish(const char *cmd, int status)
{
    struct err e = {0};
    if (cli_stdout_close(&e) < 0 && status == CLI_EXIT_OK)
        return cli_fail(cmd, &e);
    return status;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return finish("--help", CLI_EXIT_OK);
    }
    if (strcmp(argv[1], "--version") == 0) {
        char buf[2048];
        backend_describe(buf, sizeof buf);
        printf("mlxcel %s\n%s", MLXCEL_VERSION, buf);
        return finish("--version", CLI_EXIT_OK);
    }
    /* A write past `ulimit -f` raises SIGXFSZ, whose default kills the process without a
     * word; ignored, the write fails with EFBIG and the command names the file. */
    signal(SIGXFSZ, SIG_IGN);
    int sg = strip_global(&argc, argv);
    if (sg < 0) {
        fprintf(stderr, sg == -1 ? "mlxcel: --device needs a value (auto, cpu, cuda or cuda:N)\n"
                                 : "mlxcel: --kv-type needs a value (f32, f16 or bf16)\n");
        return CLI_EXIT_USAGE;
    }
    if (check_bool_env() < 0)
        return CLI_EXIT_USAGE;
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0)
            return finish(k_commands[i].name, k_commands[i].run(argc - 1, argv + 1));
    char esc[256];
    fprintf(stderr, "mlxcel: unknown command '%s'\n\n", termsafe_str(argv[1], esc, sizeof esc));
    usage(stderr);
    return CLI_EXIT_USAGE;
}
