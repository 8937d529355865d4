/*
 * The Responses API below HTTP (src/server/api_responses.h): the body's
 * translation into the chat request (input items into messages, consecutive
 * function_call items into one assistant turn, flat tools into chat's, errors
 * named by this API's fields), and the dialect on a generation whose output is
 * set by hand (what outparse would give: reasoning, text, tool calls), which
 * the integration tests cannot get out of the tiny test model: the output
 * items of the full answer, and the typed event stream, whose final response
 * must hold exactly the items of the full answer.
 */
#include <stdlib.h>
#include <string.h>

#include "server/api_responses.h"
#include "test.h"

static const char k_model[] = "tiny";

/* The chat messages a body translates to (the test fails on an error). */
static cJSON *messages_of(const char *body)
{
    cJSON *root = cJSON_Parse(body);
    struct oai_request q;
    struct oai_error err = {0};
    cJSON *echo = NULL;
    assert_non_null(root);
    if (responses_translate(root, 1000, &q, &echo, &err) < 0)
        fail_msg("%s: %s (%s)", body, err.message, err.param);
    cJSON_Delete(root);
    cJSON *m = q.messages;
    q.messages = NULL;
    oai_request_free(&q);
    cJSON_Delete(echo);
    return m;
}

static void assert_json(const cJSON *got, const char *want)
{
    cJSON *w = cJSON_Parse(want);
    assert_non_null(w);
    if (!cJSON_Compare(got, w, true)) {
        char *g = cJSON_PrintUnformatted(got);
        fail_msg("got  %s\nwant %s", g, want);
    }
    cJSON_Delete(w);
}

static void test_input_items(void **state)
{
    (void)state;
    cJSON *m = messages_of("{\"instructions\": \"be brief\", \"input\": ["
                           "{\"role\": \"developer\", \"content\": \"rules\"},"
                           "{\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\"},"
                           " {\"type\": \"input_text\", \"text\": \"b\"}]},"
                           "{\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": []},"
                           "{\"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"t\"}]},"
                           "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{\\\"x\\\":1}\"},"
                           "{\"type\": \"function_call\", \"call_id\": \"c2\", \"name\": \"g\", \"arguments\": \"{}\"},"
                           "{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"one\"},"
                           "{\"type\": \"function_call_output\", \"call_id\": \"c2\", \"output\": [{\"type\": \"input_text\", \"text\": \"two\"}]},"
                           "{\"type\": \"function_call\", \"call_id\": \"c3\", \"name\": \"f\", \"arguments\": \"{}\"}]}");
    /* the shared parser keeps arguments that are JSON objects as objects, for the templates */
    assert_json(m, "[{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"system\", \"content\": \"rules\"},"
                   "{\"role\": \"user\", \"content\": \"ab\"},"
                   "{\"role\": \"assistant\", \"content\": \"t\", \"tool_calls\": ["
                   "{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}},"
                   "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": {}}}]},"
                   "{\"role\": \"tool\", \"content\": \"one\", \"tool_call_id\": \"c1\"},"
                   "{\"role\": \"tool\", \"content\": \"two\", \"tool_call_id\": \"c2\"},"
                   "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
                   "{\"id\": \"c3\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}]");
    cJSON_Delete(m);
    m = messages_of("{\"input\": \"hi\"}");
    assert_json(m, "[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON_Delete(m);
}

static void test_translated_fields(void **state)
{
    (void)state;
    cJSON *root = cJSON_Parse("{\"input\": \"hi\", \"max_output_tokens\": 7, \"temperature\": 0.5,"
                              " \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"type\": \"object\"}, \"strict\": true}],"
                              " \"tool_choice\": \"none\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\","
                              " \"schema\": {\"type\": \"object\"}}}, \"store\": true, \"metadata\": {\"a\": \"b\"}}");
    struct oai_request q;
    struct oai_error err = {0};
    cJSON *echo = NULL;
    assert_int_equal(responses_translate(root, 1000, &q, &echo, &err), 0);
    assert_int_equal(q.max_tokens, 7);
    assert_true(q.has_temperature);
    assert_int_equal(q.tool_choice, OAI_TOOL_CHOICE_NONE);
    assert_int_equal(q.format, OAI_FORMAT_JSON_SCHEMA);
    assert_json(q.format_schema, "{\"type\": \"object\"}");
    assert_json(q.tools, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}, \"strict\": true}}]");
    assert_int_equal(q.n, 1);
    assert_json(cJSON_GetObjectItem(echo, "text"), "{\"format\": {\"type\": \"json_schema\", \"name\": \"n\","
                                                   " \"schema\": {\"type\": \"object\"}}}");
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(echo, "store")));
    oai_request_free(&q);
    cJSON_Delete(echo);
    cJSON_Delete(root);
}

