/*
 * fuzz_tokenizer: libFuzzer target for tokenizer.json loading. The input is
 * the whole tokenizer.json (written to a temporary file, as the loader reads
 * files); when it loads, a fixed mixed-script text is encoded, decoded in
 * one go and streamed token by token, and encoded as a pair with
 * truncation. Any crash, leak or undefined behaviour is a bug; so is a streamed decode that disagrees with the full decode
 * when that holds no U+FFFD (the stream and tok_decode may differ only for
 * invalid byte runs, see decode.c).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"

#define TOK_POST_MAX_PUBLIC 8  /* TOK_POST_MAX of tok_impl.h */

static const char k_text[] = "Hello, world! It's 2026: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80  end.\n";

/* The pair's ids without truncation, with or without the post-processor's special tokens
 * (-1 where it does not encode). */
static long pair_len(const struct tokenizer *t, bool special)
{
    struct tok_encode_opts o = {.add_special = special};
    struct tok_encoding enc;
    if (tok_encode_pair(t, k_text, 12, k_text + 12, sizeof k_text - 13, &o, &enc, NULL) != 0)
        return -1;
    long n = (long)enc.n;
    tok_encoding_deinit(&enc);
    return n;
}

/* The text as a (query, document) pair, truncated to a few lengths: a cut pair holds at
 * most max_length ids, specials included. Where the specials alone are more than
 * max_length, tokenizers cuts nothing (its usize subtraction wraps, post.c), so neither do
 * we and there is no bound to check. */
static void exercise_pair(const struct tokenizer *t)
{
    static const size_t k_max[] = {0, 1, 5, 12};
    long with = pair_len(t, true), without = pair_len(t, false);
    long specials = with >= 0 && without >= 0 ? with - without : -1;
    if (specials > 2 * TOK_POST_MAX_PUBLIC + 2)
        abort();
    for (size_t i = 0; i < sizeof k_max / sizeof k_max[0]; i++) {
        struct tok_encode_opts o = {.add_special = true, .max_length = k_max[i],
                                    .strategy = (enum tok_trunc)(i % 3)};
        struct tok_encoding enc;
        if (tok_encode_pair(t, k_text, 12, k_text + 12, sizeof k_text - 13, &o, &enc, NULL) == 0) {
            if (k_max[i] > 0 && specials >= 0 && (size_t)specials <= k_max[i] && enc.n > k_max[i])
                abort();
            tok_encoding_deinit(&enc);
        }
    }
}

static void exercise(const struct tokenizer *t)
{
    exercise_pair(t);
    int32_t *ids = NULL;
    size_t n = 0;
    char *full = NULL;
    if (tok_encode(t, k_text, sizeof k_text - 1, true, &ids, &n, NULL) < 0)
        return;
    if (tok_decode(t, ids, n, false, &full, NULL) == 0) {
        struct tok_stream s;
        char buf[TOK_STREAM_CAP];
        size_t off = 0, len = strlen(full);
        bool exact = !strstr(full, "\xEF\xBF\xBD");
        tok_stream_init(&s, t, false);
        for (size_t i = 0; i < n; i++) {
            int w = tok_stream_push(&s, ids[i], buf, sizeof buf, NULL);
            if (w < 0)
                break;
            if (exact && (off + (size_t)w > len || memcmp(full + off, buf, (size_t)w) != 0))
                abort();
            off += (size_t)w;
        }
    }
    free(full);
    free(ids);
}

/* The input is written to a real file in a folder made once: the loader
 * follows a symlink only when it resolves inside its folder, and a memfd's
 * /proc/self/fd/N link resolves to "/memfd:... (deleted)", so every load of
 * one failed (the fuzzer then only ever saw the first error path). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[] = "/tmp/fuzz_tokenizer_XXXXXX";
    static char path[sizeof dir + 16];
    if (!path[0]) {
        if (!mkdtemp(dir))
            return 0;
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    bool ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok)
        return 0;
    struct tokenizer *t = NULL;
    if (tok_load_files(&t, path, NULL, NULL) == 0) {
        exercise(t);
        tok_free(t);
    }
    return 0;
}
