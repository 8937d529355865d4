/*
 * termsafe: escaping of untrusted text for a terminal (termsafe.h has the
 * contract and the list of what is escaped and why).
 *
 * One pass over the bytes: each valid UTF-8 character is either copied or,
 * when it is a control a terminal interprets, replaced by its escape; each
 * byte that starts no valid character becomes \xNN on its own, so the
 * output is always valid UTF-8 whatever the input.
 */
#include "termsafe.h"

#include <stdint.h>
#include <string.h>

size_t termsafe_utf8_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return 0;
    unsigned c = u[0];
    unsigned lo = 0x80, hi = 0xBF;  /* allowed range of the second byte (RFC 3629 table) */
    size_t len;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;  /* no overlongs */
        if (c == 0xED)
            hi = 0x9F;  /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;  /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || u[1] < lo || u[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((u[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* The code point of the valid k-byte character at u. */
static uint32_t decode(const unsigned char *u, size_t k)
{
    if (k == 1)
        return u[0];
    if (k == 2)
        return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    if (k == 3)
        return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
           ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

/* C1 controls and the bidi embedding/override/isolate controls. */
static int is_unicode_control(uint32_t cp)
{
    return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

unsigned termsafe_unicode_control(const char *s, size_t k)
{
    if (k < 2 || k > 4)
        return 0;
    uint32_t cp = decode((const unsigned char *)s, k);
    return is_unicode_control(cp) ? cp : 0;
}

/* The escape of the character (k > 0) or lone byte (k == 0) at u into out (at least
 * 8 bytes); its length, 0 when it is shown as it is. */
static size_t escape_one(const unsigned char *u, size_t k, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    if (k == 0 || (k == 1 && (u[0] < 0x20 || u[0] == 0x7F))) {
        if (u[0] == '\n' || u[0] == '\r' || u[0] == '\t') {
            out[0] = '\\';
            out[1] = u[0] == '\n' ? 'n' : u[0] == '\r' ? 'r' : 't';
            return 2;
        }
        out[0] = '\\';
        out[1] = 'x';
        out[2] = hex[u[0] >> 4];
        out[3] = hex[u[0] & 15];
        return 4;
    }
    uint32_t cp = decode(u, k);
    if (!is_unicode_control(cp))
        return 0;
    static const char lower[] = "0123456789abcdef";  /* \u in JSON's and Python's spelling */
    out[0] = '\\';
    out[1] = 'u';
    for (int i = 0; i < 4; i++)
        out[2 + i] = lower[(cp >> (12 - 4 * i)) & 15];
    return 6;
}

size_t termsafe_escape(char *dst, size_t cap, const char *s, size_t n)
{
    size_t total = 0, used = 0;
    int full = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        size_t k = termsafe_utf8_len(s + i, n - i);
        char esc[8];
        size_t m = escape_one(u, k, esc);
        const char *piece = m ? esc : s + i;
        size_t len = m ? m : k;
        if (!full && used + len < cap) {
            memcpy(dst + used, piece, len);
            used += len;
        } else {
            full = 1;  /* nothing after a piece that did not fit, so none is cut */
        }
        total += len;
        i += k ? k : 1;
    }
    if (cap > 0)
        dst[used] = '\0';
    return total;
}

int termsafe_fputs(const char *s, FILE *f)
{
    char buf[1024];
    size_t n = strlen(s);
    int rc = 0;
    /* in slices that end on a character boundary, each escaped into buf (4x is the
     * most a slice can grow: a lone byte becomes 4 bytes, a 2-byte C1 control 6) */
    for (size_t i = 0; i < n;) {
        size_t end = i;
        while (end < n && end - i < sizeof buf / 8 - 4) {
            size_t k = termsafe_utf8_len(s + end, n - end);
            end += k ? k : 1;
        }
        termsafe_escape(buf, sizeof buf, s + i, end - i);
        rc = fputs(buf, f);
        if (rc == EOF)
            return EOF;
        i = end;
    }
    return rc;
}

const char *termsafe_str(const char *s, char *buf, size_t cap)
{
    if (!s)
        s = "(null)";
    termsafe_escape(buf, cap, s, strlen(s));
    return buf;
}
