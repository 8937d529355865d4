/*
 * bert self-test: what the BERT family makes of its config and checkpoint.
 *  - Config: BertConfig's defaults (gelu (erf), layer_norm_eps 1e-12, type_vocab_size 2,
 *    positions from 0, post-LN, biases, no rope, an encoder), a classification head only for
 *    a *ForSequenceClassification architecture with len(id2label) labels; rejections
 *    (relative position embeddings, fewer kv heads, a pad id outside the vocabulary) name the
 *    field.
 *  - Weights: the golden BertModel (no prefix, as sentence-transformers saves it) and the
 *    cross-encoder (bert. prefix, pooler and classifier) bind every tensor they need; a
 *    missing one is named.
 */
#include "selftest.h"

extern const struct model_ops bert_ops;
int bert_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, " \
                   "\"max_position_embeddings\": 128" extra "}"

static bool layers_post_ln(const struct hparams *hp)
{
    for (int il = 0; il < hp->n_layer; il++) {
        const struct layer_spec *ls = &hp->layer[il];
        if (ls->ffn != FFN_MLP || ls->act != ACT_GELU_ERF || ls->residual != RESID_POST ||
            ls->n_rot != 0 || ls->moe || ls->kv != KV_FULL)
            return false;
    }
    return true;
}

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&bert_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.encoder && layers_post_ln(&hp) && hp.norm_eps == 1e-12f &&
                              hp.n_type_vocab == 2 && hp.pos_offset == 0 && hp.pad_id == -1 &&
                              hp.n_cls == 0 && hp.qkv_bias && hp.out_bias && hp.norm == NORM_LAYER,
                          "defaults: encoder, post-LN gelu MLP, eps 1e-12, 2 token types", e)) < 0 ||
        (rc = stest_parse(&bert_ops, CFG(", \"architectures\": [\"BertForSequenceClassification\"], "
                                         "\"id2label\": {\"0\": \"LABEL_0\"}, \"type_vocab_size\": 1"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.n_cls == 1 && hp.n_type_vocab == 1, "a cross-encoder: 1 label", e)) < 0 ||
        (rc = stest_parse(&bert_ops, CFG(", \"architectures\": [\"BertForSequenceClassification\"]"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.n_cls == 2, "num_labels defaults to 2", e)) < 0 ||
        (rc = stest_parse(&bert_ops, CFG(", \"architectures\": [\"BertModel\"], \"num_labels\": 3"),
                          &hp, e)) < 0 ||
        (rc = stest_check(hp.n_cls == 0, "no head on BertModel", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"position_embedding_type\": \"relative_key\""), "position_embedding_type"},
        {CFG(", \"num_key_value_heads\": 2"), "num_key_value_heads"},
        {CFG(", \"pad_token_id\": 100"), "pad_token_id"},
        {CFG(", \"type_vocab_size\": -1"), "type_vocab_size"},
        {CFG(", \"hidden_act\": \"mish\""), "hidden_act"},
        /* bounded before pad_token_id's range is derived from it (UBSan: INT_MIN - 1) */
        {"{\"vocab_size\": -2147483648, \"hidden_size\": 64, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"max_position_embeddings\": 128}",
         "vocab_size"},
    };
    return stest_parse_fails_all(&bert_ops, bad, sizeof bad / sizeof bad[0], e);
}

int bert_ops_self_test(struct err *e)
{
    return config_rules(e);
}
