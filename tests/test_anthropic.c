/*
 * The Anthropic dialect's rendering of a generation's state (api_anthropic.c),
 * below HTTP: a choice holding reasoning, content and tool calls (the tool
 * calls as outparse reports them from a Hermes output) becomes a message
 * whose content blocks are thinking, text, tool_use (input: the parsed
 * arguments) with stop_reason "tool_use"; streamed, the same state becomes
 * Anthropic's named events with blocks opened and closed in order and a
 * text block that grows across pumps kept as one block; a stop string gives
 * "stop_sequence" and the string; a failed generation ends the stream with
 * an error event; errors have Anthropic's shape and types per status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api_anthropic.h"
#include "server/gen.h"
#include "server/outparse.h"
#include "test.h"

/* A generation without HTTP or engine: one choice, the given prompt and output counts. */
static struct gen *fake_gen(struct server *s, int n_prompt, int n_out)
{
    struct gen *g = calloc(1, sizeof *g);
    assert_non_null(g);
    g->s = s;
    g->model = &s->single;  /* the model answering (no router: no references) */
    g->n = 1;
    g->ch = calloc(1, sizeof *g->ch);
    assert_non_null(g->ch);
    g->d = &anthropic_dialect;
    g->n_prompt = n_prompt;
    g->ch[0].consumed = n_out;
    snprintf(g->id, sizeof g->id, "msg_0123");
    assert_non_null(g->ch[0].tool_calls = cJSON_CreateArray());
    assert_int_equal(gbuf_add(&g->ch[0].content, "", 0), 0);
    assert_int_equal(gbuf_add(&g->ch[0].reasoning, "", 0), 0);
    return g;
}

static void add_text(struct gbuf *b, const char *s)
{
    assert_int_equal(gbuf_add(b, s, strlen(s)), 0);
}

/* What gen's emit does with outparse's events. */
static int collect(void *ud, const struct outparse_event *ev)
{
    struct gen_choice *c = ud;
    if (ev->kind == OUTPARSE_TEXT)
        return gbuf_add(&c->content, ev->text, ev->len);
    if (ev->kind == OUTPARSE_REASONING)
        return gbuf_add(&c->reasoning, ev->text, ev->len);
    cJSON *t = cJSON_CreateObject();
    char *args = strndup(ev->text, ev->len);
    cJSON_AddStringToObject(t, "id", ev->id);
    cJSON_AddStringToObject(t, "name", ev->name);
    cJSON_AddStringToObject(t, "arguments", args);
    free(args);
    cJSON_AddItemToArray(c->tool_calls, t);
    return 0;
}

/* The choice's state from a Qwen-style output: reasoning, text, one Hermes tool call. */
static void parse_output(struct gen_choice *c, const char *out)
{
    struct outparse *p = NULL;
    struct err e = {0};
    cJSON *tools = cJSON_Parse("[{\"name\": \"get_weather\", \"input_schema\": {\"type\": \"object\"}}]");
    struct outparse_opts o = {.format = OUTPARSE_HERMES, .reasoning = true, .tools = tools, .id_seed = 7};
    assert_int_equal(outparse_new(&p, &o, &e), 0);
    assert_int_equal(outparse_feed(p, out, strlen(out), collect, c), 0);
    assert_int_equal(outparse_finish(p, collect, c), 0);
    outparse_free(p);
    cJSON_Delete(tools);
}

static const char k_output[] = "<think>The user wants weather.</think>Let me check.\n"
                               "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

