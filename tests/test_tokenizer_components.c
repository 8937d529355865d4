/*
 * test_tokenizer_components: one tokenizer component at a time, on small
 * hand-written tokenizer.json files: every normalizer, every pre-tokenizer
 * (each Split behaviour, invert, Metaspace prepend schemes), the BPE model
 * options (affixes, unk fusing, byte fallback), added-token matching
 * (lstrip/rstrip/single_word with Unicode neighbours, HF's skip-over rule,
 * normalized content), every decoder, streaming across byte-fallback runs
 * and the Metaspace leading space, and hostile files and texts.
 *
 * Expected values follow Hugging Face `tokenizers` semantics (its unit tests
 * and source: the pre_tokenizers, decoders and added_vocabulary modules); the
 * real checkpoints are covered by the golden tests in test_tokenizer.c.
 * Normalizer and pre-tokenizer outputs are read through the internal
 * functions (tok_impl.h), the rest through the public API.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tok_impl.h"

/* ---- helpers ---- */

int test_tok_load_json(const char *json, struct tokenizer **t, struct err *e)
{
    char path[] = "/tmp/mlxcel_tokc_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(json);
    assert_int_equal(write(fd, json, n), (ssize_t)n);
    close(fd);
    int rc = tok_load_files(t, path, NULL, e);
    unlink(path);
    return rc;
}

struct tokenizer *test_tok_must_load(const char *json)
{
    struct tokenizer *t = NULL;
    struct err e = {0};
    if (test_tok_load_json(json, &t, &e) < 0)
        fail_msg("load: %s\n%s", e.msg, json);
    return t;
}

/* A vocab of single characters and a few words, enough for any text below
 * that stays within it. */
#define MODEL(vocab, merges) "\"model\":{\"type\":\"BPE\",\"vocab\":" vocab ",\"merges\":" merges "}"
#define ABC_VOCAB "{\"a\":0,\"b\":1,\"c\":2,\" \":3,\"ab\":4,\"<unk>\":5}"

/* Runs t's normalizer on text and compares with want. */
static void expect_norm(const struct tokenizer *t, const char *text, const char *want)
{
    struct err e = {0};
    char *out = NULL;
    size_t n = 0;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    assert_non_null(md);
    assert_int_equal(tok_norm_apply(t, md, text, strlen(text), &out, &n, &e), 0);
    if (n != strlen(want) || memcmp(out, want, n) != 0)
        fail_msg("normalize '%s': got '%.*s', want '%s'", text, (int)n, out, want);
    free(out);
    pcre2_match_data_free(md);
}

static void check_normalizer(const char *norm_json, const char *text, const char *want)
{
    char json[2048];
    snprintf(json, sizeof json, "{\"normalizer\":%s," MODEL(ABC_VOCAB, "[]") "}", norm_json);
    struct tokenizer *t = test_tok_must_load(json);
    expect_norm(t, text, want);
    tok_free(t);
}

struct words {
    char buf[1024];
    size_t n;
};

static int collect(void *ctx, const char *w, size_t len)
{
    struct words *ws = ctx;
    assert_true(ws->n + len + 2 < sizeof ws->buf);
    if (ws->n)
        ws->buf[ws->n++] = '|';
    memcpy(ws->buf + ws->n, w, len);
    ws->n += len;
    ws->buf[ws->n] = '\0';
    return 0;
}

/* Pre-tokenizes text with pre_json and compares the words joined by '|'. */
static void check_pretok(const char *pre_json, const char *text, bool first, const char *want)
{
    char json[2048];
    struct words ws = {{0}, 0};
    struct err e = {0};
    snprintf(json, sizeof json, "{\"pre_tokenizer\":%s," MODEL(ABC_VOCAB, "[]") "}", pre_json);
    struct tokenizer *t = test_tok_must_load(json);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    assert_non_null(md);
    assert_int_equal(tok_pretok_run(t, md, text, strlen(text), first, collect, &ws, &e), 0);
    if (strcmp(ws.buf, want) != 0)
        fail_msg("%s on '%s': got '%s', want '%s'", pre_json, text, ws.buf, want);
    pcre2_match_data_free(md);
    tok_free(t);
}

