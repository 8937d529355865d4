/*
 * cli_lora: the adapter flags every command that runs a model shares (--lora, --lora-scaled,
 * --lora-init-without-apply; llama.cpp's names) and their loading onto an engine (cli.h,
 * ADR 0103).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/log.h"
#include "../models/lora.h"
#include "cli.h"

_Static_assert(CLI_LORA_MAX == LORA_MAX_ADAPTERS, "one adapter list");

/* A scale flag's value: finite, |s| <= LORA_MAX_SCALE. */
static int parse_scale(const char *flag, const char *s, float *out, struct err *e)
{
    double d;
    int rc = cli_parse_float(flag, s, -LORA_MAX_SCALE, LORA_MAX_SCALE, &d, e);
    *out = (float)d;
    return rc;
}

static int add(struct cli_lora *l, const char *path, float scale, struct err *e)
{
    if (l->n == CLI_LORA_MAX)
        return err_setf(e, ERR_ARG, "--lora: at most %d adapters", CLI_LORA_MAX);
    if (!*path)
        return err_setf(e, ERR_ARG, "--lora: an empty path");
    l->path[l->n] = path;
    l->scale[l->n++] = scale;
    return 0;
}

int cli_lora_flag(struct cli_lora *l, int opt, char *optarg_, int argc, char **argv,
                  struct err *e)
{
    switch (opt) {
    case CLI_OPT_LORA: {
        /* PATH[:SCALE]: a suffix after the last ':' that is a number is the scale, unless
         * the whole argument names an existing file or folder; the path is cut in place (the
         * argument string is the process's, like every other flag value kept) */
        struct stat sb;
        char *colon = strrchr(optarg_, ':');
        if (!colon || stat(optarg_, &sb) == 0)
            return add(l, optarg_, 1.0f, e);
        char *end;
        (void)strtod(colon + 1, &end);
        if (colon[1] == 0 || *end != 0)
            return add(l, optarg_, 1.0f, e);
        float s;
        int rc = parse_scale("--lora", colon + 1, &s, e);
        if (rc < 0)
            return rc;
        *colon = 0;
        return add(l, optarg_, s, e);
    }
    case CLI_OPT_LORA_SCALED: {
        if (optind >= argc)
            return err_setf(e, ERR_ARG, "--lora-scaled needs two values: PATH SCALE");
        float s;
        int rc = parse_scale("--lora-scaled", argv[optind++], &s, e);
        return rc < 0 ? rc : add(l, optarg_, s, e);
    }
    case CLI_OPT_LORA_NO_APPLY:
        l->no_apply = true;
        return 0;
    default:
        return err_setf(e, ERR_INTERNAL, "cli_lora_flag: option %d", opt);
    }
}

int cli_lora_attach(struct cli_lora *l, const struct model *m, struct cli_engine *en, struct err *e)
{
    int rc;
    float scale[CLI_LORA_MAX];
    if (l->n == 0)
        return 0;
    for (int i = 0; i < l->n; i++) {
        if ((rc = lora_load(&l->ad[i], m, l->path[i], e)) < 0 ||
            (rc = lora_prepare(l->ad[i], en->be, e)) < 0)
            return err_prefix(e, "--lora %s", l->path[i]);
        LOG_INFO("lora adapter %d: %s (%s, rank %d, scale %g, %d linears) at %g", i, l->path[i],
                 l->ad[i]->format, l->ad[i]->rank, (double)l->ad[i]->scale, l->ad[i]->n_targets,
                 l->no_apply ? 0.0 : (double)l->scale[i]);
        scale[i] = l->no_apply ? 0.0f : l->scale[i];
    }
    if ((rc = model_ctx_set_lora(en->ctx, l->ad, l->n, e)) < 0 ||
        (rc = model_ctx_set_lora_scales(en->ctx, scale, l->n, e)) < 0)
        return rc;
    return 0;
}

void cli_lora_free(struct cli_lora *l)
{
    for (int i = 0; i < l->n; i++)
        lora_free(l->ad[i]);
    memset(l->ad, 0, sizeof l->ad);
}
