/*
 * inspect: `mlxcel inspect [-m MODEL] [--json] [-v]` loads a checkpoint the
 * way generate does and describes it: family and model_type, the normalized
 * dimensions (struct hparams), parameter count, stored dtypes, quantization,
 * weight and KV-cache sizes, and the checkpoint tensors the family did not
 * consume (model_load only logs their count).
 *
 * Everything printed comes from the loaded model; nothing is recomputed from
 * config.json, so what inspect shows is what the forward pass uses. The text
 * form is for people (unused tensors capped at INSPECT_MAX_UNUSED unless -v);
 * --json is one object with stable keys for scripts, always complete.
 * Names from the files (tensor names, paths, model_type) are escaped in the
 * text form (src/core/termsafe.h), so a hostile checkpoint cannot drive the
 * terminal; --json escapes them as JSON does.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/log.h"
#include "../core/termsafe.h"
#include "../engine/kvcache.h"
#include "../models/model.h"
#include "cli.h"

/* Unused tensor names shown in non-verbose text output; the rest are counted. */
#define INSPECT_MAX_UNUSED 20

static const char *k_help =
    "usage: mlxcel inspect [-m MODEL] [--json] [-v]\n"
    "\n"
    "Describe a checkpoint: family, dimensions, parameter count, dtypes,\n"
    "quantization, weight and KV-cache sizes (of the --kv-type cache, default f32), and\n"
    "tensors the family does not use.\n"
    "  -m, --model MODEL   checkpoint folder or owner/name (default: the embedded model)\n"
    "      --json          print one JSON object (every unused tensor listed)\n"
    "  -v, --verbose       list every unused tensor and shard file; log loading details\n"
    "  -h, --help          show this help\n";

static const char *rope_name(enum rope_kind k)
{
    switch (k) {
    case ROPE_DEFAULT: return "default";
    case ROPE_LINEAR: return "linear";
    case ROPE_LLAMA3: return "llama3";
    case ROPE_LONGROPE: return "longrope";
    case ROPE_YARN: return "yarn";
    case ROPE_DYNAMIC: return "dynamic";
    }
    return "?";
}

static const char *norm_name(enum norm_kind k)
{
    switch (k) {
    case NORM_RMS: return "rmsnorm";
    case NORM_LAYER: return "layernorm";
    }
    return "?";
}

/* Tensors per stored dtype, over the consumed tensors only. */
static void count_dtypes(const struct st_set *st, size_t counts[DTYPE_COUNT])
{
    memset(counts, 0, DTYPE_COUNT * sizeof counts[0]);
    for (size_t i = 0; i < st_set_count(st); i++) {
        const struct st_tensor *t = st_set_at(st, i);
        if (t->consumed && (unsigned)t->dtype < DTYPE_COUNT)
            counts[t->dtype]++;
    }
}

/* ---- JSON ---- */

/* Layers with a latent (MLA) cache. */
static int latent_layers(const struct hparams *hp)
{
    int n = 0;
    for (int il = 0; il < hp->n_layer; il++)
        n += hp->layer[il].kv == KV_LATENT;
    return n;
}

/* KV bytes per token if every latent layer kept full per-head K and V (kvt elements). */
static uint64_t full_kv_bytes(const struct hparams *hp, enum dtype kvt)
{
    uint64_t n = 0;
    for (int il = 0; il < hp->n_layer; il++)
        n += hp->layer[il].kv == KV_LATENT
                 ? (uint64_t)hp->n_head * (hp->qk_nope_dim + hp->qk_rope_dim + hp->v_head_dim)
                 : 2ull * hp->n_kv_head * hp->head_dim;
    return n * dtype_size(kvt);
}