static void full_message_with_tool_use(void **state)
{
    (void)state;
    struct server s = {0};
    snprintf(s.single.id, sizeof s.single.id, "tiny");
    struct gen *g = fake_gen(&s, 12, 30);
    struct gen_choice *c = &g->ch[0];
    parse_output(c, k_output);
    assert_int_equal(cJSON_GetArraySize(c->tool_calls), 1);
    c->finished = true;
    c->finish = GEN_FINISH_TOOL_CALLS;

    cJSON *m = anthropic_dialect.full(g);
    assert_non_null(m);
    assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "msg_0123");
    assert_string_equal(cJSON_GetObjectItem(m, "type")->valuestring, "message");
    assert_string_equal(cJSON_GetObjectItem(m, "model")->valuestring, "tiny");
    assert_string_equal(cJSON_GetObjectItem(m, "stop_reason")->valuestring, "tool_use");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "stop_sequence")));
    const cJSON *content = cJSON_GetObjectItem(m, "content");
    assert_int_equal(cJSON_GetArraySize(content), 3);
    const cJSON *th = cJSON_GetArrayItem(content, 0), *tx = cJSON_GetArrayItem(content, 1);
    const cJSON *tu = cJSON_GetArrayItem(content, 2);
    assert_string_equal(cJSON_GetObjectItem(th, "type")->valuestring, "thinking");
    assert_string_equal(cJSON_GetObjectItem(th, "thinking")->valuestring, "The user wants weather.");
    assert_string_equal(cJSON_GetObjectItem(th, "signature")->valuestring, "");
    assert_string_equal(cJSON_GetObjectItem(tx, "type")->valuestring, "text");
    assert_string_equal(cJSON_GetObjectItem(tx, "text")->valuestring, "Let me check.\n");
    assert_string_equal(cJSON_GetObjectItem(tu, "type")->valuestring, "tool_use");
    assert_string_equal(cJSON_GetObjectItem(tu, "name")->valuestring, "get_weather");
    assert_string_equal(cJSON_GetObjectItem(tu, "id")->valuestring,
                        cJSON_GetObjectItem(cJSON_GetArrayItem(c->tool_calls, 0), "id")->valuestring);
    const cJSON *input = cJSON_GetObjectItem(tu, "input");
    assert_true(cJSON_IsObject(input));
    assert_string_equal(cJSON_GetObjectItem(input, "city")->valuestring, "Paris");
    const cJSON *u = cJSON_GetObjectItem(m, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 12);
    assert_int_equal(cJSON_GetObjectItem(u, "output_tokens")->valueint, 30);
    cJSON_Delete(m);
    gen_free(g);
}

/* The stream's events as "name" or "name:index" (one line each), checking that every
 * frame is `event: <name>\ndata: {"type": <name>, ...}`. */
static char *event_names(const struct gen *g)
{
    static char out[4096];
    size_t at = 0;
    out[0] = 0;
    char *text = strndup(g->sse.p, g->sse.len);
    for (char *f = text, *end; f && *f; f = end ? end + 2 : NULL) {
        end = strstr(f, "\n\n");
        assert_non_null(end);
        *end = 0;
        assert_int_equal(strncmp(f, "event: ", 7), 0);
        char *nl = strchr(f, '\n');
        assert_non_null(nl);
        *nl = 0;
        assert_int_equal(strncmp(nl + 1, "data: ", 6), 0);
        cJSON *d = cJSON_Parse(nl + 7);
        assert_non_null(d);
        assert_string_equal(cJSON_GetObjectItem(d, "type")->valuestring, f + 7);
        const cJSON *ix = cJSON_GetObjectItem(d, "index");
        at += (size_t)snprintf(out + at, sizeof out - at, ix ? "%s:%d\n" : "%s\n", f + 7, ix ? ix->valueint : 0);
        cJSON_Delete(d);
    }
    free(text);
    return out;
}

static void stream_blocks_in_order(void **state)
{
    (void)state;
    struct server s = {0};
    snprintf(s.single.id, sizeof s.single.id, "tiny");
    struct gen *g = fake_gen(&s, 12, 30);
    struct gen_choice *c = &g->ch[0];
    /* pump 1: reasoning and the start of the text */
    add_text(&c->reasoning, "The user wants weather.");
    add_text(&c->content, "Let me ");
    assert_int_equal(anthropic_dialect.events(g), 0);
    /* pump 2: more text (the same block), then the call */
    add_text(&c->content, "check.");
    cJSON *call = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", "call_1");
    cJSON_AddStringToObject(call, "name", "get_weather");
    cJSON_AddStringToObject(call, "arguments", "{\"city\": \"Paris\"}");
    cJSON_AddItemToArray(c->tool_calls, call);
    c->finished = true;
    c->finish = GEN_FINISH_TOOL_CALLS;
    assert_int_equal(anthropic_dialect.events(g), 0);
    assert_int_equal(anthropic_dialect.tail(g), 0);
    assert_string_equal(event_names(g), "message_start\n"
                                        "content_block_start:0\ncontent_block_delta:0\ncontent_block_stop:0\n"
                                        "content_block_start:1\ncontent_block_delta:1\ncontent_block_delta:1\n"
                                        "content_block_stop:1\n"
                                        "content_block_start:2\ncontent_block_delta:2\ncontent_block_stop:2\n"
                                        "message_delta\nmessage_stop\n");
    /* the payloads that matter to a client */
    assert_non_null(strstr(g->sse.p, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
                                     "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}"));
    assert_non_null(strstr(g->sse.p, "\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"The user wants weather.\"}"));
    assert_non_null(strstr(g->sse.p, "\"delta\":{\"type\":\"text_delta\",\"text\":\"check.\"}"));
    assert_non_null(strstr(g->sse.p, "{\"type\":\"content_block_start\",\"index\":2,\"content_block\":"
                                     "{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"get_weather\",\"input\":{}}}"));
    assert_non_null(strstr(g->sse.p, "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
                                     "\"{\\\"city\\\":\\\"Paris\\\"}\"}"));
    assert_non_null(strstr(g->sse.p, "\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null}"));
    assert_non_null(strstr(g->sse.p, "\"output_tokens\":30"));
    gen_free(g);
}

