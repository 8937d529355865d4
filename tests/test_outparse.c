/*
 * outparse: tool calls and reasoning split out of generated text. Every case
 * is fed whole, byte by byte, in fixed chunks and in random splits, and must
 * give the same events (TEXT/REASONING deltas merged, calls with the same ids
 * for the same id_seed). Model outputs are the exact syntax the fixtures'
 * chat templates render for an assistant turn with tool_calls (Qwen3 from
 * tests/fixtures/tokenizers/qwen3, Llama 3.1 and Mistral v3 from
 * tests/fixtures/templates/, rendered here and cut after the generation
 * prompt), plus hand-written malformed ones: truncated, unknown names, bad
 * arguments, oversized blocks, all of which must come back as the text they
 * were.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/outparse.h"
#include "template/template.h"
#include "test.h"

/* ---- recording events ---- */

struct sb {
    char *s;
    size_t len, cap;
};

static void sb_add(struct sb *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

static void sb_str(struct sb *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

/* ser: "T<text>R<reasoning>C<name|args>" with consecutive deltas merged; full: the
 * same plus each call's id, index and raw block; text: TEXT deltas alone. */
struct rec {
    struct sb ser, full, text, raws;
    int last;          /* kind of the open TEXT/REASONING segment, -1 none */
    int n_calls;
    char ids[OUTPARSE_MAX_CALLS + 1][40];
    int stop_at;       /* return 1 from this event on (0: never) */
    int n_events;
};

static void rec_close(struct rec *r)
{
    if (r->last >= 0) {
        sb_str(&r->ser, ">");
        sb_str(&r->full, ">");
    }
    r->last = -1;
}

static int on_event(void *ud, const struct outparse_event *ev)
{
    struct rec *r = ud;
    if (r->stop_at && ++r->n_events >= r->stop_at)
        return 1;
    assert_true(ev->kind == OUTPARSE_TOOL_CALL || ev->len > 0);  /* no empty deltas */
    if (ev->kind != OUTPARSE_TOOL_CALL) {
        if (r->last != (int)ev->kind) {
            rec_close(r);
            const char *open = ev->kind == OUTPARSE_TEXT ? "T<" : "R<";
            sb_str(&r->ser, open);
            sb_str(&r->full, open);
            r->last = (int)ev->kind;
        }
        sb_add(&r->ser, ev->text, ev->len);
        sb_add(&r->full, ev->text, ev->len);
        if (ev->kind == OUTPARSE_TEXT)
            sb_add(&r->text, ev->text, ev->len);
        return 0;
    }
    rec_close(r);
    assert_int_equal(ev->index, r->n_calls);
    assert_int_equal(strlen(ev->text), ev->len);
    char buf[64];
    sb_str(&r->ser, "C<");
    sb_str(&r->ser, ev->name);
    sb_str(&r->ser, "|");
    sb_add(&r->ser, ev->text, ev->len);
    sb_str(&r->ser, ">");
    snprintf(buf, sizeof buf, "C<%s|%d|", ev->id, ev->index);
    sb_str(&r->full, buf);
    sb_str(&r->full, ev->name);
    sb_str(&r->full, "|");
    sb_add(&r->full, ev->text, ev->len);
    sb_str(&r->full, "|");
    sb_add(&r->full, ev->raw, ev->raw_len);
    sb_str(&r->full, ">");
    sb_add(&r->raws, ev->raw, ev->raw_len);
    if (r->n_calls < OUTPARSE_MAX_CALLS + 1)
        snprintf(r->ids[r->n_calls], sizeof r->ids[0], "%s", ev->id);
    r->n_calls++;
    return 0;
}

static void rec_free(struct rec *r)
{
    free(r->ser.s);
    free(r->full.s);
    free(r->text.s);
    free(r->raws.s);
}

/* Length of the next chunk in split mode m: 0 whole, 1 bytes, 2..5 fixed sizes,
 * >= 6 random 1..17 bytes. */
#define N_MODES 16
static size_t chunk_len(int m, size_t left, uint64_t *rng)
{
    static const size_t k_fixed[] = {2, 3, 5, 13};
    size_t n = left;
    if (m == 1)
        n = 1;
    else if (m >= 2 && m <= 5)
        n = k_fixed[m - 2];
    else if (m >= 6) {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        n = 1 + (size_t)(*rng % 17);
    }
    return n < left ? n : left;
}

static void run_mode(const struct outparse_opts *o, const char *in, size_t n, int m, struct rec *r)
{
    struct outparse *p = NULL;
    struct err e = {0};
    memset(r, 0, sizeof *r);
    r->last = -1;
    assert_int_equal(outparse_new(&p, o, &e), 0);
    uint64_t rng = 0x1234567ULL + (uint64_t)m;
    for (size_t at = 0; at < n;) {
        size_t c = chunk_len(m, n - at, &rng);
        assert_int_equal(outparse_feed(p, in + at, c, on_event, r), 0);
        at += c;
    }
    assert_int_equal(outparse_finish(p, on_event, r), 0);
    rec_close(r);
    outparse_free(p);
}

/* Parse in under every split; each must give want (ser) and the same full record.
 * The whole-feed record is left in *out when out is not NULL. */
static void check_n(const struct outparse_opts *o, const char *in, size_t n, const char *want, struct rec *out)
{
    struct rec base, r;
    run_mode(o, in, n, 0, &base);
    if (want && strcmp(base.ser.s ? base.ser.s : "", want) != 0)
        fail_msg("input '%.200s'\n got '%s'\nwant '%s'", in, base.ser.s ? base.ser.s : "", want);
    for (int m = 1; m < N_MODES; m++) {
        run_mode(o, in, n, m, &r);
        if (strcmp(base.full.s ? base.full.s : "", r.full.s ? r.full.s : "") != 0)
            fail_msg("split mode %d of '%.200s'\n got '%s'\nwant '%s'", m, in, r.full.s, base.full.s);
        rec_free(&r);
    }
    if (out)
        *out = base;
    else
        rec_free(&base);
}

static void check(const struct outparse_opts *o, const char *in, const char *want)
{
    check_n(o, in, strlen(in), want, NULL);
}

static struct outparse_opts opts(enum outparse_format f, bool reasoning, const cJSON *tools)
{
    return (struct outparse_opts){.format = f, .reasoning = reasoning, .tools = tools, .id_seed = 42};
}

static const char k_tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": {\"type\": \"object\"}}}]";

/* ---- outputs rendered by the real templates ---- */

/* The assistant turn the template renders for msgs' last message: the render of
 * the whole conversation minus the render of all but the last with the generation
 * prompt, minus the end-of-turn string eot. Owned by the caller. */
static char *rendered_turn(const char *dir, const char *override, const char *msgs_json, const char *eot)
{
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    if (chat_tmpl_load(&ct, test_path(dir), override ? test_path(override) : NULL, &e) < 0)
        fail_msg("load %s: %s", dir, e.msg);
    cJSON *all = cJSON_Parse(msgs_json), *tools = cJSON_Parse(k_tools), *extra = cJSON_CreateObject();
    assert_non_null(all);
    cJSON_AddItemToObject(extra, "tools", tools);
    cJSON *head = cJSON_Duplicate(all, 1);
    cJSON_DeleteItemFromArray(head, cJSON_GetArraySize(head) - 1);
    char *full = NULL, *prompt = NULL;
    size_t fl = 0, pl = 0;
    if (chat_tmpl_apply(ct, all, false, extra, &full, &fl, &e) < 0 ||
        chat_tmpl_apply(ct, head, true, extra, &prompt, &pl, &e) < 0)
        fail_msg("render %s: %s", dir, e.msg);
    if (fl < pl || memcmp(full, prompt, pl) != 0)
        fail_msg("%s: the conversation does not extend the prompt:\n%s\n---\n%s", dir, prompt, full);
    size_t el = strlen(eot);
    assert_true(fl - pl >= el && memcmp(full + fl - el, eot, el) == 0);
    char *turn = strndup(full + pl, fl - pl - el);
    assert_non_null(turn);
    free(full);
    free(prompt);
    cJSON_Delete(all);
    cJSON_Delete(head);
    cJSON_Delete(extra);
    chat_tmpl_free(ct);
    return turn;
}

static const char k_two_calls[] =
    "[{\"role\": \"user\", \"content\": \"Weather in Paris and Rome?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "  {\"id\": \"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}},"
    "  {\"id\": \"xyzXYZ789\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Rome\"}}}]}]";

static const char k_one_call[] =
    "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "  {\"id\": \"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}]}]";

#define PARIS "C<get_weather|{\"city\":\"Paris\",\"unit\":\"celsius\"}>"
#define ROME "C<get_weather|{\"city\":\"Rome\"}>"

static void test_rendered_qwen3(void **state)
{
    (void)state;
    char *turn = rendered_turn("tests/fixtures/tokenizers/qwen3", NULL, k_two_calls, "<|im_end|>\n");
    assert_non_null(strstr(turn, "<tool_call>\n{\"name\": \"get_weather\""));
    cJSON *tools = cJSON_Parse(k_tools);
    struct outparse_opts o = opts(OUTPARSE_HERMES, true, tools);
    struct rec r;
    check_n(&o, turn, strlen(turn), PARIS ROME, &r);
    /* the raw blocks are the template's bytes, less the empty think block and the
     * newline between the calls */
    assert_true(strncmp(turn, "<think>\n\n</think>\n\n<tool_call>", 30) == 0);
    const char *nl = strstr(turn, "</tool_call>\n<tool_call>");
    assert_non_null(nl);
    size_t cut = (size_t)(nl - turn) + 12;
    assert_int_equal(r.raws.len, strlen(turn) - 19 - 1);
    assert_memory_equal(r.raws.s, turn + 19, cut - 19);
    assert_string_equal(r.raws.s + cut - 19, turn + cut + 1);
    assert_int_equal(r.n_calls, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(strlen(r.ids[i]), 29);
        assert_memory_equal(r.ids[i], "call_", 5);
        for (int k = 5; k < 29; k++)
            assert_true((r.ids[i][k] >= 'a' && r.ids[i][k] <= 'z') || (r.ids[i][k] >= 'A' && r.ids[i][k] <= 'Z') ||
                        (r.ids[i][k] >= '0' && r.ids[i][k] <= '9'));
    }
    assert_string_not_equal(r.ids[0], r.ids[1]);
    rec_free(&r);
    /* the same turn with some thinking in it, and text before the calls */
    const char *thought = "<think>\nThe user wants two cities.\n</think>\n\nChecking both.\n<tool_call>\n"
                          "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
    check(&o, thought, "R<The user wants two cities.>T<Checking both.\n>" ROME);
    free(turn);
    cJSON_Delete(tools);
}

static void test_rendered_llama3(void **state)
{
    (void)state;
    char *turn = rendered_turn("tests/fixtures/tokenizers/llama3_1", "tests/fixtures/templates/llama3_1_tools.jinja",
                               k_one_call, "<|eot_id|>");
    assert_string_equal(turn, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}");
    cJSON *tools = cJSON_Parse(k_tools);
    struct outparse_opts o = opts(OUTPARSE_LLAMA3, false, tools);
    check(&o, turn, PARIS);
    /* after <|python_tag|> (when the special token is decoded), after whitespace */
    check(&o, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", ROME);
    check(&o, "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}\n", ROME);
    /* the {"type": "function", ...} variant; "arguments" for "parameters" */
    check(&o, "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", ROME);
    check(&o, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}", ROME);
    /* several calls, ';'-separated (Llama 3.2) or not */
    check(&o, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}; "
              "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
          PARIS ROME);
    check(&o, "{\"name\": \"search\", \"parameters\": {}}\n{\"name\": \"search\", \"parameters\": {}}\nok",
          "C<search|{}>C<search|{}>T<ok>");
    /* plain answers stay text, streamed as they come (only a leading '{' is held) */
    check(&o, "Paris is sunny, 21 {C} today.", "T<Paris is sunny, 21 {C} today.>");
    check(&o, "  The call would be {\"name\": \"search\", \"parameters\": {}}",
          "T<  The call would be {\"name\": \"search\", \"parameters\": {}}>");
    check(&o, "{\"city\": \"Paris\"} is the answer", "T<{\"city\": \"Paris\"} is the answer>");
    check(&o, "{\"name\": \"search\"}", "T<{\"name\": \"search\"}>");               /* no parameters */
    check(&o, "{\"type\": \"tool\", \"name\": \"search\", \"parameters\": {}}",
          "T<{\"type\": \"tool\", \"name\": \"search\", \"parameters\": {}}>");
    check(&o, "<|python_tag|>print(2 + 2)", "T<<|python_tag|>print(2 + 2)>");  /* code interpreter */
    /* integers beyond a double's precision and unicode come back as written */
    check(&o, "{\"name\": \"search\", \"parameters\": {\"id\": 123456789012345678901, \"q\": \"caf\\u00e9 \xc3\xa9 \\\" }\"}}",
          "C<search|{\"id\":123456789012345678901,\"q\":\"caf\\u00e9 \xc3\xa9 \\\" }\"}>");
    free(turn);
    cJSON_Delete(tools);
}

static void test_rendered_mistral(void **state)
{
    (void)state;
    char *turn = rendered_turn("tests/fixtures/tokenizers/mistral_spm", "tests/fixtures/templates/mistral_v3_tools.jinja",
                               k_two_calls, "</s>");
    assert_true(strncmp(turn, "[TOOL_CALLS] [{\"name\": \"get_weather\"", 36) == 0);
    cJSON *tools = cJSON_Parse(k_tools);
    struct outparse_opts o = opts(OUTPARSE_MISTRAL, false, tools);
    struct rec r;
    check_n(&o, turn, strlen(turn), PARIS ROME, &r);
    assert_string_equal(r.raws.s, turn);  /* the whole block on the first call */
    rec_free(&r);
    check(&o, "Let me look.[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}] done",
          "T<Let me look.>C<search|{\"q\":\"x\"}>T<done>");
    /* the newer name[ARGS]{...} form, one or several */
    check(&o, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}", ROME);
    check(&o, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}"
              "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}",
          PARIS ROME);
    check(&o, "[TOOL_CALLS]search{\"q\": 1}", "C<search|{\"q\":1}>");
    /* one bad element makes the whole array text */
    check(&o, "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}, {\"name\": \"rm\", \"arguments\": {}}]",
          "T<[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}, {\"name\": \"rm\", \"arguments\": {}}]>");
    check(&o, "[TOOL_CALLS] sure, here", "T<[TOOL_CALLS] sure, here>");
    check(&o, "[TOOL_CALLS] []", "T<[TOOL_CALLS] []>");
    check(&o, "[TOOL_CALLS]search[ARGS][1]", "T<[TOOL_CALLS]search[ARGS][1]>");
    /* cJSON takes control bytes for whitespace; JSON does not */
    check(&o, "[TOOL_CALLS]search[ARGS]{\"q\":\x18 1}", "T<[TOOL_CALLS]search[ARGS]{\"q\":\x18 1}>");
    free(turn);
    cJSON_Delete(tools);
}

/* ---- Hermes by hand ---- */

static void test_hermes(void **state)
{
    (void)state;
    cJSON *tools = cJSON_Parse(k_tools);
    struct outparse_opts o = opts(OUTPARSE_HERMES, false, tools);
    check(&o, "", "");
    check(&o, "Hello <b>world</b> <tool", "T<Hello <b>world</b> <tool>");
    check(&o, "I'll check. <tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"a b\"}}</tool_call> Done.",
          "T<I'll check. >C<search|{\"q\":\"a b\"}>T<Done.>");
    /* arguments as a JSON string, as some fine-tunes write them; missing: {} */
    check(&o, "<tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": 1}\"}</tool_call>", "C<search|{\"q\":1}>");
    check(&o, "<tool_call>{\"name\": \"search\"}</tool_call>", "C<search|{}>");
    /* malformed: all text, byte for byte */
    static const char *const k_bad[] = {
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",          /* truncated */
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",  /* no end tag */
        "<tool_call>{\"arguments\": {}}</tool_call>",                                      /* no name */
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",                 /* unknown */
        "<tool_call>{\"name\": \"search\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"name\": \"search\", \"arguments\": \"not json\"}</tool_call>",
        "<tool_call>{\"name\": \"search\", \"arguments\": {}</tool_call>",                 /* unbalanced */
        "<tool_call>{\"name\": \"search\"} trailing</tool_call>",
        "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"a\x01b\"}}</tool_call>", /* raw control byte */
        "<tool_call>use this tag to call</tool_call>",
        "<tool_call>",
        "<tool_call",
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        struct rec r;
        check_n(&o, k_bad[i], strlen(k_bad[i]), NULL, &r);
        assert_int_equal(r.n_calls, 0);
        assert_string_equal(r.text.s, k_bad[i]);
        rec_free(&r);
    }
    /* a bad block does not hide a good one after it */
    check(&o, "<tool_call>oops</tool_call><tool_call>{\"name\": \"search\"}</tool_call>",
          "T<<tool_call>oops</tool_call>>C<search|{}>");
    /* without tools every name is taken */
    struct outparse_opts any = opts(OUTPARSE_HERMES, false, NULL);
    check(&any, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {\"p\": \"/\"}}</tool_call>", "C<rm_rf|{\"p\":\"/\"}>");
    /* Anthropic-shaped tools list */
    cJSON *anth = cJSON_Parse("[{\"name\": \"lookup\", \"input_schema\": {\"type\": \"object\"}}]");
    struct outparse_opts ao = opts(OUTPARSE_HERMES, false, anth);
    check(&ao, "<tool_call>{\"name\": \"lookup\"}</tool_call>", "C<lookup|{}>");
    /* OUTPARSE_NONE: everything is text */
    struct outparse_opts none = opts(OUTPARSE_NONE, false, tools);
    check(&none, "<tool_call>{\"name\": \"search\"}</tool_call>", "T<<tool_call>{\"name\": \"search\"}</tool_call>>");
    cJSON_Delete(anth);
    cJSON_Delete(tools);
}

/* Text is streamed as soon as it cannot be a marker any more. */
static void test_streaming_holdback(void **state)
{
    (void)state;
    struct outparse_opts o = opts(OUTPARSE_HERMES, true, NULL);
    struct outparse *p = NULL;
    struct err e = {0};
    struct rec r = {.last = -1};
    assert_int_equal(outparse_new(&p, &o, &e), 0);
    assert_int_equal(outparse_feed(p, "<thi", 4, on_event, &r), 0);
    assert_null(r.ser.s);
    assert_int_equal(outparse_feed(p, "nk>\nplan", 8, on_event, &r), 0);
    assert_string_equal(r.ser.s, "R<plan");
    assert_int_equal(outparse_feed(p, " \n</thi", 7, on_event, &r), 0);
    assert_string_equal(r.ser.s, "R<plan");
    assert_int_equal(outparse_feed(p, "nk>\n\nSure <tool_c", 17, on_event, &r), 0);
    assert_string_equal(r.ser.s, "R<plan>T<Sure ");
    assert_int_equal(outparse_feed(p, "all>{\"name\": \"f\"}", 17, on_event, &r), 0);
    assert_string_equal(r.ser.s, "R<plan>T<Sure ");
    assert_int_equal(outparse_feed(p, "</tool_call>", 12, on_event, &r), 0);
    rec_close(&r);
    assert_string_equal(r.ser.s, "R<plan>T<Sure >C<f|{}>");
    assert_int_equal(outparse_finish(p, on_event, &r), 0);
    assert_int_equal(outparse_feed(p, "x", 1, on_event, &r), -ERR_ARG);
    outparse_free(p);
    rec_free(&r);
}

/* ---- reasoning ---- */

static void test_reasoning(void **state)
{
    (void)state;
    struct outparse_opts o = opts(OUTPARSE_NONE, true, NULL);
    check(&o, "<think>\nLet me think.\nStep 2.\n</think>\n\nThe answer is 4.",
          "R<Let me think.\nStep 2.>T<The answer is 4.>");
    check(&o, "No thinking here. <think>x</think>", "T<No thinking here. <think>x</think>>");
    check(&o, " <think>x</think>", "T< <think>x</think>>");
    check(&o, "<think>\nunfinished thought", "R<unfinished thought>");
    check(&o, "<think></think>answer", "T<answer>");
    check(&o, "<thin", "T<<thin>");
    check(&o, "<think>a</think>b</think>c", "R<a>T<b</think>c>");
    /* whitespace before </think>: up to 64 bytes dropped, the rest kept */
    char in[256], want[256];
    snprintf(in, sizeof in, "<think>a%100s</think>b", "");
    snprintf(want, sizeof want, "R<a%36s>T<b>", "");
    check(&o, in, want);
    /* the prompt opened <think> (DeepSeek-R1 distills) */
    struct outparse_opts in_r = {.format = OUTPARSE_NONE, .in_reasoning = true, .id_seed = 1};
    check(&in_r, "\nHmm, 2+2.\n</think>\n\n4", "R<Hmm, 2+2.>T<4>");
    check(&in_r, "<think>\nHmm.</think>4", "R<Hmm.>T<4>");
    check(&in_r, "never closed", "R<never closed>");
    /* reasoning off: the tags are text */
    struct outparse_opts off = opts(OUTPARSE_NONE, false, NULL);
    check(&off, "<think>a</think>b", "T<<think>a</think>b>");
    /* reasoning, then content, then calls; none parsed inside reasoning */
    cJSON *tools = cJSON_Parse(k_tools);
    struct outparse_opts h = opts(OUTPARSE_HERMES, true, tools);
    check(&h, "<think>maybe <tool_call>{\"name\": \"search\"}</tool_call></think>Ok.\n"
              "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}</tool_call>",
          "R<maybe <tool_call>{\"name\": \"search\"}</tool_call>>T<Ok.\n>C<search|{\"q\":\"x\"}>");
    struct outparse_opts l = opts(OUTPARSE_LLAMA3, true, tools);
    check(&l, "<think>call it</think>\n{\"name\": \"search\", \"parameters\": {}}", "R<call it>C<search|{}>");
    cJSON_Delete(tools);
}

/* ---- bounds ---- */

static void test_bounds(void **state)
{
    (void)state;
    struct outparse_opts o = opts(OUTPARSE_HERMES, false, NULL);
    /* a call longer than OUTPARSE_MAX_CALL is text, and what follows is parsed */
    size_t big = OUTPARSE_MAX_CALL + 100;
    const char *head = "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"";
    const char *tail = "\"}}</tool_call><tool_call>{\"name\": \"search\"}</tool_call>";
    char *in = malloc(big + 200);
    assert_non_null(in);
    size_t n = (size_t)sprintf(in, "%s", head);
    memset(in + n, 'x', big);
    n += big;
    n += (size_t)sprintf(in + n, "%s", tail);
    struct rec r;
    run_mode(&o, in, n, 0, &r);
    assert_int_equal(r.n_calls, 1);
    assert_int_equal(r.text.len, n - strlen("<tool_call>{\"name\": \"search\"}</tool_call>"));
    assert_memory_equal(r.text.s, in, r.text.len);
    rec_free(&r);
    /* the same in 4 KiB pieces: the same events */
    struct rec r2;
    run_mode(&o, in, n, 5, &r2);  /* 13-byte chunks */
    run_mode(&o, in, n, 0, &r);
    assert_string_equal(r.full.s, r2.full.s);
    rec_free(&r);
    rec_free(&r2);
    /* a call of exactly the limit still counts */
    size_t fill = OUTPARSE_MAX_CALL - strlen(head) - strlen("\"}}</tool_call>");
    n = (size_t)sprintf(in, "%s", head);
    memset(in + n, 'y', fill);
    n += fill;
    n += (size_t)sprintf(in + n, "\"}}</tool_call>");
    assert_int_equal(n, OUTPARSE_MAX_CALL);
    run_mode(&o, in, n, 0, &r);
    assert_int_equal(r.n_calls, 1);
    rec_free(&r);
    n = (size_t)sprintf(in, "%s", head);  /* one byte more: text */
    memset(in + n, 'y', fill + 1);
    n += fill + 1;
    n += (size_t)sprintf(in + n, "\"}}</tool_call>");
    run_mode(&o, in, n, 0, &r);
    assert_int_equal(r.n_calls, 0);
    assert_int_equal(r.text.len, n);
    rec_free(&r);
    /* a deep array never closes within the limit (Mistral), or closes too deep for cJSON */
    struct outparse_opts m = opts(OUTPARSE_MISTRAL, false, NULL);
    n = (size_t)sprintf(in, "[TOOL_CALLS] ");
    memset(in + n, '[', 5000);
    memset(in + n + 5000, ']', 5000);
    n += 10000;
    run_mode(&m, in, n, 0, &r);
    assert_int_equal(r.n_calls, 0);
    assert_int_equal(r.text.len, n);
    rec_free(&r);
    /* at most OUTPARSE_MAX_CALLS calls; the rest is text */
    n = 0;
    for (int i = 0; i < OUTPARSE_MAX_CALLS + 2; i++)
        n += (size_t)sprintf(in + n, "<tool_call>{\"name\": \"f\"}</tool_call>");
    run_mode(&o, in, n, 0, &r);
    assert_int_equal(r.n_calls, OUTPARSE_MAX_CALLS);
    assert_string_equal(r.text.s, "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"f\"}</tool_call>");
    rec_free(&r);
    /* 8 MiB of text in one feed streams through */
    size_t huge = 8u << 20;
    char *t = malloc(huge);
    assert_non_null(t);
    for (size_t i = 0; i < huge; i++)
        t[i] = "ab<tool_cal\n "[i % 13];
    run_mode(&o, t, huge, 0, &r);
    assert_int_equal(r.text.len, huge);
    assert_memory_equal(r.text.s, t, huge);
    rec_free(&r);
    free(t);
    free(in);
}

/* ---- emit errors, ids ---- */

static void test_emit_stop(void **state)
{
    (void)state;
    struct outparse_opts o = opts(OUTPARSE_HERMES, false, NULL);
    struct outparse *p = NULL;
    struct err e = {0};
    struct rec r = {.last = -1, .stop_at = 2};
    assert_int_equal(outparse_new(&p, &o, &e), 0);
    const char *in = "a<tool_call>{\"name\": \"f\"}</tool_call>b";
    assert_int_equal(outparse_feed(p, in, strlen(in), on_event, &r), -ERR_NOMEM);
    assert_int_equal(outparse_feed(p, "x", 1, on_event, &r), -ERR_NOMEM);
    assert_int_equal(outparse_finish(p, on_event, &r), -ERR_NOMEM);
    outparse_free(p);
    rec_free(&r);
    outparse_free(NULL);
    struct outparse_opts bad = {.format = (enum outparse_format)9};
    assert_int_equal(outparse_new(&p, &bad, &e), -ERR_ARG);
    assert_null(p);
    /* random ids differ between parsers */
    struct outparse_opts rnd = {.format = OUTPARSE_HERMES};
    struct rec a, b;
    run_mode(&rnd, in, strlen(in), 0, &a);
    run_mode(&rnd, in, strlen(in), 0, &b);
    assert_string_not_equal(a.ids[0], b.ids[0]);
    rec_free(&a);
    rec_free(&b);
}

/* ---- detection ---- */

static void detect_dir(const char *dir, const char *override, enum outparse_format want, bool reasoning)
{
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    if (chat_tmpl_load(&ct, test_path(dir), override ? test_path(override) : NULL, &e) < 0)
        fail_msg("load %s: %s", dir, e.msg);
    const char *src = chat_tmpl_source(ct);
    assert_non_null(src);
    if (outparse_detect_format(src) != want)
        fail_msg("%s: format %s, want %s", override ? override : dir,
                 outparse_format_name(outparse_detect_format(src)), outparse_format_name(want));
    assert_int_equal(outparse_detect_reasoning(src), reasoning);
    chat_tmpl_free(ct);
}

static void test_detect(void **state)
{
    (void)state;
    detect_dir("tests/fixtures/tokenizers/qwen3", NULL, OUTPARSE_HERMES, true);
    detect_dir("tests/fixtures/tokenizers/llama3_1", "tests/fixtures/templates/llama3_1_tools.jinja", OUTPARSE_LLAMA3,
               false);
    detect_dir("tests/fixtures/tokenizers/mistral_spm", "tests/fixtures/templates/mistral_v3_tools.jinja",
               OUTPARSE_MISTRAL, false);
    /* the llama3_1 fixture's own template takes no tools */
    detect_dir("tests/fixtures/tokenizers/llama3_1", NULL, OUTPARSE_NONE, false);
    /* the mistral_spm fixture has no template at all */
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    assert_int_equal(chat_tmpl_load(&ct, test_path("tests/fixtures/tokenizers/mistral_spm"), NULL, &e), -ERR_MISSING);
    assert_int_equal(outparse_detect_format(NULL), OUTPARSE_NONE);
    assert_false(outparse_detect_reasoning(NULL));
    assert_int_equal(outparse_detect_format("{% for m in messages %}{{ m.content }}{% endfor %}"), OUTPARSE_NONE);
    assert_int_equal(outparse_detect_format("{{ '<|start_header_id|>' }}"), OUTPARSE_NONE);
    assert_int_equal(outparse_detect_format("{{ '<|start_header_id|>' }}{\"name\": f, \"parameters\": d}"),
                     OUTPARSE_LLAMA3);
    assert_true(outparse_detect_reasoning("{{ '<｜Assistant｜><think>\\n' }}"));
    assert_string_equal(outparse_format_name(OUTPARSE_MISTRAL), "mistral");
    assert_string_equal(outparse_format_name((enum outparse_format)7), "?");
}

static void test_prompt_opens_reasoning(void **state)
{
    (void)state;
    static const struct {
        const char *prompt;
        bool want;
    } k_cases[] = {
        {"<｜User｜>hi<｜Assistant｜><think>\n", true},
        {"<|im_start|>assistant\n<think>\n", true},
        {"<think>", true},
        {"<|im_start|>assistant\n<think>\n\n</think>\n\n", false},
        {"<|im_start|>assistant\n", false},
        {"<think> x", false},
        {"", false},
        {"think>", false},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++)
        assert_int_equal(outparse_prompt_opens_reasoning(k_cases[i].prompt, strlen(k_cases[i].prompt)),
                         k_cases[i].want);
    /* Qwen3 with enable_thinking=false closes the block in the prompt */
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    assert_int_equal(chat_tmpl_load(&ct, test_path("tests/fixtures/tokenizers/qwen3"), NULL, &e), 0);
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *extra = cJSON_Parse("{\"enable_thinking\": false}");
    char *out = NULL;
    size_t len;
    assert_int_equal(chat_tmpl_apply(ct, msgs, true, extra, &out, &len, &e), 0);
    assert_false(outparse_prompt_opens_reasoning(out, len));
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    chat_tmpl_free(ct);
}

/* ---- call ids (issue 39 items 3, 9) ---- */

static int keep_id(void *ud, const struct outparse_event *ev)
{
    if (ev->kind == OUTPARSE_TOOL_CALL)
        snprintf(ud, 64, "%s", ev->id);
    return 0;
}

static bool alnum_run(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return false;
    return strlen(s) == n;
}

/* Each style's id from one parsed call. */
static void test_id_styles(void **state)
{
    (void)state;
    cJSON *tools = cJSON_Parse(k_tools);
    static const char k_call[] = "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
    char id[64];
    for (int st = 0; st < 3; st++) {
        struct outparse_opts o = opts(OUTPARSE_HERMES, false, tools);
        o.ids = (enum outparse_ids)st;
        struct outparse *p = NULL;
        struct err e = {0};
        id[0] = '\0';
        assert_int_equal(outparse_new(&p, &o, &e), 0);
        assert_int_equal(outparse_feed(p, k_call, strlen(k_call), keep_id, id), 0);
        assert_int_equal(outparse_finish(p, keep_id, id), 0);
        outparse_free(p);
        if (st == OUTPARSE_IDS_OPENAI)
            assert_true(strncmp(id, "call_", 5) == 0 && alnum_run(id + 5, 24));
        else if (st == OUTPARSE_IDS_ANTHROPIC)
            assert_true(strncmp(id, "toolu_01", 8) == 0 && alnum_run(id + 8, 22));
        else
            assert_true(alnum_run(id, 9) && outparse_short_id_ok(id));
    }
    cJSON_Delete(tools);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(test_path(path), "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* The OpenAI tool loop with Mistral's template: the template demands 9-alphanumeric ids,
 * the ids a client sends back (ours or another server's) are shown to it in that form,
 * the same on the call and on its result. */
static void test_mistral_round_trip(void **state)
{
    (void)state;
    assert_true(outparse_detect_short_ids(read_text("tests/fixtures/templates/mistral_v3_tools.jinja")));
    assert_false(outparse_detect_short_ids(read_text("tests/fixtures/templates/llama3_1_tools.jinja")));
    struct chat_tmpl *ct = NULL;
    struct err e = {0};
    if (chat_tmpl_load(&ct, test_path("tests/fixtures/tokenizers/mistral_spm"),
                       test_path("tests/fixtures/templates/mistral_v3_tools.jinja"), &e) < 0)
        fail_msg("load: %s", e.msg);
    static const char k_loop[] =
        "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
        "  {\"id\": \"%s\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
        "   \"arguments\": {\"city\": \"Paris\"}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"%s\", \"content\": \"21 C\"}]";
    static const char *const k_ids[] = {"call_a1B2c3D4e5F6g7H8i9J0k1L2", "toolu_01D7FLrfh4GYq7yT1ULFeyMV", "x", "abcDEF123"};
    cJSON *extra = cJSON_CreateObject();
    cJSON_AddItemToObject(extra, "tools", cJSON_Parse(k_tools));
    for (size_t i = 0; i < sizeof k_ids / sizeof k_ids[0]; i++) {
        char txt[1024], short_id[10];
        snprintf(txt, sizeof txt, k_loop, k_ids[i], k_ids[i]);
        cJSON *msgs = cJSON_Parse(txt);
        char *out = NULL;
        size_t n = 0;
        int rc = chat_tmpl_apply(ct, msgs, true, extra, &out, &n, &e);
        bool ok_as_is = outparse_short_id_ok(k_ids[i]);
        if (!ok_as_is) {  /* what the template does with the id as the client sent it */
            assert_true(rc < 0);
            assert_non_null(strstr(e.msg, "length 9"));
        } else {
            free(out);
        }
        assert_int_equal(outparse_shorten_ids(msgs), 0);
        if (chat_tmpl_apply(ct, msgs, true, extra, &out, &n, &e) < 0)
            fail_msg("%s: %s", k_ids[i], e.msg);
        outparse_short_id(k_ids[i], short_id);
        assert_true(outparse_short_id_ok(short_id));
        if (ok_as_is)
            assert_string_equal(short_id, k_ids[i]);
        char want[64];
        snprintf(want, sizeof want, "\"id\": \"%s\"", short_id);
        assert_non_null(strstr(out, want));
        snprintf(want, sizeof want, "\"call_id\": \"%s\"", short_id);
        assert_non_null(strstr(out, want));
        free(out);
        cJSON_Delete(msgs);
    }
    cJSON_Delete(extra);
    chat_tmpl_free(ct);
}

static const struct CMUnitTest k_tests[] = {
    cmocka_unit_test(test_rendered_qwen3),
    cmocka_unit_test(test_rendered_llama3),
    cmocka_unit_test(test_rendered_mistral),
    cmocka_unit_test(test_id_styles),
    cmocka_unit_test(test_mistral_round_trip),
    cmocka_unit_test(test_hermes),
    cmocka_unit_test(test_streaming_holdback),
    cmocka_unit_test(test_reasoning),
    cmocka_unit_test(test_bounds),
    cmocka_unit_test(test_emit_stop),
    cmocka_unit_test(test_detect),
    cmocka_unit_test(test_prompt_opens_reasoning),
};

TEST_SUITE(outparse, k_tests);
