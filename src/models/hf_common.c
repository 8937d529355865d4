/*
 * hf_common: shared config normalization and tensor naming of the Hugging
 * Face decoder families (hf_common.h). The defaults below are the ones the
 * transformers config classes use; each is written here once.
 */
#include "hf_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/convert.h"

/* ---- config ---- */

static int parse_act(struct hparams *hp, const cJSON *cfg, const char *key, const char *def,
                     struct err *e)
{
    char act[64];
    int rc = cfg_opt_str(cfg, key, def, act, sizeof act, e);
    if (rc < 0)
        return rc;
    if (strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0)
        hp->act = ACT_SILU;
    else if (strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0 ||
             strcmp(act, "gelu_fast") == 0)
        hp->act = ACT_GELU_TANH;
    else if (strcmp(act, "gelu") == 0)
        hp->act = ACT_GELU_ERF;
    else if (strcmp(act, "relu") == 0)
        hp->act = ACT_RELU;
    else if (strcmp(act, "relu2") == 0)
        hp->act = ACT_RELU2;
    else
        return err_setf(e, ERR_UNSUPPORTED, "config field '%s': activation '%s' is not supported",
                        key, act);
    return 0;
}

/* transformers get_mscale: the yarn attention scale of a context factor. */
static double yarn_mscale(double factor, double mscale)
{
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

/* yarn (transformers _compute_yarn_parameters): original context defaults to
 * max_position_embeddings; the cos/sin scale to get_mscale(factor), or the
 * mscale / mscale_all_dim ratio when both are given. */
static int parse_yarn(struct hparams *hp, const cJSON *rs, struct err *e)
{
    int rc;
    float mscale, mscale_all;
    hp->rope = ROPE_YARN;
    /* a stated original context must be positive (transformers divides by it); checked
     * before the default below replaces it */
    if (cfg_has(rs, "original_max_position_embeddings") && hp->rope_orig_ctx <= 0)
        return err_setf(e, ERR_CONFIG, "rope_scaling: original_max_position_embeddings %d must be positive",
                        hp->rope_orig_ctx);
    if (hp->rope_orig_ctx <= 0)
        hp->rope_orig_ctx = hp->n_ctx;
    if ((rc = cfg_float(rs, "factor", &hp->rope_factor, e)) < 0 ||
        (rc = cfg_opt_float(rs, "beta_fast", 32.0f, &hp->rope_beta_fast, e)) < 0 ||
        (rc = cfg_opt_float(rs, "beta_slow", 1.0f, &hp->rope_beta_slow, e)) < 0 ||
        (rc = cfg_opt_bool(rs, "truncate", true, &hp->rope_truncate, e)) < 0 ||
        (rc = cfg_opt_float(rs, "mscale", 0.0f, &mscale, e)) < 0 ||
        (rc = cfg_opt_float(rs, "mscale_all_dim", 0.0f, &mscale_all, e)) < 0)
        return err_prefix(e, "rope_scaling");
    /* transformers: a stated original context replaces the factor by the context ratio
     * (DeepSeek-V3, gpt-oss), for the frequencies and the attention factor alike */
    if (cfg_has(rs, "original_max_position_embeddings")) {
        hp->rope_factor = (float)((double)hp->n_ctx / hp->rope_orig_ctx);
    }
    double af = mscale != 0.0f && mscale_all != 0.0f
                    ? yarn_mscale(hp->rope_factor, mscale) / yarn_mscale(hp->rope_factor, mscale_all)
                    : yarn_mscale(hp->rope_factor, 1.0);
    if ((rc = cfg_opt_float(rs, "attention_factor", (float)af, &hp->rope_attn_factor, e)) < 0)
        return err_prefix(e, "rope_scaling");
    return 0;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5). */
static int parse_rope_scaling(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    if (!rs || cJSON_IsNull(rs))
        return 0;
    if (!cJSON_IsObject(rs))
        return err_setf(e, ERR_CONFIG, "config field 'rope_scaling' must be an object");
    char type[32];
    int rc;
    if ((rc = cfg_opt_str(rs, "rope_type", "", type, sizeof type, e)) < 0)
        return rc;
    if (!type[0] && (rc = cfg_opt_str(rs, "type", "default", type, sizeof type, e)) < 0)
        return rc;
    if ((rc = cfg_opt_float(rs, "rope_theta", hp->rope_theta, &hp->rope_theta, e)) < 0)
        return rc;
    int orig_top;
    if ((rc = cfg_opt_int(cfg, "original_max_position_embeddings", 0, &orig_top, e)) < 0 ||
        (rc = cfg_opt_int(rs, "original_max_position_embeddings", orig_top, &hp->rope_orig_ctx, e)) < 0)
        return rc;

    /* Qwen2-VL's published configs say "mrope" for default rope over M-RoPE's sections
     * (transformers maps it to "default"; the sections are the family's to read) */
    if (strcmp(type, "default") == 0 || strcmp(type, "mrope") == 0)
        return 0;
    if (strcmp(type, "linear") == 0) {
        hp->rope = ROPE_LINEAR;
        return cfg_float(rs, "factor", &hp->rope_factor, e);
    }
    if (strcmp(type, "llama3") == 0) {
        hp->rope = ROPE_LLAMA3;
        if ((rc = cfg_float(rs, "factor", &hp->rope_factor, e)) < 0 ||
            (rc = cfg_float(rs, "low_freq_factor", &hp->rope_low_freq_factor, e)) < 0 ||
            (rc = cfg_float(rs, "high_freq_factor", &hp->rope_high_freq_factor, e)) < 0)
            return err_prefix(e, "rope_scaling");
        return 0;
    }
    if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0) {
        hp->rope = ROPE_LONGROPE;
        int half = hp->n_rot / 2;
        if (half > HP_MAX_ROT_HALF)
            return err_setf(e, ERR_CONFIG, "longrope: %d rotary dims are too many", hp->n_rot);
        if ((rc = cfg_float_array(rs, "short_factor", hp->rope_short, half, e)) < 0 ||
            (rc = cfg_float_array(rs, "long_factor", hp->rope_long, half, e)) < 0)
            return err_prefix(e, "rope_scaling");
        if (hp->rope_orig_ctx <= 0)
            return err_setf(e, ERR_CONFIG, "longrope needs original_max_position_embeddings");
        /* transformers: factor = max_position_embeddings / original; the cos/sin scale
         * defaults to sqrt(1 + ln(factor) / ln(original)) when the factor exceeds 1. */
        double factor = (double)hp->n_ctx / hp->rope_orig_ctx;
        float af = factor <= 1.0 || hp->rope_orig_ctx < 2
                       ? 1.0f : (float)sqrt(1.0 + log(factor) / log((double)hp->rope_orig_ctx));
        return cfg_opt_float(rs, "attention_factor", af, &hp->rope_attn_factor, e);
    }
    if (strcmp(type, "yarn") == 0)
        return parse_yarn(hp, rs, e);
    if (strcmp(type, "dynamic") == 0) {
        /* transformers _compute_dynamic_ntk_parameters: the original context is
         * max_position_embeddings */
        hp->rope = ROPE_DYNAMIC;
        hp->rope_orig_ctx = hp->n_ctx;
        hp->n_ctx_max = HP_MAX_CTX; /* transformers sets no bound */
        if ((rc = cfg_float(rs, "factor", &hp->rope_factor, e)) < 0)
            return err_prefix(e, "rope_scaling");
        return 0;
    }
    return err_setf(e, ERR_UNSUPPORTED, "rope_scaling type '%s' is not supported", type);
}

