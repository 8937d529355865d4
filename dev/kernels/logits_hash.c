/*
 * logits_hash: a fingerprint of every logit a model produces, to show that a change to the
 * CPU kernels or their dispatch left the bits alone (ADR 0055: linear_plan.c against the
 * dispatch before it, every ISA).
 *
 *   logits_hash MODEL N_IDS CHUNK SEQS
 *
 * SEQS sequences of N_IDS deterministic ids: each sequence's prompt goes through the model
 * CHUNK rows at a time (so every linear product sees CHUNK tokens), then the sequences
 * decode 8 steps together (SEQS tokens a product: batched decode, fused MoE). Prints one
 * FNV-1a hash over the bytes of all logits. MLXCEL_ISA, MLXCEL_FAST and MLXCEL_REPACK
 * choose the kernels as for mlxcel. Not built by CMake; link it against a build's library
 * and the CLI's engine helpers:
 *
 *   cc -O2 -Isrc dev/kernels/logits_hash.c src/cli/cli_common.c build/libmlxcel_lib.a \
 *      $(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd libcurl) -lm -lpthread -ldl
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "engine/batch.h"
#include "engine/kvcache.h"
#include "models/model.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: logits_hash MODEL N_IDS CHUNK SEQS\n");
        return 2;
    }
    const int n = atoi(argv[2]), chunk = atoi(argv[3]), seqs = atoi(argv[4]), steps = 8;
    struct err e = {0};
    struct model *m = NULL;
    struct cli_engine en = {0};
    struct batch b = {0};
    if (n < 1 || chunk < 1 || seqs < 1 || model_load(&m, argv[1], &e) < 0 ||
        cli_engine_open(&en, m, 2, ((n + steps + 15) / 16 + 1) * 16 * seqs, seqs, n + steps, 0, &e) < 0 ||
        batch_init(&b, chunk > seqs ? chunk : seqs, &e) < 0) {
        fprintf(stderr, "logits_hash: %s\n", e.msg);
        return 1;
    }
    const int V = m->hp.n_vocab, vid = V < 1000 ? V : 1000;
    float *logits = malloc((size_t)b.cap * V * sizeof *logits);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int s = 0; s < seqs && logits; s++) {
        if (kv_seq_add(en.kv, s, &e) < 0)
            goto fail;
        for (int done = 0; done < n;) {
            const int k = n - done < chunk ? n - done : chunk;
            batch_clear(&b);
            for (int j = 0; j < k; j++)
                batch_add(&b, (int32_t)(((done + j) * 7919 + 13 * s + 1) % vid), done + j, s, true, NULL);
            if (model_forward(en.ctx, &b, en.kv, logits, &e) < 0)
                goto fail;
            h = fnv(h, logits, (size_t)k * V * sizeof *logits);
            done += k;
        }
    }
    for (int t = 0; t < steps && logits; t++) {
        batch_clear(&b);
        for (int s = 0; s < seqs; s++)
            batch_add(&b, (int32_t)((t * 31 + s * 17 + 5) % vid), n + t, s, true, NULL);
        if (model_forward(en.ctx, &b, en.kv, logits, &e) < 0)
            goto fail;
        h = fnv(h, logits, (size_t)seqs * V * sizeof *logits);
    }
    printf("%016llx\n", (unsigned long long)h);
    return 0;
fail:
    fprintf(stderr, "logits_hash: %s\n", e.msg);
    return 1;
}

/* cli_common.c's model resolution calls into `pull`, which this tool never reaches. */
int cli_pull_model(const char *spec, char *dir, size_t cap, struct err *e)
{
    (void)spec, (void)dir, (void)cap;
    return err_setf(e, ERR_UNSUPPORTED, "no downloads here");
}
