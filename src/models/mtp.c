/*
 * mtp: a checkpoint's multi-token-prediction (MTP) layer as a model of one layer (ADR 0108, 0135).
 *
 * MTP_DEEPSEEK. DeepSeek-V3 (and GLM-4.5, GLM-4.7-Flash, which copy its layout) ship
 * num_nextn_predict_layers layers past num_hidden_layers, model.layers.N.*: a decoder layer of
 * the model's own kind (latent attention, experts or a dense FFN as layer N of the config would
 * have) and around it
 *
 *   x      = eh_proj(cat(enorm(embed(token at p + 1)), hnorm(h_p)))       the embedding first
 *   logits = shared_head.head(shared_head.norm(layer(x)))
 *
 * as vLLM's deepseek_mtp.py and SGLang's deepseek_nextn.py run it (h_p: the model's final
 * hidden state at p, after its output norm). transformers builds none of it.
 *
 * MTP_QWEN3_NEXT. Qwen3-Next and Qwen3.5 keep the module apart, mtp.*, as vLLM's
 * qwen3_next_mtp.py / qwen3_5_mtp.py run it: the same input stage with fc,
 * pre_fc_norm_embedding, pre_fc_norm_hidden (zero-centred norms, 1 + w, like every norm of
 * these families), mtp.layers.0 a full-attention decoder layer whose FFN is the model's kind
 * as vLLM builds it (layer index 0's: experts under decoder_sparse_step 1), mtp.norm, the
 * model's lm_head and embeddings. The count is mtp_num_hidden_layers (what the published
 * configs say), else num_nextn_predict_layers (what vLLM reads), else 1 (vLLM's default).
 *
 * model_load_mtp loads either by renaming, so that the family's own parse_config and
 * map_weights do the work: the config is parsed with num_hidden_layers + 1 layers (Qwen3-Next:
 * layer_types ending in full_attention) and layer N's spec becomes layer 0's; the model's
 * layers are renamed out of the way (mtp.main.*) and the MTP layer's tensors become
 * model.layers.0.*; its output norm takes model.norm's name and (DeepSeek) shared_head.head
 * lm_head's (when the layer has none, the model's lm_head stays, as SGLang shares it). The
 * embeddings are the model's (DeepSeek-V3's layer keeps a copy of them, left unread). Only the
 * input stage is bound here.
 */
#include "mtp.h"

#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"
#include "qwen3_next.h"

/* Where the model's own tensors go while the MTP layer is loaded (marked as not read). */
#define MTP_AWAY "mtp.main."

