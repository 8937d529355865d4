/*
 * qwen3_5_text: Qwen3_5ForCausalLM, the text model of Qwen3.5. Qwen3-Next's hybrid block
 * (qwen3_next.c: gated DeltaNet layers, gated full attention every
 * full_attention_interval-th layer or as layer_types says, zero-centred (1 + w) RMSNorms)
 * with a dense SwiGLU FFN of intermediate_size on every layer, and the DeltaNet's input
 * projections stored plainly: in_proj_qkv (q | k | v, the convolution's channel order),
 * in_proj_z, in_proj_b and in_proj_a, no head interleave. Qwen3_5TextConfig has Qwen3-Next's
 * fields and defaults without the MoE ones. Its rotary embedding is multimodal (mrope over
 * rope_parameters.mrope_section); for text every section sees the same position, which is
 * the plain rotate-half rope on partial_rotary_factor of head_dim, so mrope_section and
 * mrope_interleaved are not read. mlx-lm's layout (conv1d [ch, K, 1], norms stored as
 * 1 + w) is told apart by the conv's shape, as its sanitize does.
 */
#include "blocks.h"
#include "qwen3_next.h"

/* transformers Qwen3_5TextConfig defaults (partial_rotary_factor: its __post_init__'s 0.25) */
static const struct hf_defaults qwen3_5_text_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 0.25f, .act = "silu",
    .head_dim = 256, .sliding = false, .tie_embd = false,
};

static int qwen3_5_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    /* every layer keeps the dense GLU of intermediate_size hparams_fill_layers gave it */
    return qwen3_next_parse_common(hp, cfg, &qwen3_5_text_defaults, e);
}

/* in_proj_qkv [conv channels], in_proj_z [value dim], in_proj_b / in_proj_a [value heads] */
static int plain_inproj(struct model *m, struct wmap *w, struct layer *L, int il, const char *pre,
                        struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t nv = hp->ssm.n_head, vd = nv * hp->ssm.head_dim, d = hp->n_embd;
    int64_t cd = 2 * (int64_t)hp->ssm.n_group * hp->ssm.k_head_dim + vd;
    int rc;
    (void)il;
    if ((rc = wm_linear(w, &L->ssm_in, WM_REQUIRED, 0, cd, d, e, "%s.in_proj_qkv", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_z, WM_REQUIRED, 0, vd, d, e, "%s.in_proj_z", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_x, WM_REQUIRED, 0, nv, d, e, "%s.in_proj_b", pre)) < 0)
        return rc;
    return wm_linear(w, &L->ssm_xa, WM_REQUIRED, 0, nv, d, e, "%s.in_proj_a", pre);
}

/* no MoE layer: hf_map_ffn reads only the dense mlp.{gate,up,down}_proj */
static const struct hf_moe_names qwen3_5_text_names = {.router = "model.layers.%d.mlp.gate"};

static int qwen3_5_text_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return qwen3_next_map_common(m, st, &qwen3_5_text_names, plain_inproj, e);
}

static const char *const qwen3_5_text_archs[] = {"Qwen3_5ForCausalLM", NULL};

const struct model_ops qwen3_5_text_ops = {
    .family = "qwen3_5_text",
    .description = "Qwen3.5 text: gated DeltaNet + gated attention hybrid, dense SwiGLU",
    .architectures = qwen3_5_text_archs,
    .parse_config = qwen3_5_text_parse_config,
    .map_weights = qwen3_5_text_map_weights,
    .forward = decoder_forward,
    .mtp = MTP_QWEN3_NEXT,  /* model_load_mtp: the mtp.* module (ADR 0135) */
};