static void expect_ids(const struct tokenizer *t, const char *text, const int32_t *want, size_t n)
{
    struct err e = {0};
    int32_t *ids = NULL;
    size_t got = 0;
    if (tok_encode(t, text, strlen(text), false, &ids, &got, &e) < 0)
        fail_msg("encode '%s': %s", text, e.msg);
    if (got != n)
        fail_msg("'%s': %zu ids, want %zu", text, got, n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] != want[i])
            fail_msg("'%s': id[%zu] = %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}

static void expect_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip,
                          const char *want)
{
    struct err e = {0};
    char *out = NULL;
    if (tok_decode(t, ids, n, skip, &out, &e) < 0)
        fail_msg("decode: %s", e.msg);
    if (strcmp(out, want) != 0)
        fail_msg("decode: got '%s', want '%s'", out, want);
    free(out);
}

/* ---- normalizers ---- */

static void test_normalizers(void **state)
{
    (void)state;
    check_normalizer("{\"type\":\"NFC\"}", "e\xCC\x81", "\xC3\xA9");
    check_normalizer("{\"type\":\"NFD\"}", "\xC3\xA9", "e\xCC\x81");
    check_normalizer("{\"type\":\"NFKC\"}", "\xEF\xAC\x81 \xE2\x91\xA0", "fi 1");  /* ligature, circled 1 */
    check_normalizer("{\"type\":\"NFKD\"}", "\xC3\xA9\xEF\xAC\x81", "e\xCC\x81" "fi");
    /* ASCII stretches around a combining mark: the base letter still composes */
    check_normalizer("{\"type\":\"NFC\"}", "abc e\xCC\x81 xyz", "abc \xC3\xA9 xyz");
    check_normalizer("{\"type\":\"Lowercase\"}", "HeLLo \xC3\x89T\xC3\x89 \xC4\xB0", "hello \xC3\xA9t\xC3\xA9 i\xCC\x87");
    check_normalizer("{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":false}",
                     " \t\xE3\x80\x80" "a b  ", "a b  ");
    check_normalizer("{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true}",
                     "  a b \n", "a b");
    check_normalizer("{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"}", "ab", "\xE2\x96\x81" "ab");
    check_normalizer("{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"}", "", "");
    check_normalizer("{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}",
                     "a b  c", "a\xE2\x96\x81" "b\xE2\x96\x81\xE2\x96\x81" "c");
    check_normalizer("{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" {2,}\"},\"content\":\" \"}",
                     "a    b c", "a b c");
    check_normalizer("{\"type\":\"Replace\",\"pattern\":{\"String\":\".\"},\"content\":\"\"}",
                     "a.b.c", "abc");  /* a String pattern is literal, not a regex */
    check_normalizer("{\"type\":\"ByteLevel\"}", "a \xC3\xA9", "a\xC4\xA0\xC3\x83\xC2\xA9");
    /* a Sequence runs in order: SentencePiece legacy (mistral_spm) */
    check_normalizer("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
                     "\"\xE2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
                     "\"content\":\"\xE2\x96\x81\"}]}",
                     "a b", "\xE2\x96\x81" "a\xE2\x96\x81" "b");
}

/* ---- pre-tokenizers ---- */

