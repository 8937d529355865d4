/*
 * kern_avx2: placeholder until the avx2 kernels land.
 */
#include "kern.h"

bool cpu_kernels_avx2_init(struct cpu_kernels *k)
{
    k->name = "avx2";
    return true;
}
