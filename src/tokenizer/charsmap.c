/*
 * charsmap: the Precompiled normalizer of tokenizer.json, SentencePiece's
 * precompiled_charsmap (nmt_nfkc and friends) as tokenizers applies it.
 *
 * The blob (base64 in the JSON) is: a little-endian u32 trie size in bytes,
 * that many bytes of darts-clone double array (u32 units), then the
 * normalized strings, each ended by a NUL. A unit packs: label (bits 0-7 and
 * 31), has_leaf (bit 8), offset (bits 10-31, shifted left 8 more when bit 9
 * is set); a leaf's value (bits 0-30) is a byte offset into the strings.
 *
 * transform(chunk) is spm_precompiled's: walk the trie byte by byte from the
 * root and take the FIRST (shortest) prefix of chunk that has a value: its
 * string replaces the whole chunk, even when the chunk is longer. The
 * normalizer (tokenizers' Precompiled::normalize) cuts the text into
 * extended grapheme clusters (utf8proc's rules) and, for a cluster under 6
 * bytes, transforms it whole when the trie knows it; otherwise (or when it
 * does not) each character is transformed alone or kept.
 *
 * The blob is untrusted: it is size-capped and its strings must be UTF-8 at
 * load; every trie index and string offset is bounds-checked as it is used,
 * and one that points outside the blob (where tokenizers would panic) is an
 * ERR_FORMAT from the normalizer.
 */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tok_impl.h"
#include "../core/base64.h"

struct tok_charsmap {
    uint32_t *unit;  /* [n_unit] double array */
    size_t n_unit;
    char *norm;      /* [n_norm] normalized strings (valid UTF-8) */
    size_t n_norm;
};

/* ---- load ---- */

/* Standard base64 with padding (what tokenizers writes and reads). */
static int b64_decode_blob(const char *s, size_t len, unsigned char **out, size_t *n, struct err *e)
{
    if (len % 4 != 0)
        return err_setf(e, ERR_FORMAT, "precompiled_charsmap: base64 length %zu is not a multiple of 4", len);
    if (len / 4 * 3 > TOK_CHARSMAP_MAX)
        return err_setf(e, ERR_RANGE, "precompiled_charsmap: %zu bytes of base64 (max %zu decoded)",
                        len, TOK_CHARSMAP_MAX);
    unsigned char *b = malloc(b64_decoded_max(len) + 1);
    size_t bad;
    if (!b)
        return err_setf(e, ERR_NOMEM, "precompiled_charsmap: %zu bytes", len / 4 * 3);
    if (b64_decode(s, len, B64_PADDED, b, n, &bad) < 0) {
        free(b);
        return err_setf(e, ERR_FORMAT, "precompiled_charsmap: bad base64 at byte %zu", bad);
    }
    *out = b;
    return 0;
}

