/*
 * test_tokenizer: the tokenizer against golden encodings captured from HF
 * `tokenizers` 0.23 (tests/fixtures/tokenizers/<name>/golden.json), plus
 * streaming decode, hand-written tokenizers for the less common paths
 * (string merges, Split behaviours, ignore_merges, byte fallback) and
 * corrupt tokenizer.json files that must fail cleanly (ASan checks leaks).
 *
 * Every golden case checks: ids (no special tokens), ids_with_special
 * (post-processor), decode with and without skip_special, and a streamed
 * decode equal to the full one. The six fixtures are committed xz-compressed and
 * decompressed into a temporary folder per test; more tokenizers are
 * checked when MLXCEL_EXTRA_TOKENIZERS lists directories holding an
 * uncompressed tokenizer.json and golden.json, separated by ':'.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ---- */

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static void assert_ids(const int32_t *got, size_t n, const cJSON *want, const char *text)
{
    if ((size_t)cJSON_GetArraySize(want) != n)
        fail_msg("'%s': %zu ids, want %d", text, n, cJSON_GetArraySize(want));
    for (size_t i = 0; i < n; i++) {
        int w = cJSON_GetArrayItem(want, (int)i)->valueint;
        if (got[i] != w)
            fail_msg("'%s': id[%zu] = %d, want %d", text, i, got[i], w);
    }
}

/* True when s is well-formed UTF-8 (no check for overlongs: the decoder
 * only ever copies sequences it validated strictly). */
static bool is_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u < 0x80 ? 0 : *u >= 0xF0 ? 3 : *u >= 0xE0 ? 2 : *u >= 0xC2 ? 1 : -1;
        if (n < 0)
            return false;
        u++;
        for (int i = 0; i < n; i++, u++)
            if ((*u & 0xC0) != 0x80)
                return false;
    }
    return true;
}

/* Decodes ids token by token; every chunk must be complete UTF-8 by itself. */
static char *stream_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    struct tok_stream s;
    struct err e = {0};
    char chunk[TOK_STREAM_CAP];
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    tok_stream_init(&s, t, skip);
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(&s, ids[i], chunk, sizeof chunk, &e)
                      : tok_stream_flush(&s, chunk, sizeof chunk);
        assert_true(w >= 0);
        assert_int_equal(strlen(chunk), (size_t)w);
        assert_true(is_utf8(chunk));
        if (len + (size_t)w + 1 > cap) {
            while (len + (size_t)w + 1 > cap)
                cap *= 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
        memcpy(out + len, chunk, (size_t)w);
        len += (size_t)w;
    }
    out[len] = '\0';
    return out;
}

/* Decompresses dir/tokenizer.json.xz into a fresh temporary folder (with
 * `xz -dc`: the product reads plain JSON; only the committed fixtures are
 * compressed) and loads it with dir/tokenizer_config.json. */
struct tokenizer *test_tok_load_gz(const char *dir)
{
    char tmp[64] = "/tmp/mlxcel_tokgz_XXXXXX", cmd[8400], json[128], cfg[4200];
    struct tokenizer *t = NULL;
    struct err e = {0};
    assert_non_null(mkdtemp(tmp));
    snprintf(json, sizeof json, "%s/tokenizer.json", tmp);
    snprintf(cmd, sizeof cmd, "xz -dc '%s/tokenizer.json.xz' > '%s'", dir, json);
    assert_int_equal(system(cmd), 0);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    int rc = tok_load_files(&t, json, access(cfg, F_OK) == 0 ? cfg : NULL, &e);
    unlink(json);
    rmdir(tmp);
    if (rc < 0)
        fail_msg("tok_load(%s): %s", dir, e.msg);
    return t;
}

