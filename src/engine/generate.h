/*
 * generate: the prompt -> tokens loop of one sequence. The prompt is
 * prefilled in one batch (chunked by model_forward), then tokens are decoded
 * one at a time through the paged KV cache. Generation stops at n_predict
 * tokens, at an EOS id of the checkpoint (unless ignore_eos), when the
 * callback asks, or when the context is full.
 *
 * A prompt longer than the context is an error, or with `truncate` is cut so
 * that the n_predict tokens fit after it (at most half the context is kept
 * for them, at least one token): the first n_keep tokens (BOS, a system
 * prompt; llama.cpp's --keep) and the last n_keep_tail (a chat template's
 * generation prompt) stay, and the tokens between them are cut, LEFT the
 * oldest of them (keeps the end), RIGHT the newest (keeps the beginning), as
 * llama-server cuts after its n_keep. Logits with NaN or inf stop generation
 * with -ERR_FORMAT (sampling them is garbage).
 *
 * With gen_params.spec on, each step scores the last token and a draft (spec.h) in one
 * batch, keeps the drafted tokens sampling accepts plus one token of the model's own, and
 * truncates the rest from the cache: the same tokens as plain decoding when greedy, the
 * same distribution when sampling. Drafts reach at most kv_step_back_max positions (a
 * sliding-window cache's slack, kv_params.swa_slack). A drafter that reads the model's hidden
 * states (spec_params.observe: the MTP layer) gets every forward's, the prompt fed in pieces
 * of the context's n_batch rows for it. With recurrent layers the
 * sequence is checkpointed before a drafted step; a rejection restores it and the kept rows are
 * fed again in front of the next step's (ADR 0112; a catch-up forward when generation ends
 * there). Models whose rope follows the sequence's length (dynamic NTK, LongRoPE: scoring later
 * positions would change the step's own numbers) decode plainly (stats.spec_off says so).
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../models/model.h"
#include "batch.h"
#include "kvcache.h"
#include "sampler.h"
#include "spec.h"

#ifdef __cplusplus
extern "C" {
#endif

enum gen_truncate {
    GEN_TRUNCATE_OFF = 0,       /* a prompt longer than the context is an error */
    GEN_TRUNCATE_LEFT = 1,      /* drop the oldest tokens after the kept head */
    GEN_TRUNCATE_RIGHT = 2,     /* drop the newest tokens before the kept tail */
};

#define GEN_MAX_LORA 32         /* = LORA_MAX_ADAPTERS (models/lora.h) */

struct gen_params {
    int n_predict;              /* tokens to generate (>= 0) */
    bool ignore_eos;
    enum gen_truncate truncate;
    int n_keep;                 /* with truncate: prompt tokens at the start never cut */
    int n_keep_tail;            /* with truncate: prompt tokens at the end never cut */
    struct sampler_params sampling;
    struct spec_params spec;    /* speculative decoding (spec.h); mode SPEC_NONE: off */
    const struct batch_image *images; /* [n_images] the prompt's images (their seq ignored:
                                       * the generated sequence's), borrowed; ADR 0087 */
    int n_images;
    /* LoRA (ADR 0103): n_lora > 0: this request's scale of each of the context's adapters
     * (in model_ctx_set_lora's order; llama-server's per-request "lora"); 0: the context's
     * global scales at submission (the scheduler's; generate_run reads them every step) */
    float lora[GEN_MAX_LORA];
    int n_lora;
};

enum gen_stop {
    GEN_STOP_LENGTH = 0,    /* n_predict reached */
    GEN_STOP_EOS = 1,
    GEN_STOP_CALLBACK = 2,
    GEN_STOP_CONTEXT = 3,   /* the context filled up */
};

struct gen_stats {
    int n_prompt, n_gen;
    int n_dropped;                /* prompt tokens cut by gen_params.truncate */
    int n_cached;                 /* prompt tokens found in the prefix cache (the scheduler's) */
    double t_prompt_s, t_gen_s;   /* wall time of prefill and of decode */
    int n_drafted, n_accepted;    /* speculative decoding: tokens drafted, and accepted */
    bool spec_off;                /* speculation was asked for but the model cannot take it */
    enum gen_stop stop;
};

/* Called with every generated id (the EOS id that stops generation is not passed).
 * Return non-zero to stop. */
typedef int (*gen_token_fn)(void *ud, int32_t id);

/* Generates as sequence `seq` of kv, starting from an empty sequence (any previous
 * one is removed first, and the sequence is left in the cache). A prompt that does
 * not fit the cache is an error (-ERR_RANGE) naming both sizes; reaching the
 * context while decoding stops with GEN_STOP_CONTEXT. A prompt with images (p->images)
 * is never truncated: one that does not fit is an error. */
int generate(struct model_ctx *c, struct kv_cache *kv, int seq, const int32_t *prompt, int n_prompt,
             const struct gen_params *p, gen_token_fn cb, void *ud, struct gen_stats *stats,
             struct err *e);

/* Whether speculative decoding can run on c with kv (generate.h, ADR 0079): the cache can take
 * a draft back (kv_spec_back_max > 0: truncation, or recurrent checkpoints, ADR 0112) and the
 * rope does not follow the sequence's length. */
bool gen_spec_supported(const struct model_ctx *c, const struct kv_cache *kv);

/* Whether id is one of the checkpoint's EOS ids. */
bool gen_is_eos(const struct hparams *hp, int32_t id);

/* Monotonic seconds. */
double gen_now(void);

#ifdef __cplusplus
}
#endif