static void test_pretok_split(void **state)
{
    (void)state;
    static const struct {
        const char *behavior;
        bool invert;
        const char *want;
    } k_cases[] = {
        {"Isolated", false, "a|-|b|-|-|c"},
        {"Removed", false, "a|b|c"},
        {"MergedWithPrevious", false, "a-|b-|-|c"},
        {"MergedWithNext", false, "a|-b|-|-c"},
        {"Contiguous", false, "a|-|b|--|c"},
        /* invert: the pattern marks the content, everything else delimits */
        {"Isolated", true, "a|-|b|--|c"},
        {"Removed", true, "a|b|c"},
        {"MergedWithPrevious", true, "a-|b--|c"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char pre[256];
        const char *pat = k_cases[i].invert ? "{\"Regex\":\"[a-z]\"}" : "{\"String\":\"-\"}";
        snprintf(pre, sizeof pre, "{\"type\":\"Split\",\"pattern\":%s,\"behavior\":\"%s\",\"invert\":%s}",
                 pat, k_cases[i].behavior, k_cases[i].invert ? "true" : "false");
        check_pretok(pre, "a-b--c", true, k_cases[i].want);
    }
    /* a regex Split with Unicode classes, GPT-4 style */
    check_pretok("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{L}+|\\\\p{N}{1,3}|\\\\s+\"},"
                 "\"behavior\":\"Isolated\",\"invert\":false}",
                 "caf\xC3\xA9 12345", true, "caf\xC3\xA9| |123|45");
}

static void test_pretok_others(void **state)
{
    (void)state;
    static const char *ms = "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                            "\"prepend_scheme\":\"%s\",\"split\":%s}";
    char pre[256];
    /* Metaspace: every space becomes U+2581, which starts each piece */
    snprintf(pre, sizeof pre, ms, "always", "true");
    check_pretok(pre, "Hey   friend!", true,
                 "\xE2\x96\x81Hey|\xE2\x96\x81|\xE2\x96\x81|\xE2\x96\x81" "friend!");
    check_pretok(pre, "Hey", false, "\xE2\x96\x81Hey");
    check_pretok(pre, " Hey", true, "\xE2\x96\x81Hey");  /* no second prefix */
    snprintf(pre, sizeof pre, ms, "always", "false");
    check_pretok(pre, "a b", true, "\xE2\x96\x81" "a\xE2\x96\x81" "b");
    snprintf(pre, sizeof pre, ms, "first", "true");
    check_pretok(pre, "a b", true, "\xE2\x96\x81" "a|\xE2\x96\x81" "b");
    check_pretok(pre, "a b", false, "a|\xE2\x96\x81" "b");  /* not at the start of the text */
    snprintf(pre, sizeof pre, ms, "never", "true");
    check_pretok(pre, "a b", true, "a|\xE2\x96\x81" "b");
    /* ByteLevel: GPT-2 regex, prefix space, byte mapping left to the encoder */
    check_pretok("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}",
                 "Hello my friend", true, " Hello| my| friend");
    check_pretok("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}",
                 "Hello my", true, "Hello my");
    /* a ByteLevel that is not last maps the bytes itself */
    check_pretok("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"ByteLevel\","
                 "\"add_prefix_space\":false,\"use_regex\":false},{\"type\":\"Split\",\"pattern\":"
                 "{\"String\":\"\xC4\xA0\"},\"behavior\":\"MergedWithNext\",\"invert\":false}]}",
                 "a b", true, "a|\xC4\xA0" "b");
    check_pretok("{\"type\":\"Digits\",\"individual_digits\":true}", "Hey 123 friend!", true,
                 "Hey |1|2|3| friend!");
    check_pretok("{\"type\":\"Digits\",\"individual_digits\":false}", "Hey 123 friend!", true,
                 "Hey |123| friend!");
    check_pretok("{\"type\":\"Punctuation\",\"behavior\":\"Isolated\"}",
                 "Hey friend!     How are you?!?", true, "Hey friend|!|     How are you|?|!|?");
    check_pretok("{\"type\":\"Punctuation\",\"behavior\":\"Contiguous\"}", "a?!b", true, "a|?!|b");
    check_pretok("{\"type\":\"Whitespace\"}", "Hey, man, Good?", true, "Hey|,|man|,|Good|?");
    check_pretok("{\"type\":\"WhitespaceSplit\"}", "Hey  man!\tyes\xE3\x80\x80no", true,
                 "Hey|man!|yes|no");
    check_pretok("{\"type\":\"CharDelimiterSplit\",\"delimiter\":\"-\"}", "a-b--c", true, "a|b|c");
    check_pretok("{\"type\":\"BertPreTokenizer\"}", "Hey friend!     How are you?!?", true,
                 "Hey|friend|!|How|are|you|?|!|?");
    /* a Sequence feeds each piece of one step to the next */
    check_pretok("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},"
                 "{\"type\":\"Digits\",\"individual_digits\":true}]}",
                 "ab12 c3", true, "ab|1|2|c|3");
}

/* ---- BPE model ---- */

static void test_bpe_affixes_unk(void **state)
{
    (void)state;
    /* continuing_subword_prefix: every character but a word's first is
     * looked up as "##c"; a merge's result drops the right part's prefix */
    struct tokenizer *t;
    t = test_tok_must_load("{\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\","
                  "\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0,\"##b\":1,\"ab\":2,\"##c\":3,"
                  "\"abc\":4,\"<unk>\":5,\"c\":6},\"merges\":[\"a ##b\",\"ab ##c\"]},"
                  "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"}}");
    expect_ids(t, "abc", (const int32_t[]){4}, 1);
    expect_ids(t, "ac c", (const int32_t[]){0, 3, 6}, 3);
    expect_ids(t, "ax", (const int32_t[]){0, 5}, 2);  /* "##x" unknown */
    tok_free(t);
    t = test_tok_must_load("{\"model\":{\"type\":\"BPE\",\"end_of_word_suffix\":\"</w>\",\"vocab\":"
                  "{\"a\":0,\"b</w>\":1,\"ab</w>\":2,\"a</w>\":3},\"merges\":[\"a b</w>\"]},"
                  "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},"
                  "\"decoder\":{\"type\":\"BPEDecoder\",\"suffix\":\"</w>\"}}");
    expect_ids(t, "ab a", (const int32_t[]){2, 3}, 2);
    expect_decode(t, (const int32_t[]){2, 3}, 2, false, "ab a");
    tok_free(t);
    /* unk: one per unknown character, or one per run with fuse_unk */
    static const char *k_unk = "{\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":%s,"
                               "\"vocab\":" ABC_VOCAB ",\"merges\":[\"a b\"]}}";
    char json[512];
    snprintf(json, sizeof json, k_unk, "false");
    t = test_tok_must_load(json);
    expect_ids(t, "axyb", (const int32_t[]){0, 5, 5, 1}, 4);
    expect_ids(t, "abxy", (const int32_t[]){4, 5, 5}, 3);
    tok_free(t);
    snprintf(json, sizeof json, k_unk, "true");
    t = test_tok_must_load(json);
    expect_ids(t, "axyb", (const int32_t[]){0, 5, 1}, 3);
    expect_ids(t, "x\xC3\xA9y", (const int32_t[]){5}, 1);
    tok_free(t);
    /* no unk_token: unknown characters vanish (as in HF), so their
     * neighbours merge */
    t = test_tok_must_load("{" MODEL(ABC_VOCAB, "[\"a b\"]") "}");
    expect_ids(t, "axb", (const int32_t[]){4}, 1);
    tok_free(t);
}