/* Runs every encode case of dir/golden.json against t. */
static void check_golden_cases(const struct tokenizer *t, const char *dir)
{
    char path[4096];
    struct err e = {0};
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *gtext = read_text(path, NULL);
    cJSON *g = cJSON_Parse(gtext);
    assert_non_null(g);
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "encode")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n = 0, n_sp = 0;
        char *dec = NULL, *dec_skip = NULL, *st = NULL, *st_skip = NULL;
        if (tok_encode(t, text, strlen(text), false, &ids, &n, &e) < 0)
            fail_msg("%s: encode '%s': %s", dir, text, e.msg);
        assert_ids(ids, n, cJSON_GetObjectItem(c, "ids"), text);
        assert_int_equal(tok_encode(t, text, strlen(text), true, &ids_sp, &n_sp, &e), 0);
        assert_ids(ids_sp, n_sp, cJSON_GetObjectItem(c, "ids_with_special"), text);
        /* decoded / decoded_skip_special are HF's decode of ids */
        assert_int_equal(tok_decode(t, ids, n, false, &dec, &e), 0);
        assert_string_equal(dec, cJSON_GetObjectItem(c, "decoded")->valuestring);
        assert_int_equal(tok_decode(t, ids, n, true, &dec_skip, &e), 0);
        assert_string_equal(dec_skip, cJSON_GetObjectItem(c, "decoded_skip_special")->valuestring);
        st = stream_decode(t, ids, n, false);
        assert_string_equal(st, dec);
        st_skip = stream_decode(t, ids, n, true);
        assert_string_equal(st_skip, dec_skip);
        /* with the post-processor's ids, skip_special gives the same text back */
        char *dsp = NULL, *stsp = NULL;
        assert_int_equal(tok_decode(t, ids_sp, n_sp, true, &dsp, &e), 0);
        assert_string_equal(dsp, dec_skip);
        stsp = stream_decode(t, ids_sp, n_sp, true);
        assert_string_equal(stsp, dec_skip);
        free(dsp);
        free(stsp);
        free(ids);
        free(ids_sp);
        free(dec);
        free(dec_skip);
        free(st);
        free(st_skip);
        n_cases++;
    }
    assert_true(n_cases > 0);
    cJSON_Delete(g);
    free(gtext);
}

/* Runs every encode case of dir/golden.json against dir/tokenizer.json. */
/* The shakespeare tokenizer as plain files in a folder (the trained checkpoint's: the same
 * bytes as tests/fixtures/tokenizers/shakespeare/tokenizer.json.xz unpacked). */
#define SHAKESPEARE_PLAIN "tests/fixtures/models/phixtral-tiny"

static void check_goldens(const char *dir)
{
    struct tokenizer *t = NULL;
    struct err e = {0};
    if (tok_load(&t, dir, &e) < 0)
        fail_msg("tok_load(%s): %s", dir, e.msg);
    check_golden_cases(t, dir);
    tok_free(t);
}

/* ---- goldens ---- */

/* The six committed fixtures (tokenizer.json.xz): byte-level BPE (gpt2,
 * shakespeare, llama3_1 with ignore_merges, qwen3 with NFC) and
 * SentencePiece-style BPE (llama2: Metaspace; mistral_spm: Prepend/Replace
 * normalizer), all with ByteLevel or Replace/ByteFallback/Fuse/Strip decoders. */
static void check_gz_golden(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizers/%s", name);
    const char *dir = test_path(rel);
    struct tokenizer *t = test_tok_load_gz(dir);
    check_golden_cases(t, dir);
    tok_free(t);
}

static void test_golden_shakespeare(void **state)
{
    (void)state;
    check_gz_golden("shakespeare");
    /* the plain file, loaded from a folder as a checkpoint's is: phixtral-tiny's is the same
     * tokenizer (tokenizer.json and tokenizer_config.json byte for byte) */
    struct tokenizer *t = NULL;
    struct err e = {0};
    if (tok_load(&t, test_path(SHAKESPEARE_PLAIN), &e) < 0)
        fail_msg("tok_load(%s): %s", SHAKESPEARE_PLAIN, e.msg);
    check_golden_cases(t, test_path("tests/fixtures/tokenizers/shakespeare"));
    tok_free(t);
}

static void test_golden_gpt2(void **state)
{
    (void)state;
    check_gz_golden("gpt2");
}

static void test_golden_llama2(void **state)
{
    (void)state;
    check_gz_golden("llama2");
}

