/*
 * oai_request: OpenAI request bodies. Each field's happy path lands in the
 * struct; each bound is tried at its edge (the largest value accepted, one
 * more rejected); each rejection is a 400 invalid_request_error whose param
 * is checked exactly, and the request is left empty. The body gates are
 * tried on invalid UTF-8 (overlong, encoded surrogate, cut short, past
 * U+10FFFF), NUL bytes and \u0000 escapes, trailing bytes and a 10^5-deep
 * body (refused at once). oai_error_json must give back valid JSON in valid
 * UTF-8 whatever bytes the message holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/oai_request.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define VOCAB 1000

/* ---- helpers ---- */

/* A growing body built with printf-style appends (fails the test when out of memory). */
struct body {
    char *s;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3)))
static void add(struct body *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->len + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* body (len bytes) must parse for ep; the caller frees r. */
static void accept_n(struct oai_request *r, enum oai_endpoint ep, const char *body, size_t len)
{
    struct oai_error err = {0};
    if (oai_request_parse(r, ep, body, len, VOCAB, &err) != 0)
        fail_msg("rejected (%.80s): %s (param '%s')", body, err.message, err.param);
}

static void accept(struct oai_request *r, enum oai_endpoint ep, const char *body)
{
    accept_n(r, ep, body, strlen(body));
}

/* body (len bytes) must be a 400 naming param, with want (if not NULL) in the message,
 * and leave the request empty. */
static void reject_n(enum oai_endpoint ep, const char *body, size_t len, const char *param, const char *want)
{
    struct oai_request r;
    struct oai_error err = {0};
    int rc = oai_request_parse(&r, ep, body, len, VOCAB, &err);
    if (rc == 0) {
        oai_request_free(&r);
        fail_msg("accepted (%.80s), wanted an error on '%s'", body, param);
    }
    assert_int_equal(rc, -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.type, "invalid_request_error");
    assert_null(err.code);
    if (strcmp(err.param, param) != 0)
        fail_msg("(%.80s): param '%s', wanted '%s' (%s)", body, err.param, param, err.message);
    if (want && !strstr(err.message, want))
        fail_msg("(%.80s): message '%s' lacks '%s'", body, err.message, want);
    assert_null(r.messages);
    assert_null(r.prompt);
    assert_null(r.prompt_ids);
    assert_null(r.model);
    assert_null(r.bias);
    assert_int_equal(r.n_stop, 0);
}

static void reject_chat(const char *body, const char *param, const char *want)
{
    reject_n(OAI_CHAT, body, strlen(body), param, want);
}

static void reject_cmpl(const char *body, const char *param, const char *want)
{
    reject_n(OAI_COMPLETIONS, body, strlen(body), param, want);
}

#define HI "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const char *msg_field(const cJSON *msgs, int i, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, i), key);
    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

/* ---- chat ---- */

static void chat_minimal(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI "}");
    assert_int_equal(r.endpoint, OAI_CHAT);
    assert_null(r.model);
    assert_int_equal(cJSON_GetArraySize(r.messages), 1);
    assert_string_equal(msg_field(r.messages, 0, "role"), "user");
    assert_string_equal(msg_field(r.messages, 0, "content"), "hi");
    assert_int_equal(r.max_tokens, -1);
    assert_int_equal(r.n, 1);
    assert_false(r.has_temperature || r.has_top_p || r.has_top_k || r.has_min_p || r.has_repetition_penalty ||
                 r.has_seed);
    assert_false(r.stream || r.include_usage || r.logprobs || r.echo);
    assert_int_equal(r.n_stop, 0);
    assert_int_equal(r.n_bias, 0);
    assert_null(r.prompt);
    oai_request_free(&r);
    assert_null(r.messages);
}

static void chat_messages(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT,
           "{\"model\":\"m1\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\",\"name\":\"x\"},"
           "{\"role\":\"system\",\"content\":\"\"},"
           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\u00e9\"},{\"type\":\"text\",\"text\":\"\"},"
           "{\"type\":\"text\",\"text\":\"b\\ud83d\\ude00\",\"extra\":1}]},"
           "{\"role\":\"assistant\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":[]}],\"unknown\":[1,{}]}");
    assert_string_equal(r.model, "m1");
    assert_int_equal(cJSON_GetArraySize(r.messages), 5);
    assert_string_equal(msg_field(r.messages, 0, "role"), "system");
    assert_string_equal(msg_field(r.messages, 0, "content"), "be brief");
    assert_string_equal(msg_field(r.messages, 1, "content"), "");
    assert_string_equal(msg_field(r.messages, 2, "role"), "user");
    assert_string_equal(msg_field(r.messages, 2, "content"), "a\xc3\xa9" "b\xf0\x9f\x98\x80");
    assert_string_equal(msg_field(r.messages, 3, "role"), "assistant");
    assert_string_equal(msg_field(r.messages, 4, "content"), "");
    /* only role and content are kept */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(r.messages, 0)), 2);
    oai_request_free(&r);
}

