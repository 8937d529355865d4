/*
 * api_responses: POST /v1/responses, OpenAI's Responses API over gen (the
 * route is srv_responses in srv_impl.h). Its two halves are public for the
 * tests: the body translated into the chat request, and the dialect that
 * renders gen's state as `response` objects and typed stream events.
 */
#pragma once
#include <cjson/cJSON.h>

#include "gen.h"
#include "oai_request.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The body (a parsed object) -> the chat request *q (its fields validated, as
 * oai_request_from_object does) and the dialect's state *state (for gen's dstate; owned by
 * the caller until then, freed by responses_dialect.free_state). 0; or -1 with *err (a 400
 * naming this API's field: "input[2].content", "max_output_tokens"; 500 out of memory), q
 * and *state then hold nothing. */
int responses_translate(const cJSON *root, int n_vocab, struct oai_request *q, void **state,
                        struct oai_error *err);

/* The Responses dialect: one choice's reasoning, text and tool calls as output items. */
extern const struct gen_dialect responses_dialect;

#ifdef __cplusplus
}
#endif
