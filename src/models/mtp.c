/*
 * mtp: a checkpoint's multi-token-prediction (MTP) layer as a model of one layer (ADR 0108).
 *
 * DeepSeek-V3 (and GLM-4.5, GLM-4.7-Flash, which copy its layout) ship num_nextn_predict_layers
 * layers past num_hidden_layers, model.layers.N.*: a decoder layer of the model's own kind
 * (latent attention, experts or a dense FFN as layer N of the config would have) and around it
 *
 *   x      = eh_proj(cat(enorm(embed(token at p + 1)), hnorm(h_p)))       the embedding first
 *   logits = shared_head.head(shared_head.norm(layer(x)))
 *
 * as vLLM's deepseek_mtp.py and SGLang's deepseek_nextn.py run it (h_p: the model's final
 * hidden state at p, after its output norm). transformers builds none of it.
 *
 * model_load_mtp loads it by renaming, so that the family's own parse_config and map_weights
 * do the work: the config is parsed with num_hidden_layers + 1 layers and layer N's spec becomes
 * layer 0's; the model's layers are renamed out of the way (mtp.main.*) and model.layers.N.*
 * becomes model.layers.0.*; shared_head.norm takes model.norm's name and shared_head.head
 * lm_head's (when the layer has none, the model's lm_head stays, as SGLang shares it). The
 * embeddings are the model's (DeepSeek-V3's layer keeps a copy of them, left unread). Only
 * enorm, hnorm and eh_proj are bound here.
 */
#include "mtp.h"

#include <stdio.h>
#include <string.h>

#include "../loading/config.h"
#include "../loading/wmap.h"

/* Where the model's own tensors go while the MTP layer is loaded (marked as not read). */
#define MTP_AWAY "mtp.main."

int mtp_config(cJSON *cfg, const struct model_ops *ops, int *n_main, struct err *e)
{
    int n_next, n_layer, rc;
    if (ops->mtp == MTP_NONE)
        return err_setf(e, ERR_UNSUPPORTED, "the %s family has no multi-token-prediction layers mlxcel "
                        "can load (--spec mtp: deepseek_v3, glm4_moe, glm4_moe_lite)", ops->family);
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
    cJSON *v = cJSON_CreateNumber(n_layer + 1);
    if (!v || !cJSON_ReplaceItemInObjectCaseSensitive(cfg, "num_hidden_layers", v)) {
        cJSON_Delete(v);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
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

void mtp_layer_spec(struct hparams *hp, int n_main)
{
    hp->layer[0] = hp->layer[n_main];
    hp->n_layer = 1;
}

/* rename from -> to where a tensor's name starts with from (st_set_rename_prefix's errors) */
static int rename_prefix(struct st_set *st, const char *from, const char *to, struct err *e)
{
    int rc = st_set_rename_prefix(st, from, to, e);
    return rc < 0 ? rc : 0;
}

int mtp_rename(struct st_set *st, int n_main, struct err *e)
{
    char layer[64], name[128];
    int rc;
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
    if ((rc = wm_vec(&w, &m->mtp.enorm, WM_REQUIRED, d, e, "model.layers.0.enorm.weight")) < 0 ||
        (rc = wm_vec(&w, &m->mtp.hnorm, WM_REQUIRED, d, e, "model.layers.0.hnorm.weight")) < 0 ||
        (rc = wm_linear(&w, &m->mtp.eh_proj, WM_REQUIRED, 0, d, 2 * d, e, "model.layers.0.eh_proj")) < 0)
        return rc;
    return 0;
}
