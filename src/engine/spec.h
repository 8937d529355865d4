/*
 * spec: drafts for speculative decoding (generate.c verifies them).
 *
 * A drafter proposes the next tokens of a sequence; the target model scores the last
 * token and the drafts in one batch, and the longest prefix that sampling accepts
 * (sampler_sample_draft) is kept, plus one token of the target's own. Greedy output is
 * token for token what plain decoding gives; sampled output follows the same
 * distribution. ADR 0079.
 *
 * Prompt lookup (SPEC_NGRAM, "prompt lookup decoding", Saxena 2023; llama.cpp's
 * lookup and vLLM's n-gram speculator): the last n tokens of the history (prompt and
 * output so far), n from ngram_max down to ngram_min, are looked for earlier in the
 * history, most recent occurrence first; the tokens that followed it are the draft.
 * It pays where the output copies its input: code editing, summaries, RAG answers.
 *
 * A draft model (SPEC_DRAFT, spec_model_*) and the checkpoint's own multi-token-prediction
 * layer (SPEC_MTP, spec_mtp_*, ADR 0108) draft through spec_params.draft; the MTP layer also
 * needs the model's hidden states, which the verifier hands it through spec_params.observe.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"

struct model;
struct model_ctx;
struct kv_cache;

#ifdef __cplusplus
extern "C" {
#endif

enum spec_mode {
    SPEC_NONE = 0,
    SPEC_NGRAM = 1,
    SPEC_DRAFT = 2,   /* a draft model (spec_model_draft as the drafter) */
    SPEC_MTP = 3,     /* the checkpoint's MTP layer (spec_mtp_draft and spec_mtp_observe) */
};

#define SPEC_DRAFT_MAX_LIMIT 64  /* the bound of draft_max */

/* Proposes up to max tokens after hist[0..n), the history of cache sequence seq, into out;
 * returns how many (0: none). */
typedef int (*spec_draft_fn)(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max);
/* After a forward of the model: cache sequence seq now holds positions [pos0, pos0 + n) as
 * computed with final hidden states hidden [n, n_embd] (batch.hidden_out; positions past
 * pos0 + n that were scored were rolled back); hist[0..n_hist) is the sequence's history known
 * now (prompt and output, at least up to position pos0 + n - 1). Positions at or after pos0
 * observed before are superseded. */
typedef void (*spec_observe_fn)(void *ud, int seq, int pos0, const float *hidden, int n, const int32_t *hist,
                                int n_hist);
/* Before the first draft of a new request: hist[0..n) (its prompt) into the drafter's own
 * state of cache sequence seq, so that the first drafting step costs what later ones do.
 * generate() calls it inside the prompt's time, as llama.cpp prefills its draft model with
 * the prompt. */
typedef void (*spec_prefill_fn)(void *ud, int seq, const int32_t *hist, int n);

struct spec_params {
    enum spec_mode mode;
    int draft_max;      /* tokens drafted per step at most (1..SPEC_DRAFT_MAX_LIMIT) */
    int draft_min;      /* fewer than this: decode plainly this step (0..draft_max) */
    int ngram_min;      /* SPEC_NGRAM: the shortest suffix looked up (1..ngram_max) */
    int ngram_max;      /* SPEC_NGRAM: the longest (<= 16) */
    spec_draft_fn draft;  /* with mode SPEC_NONE and draft set: this drafter (tests) */
    void *draft_ud;
    spec_observe_fn observe;  /* set: generate() and the scheduler ask the forward for every
                               * row's hidden state and pass them here (ud: draft_ud) */
    spec_prefill_fn prefill;  /* optional (ud: draft_ud); else the first draft catches up */
    bool gate;          /* drafting paused while plain steps time faster (spec_gate; on by
                         * default): generate()'s steps, the scheduler's steps that hold one
                         * request's rows only */
};

/* Off; the values llama.cpp's prompt lookup defaults to where it has them: 16 drafted
 * tokens, n-grams of 1 to 3 (its ngram-min 1 / max 3 in lookup decoding), draft_min 1. */
void spec_params_default(struct spec_params *p);

/* The fields within their bounds (-ERR_ARG naming the field). */
int spec_params_check(const struct spec_params *p, struct err *e);

/* Whether p drafts at all. */
bool spec_on(const struct spec_params *p);

/* The draft of p for hist[0..n), the history of cache sequence seq: up to max tokens into out. */
int spec_draft(const struct spec_params *p, int seq, const int32_t *hist, int n, int32_t *out, int max);

/* A draft model: a smaller checkpoint of the same vocabulary proposes its greedy
 * continuation, one forward per drafted token, in its own cache, whose sequence s follows
 * the history of the model's sequence s: the longest prefix it shares with the history
 * stays, the rest is truncated and the new tokens fed (so a rejected draft costs only its
 * own positions, and a sequence id taken over by another request starts over by itself). */
struct spec_model;

/* Whether draft can draft for target: the same vocabulary size and EOS ids, and (draft_kv
 * not NULL) a cache that can step back (-ERR_ARG / -ERR_UNSUPPORTED naming what differs). */
int spec_model_check(const struct model *target, const struct model *draft, const struct kv_cache *draft_kv,
                     struct err *e);
/* A drafter over c and its cache kv (borrowed; its sequences are the drafter's, one per
 * sequence of the model's cache it drafts for: kv->max_seqs of them). */
int spec_model_new(struct spec_model **out, struct model_ctx *c, struct kv_cache *kv, struct err *e);
void spec_model_free(struct spec_model *d);
/* spec_draft_fn for spec_params.draft (ud: the spec_model). A failing forward of the draft
 * model drafts nothing from then on (spec_model_error says why). */
