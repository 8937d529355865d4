/*
 * oai_request: parsing of OpenAI request bodies (/v1/chat/completions,
 * /v1/completions) into a checked, engine-neutral struct oai_request, and
 * the OpenAI error shape every endpoint answers with.
 *
 * Every body is hostile: it is parsed with a depth limit, must be one JSON
 * object in valid UTF-8, and every field is type- and range-checked. A bad
 * field is a 400 whose error names it in `param` ("messages[2].content",
 * "stop[1]", "logit_bias"). Bounds (count and size) are the OAI_MAX_*
 * values below; unknown fields are ignored, as OpenAI does. Nothing here
 * knows the model except its vocabulary size (token ids and logit_bias keys
 * are checked against it).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OAI_MAX_JSON_DEPTH    64        /* nesting of the body */
#define OAI_MAX_MESSAGES      4096      /* chat messages */
#define OAI_MAX_CONTENT_PARTS 256       /* parts of one message's content array */
#define OAI_MAX_STOP          16        /* stop strings */
#define OAI_MAX_STOP_LEN      256       /* bytes of one stop string */
#define OAI_MAX_N             16        /* choices per request */
#define OAI_MAX_TOP_LOGPROBS  20        /* alternatives per token (chat) */
#define OAI_MAX_LOGPROBS      5         /* alternatives per token (completions' logprobs) */
#define OAI_MAX_BIAS          1024      /* logit_bias entries */
#define OAI_MAX_PROMPT_IDS    (1 << 20) /* ids in a token-id prompt */
#define OAI_MAX_LORA          32        /* entries of "lora" (= LORA_MAX_ADAPTERS) */
#define OAI_MAX_TOKENS_VALUE  (1 << 30) /* largest max_tokens accepted (the context decides further) */
#define OAI_MAX_IMAGES        16        /* image parts in one request */
#define OAI_MAX_IMAGE_BYTES   (20u << 20)  /* one image's decoded bytes (OpenAI's limit; the body's
                                          * --max-body bounds it first) */

enum oai_endpoint {
    OAI_CHAT = 0,          /* POST /v1/chat/completions */
    OAI_COMPLETIONS = 1,   /* POST /v1/completions */
};

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}}. */
struct oai_error {
    int status;            /* HTTP status: 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type;      /* "invalid_request_error", "authentication_error", "not_found_error",
                              "rate_limit_error", "server_error" (static strings) */
    const char *code;      /* NULL, or "context_length_exceeded", "model_not_found",
                              "invalid_api_key", ... (static strings) */
    char param[128];       /* the offending field, "" when none */
    char message[512];     /* one line, for people */
};

