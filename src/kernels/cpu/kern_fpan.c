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
    return !w->qbits && w->in > 0 && w->out > 0 &&
           (w->dt == DTYPE_F32 || w->dt == DTYPE_F16 || w->dt == DTYPE_BF16);
}

/* Blocks of FPAN_BI inputs: a block's k-lines (2-4 KiB) stay in L1 while the 32 rows'
 * pieces of it are written in. */
#define FPAN_BI 32

/* in inputs of panel p from its rows at src (row stride ld bytes) into its k-lines at pp. */
static void fpan_pack_panel(uint8_t *pp, const struct wmat *w, int p, int in, const uint8_t *src,
                            size_t ld)
{
    const size_t es = dtype_size(w->dt), line = FPAN_R * es;
    for (int i0 = 0; i0 < in; i0 += FPAN_BI) {
        const int n = in - i0 < FPAN_BI ? in - i0 : FPAN_BI;
        uint8_t *blk = pp + (size_t)i0 * line;
        for (int j = 0; j < FPAN_R; j++) {
            uint8_t *o = blk + (size_t)kern_fpan_slot(w->dt, j) * es;
            if (p * FPAN_R + j >= w->out) { /* padding rows: zeros */
                for (int i = 0; i < n; i++)
                    memset(o + (size_t)i * line, 0, es);
                continue;
            }
            const uint8_t *sr = src + (size_t)j * ld + (size_t)i0 * es;
            if (es == 2)
                for (int i = 0; i < n; i++)
                    memcpy(o + (size_t)i * line, sr + (size_t)i * 2, 2);
            else
                for (int i = 0; i < n; i++)
                    memcpy(o + (size_t)i * line, sr + (size_t)i * 4, 4);
        }
    }
}

/* Inputs of the 32 rows copied out at a time (at most 64 KiB, on the stack). */
#define FPAN_CH 512

void kern_fpan_pack(uint8_t *dst, const struct wmat *w, int p0, int p1)
{
    const size_t es = dtype_size(w->dt);
    /* each panel's rows copied out a piece at a time (FPAN_CH inputs of every row: reads of
     * 1-2 KiB in order, not 32 interleaved streams from the source, which may still be file
     * pages), then transposed from there */
    uint32_t tmp[FPAN_R * FPAN_CH];
    for (int p = p0; p < p1; p++) {
        uint8_t *pp = dst + (size_t)p * kern_fpan_bytes(w->in, w->dt);
        const uint8_t *src = w->data + (size_t)p * FPAN_R * w->row_bytes;
        const int nr = w->out - p * FPAN_R < FPAN_R ? w->out - p * FPAN_R : FPAN_R;
        for (int c0 = 0; c0 < w->in; c0 += FPAN_CH) {
            const int cn = w->in - c0 < FPAN_CH ? w->in - c0 : FPAN_CH;
            for (int j = 0; j < nr; j++)
                memcpy((uint8_t *)tmp + (size_t)j * cn * es, src + (size_t)j * w->row_bytes + (size_t)c0 * es,
                       (size_t)cn * es);
            fpan_pack_panel(pp + (size_t)c0 * FPAN_R * es, w, p, cn, (const uint8_t *)tmp, (size_t)cn * es);
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
