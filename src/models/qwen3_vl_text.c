/*
 * qwen3_vl_text: the language model of Qwen3-VL (Qwen3VLTextModel): Qwen3's block (per-head
 * q/k RMSNorm, no biases) with interleaved M-RoPE (ADR 0120): each row turns by three
 * positions, but frequency j goes to the height when j % 3 == 1 and j < 3 mrope_section[1],
 * to the width when j % 3 == 2 and j < 3 mrope_section[2], and to the temporal position
 * otherwise (transformers' apply_interleaved_mrope, which Qwen3-VL applies whatever
 * rope_scaling.mrope_interleaved says). A text row's three positions are equal: plain rope,
 * so a text-only prompt is Qwen3.
 *
 * DeepStack: the rows of an image also carry the tower's deepstack features, which the
 * decoder adds to them after its first layers (fwd_image.n_deep, ADR 0120); the family
 * needs nothing for it.
 *
 * Config: a transformers 5 or published checkpoint nests this under text_config (model_type
 * "qwen3_vl_text"); model.c reads a flat one too (ADR 0080, 0094).
 */
#include "blocks.h"
#include "hf_common.h"

/* transformers Qwen3VLTextConfig defaults (default_theta 500000) */
static const struct hf_defaults qwen3_vl_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 500000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static int qwen3_vl_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen3_vl_defaults, e);
    if (rc < 0)
        return rc;
    hp->qk_norm = true;
    hp->mrope_interleaved = true;
    if ((rc = hf_finish_layers(hp, cfg, &qwen3_vl_defaults, 0, e)) < 0)
        return rc;
    return hf_parse_mrope(hp, cfg, e);
}

static const char *const qwen3_vl_text_archs[] = {"Qwen3VLForConditionalGeneration", NULL};

const struct model_ops qwen3_vl_text_ops = {
    .family = "qwen3_vl_text",
    .description = "Qwen3-VL language model: Qwen3 block with interleaved M-RoPE (3-D positions) and "
                   "DeepStack image rows",
    .architectures = qwen3_vl_text_archs,
    .parse_config = qwen3_vl_text_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
