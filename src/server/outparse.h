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
 *
 * The rules, precisely (outparse.c has the why):
 *  - Reasoning (opts.reasoning): a "<think>" at the very start of the output
 *    opens it; so does opts.in_reasoning (the prompt opened it). Everything up to
 *    the first "</think>" is reasoning; after it everything is content (a later
 *    <think> is text). Whitespace right after <think> and </think> and (up to 64
 *    bytes) right before </think> is dropped. Tool calls are never parsed
 *    inside reasoning.
 *  - Hermes: "<tool_call>" anywhere in content, a JSON object, "</tool_call>".
 *    Llama 3: a JSON object that starts the content (after whitespace), follows a
 *    previous call (after whitespace and an optional ';'), or follows
 *    "<|python_tag|>" anywhere; it needs "name" and "parameters" (or
 *    "arguments"), and "type", when present, must be "function". Mistral:
 *    "[TOOL_CALLS]" anywhere in content, then a JSON array of {"name",
 *    "arguments"} objects, or (newer templates) name[ARGS]{...}.
 *  - A call whose name is not among opts.tools (when given), whose arguments are
 *    not an object (or a string holding one), whose JSON does not parse (raw
 *    control bytes, which cJSON would take, included), that is
 *    still open when the output ends, or that exceeds OUTPARSE_MAX_CALL bytes
 *    (markers included), or beyond the first OUTPARSE_MAX_CALLS calls, is text.
 *    Whitespace between and after calls is dropped.
 *  - Events do not depend on how the text is split across feeds, except that
 *    TEXT and REASONING deltas may be cut differently.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* Whether a rendered prompt leaves the generation inside reasoning: its last
 * "<think>" is followed by nothing but whitespace (DeepSeek-R1 distills, QwQ; not
 * Qwen3 with enable_thinking=false, whose prompt closes the block). Gives
 * outparse_opts.in_reasoning. */
bool outparse_prompt_opens_reasoning(const char *prompt, size_t len);

/* "none", "hermes", "llama3", "mistral" (for logs); "?" for anything else. */
const char *outparse_format_name(enum outparse_format f);

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
    const char *id;              /* TOOL_CALL: in the opts' style (enum outparse_ids) */
    int index;                   /* TOOL_CALL: 0, 1, ... in order */
    const char *raw;             /* TOOL_CALL: the input bytes of the block the call came from,
                                  * markers included (on the first call of a block; the other
                                  * calls of a Mistral array have raw_len 0) */
    size_t raw_len;
};
/* Every pointer in an event is valid only during the callback. */

/* Return non-zero to stop (an allocation failure downstream): the feed/finish
 * returns that value when it is negative, -ERR_NOMEM otherwise, and so does every
 * later call on the parser. */
typedef int (*outparse_emit_fn)(void *ud, const struct outparse_event *ev);

/* The form of the call ids a parser makes. */
enum outparse_ids {
    OUTPARSE_IDS_OPENAI = 0,     /* "call_" + 24 alphanumerics, as OpenAI's */
    OUTPARSE_IDS_ANTHROPIC = 1,  /* "toolu_01" + 22 alphanumerics, as Anthropic's */
    OUTPARSE_IDS_MISTRAL = 2,    /* 9 alphanumerics: what Mistral's chat templates demand */
};

/* Whether a chat template's source demands 9-character call ids: it teaches Mistral's
 * [TOOL_CALLS] format (vLLM gives every Mistral model such ids) or checks an id's length
 * against 9 (Mistral's templates raise "Tool call IDs should be alphanumeric strings with
 * length 9!"). */
bool outparse_detect_short_ids(const char *template_src);
/* Whether id is 9 alphanumerics. */
bool outparse_short_id_ok(const char *id);
/* The 9-alphanumeric id such a template is shown for a client's id: the id itself when it
 * is one, else a hash of it (so an assistant turn's call and the tool turn answering it,
 * which carry the same id, keep matching). */
void outparse_short_id(const char *id, char out[10]);
/* Every call id of a chat request's messages (assistant tool_calls[].id, tool turns'
 * tool_call_id) in place as outparse_short_id gives it, for a template that demands
 * short ids: the ids a client sends back are whatever it got, from this server (already
 * short) or another ("call_...", "toolu_..."). vLLM does the same for Mistral models (it
 * keeps an id's last 9 characters); the hash keeps ids that are not alphanumeric, or
 * shorter than 9, usable too. 0 or -ERR_NOMEM. */
int outparse_shorten_ids(cJSON *messages);

struct outparse_opts {
    enum outparse_format format; /* OUTPARSE_NONE: no tool calls are parsed */
    bool reasoning;              /* split <think>...</think> */
    bool in_reasoning;           /* the prompt already opened <think> (the generation starts inside) */
    const cJSON *tools;          /* the request's tools (names checked), or NULL: borrowed,
                                  * must outlive the parser. An array of OpenAI
                                  * {"type": "function", "function": {"name": ...}} or
                                  * Anthropic {"name": ...} tools. */
    uint64_t id_seed;            /* 0: call ids are random; else they are a function of it (tests) */
    enum outparse_ids ids;       /* the form of the call ids */
};

struct outparse;

/* A parser for one choice; *out is owned by the caller (outparse_free). Pass
 * format OUTPARSE_NONE when the request has no tools: a Llama 3 parser holds back
 * any output that starts with '{' until the object closes. Errors: -ERR_ARG (an
 * unknown format), -ERR_NOMEM. */
int outparse_new(struct outparse **out, const struct outparse_opts *o, struct err *e);
void outparse_free(struct outparse *p);  /* NULL is a no-op */
/* Feed final text (any bytes, any split); events are emitted through emit. 0, or
 * < 0 on allocation failure or when emit stopped. Memory stays within about
 * OUTPARSE_MAX_CALL plus a few KiB whatever len is. */
int outparse_feed(struct outparse *p, const char *text, size_t len, outparse_emit_fn emit, void *ud);
/* The output ended: emit what is held (an unfinished tool call as text). Call it
 * once; feeding after it is an error (-ERR_ARG). */
int outparse_finish(struct outparse *p, outparse_emit_fn emit, void *ud);

#ifdef __cplusplus
}
#endif
