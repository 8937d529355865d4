/*
 * sampler: logits -> token id (sampler.h).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/fscan.h"
#include "../core/rng.h"

struct sampler {
    struct sampler_params p;
    int n_vocab;
    struct rng rng;                 /* xoshiro256** from the seed */
    float *work;       /* [n_vocab] adjusted logits */
    int32_t *idx;      /* [n_vocab] candidate ids, sorted by work[] descending */
    float *prob;       /* [n_vocab] candidate probabilities */
    int32_t *recent;   /* ring of the last repeat_last_n accepted ids */
    int n_recent, head;
    struct sampler_bias *bias;  /* [p.n_bias] copy of the request's logit_bias */
    int32_t *count;    /* [n_vocab] generated-token counts (presence/frequency), or NULL */
    int32_t *seen;     /* [count_cap] distinct generated ids, in first-seen order */
    int n_seen;
};

void sampler_params_default(struct sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0x5eed;
}

/* The penalty divides or multiplies a logit: within [1e-3, 100] a float logit of up to
 * ~3e35 stays finite. top_p > 0: a zero mass would keep no candidate. */
const struct sampler_bound sampler_bounds[SAMPLER_N_FIELDS] = {
    [SAMPLER_TEMPERATURE] = {"--temp", "temperature", 0.0, 100.0},
    [SAMPLER_TOP_K] = {"--top-k", "top_k", 0.0, 1 << 24},
    [SAMPLER_TOP_P] = {"--top-p", "top_p", 1e-6, 1.0},
    [SAMPLER_MIN_P] = {"--min-p", "min_p", 0.0, 1.0},
    [SAMPLER_REPEAT_PENALTY] = {"--repeat-penalty", "repetition_penalty", 1e-3, 100.0},
    [SAMPLER_REPEAT_LAST_N] = {"--repeat-last-n", "repeat_last_n", 0.0, 1 << 20},
};

int sampler_bound_check(enum sampler_field f, double v, const char *source, struct err *e)
{
    const struct sampler_bound *b = &sampler_bounds[f];
    if (!isfinite(v) || v < b->lo || v > b->hi)
        return err_setf(e, ERR_ARG, "%s: %s (%s) = %g is out of range [%g, %g]", source,
                        b->config_key, b->flag, v, b->lo, b->hi);
    return 0;
}

int sampler_params_check(const struct sampler_params *p, struct err *e)
{
    const double v[SAMPLER_N_FIELDS] = {
        [SAMPLER_TEMPERATURE] = p->temperature, [SAMPLER_TOP_K] = p->top_k,
        [SAMPLER_TOP_P] = p->top_p, [SAMPLER_MIN_P] = p->min_p,
        [SAMPLER_REPEAT_PENALTY] = p->repeat_penalty, [SAMPLER_REPEAT_LAST_N] = p->repeat_last_n,
    };
    int rc;
    for (int f = 0; f < SAMPLER_N_FIELDS; f++)
        if ((rc = sampler_bound_check(f, v[f], "sampler", e)) < 0)
            return rc;
    if (!(fabsf(p->presence_penalty) <= SAMPLER_MAX_PRESENCE) ||
        !(fabsf(p->frequency_penalty) <= SAMPLER_MAX_PRESENCE))
        return err_setf(e, ERR_ARG, "sampler: presence and frequency penalties must be within [-%g, %g]",
                        (double)SAMPLER_MAX_PRESENCE, (double)SAMPLER_MAX_PRESENCE);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return err_setf(e, ERR_ARG, "sampler: bad logit bias list");
    for (int i = 0; i < p->n_bias; i++)
        if (!(fabsf(p->bias[i].bias) <= SAMPLER_MAX_BIAS))
            return err_setf(e, ERR_ARG, "sampler: logit bias %g of id %d is outside [-%g, %g]",
                            (double)p->bias[i].bias, p->bias[i].id, (double)SAMPLER_MAX_BIAS,
                            (double)SAMPLER_MAX_BIAS);
    return 0;
}

