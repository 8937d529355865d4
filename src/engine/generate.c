/*
 * generate: prefill + decode loop (generate.h).
 */
#include "generate.h"

#include "../models/vision.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double gen_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* After each forward: logits with NaN or inf would sample garbage (every comparison false),
 * so generation stops with an error instead (model_forward has logged the warning). */
static int check_logits(const struct model_ctx *c, int pos, struct err *e)
{
    if (c->n_nonfinite > 0)
        return err_setf(e, ERR_FORMAT, "the model produced non-finite logits (NaN or inf) at position "
                        "%d: its weights or config are broken", pos);
    return 0;
}

bool gen_is_eos(const struct hparams *hp, int32_t id)
{
    for (int i = 0; i < hp->n_eos; i++)
        if (hp->eos_ids[i] == id)
            return true;
    return false;
}

/* The prompt cut to fit tokens for gen_params.truncate (generate.h): a malloc'd copy in
 * *out. The head and tail are bounded so that they fit together. */
static int truncate_prompt(const int32_t *prompt, int n_prompt, int fit, const struct gen_params *p, int32_t **out,
                           struct err *e)
{
    int head = p->n_keep < 0 ? 0 : p->n_keep < fit ? p->n_keep : fit;
    int tail = p->n_keep_tail < 0 ? 0 : p->n_keep_tail < fit - head ? p->n_keep_tail : fit - head;
    int32_t *t = malloc((size_t)fit * sizeof *t);
    if (!t)
        return err_setf(e, ERR_NOMEM, "out of memory");
    /* LEFT: the head, then the newest fit - head tokens (the tail among them);
     * RIGHT: the oldest fit - tail tokens (the head among them), then the tail */
    int first = p->truncate == GEN_TRUNCATE_LEFT ? head : fit - tail;
    memcpy(t, prompt, (size_t)first * sizeof *t);
    memcpy(t + first, prompt + n_prompt - (fit - first), (size_t)(fit - first) * sizeof *t);
    *out = t;
    return 0;
}

/* Whether scoring drafted positions with a step's token could change that token's numbers:
 * rope whose frequencies follow the length of the sequence in the forward (dynamic NTK's
 * rescaling, LongRoPE's switch to its long factors), as transformers computes them. */
static bool rope_follows_length(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].n_rot > 0 && (hp->layer[il].rope == ROPE_DYNAMIC || hp->layer[il].rope == ROPE_LONGROPE))
            return true;
    return false;
}

bool gen_spec_supported(const struct model_ctx *c, const struct kv_cache *kv)
{
    return kv_spec_back_max(kv) > 0 && !rope_follows_length(&c->m->hp);
}

/* What one generation carries between steps. */
struct gstate {
    const struct hparams *hp;
    const struct gen_params *p;
    struct sampler *smp;
    gen_token_fn cb;
    void *ud;
    struct gen_stats *st;
    int32_t *hist;  /* [n_prompt + n_predict]: the prompt and the output so far (drafts read it) */
    int n_hist;
};

/* Hands one sampled id to the output: 1 when generation stops there (st->stop says why; an
 * EOS id is not output), 0 to go on. */
static int emit(struct gstate *g, int32_t id)
{
    if (!g->p->ignore_eos && gen_is_eos(g->hp, id)) {
        g->st->stop = GEN_STOP_EOS;
        return 1;
    }
    g->st->n_gen++;
    sampler_accept_output(g->smp, id);
    g->hist[g->n_hist++] = id;
    if (g->cb && g->cb(g->ud, id)) {
        g->st->stop = GEN_STOP_CALLBACK;
        return 1;
    }
    return g->st->n_gen == g->p->n_predict;
}

/* M-RoPE models with images (ADR 0094): the prompt rows' three positions, as get_rope_index
 * makes them from the images' grids, into b (rows 0..n); *delta what later rows add. */
