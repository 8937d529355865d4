/* llgreedy MODEL.gguf N_GEN ID...: greedy continuation ids (argmax over the logits) of a
 * prompt of token ids, and the mean NLL of the prompt's own tokens (teacher forced), via
 * libllama; one sequence, the whole prompt in one batch. Validation aid for hf2gguf twins. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

static void quiet(enum ggml_log_level l, const char *t, void *u) { (void)l; (void)t; (void)u; }

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 4) { fprintf(stderr, "usage: llgreedy MODEL N_GEN ID...\n"); return 2; }
    int n_gen = atoi(argv[2]), n = argc - 3;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + n_gen + 16; cp.n_batch = cp.n_ctx; cp.n_ubatch = cp.n_ctx; cp.n_threads = 1; cp.n_threads_batch = 1;
    struct llama_context *c = llama_init_from_model(m, cp);
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = atoi(argv[3 + i]); b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(c, b)) { fprintf(stderr, "decode failed\n"); return 1; }
    double nll = 0;
    for (int i = 0; i + 1 < n; i++) {
        const float *lg = llama_get_logits_ith(c, i);
        double mx = lg[argmax(lg, nv)], s = 0;
        for (int j = 0; j < nv; j++) s += exp(lg[j] - mx);
        nll += -(lg[b.token[i + 1]] - mx - log(s));
    }
    int tok = argmax(llama_get_logits_ith(c, n - 1), nv);
    printf("[");
    for (int g = 0; g < n_gen; g++) {
        printf(g ? ", %d" : "%d", tok);
        struct llama_batch one = llama_batch_get_one(&tok, 1);
        if (llama_decode(c, one)) { fprintf(stderr, "decode failed\n"); return 1; }
        tok = argmax(llama_get_logits_ith(c, -1), nv);
    }
    printf("]\nnll %.6f over %d\n", nll / (n - 1), n - 1);
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    return 0;
}
