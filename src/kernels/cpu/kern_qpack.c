/*
 * kern_qpack: the QG16 layout of 4/8-bit affine weights (kern.h), written once
 * at load by the CPU backend's prepare_weight and read by the VNNI GEMM
 * (kern_avx512_qi.c). Plain C, ISA-neutral: packing is a one-time copy, and
 * unpacking a row back into the stored layout (the embedding lookup of a
 * head tied to the embedding) lets every ISA's row dequantization run on it
 * unchanged, so the values are bit-identical to the unpacked weights.
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

void kern_qg16_pack(uint8_t *dst, const struct wmat *w, int p0, int p1)
{
    const int G = w->qgroup, in = w->in, bits = w->qbits;
    const size_t ssz = dtype_size(w->qsdt), ub = qg16_unit(w);
    for (int p = p0; p < p1; p++) {
        uint8_t *pp = dst + (size_t)p * w->qg16_panel;
        for (int c0 = 0; c0 < in; c0 += QG16_CH) {
            const int cn = in - c0 < QG16_CH ? in - c0 : QG16_CH, gn = cn / G;
            const size_t nu = (size_t)cn * (size_t)bits / 8 / ub;
            uint8_t *wd = pp + kern_qg16_bytes(c0, bits, G, ssz);
            uint8_t *sd = wd + (size_t)cn * 2 * (size_t)bits, *bd = sd + (size_t)gn * 16 * ssz;
            for (int j = 0; j < 16; j++) {
                const size_t r = (size_t)p * 16 + (size_t)j;
                if (r >= (size_t)w->out) { /* padding rows: code 0, scale 0, bias 0 */
                    for (size_t i = 0; i < nu; i++)
                        memset(wd + (i * 16 + (size_t)j) * ub, 0, ub);
                    for (int g = 0; g < gn; g++) {
                        memset(sd + ((size_t)g * 16 + (size_t)j) * ssz, 0, ssz);
                        memset(bd + ((size_t)g * 16 + (size_t)j) * ssz, 0, ssz);
                    }
                    continue;
                }
                const uint8_t *row = w->data + r * w->row_bytes + (size_t)c0 * (size_t)bits / 8;
                for (size_t i = 0; i < nu; i++)
                    memcpy(wd + (i * 16 + (size_t)j) * ub, row + i * ub, ub);
                const uint8_t *rs = w->qs + r * w->qrow_bytes + (size_t)(c0 / G) * ssz;
                const uint8_t *rb = w->qb + r * w->qrow_bytes + (size_t)(c0 / G) * ssz;
                for (int g = 0; g < gn; g++) {
                    memcpy(sd + ((size_t)g * 16 + (size_t)j) * ssz, rs + (size_t)g * ssz, ssz);
                    memcpy(bd + ((size_t)g * 16 + (size_t)j) * ssz, rb + (size_t)g * ssz, ssz);
                }
            }
        }
    }
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
