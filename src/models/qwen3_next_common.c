/*
 * qwen3_next_common: what Qwen3-Next (qwen3_next.c) and Qwen3.5's text model
 * (qwen3_5_text.c) share (qwen3_next.h): the config of the hybrid layer pattern and the
 * DeltaNet's shape, every layer's spec, and the weights both bind the same way. Layouts are
 * made canonical here, once at load (ADR 0071): row-interleaved projections are copied into
 * model-owned memory in the canonical row order, the zero-centred norm weights become f32
 * 1 + w unless the checkpoint is mlx-lm's (its conv1d.weight [ch, K, 1]; its norms are
 * stored so already), conv weights, A_log and dt_bias are widened to f32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"
#include "qwen3_next.h"

// ---- config ----

/* The DeltaNet's shape: Qwen3NextConfig's linear_* fields and defaults. */
static int parse_linear_fields(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    int rc;
    if ((rc = cfg_opt_int(cfg, "linear_conv_kernel_dim", 4, &hp->ssm.d_conv, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "linear_key_head_dim", 128, &hp->ssm.k_head_dim, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "linear_value_head_dim", 128, &hp->ssm.head_dim, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "linear_num_key_heads", 16, &hp->ssm.n_group, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "linear_num_value_heads", 32, &hp->ssm.n_head, e)) < 0)
        return rc;
    /* the convolution keeps d_conv - 1 rows per sequence: a width of 64 is far past any
     * published one (4) and bounds the state */
    if ((rc = hparams_check_dim(hp->ssm.d_conv, "linear_conv_kernel_dim", 1, 64, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.k_head_dim, "linear_key_head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.head_dim, "linear_value_head_dim", 1, HP_MAX_HEAD_DIM, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.n_group, "linear_num_key_heads", 1, HP_MAX_HEADS, e)) < 0 ||
        (rc = hparams_check_dim(hp->ssm.n_head, "linear_num_value_heads", 1, HP_MAX_HEADS, e)) < 0)
        return rc;
    if (hp->ssm.n_head % hp->ssm.n_group != 0)
        return err_setf(e, ERR_CONFIG, "config field 'linear_num_value_heads' = %d must be a "
                        "multiple of 'linear_num_key_heads' = %d (each key head serves a group of "
                        "value heads)", hp->ssm.n_head, hp->ssm.n_group);
    hp->ssm.norm_eps = hp->norm_eps;  /* RMSNormGated takes rms_norm_eps */
    return 0;
}

/* linear[il]: layer il is a DeltaNet layer (layer_types, else full_attention_interval). */
static int parse_layer_kinds(const struct hparams *hp, const cJSON *cfg, bool *linear,
                             struct err *e)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types"), *t;
    int rc, interval, il = 0;
    if (!lt || cJSON_IsNull(lt)) {
        if ((rc = cfg_opt_int(cfg, "full_attention_interval", 4, &interval, e)) < 0 ||
            (rc = hparams_check_dim(interval, "full_attention_interval", 1, HP_MAX_LAYERS, e)) < 0)
            return rc;
        for (il = 0; il < hp->n_layer; il++)
            linear[il] = (il + 1) % interval != 0;
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layer)
        return err_setf(e, ERR_CONFIG, "config field 'layer_types' must list num_hidden_layers = %d "
                        "layer types, not %d", hp->n_layer,
                        cJSON_IsArray(lt) ? cJSON_GetArraySize(lt) : -1);
    cJSON_ArrayForEach(t, lt) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "(not a string)";
        if (strcmp(s, "linear_attention") != 0 && strcmp(s, "full_attention") != 0)
            return err_setf(e, ERR_UNSUPPORTED, "config field 'layer_types'[%d] = '%s' is not "
                            "supported (linear_attention, full_attention)", il, s);
        linear[il++] = strcmp(s, "linear_attention") == 0;
    }
    return 0;
}

/* transformers 5 keeps partial_rotary_factor in rope_parameters, where it wins. */
static int parse_partial_rotary(struct hparams *hp, const cJSON *cfg, struct err *e)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(cfg, "rope_parameters");
    float f;
    int rc;
    if (!cJSON_IsObject(rp) || !cfg_has(rp, "partial_rotary_factor"))
        return 0;
    if ((rc = cfg_float(rp, "partial_rotary_factor", &f, e)) < 0)
        return err_prefix(e, "rope_parameters");
    if (!(f > 0.0f && f <= 1.0f))
        return err_setf(e, ERR_CONFIG, "rope_parameters: partial_rotary_factor %g must be in "
                        "(0, 1]", (double)f);
    hp->n_rot = (int)((double)hp->head_dim * f);
    return 0;
}

