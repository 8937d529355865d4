/*
 * deepseek_v2: DeepseekV2ForCausalLM, and the parts DeepSeek-V3 shares (deepseek.h).
 *
 *   block(x) = x + mla(rms(x)); x + ffn(rms(x))        pre-norm, RMSNorm everywhere
 *   mla      per head h (n_head heads; qk_nope_head_dim + qk_rope_head_dim query dims,
 *            v_head_dim value dims):
 *              q          = q_proj(x), or q_b_proj(rms(q_a_proj(x))) when q_lora_rank is set
 *              [c | k_pe] = kv_a_proj_with_mqa(x)     c: kv_lora_rank, k_pe: qk_rope_head_dim
 *              [k_nope_h | v_h] = kv_b_proj(rms(c))   per head, from the normalized latent
 *              scores_h   = (q_nope_h . k_nope_h + rope(q_pe_h) . rope(k_pe)) * scale
 *            rope on interleaved pairs (2j, 2j + 1) (V2's complex rope; V3's rope_interleave,
 *            default true, a permutation of the same), k_pe shared by every head; scale =
 *            (qk_nope + qk_rope)^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 when the
 *            rope is scaled and mscale_all_dim is set (transformers does so for V3; its V2
 *            omits it, DeepSeek's own V2 code applies it: we follow the latter, see ADR 0019)
 *            The q_a / kv_a norms use eps 1e-6 (transformers' RMSNorm default).
 *   cache    KV_LATENT: per position [rms(c) | rope(k_pe)], kv_lora_rank + qk_rope_head_dim
 *            floats, attended in the absorbed form (blk_mla_attention): q_nope_h through
 *            head h's k rows of kv_b_proj gives a query against the latent itself, and the
 *            attended latent through its v rows gives v_h.
 *   ffn      layers il < first_k_dense_replace (and il % moe_layer_freq != 0): SwiGLU of
 *            intermediate_size; the others: routed experts of moe_intermediate_size plus
 *            n_shared_experts shared ones (one SwiGLU of n_shared * moe_intermediate_size,
 *            added without a gate)
 *   router   V2: softmax over all n_routed_experts; topk_method "greedy" (top-k) or
 *            "group_limited_greedy" (only the topk_group of n_group groups with the best
 *            single expert); weights x routed_scaling_factor (transformers 5: no renormalization)
 *            V3 (noaux_tc): sigmoid scores; the choice on score + e_score_correction_bias (F32),
 *            groups ranked by the sum of their top 2; weights the plain scores, renormalized
 *            with norm_topk_prob (default true), x routed_scaling_factor
 *
 * Config defaults (transformers DeepseekV2Config / DeepseekV3Config): q_lora_rank 1536 (null:
 * none), kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
 * n_shared_experts V2 2 / V3 1 (null: none), first_k_dense_replace V2 0 / V3 3,
 * moe_layer_freq 1, routed_scaling_factor V2 1 / V3 2.5, n_group V2 1 / V3 8, topk_group V2 1
 * / V3 4, topk_method V2 "greedy", norm_topk_prob V3 true, rope_interleave V3 true.
 *
 * Checkpoint names (model.layers.N.): self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj},
 * self_attn.{kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}, mlp.{gate,up,down}_proj
 * (dense), mlp.gate (+ .e_score_correction_bias for V3), mlp.experts.E.{gate,up,down}_proj or
 * mlx-lm's stacked mlp.switch_mlp.*, mlp.shared_experts.{gate,up,down}_proj.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "deepseek.h"
#include "hf_common.h"
#include "../loading/config.h"

/* transformers DeepseekV2Config / DeepseekV3Config defaults of the fields shared with Llama */
static const struct hf_defaults deepseek_defaults = {
    .eps_key = "rms_norm_eps", .norm_eps = 1e-6f,
    .rope_theta = 10000.0f, .partial_rotary = 1.0f, .act = "silu",
    .head_dim = 0, .sliding = false, .tie_embd = false,
};

/* An int field where null means "none" (0) and absence the default. */
static int int_or_null(const cJSON *cfg, const char *key, int def, int *out, struct err *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (it && cJSON_IsNull(it)) {
        *out = 0;
        return 0;
    }
    return cfg_opt_int(cfg, key, def, out, e);
}

