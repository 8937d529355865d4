/*
 * bench: `mlxcel bench [-m MODEL] [-p 512] [-n 128] [-r 3] [-t N] [--json]`,
 * throughput in the style of llama.cpp's llama-bench.
 *
 * Two tests, each repeated r times after one untimed warm-up (the prompt
 * once, then one generated token, or 16 for MoE models so every expert has
 * been touched; from an empty cache, without the -d depth, as llama-bench):
 *   ppP  prompt processing: one batched forward of P token ids from an empty
 *        cache, last-position logits only (what generate's prefill does).
 *   tgN  text generation: N single-token forwards from an empty cache, each
 *        feeding back the argmax of the previous step (the sampling cost is
 *        negligible and left out, as llama-bench does). With -s S the test is
 *        tgNxS: S sequences decode together, one batch of S rows per step
 *        (the server's continuous batching); tokens/s counts all S.
 * With -d D both run after D tokens already in each sequence's cache
 * (prefilled untimed before every repetition), as llama-bench's -d: named
 * "pp512 @ d4096", "tg128 @ d4096".
 * Ids come from a fixed-seed generator, so runs are comparable. Reported:
 * tokens/s mean and sample standard deviation over the repetitions.
 *
 * Memory: the footer (stderr) puts peak RSS next to the weight bytes and the
 * KV cache of the context used, so "peak RSS <= weights + KV + 64 MiB" can be
 * checked by eye or from --json (peak_rss_bytes, weight_bytes, kv_bytes).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cjson/cJSON.h>

#include "../core/fscan.h"
#include "../core/log.h"
#include "../engine/generate.h"
#include "../models/model.h"
#include "cli.h"

#define BENCH_MAX_REPS 1000
#define BENCH_MAX_SEQS 256
/* Headroom over weights + KV cache that the memory budget allows: activations,
 * thread stacks, the allocator and the binary itself. */
#define BENCH_RSS_SLACK (64ull << 20)
/* Prompt ids are drawn from this fixed seed so every run feeds the same tokens. */
#define BENCH_SEED 0x9e3779b97f4a7c15ull

static const char *k_help =
    "usage: mlxcel bench [-m MODEL] [-p N] [-n N] [-s N] [-d N] [-r N] [-t N] [--json]\n"
    "\n"
    "Prompt-processing and generation throughput, llama-bench style.\n"
    "  -m, --model MODEL     checkpoint folder or owner/name (default: the embedded model)\n"
    "  -p, --n-prompt N      prompt tokens of the pp test (default 512; 0 skips it)\n"
    "  -n, --n-gen N         generated tokens of the tg test (default 128; 0 skips it)\n"
    "  -s, --sequences N     sequences decoding together in the tg test, one batch per\n"
    "                        step (default 1; reported as tgNxS, tokens/s of all of them)\n"
    "  -d, --n-depth N       tokens already in each sequence's cache when a test starts\n"
    "                        (default 0; prefilled untimed before every run)\n"
    "  -r, --repetitions N   timed runs per test (default 3)\n"
    "  -t, --threads N       CPU threads (default: all online CPUs)\n"
    "  -v, --verbose         log the backend, threads, load times and loading details to stderr\n"
    "      --json            print a JSON array, one object per test\n"
    CLI_LORA_HELP
    "  -h, --help            show this help\n"
    "\n"
    "Each test starts from an empty cache (or one holding -d tokens); one untimed\n"
    "warm-up precedes them.\n"
    "Peak RSS, weight and KV-cache sizes are printed to stderr.\n";

enum bench_kind { BENCH_PP = 0, BENCH_TG = 1 };

struct bench_opts {
    const char *model;
    long n_prompt, n_gen, reps, threads, n_seq, n_depth;
    bool json;
    struct cli_lora lora;
};

struct bench_result {
    enum bench_kind kind;
    int n_tokens;
    int n_seq;          /* sequences decoding together (tg); 1 for pp */
    int n_depth;        /* tokens in each sequence's cache before the test */
    double *samples;    /* [reps] tokens/s, owned */
    double mean, sd;
};