static void chat_message_errors(void **state)
{
    (void)state;
    reject_chat("{}", "messages", "required");
    reject_chat("{\"messages\":null}", "messages", "required");
    reject_chat("{\"messages\":[]}", "messages", "empty");
    reject_chat("{\"messages\":{}}", "messages", "'messages' must be an array");
    reject_chat("{\"messages\":[\"hi\"]}", "messages[0]", "must be an object");
    reject_chat("{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role", "required");
    reject_chat("{\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role", "must be a string");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"robot\",\"content\":\"x\"}]}",
                "messages[1].role", "'robot'");
    reject_chat("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":1}]}",
                "messages[0].tool_call_id", "must be a string");
    reject_chat("{\"messages\":[{\"role\":\"tool\"}]}", "messages[0].content", "required");
    reject_chat("{\"messages\":[{\"role\":\"User\",\"content\":\"x\"}]}", "messages[0].role", NULL);
    reject_chat("{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required");
    reject_chat("{\"messages\":[{\"role\":\"assistant\",\"content\":null}]}", "messages[0].content", "required");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "must be a string");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", "messages[0].content[0]",
                "must be an object");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", "messages[0].content[0].type",
                "required");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
                "messages[0].content[1].image_url.url", "data: URL");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}",
                "messages[0].content[0].type", "'input_audio'");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                "messages[0].content[0].text", "required");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":"
                "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":[1]}]}]}",
                "messages[1].content[1].text", "must be a string");
}

/* A long role is quoted cut at QUOTE_MAX bytes on a character boundary. */
/* image_url parts: data: URLs decoded into images[], the message's content kept as typed
 * parts for the template; URLs, bad base64, empty images, images outside user messages and
 * too many images refused naming the part. */
static void chat_images(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
           "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{\"url\":"
           "\"data:image/png;base64,aGVsbG8=\"}},{\"type\":\"image_url\",\"image_url\":{\"url\":"
           "\"DATA:image/jpeg;BASE64,aGk\",\"detail\":\"low\"}}]}]}");
    assert_int_equal(r.n_images, 2);
    assert_int_equal(r.images[0].len, 5);
    assert_memory_equal(r.images[0].data, "hello", 5);
    assert_int_equal(r.images[1].len, 2);
    assert_memory_equal(r.images[1].data, "hi", 2);
    assert_string_equal(r.images[1].param, "messages[1].content[2].image_url.url");
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 1), "content");
    assert_true(cJSON_IsArray(c));
    assert_int_equal(cJSON_GetArraySize(c), 3);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 0), "text")->valuestring, "a");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(c, 1), "type")->valuestring, "image");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetArrayItem(c, 2)), 1);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 0), "content")));
    oai_request_free(&r);
    const char *P = "messages[0].content[0].image_url.url";
    /* an http(s) URL is kept for the server (fetched only with serve --allow-image-urls) */
    accept(&r, OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
           "{\"url\":\"https://example.com/a.png\"}}]}]}");
    assert_int_equal(r.n_images, 1);
    assert_null(r.images[0].data);
    assert_string_equal(r.images[0].url, "https://example.com/a.png");
    oai_request_free(&r);
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"ftp://example.com/a.png\"}}]}]}", P, "data: URL");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"data:image/png;base64,aGV$bG8=\"}}]}]}", P, "not base64");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"data:image/png;base64,\"}}]}]}", P, "empty");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"data:image/png;base64,a\"}}]}]}", P, "cut short");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"data:image/png,aGk=\"}}]}]}", P, "base64 data: URL");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "\"data:image/png;base64,aGk=\"}]}]}", "messages[0].content[0].image_url", "an object");
    reject_chat("{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"image_url\",\"image_url\":"
                "{\"url\":\"data:image/png;base64,aGk=\"}}]}]}", "messages[0].content", "user messages");
    struct body b = {0};
    add(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i <= OAI_MAX_IMAGES; i++)
        add(&b, "%s{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,aGk=\"}}", i ? "," : "");
    add(&b, "]}]}");
    char param[64];
    snprintf(param, sizeof param, "messages[0].content[%d].image_url.url", OAI_MAX_IMAGES);
    reject_chat(b.s, param, "at most 16 images");
    free(b.s);
}

static void chat_role_quoted(void **state)
{
    (void)state;
    struct body b = {0};
    add(&b, "{\"messages\":[{\"role\":\"x");
    for (int i = 0; i < 300; i++)
        add(&b, "\xc3\xa9");
    add(&b, "\",\"content\":\"x\"}]}");
    struct oai_request r;
    struct oai_error err = {0};
    assert_int_equal(oai_request_parse(&r, OAI_CHAT, b.s, b.len, VOCAB, &err), -1);
    assert_string_equal(err.param, "messages[0].role");
    const char *q = strstr(err.message, "(got 'x");
    assert_non_null(q);
    assert_non_null(strstr(q, "\xc3\xa9...')"));
    assert_true(strlen(q) < 64 + 16);
    size_t n = strlen(err.message), need;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_seq((const unsigned char *)err.message + i, n - i, &need);
        assert_true(need > 0 && k == need);
        i += k;
    }
    free(b.s);
}

static void chat_message_bounds(void **state)
{
    (void)state;
    struct body b = {0};
    add(&b, "{\"messages\":[");
    for (int i = 0; i < OAI_MAX_MESSAGES; i++)
        add(&b, "%s{\"role\":\"user\",\"content\":\"%d\"}", i ? "," : "", i);
    size_t at = b.len;
    add(&b, "]}");
    struct oai_request r;
    accept_n(&r, OAI_CHAT, b.s, b.len);
    assert_int_equal(cJSON_GetArraySize(r.messages), OAI_MAX_MESSAGES);
    assert_string_equal(msg_field(r.messages, OAI_MAX_MESSAGES - 1, "content"), "4095");
    oai_request_free(&r);
    b.len = at;
    add(&b, ",{\"role\":\"user\",\"content\":\"x\"}]}");
    reject_n(OAI_CHAT, b.s, b.len, "messages", "at most 4096");

    b.len = 0;
    add(&b, "{\"messages\":[{\"role\":\"user\",\"content\":[");
    for (int i = 0; i < OAI_MAX_CONTENT_PARTS; i++)
        add(&b, "%s{\"type\":\"text\",\"text\":\"%c\"}", i ? "," : "", 'a' + i % 26);
    at = b.len;
    add(&b, "]}]}");
    accept_n(&r, OAI_CHAT, b.s, b.len);
    const char *joined = msg_field(r.messages, 0, "content");
    assert_int_equal(strlen(joined), OAI_MAX_CONTENT_PARTS);
    assert_memory_equal(joined, "abcdefghijklmnopqrstuvwxyzab", 28);
    oai_request_free(&r);
    b.len = at;
    add(&b, ",{\"type\":\"text\",\"text\":\"x\"}]}]}");
    reject_n(OAI_CHAT, b.s, b.len, "messages[0].content", "at most 256");
    free(b.s);
}

