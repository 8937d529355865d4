/*
 * embed: what sentence-transformers does around the encoder, so that a checkpoint folder
 * behaves as SentenceTransformer(folder).encode(texts) and CrossEncoder(folder).predict(pairs).
 *
 * emb_config_load reads the folder's sentence-transformers files:
 *   modules.json                     the module list: Transformer, then Pooling, Dense (any
 *                                    number, in order), Normalize; another module is refused
 *   1_Pooling/config.json            pooling_mode: a mode or a list of them (cls, max, mean,
 *                                    mean_sqrt_len_tokens, weightedmean, lasttoken),
 *                                    concatenated in the list's order; or the older
 *                                    pooling_mode_* booleans (concatenated in ST's legacy
 *                                    order, none set: mean); include_prompt
 *   2_Dense/config.json + model.safetensors   in/out features, bias, activation (Tanh or
 *                                    Identity), linear.weight / linear.bias
 *   sentence_bert_config.json        max_seq_length (else tokenizer_config.json's
 *                                    model_max_length, where sentence-transformers 6 keeps it)
 *   config_sentence_transformers.json prompts, default_prompt_name; a cross-encoder's
 *                                    activation_fn (also config.json's "sentence_transformers")
 * A folder without modules.json is what SentenceTransformer makes of a plain transformers
 * model: mean pooling, no Dense, no Normalize. Every size is checked against the model's.
 * The pooled / dense / normalized vectors are computed on the host in double.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "../core/err.h"
#include "../models/hparams.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EMB_MAX_DENSE   4
#define EMB_MAX_PROMPTS 16

/* sentence-transformers' pooling modes; a Pooling module concatenates its modes in order. */
enum emb_pool {
    EMB_POOL_CLS = 1,
    EMB_POOL_MAX = 2,
    EMB_POOL_MEAN = 3,
    EMB_POOL_MEAN_SQRT = 4,
    EMB_POOL_WEIGHTED_MEAN = 5,
    EMB_POOL_LAST = 6,
};
#define EMB_MAX_POOL 6

/* A cross-encoder's score from its logit (CrossEncoder's activation_fn). */
enum emb_act { EMB_ACT_IDENTITY = 0, EMB_ACT_SIGMOID = 1, EMB_ACT_TANH = 2 };

struct emb_dense {
    int n_in, n_out;
    float *w;                 /* [n_out, n_in], owned */
    float *b;                 /* [n_out] or NULL, owned */
    enum emb_act act;
};

struct emb_prompt {
    char name[64];
    char *text;               /* owned */
};

struct emb_config {
    enum emb_pool pool[EMB_MAX_POOL];  /* the modes, concatenated in this order */
    int n_pool;
    bool include_prompt;      /* false: a prompt's tokens are left out of the pooling */
    struct emb_dense dense[EMB_MAX_DENSE];
    int n_dense;
    bool normalize;
    int max_seq_length;       /* tokens (0: the model's) */
    int dim;                  /* the final vector's width */
    struct emb_prompt prompts[EMB_MAX_PROMPTS];
    int n_prompts;
    char default_prompt[64];  /* "" : none */
    enum emb_act score_act;   /* cross-encoders */
};

/* Read dir's sentence-transformers files for a model of hp (n_embd, n_cls). Fills c
 * (emb_config_deinit frees it, also after a failure). */
int emb_config_load(struct emb_config *c, const char *dir, const struct hparams *hp, struct err *e);
void emb_config_deinit(struct emb_config *c);

/* The prompt text named name, or NULL. */
const char *emb_prompt_find(const struct emb_config *c, const char *name);

/* out[dim] = normalize(dense(pool(hidden))) for one sequence of n rows [n, n_embd];
 * skip: leading rows left out of the pooling (a prompt with include_prompt false). */
void emb_finish(const struct emb_config *c, float *out, const float *hidden, int n, int n_embd,
                int skip);

/* A cross-encoder's score of its first logit. */
float emb_score(const struct emb_config *c, float logit);

/* v[0, k) = v[0, k) / ||v[0, k)|| (nothing for a zero vector): Matryoshka truncation. */
void emb_renormalize(float *v, int k);

/* A rerank result: the document's index and its score. */
struct emb_ranked {
    int index;
    float score;
};

/* Orders r best first, equal scores in input order (the rerank APIs' order). */
void emb_rank_sort(struct emb_ranked *r, int n);

#ifdef __cplusplus
}
#endif
