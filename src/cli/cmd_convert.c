/*
 * convert: `mlxcel convert -m SRC -o DST [-q ...] [--dtype D]` writes an
 * MLX-format checkpoint the way mlx-lm's `convert` does (convert.h): float
 * weights cast to the config's torch_dtype (or --dtype), MoE experts stacked
 * by the family's expert_stacking rules, a tied lm_head dropped, and with -q
 * every Linear / Embedding / expert weight whose input width divides the
 * group size quantized (quantize.h), config.json given "quantization" and
 * "quantization_config". Tokenizer and other small files are copied.
 *
 * Also home of the helpers convert and synth share (declared in cli.h): the
 * -q flag set and the progress line, which is drawn only when stderr is a
 * terminal.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../loading/config.h"
#include "../loading/convert.h"
#include "../models/lora.h"
#include "../models/model.h"
#include "../models/registry.h"
#include "../engine/generate.h"
#include "cli.h"

static const char *k_help =
    "usage: mlxcel convert -m SRC -o DST [-q] [--q-bits B] [--q-group-size G]\n"
    "                      [--q-mode affine|mxfp4|mxfp8|nvfp4] [--dtype bf16|f16|f32] [--json]\n"
    "\n"
    "Write an MLX-format checkpoint (as mlx-lm's convert): float weights cast to the\n"
    "config's torch_dtype, MoE experts stacked, a tied lm_head dropped; with -q every\n"
    "Linear, Embedding and expert weight whose input width divides the group size is\n"
    "quantized. config.json, tokenizer and other small files go along.\n"
    "  -m, --model SRC        source checkpoint folder (Hugging Face layout) or owner/name\n"
    "  -o, --output DST       new folder (must not exist, or be empty)\n"
    "  -q, --quantize         quantize\n"
    "      --q-bits B         affine: 2, 3, 4, 5, 6, 8 (default 4); fp modes: their own\n"
    "      --q-group-size G   affine: 32, 64, 128 (default 64); fp modes: their own\n"
    "      --q-mode M         affine (default), mxfp4 (32, 4), mxfp8 (32, 8), nvfp4 (16, 4)\n"
    "      --q-variant V      gpu (default: MLX's Metal/CUDA quantizer, which made the\n"
    "                         mlx-community uploads) or cpu (MLX's CPU kernel)\n"
    "      --dtype D          bf16, f16 or f32 (default: the config's torch_dtype)\n"
    "      --fuse-lora PATH[:S]  merge a LoRA adapter (mlx-lm or PEFT; repeatable) into the\n"
    "                         weights at scale S (default 1), as mlx-lm's fuse: W + S s B A\n"
    "                         computed in f32, then cast to the output dtype (and quantized with\n"
    "                         -q); an MLX-quantized source keeps its quantization (each merged\n"
    "                         weight dequantized, added to, quantized again; no -q or --dtype)\n"
    "      --json             print a JSON summary on stdout\n"
    "  -h, --help             show this help\n";

/* ---- shared with synth ---- */

int cli_quant_resolve(const struct cli_quant_flags *f, struct quant_params *q, struct err *e)
{
    long v;
    int rc;
    memset(q, 0, sizeof *q);
    if (f->mode && qmode_parse(f->mode, &q->mode, NULL) < 0)
        return err_setf(e, ERR_ARG, "--q-mode '%s' is not one of affine, mxfp4, mxfp8, nvfp4", f->mode);
    qmode_defaults(q->mode, &q->group, &q->bits);
    if (f->bits) {
        if ((rc = cli_parse_int("--q-bits", f->bits, 1, 64, &v, e)) < 0)
            return rc;
        q->bits = (int)v;
    }
    if (f->group) {
        if ((rc = cli_parse_int("--q-group-size", f->group, 1, 1 << 20, &v, e)) < 0)
            return rc;
        q->group = (int)v;
    }
    if (f->variant) {
        if (strcmp(f->variant, "gpu") == 0)
            q->variant = QUANT_GPU;
        else if (strcmp(f->variant, "cpu") == 0)
            q->variant = QUANT_CPU;
        else
            return err_setf(e, ERR_ARG, "--q-variant '%s' is not gpu or cpu", f->variant);
    }
    if ((rc = quant_params_check(q, e)) < 0)
        return err_prefix(e, "--q-mode %s --q-group-size %d --q-bits %d", qmode_name(q->mode),
                          q->group, q->bits);
    return 0;
}

bool cli_quant_flags_given(const struct cli_quant_flags *f)
{
    return f->bits || f->group || f->mode || f->variant;
}