int hf_parse_decoder(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                     struct err *e)
{
    int rc;
    float partial;
    if ((rc = cfg_int(cfg, "vocab_size", &hp->n_vocab, e)) < 0 ||
        (rc = cfg_int(cfg, "hidden_size", &hp->n_embd, e)) < 0 ||
        (rc = cfg_int(cfg, "num_hidden_layers", &hp->n_layer, e)) < 0 ||
        (rc = cfg_int(cfg, "num_attention_heads", &hp->n_head, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "num_key_value_heads", hp->n_head, &hp->n_kv_head, e)) < 0 ||
        (rc = cfg_int(cfg, "intermediate_size", &hp->n_ff, e)) < 0 ||
        (rc = cfg_int(cfg, "max_position_embeddings", &hp->n_ctx, e)) < 0 ||
        (rc = cfg_opt_float(cfg, d->eps_key, d->norm_eps, &hp->norm_eps, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "rope_theta", d->rope_theta, &hp->rope_theta, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "partial_rotary_factor", d->partial_rotary, &partial, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "tie_word_embeddings", d->tie_embd, &hp->tie_embd, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "attention_bias", false, &hp->qkv_bias, e)) < 0 ||
        (rc = parse_act(hp, cfg, "hidden_act", d->act, e)) < 0)
        return rc;
    /* bounded here, before any family walks its layers (a family's layer pattern is read
     * before hparams_validate runs; LFM2's walked 2^31 of them: a fuzz timeout) */
    if (hp->n_layer < 1 || hp->n_layer > HP_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "config field 'num_hidden_layers' = %d is out of range [1, %d]",
                        hp->n_layer, HP_MAX_LAYERS);
    /* no decoder family binds MLP biases: a config that has them must not load silently */
    bool mlp_bias;
    if ((rc = cfg_opt_bool(cfg, "mlp_bias", false, &mlp_bias, e)) < 0)
        return rc;
    if (mlp_bias)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'mlp_bias' = true is not supported");
    /* bounded before any size is derived from them */
    if ((rc = hparams_check_dim(hp->n_head, "num_attention_heads", 1, HP_MAX_HEADS, e)) < 0 ||
        (rc = hparams_check_dim(hp->n_embd, "hidden_size", 1, HP_MAX_DIM, e)) < 0)
        return rc;
    if (cfg_has(cfg, "head_dim")) {
        if ((rc = cfg_int(cfg, "head_dim", &hp->head_dim, e)) < 0)
            return rc;
    } else if (d->head_dim > 0) {
        hp->head_dim = d->head_dim;
    } else {
        if (hp->n_embd % hp->n_head != 0)
            return err_setf(e, ERR_CONFIG,
                            "hidden_size %d is not divisible by num_attention_heads %d", hp->n_embd,
                            hp->n_head);
        hp->head_dim = hp->n_embd / hp->n_head;
    }
    if ((rc = hparams_check_dim(hp->head_dim, "head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0)
        return rc;
    if (!(partial > 0.0f && partial <= 1.0f))
        return err_setf(e, ERR_CONFIG, "partial_rotary_factor %g must be in (0, 1]", (double)partial);
    hp->n_rot = (int)((double)hp->head_dim * partial);
    hp->out_bias = hp->qkv_bias;  /* Llama's attention_bias covers q, k, v and o */
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    return parse_rope_scaling(hp, cfg, e);
}

int hf_check_full_rotary(const cJSON *cfg, const char *why, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *src = rp && cJSON_IsObject(rp) && cfg_has(rp, "partial_rotary_factor") ? rp : cfg;
    float partial;
    int rc;
    if ((rc = cfg_opt_float(src, "partial_rotary_factor", 1.0f, &partial, e)) < 0)
        return src == rp ? err_prefix(e, "rope_parameters") : rc;
    if (partial != 1.0f)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'partial_rotary_factor' = %g is not "
                        "supported: %s (1.0)", (double)partial, why);
    return 0;
}

/* KEY: one of words (NULL-terminated) per layer, no more, no fewer; out[il] the index of layer
 * il's word. Any other word is refused, naming it. */
static int layer_words(const struct hparams *hp, const cJSON *lt, const char *key,
                       const char *const *words, int *out, struct err *e)
{
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field '%s' must list %d layer types", key,
                        hp->n_layer);
    int il = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, lt) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "";
        out[il] = -1;
        for (int w = 0; words[w] && out[il] < 0; w++)
            out[il] = strcmp(s, words[w]) == 0 ? w : -1;
        if (out[il] < 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field '%s'[%d] = '%.64s' is not supported",
                            key, il, s);
        il++;
    }
    return 0;
}

