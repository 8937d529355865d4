/*
 * sampler: logits -> token id (sampler.h).
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint64_t rng[4];
    float *work;       /* [n_vocab] adjusted logits */
    int32_t *idx;      /* [n_vocab] candidate ids, sorted by work[] descending */
    float *prob;       /* [n_vocab] candidate probabilities */
    int32_t *recent;   /* ring of the last repeat_last_n accepted ids */
    int n_recent, head;
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

int sampler_params_check(const struct sampler_params *p, struct err *e)
{
    if (!isfinite(p->temperature))
        return err_setf(e, ERR_ARG, "temperature must be a finite number");
    if (!(p->top_p > 0.0f) || !isfinite(p->top_p))
        return err_setf(e, ERR_ARG, "top-p %g must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return err_setf(e, ERR_ARG, "min-p %g must be in [0, 1]", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return err_setf(e, ERR_ARG, "repeat penalty %g must be positive", (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > (1 << 20))
        return err_setf(e, ERR_ARG, "repeat window %d is out of range", p->repeat_last_n);
    return 0;
}

/* ---- xoshiro256** (Blackman & Vigna), seeded through splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

int sampler_new(struct sampler **out, const struct sampler_params *p, int n_vocab, struct err *e)
{
    *out = NULL;
    int rc = sampler_params_check(p, e);
    if (rc < 0)
        return rc;
    if (n_vocab <= 0)
        return err_setf(e, ERR_ARG, "sampler: empty vocabulary");
    struct sampler *s = calloc(1, sizeof *s);
    if (!s)
        return err_setf(e, ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t seed = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&seed);
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

static int32_t argmax(const float *v, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

/* Order ids by key descending, ties to the lower id (qsort_r comparator). */
static int cmp_desc(const void *a, const void *b, void *key)
{
    const float *k = key;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float fx = k[x], fy = k[y];
    if (fx != fy)
        return fx > fy ? -1 : 1;
    return x < y ? -1 : (x > y);
}

int32_t sampler_sample(struct sampler *s, const float *logits)
{
    const struct sampler_params *p = &s->p;
    int V = s->n_vocab;
    memcpy(s->work, logits, (size_t)V * sizeof(float));

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
    if (p->temperature <= 0.0f)
        return argmax(s->work, V);

    /* 2. temperature, then candidates sorted by logit */
    for (int i = 0; i < V; i++) {
        s->work[i] /= p->temperature;
        s->idx[i] = i;
    }
    int n = V;
    qsort_r(s->idx, (size_t)V, sizeof *s->idx, cmp_desc, s->work);

    /* 3. top-k */
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;

    /* softmax over the candidates (sorted: the first is the max) */
    double mx = s->work[s->idx[0]], sum = 0.0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = (float)exp((double)s->work[s->idx[i]] - mx);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++)
        s->prob[i] = (float)(s->prob[i] / sum);

    /* 4. top-p: smallest prefix whose mass reaches top_p (at least one token) */
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    /* 5. min-p: drop tokens below min_p x the top probability */
    if (p->min_p > 0.0f) {
        float floor_p = p->min_p * s->prob[0];
        int keep = 1;
        while (keep < n && s->prob[keep] >= floor_p)
            keep++;
        n = keep;
    }

    /* 6. draw */
    double total = 0.0;
    for (int i = 0; i < n; i++)
        total += s->prob[i];
    double r = rng_uniform(s->rng) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc)
            return s->idx[i];
    }
    return s->idx[n - 1];
}
