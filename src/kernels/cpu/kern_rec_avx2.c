/*
 * kern_rec_avx2: the recurrent layers' loops written in plain C, the gated delta rule
 * (kern_gdn.h), the causal convolution (kern_conv.h) and the RG-LRU (kern_rglru.h), vectorized for AVX2 + FMA (4
 * doubles or 8 floats a register); called only where dispatch.c chose the avx2 table.
 */
#include "kern.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERN_GDN_ENTRY kern_gdn_rows_avx2
#include "kern_gdn.h"
#define KERN_CONV_ENTRY kern_conv_rows_avx2
#include "kern_conv.h"
#define KERN_RGLRU_ENTRY kern_rglru_rows_avx2
#include "kern_rglru.h"
#endif
