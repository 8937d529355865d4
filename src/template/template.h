/*
 * template: a bounded Jinja2 interpreter for Hugging Face chat templates.
 *
 * tmpl_parse() compiles template text (the subset of Jinja2 that shipped
 * chat templates use, with transformers' settings: trim_blocks,
 * lstrip_blocks, loop controls, the `tojson`/`raise_exception`/
 * `strftime_now` additions, the immutable sandbox) into a tree owned by the
 * returned struct tmpl. tmpl_render() evaluates it against variables given
 * as one cJSON object (messages, tools, add_generation_prompt, ...) and
 * returns the text byte for byte as jinja2 would. A parsed template is
 * immutable: renders may run concurrently on it.
 *
 * Every input is hostile: the source size, parse nesting, run-time
 * recursion, evaluation steps, memory and output size are bounded
 * (struct tmpl_limits); exceeding a bound is an error, never a hang.
 * Errors carry the template line ("template line 3: ...").
 *
 * chat.c builds on this: finding a checkpoint's template
 * (tokenizer_config.json, chat_template.jinja, chat_template.json) and its
 * special-token strings, and rendering a message list the way
 * transformers' apply_chat_template does.
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

struct tmpl;

struct tmpl_limits {
    size_t max_source;   /* template bytes */
    size_t max_output;   /* rendered bytes, also the largest single string */
    size_t max_memory;   /* bytes the render may allocate in total */
    uint64_t max_steps;  /* evaluation steps (nodes evaluated, loop iterations) */
    int max_depth;       /* run-time nesting: macro calls, nested blocks, expressions */
};

/* The defaults: 1 MiB source, 16 MiB output, 256 MiB memory, 20M steps, depth 200. */
void tmpl_limits_default(struct tmpl_limits *l);

/* Parse len bytes of template text. *out is owned by the caller (tmpl_free).
 * Errors: -ERR_RANGE (source over the limit), -ERR_FORMAT (syntax error, the
 * message gives the line), -ERR_NOMEM. lim may be NULL (defaults). */
int tmpl_parse(struct tmpl **out, const char *src, size_t len, const struct tmpl_limits *lim,
               struct err *e);
void tmpl_free(struct tmpl *t);  /* NULL is a no-op */

/* Render with vars (a JSON object whose members become template variables;
 * NULL = none). *out is malloc'd, NUL-terminated, owned by the caller; *len
 * excludes the NUL. Errors: -ERR_FORMAT (a run-time template error, e.g. a
 * type error, an undefined attribute, raise_exception("msg") -> the message),
 * -ERR_RANGE (a limit was exceeded), -ERR_NOMEM. */
int tmpl_render(const struct tmpl *t, const cJSON *vars, char **out, size_t *len, struct err *e);

/* ---- chat templates of a checkpoint (chat.c) ---- */

struct chat_tmpl;

/* Find and parse the chat templates of checkpoint folder dir, in transformers'
 * order (chat.c has it in full, docs/adr/0050 why): override_file (when
 * non-NULL); else the files chat_template.jinja ("default") and
 * additional_chat_templates/<name>.jinja, which replace tokenizer_config.json's
 * template when any exists; else tokenizer_config.json "chat_template" (a
 * string, or a list of {name, template}); else chat_template.json
 * {"chat_template": ...}. Special tokens (bos_token, eos_token, ... as strings
 * or {"content": ...}) come from tokenizer_config.json. -ERR_MISSING when there
 * is no template; other errors as tmpl_parse (naming the source) and for
 * unreadable or malformed files. */
int chat_tmpl_load(struct chat_tmpl **out, const char *dir, const char *override_file,
                   struct err *e);
void chat_tmpl_free(struct chat_tmpl *c);  /* NULL is a no-op */

/* The source text of the template used without tools (the only one, or "default"; else the
 * first found: chat_template.jinja, the folder's by name, or the config list's first),
 * NUL-terminated (a NUL inside it ends the string early), owned by c and
 * valid until chat_tmpl_free. For inspecting what the
 * template teaches (outparse_detect_format, outparse_detect_reasoning). */
const char *chat_tmpl_source(const struct chat_tmpl *c);

/* Render messages (a JSON array) as apply_chat_template(messages,
 * add_generation_prompt=agp, **extra) does: variables are the special tokens,
 * messages, tools and documents (none unless in extra), add_generation_prompt,
 * then every member of extra (a JSON object or NULL). Of several named
 * templates, "tool_use" renders when extra has non-null "tools" and it exists,
 * else "default"; with neither, -ERR_FORMAT naming those there are. Output as
 * tmpl_render. */
int chat_tmpl_apply(const struct chat_tmpl *c, const cJSON *messages, bool agp, const cJSON *extra,
                    char **out, size_t *len, struct err *e);

#ifdef __cplusplus
}
#endif