static double yarn_get_mscale(double factor, double mscale)
{
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

/* The softmax scale: (qk_nope + qk_rope)^-0.5, times mscale(factor, mscale_all_dim)^2 under a
 * scaled rope that states mscale_all_dim. */
static int mla_scale(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    double scale = 1.0 / sqrt((double)(hp->qk_nope_dim + hp->qk_rope_dim));
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (hp->rope != ROPE_DEFAULT && rs && cJSON_IsObject(rs)) {
        float all, factor;
        int rc;
        if ((rc = cfg_opt_float(rs, "mscale_all_dim", 0.0f, &all, e)) < 0 ||
            (rc = cfg_opt_float(rs, "factor", 1.0f, &factor, e)) < 0)
            return err_prefix(e, "rope_scaling");
        if (all != 0.0f) {
            double ms = yarn_get_mscale(factor, all);
            scale *= ms * ms;
        }
    }
    hp->attn_scale = (float)scale;
    return 0;
}

static int parse_mla(struct hparams *hp, const cJSON *cfg, const struct deepseek_mla_defaults *md,
                     struct err *e)
{
    int rc;
    bool bias;
    if ((rc = int_or_null(cfg, "q_lora_rank", md->q_lora_rank, &hp->q_lora_rank, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "kv_lora_rank", md->kv_lora_rank, &hp->kv_lora_rank, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "qk_nope_head_dim", md->qk_nope_dim, &hp->qk_nope_dim, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "qk_rope_head_dim", md->qk_rope_dim, &hp->qk_rope_dim, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "v_head_dim", md->v_head_dim, &hp->v_head_dim, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "attention_bias", false, &bias, e)) < 0)
        return rc;
    if (bias)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'attention_bias' = true is not supported "
                        "with latent attention");
    if ((rc = hparams_check_dim(hp->q_lora_rank, "q_lora_rank", 0, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->kv_lora_rank, "kv_lora_rank", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->qk_nope_dim, "qk_nope_head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->qk_rope_dim, "qk_rope_head_dim", 2, 2 * HP_MAX_ROT_HALF, e)) < 0 ||
        (rc = hparams_check_dim(hp->v_head_dim, "v_head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0)
        return rc;
    if (hp->qk_rope_dim % 2 != 0)
        return err_setf(e, ERR_CONFIG, "config field 'qk_rope_head_dim' = %d must be even",
                        hp->qk_rope_dim);
    if (hp->kv_lora_rank + hp->qk_rope_dim > HP_MAX_HEAD_DIM)
        return err_setf(e, ERR_CONFIG, "kv_lora_rank + qk_rope_head_dim = %d exceeds %d",
                        hp->kv_lora_rank + hp->qk_rope_dim, HP_MAX_HEAD_DIM);
    /* every head has its own q and kv_b rows; the shared rope key makes it one "kv head" */
    hp->head_dim = hp->qk_nope_dim + hp->qk_rope_dim;
    hp->n_kv_head = hp->n_head;
    hp->n_rot = hp->qk_rope_dim;
    return 0;
}

static int parse_router(struct hparams *hp, const cJSON *cfg, enum deepseek_version v,
                        struct err *e)
{
    int rc;
    char method[32];
    bool v3 = v == DEEPSEEK_V3;
    if ((rc = cfg_opt_float(cfg, "routed_scaling_factor", v3 ? 2.5f : 1.0f, &hp->moe_scale, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "n_group", v3 ? 8 : 1, &hp->moe_n_group, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "topk_group", v3 ? 4 : 1, &hp->moe_topk_group, e)) < 0 ||
        (rc = cfg_opt_str(cfg, "topk_method", v3 ? "noaux_tc" : "greedy", method, sizeof method, e)) < 0)
        return rc;
    if (v3) {
        /* transformers' V3 router is noaux_tc whatever the config says; refuse the others
         * rather than run them as noaux_tc */
        if (strcmp(method, "noaux_tc") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'topk_method' = '%s' is not "
                            "supported (noaux_tc)", method);
        hp->router = ROUTER_GROUP_SIGMOID;
        hp->router_bias = true;
        return cfg_opt_bool(cfg, "norm_topk_prob", true, &hp->moe_norm, e);
    }
    hp->router = ROUTER_GROUP_SOFTMAX;
    hp->moe_norm = false;
    if (strcmp(method, "greedy") == 0) {
        hp->moe_n_group = hp->moe_topk_group = 1;
    } else if (strcmp(method, "group_limited_greedy") != 0) {
        return err_setf(e, ERR_UNSUPPORTED, "config field 'topk_method' = '%s' is not supported "
                        "(greedy, group_limited_greedy)", method);
    }
    return 0;
}

/* DeepseekV2Config / DeepseekV3Config defaults of the latent attention */
static const struct deepseek_mla_defaults deepseek_mla = {
    .q_lora_rank = 1536, .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64,
    .v_head_dim = 128,
};

int deepseek_parse_mla(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                       const struct deepseek_mla_defaults *md, struct err *e)
{
    bool interleave = true;
    int rc;
    if ((rc = hf_parse_decoder(hp, cfg, d, e)) < 0 || (rc = parse_mla(hp, cfg, md, e)) < 0)
        return rc;
    hp->qkv_bias = hp->out_bias = false;
    if (md->rope_interleave && (rc = cfg_opt_bool(cfg, "rope_interleave", true, &interleave, e)) < 0)
        return rc;
    hp->rope_style = interleave ? ROPE_STYLE_PAIRS : ROPE_STYLE_HALF;
    return mla_scale(hp, cfg, e);
}

int deepseek_latent_layers(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                           struct err *e)
{
    int rc;
    if ((rc = hf_finish_layers(hp, cfg, d, 0, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        if (hp->layer[il].kv != KV_FULL)
            return err_setf(e, ERR_UNSUPPORTED, "layer %d: sliding windows are not supported with "
                            "latent attention", il);
        hp->layer[il].kv = KV_LATENT;
    }
    return 0;
}

int deepseek_parse_config(struct hparams *hp, const cJSON *cfg, enum deepseek_version v,
                          struct err *e)
{
    bool v3 = v == DEEPSEEK_V3;
    int rc, n_routed, moe_ff, n_shared, first_dense, freq;
    struct deepseek_mla_defaults md = deepseek_mla;
    md.rope_interleave = v3;
    if ((rc = deepseek_parse_mla(hp, cfg, &deepseek_defaults, &md, e)) < 0)
        return rc;

    if ((rc = int_or_null(cfg, "n_routed_experts", 0, &n_routed, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_experts_per_tok", 0, &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_intermediate_size", 1407, &moe_ff, e)) < 0 ||
        (rc = int_or_null(cfg, "n_shared_experts", v3 ? 1 : 2, &n_shared, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "first_k_dense_replace", v3 ? 3 : 0, &first_dense, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_layer_freq", 1, &freq, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(n_routed, "n_routed_experts", 0, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(moe_ff, "moe_intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(n_shared, "n_shared_experts", 0, 1024, e)) < 0 ||
        (rc = hparams_check_dim(first_dense, "first_k_dense_replace", 0, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(freq, "moe_layer_freq", 1, HP_MAX_LAYERS, e)) < 0 ||
        (n_routed > 0 &&
         (rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, n_routed, e)) < 0) ||
        (rc = hparams_check_dim((int64_t)moe_ff * n_shared, "n_shared_experts * moe_intermediate_size",
                                0, HP_MAX_DIM, e)) < 0)
        return rc;
    hp->n_expert = n_routed;
    if (n_routed > 0 && (rc = parse_router(hp, cfg, v, e)) < 0)
        return rc;
    if ((rc = deepseek_latent_layers(hp, cfg, &deepseek_defaults, e)) < 0)
        return rc;
    int ff = hp->n_ff, widest = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->moe = n_routed > 0 && il >= first_dense && il % freq == 0;
        ls->n_ff = ls->moe ? moe_ff : ff;
        ls->n_ff_shexp = ls->moe ? moe_ff * n_shared : 0;
        ls->shexp_plain = true;
        ls->router = ls->moe ? hp->router : ROUTER_NONE;
        widest = ls->n_ff > widest ? ls->n_ff : widest;
        widest = ls->n_ff_shexp > widest ? ls->n_ff_shexp : widest;
    }
    hp->n_ff = widest;
    return 0;
}

/* ---- weights ---- */

/* Row r of kv_b_proj (or of embed_q / unembed_out, rows of all heads in order; n elements)
 * as f32: widened, or dequantized from MLX affine codes (w = scale * q + bias per group;
 * codes packed LSB first, as the kernels read them). */
static void kvb_row(float *dst, const struct tensor *t, int64_t r, int n)
{
    int64_t rs = t->stride[t->ndim - 2];
    if (!t->qbits) {
        dtype_to_f32_ref(dst, (const char *)t->data + (size_t)(r * rs) * dtype_size(t->dtype),
                         t->dtype, (size_t)n);
        return;
    }
    const uint8_t *row = (const uint8_t *)t->data + (size_t)(r * rs) * dtype_size(t->dtype);
    size_t groups = (size_t)(n / t->qgroup), ss = dtype_size(t->qsdtype);
    const char *sc = (const char *)t->qscales + (size_t)r * groups * ss;
    const char *bi = (const char *)t->qbiases + (size_t)r * groups * ss;
    for (int j = 0; j < n; j++) {
        size_t o = (size_t)j * (size_t)t->qbits, g = (size_t)j / (size_t)t->qgroup;
        unsigned v = row[o >> 3];
        if ((o & 7) + (size_t)t->qbits > 8)
            v |= (unsigned)row[(o >> 3) + 1] << 8;
        unsigned q = (v >> (o & 7)) & ((1u << t->qbits) - 1);
        float s, b;
        dtype_to_f32_ref(&s, sc + g * ss, t->qsdtype, 1);
        dtype_to_f32_ref(&b, bi + g * ss, t->qsdtype, 1);
        dst[j] = s * (float)q + b;
    }
}

/* kv_b_proj [n_head * (nope + v), kv_lora_rank] into wk_lat [n_head, kv_lora_rank, nope] (its
 * k rows transposed) and wv_lat [n_head, v, kv_lora_rank + rope] (its v rows, zero past the
 * latent), F32 (dequantized when affine-quantized), at *mem (advanced). */
static int split_kv_b(const struct hparams *hp, const struct tensor *kvb, bool recording,
                      struct layer *L, float **mem, struct err *e)
{
    int H = hp->n_head, r = hp->kv_lora_rank, lr = r + hp->qk_rope_dim;
    int nope = hp->qk_nope_dim, vd = hp->v_head_dim;
    if (kvb->qbits ? kvb->qmode != QMODE_AFFINE || !kvb->qbiases : !dtype_is_float(kvb->dtype))
        return err_setf(e, ERR_UNSUPPORTED, "%s: kv_b_proj must be float or affine-quantized",
                        kvb->name ? kvb->name : "kv_b_proj");
    float *wk = *mem, *wv = wk + (size_t)H * r * nope, *row = wv + (size_t)H * vd * lr;
    /* `mlxcel synth` records the names only: nothing to read */
    for (int h = 0; h < H && !recording; h++) {
        for (int j = 0; j < nope + vd; j++) {
            kvb_row(row, kvb, (int64_t)h * (nope + vd) + j, r);
            if (j < nope) {
                for (int i = 0; i < r; i++)
                    wk[((size_t)h * r + i) * nope + j] = row[i];
            } else {
                float *dst = wv + ((size_t)h * vd + (j - nope)) * lr;
                memcpy(dst, row, (size_t)r * sizeof *dst);
                memset(dst + r, 0, (size_t)(lr - r) * sizeof *dst);
            }
        }
    }
    int64_t ks[3] = {H, r, nope}, vs[3] = {H, vd, lr};
    tensor_init(&L->wk_lat, DTYPE_F32, wk, 3, ks);
    tensor_init(&L->wv_lat, DTYPE_F32, wv, 3, vs);
    L->wk_lat.name = "kv_b_proj (k rows, transposed)";
    L->wv_lat.name = "kv_b_proj (v rows)";
    *mem = wv + (size_t)H * vd * lr;
    return 0;
}

/* mlx-lm's split of kv_b_proj (its deepseek_v3 sanitize): embed_q [n_head, kv_lora_rank, nope]
 * (the k rows transposed: wk_lat as it is) and unembed_out [n_head, v, kv_lora_rank] (wv_lat
 * without its zero rope columns), float or affine-quantized, into F32 at *mem (advanced). */
static int split_mlx(const struct hparams *hp, const struct tensor *eq, const struct tensor *uo,
                     bool recording, struct layer *L, float **mem, struct err *e)
{
    int H = hp->n_head, r = hp->kv_lora_rank, lr = r + hp->qk_rope_dim;
    int nope = hp->qk_nope_dim, vd = hp->v_head_dim;
    for (int i = 0; i < 2; i++) {
        const struct tensor *t = i ? uo : eq;
        if (t->qbits ? t->qmode != QMODE_AFFINE || !t->qbiases : !dtype_is_float(t->dtype))
            return err_setf(e, ERR_UNSUPPORTED, "%s must be float or affine-quantized",
                            t->name ? t->name : i ? "unembed_out" : "embed_q");
    }
    float *wk = *mem, *wv = wk + (size_t)H * r * nope;
    for (int64_t k = 0; k < (int64_t)H * r && !recording; k++)
        kvb_row(wk + k * nope, eq, k, nope);
    for (int64_t k = 0; k < (int64_t)H * vd && !recording; k++) {
        kvb_row(wv + k * lr, uo, k, r);
        memset(wv + k * lr + r, 0, (size_t)(lr - r) * sizeof *wv);
    }
    int64_t ks[3] = {H, r, nope}, vs[3] = {H, vd, lr};
    tensor_init(&L->wk_lat, DTYPE_F32, wk, 3, ks);
    tensor_init(&L->wv_lat, DTYPE_F32, wv, 3, vs);
    L->wk_lat.name = "embed_q";
    L->wv_lat.name = "unembed_out";
    *mem = wv + (size_t)H * vd * lr;
    return 0;
}

static int map_mla(struct model *m, struct wmap *w, struct layer *L, int il, float **mem,
                   struct tensor *views, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t H = hp->n_head, hd = hp->head_dim, d = hp->n_embd, r = hp->kv_lora_rank;
    int64_t q_in = hp->q_lora_rank > 0 ? hp->q_lora_rank : d;
    char pre[256];
    struct tensor kvb;
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.self_attn", il);
    if (hp->q_lora_rank > 0) {
        if ((rc = wm_linear(w, &L->wq_a, WM_REQUIRED, 0, q_in, d, e, "%s.q_a_proj", pre)) < 0 ||
            (rc = wm_vec(w, &L->q_a_norm, WM_REQUIRED, q_in, e, "%s.q_a_layernorm.weight", pre)) < 0 ||
            (rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, H * hd, q_in, e, "%s.q_b_proj", pre)) < 0)
            return rc;
    } else if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, H * hd, d, e, "%s.q_proj", pre)) < 0) {
        return rc;
    }
    bool rec = st_set_is_recording(w->st);
    if ((rc = wm_linear(w, &L->wkv_a, WM_REQUIRED, 0, r + hp->qk_rope_dim, d, e,
                        "%s.kv_a_proj_with_mqa", pre)) < 0 ||
        (rc = wm_vec(w, &L->kv_a_norm, WM_REQUIRED, r, e, "%s.kv_a_layernorm.weight", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, H * hp->v_head_dim, e, "%s.o_proj", pre)) < 0)
        return rc;
    if (wm_has(w, "%s.embed_q.weight", pre)) {
        struct tensor eq, uo;
        if ((rc = wm_linear(w, &eq, WM_REQUIRED, H, r, hp->qk_nope_dim, e, "%s.embed_q", pre)) < 0 ||
            (rc = wm_linear(w, &uo, WM_REQUIRED, H, hp->v_head_dim, r, e, "%s.unembed_out", pre)) < 0 ||
            (rc = split_mlx(hp, &eq, &uo, rec, L, mem, e)) < 0)
            return rc;
    } else if ((rc = wm_linear(w, &kvb, WM_REQUIRED, 0, H * (hp->qk_nope_dim + hp->v_head_dim), r, e,
                               "%s.kv_b_proj", pre)) < 0 ||
               (rc = split_kv_b(hp, &kvb, rec, L, mem, e)) < 0) {
        return rc;
    }
    L->mla_heads = views;
    for (int64_t h = 0; h < H; h++) {
        views[4 * h] = tensor_rows(&L->wq, h * hd, hp->qk_nope_dim);
        views[4 * h + 1] = tensor_rows(&L->wq, h * hd + hp->qk_nope_dim, hp->qk_rope_dim);
        views[4 * h + 2] = tensor_slice0(&L->wk_lat, h);
        views[4 * h + 3] = tensor_slice0(&L->wv_lat, h);
    }
    return 0;
}

static int map_ffn(struct model *m, struct wmap *w, struct layer *L, int il, float **mem,
                   struct err *e)
{
    const struct hparams *hp = &m->hp;
    const struct layer_spec *ls = &hp->layer[il];
    int64_t d = hp->n_embd, ff = ls->n_ff;
    char pre[256];
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.mlp", il);
    if (!ls->moe) {
        if ((rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
            return rc;
        return 0;
    }
    if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, hp->n_expert, d, e, "%s.gate", pre)) < 0)
        return rc;
    if (hp->router_bias) {
        if ((rc = wm_vec(w, &L->router_b, WM_REQUIRED, hp->n_expert, e,
                         "%s.gate.e_score_correction_bias", pre)) < 0)
            return rc;
        /* published F32; another float dtype (a conversion) is widened once, exactly */
        if (L->router_b.dtype != DTYPE_F32) {
            if (L->router_b.qbits || !dtype_is_float(L->router_b.dtype))
                return err_setf(e, ERR_FORMAT, "%s.gate.e_score_correction_bias: dtype %s, expected "
                                "a float", pre, dtype_name(L->router_b.dtype));
            int64_t shape[1] = {hp->n_expert};
            if (!st_set_is_recording(w->st))
                dtype_to_f32_ref(*mem, L->router_b.data, L->router_b.dtype, (size_t)hp->n_expert);
            tensor_init(&L->router_b, DTYPE_F32, *mem, 1, shape);
            L->router_b.name = "e_score_correction_bias (widened to F32)";
            *mem += hp->n_expert;
        }
    }
    int64_t sff = ls->n_ff_shexp;
    if (sff > 0 &&
        ((rc = wm_linear(w, &L->shexp_gate, WM_REQUIRED, 0, sff, d, e, "%s.shared_experts.gate_proj", pre)) < 0 ||
         (rc = wm_linear(w, &L->shexp_up, WM_REQUIRED, 0, sff, d, e, "%s.shared_experts.up_proj", pre)) < 0 ||
         (rc = wm_linear(w, &L->shexp_down, WM_REQUIRED, 0, d, sff, e, "%s.shared_experts.down_proj", pre)) < 0))
        return rc;
    const struct expert_stack_rule *r = hf_mlp_experts_stacking;
    if ((rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ff, d, false, r[0].per_expert, r[0].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.down, il, d, ff, false, r[1].per_expert, r[1].stacked, e)) < 0 ||
        (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ff, d, false, r[2].per_expert, r[2].stacked, e)) < 0)
        return rc;
    return 0;
}

