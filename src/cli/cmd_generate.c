/*
 * generate: `mlxcel generate [-m MODEL] (-p TEXT | --prompt-ids IDS) [-n N] ...`
 * Streams the continuation to stdout as it is produced (complete UTF-8
 * characters only), or with --output-ids prints the generated ids as one
 * JSON array. Sampling defaults come from the checkpoint's
 * generation_config.json; flags override them.
 *
 * Chat: when the checkpoint has a chat template (or --chat-template-file
 * gives one), the prompt text becomes the user message ([--system TEXT,]
 * user) of a conversation rendered with add_generation_prompt, and the
 * result is encoded without the post-processor's special tokens, exactly
 * as transformers' apply_chat_template(..., tokenize=True) does (special
 * tokens written by the template are recognised in the text). --no-chat
 * sends the prompt as is; --chat makes a missing template an error.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/log.h"
#include "../engine/generate.h"
#include "../models/vision.h"
#include "../template/template.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "cli_images.h"

static const char *k_help =
    "usage: mlxcel generate [-m MODEL] (-p TEXT | -f FILE | --prompt-ids IDS) [options]\n"
    "\n"
    "Generate a continuation of a prompt.\n"
    "\n"
    "  -m, --model MODEL      checkpoint folder or owner/name (default: the embedded model)\n"
    "  -p, --prompt TEXT      prompt text\n"
    "  -f, --file FILE        read the prompt from a file (- reads standard input)\n"
    "      --prompt-ids IDS   prompt as token ids: 1,2,3 (no tokenizer needed)\n"
    "      --image FILE       an image for the prompt (repeatable, up to 16): JPEG, PNG, WebP or\n"
    "                         GIF, through the checkpoint's image processor\n"
    "                         (preprocessor_config.json); each goes where the prompt has the\n"
    "                         model's image placeholder (<start_of_image> for Gemma 3, <image>\n"
    "                         for LLaVA), else all of them before the text, as the chat\n"
    "                         template places images\n"
    "      --pixel-values-out FILE  with --image: also write the processed pixel_values there\n"
    "                         (the safetensors file --pixel-values reads)\n"
    "      --image-embd-out FILE  with --image or --pixel-values: also write the images'\n"
    "                         embeddings (the projector's output: the rows their image tokens\n"
    "                         take), a safetensors file with an F32 tensor image_embeds [n, n_embd]\n"
    "      --pixel-values FILE  the prompt's images as processed pixel_values: a safetensors\n"
    "                         file with a tensor pixel_values [n, 3, S, S] (what transformers'\n"
    "                         processor returns); each image goes where the prompt has the\n"
    "                         model's start-of-image token (<start_of_image> for Gemma 3)\n"
    "      --chat             wrap the prompt in the model's chat template (error if it has none)\n"
    "      --no-chat          send the prompt as is (default: chat template when the model has one)\n"
    "      --system TEXT      system message for the chat template\n"
    "      --chat-template-file F  use this chat template instead of the model's\n"
    "  -n, --n-predict N      tokens to generate (default 128)\n"
    "      --temp T           temperature; 0 = greedy (default: generation_config.json, else 0)\n"
    "      --top-k K          keep the K most likely tokens (0 = off)\n"
    "      --top-p P          nucleus sampling mass (1 = off)\n"
    "      --min-p P          drop tokens below P x the top probability (0 = off)\n"
    "      --repeat-penalty R repetition penalty (1 = off)\n"
    "      --repeat-last-n N  tokens the penalty looks back over (default 64)\n"
    "      --seed S           RNG seed (default 1)\n"
    "  -t, --threads N        CPU threads (default: all online CPUs)\n"
    "  -c, --ctx-size, --ctx N  context size (default: the model's max_position_embeddings,\n"
    "                         x rope_scaling.factor for dynamic NTK rope); a prompt longer\n"
    "                         than it is an error unless --truncate\n"
    "      --truncate left|right  cut a prompt longer than the context to fit, leaving room\n"
    "                         for the -n tokens (at most half the context): the head (--keep)\n"
    "                         and the chat template's generation prompt stay, and of the rest\n"
    "                         left drops the oldest tokens, right the newest (as llama-server)\n"
    "      --keep N           with --truncate: prompt tokens at the start never cut (default:\n"
    "                         the chat template's system message and user header, else BOS)\n"
    "      --ignore-eos       keep generating past end-of-sequence tokens\n"
    CLI_LORA_HELP
    CLI_SPEC_HELP
    "      --spec-gate on|off drafting steps timed against plain ones now and then, and\n"
    "                         drafting paused while plain decoding is faster (default on)\n"
    "      --model-draft MODEL  the draft model of --spec draft (implies it): a smaller\n"
    "                         checkpoint with the same vocabulary (folder or owner/name)\n"
    "      --output-ids       print only the generated ids, as a JSON array\n"
    "      --stats            print prompt and generation tokens/s to stderr; with --image also\n"
    "                         the image preprocessing (decode + processor) and encode (vision\n"
    "                         tower + projector) times and the time to first token (both of\n"
    "                         them, the prompt's prefill and the first token's sampling)\n"
    "  -v, --verbose          log the backend, threads, load times and loading details to stderr\n"
    "  -h, --help             show this help\n";

enum {
    OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPPEN, OPT_REPN, OPT_SEED,
    OPT_IGNORE_EOS, OPT_STATS, OPT_PROMPT_IDS, OPT_OUTPUT_IDS, OPT_CHAT, OPT_NO_CHAT, OPT_SYSTEM,
    OPT_TEMPLATE_FILE, OPT_TRUNCATE, OPT_KEEP, OPT_SPEC, OPT_DRAFT_MAX, OPT_DRAFT_MIN, OPT_SPEC_GATE,
    OPT_MODEL_DRAFT, OPT_IMAGE, OPT_PIXEL_VALUES, OPT_PIXEL_VALUES_OUT, OPT_IMAGE_EMBD_OUT,
};

struct gen_cli {
    const char *model, *prompt, *prompt_file, *prompt_ids, *model_draft;
    const char *images[CLI_MAX_IMAGES];  /* --image, in order */
    int n_images;
    const char *pixel_values, *pixel_values_out;  /* --pixel-values, --pixel-values-out */
    const char *image_embd_out;                   /* --image-embd-out */
    const char *system, *template_file;
    int chat;  /* -1: when the model has a template, 0: never (--no-chat), 1: always (--chat) */
    long n_predict, threads, n_ctx;
    long keep;          /* --keep, -1 when not given */
    bool ignore_eos, stats, output_ids;
    enum gen_truncate truncate;
    bool has_temp, has_top_k, has_top_p, has_min_p, has_rep;
    struct sampler_params sp;
    struct spec_params spec;
    struct cli_lora lora;
};