/* Everything one run needs: the engine, a batch, logits and the prompt ids. */
struct bench_state {
    struct cli_engine en;
    struct batch b;     /* [max(n_prompt, n_seq)] rows */
    float *logits;      /* [n_seq, n_vocab] */
    int32_t *ids;       /* [max(n_prompt, n_seq)] */
    int32_t *next;      /* [n_seq] each sequence's next token */
    int n_slots;        /* KV cache slots (whole blocks) */
    int n_seq;          /* sequences of the tg test */
    int depth;          /* tokens prefilled into each sequence before a run */
    long rows;          /* rows forwarded so far (the depth prefills included) */
};

static int parse_args(int argc, char **argv, struct bench_opts *o, struct err *e)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'}, {"repetitions", required_argument, 0, 'r'},
        {"sequences", required_argument, 0, 's'}, {"n-depth", required_argument, 0, 'd'},
        {"threads", required_argument, 0, 't'}, {"json", no_argument, 0, 'J'},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, CLI_LORA_OPTIONS,
        {0, 0, 0, 0},
    };
    int c, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, ":m:p:n:s:d:r:t:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'p': rc = cli_parse_int("-p", optarg, 0, 1 << 24, &o->n_prompt, e); break;
        case 'n': rc = cli_parse_int("-n", optarg, 0, 1 << 24, &o->n_gen, e); break;
        case 'r': rc = cli_parse_int("-r", optarg, 1, BENCH_MAX_REPS, &o->reps, e); break;
        case 's': rc = cli_parse_int("-s", optarg, 1, BENCH_MAX_SEQS, &o->n_seq, e); break;
        case 'd': rc = cli_parse_int("-d", optarg, 0, 1 << 24, &o->n_depth, e); break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &o->threads, e); break;
        case 'J': o->json = true; break;
        case CLI_OPT_LORA:
        case CLI_OPT_LORA_SCALED:
        case CLI_OPT_LORA_NO_APPLY: rc = cli_lora_flag(&o->lora, c, optarg, argc, argv, e); break;
        case 'h': cli_help(k_help, CLI_GLOBAL_ALL); return 1;
        case ':': return err_setf(e, ERR_ARG, "option %s needs a value", argv[optind - 1]);
        default: return err_setf(e, ERR_ARG, "unknown option %s", argv[optind - 1]);
        }
    }
    if (rc < 0)
        return rc;
    if (optind < argc)
        return err_setf(e, ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (o->n_prompt == 0 && o->n_gen == 0)
        return err_setf(e, ERR_ARG, "-p 0 and -n 0 leave nothing to run");
    return 0;
}

/* ---- runs ---- */

/* splitmix64: deterministic ids in [0, n_vocab), independent of libc rand(). */
static void fill_ids(int32_t *ids, int n, int n_vocab)
{
    uint64_t s = BENCH_SEED;
    for (int i = 0; i < n; i++) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        ids[i] = (int32_t)(z % (uint64_t)n_vocab);
    }
}

/* Sequences [0, n) again empty, then each holding the -d depth (untimed). */
static int reset_seqs(struct bench_state *b, int n, struct err *e)
{
    int rc;
    batch_clear(&b->b);
    for (int s = 0; s < n; s++) {
        kv_seq_remove(b->en.kv, s);
        if ((rc = kv_seq_add(b->en.kv, s, e)) < 0)
            return rc;
    }
    for (int s = 0; s < n && b->depth > 0; s++) {
        batch_clear(&b->b);
        if ((rc = batch_add_seq(&b->b, b->ids, b->depth, 0, s, false, e)) < 0 ||
            (rc = model_forward(b->en.ctx, &b->b, b->en.kv, b->logits, e)) < 0)
            return err_prefix(e, "filling the cache to depth %d", b->depth);
        b->rows += b->depth;
    }
    batch_clear(&b->b);
    return 0;
}

