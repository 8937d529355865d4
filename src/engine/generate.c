/*
 * generate: prefill + decode loop (generate.h).
 */
#include "generate.h"

#include <stdlib.h>
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

int generate(struct model_ctx *c, struct kv_cache *kv, int seq, const int32_t *prompt, int n_prompt,
             const struct gen_params *p, gen_token_fn cb, void *ud, struct gen_stats *stats,
             struct err *e)
{
    const struct hparams *hp = &c->m->hp;
    struct sampler *smp = NULL;
    struct batch b = {0};
    float *logits = NULL;
    int rc;
    struct gen_stats st = {.n_prompt = n_prompt, .stop = GEN_STOP_LENGTH};

    if (n_prompt <= 0)
        return err_setf(e, ERR_ARG, "the prompt is empty");
    if (p->n_predict < 0)
        return err_setf(e, ERR_ARG, "the number of tokens to generate must not be negative");
    int fit = kv->max_seq_len - 1; /* room for one generated token */
    if (p->truncate != GEN_TRUNCATE_OFF && n_prompt > fit && fit >= 1) {
        st.n_dropped = n_prompt - fit;
        if (p->truncate == GEN_TRUNCATE_LEFT)
            prompt += st.n_dropped;
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
    batch_free(&b);
    sampler_free(smp);
    return rc;
}
