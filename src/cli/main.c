/*
 * mlxcel: command dispatch. Each command lives in cmd_<name>.c and parses
 * its own flags; `mlxcel <command> --help` documents it.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/termsafe.h"
#include "cli.h"
#include "config.h"
#include "kernels/backend_plugin.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    bool splits;   /* runs its model through cli_engine_open: --tensor-parallel applies */
};

static const struct command k_commands[] = {
    {"generate", cmd_generate, "generate text from a prompt", true},
    {"tokenize", cmd_tokenize, "print the token ids of a text", false},
    {"detokenize", cmd_detokenize, "print the text of token ids", false},
    {"template", cmd_template, "render the chat template over a message list", false},
    {"perplexity", cmd_perplexity, "perplexity of a text or id file", true},
    {"embed", cmd_embed, "embeddings of texts (sentence-transformers encode)", false},
    {"rerank", cmd_rerank, "rank documents against a query (a cross-encoder or an LM reranker)", false},
    {"inspect", cmd_inspect, "describe a checkpoint", false},
    {"bench", cmd_bench, "prompt and generation throughput (llama-bench style)", true},
    {"list", cmd_list, "list downloaded models", false},
    {"pull", cmd_pull, "download a model from the Hugging Face Hub", false},
    {"arch", cmd_arch, "list supported architectures", false},
    {"convert", cmd_convert, "write an MLX checkpoint (optionally quantized)", false},
    {"synth", cmd_synth, "write a random-weight checkpoint of any shape", false},
    {"serve", cmd_serve, "serve a model over an OpenAI-compatible HTTP API", true},
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
               "or on/off; any other value is refused. A flag wins over its variable. README.md\n"
               "(\"Environment\") lists every variable, and the developer switches of the\n"
               "kernels (MLXCEL_ISA, MLXCEL_REPACK, MLXCEL_FUSED_MOE, MLXCEL_CUDA_*).\n");
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
        struct err ve = {0};
        int ac = 2; /* the environment only: --version takes no flags */
        (void)cli_config_load(&ac, argv, &ve);
        backend_describe(buf, sizeof buf, cli_cfg()->be.cuda_plugin);
        printf("mlxcel %s\n%s", MLXCEL_VERSION, buf);
        return finish("--version", CLI_EXIT_OK);
    }
    /* A write past `ulimit -f` raises SIGXFSZ, whose default kills the process without a
     * word; ignored, the write fails with EFBIG and the command names the file. */
    signal(SIGXFSZ, SIG_IGN);
    /* the global flags and the environment, read once here (config.h) */
    struct err e = {0};
    if (cli_config_load(&argc, argv, &e) < 0) {
        fprintf(stderr, "mlxcel: %s\n", e.msg);
        return CLI_EXIT_USAGE;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++) {
        if (strcmp(argv[1], k_commands[i].name) != 0)
            continue;
        if (cli_cfg()->tensor_parallel && !k_commands[i].splits) {
            fprintf(stderr, "mlxcel %s: --tensor-parallel: this command splits no model (generate, "
                    "perplexity, bench and serve do)\n", k_commands[i].name);
            return CLI_EXIT_USAGE;
        }
        int n_tp;
        if (cli_tensor_parallel(&n_tp, &e) < 0) {
            fprintf(stderr, "mlxcel %s: %s\n", k_commands[i].name, e.msg);
            return CLI_EXIT_USAGE;
        }
        return finish(k_commands[i].name, k_commands[i].run(argc - 1, argv + 1));
    }
    char esc[256];
    fprintf(stderr, "mlxcel: unknown command '%s'\n\n", termsafe_str(argv[1], esc, sizeof esc));
    usage(stderr);
    return CLI_EXIT_USAGE;
}
