/*
 * vision_blocks: the ViT tower (vision_blocks.h). Loading binds SigLIP's names to the
 * canonical slots of struct layer; the forward runs one image as one "sequence" of n_patch
 * rows through blk_attention, whose kv_rows give every patch the whole image as its
 * bidirectional span (kv_rows.span), over a K/V buffer of the image's own (one block of
 * n_pos slots, reused by every layer: a layer's K/V are not read after it). CLIP (LLaVA)
 * adds a class row before the patches, pre_layrnorm and quick_gelu.
 */
#include "vision_blocks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loading/config.h"
#include "blocks.h"

/* Bounds on an untrusted vision_config: far above every published tower (SigLIP so400m:
 * 1152 wide, 27 layers, 896 px / 14 = 4096 patches), low enough that no size overflows. */
#define VIT_MAX_EMBD   8192
#define VIT_MAX_FF     65536
#define VIT_MAX_LAYERS 128
#define VIT_MAX_IMAGE  4096
#define VIT_MAX_PATCHES 16384
#define VIT_MAX_SIDE   128    /* patches per side: VIT_MAX_PATCHES = VIT_MAX_SIDE² */

// ---- config ----

static int parse_act(const char *name, enum act_kind *out, struct err *e)
{
    if (!strcmp(name, "gelu_pytorch_tanh") || !strcmp(name, "gelu_new") || !strcmp(name, "gelu_fast"))
        *out = ACT_GELU_TANH;
    else if (!strcmp(name, "gelu"))
        *out = ACT_GELU_ERF;
    else if (!strcmp(name, "silu") || !strcmp(name, "swish"))
        *out = ACT_SILU;
    else if (!strcmp(name, "relu"))
        *out = ACT_RELU;
    else
        return err_setf(e, ERR_UNSUPPORTED, "hidden_act '%s' is not supported", name);
    return 0;
}

/* A ViT vision_config with these defaults for absent keys. */
struct vit_defaults {
    int patch_size;
    float norm_eps;
    const char *act;
    bool cls;
    int n_embd, n_ff, n_layer, n_head;
};

static int vit_parse(struct vit_hparams *vh, const cJSON *vc, const struct vit_defaults *d, struct err *e)
{
    char act[64];
    int rc;
    memset(vh, 0, sizeof *vh);
    if ((rc = cfg_opt_int(vc, "hidden_size", d->n_embd, &vh->n_embd, e)) < 0 ||
        (rc = cfg_opt_int(vc, "intermediate_size", d->n_ff, &vh->n_ff, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_hidden_layers", d->n_layer, &vh->n_layer, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_attention_heads", d->n_head, &vh->n_head, e)) < 0 ||
        (rc = cfg_opt_int(vc, "num_channels", 3, &vh->n_channels, e)) < 0 ||
        (rc = cfg_opt_int(vc, "image_size", 224, &vh->image_size, e)) < 0 ||
        (rc = cfg_opt_int(vc, "patch_size", d->patch_size, &vh->patch_size, e)) < 0 ||
        (rc = cfg_opt_float(vc, "layer_norm_eps", d->norm_eps, &vh->norm_eps, e)) < 0 ||
        (rc = cfg_opt_str(vc, "hidden_act", d->act, act, sizeof act, e)) < 0)
        return err_prefix(e, "vision_config");
    /* quick_gelu: CLIP's (SigLIP configs do not use it) */
    vh->quick_gelu = d->cls && strcmp(act, "quick_gelu") == 0;
    if (vh->quick_gelu)
        vh->act = ACT_SIGMOID;
    else if ((rc = parse_act(act, &vh->act, e)) < 0)
        return err_prefix(e, "vision_config");
    if (vh->n_embd < 1 || vh->n_embd > VIT_MAX_EMBD || vh->n_ff < 1 || vh->n_ff > VIT_MAX_FF ||
        vh->n_layer < 1 || vh->n_layer > VIT_MAX_LAYERS || vh->n_head < 1 || vh->n_embd % vh->n_head)
        return err_setf(e, ERR_CONFIG, "vision_config: hidden_size %d, intermediate_size %d, "
                        "num_hidden_layers %d, num_attention_heads %d out of range (hidden_size a "
                        "multiple of the heads, at most %d wide, %d layers)", vh->n_embd, vh->n_ff,
                        vh->n_layer, vh->n_head, VIT_MAX_EMBD, VIT_MAX_LAYERS);
    if (vh->n_channels < 1 || vh->n_channels > 4 || vh->patch_size < 1 || vh->image_size < 1 ||
        vh->image_size > VIT_MAX_IMAGE || vh->image_size % vh->patch_size)
        return err_setf(e, ERR_CONFIG, "vision_config: image_size %d, patch_size %d, num_channels %d "
                        "out of range (image_size a multiple of patch_size, at most %d; 1-4 channels)",
                        vh->image_size, vh->patch_size, vh->n_channels, VIT_MAX_IMAGE);
    if (!(vh->norm_eps > 0.0f) || !isfinite(vh->norm_eps))
        return err_setf(e, ERR_CONFIG, "vision_config.layer_norm_eps %g must be positive", vh->norm_eps);
    vh->head_dim = vh->n_embd / vh->n_head;
    vh->side = vh->image_size / vh->patch_size;
    vh->n_patch = vh->side * vh->side;
    if (vh->n_patch > VIT_MAX_PATCHES || vh->head_dim > 256)
        return err_setf(e, ERR_CONFIG, "vision_config: %d patches (at most %d) or head dim %d (at most "
                        "256)", vh->n_patch, VIT_MAX_PATCHES, vh->head_dim);
    vh->cls = d->cls;
    vh->n_pos = vh->n_patch + (d->cls ? 1 : 0);
    return 0;
}