/* layer_types: one string per layer. */
static int parse_layer_types(struct hparams *hp, const cJSON *lt, int window, struct err *e)
{
    static const char *const words[] = {"full_attention", "sliding_attention", NULL};
    int kind[HP_MAX_LAYERS], rc;
    if ((rc = layer_words(hp, lt, "layer_types", words, kind, e)) < 0)
        return rc;
    for (int il = 0; il < hp->n_layer; il++) {
        if (kind[il] == 0)
            continue;
        if (window <= 0)
            return err_setf(e, ERR_CONFIG, "layer_types[%d] is sliding_attention but "
                            "'sliding_window' is not set", il);
        hp->layer[il].kv = KV_SLIDING;
        hp->layer[il].window = window;
    }
    return 0;
}

int hf_finish_layers(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                     int max_window_default, struct err *e)
{
    int rc, window = 0, first;
    bool use = d->sliding;
    /* the specs are written below, before hparams_validate runs: bound them first */
    if (hp->n_layer < 1 || hp->n_layer > HP_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "config field 'num_hidden_layers' = %d is out of range [1, %d]",
                        hp->n_layer, HP_MAX_LAYERS);
    hparams_fill_layers(hp);
    if ((cfg_has(cfg, "sliding_window") && (rc = cfg_int(cfg, "sliding_window", &window, e)) < 0) ||
        (cfg_has(cfg, "use_sliding_window") &&
         (rc = cfg_opt_bool(cfg, "use_sliding_window", d->sliding, &use, e)) < 0))
        return rc;
    if ((rc = cfg_opt_int(cfg, "max_window_layers", max_window_default, &first, e)) < 0)
        return rc;
    if (window < 0)
        return err_setf(e, ERR_CONFIG, "config field 'sliding_window' = %d must not be negative",
                        window);
    /* an explicit layer_types list names each layer's kind itself */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (lt && !cJSON_IsNull(lt))
        return parse_layer_types(hp, lt, window, e);
    if (!use)
        window = 0;
    for (int il = first > 0 ? first : 0; window > 0 && il < hp->n_layer; il++) {
        hp->layer[il].kv = KV_SLIDING;
        hp->layer[il].window = window;
    }
    return 0;
}

int hf_hybrid_layers(struct hparams *hp, const cJSON *cfg, int win_default, int pattern,
                     struct err *e)
{
    int rc, window = 0;
    if (hp->n_layer < 1 || hp->n_layer > HP_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "config field 'num_hidden_layers' = %d is out of range [1, %d]",
                        hp->n_layer, HP_MAX_LAYERS);
    hparams_fill_layers(hp);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(cfg, "sliding_window");
    if (!sw)
        window = win_default;
    else if (!cJSON_IsNull(sw) && (rc = cfg_int(cfg, "sliding_window", &window, e)) < 0)
        return rc;
    if (window < 0)
        return err_setf(e, ERR_CONFIG, "config field 'sliding_window' = %d must not be negative",
                        window);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types");
    if (lt && !cJSON_IsNull(lt))
        return parse_layer_types(hp, lt, window, e);
    for (int il = 0; pattern > 0 && il < hp->n_layer; il++) {
        if ((il + 1) % pattern == 0)
            continue;
        if (window <= 0)
            return err_setf(e, ERR_CONFIG, "layer %d is a sliding layer but 'sliding_window' is not set",
                            il);
        hp->layer[il].kv = KV_SLIDING;
        hp->layer[il].window = window;
    }
    return 0;
}

int hf_parse_moe(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = cfg_int(cfg, "num_local_experts", &hp->n_expert, e)) < 0 ||
        (rc = cfg_int(cfg, "num_experts_per_tok", &hp->n_expert_used, e)) < 0)
        return rc;
    if (hp->n_expert < 1 || hp->n_expert > HP_MAX_EXPERTS)
        return err_setf(e, ERR_CONFIG, "num_local_experts = %d must be in [1, %d]", hp->n_expert,
                        HP_MAX_EXPERTS);
    return 0;
}

