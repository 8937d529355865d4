/*
 * vnni_peak: what one core can issue of the products the exact integer tiles
 * (src/kernels/cpu/kern_avx512_qi.c) are made of, so a tile's measured rate can
 * be read as a share of the ceiling of its instruction mix.
 *
 *   gcc -O2 -march=native -o /tmp/vnni_peak dev/kernels/vnni_peak.c
 *   /tmp/vnni_peak [millions of iterations, default 50]
 *
 * Each line is one instruction pattern run in a loop on L1-resident data (no
 * misses), with enough independent accumulators to hide latency. The rate is
 * in products-instructions per second (vpdpbusd / vpdpwssd / vfmadd231ps), and
 * as a share of the first line (register-only vpdpbusd, the unit's peak).
 *
 *   dpbusd             vpdpbusd zmm, register operands only
 *   dpwssd             vpdpwssd zmm, register operands only
 *   fma                vfmadd231ps zmm, register operands only
 *   dpbusd {1to16}     vpdpbusd with an embedded-broadcast memory operand
 *   4-bit tile 1 x 6   qg_tile's word (one 16-row panel): a 64-byte load, two
 *                      nibble masks and a shift, then per token 4 x (dword
 *                      broadcast load + vpdpbusd): one load per product
 *   4-bit tile 2 x 4   two panels by 4 tokens: each broadcast feeds both
 *                      panels' words, one load per two products
 *   8-bit tile 1 x 6   qg_tile8's step: two 32-byte loads widened to words
 *                      (vpmovzxbw), per token 2 x (broadcast + vpdpwssd)
 *
 * Exact x takes two products per code and token (two int8 limbs for 4-bit,
 * 16-bit pairs for 8-bit), so these rates bound batched decode and prompts:
 * tokens/s <= rate * threads * 32 / (multiply-adds per token).
 *
 * Not linked into anything (dev/ is the lab). x86-64 with AVX512-VNNI only.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define R12(I) I(0) I(1) I(2) I(3) I(4) I(5) I(6) I(7) I(8) I(9) I(10) I(11)
#define DPB(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define DPW(i) "vpdpwssd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define FMZ(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define DPBM(i) "vpdpbusd (%1)%{1to16%}, %%zmm31, %%zmm" #i "\n\t"

/* 4-bit, one panel: token t's high-limb chain in zmm t, low-limb chain in zmm 1t (t < 6) */
#define UNP4(r, w, off)                                                                    \
    "vmovdqa64 " #off "(%2), %%zmm24\n\t vpandd %%zmm24, %%zmm25, %%zmm" #r "\n\t"          \
    "vpsrld $4, %%zmm24, %%zmm" #w "\n\t vpandd %%zmm" #w ", %%zmm25, %%zmm" #w "\n\t"
#define TOK4(t, o)                                                                         \
    "vpbroadcastd " #o "+0(%1), %%zmm20\n\t vpdpbusd %%zmm20, %%zmm16, %%zmm" #t "\n\t"     \
    "vpbroadcastd " #o "+32(%1), %%zmm21\n\t vpdpbusd %%zmm21, %%zmm17, %%zmm" #t "\n\t"    \
    "vpbroadcastd " #o "+64(%1), %%zmm22\n\t vpdpbusd %%zmm22, %%zmm16, %%zmm1" #t "\n\t"   \
    "vpbroadcastd " #o "+96(%1), %%zmm23\n\t vpdpbusd %%zmm23, %%zmm17, %%zmm1" #t "\n\t"
/* 4-bit, two panels (codes in zmm16/17 and zmm18/19), one token: its high-limb chains in
 * zmm a (panel 1) and zmm c (panel 2), low-limb chains in zmm b and zmm d */