/* Streaming output state passed to the token callback. */
struct sink {
    struct tok_stream ts;
    bool text;
    int32_t *ids;
    size_t n, cap;
    int failed;
    bool write_failed;  /* stdout could not be written: generation stops */
    int undecodable;   /* ids the tokenizer has no text for (model vocab > tokenizer vocab) */
    double t_first;    /* gen_now() at the first token, 0 before */
};

static int on_token(void *ud, int32_t id)
{
    struct sink *s = ud;
    if (s->n == 0)
        s->t_first = gen_now();
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 256;
        int32_t *v = realloc(s->ids, nc * sizeof *v);
        if (!v)
            return s->failed = 1;
        s->ids = v;
        s->cap = nc;
    }
    s->ids[s->n++] = id;
    if (s->text) {
        char buf[TOK_STREAM_CAP];
        int w = tok_stream_push(&s->ts, id, buf, sizeof buf, NULL);
        if (w > 0) {
            fwrite(buf, 1, (size_t)w, stdout);
            if (cli_stdout_check(NULL) < 0)
                return s->write_failed = true;  /* no use computing what cannot be shown */
        } else if (w < 0) {
            s->undecodable++;
        }
    }
    return 0;
}

/* A sampling flag, within the one bounds table the generation config is checked against too.
 * Integer fields (top-k, repeat-last-n) parse as integers. */
static int parse_sampling(enum sampler_field f, const char *arg, double *out, struct err *e)
{
    const struct sampler_bound *b = &sampler_bounds[f];
    long l = 0;
    if (f != SAMPLER_TOP_K && f != SAMPLER_REPEAT_LAST_N)
        return cli_parse_float(b->flag, arg, b->lo, b->hi, out, e);
    int rc = cli_parse_int(b->flag, arg, (long)b->lo, (long)b->hi, &l, e);
    *out = (double)l;
    return rc;
}

