/*
 * generate: prefill + decode loop (generate.h).
 */
#include "generate.h"

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

int generate(struct model_ctx *c, struct kv_cache *kv, int seq, const int32_t *prompt, int n_prompt,
             const struct gen_params *p, gen_token_fn cb, void *ud, struct gen_stats *stats,
             struct err *e)
{
    const struct hparams *hp = &c->m->hp;
    struct sampler *smp = NULL;
    struct batch b = {0};
    float *logits = NULL;
    int32_t *cut = NULL;
    int rc;
    struct gen_stats st = {.n_prompt = n_prompt, .stop = GEN_STOP_LENGTH};

    if (n_prompt <= 0)
        return err_setf(e, ERR_ARG, "the prompt is empty");
    if (p->n_predict < 0)
        return err_setf(e, ERR_ARG, "the number of tokens to generate must not be negative");
    /* room for the tokens asked for, at most half the context, at least one */
    int room = p->n_predict < kv->max_seq_len / 2 ? p->n_predict : kv->max_seq_len / 2;
    int fit = kv->max_seq_len - (room > 1 ? room : 1);
    if (p->truncate != GEN_TRUNCATE_OFF && n_prompt > fit && fit >= 1) {
        if ((rc = truncate_prompt(prompt, n_prompt, fit, p, &cut, e)) < 0)
            return rc;
        st.n_dropped = n_prompt - fit;
        prompt = cut;
        n_prompt = st.n_prompt = fit;
    }
    kv_seq_remove(kv, seq);
    if ((rc = kv_seq_add(kv, seq, e)) < 0 || (rc = sampler_new(&smp, &p->sampling, hp->n_vocab, e)) < 0 ||
        (rc = batch_init(&b, n_prompt, e)) < 0)
        goto out;
    logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    if (!logits) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto out;
    }

    for (int i = 0; i < n_prompt; i++)
        sampler_accept(smp, prompt[i]);
    double t0 = gen_now();
    if ((rc = batch_add_seq(&b, prompt, n_prompt, 0, seq, true, e)) < 0 ||
        (rc = model_forward(c, &b, kv, logits, e)) < 0 || (rc = check_logits(c, n_prompt - 1, e)) < 0)
        goto out;
    double t1 = gen_now();
    st.t_prompt_s = t1 - t0;

    while (st.n_gen < p->n_predict) {
        int32_t id = sampler_sample(smp, logits);
        if (!p->ignore_eos && gen_is_eos(hp, id)) {
            st.stop = GEN_STOP_EOS;
            break;
        }
        st.n_gen++;
        sampler_accept_output(smp, id);
        if (cb && cb(ud, id)) {
            st.stop = GEN_STOP_CALLBACK;
            break;
        }
        if (st.n_gen == p->n_predict)
            break;
        int len = kv_seq_len(kv, seq);
        if (len >= kv->max_seq_len) {
            st.stop = GEN_STOP_CONTEXT;
            break;
        }
        batch_clear(&b);
        if ((rc = batch_add(&b, id, len, seq, true, e)) < 0 ||
            (rc = model_forward(c, &b, kv, logits, e)) < 0 || (rc = check_logits(c, len, e)) < 0)
            goto out;
    }
    st.t_gen_s = gen_now() - t1;
    rc = 0;
out:
    if (stats)
        *stats = st;
    free(logits);
    free(cut);
    batch_free(&b);
    sampler_free(smp);
    return rc;
}