#define TOK4X2(a, b, c, d, o)                                                              \
    "vpbroadcastd " #o "+0(%1), %%zmm20\n\t vpdpbusd %%zmm20, %%zmm16, %%zmm" #a "\n\t"     \
    "vpdpbusd %%zmm20, %%zmm18, %%zmm" #c "\n\t"                                           \
    "vpbroadcastd " #o "+32(%1), %%zmm21\n\t vpdpbusd %%zmm21, %%zmm17, %%zmm" #a "\n\t"    \
    "vpdpbusd %%zmm21, %%zmm19, %%zmm" #c "\n\t"                                           \
    "vpbroadcastd " #o "+64(%1), %%zmm22\n\t vpdpbusd %%zmm22, %%zmm16, %%zmm" #b "\n\t"    \
    "vpdpbusd %%zmm22, %%zmm18, %%zmm" #d "\n\t"                                           \
    "vpbroadcastd " #o "+96(%1), %%zmm23\n\t vpdpbusd %%zmm23, %%zmm17, %%zmm" #b "\n\t"    \
    "vpdpbusd %%zmm23, %%zmm19, %%zmm" #d "\n\t"
/* 8-bit, one panel: two widened pair vectors, token t's chains zmm t and zmm 1t */
#define UNP8 "vpmovzxbw (%2), %%zmm16\n\t vpmovzxbw 32(%2), %%zmm17\n\t"
#define TOK8(t, o)                                                                         \
    "vpbroadcastd " #o "(%1), %%zmm20\n\t vpdpwssd %%zmm20, %%zmm16, %%zmm" #t "\n\t"       \
    "vpbroadcastd " #o "+4(%1), %%zmm21\n\t vpdpwssd %%zmm21, %%zmm17, %%zmm1" #t "\n\t"

#define CLOBBER                                                                            \
    "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",    \
        "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24"

static _Alignas(64) unsigned char xbuf[4096], wbuf[4096];
static double peak;

/* Best of 3 runs of n iterations of a pattern making k products each. */
#define RUN(label, k, body)                                                                \
    do {                                                                                   \
        double best = 0;                                                                   \
        for (int rep = 0; rep < 3; rep++) {                                                \
            long it = n;                                                                   \
            double t0 = now();                                                             \
            __asm__ volatile("1:\n\t" body "dec %0\n\tjnz 1b"                             \
                             : "+r"(it)                                                    \
                             : "r"(xbuf), "r"(wbuf)                                        \
                             : CLOBBER);                                                   \
            double r = (double)n * (k) / (now() - t0) / 1e9;                               \
            best = r > best ? r : best;                                                    \
        }                                                                                  \
        if (peak == 0)                                                                     \
            peak = best;                                                                   \
        printf("%-20s %6.2f G/s  %5.1f %%\n", label, best, 100 * best / peak);             \
    } while (0)

int main(int argc, char **argv)
{
    long n = (argc > 1 ? atol(argv[1]) : 50) * 1000000L;
    if (n <= 0) {
        fprintf(stderr, "usage: %s [millions of iterations]\n", argv[0]);
        return 2;
    }
    /* a dependent add chain retires one a cycle: the clock, roughly */
    long x = 0, m = n * 4;
    double t0 = now();
    for (long i = 0; i < m; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    printf("clock ~ %.2f GHz (dependent adds)\n", (double)m * 4 / (now() - t0) / 1e9);
    RUN("dpbusd", 12, R12(DPB));
    RUN("dpwssd", 12, R12(DPW));
    RUN("fma", 12, R12(FMZ));
    RUN("dpbusd {1to16}", 12, R12(DPBM));
    RUN("4-bit tile 1 x 6", 24,
        UNP4(16, 17, 0) TOK4(0, 0) TOK4(1, 128) TOK4(2, 256) TOK4(3, 384) TOK4(4, 512)
            TOK4(5, 640));
    RUN("4-bit tile 2 x 4", 32,
        UNP4(16, 17, 0) UNP4(18, 19, 64) TOK4X2(0, 4, 8, 12, 0) TOK4X2(1, 5, 9, 13, 128)
            TOK4X2(2, 6, 10, 14, 256) TOK4X2(3, 7, 11, 15, 384));
    RUN("8-bit tile 1 x 6", 12,
        UNP8 TOK8(0, 0) TOK8(1, 128) TOK8(2, 256) TOK8(3, 384) TOK8(4, 512) TOK8(5, 640));
    return x == 0; /* x is used, so the clock loop stays */
}