static int parse_args(int argc, char **argv, struct gen_cli *o, struct err *e)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'}, {"n-predict", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'}, {"ctx", required_argument, 0, 'c'},
        {"ctx-size", required_argument, 0, 'c'}, {"keep", required_argument, 0, OPT_KEEP},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'},
        {"temp", required_argument, 0, OPT_TEMP}, {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP}, {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REPPEN},
        {"repeat-last-n", required_argument, 0, OPT_REPN}, {"seed", required_argument, 0, OPT_SEED},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS}, {"stats", no_argument, 0, OPT_STATS},
        {"prompt-ids", required_argument, 0, OPT_PROMPT_IDS},
        {"output-ids", no_argument, 0, OPT_OUTPUT_IDS}, {"chat", no_argument, 0, OPT_CHAT},
        {"no-chat", no_argument, 0, OPT_NO_CHAT}, {"system", required_argument, 0, OPT_SYSTEM},
        {"chat-template-file", required_argument, 0, OPT_TEMPLATE_FILE},
        {"truncate", required_argument, 0, OPT_TRUNCATE}, {"spec", required_argument, 0, OPT_SPEC},
        {"draft-max", required_argument, 0, OPT_DRAFT_MAX}, {"draft-min", required_argument, 0, OPT_DRAFT_MIN},
        {"spec-gate", required_argument, 0, OPT_SPEC_GATE},
        {"model-draft", required_argument, 0, OPT_MODEL_DRAFT},
        {"image", required_argument, 0, OPT_IMAGE}, {"pixel-values", required_argument, 0, OPT_PIXEL_VALUES},
        {"pixel-values-out", required_argument, 0, OPT_PIXEL_VALUES_OUT},
        {"image-embd-out", required_argument, 0, OPT_IMAGE_EMBD_OUT},
        CLI_LORA_OPTIONS,
        {0, 0, 0, 0},
    };
    int c, rc = 0;
    long l;
    double d;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, ":m:p:f:n:t:c:vh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'f': o->prompt_file = optarg; break;
        case 'n': rc = cli_parse_int("-n", optarg, 0, 1 << 24, &o->n_predict, e); break;
        case 't': rc = cli_parse_int("--threads", optarg, 1, 1024, &o->threads, e); break;
        case 'c': rc = cli_parse_int("--ctx-size", optarg, 1, 1 << 24, &o->n_ctx, e); break;
        case OPT_KEEP: rc = cli_parse_int("--keep", optarg, 0, 1 << 24, &o->keep, e); break;
        case 'v': log_set_level(LOG_LEVEL_INFO); break;
        case 'h': cli_help(k_help, CLI_GLOBAL_ALL); return 1;
        case OPT_TEMP:
            rc = parse_sampling(SAMPLER_TEMPERATURE, optarg, &d, e);
            o->sp.temperature = (float)d;
            o->has_temp = true;
            break;
        case OPT_TOPK:
            rc = parse_sampling(SAMPLER_TOP_K, optarg, &d, e);
            o->sp.top_k = (int)d;
            o->has_top_k = true;
            break;
        case OPT_TOPP:
            rc = parse_sampling(SAMPLER_TOP_P, optarg, &d, e);
            o->sp.top_p = (float)d;
            o->has_top_p = true;
            break;
        case OPT_MINP:
            rc = parse_sampling(SAMPLER_MIN_P, optarg, &d, e);
            o->sp.min_p = (float)d;
            o->has_min_p = true;
            break;
        case OPT_REPPEN:
            rc = parse_sampling(SAMPLER_REPEAT_PENALTY, optarg, &d, e);
            o->sp.repeat_penalty = (float)d;
            o->has_rep = true;
            break;
        case OPT_REPN:
            rc = parse_sampling(SAMPLER_REPEAT_LAST_N, optarg, &d, e);
            o->sp.repeat_last_n = (int)d;
            break;
        case OPT_SEED:
            rc = cli_parse_int("--seed", optarg, 0, 0x7fffffffL, &l, e);
            o->sp.seed = (uint64_t)l;
            break;
        case OPT_IGNORE_EOS: o->ignore_eos = true; break;
        case OPT_STATS: o->stats = true; break;
        case OPT_PROMPT_IDS: o->prompt_ids = optarg; break;
        case OPT_OUTPUT_IDS: o->output_ids = true; break;
        case OPT_CHAT: o->chat = 1; break;
        case OPT_NO_CHAT: o->chat = 0; break;
        case OPT_SYSTEM: o->system = optarg; break;
        case OPT_TEMPLATE_FILE: o->template_file = optarg; break;
        case OPT_TRUNCATE:
            if (strcmp(optarg, "left") == 0)
                o->truncate = GEN_TRUNCATE_LEFT;
            else if (strcmp(optarg, "right") == 0)
                o->truncate = GEN_TRUNCATE_RIGHT;
            else
                rc = err_setf(e, ERR_ARG, "--truncate: '%s' is not left or right", optarg);
            break;
        case OPT_SPEC: rc = cli_spec_flag("spec", optarg, &o->spec, e); break;
        case OPT_DRAFT_MAX: rc = cli_spec_flag("draft-max", optarg, &o->spec, e); break;
        case OPT_DRAFT_MIN: rc = cli_spec_flag("draft-min", optarg, &o->spec, e); break;
        case OPT_SPEC_GATE: rc = cli_spec_flag("spec-gate", optarg, &o->spec, e); break;
        case OPT_MODEL_DRAFT: o->model_draft = optarg; break;
        case OPT_IMAGE:
            if (o->n_images == CLI_MAX_IMAGES)
                rc = err_setf(e, ERR_ARG, "--image: at most %d images", CLI_MAX_IMAGES);
            else
                o->images[o->n_images++] = optarg;
            break;
        case OPT_PIXEL_VALUES_OUT: o->pixel_values_out = optarg; break;
        case OPT_IMAGE_EMBD_OUT: o->image_embd_out = optarg; break;
        case OPT_PIXEL_VALUES: o->pixel_values = optarg; break;
        case CLI_OPT_LORA:
        case CLI_OPT_LORA_SCALED:
        case CLI_OPT_LORA_NO_APPLY: rc = cli_lora_flag(&o->lora, c, optarg, argc, argv, e); break;
        case ':': return err_setf(e, ERR_ARG, "option %s needs a value", argv[optind - 1]);
        default: return err_setf(e, ERR_ARG, "unknown option %s", argv[optind - 1]);
        }
    }
    if (rc < 0)
        return rc;
    if (optind < argc)
        return err_setf(e, ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (!!o->prompt + !!o->prompt_file + !!o->prompt_ids != 1)
        return err_setf(e, ERR_ARG, "give exactly one of -p, -f or --prompt-ids");
    bool chat_opts = o->chat == 1 || o->system || o->template_file;
    if (o->prompt_ids && chat_opts)
        return err_setf(e, ERR_ARG, "--chat, --system and --chat-template-file need a text prompt, not --prompt-ids");
    if (o->chat == 0 && chat_opts)
        return err_setf(e, ERR_ARG, "--no-chat contradicts --chat, --system and --chat-template-file");
    if (o->system || o->template_file)
        o->chat = 1;
    if (o->n_images && o->pixel_values)
        return err_setf(e, ERR_ARG, "--image and --pixel-values both give the prompt's images: use one");
    if (o->pixel_values_out && !o->n_images)
        return err_setf(e, ERR_ARG, "--pixel-values-out writes the pixels of --image: give --image FILE");
    if (o->image_embd_out && !o->n_images && !o->pixel_values)
        return err_setf(e, ERR_ARG, "--image-embd-out writes the images' embeddings: give --image or --pixel-values");
    return 0;
}

