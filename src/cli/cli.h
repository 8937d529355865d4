/*
 * cli: the `mlxcel` command-line front end. main.c dispatches to one
 * cmd_<name>() per command; this header holds what the commands share:
 * model-path resolution (-m DIR | owner/name | the embedded default),
 * number parsing with range checks, and the error printer. Commands return
 * the process exit status (0 ok, 1 runtime error, 2 usage error).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/err.h"
#include "../core/fileio.h"
#include "../engine/spec.h"
#include "../loading/quantize.h"

#define MLXCEL_VERSION "0.1.0"  /* --version, and GET /props' build_info */

#define CLI_EXIT_OK    0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_rerank(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_arch(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_pull(int argc, char **argv);

/* Print "mlxcel <cmd>: <message>" to stderr and return CLI_EXIT_ERROR. The message is
 * escaped (control and non-UTF-8 bytes as \n, \xNN), so it is one line of valid UTF-8. */
int cli_fail(const char *cmd, const struct err *e);
/* The flags every command takes (src/cli/main.c strips them from argv), for --help:
 * CLI_GLOBAL_MODEL is --offline (commands that resolve -m owner/name), CLI_GLOBAL_KV
 * --kv-type (commands that size or run a KV cache), CLI_GLOBAL_RUN the engine's --device,
 * --fast and --[no-]mmap. */
#define CLI_GLOBAL_MODEL 1u
#define CLI_GLOBAL_KV    2u
#define CLI_GLOBAL_RUN   4u
#define CLI_GLOBAL_ALL   (CLI_GLOBAL_MODEL | CLI_GLOBAL_KV | CLI_GLOBAL_RUN)
/* outdir_sweep's callback for the commands that write folders: says what was removed
 * (ud: the command's name). */
void cli_on_swept(void *ud, const char *path, const char *why);
/* Print help (a command's usage text) and then the global flags of which to stdout. */
void cli_help(const char *help, unsigned which);
/* Print a usage error (escaped as cli_fail) and a hint to run --help; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse a decimal integer in [lo, hi] from a flag value. */
int cli_parse_int(const char *flag, const char *s, long lo, long hi, long *out, struct err *e);
int cli_parse_float(const char *flag, const char *s, double lo, double hi, double *out, struct err *e);
/* The speculative decoding flags of generate and serve (--spec none|ngram, --draft-max N,
 * --draft-min N, --spec-gate on|off): flag is the name without dashes; -ERR_ARG for
 * a bad value. CLI_SPEC_HELP is their --help text. */
int cli_spec_flag(const char *flag, const char *arg, struct spec_params *p, struct err *e);
#define CLI_SPEC_HELP \
    "      --spec MODE        speculative decoding: none (default), ngram (prompt lookup: drafts\n" \
    "                         copied from where the last tokens occurred before in the prompt or\n" \
    "                         output), draft (a draft model, --model-draft) or mtp (the\n" \
    "                         checkpoint's own multi-token-prediction layer: DeepSeek-V3, GLM-4.5,\n" \
    "                         GLM-4.7-Flash with num_nextn_predict_layers, Qwen3-Next and Qwen3.5\n" \
    "                         with their mtp.* module); the output is the same, faster when\n" \
    "                         drafts are often right\n" \
    "      --draft-max N      tokens drafted per step at most (default 16, up to 64)\n" \
    "      --draft-min N      decode plainly when fewer are drafted (default 1)\n"

/* LoRA adapters (cli_lora.c, ADR 0103): --lora PATH[:SCALE], --lora-scaled PATH SCALE
 * (llama.cpp's names; repeatable) and --lora-init-without-apply, in the commands that load a
 * model to run it. cli_lora_flag takes one of the CLI_OPT_LORA* options getopt returned
 * (optarg its value, cut at a ":SCALE" suffix in place; --lora-scaled's SCALE is
 * argv[optind], consumed); cli_lora_attach loads
 * them against m, prepares them for en's backend and gives them to en's context with their
 * scales as the global ones (0 with --lora-init-without-apply). */