static void stop_sequence_and_error(void **state)
{
    (void)state;
    struct server s = {0};
    struct gen *g = fake_gen(&s, 3, 4);
    struct gen_choice *c = &g->ch[0];
    static const char k_stop[] = "END";
    add_text(&c->content, "abc");
    c->finished = true;
    c->finish = GEN_FINISH_STOP;
    c->stop_seq = k_stop;
    cJSON *m = anthropic_dialect.full(g);
    assert_string_equal(cJSON_GetObjectItem(m, "stop_reason")->valuestring, "stop_sequence");
    assert_string_equal(cJSON_GetObjectItem(m, "stop_sequence")->valuestring, "END");
    cJSON_Delete(m);
    c->stop_seq = NULL;
    m = anthropic_dialect.full(g);
    assert_string_equal(cJSON_GetObjectItem(m, "stop_reason")->valuestring, "end_turn");
    cJSON_Delete(m);
    c->finish = GEN_FINISH_LENGTH;
    m = anthropic_dialect.full(g);
    assert_string_equal(cJSON_GetObjectItem(m, "stop_reason")->valuestring, "max_tokens");
    cJSON_Delete(m);

    /* a failed generation: the stream ends with an error event after what was sent */
    assert_int_equal(anthropic_dialect.events(g), 0);
    g->rc = -1;
    oai_errorf(&g->err, 500, "server_error", NULL, NULL, "generation failed: boom");
    assert_int_equal(anthropic_dialect.tail(g), 0);
    assert_string_equal(event_names(g), "message_start\ncontent_block_start:0\ncontent_block_delta:0\nerror\n");
    assert_non_null(strstr(g->sse.p, "data: {\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                                     "\"message\":\"generation failed: boom\"}}\n\n"));
    gen_free(g);
}

static void error_shapes(void **state)
{
    (void)state;
    static const struct {
        int status;
        const char *type;
    } k[] = {{400, "invalid_request_error"}, {401, "authentication_error"}, {404, "not_found_error"},
             {413, "request_too_large"},     {429, "rate_limit_error"},     {500, "api_error"},
             {503, "overloaded_error"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        struct oai_error err;
        oai_errorf(&err, k[i].status, "whatever", "code", "param", "msg %d \xff", k[i].status);
        char *body = anthropic_error_json(&err);
        assert_non_null(body);
        cJSON *j = cJSON_Parse(body);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItem(j, "type")->valuestring, "error");
        const cJSON *e = cJSON_GetObjectItem(j, "error");
        assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, k[i].type);
        assert_int_equal(strncmp(cJSON_GetObjectItem(e, "message")->valuestring, "msg ", 4), 0);
        assert_int_equal(cJSON_GetArraySize(e), 2);
        cJSON_Delete(j);
        free(body);
    }
}

/* The body (a JSON text) through anthropic_translate as /v1/messages; its status. */
static int translate_text(const char *body, struct oai_request *q, struct oai_error *err)
{
    cJSON *root = cJSON_Parse(body);
    assert_non_null(root);
    int rc = anthropic_translate(root, false, 1000, q, err);
    cJSON_Delete(root);
    return rc;
}

/* tool_result blocks become tool messages with their tool_call_id, text between them a user
 * message; max_tokens null is missing, as Anthropic requires it. */
