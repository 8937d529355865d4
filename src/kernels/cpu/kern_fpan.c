/*
 * kern_fpan: the FPAN layout of float weights (kern.h), written once at load by
 * the CPU backend's prepare_weight and read by the variants' fpan_linear.
 * Plain C, ISA-neutral: which weights it holds, the packing, and a row back in
 * the stored layout (the embedding lookup of a head tied to the embedding), so
 * the values are bit-identical to the stored weights'.
 */
#include <string.h>

#include "kern.h"

bool kern_fpan_ok(const struct wmat *w)
{
    return !w->qbits && !w->qg16 && !w->fpan && w->in > 0 && w->out > 0 &&
           (w->dt == DTYPE_F32 || w->dt == DTYPE_F16 || w->dt == DTYPE_BF16);
}

void kern_fpan_pack(uint8_t *dst, const struct wmat *w, int p0, int p1)
{
    const size_t es = dtype_size(w->dt), line = FPAN_R * es;
    for (int p = p0; p < p1; p++) {
        uint8_t *pp = dst + (size_t)p * kern_fpan_bytes(w->in, w->dt);
        for (int j = 0; j < FPAN_R; j++) {
            const int r = p * FPAN_R + j;
            uint8_t *o = pp + (size_t)kern_fpan_slot(w->dt, j) * es;
            if (r >= w->out) { /* padding rows: zeros */
                for (int i = 0; i < w->in; i++)
                    memset(o + (size_t)i * line, 0, es);
                continue;
            }
            const uint8_t *src = w->data + (size_t)r * w->row_bytes;
            if (es == 2)
                for (int i = 0; i < w->in; i++)
                    memcpy(o + (size_t)i * line, src + (size_t)i * 2, 2);
            else
                for (int i = 0; i < w->in; i++)
                    memcpy(o + (size_t)i * line, src + (size_t)i * 4, 4);
        }
    }
}

void kern_fpan_unpack_row(uint8_t *dst, const struct wmat *w, int r)
{
    const size_t es = dtype_size(w->dt), line = FPAN_R * es;
    const uint8_t *o = w->data + (size_t)(r / FPAN_R) * w->fpan_panel +
                       (size_t)kern_fpan_slot(w->dt, r % FPAN_R) * es;
    for (int i = 0; i < w->in; i++)
        memcpy(dst + (size_t)i * es, o + (size_t)i * line, es);
}