static cJSON *build_json(const struct model *m, enum dtype kvt)
{
    const struct hparams *hp = &m->hp;
    size_t counts[DTYPE_COUNT];
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "family", m->ops->family);
    cJSON_AddStringToObject(o, "model_type", hp->model_type);
    cJSON_AddStringToObject(o, "path", m->dir);
    cJSON_AddNumberToObject(o, "n_vocab", hp->n_vocab);
    cJSON_AddNumberToObject(o, "n_embd", hp->n_embd);
    cJSON_AddNumberToObject(o, "n_layer", hp->n_layer);
    cJSON_AddNumberToObject(o, "n_head", hp->n_head);
    cJSON_AddNumberToObject(o, "n_kv_head", hp->n_kv_head);
    cJSON_AddNumberToObject(o, "head_dim", hp->head_dim);
    cJSON_AddNumberToObject(o, "n_ff", hp->n_ff);
    cJSON_AddNumberToObject(o, "n_ctx", hp->n_ctx);
    cJSON_AddNumberToObject(o, "n_rot", hp->n_rot);
    cJSON_AddNumberToObject(o, "n_expert", hp->n_expert);
    cJSON_AddNumberToObject(o, "n_expert_used", hp->n_expert_used);
    cJSON *rope = cJSON_AddObjectToObject(o, "rope");
    if (rope) {
        cJSON_AddStringToObject(rope, "kind", rope_name(hp->rope));
        cJSON_AddNumberToObject(rope, "theta", hp->rope_theta);
        if (hp->rope != ROPE_DEFAULT && hp->rope != ROPE_LONGROPE)
            cJSON_AddNumberToObject(rope, "factor", hp->rope_factor);
    }
    cJSON_AddStringToObject(o, "norm", norm_name(hp->norm));
    cJSON_AddNumberToObject(o, "params", (double)model_n_params(m));
    cJSON *dt = cJSON_AddObjectToObject(o, "dtypes");
    count_dtypes(m->st, counts);
    for (int d = 0; dt && d < DTYPE_COUNT; d++)
        if (counts[d])
            cJSON_AddNumberToObject(dt, dtype_name((enum dtype)d), (double)counts[d]);
    if (hp->quant.present) {
        cJSON *q = cJSON_AddObjectToObject(o, "quantization");
        if (q) {
            cJSON_AddStringToObject(q, "mode", qmode_name(hp->quant.top.mode));
            cJSON_AddNumberToObject(q, "bits", hp->quant.top.bits);
            cJSON_AddNumberToObject(q, "group_size", hp->quant.top.group);
            cJSON_AddNumberToObject(q, "overrides", hp->quant.n_ov);
        }
    } else {
        cJSON_AddNullToObject(o, "quantization");
    }
    cJSON_AddNumberToObject(o, "weight_bytes", (double)model_weight_bytes(m));
    cJSON_AddStringToObject(o, "kv_type", cli_kv_dtype_name(kvt));
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)model_kv_bytes_per_token(m, kvt));
    struct model_kv_sizes z;
    model_kv_sizes(m, kvt, &z);
    cJSON *kinds = cJSON_AddObjectToObject(o, "kv_layers");
    cJSON *full = kinds ? cJSON_AddObjectToObject(kinds, "full") : NULL;
    if (full) {
        cJSON_AddNumberToObject(full, "layers", z.n_full);
        cJSON_AddNumberToObject(full, "bytes_per_token", (double)z.full_per_token);
        cJSON_AddNumberToObject(full, "bytes_at_n_ctx", (double)(z.full_per_token * (uint64_t)hp->n_ctx));
    }
    cJSON *swa = kinds && z.n_swa ? cJSON_AddObjectToObject(kinds, "sliding") : NULL;
    if (swa) {
        int most = model_kv_window_positions(z.window, hp->n_ctx, KV_DEFAULT_BLOCK);
        cJSON_AddNumberToObject(swa, "layers", z.n_swa);
        cJSON_AddNumberToObject(swa, "window", z.window);
        cJSON_AddNumberToObject(swa, "bytes_per_token", (double)z.swa_per_token);
        cJSON_AddNumberToObject(swa, "max_positions", most);
        cJSON_AddNumberToObject(swa, "bytes_at_n_ctx", (double)(z.swa_per_token * (uint64_t)most));
    }
    cJSON_AddNumberToObject(o, "kv_bytes_at_n_ctx", (double)model_kv_bytes(m, hp->n_ctx, KV_DEFAULT_BLOCK, kvt));
    int n_latent = latent_layers(hp);
    if (n_latent > 0) {
        cJSON *lat = cJSON_AddObjectToObject(o, "kv_latent");
        if (lat) {
            cJSON_AddNumberToObject(lat, "layers", n_latent);
            cJSON_AddNumberToObject(lat, "kv_lora_rank", hp->kv_lora_rank);
            cJSON_AddNumberToObject(lat, "rope_dims", hp->qk_rope_dim);
            cJSON_AddNumberToObject(lat, "full_kv_bytes_per_token", (double)full_kv_bytes(hp, kvt));
        }
    }
    cJSON_AddNumberToObject(o, "files", (double)st_set_n_files(m->st));
    cJSON *un = cJSON_AddArrayToObject(o, "unused_tensors");
    for (size_t i = 0; un && i < st_set_count(m->st); i++) {
        const struct st_tensor *t = st_set_at(m->st, i);
        if (!t->consumed)
            cJSON_AddItemToArray(un, cJSON_CreateString(t->name));
    }
    return o;
}