/* byte_fallback: an unknown character becomes the <0xXX> tokens of its
 * UTF-8 bytes; if one byte token is missing the character falls to unk. */
static void test_bpe_byte_fallback(void **state)
{
    (void)state;
    struct tokenizer *t = test_tok_must_load(
        "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"vocab\":"
        "{\"<unk>\":0,\"a\":1,\"<0xE2>\":2,\"<0x82>\":3,\"<0xAC>\":4,\"<0xC3>\":5},\"merges\":[]},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}");
    expect_ids(t, "a\xE2\x82\xAC" "a", (const int32_t[]){1, 2, 3, 4, 1}, 5);
    expect_ids(t, "\xC3\xA9", (const int32_t[]){0}, 1);  /* <0xA9> missing */
    expect_decode(t, (const int32_t[]){1, 2, 3, 4, 1}, 5, false, "a\xE2\x82\xAC" "a");
    /* an invalid run becomes one U+FFFD per byte token */
    expect_decode(t, (const int32_t[]){2, 3, 1}, 3, false, "\xEF\xBF\xBD\xEF\xBF\xBD" "a");
    /* streaming holds the run back until the character is complete */
    struct tok_stream s;
    struct err e = {0};
    char buf[TOK_STREAM_CAP];
    tok_stream_init(&s, t, false);
    assert_int_equal(tok_stream_push(&s, 1, buf, sizeof buf, &e), 1);
    assert_string_equal(buf, "a");
    assert_int_equal(tok_stream_push(&s, 2, buf, sizeof buf, &e), 0);
    assert_int_equal(tok_stream_push(&s, 3, buf, sizeof buf, &e), 0);
    assert_int_equal(tok_stream_push(&s, 4, buf, sizeof buf, &e), 3);
    assert_string_equal(buf, "\xE2\x82\xAC");
    assert_int_equal(tok_stream_push(&s, 2, buf, sizeof buf, &e), 0);
    assert_int_equal(tok_stream_flush(&s, buf, sizeof buf), 3);
    assert_string_equal(buf, "\xEF\xBF\xBD");
    tok_free(t);
}

