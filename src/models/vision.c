/*
 * vision: the table of vision families (vision.def, X-macro), loading a checkpoint's
 * tower into m->vision, and encoding images through the family's ops (vision.h).
 * Images are encoded one at a time: a tower's activations for one 896 px image (4096
 * patches) are already tens of MiB, and the text model's prefill, not the encoder, is
 * what batches.
 */
#include "vision.h"

#include <stdlib.h>
#include <string.h>

#include "../core/log.h"

#define VISION(name, ops) extern const struct vision_ops ops;
#include "vision.def"
#undef VISION

#define VISION(name, ops) &ops,
static const struct vision_ops *const k_vision[] = {
#include "vision.def"
};
#undef VISION

const struct vision_ops *vision_find(const char *model_type)
{
    for (size_t i = 0; i < sizeof k_vision / sizeof k_vision[0]; i++)
        if (strcmp(k_vision[i]->model_type, model_type) == 0)
            return k_vision[i];
    return NULL;
}

size_t vision_count(void)
{
    return sizeof k_vision / sizeof k_vision[0];
}

const struct vision_ops *vision_at(size_t i)
{
    return i < vision_count() ? k_vision[i] : NULL;
}

int vision_load(struct model *m, const cJSON *cfg, struct err *e)
{
    const struct vision_ops *ops = vision_find(m->multimodal);
    if (!ops)
        return 0;
    struct vision *v = calloc(1, sizeof *v);
    if (!v)
        return err_setf(e, ERR_NOMEM, "out of memory");
    v->ops = ops;
    int rc = ops->load(v, m, cfg, e);
    if (rc == 1) {
        LOG_WARN("%s checkpoint without its vision tower (%s): it runs text only", m->multimodal, e->msg);
        err_clear(e);
        vision_free(v);
        return 0;
    }
    if (rc < 0) {
        vision_free(v);
        return err_prefix(e, "%s vision tower", m->multimodal);
    }
    m->vision = v;
    return 0;
}

void vision_free(struct vision *v)
{
    if (!v)
        return;
    if (v->ops && v->ops->free_family)
        v->ops->free_family(v);
    vit_weights_free(&v->vw);
    free(v);
}

void vision_each_weight(struct vision *v, void (*fn)(void *ud, struct tensor *t, bool linear), void *ud)
{
    if (!v)
        return;
    vit_each_weight(&v->vw, &v->vh, fn, ud);
    if (v->ops->each_weight)
        v->ops->each_weight(v, fn, ud);
}

int vision_ctx_new(struct vision_ctx **out, const struct model *m, struct backend *be, struct err *e)
{
    int rc;
    *out = NULL;
    if (!m->vision)
        return err_setf(e, ERR_ARG, "model %s does not take images", m->hp.model_type);
    struct vision_ctx *vc = calloc(1, sizeof *vc);
    if (!vc)
        return err_setf(e, ERR_NOMEM, "out of memory");
    vc->m = m;
    vc->be = be;
    /* a family of variable-size images keeps its own tower buffers (ops->ctx_new) */
    if ((m->vision->info.merge == 0 && (rc = vit_ctx_new(&vc->vit, &m->vision->vh, &m->vision->vw, be, e)) < 0) ||
        (rc = m->vision->ops->ctx_new(vc, e)) < 0) {
        vision_ctx_free(vc);
        return rc;
    }
    *out = vc;
    return 0;
}

void vision_ctx_free(struct vision_ctx *vc)
{
    if (!vc)
        return;
    if (vc->fam)
        vc->m->vision->ops->ctx_free(vc);
    vit_ctx_free(vc->vit);
    free(vc);
}

size_t vision_pixel_bytes(const struct vision *v)
{
    return (size_t)v->info.n_channels * v->info.image_size * v->info.image_size * sizeof(float);
}

size_t vision_embd_bytes(const struct model *m)
{
    return m->vision ? (size_t)m->vision->info.tokens_per_image * m->hp.n_embd * sizeof(float) : 0;
}

size_t vision_image_floats(const struct model *m, int n_tok)
{
    int planes = 1 + (m->vision ? m->vision->info.n_deepstack : 0);
    return (size_t)planes * (size_t)(n_tok > 0 ? n_tok : 0) * (size_t)m->hp.n_embd;
}

int vision_encode(struct vision_ctx *vc, float *out, const float *pixels, int n_img, struct err *e)
{
    const struct vision *v = vc->m->vision;
    if (v->info.merge > 0)
        return err_setf(e, ERR_ARG, "vision_encode: %s takes images of their own size (vision_encode_grid)",
                        v->ops->model_type);
    if (n_img < 0)
        return err_setf(e, ERR_ARG, "vision_encode: %d images", n_img);
    size_t px = vision_pixel_bytes(v) / sizeof(float), rows = vision_embd_bytes(vc->m) / sizeof(float);
    for (int i = 0; i < n_img; i++) {
        v->ops->encode_one(vc, out + (size_t)i * rows, pixels + (size_t)i * px);
        /* the host staging of the patches is rewritten by the next image */
        int rc = backend_sync(vc->be, e);
        if (rc < 0)
            return err_prefix(e, "encoding image %d", i + 1);
    }
    return 0;
}

