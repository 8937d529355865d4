/*
 * mlxcel: command dispatch. Each command lives in cmd_<name>.c and parses
 * its own flags; `mlxcel <command> --help` documents it.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

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
    fprintf(f, "\nRun `mlxcel <command> --help` for the options of a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mlxcel %s\n", MLXCEL_VERSION);
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(argv[1], k_commands[i].name) == 0)
            return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "mlxcel: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