struct lora_adapter;
#define CLI_LORA_MAX 32
struct cli_lora {
    int n;
    const char *path[CLI_LORA_MAX];
    float scale[CLI_LORA_MAX];
    bool no_apply;
    struct lora_adapter *ad[CLI_LORA_MAX];  /* loaded by cli_lora_attach, owned */
};
enum { CLI_OPT_LORA = 0x4c00, CLI_OPT_LORA_SCALED, CLI_OPT_LORA_NO_APPLY };
#define CLI_LORA_OPTIONS                                                              \
    {"lora", required_argument, 0, CLI_OPT_LORA},                                    \
    {"lora-scaled", required_argument, 0, CLI_OPT_LORA_SCALED},                      \
    {"lora-init-without-apply", no_argument, 0, CLI_OPT_LORA_NO_APPLY}
#define CLI_LORA_HELP \
    "      --lora PATH[:S]    apply a LoRA adapter (mlx-lm adapters.safetensors or PEFT\n" \
    "                         adapter_model.safetensors, with adapter_config.json; a folder or\n" \
    "                         the file) unmerged, at scale S (default 1; repeatable)\n" \
    "      --lora-scaled PATH S  the same at scale S (llama.cpp's form)\n" \
    "      --lora-init-without-apply  load the adapters at scale 0 (serve: set scales later\n" \
    "                         with POST /lora-adapters or per request)\n"
int cli_lora_flag(struct cli_lora *l, int opt, char *optarg_, int argc, char **argv,
                  struct err *e);
struct cli_engine;
struct model;
int cli_lora_attach(struct cli_lora *l, const struct model *m, struct cli_engine *en, struct err *e);
void cli_lora_free(struct cli_lora *l);

/* Parse "1,2,3" (or whitespace separated, or a JSON array) into a malloc'd id array. */
int cli_parse_ids(const char *s, int32_t **ids, size_t *n, struct err *e);

/* Read the file a -f flag names (at most max bytes; file_read_all's rule), or standard input
 * when path is "-" (a pipe or a file; the only way to read it, since /dev/stdin is not a
 * regular file). *out is malloc'd and NUL-terminated, owned by the caller. */
int cli_read_input(const char *path, size_t max, char **out, size_t *len, struct err *e);

/* Resolve -m: an existing folder, or owner/name in $MLXCEL_MODELS_DIR or the Hugging Face
 * cache, else pulled from the Hub into the cache (cli_pull_model) unless offline
 * (`--offline` on any command, or $HF_HUB_OFFLINE: cli_cfg()->offline); NULL means the
 * embedded default model. buf receives the folder. */
int cli_resolve_model(const char *arg, char *buf, size_t cap, struct err *e);
/* Pull owner/name from the Hub into the HF cache for a command that needs it (cmd_pull.c),
 * saying on stderr what it fetches; buf receives the snapshot folder. */
int cli_pull_model(const char *repo, char *buf, size_t cap, struct err *e);
/* Roots searched for owner/name. */
void cli_models_dir(char *buf, size_t cap);
void cli_hf_hub_dir(char *buf, size_t cap);
/* The snapshot folder of an HF cache repo folder (refs/main, else the newest snapshot). */
int cli_hf_snapshot(const char *repo_dir, char *buf, size_t cap);

/* Whether a model folder is whole (cli_snapshot.c): the files its index names, at least
 * one *.safetensors, no dangling links, and for an HF snapshot no *.incomplete blob. */
struct cli_snapshot_check {
    size_t n_missing;          /* files named or linked but absent */
    char first_missing[256];   /* the first of them ("*.safetensors": no weights at all) */
    size_t n_incomplete;       /* blobs/ *.incomplete of the HF repository */
};
void cli_snapshot_check(const char *dir, struct cli_snapshot_check *c);
bool cli_snapshot_is_partial(const struct cli_snapshot_check *c);
/* "X missing", "X and N more file(s) missing" or "N unfinished download(s) in blobs/". */
void cli_snapshot_describe(const struct cli_snapshot_check *c, char *buf, size_t cap);
/* After a failure to load from dir: when dir is partial, the message gains what is missing
 * and `mlxcel pull owner/name`. */
