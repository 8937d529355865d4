/*
 * gen: one generation request of any API dialect, below the wire format.
 *
 * Every endpoint that generates (OpenAI chat and completions, Responses,
 * Anthropic Messages) parses its body into a struct oai_request (the common
 * request: messages or a prompt, sampling, stop strings, n, logprobs, tools),
 * then hands it to gen: the prompt ids (the chat template rendered with the
 * request's tools and template variables, encoded as `mlxcel template` /
 * `generate` do; or a completion's text or ids), one engine job per choice
 * (runner.h), and per choice its text (textout: stop strings, hold-back)
 * split by outparse into content, reasoning and tool calls. The connection
 * thread pumps tokens into that state; a dialect (struct gen_dialect) turns
 * the state into its JSON answer or its stream events. Nothing here knows a
 * wire format except the OpenAI logprob entries, which only OpenAI reports.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "../engine/image_input.h"
#include "../engine/runner.h"
#include "oai_request.h"
#include "outparse.h"
#include "srv_impl.h"
#include "textout.h"

/* A growable byte string. */
struct gbuf {
    char *p;
    size_t len, cap;
};
int gbuf_add(struct gbuf *b, const char *s, size_t n);

enum gen_finish {
    GEN_FINISH_NONE = 0,
    GEN_FINISH_STOP,             /* EOS or a stop string */
    GEN_FINISH_LENGTH,           /* max_tokens or the context */
    GEN_FINISH_TOOL_CALLS,       /* the output ended with tool calls */
};

struct gen_choice {
    struct runner_job job;
    struct grammar_state *gstate; /* the choice's constraint state (g->gram), or NULL */
    struct textout out;          /* the raw text, cut at stop strings */
    struct outparse *op;         /* NULL: the text is all content */
    int consumed;                /* job tokens turned into text */
    size_t fed;                  /* bytes of out.text handed to the parser */
    size_t lp_chars;             /* code points of the logprob tokens so far (text_offset) */
    bool finished;
    enum gen_finish finish;
    const char *stop_seq;        /* the stop string that ended it, if one did */
    /* what the dialects report */
    struct gbuf content, reasoning;
    cJSON *tool_calls;           /* [{"id","name","arguments"}] */
    /* how much of it a stream has sent (the dialects own these) */
    size_t sent_content, sent_reasoning;
    int sent_tools;
    bool head_sent, finish_sent;
    int block;                   /* dialect state: an open content block, ... */
    /* OpenAI logprobs: chat entries not yet sent; completions arrays */
    cJSON *lp;
    cJSON *c_tokens, *c_lps, *c_tops, *c_offsets;
};

struct gen;

/* A dialect: how gen's state becomes an answer. */
struct gen_dialect {
    /* the non-streamed answer (NULL: out of memory) */
    cJSON *(*full)(struct gen *g);
    /* streaming: append the events for what changed since the last call (gen_sse_*) */
    int (*events)(struct gen *g);
    /* streaming: the closing events (usage, [DONE], ...), or an error event when g->rc < 0 or
     * g->aborted */
    int (*tail)(struct gen *g);
    /* frees g->dstate (NULL: the dialect keeps none); called by gen_free */
    void (*free_state)(void *dstate);
};

struct gen {
    struct server *s;
    struct srv_model *model;     /* the model generating, referenced until gen_free */
    struct MHD_Connection *conn;
    struct srv_req *r;           /* NULL once the request is over */
    const struct gen_dialect *d;
    void *dstate;                /* the dialect's own (freed by d->free_state) */
    enum oai_endpoint ep;        /* OAI_CHAT: a chat prompt; OAI_COMPLETIONS: text or ids */
    struct oai_request q;
    int32_t *prompt;
    int n_prompt;
    struct image_input imgs;     /* the request's images, processed (imgs.su NULL: none) */
    struct sched_image simg[IMAGE_INPUT_MAX];  /* each image's pixels and first row, for the jobs */
    char *echo;                  /* completions' echo: the prompt text */
    size_t echo_len;
    size_t echo_chars;           /* its code points: the first text_offset */
    struct sampler_bias *bias;
    char *alt;                   /* [TOK_STREAM_CAP] a logprob alternative's text */
    struct grammar *gram;        /* structured output or a forced tool call, NULL: free text */
    int tool_format;             /* enum outparse_format the output is parsed with */
    struct gen_choice *ch;
    int n;
    bool cv_init, submitted;
    pthread_cond_t cv;
    char id[64];
    long created;
    double t_start;
    int rc;                      /* a job failed: its error in err */
    struct oai_error err;
    bool aborted;                /* the client left or the server is stopping */
    bool in_reasoning;           /* the chat prompt ends inside <think> */
    /* streaming */
    struct gbuf sse;
    size_t sse_off;
    bool ended;
};

/* A generation for request q (moved into g: q is left empty) at endpoint kind ep, with
 * id prefix ("chatcmpl", "msg", "resp"). -1 with *err when the request cannot run (the
 * prompt, the context, the sampling values). */
int gen_new(struct gen **out, struct server *s, struct MHD_Connection *c, struct srv_req *r,
            enum oai_endpoint ep, struct oai_request *q, const char *id_prefix, const struct gen_dialect *d,
            struct oai_error *err);
void gen_free(struct gen *g);
/* Submits the jobs and answers: streamed (an SSE response) or in full once every choice
 * ended. Takes ownership of g. */
enum MHD_Result gen_serve(struct gen *g);

/* The prompt's token count for request q at endpoint ep, as gen_new would build it (the
 * chat template with q's tools and template variables, encoded), without running anything.
 * 0, or -1 with *err (400: the template or the encoding failed). */
int gen_count_prompt(struct srv_model *sm, enum oai_endpoint ep, const struct oai_request *q, int *n,
                     struct oai_error *err);

/* Prompt and completion token counts (completion: the tokens every choice consumed). */
int gen_usage(const struct gen *g, int *completion);
/* Prompt tokens the first choice found in the prefix cache (0 before it ended). */
int gen_cached(const struct gen *g);
/* Tokens speculative decoding drafted for the choices that ended, and how many of them were
 * accepted (*accepted); 0 without drafts. */
int gen_drafted(const struct gen *g, int *accepted);

/* Appends `data: <doc>\n\n` (doc deleted), or `event: <name>\ndata: <doc>\n\n` when name. */
int gen_sse_event(struct gen *g, const char *name, cJSON *doc);
/* Appends raw bytes to the stream. */
int gen_sse_raw(struct gen *g, const char *s, size_t n);

/* The finish reason in OpenAI's words. */
const char *gen_finish_openai(enum gen_finish f);