/* ---- added tokens ---- */

static void test_added_tokens(void **state)
{
    (void)state;
    struct tokenizer *t = test_tok_must_load(
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"<x>\",\"special\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false},"
        "{\"id\":11,\"content\":\"ab\",\"special\":false,\"single_word\":true,\"normalized\":false},"
        "{\"id\":12,\"content\":\"b\",\"special\":false,\"normalized\":false},"
        "{\"id\":13,\"content\":\"<xy>\",\"special\":true,\"normalized\":false}],"
        MODEL(ABC_VOCAB, "[]") "}");
    /* lstrip/rstrip take Unicode whitespace too (U+3000) */
    expect_ids(t, "a \xE3\x80\x80<x>\xE3\x80\x80 c", (const int32_t[]){0, 10, 2}, 3);
    /* leftmost-longest: "<xy>" wins over "<x>" at the same position */
    expect_ids(t, "<xy>", (const int32_t[]){13}, 1);
    /* single_word: a neighbouring word character (even non-ASCII) rejects
     * "ab", and, as in HF, the rejected text is skipped over, so the "b"
     * inside it is not matched either */
    expect_ids(t, "ab c", (const int32_t[]){11, 3, 2}, 3);
    expect_ids(t, "cab", (const int32_t[]){2, 0, 1}, 3);
    expect_ids(t, "\xC3\xA9" "ab", (const int32_t[]){0, 1}, 2);  /* é unknown: dropped */
    expect_ids(t, "cb", (const int32_t[]){2, 12}, 2);
    /* decode: skip_special drops only special ones */
    expect_decode(t, (const int32_t[]){0, 13, 10}, 3, true, "a <x>");
    tok_free(t);
    /* normalized tokens match the normalized text (their content is
     * normalized too) */
    t = test_tok_must_load("{\"added_tokens\":[{\"id\":10,\"content\":\"AB\",\"special\":false,"
                  "\"normalized\":true}],\"normalizer\":{\"type\":\"Lowercase\"},"
                  MODEL(ABC_VOCAB, "[]") "}");
    expect_ids(t, "cAbc", (const int32_t[]){2, 10, 2}, 3);
    tok_free(t);
}

/* ---- decoders ---- */

#define DEC_VOCAB "{\"\xE2\x96\x81" "a\":0,\"b\":1,\"\xE2\x96\x81\":2,\"<0x41>\":3,\"x_\":4,\"<s>\":5}"

static struct tokenizer *load_decoder(const char *dec)
{
    char json[2048];
    snprintf(json, sizeof json, "{\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true}],"
             "\"decoder\":%s," MODEL(DEC_VOCAB, "[]") "}", dec);
    return test_tok_must_load(json);
}

