/*
 * outparse: splits a choice's generated text into what the APIs report
 * separately: reasoning (<think>...</think>), plain content, and tool calls
 * in the format the model's chat template teaches it:
 *   OUTPARSE_HERMES   <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen, Hermes)
 *   OUTPARSE_LLAMA3   {"name": ..., "parameters": {...}} as the whole output, or after
 *                     <|python_tag|> (Llama 3.x)
 *   OUTPARSE_MISTRAL  [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]
 * Text is fed as it becomes final (streaming) and events come out in order;
 * text that could still be the start of a marker is held back. A tool call
 * that turns out malformed (truncated JSON, no name, unknown function) is
 * reported as plain text, never dropped and never a crash. Every buffer is
 * bounded (OUTPARSE_MAX_CALL bytes per call).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "../core/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OUTPARSE_MAX_CALL (1u << 20)
#define OUTPARSE_MAX_CALLS 64

enum outparse_format {
    OUTPARSE_NONE = 0,
    OUTPARSE_HERMES = 1,
    OUTPARSE_LLAMA3 = 2,
    OUTPARSE_MISTRAL = 3,
};

/* The tool-call format a chat template's source teaches (OUTPARSE_NONE when none is
 * recognised), and whether it emits <think> reasoning. */
enum outparse_format outparse_detect_format(const char *template_src);
bool outparse_detect_reasoning(const char *template_src);

enum outparse_kind {
    OUTPARSE_TEXT = 0,           /* content text */
    OUTPARSE_REASONING = 1,      /* reasoning text (inside <think>) */
    OUTPARSE_TOOL_CALL = 2,      /* one complete tool call: name, id, arguments (JSON text) */
};

struct outparse_event {
    enum outparse_kind kind;
    const char *text;            /* TEXT / REASONING: the delta; TOOL_CALL: arguments JSON */
    size_t len;
    const char *name;            /* TOOL_CALL: function name */
    const char *id;              /* TOOL_CALL: "call_<random>" */
    int index;                   /* TOOL_CALL: 0, 1, ... in order */
};

/* Return non-zero to stop (an allocation failure downstream). */
typedef int (*outparse_emit_fn)(void *ud, const struct outparse_event *ev);

struct outparse_opts {
    enum outparse_format format; /* OUTPARSE_NONE: no tool calls are parsed */
    bool reasoning;              /* split <think>...</think> */
    bool in_reasoning;           /* the prompt already opened <think> (the generation starts inside) */
    const cJSON *tools;          /* the request's tools (names checked), or NULL */
};

struct outparse;

int outparse_new(struct outparse **out, const struct outparse_opts *o, struct err *e);
void outparse_free(struct outparse *p);
/* Feed final text; events are emitted through emit. < 0 on allocation failure. */
int outparse_feed(struct outparse *p, const char *text, size_t len, outparse_emit_fn emit, void *ud);
/* The output ended: emit what is held (an unfinished tool call as text). */
int outparse_finish(struct outparse *p, outparse_emit_fn emit, void *ud);

#ifdef __cplusplus
}
#endif