static void test_golden_mistral_spm(void **state)
{
    (void)state;
    check_gz_golden("mistral_spm");
}

static void test_golden_llama3_1(void **state)
{
    (void)state;
    check_gz_golden("llama3_1");
}

static void test_golden_qwen3(void **state)
{
    (void)state;
    check_gz_golden("qwen3");
}

static void test_golden_extra(void **state)
{
    (void)state;
    const char *env = getenv("MLXCEL_EXTRA_TOKENIZERS");
    if (!env || !*env)
        skip();
    char *list = strdup(env), *save = NULL;
    assert_non_null(list);
    for (char *d = strtok_r(list, ":", &save); d; d = strtok_r(NULL, ":", &save))
        check_goldens(d);
    free(list);
}

static void test_accessors(void **state)
{
    (void)state;
    struct tokenizer *t = NULL;
    struct err e = {0};
    assert_int_equal(tok_load(&t, test_path(SHAKESPEARE_PLAIN), &e), 0);
    assert_int_equal(tok_vocab_size(t), 2048);
    assert_int_equal(tok_bos_id(t), 0);
    assert_int_equal(tok_eos_id(t), 0);
    assert_string_equal(tok_id_to_piece(t, 0), "<|endoftext|>");
    assert_true(tok_is_special(t, 4));
    assert_false(tok_is_special(t, 100));
    assert_null(tok_id_to_piece(t, 2048));
    assert_null(tok_id_to_piece(t, -1));
    assert_int_equal(tok_piece_to_id(t, "<|end|>"), 4);
    assert_int_equal(tok_piece_to_id(t, "\xC4\xA0"), 225); /* "Ġ" is the byte-level space */
    assert_int_equal(tok_piece_to_id(t, "no such piece"), -1);
    tok_free(t);
    tok_free(NULL);
}

/* ---- streaming ---- */

/* Pushing one byte token at a time (each UTF-8 character split across
 * tokens) must emit only complete characters and rebuild the text. */
