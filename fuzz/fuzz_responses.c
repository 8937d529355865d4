/*
 * fuzz_responses: libFuzzer target for the Responses API's request
 * translation (responses_translate, api_responses.h). The input is parsed as
 * the server parses a body (oai_parse_object: bounded depth, valid UTF-8) and
 * translated into the chat request for a vocabulary of 2048 ids. Any crash,
 * leak or undefined behaviour is a bug. An accepted request must keep the
 * chat request's promises (request_check.h) and those of this API (one
 * choice, no logprobs or logit_bias: the translation passes none), and its
 * echo must be an object that prints as valid JSON; a rejected one must leave
 * the request and the echo empty, with an error that renders as valid JSON.
 */
#include <stdint.h>

#include "request_check.h"
#include "server/api_responses.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct oai_error err;
    struct oai_request q;
    cJSON *root = oai_parse_object((const char *)data, size, &err), *echo;
    if (!root) {
        check_error(&err);
        return 0;
    }
    if (responses_translate(root, N_VOCAB, &q, &echo, &err) == 0) {
        check_request(&q, OAI_CHAT);
        if (q.n != 1 || q.logprobs || q.n_bias || !cJSON_IsObject(echo))
            abort();
        cJSON_Delete(check_body(cJSON_PrintUnformatted(echo)));
    } else {
        if (echo)
            abort();
        check_empty(&q);
        check_error(&err);
    }
    cJSON_Delete(echo);
    oai_request_free(&q);
    cJSON_Delete(root);
    return 0;
}
