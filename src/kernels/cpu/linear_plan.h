/*
 * linear_plan: which kernel runs a CPU linear product (internal to src/kernels/cpu/).
 *
 * A weight's plan is fixed by its format (float dtype, or quantization mode, bits and
 * group), its shape, the layout prepare_weight gave it (stored, QG16, FPAN) and the kernel
 * table of the ISA: an ordered list of token-count buckets, each naming the path
 * (matvec, integer matvec, FPAN, GEMM) and the kernel that runs it. cpu_linear looks the
 * call's token count up in the plan and dispatches the bucket's kernel on the pool;
 * `mlxcel inspect --kernels` prints every weight's plan. docs/architecture.md ("Which
 * kernel runs") has the same table for people; ADR 0055 says why it is one table.
 *
 * Every token-count threshold of the CPU linear product is below, in one table, with the
 * measurement that set it (the benchmarks are in docs/benchmarks.md and the ADRs named).
 * The kernel files take their thresholds from here, so the plan and the code that runs
 * cannot disagree.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "kern.h"

/* ---- the thresholds: the first token count of the next bucket ---- */
enum {
    /* AVX2, float W: the GEMM from 16 tokens. bench_linear "pf", 2 threads, Zen 5 on the
     * AVX2 kernels: 8 tokens mv_rows 110-116 GFLOP/s against the GEMM's 100-103; 16 tokens
     * the GEMM 141-157 against 100-105. */
    LP_A2_GEMM_F = 16,
    /* AVX2, quantized W the integer matvec does not take (3/5/6-bit, mxfp8, nvfp4): the
     * GEMM from 32 tokens. Zen 4 host, 2 threads, Llama-3.2-1B-shaped MLX 4-bit: 24 rows
     * matvec 22.2 t/s against the GEMM's 19.1, 32 rows 19.5 against 19.9; batched decode of
     * 8 sequences 19.3 against 6.7 (docs/benchmarks.md "Batched decode"). */
    LP_A2_GEMM_Q = 32,
    /* AVX2, quantized W the integer matvec takes but does not keep at every token count
     * (affine 8-bit, mxfp4): the GEMM from 32 tokens, as LP_A2_GEMM_Q. 8-bit prefill on the
     * integer matvec against the GEMM was no win (ADR 0025 item 8: 80.3, 83.8, 54.9 against
     * 79.8, 78.1, 84.9 t/s); affine 4-bit stays on the integer matvec at every count
     * (pp512 1.06-1.30x, same item). */
    LP_A2_GEMM_QI = 32,
    /* AVX2 quantized matvec (mv_quant): from 2 tokens each block of 4 rows is decoded once
     * and the scaled weights feed two tokens per load (docs/benchmarks.md "Batched decode:
     * each quantized block decoded once for every sequence": 16 sequences 1.55x, the 1-token
     * path unchanged). */
    LP_A2_MVQ_MULTI = 2,
    /* AVX-512, float W stored as it is (FPAN off): the GEMM from 24 tokens. mv_block_p
     * against the GEMM, llama-1b bf16 decode, 2 threads, Zen 5: 16 sequences 96-100 t/s
     * against 65-68, 24 sequences 84-98 against 75-102 (ADR 0038). */
    LP_A512_GEMM_F = 24,
    /* AVX-512, quantized W outside the integer matvec (and every quantized W without
     * VNNI): the GEMM from 6 tokens. Set with the per-ISA crossovers at 116ea61 ("measured
     * on the dev machine"; the numbers were not recorded); AVX-512 without VNNI was not
     * measured against the AVX2 integer matvec that keeps its decode (ADR 0025 item 8). */
    LP_A512_GEMM_Q = 6,
    /* AVX-512 float matvec: from 5 tokens mv_block_p (4 rows by up to 6 tokens a pass over
     * blocks of 512 inputs) instead of mv_block_t (2 rows by 4 tokens). llama-1b bf16
     * decode, 2 threads, Zen 5: 8 sequences 81-97 t/s against 71-74, 12 sequences 90-101
     * against 65-66, 5 and 6 sequences 68-77 against 60-67; at 4 sequences mv_block_t's two
     * streams are faster (79 against 70). ADR 0038. */
    LP_A512_MVP_MIN = 5,
    /* FPAN: from 12 tokens tiles of 2 panels by 6 tokens instead of 1 panel by 8. Zen 5,
     * 2 threads, bf16 4096 x 4096 (bench_linear pf), GFLOP/s best of 10, 1 by 8 against 2 by
     * 6: 16 tokens 355-357 / 373-376, 64 374-391 / 391-402, 512 342-366 / 359-387; llama-1b
     * bf16 pp512 1.03-1.05x (docs/benchmarks.md "Float tiles of 2 panels by 6 tokens"). */
    LP_FPAN_SIX_MIN = 12,
    /* VNNI, quantized W the integer matvec takes but not at every token count (affine
     * 8-bit not repacked, mxfp4): the f32 GEMM from 32 tokens, as on AVX2; the VNNI matvec
     * costs far less per token than the f32 one it replaces (ADR 0027; not measured at the
     * boundary). */
    LP_VNNI_GEMM_QI = 32,
    /* VNNI, affine 4-bit W in the stored layout (repacking off): from 4 tokens the tiles
     * (qg_rows, each block of 16 rows packed as QG16 per call) beat qv_block. Zen 5, 1024 x
     * 4096 from L3, 1 thread, µs qv_block / tiles: 3 tokens 172 / 229, 4 295 / 235, 6 424 /
     * 297, 8 455 / 354 (ADR 0027). */
    LP_VNNI_QG_ROWS_MIN = 4,
    /* VNNI, QG16 W: below 8 tokens (the tile's height) two panels are read together
     * (qg_rows16n; ADR 0040). llama-1b, 2 threads, Zen 5, one panel against two: 4-bit 1
     * sequence 71.3 / 87.4 t/s, 4 sequences 183 / 201; 8-bit 1 sequence 36.7 / 39.8, 4 99.6
     * / 121; from 8 tokens the tiles of 8 do as well (4-bit) or better (8-bit). */
    LP_VNNI_QG_TILE = 8,
    /* VNNI, QG16 W: from 4 tokens (to LP_VNNI_QG_TILE - 1) the two panels go four tokens a
     * tile (qg_rows16_4n; ADR 0043: llama-1b 4-bit, 4 sequences 1.18-1.24x the pairs). */
    LP_VNNI_QG_T4 = 4,
    /* VNNI, QG16 4-bit W: from 32 tokens three panels a tile (qg_panels3; ADR 0034).
     * llama-1b 4-bit, 2 threads, three panels against one: 8 sequences 0.87-1.03x, 16
     * sequences 0.91-1.09x; prompts of 128 and 512 tokens 1.2-1.4x. */
    LP_VNNI_QG3_MIN = 32,
    /* VNNI, QG16: the stream is prefetched 2 KiB ahead of the tile from 4 tokens, 4 KiB
     * below (one token consumes it faster). Zen 5, 2 threads, 4-bit 10240 x 2560 from DRAM,
     * none / 1 / 2 / 4 / 8 KiB ahead on a first version of the tiles: 8 tokens 1174 / 761 /
     * 733 / 755 / 768 us, 1 token 446 / 349 / 364 / 319 / 310 us (the host shared and noisy:
     * only the first step is large; a later sweep on the final kernel was noise). */
    LP_VNNI_QG16_PF_NEAR = 4,
    /* x prepared for the integer matvec on every thread from 8 tokens (prefill); on the
     * calling thread alone below (a token's preparation is shorter than a dispatch). */
    LP_QI_PREP_THREADS = 8,
};

