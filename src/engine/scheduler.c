/*
 * scheduler: continuous batching (scheduler.h).
 *
 * A request holds its tokens (prompt, then what it generated) and how many
 * of them are in its cache sequence (n_fed). Every step feeds each running
 * request toks[n_fed .. n_toks) as far as the step's row budget allows (a
 * decoding request has exactly one token to feed, the one it just sampled),
 * asks for logits where a request's feed reaches its last token, and
 * samples those. Decode rows go first, so prefills never delay them; a long
 * prompt is prefilled over several steps.
 *
 * Speculative decoding (gen_params.spec, ADR 0079): a decoding request's row is
 * followed by its draft's rows (within the step's budget), all with logits;
 * after the forward the request's rows are judged in order as generate()
 * judges them and its sequence is truncated back to the tokens it keeps (recurrent layers:
 * back to the checkpoint taken before the step, the kept rows fed again in front of its next
 * rows, ADR 0112), so its output equals generate()'s with the same parameters. A drafter that reads the model's
 * hidden states (spec_params.observe: the MTP layer, ADR 0108) gets, after the step, those of
 * the rows its request keeps (prompt chunks included).
 *
 * Images (ADR 0090): a request keeps its images' pixels and, once encoded, their rows of
 * embeddings (backend memory) until it ends, so a preempted request is fed again without
 * encoding again. key[] is what the prefix cache sees of toks[]: the ids, except in blocks
 * holding an image row, where each row's key is 32 bits of SHA-256(the digests of the
 * block's images, the row's offset in the block, its id); a block of block_size such rows
 * matches another only when every row's 32 bits do.
 *
 * Recurrent layers (ADR 0129): a hit must end where the cache holds a snapshot of the states,
 * and a snapshot can only be taken when a sequence's length is the boundary. At admission a
 * request plans at most three: the last full block of its prompt (a repeated prompt, the next
 * turn of a chat), SCHED_SNAP_TAIL blocks before it (a prompt that shares all but a short last
 * turn) and, when its tokens match an indexed chain longer than its hit, the end of that chain
 * (where it parts from a prompt seen before: a shared system prompt). Its prompt
 * chunks end at those boundaries, and after the step that reaches one its states are kept.
 * Past its prompt it keeps one more, at the last block boundary its output reached (replaced as
 * it goes on): the next turn of a chat, which renders this answer again, finds it.
 */
#include "scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/log.h"
#include "../core/sha256.h"
#include "../kernels/backend.h"
#include "../models/lora.h"
#include "../models/vision.h"

_Static_assert(GEN_MAX_LORA == LORA_MAX_ADAPTERS, "gen_params.lora holds every adapter");

#define SCHED_DEFAULT_MAX_REQUESTS 1024
/* Blocks between a prompt's last full block and the snapshot kept before it (ADR 0129): 256
 * tokens at the default block size, more than most user turns of a chat, so a second prompt
 * that shares only the system prompt with the first hits most of it. */
#define SCHED_SNAP_TAIL 16

struct simg {
    int32_t pos;                 /* its first row in toks */
    int n_tok;                   /* its rows */
    int32_t grid[3];             /* images of their own size: t, h, w patches (else 0) */
    size_t n_px;                 /* floats of pixels */
    float *pixels;               /* [C, S, S] (or [t h w, patch_dim]) host, owned */
    float *embd;                 /* [(1 + n_deepstack) T, n_embd] backend memory once encoded
                                  * (vision_image_floats), owned; NULL before */
    char sha[65];                /* SHA-256 of the pixel values' bytes, hex */
};

struct sreq {
    int id;                      /* > 0 while in use */
    int seq;                     /* cache sequence, -1 while waiting */
    int32_t *toks;               /* [cap] prompt, then generated ids */
    int32_t *key;                /* [cap] the prefix cache's key of each of toks (see above) */
    struct simg *img;            /* [n_img] the prompt's images, in order */
    int n_img;
    int32_t *rope;               /* [n_prompt][3] M-RoPE positions of an image prompt (ADR 0094),
                                  * or NULL: a row's position in all three */
    int32_t delta;               /* what rows past the prompt add to their position */
    int n_toks, cap, n_prompt;
    int n_fed;                   /* toks in the cache */
    long admitted;               /* admission order (preemption takes the newest) */
    struct sampler *smp;
    struct gen_params p;
    struct sched_cb cb;
    bool cons_broken;            /* the constraint refused a token (an internal error) */
    bool spec;                   /* drafts for this request (asked, and the model can take them) */
    int32_t *draft;              /* [p.spec.draft_max] this step's draft */
    int n_draft;                 /* its length */
    bool decoding;               /* this step feeds its one sampled token (a decode step) */
    bool rewind;                 /* a rejected draft took its cache back to the checkpoint before
                                  * the step (recurrent layers, ADR 0112): the kept rows go again
                                  * with its next token, drafts after them */
    int snap[3];                 /* recurrent layers: block boundaries where its states are kept
                                  * for the prefix cache (ADR 0129): the prompt's last full block,
                                  * the end of the chain another prompt left indexed, and
                                  * SCHED_SNAP_TAIL blocks before the first; a prompt chunk ends
                                  * there; 0: none */
    int snap_dec;                /* the length where it last kept its states past its prompt
                                  * (decoding reaches a block boundary), replaced by the next; 0:
                                  * none of its own */
    int obs_to;                  /* after a rewind: the kept rows' hidden states went to the
                                  * drafter already (spec_params.observe), up to this position;
                                  * their second feed is not observed again (0: none) */
    struct spec_pace pace;       /* the draft length now (spec.h) */
    struct spec_gate gate;       /* whether drafting pays (spec.h), timed on the steps this
                                  * request has to itself (ADR 0148) */
    struct gen_stats st;
    double t_admit, t_first;
    float lora[GEN_MAX_LORA];    /* its adapters' scales, fixed at submission (ADR 0103) */
    bool lora_on;                /* some scale is not 0: its prefix keys carry them */
};