/* One generation_config.json value (NaN: absent) unless its flag was given, checked against
 * the same bounds as the flag (cli_check_generation_config's rule; a value a flag replaces is
 * not used, so not checked). src names the file. */
static int gen_default(bool has_flag, enum sampler_field f, double v, const char *src, double *out,
                       struct err *e)
{
    if (has_flag || isnan(v))
        return 0;
    int rc = sampler_bound_check(f, v, src, e);
    if (rc < 0)
        return rc;
    *out = v;
    return 0;
}

/* Flags override the checkpoint's generation_config.json. */
static int apply_defaults(struct gen_cli *o, const struct model *m, struct err *e)
{
    const struct generation_defaults *g = &m->gen;
    double t = o->sp.temperature, k = o->sp.top_k, p = o->sp.top_p, mp = o->sp.min_p,
           r = o->sp.repeat_penalty;
    char src[4200];
    int rc;
    snprintf(src, sizeof src, "%s/generation_config.json", m->dir);
    if ((rc = gen_default(o->has_temp, SAMPLER_TEMPERATURE, g->temperature, src, &t, e)) < 0 ||
        (rc = gen_default(o->has_top_k, SAMPLER_TOP_K, g->top_k == GEN_TOP_K_ABSENT ? NAN : g->top_k, src, &k,
                          e)) < 0 ||
        (rc = gen_default(o->has_top_p, SAMPLER_TOP_P, g->top_p, src, &p, e)) < 0 ||
        (rc = gen_default(o->has_min_p, SAMPLER_MIN_P, g->min_p, src, &mp, e)) < 0 ||
        (rc = gen_default(o->has_rep, SAMPLER_REPEAT_PENALTY, g->repeat_penalty, src, &r, e)) < 0)
        return rc;
    o->sp.temperature = (float)t;
    o->sp.top_k = (int)k;
    o->sp.top_p = (float)p;
    o->sp.min_p = (float)mp;
    o->sp.repeat_penalty = (float)r;
    return 0;
}