/* ---- plans ---- */

/* How prepare_weight laid the weight out (kern.h). */
enum lp_layout {
    LP_LAYOUT_STORED, /* as stored: the mmap view, or a copy of it */
    LP_LAYOUT_QG16,   /* 4/8-bit affine in panels of 16 rows (kern.h QG16) */
    LP_LAYOUT_FPAN,   /* float in panels of 32 rows (kern.h FPAN) */
};

/* Which backend loop drives the kernel: what x it is given and how rows are split. */
enum lp_path {
    LP_PATH_MATVEC, /* k->matvec over f32 x (quantized: x sums, permuted x) */
    LP_PATH_QI,     /* k->matvec_qi over x prepared as integers (kern.h "qi") */
    LP_PATH_FPAN,   /* k->fpan_linear over f32 x */
    LP_PATH_GEMM,   /* gemm_rows: packed panels and k->ukernel */
};

/* The kernels a bucket can name (lp_kernel_name() gives the function). */
enum lp_kernel {
    LK_REF_MATVEC,     /* scalar: every product */
    LK_GEMM,           /* gemm_rows + the ISA's ukernel */
    LK_A2_MV_ROW,      /* AVX2 float, 1 token */
    LK_A2_MV_BLOCK_T,  /* AVX2 float, 2+ tokens: one row by up to 4 tokens */
    LK_A2_MV_QUANT,    /* AVX2 quantized, lane order, 1 token */
    LK_A2_MV_QUANT_M,  /* the same from LP_A2_MVQ_MULTI tokens: blocks decoded once */
    LK_A2_MV_QGENERIC, /* AVX2 quantized, groups q_lanes cannot take */
    LK_A2_QI,          /* AVX2 integer matvec (qi_block) */
    LK_A512_MV_ROW,    /* AVX-512 float, 1 token */
    LK_A512_MV_BLOCK_T,/* AVX-512 float, 2 rows by up to 4 tokens */
    LK_A512_MV_BLOCK_P,/* AVX-512 float, 4 rows by up to 6 tokens */
    LK_A512_MV_QUANT,  /* AVX-512 quantized, lane order */
    LK_A512_MV_QGENERIC,
    LK_A512_FPAN8,     /* fpan_rows, tiles of 1-4 panels by up to 8 tokens */
    LK_A512_FPAN6,     /* fpan_rows, tiles of 2 panels by 6 tokens */
    LK_VNNI_QV_BLOCK,  /* VNNI integer matvec, stored layout, 4 rows a block */
    LK_VNNI_QG_ROWS,   /* VNNI 4-bit tiles, stored layout (QG16 packed per call) */
    LK_VNNI_QG_FEW,    /* QG16, 2 panels, tokens by pairs (qg_rows16n) */
    LK_VNNI_QG_SOME,   /* QG16, 2 panels, tokens by fours (qg_rows16_4n) */
    LK_VNNI_QG_TILES,  /* QG16, tiles of 8 tokens (qg_rows16) */
    LK_VNNI_QG_TILES3, /* QG16 4-bit, 3 panels by 8 tokens (qg_rows16 / qg_panels3) */
    LK_COUNT
};