static void chat_logprobs(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"logprobs\":true,\"top_logprobs\":20}");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 20);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"logprobs\":true,\"top_logprobs\":0}");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"logprobs\":false,\"top_logprobs\":null}");
    assert_false(r.logprobs);
    oai_request_free(&r);
    reject_chat("{" HI ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs", "[0, 20]");
    reject_chat("{" HI ",\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs", NULL);
    reject_chat("{" HI ",\"top_logprobs\":2}", "top_logprobs", "logprobs");
    reject_chat("{" HI ",\"logprobs\":false,\"top_logprobs\":2}", "top_logprobs", "logprobs");
    reject_chat("{" HI ",\"logprobs\":1}", "logprobs", "must be a boolean");
}

/* ---- completions ---- */

static void cmpl_prompt(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Once upon\",\"echo\":true,\"suffix\":\"\"}");
    assert_int_equal(r.endpoint, OAI_COMPLETIONS);
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.prompt_len, 9);
    assert_true(r.echo);
    assert_null(r.messages);
    assert_null(r.prompt_ids);
    oai_request_free(&r);

    accept(&r, OAI_COMPLETIONS, "{\"prompt\":[\"just one\"],\"suffix\":null}");
    assert_string_equal(r.prompt, "just one");
    assert_false(r.echo);
    oai_request_free(&r);

    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"\"}");
    assert_string_equal(r.prompt, "");
    assert_int_equal(r.prompt_len, 0);
    oai_request_free(&r);

    accept(&r, OAI_COMPLETIONS, "{\"prompt\":[0, 17, 999, 1e2]}");
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_ids, 4);
    static const int32_t want[4] = {0, 17, 999, 100};
    assert_memory_equal(r.prompt_ids, want, sizeof want);
    oai_request_free(&r);

    reject_cmpl("{}", "prompt", "required");
    reject_cmpl("{\"prompt\":null}", "prompt", "required");
    reject_cmpl("{\"prompt\":5}", "prompt", "must be a string or an array");
    reject_cmpl("{\"prompt\":[]}", "prompt", "empty");
    reject_cmpl("{\"prompt\":[\"a\",\"b\"]}", "prompt", "only one prompt");
    reject_cmpl("{\"prompt\":[[1,2]]}", "prompt", "only one prompt");
    reject_cmpl("{\"prompt\":[1,1000]}", "prompt[1]", "[0, 999]");
    reject_cmpl("{\"prompt\":[-1]}", "prompt[0]", NULL);
    reject_cmpl("{\"prompt\":[1,2.5]}", "prompt[1]", "(got 2.5)");
    reject_cmpl("{\"prompt\":[1,\"a\"]}", "prompt[1]", "must be an integer");
    reject_cmpl("{\"prompt\":[1,null]}", "prompt[1]", "must be an integer");
    reject_cmpl("{\"prompt\":\"x\",\"suffix\":\"tail\"}", "suffix", "suffix is not supported");
    reject_cmpl("{\"prompt\":\"x\",\"suffix\":3}", "suffix", "must be a string");
    reject_cmpl("{\"prompt\":\"x\",\"echo\":\"yes\"}", "echo", "must be a boolean");
    /* chat fields mean nothing here, and the reverse */
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"messages\":5,\"max_completion_tokens\":\"z\"}");
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"prompt\":[[1]],\"suffix\":\"s\",\"echo\":3}");
    oai_request_free(&r);
    /* tools, tool_choice, response_format, chat_template_kwargs */
    accept(&r, OAI_CHAT, "{" HI ",\"tools\":[],\"response_format\":{\"type\":\"text\"}}");
    assert_null(r.tools);
    assert_int_equal(r.format, OAI_FORMAT_TEXT);
    oai_request_free(&r);