/* The chat prompt for text: [system,] user rendered by the template, add_generation_prompt. */
static int render_chat(const struct gen_cli *o, const struct chat_tmpl *ct, const char *text, size_t len,
                       int n_images, char **out, size_t *out_len, struct err *e)
{
    cJSON *msgs = cJSON_CreateArray(), *m;
    char *content = malloc(len + 1);
    bool ok = msgs && content;
    if (ok) {
        memcpy(content, text, len);
        content[len] = 0;
    }
    if (ok && o->system)
        ok = (m = cJSON_CreateObject()) && cJSON_AddItemToArray(msgs, m) &&
             cJSON_AddStringToObject(m, "role", "system") && cJSON_AddStringToObject(m, "content", o->system);
    ok = ok && (m = cJSON_CreateObject()) && cJSON_AddItemToArray(msgs, m) &&
         cJSON_AddStringToObject(m, "role", "user");
    if (ok && n_images > 0) {
        /* transformers' typed content: the images, then the text (the template writes each
         * image's placeholder) */
        cJSON *parts = cJSON_AddArrayToObject(m, "content"), *p;
        ok = parts != NULL;
        for (int i = 0; ok && i <= n_images; i++)
            ok = (p = cJSON_CreateObject()) && cJSON_AddItemToArray(parts, p) &&
                 cJSON_AddStringToObject(p, "type", i < n_images ? "image" : "text") &&
                 (i < n_images || cJSON_AddStringToObject(p, "text", content));
    } else {
        ok = ok && cJSON_AddStringToObject(m, "content", content);
    }
    free(content);
    int rc = ok ? chat_tmpl_apply(ct, msgs, true, NULL, out, out_len, e) : err_setf(e, ERR_NOMEM, "out of memory");
    cJSON_Delete(msgs);
    return rc;
}

/* Tokens of text[0, len) encoded without special tokens; 0 when it does not encode. */
static int count_tokens(const struct tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (len == 0 || tok_encode(tok, text, len, false, &ids, &n, NULL) < 0)
        n = 0;
    free(ids);
    return (int)n;
}

/* The parts of a rendered chat prompt that --truncate keeps: the tokens before the user's
 * text (BOS, system message, user header) and after it (end of turn, generation prompt).
 * The text is found as rendered; when the template changed it, nothing is kept. */
static void chat_keep(const struct tokenizer *tok, const char *chat, size_t chat_len, const char *user,
                      size_t user_len, int *head, int *tail)
{
    const char *at = NULL;
    /* the last occurrence (the user's text follows any system message), searched from the
     * end: the template's tail is short, so this takes a few comparisons */
    for (size_t i = chat_len >= user_len && user_len > 0 ? chat_len - user_len + 1 : 0; i-- > 0;) {
        if (memcmp(chat + i, user, user_len) == 0) {
            at = chat + i;
            break;
        }
    }
    *head = *tail = 0;
    if (!at)
        return;
    *head = count_tokens(tok, chat, (size_t)(at - chat));
    *tail = count_tokens(tok, at + user_len, chat_len - (size_t)(at - chat) - user_len);
}

/* Whether text[0, len) holds the NUL-terminated needle. */
static bool contains(const char *text, size_t len, const char *needle)
{
    size_t nb = strlen(needle);
    for (size_t i = 0; nb && i + nb <= len; i++)
        if (memcmp(text + i, needle, nb) == 0)
            return true;
    return false;
}

/* Prompt ids: --prompt-ids as given, else the text (-p / -f) through the chat
 * template when one applies (encoded without special tokens), else the text
 * encoded with the tokenizer's special tokens. *head / *tail: what --truncate keeps by
 * default (chat_keep; else the BOS token when the prompt starts with it). */