struct sched {
    struct model_ctx *c;
    struct kv_cache *kv;
    struct sreq *reqs;           /* [max_requests] */
    int *waiting;                /* [max_requests] FIFO of request slots */
    int n_waiting, max_requests, next_id;
    long n_admitted;
    struct batch b;
    int *row_req;                /* [max_batch_tokens] request slot of each logits row */
    float *logits;               /* [max_batch_tokens, n_vocab] */
    int budget;
    int cap;                     /* rows a step may hold: budget, + one image's rows (vision) */
    bool prefix;                 /* the prefix cache is on */
    bool spec_ok;                /* the model and cache can take drafts (gen_spec_supported) */
    uint64_t n_drafted, n_accepted;  /* speculative decoding, all requests (sched_spec_stats) */
    bool no_drafts;              /* this step's batch is built without drafts (the pool is short) */
    uint64_t n_query, n_hit;     /* prompt tokens admitted / found cached (sched_prefix_stats) */
    struct vision_ctx *vc;       /* the tower's buffers, made at the first encode; owned */
    struct batch_image *bimg;    /* [budget] this step's images (a model with vision) */
    int n_lora;                  /* the context's adapters (model_ctx_n_lora at sched_new) */
    float *lora;                 /* [max_seqs][n_lora] scales of each running sequence */
    float *hid;                  /* [cap, n_embd] the step's hidden states, once a request's drafter
                                  * reads them (spec_params.observe); NULL before */
    int *seq_row;                /* [max_seqs] the step's first row of each sequence, or -1 */
    uint64_t n_encoded;          /* images encoded (sched_n_encoded) */
};

// ---- requests ----

static void req_end(struct sched *s, struct sreq *r, int rc, const struct err *e)
{
    if (r->seq >= 0)
        kv_seq_remove(s->kv, r->seq);
    if (r->t_first > 0)
        r->st.t_gen_s = gen_now() - r->t_first;
    if (r->cb.on_done)
        r->cb.on_done(r->cb.ud, &r->st, rc, e);
    sampler_free(r->smp);
    for (int k = 0; k < r->n_img; k++) {
        free(r->img[k].pixels);
        if (r->img[k].embd)
            s->c->be->ops->buf_free(s->c->be, r->img[k].embd);
    }
    free(r->img);
    free(r->rope);
    free(r->toks);
    free(r->key);
    free(r->draft);
    memset(r, 0, sizeof *r);
    r->seq = -1;
}

static int free_seq(const struct sched *s)
{
    for (int q = 0; q < s->kv->max_seqs; q++)
        if (kv_seq_len(s->kv, q) < 0)
            return q;
    return -1;
}

// ---- lifetime and submission ----

/* The most rows of one image: the model's tokens_per_image, or for images of their own size
 * what one forward chunk holds. */
static int image_rows(const struct sched *s)
{
    const struct vision *v = s->c->m->vision;
    return !v ? 0 : v->info.merge > 0 ? s->c->n_batch : v->info.tokens_per_image;
}