/* The DeltaNet layers' state sizes (checked before they narrow to int) and the scratch. */
static int set_layers(struct hparams *hp, const bool *linear, struct err *e)
{
    int64_t kd = (int64_t)hp->ssm.n_group * hp->ssm.k_head_dim;
    int64_t cd = 2 * kd + (int64_t)hp->ssm.n_head * hp->ssm.head_dim;
    int64_t conv = (int64_t)(hp->ssm.d_conv - 1) * cd;
    int64_t rec = (int64_t)hp->ssm.n_head * hp->ssm.k_head_dim * hp->ssm.head_dim;
    if (conv > HP_MAX_STATE || rec > HP_MAX_STATE)
        return err_setf(e, ERR_CONFIG, "linear_num_value_heads x linear_key_head_dim x "
                        "linear_value_head_dim = %lld and the convolution's %lld floats of state "
                        "per sequence must each be at most %d", (long long)rec, (long long)conv,
                        HP_MAX_STATE);
    for (int il = 0; il < hp->n_layer; il++) {
        struct layer_spec *ls = &hp->layer[il];
        if (linear[il]) {
            ls->mixer = MIXER_DELTANET;
            ls->kv = KV_RECURRENT;
            ls->state_conv = (int)conv;
            ls->state_rec = (int)rec;
        } else {
            ls->attn_gate = true;
        }
    }
    int scratch = blk_deltanet_scratch(hp);
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    if (scratch < 0 || q_dim > HP_MAX_DIM)
        return err_setf(e, ERR_CONFIG, "the linear attention's projections (linear_* fields) or "
                        "num_attention_heads x head_dim are too wide");
    hp->rec_scratch = scratch > q_dim ? scratch : (int)q_dim;
    return 0;
}

int qwen3_next_parse_common(struct hparams *hp, const cJSON *cfg, const struct hf_defaults *d,
                            struct err *e)
{
    bool linear[HP_MAX_LAYERS];
    int rc = hf_parse_decoder(hp, cfg, d, e);
    if (rc < 0)
        return rc;
    /* transformers' torch path applies silu in the convolution and the gated norm whatever
     * hidden_act says, its fused kernels hidden_act: only silu means one thing */
    if (hp->act != ACT_SILU)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'hidden_act': only silu is supported");
    if (hp->qkv_bias)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'attention_bias' = true is not supported");
    if ((rc = parse_partial_rotary(hp, cfg, e)) < 0)
        return rc;
    hp->qk_norm = true;
    /* the zero-centred norms: their weights become 1 + w at load (qwen3_next_map_common) */
    hp->norm_w_offset = 0.0f;
    if (hp->n_layer < 1 || hp->n_layer > HP_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "config field 'num_hidden_layers' = %d is out of range "
                        "[1, %d]", hp->n_layer, HP_MAX_LAYERS);
    hparams_fill_layers(hp);
    if ((rc = parse_linear_fields(hp, cfg, e)) < 0 || (rc = parse_layer_kinds(hp, cfg, linear, e)) < 0)
        return rc;
    return set_layers(hp, linear, e);
}

// ---- weights ----

int qwen3_next_permute_rows(struct model *m, struct st_set *st, struct tensor *t,
                            const int32_t *perm, struct err *e)
{
    if (st_set_is_recording(st))
        return 0;  /* synth: recorded views have no data */
    int64_t n = t->shape[0], rs = tensor_row_storage(t);
    if (t->ndim != 2 || t->packed || t->stride[0] != rs)
        return err_setf(e, ERR_FORMAT, "tensor %s: a 2-D tensor with contiguous rows expected",
                        t->name ? t->name : "?");
    size_t rb = (size_t)rs * dtype_size(t->dtype);
    size_t sb = t->qbits ? (size_t)(t->shape[1] / t->qgroup) * dtype_size(t->qsdtype) : 0;
    char *d, *s = NULL, *b = NULL;
    int rc;
    if ((rc = model_alloc_owned(m, (size_t)n * rb, (void **)&d, e)) < 0 ||
        (sb && (rc = model_alloc_owned(m, (size_t)n * sb, (void **)&s, e)) < 0) ||
        (sb && t->qbiases && (rc = model_alloc_owned(m, (size_t)n * sb, (void **)&b, e)) < 0))
        return rc;
    for (int64_t r = 0; r < n; r++) {
        memcpy(d + r * rb, (const char *)t->data + (size_t)perm[r] * rb, rb);
        if (s)
            memcpy(s + r * sb, (const char *)t->qscales + (size_t)perm[r] * sb, sb);
        if (b)
            memcpy(b + r * sb, (const char *)t->qbiases + (size_t)perm[r] * sb, sb);
    }
    t->data = d;
    if (s)
        t->qscales = s;
    if (b)
        t->qbiases = b;
    return 0;
}