static void translate_tool_results_and_max_tokens(void **state)
{
    (void)state;
    struct oai_request q;
    struct oai_error err;
    assert_int_equal(translate_text("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":["
                                    "{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"18C\"},"
                                    "{\"type\":\"text\",\"text\":\"and?\"},"
                                    "{\"type\":\"tool_result\",\"tool_use_id\":\"t2\"}]}]}",
                                    &q, &err),
                     0);
    assert_int_equal(cJSON_GetArraySize(q.messages), 3);
    const cJSON *m0 = cJSON_GetArrayItem(q.messages, 0), *m2 = cJSON_GetArrayItem(q.messages, 2);
    assert_string_equal(cJSON_GetObjectItem(m0, "role")->valuestring, "tool");
    assert_string_equal(cJSON_GetObjectItem(m0, "tool_call_id")->valuestring, "t1");
    assert_string_equal(cJSON_GetObjectItem(m0, "content")->valuestring, "18C");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(q.messages, 1), "role")->valuestring, "user");
    assert_string_equal(cJSON_GetObjectItem(m2, "tool_call_id")->valuestring, "t2");
    assert_string_equal(cJSON_GetObjectItem(m2, "content")->valuestring, "");
    assert_int_equal(q.max_tokens, 8);
    oai_request_free(&q);

    assert_int_equal(translate_text("{\"max_tokens\":null,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                                    &q, &err),
                     -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.message, "max_tokens: field required");
    assert_null(q.messages);

    /* an input_schema of another type than object is refused under its own name */
    assert_int_equal(translate_text("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                    "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"string\"}}]}", &q, &err),
                     -1);
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "'tools[0].input_schema' must be a schema of type 'object'"));

    /* Anthropic's ranges: temperature 0..1 (OpenAI's 0..2 is not), top_k an integer >= 0 */
    static const struct { const char *field, *want; } bad_sampling[] = {
        {"\"temperature\":1.5", "temperature: must be a number from 0 to 1"},
        {"\"temperature\":-0.1", "temperature: must be a number from 0 to 1"},
        {"\"temperature\":\"1\"", "temperature: must be a number from 0 to 1"},
        {"\"top_k\":-1", "top_k: must be an integer >= 0"},
        {"\"top_k\":2.5", "top_k: must be an integer >= 0"},
        {"\"top_k\":true", "top_k: must be an integer >= 0"},
    };
    char body[256];
    for (size_t i = 0; i < sizeof bad_sampling / sizeof bad_sampling[0]; i++) {
        snprintf(body, sizeof body, "{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}",
                 bad_sampling[i].field);
        assert_int_equal(translate_text(body, &q, &err), -1);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.type, "invalid_request_error");
        assert_string_equal(err.message, bad_sampling[i].want);
        assert_int_equal(strncmp(err.param, bad_sampling[i].field + 1, strlen(err.param)), 0);
        assert_true(err.param[0]);
    }
    assert_int_equal(translate_text("{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                    "\"temperature\":1,\"top_k\":0}", &q, &err), 0);
    assert_true(q.temperature == 1.0f && q.top_k == 0);
    oai_request_free(&q);
}

/* A body of ~100k tool_result blocks (what a 4 MiB body holds) is refused in linear time: each
 * tool message used to be found again by walking all the messages before it, quadratic (found
 * by fuzz_anthropic's review: minutes of CPU for one request). */
static void translate_many_tool_results_fast(void **state)
{
    (void)state;
    enum { N_MSG = 400, N_BLOCK = OAI_MAX_CONTENT_PARTS };
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(root, "messages");
    assert_non_null(cJSON_AddNumberToObject(root, "max_tokens", 8));
    for (int i = 0; i < N_MSG; i++) {
        cJSON *m = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(m, "content");
        assert_non_null(cJSON_AddStringToObject(m, "role", "user"));
        for (int j = 0; j < N_BLOCK; j++) {
            cJSON *b = cJSON_CreateObject();
            assert_non_null(cJSON_AddStringToObject(b, "type", "tool_result"));
            assert_non_null(cJSON_AddStringToObject(b, "tool_use_id", "t"));
            assert_true(cJSON_AddItemToArray(content, b));
        }
        assert_true(cJSON_AddItemToArray(msgs, m));
    }
    struct oai_request q;
    struct oai_error err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(anthropic_translate(root, false, 1000, &q, &err), -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_int_equal(err.status, 400);  /* more than OAI_MAX_MESSAGES messages */
    assert_null(q.messages);
    /* linear: well under a second (ASan: ~2 s); quadratic was ~30 s (ASan: minutes) */
    assert_true(s < 10.0);
    cJSON_Delete(root);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(full_message_with_tool_use),
    cmocka_unit_test(stream_blocks_in_order),
    cmocka_unit_test(stop_sequence_and_error),
    cmocka_unit_test(error_shapes),
    cmocka_unit_test(translate_tool_results_and_max_tokens),
    cmocka_unit_test(translate_many_tool_results_fast),
};

TEST_SUITE(anthropic, tests);