void cli_progress(void *ud, uint64_t done, uint64_t total)
{
    struct cli_progress_state *p = ud;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct == p->last_pct)
        return;
    p->last_pct = pct;
    char a[32], b[32];
    cli_format_bytes(done, a, sizeof a);
    cli_format_bytes(total, b, sizeof b);
    fprintf(stderr, "\r%s: %3d%% (%s of %s)", p->what, pct, a, b);
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}

void cli_progress_end(const struct cli_progress_state *p)
{
    if (p->last_pct >= 0 && p->last_pct < 100)
        fputc('\n', stderr);
}

/* ---- command ---- */

/* The family of the source: its stacking rules, its quant predicate and whether its head
 * is tied. */
static int source_family(const char *dir, struct convert_opts *o, struct ck_view_rule *views,
                         bool *tied, struct err *e)
{
    char path[4200];
    cJSON *cfg = NULL;
    const struct model_ops *ops;
    struct hparams hp;
    int rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) < 0)
        return rc;
    hparams_init(&hp);
    if ((rc = registry_resolve(cfg, &ops, e)) < 0 || (rc = ops->parse_config(&hp, cfg, e)) < 0) {
        err_prefix(e, "%s", path);
    } else {
        o->rules = ops->expert_stacking;
        o->predicate = ops->quant_predicate;
        *tied = hp.tie_embd;
        rc = model_convert_views(ops, cfg, views, &o->views, e);
    }
    cJSON_Delete(cfg);
    return rc;
}

static int print_summary(const char *src, const char *dst, const struct convert_stats *st,
                         const struct quant_params *q, bool json, double secs, struct err *e)
{
    if (!json) {
        char b[32];
        cli_format_bytes(st->ck.bytes, b, sizeof b);
        printf("%s -> %s: %zu tensors (%zu quantized", src, dst, st->ck.n_tensors, st->ck.n_quantized);
        if (q)
            printf(", %s %d-bit group %d", qmode_name(q->mode), q->bits, q->group);
        printf("), %s, %zu files copied, %.1f s\n", b, st->n_copied, secs);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "src", src);
        cJSON_AddStringToObject(o, "dst", dst);
        cJSON_AddNumberToObject(o, "tensors_in", (double)st->n_inputs);
        cJSON_AddNumberToObject(o, "tensors_out", (double)st->ck.n_tensors);
        cJSON_AddNumberToObject(o, "quantized", (double)st->ck.n_quantized);
        cJSON_AddNumberToObject(o, "params", (double)st->ck.n_params);
        cJSON_AddNumberToObject(o, "bytes", (double)st->ck.bytes);
        cJSON_AddStringToObject(o, "dtype", st->dtype >= 0 ? dtype_name((enum dtype)st->dtype) : "kept");
        if (q) {
            cJSON_AddStringToObject(o, "mode", qmode_name(q->mode));
            cJSON_AddNumberToObject(o, "bits", q->bits);
            cJSON_AddNumberToObject(o, "group_size", q->group);
        } else {
            cJSON_AddNullToObject(o, "mode");
        }
        cJSON_AddNumberToObject(o, "files_copied", (double)st->n_copied);
        cJSON_AddNumberToObject(o, "seconds", secs);
    }
    return cli_print_json(o, e);
}

enum { OPT_QBITS = 256, OPT_QGROUP, OPT_QMODE, OPT_QVARIANT, OPT_DTYPE, OPT_JSON, OPT_FUSE };

/* --fuse-lora: the base loaded (for its shapes and tensor names) and each adapter merged into
 * an F32 copy of the weights it targets (lora_fused_new); convert reads those. */
struct fuse {
    struct model *m;
    struct cli_lora l;
    struct lora_fused *f;
};

static int fuse_open(struct fuse *fu, const char *dir, struct err *e)
{
    int rc;
    if ((rc = cli_model_load(&fu->m, dir, e)) < 0)
        return err_prefix(e, "--fuse-lora");
    for (int i = 0; i < fu->l.n; i++)
        if ((rc = lora_load(&fu->l.ad[i], fu->m, fu->l.path[i], e)) < 0)
            return err_prefix(e, "--fuse-lora %s", fu->l.path[i]);
    return lora_fused_new(&fu->f, fu->m, fu->l.ad, fu->l.scale, fu->l.n, e);
}

static void fuse_close(struct fuse *fu)
{
    lora_fused_free(fu->f);
    cli_lora_free(&fu->l);
    model_free(fu->m);
}

