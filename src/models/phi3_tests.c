/*
 * phi3 self-test: longrope normalization (factor arrays of n_rot / 2, the
 * original context from the top level, the attention factor
 * sqrt(1 + ln(max / original) / ln(original)) as transformers computes it),
 * the short/long inverse frequencies, and errors naming the bad field.
 */
#include <math.h>

#include "blocks.h"
#include "selftest.h"

extern const struct model_ops phi3_ops;
int phi3_ops_self_test(struct err *e);

#define BASE "\"vocab_size\": 384, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
             "\"intermediate_size\": 128, \"max_position_embeddings\": 256, \"original_max_position_embeddings\": 8"
#define SHORT "[1.0, 1.05, 1.1, 1.2, 1.4, 1.8, 2.5, 3.0]"
#define LONG "[1.0, 1.3, 1.9, 2.8, 4.0, 6.0, 9.0, 12.0]"

int phi3_ops_self_test(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": " SHORT
                                     ", \"long_factor\": " LONG "}}", &hp, e)) < 0)
        return rc;
    double af = sqrt(1.0 + log(256.0 / 8.0) / log(8.0));
    if ((rc = stest_check(hp.rope == ROPE_LONGROPE && hp.rope_orig_ctx == 8 && hp.rope_short[7] == 3.0f &&
                              hp.rope_long[7] == 12.0f, "longrope fields", e)) < 0 ||
        (rc = stest_check(stest_near(hp.rope_attn_factor, af, 1e-6), "longrope attention factor", e)) < 0 ||
        (rc = stest_check(!hp.qkv_bias && hp.norm_eps == 1e-5f, "phi3 defaults", e)) < 0)
        return rc;
    float inv[8], inv_long[8];
    blk_rope_freqs(&hp, &hp.layer[0], inv, inv_long);
    for (int j = 0; j < 8 && rc == 0; j++) {
        double base = pow(10000.0, 2.0 * j / 16);
        rc = stest_check(stest_near(inv[j], 1.0 / (hp.rope_short[j] * base), 1e-7) &&
                             stest_near(inv_long[j], 1.0 / (hp.rope_long[j] * base), 1e-7),
                         "longrope short/long inverse frequencies", e);
    }
    if (rc < 0)
        return rc;
    /* an explicit attention_factor wins */
    if ((rc = stest_parse(&phi3_ops, "{" BASE ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": " SHORT
                                     ", \"long_factor\": " LONG ", \"attention_factor\": 1.25}}", &hp, e)) < 0 ||
        (rc = stest_check(hp.rope_attn_factor == 1.25f, "explicit attention_factor", e)) < 0)
        return rc;
    if ((rc = stest_parse_fails(&phi3_ops, "{" BASE ", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0], "
                                           "\"long_factor\": " LONG "}}", "short_factor", e)) < 0)
        return rc;
    return 0;
}