static void test_decoders(void **state)
{
    (void)state;
    const int32_t seq[] = {5, 0, 1, 2, 3, 0};
    struct tokenizer *t = load_decoder("null");
    expect_decode(t, seq, 6, false, "<s> \xE2\x96\x81" "a b \xE2\x96\x81 <0x41> \xE2\x96\x81" "a");
    tok_free(t);
    t = load_decoder("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"always\"}");
    expect_decode(t, seq + 1, 5, false, "ab <0x41> a");  /* first token's U+2581 dropped */
    expect_decode(t, seq, 6, false, "<s> ab <0x41> a");
    tok_free(t);
    t = load_decoder("{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"never\"}");
    expect_decode(t, seq + 1, 5, false, " ab <0x41> a");
    tok_free(t);
    t = load_decoder("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                     "{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
                     "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}");
    expect_decode(t, seq + 1, 5, false, "ab A a");
    expect_decode(t, seq, 6, true, "ab A a");
    expect_decode(t, seq, 6, false, "<s> ab A a");
    tok_free(t);
    /* Strip without Fuse works on every token */
    t = load_decoder("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                     "{\"Regex\":\"\xE2\x96\x81+\"},\"content\":\" \"},"
                     "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":1}]}");
    expect_decode(t, (const int32_t[]){0, 2, 1}, 3, false, "ab");
    tok_free(t);
    t = load_decoder("{\"type\":\"ByteLevel\"}");
    /* pieces outside the byte-level alphabet are taken as they are */
    expect_decode(t, (const int32_t[]){1, 0}, 2, false, "b\xE2\x96\x81" "a");
    tok_free(t);
}

/* Streaming with the Metaspace decoder: the first token loses its U+2581,
 * later ones keep it as a space, and the chunks add up to tok_decode. */
static void test_stream_metaspace(void **state)
{
    (void)state;
    struct tokenizer *t = load_decoder(
        "{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"always\"}");
    const int32_t ids[] = {2, 0, 2, 1, 0};
    const char *want[] = {"", " a", " ", "b", " a"};
    struct tok_stream s;
    struct err e = {0};
    char buf[TOK_STREAM_CAP];
    tok_stream_init(&s, t, false);
    for (int i = 0; i < 5; i++) {
        int w = tok_stream_push(&s, ids[i], buf, sizeof buf, &e);
        assert_true(w >= 0);
        if (strcmp(buf, want[i]) != 0)
            fail_msg("push %d: got '%s', want '%s'", i, buf, want[i]);
    }
    assert_int_equal(tok_stream_flush(&s, buf, sizeof buf), 0);
    expect_decode(t, ids, 5, false, " a b a");
    /* too small a buffer is an error and leaves the stream as it was */
    tok_stream_init(&s, t, false);
    assert_int_equal(tok_stream_push(&s, 0, buf, 1, &e), -ERR_RANGE);
    assert_int_equal(tok_stream_push(&s, 0, buf, sizeof buf, &e), 1);
    assert_string_equal(buf, "a");
    tok_free(t);
}

/* ---- hostile input ---- */