static int encode_prompt(const struct gen_cli *o, const char *dir, const struct tokenizer *tok,
                         const struct image_input *img, int32_t **ids, size_t *n, int *head, int *tail,
                         struct err *e)
{
    *head = *tail = 0;
    if (o->prompt_ids)
        return cli_parse_ids(o->prompt_ids, ids, n, e);
    char *text = NULL, *chat = NULL, *sub = NULL, *pre = NULL;
    size_t len, chat_len = 0;
    struct chat_tmpl *ct = NULL;
    int rc;
    if (o->prompt_file) {
        if ((rc = cli_read_input(o->prompt_file, 64u << 20, &text, &len, e)) < 0)
            return rc;
    }
    const char *t = text ? text : o->prompt;
    len = text ? len : strlen(t);
    if (o->chat != 0) {
        rc = chat_tmpl_load(&ct, dir, o->template_file, e);
        if (rc == -ERR_MISSING && o->chat < 0) {
            rc = 0;  /* no template: the prompt goes as is */
        } else if (rc < 0) {
            if (o->chat < 0)
                err_prefix(e, "chat template (use --no-chat to send the prompt as is)");
            goto out;
        } else if (memchr(t, '\0', len)) {
            /* transformers keeps a NUL (a Python str carries it), but chat templates render
             * NUL-terminated strings here: refuse rather than cut the prompt at it */
            rc = err_setf(e, ERR_ARG, "the prompt holds a NUL byte at byte %zu, which a chat template "
                          "cannot carry (--no-chat encodes the text as it is, NUL included)",
                          (size_t)((const char *)memchr(t, '\0', len) - t));
            goto out;
        } else if ((rc = render_chat(o, ct, t, len, img && !contains(t, len, img->su->placeholder) ?
                                     img->n_added : 0, &chat, &chat_len, e)) < 0) {
            goto out;
        } else {
            LOG_INFO("chat template applied: %zu bytes of prompt text", chat_len);
        }
    }
    /* what is encoded: the rendered chat (without special tokens: the template wrote them),
     * else the text as it is (with them) */
    bool templated = chat != NULL;
    const char *src = templated ? chat : t;
    size_t src_len = templated ? chat_len : len;
    if (img && !templated && !contains(t, len, img->su->placeholder)) {
        /* no template and no placeholder: the images go before the text */
        size_t nb = strlen(img->su->bare), n_pre = nb * (size_t)img->n_added;
        if (!(pre = malloc(n_pre + len + 1))) {
            rc = err_setf(e, ERR_NOMEM, "out of memory for the prompt");
            goto out;
        }
        for (int i = 0; i < img->n_added; i++)
            memcpy(pre + nb * (size_t)i, img->su->bare, nb);
        memcpy(pre + n_pre, t, len);
        pre[n_pre + len] = 0;
        src = pre;
        src_len = n_pre + len;
    }
    if (img) {
        /* as transformers' processor: each placeholder replaced by its image's text, then the
         * whole prompt tokenized */
        if ((rc = image_input_substitute(img, src, src_len, &sub, &src_len, e)) < 0)
            goto out;
        src = sub;
    }
    rc = tok_encode(tok, src, src_len, !templated, ids, n, e);
    if (rc == 0 && templated && o->truncate != GEN_TRUNCATE_OFF)
        chat_keep(tok, src, src_len, t, len, head, tail);
    else if (rc == 0 && *n > 0 && (*ids)[0] == tok_bos_id(tok))
        *head = 1;
out:
    chat_tmpl_free(ct);
    free(chat);
    free(sub);
    free(pre);
    free(text);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    struct gen_cli o = {.n_predict = 128, .threads = 0, .chat = -1, .keep = -1};
    struct err e = {0};
    char dir[4096];
    struct tokenizer *tok = NULL;
    struct model *m = NULL;
    struct cli_engine en = {0};
    struct sink sink = {0};
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    float *pixels = NULL;
    int n_img = 0;
    struct cli_images imgs = {0};
    struct cli_image_input input = {0};
    struct gen_stats st;
    struct cli_draft draft = {0};
    int rc, status = CLI_EXIT_ERROR;

    sampler_params_default(&o.sp);
    spec_params_default(&o.spec);
    o.sp.seed = 1;
    rc = parse_args(argc, argv, &o, &e);
    if (rc == 0 && o.model_draft && (o.spec.mode == SPEC_NGRAM || o.spec.mode == SPEC_MTP))
        rc = err_setf(&e, ERR_ARG, "--model-draft drafts with a model: it does not go with --spec %s",
                      o.spec.mode == SPEC_NGRAM ? "ngram" : "mtp");
    if (rc == 0 && o.spec.mode == SPEC_DRAFT && !o.model_draft)
        rc = err_setf(&e, ERR_ARG, "--spec draft needs a draft model (--model-draft)");
    if (rc == 0 && o.model_draft)
        o.spec.mode = SPEC_DRAFT;
    if (rc == 0 && o.spec.mode == SPEC_NGRAM)
        rc = spec_params_check(&o.spec, &e);
    if (rc > 0)
        return CLI_EXIT_OK;
    if (rc < 0)
        return cli_usage_error("generate", "%s", e.msg);