static void test_errors(void **state)
{
    (void)state;
    static const char *const k_cases[][2] = {
        {"{}", "input"},
        {"{\"input\": []}", "input"},
        {"{\"input\": [{\"type\": \"reasoning\"}]}", "input"},
        {"{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "input[0].role"},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\"}]}]}", "input[0].content[0]"},
        {"{\"input\": [\"x\", {\"type\": \"function_call\", \"call_id\": 1}]}", "input[0]"},
        {"{\"input\": [{\"role\": \"user\", \"content\": \"x\"}, {\"type\": \"function_call\", \"call_id\": 1}]}",
         "input[1].call_id"},
        {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\", \"output\": 5}]}", "input[0].output"},
        /* an output with no function_call before it with its call_id (OpenAI: 400 "No tool call found") */
        {"{\"input\": [{\"role\": \"user\", \"content\": \"x\"}, {\"type\": \"function_call_output\", "
         "\"call_id\": \"c\", \"output\": \"o\"}]}", "input[1].call_id"},
        {"{\"input\": [{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{}\"}, "
         "{\"type\": \"function_call_output\", \"call_id\": \"c2\", \"output\": \"o\"}]}", "input[1].call_id"},
        {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"o\"}, "
         "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{}\"}]}", "input[0].call_id"},
        {"{\"input\": \"x\", \"previous_response_id\": \"resp_1\"}", "previous_response_id"},
        {"{\"input\": \"x\", \"max_output_tokens\": -1}", "max_output_tokens"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"file_search\"}]}", "tools[0]"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"\"}]}", "tools[0].name"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"description\": 1}]}", "tools[0]"},
        {"{\"input\": \"x\", \"tool_choice\": {\"type\": \"web_search\"}}", "tool_choice"},
        {"{\"input\": \"x\", \"tool_choice\": \"required\"}", "tool_choice"},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"schema\": {}}}}", "text.format.name"},
        {"{\"input\": \"x\", \"text\": 1}", "text"},
        {"{\"input\": \"x\", \"reasoning\": \"high\"}", "reasoning"},
        {"{\"input\": \"x\", \"top_p\": 0}", "top_p"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        cJSON *root = cJSON_Parse(k_cases[i][0]);
        struct oai_request q;
        struct oai_error err = {0};
        cJSON *echo = (cJSON *)&err;  /* anything but NULL: a failure sets it NULL */
        assert_non_null(root);
        if (responses_translate(root, 1000, &q, &echo, &err) == 0)
            fail_msg("%s: accepted", k_cases[i][0]);
        assert_null(echo);
        assert_int_equal(err.status, 400);
        if (strcmp(err.param, k_cases[i][1]) != 0)
            fail_msg("%s: param '%s' (%s), want '%s'", k_cases[i][0], err.param, err.message, k_cases[i][1]);
        assert_null(strstr(err.message, "max_tokens"));
        assert_null(strstr(err.message, ".function"));
        cJSON_Delete(root);
    }
}

// ---- the dialect on a hand-made generation ----

struct fake {
    struct server s;
    struct gen *g;
};

static void fake_open(struct fake *f, const char *body)
{
    memset(&f->s, 0, sizeof f->s);
    strcpy(f->s.single.id, k_model);
    struct gen *g = f->g = calloc(1, sizeof *g);
    struct oai_error err = {0};
    cJSON *root = cJSON_Parse(body), *echo;
    assert_non_null(g);
    assert_int_equal(responses_translate(root, 1000, &g->q, &echo, &err), 0);
    assert_non_null(g->dstate = responses_state_new(echo));
    cJSON_Delete(root);
    g->s = &f->s;
    g->model = &f->s.single;
    g->d = &responses_dialect;
    g->n = 1;
    g->ch = calloc(1, sizeof *g->ch);
    assert_non_null(g->ch);
    strcpy(g->id, "resp_00000000000000ab");
    g->created = 1700000000;
    g->n_prompt = 7;
    struct gen_choice *c = &g->ch[0];
    assert_non_null(c->tool_calls = cJSON_CreateArray());
    assert_int_equal(gbuf_add(&c->content, "", 0), 0);
    assert_int_equal(gbuf_add(&c->reasoning, "", 0), 0);
}

static void add_text(struct gbuf *b, const char *s)
{
    assert_int_equal(gbuf_add(b, s, strlen(s)), 0);
}

