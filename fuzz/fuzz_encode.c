/*
 * fuzz_encode: libFuzzer target for encoding and decoding with real
 * tokenizers. Two committed fixtures are loaded once (decompressed with
 * `xz -dc` into a temporary folder): llama2 (SentencePiece-style BPE:
 * Metaspace, byte fallback, Replace/ByteFallback/Fuse/Strip decoder) and
 * shakespeare (byte-level BPE). The first input byte picks the tokenizer
 * and mode:
 *   bit 0      which tokenizer
 *   bit 1      the rest is text: encode (invalid UTF-8 must be refused with
 *              -ERR_ARG), then decode the ids and check the text comes back
 *              (byte-level: exactly; SentencePiece: modulo the leading
 *              space its decoder strips and unknown characters), and
 *              stream-decode them, which must equal the full decode
 *   else       the rest is little-endian 16-bit ids: decode them (ids out of
 *              range are an error), and stream them, each chunk valid UTF-8;
 *              bit 2 sets skip_special
 * Any crash, leak, undefined behaviour or abort is a bug.
 * Set MLXCEL_SOURCE_DIR when running outside the repository root.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"

static struct tokenizer *g_tok[2];

static struct tokenizer *load_fixture(const char *name)
{
    const char *root = getenv("MLXCEL_SOURCE_DIR");
    char dir[64] = "/tmp/mlxcel_fuzzenc_XXXXXX", cmd[4608], json[128], cfg[4096];
    struct tokenizer *t = NULL;
    if (!mkdtemp(dir))
        abort();
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/tests/fixtures/tokenizers/%s/tokenizer.json.xz' > '%s'",
             root ? root : ".", name, json);
    snprintf(cfg, sizeof cfg, "%s/tests/fixtures/tokenizers/%s/tokenizer_config.json",
             root ? root : ".", name);
    if (system(cmd) != 0 || tok_load_files(&t, json, cfg, NULL) < 0) {
        fprintf(stderr, "fuzz_encode: cannot load the %s fixture (run from the repo root)\n", name);
        abort();
    }
    unlink(json);
    rmdir(dir);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_tok[0] = load_fixture("llama2");
    g_tok[1] = load_fixture("shakespeare");
    return 0;
}

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF),
 * written independently of the tokenizer's own check. */
static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
                 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
        if (k == 9 || i + k >= n + (k == 0 ? 1 : 0))
            return false;
        uint32_t cp = k == 0 ? c : c & (0x3F >> k);
        for (size_t j = 1; j <= k; j++) {
            if ((u[i + j] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

/* Streams ids; every chunk must be valid UTF-8. Returns the concatenation. */
static char *stream(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    static char chunk[TOK_STREAM_CAP];
    struct tok_stream s;
    size_t len = 0;
    char *out = malloc(1);
    if (!out)
        abort();
    tok_stream_init(&s, t, skip);
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof chunk, NULL)
                      : tok_stream_flush(&s, chunk, sizeof chunk);
        if (w < 0 || !valid_utf8(chunk, (size_t)w))  /* NUL bytes are text too */
            abort();
        out = realloc(out, len + (size_t)w + 1);
        if (!out)
            abort();
        memcpy(out + len, chunk, (size_t)w);
        len += (size_t)w;
    }
    out[len] = '\0';
    return out;
}

static void fuzz_text(const struct tokenizer *t, bool byte_level, const char *text, size_t n)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *dec = NULL;
    struct err e = {0};
    int rc = tok_encode(t, text, n, false, &ids, &n_ids, &e);
    if (rc < 0) {
        if (rc != -ERR_ARG || valid_utf8(text, n))
            abort();  /* only invalid UTF-8 may be refused */
        return;
    }
    if (tok_decode(t, ids, n_ids, false, &dec, NULL) < 0)
        abort();
    /* byte-level BPE is lossless; without NUL bytes the text comes back */
    if (byte_level && !memchr(text, 0, n) && (strlen(dec) != n || memcmp(dec, text, n) != 0))
        abort();
    char *st = stream(t, ids, n_ids, false);
    if (strcmp(st, dec) != 0 && !strstr(dec, "\xEF\xBF\xBD"))
        abort();
    free(st);
    free(dec);
    free(ids);
}

static void fuzz_ids(const struct tokenizer *t, bool skip, const uint8_t *data, size_t size)
{
    size_t n = size / 2;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    char *dec = NULL;
    bool in_range = true;
    if (!ids)
        abort();
    for (size_t i = 0; i < n; i++) {
        ids[i] = data[2 * i] | (data[2 * i + 1] << 8);
        in_range &= tok_id_to_piece(t, ids[i]) != NULL;
    }
    int rc = tok_decode(t, ids, n, skip, &dec, NULL);
    if ((rc == 0) != in_range || (rc == 0 && !valid_utf8(dec, strlen(dec))))
        abort();
    if (in_range)
        free(stream(t, ids, n, skip));
    free(dec);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    const struct tokenizer *t = g_tok[data[0] & 1];
    if (data[0] & 2)
        fuzz_text(t, (data[0] & 1) == 1, (const char *)data + 1, size - 1);
    else
        fuzz_ids(t, data[0] & 4, data + 1, size - 1);
    return 0;
}
