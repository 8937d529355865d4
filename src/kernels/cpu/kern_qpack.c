/*
 * kern_qpack: the QG16 layout of 4/8-bit affine weights (kern.h), written once
 * at load by the CPU backend's prepare_weight (cpu_kernels.qg16_pack, in
 * kern_avx512_qi.c) and read by the VNNI GEMM. Plain C, ISA-neutral: which
 * weights it holds, and a row unpacked back into the stored layout (the
 * embedding lookup of a head tied to the embedding), so that every ISA's row
 * dequantization runs on it unchanged and the values are bit-identical to the
 * stored weights'.
 */
#include <string.h>

#include "kern.h"

bool kern_qg16_ok(const struct wmat *w)
{
    return (w->qbits == 4 || w->qbits == 8) && w->qmode == QMODE_AFFINE && w->qb &&
           (w->qgroup == 32 || w->qgroup == 64 || w->qgroup == 128) && w->in % w->qgroup == 0 &&
           w->in > 0 && w->out > 0 &&
           (w->qsdt == DTYPE_F32 || w->qsdt == DTYPE_F16 || w->qsdt == DTYPE_BF16);
}

/* The chunk's codes of a row: 4 bytes (8 codes) per 4-bit word, 2 bytes (2 codes) per 8-bit
 * pair; unit i of row j sits at (i * 16 + j) * unit bytes. */
static size_t qg16_unit(const struct wmat *w)
{
    return w->qbits == 4 ? 4 : 2;
}

size_t kern_qg16_unpack_row(uint8_t *dst, const struct wmat *w, int r)
{
    const int G = w->qgroup, in = w->in, bits = w->qbits, j = r % 16;
    const size_t ssz = dtype_size(w->qsdt), ng = (size_t)(in / G), ub = qg16_unit(w);
    const size_t row_bytes = (size_t)in * (size_t)bits / 8;
    const uint8_t *pp = w->data + (size_t)(r / 16) * w->qg16_panel;
    uint8_t *codes = dst, *s = dst + row_bytes, *b = s + ng * ssz;
    for (int c0 = 0; c0 < in; c0 += QG16_CH) {
        const int cn = in - c0 < QG16_CH ? in - c0 : QG16_CH, gn = cn / G;
        const size_t nu = (size_t)cn * (size_t)bits / 8 / ub;
        const uint8_t *wd = pp + kern_qg16_bytes(c0, bits, G, ssz);
        const uint8_t *sd = wd + (size_t)cn * 2 * (size_t)bits, *bd = sd + (size_t)gn * 16 * ssz;
        uint8_t *cr = codes + (size_t)c0 * (size_t)bits / 8;
        for (size_t i = 0; i < nu; i++)
            memcpy(cr + i * ub, wd + (i * 16 + (size_t)j) * ub, ub);
        for (int g = 0; g < gn; g++) {
            memcpy(s + (size_t)(c0 / G + g) * ssz, sd + ((size_t)g * 16 + (size_t)j) * ssz, ssz);
            memcpy(b + (size_t)(c0 / G + g) * ssz, bd + ((size_t)g * 16 + (size_t)j) * ssz, ssz);
        }
    }
    return row_bytes + 2 * ng * ssz;
}
