/*
 * xlm_roberta: XLMRobertaModel / RobertaModel and their *ForSequenceClassification
 * (transformers modeling_xlm_roberta.py): BERT's encoder (encoder.c, ADR 0083) with
 * position ids from padding_idx + 1 (create_position_ids_from_input_ids: a pad token keeps
 * padding_idx) and the RobertaClassificationHead (classifier.dense + tanh on <s>, then
 * classifier.out_proj). model_type "roberta" is an alias.
 */
#include "encoder.h"

static const struct enc_names xlmr_names = {
    .prefix = "roberta.",
    .cls_dense = "classifier.dense",
    .cls_out = "classifier.out_proj",
};

static int xlmr_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    return enc_parse_config(hp, cfg, true, e);
}

static int xlmr_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return enc_map_weights(m, st, &xlmr_names, e);
}

static const char *const xlmr_archs[] = {"XLMRobertaModel", "XLMRobertaForSequenceClassification",
                                         "RobertaModel", "RobertaForSequenceClassification", NULL};

const struct model_ops xlm_roberta_ops = {
    .family = "xlm-roberta",
    .description = "XLM-RoBERTa / RoBERTa encoder: BERT's blocks, positions from padding_idx + 1",
    .architectures = xlmr_archs,
    .parse_config = xlmr_parse_config,
    .map_weights = xlmr_map_weights,
    .forward = encoder_forward,
};