#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}"
    accept(&r, OAI_CHAT, "{" HI ",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":"
                         "{\"name\":\"get_weather\"}},\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                         "{\"name\":\"x\",\"schema\":{\"type\":\"object\"}}},\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    assert_int_equal(cJSON_GetArraySize(r.tools), 1);
    assert_int_equal(r.tool_choice, OAI_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_choice_name, "get_weather");
    assert_int_equal(r.format, OAI_FORMAT_JSON_SCHEMA);
    assert_non_null(r.format_schema);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(r.template_kwargs, "enable_thinking")));
    oai_request_free(&r);
    reject_chat("{" HI ",\"tools\":[{\"type\":\"function\"}]}", "tools[0]", "must be");
    reject_chat("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
                "tools[0].function.name", "letters");
    /* a call's arguments are an object: OpenAI refuses parameters of another type ("schema must be
     * a JSON Schema of 'type: \"object\"'"), as Anthropic does an input_schema; a forced call
     * generated a JSON string as the arguments */
    reject_chat("{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                "{\"type\":\"string\"}}}],\"tool_choice\":\"required\"}", "tools[0].function.parameters", "object");
    reject_chat("{" HI ",\"tools\":[" TOOL ",{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":"
                "{\"type\":[\"object\",\"null\"]}}}]}", "tools[1].function.parameters", "object");
    accept(&r, OAI_CHAT, "{" HI ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                         "{\"properties\":{}}}}]}");
    oai_request_free(&r);
    reject_chat("{" HI ",\"tools\":[" TOOL "],\"tool_choice\":{\"type\":\"function\",\"function\":"
                "{\"name\":\"other\"}}}", "tool_choice", "not among");
    reject_chat("{" HI ",\"tool_choice\":\"required\"}", "tool_choice", "empty");
    reject_chat("{" HI ",\"tool_choice\":\"sometimes\"}", "tool_choice", "must be");
    reject_chat("{" HI ",\"response_format\":\"json\"}", "response_format", "must be");
    reject_chat("{" HI ",\"response_format\":{\"type\":\"xml\"}}", "response_format.type", "must be");
    reject_chat("{" HI ",\"chat_template_kwargs\":[1]}", "chat_template_kwargs", "must be");
    accept(&r, OAI_CHAT, "{" HI ",\"ignore_eos\":true}");
    assert_true(r.ignore_eos);
    oai_request_free(&r);
    reject_chat("{" HI ",\"ignore_eos\":1}", "ignore_eos", "must be a boolean");
    /* tool turns: an assistant message of calls only (arguments parsed to an object), a tool result */
    accept(&r, OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\","
                         "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                         "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},{\"role\":\"tool\","
                         "\"tool_call_id\":\"c1\",\"content\":\"12C\"}]}");
    const cJSON *asst = cJSON_GetArrayItem(r.messages, 1);
    assert_string_equal(cJSON_GetObjectItem(asst, "content")->valuestring, "");
    const cJSON *args = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(
        cJSON_GetObjectItem(asst, "tool_calls"), 0), "function"), "arguments");
    assert_string_equal(cJSON_GetObjectItem(args, "city")->valuestring, "Oslo");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 2), "tool_call_id")->valuestring, "c1");
    oai_request_free(&r);
    reject_chat("{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":3}]}]}",
                "messages[0].tool_calls[0]", "must be");
    reject_chat("{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", "messages[0].role", "deprecated");
}

static void cmpl_prompt_ids_bound(void **state)
{
    (void)state;
    struct body b = {0};
    add(&b, "{\"prompt\":[");
    for (int i = 0; i < OAI_MAX_PROMPT_IDS; i++)
        add(&b, i ? ",%d" : "%d", i % VOCAB);
    size_t at = b.len;
    add(&b, "]}");
    struct oai_request r;
    accept_n(&r, OAI_COMPLETIONS, b.s, b.len);
    assert_int_equal(r.n_prompt_ids, OAI_MAX_PROMPT_IDS);
    assert_int_equal(r.prompt_ids[OAI_MAX_PROMPT_IDS - 1], (OAI_MAX_PROMPT_IDS - 1) % VOCAB);
    oai_request_free(&r);
    b.len = at;
    add(&b, ",1]}");
    reject_n(OAI_COMPLETIONS, b.s, b.len, "prompt", "at most");
    free(b.s);
}

static void cmpl_logprobs(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":5}");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 5);
    oai_request_free(&r);
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":0}");
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 0);
    oai_request_free(&r);
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"logprobs\":null}");
    assert_false(r.logprobs);
    oai_request_free(&r);
    reject_cmpl("{\"prompt\":\"x\",\"logprobs\":6}", "logprobs", "[0, 5]");
    reject_cmpl("{\"prompt\":\"x\",\"logprobs\":true}", "logprobs", "must be an integer");
}

/* ---- shared fields ---- */

static void max_tokens(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":0}");
    assert_int_equal(r.max_tokens, 0);
    oai_request_free(&r);
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"max_tokens\":1073741824}");
    assert_int_equal(r.max_tokens, OAI_MAX_TOKENS_VALUE);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"max_tokens\":1}");
    assert_int_equal(r.max_tokens, 1);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"max_completion_tokens\":7}");
    assert_int_equal(r.max_tokens, 7);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{\"max_completion_tokens\":7," HI ",\"max_tokens\":9}");
    assert_int_equal(r.max_tokens, 7);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"max_tokens\":null,\"max_completion_tokens\":null}");
    assert_int_equal(r.max_tokens, -1);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"max_tokens\":2.0}");
    assert_int_equal(r.max_tokens, 2);
    oai_request_free(&r);

    reject_chat("{" HI ",\"max_tokens\":0}", "max_tokens", "[1, 1073741824]");
    reject_chat("{" HI ",\"max_completion_tokens\":0}", "max_completion_tokens", NULL);
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens", "[0, 1073741824]");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":1073741825}", "max_tokens", "(got 1073741825)");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":1.5}", "max_tokens", "(got 1.5)");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":1e300}", "max_tokens", NULL);
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":1e999}", "max_tokens", NULL);
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":-1e999}", "max_tokens", NULL);
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":\"10\"}", "max_tokens", "'max_tokens' must be an integer");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":true}", "max_tokens", "must be an integer");
    /* not JSON numbers at all */
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":NaN}", "", "not valid JSON");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":Infinity}", "", "not valid JSON");
    reject_cmpl("{\"prompt\":\"x\",\"max_tokens\":-nan}", "", "not valid JSON");
}

