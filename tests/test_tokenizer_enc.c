/*
 * test_tokenizer_enc: the encoder families' tokenizers (WordPiece, Unigram,
 * WordLevel) against goldens from the Rust `tokenizers` library 0.23
 * (tests/fixtures/gen/gen_enc_tokenizers.py writes them), plus hand-written
 * tokenizers for the hostile cases: corrupt Precompiled charsmaps (truncated,
 * offsets out of range, strings not UTF-8), absurd vocab claims, missing unk
 * tokens, impossible truncations. ASan checks that every error path frees.
 *
 * A golden folder (tests/fixtures/tokenizers/<name>/) holds tokenizer.json.xz,
 * tokenizer_config.json and golden.json.xz with, per text: ids without and with
 * special tokens, the type ids, decode() of both (specials kept or skipped);
 * per pair: ids and type ids; per truncation case (single or pair, max_length,
 * strategy): ids and type ids, or the error tokenizers raised.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "tokenizer/tok_impl.h"

/* ---- helpers ---- */

/* The text of an xz-compressed file (the goldens are committed as .xz). */
static char *slurp_xz(const char *path)
{
    char cmd[4200];
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    assert_non_null(buf);
    snprintf(cmd, sizeof cmd, "xz -dc '%s'", path);
    FILE *f = popen(cmd, "r");
    if (!f)
        fail_msg("cannot run %s", cmd);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    assert_int_equal(pclose(f), 0);
    buf[n] = '\0';
    return buf;
}

/* True when got[0..n) equals the JSON array want. */
static bool same_ids(const int32_t *got, size_t n, const cJSON *want)
{
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (got[i] != cJSON_GetArrayItem(want, (int)i)->valueint)
            return false;
    return true;
}

static void print_ids(const char *what, const int32_t *v, size_t n, const cJSON *want)
{
    char *w = cJSON_PrintUnformatted(want);
    fprintf(stderr, "  %s got [", what);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s%d", i ? "," : "", v[i]);
    fprintf(stderr, "]\n  want %s\n", w ? w : "?");
    free(w);
}

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The raw golden text and a read position in it: input texts are read from
 * the JSON source (cJSON's strings end at a \u0000, which one golden text
 * holds), in file order: "text" per encode case, "a" and "b" per pair and
 * truncation case. */
struct raw_reader {
    const char *raw;
    size_t pos;
};

/* Decodes the value of the next `"key": ` into o (o->p NULL for null). */
static void raw_next(struct raw_reader *r, const char *key, struct tok_buf *o)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *at = strstr(r->raw + r->pos, pat);
    if (!at)
        fail_msg("golden: no more \"%s\"", key);
    struct tok_jcur c = {at + strlen(pat), r->raw + strlen(r->raw)};
    r->pos = (size_t)(c.p - r->raw);
    if (strncmp(c.p, "null", 4) == 0) {
        free(o->p);
        *o = (struct tok_buf){0};
        return;
    }
    assert_int_equal(tok_json_string(&c, o, NULL), 0);
    r->pos = (size_t)(c.p - r->raw);
}

/* Decodes ids one at a time through a tok_stream. */
static char *stream_all(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    struct tok_stream s;
    char chunk[TOK_STREAM_CAP];
    size_t len = 0, cap = 64;
    char *out = malloc(cap);
    assert_non_null(out);
    tok_stream_init(&s, t, skip);
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof chunk, NULL)
                      : tok_stream_flush(&s, chunk, sizeof chunk);
        assert_true(w >= 0);
        while (len + (size_t)w + 1 > cap)
            cap *= 2;
        out = realloc(out, cap);
        assert_non_null(out);
        memcpy(out + len, chunk, (size_t)w);
        len += (size_t)w;
    }
    out[len] = '\0';
    return out;
}

/* ---- goldens ---- */

