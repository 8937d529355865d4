/*
 * blocks_gdn: the gated DeltaNet mixer of Qwen3-Next and Qwen3.5 (blocks.h; transformers'
 * Qwen3NextGatedDeltaNet), through the backend ops only. The projections arrive split in
 * the canonical order (the family's map_weights undoes transformers' head-interleaved
 * in_proj_qkvz / in_proj_ba rows at load): q | k | v feed the causal convolution, z gates
 * the output, b sets beta and a the decay. The scratch b->rec holds, for the n rows of the
 * chunk, four dense planes one after the other (the linear products read dense rows):
 *
 *   qkv [n, conv_dim = 2 n_k_head k_dim + n_v_head v_dim] | z [n, vd] | y [n, vd] | ba [n, 2 nv]
 *
 * where vd = n_v_head * v_dim. The convolution runs in place over q | k | v; the rule reads
 * them and b | a and writes y; the gated norm and the product with silu(z) run over y.
 */
#include "blocks.h"

int blk_deltanet_scratch(const struct hparams *hp)
{
    int64_t kd = (int64_t)hp->ssm.n_group * hp->ssm.k_head_dim;
    int64_t vd = (int64_t)hp->ssm.n_head * hp->ssm.head_dim;
    int64_t need = 2 * kd + 3 * vd + 2 * (int64_t)hp->ssm.n_head;
    return need > HP_MAX_DIM * 8 ? -1 : (int)need;
}

void blk_deltanet(const struct model_ctx *c, float *o, const float *xn, const struct layer *L,
                  const struct kv_layer *kv, const struct kv_rows *rows, int n)
{
    struct backend *be = c->be;
    const struct backend_ops *op = be->ops;
    const struct hparams *hp = &c->m->hp;
    int nk = hp->ssm.n_group, nv = hp->ssm.n_head, dk = hp->ssm.k_head_dim, dv = hp->ssm.head_dim;
    int cd = 2 * nk * dk + nv * dv, vd = nv * dv;
    float *qkv = c->bufs.rec, *z = qkv + (size_t)n * cd, *y = z + (size_t)n * vd;
    float *ba = y + (size_t)n * vd;

    /* 1. the four input projections, into their columns of the scratch */
    struct linear_job jobs[4] = {
        {qkv, cd, xn, &L->ssm_in, NULL, n},
        {z, vd, xn, &L->ssm_z, NULL, n},
        {ba, 2 * nv, xn, &L->ssm_x, NULL, n},
        {ba + nv, 2 * nv, xn, &L->ssm_xa, NULL, n},
    };
    op->linear_batch(be, jobs, 4);
    /* 2. causal depthwise conv + silu over q | k | v, carrying the last d_conv - 1 rows */
    op->conv1d(be, qkv, cd, qkv, cd, &L->ssm_conv, NULL, kv, rows, n, cd, hp->ssm.d_conv, true);
    /* 3. the gated delta rule, carrying each value head's [k_dim, v_dim] state */
    struct gdn_params p = {.n_k_head = nk, .n_v_head = nv, .k_dim = dk, .v_dim = dv,
                           .a_log = &L->ssm_a, .dt_bias = &L->ssm_dt_b};
    op->gated_delta(be, y, vd, qkv, cd, ba, 2 * nv, &p, kv, rows, n);
    /* 4. RMSNormGated: rmsnorm(y) * w per value head (plain w, not 1 + w), then * silu(z) */
    op->rmsnorm(be, y, y, vd, &L->ssm_norm, 0.0f, hp->ssm.norm_eps, n, nv, dv);
    op->act(be, ACT_SILU, z, vd, n, vd);
    op->mul(be, y, vd, y, vd, z, vd, n, vd);
    /* 5. output projection */
    op->linear(be, o, hp->n_embd, y, &L->ssm_out, NULL, n);
}