/* One pp run of n tokens; *secs receives its wall time. */
static int run_pp(struct bench_state *b, int n, double *secs, struct err *e)
{
    int rc;
    if ((rc = reset_seqs(b, 1, e)) < 0 ||
        (rc = batch_add_seq(&b->b, b->ids, n, b->depth, 0, true, e)) < 0)
        return rc;
    double t0 = gen_now();
    rc = model_forward(b->en.ctx, &b->b, b->en.kv, b->logits, e);
    *secs = gen_now() - t0;
    b->rows += n;
    return rc;
}

/* One tg run of n steps from empty caches: each step one batch of one row per sequence. */
static int run_tg(struct bench_state *b, int n, double *secs, struct err *e)
{
    int V = b->en.ctx->m->hp.n_vocab, rc;
    if ((rc = reset_seqs(b, b->n_seq, e)) < 0)
        return rc;
    for (int s = 0; s < b->n_seq; s++)
        b->next[s] = b->ids[s];
    double t0 = gen_now();
    for (int i = 0; i < n && rc == 0; i++) {
        batch_clear(&b->b);
        for (int s = 0; s < b->n_seq; s++)
            batch_add(&b->b, b->next[s], b->depth + i, s, true, NULL);
        rc = model_forward(b->en.ctx, &b->b, b->en.kv, b->logits, e);
        b->rows += b->n_seq;
        for (int s = 0; s < b->n_seq; s++)
            b->next[s] = fscan_argmax(b->logits + (size_t)s * V, V);
    }
    *secs = gen_now() - t0;
    return rc;
}

static void summarize(struct bench_result *r, int reps)
{
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < reps; i++)
        sum += r->samples[i];
    r->mean = sum / reps;
    for (int i = 0; i < reps; i++)
        sq += (r->samples[i] - r->mean) * (r->samples[i] - r->mean);
    r->sd = reps > 1 ? sqrt(sq / (reps - 1)) : 0.0;
}

static const char *kind_name(enum bench_kind k)
{
    return k == BENCH_PP ? "pp" : "tg";
}

/* "pp512", "tg128", "tg128x4" for 4 sequences decoding together, each with
 * " @ d4096" after it when the test ran at a depth. */
static void test_name(char *buf, size_t cap, const struct bench_result *r)
{
    char d[24] = "";
    if (r->n_depth > 0)
        snprintf(d, sizeof d, " @ d%d", r->n_depth);
    if (r->n_seq > 1)
        snprintf(buf, cap, "%s%dx%d%s", kind_name(r->kind), r->n_tokens, r->n_seq, d);
    else
        snprintf(buf, cap, "%s%d%s", kind_name(r->kind), r->n_tokens, d);
}

static int run_test(struct bench_state *b, struct bench_result *r, int reps, bool progress,
                    struct err *e)
{
    for (int i = 0; i < reps; i++) {
        double secs = 0.0;
        int rc = r->kind == BENCH_PP ? run_pp(b, r->n_tokens, &secs, e)
                                     : run_tg(b, r->n_tokens, &secs, e);
        if (rc < 0)
            return err_prefix(e, "%s%d run %d", kind_name(r->kind), r->n_tokens, i + 1);
        r->samples[i] = secs > 0 ? (double)r->n_tokens * r->n_seq / secs : 0.0;
        if (progress)
            fprintf(stderr, "\r%s%d: run %d/%d  %.2f t/s   ", kind_name(r->kind), r->n_tokens,
                    i + 1, reps, r->samples[i]);
    }
    if (progress)
        fputc('\n', stderr);
    summarize(r, reps);
    return 0;
}

/* ---- output ---- */

struct bench_meta {
    const char *model;       /* name shown in the model column */
    const struct model *m;
    const char *backend;
    int threads;
    int n_ctx;
    enum dtype kv_dtype;
    bool fast;               /* --fast in effect on the backend */
    int n_tp;                /* --tensor-parallel ranks (threads: each rank's) */
    uint64_t peak_rss;       /* bytes */
    uint64_t state_bytes;    /* the cache's recurrent states (every sequence), bytes */
};

static uint64_t peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;   /* Linux reports kilobytes */
}