/* Counts a mismatch: prints it and keeps going, so one run shows them all. */
static int check_encode(const struct tokenizer *t, const cJSON *c, const struct tok_buf *in)
{
    const char *text = in->p;
    size_t len = in->n;
    assert_int_equal(strncmp(text, jstr(c, "text"), strlen(jstr(c, "text"))), 0);  /* in step */
    struct tok_encode_opts o = {.add_special = true};
    struct tok_encoding enc = {0};
    struct err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int bad = 0;
    char *dec = NULL, *skip = NULL, *with = NULL, *st = NULL;
    if (tok_encode(t, text, len, false, &ids, &n, &e) < 0)
        fail_msg("encode '%s': %s", text, e.msg);
    if (!same_ids(ids, n, cJSON_GetObjectItem(c, "ids"))) {
        fprintf(stderr, "ids of '%s' differ\n", text);
        print_ids("ids", ids, n, cJSON_GetObjectItem(c, "ids"));
        bad++;
    }
    assert_int_equal(tok_encode_pair(t, text, len, NULL, 0, &o, &enc, &e), 0);
    if (!same_ids(enc.ids, enc.n, cJSON_GetObjectItem(c, "ids_with_special")) ||
        !same_ids(enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids_with_special"))) {
        fprintf(stderr, "ids_with_special / type ids of '%s' differ\n", text);
        print_ids("ids", enc.ids, enc.n, cJSON_GetObjectItem(c, "ids_with_special"));
        print_ids("type_ids", enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids_with_special"));
        bad++;
    }
    /* tok_encode with specials agrees with tok_encode_pair */
    int32_t *ids2 = NULL;
    size_t n2 = 0;
    assert_int_equal(tok_encode(t, text, len, true, &ids2, &n2, &e), 0);
    assert_int_equal(n2, enc.n);
    assert_memory_equal(ids2, enc.ids, n2 * sizeof *ids2);
    assert_int_equal(tok_decode(t, ids, n, false, &dec, &e), 0);
    assert_int_equal(tok_decode(t, ids, n, true, &skip, &e), 0);
    assert_int_equal(tok_decode(t, enc.ids, enc.n, false, &with, &e), 0);
    const char *wd = jstr(c, "decoded"), *ws = jstr(c, "decoded_skip_special");
    const char *ww = jstr(c, "decoded_with_special");
    if (strcmp(dec, wd) || strcmp(skip, ws) || (ww && strcmp(with, ww))) {
        fprintf(stderr, "decode of '%s' differs:\n  got  '%s' / '%s' / '%s'\n  want '%s' / '%s' / '%s'\n",
                text, dec, skip, with, wd, ws, ww ? ww : "");
        bad++;
    }
    st = stream_all(t, ids, n, false);
    if (strcmp(st, dec)) {
        fprintf(stderr, "streamed decode of '%s': '%s', whole '%s'\n", text, st, dec);
        bad++;
    }
    free(st);
    st = stream_all(t, enc.ids, enc.n, false);
    if (strcmp(st, with)) {
        fprintf(stderr, "streamed decode (specials) of '%s': '%s', whole '%s'\n", text, st, with);
        bad++;
    }
    free(st);
    free(ids);
    free(ids2);
    free(dec);
    free(skip);
    free(with);
    tok_encoding_deinit(&enc);
    return bad;
}

static int check_pair(const struct tokenizer *t, const cJSON *c, const struct tok_buf *ia,
                      const struct tok_buf *ib)
{
    const char *a = ia->p, *b = ib->p;
    struct tok_encode_opts o = {.add_special = true};
    assert_string_equal(a, jstr(c, "a"));
    struct tok_encoding enc = {0};
    struct err e = {0};
    int bad = 0;
    if (tok_encode_pair(t, a, ia->n, b, ib->n, &o, &enc, &e) < 0)
        fail_msg("pair '%s' / '%s': %s", a, b, e.msg);
    if (!same_ids(enc.ids, enc.n, cJSON_GetObjectItem(c, "ids")) ||
        !same_ids(enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids"))) {
        fprintf(stderr, "pair '%s' / '%s' differs\n", a, b);
        print_ids("ids", enc.ids, enc.n, cJSON_GetObjectItem(c, "ids"));
        print_ids("type_ids", enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids"));
        bad++;
    }
    tok_encoding_deinit(&enc);
    return bad;
}

static int check_truncate(const struct tokenizer *t, const cJSON *c, const struct tok_buf *ia,
                          const struct tok_buf *ib)
{
    const char *a = ia->p, *b = ib->p, *strat = jstr(c, "strategy");
    struct tok_encode_opts o = {.add_special = true};
    struct tok_encoding enc = {0};
    struct err e = {0};
    int bad = 0;
    o.max_length = (size_t)cJSON_GetObjectItem(c, "max_length")->valueint;
    o.strategy = strcmp(strat, "only_first") == 0    ? TOK_TRUNC_ONLY_FIRST
                 : strcmp(strat, "only_second") == 0 ? TOK_TRUNC_ONLY_SECOND
                                                     : TOK_TRUNC_LONGEST_FIRST;
    int rc = tok_encode_pair(t, a, ia->n, b, ib->n, &o, &enc, &e);
    if (cJSON_GetObjectItem(c, "error")) {
        if (rc >= 0) {
            fprintf(stderr, "truncate '%s' / '%s' max %zu %s: ok, want error '%s'\n", a,
                    b ? b : "(none)", o.max_length, strat, jstr(c, "error"));
            bad++;
        }
    } else if (rc < 0) {
        fprintf(stderr, "truncate '%s' / '%s' max %zu %s: %s\n", a, b ? b : "(none)",
                o.max_length, strat, e.msg);
        bad++;
    } else if (!same_ids(enc.ids, enc.n, cJSON_GetObjectItem(c, "ids")) ||
               !same_ids(enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids"))) {
        fprintf(stderr, "truncate '%s' / '%s' max %zu %s differs\n", a, b ? b : "(none)",
                o.max_length, strat);
        print_ids("ids", enc.ids, enc.n, cJSON_GetObjectItem(c, "ids"));
        print_ids("type_ids", enc.type_ids, enc.n, cJSON_GetObjectItem(c, "type_ids"));
        bad++;
    }
    tok_encoding_deinit(&enc);
    return bad;
}

static void check_fixture(const char *name)
{
    char rel[256], path[4200];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizers/%s", name);
    const char *dir = test_path(rel);
    struct tokenizer *t = test_tok_load_gz(dir);
    snprintf(path, sizeof path, "%s/golden.json.xz", dir);
    char *text = slurp_xz(path);
    cJSON *g = cJSON_Parse(text);
    assert_non_null(g);
    const cJSON *c;
    int bad = 0, n = 0;
    struct raw_reader r = {text, 0};
    struct tok_buf ia = {0}, ib = {0};
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "encode")) {
        raw_next(&r, "text", &ia);
        bad += check_encode(t, c, &ia);
        n++;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "pairs")) {
        raw_next(&r, "a", &ia);
        raw_next(&r, "b", &ib);
        bad += check_pair(t, c, &ia, &ib);
        n++;
    }
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "truncate")) {
        raw_next(&r, "a", &ia);
        raw_next(&r, "b", &ib);
        bad += check_truncate(t, c, &ia, &ib);
        n++;
    }
    free(ia.p);
    free(ib.p);
    cJSON_Delete(g);
    free(text);
    tok_free(t);
    if (bad)
        fail_msg("%s: %d of %d golden cases differ", name, bad, n);
    assert_true(n > 50);
}