static int mrope_prompt(const struct model_ctx *c, struct batch *b, const int32_t *prompt, int n,
                        const struct batch_image *imgs, int n_img, int32_t *delta, struct err *e)
{
    *delta = 0;
    if (!hparams_has_mrope(&c->m->hp) || n_img == 0 || !c->m->vision)
        return 0;
    int32_t *grid = malloc((size_t)n_img * 2 * sizeof *grid), *p3 = malloc((size_t)n * 3 * sizeof *p3);
    int rc = 0;
    if (!grid || !p3) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int k = 0; k < n_img; k++) {
        if (imgs[k].grid_h < 1 || imgs[k].grid_w < 1 || imgs[k].grid_h * imgs[k].grid_w != imgs[k].n_tok) {
            rc = err_setf(e, ERR_ARG, "image %d: %d rows without their grid (M-RoPE needs it)", k + 1,
                          imgs[k].n_tok);
            goto out;
        }
        grid[2 * k] = imgs[k].grid_h;
        grid[2 * k + 1] = imgs[k].grid_w;
    }
    if ((rc = vision_mrope_positions(p3, delta, prompt, n, c->m->vision->info.image_token_id, grid, n_img, e)) < 0 ||
        (rc = batch_rope_set(b, 0, n, p3, 0, e)) < 0)
        goto out;
out:
    free(grid);
    free(p3);
    return rc;
}

int generate(struct model_ctx *c, struct kv_cache *kv, int seq, const int32_t *prompt, int n_prompt,
             const struct gen_params *p, gen_token_fn cb, void *ud, struct gen_stats *stats,
             struct err *e)
{
    const struct hparams *hp = &c->m->hp;
    const int V = hp->n_vocab;
    struct sampler *smp = NULL;
    struct batch b = {0};
    float *logits = NULL, *hid = NULL;
    int32_t *cut = NULL, *hist = NULL, *draft = NULL;
    struct batch_image *imgs = NULL;
    int32_t delta = 0;
    int rc;
    struct gen_stats st = {.n_prompt = n_prompt, .stop = GEN_STOP_LENGTH};

