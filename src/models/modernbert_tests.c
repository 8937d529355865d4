/*
 * modernbert self-test: ModernBertConfig into hparams.
 *  - Defaults: an encoder, pre-LN (sequential residuals), GeGLU with exact gelu, no biases,
 *    rope on the whole head (global theta 160000), layers 0, 3, 6 ... global and the rest
 *    local (KV_SLIDING, window 2 (local_attention / 2) + 1, local theta 10000), no position
 *    table offset, no token types.
 *  - layer_types and rope_parameters (transformers 5) take precedence; a cross-encoder gets
 *    its labels; what the family cannot run (biases, mean classifier pooling, another rope
 *    type, a malformed layer_types) is refused naming the field.
 */
#include "selftest.h"

extern const struct model_ops modernbert_ops;
int modernbert_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 48, " \
                   "\"max_position_embeddings\": 128, \"local_attention\": 16" extra "}"

static bool layer_ok(const struct hparams *hp, int il, bool local, float theta)
{
    const struct layer_spec *ls = &hp->layer[il];
    return ls->ffn == FFN_GLU && ls->act == ACT_GELU_ERF && ls->residual == RESID_SEQUENTIAL &&
           ls->n_rot == 16 && ls->rope_theta == theta &&
           (local ? ls->kv == KV_SLIDING && ls->window == 17 : ls->kv == KV_FULL);
}

int modernbert_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&modernbert_ops, CFG(""), &hp, e)) < 0 ||
        (rc = stest_check(hp.encoder && hp.n_type_vocab == 0 && hp.pos_offset == 0 && hp.pad_id == -1 &&
                              !hp.qkv_bias && !hp.out_bias && !hp.norm_bias && hp.norm == NORM_LAYER &&
                              hp.norm_eps == 1e-5f && hp.n_cls == 0 &&
                              layer_ok(&hp, 0, false, 160000.0f) && layer_ok(&hp, 1, true, 10000.0f) &&
                              layer_ok(&hp, 2, true, 10000.0f) && layer_ok(&hp, 3, false, 160000.0f),
                          "defaults: global every 3 layers, band of 8 each side, GeGLU, rope", e)) < 0 ||
        (rc = stest_parse(&modernbert_ops,
                          CFG(", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                              "\"full_attention\", \"sliding_attention\"], \"rope_parameters\": "
                              "{\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 5000.0}, "
                              "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 700.0}}"),
                          &hp, e)) < 0 ||
        (rc = stest_check(layer_ok(&hp, 0, true, 700.0f) && layer_ok(&hp, 1, false, 5000.0f) &&
                              layer_ok(&hp, 3, true, 700.0f),
                          "layer_types and rope_parameters", e)) < 0 ||
        (rc = stest_parse(&modernbert_ops,
                          "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 4, "
                          "\"num_attention_heads\": 4, \"intermediate_size\": 48, "
                          "\"max_position_embeddings\": 128, \"local_attention\": 7, "
                          "\"global_attn_every_n_layers\": 2, \"global_rope_theta\": 9.0}", &hp, e)) < 0 ||
        (rc = stest_check(layer_ok(&hp, 0, false, 9.0f) && hp.layer[1].kv == KV_SLIDING &&
                              hp.layer[1].window == 7 && hp.layer[2].kv == KV_FULL,
                          "global_attn_every_n_layers 2, an odd local_attention (3 each side)", e)) < 0 ||
        (rc = stest_parse(&modernbert_ops,
                          CFG(", \"architectures\": [\"ModernBertForSequenceClassification\"], "
                              "\"id2label\": {\"0\": \"LABEL_0\"}"), &hp, e)) < 0 ||
        (rc = stest_check(hp.n_cls == 1 && !hp.cls_mean, "a cross-encoder: 1 label", e)) < 0 ||
        (rc = stest_parse(&modernbert_ops,
                          CFG(", \"architectures\": [\"ModernBertForSequenceClassification\"], "
                              "\"classifier_pooling\": \"mean\""), &hp, e)) < 0 ||
        (rc = stest_check(hp.n_cls == 2 && hp.cls_mean, "classifier_pooling mean", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"attention_bias\": true"), "attention_bias"},
        {CFG(", \"mlp_bias\": true"), "mlp_bias"},
        {CFG(", \"hidden_activation\": \"mish\""), "hidden_activation"},
        {CFG(", \"layer_types\": [\"full_attention\"]"), "layer_types"},
        {CFG(", \"layer_types\": [\"full_attention\", \"chunked\", \"full_attention\", \"full_attention\"]"),
         "layer_types"},
        {CFG(", \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"yarn\"}}"), "rope_type"},
        {CFG(", \"global_attn_every_n_layers\": 0"), "global_attn_every_n_layers"},
        {CFG(", \"num_key_value_heads\": 2"), "num_key_value_heads"},
        {CFG(", \"architectures\": [\"ModernBertForSequenceClassification\"], "
             "\"classifier_pooling\": \"max\""), "classifier_pooling"},
        {CFG(", \"architectures\": [\"ModernBertForSequenceClassification\"], "
             "\"classifier_activation\": \"tanh\""), "classifier_activation"},
    };
    return stest_parse_fails_all(&modernbert_ops, bad, sizeof bad / sizeof bad[0], e);
}
