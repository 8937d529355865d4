/*
 * bert: BertModel and BertForSequenceClassification (transformers modeling_bert.py):
 * absolute position and token-type embeddings, post-LN blocks with biases, exact-erf GELU;
 * the classification head is the pooler (dense + tanh on [CLS]) then `classifier`.
 * Everything is encoder.c's (ADR 0083); this file names BERT's prefix and head.
 */
#include "encoder.h"

static const struct enc_names bert_names = {
    .prefix = "bert.",
    .cls_dense = "bert.pooler.dense",
    .cls_out = "classifier",
};

static int bert_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    return enc_parse_config(hp, cfg, false, e);
}

static int bert_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return enc_map_weights(m, st, &bert_names, e);
}

static const char *const bert_archs[] = {"BertModel", "BertForSequenceClassification", NULL};

const struct model_ops bert_ops = {
    .family = "bert",
    .description = "BERT encoder (embeddings / cross-encoder): post-LN, absolute positions, token types",
    .architectures = bert_archs,
    .parse_config = bert_parse_config,
    .map_weights = bert_map_weights,
    .forward = encoder_forward,
};