void cli_hint_partial(const char *dir, struct err *e);
/* model_load(m, dir, e) with cli_hint_partial on failure. */
struct model;
int cli_model_load(struct model **m, const char *dir, struct err *e);
/* --reranker KIND (rerank, serve; NULL: nothing): "qwen3" serves m as an LM reranker
 * (model_set_lm_reranker, ADR 0098); another kind is -ERR_ARG. */
int cli_reranker_apply(struct model *m, const char *kind, struct err *e);

/* Print root as JSON on stdout and delete it (root may be NULL after an allocation
 * failure: -ERR_NOMEM). Takes ownership of root. */
/* What a command needs to run a model: a backend (the one factory, with cli_cfg()'s device
 * and backend options), the model's weights prepared for it, an activation context and a paged KV
 * cache of n_tokens slots for max_seqs sequences of at most max_seq_len tokens
 * (<= 0: the model's context). */
struct model;
struct backend;
struct model_ctx;
struct kv_cache;
struct cli_engine {
    struct backend *be;
    bool be_borrowed;    /* be belongs to another engine (cli_engine_attach) */
    /* --tensor-parallel N: the ranks' backends, tp_be[0] == be (models/tp.h); n_tp 0: none */
    struct backend *tp_be[8];
    int n_tp;
    struct model_ctx *ctx;
    struct kv_cache *kv;
};
/* The KV cache element type --kv-type (MLXCEL_KV_TYPE; cli_cfg()->kv_type) asks for: f32 (the default), f16
 * or bf16; -ERR_ARG naming the value otherwise. cli_engine_open uses it. */
int cli_kv_dtype(enum dtype *out, struct err *e);
/* Its name as --kv-type spells it: "f32", "f16" or "bf16". */
const char *cli_kv_dtype_name(enum dtype t);
/* --tensor-parallel N (-tp N; cli_cfg()->tensor_parallel): *n ranks, 1 when not given;
 * -ERR_ARG for a value that is not 1 to 8. */
int cli_tensor_parallel(int *n, struct err *e);
/* swa_slack: kv_params.swa_slack (speculative decoding's --draft-max, else 0). With
 * --tensor-parallel N > 1 the model is split over N ranks (model_tp_split), each on a backend
 * of its own with threads / N threads. */
int cli_engine_open(struct cli_engine *en, struct model *m, long threads, int n_tokens, int max_seqs,
                    int max_seq_len, int swa_slack, struct err *e);
/* An engine for a second model (a draft model) on the backend of `on` (borrowed). */
int cli_engine_attach(struct cli_engine *en, const struct cli_engine *on, struct model *m, int n_tokens,
                      int max_seqs, int max_seq_len, int swa_slack, struct err *e);
void cli_engine_close(struct cli_engine *en);

/* The draft model of --model-draft (speculative decoding, ADR 0079): loaded, checked against
 * target (vocabulary, EOS ids, a cache that can step back), on the backend of `on`, its cache
 * holding max_seqs sequences of up to on's context (or the draft's own, if shorter) in
 * n_tokens slots plus drafting room. Errors name the flag and the path. */
struct cli_draft {
    struct model *m;
    struct cli_engine en;
    struct spec_model *sm;
    struct spec_mtp *mtp;    /* --spec mtp (cli_mtp_open) instead of sm */
};
int cli_draft_open(struct cli_draft *d, const char *path, const struct model *target, const struct cli_engine *on,
                   int n_tokens, int max_seqs, int draft_max, struct err *e);