int sampler_new(struct sampler **out, const struct sampler_params *p, int n_vocab, struct err *e)
{
    *out = NULL;
    int rc = sampler_params_check(p, e);
    if (rc < 0)
        return rc;
    if (n_vocab <= 0)
        return err_setf(e, ERR_ARG, "sampler: empty vocabulary");
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab)
            return err_setf(e, ERR_RANGE, "sampler: logit bias id %d is outside the vocabulary [0, %d)",
                            p->bias[i].id, n_vocab);
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->p.bias = NULL;
    if (p->n_bias > 0) {
        s->bias = malloc((size_t)p->n_bias * sizeof *s->bias);
        if (!s->bias) {
            free(s);
            return err_setf(e, ERR_NOMEM, "sampler: out of memory");
        }
        memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        s->count = calloc((size_t)n_vocab, sizeof *s->count);
        s->seen = malloc((size_t)n_vocab * sizeof *s->seen);
        if (!s->count || !s->seen) {
            sampler_free(s);
            return err_setf(e, ERR_NOMEM, "sampler: out of memory");
        }
    }
    s->n_vocab = n_vocab;
    rng_seed(&s->rng, p->seed);
    s->work = malloc((size_t)n_vocab * sizeof *s->work);
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    s->recent = malloc((size_t)(p->repeat_last_n > 0 ? p->repeat_last_n : 1) * sizeof *s->recent);
    if (!s->work || !s->idx || !s->prob || !s->recent) {
        sampler_free(s);
        return err_setf(e, ERR_NOMEM, "sampler: out of memory");
    }
    *out = s;
    return 0;
}

void sampler_free(struct sampler *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->idx);
    free(s->prob);
    free(s->recent);
    free(s->bias);
    free(s->count);
    free(s->seen);
    free(s);
}

void sampler_accept(struct sampler *s, int32_t id)
{
    if (s->p.repeat_last_n <= 0)
        return;
    s->recent[s->head] = id;
    s->head = (s->head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n)
        s->n_recent++;
}

int sampler_accept_output(struct sampler *s, int32_t id)
{
    sampler_accept(s, id);
    if (s->count && id >= 0 && id < s->n_vocab && s->count[id]++ == 0)
        s->seen[s->n_seen++] = id;
    return s->p.cons.ops ? s->p.cons.ops->accept(s->p.cons.state, id) : 0;
}

/* Candidate order: higher key first, ties to the lower id. */
static bool before(const float *key, int32_t a, int32_t b)
{
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

/* Reorder idx[0..n) so its first m entries are the m best (unordered): quickselect. */
static void select_top(int32_t *idx, int n, int m, const float *key)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t pivot = idx[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (before(key, idx[i], pivot))
                i++;
            while (before(key, pivot, idx[j]))
                j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i++] = idx[j];
                idx[j--] = t;
            }
        }
        if (m - 1 <= j)
            hi = j;
        else if (m - 1 >= i)
            lo = i;
        else
            break;
    }
}

static int cmp_desc(const void *a, const void *b, void *key)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return before(key, x, y) ? -1 : before(key, y, x) ? 1 : 0;
}

/* The m best candidates, sorted, in idx[0..m). */
static void top_sorted(struct sampler *s, int m)
{
    for (int i = 0; i < s->n_vocab; i++)
        s->idx[i] = i;
    if (m < s->n_vocab)
        select_top(s->idx, s->n_vocab, m, s->work);
    qsort_r(s->idx, (size_t)m, sizeof *s->idx, cmp_desc, s->work);
}

static int32_t draw(struct sampler *s, int n)
{
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->prob[i];
    double r = rng_uniform(&s->rng) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc)
            return s->idx[i];
    }
    return s->idx[n - 1];
}

/* Candidates considered before top-p can stop growing the sorted prefix. */
#define TOPP_FIRST 256

/* Steps 0-5 below: the candidates idx[0..n) with their probabilities prob[0..n) (not
 * normalized when a filter cut some), returned as n; greedy sampling returns 0 and its pick
 * in *greedy. */