static int print_json(const struct bench_meta *mt, const struct bench_result *res, int n_res,
                      int reps, struct err *e)
{
    char test[32];
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n_res; i++) {
        const struct bench_result *r = &res[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o))
            break;
        test_name(test, sizeof test, r);
        cJSON_AddStringToObject(o, "model", mt->model);
        cJSON_AddStringToObject(o, "family", mt->m->ops->family);
        cJSON_AddNumberToObject(o, "params", (double)model_n_params(mt->m));
        cJSON_AddStringToObject(o, "backend", mt->backend);
        cJSON_AddNumberToObject(o, "threads", mt->threads);
        cJSON_AddNumberToObject(o, "tensor_parallel", mt->n_tp);
        cJSON_AddStringToObject(o, "test", test);
        cJSON_AddNumberToObject(o, "n_tokens", r->n_tokens);
        cJSON_AddNumberToObject(o, "n_seqs", r->n_seq);
        cJSON_AddNumberToObject(o, "n_depth", r->n_depth);
        cJSON_AddNumberToObject(o, "reps", reps);
        cJSON_AddNumberToObject(o, "ts_mean", r->mean);
        cJSON_AddNumberToObject(o, "ts_sd", r->sd);
        cJSON_AddItemToObject(o, "samples_ts", cJSON_CreateDoubleArray(r->samples, reps));
        cJSON_AddNumberToObject(o, "n_ctx", mt->n_ctx);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)model_weight_bytes(mt->m));
        cJSON_AddStringToObject(o, "kv_type", cli_kv_dtype_name(mt->kv_dtype));
        /* the rows of n_ctx positions, and the recurrent states of every sequence the cache
         * holds (model_kv_bytes counts one sequence's) */
        struct model_kv_sizes z;
        model_kv_sizes(mt->m, mt->kv_dtype, &z);
        cJSON_AddNumberToObject(o, "kv_bytes",
                                (double)(model_kv_bytes(mt->m, mt->n_ctx, KV_DEFAULT_BLOCK, mt->kv_dtype) -
                                         z.rec_per_seq + mt->state_bytes));
        cJSON_AddBoolToObject(o, "fast", mt->fast);
        cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)mt->peak_rss);
    }
    return cli_print_json(arr, e);
}

static void print_table(const struct bench_meta *mt, const struct bench_result *res, int n_res)
{
    char params[32], test[32], be[64];
    /* the backend column names the ranks (threads: each rank's), a cache narrower than f32
     * and --fast */
    char tp[16] = "";
    if (mt->n_tp > 1)
        snprintf(tp, sizeof tp, " x%d", mt->n_tp);
    snprintf(be, sizeof be, "%s%s%s%s%s", mt->backend, tp, mt->kv_dtype != DTYPE_F32 ? " kv " : "",
             mt->kv_dtype != DTYPE_F32 ? cli_kv_dtype_name(mt->kv_dtype) : "", mt->fast ? " fast" : "");
    int wm = (int)strlen(mt->model), wb = (int)strlen(be), wt = 8;
    wm = wm < 5 ? 5 : wm;
    wb = wb < 7 ? 7 : wb;
    for (int i = 0; i < n_res; i++) {
        test_name(test, sizeof test, &res[i]);
        wt = (int)strlen(test) > wt ? (int)strlen(test) : wt;
    }
    cli_format_count(model_n_params(mt->m), params, sizeof params);
    printf("| %-*s | %8s | %-*s | %7s | %*s | %20s |\n", wm, "model", "params", wb, "backend",
           "threads", wt, "test", "t/s");
    printf("| %.*s | -------: | %.*s | ------: | %.*s: | -------------------: |\n", wm,
           "----------------------------------------------------------------", wb,
           "----------------------------------------------------------------", wt - 1,
           "--------------------------------");
    for (int i = 0; i < n_res; i++) {
        char ts[64];
        test_name(test, sizeof test, &res[i]);
        snprintf(ts, sizeof ts, "%.2f ± %.2f", res[i].mean, res[i].sd);
        /* "±" is two bytes but one column; widen the field by one to keep alignment */
        printf("| %-*s | %8s | %-*s | %7d | %*s | %21s |\n", wm, mt->model, params, wb, be,
               mt->threads, wt, test, ts);
    }
}