static void test_golden_bert_uncased(void **state) { (void)state; check_fixture("bert_uncased"); }
static void test_golden_bert_cased(void **state) { (void)state; check_fixture("bert_cased"); }
static void test_golden_xlmr_unigram(void **state) { (void)state; check_fixture("xlmr_unigram"); }
static void test_golden_t5_unigram(void **state) { (void)state; check_fixture("t5_unigram"); }
static void test_golden_unigram_nfkc(void **state) { (void)state; check_fixture("unigram_nfkc"); }
static void test_golden_wordlevel(void **state) { (void)state; check_fixture("wordlevel"); }
static void test_golden_wordlevel_ws(void **state) { (void)state; check_fixture("wordlevel_ws"); }

/* ---- hand-written tokenizers ---- */

/* Encodes text (no specials) and compares with want[0..n). */
static void expect_ids(const struct tokenizer *t, const char *text, const int32_t *want, size_t n)
{
    int32_t *ids = NULL;
    size_t got = 0;
    struct err e = {0};
    if (tok_encode(t, text, strlen(text), false, &ids, &got, &e) < 0)
        fail_msg("encode '%s': %s", text, e.msg);
    if (got != n || memcmp(ids, want, n * sizeof *want) != 0) {
        fprintf(stderr, "'%s': got", text);
        for (size_t i = 0; i < got; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail_msg("'%s': %zu ids, want %zu", text, got, n);
    }
    free(ids);
}

static void expect_vec(const int32_t *got, size_t n, const int32_t *want, size_t nw, const char *what)
{
    if (n != nw || memcmp(got, want, n * sizeof *want) != 0) {
        fprintf(stderr, "%s: got", what);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", got[i]);
        fprintf(stderr, "\n");
        fail_msg("%s: %zu values, want %zu", what, n, nw);
    }
}

static void expect_enc(const struct tok_encoding *enc, const int32_t *want, size_t n)
{
    expect_vec(enc->ids, enc->n, want, n, "ids");
}

static void expect_types(const struct tok_encoding *enc, const int32_t *want, size_t n)
{
    expect_vec(enc->type_ids, enc->n, want, n, "type ids");
}

#define IDS(...) (const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

static const char k_wordpiece[] =
    "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
    "\"max_input_chars_per_word\":5,\"vocab\":{\"[UNK]\":0,\"[CLS]\":1,\"[SEP]\":2,\"un\":3,"
    "\"##aff\":4,\"##able\":5,\"a\":6,\"##b\":7,\",\":8,\".\":9,\"\\u4e2d\":10}},"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",2],\"cls\":[\"[CLS]\",1]},"
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true}}";

