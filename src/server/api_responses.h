/*
 * api_responses: POST /v1/responses, OpenAI's Responses API over gen (the
 * route is srv_responses in srv_impl.h). Its two halves are public for the
 * tests: the body translated into the chat request (responses_request.c), and
 * the dialect that renders gen's state as `response` objects and typed stream
 * events (api_responses.c).
 */
#pragma once
#include <cjson/cJSON.h>

#include "gen.h"
#include "oai_request.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The body (a parsed object) -> the chat request *q (its fields validated, as
 * oai_request_from_object does) and *echo, the request fields every response object
 * repeats (instructions, tools in the flat form, text, ...; the caller owns it). 0; or -1
 * with *err (a 400 naming this API's field: "input[2].content", "max_output_tokens"; 500
 * out of memory), q and *echo then hold nothing. (responses_request.c) */
int responses_translate(const cJSON *root, int n_vocab, struct oai_request *q, cJSON **echo,
                        struct oai_error *err);
/* An error that names a chat field (from oai_request or gen) names this API's instead:
 * max_tokens -> max_output_tokens, response_format -> text.format, tools[i].function.name
 * -> tools[i].name, messages -> input. */
void responses_rename_fields(struct oai_error *err);

/* The dialect's state for gen's dstate over echo (taken); NULL (echo freed) when out of
 * memory. Freed by responses_dialect.free_state. (api_responses.c) */
void *responses_state_new(cJSON *echo);

/* The Responses dialect: one choice's reasoning, text and tool calls as output items. */
extern const struct gen_dialect responses_dialect;

#ifdef __cplusplus
}
#endif