/* mlx-lm's layout: a DeltaNet layer's conv1d.weight stored [ch, K, 1] (sanitized). */
static bool is_mlx_layout(const struct model *m, const struct st_set *st)
{
    char name[96];
    for (int il = 0; il < m->hp.n_layer; il++) {
        if (m->hp.layer[il].mixer != MIXER_DELTANET)
            continue;
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.conv1d.weight", il);
        const struct st_tensor *t = st_set_find(st, name);
        return t && t->ndim == 3 && t->shape[1] > 1 && t->shape[2] == 1;
    }
    return false;
}

/* A zero-centred norm weight w as an owned F32 1 + w (transformers' layout; mlx-lm's is). */
static int norm_plus_one(struct model *m, struct st_set *st, struct tensor *t, bool mlx,
                         struct err *e)
{
    if (mlx || st_set_is_recording(st) || !tensor_is_present(t))
        return 0;
    if (t->qbits || !tensor_is_contiguous(t))
        return err_setf(e, ERR_FORMAT, "tensor %s: a float norm weight expected",
                        t->name ? t->name : "?");
    int64_t n = tensor_nelem(t);
    float *dst;
    int rc = model_alloc_owned(m, (size_t)n * sizeof *dst, (void **)&dst, e);
    if (rc < 0)
        return rc;
    dtype_to_f32_ref(dst, t->data, t->dtype, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        dst[i] += 1.0f;
    const char *name = t->name;
    tensor_init(t, DTYPE_F32, dst, 1, &n);
    t->name = name;
    return 0;
}

int qwen3_next_norm_plus_one(struct model *m, struct st_set *st, struct tensor *t, struct err *e)
{
    return norm_plus_one(m, st, t, false, e);
}

/* q_proj [n_head x (q | gate), n_embd] -> wq, wq_gate; k/v/o projections; q/k norms. */
static int map_gated_attention(struct model *m, struct wmap *w, struct layer *L, int il,
                               bool mlx, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_kv_head * hd, d = hp->n_embd;
    char pre[64];
    struct tensor q;
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.self_attn", il);
    if ((rc = wm_linear(w, &q, WM_REQUIRED, 0, 2 * qd, d, e, "%s.q_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wk, WM_REQUIRED, 0, kvd, d, e, "%s.k_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wv, WM_REQUIRED, 0, kvd, d, e, "%s.v_proj", pre)) < 0 ||
        (rc = wm_linear(w, &L->wo, WM_REQUIRED, 0, d, qd, e, "%s.o_proj", pre)) < 0 ||
        (rc = wm_vec(w, &L->q_norm, WM_REQUIRED, hd, e, "%s.q_norm.weight", pre)) < 0 ||
        (rc = wm_vec(w, &L->k_norm, WM_REQUIRED, hd, e, "%s.k_norm.weight", pre)) < 0 ||
        (rc = norm_plus_one(m, w->st, &L->q_norm, mlx, e)) < 0 ||
        (rc = norm_plus_one(m, w->st, &L->k_norm, mlx, e)) < 0)
        return rc;
    int32_t *perm = malloc((size_t)(2 * qd) * sizeof *perm);
    if (!perm)
        return err_setf(e, ERR_NOMEM, "out of memory");
    for (int64_t h = 0; h < hp->n_head; h++)
        for (int64_t j = 0; j < hd; j++) {
            perm[h * hd + j] = (int32_t)(h * 2 * hd + j);
            perm[qd + h * hd + j] = (int32_t)(h * 2 * hd + hd + j);
        }
    rc = qwen3_next_permute_rows(m, w->st, &q, perm, e);
    free(perm);
    L->wq = tensor_rows(&q, 0, qd);
    L->wq_gate = tensor_rows(&q, qd, qd);
    return rc;
}

/* A DeltaNet layer: inproj's projections, conv1d, A_log, dt_bias, the gated norm, out_proj. */
static int map_deltanet(struct model *m, struct wmap *w, struct layer *L, int il, bool mlx,
                        qn_inproj_fn inproj, struct err *e)
{
    const struct hparams *hp = &m->hp;
    int64_t nv = hp->ssm.n_head, vd = nv * hp->ssm.head_dim, K = hp->ssm.d_conv;
    int64_t cd = 2 * (int64_t)hp->ssm.n_group * hp->ssm.k_head_dim + vd;
    int64_t shape[3] = {cd, mlx ? K : 1, mlx ? 1 : K};
    char pre[64];
    int rc;
    snprintf(pre, sizeof pre, "model.layers.%d.linear_attn", il);
    if ((rc = inproj(m, w, L, il, pre, e)) < 0 ||
        (rc = wm_tensor(w, &L->ssm_conv, WM_REQUIRED, 3, shape, e, "%s.conv1d.weight", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_a, WM_REQUIRED, nv, e, "%s.A_log", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_dt_b, WM_REQUIRED, nv, e, "%s.dt_bias", pre)) < 0 ||
        (rc = wm_vec(w, &L->ssm_norm, WM_REQUIRED, hp->ssm.head_dim, e, "%s.norm.weight", pre)) < 0 ||
        (rc = wm_linear(w, &L->ssm_out, WM_REQUIRED, 0, hp->n_embd, vd, e, "%s.out_proj", pre)) < 0)
        return rc;
    if (st_set_is_recording(w->st))
        return 0;
    /* [ch, 1, K] and [ch, K, 1] both hold channel c's K taps at c * K: the kernels' [ch, K] */
    L->ssm_conv.ndim = 2;
    L->ssm_conv.shape[1] = K;
    L->ssm_conv.stride[0] = K;
    L->ssm_conv.stride[1] = 1;
    if ((rc = model_widen_f32(m, &L->ssm_conv, e)) < 0 || (rc = model_widen_f32(m, &L->ssm_a, e)) < 0)
        return rc;
    return model_widen_f32(m, &L->ssm_dt_b, e);
}

int qwen3_next_map_common(struct model *m, struct st_set *st, const struct hf_moe_names *names,
                          qn_inproj_fn inproj, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    bool mlx = is_mlx_layout(m, st);
    char n1[96], n2[96];
    int rc;
    if ((m->hp.n_expert > 0 && (rc = hf_experts_alloc(m, e)) < 0) ||
        (rc = hf_map_head(m, &w, "model.embed_tokens", "model.norm", "lm_head", e)) < 0 ||
        (rc = norm_plus_one(m, st, &m->out_norm, mlx, e)) < 0)
        return rc;
    /* the multi-token-prediction head: transformers ignores it (_keys_to_ignore_on_load_unexpected
     * ^mtp.*), so does mlx-lm's sanitize */
    for (size_t i = 0; i < st_set_count(st); i++) {
        const struct st_tensor *t = st_set_at(st, i);
        if (strncmp(t->name, "mtp.", 4) == 0)
            st_set_mark(st, t->name);
    }
    for (int il = 0; il < m->hp.n_layer; il++) {
        struct layer *L = &m->layers[il];
        snprintf(n1, sizeof n1, "model.layers.%d.input_layernorm", il);
        snprintf(n2, sizeof n2, "model.layers.%d.post_attention_layernorm", il);
        if ((rc = hf_map_norm(&w, &m->hp, &L->attn_norm, &L->attn_norm_b, n1, e)) < 0 ||
            (rc = hf_map_norm(&w, &m->hp, &L->ffn_norm, &L->ffn_norm_b, n2, e)) < 0 ||
            (rc = norm_plus_one(m, st, &L->attn_norm, mlx, e)) < 0 ||
            (rc = norm_plus_one(m, st, &L->ffn_norm, mlx, e)) < 0)
            return rc;
        rc = m->hp.layer[il].mixer == MIXER_DELTANET ? map_deltanet(m, &w, L, il, mlx, inproj, e)
                                                     : map_gated_attention(m, &w, L, il, mlx, e);
        if (rc < 0 || (rc = hf_map_ffn(m, &w, L, il, names, e)) < 0)
            return rc;
    }
    return 0;
}

/* in_proj_qkvz / in_proj_ba, rows interleaved per key head g: [q_g | k_g | v_g | z_g] and
 * [b_g | a_g] (v_g, z_g, b_g, a_g covering g's value heads), into q | k | v | z and b | a. */