/* WordPiece with BERT's normalizer, pre-tokenizer, processor and decoder. */
static void test_wordpiece(void **state)
{
    (void)state;
    struct tokenizer *t = test_tok_must_load(k_wordpiece);
    struct err e = {0};
    char *out = NULL;
    expect_ids(t, "UnAff", IDS(3, 4));               /* lowercased, ## continuation */
    expect_ids(t, "unaffable", IDS(0));              /* 9 characters > max 5: one unk */
    expect_ids(t, "\xC3\x81" "b,a\x01.", IDS(6, 7, 8, 6, 9)); /* accent stripped, control dropped */
    expect_ids(t, "abc", IDS(0));                    /* ##c missing: the whole word is unk */
    expect_ids(t, "a\xE4\xB8\xAD" "a", IDS(6, 10, 6)); /* CJK ideographs are words */
    /* decoder: ## joins, " ," and " ." are cleaned up */
    assert_int_equal(tok_decode(t, IDS(3, 4, 8, 6, 7, 9), false, &out, &e), 0);
    assert_string_equal(out, "unaff, ab.");
    free(out);
    /* pair: [CLS] A [SEP] B [SEP] with type ids 0 0 0 1 1 */
    struct tok_encode_opts o = {.add_special = true};
    struct tok_encoding enc = {0};
    assert_int_equal(tok_encode_pair(t, "un", 2, "a", 1, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 3, 2, 6, 2));
    expect_types(&enc, IDS(0, 0, 0, 1, 1));
    tok_encoding_deinit(&enc);
    /* longest_first: 4 + 2 ids into 6 - 3 specials: the longer keeps 2, the shorter 1 */
    o.max_length = 6;
    assert_int_equal(tok_encode_pair(t, "un un un un", 11, "a a", 3, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 3, 3, 2, 6, 2));
    tok_encoding_deinit(&enc);
    /* only_second cannot cut "a a" (2 ids) by 3; only_second needs a pair */
    o.strategy = TOK_TRUNC_ONLY_SECOND;
    assert_int_equal(tok_encode_pair(t, "un un un un", 11, "a a", 3, &o, &enc, &e), -ERR_RANGE);
    assert_null(enc.ids);
    assert_int_equal(tok_encode_pair(t, "un un un un un un", 17, NULL, 0, &o, &enc, &e), -ERR_RANGE);
    o.strategy = TOK_TRUNC_ONLY_FIRST;
    assert_int_equal(tok_encode_pair(t, "un un un un", 11, "a a", 3, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 3, 2, 6, 6, 2));
    tok_encoding_deinit(&enc);
    /* a single text: the budget is max_length - 2 */
    o.strategy = TOK_TRUNC_LONGEST_FIRST;
    o.max_length = 3;
    assert_int_equal(tok_encode_pair(t, "un a", 4, NULL, 0, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 3, 2));
    expect_types(&enc, IDS(0, 0, 0));
    tok_encoding_deinit(&enc);
    /* tokenizers 0.23 stops encoding a text after the word that reaches
     * max_length: 10 and 6 words both become 6, so with a budget of 3 the
     * (now equal) texts keep 1 and 2, where cutting 10 and 6 would give 2, 1 */
    o.max_length = 6;
    assert_int_equal(tok_encode_pair(t, "a a a a a a a a a a", 19, "a a a a a a", 11, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 6, 2, 6, 6, 2));
    tok_encoding_deinit(&enc);
    /* max_length below the 2 special tokens: the early exit keeps the first
     * word, and the budget (max_length - 2 in usize) wraps: nothing more is cut */
    o.max_length = 1;
    assert_int_equal(tok_encode_pair(t, "un a a", 6, NULL, 0, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 3, 2));
    tok_encoding_deinit(&enc);
    o.max_length = 2;
    assert_int_equal(tok_encode_pair(t, "un a a", 6, NULL, 0, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(1, 2));
    tok_encoding_deinit(&enc);
    tok_free(t);
}

#define UNIGRAM_VOCAB                                                                      \
    "[[\"<unk>\",0.0],[\"a\",-1.0],[\"b\",-2.0],[\"ab\",-2.5],[\"\\u2581\",-1.0],"       \
    "[\"\\u2581a\",-1.5],[\"<0x78>\",-3.0],[\"<0x79>\",-3.0],[\"</s>\",0.0]]"

/* Unigram: Viterbi, unk fusion, byte fallback, Metaspace. */
static void test_unigram(void **state)
{
    (void)state;
    static const char k_json[] =
        "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":" UNIGRAM_VOCAB "},"
        "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
        "\"prepend_scheme\":\"always\",\"split\":true},"
        "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"always\"}}";
    static const char k_json_bf[] =
        "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":" UNIGRAM_VOCAB "}}";
    struct tokenizer *t = test_tok_must_load(k_json);
    struct err e = {0};
    char *out = NULL;
    /* "\u2581" + "ab" and "\u2581a" + "b" both score -3.5: the first edge
     * offered to the end node wins (ab, from the earlier start) */
    expect_ids(t, "ab", IDS(4, 3));
    expect_ids(t, "b ab", IDS(4, 2, 4, 3));
    expect_ids(t, "axyb", IDS(5, 0, 2));       /* x and y unknown: one fused unk */
    assert_int_equal(tok_decode(t, IDS(5, 2, 4, 1), false, &out, &e), 0);
    assert_string_equal(out, "ab a");
    free(out);
    tok_free(t);
    t = test_tok_must_load(k_json_bf);
    expect_ids(t, "ab", IDS(3));                /* -2.5 beats a + b = -3 */
    expect_ids(t, "axyb", IDS(1, 6, 7, 2));     /* fused "xy" -> <0x78> <0x79> */
    expect_ids(t, "axzb", IDS(1, 0, 2));        /* no <0x7A>: the fused piece is unk */
    tok_free(t);
}

