/*
 * dispatch: which ISA variant of the CPU kernels this machine can run.
 *
 * A variant is usable only when the CPU reports every instruction set its
 * file was compiled for (CPUID) AND the OS saves the matching register state
 * on context switch (XCR0 via xgetbv; an OS without AVX-512 state support
 * would fault on the first zmm instruction even though CPUID lists it).
 * The probe runs at backend creation; cpu_kernels_init() then fills a struct cpu_kernels
 * with the scalar references and overlays the chosen variant.
 *
 *   avx2:   AVX2 + FMA + F16C, XCR0 SSE|AVX
 *   avx512: AVX-512 F/BW/VL/DQ + FMA + F16C, XCR0 SSE|AVX|opmask|ZMM; with
 *           AVX512_VNNI also the VNNI integer matvec (kern_avx512_qi.c)
 */
#include <string.h>

#include "kern.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static enum cpu_isa probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return CPU_ISA_SCALAR;
    bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
         f16c = c & (1u << 29);
    if (!osxsave || !avx || !fma || !f16c)
        return CPU_ISA_SCALAR;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) /* XMM and YMM state */
        return CPU_ISA_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return CPU_ISA_SCALAR;
    if (!(b & (1u << 5))) /* AVX2 */
        return CPU_ISA_SCALAR;
    bool f512 = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30), vl = b & (1u << 31);
    if (f512 && dq && bw && vl && (xcr0 & 0xe6) == 0xe6) /* + opmask, ZMM_Hi256, Hi16_ZMM */
        return CPU_ISA_AVX512;
    return CPU_ISA_AVX2;
}
#else
static enum cpu_isa probe(void)
{
    return CPU_ISA_SCALAR;
}
#endif

bool cpu_has_avx512_vnni(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return probe() == CPU_ISA_AVX512 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11));
#else
    return false;
#endif
}

/* Probed on every call (no cached global): it runs once per backend creation. */
enum cpu_isa cpu_isa_best(void)
{
    return probe();
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AVX512:
        return "avx512";
    case CPU_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

int cpu_isa_parse(const char *s, enum cpu_isa *out)
{
    if (!strcmp(s, "auto") || !*s)
        *out = cpu_isa_best();
    else if (!strcmp(s, "scalar") || !strcmp(s, "ref"))
        *out = CPU_ISA_SCALAR;
    else if (!strcmp(s, "avx2"))
        *out = CPU_ISA_AVX2;
    else if (!strcmp(s, "avx512"))
        *out = CPU_ISA_AVX512;
    else
        return -1;
    return 0;
}

bool cpu_kernels_init(struct cpu_kernels *k, enum cpu_isa isa)
{
    cpu_kernels_ref_init(k);
    switch (isa) {
    case CPU_ISA_AVX512:
        /* The avx512 file overlays only what it implements; AVX2 fills the rest. */
        if (!cpu_kernels_avx2_init(k) || !cpu_kernels_avx512_init(k))
            return false;
        /* without VNNI the AVX2 integer matvec stays, but the AVX-512 f32 GEMM
         * takes batches from where it took them before (not measured against it) */
        k->gemm_min_tok_qi = k->gemm_min_tok_q;
        k->qi_any_tok = NULL;
        if (cpu_has_avx512_vnni())
            kern_avx512_qi_init(k);
        return true;
    case CPU_ISA_AVX2:
        return cpu_kernels_avx2_init(k);
    default:
        return true;
    }
}