int vit_parse_siglip(struct vit_hparams *vh, const cJSON *vc, struct err *e)
{
    /* transformers SiglipVisionConfig defaults */
    static const struct vit_defaults d = {16, 1e-6f, "gelu_pytorch_tanh", false, 768, 3072, 12, 12};
    return vit_parse(vh, vc, &d, e);
}

int vit_parse_idefics3(struct vit_hparams *vh, const cJSON *vc, struct err *e)
{
    /* transformers Idefics3VisionConfig (and SmolVLMVisionConfig) defaults */
    static const struct vit_defaults d = {32, 1e-6f, "gelu_pytorch_tanh", false, 1152, 3072, 12, 16};
    return vit_parse(vh, vc, &d, e);
}

int vit_find_tower(struct wmap *w, const char **tower, const char **proj)
{
    static const char *const towers[] = {"model.vision_tower.vision_model.", "vision_tower.vision_model.",
                                         "model.vision_tower.", "vision_tower."};
    static const char *const projs[] = {"model.multi_modal_projector.", "multi_modal_projector.",
                                        "model.multi_modal_projector.", "multi_modal_projector."};
    for (int i = 0; i < 4; i++)
        if (wm_has(w, "%sembeddings.patch_embedding.weight", towers[i])) {
            *tower = towers[i];
            *proj = projs[i];
            return i;
        }
    return -1;
}

int vit_parse_clip(struct vit_hparams *vh, const cJSON *vc, struct err *e)
{
    /* transformers CLIPVisionConfig defaults */
    static const struct vit_defaults d = {32, 1e-5f, "quick_gelu", true, 768, 3072, 12, 12};
    return vit_parse(vh, vc, &d, e);
}

// ---- bucketed position ids (Idefics2/3, SmolVLM) ----

/* torch.arange(start, end, step) into float32 on the CPU, as aten's arange kernel writes it:
 * n = ceil((end - start) / step) in double; start + step * i in double (the float kernel's
 * accumulate type), rounded to float. Where the kernel's vectorized loop runs (blocks of two
 * vectors of `lanes` floats while at least that many remain), each vector's base is first
 * rounded to float and its lanes are base + j * step: last-bit differences that decide a bucket
 * at an exact boundary. Returns n (at most cap). */
static int torch_arange_f32(float *out, int cap, double start, double end, double step, int lanes)
{
    double nd = ceil((end - start) / step);
    int n = nd < 0 ? 0 : nd > cap ? cap : (int)nd, i = 0;
    if (lanes > 0)
        for (; i <= n - 2 * lanes; i += 2 * lanes)
            for (int h = 0; h < 2; h++) {
                float base = (float)(start + step * (double)(i + h * lanes));
                for (int j = 0; j < lanes; j++)
                    out[i + h * lanes + j] = (float)((double)base + j * step);
            }
    for (; i < n; i++)
        out[i] = (float)(start + step * (double)i);
    return n;
}