static void test_stream_bytewise(void **state)
{
    (void)state;
    static const char text[] = "h\xC3\xA9llo \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD \xE4\xB8\xAD\xE6\x96\x87!";
    struct tokenizer *t = NULL;
    struct err e = {0};
    t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/gpt2"));
    int32_t ids[sizeof text];
    size_t n = 0;
    for (size_t i = 0; i + 1 < sizeof text; i++) {
        /* The byte-level piece for byte b: printable ASCII maps to itself;
         * others go through encode of that single byte's character. */
        int32_t *one = NULL;
        size_t n_one = 0;
        unsigned char b = (unsigned char)text[i];
        if (b < 0x80) {
            assert_int_equal(tok_encode(t, text + i, 1, false, &one, &n_one, &e), 0);
            assert_int_equal(n_one, 1);
            ids[n++] = one[0];
            free(one);
            continue;
        }
        /* Byte-level code points for 0x80..0xFF: 0xA1..0xAC, 0xAE..0xFF map to
         * themselves; the rest to U+0100 + k (see tables.c). */
        int cp = b;
        if (!((b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
            int k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE))
                    k++;
            cp = 256 + k;
        }
        char piece[3] = {(char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)), 0};
        ids[n] = tok_piece_to_id(t, piece);
        assert_true(ids[n] >= 0);
        n++;
    }
    char *full = NULL;
    assert_int_equal(tok_decode(t, ids, n, false, &full, &e), 0);
    assert_string_equal(full, text);
    char *st = stream_decode(t, ids, n, false);
    assert_string_equal(st, text);
    /* Chunks are complete characters: the first byte of the emoji emits nothing. */
    struct tok_stream s;
    char chunk[TOK_STREAM_CAP];
    tok_stream_init(&s, t, false);
    assert_int_equal(tok_stream_push(&s, ids[7], chunk, sizeof chunk, &e), 0);  /* F0 */
    assert_int_equal(tok_stream_push(&s, ids[8], chunk, sizeof chunk, &e), 0);  /* 9F */
    assert_int_equal(tok_stream_push(&s, ids[9], chunk, sizeof chunk, &e), 0);  /* 91 */
    assert_int_equal(tok_stream_push(&s, ids[10], chunk, sizeof chunk, &e), 4); /* 8B */
    assert_memory_equal(chunk, "\xF0\x9F\x91\x8B", 5);
    /* A cut character followed by ASCII becomes U+FFFD, as in tok_decode. */
    assert_int_equal(tok_stream_push(&s, ids[7], chunk, sizeof chunk, &e), 0);
    assert_int_equal(tok_stream_push(&s, ids[0], chunk, sizeof chunk, &e), 4);
    assert_string_equal(chunk, "\xEF\xBF\xBDh");
    /* A lone continuation byte waits (the text ends in U+FFFD) and comes
     * out with the next token. */
    assert_int_equal(tok_stream_push(&s, ids[9], chunk, sizeof chunk, &e), 0);
    assert_int_equal(tok_stream_push(&s, ids[0], chunk, sizeof chunk, &e), 4);
    assert_string_equal(chunk, "\xEF\xBF\xBDh");
    /* Pending bytes at the end flush as one U+FFFD. */
    assert_int_equal(tok_stream_push(&s, ids[7], chunk, sizeof chunk, &e), 0);
    assert_int_equal(tok_stream_push(&s, ids[8], chunk, sizeof chunk, &e), 0);
    assert_int_equal(tok_stream_flush(&s, chunk, sizeof chunk), 3);
    assert_string_equal(chunk, "\xEF\xBF\xBD");
    assert_int_equal(tok_stream_flush(&s, chunk, sizeof chunk), 0);
    /* Garbage that never completes is emitted once the window is full. */
    int total = 0;
    for (int i = 0; i < TOK_STREAM_WINDOW + 2; i++) {
        int w = tok_stream_push(&s, ids[9], chunk, sizeof chunk, &e);
        assert_true(w >= 0);
        total += w;
    }
    assert_true(total > 0);
    assert_true(tok_stream_flush(&s, chunk, sizeof chunk) >= 0);
    /* The same ids through tok_decode. */
    int32_t seq[] = {ids[7], ids[0], ids[9], ids[7], ids[8]};
    char *d = NULL;
    assert_int_equal(tok_decode(t, seq, 5, false, &d, &e), 0);
    assert_string_equal(d, "\xEF\xBF\xBDh\xEF\xBF\xBD\xEF\xBF\xBD");
    /* Errors leave the stream alone. */
    assert_int_equal(tok_stream_push(&s, 50257, chunk, sizeof chunk, &e), -ERR_RANGE);
    assert_int_equal(tok_stream_push(&s, -1, chunk, sizeof chunk, &e), -ERR_RANGE);
    free(d);
    free(full);
    free(st);
    tok_free(t);
}

/* ---- encode/decode edges ---- */

