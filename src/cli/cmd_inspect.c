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
 *
 * --kernels prepares the weights for the CPU backend as generate does and adds, for every
 * weight a linear product reads, the backend's plan (backend_ops.linear_plan): the layout
 * prepare_weight chose and, per range of token counts, the path and the kernel function.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../core/log.h"
#include "../core/termsafe.h"
#include "../engine/kvcache.h"
#include "../kernels/backend.h"
#include "../loading/quant.h"
#include "../models/model.h"
#include "../models/vision.h"
#include "cli.h"
#include "config.h"

/* Unused tensor names shown in non-verbose text output; the rest are counted. */
#define INSPECT_MAX_UNUSED 20

static const char *k_help =
    "usage: mlxcel inspect [-m MODEL] [--json] [--kernels] [-v]\n"
    "\n"
    "Describe a checkpoint: family, dimensions, parameter count, dtypes,\n"
    "quantization, weight and KV-cache sizes (of the --kv-type cache, default f32), and\n"
    "tensors the family does not use.\n"
    "  -m, --model MODEL   checkpoint folder or owner/name (default: the embedded model)\n"
    "      --json          print one JSON object (every unused tensor listed)\n"
    "      --kernels       also prepare the weights for the CPU backend (--device is not\n"
    "                      read; MLXCEL_ISA, --fast and MLXCEL_REPACK are) and print each\n"
    "                      linear weight's plan: its layout and the kernel that runs each\n"
    "                      range of token counts (docs/architecture.md, \"Which kernel runs\")\n"
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
    cJSON *rec = kinds && z.n_rec ? cJSON_AddObjectToObject(kinds, "recurrent") : NULL;
    if (rec) {
        cJSON_AddNumberToObject(rec, "layers", z.n_rec);
        cJSON_AddNumberToObject(rec, "bytes_per_sequence", (double)z.rec_per_seq);
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
    if (m->vision) {
        const struct vision *v = m->vision;
        cJSON *vo = cJSON_AddObjectToObject(o, "vision");
        if (vo) {
            cJSON_AddStringToObject(vo, "model_type", v->ops->model_type);
            cJSON_AddNumberToObject(vo, "n_embd", v->vh.n_embd);
            cJSON_AddNumberToObject(vo, "n_layer", v->vh.n_layer);
            cJSON_AddNumberToObject(vo, "image_size", v->vh.image_size);
            cJSON_AddNumberToObject(vo, "patch_size", v->vh.patch_size);
            cJSON_AddNumberToObject(vo, "tokens_per_image", v->info.tokens_per_image);
            cJSON_AddNumberToObject(vo, "image_token_id", v->info.image_token_id);
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

static int print_kernels(struct model *m, cJSON *o, struct err *e);

static int print_json(struct model *m, enum dtype kvt, bool kernels, struct err *e)
{
    cJSON *o = build_json(m, kvt);
    int rc;
    if (o && kernels && (rc = print_kernels(m, o, e)) < 0) {
        cJSON_Delete(o);
        return rc;
    }
    return cli_print_json(o, e);
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
    if (z.n_rec > 0) {
        cli_format_bytes(z.rec_per_seq, a, sizeof a);
        printf("%-18s %d layers, %s per sequence at any length (f32)\n", "  recurrent layers",
               z.n_rec, a);
    }
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

    if (m->vision) {
        const struct vision *v = m->vision;
        printf("%-18s %s: a ViT %d wide, %d layers, %d px in %d px patches; %d rows per image (token %d)\n",
               "vision", v->ops->model_type, v->vh.n_embd, v->vh.n_layer, v->vh.image_size, v->vh.patch_size,
               v->info.tokens_per_image, v->info.image_token_id);
    }
    size_t n_files = st_set_n_files(m->st);
    printf("%-18s %zu\n", "files", n_files);
    for (size_t i = 0; verbose && i < n_files; i++)
        printf("  %s\n", termsafe_str(st_set_file_path(m->st, i), esc, sizeof esc));
    print_unused(m->st, verbose);
}


/* ---- kernel plans (--kernels) ---- */

/* fn(ctx, name, w) for every weight m's linear products read, in model order. */
static void each_linear(const struct model *m, void (*fn)(void *, const char *, const struct tensor *),
                        void *ctx)
{
    char nm[96];
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct layer *L = &m->layers[il];
#define LAYER_MAT(slot)                                                              \
    if (tensor_is_present(&L->slot)) {                                               \
        snprintf(nm, sizeof nm, "layers.%d.%s", il, #slot);                          \
        fn(ctx, L->slot.name ? L->slot.name : nm, &L->slot);                         \
    }
        LAYER_MATRICES(LAYER_MAT)
#undef LAYER_MAT
        for (int h = 0; L->mla_heads && h < 4 * m->hp.n_head; h++) {
            snprintf(nm, sizeof nm, "layers.%d.mla_heads.%d", il, h);
            fn(ctx, nm, &L->mla_heads[h]);
        }
    }
    for (size_t i = 0; i < m->expert_views_used; i++)
        if (m->expert_views[i].ndim == 2) {
            snprintf(nm, sizeof nm, "expert_views.%zu", i);
            fn(ctx, m->expert_views[i].name ? m->expert_views[i].name : nm, &m->expert_views[i]);
        }
    if (tensor_is_present(&m->lm_head))
        fn(ctx, m->lm_head.name ? m->lm_head.name : "lm_head", &m->lm_head);
}

/* A weight's format for the plan listing: dtype, or quantization mode, bits and group. */
static void format_name(char *buf, size_t cap, const struct tensor *w)
{
    if (!w->qbits)
        snprintf(buf, cap, "%s", dtype_name(w->dtype));
    else if (w->qmode == QMODE_AFFINE)
        snprintf(buf, cap, "affine %d-bit g%d", w->qbits, w->qgroup);
    else
        snprintf(buf, cap, "%s g%d", qmode_name(w->qmode), w->qgroup);
}

struct plan_out {
    struct backend *be;
    cJSON *arr;   /* JSON: the array of plans; NULL: text */
    int rc;       /* first error */
};

static void plan_one(void *arg, const char *name, const struct tensor *w)
{
    struct plan_out *po = arg;
    struct linear_plan_info pi;
    char fmt[48];
    int rc = backend_linear_plan(po->be, w, &pi);
    if (rc < 0) {
        po->rc = po->rc ? po->rc : rc;
        return;
    }
    format_name(fmt, sizeof fmt, w);
    if (!po->arr) {
        char shape[48];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)(w->ndim == 2 ? w->shape[0] : 1),
                 (long long)w->shape[w->ndim - 1]);
        printf("  %-48s %-12s %-18s %-6s", name, shape, fmt, pi.layout);
        for (int i = 0; i < pi.n; i++) {
            if (i + 1 < pi.n && pi.b[i + 1].from_tok - 1 > pi.b[i].from_tok)
                printf(" %d-%d %s", pi.b[i].from_tok, pi.b[i + 1].from_tok - 1, pi.b[i].kernel);
            else if (i + 1 < pi.n)
                printf(" %d %s", pi.b[i].from_tok, pi.b[i].kernel);
            else
                printf(" %d+ %s", pi.b[i].from_tok, pi.b[i].kernel);
        }
        printf("%s\n", pi.fast ? " (fast)" : "");
        return;
    }
    cJSON *o = cJSON_CreateObject(), *bs = NULL;
    if (o) {
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddNumberToObject(o, "out", (double)(w->ndim == 2 ? w->shape[0] : 1));
        cJSON_AddNumberToObject(o, "in", (double)w->shape[w->ndim - 1]);
        cJSON_AddStringToObject(o, "format", fmt);
        cJSON_AddStringToObject(o, "layout", pi.layout);
        cJSON_AddBoolToObject(o, "fast", pi.fast);
        bs = cJSON_AddArrayToObject(o, "buckets");
    }
    if (!bs) {
        cJSON_Delete(o);
        po->rc = po->rc ? po->rc : -ERR_NOMEM;
        return;
    }
    for (int i = 0; i < pi.n; i++) {
        cJSON *b = cJSON_CreateObject();
        if (!b)
            continue;
        cJSON_AddNumberToObject(b, "from_tok", pi.b[i].from_tok);
        cJSON_AddStringToObject(b, "path", pi.b[i].path);
        cJSON_AddStringToObject(b, "kernel", pi.b[i].kernel);
        cJSON_AddItemToArray(bs, b);
    }
    cJSON_AddItemToArray(po->arr, o);
}

/* Prepare m for a new CPU backend and list every linear weight's plan: into o["kernels"]
 * (o not NULL), else as text. */
static int print_kernels(struct model *m, cJSON *o, struct err *e)
{
    struct backend *be = NULL;
    int rc;
    if ((rc = backend_cpu_new(&be, 0, NULL, &cli_cfg()->be, e)) < 0)
        return rc;
    struct plan_out po = {be, NULL, 0};
    if ((rc = model_prepare(m, be, e)) < 0)
        goto out;
    if (o) {
        cJSON *k = cJSON_AddObjectToObject(o, "kernels");
        po.arr = k ? cJSON_AddArrayToObject(k, "weights") : NULL;
        if (!po.arr) {
            rc = err_setf(e, ERR_NOMEM, "out of memory");
            goto out;
        }
        cJSON_AddStringToObject(k, "backend", be->name);
        cJSON_AddNumberToObject(k, "threads", be->n_threads);
    } else {
        printf("%-18s %s, %d threads (from each token count on: kernel)\n", "kernels", be->name,
               be->n_threads);
    }
    each_linear(m, plan_one, &po);
    if (po.rc < 0)
        rc = err_setf(e, -po.rc, "cannot describe the kernel plans");
out:
    backend_free(be);
    return rc;
}

/* ---- command ---- */

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"json", no_argument, 0, 'J'},
        {"kernels", no_argument, 0, 'K'}, {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *model = NULL;
    bool json = false, verbose = false, kernels = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'J': json = true; break;
        case 'K': kernels = true; break;
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
        if (print_json(m, kvt, kernels, &e) < 0)
            status = cli_fail("inspect", &e);
    } else {
        print_text(m, verbose, kvt);
        /* the text before the plans' preparation starts; a full disk said here, with errno */
        if (cli_stdout_check(&e) < 0 || (kernels && print_kernels(m, NULL, &e) < 0))
            status = cli_fail("inspect", &e);
    }
    model_free(m);
    return status;
}