static int print_json(const struct model *m, enum dtype kvt, struct err *e)
{
    return cli_print_json(build_json(m, kvt), e);
}

/* ---- text ---- */

static void print_dims(const struct hparams *hp)
{
    printf("%-18s %d\n", "n_vocab", hp->n_vocab);
    printf("%-18s %d\n", "n_embd", hp->n_embd);
    printf("%-18s %d\n", "n_layer", hp->n_layer);
    printf("%-18s %d\n", "n_head", hp->n_head);
    printf("%-18s %d\n", "n_kv_head", hp->n_kv_head);
    printf("%-18s %d\n", "head_dim", hp->head_dim);
    printf("%-18s %d\n", "n_ff", hp->n_ff);
    printf("%-18s %d\n", "n_ctx", hp->n_ctx);
    printf("%-18s %d\n", "n_rot", hp->n_rot);
    if (hp->n_expert > 0) {
        printf("%-18s %d\n", "n_expert", hp->n_expert);
        printf("%-18s %d\n", "n_expert_used", hp->n_expert_used);
    }
    printf("%-18s %s, theta %.10g", "rope", rope_name(hp->rope), hp->rope_theta);
    if (hp->rope != ROPE_DEFAULT && hp->rope != ROPE_LONGROPE)
        printf(", factor %g", hp->rope_factor);
    printf("\n%-18s %s\n", "norm", norm_name(hp->norm));
}

static void print_unused(const struct st_set *st, bool verbose)
{
    size_t n_unused = st_set_n_unused(st), shown = 0;
    printf("%-18s %zu\n", "unused tensors", n_unused);
    for (size_t i = 0; i < st_set_count(st); i++) {
        const struct st_tensor *t = st_set_at(st, i);
        if (t->consumed)
            continue;
        if (!verbose && shown == INSPECT_MAX_UNUSED) {
            printf("  ... and %zu more (-v or --json lists all)\n", n_unused - shown);
            break;
        }
        char name[1024];
        printf("  %s\n", termsafe_str(t->name, name, sizeof name));
        shown++;
    }
}

/* The cache per token and its bound at n_ctx, by layer kind (sliding layers keep at most
 * their window plus one block of KV_DEFAULT_BLOCK positions: ADR 0023). */
static void print_kv(const struct model *m, uint64_t per_token, enum dtype kvt)
{
    const struct hparams *hp = &m->hp;
    struct model_kv_sizes z;
    char a[64], b[64];
    model_kv_sizes(m, kvt, &z);
    cli_format_bytes(per_token, a, sizeof a);
    cli_format_bytes(model_kv_bytes(m, hp->n_ctx, KV_DEFAULT_BLOCK, kvt), b, sizeof b);
    printf("%-18s %s per token; %s per sequence at n_ctx %d%s%s\n", "kv cache", a, b, hp->n_ctx,
           kvt == DTYPE_F32 ? "" : ", ", kvt == DTYPE_F32 ? "" : cli_kv_dtype_name(kvt));
    if (z.n_swa == 0)
        return;
    int most = model_kv_window_positions(z.window, hp->n_ctx, KV_DEFAULT_BLOCK);
    cli_format_bytes(z.full_per_token, a, sizeof a);
    cli_format_bytes(z.full_per_token * (uint64_t)hp->n_ctx, b, sizeof b);
    printf("%-18s %d layers, %s per token, every position (%s at n_ctx)\n", "  full layers", z.n_full,
           a, b);
    cli_format_bytes(z.swa_per_token, a, sizeof a);
    cli_format_bytes(z.swa_per_token * (uint64_t)most, b, sizeof b);
    printf("%-18s %d layers, %s per token, window %d: at most %d positions (%s)\n",
           "  sliding layers", z.n_swa, a, z.window, most, b);
}