static void sampling(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT,
           "{" HI ",\"temperature\":2,\"top_p\":1,\"top_k\":40,\"min_p\":0,\"repetition_penalty\":10,"
           "\"presence_penalty\":-2,\"frequency_penalty\":2}");
    assert_true(r.has_temperature && r.has_top_p && r.has_top_k && r.has_min_p && r.has_repetition_penalty);
    assert_true(r.temperature == 2.0f && r.top_p == 1.0f && r.min_p == 0.0f && r.repetition_penalty == 10.0f);
    assert_int_equal(r.top_k, 40);
    assert_true(r.presence_penalty == -2.0f && r.frequency_penalty == 2.0f);
    oai_request_free(&r);
    accept(&r, OAI_COMPLETIONS,
           "{\"prompt\":\"x\",\"temperature\":0,\"top_p\":1e-6,\"top_k\":-1,\"min_p\":1,\"repetition_penalty\":0.5}");
    assert_true(r.temperature == 0.0f && r.top_p == 1e-6f && r.min_p == 1.0f && r.repetition_penalty == 0.5f);
    assert_true(r.has_top_k);
    assert_int_equal(r.top_k, 0);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"top_k\":1048576,\"temperature\":null}");
    assert_int_equal(r.top_k, 1 << 20);
    assert_false(r.has_temperature);
    oai_request_free(&r);

    reject_chat("{" HI ",\"temperature\":2.0001}", "temperature", "[0, 2]");
    reject_chat("{" HI ",\"temperature\":-0.1}", "temperature", NULL);
    reject_chat("{" HI ",\"temperature\":1e999}", "temperature", NULL);
    reject_chat("{" HI ",\"temperature\":\"hot\"}", "temperature", "'temperature' must be a number");
    reject_chat("{" HI ",\"top_p\":0}", "top_p", "(0, 1]");
    reject_chat("{" HI ",\"top_p\":1e-50}", "top_p", "(0, 1]");  /* 0 once a float */
    reject_chat("{" HI ",\"top_p\":1.01}", "top_p", NULL);
    reject_chat("{" HI ",\"top_k\":-2}", "top_k", NULL);
    reject_chat("{" HI ",\"top_k\":1048577}", "top_k", NULL);
    reject_chat("{" HI ",\"top_k\":4.5}", "top_k", NULL);
    reject_chat("{" HI ",\"min_p\":1.5}", "min_p", NULL);
    reject_chat("{" HI ",\"repetition_penalty\":0}", "repetition_penalty", "(0, 10]");
    reject_chat("{" HI ",\"repetition_penalty\":10.5}", "repetition_penalty", NULL);
    reject_chat("{" HI ",\"presence_penalty\":-2.5}", "presence_penalty", "[-2, 2]");
    reject_chat("{" HI ",\"frequency_penalty\":[1]}", "frequency_penalty", "must be a number");
}

static void seed(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"seed\":-1}");
    assert_true(r.has_seed);
    assert_true(r.seed == UINT64_MAX);
    assert_true((int64_t)r.seed == -1);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"seed\":42}");
    assert_true(r.seed == 42);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"seed\":-9223372036854775808}");
    assert_true(r.seed == 1ull << 63);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"seed\":9223372036854774784}");  /* the largest double below 2^63 */
    assert_true(r.seed == 9223372036854774784ull);
    oai_request_free(&r);
    reject_chat("{" HI ",\"seed\":9223372036854775808}", "seed", "64-bit integer");
    reject_chat("{" HI ",\"seed\":1e300}", "seed", NULL);
    reject_chat("{" HI ",\"seed\":0.5}", "seed", NULL);
    reject_chat("{" HI ",\"seed\":\"1\"}", "seed", "must be an integer");
}

static void stop(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"stop\":\"\\n\\n\"}");
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n\n");
    assert_int_equal(r.stop_len[0], 2);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"stop\":null}");
    assert_int_equal(r.n_stop, 0);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"stop\":[]}");
    assert_int_equal(r.n_stop, 0);
    oai_request_free(&r);

    struct body b = {0};
    char s256[OAI_MAX_STOP_LEN + 2];
    memset(s256, 'x', OAI_MAX_STOP_LEN);
    s256[OAI_MAX_STOP_LEN] = '\0';
    add(&b, "{\"prompt\":\"p\",\"stop\":[");
    for (int i = 0; i < OAI_MAX_STOP; i++)
        add(&b, "%s\"%s%c\"", i ? "," : "", i == 0 ? s256 + 1 : "", 'a' + i);
    size_t at = b.len;
    add(&b, "]}");
    accept_n(&r, OAI_COMPLETIONS, b.s, b.len);
    assert_int_equal(r.n_stop, OAI_MAX_STOP);
    assert_int_equal(r.stop_len[0], OAI_MAX_STOP_LEN);
    assert_int_equal(strlen(r.stop[0]), OAI_MAX_STOP_LEN);
    assert_string_equal(r.stop[15], "p");
    oai_request_free(&r);
    b.len = at;
    add(&b, ",\"q\"]}");
    reject_n(OAI_COMPLETIONS, b.s, b.len, "stop", "at most 16");
    b.len = 0;
    add(&b, "{" HI ",\"stop\":[\"a\",\"%sy\"]}", s256);
    reject_n(OAI_CHAT, b.s, b.len, "stop[1]", "at most 256 bytes (got 257)");
    b.len = 0;
    add(&b, "{" HI ",\"stop\":\"%sy\"}", s256);
    reject_n(OAI_CHAT, b.s, b.len, "stop", "(got 257)");
    free(b.s);

    reject_chat("{" HI ",\"stop\":\"\"}", "stop", "must not be empty");
    reject_chat("{" HI ",\"stop\":[\"a\",\"\"]}", "stop[1]", "must not be empty");
    reject_chat("{" HI ",\"stop\":[\"a\",3]}", "stop[1]", "must be a string");
    reject_chat("{" HI ",\"stop\":5}", "stop", "must be a string or an array");
}

