/*
 * base64: see base64.h.
 */
#include "base64.h"

#include <stdint.h>

static int value(unsigned char c, unsigned flags)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || (c == '-' && (flags & B64_URLSAFE)))
        return 62;
    if (c == '/' || (c == '_' && (flags & B64_URLSAFE)))
        return 63;
    return -1;
}

int b64_decode(const char *s, size_t n, unsigned flags, unsigned char *out, size_t *len, size_t *bad)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t m = n, k = 0;
    *len = 0;
    /* the padding: at most two '=' at the end (padded: making a multiple of 4; a third '='
     * is then a character that is not base64) */
    if ((flags & B64_PADDED) && n % 4 != 0) {
        *bad = n;
        return -1;
    }
    for (int i = 0; i < 2 && m > 0 && p[m - 1] == '='; i++)
        m--;
    if (m % 4 == 1) {
        *bad = n;
        return -1;
    }
    uint32_t acc = 0;
    for (size_t i = 0; i < m; i++) {
        int v = value(p[i], flags);
        if (v < 0) {
            *bad = i;
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[k++] = (unsigned char)(acc >> 16);
            out[k++] = (unsigned char)(acc >> 8);
            out[k++] = (unsigned char)acc;
            acc = 0;
        }
    }
    if (m % 4 == 2) {
        out[k++] = (unsigned char)(acc >> 4);
    } else if (m % 4 == 3) {
        out[k++] = (unsigned char)(acc >> 10);
        out[k++] = (unsigned char)(acc >> 2);
    }
    *len = k;
    return 0;
}

void b64_encode(const unsigned char *in, size_t n, char *out)
{
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = k[x >> 18 & 63];
        out[o++] = k[x >> 12 & 63];
        out[o++] = i + 1 < n ? k[x >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? k[x & 63] : '=';
    }
    out[o] = 0;
}
