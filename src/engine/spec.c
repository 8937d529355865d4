/*
 * spec: drafters for speculative decoding (spec.h).
 */
#include "spec.h"

#include <string.h>

void spec_params_default(struct spec_params *p)
{
    memset(p, 0, sizeof *p);
    p->mode = SPEC_NONE;
    p->draft_max = 16;
    p->draft_min = 1;
    p->ngram_min = 1;
    p->ngram_max = 3;
}

int spec_params_check(const struct spec_params *p, struct err *e)
{
    if (p->mode != SPEC_NONE && p->mode != SPEC_NGRAM)
        return err_setf(e, ERR_ARG, "unknown speculative mode %d", (int)p->mode);
    if (p->draft_max < 1 || p->draft_max > SPEC_DRAFT_MAX_LIMIT)
        return err_setf(e, ERR_ARG, "--draft-max must be in [1, %d] (got %d)", SPEC_DRAFT_MAX_LIMIT, p->draft_max);
    if (p->draft_min < 0 || p->draft_min > p->draft_max)
        return err_setf(e, ERR_ARG, "--draft-min must be in [0, --draft-max = %d] (got %d)", p->draft_max,
                        p->draft_min);
    if (p->ngram_max < 1 || p->ngram_max > 16 || p->ngram_min < 1 || p->ngram_min > p->ngram_max)
        return err_setf(e, ERR_ARG, "the n-gram sizes must satisfy 1 <= min <= max <= 16 (got %d, %d)",
                        p->ngram_min, p->ngram_max);
    return 0;
}

bool spec_on(const struct spec_params *p)
{
    return p->mode == SPEC_NGRAM || p->draft != NULL;
}

int spec_ngram(const int32_t *hist, int n, int ngram_min, int ngram_max, int32_t *out, int max)
{
    if (max <= 0)
        return 0;
    for (int m = ngram_max < n - 1 ? ngram_max : n - 1; m >= ngram_min; m--) {
        const int32_t *key = hist + n - m;
        /* an occurrence at [i, i + m) with at least one token after it, most recent first */
        for (int i = n - m - 1; i >= 0; i--) {
            if (hist[i] != key[0] || memcmp(hist + i, key, (size_t)m * sizeof *key) != 0)
                continue;
            int k = n - (i + m) < max ? n - (i + m) : max;
            memcpy(out, hist + i + m, (size_t)k * sizeof *out);
            return k;
        }
    }
    return 0;
}

int spec_draft(const struct spec_params *p, const int32_t *hist, int n, int32_t *out, int max)
{
    if (p->draft)
        return p->draft(p->draft_ud, hist, n, out, max);
    if (p->mode == SPEC_NGRAM)
        return spec_ngram(hist, n, p->ngram_min, p->ngram_max, out, max);
    return 0;
}

int spec_next_len(int cur, int max, int j, int k)
{
    if (j == k)
        return 2 * cur < max ? 2 * cur : max;
    if (j == 0)
        return cur > 1 ? cur / 2 : 1;
    return cur;
}