/* torch.bucketize(frac, boundaries, right=True) of torch.arange(0, 1 - 1e-6, 1 / nb) over
 * boundaries torch.arange(1 / side, 1.0, 1 / side): how many boundaries are <= each value. */
static int vit_buckets(int32_t *out, int nb, int side, int lanes)
{
    float bd[VIT_MAX_SIDE], fr[VIT_MAX_SIDE];
    int nbd = torch_arange_f32(bd, VIT_MAX_SIDE, 1.0 / side, 1.0, 1.0 / side, lanes);
    /* 1 / nb_patches: a true division of int64 tensors, in the default dtype (float32) */
    double step = (double)(1.0f / (float)nb);
    int nf = torch_arange_f32(fr, VIT_MAX_SIDE, 0.0, 1.0 - 1e-6, step, lanes);
    for (int k = 0; k < nf; k++) {
        int c = 0;
        while (c < nbd && bd[c] <= fr[k])
            c++;
        out[k] = c;
    }
    return nf;
}

int vit_bucket_positions(int32_t *out, int nb_h, int nb_w, int side, int lanes)
{
    int32_t bh[VIT_MAX_SIDE], bw[VIT_MAX_SIDE];
    if (side < 1 || side > VIT_MAX_SIDE || nb_h < 1 || nb_h > side || nb_w < 1 || nb_w > side)
        return -ERR_ARG;
    if (vit_buckets(bh, nb_h, side, lanes) != nb_h || vit_buckets(bw, nb_w, side, lanes) != nb_w)
        return -ERR_ARG;  /* arange's length is nb for every nb <= VIT_MAX_SIDE */
    for (int y = 0; y < nb_h; y++)
        for (int x = 0; x < nb_w; x++)
            out[y * nb_w + x] = bh[y] * side + bw[x];
    return 0;
}

// ---- weights ----

/* The conv weight [out, C, p, p] (torch) or [out, p, p, C] (MLX), bound as the matrix
 * [out, C p p] in the stored order. */
static int map_patch(struct vit_weights *vw, struct wmap *w, const struct vit_hparams *vh,
                     const char *prefix, struct err *e)
{
    char name[512];
    int64_t D = vh->n_embd, C = vh->n_channels, p = vh->patch_size;
    snprintf(name, sizeof name, "%sembeddings.patch_embedding.weight", prefix);
    const struct st_tensor *t = st_set_find(w->st, name);
    bool hwc = t && t->ndim == 4 && t->shape[1] == p && t->shape[3] == C && !(t->shape[1] == C);
    int64_t chw[4] = {D, C, p, p}, mlx[4] = {D, p, p, C};
    int rc = wm_tensor(w, &vw->patch_w, WM_REQUIRED, 4, hwc ? mlx : chw, e, "%s", name);
    if (rc < 0)
        return rc;
    vw->layout = hwc ? VIT_PATCH_HWC : VIT_PATCH_CHW;
    int64_t mat[2] = {D, C * p * p};
    const char *keep = vw->patch_w.name;
    tensor_init(&vw->patch_w, vw->patch_w.dtype, vw->patch_w.data, 2, mat);
    vw->patch_w.name = keep;
    int64_t pos[2] = {vh->n_pos, D};
    /* CLIP's patch conv has no bias */
    if ((rc = wm_vec(w, &vw->patch_b, !vh->cls, D, e, "%sembeddings.patch_embedding.bias", prefix)) < 0 ||
        (rc = wm_tensor(w, &vw->pos_embd, WM_REQUIRED, 2, pos, e, "%sembeddings.position_embedding.weight",
                        prefix)) < 0)
        return rc;
    return 0;
}