    if ((rc = cli_resolve_model(o.model, dir, sizeof dir, &e)) < 0)
        goto fail;
    bool need_tok = !o.prompt_ids || !o.output_ids;
    if (need_tok && (rc = tok_load(&tok, dir, &e)) < 0) {
        if (o.prompt_ids)
            err_prefix(&e, "decoding output needs a tokenizer (use --output-ids for raw ids)");
        cli_hint_partial(dir, &e);
        goto fail;
    }
    int keep_head, keep_tail;
    /* --stats with --image: wall times of the image phases (s); ttft counts from t_pre0 */
    double t_pre0 = 0, t_pre = 0, t_enc = 0, t_gen0 = 0;
    /* --image: the model first (its tower and tokens say what the images become) */
    if (o.n_images && (rc = cli_model_load(&m, dir, &e)) < 0)
        goto fail;
    t_pre0 = gen_now();
    if (o.n_images && (rc = cli_image_input_load(&input, dir, m, tok, o.images, o.n_images, &e)) < 0)
        goto fail;
    t_pre = gen_now() - t_pre0;
    if (input.in.n_img && o.pixel_values_out &&
        (rc = cli_pixel_values_write(o.pixel_values_out, m, input.in.pixels, input.in.n_img, &e)) < 0)
        goto fail;
    if ((rc = encode_prompt(&o, dir, tok, o.n_images && !o.prompt_ids ? &input.in : NULL, &prompt, &n_prompt,
                            &keep_head, &keep_tail, &e)) < 0)
        goto fail;
    if (n_prompt == 0) {
        err_setf(&e, ERR_ARG, "the prompt encodes to no tokens");
        goto fail;
    }
    if (!m && (rc = cli_model_load(&m, dir, &e)) < 0)
        goto fail;
    if ((rc = apply_defaults(&o, m, &e)) < 0)
        goto fail;
    /* the images' places in the prompt before the cache is sized for it (ADR 0087) */
    if (o.pixel_values && (rc = cli_pixel_values_read(o.pixel_values, m, &pixels, &n_img, &e)) < 0)
        goto fail;
    /* images of their own size (Qwen) stay in input: the text substitution expanded them */
    bool grid_images = m->vision && m->vision->info.merge > 0;
    if (input.in.n_img && !grid_images) {
        pixels = input.in.pixels;  /* taken */
        input.in.pixels = NULL;
        n_img = input.in.n_img;
    }
    if (n_img && (rc = cli_images_expand(m, &prompt, &n_prompt, n_img, &e)) < 0)
        goto fail;
    /* one sequence: the cache holds what this run can reach; the engine checks the
     * context (--ctx, else the model's default, which for dynamic NTK rope reaches past
     * max_position_embeddings; kv_cache_new refuses one above the model's limit) */
    long max_len = o.n_ctx > 0 ? o.n_ctx : hparams_ctx_default(&m->hp);
    long slots = (long)n_prompt + o.n_predict < max_len ? (long)n_prompt + o.n_predict : max_len;
    if ((rc = cli_engine_open(&en, m, o.threads, (int)slots, 1, (int)max_len,
                              o.spec.mode != SPEC_NONE ? o.spec.draft_max : 0, &e)) < 0 ||
        (rc = cli_lora_attach(&o.lora, m, &en, &e)) < 0)
        goto fail;
    if (o.model_draft && (rc = cli_draft_open(&draft, o.model_draft, m, &en, (int)slots, 1, o.spec.draft_max, &e)) < 0)
        goto fail;
    if (o.spec.mode == SPEC_MTP && (rc = cli_mtp_open(&draft, dir, m, &en, (int)slots, 1, o.spec.draft_max, &e)) < 0)
        goto fail;
    if ((draft.sm || draft.mtp) && (rc = cli_draft_use(&draft, &o.spec, &e)) < 0)
        goto fail;