/* Fill *err (always returns -1 so callers can `return oai_errorf(...)`). param may be NULL. */
int oai_errorf(struct oai_error *err, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error as a JSON body (malloc'd, NUL-terminated; NULL when out of memory). */
char *oai_error_json(const struct oai_error *err);

#define OAI_MAX_TOOLS         128       /* tools in a request */
#define OAI_MAX_TOOL_CALLS    64        /* tool calls in one assistant message */

enum oai_tool_choice {
    OAI_TOOL_CHOICE_AUTO = 0,     /* the model decides (the default with tools) */
    OAI_TOOL_CHOICE_NONE = 1,     /* no calls: tools are not shown to the template */
    OAI_TOOL_CHOICE_REQUIRED = 2, /* at least one call */
    OAI_TOOL_CHOICE_NAMED = 3,    /* a call of tool_choice_name */
};

enum oai_format {
    OAI_FORMAT_TEXT = 0,
    OAI_FORMAT_JSON_OBJECT = 1,
    OAI_FORMAT_JSON_SCHEMA = 2,
};

struct oai_bias {
    int32_t id;
    float bias;            /* [-100, 100] */
};

/* An image part's bytes (base64-decoded from its data: URL; not yet decoded as an image), or
 * its http(s) URL (fetched only with `serve --allow-image-urls`). */
#define OAI_MAX_IMAGE_URL 8192    /* bytes of an http(s) image URL */
struct oai_image {
    unsigned char *data;          /* malloc'd; NULL for a URL */
    size_t len;                   /* 1 .. OAI_MAX_IMAGE_BYTES */
    char *url;                    /* malloc'd http(s) URL, NULL for data */
    char param[128];              /* where the request has it: "messages[1].content[0]" */
};

struct oai_request {
    enum oai_endpoint endpoint;
    char *model;                  /* NULL when absent */

    /* chat: messages as the chat template wants them: an array of {"role": "system" |
     * "user" | "assistant" | "tool", "content": "<text>" ("" for an assistant turn of
     * tool calls only)} (content arrays of text parts joined into one string; "developer"
     * becomes "system"); assistant turns keep "tool_calls" ([{"id", "type": "function",
     * "function": {"name", "arguments": <object, parsed from the JSON text when it is one>}}])
     * and tool turns "tool_call_id". A message with image parts keeps its content as parts
     * in order, as transformers' chat templates take them: [{"type": "text", "text"},
     * {"type": "image"}, ...]; its images are in images[], in order over all messages */
    cJSON *messages;
    struct oai_image *images;     /* [n_images] image_url parts with data: URLs */
    int n_images;
    /* completions: a text prompt (NUL-terminated, prompt_len bytes), or token ids */
    char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    int n_prompt_ids;
    bool echo;                    /* completions: the prompt text before the completion */

    int max_tokens;               /* max_tokens / max_completion_tokens; -1 when absent */
    /* sampling; has_* says whether the request set the field (else the server's default) */
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty, has_seed;
    float temperature;            /* [0, 2] */
    float top_p;                  /* (0, 1] */
    int top_k;                    /* >= 0 (0 and -1: off; -1 is stored as 0) */
    float min_p;                  /* [0, 1] */
    float repetition_penalty;     /* (0, 10] */
    float presence_penalty;       /* [-2, 2], 0 when absent */
    float frequency_penalty;      /* [-2, 2], 0 when absent */
    uint64_t seed;                /* any 64-bit integer (negative ones as two's complement) */

    char *stop[OAI_MAX_STOP];     /* non-empty, NUL-free, valid UTF-8, <= OAI_MAX_STOP_LEN bytes */
    size_t stop_len[OAI_MAX_STOP];
    int n_stop;

    int n;                        /* choices, [1, OAI_MAX_N], 1 when absent */
    bool logprobs;                /* chat: logprobs true; completions: logprobs given (>= 0) */
    int top_logprobs;             /* chat: top_logprobs [0, 20]; completions: the logprobs value [0, 5] */
    struct oai_bias *bias;        /* logit_bias, ids in [0, n_vocab) */
    int n_bias;

    bool stream;
    bool include_usage;           /* stream_options.include_usage */
    bool ignore_eos;              /* vLLM's and llama-server's extension: generate past EOS */

    /* chat: tools (as the chat template takes them: [{"type": "function", "function": {"name",
     * "description", "parameters"}}]), NULL when none; the choice; the output format;
     * chat_template_kwargs (an object of extra template variables), NULL when none */
    cJSON *tools;
    enum oai_tool_choice tool_choice;
    char *tool_choice_name;       /* OAI_TOOL_CHOICE_NAMED */
    enum oai_format format;
    cJSON *format_schema;         /* OAI_FORMAT_JSON_SCHEMA: the schema */
    cJSON *template_kwargs;
    /* how errors name tool i's parameters in the request as the client wrote it (a printf
     * format taking i; static, not owned); NULL: chat's "tools[%d].function.parameters" */
    const char *tools_where;
    bool anthropic;               /* came through /v1/messages: tool_use ids are "toolu_..." */
    /* llama-server's per-request "lora": [{"id", "scale"}]; has_lora: given (the adapters it
     * does not name run at 0), else the server's global scales. Ids are checked against the
     * served adapters by the server (gen.c). */
    struct {
        int id;
        float scale;
    } lora[OAI_MAX_LORA];
    int n_lora;
    bool has_lora;
};

void oai_request_init(struct oai_request *r);
/* Frees what the request owns and re-initializes it. */
void oai_request_free(struct oai_request *r);

/* Parse a request body of len bytes (not NUL-terminated) for endpoint ep. Token ids
 * (prompt ids, logit_bias keys) must be in [0, n_vocab). 0 on success; -1 with *err
 * (status 400, type "invalid_request_error", param naming the field) otherwise; on
 * failure r holds nothing (it is freed). */
int oai_request_parse(struct oai_request *r, enum oai_endpoint ep, const char *body, size_t len, int n_vocab,
                      struct oai_error *err);

/* The same from a parsed JSON object (the Responses and Anthropic adapters translate their
 * bodies into OpenAI's shape and validate them here). */
int oai_request_from_object(struct oai_request *r, enum oai_endpoint ep, const cJSON *root, int n_vocab,
                            struct oai_error *err);

/* Parse a body as one JSON object (valid UTF-8, at most OAI_MAX_JSON_DEPTH deep, no trailing
 * bytes) for the other endpoints (/tokenize, ...). NULL with *err (400) on failure. */
cJSON *oai_parse_object(const char *body, size_t len, struct oai_error *err);

/* root's "lora" (llama-server's [{"id", "scale"}]) into r->lora / n_lora / has_lora (absent: 0,
 * nothing set); 0, or -1 with *err (400) for a bad shape, id or scale. The chat, completions and
 * llama-server routes share it. */
int oai_parse_lora(struct oai_request *r, const cJSON *root, struct oai_error *err);

#ifdef __cplusplus
}
#endif
