/*
 * hub suite: the pure parts of the Hub client (src/hub/hub_names.c) and the
 * sha256 it verifies downloads with. The network side is covered by
 * tests/cli/pull.sh against tests/hub/fakehub.mjs.
 *   repo_names      owner/name by the Hub's rules; path tricks refused
 *   revisions       branches, tags, refs/pr/N, commits; "..", "/x" refused
 *   file_names      names from a listing that could leave the snapshot
 *   default_set     what a pull fetches without --include
 *   include_exclude --include replaces the default set, --exclude wins
 *   listing         a well-formed listing: commit, sorted files, sizes, sha256
 *   listing_hostile unsafe names, duplicates, file-and-folder, bad sizes,
 *                   bad hashes, wrong shapes, invalid JSON: each an error
 *   sha256_vectors  FIPS 180-4 vectors, whole and fed a byte at a time
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "hub/hub.h"
#include "test.h"

static void repo_names(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "mlx-community/Qwen3-4B-4bit", "a/b", "Org_1/model.v2", "meta-llama/Llama-3.2-1B-Instruct",
    };
    static const char *const bad[] = {
        "", "abc", "a/b/c", "/b", "a/", "../x", "a/..", "a--b/c", "a/b..c", "-a/b", "a/b-", ".a/b",
        "a b/c", "a/b\n", "a/b%2F", "a\\b/c", "owner/na:me",
    };
    struct err e = {0};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(hub_repo_check(ok[i], &e), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear(&e);
        assert_int_equal(hub_repo_check(bad[i], &e), -ERR_ARG);
        assert_true(e.msg[0] != '\0');
    }
    char long_name[120];
    memset(long_name, 'x', sizeof long_name);
    long_name[0] = 'o', long_name[1] = '/';
    long_name[2 + 97] = '\0';
    assert_int_equal(hub_repo_check(long_name, NULL), -ERR_ARG);
    long_name[2 + 96] = '\0';
    assert_int_equal(hub_repo_check(long_name, NULL), 0);
}

static void revisions(void **state)
{
    (void)state;
    static const char *const ok[] = {"main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"};
    static const char *const bad[] = {"", "../x", "/main", "a//b", "a/", "a b", ".hidden", "a/.b", "a\nb", "x?y"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(hub_revision_check(ok[i], NULL), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(hub_revision_check(bad[i], NULL), -ERR_ARG);
}

static void file_names(void **state)
{
    (void)state;
    static const char *const ok[] = {"config.json", "sub/dir/model.safetensors", "a.b..c", "..a", "a..",
                                     "tokenizer.json", "with space.txt"};
    static const char *const bad[] = {"", "/abs", "../x", "a/../b", "a/./b", "./a", "a//b", "a/", "..", ".",
                                      "a\\b", "a\nb", "a\x7f", "sub/.."};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_true(hub_name_is_safe(ok[i]));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(hub_name_is_safe(bad[i]));
    char big[HUB_NAME_MAX + 8];
    memset(big, 'a', 300);
    big[300] = '\0';
    assert_false(hub_name_is_safe(big));  /* a component over 255 bytes */
    for (size_t i = 0; i < HUB_NAME_MAX; i++)
        big[i] = i % 100 == 99 ? '/' : 'a';
    big[HUB_NAME_MAX] = '\0';
    assert_false(hub_name_is_safe(big));  /* the whole name too long */
    big[HUB_NAME_MAX - 2] = '\0';
    assert_true(hub_name_is_safe(big));
}