static void add_call(struct gen_choice *c, const char *id, const char *name, const char *args)
{
    cJSON *t = cJSON_CreateObject();
    assert_non_null(t);
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "name", name);
    cJSON_AddStringToObject(t, "arguments", args);
    cJSON_AddItemToArray(c->tool_calls, t);
}

/* The stream so far as an array of event objects; checks the framing (event name = type,
 * sequence numbers 0, 1, ...). */
static cJSON *stream_events(struct gen *g)
{
    cJSON *out = cJSON_CreateArray();
    const char *p = g->sse.p ? g->sse.p : "";
    int i = 0;
    while (*p) {
        assert_memory_equal(p, "event: ", 7);
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        assert_memory_equal(nl + 1, "data: ", 6);
        const char *end = strstr(nl + 1, "\n\n");
        assert_non_null(end);
        char *data = strndup(nl + 7, (size_t)(end - nl - 7));
        cJSON *e = cJSON_Parse(data);
        free(data);
        assert_non_null(e);
        const char *type = cJSON_GetObjectItem(e, "type")->valuestring;
        assert_int_equal(strlen(type), (size_t)(nl - p - 7));
        assert_memory_equal(p + 7, type, strlen(type));
        assert_int_equal(cJSON_GetObjectItem(e, "sequence_number")->valueint, i++);
        cJSON_AddItemToArray(out, e);
        p = end + 2;
    }
    return out;
}

static void assert_types(const cJSON *events, const char *const *want, int n)
{
    assert_int_equal(cJSON_GetArraySize(events), n);
    for (int i = 0; i < n; i++) {
        const char *t = cJSON_GetObjectItem(cJSON_GetArrayItem(events, i), "type")->valuestring;
        if (strcmp(t, want[i]) != 0)
            fail_msg("event %d: %s, want %s", i, t, want[i]);
    }
}

static void test_full_items(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, "{\"input\": \"hi\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}]}");
    struct gen_choice *c = &f.g->ch[0];
    add_text(&c->reasoning, "let me see");
    add_text(&c->content, "Calling.");
    add_call(c, "call_a", "f", "{\"x\":1}");
    add_call(c, "call_b", "f", "{}");
    c->consumed = 5;
    c->finished = true;
    c->finish = GEN_FINISH_TOOL_CALLS;
    cJSON *r = responses_dialect.full(f.g);
    assert_non_null(r);
    assert_string_equal(cJSON_GetObjectItem(r, "status")->valuestring, "completed");
    assert_json(cJSON_GetObjectItem(r, "output"),
                "[{\"id\": \"rs_00000000000000ab00\", \"type\": \"reasoning\", \"summary\": [],"
                "  \"content\": [{\"type\": \"reasoning_text\", \"text\": \"let me see\"}]},"
                " {\"id\": \"msg_00000000000000ab01\", \"type\": \"message\", \"status\": \"completed\", \"role\": \"assistant\","
                "  \"content\": [{\"type\": \"output_text\", \"annotations\": [], \"logprobs\": [], \"text\": \"Calling.\"}]},"
                " {\"id\": \"fc_00000000000000ab02\", \"type\": \"function_call\", \"status\": \"completed\","
                "  \"arguments\": \"{\\\"x\\\":1}\", \"call_id\": \"call_a\", \"name\": \"f\"},"
                " {\"id\": \"fc_00000000000000ab03\", \"type\": \"function_call\", \"status\": \"completed\","
                "  \"arguments\": \"{}\", \"call_id\": \"call_b\", \"name\": \"f\"}]");
    assert_json(cJSON_GetObjectItem(r, "usage"),
                "{\"input_tokens\": 7, \"input_tokens_details\": {\"cached_tokens\": 0}, \"output_tokens\": 5,"
                " \"output_tokens_details\": {\"reasoning_tokens\": 0}, \"total_tokens\": 12}");
    assert_json(cJSON_GetObjectItem(r, "tools"),
                "[{\"type\": \"function\", \"name\": \"f\", \"description\": null, \"parameters\": null, \"strict\": null}]");
    assert_string_equal(cJSON_GetObjectItem(r, "model")->valuestring, k_model);
    cJSON_Delete(r);
    /* only calls: no message item */
    c->content.len = 0;
    c->reasoning.len = 0;
    r = responses_dialect.full(f.g);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r, "output")), 2);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "output"), 0), "id")->valuestring,
                        "fc_00000000000000ab00");
    cJSON_Delete(r);
    gen_free(f.g);
}

