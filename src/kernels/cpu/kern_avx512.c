/*
 * kern_avx512: placeholder until the avx512 kernels land.
 */
#include "kern.h"

bool cpu_kernels_avx512_init(struct cpu_kernels *k)
{
    k->name = "avx512";
    return true;
}