int spec_model_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max);
/* spec_prefill_fn for spec_params.prefill: hist[0..n - 1) fed into a sequence the drafter
 * holds nothing of yet (the last token is the first draft's to feed: its logits start it); a
 * sequence holding something is left to spec_model_draft's prefix matching. */
void spec_model_prefill(void *ud, int seq, const int32_t *hist, int n);
/* The draft model's error, or NULL. */
const char *spec_model_error(const struct spec_model *d);

/* The checkpoint's multi-token-prediction layer (model_load_mtp, ADR 0108) as a drafter: the
 * layer's own cache, in c's context, holds per sequence one row per position p of the model's
 * sequence that has a successor: input the token at p + 1 and the model's hidden state at p.
 * A draft feeds the rows not in it yet (the hidden states come through spec_mtp_observe) and
 * takes the argmax of the last one's logits, then chains: each further draft token is fed at
 * the next position with the layer's own final hidden state in place of the model's, and those
 * chained rows are truncated again (their true rows come once the model has scored them). A
 * sequence's rows start where the model first computed it for its current request (a prefix
 * cache hit's positions have no hidden states): positions in the layer's cache are relative to
 * that first one, which rope's relative angles do not see. The drafts are greedy: point masses,
 * exact under sampling_draft's rule. */
struct spec_mtp;

/* A drafter over the MTP model's context c and its cache kv (borrowed; one sequence per
 * sequence of the model's cache: kv->max_seqs of them, of kv->max_seq_len positions). */
int spec_mtp_new(struct spec_mtp **out, struct model_ctx *c, struct kv_cache *kv, struct err *e);
void spec_mtp_free(struct spec_mtp *d);
/* spec_draft_fn and spec_observe_fn for spec_params (ud: the spec_mtp). A failing forward of
 * the layer drafts nothing from then on (spec_mtp_error says why). */
int spec_mtp_draft(void *ud, int seq, const int32_t *hist, int n, int32_t *out, int max);
void spec_mtp_observe(void *ud, int seq, int pos0, const float *hidden, int n, const int32_t *hist, int n_hist);
const char *spec_mtp_error(const struct spec_mtp *d);
/* Whether mtp (a model_load_mtp layer) can draft for target: the same vocabulary and width
 * (-ERR_ARG naming what differs). */
int spec_mtp_check(const struct model *target, const struct model *mtp, struct err *e);

/* How long a sequence's drafts are, adapted to what was kept: the length halves after a
 * step that kept none and doubles after one that kept all (up to draft_max); at length 1,
 * a step that keeps none pauses drafting for 1, 2, 4 ... up to SPEC_PAUSE_MAX steps (a
 * draft nobody accepts costs rows for nothing), any kept draft ends the pauses. generate()
 * and the scheduler pace the same way, so a request drafts alike in both. */
#define SPEC_PAUSE_MAX 64
struct spec_pace {
    int len, max;     /* the draft length now; draft_max */
    int pause, rest;  /* the last pause's length; steps of it left */
};
void spec_pace_init(struct spec_pace *a, int draft_max);
/* The most the next step may draft: 0 while paused. */
int spec_pace_len(const struct spec_pace *a);
/* After each decode step: it drafted k and kept j of them (k = 0: a plain step, which
 * counts toward a pause). */
void spec_pace_update(struct spec_pace *a, int j, int k);

/* Whether drafting pays on this machine, by generate()'s own clock (issue 45's item 3, ADR
 * 0148): a draft that is often kept still costs more than it saves where a forward of k rows
 * costs nearly k one-row steps (a CPU) or drafting costs much (a draft model near the target's
 * size). Drafting steps run until SPEC_GATE_SPEC tokens are out, then plain steps until
 * SPEC_GATE_PLAIN more; the mode with fewer seconds a token holds for SPEC_GATE_HOLD tokens,
 * twice as long each time the same mode wins again (up to SPEC_GATE_HOLD_MAX), and then both
 * are timed again; but a drafter that keeps a cache of its own (a draft model) drafts no more
 * once plain decoding wins, since timing it again would first catch its cache up on every
 * token of the hold (on a CPU about as costly as the hold itself). Outputs do not depend on
 * the gate (drafts are exact); the drafted counts do. */
#define SPEC_GATE_SPEC 48
#define SPEC_GATE_PLAIN 16
#define SPEC_GATE_HOLD 256
#define SPEC_GATE_HOLD_MAX 4096
struct spec_gate {
    int phase;        /* 0: timing drafting steps, 1: timing plain ones, 2: holding the winner */
    bool sticky;      /* plain decoding, once it wins, holds for good */
    bool plain;       /* the last round's winner was plain decoding */
    int left, hold;   /* tokens left of the hold; its length */
    double t[2];      /* seconds of this round's [plain, drafting] steps */
    int n[2];         /* tokens they output */
};
void spec_gate_init(struct spec_gate *g, bool sticky);
/* Whether the next step may draft. */
bool spec_gate_drafts(const struct spec_gate *g);
/* After each decode step: it output n tokens in s seconds. */
void spec_gate_update(struct spec_gate *g, int n, double s);

/* Prompt lookup: the tokens after the most recent earlier occurrence of hist's last
 * m tokens, m from ngram_max down to ngram_min, up to max of them. */
int spec_ngram(const int32_t *hist, int n, int ngram_min, int ngram_max, int32_t *out, int max);

#ifdef __cplusplus
}
#endif