static void test_stream_items(void **state)
{
    (void)state;
    struct fake f;
    fake_open(&f, "{\"input\": \"hi\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"stream\": true}");
    struct gen *g = f.g;
    struct gen_choice *c = &g->ch[0];
    const struct gen_dialect *d = &responses_dialect;
    add_text(&c->reasoning, "let ");
    assert_int_equal(d->events(g), 0);
    add_text(&c->reasoning, "me see");
    assert_int_equal(d->events(g), 0);
    add_text(&c->content, "Call");
    assert_int_equal(d->events(g), 0);
    add_text(&c->content, "ing.");
    add_call(c, "call_a", "f", "{\"x\":1}");
    assert_int_equal(d->events(g), 0);
    add_call(c, "call_b", "f", "{}");
    c->consumed = 5;
    c->finished = true;
    c->finish = GEN_FINISH_TOOL_CALLS;
    assert_int_equal(d->events(g), 0);
    assert_int_equal(d->tail(g), 0);
    cJSON *ev = stream_events(g);
    static const char *const k_want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    };
    assert_types(ev, k_want, (int)(sizeof k_want / sizeof k_want[0]));
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 6), "text")->valuestring, "let me see");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 13), "text")->valuestring, "Calling.");
    assert_json(cJSON_GetArrayItem(ev, 17), "{\"type\": \"response.function_call_arguments.delta\", \"sequence_number\": 17,"
                                            " \"item_id\": \"fc_00000000000000ab02\", \"output_index\": 2,"
                                            " \"delta\": \"{\\\"x\\\":1}\"}");
    /* the final response holds exactly the items of the full answer */
    cJSON *full = d->full(g);
    cJSON *last = cJSON_GetObjectItem(cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1), "response");
    assert_true(cJSON_Compare(cJSON_GetObjectItem(last, "output"), cJSON_GetObjectItem(full, "output"), true));
    assert_true(cJSON_Compare(cJSON_GetObjectItem(last, "usage"), cJSON_GetObjectItem(full, "usage"), true));
    assert_string_equal(cJSON_GetObjectItem(last, "status")->valuestring, "completed");
    cJSON_Delete(full);
    cJSON_Delete(ev);
    gen_free(g);
}

static void test_stream_empty_and_failed(void **state)
{
    (void)state;
    struct fake f;
    /* no text, no calls: one empty message, as the full answer has */
    fake_open(&f, "{\"input\": \"hi\", \"stream\": true}");
    struct gen_choice *c = &f.g->ch[0];
    c->finished = true;
    c->finish = GEN_FINISH_LENGTH;
    assert_int_equal(responses_dialect.events(f.g), 0);
    assert_int_equal(responses_dialect.tail(f.g), 0);
    cJSON *ev = stream_events(f.g), *full = responses_dialect.full(f.g);
    cJSON *last = cJSON_GetObjectItem(cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1), "response");
    assert_int_equal(cJSON_GetArraySize(ev), 8);
    assert_true(cJSON_Compare(cJSON_GetObjectItem(last, "output"), cJSON_GetObjectItem(full, "output"), true));
    assert_json(cJSON_GetObjectItem(last, "incomplete_details"), "{\"reason\": \"max_output_tokens\"}");
    assert_string_equal(cJSON_GetObjectItem(last, "status")->valuestring, "incomplete");
    cJSON_Delete(full);
    cJSON_Delete(ev);
    gen_free(f.g);
    /* a failure before any event: created, in_progress, failed with the error */
    fake_open(&f, "{\"input\": \"hi\", \"stream\": true}");
    f.g->rc = -1;
    oai_errorf(&f.g->err, 500, "server_error", NULL, NULL, "generation failed: boom");
    assert_int_equal(responses_dialect.tail(f.g), 0);
    ev = stream_events(f.g);
    static const char *const k_want[] = {"response.created", "response.in_progress", "response.failed"};
    assert_types(ev, k_want, 3);
    last = cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 2), "response");
    assert_json(cJSON_GetObjectItem(last, "error"), "{\"code\": \"server_error\", \"message\": \"generation failed: boom\"}");
    assert_string_equal(cJSON_GetObjectItem(last, "status")->valuestring, "failed");
    cJSON_Delete(ev);
    gen_free(f.g);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_input_items),
    cmocka_unit_test(test_translated_fields),
    cmocka_unit_test(test_errors),
    cmocka_unit_test(test_full_items),
    cmocka_unit_test(test_stream_items),
    cmocka_unit_test(test_stream_empty_and_failed),
};

TEST_SUITE(responses, tests);
