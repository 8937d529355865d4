/*
 * qwen2_vl_text: the language model of Qwen2-VL and Qwen2.5-VL (Qwen2VLTextModel,
 * Qwen2_5_VLTextModel): Qwen2's block (q/k/v biases, none on o) with M-RoPE (ADR 0094).
 * Each row turns by three positions, temporal / height / width, over the frequency
 * sections mrope_section (rope_scaling / rope_parameters, e.g. [16, 24, 24] of 64); a
 * text row's three are equal, which is plain rope. The positions come with the batch
 * (batch.rope), made by vision_mrope_positions as transformers' get_rope_index does.
 *
 * Config: a transformers 5 checkpoint nests this under text_config (model_type
 * "qwen2_vl_text" / "qwen2_5_vl_text"); a published Qwen2-VL config.json is flat (model_type
 * "qwen2_vl" with the text keys at its top): model.c reads both (ADR 0080, 0094).
 */
#include "blocks.h"
#include "hf_common.h"

#include "../loading/config.h"

/* transformers Qwen2VLTextConfig defaults */
static const struct hf_defaults qwen2_vl_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-5f,
    .rope_theta = 1000000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

static int qwen2_vl_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen2_vl_defaults, e);
    if (rc < 0)
        return rc;
    hp->qkv_bias = true;
    hp->out_bias = false;
    /* Qwen2VLTextConfig: max_window_layers defaults to 80 */
    if ((rc = hf_finish_layers(hp, cfg, &qwen2_vl_defaults, 80, e)) < 0)
        return rc;
    return hf_parse_mrope(hp, cfg, e);
}

static const char *const qwen2_vl_text_archs[] = {"Qwen2VLForConditionalGeneration",
                                                  "Qwen2_5_VLForConditionalGeneration", NULL};

const struct model_ops qwen2_vl_text_ops = {
    .family = "qwen2_vl_text",
    .description = "Qwen2-VL / Qwen2.5-VL language model: Qwen2 block with M-RoPE (3-D positions)",
    .architectures = qwen2_vl_text_archs,
    .parse_config = qwen2_vl_text_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