static int map_layer(struct layer *L, struct wmap *w, const struct vit_hparams *vh, const char *prefix,
                     int il, struct err *e)
{
    int64_t D = vh->n_embd, F = vh->n_ff;
    const char *p = prefix;
    int rc;
    if ((rc = wm_vec(w, &L->attn_norm, WM_REQUIRED, D, e, "%sencoder.layers.%d.layer_norm1.weight", p, il)) < 0 ||
        (rc = wm_vec(w, &L->attn_norm_b, WM_REQUIRED, D, e, "%sencoder.layers.%d.layer_norm1.bias", p, il)) < 0 ||
        (rc = wm_vec(w, &L->ffn_norm, WM_REQUIRED, D, e, "%sencoder.layers.%d.layer_norm2.weight", p, il)) < 0 ||
        (rc = wm_vec(w, &L->ffn_norm_b, WM_REQUIRED, D, e, "%sencoder.layers.%d.layer_norm2.bias", p, il)) < 0)
        return rc;
    static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    struct tensor *ws[4] = {&L->wq, &L->wk, &L->wv, &L->wo}, *bs[4] = {&L->bq, &L->bk, &L->bv, &L->bo};
    for (int i = 0; i < 4; i++)
        if ((rc = wm_linear(w, ws[i], WM_REQUIRED, 0, D, D, e, "%sencoder.layers.%d.self_attn.%s", p, il,
                            proj[i])) < 0 ||
            (rc = wm_vec(w, bs[i], WM_REQUIRED, D, e, "%sencoder.layers.%d.self_attn.%s.bias", p, il,
                         proj[i])) < 0)
            return rc;
    if ((rc = wm_linear(w, &L->up, WM_REQUIRED, 0, F, D, e, "%sencoder.layers.%d.mlp.fc1", p, il)) < 0 ||
        (rc = wm_vec(w, &L->up_b, WM_REQUIRED, F, e, "%sencoder.layers.%d.mlp.fc1.bias", p, il)) < 0 ||
        (rc = wm_linear(w, &L->down, WM_REQUIRED, 0, D, F, e, "%sencoder.layers.%d.mlp.fc2", p, il)) < 0 ||
        (rc = wm_vec(w, &L->down_b, WM_REQUIRED, D, e, "%sencoder.layers.%d.mlp.fc2.bias", p, il)) < 0)
        return rc;
    return 0;
}

int vit_map_siglip(struct vit_weights *vw, struct wmap *w, const struct vit_hparams *vh,
                   const char *prefix, struct err *e)
{
    int rc;
    memset(vw, 0, sizeof *vw);
    vw->layers = calloc((size_t)vh->n_layer, sizeof *vw->layers);
    if (!vw->layers)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if ((rc = map_patch(vw, w, vh, prefix, e)) < 0)
        return rc;
    for (int il = 0; il < vh->n_layer; il++)
        if ((rc = map_layer(&vw->layers[il], w, vh, prefix, il, e)) < 0)
            return rc;
    if ((rc = wm_vec(w, &vw->post_norm, WM_REQUIRED, vh->n_embd, e, "%spost_layernorm.weight", prefix)) < 0 ||
        (rc = wm_vec(w, &vw->post_norm_b, WM_REQUIRED, vh->n_embd, e, "%spost_layernorm.bias", prefix)) < 0)
        return rc;
    return 0;
}

int vit_map_clip(struct vit_weights *vw, struct wmap *w, const struct vit_hparams *vh, const char *prefix,
                 struct err *e)
{
    int rc;
    memset(vw, 0, sizeof *vw);
    vw->layers = calloc(vh->n_layer > 0 ? (size_t)vh->n_layer : 1, sizeof *vw->layers);
    if (!vw->layers)
        return err_setf(e, ERR_NOMEM, "out of memory");
    if (!vh->cls)
        return err_setf(e, ERR_ARG, "vit_map_clip: hparams without the class row (vit_parse_clip)");
    if ((rc = map_patch(vw, w, vh, prefix, e)) < 0 ||
        (rc = wm_vec(w, &vw->class_embd, WM_REQUIRED, vh->n_embd, e, "%sembeddings.class_embedding", prefix)) < 0 ||
        (rc = wm_vec(w, &vw->pre_norm, WM_REQUIRED, vh->n_embd, e, "%spre_layrnorm.weight", prefix)) < 0 ||
        (rc = wm_vec(w, &vw->pre_norm_b, WM_REQUIRED, vh->n_embd, e, "%spre_layrnorm.bias", prefix)) < 0)
        return rc;
    /* the class embedding as a one-row table: the embed op writes it into row 0 */
    int64_t one[2] = {1, vh->n_embd};
    const char *keep = vw->class_embd.name;
    tensor_init(&vw->class_embd, vw->class_embd.dtype, vw->class_embd.data, 2, one);
    vw->class_embd.name = keep;
    for (int il = 0; il < vh->n_layer; il++)
        if ((rc = map_layer(&vw->layers[il], w, vh, prefix, il, e)) < 0)
            return rc;
    return 0;
}

