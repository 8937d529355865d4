/*
 * fuzz_anthropic: libFuzzer target for the Anthropic Messages request
 * translation (anthropic_translate, api_anthropic.h). The input is parsed as
 * the server parses a body (oai_parse_object: bounded depth, valid UTF-8) and
 * translated into the chat request for a vocabulary of 2048 ids, once as
 * /v1/messages and once as /v1/messages/count_tokens. Any crash, leak or
 * undefined behaviour is a bug. An accepted request must keep the chat
 * request's promises (request_check.h) and those of this API (one choice, no
 * logprobs or logit_bias; max_tokens given, unless counting: then no
 * stream, no stop, no max_tokens); a
 * rejected one must leave the request empty, with an error that renders as
 * valid JSON in OpenAI's shape and in Anthropic's ({"type": "error",
 * "error": {"type", "message"}}).
 */
#include <stdint.h>

#include "request_check.h"
#include "server/api_anthropic.h"

static void check_anthropic_error(const struct oai_error *err)
{
    check_error(err);
    cJSON *o = check_body(anthropic_error_json(err));
    const cJSON *e = cJSON_GetObjectItem(o, "error"), *type = cJSON_GetObjectItem(o, "type");
    if (o && (!cJSON_IsString(type) || strcmp(type->valuestring, "error") ||
              !cJSON_IsString(cJSON_GetObjectItem(e, "type")) || !cJSON_IsString(cJSON_GetObjectItem(e, "message"))))
        abort();
    cJSON_Delete(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct oai_error err;
    cJSON *root = oai_parse_object((const char *)data, size, &err);
    if (!root) {
        check_anthropic_error(&err);
        return 0;
    }
    for (int count = 0; count <= 1; count++) {
        struct oai_request q;
        if (anthropic_translate(root, count, N_VOCAB, &q, &err) == 0) {
            check_request(&q, OAI_CHAT);
            if (q.n != 1 || q.logprobs || q.n_bias || (count && (q.stream || q.n_stop || q.max_tokens != -1)) ||
                (!count && q.max_tokens < 1))
                abort();
        } else {
            check_empty(&q);
            check_anthropic_error(&err);
        }
        oai_request_free(&q);
    }
    cJSON_Delete(root);
    return 0;
}
