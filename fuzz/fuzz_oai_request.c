/*
 * fuzz_oai_request: libFuzzer target for the OpenAI request parser. The
 * input is parsed as a /v1/chat/completions body and as a /v1/completions
 * body (vocabulary of 2048 ids), and as a plain object (oai_parse_object).
 * Any crash, leak or undefined behaviour is a bug. An accepted request must
 * satisfy the header's promises (request_check.h: every count and value
 * within its bound, messages {role, content} with a template role and a
 * string content, nothing but tool_calls / tool_call_id besides, tools and
 * tool_choice consistent); a rejected one must leave the request empty, and
 * its oai_error_json must be valid UTF-8 that cJSON parses back.
 */
#include <stdint.h>

#include "request_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    for (int ep = OAI_CHAT; ep <= OAI_COMPLETIONS; ep++) {
        struct oai_request r;
        struct oai_error err;
        if (oai_request_parse(&r, (enum oai_endpoint)ep, body, size, N_VOCAB, &err) == 0) {
            check_request(&r, (enum oai_endpoint)ep);
        } else {
            check_empty(&r);
            check_error(&err);
        }
        oai_request_free(&r);
    }
    struct oai_error err;
    cJSON *o = oai_parse_object(body, size, &err);
    if (o)
        cJSON_Delete(o);
    else
        check_error(&err);
    return 0;
}
