/*
 * qwen3_vl_moe_text: the language model of Qwen3-VL-MoE (Qwen3VLMoeTextModel): Qwen3-MoE's
 * block (per-head q/k RMSNorm, softmax router over num_experts, the top num_experts_per_tok
 * renormalized, SwiGLU experts of moe_intermediate_size; dense MLP layers where
 * mlp_only_layers / decoder_sparse_step say) with Qwen3-VL's interleaved M-RoPE and DeepStack
 * image rows (ADR 0120; qwen3_vl_text.c).
 *
 * transformers' Qwen3VLMoeTextTopKRouter always renormalizes the top k, whatever
 * norm_topk_prob says, and so does this family.
 *
 * Experts: a published checkpoint stores them fused, mlp.experts.gate_up_proj [E, H, 2I]
 * (x @ W; gate in the first I columns) and mlp.experts.down_proj [E, I, H], copied here once
 * into [E, out, in]; transformers' own runtime layout [E, 2I, H] / [E, H, I] is viewed as it
 * is (told apart by shape; where H = 2I the published layout is assumed); mlx-vlm's
 * sanitize stacks mlp.switch_mlp.{gate,up,down}_proj (read as Qwen3-MoE's).
 */
#include <stdio.h>

#include "blocks.h"
#include "hf_common.h"

#include "../loading/wmap.h"

/* transformers Qwen3VLMoeTextConfig defaults */
static const struct hf_defaults qwen3_vl_moe_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 500000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 128, .sliding = false, .tie_embd = false,
};

static int qwen3_vl_moe_text_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc = hf_parse_decoder(hp, cfg, &qwen3_vl_moe_defaults, e);
    if (rc < 0)
        return rc;
    hp->qk_norm = true;
    hp->mrope_interleaved = true;
    if ((rc = hf_finish_layers(hp, cfg, &qwen3_vl_moe_defaults, 0, e)) < 0 ||
        (rc = hf_parse_sparse_moe(hp, cfg, NULL, e)) < 0)
        return rc;
    hp->router = ROUTER_SOFTMAX_TOPK;
    for (int il = 0; il < hp->n_layer; il++)
        if (hp->layer[il].moe)
            hp->layer[il].router = ROUTER_SOFTMAX_TOPK;
    return hf_parse_mrope(hp, cfg, e);
}

static const struct hf_moe_names qwen3_vl_moe_names = {"model.layers.%d.mlp.gate", hf_mlp_experts_stacking,
                                                       NULL, NULL, NULL};

/* Layer il's fused experts (mlp.experts.gate_up_proj / down_proj) as E gate, up and down views. */
static int map_fused(struct model *m, struct wmap *w, struct layer *L, int il, struct err *e)
{
    int64_t d = m->hp.n_embd, ff = m->hp.layer[il].n_ff, E = m->hp.n_expert;
    char gu_name[128], dn_name[128];
    struct tensor gu, dn;
    int rc;
    snprintf(gu_name, sizeof gu_name, "model.layers.%d.mlp.experts.gate_up_proj", il);
    snprintf(dn_name, sizeof dn_name, "model.layers.%d.mlp.experts.down_proj", il);
    const struct st_tensor *st = st_set_find(w->st, gu_name);
    bool runtime = st && st->ndim == 3 && st->shape[1] == 2 * ff && st->shape[2] == d && d != 2 * ff;
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, E, d, e, "model.layers.%d.mlp.gate", il)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.gate, false, e)) < 0 || (rc = hf_expert_views(m, &L->ex.up, false, e)) < 0 ||
        (rc = hf_expert_views(m, &L->ex.down, false, e)) < 0)
        return rc;
    if (runtime) {
        const int64_t sgu[3] = {E, 2 * ff, d}, sdn[3] = {E, d, ff};
        if ((rc = wm_tensor(w, &gu, WM_REQUIRED, 3, sgu, e, "%s", gu_name)) < 0 ||
            (rc = wm_tensor(w, &dn, WM_REQUIRED, 3, sdn, e, "%s", dn_name)) < 0)
            return rc;
    } else if ((rc = hf_take_transposed(m, w, &gu, 2 * ff, d, gu_name, e)) < 0 ||
               (rc = hf_take_transposed(m, w, &dn, d, ff, dn_name, e)) < 0) {
        return rc;
    }
    for (int64_t x = 0; x < E; x++) {
        struct tensor ex = tensor_slice0(&gu, x);
        L->ex.gate.w[x] = tensor_rows(&ex, 0, ff);
        L->ex.up.w[x] = tensor_rows(&ex, ff, ff);
        L->ex.down.w[x] = tensor_slice0(&dn, x);
    }
    return 0;
}

static int qwen3_vl_moe_text_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int rc;
    if ((rc = hf_experts_alloc(m, e)) < 0 ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        char n1[128], n2[128];
        snprintf(n1, sizeof n1, "model.layers.%d.input_layernorm", il);
        snprintf(n2, sizeof n2, "model.layers.%d.post_attention_layernorm", il);
        if ((rc = hf_map_norm(&w, &m->hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, &m->hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = hf_map_attention(&w, &m->hp, L, il, e)) < 0)
            return rc;
        bool fused = m->hp.layer[il].moe && wm_has(&w, "model.layers.%d.mlp.experts.gate_up_proj", il);
        if ((rc = fused ? map_fused(m, &w, L, il, e) : hf_map_ffn(m, &w, L, il, &qwen3_vl_moe_names, e)) < 0)
            return rc;
    }
    return 0;
}

static const char *const qwen3_vl_moe_text_archs[] = {"Qwen3VLMoeForConditionalGeneration", NULL};

const struct model_ops qwen3_vl_moe_text_ops = {
    .family = "qwen3_vl_moe_text",
    .description = "Qwen3-VL-MoE language model: Qwen3-MoE block (fused experts) with interleaved M-RoPE "
                   "and DeepStack image rows",
    .architectures = qwen3_vl_moe_text_archs,
    .parse_config = qwen3_vl_moe_text_parse_config,
    .map_weights = qwen3_vl_moe_text_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_8bit,
};