int sched_new(struct sched **out, struct model_ctx *c, struct kv_cache *kv, const struct sched_params *p,
              struct err *e)
{
    int rc;
    *out = NULL;
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    s->c = c;
    s->kv = kv;
    s->next_id = 1;
    s->budget = p && p->max_batch_tokens > 0 ? p->max_batch_tokens : c->n_batch;
    s->max_requests = p && p->max_requests > 0 ? p->max_requests : SCHED_DEFAULT_MAX_REQUESTS;
    s->prefix = !(p && p->no_prefix_cache);
    s->spec_ok = gen_spec_supported(c, kv);
    s->reqs = calloc((size_t)s->max_requests, sizeof *s->reqs);
    s->waiting = calloc((size_t)s->max_requests, sizeof *s->waiting);
    /* an image's rows go in one step whole, past the budget when it is smaller (once a step) */
    s->cap = s->budget + image_rows(s);
    s->logits = malloc((size_t)s->cap * c->m->hp.n_vocab * sizeof *s->logits);
    s->row_req = malloc((size_t)s->cap * sizeof *s->row_req);
    s->bimg = c->m->vision ? malloc((size_t)s->cap * sizeof *s->bimg) : NULL;
    s->n_lora = model_ctx_n_lora(c);
    s->lora = s->n_lora ? calloc((size_t)kv->max_seqs * s->n_lora, sizeof *s->lora) : NULL;
    if (!s->reqs || !s->waiting || !s->logits || !s->row_req || (c->m->vision && !s->bimg) ||
        (s->n_lora && !s->lora)) {
        sched_free(s);
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    }
    for (int i = 0; i < s->max_requests; i++)
        s->reqs[i].seq = -1;
    if ((rc = batch_init(&s->b, s->cap, e)) < 0) {
        sched_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    for (int i = 0; s->reqs && i < s->max_requests; i++)
        if (s->reqs[i].id > 0) {
            s->reqs[i].st.stop = GEN_STOP_CALLBACK;
            req_end(s, &s->reqs[i], 0, NULL);
        }
    batch_free(&s->b);
    vision_ctx_free(s->vc);
    free(s->bimg);
    free(s->hid);
    free(s->seq_row);
    free(s->reqs);
    free(s->waiting);
    free(s->logits);
    free(s->row_req);
    free(s->lora);
    free(s);
}


/* Rope positions of rows [row0, row0 + n) of the batch, r's at positions from pos0. */
static void rope_rows(struct sched *s, const struct sreq *r, int row0, int n, int pos0)
{
    if (!r->rope)
        return;
    for (int i = 0; i < n; i++) {
        int pos = pos0 + i;
        if (pos < r->n_prompt)
            batch_rope_set(&s->b, row0 + i, 1, r->rope + 3 * (size_t)pos, 0, NULL);
        else
            batch_rope_set(&s->b, row0 + i, 1, NULL, r->delta, NULL);
    }
}

/* The prefix key of r's token i (toks[i] set; see the file's comment). */
static int32_t key_of(const struct sched *s, const struct sreq *r, int i)
{
    int B = s->kv->block_size, b0 = i / B * B;
    struct sha256 h;
    bool any = false;
    if (r->lora_on) {
        /* another adapter mix computes other K/V for the same tokens: its own keys */
        sha256_init(&h);
        sha256_update(&h, r->lora, (size_t)s->n_lora * sizeof *r->lora);
        any = true;
    }
    for (int k = 0; k < r->n_img; k++) {
        if (r->img[k].pos >= b0 + B || r->img[k].pos + r->img[k].n_tok <= b0)
            continue;
        if (!any)
            sha256_init(&h);
        any = true;
        sha256_update(&h, r->img[k].sha, 64);
    }
    if (!any)
        return r->toks[i];
    int32_t tail[2] = {i - b0, r->toks[i]};
    char hex[65];
    sha256_update(&h, tail, sizeof tail);
    sha256_final_hex(&h, hex);
    uint32_t v = 0;
    for (int j = 0; j < 8; j++)
        v = v << 4 | (uint32_t)(hex[j] <= '9' ? hex[j] - '0' : hex[j] - 'a' + 10);
    return (int32_t)v;
}

/* r's adapter scales: the request's own (p->n_lora of them, the context's count), or the
 * context's global scales now. -ERR_ARG for another count, -ERR_RANGE for a bad scale. */
static int take_lora(struct sched *s, struct sreq *r, const struct gen_params *p, struct err *e)
{
    if (p->n_lora < 0 || p->n_lora > GEN_MAX_LORA || (p->n_lora > 0 && p->n_lora != s->n_lora))
        return err_setf(e, ERR_ARG, "the request gives %d adapter scales; the model has %d "
                        "adapters", p->n_lora, s->n_lora);
    for (int i = 0; i < s->n_lora; i++) {
        float v = p->n_lora ? p->lora[i] : model_ctx_lora_scale(s->c, i);
        if (!isfinite(v) || fabsf(v) > LORA_MAX_SCALE)
            return err_setf(e, ERR_RANGE, "adapter %d's scale %g is not in [-%g, %g]", i,
                            (double)v, (double)LORA_MAX_SCALE, (double)LORA_MAX_SCALE);
        r->lora[i] = v;
        r->lora_on |= v != 0.0f;
    }
    return 0;
}

/* images[0, n) checked against prompt and copied into r (pixels hashed). */
static int take_images(struct sched *s, struct sreq *r, const int32_t *prompt, int n_prompt,
                       const struct sched_image *images, int n, struct err *e)
{
    const struct model *m = s->c->m;
    if (!m->vision)
        return err_setf(e, ERR_ARG, "model %s does not take images", m->hp.model_type);
    if (n > SCHED_MAX_IMAGES)
        return err_setf(e, ERR_RANGE, "%d images in one request (at most %d)", n, SCHED_MAX_IMAGES);
    const struct vision_info *vi = &m->vision->info;
    int T = vi->tokens_per_image, covered = 0, prev_end = 0, rc;
    int32_t *grids = NULL;
    for (int k = 0; k < n; k++) {
        int32_t p = images[k].pos;
        if (vi->merge > 0 && (T = vision_grid_tokens(m->vision, images[k].grid, e)) < 0)
            return err_prefix(e, "image %d", k);
        if (T > s->c->n_batch && vi->bidirectional)
            return err_setf(e, ERR_RANGE, "an image takes %d rows but a forward chunk holds %d (the context's "
                            "n_batch)", T, s->c->n_batch);
        if (!images[k].pixels || p < prev_end || p > n_prompt - 1 - T)
            return err_setf(e, ERR_ARG, "image %d at token %d: images go in order, apart, each before the "
                            "prompt's last token", k, (int)p);
        for (int j = p; j < p + T; j++)
            if (!vision_is_image_row(vi, prompt[j]) || (j == p && prompt[j] != vi->image_token_id))
                return err_setf(e, ERR_ARG, "image %d: token %d of its %d rows is %d, not the image token %d",
                                k, j, T, prompt[j], vi->image_token_id);
        covered += T;
        prev_end = p + T;
    }
    for (int j = 0; j < n_prompt; j++)
        covered -= vision_is_image_row(vi, prompt[j]);
    if (covered != 0)
        return err_setf(e, ERR_ARG, "the prompt holds image tokens that no image fills");
    if (n == 0)
        return 0;
    if (!(r->img = calloc((size_t)n, sizeof *r->img)))
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    for (int k = 0; k < n; k++, r->n_img++) {
        struct simg *im = &r->img[k];
        struct sha256 h;
        im->pos = images[k].pos;
        im->n_tok = vi->merge > 0 ? vision_grid_tokens(m->vision, images[k].grid, NULL) : vi->tokens_per_image;
        memcpy(im->grid, images[k].grid, sizeof im->grid);
        im->n_px = vi->merge > 0 ? (size_t)im->grid[0] * im->grid[1] * im->grid[2] * (size_t)vi->patch_dim
                                 : vision_pixel_bytes(m->vision) / sizeof(float);
        size_t px = im->n_px * sizeof(float);
        if (!(im->pixels = malloc(px)))
            return err_setf(e, ERR_NOMEM, "scheduler: out of memory for an image's pixels");
        memcpy(im->pixels, images[k].pixels, px);
        sha256_init(&h);
        sha256_update(&h, im->pixels, px);
        if (vi->merge > 0)
            sha256_update(&h, im->grid, sizeof im->grid);
        sha256_final_hex(&h, im->sha);
    }
    /* M-RoPE: the prompt's positions as get_rope_index makes them, once (ADR 0094) */
    if (vi->merge > 0 && hparams_has_mrope(&m->hp)) {
        grids = malloc((size_t)n * 2 * sizeof *grids);
        r->rope = malloc((size_t)n_prompt * 3 * sizeof *r->rope);
        if (!grids || !r->rope) {
            free(grids);
            return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
        }
        for (int k = 0; k < n; k++) {
            grids[2 * k] = r->img[k].grid[1] / vi->merge;
            grids[2 * k + 1] = r->img[k].grid[2] / vi->merge;
        }
        rc = vision_mrope_positions(r->rope, &r->delta, prompt, n_prompt, vi->image_token_id, grids, n, e);
        free(grids);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Undo a failed submission's allocations. */
static void req_discard(struct sreq *r)
{
    for (int k = 0; k < r->n_img; k++)
        free(r->img[k].pixels);
    free(r->img);
    free(r->rope);
    free(r->toks);
    free(r->key);
    free(r->draft);
    sampler_free(r->smp);
    memset(r, 0, sizeof *r);
    r->seq = -1;
}

int sched_submit(struct sched *s, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                 const struct sched_cb *cb, int *id, struct err *e)
{
    return sched_submit_images(s, prompt, n_prompt, p, NULL, 0, cb, id, e);
}

int sched_submit_images(struct sched *s, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                        const struct sched_image *images, int n_images, const struct sched_cb *cb, int *id,
                        struct err *e)
{
    int rc, slot = -1;
    if (n_prompt <= 0)
        return err_setf(e, ERR_ARG, "the prompt is empty");
    if (p->n_predict < 0)
        return err_setf(e, ERR_ARG, "the number of tokens to generate must not be negative");
    /* ADR 0090: the scheduler encodes images itself (sched_submit_images); rows encoded
     * elsewhere carry no content hash for the prefix key */
    if (p->n_images != 0)
        return err_setf(e, ERR_UNSUPPORTED, "the scheduler takes images as pixels (sched_submit_images), "
                        "not encoded rows");
    if (n_images < 0 || (n_images > 0 && !images))
        return err_setf(e, ERR_ARG, "%d images without their list", n_images);
    if (n_prompt > s->kv->max_seq_len)
        return err_setf(e, ERR_RANGE, "the prompt has %d tokens but the context holds %d", n_prompt,
                        s->kv->max_seq_len);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->c->m->hp.n_vocab)
            return err_setf(e, ERR_RANGE, "token id %d at position %d is outside the vocabulary [0, %d)",
                            prompt[i], i, s->c->m->hp.n_vocab);
    for (int i = 0; i < s->max_requests && slot < 0; i++)
        if (s->reqs[i].id == 0)
            slot = i;
    if (slot < 0)
        return err_setf(e, ERR_RANGE, "the scheduler holds %d requests already", s->max_requests);
    struct sreq *r = &s->reqs[slot];
    memset(r, 0, sizeof *r);
    r->seq = -1;
    r->cap = n_prompt + (p->n_predict < s->kv->max_seq_len ? p->n_predict : s->kv->max_seq_len) + 1;
    if (spec_on(&p->spec) && (rc = spec_params_check(&p->spec, e)) < 0)
        return rc;
    /* a vision model's text prompt is checked too: no image tokens without their image */
    if ((n_images > 0 || s->c->m->vision) &&
        (rc = take_images(s, r, prompt, n_prompt, images, n_images, e)) < 0) {
        req_discard(r);
        return rc;
    }
    r->spec = spec_on(&p->spec) && s->spec_ok;
    if (r->spec && p->spec.observe && s->c->m->ops->mtp == MTP_NONE && !tensor_is_present(&s->c->m->mtp.eh_proj)) {
        req_discard(r);
        return err_setf(e, ERR_UNSUPPORTED, "the %s family does not hand out the hidden states its drafter reads",
                        s->c->m->ops->family);
    }
    if (r->spec && p->spec.observe && !s->hid) {
        s->hid = malloc((size_t)s->cap * s->c->m->hp.n_embd * sizeof *s->hid);
        s->seq_row = malloc((size_t)s->kv->max_seqs * sizeof *s->seq_row);
        if (!s->hid || !s->seq_row) {
            free(s->hid);
            free(s->seq_row);
            s->hid = NULL;
            s->seq_row = NULL;
            req_discard(r);
            return err_setf(e, ERR_NOMEM, "scheduler: out of memory for the hidden states");
        }
    }
    r->toks = malloc((size_t)r->cap * sizeof *r->toks);
    r->key = malloc((size_t)r->cap * sizeof *r->key);
    r->draft = r->spec ? malloc((size_t)p->spec.draft_max * sizeof *r->draft) : NULL;
    if (!r->toks || !r->key || (r->spec && !r->draft)) {
        req_discard(r);
        return err_setf(e, ERR_NOMEM, "scheduler: out of memory");
    }
    spec_pace_init(&r->pace, r->spec ? p->spec.draft_max : 0);
    spec_gate_init(&r->gate, p->spec.prefill != NULL);
    if ((rc = sampler_new(&r->smp, &p->sampling, s->c->m->hp.n_vocab, e)) < 0) {
        req_discard(r);
        return rc;
    }
    if ((rc = take_lora(s, r, p, e)) < 0) {
        req_discard(r);
        return rc;
    }
    memcpy(r->toks, prompt, (size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++) {
        sampler_accept(r->smp, prompt[i]);
        r->key[i] = key_of(s, r, i);
    }
    r->n_toks = r->n_prompt = n_prompt;
    r->p = *p;
    if (cb)
        r->cb = *cb;
    r->st = (struct gen_stats){.n_prompt = n_prompt, .stop = GEN_STOP_LENGTH,
                               .spec_off = spec_on(&p->spec) && !s->spec_ok};
    r->id = s->next_id++;
    if (s->next_id <= 0)
        s->next_id = 1;
    s->waiting[s->n_waiting++] = slot;
    if (id)
        *id = r->id;
    return 0;
}

static void waiting_remove(struct sched *s, int at)
{
    memmove(s->waiting + at, s->waiting + at + 1, (size_t)(s->n_waiting - at - 1) * sizeof *s->waiting);
    s->n_waiting--;
}

bool sched_cancel(struct sched *s, int id)
{
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id != id || id <= 0)
            continue;
        for (int w = 0; w < s->n_waiting; w++)
            if (s->waiting[w] == i)
                waiting_remove(s, w);
        r->st.stop = GEN_STOP_CALLBACK;
        req_end(s, r, 0, NULL);
        return true;
    }
    return false;
}

int sched_n_waiting(const struct sched *s)
{
    return s->n_waiting;
}

int sched_n_running(const struct sched *s)
{
    int n = 0;
    for (int i = 0; i < s->max_requests; i++)
        n += s->reqs[i].id > 0 && s->reqs[i].seq >= 0;
    return n;
}

void sched_prefix_stats(const struct sched *s, uint64_t *query_tokens, uint64_t *hit_tokens)
{
    *query_tokens = s->n_query;
    *hit_tokens = s->n_hit;
}

void sched_spec_stats(const struct sched *s, uint64_t *drafted, uint64_t *accepted)
{
    *drafted = s->n_drafted;
    *accepted = s->n_accepted;
}

uint64_t sched_n_encoded(const struct sched *s)
{
    return s->n_encoded;
}

// ---- one step ----

/* Blocks a request needs to hold all its tokens. */
static int blocks_for(const struct sched *s, int n_toks)
{
    return (n_toks + s->kv->block_size - 1) / s->kv->block_size;
}

/* Recurrent layers (ADR 0129): the block boundaries past the hit where r's states will be
 * kept: the prompt's last full block (all its ids but the last, which a later identical prompt
 * leaves to compute), the end of the longest indexed chain its tokens match when no snapshot
 * made that chain a hit (another prompt parts from this one there), and SCHED_SNAP_TAIL blocks
 * before the last full block (where a prompt that shares all but a short last turn parts). */
static void plan_snapshots(const struct sched *s, struct sreq *r, int hit)
{
    int bs = s->kv->block_size;
    r->snap[0] = r->snap[1] = r->snap[2] = r->snap_dec = 0;
    if (!s->prefix || !kv_can_snapshot(s->kv))
        return;
    int last = (r->n_prompt - 1) / bs * bs, seen = kv_prefix_match(s->kv, r->key, r->n_toks - 1);
    int tail = last - SCHED_SNAP_TAIL * bs;
    if (last > hit)
        r->snap[0] = last;
    if (seen > hit && seen != last)
        r->snap[1] = seen;
    if (tail > hit && tail != seen)
        r->snap[2] = tail;
}

/* At most k rows of r's next prompt chunk, ending at a boundary where its states are to be
 * kept when one lies inside (plan_snapshots). */
static int chunk_snap(const struct sreq *r, int k)
{
    for (int j = 0; j < 3; j++)
        if (r->snap[j] > r->n_fed && r->snap[j] < r->n_fed + k)
            k = r->snap[j] - r->n_fed;
    return k;
}

/* After a step: the states of each request that reached a planned boundary are kept as the
 * snapshot of that block's entry (registered just before); past its prompt, at each block
 * boundary, replacing its previous one there (the next turn of a chat renders this answer
 * again). A buffer that cannot be had turns snapshots off, with one warning. */
static void take_snapshots(struct sched *s)
{
    int bs = s->kv->block_size;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        struct err e;
        if (r->id <= 0 || r->seq < 0 || r->n_fed <= 0)
            continue;
        bool planned = r->n_fed == r->snap[0] || r->n_fed == r->snap[1] || r->n_fed == r->snap[2];
        bool answer = r->n_fed >= r->n_prompt && r->n_fed % bs == 0 && r->n_fed > r->snap_dec;
        if (!planned && !answer)
            continue;
        int rc = kv_prefix_snapshot(s->kv, r->seq, &e);
        if (rc < 0) {
            LOG_WARN("prefix cache: %s; recurrent states are no longer kept (no prefix hits)", e.msg);
            return;
        }
        if (answer && !planned) {
            /* its own earlier one goes; one the entry had already is another request's */
            kv_prefix_unsnap(s->kv, r->seq, r->snap_dec);
            r->snap_dec = rc == 1 ? r->n_fed : 0;
        }
    }
}

