/*
 * api_anthropic: POST /v1/messages and /v1/messages/count_tokens, the
 * Anthropic Messages dialect over gen (the routes are srv_anthropic_* in
 * srv_impl.h). Public for the tests and the fuzzers: the body translated into
 * the chat request, the error shape, and the dialect that renders gen's state
 * as a `message` and Anthropic's named stream events (all in api_anthropic.c).
 */
#pragma once
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "oai_request.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The body (a parsed object) -> the chat request *q (its fields validated, as
 * oai_request_from_object does). count: for count_tokens (max_tokens optional, stream and
 * stop_sequences ignored). 0; or -1 with *err (a 400 naming Anthropic's field in the message,
 * "messages.2.content"; 500 out of memory), q then holds nothing. */
int anthropic_translate(const cJSON *root, bool count, int n_vocab, struct oai_request *q,
                        struct oai_error *err);

/* Anthropic's error body {"type": "error", "error": {"type", "message"}} (malloc'd; NULL: out
 * of memory). */
char *anthropic_error_json(const struct oai_error *err);

/* The Anthropic dialect itself (gen.h), for tests that render a generation's state. */
struct gen_dialect;
extern const struct gen_dialect anthropic_dialect;

#ifdef __cplusplus
}
#endif