    double t_enc0 = gen_now();  /* the encoders synchronize the backend before they return */
    if (n_img > 0 && (rc = cli_images_encode(&imgs, m, en.be, prompt, n_prompt, pixels, n_img, &e)) < 0)
        goto fail;
    if (grid_images && input.in.n_img > 0 &&
        (rc = cli_images_encode_input(&imgs, m, en.be, prompt, n_prompt, &input.in, &e)) < 0)
        goto fail;
    t_enc = gen_now() - t_enc0;
    if (o.image_embd_out && (rc = cli_image_embeds_write(o.image_embd_out, m, &imgs, &e)) < 0)
        goto fail;
    sink.text = !o.output_ids;
    if (tok)
        tok_stream_init(&sink.ts, tok, true);
    struct gen_params gp = {.n_predict = (int)o.n_predict, .ignore_eos = o.ignore_eos,
                            .truncate = o.truncate, .n_keep = o.keep >= 0 ? (int)o.keep : keep_head,
                            .n_keep_tail = keep_tail, .sampling = o.sp, .spec = o.spec,
                            .images = imgs.n ? imgs.img : NULL, .n_images = imgs.n};
    t_gen0 = gen_now();
    rc = generate(en.ctx, en.kv, 0, prompt, (int)n_prompt, &gp, on_token, &sink, &st, &e);
    if (st.n_dropped > 0) {
        /* the protected head and tail, named only when there is one: "(the oldest, keeping the
         * first 3 and the last 5)", "(the oldest, keeping the first 3)", "(the newest)" */
        int head = gp.n_keep < st.n_prompt ? gp.n_keep : st.n_prompt;
        int tail = gp.n_keep_tail < st.n_prompt - gp.n_keep ? gp.n_keep_tail : 0;
        char kept[96] = "";
        if (head > 0 && tail > 0)
            snprintf(kept, sizeof kept, ", keeping the first %d and the last %d", head, tail);
        else if (head > 0 || tail > 0)
            snprintf(kept, sizeof kept, ", keeping the %s %d", head > 0 ? "first" : "last", head > 0 ? head : tail);
        fprintf(stderr, "mlxcel generate: truncated the prompt: dropped %d of %zu tokens (%s%s) to fit the context "
                "of %d with room for %ld to generate\n", st.n_dropped, n_prompt,
                o.truncate == GEN_TRUNCATE_LEFT ? "the oldest" : "the newest", kept, en.kv->max_seq_len,
                (long)(en.kv->max_seq_len - st.n_prompt));
    }
    if (rc == -ERR_RANGE && strstr(e.msg, "context overflow")) {
        /* what to do about it: a larger context where the model allows one, or a cut prompt */
        char msg[sizeof e.msg];
        int limit = hparams_ctx_limit(&m->hp);
        snprintf(msg, sizeof msg, "%s", e.msg);
        if (en.kv->max_seq_len < limit)
            err_setf(&e, ERR_RANGE, "%s; use --ctx-size N (up to %d for this model) or --truncate left", msg, limit);
        else
            err_setf(&e, ERR_RANGE, "%s (the model's limit); use --truncate left to cut the prompt", msg);
    }
    if (rc < 0)
        goto fail;
    if (sink.failed) {
        err_setf(&e, ERR_NOMEM, "out of memory collecting output");
        goto fail;
    }
    if (sink.write_failed) {
        cli_stdout_check(&e);
        goto fail;
    }
    if (o.output_ids) {
        fputc('[', stdout);
        for (size_t i = 0; i < sink.n; i++)
            printf("%s%d", i ? ", " : "", sink.ids[i]);
        fputs("]\n", stdout);
    } else {
        char buf[TOK_STREAM_CAP];
        int w = tok_stream_flush(&sink.ts, buf, sizeof buf);
        if (w > 0)
            fwrite(buf, 1, (size_t)w, stdout);
        fputc('\n', stdout);
    }
    if (sink.undecodable)
        fprintf(stderr, "mlxcel generate: warning: %d generated ids have no text in the tokenizer\n",
                sink.undecodable);
    if (st.stop == GEN_STOP_CONTEXT)
        fprintf(stderr, "mlxcel generate: stopped: the context of %d tokens is full\n",
                en.kv->max_seq_len);
    if (st.spec_off)
        fprintf(stderr, "mlxcel generate: --spec: this model decodes without speculation (its rope follows the "
                "sequence's length: dynamic NTK or LongRoPE)\n");
    if (o.stats && gp.spec.mode != SPEC_NONE && !st.spec_off)
        fprintf(stderr, "speculative: %d tokens drafted, %d accepted (%.1f %%)\n", st.n_drafted, st.n_accepted,
                st.n_drafted ? 100.0 * st.n_accepted / st.n_drafted : 0.0);
    if (o.stats)
        fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s)\ngeneration: %d tokens in %.3f s (%.1f tok/s)\n",
                st.n_prompt, st.t_prompt_s, st.t_prompt_s > 0 ? st.n_prompt / st.t_prompt_s : 0.0,
                st.n_gen, st.t_gen_s, st.t_gen_s > 0 ? st.n_gen / st.t_gen_s : 0.0);
    if (o.stats && imgs.n > 0) {
        /* as llama-mtmd-cli's "image slice encoded in" and its prompt eval: the image's phases
         * apart, and the time to first token from the image file to the first sampled token
         * (setting up the KV cache, between the phases, left out; no first token with -n 0) */
        int n_img_tok = 0;
        for (int i = 0; i < imgs.n; i++)
            n_img_tok += imgs.img[i].n_tok;
        fprintf(stderr, "image: %d image%s, %d tokens; preprocess %.2f ms, encode %.2f ms\n", imgs.n,
                imgs.n == 1 ? "" : "s", n_img_tok, 1e3 * t_pre, 1e3 * t_enc);
        if (sink.n > 0)
            fprintf(stderr, "time to first token: %.2f ms (preprocess + encode + prefill of %d tokens + "
                    "first token)\n", 1e3 * (t_pre + t_enc + (sink.t_first - t_gen0)), st.n_prompt);
    }
    status = CLI_EXIT_OK;
fail:
    if (status != CLI_EXIT_OK)
        cli_fail("generate", &e);
    free(sink.ids);
    free(prompt);
    free(pixels);
    cli_images_free(&imgs);
    cli_image_input_free(&input);
    cli_draft_close(&draft);
    cli_engine_close(&en);
    cli_lora_free(&o.lora);
    model_free(m);
    tok_free(tok);
    return status;
}