/* Admit waiting requests in order while a sequence id and room for the tokens exist. A
 * request first attaches what the prefix cache holds of its tokens (all but the last,
 * which must be computed for its logits); the room it needs is for the rest. */
static void admit(struct sched *s)
{
    while (s->n_waiting > 0) {
        struct sreq *r = &s->reqs[s->waiting[0]];
        int q = free_seq(s);
        bool alone = sched_n_running(s) == 0;
        if (q < 0)
            return;
        kv_seq_add(s->kv, q, NULL);
        if (s->n_lora)
            memcpy(s->lora + (size_t)q * s->n_lora, r->lora, (size_t)s->n_lora * sizeof *s->lora);
        int hit = s->prefix ? kv_prefix_attach(s->kv, q, r->key, r->n_toks - 1) : 0;
        for (int k = r->n_img - 1; k >= 0 && hit > 0; k--)
            if (r->img[k].pos < hit && hit < r->img[k].pos + r->img[k].n_tok) {
                /* a hit ends inside an image: attach only what lies before it */
                kv_seq_remove(s->kv, q);
                kv_seq_add(s->kv, q, NULL);
                hit = kv_prefix_attach(s->kv, q, r->key, r->img[k].pos);
            }
        int held = hit / s->kv->block_size, avail = kv_n_free_blocks(s->kv);
        if (avail < blocks_for(s, r->n_toks + 1) - held && !alone) {
            kv_seq_remove(s->kv, q);
            return;
        }
        if (avail < blocks_for(s, r->n_toks) - held) {
            struct err e;
            kv_seq_remove(s->kv, q);
            err_setf(&e, ERR_NOMEM, "kv cache of %d blocks is too small for a request of %d tokens",
                     s->kv->n_blocks, r->n_toks);
            waiting_remove(s, 0);
            req_end(s, r, -ERR_NOMEM, &e);
            continue;
        }
        r->seq = q;
        r->n_fed = hit;
        r->rewind = false;
        plan_snapshots(s, r, hit);
        r->obs_to = 0;
        r->admitted = s->n_admitted++;
        if (r->t_admit == 0) {
            /* first admission: the prompt's hit counts (a readmission's does not) */
            r->t_admit = gen_now();
            r->st.n_cached = hit;
            s->n_query += (uint64_t)r->n_prompt;
            s->n_hit += (uint64_t)hit;
        }
        waiting_remove(s, 0);
    }
}