static void b64(const unsigned char *in, size_t n, char *out)
{
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = k[v >> 18 & 63];
        out[o++] = k[v >> 12 & 63];
        out[o++] = i + 1 < n ? k[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? k[v & 63] : '=';
    }
    out[o] = '\0';
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A charsmap blob mapping "A" -> "x" (and nothing else): root offset 1, the
 * unit for 'A' at 1 ^ 0x41 = 0x40 with a leaf at 0x40 ^ 2 = 0x42 whose value
 * is string offset str_at. strings: what follows the trie. */
static size_t make_charsmap(unsigned char *blob, uint32_t n_units, uint32_t root, uint32_t str_at,
                            const char *strings, size_t n_strings)
{
    put_u32(blob, n_units * 4);
    memset(blob + 4, 0, n_units * 4);
    put_u32(blob + 4, root);
    if (n_units > 0x42) {
        put_u32(blob + 4 + 4 * 0x40, 0x41u | 1u << 8 | 2u << 10);
        put_u32(blob + 4 + 4 * 0x42, str_at);
    }
    memcpy(blob + 4 + 4 * n_units, strings, n_strings);
    return 4 + 4 * n_units + n_strings;
}

/* Loads a WordLevel tokenizer whose normalizer is the given charsmap. */
static int load_charsmap(const unsigned char *blob, size_t n, struct tokenizer **t, struct err *e)
{
    char *b = malloc(4 * (n / 3 + 1) + 1), *json = malloc(4 * (n / 3 + 1) + 512);
    assert_non_null(b);
    assert_non_null(json);
    b64(blob, n, b);
    sprintf(json, "{\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"?\",\"vocab\":{\"?\":0,\"x\":1,"
                  "\"A\":2,\"xB\":3,\"B\":4}},\"normalizer\":{\"type\":\"Precompiled\","
                  "\"precompiled_charsmap\":\"%s\"},\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}", b);
    int rc = test_tok_load_json(json, t, e);
    free(b);
    free(json);
    return rc;
}

/* The Precompiled normalizer on a hand-built charsmap, then hostile ones. */
static void test_charsmap(void **state)
{
    (void)state;
    unsigned char blob[4096];
    struct tokenizer *t = NULL;
    struct err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    size_t len = make_charsmap(blob, 0x80, 1u << 10, 0, "x\0", 2);
    assert_int_equal(load_charsmap(blob, len, &t, &e), 0);
    expect_ids(t, "A", IDS(1));
    expect_ids(t, "AB B", IDS(3, 4));  /* "A" -> "x", "B" kept */
    tok_free(t);
    /* empty trie, trie larger than the blob, huge size claim, bad base64 */
    put_u32(blob, 0);
    assert_int_equal(load_charsmap(blob, 4, &t, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "trie"));
    assert_null(t);
    len = make_charsmap(blob, 0x80, 1u << 10, 0, "x\0", 2);
    assert_int_equal(load_charsmap(blob, 100, &t, &e), -ERR_FORMAT);
    put_u32(blob, 0xFFFFFFFCu);
    assert_int_equal(load_charsmap(blob, len, &t, &e), -ERR_FORMAT);
    assert_int_equal(load_charsmap(blob, 2, &t, &e), -ERR_FORMAT);
    assert_int_equal(test_tok_load_json("{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"normalizer\":"
                               "{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"AA!A\"}}", &t, &e),
                     -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "base64"));
    /* a charsmap over TOK_CHARSMAP_MAX (16 MiB decoded) is refused before decoding */
    {
        size_t n_b64 = (TOK_CHARSMAP_MAX / 3 + 1) * 4;
        char *json = malloc(n_b64 + 256);
        assert_non_null(json);
        int k = sprintf(json, "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"normalizer\":"
                              "{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"");
        memset(json + k, 'A', n_b64);
        strcpy(json + k + n_b64, "\"}}");
        assert_int_equal(test_tok_load_json(json, &t, &e), -ERR_RANGE);
        assert_null(t);
        free(json);
    }
    /* normalized strings that are not UTF-8 */
    len = make_charsmap(blob, 0x80, 1u << 10, 0, "\xC3(\0", 3);
    assert_int_equal(load_charsmap(blob, len, &t, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "UTF-8"));
    /* a root offset leading outside the trie, a string offset past the
     * strings, one inside a character: load, then fail cleanly on use */
    static const struct {
        uint32_t root, str_at;
        const char *strings;
        size_t n;
    } k_bad[] = {
        {1000u << 10, 0, "x\0", 2},
        {1u << 10, 99, "x\0", 2},
        {1u << 10, 1, "\xC3\xA9\0", 3},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        len = make_charsmap(blob, 0x80, k_bad[i].root, k_bad[i].str_at, k_bad[i].strings, k_bad[i].n);
        assert_int_equal(load_charsmap(blob, len, &t, &e), 0);
        assert_int_equal(tok_encode(t, "A", 1, false, &ids, &n, &e), -ERR_FORMAT);
        assert_non_null(strstr(e.msg, "precompiled_charsmap"));
        assert_null(ids);
        tok_free(t);
        t = NULL;
    }
}

/* Bad vocabularies and options: clear errors at load, missing unk at encode. */
static void test_hostile(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int code;
        const char *in_msg;
    } k_cases[] = {
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", -ERR_FORMAT, "empty"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":{\"a\":0}}}", -ERR_FORMAT, "list"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",\"x\"]]}}", -ERR_FORMAT, "score"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\"]]}}", -ERR_FORMAT, "vocab[0]"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",1e999]]}}", -ERR_FORMAT, "score"},
        {"{\"model\":{\"type\":\"Unigram\",\"unk_id\":-1,\"vocab\":[[\"a\",0]]}}", -ERR_FORMAT, "unk_id"},
        {"{\"model\":{\"type\":\"Unigram\",\"unk_id\":2147483648,\"vocab\":[[\"a\",0]]}}", -ERR_FORMAT,
         "unk_id"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0],[\"\\ud800\",0]]}}", -ERR_FORMAT, ""},
        {"{\"model\":{\"type\":\"WordPiece\",\"max_input_chars_per_word\":-1,\"vocab\":{\"a\":0}}}",
         -ERR_FORMAT, "max_input_chars_per_word"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0,\"b\":9999999}}}", -ERR_FORMAT, "sparse"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":16777216}}}", -ERR_FORMAT, "id"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"normalizer\":{\"type\":"
         "\"BertNormalizer\",\"lowercase\":\"yes\"}}", -ERR_FORMAT, "lowercase"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"post_processor\":{\"type\":"
         "\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":1e9}}]}}",
         -ERR_FORMAT, "type_id"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"post_processor\":{\"type\":"
         "\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"C\"}}]}}", -ERR_FORMAT, "A or B"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}},\"post_processor\":{\"type\":"
         "\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\"}},{\"Sequence\":{\"id\":\"A\"}}]}}",
         -ERR_UNSUPPORTED, "once"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        struct tokenizer *t = (struct tokenizer *)k_cases;  /* must be reset to NULL */
        struct err e = {0};
        int rc = test_tok_load_json(k_cases[i].json, &t, &e);
        if (rc != k_cases[i].code || !strstr(e.msg, k_cases[i].in_msg))
            fail_msg("case %zu: rc %d (%s), want %d with '%s'", i, rc, e.msg, k_cases[i].code,
                     k_cases[i].in_msg);
        assert_null(t);
    }
    /* unk needed but absent: an error from encode, not a crash or a silent drop */
    static const char *const k_no_unk[] = {
        "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
        "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0}}}",
        "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0]]}}",
    };
    for (size_t i = 0; i < sizeof k_no_unk / sizeof k_no_unk[0]; i++) {
        struct tokenizer *t = test_tok_must_load(k_no_unk[i]);
        struct err e = {0};
        int32_t *ids = NULL;
        size_t n = 0;
        expect_ids(t, "a", IDS(0));
        assert_int_equal(tok_encode(t, "b", 1, false, &ids, &n, &e), -ERR_FORMAT);
        assert_null(ids);
        tok_free(t);
    }
    /* a pair with special tokens needs a pair template */
    struct tokenizer *t = test_tok_must_load(
        "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"a\":0,\"<s>\":1}},\"post_processor\":{\"type\":"
        "\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],"
        "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}}}");
    struct tok_encode_opts o = {.add_special = true};
    struct tok_encoding enc = {0};
    struct err e = {0};
    assert_int_equal(tok_encode_pair(t, "a", 1, "a", 1, &o, &enc, &e), -ERR_UNSUPPORTED);
    o.add_special = false;
    assert_int_equal(tok_encode_pair(t, "a", 1, "a", 1, &o, &enc, &e), 0);
    expect_enc(&enc, IDS(0, 0));
    expect_types(&enc, IDS(0, 1));
    tok_encoding_deinit(&enc);
    tok_free(t);
}

