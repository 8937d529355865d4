/*
 * kern_rec_ref: the recurrent layers' loops written in plain C, the gated delta rule
 * (kern_gdn.h), the causal convolution (kern_conv.h) and the RG-LRU (kern_rglru.h), at the baseline ISA.
 */
#define KERN_GDN_ENTRY kern_gdn_rows_ref
#include "kern_gdn.h"
#define KERN_CONV_ENTRY kern_conv_rows_ref
#include "kern_conv.h"
#define KERN_RGLRU_ENTRY kern_rglru_rows_ref
#include "kern_rglru.h"