/* Drop the newest running request's cache and put it back at the head of the queue. */
static bool preempt(struct sched *s)
{
    struct sreq *v = NULL;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0 && (!v || r->admitted > v->admitted))
            v = r;
    }
    if (!v || sched_n_running(s) < 2)
        return false;
    kv_seq_remove(s->kv, v->seq);
    v->seq = -1;
    v->n_fed = 0;
    v->obs_to = 0;
    memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
    s->waiting[0] = (int)(v - s->reqs);
    s->n_waiting++;
    return true;
}

/* r's draft after its last token, as generate() drafts: at most its draft length now, the
 * output left after the step's own token, the context left, and the rows of room its own
 * rows (the token, and the kept rows of a rewind) leave. */
static int draft_for(const struct sched *s, struct sreq *r, int room)
{
    if (r->p.spec.gate && !spec_gate_drafts(&r->gate))
        return 0;
    int left = r->n_toks - r->n_fed;  /* 1, or more after a rollback (rewind) */
    int max = r->p.n_predict - r->st.n_gen - 1, ctx = s->kv->max_seq_len - r->n_toks;
    int lim = spec_pace_len(&r->pace);
    max = max < lim ? max : lim;
    max = max < ctx ? max : ctx;
    max = max < kv_spec_back_max(s->kv) ? max : kv_spec_back_max(s->kv);
    max = max < room - left ? max : room - left;
    int k = max > 0 ? spec_draft(&r->p.spec, r->seq, r->toks, r->n_toks, r->draft, max) : 0;
    return k < r->p.spec.draft_min || k < 0 ? 0 : k > max ? max : k;
}