int deepseek_map_weights(struct model *m, struct st_set *st, struct err *e)
{
    const struct hparams *hp = &m->hp;
    struct wmap w = {st, &m->hp.quant};
    int rc;
    char pre[256];
    /* the per-head views, then the rearranged kv_b_proj factors, of every layer */
    size_t H = (size_t)hp->n_head, lr = (size_t)hp->kv_lora_rank + hp->qk_rope_dim;
    size_t per_layer = H * hp->kv_lora_rank * hp->qk_nope_dim + H * hp->v_head_dim * lr;
    size_t views = 4 * H * (size_t)hp->n_layer;
    /* per layer: the kv_b_proj factors, a widened correction bias; one latent row of scratch */
    per_layer += (size_t)hp->n_expert;
    m->derived = malloc(views * sizeof(struct tensor) +
                        (per_layer * hp->n_layer + (size_t)hp->kv_lora_rank) * sizeof(float));
    if (!m->derived)
        return err_setf(e, ERR_NOMEM, "out of memory for the latent attention weights");
    struct tensor *vw = m->derived;
    float *mem = (float *)(vw + views);
    if (hp->n_expert > 0 && (rc = hf_experts_alloc(m, e)) < 0)
        return rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        char n1[300], n2[300];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        snprintf(n1, sizeof n1, "%s.input_layernorm", pre);
        snprintf(n2, sizeof n2, "%s.post_attention_layernorm", pre);
        if ((rc = hf_map_norm(&w, hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = map_mla(m, &w, L, il, &mem, vw + 4 * H * (size_t)il, e)) < 0 ||
            (rc = map_ffn(m, &w, L, il, &mem, e)) < 0)
            return rc;
    }
    return 0;
}

/* ---- DeepSeek-V2 ---- */

static int deepseek_v2_parse_config(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    return deepseek_parse_config(hp, cfg, DEEPSEEK_V2, e);
}

static const char *const deepseek_v2_archs[] = {"DeepseekV2ForCausalLM", NULL};

const struct model_ops deepseek_v2_ops = {
    .family = "deepseek_v2",
    .description = "DeepSeek-V2: multi-head latent attention (latent KV cache), softmax-routed "
                   "experts + shared experts",
    .architectures = deepseek_v2_archs,
    .parse_config = deepseek_v2_parse_config,
    .map_weights = deepseek_map_weights,
    .forward = decoder_forward,
    .expert_stacking = hf_mlp_experts_stacking,
    .quant_predicate = hf_quant_gate_float,
};
