/*
 * qwen3_next: Qwen3NextForCausalLM, a hybrid of gated DeltaNet (linear attention with a
 * fixed-size state per sequence) and gated full attention, with a sparse MoE FFN:
 *
 *   block(x)   x += mixer(norm1(x)); x += ffn(norm2(x)); every RMSNorm zero-centred:
 *              x / rms(x) * (1 + w) (model.norm and the q/k norms too)
 *   mixer      layer_types[il] (or, absent, full attention on every full_attention_interval-th
 *              layer, default 4):
 *     linear_attention  the gated DeltaNet (blocks_gdn.c): conv1d (width
 *              linear_conv_kernel_dim, no bias) + silu over q | k | v, the gated delta rule over
 *              linear_num_value_heads heads of linear_value_head_dim, q/k of
 *              linear_num_key_heads heads of linear_key_head_dim shared by groups of value
 *              heads; RMSNormGated(y) * silu(z) with plain weights; out_proj
 *     full_attention    q_proj emits per head [q | gate]; per-head (1 + w) q/k RMSNorm;
 *              rotate-half rope on partial_rotary_factor (0.25) of head_dim (256); the output
 *              times sigmoid(gate) before o_proj
 *   ffn        the Qwen-MoE block: softmax router over num_experts, top num_experts_per_tok,
 *              renormalized with norm_topk_prob (Qwen3NextConfig: true), experts of
 *              moe_intermediate_size, plus sigmoid(shared_expert_gate x) * shared_expert(x)
 *              of shared_expert_intermediate_size; decoder_sparse_step / mlp_only_layers
 *              layers take the dense MLP of intermediate_size
 *
 * Weights: transformers' in_proj_qkvz rows interleave per key head [q | k | v | z] and
 * in_proj_ba [b | a]; map_weights copies them once into the canonical order (q | k | v | z,
 * b | a) and views the parts (the rows are independent, so MLX-quantized ones too). mlx-lm
 * keeps those names and order, stacks experts as mlp.switch_mlp, stores conv1d.weight
 * [ch, K, 1] instead of [ch, 1, K], and has already added 1 to the zero-centred norms: the
 * conv's shape tells the layouts apart, as mlx-lm's sanitize does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "qwen3_next.h"

/* transformers Qwen3NextConfig defaults (partial_rotary_factor: its __post_init__'s 0.25) */
static const struct hf_defaults qwen3_next_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 0.25f, .act = "silu",
    .head_dim = 256, .sliding = false, .tie_embd = false,
};

// ---- config ----

static int qwen3_next_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = qwen3_next_parse_common(hp, cfg, &qwen3_next_defaults, e)) < 0 ||
        (rc = hf_parse_sparse_moe(hp, cfg, "shared_expert_intermediate_size", e)) < 0)
        return rc;
    /* Qwen3NextConfig's norm_topk_prob defaults to true (hf_parse_sparse_moe's to false) */
    if (!cfg_has(cfg, "norm_topk_prob")) {
        hp->router = ROUTER_SOFTMAX_TOPK;
        for (int il = 0; il < hp->n_layer; il++)
            if (hp->layer[il].moe)
                hp->layer[il].router = ROUTER_SOFTMAX_TOPK;
    }
    return 0;
}

// ---- weights ----

static int next_inproj(struct model *m, struct wmap *w, struct layer *L, int il, const char *pre,
                       struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t nk = hp->ssm.n_group, dk = hp->ssm.k_head_dim, r = hp->ssm.n_head / nk;
    int64_t rv = r * hp->ssm.head_dim, G = 2 * dk + 2 * rv, vd = nk * rv, cd = 2 * nk * dk + vd;
    struct tensor qkvz, ba;
    int rc;
    (void)il;
    if ((rc = wm_linear(w, &qkvz, WM_REQUIRED, 0, cd + vd, hp->n_embd, e, "%s.in_proj_qkvz", pre)) < 0 ||
        (rc = wm_linear(w, &ba, WM_REQUIRED, 0, 2 * nk * r, hp->n_embd, e, "%s.in_proj_ba", pre)) < 0)
        return rc;
    int32_t *perm = malloc((size_t)(cd + vd) * sizeof *perm);
    if (!perm)
        return err_setf(e, ERR_NOMEM, "out of memory");
    /* part p of every group in turn: q (dk rows at 0), k (dk at dk), v (rv at 2 dk), z */
    static const int k_parts = 4;
    int64_t row = 0;
    for (int p = 0; p < k_parts; p++) {
        int64_t off = p == 0 ? 0 : p == 1 ? dk : p == 2 ? 2 * dk : 2 * dk + rv;
        int64_t len = p < 2 ? dk : rv;
        for (int64_t g = 0; g < nk; g++)
            for (int64_t j = 0; j < len; j++)
                perm[row++] = (int32_t)(g * G + off + j);
    }
    if ((rc = qwen3_next_permute_rows(m, w->st, &qkvz, perm, e)) == 0) {
        row = 0;
        for (int p = 0; p < 2; p++)
            for (int64_t g = 0; g < nk; g++)
                for (int64_t j = 0; j < r; j++)
                    perm[row++] = (int32_t)(g * 2 * r + p * r + j);
        rc = qwen3_next_permute_rows(m, w->st, &ba, perm, e);
    }
    free(perm);
    L->ssm_in = tensor_rows(&qkvz, 0, cd);
    L->ssm_z = tensor_rows(&qkvz, cd, vd);
    L->ssm_x = tensor_rows(&ba, 0, nk * r);
    L->ssm_xa = tensor_rows(&ba, nk * r, nk * r);
    return rc;
}

static const struct hf_moe_names qwen3_next_names = {
    .router = "model.layers.%d.mlp.gate", .experts = hf_mlp_experts_stacking,
    .shared = "model.layers.%d.mlp.shared_expert", .shared_gate = "model.layers.%d.mlp.shared_expert_gate",
};

static int qwen3_next_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    return qwen3_next_map_common(m, st, &qwen3_next_names, next_inproj, e);
}

/* mlx-lm's quant_predicate: the router and the shared expert's gate at 8 bits, group 64. */
static int qwen3_next_quant(const char *module, const struct quant_params *base,
                            struct quant_params *qp)
{
    static const char k_sfx[] = ".shared_expert_gate";
    size_t a = strlen(module), b = sizeof k_sfx - 1;
    if (a > b && strcmp(module + a - b, k_sfx) == 0)
        return hf_quant_gate_8bit("mlp.gate", base, qp);
    return hf_quant_gate_8bit(module, base, qp);
}

static const char *const qwen3_next_archs[] = {"Qwen3NextForCausalLM", NULL};

const struct model_ops qwen3_next_ops = {
    .family = "qwen3_next",
    .description = "Qwen3-Next: gated DeltaNet + gated attention hybrid, sparse MoE with a "
                   "sigmoid-gated shared expert",
    .architectures = qwen3_next_archs,
    .parse_config = qwen3_next_parse_config,
    .map_weights = qwen3_next_map_weights,
    .forward = decoder_forward,
    .mtp = MTP_QWEN3_NEXT,  /* model_load_mtp: the mtp.* module (ADR 0135) */
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = qwen3_next_quant,
};