int tok_charsmap_new(struct tok_charsmap **out, const char *b64, size_t len, struct err *e)
{
    unsigned char *blob = NULL;
    size_t n = 0;
    int rc;
    *out = NULL;
    if ((rc = b64_decode_blob(b64, len, &blob, &n, e)) < 0)
        return rc;
    struct tok_charsmap *m = calloc(1, sizeof *m);
    if (!m) {
        free(blob);
        return err_setf(e, ERR_NOMEM, "precompiled_charsmap");
    }
    if (n < 4) {
        rc = err_setf(e, ERR_FORMAT, "precompiled_charsmap: %zu bytes, no trie size", n);
        goto fail;
    }
    uint32_t trie_bytes = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 |
                          (uint32_t)blob[3] << 24;
    m->n_unit = trie_bytes / 4;
    if (m->n_unit == 0 || m->n_unit > (n - 4) / 4) {
        rc = err_setf(e, ERR_FORMAT,
                      "precompiled_charsmap: trie of %u bytes in a blob of %zu (empty or truncated)",
                      trie_bytes, n);
        goto fail;
    }
    m->unit = malloc(m->n_unit * sizeof *m->unit);
    m->n_norm = n - 4 - 4 * m->n_unit;
    m->norm = malloc(m->n_norm + 1);
    if (!m->unit || !m->norm) {
        rc = err_setf(e, ERR_NOMEM, "precompiled_charsmap: %zu bytes", n);
        goto fail;
    }
    for (size_t i = 0; i < m->n_unit; i++) {
        const unsigned char *p = blob + 4 + 4 * i;
        m->unit[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
    memcpy(m->norm, blob + 4 + 4 * m->n_unit, m->n_norm);
    m->norm[m->n_norm] = '\0';
    /* tokenizers reads the strings as one Rust String: it must be UTF-8
     * (NULs included, which are ASCII) */
    if (tok_utf8_check(m->norm, m->n_norm) != m->n_norm) {
        rc = err_setf(e, ERR_FORMAT, "precompiled_charsmap: normalized strings are not UTF-8 "
                      "(byte %zu)", tok_utf8_check(m->norm, m->n_norm));
        goto fail;
    }
    free(blob);
    *out = m;
    return 0;
fail:
    free(blob);
    tok_charsmap_free(m);
    return rc;
}

void tok_charsmap_free(struct tok_charsmap *m)
{
    if (!m)
        return;
    free(m->unit);
    free(m->norm);
    free(m);
}

/* ---- transform ---- */

static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static size_t unit_offset(uint32_t u) { return (size_t)((u >> 10) << ((u & (1u << 9)) >> 6)); }

/* spm_precompiled's transform: the string of the shortest prefix of s that
 * the trie holds. Returns 1 (found: *r, *rn), 0 (not found) or -ERR_FORMAT. */
static int transform(const struct tok_charsmap *m, const char *s, size_t len, const char **r,
                     size_t *rn, struct err *e)
{
    size_t pos = unit_offset(m->unit[0]);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0)
            break;
        pos ^= c;
        if (pos >= m->n_unit)
            goto bad;
        uint32_t u = m->unit[pos];
        if (unit_label(u) != c)
            return 0;
        pos ^= unit_offset(u);
        if (!unit_has_leaf(u))
            continue;
        if (pos >= m->n_unit)
            goto bad;
        size_t at = unit_value(m->unit[pos]);
        if (at > m->n_norm || (at < m->n_norm && ((unsigned char)m->norm[at] & 0xC0) == 0x80))
            return err_setf(e, ERR_FORMAT,
                            "precompiled_charsmap: string offset %zu outside the %zu bytes of strings "
                            "or inside a character", at, m->n_norm);
        *r = m->norm + at;
        *rn = strlen(m->norm + at);  /* norm is NUL-terminated past its end */
        if (*rn > m->n_norm - at)
            *rn = m->n_norm - at;
        return 1;
    }
    return 0;
bad:
    return err_setf(e, ERR_FORMAT, "precompiled_charsmap: trie index %zu outside its %zu units",
                    pos, m->n_unit);
}

/* One grapheme g[0..len): whole when short and known, else char by char. */
static int apply_grapheme(const struct tok_charsmap *m, const char *g, size_t len,
                          struct tok_buf *o, struct err *e)
{
    const char *r;
    size_t rn;
    int rc;
    if (len < 6) {
        if ((rc = transform(m, g, len, &r, &rn, e)) < 0)
            return rc;
        if (rc == 1)
            return tok_buf_put(o, r, rn, e);
    }
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t k = tok_utf8_next(g + i, len - i, &cp);
        if ((rc = transform(m, g + i, k, &r, &rn, e)) < 0)
            return rc;
        if ((rc = rc == 1 ? tok_buf_put(o, r, rn, e) : tok_buf_put(o, g + i, k, e)) < 0)
            return rc;
        i += k;
    }
    return 0;
}

int tok_charsmap_apply(const struct tok_charsmap *m, const char *s, size_t len,
                       struct tok_buf *o, struct err *e)
{
    utf8proc_int32_t state = 0, prev = -1;
    size_t gstart = 0;
    int rc;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t k = tok_utf8_next(s + i, len - i, &cp);
        if (prev >= 0 && utf8proc_grapheme_break_stateful(prev, cp, &state)) {
            if ((rc = apply_grapheme(m, s + gstart, i - gstart, o, e)) < 0)
                return rc;
            gstart = i;
        }
        prev = cp;
        i += k;
    }
    if (len > gstart && (rc = apply_grapheme(m, s + gstart, len - gstart, o, e)) < 0)
        return rc;
    return tok_buf_put(o, "", 0, e);
}