void vit_weights_free(struct vit_weights *vw)
{
    free(vw->layers);
    vw->layers = NULL;
}

void vit_each_weight(struct vit_weights *vw, const struct vit_hparams *vh,
                     void (*fn)(void *ud, struct tensor *t, bool linear), void *ud)
{
    struct tensor *top[] = {&vw->patch_w, &vw->patch_b, &vw->pos_embd, &vw->post_norm, &vw->post_norm_b,
                            &vw->class_embd, &vw->pre_norm, &vw->pre_norm_b};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (tensor_is_present(top[i]))
            fn(ud, top[i], i == 0);
    for (int il = 0; vw->layers && il < vh->n_layer; il++) {
        struct layer *L = &vw->layers[il];
        struct tensor *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->up, &L->down};
        struct tensor *vals[] = {&L->attn_norm, &L->attn_norm_b, &L->ffn_norm, &L->ffn_norm_b, &L->bq,
                                 &L->bk, &L->bv, &L->bo, &L->up_b, &L->down_b};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            fn(ud, mats[i], true);
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
            fn(ud, vals[i], false);
    }
}

// ---- context ----

static void *carve(char *base, size_t *off, size_t n)
{
    void *p = base ? base + *off : NULL;
    *off += ((n + 15) & ~(size_t)15) * sizeof(float);
    return p;
}

/* Lay out the buffers of one image; with base == NULL only returns the bytes. */
static size_t vit_layout(struct vit_ctx *vc, char *base)
{
    const struct vit_hparams *vh = vc->vh;
    size_t P = (size_t)vh->n_pos, D = (size_t)vh->n_embd, off = 0;
    size_t cpp = (size_t)vh->n_channels * vh->patch_size * vh->patch_size;
    struct ctx_bufs b = {0};
    b.x = carve(base, &off, P * D);
    b.xn = carve(base, &off, P * D);
    b.qkv = carve(base, &off, P * 3 * D);
    b.att = carve(base, &off, P * D);
    b.o = carve(base, &off, P * D);
    b.f = carve(base, &off, P * D);
    b.h = carve(base, &off, P * (size_t)vh->n_ff);
    b.h1 = vh->quick_gelu ? carve(base, &off, P * (size_t)vh->n_ff) : NULL;
    b.meta = carve(base, &off, 6 * P + 1);
    float *k = carve(base, &off, P * D), *v = carve(base, &off, P * D);
    float *patches = carve(base, &off, (size_t)vh->n_patch * cpp);
    if (base) {
        vc->b = b;
        vc->kv = (struct kv_layer){k, v, (int)D, (int)D, DTYPE_F32};
        vc->patches = patches;
    }
    return off;
}

/* Positions 0..P-1, slots = positions, one table of one block of P slots, every row's
 * span the whole image: uploaded once. */
static void vit_rows(struct vit_ctx *vc, int32_t *host)
{
    int P = vc->vh->n_pos;
    int32_t *pos = host, *slot = pos + P, *tab = slot + P, *end = tab + P, *span = end + P;
    int32_t *tables = span + 2 * P;
    for (int i = 0; i < P; i++) {
        pos[i] = slot[i] = i;
        tab[i] = 0;
        end[i] = P;
        span[2 * i] = 0;
        span[2 * i + 1] = P - 1;
    }
    tables[0] = 0;
    int32_t *d = vc->b.meta;
    vc->rows = (struct kv_rows){.pos = d, .slot = d + P, .table = d + 2 * P, .seq_end = d + 3 * P,
                                .span = d + 4 * P, .tables = d + 6 * P, .block_size = P};
}

