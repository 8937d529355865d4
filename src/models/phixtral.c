/*
 * phixtral: Phixtral (model_type "phi-msft", alias "phixtral"): the Phi-2
 * backbone with a Mixtral-style sparse MoE in place of the MLP
 * (mlabonne/phixtral-4x2_8, -2x2_8; contract of mlx-lm models/phixtral.py).
 *
 *   block(x) = x + attn(ln(x)) + moe(ln(x))        one LayerNorm, parallel residual
 *   attn     = out_proj(attend(rope(split3(Wqkv ln(x)))))   biases; NeoX RoPE on
 *              the first rotary_dim dims of each head; scale 1/sqrt(head_dim)
 *   moe      = sum over the top-k gate logits (softmax over those k only) of
 *              fc2(gelu_tanh(fc1(x))), expert linears with biases
 *   head     = lm_head.linear(lm_head.ln(x))
 *
 * Config uses the phi-msft names. Unlike mlx-lm, which reads only the MoE
 * fields and assumes Phi-2 sizes, every field is honoured, so a Phixtral of
 * any size loads; n_inner null means 4 * n_embd.
 *
 * Weights: the published per-expert layout (moe.mlp.E.fc1) and the mlx-lm
 * converted stacked layout (moe.switch_mlp.fc1 [E, out, in]) both bind to the
 * canonical expert views without copying (hf_map_expert_linear).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/convert.h"
#include "blocks.h"
#include "hf_common.h"


/* Defaults of the phi-msft config (PhiConfig of the Phixtral release) where the
 * field may be absent or null. */
#define PHIXTRAL_DEFAULT_EPS   1e-5f
#define PHIXTRAL_ROPE_THETA    10000.0f
#define PHIXTRAL_INNER_FACTOR  4

