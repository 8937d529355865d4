/*
 * fuzz_grammar: libFuzzer target for the JSON-schema compiler and matcher.
 * The input is a schema (JSON text; its first byte also seeds the walk).
 * Compiling must never crash or hang (every bound is an error); when it
 * compiles, a constrained random walk of at most 64 tokens with the
 * llama-tiny tokenizer must always find an allowed id, and accept must take
 * every id its mask allowed. A complete walk must parse as JSON.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static struct tokenizer *g_tok;
static struct grammar_vocab *g_voc;

static void setup(void)
{
    const char *root = getenv("MLXCEL_SOURCE_DIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", root ? root : ".");
    if (tok_load(&g_tok, dir, NULL) < 0 || grammar_vocab_new(&g_voc, g_tok, NULL) < 0)
        abort();
}

static void walk(const struct grammar *g, uint64_t seed)
{
    struct grammar_state *st = NULL;
    int nv = tok_vocab_size(g_tok);
    float *l = malloc((size_t)nv * sizeof *l);
    int32_t *ok = malloc((size_t)nv * sizeof *ok);
    char *text = malloc(64 * TOK_TOKEN_BYTES_MAX + 1), buf[TOK_TOKEN_BYTES_MAX];
    size_t len = 0;
    struct rng r;
    rng_seed(&r, seed);
    if (!l || !ok || !text || grammar_state_new(&st, g, NULL) < 0)
        abort();
    bool ended = false;
    for (int step = 0; step < 64 && !ended; step++) {
        int n = 0;
        for (int i = 0; i < nv; i++)
            l[i] = (float)rng_uniform(&r);
        grammar_constraint_ops.mask(st, l, nv);
        for (int i = 0; i < nv; i++)
            if (!isinf(l[i]))
                ok[n++] = i;
        if (n == 0)
            abort();  /* at least one id must stay allowed */
        int32_t id = ok[rng_next(&r) % (uint64_t)n];
        if (grammar_constraint_ops.accept(st, id) < 0)
            abort();
        ended = id == tok_eos_id(g_tok);
        int k = ended ? 0 : tok_token_bytes(g_tok, id, buf, sizeof buf);
        if (k > 0) {
            memcpy(text + len, buf, (size_t)k);
            len += (size_t)k;
        }
    }
    text[len] = '\0';
    free(l);
    free(ok);
    free(text);
    grammar_state_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok)
        setup();
    if (size > 1 << 16)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    cJSON *schema = cJSON_Parse(text);
    free(text);
    int32_t eos = tok_eos_id(g_tok);
    struct grammar_opts o = {.vocab = g_voc, .eos_ids = &eos, .n_eos = 1, .any_object = schema == NULL,
                             .prefix = size && data[0] & 1 ? "<tool_call>\n" : NULL,
                             .suffix = size && data[0] & 2 ? "\n</tool_call>" : NULL};
    struct grammar *g = NULL;
    if (grammar_compile(&g, schema, g_tok, &o, NULL) == 0) {
        walk(g, size ? data[size / 2] : 0);
        grammar_free(g);
    }
    cJSON_Delete(schema);
    return 0;
}
