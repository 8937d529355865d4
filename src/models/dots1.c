/*
 * dots1: Dots1ForCausalLM (rednote-hilab dots.llm1). The Qwen3 attention block with
 * DeepSeek-V3's mixture of experts (transformers builds it from Qwen3Attention and
 * DeepseekV3MoE / DeepseekV3TopkRouter):
 *
 *   block(x) = x + attn(rms(x)); x + ffn(rms(x))      pre-norm, RMSNorm (rms_norm_eps 1e-6)
 *   attn     q/k/v/o without biases (attention_bias false), per-head q/k RMSNorm before a
 *            rotate-half RoPE over the whole head, scale head_dim^-0.5; layer_types (absent:
 *            the layers from max_window_layers (62) on slide over sliding_window (4096))
 *   ffn      layers il < first_k_dense_replace (0): SwiGLU of intermediate_size; the others:
 *            n_routed_experts SwiGLU experts of moe_intermediate_size (1408) + n_shared_experts
 *            shared ones (one SwiGLU of n_shared * moe_intermediate_size, added plain)
 *   router   noaux_tc: scores = sigmoid(mlp.gate x); the choice on score +
 *            e_score_correction_bias (F32) among the topk_group (1) best of n_group (1)
 *            groups (group score: the sum of its top 2); weights the scores, / their sum with
 *            norm_topk_prob (false), x routed_scaling_factor (1.0)
 *
 * n_routed_experts, num_experts_per_tok and n_shared_experts have no usable default
 * (transformers' None fails) and are required.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
 * mlp.{gate,up,down}_proj (dense), mlp.gate (+ .e_score_correction_bias),
 * mlp.experts.E.{gate,up,down}_proj or mlx-lm's stacked mlp.switch_mlp.*,
 * mlp.shared_experts.{gate,up,down}_proj.
 */
#include "blocks.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers Dots1Config defaults of the Llama-style fields */
static const struct hf_defaults dots1_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static const struct hf_v3_moe_defaults dots1_moe_defaults = {
    .n_routed = -1, .k = -1, .moe_ff = 1408, .n_shared = -1, .first_dense = 0,
    .n_group = 1, .topk_group = 1, .norm_topk = false, .scale = 1.0f,
};

/* Dots1Config: sliding_window 4096 when absent, on the layers from max_window_layers (62) on;
 * use_sliding_window is not read */
#define DOTS1_WINDOW 4096
#define DOTS1_MAX_WINDOW_LAYERS 62

static int dots1_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, first, window = DOTS1_WINDOW;
    if ((rc = hf_parse_decoder(hp, cfg, &dots1_defaults, e)) < 0)
        return rc;
    hp->qk_norm = true;
    if ((rc = hf_finish_layers(hp, cfg, &dots1_defaults, DOTS1_MAX_WINDOW_LAYERS, e)) < 0)
        return rc;
    /* without layer_types, Dots1Config's own rule (hf_finish_layers also reads
     * use_sliding_window and defaults the window to none): sliding_window (absent: 4096,
     * null: none) on the layers from max_window_layers on */
    if (!cfg_has(cfg, "layer_types")) {
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window");
        if ((sw && !cJSON_IsNull(sw) && (rc = cfg_int(cfg, "sliding_window", &window, e)) < 0) ||
            (rc = cfg_opt_int(cfg, "max_window_layers", DOTS1_MAX_WINDOW_LAYERS, &first, e)) < 0)
            return rc;
        if (sw && cJSON_IsNull(sw))
            window = 0;
        if (window < 0)
            return err_setf(e, ERR_CONFIG, "config field 'sliding_window' = %d must not be "
                            "negative", window);
        for (int il = 0; il < hp->n_layer; il++) {
            bool slide = window > 0 && il >= first;
            hp->layer[il].kv = slide ? KV_SLIDING : KV_FULL;
            hp->layer[il].window = slide ? window : 0;
        }
    }
    return hf_parse_v3_moe(hp, cfg, &dots1_moe_defaults, e);
}

static const struct hf_moe_names dots1_names = {
    "model.layers.%d.mlp.gate", hf_mlp_experts_stacking, "model.layers.%d.mlp.shared_experts", NULL,
    "model.layers.%d.mlp.gate.e_score_correction_bias",
};

static int dots1_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &dots1_names, e);
}

static const char *const dots1_archs[] = {"Dots1ForCausalLM", NULL};

const struct model_ops dots1_ops = {
    .family = "dots1",
    .description = "dots.llm1: Qwen3 attention (q/k norm) + DeepSeek-V3 experts (sigmoid, "
                   "correction bias, shared experts, dense first layers)",
    .architectures = dots1_archs,
    .parse_config = dots1_parse_config,
    .map_weights = dots1_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_float,
};
