/*
 * kern_rec_avx512: the recurrent layers' loops written in plain C, the gated delta rule
 * (kern_gdn.h), the causal convolution (kern_conv.h) and the RG-LRU (kern_rglru.h), vectorized for AVX-512 (8 doubles
 * or 16 floats a register); called only where dispatch.c chose the avx512 table.
 */
#include "kern.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#define KERN_GDN_ENTRY kern_gdn_rows_avx512
#include "kern_gdn.h"
#define KERN_CONV_ENTRY kern_conv_rows_avx512
#include "kern_conv.h"
#define KERN_RGLRU_ENTRY kern_rglru_rows_avx512
#include "kern_rglru.h"
#endif