static int phixtral_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc, n_head_kv, n_inner;
    char act[32];
    if ((rc = cfg_int(cfg, "vocab_size", &hp->n_vocab, e)) < 0 ||
        (rc = cfg_int(cfg, "n_embd", &hp->n_embd, e)) < 0 ||
        (rc = cfg_int(cfg, "n_head", &hp->n_head, e)) < 0 ||
        (rc = cfg_int(cfg, "n_layer", &hp->n_layer, e)) < 0 ||
        (rc = cfg_int(cfg, "rotary_dim", &hp->n_rot, e)) < 0 ||
        (rc = cfg_int(cfg, "n_positions", &hp->n_ctx, e)) < 0 ||
        (rc = cfg_int(cfg, "num_local_experts", &hp->n_expert, e)) < 0 ||
        (rc = cfg_int(cfg, "num_experts_per_tok", &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "n_head_kv", 0, &n_head_kv, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "n_inner", 0, &n_inner, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "layer_norm_epsilon", PHIXTRAL_DEFAULT_EPS, &hp->norm_eps, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "rope_theta", PHIXTRAL_ROPE_THETA, &hp->rope_theta, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", false, &hp->tie_embd, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "activation_function", "gelu_new", act, sizeof act, e)) < 0)
        return rc;

    /* the rules mlx-lm leaves implicit, checked here with the field named; n_embd is
     * bounded before 4 * n_embd is computed (in 64 bits, then checked) */
    if ((rc = hparams_check_dim(hp->n_embd, "n_embd", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_head, "n_head", 1, HP_MAX_HEADS, e)) < 0)
        return rc;
    if (hp->n_embd % hp->n_head != 0)
        return err_setf(e, ERR_CONFIG, "config field 'n_embd' = %d is not divisible by 'n_head' = %d",
                        hp->n_embd, hp->n_head);
    if (hp->n_expert < 1 || hp->n_expert > HP_MAX_EXPERTS)
        return err_setf(e, ERR_CONFIG, "config field 'num_local_experts' = %d must be in [1, %d]",
                        hp->n_expert, HP_MAX_EXPERTS);
    if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return err_setf(e, ERR_CONFIG,
                        "config field 'num_experts_per_tok' = %d must be between 1 and num_local_experts = %d",
                        hp->n_expert_used, hp->n_expert);
    hp->head_dim = hp->n_embd / hp->n_head;
    if (hp->n_rot < 0 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return err_setf(e, ERR_CONFIG,
                        "config field 'rotary_dim' = %d must be even and at most head_dim = %d",
                        hp->n_rot, hp->head_dim);
    if (n_head_kv != 0 && n_head_kv != hp->n_head)
        return err_setf(e, ERR_UNSUPPORTED,
                        "config field 'n_head_kv' = %d: Phixtral's fused Wqkv splits evenly (n_head_kv must equal n_head)",
                        n_head_kv);
    if (n_inner < 0)
        return err_setf(e, ERR_CONFIG, "config field 'n_inner' = %d must not be negative", n_inner);
    if (strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0 && strcmp(act, "gelu_fast") != 0)
        return err_setf(e, ERR_UNSUPPORTED,
                        "config field 'activation_function' = '%s': Phixtral experts use gelu_new", act);

    hp->n_kv_head = hp->n_head;
    int64_t n_ff = n_inner ? n_inner : (int64_t)PHIXTRAL_INNER_FACTOR * hp->n_embd;
    if ((rc = hparams_check_dim(n_ff, n_inner ? "n_inner" : "4 * n_embd", 1, HP_MAX_DIM, e)) < 0)
        return rc;
    hp->n_ff = (int)n_ff;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->norm = NORM_LAYER;
    hp->parallel_residual = true;
    hp->qkv_bias = hp->out_bias = true;
    hp->ffn = FFN_MLP;
    hp->act = ACT_GELU_TANH;
    hp->ffn_bias = true;
    hp->head_bias = true;
    hp->router = ROUTER_TOPK_SOFTMAX;
    hparams_fill_layers(hp);
    return 0;
}

/* Expert linears: published per-expert names and mlx-lm's stacked SwitchMLP names
 * (mlx-lm models/phixtral.py sanitize); map_weights binds either, convert stacks. */
static const struct expert_stack_rule phixtral_stacking[] = {
    {"transformer.h.%d.moe.mlp.%d.fc1", "transformer.h.%d.moe.switch_mlp.fc1"},
    {"transformer.h.%d.moe.mlp.%d.fc2", "transformer.h.%d.moe.switch_mlp.fc2"},
    {NULL, NULL},
};

static int phixtral_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &hp->quant};
    int64_t d = hp->n_embd;
    char pre[128], ln[160];
    int rc;
    if ((rc = hf_experts_alloc(m, e)) < 0 ||
        (rc = hf_map_head(m, &w, "transformer.embd.wte", "lm_head.ln", "lm_head.linear", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(pre, sizeof pre, "transformer.h.%d", il);
        snprintf(ln, sizeof ln, "%s.ln", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, ln, e)) < 0 ||
            (rc = wm_linear(&w, &L->wqkv, WM_REQUIRED, 0, 3 * d, d, e, "%s.mixer.Wqkv", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bqkv, WM_REQUIRED, 3 * d, e, "%s.mixer.Wqkv.bias", pre)) < 0 ||
            (rc = wm_linear(&w, &L->wo, WM_REQUIRED, 0, d, d, e, "%s.mixer.out_proj", pre)) < 0 ||
            (rc = wm_vec(&w, &L->bo, WM_REQUIRED, d, e, "%s.mixer.out_proj.bias", pre)) < 0 ||
            (rc = wm_linear(&w, &L->router, WM_REQUIRED, 0, hp->n_expert, d, e, "%s.moe.gate", pre)) < 0 ||
            (rc = hf_map_expert_linear(m, &w, &L->ex.up, il, hp->n_ff, d, true,
                                       phixtral_stacking[0].per_expert,
                                       phixtral_stacking[0].stacked, e)) < 0 ||
            (rc = hf_map_expert_linear(m, &w, &L->ex.down, il, d, hp->n_ff, true,
                                       phixtral_stacking[1].per_expert,
                                       phixtral_stacking[1].stacked, e)) < 0)
            return rc;
    }
    return 0;
}

static const char *const phixtral_archs[] = {"PhixtralForCausalLM", NULL};

const struct model_ops phixtral_ops = {
    .family = "phixtral",
    .description = "Phixtral (phi-msft): Phi-2 backbone + top-k MoE of gelu MLP experts",
    .architectures = phixtral_archs,
    .parse_config = phixtral_parse_config,
    .map_weights = phixtral_map_weights,
    .forward = decoder_forward,
    .expert_stacking = phixtral_stacking,
};
