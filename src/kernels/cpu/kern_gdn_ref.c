/*
 * kern_gdn_ref: the gated delta rule (kern_gdn.h) at the baseline ISA.
 */
#define KERN_GDN_ENTRY kern_gdn_rows_ref
#include "kern_gdn.h"
