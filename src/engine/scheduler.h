/*
 * scheduler: continuous batching of many generation requests over one model
 * context and one paged KV cache. Requests are submitted at any time; each
 * sched_step() builds ONE batch from every running request (one decode row
 * each, plus prompt chunks of admitted requests up to the step's token
 * budget), runs model_forward once, samples each request's next token with
 * its own sampler and reports it through the request's callback.
 *
 * Admission is first come, first served: a waiting request gets a sequence
 * id and starts prefilling when a sequence id is free and the pool has room
 * for its prompt. When a step's batch would not fit the pool, the most
 * recently admitted request is preempted by recomputation
 * (vLLM's policy): its cache is dropped, and it waits at the head of the
 * queue with its prompt plus what it generated, to be prefilled again; its
 * sampler, and so its output, is unaffected.
 *
 * Prefix cache (ADR 0022, on unless sched_params.no_prefix_cache): after
 * every forward the full blocks of each running request are registered in
 * the cache's prefix index; at admission a request attaches the longest
 * indexed chain of its tokens (always leaving its last token to compute, so
 * there are logits to sample) and prefills only the rest. The cached KV is
 * what the request would have computed (same tokens, same positions), so the
 * output is the same with or without a hit. A preempted request usually
 * finds its own blocks again when it is readmitted. With recurrent layers a hit
 * ends only where the cache kept a snapshot of the states (ADR 0129): a request
 * keeps them at its prompt's last full block and 16 blocks before it, where it
 * parts from a chain indexed before, and at the last block boundary its output
 * reached; its prompt chunks end at those boundaries.
 *
 * Images (ADR 0090): sched_submit_images takes a prompt's images as pixels. Each is
 * encoded by the model's vision tower as a step of the scheduler (at most one image per
 * sched_step, before that step's forward, so the other requests keep decoding while an image
 * prompt waits one step per image), once its request is running and its rows are next to be
 * fed; its rows then go into one forward whole (a prompt chunk ends before an image that does
 * not fit the step). In the prefix cache a block holding any image row is keyed, row by row,
 * by a SHA-256 of the SHA-256 of its images' pixel values, the row's place and its token: the
 * same text with another image never shares such a block (or any after it), the same image
 * does. A hit never ends inside an image.
 *
 * Single-threaded: one owner calls submit / cancel / step (the server puts a
 * lock around submit and runs steps on the engine thread). Nothing here
 * allocates per step; a request's token buffer grows when it is (re)admitted.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "generate.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sched;

/* Called once per request when it ends: stats (stop reason, counts, times) and, on
 * failure, rc < 0 with e describing it. */
typedef void (*sched_done_fn)(void *ud, const struct gen_stats *stats, int rc, const struct err *e);

/* A request's callbacks (all optional). on_token gets every generated id with the raw
 * logits row [n_vocab] it was sampled from (for logprobs); non-zero stops the request.
 * on_done is called exactly once. Both run on the thread that calls sched_step. */
struct sched_cb {
    int (*on_token)(void *ud, int32_t id, const float *logits);
    sched_done_fn on_done;
    void *ud;
};

struct sched_params {
    int max_batch_tokens;   /* rows per step (<= 0: the context's n_batch) */
    int max_requests;       /* waiting + running (<= 0: 1024) */
    bool no_prefix_cache;   /* true: neither register nor reuse prefixes (default: on) */
};

/* A scheduler over c and kv (borrowed; kv's sequences are the scheduler's). */
int sched_new(struct sched **out, struct model_ctx *c, struct kv_cache *kv, const struct sched_params *p,
              struct err *e);
/* Ends every request (done with GEN_STOP_CALLBACK semantics: rc 0) and frees the scheduler. */
void sched_free(struct sched *s);

/* Queue a request (the prompt is copied) with callbacks cb (NULL: none). *id (optional)
 * names it for sched_cancel. Errors: bad parameters, an empty prompt, a prompt longer than the
 * cache's max_seq_len, or the queue full. */
int sched_submit(struct sched *s, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                 const struct sched_cb *cb, int *id, struct err *e);
/* An image of a prompt for sched_submit_images: pixels (host float32 [C, S, S] as the
 * model's image processor gives them; copied) and the first of the prompt's tokens_per_image
 * image tokens it fills, prompt[pos, pos + tokens_per_image). */
struct sched_image {
    int32_t pos;
    const float *pixels;
    /* images of their own size (vision_info.merge > 0: Qwen2-VL, ADR 0095): its grid of t, h, w
     * patches; pixels [t h w, patch_dim], and t h w / merge² image tokens at pos. Zero for
     * fixed-size images. */
    int32_t grid[3];
};

/* At most this many images in one request. */
#define SCHED_MAX_IMAGES 64

/* sched_submit with n_images images (in prompt order, not overlapping). Errors: a model
 * without a vision tower, an image whose run is not all image tokens or includes the
 * prompt's last token, image tokens no image covers, an image of more rows than a step
 * (max_batch_tokens), more than SCHED_MAX_IMAGES. gen_params.images (images already encoded)
 * is refused: the scheduler encodes its own. */
int sched_submit_images(struct sched *s, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                        const struct sched_image *images, int n_images, const struct sched_cb *cb, int *id,
                        struct err *e);
/* Images encoded so far (every encode step; a preempted request keeps its embeddings). */
uint64_t sched_n_encoded(const struct sched *s);
/* End request id (waiting or running) as stopped by its callback; false if unknown. */
bool sched_cancel(struct sched *s, int id);
/* One batch over every running request; 0 when nothing is left to do after it, 1 when
 * work remains. A failing forward ends the running requests with its error (their
 * on_done gets it); waiting requests stay queued. */
int sched_step(struct sched *s, struct err *e);
/* Requests waiting and running. */
int sched_n_waiting(const struct sched *s);
int sched_n_running(const struct sched *s);
/* Prompt tokens of the requests admitted so far (each counted once, at its first
 * admission) and, of them, the ones found in the prefix cache. */
void sched_prefix_stats(const struct sched *s, uint64_t *query_tokens, uint64_t *hit_tokens);
/* Speculative decoding over all requests so far: tokens drafted, and accepted. */
void sched_spec_stats(const struct sched *s, uint64_t *drafted, uint64_t *accepted);

#ifdef __cplusplus
}
#endif