void cli_draft_close(struct cli_draft *d);
/* --spec mtp (ADR 0108): the multi-token-prediction layer of the checkpoint in dir (target's),
 * on the backend of `on`, its cache following on's max_seqs sequences; errors say why the
 * checkpoint has none (the family, num_nextn_predict_layers, a missing tensor). */
int cli_mtp_open(struct cli_draft *d, const char *dir, const struct model *target, const struct cli_engine *on,
                 int n_tokens, int max_seqs, int draft_max, struct err *e);
/* Set p's drafter to d's (a draft model or an MTP layer), and check p. */
int cli_draft_use(const struct cli_draft *d, struct spec_params *p, struct err *e);

/* The values m's generation_config.json gave, checked against the bounds of the flags
 * that override them (sampler_bounds: the same rule for --temp and "temperature"):
 * -ERR_ARG naming the file, the key and the range otherwise. serve calls it once the
 * model is loaded, since any of them may become a request's default; generate checks
 * the same way only the values no flag replaces. */
int cli_check_generation_config(const struct model *m, struct err *e);

struct cJSON;
/* Parse len bytes of JSON the user gave (a file or a flag's value; `what` names it in
 * messages) into *out (any JSON value; the caller cJSON_Deletes it). The whole text must
 * be one value. A NUL character, as a raw byte or as \u0000 in a string, is refused
 * naming its byte offset: cJSON strings end at a NUL and chat templates render them, so it
 * would otherwise cut the message short without a word. */
int cli_parse_json(const char *buf, size_t len, const char *what, struct cJSON **out, struct err *e);
/* n bytes of s (NULs included) as a malloc'd JSON string literal with its quotes, for
 * cJSON_AddRawToObject / cJSON_CreateRaw where cJSON's own strings would stop at a NUL;
 * NULL when out of memory. */
char *cli_json_quote(const char *s, size_t n);

/* Print root to stdout and free it; bytes that are not UTF-8 (in names read from disk)
 * become \ufffd, so the output is always valid JSON. */
int cli_print_json(struct cJSON *root, struct err *e);

/* Standard output as a checked stream. Writes to stdout are buffered, so a full disk,
 * /dev/full or a closed descriptor shows only at a flush: cli_stdout_check flushes and
 * returns 0, or -ERR_IO with "writing standard output: <reason>" in e once any write
 * has failed. main() calls cli_stdout_close after every command (help and version
 * included), so no command exits 0 with output that was not written; commands that
 * stream (generate) or print before running on (serve) call cli_stdout_check to stop
 * early. */
int cli_stdout_check(struct err *e);
/* Flush and close stdout; as cli_stdout_check, also when only the close fails. */
int cli_stdout_close(struct err *e);

/* True when stderr is a terminal (progress output goes there only then). */
bool cli_stderr_is_tty(void);

/* Human-readable counts and sizes for tables: 1234567 -> "1.2M", 7340032 -> "7.0 MiB".
 * buf always receives a NUL-terminated string (truncated to cap). */
void cli_format_count(int64_t n, char *buf, size_t cap);
void cli_format_bytes(uint64_t n, char *buf, size_t cap);

/* The -q flag set of convert and synth (values as given, NULL when absent), resolved to
 * checked parameters: mode defaults fill what is not given (cmd_convert.c). */
struct cli_quant_flags {
    const char *bits, *group, *mode, *variant;
};
int cli_quant_resolve(const struct cli_quant_flags *f, struct quant_params *q, struct err *e);
bool cli_quant_flags_given(const struct cli_quant_flags *f);
/* Progress line on stderr ("\rWHAT:  45% (1.2 GiB of 2.7 GiB)"), for ck_progress_fn; the
 * caller installs it only when stderr is a terminal. ud: struct cli_progress_state. */
struct cli_progress_state {
    const char *what;
    int last_pct;  /* -1 before the first call */
};
void cli_progress(void *ud, uint64_t done, uint64_t total);
/* Ends a progress line cut short (by an error) so the next message starts on its own line. */
void cli_progress_end(const struct cli_progress_state *p);