int hf_parse_sparse_moe(struct hparams *hp, const cJSON *cfg, const char *shared_key,
                        struct err *e)
{
    int32_t dense_ids[HP_MAX_LAYERS];
    bool dense[HP_MAX_LAYERS] = {0}, norm_topk;
    int rc, n_dense, moe_ff, step, shared = 0, ff = hp->n_ff, widest = 0;
    /* transformers 5 saves some of these configs (Qwen3-VL-MoE's text_config) with the
     * attribute's new name, num_local_experts; published checkpoints say num_experts */
    const bool local = !cfg_has(cfg, "num_experts") && cfg_has(cfg, "num_local_experts");
    if ((rc = cfg_int(cfg, local ? "num_local_experts" : "num_experts", &hp->n_expert, e)) < 0 ||
        (rc = cfg_int(cfg, "num_experts_per_tok", &hp->n_expert_used, e)) < 0 ||
        (rc = cfg_int(cfg, "moe_intermediate_size", &moe_ff, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "norm_topk_prob", false, &norm_topk, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "decoder_sparse_step", 1, &step, e)) < 0 ||
        (rc = cfg_opt_ids(cfg, "mlp_only_layers", dense_ids, HP_MAX_LAYERS, &n_dense, e)) < 0 ||
        (shared_key && (rc = cfg_int(cfg, shared_key, &shared, e)) < 0))
        return rc;
    if ((rc = hparams_check_dim(hp->n_expert, "num_experts", 0, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(step, "decoder_sparse_step", 1, HP_MAX_LAYERS, e)) < 0 ||
        (rc = hparams_check_dim(moe_ff, "moe_intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (shared_key && (rc = hparams_check_dim(shared, shared_key, 1, HP_MAX_DIM, e)) < 0))
        return rc;
    /* checked here, not only on the MoE layers: a config whose layers all happen to be dense
     * (decoder_sparse_step, mlp_only_layers) must still state a top-k that can work */
    if (hp->n_expert > 0 &&
        (rc = hparams_check_dim(hp->n_expert_used, "num_experts_per_tok", 1, hp->n_expert, e)) < 0)
        return rc;
    for (int i = 0; i < n_dense; i++) {
        if ((rc = hparams_check_dim(dense_ids[i], "mlp_only_layers", 0, hp->n_layer - 1, e)) < 0)
            return rc;
        dense[dense_ids[i]] = true;
    }
    hp->router = norm_topk ? ROUTER_SOFTMAX_TOPK : ROUTER_SOFTMAX_TOPK_RAW;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->moe = hp->n_expert > 0 && !dense[il] && (il + 1) % step == 0;
        ls->n_ff = ls->moe ? moe_ff : ff;
        ls->n_ff_shexp = ls->moe ? shared : 0;
        ls->router = ls->moe ? hp->router : ROUTER_NONE;
        ls->n_expert_used = hp->n_expert_used;
        widest = ls->n_ff > widest ? ls->n_ff : widest;
        widest = ls->n_ff_shexp > widest ? ls->n_ff_shexp : widest;
    }
    hp->n_ff = widest;
    return 0;
}

/* ---- weights ---- */

int hf_experts_alloc(struct model *m, struct err *e)
{
    /* per layer: up, gate, down, each with weights and biases */
    size_t n = (size_t)m->hp.n_layer * 6 * (size_t)m->hp.n_expert;
    m->expert_views = calloc(n, sizeof *m->expert_views);
    if (!m->expert_views)
        return err_setf(e, ERR_NOMEM, "out of memory for %zu expert views", n);
    m->n_expert_views = n;
    m->expert_views_used = 0;
    return 0;
}

static struct tensor *take_views(struct model *m)
{
    struct tensor *v = m->expert_views + m->expert_views_used;
    m->expert_views_used += (size_t)m->hp.n_expert;
    return v;
}

int hf_expert_views(struct model *m, struct expert_linear *el, bool bias, struct err *e)
{
    if (m->expert_views_used + (size_t)(bias ? 2 : 1) * m->hp.n_expert > m->n_expert_views)
        return err_setf(e, ERR_INTERNAL, "expert view store exhausted");
    el->w = take_views(m);
    el->b = bias ? take_views(m) : NULL;
    return 0;
}

int hf_map_expert_linear(struct model *m, struct wmap *w, struct expert_linear *el, int il,
                         int64_t n_out, int64_t n_in, bool bias, const char *per_expert_fmt,
                         const char *stacked_fmt, struct err *e)
{
    char prefix[512];
    int E = m->hp.n_expert, rc;
    if (m->expert_views_used + (size_t)(bias ? 2 : 1) * E > m->n_expert_views)
        return err_setf(e, ERR_INTERNAL, "expert view store exhausted");
    el->w = take_views(m);
    el->b = bias ? take_views(m) : NULL;

    if (stacked_fmt)
        snprintf(prefix, sizeof prefix, stacked_fmt, il);
    if (stacked_fmt && (wm_has(w, "%s.weight", prefix) || wm_has(w, "%s.scales", prefix))) {
        /* mlx-lm SwitchLinear layout: one [E, out, in] tensor, sliced into views */
        struct tensor all, ball;
        if ((rc = wm_linear(w, &all, WM_REQUIRED, E, n_out, n_in, e, "%s", prefix)) < 0)
            return rc;
        if (bias) {
            int64_t shape[2] = {E, n_out};
            if ((rc = wm_tensor(w, &ball, WM_REQUIRED, 2, shape, e, "%s.bias", prefix)) < 0)
                return rc;
        }
        for (int x = 0; x < E; x++) {
            el->w[x] = tensor_slice0(&all, x);
            if (bias)
                el->b[x] = tensor_slice0(&ball, x);
        }
        return 0;
    }
    /* published layout: one tensor per expert */
    for (int x = 0; x < E; x++) {
        snprintf(prefix, sizeof prefix, per_expert_fmt, il, x);
        if ((rc = wm_linear(w, &el->w[x], WM_REQUIRED, 0, n_out, n_in, e, "%s", prefix)) < 0)
            return rc;
        if (bias && (rc = wm_vec(w, &el->b[x], WM_REQUIRED, n_out, e, "%s.bias", prefix)) < 0)
            return rc;
    }
    return 0;
}

int hf_map_head(struct model *m, struct wmap *w, const char *embd, const char *norm,
                const char *head, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int rc;
    if ((rc = wm_linear(w, &m->tok_embd, WM_REQUIRED, 0, hp->n_vocab, hp->n_embd, e, "%s", embd)) < 0 ||
        (rc = wm_vec(w, &m->out_norm, WM_REQUIRED, hp->n_embd, e, "%s.weight", norm)) < 0)
        return rc;
    if (hp->norm == NORM_LAYER && hp->norm_bias &&
        (rc = wm_vec(w, &m->out_norm_b, WM_REQUIRED, hp->n_embd, e, "%s.bias", norm)) < 0)
        return rc;
    /* a tied head reuses the embedding; a checkpoint may still carry a copy (dropped) */
    if (hp->tie_embd || !head) {
        m->lm_head = m->tok_embd;
        if (head && wm_has(w, "%s.weight", head)) {
            char name[512];
            snprintf(name, sizeof name, "%s.weight", head);
            st_set_mark(w->st, name);
        }
    } else if ((rc = wm_linear(w, &m->lm_head, WM_REQUIRED, 0, hp->n_vocab, hp->n_embd, e, "%s", head)) < 0) {
        return rc;
    }
    if (hp->head_bias &&
        (rc = wm_vec(w, &m->lm_head_b, WM_REQUIRED, hp->n_vocab, e, "%s.bias", head ? head : embd)) < 0)
        return rc;
    return 0;
}

int hf_map_norm(struct wmap *w, const struct hparams *hp, struct tensor *wt, struct tensor *b,
                    const char *prefix, struct err *e)
{
    int rc = wm_vec(w, wt, WM_REQUIRED, hp->n_embd, e, "%s.weight", prefix);
    if (rc == 0 && hp->norm == NORM_LAYER && hp->norm_bias)
        rc = wm_vec(w, b, WM_REQUIRED, hp->n_embd, e, "%s.bias", prefix);
    return rc;
}

int hf_map_attention(struct wmap *w, const struct hparams *hp, struct layer *L, int il,
                     struct err *e)
{
    const struct layer_spec *ls = &hp->layer[il];
    int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_kv_head * hd;
    int rc;
    const char *p = "model.layers.%d.self_attn";
    char pre[256];
    snprintf(pre, sizeof pre, p, il);
    if (wm_has(w, "%s.qkv_proj.weight", pre) || wm_has(w, "%s.qkv_proj.scales", pre)) {
        if ((rc = wm_linear(w, &L->wqkv, WM_REQUIRED, 0, qd + 2 * kvd, hp->n_embd, e, "%s.qkv_proj", pre)) < 0)
            return rc;
        if (hp->qkv_bias && (rc = wm_vec(w, &L->bqkv, WM_REQUIRED, qd + 2 * kvd, e, "%s.qkv_proj.bias", pre)) < 0)
            return rc;
    } else {
        if ((rc = wm_linear(w, &L->wq, WM_REQUIRED, 0, qd, hp->n_embd, e, "%s.q_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, hp->n_embd, e, "%s.k_proj", pre)) < 0 ||
            (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, hp->n_embd, e, "%s.v_proj", pre)) < 0)
            return rc;
        if (hp->qkv_bias &&
            ((rc = wm_vec(w, &L->bq, WM_REQUIRED, qd, e, "%s.q_proj.bias", pre)) < 0 ||
             (rc = wm_vec(w, &L->bk, WM_REQUIRED, kvd, e, "%s.k_proj.bias", pre)) < 0 ||
             (rc = wm_vec(w, &L->bv, WM_REQUIRED, kvd, e, "%s.v_proj.bias", pre)) < 0))
            return rc;
    }
    if ((rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, hp->n_embd, qd, e, "%s.o_proj", pre)) < 0)
        return rc;
    if (hp->out_bias && (rc = wm_vec(w, &L->bo, WM_REQUIRED, hp->n_embd, e, "%s.o_proj.bias", pre)) < 0)
        return rc;
    if (!ls->qk_norm)
        return 0;
    if (hp->qk_norm_per_head) {
        /* Cohere: one LayerNorm weight row per head */
        int64_t qs[2] = {hp->n_head, hd}, ks[2] = {hp->n_kv_head, hd};
        if ((rc = wm_tensor(w, &L->q_norm, WM_REQUIRED, 2, qs, e, "%s.q_norm.weight", pre)) < 0 ||
            (rc = wm_tensor(w, &L->k_norm, WM_REQUIRED, 2, ks, e, "%s.k_norm.weight", pre)) < 0)
            return rc;
        return 0;
    }
    /* one head's width, or the whole q / k width (qk_norm_full, OLMo 2) */
    if ((rc = wm_vec(w, &L->q_norm, WM_REQUIRED, ls->qk_norm_full ? qd : hd, e, "%s.q_norm.weight", pre)) < 0 ||
        (rc = wm_vec(w, &L->k_norm, WM_REQUIRED, ls->qk_norm_full ? kvd : hd, e, "%s.k_norm.weight", pre)) < 0)
        return rc;
    return 0;
}

/* Mixtral-style experts: w1 gate, w2 down, w3 up, and mlx-lm's stacked SwitchGLU names
 * (mlx-lm models/mixtral.py and phimoe.py sanitize). */
const struct expert_stack_rule hf_moe_stacking[] = {
    {"model.layers.%d.block_sparse_moe.experts.%d.w1", "model.layers.%d.block_sparse_moe.switch_mlp.gate_proj"},
    {"model.layers.%d.block_sparse_moe.experts.%d.w2", "model.layers.%d.block_sparse_moe.switch_mlp.down_proj"},
    {"model.layers.%d.block_sparse_moe.experts.%d.w3", "model.layers.%d.block_sparse_moe.switch_mlp.up_proj"},
    {NULL, NULL},
};

const struct expert_stack_rule hf_mlp_experts_stacking[] = {
    {"model.layers.%d.mlp.experts.%d.gate_proj", "model.layers.%d.mlp.switch_mlp.gate_proj"},
    {"model.layers.%d.mlp.experts.%d.down_proj", "model.layers.%d.mlp.switch_mlp.down_proj"},
    {"model.layers.%d.mlp.experts.%d.up_proj", "model.layers.%d.mlp.switch_mlp.up_proj"},
    {NULL, NULL},
};

static bool module_is(const char *module, const char *suffix)
{
    size_t a = strlen(module), b = strlen(suffix);
    return a >= b && strcmp(module + a - b, suffix) == 0 && (a == b || module[a - b - 1] == '.');
}

/* {"group_size": 64, "bits": 8}: affine, whatever the command's mode (mlx-lm's
 * to_quantized defaults the mode to affine when the predicate names none). */
static int router_8bit(const char *module, const char *suffix, const struct quant_params *base,
                       struct quant_params *qp)
{
    if (!module_is(module, suffix))
        return CK_Q_DEFAULT;
    *qp = (struct quant_params){QMODE_AFFINE, 8, 64, base->variant};
    return CK_Q_OVERRIDE;
}

int hf_quant_gate_8bit(const char *module, const struct quant_params *base, struct quant_params *qp)
{
    return router_8bit(module, "mlp.gate", base, qp);
}

int hf_quant_router_8bit(const char *module, const struct quant_params *base, struct quant_params *qp)
{
    return router_8bit(module, "mlp.router", base, qp);
}

int hf_quant_gate_float(const char *module, const struct quant_params *base, struct quant_params *qp)
{
    (void)base;
    (void)qp;
    return module_is(module, "mlp.gate") ? CK_Q_FLOAT : CK_Q_DEFAULT;
}

static const struct hf_moe_names block_sparse_moe_names = {
    "model.layers.%d.block_sparse_moe.gate", hf_moe_stacking, NULL, NULL, NULL,
};

/* A shared expert's GLU and its sigmoid gate (one output). */
static int map_shared_expert(struct wmap *w, const struct hparams *hp, struct layer *L, int il,
                             const struct hf_moe_names *names, struct err *e)
{
    int64_t ff = hp->layer[il].n_ff_shexp, d = hp->n_embd;
    char pre[256], gate[256];
    int rc;
    snprintf(pre, sizeof pre, names->shared, il);
    if ((rc = wm_linear(w, &L->shexp_gate, WM_REQUIRED, 0, ff, d, e, "%s.gate_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_up, WM_REQUIRED, 0, ff, d, e, "%s.up_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->shexp_down, WM_REQUIRED, 0, d, ff, e, "%s.down_proj", pre)) < 0)
        return rc;
    if (hp->layer[il].shexp_plain)
        return 0;
    snprintf(gate, sizeof gate, names->shared_gate, il);
    return wm_linear(w, &L->shexp_inp_gate, WM_REQUIRED, 0, 1, d, e, "%s", gate);
}

int hf_map_router_bias(struct model *m, struct wmap *w, struct layer *L, const char *name,
                       bool grouped, struct err *e)
{
    int64_t E = m->hp.n_expert;
    int rc;
    const struct st_tensor *t = st_set_find(w->st, name);
    if (t ? t->ndim == 2 : grouped) {
        int64_t shape[2] = {1, E};
        struct tensor g;
        if ((rc = wm_tensor(w, &g, WM_REQUIRED, 2, shape, e, "%s", name)) < 0)
            return rc;
        L->router_b = tensor_slice0(&g, 0);
    } else if ((rc = wm_vec(w, &L->router_b, WM_REQUIRED, E, e, "%s", name)) < 0) {
        return rc;
    }
    if (L->router_b.dtype == DTYPE_F32)
        return 0;
    if (L->router_b.qbits || !dtype_is_float(L->router_b.dtype))
        return err_setf(e, ERR_FORMAT, "%s: dtype %s, expected a float", name,
                        dtype_name(L->router_b.dtype));
    void *buf;
    if ((rc = model_alloc_owned(m, (size_t)E * sizeof(float), &buf, e)) < 0)
        return rc;
    if (!st_set_is_recording(w->st))
        dtype_to_f32_ref(buf, L->router_b.data, L->router_b.dtype, (size_t)E);
    int64_t shape[1] = {E};
    tensor_init(&L->router_b, DTYPE_F32, buf, 1, shape);
    L->router_b.name = "correction bias (widened to F32)";
    return 0;
}

int hf_map_ffn(struct model *m, struct wmap *w, struct layer *L, int il,
               const struct hf_moe_names *names, struct err *e)
{
    const struct hparams *hp = &m->hp;
    const struct layer_spec *ls = &hp->layer[il];
    int rc;
    char pre[256];
    if (ls->moe) {
        snprintf(pre, sizeof pre, names->router, il);
        if ((rc = wm_linear(w, &L->router, WM_REQUIRED, 0, hp->n_expert, hp->n_embd, e, "%s", pre)) < 0)
            return rc;
        if (hp->router_bias && names->router_bias) {
            snprintf(pre, sizeof pre, names->router_bias, il);
            if ((rc = hf_map_router_bias(m, w, L, pre, false, e)) < 0)
                return rc;
        }
        if (ls->n_ff_shexp > 0 && (rc = map_shared_expert(w, hp, L, il, names, e)) < 0)
            return rc;
        const struct expert_stack_rule *r = names->experts;
        if ((rc = hf_map_expert_linear(m, w, &L->ex.gate, il, ls->n_ff, hp->n_embd, false,
                                       r[0].per_expert, r[0].stacked, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.down, il, hp->n_embd, ls->n_ff, false,
                                       r[1].per_expert, r[1].stacked, e)) < 0 ||
            (rc = hf_map_expert_linear(m, w, &L->ex.up, il, ls->n_ff, hp->n_embd, false,
                                       r[2].per_expert, r[2].stacked, e)) < 0)
            return rc;
        return 0;
    }
    snprintf(pre, sizeof pre, "model.layers.%d.mlp", il);
    if (ls->ffn == FFN_MLP) {
        /* a non-gated MLP (Arcee, Nemotron): down(act(up(x))) */
        if ((rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ls->n_ff, hp->n_embd, e, "%s.up_proj", pre)) < 0)
            return rc;
    } else if (wm_has(w, "%s.gate_up_proj.weight", pre) || wm_has(w, "%s.gate_up_proj.scales", pre)) {
        if ((rc = wm_linear(w, &L->gate_up, WM_REQUIRED, 0, 2 * (int64_t)ls->n_ff, hp->n_embd, e, "%s.gate_up_proj", pre)) < 0)
            return rc;
    } else if ((rc = wm_linear(w, &L->gate, WM_REQUIRED, 0, ls->n_ff, hp->n_embd, e, "%s.gate_proj", pre)) < 0 ||
               (rc = wm_linear(w, &L->up, WM_REQUIRED, 0, ls->n_ff, hp->n_embd, e, "%s.up_proj", pre)) < 0) {
        return rc;
    }
    return wm_linear(w, &L->down, WM_REQUIRED, 0, hp->n_embd, ls->n_ff, e, "%s.down_proj", pre);
}

/* PRE.NAME.weight (no bias) into wt */
static int map_post_norm(struct wmap *w, const struct hparams *hp, struct tensor *wt,
                         const char *pre, const char *name, struct err *e)
{
    return wm_vec(w, wt, WM_REQUIRED, hp->n_embd, e, "%s.%s.weight", pre, name);
}

int hf_map_decoder(struct model *m, struct st_set *st, struct err *e)
{
    return hf_map_decoder_moe(m, st, &block_sparse_moe_names, e);
}

int hf_map_decoder_moe(struct model *m, struct st_set *st, const struct hf_moe_names *names,
                       struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int rc;
    char pre[256];
    if (m->hp.n_expert > 0 && (rc = hf_experts_alloc(m, e)) < 0)
        return rc;
    if ((rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0)
        return rc;
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(pre, sizeof pre, "model.layers.%d", il);
        /* pre-norm layers: input_layernorm, post_attention_layernorm (before the FFN);
         * post-norm layers: post_attention_layernorm, post_feedforward_layernorm;
         * sandwich layers: input_layernorm, pre_feedforward_layernorm, and the norms of the
         * block outputs post_attention_layernorm, post_feedforward_layernorm */
        enum residual_kind rk = m->hp.layer[il].residual;
        bool post = rk == RESID_POST, sandwich = rk == RESID_SANDWICH;
        char n1[300], n2[300];
        snprintf(n1, sizeof n1, "%s.%s", pre, post ? "post_attention_layernorm" : "input_layernorm");
        snprintf(n2, sizeof n2, "%s.%s", pre,
                 post ? "post_feedforward_layernorm"
                      : sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm");
        if (sandwich && ((rc = map_post_norm(&w, &m->hp, &L->attn_post_norm, pre,
                                             "post_attention_layernorm", e)) < 0 ||
                         (rc = map_post_norm(&w, &m->hp, &L->ffn_post_norm, pre,
                                             "post_feedforward_layernorm", e)) < 0))
            return rc;
        /* a parallel block has one norm feeding attention and the FFN (Cohere) */
        if ((rc = hf_map_norm(&w, &m->hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (!m->hp.parallel_residual &&
             (rc = hf_map_norm(&w, &m->hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0) ||
            (rc = hf_map_attention(&w, &m->hp, L, il, e)) < 0 ||
            (rc = hf_map_ffn(m, &w, L, il, names, e)) < 0)
            return rc;
    }
    return 0;
}

/* ---- DeepSeek-V3 experts beside ordinary attention ---- */

int hf_parse_v3_moe(struct hparams *hp, const cJSON *cfg, const struct hf_v3_moe_defaults *d,
                    struct err *e)
{
    int rc, n_routed = d->n_routed, k = d->k, moe_ff = d->moe_ff, n_shared = d->n_shared;
    int first = d->first_dense, ff = hp->n_ff, widest = 0;
    /* a field without a default (-1) is required: transformers fails on its None */
    if ((rc = n_routed < 0 ? cfg_int(cfg, "n_routed_experts", &n_routed, e)
                           : cfg_opt_int(cfg, "n_routed_experts", n_routed, &n_routed, e)) < 0 ||
        (rc = k < 0 ? cfg_int(cfg, "num_experts_per_tok", &k, e)
                    : cfg_opt_int(cfg, "num_experts_per_tok", k, &k, e)) < 0 ||
        (rc = n_shared < 0 ? cfg_int(cfg, "n_shared_experts", &n_shared, e)
                           : cfg_opt_int(cfg, "n_shared_experts", n_shared, &n_shared, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "moe_intermediate_size", moe_ff, &moe_ff, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "first_k_dense_replace", first, &first, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "n_group", d->n_group, &hp->moe_n_group, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "topk_group", d->topk_group, &hp->moe_topk_group, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "norm_topk_prob", d->norm_topk, &hp->moe_norm, e)) < 0 ||
        (rc = cfg_opt_float(cfg, "routed_scaling_factor", d->scale, &hp->moe_scale, e)) < 0)
        return rc;
    if ((rc = hparams_check_dim(n_routed, "n_routed_experts", 1, HP_MAX_EXPERTS, e)) < 0 ||
        (rc = hparams_check_dim(k, "num_experts_per_tok", 1, n_routed, e)) < 0 ||
        (rc = hparams_check_dim(moe_ff, "moe_intermediate_size", 1, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(n_shared, "n_shared_experts", 0, 1024, e)) < 0 ||
        (rc = hparams_check_dim((int64_t)moe_ff * n_shared, "n_shared_experts * moe_intermediate_size",
                                0, HP_MAX_DIM, e)) < 0 ||
        (rc = hparams_check_dim(first, "first_k_dense_replace", 0, HP_MAX_LAYERS, e)) < 0)
        return rc;
    /* mlp_layer_types (transformers builds the experts where it says "sparse"; another word
     * is refused, not read as dense), else first_k_dense_replace */
    static const char *const words[] = {"dense", "sparse", NULL};
    int sparse[HP_MAX_LAYERS];
    const cJSON *lt = d->mlp_layer_types ? cJSON_GetObjectItemCaseSensitive(cfg, "mlp_layer_types") : NULL;
    for (int il = 0; il < hp->n_layer; il++)
        sparse[il] = il >= first;
    if (lt && !cJSON_IsNull(lt) && (rc = layer_words(hp, lt, "mlp_layer_types", words, sparse, e)) < 0)
        return rc;
    hp->n_expert = n_routed;
    hp->n_expert_used = k;
    hp->router = ROUTER_GROUP_SIGMOID;
    hp->router_bias = true;
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        ls->moe = sparse[il] == 1;
        ls->n_ff = ls->moe ? moe_ff : ff;
        ls->n_ff_shexp = ls->moe ? moe_ff * n_shared : 0;
        ls->shexp_plain = true;
        ls->router = ls->moe ? hp->router : ROUTER_NONE;
        ls->n_expert_used = k;
        widest = ls->n_ff > widest ? ls->n_ff : widest;
        widest = ls->n_ff_shexp > widest ? ls->n_ff_shexp : widest;
    }
    hp->n_ff = widest;
    return 0;
}

void hf_transpose_experts(void *dst, const void *src, int64_t E, int64_t rows, int64_t cols,
                              size_t es)
{
    enum { T = 32 };
    for (int64_t x = 0; x < E; x++) {
        const char *s = (const char *)src + (size_t)(x * rows * cols) * es;
        char *d = (char *)dst + (size_t)(x * rows * cols) * es;
        for (int64_t c0 = 0; c0 < cols; c0 += T)
            for (int64_t r0 = 0; r0 < rows; r0 += T)
                for (int64_t c = c0; c < cols && c < c0 + T; c++)
                    for (int64_t r = r0; r < rows && r < r0 + T; r++)
                        memcpy(d + (size_t)(r * cols + c) * es, s + (size_t)(c * rows + r) * es, es);
    }
}

int hf_take_transposed(struct model *m, struct wmap *w, struct tensor *out, int64_t n_out,
                       int64_t n_in, const char *name, struct err *e)
{
    int64_t E = m->hp.n_expert, shape[3] = {E, n_in, n_out};
    struct tensor t;
    void *buf;
    int rc;
    if ((rc = wm_tensor(w, &t, WM_REQUIRED, 3, shape, e, "%s", name)) < 0)
        return rc;
    if (!tensor_is_contiguous(&t) || !dtype_is_float(t.dtype) || t.qbits)
        return err_setf(e, ERR_FORMAT, "tensor '%s' must be a contiguous float tensor", name);
    size_t es = dtype_size(t.dtype);
    if ((rc = model_alloc_owned(m, (size_t)(E * n_in * n_out) * es, &buf, e)) < 0)
        return rc;
    if (!st_set_is_recording(w->st)) /* a recorded tensor's data is a placeholder (synth) */
        hf_transpose_experts(buf, t.data, E, n_out, n_in, es);
    int64_t tshape[3] = {E, n_out, n_in};
    tensor_init(out, t.dtype, buf, 3, tshape);
    out->name = t.name;
    return 0;
}

/* mrope_section from rope_scaling (transformers 4, published configs) or rope_parameters
 * (transformers 5): three integers. */
int hf_parse_mrope(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (!cJSON_IsObject(rs))
        rs = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    const cJSON *ms = cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "mrope_section") : NULL;
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) != 3)
        return err_setf(e, ERR_CONFIG, "%s needs rope_scaling.mrope_section: three integers", hp->model_type[0]
                        ? hp->model_type : "an M-RoPE text model");
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(ms, i);
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < 0 ||
            v->valuedouble > HP_MAX_ROT_HALF)
            return err_setf(e, ERR_CONFIG, "rope_scaling.mrope_section[%d] must be an integer in [0, %d]", i,
                            HP_MAX_ROT_HALF);
        hp->mrope_section[i] = (int)v->valuedouble;
    }
    return 0;
}
