/*
 * falcon_h1 self-test: FalconH1Config's layers and multipliers.
 *  - Config: each config layer becomes an attention + MLP layer and a Mamba-2 layer
 *    (2 hp layers), the multipliers land where the forward reads them (key_multiplier in
 *    the softmax scale), the gated-norm options follow mamba_rms_norm /
 *    mamba_norm_before_gate; bad fields are rejected naming them.
 *  - Weights: the golden checkpoint is consumed entirely; missing A_log / conv1d named;
 *    mlx-lm's layout (conv1d [ch, K, 1], multipliers folded into the weights) gives the
 *    golden logits (its multipliers are 1) and ignores the config's multipliers.
 *  - Forward: every multiplier and the norm options change the golden logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../loading/config.h"
#include "../loading/convert.h"
#include "selftest.h"

extern const struct model_ops falcon_h1_ops;
int falcon_h1_ops_self_test(struct err *e);

#define CFG(extra) "{\"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 3, " \
                   "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"head_dim\": 16, " \
                   "\"max_position_embeddings\": 128, \"mamba_n_heads\": 8, " \
                   "\"mamba_d_state\": 16" extra "}"

static int config_rules(struct err *e)
{
    struct hparams hp;
    int rc;
    if ((rc = stest_parse(&falcon_h1_ops, CFG(", \"key_multiplier\": 0.5, \"mlp_multipliers\": "
                                              "[0.25, 2.0], \"ssm_multipliers\": [1, 2, 3, 4, 5], "
                                              "\"mamba_rms_norm\": true"), &hp, e)) < 0)
        return rc;
    if ((rc = stest_check(hp.n_layer == 6 && hp.layer[4].mixer == MIXER_ATTENTION &&
                          hp.layer[4].ffn == FFN_GLU && hp.layer[5].mixer == MIXER_MAMBA2 &&
                          hp.layer[5].ffn == FFN_NONE && hp.layer[5].kv == KV_RECURRENT &&
                          stest_near(hp.layer[0].attn_scale, 0.5 / 4.0, 1e-7) &&
                          hp.mup.mlp_gate == 0.25f && hp.mup.mlp_down == 2.0f &&
                          hp.ssm.mup && hp.ssm.mup_mult[4] == 5.0f && !hp.ssm.norm_off &&
                          hp.ssm.norm_before_gate && hp.ssm.norm_groups == 1 &&
                          hp.ssm.d_inner == 128 && hp.ssm.head_dim == 16,
                          "pairs of layers and multipliers", e)) < 0)
        return rc;
    if ((rc = stest_parse(&falcon_h1_ops, CFG(", \"mamba_d_ssm\": 64"), &hp, e)) < 0 ||
        (rc = stest_check(hp.ssm.d_inner == 64 && hp.ssm.head_dim == 8 && hp.ssm.norm_off &&
                          hp.mup.ssm_in == 1.0f, "mamba_d_ssm, defaults", e)) < 0)
        return rc;
    static const struct stest_bad bad[] = {
        {CFG(", \"mamba_d_ssm\": 100"), "mamba_d_ssm"},
        {CFG(", \"mamba_d_head\": 8"), "mamba_n_heads"},
        {CFG(", \"ssm_multipliers\": [1, 2]"), "ssm_multipliers"},
        {CFG(", \"mlp_multipliers\": 3"), "mlp_multipliers"},
        {CFG(", \"projectors_bias\": true"), "projectors_bias"},
        {CFG(", \"lm_head_multiplier\": 0"), "lm_head_multiplier"},
        {CFG(", \"mamba_n_groups\": 3"), "mamba_n_groups"},
    };
    return stest_parse_fails_all(&falcon_h1_ops, bad, sizeof bad / sizeof bad[0], e);
}

static int weights(struct err *e)
{
    struct model *m = NULL;
    int rc = stest_load_variant(&m, "falcon_h1", NULL, NULL, e);
    if (rc < 0)
        return rc;
    rc = stest_check(st_set_n_unused(m->st) == 0 && m->hp.n_layer == 8, "every tensor consumed", e);
    model_free(m);
    if (rc < 0)
        return rc;
    static const char *const names[] = {"model.layers.0.mamba.A_log",
                                        "model.layers.2.mamba.conv1d.weight",
                                        "model.layers.1.self_attn.k_proj.weight",
                                        "model.layers.3.feed_forward.gate_proj.weight",
                                        "model.layers.3.mamba.norm.weight", NULL};
    return stest_missing_named("falcon_h1", names, e);
}

/* The golden checkpoint as mlx-lm's converter lays it out (conv1d [ch, K, 1]; its
 * multipliers, all 1, folded), the config's keys replaced by patch (or NULL), loaded. */