static void print_text(const struct model *m, bool verbose, enum dtype kvt)
{
    const struct hparams *hp = &m->hp;
    char buf[64];
    size_t counts[DTYPE_COUNT];

    char esc[4200];
    /* the folder and model_type come from the disk and config.json: escaped (termsafe.h) */
    printf("%-18s %s\n", "path", termsafe_str(m->dir, esc, sizeof esc));
    printf("%-18s %s\n", "family", m->ops->family);
    printf("%-18s %s\n", "model_type", termsafe_str(hp->model_type, esc, sizeof esc));
    print_dims(hp);
    int64_t params = model_n_params(m);
    cli_format_count(params, buf, sizeof buf);
    printf("%-18s %s (%lld)\n", "params", buf, (long long)params);

    count_dtypes(m->st, counts);
    printf("%-18s", "dtypes");
    const char *sep = " ";
    for (int d = 0; d < DTYPE_COUNT; d++) {
        if (counts[d]) {
            printf("%s%s x %zu", sep, dtype_name((enum dtype)d), counts[d]);
            sep = ", ";
        }
    }
    printf("\n");
    if (hp->quant.present)
        printf("%-18s %s %d-bit, group size %d%s%.0d%s\n", "quantization", qmode_name(hp->quant.top.mode),
               hp->quant.top.bits, hp->quant.top.group, hp->quant.n_ov ? " (" : "", hp->quant.n_ov,
               hp->quant.n_ov ? " per-module overrides)" : "");
    else
        printf("%-18s none\n", "quantization");

    uint64_t wb = model_weight_bytes(m), kv = model_kv_bytes_per_token(m, kvt);
    cli_format_bytes(wb, buf, sizeof buf);
    printf("%-18s %s (%llu bytes)\n", "weights", buf, (unsigned long long)wb);
    print_kv(m, kv, kvt);
    if (latent_layers(hp) > 0) {
        uint64_t full = full_kv_bytes(hp, kvt);
        cli_format_bytes(full, buf, sizeof buf);
        printf("%-18s %d layers cache kv_lora_rank %d + rope %d floats per token; full K/V would "
               "take %s per token (%.1fx)\n", "kv latent (MLA)", latent_layers(hp), hp->kv_lora_rank,
               hp->qk_rope_dim, buf, kv ? (double)full / (double)kv : 0.0);
    }

    size_t n_files = st_set_n_files(m->st);
    printf("%-18s %zu\n", "files", n_files);
    for (size_t i = 0; verbose && i < n_files; i++)
        printf("  %s\n", termsafe_str(st_set_file_path(m->st, i), esc, sizeof esc));
    print_unused(m->st, verbose);
}

/* ---- command ---- */

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"json", no_argument, 0, 'J'},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL;
    bool json = false, verbose = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'J': json = true; break;
        case 'v': verbose = true; break;
        case 'h': cli_help(k_help, CLI_GLOBAL_MODEL | CLI_GLOBAL_KV); return CLI_EXIT_OK;
        case ':': return cli_usage_error("inspect", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("inspect", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("inspect", "unexpected argument '%s'", argv[optind]);
    if (verbose)
        log_set_level(LOG_LEVEL_INFO);

    struct err e = {0};
    char dir[4096];
    struct model *m = NULL;
    enum dtype kvt;
    if (cli_kv_dtype(&kvt, &e) < 0 || cli_resolve_model(model, dir, sizeof dir, &e) < 0 ||
        cli_model_load(&m, dir, &e) < 0)
        return cli_fail("inspect", &e);
    int status = CLI_EXIT_OK;
    if (json) {
        if (print_json(m, kvt, &e) < 0)
            status = cli_fail("inspect", &e);
    } else {
        print_text(m, verbose, kvt);
    }
    model_free(m);
    return status;
}