    if (n_prompt <= 0)
        return err_setf(e, ERR_ARG, "the prompt is empty");
    if (p->n_predict < 0)
        return err_setf(e, ERR_ARG, "the number of tokens to generate must not be negative");
    bool spec = spec_on(&p->spec);
    if (spec && (rc = spec_params_check(&p->spec, e)) < 0)
        return rc;
    if (spec && !gen_spec_supported(c, kv)) {
        spec = false;
        st.spec_off = true;
    }
    int K = spec ? p->spec.draft_max : 0;
    /* room for the tokens asked for, at most half the context, at least one */
    int room = p->n_predict < kv->max_seq_len / 2 ? p->n_predict : kv->max_seq_len / 2;
    int fit = kv->max_seq_len - (room > 1 ? room : 1);
    if (p->n_images < 0 || (p->n_images > 0 && !p->images))
        return err_setf(e, ERR_ARG, "%d images without their list", p->n_images);
    /* an image's rows cannot be cut, nor moved (its positions are fixed) */
    if (p->truncate != GEN_TRUNCATE_OFF && n_prompt > fit && fit >= 1 && p->n_images == 0) {
        if ((rc = truncate_prompt(prompt, n_prompt, fit, p, &cut, e)) < 0)
            return rc;
        st.n_dropped = n_prompt - fit;
        prompt = cut;
        n_prompt = st.n_prompt = fit;
    }
    kv_seq_remove(kv, seq);
    if ((rc = kv_seq_add(kv, seq, e)) < 0 || (rc = sampler_new(&smp, &p->sampling, V, e)) < 0 ||
        (rc = batch_init(&b, n_prompt > 2 * K + 1 ? n_prompt : 2 * K + 1, e)) < 0)
        goto out;
    logits = malloc((size_t)V * (size_t)(K + 1) * sizeof *logits);
    /* the output is at most n_predict tokens, and at most one past a full context */
    int n_out = p->n_predict < kv->max_seq_len ? p->n_predict : kv->max_seq_len;
    hist = malloc(((size_t)n_prompt + (size_t)n_out + 1) * sizeof *hist);
    draft = malloc((size_t)(K + 1) * sizeof *draft);
    /* a drafter that reads hidden states (MTP) gets every forward's: the prompt is fed in
     * pieces of a forward chunk (an image's prompt whole: images are not cut), so that their
     * hidden states take a chunk's room at most */
    bool observe = spec && p->spec.observe;
    int piece = observe && p->n_images == 0 && c->n_batch < n_prompt ? c->n_batch : n_prompt;
    if (observe)
        hid = malloc((size_t)(piece > K + 1 ? piece : K + 1) * (size_t)hp->n_embd * sizeof *hid);
    if (!logits || !hist || !draft || (observe && !hid)) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    if (p->n_images > 0) {
        if (!(imgs = malloc((size_t)p->n_images * sizeof *imgs))) {
            rc = err_setf(e, ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int i = 0; i < p->n_images; i++) {
            imgs[i] = p->images[i];
            imgs[i].seq = seq;
        }
    }
    struct gstate g = {hp, p, smp, cb, ud, &st, hist, n_prompt};

    for (int i = 0; i < n_prompt; i++)
        sampler_accept(smp, prompt[i]);
    double t0 = gen_now();
    for (int p0 = 0; p0 < n_prompt; p0 += piece) {
        int np = n_prompt - p0 < piece ? n_prompt - p0 : piece;
        batch_clear(&b);
        /* M-RoPE positions are the prompt's as a whole (pieces only come without images, where
         * batch_add's (pos, pos, pos) are M-RoPE's text positions already) */
        if ((rc = batch_add_seq(&b, prompt + p0, np, p0, seq, p0 + np == n_prompt, e)) < 0 ||
            (np == n_prompt && (rc = mrope_prompt(c, &b, prompt, n_prompt, imgs, p->n_images, &delta, e)) < 0))
            goto out;
        b.img = imgs;
        b.n_img = p->n_images;
        b.hidden_out = hid;
        if ((rc = model_forward(c, &b, kv, logits, e)) < 0)
            goto out;
        if (observe)
            p->spec.observe(p->spec.draft_ud, seq, p0, hid, np, prompt, n_prompt);
    }
    if ((rc = check_logits(c, n_prompt - 1, e)) < 0)
        goto out;
    if (spec && p->spec.prefill && p->n_predict > 1)  /* the drafter's own prompt, timed with it */
        p->spec.prefill(p->spec.draft_ud, seq, prompt, n_prompt);
    double t1 = gen_now();
    st.t_prompt_s = t1 - t0;

    /* id: sampled, not yet output nor in the cache. Each step outputs it, then scores it with
     * k drafted tokens (k = 0: plain decoding) and keeps the accepted ones and one more.
     * want: the positions plain decoding's cache would hold. With recurrent layers a rejected
     * draft takes the cache back to the checkpoint before its step (ADR 0112): the next step
     * feeds the kept rows again before its own (fed < want), or the catch-up after the loop. */
    int32_t id = p->n_predict > 0 ? sampler_sample(smp, logits) : 0;
    int want = n_prompt, obs_to = n_prompt;  /* obs_to: hidden states observed up to there */
    bool rec = kv_has_recurrent(kv);
    struct spec_pace pace;  /* the draft length now (spec.h) */
    spec_pace_init(&pace, K);
    struct spec_gate gate;  /* whether drafting pays here (spec.h) */
    spec_gate_init(&gate, p->spec.prefill != NULL); /* a draft model: its cache would catch up */
    const bool gated = spec && p->spec.gate;
    while (st.n_gen < p->n_predict) {
        const double ts = gated ? gen_now() : 0.0;
        if (emit(&g, id))
            break;
        int len = want, fed = kv_seq_len(kv, seq);
        if (len >= kv->max_seq_len) {
            st.stop = GEN_STOP_CONTEXT;
            break;
        }
        int k = 0;
        if (spec && (!gated || spec_gate_drafts(&gate))) {
            /* useful drafts: the output left after this step's own token, the context left */
            int max = p->n_predict - st.n_gen - 1, ctx = kv->max_seq_len - len - 1;
            int lim = spec_pace_len(&pace);
            max = max < lim ? max : lim;
            max = max < ctx ? max : ctx;
            max = max < kv_spec_back_max(kv) ? max : kv_spec_back_max(kv);
            k = spec_draft(&p->spec, seq, hist, g.n_hist, draft, max);
            k = k < p->spec.draft_min || k < 0 ? 0 : k > max ? max : k;
        }
        batch_clear(&b);
        b.hidden_out = hid;
        for (int q = fed; q < len; q++)  /* kept rows fed again after a rollback */
            if ((rc = batch_add(&b, hist[q], q, seq, false, e)) < 0)
                goto out;
        if ((rc = batch_add(&b, id, len, seq, true, e)) < 0)
            goto out;
        for (int i = 0; i < k; i++)
            if ((rc = batch_add(&b, draft[i], len + 1 + i, seq, true, e)) < 0)
                goto out;
        /* after an image, M-RoPE positions continue from its max position + 1 */
        if (delta != 0 && (rc = batch_rope_set(&b, 0, b.n_tok, NULL, delta, e)) < 0)
            goto out;
        if (rec && k > 0 && (rc = kv_seq_checkpoint(kv, seq, e)) < 0)
            goto out;
        if ((rc = model_forward(c, &b, kv, logits, e)) < 0 || (rc = check_logits(c, len, e)) < 0)
            goto out;
        st.n_drafted += k;
        int j = 0;
        bool stop = false, acc = true;
        for (; j < k; j++) {
            id = sampler_sample_draft(smp, logits + (size_t)j * V, draft[j], &acc);
            if (!acc)
                break;
            st.n_accepted++;
            if (emit(&g, draft[j])) {
                stop = true;
                break;
            }
        }
        if (j == k)
            id = sampler_sample(smp, logits + (size_t)k * V);
        if (spec)
            spec_pace_update(&pace, j, k);
        /* the cache keeps what plain decoding would hold: the step's token and the drafts
         * output before the one that stopped or was rejected (recurrent layers: back to the
         * checkpoint, those rows fed again later) */
        want = len + 1 + j;
        if (j < k && (rc = kv_seq_truncate(kv, seq, rec ? fed : want, e)) < 0)
            goto out;
        /* the kept rows' hidden states (after a rollback too: the rows after them do not
         * reach them, and the MTP layer needs the last one to draft next step); rows fed
         * again after a rollback were handed over already */
        if (observe) {
            int from = fed > obs_to ? fed : obs_to;
            if (want > from)
                p->spec.observe(p->spec.draft_ud, seq, from, hid + (size_t)(from - fed) * hp->n_embd, want - from,
                                hist, g.n_hist);
            obs_to = want;
        }
        if (gated)
            spec_gate_update(&gate, 1 + j, gen_now() - ts);
        if (stop)
            break;
    }
    /* catch up: the kept rows of a last rolled-back step, so that the cache ends as plain
     * decoding's */
    int fed = kv_seq_len(kv, seq);
    if (fed < want) {
        batch_clear(&b);
        b.hidden_out = NULL;
        for (int q = fed; q < want; q++)
            if ((rc = batch_add(&b, hist[q], q, seq, q == want - 1, e)) < 0)
                goto out;
        if ((delta != 0 && (rc = batch_rope_set(&b, 0, b.n_tok, NULL, delta, e)) < 0) ||
            (rc = model_forward(c, &b, kv, logits, e)) < 0)
            goto out;
    }
    st.t_gen_s = gen_now() - t1;
    rc = 0;
out:
    if (stats)
        *stats = st;
    free(logits);
    free(hid);
    free(cut);
    free(hist);
    free(draft);
    free(imgs);
    batch_free(&b);
    sampler_free(smp);
    return rc;
}
