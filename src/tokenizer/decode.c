/*
 * decode: ids -> text, in one piece (tok_decode) or token by token
 * (struct tok_stream).
 *
 * Each id first becomes bytes on its own (token_bytes): with the ByteLevel
 * decoder every character of the piece maps back to the byte it stands for;
 * as in HF, a piece with any character outside the byte-level alphabet
 * (e.g. an added token written in plain Unicode) is taken verbatim. Without
 * a decoder the piece is taken verbatim too. The bytes of all tokens are
 * then made valid UTF-8 with the maximal-subpart rule (tables.c), which is
 * what HF's String::from_utf8_lossy does over the joined bytes.
 *
 * Streaming runs the same scan, but a character cut short by the end of a
 * token (valid so far, e.g. the first 2 bytes of an emoji) is held in
 * tok_stream.pending and rescanned with the next token's bytes; anything
 * invalid becomes U+FFFD at once. Because the scan restarts only at
 * character boundaries, the concatenated stream output equals tok_decode of
 * the same ids. Per-token decoders that SentencePiece needs (Replace of
 * U+2581, ByteFallback <0xXX>) fit into token_bytes; Strip of a leading
 * space will need a "first token" flag in the stream.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* ---- load ---- */

int tok_decoder_load(struct tokenizer *t, const cJSON *j, struct err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type"), *it;
    t->dec = TOK_DEC_NONE;
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsString(type))
        return err_setf(e, ERR_FORMAT, "decoder: missing \"type\"");
    if (strcmp(type->valuestring, "ByteLevel") == 0) {
        t->dec = TOK_DEC_BYTELEVEL;
        return 0;
    }
    if (strcmp(type->valuestring, "Sequence") == 0) {
        /* A Sequence made only of ByteLevel decoders is one ByteLevel. */
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "decoders")) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "ByteLevel") != 0)
                return err_setf(e, ERR_UNSUPPORTED, "decoder type '%.64s' in a Sequence is not supported",
                                cJSON_IsString(ty) ? ty->valuestring : "(none)");
            t->dec = TOK_DEC_BYTELEVEL;
        }
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "decoder type '%.64s' is not supported",
                    type->valuestring);
}

/* ---- per-token bytes ---- */

/* Writes the bytes id stands for to out (room for TOK_PIECE_MAX bytes);
 * returns their count. id must be valid. */
static size_t token_bytes(const struct tokenizer *t, int32_t id, unsigned char *out)
{
    const struct tok_entry *en = &t->entry[id];
    const unsigned char *p = (const unsigned char *)t->pool.buf + en->off;
    size_t n = 0, need;
    if (t->dec == TOK_DEC_BYTELEVEL) {
        for (size_t i = 0; i < en->len;) {
            size_t k = tok_utf8_seq(p + i, en->len - i, &need);
            uint32_t cp;
            if (need == 0 || k != need || k > 2)
                goto verbatim;  /* every byte-level code point is 1 or 2 bytes */
            cp = k == 1 ? p[i] : ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
            if (cp >= TOK_BL_CP_MAX || t->bl.dec[cp] < 0)
                goto verbatim;
            out[n++] = (unsigned char)t->bl.dec[cp];
            i += k;
        }
        return n;
    }
verbatim:
    memcpy(out, p, en->len);
    return en->len;
}

static int check_id(const struct tokenizer *t, int32_t id, size_t pos, struct err *e)
{
    if (id < 0 || id >= t->n_ids || !t->entry[id].flags)
        return err_setf(e, ERR_RANGE, "decode: id %d at position %zu is not in the vocab (size %d)",
                        id, pos, t->n_ids);
    return 0;
}

/* ---- lossy UTF-8 ---- */

/* Copies s[0..n) to out as valid UTF-8 (out has room for 3n bytes), each
 * maximal invalid subpart becoming U+FFFD. With hold, a valid but
 * incomplete character at the very end is left out and its length stored
 * in *held. Returns the bytes written. */
static size_t utf8_lossy(const unsigned char *s, size_t n, char *out, bool hold, size_t *held)
{
    size_t i = 0, o = 0, need;
    *held = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        size_t k = tok_utf8_seq(s + i, n - i, &need);
        if (need && k == need) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        if (hold && need && i + k == n) {
            *held = k;
            break;
        }
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k ? k : 1;
    }
    return o;
}

/* ---- public ---- */

int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
               char **out, struct err *e)
{
    size_t total = 0, nb = 0, held;
    int rc;
    *out = NULL;
    if (n > 0 && !ids)
        return err_setf(e, ERR_ARG, "decode: NULL ids");
    for (size_t i = 0; i < n; i++) {
        if ((rc = check_id(t, ids[i], i, e)) < 0)
            return rc;
        total += t->entry[ids[i]].len;  /* token_bytes never writes more than the piece */
    }
    unsigned char *raw = malloc(total + 1);
    char *res = malloc(3 * total + 1);
    if (!raw || !res) {
        free(raw);
        free(res);
        return err_setf(e, ERR_NOMEM, "decode: %zu bytes", 4 * total + 2);
    }
    for (size_t i = 0; i < n; i++)
        if (!(skip_special && tok_is_special(t, ids[i])))
            nb += token_bytes(t, ids[i], raw + nb);
    size_t w = utf8_lossy(raw, nb, res, false, &held);
    res[w] = '\0';
    free(raw);
    *out = res;
    return 0;
}

void tok_stream_init(struct tok_stream *s, const struct tokenizer *t, bool skip_special)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->skip_special = skip_special;
}

int tok_stream_push(struct tok_stream *s, int32_t id, char *out, size_t cap, struct err *e)
{
    const struct tokenizer *t = s->tok;
    unsigned char buf[sizeof s->pending + TOK_PIECE_MAX];
    char tmp[3 * sizeof buf + 1];
    size_t held;
    int rc;
    if ((rc = check_id(t, id, 0, e)) < 0)
        return rc;
    if (!out || cap == 0)
        return err_setf(e, ERR_ARG, "stream: no output buffer");
    if (s->skip_special && tok_is_special(t, id)) {
        out[0] = '\0';
        return 0;
    }
    size_t np = (size_t)s->n_pending;
    memcpy(buf, s->pending, np);
    size_t n = np + token_bytes(t, id, buf + np);
    size_t w = utf8_lossy(buf, n, tmp, true, &held);
    if (w + 1 > cap)
        return err_setf(e, ERR_RANGE, "stream: %zu bytes of output, buffer holds %zu", w + 1, cap);
    memcpy(out, tmp, w);
    out[w] = '\0';
    memcpy(s->pending, buf + n - held, held);
    s->n_pending = (int)held;
    return (int)w;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
    if (s->n_pending == 0) {
        if (out && cap > 0)
            out[0] = '\0';
        return 0;
    }
    if (!out || cap < 4)
        return -ERR_RANGE;
    /* What is pending is one valid-but-cut character: one U+FFFD. */
    memcpy(out, "\xEF\xBF\xBD", 4);
    s->n_pending = 0;
    return 3;
}