static void test_encode_errors(void **state)
{
    (void)state;
    struct tokenizer *t = NULL;
    struct err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;
    t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/gpt2"));
    assert_int_equal(tok_encode(t, "ab\xC3(", 4, false, &ids, &n, &e), -ERR_ARG);
    assert_non_null(strstr(e.msg, "byte 2"));
    assert_null(ids);
    assert_int_equal(tok_encode(t, "\xED\xA0\x80", 3, false, &ids, &n, &e), -ERR_ARG);  /* surrogate */
    assert_int_equal(tok_encode(t, "\xC0\xAF", 2, false, &ids, &n, &e), -ERR_ARG);      /* overlong */
    size_t big = ((size_t)64 << 20) + 1;
    char *huge = calloc(big, 1);  /* untouched pages: the length is refused first */
    assert_non_null(huge);
    assert_int_equal(tok_encode(t, huge, big, false, &ids, &n, &e), -ERR_RANGE);
    free(huge);
    /* Empty text: no ids, but a valid array. */
    assert_int_equal(tok_encode(t, "", 0, true, &ids, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    int32_t bad[] = {15496, 50257};
    assert_int_equal(tok_decode(t, bad, 2, false, &out, &e), -ERR_RANGE);
    assert_null(out);
    tok_free(t);
}

/* A word far longer than any vocab piece (the merge loop must stay fast;
 * past 256 KiB it is cut into pieces) round-trips, and NUL bytes inside
 * the text are ordinary bytes. */
static void test_encode_long_word(void **state)
{
    (void)state;
    struct tokenizer *t = NULL;
    struct err e = {0};
    size_t len = 300000;
    char *text = malloc(len + 1);
    assert_non_null(text);
    for (size_t i = 0; i < len; i++)
        text[i] = "abcdefghij"[i % 7];
    text[len] = '\0';
    t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/gpt2"));
    int32_t *ids = NULL;
    size_t n = 0;
    char *dec = NULL;
    assert_int_equal(tok_encode(t, text, len, false, &ids, &n, &e), 0);
    assert_true(n > 0 && n < len);
    assert_int_equal(tok_decode(t, ids, n, false, &dec, &e), 0);
    assert_string_equal(dec, text);
    free(ids);
    free(dec);
    assert_int_equal(tok_encode(t, "a\0b", 3, false, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    free(ids);
    tok_free(t);
    free(text);
}

/* Long texts go through a per-call word cache, including the path where it
 * is full: the ids must equal those of each word encoded on its own. */
static void test_encode_cache(void **state)
{
    (void)state;
    struct tokenizer *t = NULL;
    struct err e = {0};
    size_t cap = 200000, len = 0, n_want = 0, cap_want = 1 << 16;
    char *text = malloc(cap);
    int32_t *want = malloc(cap_want * sizeof *want);
    assert_non_null(text);
    assert_non_null(want);
    t = test_tok_load_gz(test_path("tests/fixtures/tokenizers/gpt2"));
    /* 12000 distinct words (more than the cache holds) plus repeats. */
    for (int i = 0; i < 12000; i++) {
        char word[64];
        int wl = i % 5 ? snprintf(word, sizeof word, " w%d", i)
                       : snprintf(word, sizeof word, " na\xC3\xAFve \xE4\xB8\xAD\xF0\x9F\x91\x8B");
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(tok_encode(t, word, (size_t)wl, false, &ids, &n, &e), 0);
        assert_true(n_want + n <= cap_want && len + (size_t)wl < cap);
        memcpy(want + n_want, ids, n * sizeof *ids);
        n_want += n;
        memcpy(text + len, word, (size_t)wl);
        len += (size_t)wl;
        free(ids);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tok_encode(t, text, len, false, &ids, &n, &e), 0);
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, n * sizeof *ids);
    free(ids);
    free(want);
    free(text);
    tok_free(t);
}

/* ---- hand-written tokenizers ---- */

struct tmpdir {
    char dir[64];
    char json[128];
    char config[128];
};

static void tmpdir_make(struct tmpdir *d)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/mlxcel_tok_XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->json, sizeof d->json, "%s/tokenizer.json", d->dir);
    snprintf(d->config, sizeof d->config, "%s/tokenizer_config.json", d->dir);
}

static void tmpdir_remove(struct tmpdir *d)
{
    unlink(d->json);
    unlink(d->config);
    rmdir(d->dir);
}

/* Loads a tokenizer.json given as text; returns the tok_load status. */
static int load_text(struct tmpdir *d, const char *json, struct tokenizer **t, struct err *e)
{
    write_text(d->json, json);
    return tok_load(t, d->dir, e);
}

static void expect_ids(const struct tokenizer *t, const char *text, const int32_t *want, size_t n)
{
    struct err e = {0};
    int32_t *ids = NULL;
    size_t got = 0;
    assert_int_equal(tok_encode(t, text, strlen(text), false, &ids, &got, &e), 0);
    if (got != n)
        fail_msg("'%s': %zu ids, want %zu", text, got, n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] != want[i])
            fail_msg("'%s': id[%zu] = %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}

#define TINY_VOCAB "{\"a\":0,\"b\":1,\"ab\":2,\"c\":3,\"abc\":4,\"-\":5,\"a-\":6,\"-a\":7,\"--\":8}"

static void test_merges_string_and_pair(void **state)
{
    (void)state;
    struct tmpdir d;
    struct tokenizer *t = NULL;
    struct err e = {0};
    tmpdir_make(&d);
    assert_int_equal(load_text(&d, "{\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                                   ",\"merges\":[\"a b\",\"ab c\"]}}", &t, &e), 0);
    expect_ids(t, "abcabc", (const int32_t[]){4, 4}, 2);
    expect_ids(t, "abcabbc", (const int32_t[]){4, 2, 1, 3}, 4);
    tok_free(t);
    assert_int_equal(load_text(&d, "{\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                                   ",\"merges\":[[\"a\",\"b\"]]}}", &t, &e), 0);
    expect_ids(t, "abcabc", (const int32_t[]){2, 3, 2, 3}, 4);
    expect_ids(t, "ababc", (const int32_t[]){2, 2, 3}, 3);
    tok_free(t);
    tmpdir_remove(&d);
}

static void test_split_behaviors(void **state)
{
    (void)state;
    static const struct {
        const char *behavior;
        const char *text;
        int32_t ids[6];
        size_t n;
    } k_cases[] = {
        {"Isolated", "a-a", {0, 5, 0}, 3},
        {"Removed", "a-a", {0, 0}, 2},
        {"MergedWithPrevious", "a-a", {6, 0}, 2},
        {"MergedWithNext", "a-a", {0, 7}, 2},
        {"Contiguous", "a--a", {0, 8, 0}, 3},
    };
    struct tmpdir d;
    tmpdir_make(&d);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        char json[1024];
        struct tokenizer *t = NULL;
        struct err e = {0};
        snprintf(json, sizeof json,
                 "{\"model\":{\"type\":\"BPE\",\"vocab\":" TINY_VOCAB
                 ",\"merges\":[\"a -\",\"- a\",\"- -\"]},"
                 "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},"
                 "\"behavior\":\"%s\",\"invert\":false}}",
                 k_cases[i].behavior);
        if (load_text(&d, json, &t, &e) < 0)
            fail_msg("%s: %s", k_cases[i].behavior, e.msg);
        expect_ids(t, k_cases[i].text, k_cases[i].ids, k_cases[i].n);
        tok_free(t);
    }
    tmpdir_remove(&d);
}

/* ignore_merges, byte_fallback, unk, added-token flags, NFKC, template and
 * tokenizer_config.json add_bos_token. */
static void test_model_options(void **state)
{
    (void)state;
    struct tmpdir d;
    struct tokenizer *t = NULL;
    struct err e = {0};
    tmpdir_make(&d);
    /* ignore_merges: "abc" is in the vocab, so no merge ever runs on it. */
    assert_int_equal(load_text(&d, "{\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":"
                                   TINY_VOCAB ",\"merges\":[]}}", &t, &e), 0);
    expect_ids(t, "abc", (const int32_t[]){4}, 1);
    expect_ids(t, "abca", (const int32_t[]){0, 1, 3, 0}, 4);
    tok_free(t);
    /* byte_fallback for unknown characters, unk (fused) otherwise. */
    assert_int_equal(load_text(&d, "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,"
                                   "\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"vocab\":"
                                   "{\"<unk>\":0,\"a\":1,\"<0xC3>\":2,\"<0xA9>\":3},\"merges\":[]}}",
                               &t, &e), 0);
    expect_ids(t, "a\xC3\xA9", (const int32_t[]){1, 2, 3}, 3);
    expect_ids(t, "a\xE2\x82\xAC\xE2\x82\xAC" "a", (const int32_t[]){1, 0, 1}, 3);
    tok_free(t);
    /* Added tokens: lstrip/rstrip eat spaces, single_word needs word boundaries,
     * normalized ones match after NFKC; template adds BOS/EOS; config's
     * add_bos_token does not add a second BOS. */
    write_text(d.config, "{\"bos_token\":{\"content\":\"<s>\"},\"eos_token\":\"</s>\","
                         "\"add_bos_token\":true}");
    assert_int_equal(load_text(&d,
        "{\"added_tokens\":["
        "{\"id\":10,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":11,\"content\":\"</s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":12,\"content\":\"<x>\",\"special\":false,\"lstrip\":true,\"rstrip\":true,"
        "\"normalized\":false},"
        "{\"id\":13,\"content\":\"ab\",\"special\":false,\"single_word\":true,\"normalized\":false},"
        "{\"id\":14,\"content\":\"fi\",\"special\":false,\"normalized\":true}],"
        "\"normalizer\":{\"type\":\"NFKC\"},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
        "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
        "{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}],\"special_tokens\":{"
        "\"<s>\":{\"id\":\"<s>\",\"ids\":[10],\"tokens\":[\"<s>\"]},"
        "\"</s>\":{\"id\":\"</s>\",\"ids\":[11],\"tokens\":[\"</s>\"]}}},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\" \":2,\"f\":3,\"i\":4,\"ab\":5,"
        "\"<s>\":10,\"</s>\":11},\"merges\":[\"a b\"]}}", &t, &e), 0);
    assert_int_equal(tok_bos_id(t), 10);
    assert_int_equal(tok_eos_id(t), 11);
    expect_ids(t, "a <x> b", (const int32_t[]){0, 12, 1}, 3);
    expect_ids(t, "ab a ab", (const int32_t[]){13, 2, 0, 2, 13}, 5);
    expect_ids(t, "abab", (const int32_t[]){5, 5}, 2);
    expect_ids(t, "\xEF\xAC\x81", (const int32_t[]){14}, 1);  /* U+FB01 ligature -> "fi" */
    expect_ids(t, "<s>a</s>", (const int32_t[]){10, 0, 11}, 3);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tok_encode(t, "a", 1, true, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 10);
    assert_int_equal(ids[1], 0);
    assert_int_equal(ids[2], 11);
    free(ids);
    char *out = NULL;
    int32_t seq[] = {10, 0, 12, 11};
    /* No decoder: HF joins the tokens with " ". */
    assert_int_equal(tok_decode(t, seq, 4, true, &out, &e), 0);
    assert_string_equal(out, "a <x>");
    free(out);
    tok_free(t);
    /* An explicit add_bos_token / add_eos_token = false takes them out of
     * the template, as transformers' Llama tokenizers rebuild it. */
    write_text(d.config, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":false}");
    assert_int_equal(tok_load(&t, d.dir, &e), 0);
    assert_int_equal(tok_encode(t, "a", 1, true, &ids, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 11);
    free(ids);
    tok_free(t);
    write_text(d.config, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_eos_token\":false}");
    assert_int_equal(tok_load(&t, d.dir, &e), 0);
    assert_int_equal(tok_encode(t, "a", 1, true, &ids, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 10);
    assert_int_equal(ids[1], 0);
    free(ids);
    tok_free(t);
    tmpdir_remove(&d);
}

/* ---- corrupt input ---- */

static void test_corrupt(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int code;
        const char *in_msg;
    } k_cases[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}", -ERR_FORMAT, "not valid JSON"},
        {"[1, 2]", -ERR_FORMAT, "not a JSON object"},
        {"{\"version\": \"1.0\"}", -ERR_FORMAT, "model"},
        {"{\"model\": {\"type\": \"WordPieceX\", \"vocab\": {\"a\": 0}}}", -ERR_UNSUPPORTED, "WordPieceX"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]], \"unk_id\": 1}}", -ERR_FORMAT, "unk_id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", -ERR_FORMAT, "empty"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", -ERR_FORMAT, "id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 16777216}}}", -ERR_FORMAT, "id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1.5}}}", -ERR_FORMAT, "id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}}}", -ERR_FORMAT, "id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1000000}}}", -ERR_FORMAT, "sparse"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}", -ERR_FORMAT, "twice"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}}}", -ERR_FORMAT, "twice"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a z\"]}}", -ERR_FORMAT, "'z'"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}", -ERR_FORMAT, "merged"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"aa\"]}}", -ERR_FORMAT, "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", -ERR_FORMAT, "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": 3}}", -ERR_FORMAT, "merges"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"dropout\": \"x\"}}", -ERR_FORMAT, "dropout"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}}",
         -ERR_UNSUPPORTED, "UnicodeScripts"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}", -ERR_UNSUPPORTED, "regex"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"Precompiled\"}}",
         -ERR_FORMAT, "precompiled_charsmap"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"decoder\": {\"type\": \"WordPiece\", \"prefix\": 3}}",
         -ERR_FORMAT, "WordPiece"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}",
         -ERR_FORMAT, "content"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"content\": \"x\"}]}",
         -ERR_FORMAT, "added_tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": {}}", -ERR_FORMAT,
         "added_tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"post_processor\": {\"type\": "
         "\"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], "
         "\"special_tokens\": {\"<s>\": {\"ids\": [99]}}}}", -ERR_FORMAT, "out of range"},
    };
    struct tmpdir d;
    tmpdir_make(&d);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        struct tokenizer *t = (struct tokenizer *)&d;  /* must be reset to NULL */
        struct err e = {0};
        int rc = load_text(&d, k_cases[i].json, &t, &e);
        if (rc != k_cases[i].code || !strstr(e.msg, k_cases[i].in_msg))
            fail_msg("case %zu: rc %d (%s), want %d with '%s'", i, rc, e.msg, k_cases[i].code,
                     k_cases[i].in_msg);
        assert_null(t);
    }
    tmpdir_remove(&d);
}

