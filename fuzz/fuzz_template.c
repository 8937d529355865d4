/*
 * fuzz_template: libFuzzer target for the Jinja2 interpreter. The input is
 * parsed as a template and, when it parses, rendered over a fixed chat
 * (system/user/assistant-with-tool-call/tool messages, tools, special
 * tokens) under small limits so every input finishes quickly. Any crash,
 * leak, hang or undefined behaviour is a bug; a render must either succeed
 * with output within the limit or fail with an error message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "template/template.h"

static const char *k_vars =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
    " \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00fc <tool_response>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nok\", \"tool_calls\":"
    " [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"documents\": null, \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *vars;
    if (!vars && !(vars = cJSON_Parse(k_vars)))
        abort();
    struct tmpl_limits lim;
    tmpl_limits_default(&lim);
    lim.max_steps = 200000;
    lim.max_output = 1u << 20;
    lim.max_memory = 64u << 20;
    lim.max_depth = 100;
    struct tmpl *t = NULL;
    struct err e = {0};
    if (tmpl_parse(&t, (const char *)data, size, &lim, &e) < 0) {
        if (t || e.msg[0] == 0)
            abort();
        return 0;
    }
    char *out = NULL;
    size_t len = 0;
    int rc = tmpl_render(t, vars, &out, &len, &e);
    if (rc == 0 && (!out || len > lim.max_output || strlen(out) > len))
        abort();
    if (rc < 0 && (out || e.msg[0] == 0))
        abort();
    free(out);
    tmpl_free(t);
    return 0;
}
