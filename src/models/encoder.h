/*
 * encoder: what the BERT-style encoder families share (encoder.c): their config, their
 * weight names with and without the base model's prefix, and the encoder forward
 * (ADR 0083). bert.c and xlm_roberta.c differ only in the prefix, the first position id and
 * the classification head's names, which struct enc_names carries.
 */
#pragma once
#include <cjson/cJSON.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The names one encoder family's checkpoints use. */
struct enc_names {
    const char *prefix;      /* the base model's prefix in task-head checkpoints ("bert.",
                              * "roberta."); a checkpoint without it (BertModel as
                              * sentence-transformers saves it) loads too */
    const char *cls_dense;   /* the classification head's dense + tanh ("bert.pooler.dense",
                              * "classifier.dense") */
    const char *cls_out;     /* its output projection ("classifier", "classifier.out_proj") */
};

/* BertConfig / XLMRobertaConfig into hp: vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size, max_position_embeddings (required), hidden_act
 * ("gelu"), layer_norm_eps (1e-12), type_vocab_size (2), position_embedding_type
 * ("absolute" only), pad_token_id; roberta_positions: position ids start at
 * pad_token_id + 1 (default padding_idx 1). A config whose architectures name a
 * *ForSequenceClassification class gets a head of len(id2label) labels (num_labels when
 * given, else 2, transformers' default). */
int enc_parse_config(struct hparams *hp, const cJSON *cfg, bool roberta_positions, struct err *e);

/* Bind the embeddings, every layer and, with hp->n_cls, the classification head. */
int enc_map_weights(struct model *m, struct st_set *st, const struct enc_names *nm, struct err *e);

/* The forward of one chunk of packed sequences (ADR 0083): embeddings (token + position
 * (ch->emb_pos) + type (ch->type_ids)) and their LayerNorm, then per layer
 * x = LN1(x + attn(x)), x = LN2(x + mlp(x)) with every row attending all rows of its
 * sequence (ch->rows: each row at its own position with the whole sequence as its span,
 * ADR 0092). Leaves the last hidden states in c->bufs.x; with hp.n_cls and
 * ch->n_out, the head's logits of rows ch->out_rows in c->bufs.logits ([n_out, n_cls]). */
int encoder_forward(struct model_ctx *c, const struct fwd_chunk *ch, struct err *e);

#ifdef __cplusplus
}
#endif