/* A piece longer than TOK_PIECE_MAX, a truncated real file, a missing
 * file and an invalid tokenizer_config.json. */
static void test_corrupt_files(void **state)
{
    (void)state;
    struct tmpdir d;
    struct tokenizer *t = NULL;
    struct err e = {0};
    tmpdir_make(&d);
    char *json = malloc(TOK_PIECE_MAX + 128);
    assert_non_null(json);
    int n = snprintf(json, 128, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"");
    memset(json + n, 'x', TOK_PIECE_MAX + 1);
    strcpy(json + n + TOK_PIECE_MAX + 1, "\": 0}}}");
    assert_int_equal(load_text(&d, json, &t, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "bytes (max"));
    assert_null(t);
    free(json);

    size_t len = 0;
    char *real = read_text(test_path(SHAKESPEARE_PLAIN "/tokenizer.json"), &len);
    real[len / 2] = '\0';
    assert_int_equal(load_text(&d, real, &t, &e), -ERR_FORMAT);
    assert_null(t);
    free(real);

    unlink(d.json);
    assert_int_equal(tok_load(&t, d.dir, &e), -ERR_MISSING);
    assert_non_null(strstr(e.msg, d.json));
    assert_null(t);

    write_text(d.config, "{\"bos_token\": ");
    char *good = read_text(test_path(SHAKESPEARE_PLAIN "/tokenizer.json"), NULL);
    assert_int_equal(load_text(&d, good, &t, &e), -ERR_FORMAT);
    assert_non_null(strstr(e.msg, "tokenizer_config.json"));
    assert_null(t);
    free(good);
    tmpdir_remove(&d);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_golden_shakespeare),
    cmocka_unit_test(test_golden_gpt2),
    cmocka_unit_test(test_golden_llama2),
    cmocka_unit_test(test_golden_mistral_spm),
    cmocka_unit_test(test_golden_llama3_1),
    cmocka_unit_test(test_golden_qwen3),
    cmocka_unit_test(test_golden_extra),
    cmocka_unit_test(test_accessors),
    cmocka_unit_test(test_stream_bytewise),
    cmocka_unit_test(test_encode_errors),
    cmocka_unit_test(test_encode_long_word),
    cmocka_unit_test(test_encode_cache),
    cmocka_unit_test(test_merges_string_and_pair),
    cmocka_unit_test(test_split_behaviors),
    cmocka_unit_test(test_model_options),
    cmocka_unit_test(test_corrupt),
    cmocka_unit_test(test_corrupt_files),
};

TEST_SUITE(tokenizer, tests);