/* Long words cost O(word x longest piece), whatever max_input_chars_per_word says. */
static void test_long_words(void **state)
{
    (void)state;
    size_t n = 200000;
    char *json = malloc(4096), *piece = malloc(1001), *text = malloc(n + 1);
    assert_non_null(json);
    assert_non_null(piece);
    assert_non_null(text);
    memset(piece, 'a', 1000);
    piece[1000] = '\0';
    memset(text, 'a', n);
    text[n] = '\0';
    snprintf(json, 4096, "{\"model\":{\"type\":\"WordPiece\",\"max_input_chars_per_word\":1e300,"
                         "\"unk_token\":\"[UNK]\",\"vocab\":{\"[UNK]\":0,\"a\":1,\"##a\":2,\"%s\":3,"
                         "\"##%s\":4}}}", piece, piece);
    struct tokenizer *t = test_tok_must_load(json);
    int32_t *ids = NULL;
    size_t got = 0;
    struct err e = {0};
    assert_int_equal(tok_encode(t, text, n, false, &ids, &got, &e), 0);
    assert_int_equal(got, n / 1000);  /* the 1000-byte piece, then "##" + 1000 a's each */
    free(ids);
    tok_free(t);
    /* Unigram over the same word */
    snprintf(json, 4096, "{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"vocab\":[[\"<unk>\",0],"
                         "[\"a\",-1],[\"%s\",-2]]}}", piece);
    t = test_tok_must_load(json);
    assert_int_equal(tok_encode(t, text, n, false, &ids, &got, &e), 0);
    assert_int_equal(got, n / 1000);
    free(ids);
    tok_free(t);
    free(json);
    free(piece);
    free(text);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_golden_bert_uncased),
    cmocka_unit_test(test_golden_bert_cased),
    cmocka_unit_test(test_golden_xlmr_unigram),
    cmocka_unit_test(test_golden_t5_unigram),
    cmocka_unit_test(test_golden_unigram_nfkc),
    cmocka_unit_test(test_golden_wordlevel),
    cmocka_unit_test(test_golden_wordlevel_ws),
    cmocka_unit_test(test_wordpiece),
    cmocka_unit_test(test_unigram),
    cmocka_unit_test(test_charsmap),
    cmocka_unit_test(test_hostile),
    cmocka_unit_test(test_long_words),
};

TEST_SUITE(tokenizer_enc, tests);
