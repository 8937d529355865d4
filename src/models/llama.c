/*
 * llama: LlamaForCausalLM and MistralForCausalLM (alias "mistral").
 * RMSNorm, RoPE (default, linear, llama3 scaling), GQA, SwiGLU, tied or
 * untied embeddings; attention_bias adds biases to q, k, v and o.
 * Everything is the shared HF decoder layout (hf_common.c).
 */
#include "blocks.h"
#include "hf_common.h"


/* transformers LlamaConfig defaults */
static const struct hf_defaults llama_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = true, .tie_embd = false,
};

static int llama_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &llama_defaults, e);
    return rc < 0 ? rc : hf_finish_layers(hp, cfg, &llama_defaults, 0, e);
}

static const char *const llama_archs[] = {"LlamaForCausalLM", "MistralForCausalLM", NULL};

const struct model_ops llama_ops = {
    .family = "llama",
    .description = "Llama 1/2/3, Mistral: RMSNorm, RoPE (default/linear/llama3), GQA, SwiGLU",
    .architectures = llama_archs,
    .parse_config = llama_parse_config,
    .map_weights = hf_map_decoder,
    .forward = decoder_forward,
};