int cmd_convert(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},        {"output", required_argument, 0, 'o'},
        {"quantize", no_argument, 0, 'q'},           {"q-bits", required_argument, 0, OPT_QBITS},
        {"q-group-size", required_argument, 0, OPT_QGROUP}, {"q-mode", required_argument, 0, OPT_QMODE},
        {"q-variant", required_argument, 0, OPT_QVARIANT}, {"dtype", required_argument, 0, OPT_DTYPE},
        {"json", no_argument, 0, OPT_JSON},          {"help", no_argument, 0, 'h'},
        {"fuse-lora", required_argument, 0, OPT_FUSE},
        {0, 0, 0, 0},
    };
    const char *src = NULL, *dst = NULL, *dtype = NULL;
    struct cli_quant_flags qf = {0};
    struct fuse fu = {0};
    struct err e = {0};
    bool quantize = false, json = false;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":m:o:qh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': src = optarg; break;
        case 'o': dst = optarg; break;
        case 'q': quantize = true; break;
        case OPT_QBITS: qf.bits = optarg; break;
        case OPT_QGROUP: qf.group = optarg; break;
        case OPT_QMODE: qf.mode = optarg; break;
        case OPT_QVARIANT: qf.variant = optarg; break;
        case OPT_DTYPE: dtype = optarg; break;
        case OPT_JSON: json = true; break;
        case OPT_FUSE:
            if (cli_lora_flag(&fu.l, CLI_OPT_LORA, optarg, argc, argv, &e) < 0)
                return cli_usage_error("convert", "--fuse-lora: %s", e.msg);
            break;
        case 'h': cli_help(k_help, CLI_GLOBAL_MODEL); return CLI_EXIT_OK;
        case ':': return cli_usage_error("convert", "option %s needs a value", argv[optind - 1]);
        default: return cli_usage_error("convert", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("convert", "unexpected argument '%s'", argv[optind]);
    if (!src || !dst)
        return cli_usage_error("convert", "give the source with -m and the output folder with -o");

    struct quant_params q;
    struct convert_opts o = {0};
    struct ck_view_rule views[CK_MAX_VIEWS];
    struct convert_stats st;
    struct cli_progress_state prog = {"convert", -1};
    char dir[4096];
    bool tied = false;
    if (!quantize && cli_quant_flags_given(&qf)) {
        err_setf(&e, ERR_ARG, "--q-* options need -q");
        return cli_fail("convert", &e);
    }
    o.dtype = -1;
    if (dtype && (o.dtype = ck_dtype_parse(dtype)) < 0) {
        err_setf(&e, ERR_ARG, "--dtype '%s' is not bf16, f16 or f32", dtype);
        return cli_fail("convert", &e);
    }
    if ((quantize && cli_quant_resolve(&qf, &q, &e) < 0) ||
        cli_resolve_model(src, dir, sizeof dir, &e) < 0 ||
        source_family(dir, &o, views, &tied, &e) < 0)
        return cli_fail("convert", &e);
    /* mlx-lm's sanitize drops a tied head's copy; the embedding serves as the head */
    static const char *const drop_tied[] = {"lm_head.weight", NULL};
    if (fu.l.n > 0) {
        if (fuse_open(&fu, dir, &e) < 0) {
            fuse_close(&fu);
            return cli_fail("convert", &e);
        }
        o.replace = lora_fused_find;
        o.replace_ud = fu.f;
    }
    o.src = dir;
    o.dst = dst;
    o.q = quantize ? &q : NULL;
    o.drop = tied ? drop_tied : NULL;
    if (cli_stderr_is_tty()) {
        o.progress = cli_progress;
        o.progress_ud = &prog;
    }
    outdir_catch_signals();  /* an interrupted run leaves no partial folder */
    outdir_sweep(dst, cli_on_swept, "convert");  /* ... and a killed one's is removed now */
    double t0 = gen_now();
    int crc = convert_checkpoint(&o, &st, &e);
    fuse_close(&fu);
    if (crc < 0) {
        cli_progress_end(&prog);
        return cli_fail("convert", &e);
    }
    double secs = gen_now() - t0;
    if (print_summary(dir, dst, &st, o.q, json, secs, &e) < 0)
        return cli_fail("convert", &e);
    /* the copy is of plain files: a sentence-transformers folder's modules (Pooling, Dense,
     * Normalize in subfolders) stay behind, and without them the output embeds differently */
    char st_path[4096 + 16];
    snprintf(st_path, sizeof st_path, "%s/modules.json", dir);
    if (access(st_path, F_OK) == 0)
        fprintf(stderr, "mlxcel convert: warning: %s is a sentence-transformers folder: copy modules.json, "
                "its module folders (1_Pooling/, 2_Dense/, ...) and config_sentence_transformers.json "
                "into %s, or its embeddings will differ\n", dir, dst);
    return CLI_EXIT_OK;
}