static int candidates(struct sampler *s, const float *logits, int32_t *greedy)
{
    const struct sampler_params *p = &s->p;
    int V = s->n_vocab;
    memcpy(s->work, logits, (size_t)V * sizeof(float));
    if (p->cons.ops)
        p->cons.ops->mask(p->cons.state, s->work, V);

    /* 0. logit bias, then the presence and frequency penalties over generated ids */
    for (int i = 0; i < p->n_bias; i++)
        s->work[s->bias[i].id] += s->bias[i].bias;
    for (int i = 0; i < s->n_seen; i++) {
        int32_t id = s->seen[i];
        s->work[id] -= p->presence_penalty + p->frequency_penalty * (float)s->count[id];
    }

    /* 1. repetition penalty (each distinct recent id once) */
    if (p->repeat_penalty != 1.0f) {
        for (int i = 0; i < s->n_recent; i++) {
            int32_t id = s->recent[i];
            if (id < 0 || id >= V)
                continue;
            bool seen = false;
            for (int j = 0; j < i; j++)
                seen |= s->recent[j] == id;
            if (seen)
                continue;
            float l = s->work[id];
            s->work[id] = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        }
    }
    if (p->temperature < SAMPLER_GREEDY_TEMP) {
        *greedy = fscan_argmax(s->work, V);
        return 0;
    }

    /* 2. temperature, in the safe form (l - max) / T: every scaled logit is <= 0, so a
     * small T sends the others to -inf (probability 0), never the max to +inf */
    int32_t top = fscan_argmax(s->work, V);
    double lmax = s->work[top], inv_t = 1.0 / (double)p->temperature;
    for (int i = 0; i < V; i++)
        s->work[i] = (float)(((double)s->work[i] - lmax) * inv_t);
    s->work[top] = 0.0f;
    const double mx = 0.0;

    /* 3. top-k: the distribution is renormalized over the k survivors */
    int K = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double z = 0.0;
    if (K == V)
        for (int i = 0; i < V; i++)
            z += exp((double)s->work[i] - mx);

    /* 4. candidates sorted by probability: only as many as top-k and top-p need.
     * Without either, every id is a candidate in id order (no sort). */
    int n;
    if (K < V || p->top_p < 1.0f) {
        int m = K < V ? K : (TOPP_FIRST < V ? TOPP_FIRST : V);
        for (;;) {
            top_sorted(s, m);
            if (K < V) {
                z = 0.0;
                for (int i = 0; i < m; i++)
                    z += exp((double)s->work[s->idx[i]] - mx);
            }
            double cum = 0.0;
            n = m;
            for (int i = 0; i < m; i++) {
                s->prob[i] = (float)(exp((double)s->work[s->idx[i]] - mx) / z);
                cum += s->prob[i];
                if (p->top_p < 1.0f && cum >= p->top_p) {
                    n = i + 1; /* smallest prefix reaching top_p */
                    break;
                }
            }
            if (n < m || m == K || p->top_p >= 1.0f)
                break;
            m = m * 4 < K ? m * 4 : K; /* the prefix did not reach top_p: widen */
        }
    } else {
        for (int i = 0; i < V; i++) {
            s->idx[i] = i;
            s->prob[i] = (float)(exp((double)s->work[i] - mx) / z);
        }
        n = V;
    }

    /* 5. min-p: drop candidates below min_p x the top probability */
    if (p->min_p > 0.0f) {
        float top = 0.0f;
        for (int i = 0; i < n; i++)
            top = s->prob[i] > top ? s->prob[i] : top;
        int keep = 0;
        for (int i = 0; i < n; i++) {
            if (s->prob[i] >= p->min_p * top) {
                s->idx[keep] = s->idx[i];
                s->prob[keep++] = s->prob[i];
            }
        }
        n = keep;
    }

    return n;
}

int32_t sampler_sample(struct sampler *s, const float *logits)
{
    int32_t g = 0;
    int n = candidates(s, logits, &g);
    return n ? draw(s, n) : g;  /* 6. draw */
}

int32_t sampler_sample_draft(struct sampler *s, const float *logits, int32_t draft, bool *accepted)
{
    /* Every drafter proposes a point mass (prompt lookup, a draft model's and the MTP layer's
     * argmax), so Leviathan's rule (accept d with probability p(d), else draw from p without d)
     * is the same as drawing x from p and accepting when x is d. Drawn that way, each output
     * token takes one uniform from the stream whether it was drafted or not, so a seeded
     * request gives the tokens plain decoding gives, whatever its drafts and their lengths (a
     * server step's row budget cuts them; ADR 0116). */
    int32_t id = sampler_sample(s, logits);
    *accepted = id == draft;
    return id;
}

void sampler_logprobs(const float *logits, int n_vocab, int32_t id, int n_top, float *lp_id,
                      int32_t *top_id, float *top_lp)
{
    double mx = -INFINITY, z = 0.0;
    for (int i = 0; i < n_vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n_vocab; i++)
        z += exp((double)logits[i] - mx);
    double lz = mx + log(z);
    *lp_id = (float)((double)logits[id] - lz);
    /* insertion into a sorted list of n_top: the common case (a logit below the list's
     * last) costs one comparison */
    int n = 0;
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float l = logits[i];
        if (n == n_top && !(l > top_lp[n - 1]))
            continue;
        int at = n < n_top ? n++ : n - 1;
        while (at > 0 && l > top_lp[at - 1]) {
            top_lp[at] = top_lp[at - 1];
            top_id[at] = top_id[at - 1];
            at--;
        }
        top_lp[at] = l;
        top_id[at] = i;
    }
    for (int i = 0; i < n; i++)
        top_lp[i] = (float)((double)top_lp[i] - lz);
}