static void n_and_user(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"n\":16,\"user\":\"u-1\"}");
    assert_int_equal(r.n, 16);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"n\":1,\"user\":null}");
    assert_int_equal(r.n, 1);
    oai_request_free(&r);
    reject_chat("{" HI ",\"n\":17}", "n", "[1, 16]");
    reject_chat("{" HI ",\"n\":0}", "n", NULL);
    reject_chat("{" HI ",\"n\":\"2\"}", "n", "must be an integer");
    reject_chat("{" HI ",\"user\":5}", "user", "'user' must be a string");
    reject_chat("{" HI ",\"model\":[\"m\"]}", "model", "'model' must be a string");
}

static void logit_bias(void **state)
{
    (void)state;
    struct oai_request r;
    /* a key given twice is refused with the body (body_strict); one id spelled twice
     * ("50", "050") keeps its last value */
    reject_chat("{" HI ",\"logit_bias\":{\"50\":1.5,\"50\":-3}}", "logit_bias.50", "appears twice");
    accept(&r, OAI_CHAT, "{" HI ",\"logit_bias\":{\"0\":-100,\"999\":100,\"50\":1.5,\"007\":2,\"050\":-3}}");
    assert_int_equal(r.n_bias, 4);
    assert_int_equal(r.bias[0].id, 0);
    assert_true(r.bias[0].bias == -100.0f);
    assert_int_equal(r.bias[1].id, 999);
    assert_true(r.bias[1].bias == 100.0f);
    assert_int_equal(r.bias[2].id, 50);
    assert_true(r.bias[2].bias == -3.0f);
    assert_int_equal(r.bias[3].id, 7);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"logit_bias\":{}}");
    assert_int_equal(r.n_bias, 0);
    assert_null(r.bias);
    oai_request_free(&r);

    reject_chat("{" HI ",\"logit_bias\":{\"1000\":1}}", "logit_bias", "'1000'");
    reject_chat("{" HI ",\"logit_bias\":{\"-1\":1}}", "logit_bias", "'-1'");
    reject_chat("{" HI ",\"logit_bias\":{\"+1\":1}}", "logit_bias", NULL);
    reject_chat("{" HI ",\"logit_bias\":{\" 1\":1}}", "logit_bias", NULL);
    reject_chat("{" HI ",\"logit_bias\":{\"1 \":1}}", "logit_bias", NULL);
    reject_chat("{" HI ",\"logit_bias\":{\"\":1}}", "logit_bias", NULL);
    reject_chat("{" HI ",\"logit_bias\":{\"99999999999999999999999\":1}}", "logit_bias", NULL);
    reject_chat("{" HI ",\"logit_bias\":{\"1\":100.5}}", "logit_bias", "[-100, 100]");
    reject_chat("{" HI ",\"logit_bias\":{\"1\":\"5\"}}", "logit_bias", "must be a number");
    reject_chat("{" HI ",\"logit_bias\":[1]}", "logit_bias", "must be an object");

    struct body b = {0};
    add(&b, "{" HI ",\"logit_bias\":{");
    for (int i = 0; i < OAI_MAX_BIAS; i++)  /* ids past VOCAB again, spelled "0<id>" */
        add(&b, i < VOCAB ? "%s\"%d\":%d" : "%s\"0%d\":%d", i ? "," : "", i % VOCAB, i % 7);
    size_t at = b.len;
    add(&b, "}}");
    accept_n(&r, OAI_CHAT, b.s, b.len);
    assert_int_equal(r.n_bias, VOCAB);  /* 1024 keys over 1000 ids */
    oai_request_free(&r);
    b.len = at;
    add(&b, ",\"005\":1}}");
    reject_n(OAI_CHAT, b.s, b.len, "logit_bias", "at most 1024");
    /* a long key is quoted cut short */
    b.len = 0;
    add(&b, "{" HI ",\"logit_bias\":{\"");
    for (int i = 0; i < 200; i++)
        add(&b, "k");
    add(&b, "\":1}}");
    struct oai_error err = {0};
    assert_int_equal(oai_request_parse(&r, OAI_CHAT, b.s, b.len, VOCAB, &err), -1);
    assert_non_null(strstr(err.message, "kkk...'"));
    assert_true(strlen(err.message) < 150);
    free(b.s);
}

static void stream(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_true(r.stream && r.include_usage);
    oai_request_free(&r);
    accept(&r, OAI_COMPLETIONS, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{}}");
    assert_true(r.stream);
    assert_false(r.include_usage);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"stream\":false,\"stream_options\":null}");
    assert_false(r.stream);
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{" HI ",\"stream_options\":null}");
    oai_request_free(&r);
    reject_chat("{" HI ",\"stream_options\":{\"include_usage\":true}}", "stream_options", "only allowed when stream");
    reject_chat("{" HI ",\"stream\":false,\"stream_options\":{}}", "stream_options", NULL);
    reject_chat("{" HI ",\"stream\":true,\"stream_options\":true}", "stream_options", "must be an object");
    reject_chat("{" HI ",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "stream_options.include_usage",
                "must be a boolean");
    reject_chat("{" HI ",\"stream\":\"true\"}", "stream", "'stream' must be a boolean");
}

/* ---- the body ---- */

static void body_json(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, " \t\r\n{" HI "} \n\t\r ");
    oai_request_free(&r);
    reject_n(OAI_CHAT, "", 0, "", "empty");
    reject_n(OAI_CHAT, NULL, 0, "", "empty");
    reject_chat("   ", "", "not valid JSON");
    reject_chat("{" HI "}x", "", "(error at byte 45)");
    reject_chat("{" HI "}{}", "", "not valid JSON");
    reject_chat("{" HI "}\f", "", "not valid JSON");
    reject_chat("\x01{" HI "}", "", "(error at byte 0)");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", "", "not valid JSON");
    reject_chat("{\"messages\":", "", "not valid JSON");
    reject_chat("{\"a\":1,}", "", "not valid JSON");
    reject_chat("[]", "", "must be a JSON object");
    reject_chat("\"x\"", "", "must be a JSON object");
    reject_chat("null", "", "must be a JSON object");
    /* body is not NUL-terminated: nothing past len is read */
    const char *full = "{" HI "}garbage";
    accept_n(&r, OAI_CHAT, full, strlen("{" HI "}"));
    oai_request_free(&r);
    reject_n(OAI_CHAT, full, strlen("{" HI), "", "not valid JSON");
}