/* The rows of r's next prompt chunk, at most k: it ends before an image not yet encoded or
 * not whole in it; the images it holds are added to the step's list (every one before that
 * end: an encoded image and an unencoded one after it in the same chunk's reach, as an
 * Idefics3 image's tiles or a prompt's two images are, give a chunk ending before the second
 * that holds the first's rows). */
static int chunk_images(struct sched *s, const struct sreq *r, int k)
{
    int from = r->n_fed;
    /* an image attended both ways goes whole; a causal one (Qwen) may be cut between steps */
    bool whole = !s->c->m->vision || s->c->m->vision->info.bidirectional;
    for (int j = 0; j < r->n_img; j++) {
        const struct simg *im = &r->img[j];
        int T = im->n_tok;
        if (im->pos + T <= from)
            continue;  /* fed */
        if (im->pos >= from + k)
            break;
        if (im->pos < from && whole)
            return 0;  /* never: a hit and a chunk both end outside images */
        if (!im->embd || (whole && im->pos + T > from + k)) {
            k = im->pos > from ? im->pos - from : 0;
            break;
        }
    }
    int D = s->c->m->hp.n_embd;
    for (int j = 0; j < r->n_img; j++) {
        const struct simg *im = &r->img[j];
        int lo = im->pos > from ? im->pos : from, hi = im->pos + im->n_tok;
        hi = hi < from + k ? hi : from + k;
        if (lo >= hi)
            continue;
        /* the rows of the image in this step (all of it, or a part of a causal one) */
        s->bimg[s->b.n_img++] = (struct batch_image){r->seq, lo, hi - lo, im->embd + (size_t)(lo - im->pos) * D,
                                                     0, 0, (size_t)im->n_tok * D};
        s->b.img = s->bimg;
    }
    return k;
}

/* The rows of r's next image when its next row to feed starts one (encoded), else 0. */
static int image_next(const struct sreq *r)
{
    for (int j = 0; j < r->n_img; j++)
        if (r->img[j].pos == r->n_fed)
            return r->img[j].embd != NULL ? r->img[j].n_tok : 0;
    return 0;
}

/* Rows for every running request: decode rows (with their drafts) first, then prompt chunks. */
static void build_batch(struct sched *s)
{
    batch_clear(&s->b);
    for (int i = 0; i < s->max_requests; i++) {
        s->reqs[i].n_draft = 0;
        s->reqs[i].decoding = false;
    }
    bool past = false;  /* an image went past the budget this step */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < s->max_requests; i++) {
            struct sreq *r = &s->reqs[i];
            int left = r->n_toks - r->n_fed, room = s->budget - s->b.n_tok;
            if (r->id <= 0 || r->seq < 0 || left <= 0 || (pass == 0) != (left == 1 || r->rewind) ||
                (room <= 0 && pass == 0))
                continue;
            r->decoding = pass == 0;
            r->n_draft = pass == 0 && r->spec && !s->no_drafts ? draft_for(s, r, room) : 0;
            if (r->n_draft > 0) {
                /* the kept rows of a rewind (no logits), the token, its draft */
                for (int q = r->n_fed; q < r->n_toks; q++) {
                    batch_add(&s->b, r->toks[q], q, r->seq, q == r->n_toks - 1, NULL);
                    s->row_req[s->b.n_tok - 1] = i;
                }
                for (int j = 0; j < r->n_draft; j++) {
                    batch_add(&s->b, r->draft[j], r->n_toks + j, r->seq, true, NULL);
                    s->row_req[s->b.n_tok - 1] = i;
                }
                rope_rows(s, r, s->b.n_tok - left - r->n_draft, left + r->n_draft, r->n_fed);
                continue;
            }
            int k = room > 0 ? chunk_images(s, r, chunk_snap(r, left < room ? left : room)) : 0;
            int nxt = k <= 0 && !past ? image_next(r) : 0;
            if (nxt > 0 && nxt <= s->cap - s->b.n_tok) {
                /* the next rows are an image larger than what the budget leaves: it goes whole,
                 * past the budget (at most one image's rows past it a step) */
                k = chunk_images(s, r, nxt);
                past = k > 0;
            }
            if (k <= 0)
                continue;
            batch_add_seq(&s->b, r->toks + r->n_fed, k, r->n_fed, r->seq, k == left, NULL);
            rope_rows(s, r, s->b.n_tok - k, k, r->n_fed);
            if (k == left)
                s->row_req[s->b.n_tok - 1] = i;
        }
}

