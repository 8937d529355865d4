/*
 * xlm-roberta self-test: XLMRobertaConfig into hparams.
 *  - Positions start at padding_idx + 1 (pad_token_id, default 1) and the pad id is kept
 *    (a pad token takes position padding_idx); the rest is BERT's (bert_tests.c).
 *  - A table with no position past padding_idx is rejected, naming the field.
 */
#include "selftest.h"

extern const struct model_ops xlm_roberta_ops;
int xlm_roberta_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 130" extra "}"

int xlm_roberta_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&xlm_roberta_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.encoder && hp.pos_offset == 2 && hp.pad_id == 1 && hp.n_cls == 0,
                          "positions from padding_idx 1 + 1", e)) < 0 ||
        (rc = stest_parse(&xlm_roberta_ops, CFG(", \"pad_token_id\": 5, \"architectures\": "
                                                "[\"XLMRobertaForSequenceClassification\"], "
                                                "\"id2label\": {\"0\": \"a\"}"), &hp, e)) < 0 ||
        (rc = stest_check(hp.pos_offset == 6 && hp.pad_id == 5 && hp.n_cls == 1,
                          "pad_token_id 5: positions from 6; one label", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {"{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"max_position_embeddings\": 2}",
         "max_position_embeddings"},
    };
    return stest_parse_fails_all(&xlm_roberta_ops, bad, sizeof bad / sizeof bad[0], e);
}
