/*
 * seed_oss: SeedOssForCausalLM (ByteDance Seed-OSS). The Llama block
 * (RMSNorm, RoPE, GQA, SwiGLU) whose attention biases are split in two:
 *
 *   q, k, v = x W{q,k,v}^T + b{q,k,v}     attention_bias (default true)
 *   o       = att Wo^T (+ bo)              attention_out_bias (default false)
 *
 * Config (transformers SeedOssConfig): head_dim 128 when absent (null:
 * hidden_size / num_attention_heads), num_key_value_heads 8 when absent
 * (null: num_attention_heads), rms_norm_eps 1e-6, rope_theta 1e4, untied
 * head; residual_dropout / attention_dropout / pretraining_tp do nothing at
 * inference; mlp_bias = true is refused. Tensors: hf_map_decoder's names.
 */
#include "../loading/config.h"
#include "blocks.h"
#include "hf_common.h"


/* transformers SeedOssConfig defaults */
static const struct hf_defaults seed_oss_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static bool is_null(const cJSON *cfg, const char *key)
{
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cfg, key));
}

static int seed_oss_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    struct hf_defaults d = seed_oss_defaults;
    int rc;
    /* head_dim: null means hidden_size / num_attention_heads */
    if (is_null(cfg, "head_dim"))
        d.head_dim = 0;
    if ((rc = hf_parse_decoder(hp, cfg, &d, e)) < 0)
        return rc;
    /* absent: SeedOssConfig's 8; null: num_attention_heads (hf_parse_decoder) */
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "num_key_value_heads"))
        hp->n_kv_head = 8;
    if ((rc = cfg_opt_bool(cfg, "attention_bias", true, &hp->qkv_bias, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "attention_out_bias", false, &hp->out_bias, e)) < 0)
        return rc;
    return hf_finish_layers(hp, cfg, &d, 0, e);
}

static const char *const seed_oss_archs[] = {"SeedOssForCausalLM", NULL};

const struct model_ops seed_oss_ops = {
    .family = "seed_oss",
    .description = "Seed-OSS: Llama block with q/k/v biases (attention_bias) apart from o (attention_out_bias)",
    .architectures = seed_oss_archs,
    .parse_config = seed_oss_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