/* cfg's num_hidden_layers (already read as n_layer) becomes n_layer + 1. */
static int grow_layers(cJSON *cfg, int n_layer, struct err *e)
{
    cJSON *v = cJSON_CreateNumber(n_layer + 1);
    if (!v || !cJSON_ReplaceItemInObjectCaseSensitive(cfg, "num_hidden_layers", v)) {
        cJSON_Delete(v);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    return 0;
}

/* Qwen3-Next / Qwen3.5 (the file's comment): the count, then one full-attention layer more in
 * layer_types (written out from full_attention_interval when the config has none). */
static int qwen3_next_config(cJSON *cfg, int *n_main, struct err *e)
{
    const char *key = cfg_has(cfg, "mtp_num_hidden_layers") ? "mtp_num_hidden_layers" : "num_nextn_predict_layers";
    bool dedicated;
    int n_next, n_layer, interval, rc;
    if ((rc = cfg_opt_int(cfg, key, 1, &n_next, e)) < 0 || (rc = cfg_int(cfg, "num_hidden_layers", &n_layer, e)) < 0 ||
        (rc = cfg_opt_int(cfg, "full_attention_interval", 4, &interval, e)) < 0 ||
        (rc = cfg_opt_bool(cfg, "mtp_use_dedicated_embeddings", false, &dedicated, e)) < 0)
        return rc;
    if (n_next < 1)
        return err_setf(e, ERR_CONFIG, "the checkpoint has no multi-token-prediction layer: config field "
                        "'%s' is %d", key, n_next);
    if (dedicated)
        return err_setf(e, ERR_UNSUPPORTED, "config field 'mtp_use_dedicated_embeddings' = true (an MTP "
                        "module with embeddings of its own) is not supported");
    if (n_next > HP_MAX_LAYERS || n_layer < 1 || n_layer >= HP_MAX_LAYERS || interval < 1)
        return err_setf(e, ERR_CONFIG, "config fields 'num_hidden_layers' = %d, '%s' = %d, "
                        "'full_attention_interval' = %d are out of range", n_layer, key, n_next, interval);
    cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "layer_types"), *full = NULL;
    if (!lt || cJSON_IsNull(lt)) {
        cJSON *made = cJSON_CreateArray();
        for (int il = 0; made && il < n_layer; il++) {
            cJSON *w = cJSON_CreateString((il + 1) % interval ? "linear_attention" : "full_attention");
            if (!w || !cJSON_AddItemToArray(made, w)) {
                cJSON_Delete(w);
                cJSON_Delete(made);
                made = NULL;
            }
        }
        if (!made || (lt && !cJSON_ReplaceItemInObjectCaseSensitive(cfg, "layer_types", made)) ||
            (!lt && !cJSON_AddItemToObject(cfg, "layer_types", made))) {
            cJSON_Delete(made);
            return err_setf(e, ERR_NOMEM, "out of memory");
        }
        lt = made;
    }
    /* a list of another length is the family's to refuse (parse_layer_kinds) */
    if (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == n_layer &&
        (!(full = cJSON_CreateString("full_attention")) || !cJSON_AddItemToArray(lt, full))) {
        cJSON_Delete(full);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    *n_main = n_layer;
    return grow_layers(cfg, n_layer, e);
}

int mtp_config(cJSON *cfg, const struct model_ops *ops, int *n_main, struct err *e)
{
    int n_next, n_layer, rc;
    if (ops->mtp == MTP_NONE)
        return err_setf(e, ERR_UNSUPPORTED, "the %s family has no multi-token-prediction layers mlxcel "
                        "can load (--spec mtp: deepseek_v3, glm4_moe, glm4_moe_lite, qwen3_next, "
                        "qwen3_5_text)", ops->family);
    if (ops->mtp == MTP_QWEN3_NEXT)
        return qwen3_next_config(cfg, n_main, e);
    bool stated = cfg_has(cfg, "num_nextn_predict_layers");
    if ((rc = cfg_opt_int(cfg, "num_nextn_predict_layers", 0, &n_next, e)) < 0 ||
        (rc = cfg_int(cfg, "num_hidden_layers", &n_layer, e)) < 0)
        return rc;
    if (n_next < 1)
        return err_setf(e, ERR_CONFIG, "the checkpoint has no multi-token-prediction layer: config field "
                        "'num_nextn_predict_layers' is %s", stated ? "0" : "absent");
    if (n_next > HP_MAX_LAYERS || n_layer < 1 || n_layer >= HP_MAX_LAYERS)
        return err_setf(e, ERR_CONFIG, "config fields 'num_hidden_layers' = %d, 'num_nextn_predict_layers' "
                        "= %d are out of range", n_layer, n_next);
    /* the family parses one layer more: layer n_layer's spec is the MTP layer's; a per-layer
     * list of n_layer words (GLM-4.7-Flash's mlp_layer_types) gets its last word once more,
     * the kind first_k_dense_replace gives a layer past the dense ones */
    if ((rc = grow_layers(cfg, n_layer, e)) < 0)
        return rc;
    cJSON *lt = cJSON_GetObjectItemCaseSensitive(cfg, "mlp_layer_types");
    if (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == n_layer) {
        cJSON *last = cJSON_Duplicate(cJSON_GetArrayItem(lt, n_layer - 1), true);
        if (!last || !cJSON_AddItemToArray(lt, last)) {
            cJSON_Delete(last);
            return err_setf(e, ERR_NOMEM, "out of memory");
        }
    }
    *n_main = n_layer;
    return 0;
}

int mtp_count(const cJSON *cfg, int *n, struct err *e)
{
    int rc = cfg_opt_int(cfg, "num_nextn_predict_layers", 0, n, e);
    if (rc == 0 && (*n < 0 || *n > HP_MAX_LAYERS))
        rc = err_setf(e, ERR_CONFIG, "config field 'num_nextn_predict_layers' = %d is out of range [0, %d]", *n,
                      HP_MAX_LAYERS);
    return rc;
}

void mtp_skip(struct st_set *st, int n_layer, int n)
{
    char pre[64];
    for (int i = 0; i < n; i++) {
        snprintf(pre, sizeof pre, "model.layers.%d.", n_layer + i);
        st_set_mark_prefix(st, pre);
    }
}

void mtp_layer_spec(struct hparams *hp, int n_main, enum mtp_layout layout)
{
    struct layer_spec first = hp->layer[0];
    hp->layer[0] = hp->layer[n_main];
    hp->n_layer = 1;
    if (layout != MTP_QWEN3_NEXT)
        return;
    /* vLLM builds the layer as index 0 of its own list: the FFN layer 0 has (experts unless
     * mlp_only_layers names 0 or decoder_sparse_step is over 1) */
    struct layer_spec *ls = &hp->layer[0];
    ls->moe = first.moe;
    ls->ffn = first.ffn;
    ls->act = first.act;
    ls->n_ff = first.n_ff;
    ls->n_ff_shexp = first.n_ff_shexp;
    ls->router = first.router;
    ls->n_expert_used = first.n_expert_used;
}

/* rename from -> to where a tensor's name starts with from (st_set_rename_prefix's errors) */
static int rename_prefix(struct st_set *st, const char *from, const char *to, struct err *e)
{
    int rc = st_set_rename_prefix(st, from, to, e);
    return rc < 0 ? rc : 0;
}

/* Qwen3-Next / Qwen3.5: mtp.layers.0.* as model.layers.0.*, mtp.norm as model.norm; mlx-lm's
 * conversions (its conv1d [ch, K, 1], norms stored as 1 + w) keep no MTP module, and one that
 * did would need its norms read as stored: refused. */
static int qwen3_next_rename(struct st_set *st, int n_main, struct err *e)
{
    static const char *const needed[] = {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight",
                                         "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                                         "mtp.layers.0.input_layernorm.weight"};
    char name[96];
    int rc;
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!st_set_find(st, needed[i]))
            return err_setf(e, ERR_FORMAT, "tensor '%s' is missing: the checkpoint does not hold its "
                            "multi-token-prediction layer (conversions such as mlx-lm's drop it)", needed[i]);
    for (int il = 0; il < n_main; il++) {
        snprintf(name, sizeof name, "model.layers.%d.linear_attn.conv1d.weight", il);
        const struct st_tensor *t = st_set_find(st, name);
        if (t && t->ndim == 3 && t->shape[1] > 1 && t->shape[2] == 1)
            return err_setf(e, ERR_UNSUPPORTED, "an mlx-lm conversion (tensor '%s' is [ch, K, 1]): its "
                            "multi-token-prediction layer is not supported", name);
    }
    if ((rc = rename_prefix(st, "model.layers.", MTP_AWAY "layers.", e)) < 0 ||
        (rc = rename_prefix(st, "mtp.layers.0.", "model.layers.0.", e)) < 0 ||
        (rc = rename_prefix(st, "model.norm.", MTP_AWAY "norm.", e)) < 0 ||
        (rc = rename_prefix(st, "mtp.norm.", "model.norm.", e)) < 0)
        return rc;
    st_set_mark_prefix(st, MTP_AWAY);
    st_set_mark_prefix(st, "mtp.layers.");  /* further MTP layers (mtp_num_hidden_layers > 1) */
    return 0;
}

int mtp_rename(struct st_set *st, int n_main, enum mtp_layout layout, struct err *e)
{
    char layer[64], name[128];
    int rc;
    if (layout == MTP_QWEN3_NEXT)
        return qwen3_next_rename(st, n_main, e);
    snprintf(layer, sizeof layer, "model.layers.%d.", n_main);
    static const char *const needed[] = {"eh_proj.weight", "enorm.weight", "hnorm.weight",
                                         "shared_head.norm.weight"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        snprintf(name, sizeof name, "%s%s", layer, needed[i]);
        if (!st_set_find(st, name))
            return err_setf(e, ERR_FORMAT, "tensor '%s' is missing: the checkpoint does not hold its "
                            "multi-token-prediction layer (conversions such as mlx-lm's drop it)", name);
    }
    bool own_head = (snprintf(name, sizeof name, "%sshared_head.head.weight", layer), st_set_find(st, name));
    if ((rc = rename_prefix(st, "model.layers.", MTP_AWAY "layers.", e)) < 0)
        return rc;
    snprintf(name, sizeof name, MTP_AWAY "layers.%d.", n_main);
    if ((rc = rename_prefix(st, name, "model.layers.0.", e)) < 0 ||
        (rc = rename_prefix(st, "model.norm.", MTP_AWAY "norm.", e)) < 0 ||
        (rc = rename_prefix(st, "model.layers.0.shared_head.norm.", "model.norm.", e)) < 0)
        return rc;
    if (own_head && ((rc = rename_prefix(st, "lm_head.", MTP_AWAY "lm_head.", e)) < 0 ||
                     (rc = rename_prefix(st, "model.layers.0.shared_head.head.", "lm_head.", e)) < 0))
        return rc;
    st_set_mark_prefix(st, MTP_AWAY);
    st_set_mark_prefix(st, "model.layers.0.embed_tokens.");  /* the embeddings' copy */
    return 0;
}

int mtp_map(struct model *m, struct st_set *st, struct err *e)
{
    struct wmap w = {st, &m->hp.quant};
    int64_t d = m->hp.n_embd;
    int rc;
    if (m->ops->mtp == MTP_QWEN3_NEXT) {
        /* the embedding's norm first, as the concatenation's halves (vLLM's order) */
        if ((rc = wm_vec(&w, &m->mtp.enorm, WM_REQUIRED, d, e, "mtp.pre_fc_norm_embedding.weight")) < 0 ||
            (rc = wm_vec(&w, &m->mtp.hnorm, WM_REQUIRED, d, e, "mtp.pre_fc_norm_hidden.weight")) < 0 ||
            (rc = wm_linear(&w, &m->mtp.eh_proj, WM_REQUIRED, 0, d, 2 * d, e, "mtp.fc")) < 0 ||
            (rc = qwen3_next_norm_plus_one(m, st, &m->mtp.enorm, e)) < 0)
            return rc;
        return qwen3_next_norm_plus_one(m, st, &m->mtp.hnorm, e);
    }
    if ((rc = wm_vec(&w, &m->mtp.enorm, WM_REQUIRED, d, e, "model.layers.0.enorm.weight")) < 0 ||
        (rc = wm_vec(&w, &m->mtp.hnorm, WM_REQUIRED, d, e, "model.layers.0.hnorm.weight")) < 0 ||
        (rc = wm_linear(&w, &m->mtp.eh_proj, WM_REQUIRED, 0, d, 2 * d, e, "model.layers.0.eh_proj")) < 0)
        return rc;
    return 0;
}