static void print_footer(const struct bench_meta *mt)
{
    uint64_t wb = model_weight_bytes(mt->m);
    uint64_t kv = model_kv_bytes_per_token(mt->m, mt->kv_dtype) * (uint64_t)mt->n_ctx + mt->state_bytes;
    uint64_t budget = wb + kv + BENCH_RSS_SLACK;
    char s_rss[32], s_w[32], s_kv[32], s_b[32];
    cli_format_bytes(mt->peak_rss, s_rss, sizeof s_rss);
    cli_format_bytes(wb, s_w, sizeof s_w);
    cli_format_bytes(kv, s_kv, sizeof s_kv);
    cli_format_bytes(budget, s_b, sizeof s_b);
    fprintf(stderr, "peak RSS %s; weights %s + KV cache %s (n_ctx %d) + 64 MiB = %s: %s\n", s_rss,
            s_w, s_kv, mt->n_ctx, s_b, mt->peak_rss <= budget ? "within budget" : "OVER budget");
}

/* ---- command ---- */

/* The model column: the -m argument as given (trailing '/' dropped), else the default's folder name. */
static void model_label(const char *arg, const char *dir, char *buf, size_t cap)
{
    const char *s = arg;
    if (!s) {
        const char *slash = strrchr(dir, '/');
        s = slash ? slash + 1 : dir;
    }
    snprintf(buf, cap, "%s", s);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
}

/* Allocates the engine (its cache sized for the longer run; the engine's context
 * check rejects runs longer than the model's context), logits and prompt ids. */
static int bench_setup(struct bench_state *b, struct model *m, const struct bench_opts *o,
                       struct err *e)
{
    long d = o->n_depth, gen = d + o->n_gen < m->hp.n_ctx ? d + o->n_gen : m->hp.n_ctx;
    long slots = d + o->n_prompt < m->hp.n_ctx ? d + o->n_prompt : m->hp.n_ctx;
    long rows = o->n_prompt > o->n_seq ? o->n_prompt : o->n_seq;
    int rc;
    rows = rows > d ? rows : d;
    if (d >= m->hp.n_ctx)
        return err_setf(e, ERR_RANGE, "-d %ld leaves no room in the model's context of %d tokens",
                        d, m->hp.n_ctx);
    b->n_seq = (int)o->n_seq;
    b->depth = (int)d;
    /* the cache holds the pp prompt or every tg sequence (each in whole blocks),
     * whichever is larger */
    long per_seq = (gen + KV_DEFAULT_BLOCK - 1) / KV_DEFAULT_BLOCK * KV_DEFAULT_BLOCK;
    if (per_seq * o->n_seq > slots)
        slots = per_seq * o->n_seq;
    /* -n up to the context times -s up to 256 can pass what an int (and the pool) holds */
    if (slots > KV_MAX_TOKENS)
        return err_setf(e, ERR_RANGE,
                        "-d %ld + -n %ld x -s %ld needs a KV cache of %ld tokens, more than %d",
                        d, o->n_gen, o->n_seq, slots, KV_MAX_TOKENS);
    if ((rc = cli_engine_open(&b->en, m, o->threads, (int)slots, b->n_seq, 0, 0, e)) < 0 ||
        (rc = batch_init(&b->b, (int)rows, e)) < 0)
        return rc;
    b->n_slots = b->en.kv->n_blocks * b->en.kv->block_size;
    b->logits = malloc((size_t)b->n_seq * m->hp.n_vocab * sizeof *b->logits);
    b->ids = malloc((size_t)rows * sizeof *b->ids);
    b->next = malloc((size_t)b->n_seq * sizeof *b->next);
    if (!b->logits || !b->ids || !b->next)
        return err_setf(e, ERR_NOMEM, "out of memory");
    fill_ids(b->ids, (int)rows, m->hp.n_vocab);
    return 0;
}