static int load_mlx(struct model **m, const char *patch, struct err *e)
{
    static const struct ck_view_rule views[] = {
        {"model.layers.%d.mamba.conv1d.weight", "model.layers.%d.mamba.conv1d.weight", CK_VIEW_T, 0, 0},
        {NULL, NULL, CK_VIEW_NONE, 0, 0},
    };
    char *tmp = stest_tmpdir(), path[600];
    cJSON *cfg = NULL, *pj = patch ? cJSON_Parse(patch) : NULL;
    struct convert_opts o = {STEST_GOLDEN "falcon_h1", tmp, NULL, NULL, -1, NULL, NULL, NULL, NULL,
                             views, NULL, NULL};
    struct convert_stats st;
    int rc;
    *m = NULL;
    if (!tmp)
        return err_setf(e, ERR_IO, "cannot make a temporary folder");
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if ((rc = convert_checkpoint(&o, &st, e)) == 0 && patch &&
        (rc = cfg_load_file(path, FILE_FOLDER, &cfg, e)) == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, pj) {
            cJSON_DeleteItemFromObjectCaseSensitive(cfg, it->string);
            cJSON_AddItemToObject(cfg, it->string, cJSON_Duplicate(it, true));
        }
        char *text = cJSON_Print(cfg);
        FILE *f = text ? fopen(path, "w") : NULL;
        if (!f || fputs(text, f) < 0)
            rc = err_setf(e, ERR_IO, "cannot write %s", path);
        if (f)
            fclose(f);
        free(text);
    }
    if (rc == 0)
        rc = model_load(m, tmp, e);
    cJSON_Delete(cfg);
    cJSON_Delete(pj);
    stest_rmtree(tmp);
    return rc;
}

/* mlx-lm's layout gives the golden logits, whatever multipliers its config states */
static int mlx_layout(struct err *e)
{
    struct model *ref = NULL, *mlx = NULL, *mlxp = NULL;
    int rc, V;
    float *a = NULL, *b = NULL, *c = NULL;
    if ((rc = stest_load_variant(&ref, "falcon_h1", NULL, NULL, e)) < 0 ||
        (rc = load_mlx(&mlx, NULL, e)) < 0 ||
        (rc = load_mlx(&mlxp, "{\"embedding_multiplier\": 2, \"key_multiplier\": 3, "
                              "\"ssm_multipliers\": [2, 1, 1, 1, 3], \"mlp_multipliers\": [2, 2], "
                              "\"attention_in_multiplier\": 2}", e)) < 0)
        goto done;
    V = ref->hp.n_vocab;
    a = malloc((size_t)V * sizeof *a);
    b = malloc((size_t)V * sizeof *b);
    c = malloc((size_t)V * sizeof *c);
    if (!a || !b || !c) {
        rc = err_setf(e, ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = stest_prompt_logits(ref, a, e)) < 0 || (rc = stest_prompt_logits(mlx, b, e)) < 0 ||
        (rc = stest_prompt_logits(mlxp, c, e)) < 0)
        goto done;
    double mx = 0, d1 = 0, d2 = 0;
    for (int i = 0; i < V; i++) {
        mx = fmax(mx, fabs(a[i]));
        d1 = fmax(d1, fabs((double)a[i] - b[i]));
        d2 = fmax(d2, fabs((double)a[i] - c[i]));
    }
    rc = stest_check(mlx->layers[1].ssm_conv.ndim == 2 && !mlxp->hp.ssm.mup &&
                     d1 <= 1e-5 * mx && d2 <= 1e-5 * mx,
                     "mlx-lm's folded layout: the golden logits, config multipliers not applied", e);
done:
    free(a);
    free(b);
    free(c);
    model_free(ref);
    model_free(mlx);
    model_free(mlxp);
    return rc;
}

int falcon_h1_ops_self_test(struct err *e)
{
    static const char *const patches[] = {
        "{\"embedding_multiplier\": 2}", "{\"lm_head_multiplier\": 0.5}", "{\"key_multiplier\": 3}",
        "{\"attention_in_multiplier\": 2}", "{\"attention_out_multiplier\": 2}",
        "{\"ssm_in_multiplier\": 2}", "{\"ssm_out_multiplier\": 2}", "{\"mlp_multipliers\": [2, 1]}",
        "{\"mlp_multipliers\": [1, 2]}", "{\"ssm_multipliers\": [2, 1, 1, 1, 1]}",
        "{\"ssm_multipliers\": [1, 1, 1, 1, 3]}", "{\"mamba_norm_before_gate\": false}",
        "{\"mamba_rms_norm\": false}", NULL};
    int rc;
    if ((rc = config_rules(e)) < 0 || (rc = weights(e)) < 0 || (rc = mlx_layout(e)) < 0)
        return rc;
    for (int i = 0; patches[i] && rc == 0; i++)
        rc = stest_patch_changes_logits("falcon_h1", patches[i], e);
    return rc;
}