static void default_set(void **state)
{
    (void)state;
    static const char *const yes[] = {
        "model.safetensors", "model-00001-of-00002.safetensors", "sub/consolidated.safetensors",
        "model.safetensors.index.json", "config.json", "tokenizer.json", "tokenizer_config.json",
        "tokenizer.model", "chat_template.jinja", "README.md", "merges.txt", "vocab.txt", "qwen.tiktoken",
    };
    static const char *const no[] = {
        "pytorch_model.bin", "model.gguf", "onnx/model.onnx", "flax_model.msgpack", "images/logo.png",
        "consolidated.pth", ".gitattributes", "tf_model.h5", "photo.jpg",
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        assert_true(hub_name_is_default(yes[i]));
        assert_true(hub_name_is_wanted(yes[i], NULL, 0, NULL, 0));
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(hub_name_is_wanted(no[i], NULL, 0, NULL, 0));
}

static void include_exclude(void **state)
{
    (void)state;
    const char *inc[] = {"*.json", "pytorch_model.bin"}, *exc[] = {"golden.json", "sub/*"};
    assert_true(hub_name_is_wanted("config.json", inc, 2, exc, 2));
    assert_true(hub_name_is_wanted("pytorch_model.bin", inc, 2, exc, 2));
    assert_false(hub_name_is_wanted("golden.json", inc, 2, exc, 2));
    assert_false(hub_name_is_wanted("model.safetensors", inc, 2, exc, 2));  /* include replaces the default */
    assert_false(hub_name_is_wanted("sub/x.json", inc, 2, exc, 2));
    assert_true(hub_name_is_wanted("deep/x.json", inc, 2, exc, 2));         /* '*' crosses '/' as in fnmatch */
    assert_false(hub_name_is_wanted("model.safetensors", NULL, 0, (const char *[]){"*.safetensors"}, 1));
    assert_true(hub_name_is_wanted("config.json", NULL, 0, (const char *[]){"*.safetensors"}, 1));
}

#define SHA40 "0123456789abcdef0123456789abcdef01234567"
#define SHA64 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static int parse(struct hub_listing *l, const char *doc, struct err *e)
{
    err_clear(e);
    return hub_listing_parse(l, doc, strlen(doc), e);
}

static void listing(void **state)
{
    (void)state;
    struct hub_listing l;
    struct err e = {0};
    const char *doc = "{\"id\":\"a/b\",\"sha\":\"" SHA40 "\",\"siblings\":["
                      "{\"rfilename\":\"tokenizer.json\",\"size\":10,\"blobId\":\"" SHA40 "\"},"
                      "{\"rfilename\":\"model.safetensors\",\"size\":100,"
                      "\"lfs\":{\"sha256\":\"" SHA64 "\",\"size\":100,\"pointerSize\":134}},"
                      "{\"rfilename\":\"sub/config.json\"}]}";
    assert_int_equal(parse(&l, doc, &e), 0);
    assert_string_equal(l.commit, SHA40);
    assert_int_equal(l.n_files, 3);
    hub_listing_deinit(&l);
    /* an escaped backslash followed by "u0000" is text, not a NUL (the card may hold it) */
    const char *text = "{\"sha\":\"" SHA40 "\",\"cardData\":{\"x\":\"c:\\\\u0000\"},\"siblings\":[]}";
    assert_int_equal(parse(&l, text, &e), 0);
    hub_listing_deinit(&l);
    assert_int_equal(parse(&l, doc, &e), 0);
    assert_string_equal(l.files[0].name, "model.safetensors");  /* sorted */
    assert_int_equal(l.files[0].size, 100);
    assert_string_equal(l.files[0].sha256, SHA64);
    assert_string_equal(l.files[1].name, "sub/config.json");
    assert_int_equal(l.files[1].size, -1);                     /* no size: the HEAD gives it */
    assert_string_equal(l.files[2].sha256, "");
    hub_listing_deinit(&l);
    assert_int_equal(parse(&l, "{\"sha\":\"" SHA40 "\",\"siblings\":[]}", &e), 0);
    assert_int_equal(l.n_files, 0);
    hub_listing_deinit(&l);
}

static void listing_hostile(void **state)
{
    (void)state;
#define SIB(x) "{\"sha\":\"" SHA40 "\",\"siblings\":[" x "]}"
    static const struct { const char *doc, *msg; } k_bad[] = {
        {SIB("{\"rfilename\":\"../x.json\"}"), "unsafe file name '../x.json'"},
        {SIB("{\"rfilename\":\"/etc/x.json\"}"), "unsafe file name"},
        {SIB("{\"rfilename\":\"a/../../x\"}"), "unsafe file name"},
        {SIB("{\"rfilename\":\"a\"},{\"rfilename\":\"a\"}"), "listed twice"},
        {SIB("{\"rfilename\":\"a\"},{\"rfilename\":\"a-b\"},{\"rfilename\":\"a/b\"}"), "both a file and a folder"},
        {SIB("{\"rfilename\":\"a\",\"size\":-1}"), "size outside"},
        {SIB("{\"rfilename\":\"a\",\"size\":1e18}"), "size outside"},
        {SIB("{\"rfilename\":\"a\",\"size\":1.5}"), "size outside"},
        {SIB("{\"rfilename\":\"a\",\"size\":\"10\"}"), "size outside"},
        {SIB("{\"rfilename\":\"a\",\"size\":10,\"lfs\":{\"sha256\":\"" SHA64 "\",\"size\":11}}"), "two sizes"},
        {SIB("{\"rfilename\":\"a\",\"lfs\":{\"sha256\":\"xyz\"}}"), "valid sha256"},
        {SIB("{\"rfilename\":\"a\",\"lfs\":{}}"), "valid sha256"},
        {SIB("{\"rfilename\":\"config.json\\u0000../../x\"}"), "NUL character"},
        {SIB("{\"rfilename\":\"a\\u0001b\"}"), "unsafe file name"},
        {SIB("{\"rfilename\":\"a\\\\..\\\\x\"}"), "unsafe file name"},
        {SIB("{\"rfilename\":\"a\\u002f..\\u002fx\"}"), "unsafe file name"},
        {SIB("{\"rfilename\":7}"), "rfilename"},
        {SIB("{}"), "rfilename"},
        {"{\"sha\":\"abc\",\"siblings\":[]}", "commit hash"},
        {"{\"sha\":\"" SHA40 "\",\"siblings\":{}}", "not an array"},
        {"{\"siblings\":[]}", "commit hash"},
        {"{\"sha\": \"abc\", ", "not valid JSON"},
        {"{\"sha\":\"" SHA40 "\",\"siblings\":[]} junk", "not valid JSON"},
        {"[]", "not a JSON object"},
    };
#undef SIB
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        struct hub_listing l;
        struct err e = {0};
        int rc = parse(&l, k_bad[i].doc, &e);
        if (rc >= 0 || !strstr(e.msg, k_bad[i].msg))
            fail_msg("listing %zu (%s): rc %d, message '%s', want '%s'", i, k_bad[i].doc, rc, e.msg, k_bad[i].msg);
        assert_null(l.files);
        assert_int_equal(l.n_files, 0);
    }
}

static void sha256_vectors(void **state)
{
    (void)state;
    struct sha256 s;
    char hex[65];
    sha256_init(&s);
    sha256_final_hex(&s, hex);
    assert_string_equal(hex, SHA64);
    sha256_init(&s);
    sha256_update(&s, "abc", 3);
    sha256_final_hex(&s, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  /* 56 bytes: two pad blocks */
    sha256_init(&s);
    for (size_t i = 0; i < strlen(m); i++)
        sha256_update(&s, m + i, 1);
    sha256_final_hex(&s, hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *a = malloc(1000000);
    assert_non_null(a);
    memset(a, 'a', 1000000);
    sha256_init(&s);
    sha256_update(&s, a, 1);
    sha256_update(&s, a, 999999);
    sha256_final_hex(&s, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(repo_names),     cmocka_unit_test(revisions),       cmocka_unit_test(file_names),
    cmocka_unit_test(default_set),    cmocka_unit_test(include_exclude), cmocka_unit_test(listing),
    cmocka_unit_test(listing_hostile), cmocka_unit_test(sha256_vectors),
};

TEST_SUITE(hub, tests);