static void test_hostile_files(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int code;
        const char *in_msg;
    } k_cases[] = {
        {"{" MODEL("{\"a\":0}", "[]") ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}",
         -ERR_FORMAT, "replacement"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":"
         "\"_\",\"prepend_scheme\":\"sometimes\"}}", -ERR_FORMAT, "prepend_scheme"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"normalizer\":{\"type\":\"Prepend\",\"prepend\":3}}",
         -ERR_FORMAT, "prepend"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"normalizer\":{\"type\":\"Replace\",\"pattern\":"
         "{\"Regex\":\"[\"},\"content\":\"\"}}", -ERR_UNSUPPORTED, "regex"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"normalizer\":{\"type\":\"Replace\",\"pattern\":{},"
         "\"content\":\"x\"}}", -ERR_FORMAT, "pattern"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"decoder\":{\"type\":\"Strip\",\"content\":\" \","
         "\"start\":-1,\"stop\":0}}", -ERR_FORMAT, "start"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"decoder\":{\"type\":\"Replace\",\"pattern\":{\"String\":"
         "\"a\"},\"content\":\"longer\"}}", -ERR_UNSUPPORTED, "longer"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"decoder\":{\"type\":\"Sequence\",\"decoders\":"
         "[{\"type\":\"Fuse\"},{\"type\":\"CTC\"}]}}", -ERR_UNSUPPORTED, "CTC"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"pre_tokenizer\":{\"type\":\"Punctuation\",\"behavior\":3}}",
         -ERR_FORMAT, "behavior"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
         "{\"Regex\":\"a{2,1}\"},\"behavior\":\"Isolated\"}}", -ERR_UNSUPPORTED, "regex"},
        {"{" MODEL("{\"a\\ud800\":0}", "[]") "}", -ERR_FORMAT, "surrogate"},
        {"{" MODEL("{\"a\":0,\"b\":1}", "[[\"a\",\"b\"]]") "}", -ERR_FORMAT, "merged piece"},
        {"{" MODEL("{\"a\":0}", "[[\"a\",3]]") "}", -ERR_FORMAT, "merges[0]"},
        {"{" MODEL("{\"a\":0}", "{}") "}", -ERR_FORMAT, "merges"},
        {"{" MODEL("[[\"a\",0.0]]", "[]") "}", -ERR_FORMAT, "vocab"},
        {"{\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",\"vocab\":"
         "{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}", -ERR_FORMAT, "prefix"},
        {"{\"model\":{\"type\":\"WordLevel\",\"vocab\":[[\"a\",0.0]]}}", -ERR_FORMAT,
         "vocab"},
        {"{" MODEL("{\"a\":0}", "[]") ",\"added_tokens\":[{\"id\":1,\"content\":\"\\udc00\"}]}",
         -ERR_FORMAT, "JSON"},
        {"{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
         "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]"
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]," MODEL("{\"a\":0}", "[]") "}",
         -ERR_FORMAT, "JSON"},
    };
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        struct tokenizer *t = NULL;
        struct err e = {0};
        int rc = test_tok_load_json(k_cases[i].json, &t, &e);
        if (rc != k_cases[i].code || !strstr(e.msg, k_cases[i].in_msg))
            fail_msg("case %zu: rc %d (%s), want %d with '%s'", i, rc, e.msg, k_cases[i].code,
                     k_cases[i].in_msg);
        assert_null(t);
    }
}

/* Invalid UTF-8, NUL bytes and pathological texts: clear errors or exact
 * round trips, never a crash or a hang. */
static void test_hostile_texts(void **state)
{
    (void)state;
    struct tokenizer *t = load_decoder(
        "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}");
    struct err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    static const char *k_bad[] = {"\xFF", "a\xC3", "\xE2\x82", "\xF4\x90\x80\x80", "\xC1\xBF"};
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        assert_int_equal(tok_encode(t, k_bad[i], strlen(k_bad[i]), false, &ids, &n, &e), -ERR_ARG);
        assert_non_null(strstr(e.msg, "UTF-8"));
        assert_null(ids);
    }
    /* ids out of range, negative, and the holes between ids */
    char *out = NULL;
    assert_int_equal(tok_decode(t, (const int32_t[]){-5}, 1, false, &out, &e), -ERR_RANGE);
    assert_int_equal(tok_decode(t, (const int32_t[]){1 << 30}, 1, false, &out, &e), -ERR_RANGE);
    assert_null(out);
    /* streaming ids that never complete a character: bounded output */
    struct tok_stream s;
    char buf[TOK_STREAM_CAP];
    size_t total = 0;
    tok_stream_init(&s, t, false);
    for (int i = 0; i < 100; i++) {
        int w = tok_stream_push(&s, 3, buf, sizeof buf, &e);  /* "<0x41>" = 'A': valid */
        assert_true(w >= 0);
        total += (size_t)w;
    }
    assert_int_equal(total, 100);
    tok_free(t);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_normalizers),
    cmocka_unit_test(test_pretok_split),
    cmocka_unit_test(test_pretok_others),
    cmocka_unit_test(test_bpe_affixes_unk),
    cmocka_unit_test(test_bpe_byte_fallback),
    cmocka_unit_test(test_added_tokens),
    cmocka_unit_test(test_decoders),
    cmocka_unit_test(test_stream_metaspace),
    cmocka_unit_test(test_hostile_files),
    cmocka_unit_test(test_hostile_texts),
};

TEST_SUITE(tokenizer_parts, tests);