/* Output id, drawn from logits, for r; false when r ended (st.stop set, or cons_broken). */
static bool emit(struct sched *s, struct sreq *r, int32_t id, const float *logits)
{
    if (!r->p.ignore_eos && gen_is_eos(&s->c->m->hp, id)) {
        r->st.stop = GEN_STOP_EOS;
        return false;
    }
    r->st.n_gen++;
    if (sampler_accept_output(r->smp, id) < 0) {
        r->cons_broken = true;  /* the constraint refused what its own mask allowed */
        return false;
    }
    if (r->cb.on_token && r->cb.on_token(r->cb.ud, id, logits)) {
        r->st.stop = GEN_STOP_CALLBACK;
        return false;
    }
    if (r->st.n_gen == r->p.n_predict) {
        r->st.stop = GEN_STOP_LENGTH;
        return false;
    }
    if (r->n_toks >= s->kv->max_seq_len || r->n_toks >= r->cap) {
        r->st.stop = GEN_STOP_CONTEXT;
        return false;
    }
    r->toks[r->n_toks] = id;
    r->key[r->n_toks] = key_of(s, r, r->n_toks);
    r->n_toks++;
    return true;
}

/* Sample request r from its logits row; false when it ended. */
static bool sample_one(struct sched *s, struct sreq *r, const float *logits)
{
    if (r->t_first == 0) {
        r->t_first = gen_now();
        r->st.t_prompt_s = r->t_first - r->t_admit;
    }
    r->rewind = false;
    if (r->st.n_gen >= r->p.n_predict) {
        r->st.stop = GEN_STOP_LENGTH;
        return false;
    }
    return emit(s, r, sampler_sample(r->smp, logits), logits);
}

/* Judge r's draft on its rows lg[0..k] (row j scores draft j; row k follows the whole draft)
 * as generate() does; false when r ended. Its sequence is cut back to the tokens it keeps, or
 * with recurrent layers, when a draft was rejected, to the checkpoint before the step (ADR
 * 0112: r->rewind, the kept rows fed again next step). */
static bool verify(struct sched *s, struct sreq *r, const float *lg, int V, struct err *e)
{
    int k = r->n_draft, j = 0;
    bool alive = true, acc = true;
    r->n_draft = 0;
    r->st.n_drafted += k;
    s->n_drafted += (uint64_t)k;
    for (; j < k; j++) {
        const float *row = lg + (size_t)j * V;
        int32_t id = sampler_sample_draft(r->smp, row, r->draft[j], &acc);
        if (!acc) {
            alive = emit(s, r, id, row);
            break;
        }
        r->st.n_accepted++;
        s->n_accepted++;
        if (!(alive = emit(s, r, id, row)))
            break;
    }
    if (alive && acc)
        alive = emit(s, r, sampler_sample(r->smp, lg + (size_t)k * V), lg + (size_t)k * V);
    spec_pace_update(&r->pace, j, k);
    int keep = r->n_toks - 1;
    if (alive && kv_seq_len(s->kv, r->seq) > keep) {
        int to = kv_has_recurrent(s->kv) ? kv_seq_checkpoint_len(s->kv, r->seq) : keep;
        if (kv_seq_truncate(s->kv, r->seq, to, e) < 0)
            return false;
    }
    r->n_fed = alive ? kv_seq_len(s->kv, r->seq) : keep;
    r->rewind = r->n_fed < keep;
    return alive;
}

/* Blocks the built batch needs beyond what its sequences hold (no request is forked, so
 * no copy-on-write). */
static int batch_blocks_needed(const struct sched *s)
{
    int need = 0;
    for (int i = 0; i < s->max_requests; i++) {
        const struct sreq *r = &s->reqs[i];
        if (r->id <= 0 || r->seq < 0)
            continue;
        int fed = r->n_fed, left = r->n_toks - r->n_fed;
        for (int row = 0; row < s->b.n_tok; row++)
            fed += s->b.seq[row] == r->seq;
        if (left > 0)
            need += blocks_for(s, fed) - s->kv->seqs[r->seq].n_blocks;
    }
    return need;
}

/* The encode step: the first image that a running request feeds next and that is not
 * encoded yet goes through the tower (one per step). A failure ends that request. */
static void encode_step(struct sched *s)
{
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id <= 0 || r->seq < 0)
            continue;
        for (int j = 0; j < r->n_img; j++) {
            struct simg *im = &r->img[j];
            if (im->embd || im->pos + im->n_tok <= r->n_fed)
                continue;
            struct err e;
            struct backend *be = s->c->be;
            size_t bytes = vision_image_floats(s->c->m, im->n_tok) * sizeof(float);
            bool grid = s->c->m->vision->info.merge > 0;
            int rc = s->vc ? 0 : vision_ctx_new(&s->vc, s->c->m, be, &e);
            if (rc == 0 && (rc = be->ops->buf_alloc(be, bytes, (void **)&im->embd, &e)) < 0)
                im->embd = NULL;
            if (rc == 0 && (rc = grid ? vision_encode_grid(s->vc, im->embd, im->pixels, im->grid, &e)
                                      : vision_encode(s->vc, im->embd, im->pixels, 1, &e)) < 0) {
                be->ops->buf_free(be, im->embd);
                im->embd = NULL;
            }
            if (rc < 0) {
                err_prefix(&e, "encoding image %d", j);
                req_end(s, r, rc, &e);
            } else {
                s->n_encoded++;
            }
            return;
        }
    }
}

/* Whether a request in the built batch drafts with the model's hidden states. */
static bool batch_observes(const struct sched *s)
{
    for (int i = 0; s->hid && i < s->max_requests; i++) {
        const struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0 && r->spec && r->p.spec.observe)
            return true;
    }
    return false;
}

/* After the step's sampling: each request whose drafter reads hidden states gets those of the
 * rows it kept (the fed prompt chunk, or the decode row and the accepted drafts). After a
 * rewind (ADR 0112) those are the kept rows below the checkpoint's rollback, exact since the
 * rows after them do not reach them: they are handed over now, so that the next step drafts
 * (the MTP layer needs the hidden state of the position before its draft), and not again when
 * the next step feeds them once more. */
