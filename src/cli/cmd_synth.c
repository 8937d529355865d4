/*
 * synth: `mlxcel synth --config CONFIG.json -o DIR [-q ...] [--dtype D]
 * [--seed N] [-t N] [--tokenizer DIR]` writes a random-weight checkpoint of the
 * shape config.json describes, for benchmarks at real proportions without
 * a download (synth.h: the tensor list comes from the family's own weight
 * mapping; tensors stream one at a time, so size is bounded by disk only).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../models/synth.h"
#include "../engine/generate.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel synth --config CONFIG.json -o DIR [-q] [--q-bits B] [--q-group-size G]\n"
    "                    [--q-mode M] [--dtype bf16|f16|f32] [--seed N] [-t N] [--tokenizer DIR]\n"
    "                    [--json]\n"
    "\n"
    "Write a checkpoint with random weights (matrices N(0, 0.02), norms 1, biases\n"
    "N(0, 0.002); deterministic from the seed) of any size a family's config.json\n"
    "describes. Float output has the published layout; -q writes the MLX layout\n"
    "(experts stacked), the same bytes `mlxcel convert -q` makes of the float output.\n"
    "An image-text config (gemma3, llava, qwen2_vl, qwen2_5_vl, qwen3_vl) gets its text\n"
    "model under model.language_model. and its vision tower and projector (transformers\n"
    "5's names), the tower float under -q as mlx-vlm converts it.\n"
    "  -c, --config FILE      config.json of a supported family (see `mlxcel arch`)\n"
    "  -o, --output DIR       new folder (must not exist, or be empty)\n"
    "  -q, --quantize         quantize (--q-bits, --q-group-size, --q-mode, --q-variant\n"
    "                         as for `mlxcel convert`)\n"
    "      --dtype D          bf16, f16 or f32 (default: the config's torch_dtype, else bf16)\n"
    "      --seed N           generator seed (default 0)\n"
    "  -t, --threads N        threads generating and quantizing (default: all online CPUs,\n"
    "                         at most 64); the output is the same for any N\n"
    "      --tokenizer DIR    copy tokenizer.json (+ tokenizer_config.json) from DIR\n"
    "      --json             print a JSON summary on stdout\n"
    "  -h, --help             show this help\n";

enum { OPT_QBITS = 256, OPT_QGROUP, OPT_QMODE, OPT_QVARIANT, OPT_DTYPE, OPT_SEED, OPT_TOK, OPT_JSON };

static int print_summary(const struct synth_opts *o, const struct synth_stats *st, bool json,
                         double secs, struct err *e)
{
    if (!json) {
        char b[32], p[32];
        cli_format_bytes(st->ck.bytes, b, sizeof b);
        cli_format_count(st->ck.n_params, p, sizeof p);
        printf("%s: %s, %s params, %zu tensors (%zu quantized), %s %s, %.1f s\n", o->dst, st->family,
               p, st->ck.n_tensors, st->ck.n_quantized, b, dtype_name(st->dtype), secs);
        return 0;
    }
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddStringToObject(j, "dst", o->dst);
        cJSON_AddStringToObject(j, "family", st->family);
        cJSON_AddNumberToObject(j, "params", (double)st->ck.n_params);
        cJSON_AddNumberToObject(j, "tensors", (double)st->ck.n_tensors);
        cJSON_AddNumberToObject(j, "quantized", (double)st->ck.n_quantized);
        cJSON_AddNumberToObject(j, "bytes", (double)st->ck.bytes);
        cJSON_AddStringToObject(j, "dtype", dtype_name(st->dtype));
        if (o->q) {
            cJSON_AddStringToObject(j, "mode", qmode_name(o->q->mode));
            cJSON_AddNumberToObject(j, "bits", o->q->bits);
            cJSON_AddNumberToObject(j, "group_size", o->q->group);
        } else {
            cJSON_AddNullToObject(j, "mode");
        }
        cJSON_AddNumberToObject(j, "seed", (double)o->seed);
        cJSON_AddNumberToObject(j, "seconds", secs);
    }
    return cli_print_json(j, e);
}

int cmd_synth(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},       {"output", required_argument, 0, 'o'},
        {"quantize", no_argument, 0, 'q'},           {"q-bits", required_argument, 0, OPT_QBITS},
        {"q-group-size", required_argument, 0, OPT_QGROUP}, {"q-mode", required_argument, 0, OPT_QMODE},
        {"q-variant", required_argument, 0, OPT_QVARIANT}, {"dtype", required_argument, 0, OPT_DTYPE},
        {"seed", required_argument, 0, OPT_SEED},    {"tokenizer", required_argument, 0, OPT_TOK},
        {"json", no_argument, 0, OPT_JSON},          {"help", no_argument, 0, 'h'},
        {"threads", required_argument, 0, 't'},
        {0, 0, 0, 0},
    };
    struct synth_opts o = {.dtype = -1};
    struct cli_quant_flags qf = {0};
    const char *dtype = NULL, *seed = NULL, *threads = NULL;
    bool quantize = false, json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:o:qt:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': o.config = optarg; break;
        case 'o': o.dst = optarg; break;
        case 'q': quantize = true; break;
        case OPT_QBITS: qf.bits = optarg; break;
        case OPT_QGROUP: qf.group = optarg; break;
        case OPT_QMODE: qf.mode = optarg; break;
        case OPT_QVARIANT: qf.variant = optarg; break;
        case OPT_DTYPE: dtype = optarg; break;
        case OPT_SEED: seed = optarg; break;
        case 't': threads = optarg; break;
        case OPT_TOK: o.tokenizer = optarg; break;
        case OPT_JSON: json = true; break;
        case 'h': fputs(k_help, stdout); return CLI_EXIT_OK;
        case ':': return cli_usage_error("synth", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("synth", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("synth", "unexpected argument '%s'", argv[optind]);
    if (!o.config || !o.dst)
        return cli_usage_error("synth", "give the shape with --config and the output folder with -o");

    struct err e = {0};
    struct quant_params q;
    struct synth_stats st;
    struct cli_progress_state prog = {"synth", -1};
    long v;
    if (!quantize && cli_quant_flags_given(&qf)) {
        err_setf(&e, ERR_ARG, "--q-* options need -q");
        return cli_fail("synth", &e);
    }
    if (dtype && (o.dtype = ck_dtype_parse(dtype)) < 0) {
        err_setf(&e, ERR_ARG, "--dtype '%s' is not bf16, f16 or f32", dtype);
        return cli_fail("synth", &e);
    }
    if (seed) {
        if (cli_parse_int("--seed", seed, 0, 0x7fffffffL, &v, &e) < 0)
            return cli_fail("synth", &e);
        o.seed = (uint64_t)v;
    }
    if (threads) {
        if (cli_parse_int("--threads", threads, 1, 1024, &v, &e) < 0)
            return cli_fail("synth", &e);
        o.n_threads = (int)v;
    }
    if (quantize) {
        if (cli_quant_resolve(&qf, &q, &e) < 0)
            return cli_fail("synth", &e);
        o.q = &q;
    }
    if (cli_stderr_is_tty()) {
        o.progress = cli_progress;
        o.progress_ud = &prog;
    }
    outdir_catch_signals();  /* an interrupted run leaves no partial folder */
    outdir_sweep(o.dst, cli_on_swept, "synth");  /* ... and a killed one's is removed now */
    double t0 = gen_now();
    if (synth_checkpoint(&o, &st, &e) < 0) {
        cli_progress_end(&prog);
        return cli_fail("synth", &e);
    }
    double secs = gen_now() - t0;
    if (print_summary(&o, &st, json, secs, &e) < 0)
        return cli_fail("synth", &e);
    return CLI_EXIT_OK;
}
