/*
 * kern_gdn_avx2: the gated delta rule (kern_gdn.h) vectorized for AVX2 + FMA (4 doubles a
 * register); called only where dispatch.c chose the avx2 table.
 */
#include "kern.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERN_GDN_ENTRY kern_gdn_rows_avx2
#include "kern_gdn.h"
#endif