/* Untimed warm-up as llama-bench does it: the full prompt once and one
 * generated token, from an empty cache (llama-bench warms up before it fills
 * the -d depth; prefilling it here too would double a -d 8192 -r 1 run for
 * nothing, the depth prefill before each timed run touching the same cache).
 * A MoE model decodes up to 16 tokens instead: one token routes to only k
 * experts per layer, and the first timed repetition would otherwise pay for
 * mapping the others in from the page cache. */
static int warm_up(struct bench_state *b, const struct bench_opts *o, const struct model *m,
                   struct err *e)
{
    double secs;
    int rc = 0, depth = b->depth;
    int n_tg = m->hp.n_expert > 0 ? (int)(o->n_gen < 16 ? o->n_gen : 16) : 1;
    long rows = b->rows;
    b->depth = 0;
    if (o->n_prompt > 0 && (rc = run_pp(b, (int)o->n_prompt, &secs, e)) < 0)
        rc = err_prefix(e, "warm-up");
    else if (o->n_gen > 0 && (rc = run_tg(b, n_tg, &secs, e)) < 0)
        rc = err_prefix(e, "warm-up");
    b->depth = depth;
    LOG_INFO("bench: warm-up forwarded %ld rows", b->rows - rows);
    return rc < 0 ? rc : 0;
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 3, .n_seq = 1};
    struct err e = {0};
    char dir[4096], label[4096];
    struct model *m = NULL;
    struct bench_state b = {0};
    struct bench_result res[2] = {{0}};
    int n_res = 0, status = CLI_EXIT_ERROR;

    int rc = parse_args(argc, argv, &o, &e);
    if (rc > 0)
        return CLI_EXIT_OK;
    if (rc < 0)
        return cli_usage_error("bench", "%s", e.msg);

    if (cli_resolve_model(o.model, dir, sizeof dir, &e) < 0 || cli_model_load(&m, dir, &e) < 0 ||
        bench_setup(&b, m, &o, &e) < 0 || cli_lora_attach(&o.lora, m, &b.en, &e) < 0 ||
        warm_up(&b, &o, m, &e) < 0)
        goto out;
    if (o.n_prompt > 0)
        res[n_res++] = (struct bench_result){.kind = BENCH_PP, .n_tokens = (int)o.n_prompt,
                                             .n_seq = 1, .n_depth = (int)o.n_depth};
    if (o.n_gen > 0)
        res[n_res++] = (struct bench_result){.kind = BENCH_TG, .n_tokens = (int)o.n_gen,
                                             .n_seq = (int)o.n_seq, .n_depth = (int)o.n_depth};
    bool progress = cli_stderr_is_tty();
    for (int i = 0; i < n_res; i++) {
        res[i].samples = calloc((size_t)o.reps, sizeof *res[i].samples);
        if (!res[i].samples) {
            err_setf(&e, ERR_NOMEM, "out of memory");
            goto out;
        }
        if (run_test(&b, &res[i], (int)o.reps, progress, &e) < 0)
            goto out;
    }

    model_label(o.model, dir, label, sizeof label);
    struct bench_meta mt = {
        .model = label, .m = m, .backend = b.en.be->name, .threads = b.en.be->n_threads,
        .n_ctx = b.n_slots, .peak_rss = peak_rss_bytes(), .kv_dtype = b.en.kv->dtype,
        .state_bytes = b.en.kv->state_bytes,
        .fast = b.en.be->fast, .n_tp = b.en.n_tp > 1 ? b.en.n_tp : 1,
    };
    if (o.json) {
        if (print_json(&mt, res, n_res, (int)o.reps, &e) < 0)
            goto out;
    } else {
        print_table(&mt, res, n_res);
    }
    cli_stdout_check(NULL);  /* the table before the footer when both go to one terminal */
    print_footer(&mt);
    status = CLI_EXIT_OK;
out:
    if (status != CLI_EXIT_OK)
        cli_fail("bench", &e);
    for (int i = 0; i < n_res; i++)
        free(res[i].samples);
    free(b.ids);
    free(b.next);
    free(b.logits);
    batch_free(&b.b);
    cli_engine_close(&b.en);
    cli_lora_free(&o.lora);
    model_free(m);
    return status;
}
