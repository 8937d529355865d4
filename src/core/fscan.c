/*
 * fscan: the host's scans over the logits (fscan.h).
 */
#include "fscan.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

int32_t fscan_argmax(const float *v, int n)
{
    if (n <= 1 || v[0] != v[0])
        return 0;
    /* 1. the largest non-NaN value: max(x, m) keeps m where x is NaN (MAXPS returns its
     * second operand when either is NaN), and m starts from v[0], not a NaN */
    float best = v[0];
    int i = 0;
#if defined(__SSE2__)
    __m128 m0 = _mm_set1_ps(best), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm_max_ps(_mm_loadu_ps(v + i), m0);
        m1 = _mm_max_ps(_mm_loadu_ps(v + i + 4), m1);
        m2 = _mm_max_ps(_mm_loadu_ps(v + i + 8), m2);
        m3 = _mm_max_ps(_mm_loadu_ps(v + i + 12), m3);
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    for (int k = 0; k < 4; k++)
        best = lanes[k] > best ? lanes[k] : best;
#else
    float m[8];
    for (int k = 0; k < 8; k++)
        m[k] = best;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            m[k] = v[i + k] > m[k] ? v[i + k] : m[k];
    for (int k = 0; k < 8; k++)
        best = m[k] > best ? m[k] : best;
#endif
    for (; i < n; i++)
        best = v[i] > best ? v[i] : best;
    /* 2. its first index: the plain loop moves only on a strictly greater value, so it
     * stops at the first element equal to the maximum (-0 and +0 compare equal there too) */
    for (i = 0; i < n; i++)
        if (v[i] == best)
            return i;
    return 0;
}

bool fscan_finite(const float *v, int n)
{
    /* an exponent of all ones is an infinity or a NaN */
    int i = 0;
#if defined(__SSE2__)
    const __m128i ex = _mm_set1_epi32(0x7f800000);
    __m128i bad = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i a = _mm_and_si128(_mm_loadu_si128((const __m128i *)(v + i)), ex);
        __m128i b = _mm_and_si128(_mm_loadu_si128((const __m128i *)(v + i + 4)), ex);
        bad = _mm_or_si128(bad, _mm_or_si128(_mm_cmpeq_epi32(a, ex), _mm_cmpeq_epi32(b, ex)));
    }
    if (_mm_movemask_epi8(bad))
        return false;
#endif
    uint32_t any = 0;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, v + i, sizeof u);
        any |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return !any;
}