#define LP_MAX_BUCKETS 6

/* Tokens from from_tok (to the next bucket's, or on) run kernel on path; rows: the
 * rows a thread claims at a time (the backend falls back to 16 where a larger unit
 * leaves fewer than 4 pieces a thread). */
struct lp_bucket {
    int from_tok;
    uint8_t path;   /* enum lp_path */
    uint8_t kernel; /* enum lp_kernel */
    int16_t rows;
};

struct linear_plan {
    uint8_t layout; /* enum lp_layout */
    bool fast;      /* the integer matvec takes x's high limb alone (--fast, 4-bit affine) */
    uint8_t n;      /* buckets */
    struct lp_bucket b[LP_MAX_BUCKETS];
};

/* The decision itself: the bucket of n_tok tokens of w under k (from_tok = n_tok). */
struct lp_bucket lp_classify(const struct cpu_kernels *k, const struct wmat *w, int n_tok);
/* True when the integer matvec takes w (kern.h "qi"): x is then prepared as integers. */
bool lp_uses_qi(const struct cpu_kernels *k, const struct wmat *w);
/* Tokens from which w takes the GEMM path under k (1 << 30: never). */
int lp_gemm_from(const struct cpu_kernels *k, const struct wmat *w);

/* The plan of w (as the kernels see it: wmat_from of the prepared tensor) under k. */
void linear_plan_make(struct linear_plan *p, const struct cpu_kernels *k, const struct wmat *w);

/* The bucket n_tok (>= 1) falls in. */
static inline const struct lp_bucket *linear_plan_at(const struct linear_plan *p, int n_tok)
{
    int i = p->n - 1;
    while (i > 0 && n_tok < p->b[i].from_tok)
        i--;
    return &p->b[i];
}

/* Tokens from which the plan takes the GEMM path (1 << 30: never). */
int linear_plan_gemm_from(const struct linear_plan *p);

const char *lp_layout_name(enum lp_layout l);
const char *lp_path_name(enum lp_path p);
const char *lp_kernel_name(enum lp_kernel k);