int vit_ctx_new(struct vit_ctx **out, const struct vit_hparams *vh, const struct vit_weights *vw,
                struct backend *be, struct err *e)
{
    int rc;
    *out = NULL;
    struct vit_ctx *vc = calloc(1, sizeof *vc);
    if (!vc)
        return err_setf(e, ERR_NOMEM, "out of memory");
    vc->vh = vh;
    vc->vw = vw;
    vc->be = be;
    size_t P = (size_t)vh->n_pos, cpp = (size_t)vh->n_channels * vh->patch_size * vh->patch_size;
    size_t bytes = vit_layout(vc, NULL);
    int32_t *meta = malloc((6 * P + 1) * sizeof *meta);
    vc->patches_host = malloc((size_t)vh->n_patch * cpp * sizeof *vc->patches_host);
    if (!meta || !vc->patches_host) {
        free(meta);
        vit_ctx_free(vc);
        return err_setf(e, ERR_NOMEM, "out of memory");
    }
    if ((rc = be->ops->buf_alloc(be, bytes, &vc->arena, e)) < 0) {
        free(meta);
        vit_ctx_free(vc);
        return err_prefix(e, "vision tower activations (%zu MiB)", bytes >> 20);
    }
    vit_layout(vc, vc->arena);
    vit_rows(vc, meta);
    be->ops->upload(be, vc->b.meta, meta, (6 * P + 1) * sizeof *meta);
    rc = backend_sync(be, e);
    free(meta);
    if (rc < 0) {
        vit_ctx_free(vc);
        return rc;
    }
    *out = vc;
    return 0;
}

void vit_ctx_free(struct vit_ctx *vc)
{
    if (!vc)
        return;
    if (vc->arena)
        vc->be->ops->buf_free(vc->be, vc->arena);
    free(vc->patches_host);
    free(vc);
}

// ---- forward ----

/* pixels [C, S, S] -> one row per patch (row-major over the patch grid, as the conv's
 * flatten(2) orders them), its values in the stored weight's order: (c, ky, kx) for
 * torch's layout, (ky, kx, c) for MLX's. */
static void im2col(float *out, const float *px, const struct vit_hparams *vh, enum vit_patch_layout lay)
{
    int C = vh->n_channels, p = vh->patch_size, S = vh->image_size, side = vh->side;
    size_t cpp = (size_t)C * p * p;
    for (int py = 0; py < side; py++)
        for (int pxi = 0; pxi < side; pxi++) {
            float *row = out + ((size_t)py * side + pxi) * cpp;
            for (int c = 0; c < C; c++)
                for (int ky = 0; ky < p; ky++)
                    for (int kx = 0; kx < p; kx++) {
                        float v = px[((size_t)c * S + (size_t)py * p + ky) * S + (size_t)pxi * p + kx];
                        size_t j = lay == VIT_PATCH_CHW ? ((size_t)c * p + ky) * p + kx
                                                        : ((size_t)ky * p + kx) * C + c;
                        row[j] = v;
                    }
        }
}