int vision_mrope_positions(int32_t *pos3, int32_t *delta, const int32_t *ids, int n, int32_t image_token_id,
                           const int32_t *grid, int n_img, struct err *e)
{
    int64_t cur = 0;
    int k = 0;
    for (int i = 0; i < n;) {
        if (ids[i] != image_token_id) {
            pos3[3 * i] = pos3[3 * i + 1] = pos3[3 * i + 2] = (int32_t)cur++;
            i++;
            continue;
        }
        if (k >= n_img)
            return err_setf(e, ERR_ARG, "image token at %d past the %d image%s", i, n_img, n_img == 1 ? "" : "s");
        int gh = grid[2 * k], gw = grid[2 * k + 1];
        if (gh < 1 || gw < 1 || (int64_t)gh * gw > n - i)
            return err_setf(e, ERR_ARG, "image %d: a %d x %d grid of tokens does not fit the prompt at %d", k + 1,
                            gh, gw, i);
        for (int r = 0; r < gh * gw; r++) {
            if (ids[i + r] != image_token_id)
                return err_setf(e, ERR_ARG, "image %d: %d image tokens at %d where its grid takes %d", k + 1,
                                r, i, gh * gw);
            pos3[3 * (i + r)] = (int32_t)cur;
            pos3[3 * (i + r) + 1] = (int32_t)(cur + r / gw);
            pos3[3 * (i + r) + 2] = (int32_t)(cur + r % gw);
        }
        cur += gh > gw ? gh : gw;
        i += gh * gw;
        k++;
    }
    if (k != n_img)
        return err_setf(e, ERR_ARG, "%d image%s but the prompt has image tokens for %d", n_img,
                        n_img == 1 ? "" : "s", k);
    *delta = (int32_t)(cur - n);
    return 0;
}

int vision_grid_tokens(const struct vision *v, const int32_t *grid_thw, struct err *e)
{
    const struct vision_info *vi = &v->info;
    int64_t t = grid_thw[0], h = grid_thw[1], w = grid_thw[2];
    if (vi->merge <= 0)
        return err_setf(e, ERR_ARG, "%s takes images of one size, not a grid", v->ops->model_type);
    if (v->ops->grid_tokens)
        return v->ops->grid_tokens(v, grid_thw, e);
    if (t != 1 || h < vi->merge || w < vi->merge || h % vi->merge || w % vi->merge || h * w > vi->max_patches)
        return err_setf(e, ERR_ARG, "an image grid of %lld x %lld x %lld patches: the tower takes one temporal "
                        "patch (a still image), sides multiples of spatial_merge_size %d, at most %d patches",
                        (long long)t, (long long)h, (long long)w, vi->merge, vi->max_patches);
    return (int)(h * w / (vi->merge * vi->merge));
}

bool vision_is_image_row(const struct vision_info *vi, int32_t id)
{
    return id == vi->image_token_id || (vi->row_breaks && (id == vi->break_token_id || id == vi->end_token_id));
}

size_t vision_image_run(const struct vision_info *vi, const int32_t *ids, size_t n)
{
    size_t len = 0;
    if (n == 0 || ids[0] != vi->image_token_id)
        return 0;
    if (!vi->row_breaks) {
        while (len < n && ids[len] == vi->image_token_id)
            len++;
        return len;
    }
    /* image and break tokens, through the end token; trailing breaks without an end are not
     * the image's */
    size_t last_img = 0;
    while (len < n && (ids[len] == vi->image_token_id || ids[len] == vi->break_token_id)) {
        if (ids[len] == vi->image_token_id)
            last_img = len;
        len++;
    }
    if (len < n && ids[len] == vi->end_token_id)
        return len + 1;
    return last_img + 1;
}

int vision_encode_grid(struct vision_ctx *vc, float *out, const float *pixels, const int32_t *grid_thw,
                       struct err *e)
{
    const struct vision *v = vc->m->vision;
    int rc = vision_grid_tokens(v, grid_thw, e);
    if (rc < 0)
        return rc;
    if (!v->ops->encode_grid)
        return err_setf(e, ERR_ARG, "%s has no grid encoder", v->ops->model_type);
    if ((rc = v->ops->encode_grid(vc, out, pixels, grid_thw, e)) < 0)
        return rc;
    return backend_sync(vc->be, e);
}