/* Numbers as RFC 8259 writes them (cJSON alone takes "02", "1." and "-.5"), and no key
 * twice (cJSON would read the first, Python's json the last): both a 400 naming the place. */
static void body_strict(void **state)
{
    (void)state;
    struct oai_request r;
    accept(&r, OAI_CHAT, "{" HI ",\"temperature\":0.5,\"max_tokens\":20,\"seed\":-0,\"top_p\":1e-1}");
    oai_request_free(&r);
    reject_chat("{" HI ",\"max_tokens\":02}", "max_tokens", "leading zeros");
    reject_chat("{" HI ",\"temperature\":1.}", "temperature", "not valid JSON");
    reject_chat("{" HI ",\"temperature\":-.5}", "temperature", "not valid JSON");
    reject_chat("{" HI ",\"logit_bias\":{\"5\":-01}}", "logit_bias.5", "not valid JSON");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":[00]}]}",
                "messages[1].content[0]", "not valid JSON");
    reject_chat("{" HI ",\"max_tokens\":2,\"max_tokens\":3}", "max_tokens", "appears twice");
    reject_chat("{\"messages\":[{\"role\":\"user\",\"role\":\"system\",\"content\":\"a\"}]}",
                "messages[0].role", "appears twice");
    reject_chat("{" HI ",\"a\\u0062\":1,\"ab\":2}", "ab", "appears twice");
    /* a number-like run inside a string is a string */
    accept(&r, OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"02 1. -.5\"}]}");
    oai_request_free(&r);
}

static void body_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t len;
        const char *want;
    } k[] = {
#define B(lit, want) {lit, sizeof lit - 1, want}
        B("{\"model\":\"\xc0\xaf\"," HI "}", "not valid UTF-8 (at byte 10)"),        /* overlong '/' */
        B("{\"model\":\"\xe0\x80\xaf\"," HI "}", "not valid UTF-8 (at byte 10)"),    /* overlong, 3 bytes */
        B("{\"model\":\"\xed\xa0\x80\"," HI "}", "not valid UTF-8 (at byte 10)"),    /* U+D800 */
        B("{\"model\":\"\xf4\x90\x80\x80\"," HI "}", "not valid UTF-8 (at byte 10)"), /* U+110000 */
        B("{\"model\":\"\xe2\x82\"," HI "}", "not valid UTF-8 (at byte 10)"),        /* cut short */
        B("{\"model\":\"\xff\"," HI "}", "not valid UTF-8"),
        B("{" HI "}\xe2\x82", "not valid UTF-8"),                                   /* cut at the end */
        B("{\"model\":\"a\0b\"," HI "}", "NUL byte (at byte 11)"),
        B("{" HI "}\0", "NUL byte"),
        B("{\"model\":\"a\\u0000b\"," HI "}", "must not contain NUL"),
        B("{\"a\\u0000\":1," HI "}", "must not contain NUL"),
        B("{\"model\":\"\\\\\\u0000\"," HI "}", "must not contain NUL"),          /* \\ then \u0000 */
        B("{\"model\":\"\\ud800\"," HI "}", "not valid JSON"),                     /* lone surrogate escape */
        B("{\"model\":\"\\udc00\\ud800\"," HI "}", "not valid JSON"),
#undef B
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        reject_n(OAI_CHAT, k[i].s, k[i].len, "", k[i].want);

    /* an escaped backslash before u0000 is not a NUL escape; a valid pair is fine */
    struct oai_request r;
    accept(&r, OAI_CHAT, "{\"model\":\"\\\\u0000 \\ud83d\\ude00 \\u0001\"," HI "}");
    assert_string_equal(r.model, "\\u0000 \xf0\x9f\x98\x80 \x01");
    oai_request_free(&r);
    accept(&r, OAI_CHAT, "{\"model\":\"\xf4\x8f\xbf\xbf \xef\xbf\xbd\"," HI "}");  /* U+10FFFF */
    oai_request_free(&r);
}

/* "[" * n, then "]" * n, inside {"a": ...}; NULL body with n <= 0. */
static char *nested(int n, size_t *len)
{
    char *s = malloc((size_t)n * 2 + 16);
    assert_non_null(s);
    size_t at = 0;
    memcpy(s, "{\"a\":", 5);
    at = 5;
    memset(s + at, '[', (size_t)n);
    at += (size_t)n;
    memset(s + at, ']', (size_t)n);
    at += (size_t)n;
    s[at++] = '}';
    *len = at;
    return s;
}