static void observe_step(struct sched *s)
{
    int d = s->c->m->hp.n_embd;
    for (int q = 0; q < s->kv->max_seqs; q++)
        s->seq_row[q] = -1;
    for (int row = s->b.n_tok - 1; row >= 0; row--)
        s->seq_row[s->b.seq[row]] = row;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id <= 0 || r->seq < 0 || !r->spec || !r->p.spec.observe || s->seq_row[r->seq] < 0)
            continue;
        int row = s->seq_row[r->seq], pos0 = s->b.pos[row];
        int end = r->rewind ? r->n_toks - 1 : r->n_fed, from = pos0 > r->obs_to ? pos0 : r->obs_to;
        r->obs_to = r->rewind ? end : 0;
        if (end > from)
            r->p.spec.observe(r->p.spec.draft_ud, r->seq, from, s->hid + (size_t)(row + from - pos0) * d,
                              end - from, r->toks, r->n_toks);
    }
}

int sched_step(struct sched *s, struct err *e)
{
    int V = s->c->m->hp.n_vocab, rc;
    admit(s);
    if (s->bimg)
        encode_step(s);
    /* the pool decides who runs: drafts are dropped first, then the newest request is
     * preempted until the batch fits (a draft never costs another request its cache) */
    s->no_drafts = false;
    for (;;) {
        build_batch(s);
        if (s->b.n_tok == 0)
            return s->n_waiting > 0 ? 1 : 0;
        if (batch_blocks_needed(s) <= kv_n_free_blocks(s->kv))
            break;
        bool drafted = false;
        for (int i = 0; i < s->max_requests && !s->no_drafts; i++)
            drafted |= s->reqs[i].id > 0 && s->reqs[i].n_draft > 0;
        if (drafted) {
            s->no_drafts = true;
            continue;
        }
        if (!preempt(s))
            break;
    }
    /* recurrent layers: each drafting sequence's states saved before the step (ADR 0112); when
     * the checkpoints' buffer cannot be had, the step goes without drafts */
    for (int i = 0; kv_has_recurrent(s->kv) && i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        struct err ce;
        if (r->id > 0 && r->seq >= 0 && r->n_draft > 0 && kv_seq_checkpoint(s->kv, r->seq, &ce) < 0) {
            LOG_WARN("speculative decoding: %s; this step goes without drafts", ce.msg);
            s->no_drafts = true;
            build_batch(s);
            break;
        }
    }
    s->b.lora = s->lora;   /* each running sequence's row of scales (admit) */
    s->b.n_lora = s->n_lora;
    s->b.hidden_out = batch_observes(s) ? s->hid : NULL;
    /* a step whose rows are one request's times that request's drafting (ADR 0148): a step
     * shared with others says nothing of what its drafts cost */
    bool alone = true;
    for (int row = 1; row < s->b.n_tok; row++)
        alone &= s->row_req[row] == s->row_req[0];
    const double t0 = gen_now();
    if ((rc = model_forward(s->c, &s->b, s->kv, s->logits, e)) < 0) {
        /* the sequences were rolled back; the running requests end with the error (a lone
         * request that outgrew the pool among them), waiting ones may still run */
        for (int i = 0; i < s->max_requests; i++)
            if (s->reqs[i].id > 0 && s->reqs[i].seq >= 0)
                req_end(s, &s->reqs[i], rc, e);
        return s->n_waiting > 0 ? 1 : 0;
    }
    /* the fed rows are in the cache; then sample in row order (a request's draft rows
     * together), then index what each running request keeps */
    int out = 0;
    for (int i = 0; i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0)
            r->n_fed = kv_seq_len(s->kv, r->seq);
    }
    for (int row = 0; row < s->b.n_tok; row++) {
        if (!s->b.logits[row])
            continue;
        struct sreq *r = &s->reqs[s->row_req[row]];
        const float *lg = s->logits + (size_t)out * V;
        int rows = 1 + r->n_draft;
        out += rows;
        row += rows - 1;
        bool finite = true;
        for (int j = 0; j < rows && s->c->n_nonfinite > 0; j++)
            finite &= logits_row_finite(lg + (size_t)j * V, V);
        struct err re;
        re.code = ERR_OK;
        re.msg[0] = 0;
        if (!finite) {
            /* as generate(): a request whose logits are broken ends with an error */
            err_setf(&re, ERR_FORMAT, "the model produced non-finite logits (NaN or inf) at position "
                     "%d: its weights or config are broken", r->n_fed - 1);
            req_end(s, r, -ERR_FORMAT, &re);
            continue;
        }
        if (rows == 1 && r->spec && r->decoding)
            spec_pace_update(&r->pace, 0, 0);  /* a plain step counts toward a pause, as in generate() */
        const bool timed = alone && r->spec && r->decoding && r->p.spec.gate;
        const int n_gen0 = r->st.n_gen;
        if (rows > 1 ? !verify(s, r, lg, V, &re) : !sample_one(s, r, lg)) {
            bool failed = r->cons_broken || re.code != 0;
            if (r->cons_broken)
                err_setf(&re, ERR_INTERNAL, "the output constraint rejected a token its mask allowed");
            req_end(s, r, failed ? -re.code : 0, failed ? &re : NULL);
        } else if (timed) {
            spec_gate_update(&r->gate, r->st.n_gen - n_gen0, gen_now() - t0);
        } else if (rows == 1 && !r->decoding && r->spec && r->p.spec.prefill && r->n_fed == r->n_prompt) {
            /* the prompt is in: the drafter's own prompt now, in the prompt's time as in
             * generate(), rather than at the first draft */
            r->p.spec.prefill(r->p.spec.draft_ud, r->seq, r->toks, r->n_prompt);
        }
    }
    if (s->b.hidden_out)
        observe_step(s);
    for (int i = 0; s->prefix && i < s->max_requests; i++) {
        struct sreq *r = &s->reqs[i];
        if (r->id > 0 && r->seq >= 0)
            kv_prefix_register(s->kv, r->seq, r->key, r->n_fed);
    }
    if (s->prefix && kv_can_snapshot(s->kv))
        take_snapshots(s);
    return sched_n_running(s) + s->n_waiting > 0 ? 1 : 0;
}