void vit_forward(struct vit_ctx *vc, const float *pixels)
{
    const struct vit_hparams *vh = vc->vh;
    const struct vit_weights *vw = vc->vw;
    struct backend *be = vc->be;
    const struct backend_ops *op = be->ops;
    const struct ctx_bufs *b = &vc->b;
    int P = vh->n_pos, D = vh->n_embd, c = vh->cls ? 1 : 0, F = vh->n_ff;
    size_t cpp = (size_t)vh->n_channels * vh->patch_size * vh->patch_size;

    /* 1. patch embedding: the stride-p convolution as one product over the patches (after
     *    the class row, CLIP's class_embedding, where there is one: rows.pos[0] is 0) */
    im2col(vc->patches_host, pixels, vh, vw->layout);
    op->upload(be, vc->patches, vc->patches_host, (size_t)vh->n_patch * cpp * sizeof(float));
    op->linear(be, b->x + (size_t)c * D, D, vc->patches, &vw->patch_w,
               tensor_is_present(&vw->patch_b) ? &vw->patch_b : NULL, vh->n_patch);
    if (c)
        op->embed(be, b->x, &vw->class_embd, vc->rows.pos, 1);
    /* 2. + the position embedding of each row (rows 0..P-1: the positions themselves, or the
     *    family's pos_ids: Idefics3's bucketed ones) */
    op->embed(be, b->o, &vw->pos_embd, vc->pos_ids ? vc->pos_ids : vc->rows.pos, P);
    op->axpy(be, b->x, D, 1.0f, b->o, D, P, D);
    /* CLIP's pre_layrnorm */
    struct blk_norm_w pre = {NORM_LAYER, vh->norm_eps, &vw->pre_norm, &vw->pre_norm_b, 0.0f};
    if (tensor_is_present(&vw->pre_norm))
        blk_norm(be, b->x, b->x, &pre, P, D);
    /* 3. pre-LN blocks, attention over the whole image */
    struct blk_attn_cfg ac = {
        .ap = {.n_head = vh->n_head, .n_kv_head = vh->n_head, .head_dim = vh->head_dim,
               .scale = 1.0f / sqrtf((float)vh->head_dim)},
        .norm = NORM_LAYER,
        .norm_eps = vh->norm_eps,
        .n_embd = D,
    };
    for (int il = 0; il < vh->n_layer; il++) {
        const struct layer *L = &vw->layers[il];
        struct blk_norm_w n1 = {NORM_LAYER, vh->norm_eps, &L->attn_norm, &L->attn_norm_b, 0.0f};
        struct blk_norm_w n2 = {NORM_LAYER, vh->norm_eps, &L->ffn_norm, &L->ffn_norm_b, 0.0f};
        blk_norm(be, b->xn, b->x, &n1, P, D);
        blk_attention(be, b->o, b->xn, L, &ac, &vc->kv, &vc->rows, b, P);
        op->axpy(be, b->x, D, 1.0f, b->o, D, P, D);
        blk_norm(be, b->xn, b->x, &n2, P, D);
        if (vh->quick_gelu) {   /* fc2(quick_gelu(fc1 x)): x sigmoid(1.702 x) from scale, sigmoid, mul */
            op->linear(be, b->h, F, b->xn, &L->up, &L->up_b, P);
            op->copy(be, b->h1, b->h, (size_t)P * F * sizeof(float));
            op->scale(be, b->h1, F, 1.702f, P, F);
            op->act(be, ACT_SIGMOID, b->h1, F, P, F);
            op->mul(be, b->h, F, b->h, F, b->h1, F, P, F);
            op->linear(be, b->f, D, b->h, &L->down, &L->down_b, P);
        } else {
            blk_mlp(be, b->f, b->xn, L, vh->act, vh->n_ff, b, P);
        }
        op->axpy(be, b->x, D, 1.0f, b->f, D, P, D);
    }
    /* 4. post_layernorm */
    struct blk_norm_w pn = {NORM_LAYER, vh->norm_eps, &vw->post_norm, &vw->post_norm_b, 0.0f};
    if (tensor_is_present(&vw->post_norm))
        blk_norm(be, b->x, b->x, &pn, P, D);
}

int vit_feature_layer(const cJSON *cfg, int n_layer, int def, int *blocks, struct err *e)
{
    int L = n_layer, layer = def;
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(cfg, "vision_feature_layer");
    if (fl && !cJSON_IsNull(fl)) {
        if (cJSON_IsArray(fl))
            return err_setf(e, ERR_UNSUPPORTED, "vision_feature_layer: a list of layers (their features "
                            "concatenated) is not supported; one layer index is");
        if (!cJSON_IsNumber(fl) || fl->valuedouble != floor(fl->valuedouble) || fabs(fl->valuedouble) > 1e6)
            return err_setf(e, ERR_CONFIG, "vision_feature_layer must be an integer");
        layer = (int)fl->valuedouble;
    }
    /* hidden_states has n_layer + 1 entries (the embeddings, then each block's output) */
    if (layer < -(L + 1) || layer > L)
        return err_setf(e, ERR_CONFIG, "vision_feature_layer %d is outside the tower's hidden states "
                        "[%d, %d] (%d layers)", layer, -(L + 1), L, L);
    *blocks = layer < 0 ? layer + L + 1 : layer;
    return 0;
}