static void body_depth(void **state)
{
    (void)state;
    size_t len;
    struct oai_error err = {0};
    char *s = nested(OAI_MAX_JSON_DEPTH - 1, &len);  /* the object plus 63 arrays */
    cJSON *o = oai_parse_object(s, len, &err);
    if (!o)
        fail_msg("%s", err.message);
    cJSON_Delete(o);
    free(s);
    s = nested(OAI_MAX_JSON_DEPTH, &len);
    assert_null(oai_parse_object(s, len, &err));
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "nested more than 64 levels"));
    free(s);
    /* brackets inside strings do not count */
    struct oai_request r;
    accept(&r, OAI_CHAT, "{\"model\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"{{\"," HI "}");
    oai_request_free(&r);

    s = nested(100000, &len);
    clock_t t0 = clock();
    reject_n(OAI_CHAT, s, len, "", "nested more than 64 levels");
    reject_n(OAI_COMPLETIONS, s, len, "", "nested");
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    free(s);
    if (secs > 0.1)
        fail_msg("a 100000-deep body took %.3f s to reject", secs);
}

static void parse_object(void **state)
{
    (void)state;
    struct oai_error err = {0};
    const char *body = "{\"text\":\"hi\",\"add_special\":true}";
    cJSON *o = oai_parse_object(body, strlen(body), &err);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "text")->valuestring, "hi");
    cJSON_Delete(o);
    assert_null(oai_parse_object("[1]", 3, &err));
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, "");
    static const char surrogate[] = "{\"a\":\"\xed\xa0\x80\"}";
    assert_null(oai_parse_object(surrogate, sizeof surrogate - 1, &err));
    assert_non_null(strstr(err.message, "UTF-8"));
    assert_null(oai_parse_object("{} x", 4, &err));
    assert_non_null(strstr(err.message, "(error at byte 3)"));
}

/* ---- errors ---- */

static cJSON *error_json(const struct oai_error *err)
{
    char *s = oai_error_json(err);
    assert_non_null(s);
    size_t n = strlen(s), need;
    for (size_t i = 0; i < n;) {
        size_t k = tok_utf8_seq((const unsigned char *)s + i, n - i, &need);
        if (!(need > 0 && k == need))
            fail_msg("invalid UTF-8 at byte %zu of %s", i, s);
        i += k;
    }
    cJSON *o = cJSON_Parse(s);
    free(s);
    assert_non_null(o);
    assert_int_equal(cJSON_GetArraySize(o), 1);
    cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_true(cJSON_IsObject(e));
    assert_int_equal(cJSON_GetArraySize(e), 4);
    return o;
}

static const cJSON *err_field(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), key);
}

static void error_shape(void **state)
{
    (void)state;
    struct oai_error err;
    assert_int_equal(oai_errorf(&err, 404, "not_found_error", "model_not_found", NULL, "model '%s' not found", "x"),
                     -1);
    assert_int_equal(err.status, 404);
    cJSON *o = error_json(&err);
    assert_string_equal(err_field(o, "message")->valuestring, "model 'x' not found");
    assert_string_equal(err_field(o, "type")->valuestring, "not_found_error");
    assert_string_equal(err_field(o, "code")->valuestring, "model_not_found");
    assert_true(cJSON_IsNull(err_field(o, "param")));
    cJSON_Delete(o);

    /* from the parser: param set, code null */
    struct oai_request r;
    const char *body = "{" HI ",\"n\":99}";
    assert_int_equal(oai_request_parse(&r, OAI_CHAT, body, strlen(body), VOCAB, &err), -1);
    o = error_json(&err);
    assert_string_equal(err_field(o, "param")->valuestring, "n");
    assert_string_equal(err_field(o, "type")->valuestring, "invalid_request_error");
    assert_true(cJSON_IsNull(err_field(o, "code")));
    assert_non_null(strstr(err_field(o, "message")->valuestring, "'n' must be an integer in [1, 16]"));
    cJSON_Delete(o);

    /* arbitrary bytes: invalid UTF-8 becomes '?', control bytes ' ', quotes are escaped */
    oai_errorf(&err, 400, "invalid_request_error", NULL, "p\xff", "a\xc3\"b\n\x01\xed\xa0\x80z\xe2\x82\xac");
    o = error_json(&err);
    assert_string_equal(err_field(o, "message")->valuestring, "a?\"b  ???z\xe2\x82\xac");
    assert_string_equal(err_field(o, "param")->valuestring, "p?");
    cJSON_Delete(o);

    /* a message cut by its buffer drops the partial character */
    char big[600];
    memset(big, 'a', 510);
    strcpy(big + 510, "\xe2\x82\xac tail");
    oai_errorf(&err, 400, "invalid_request_error", NULL, NULL, "%s", big);
    assert_int_equal(strlen(err.message), 510);
    o = error_json(&err);
    cJSON_Delete(o);

    /* a struct filled by hand without a NUL and with no type */
    memset(&err, 0xff, sizeof err);
    err.status = 500;
    err.type = NULL;
    err.code = NULL;
    o = error_json(&err);
    assert_string_equal(err_field(o, "type")->valuestring, "server_error");
    assert_int_equal(strlen(err_field(o, "message")->valuestring), sizeof err.message);
    cJSON_Delete(o);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(chat_minimal),
    cmocka_unit_test(chat_messages),
    cmocka_unit_test(chat_message_errors),
    cmocka_unit_test(chat_role_quoted),
    cmocka_unit_test(chat_images),
    cmocka_unit_test(chat_message_bounds),
    cmocka_unit_test(chat_logprobs),
    cmocka_unit_test(cmpl_prompt),
    cmocka_unit_test(cmpl_prompt_ids_bound),
    cmocka_unit_test(cmpl_logprobs),
    cmocka_unit_test(max_tokens),
    cmocka_unit_test(sampling),
    cmocka_unit_test(seed),
    cmocka_unit_test(stop),
    cmocka_unit_test(n_and_user),
    cmocka_unit_test(logit_bias),
    cmocka_unit_test(stream),
    cmocka_unit_test(body_json),
    cmocka_unit_test(body_strict),
    cmocka_unit_test(body_bytes),
    cmocka_unit_test(body_depth),
    cmocka_unit_test(parse_object),
    cmocka_unit_test(error_shape),
};

TEST_SUITE(oai_request, tests);
