#!/bin/sh
# `mlxcel inspect --kernels`: every linear weight's plan (layout, and the kernel that runs
# each range of token counts; src/kernels/cpu/linear_plan.h), in text and in --json, on the
# ISAs this CPU has: scalar always, AVX2 and AVX-512 VNNI where present.
# Usage (from the repo root): sh tests/cli/inspect_kernels.sh path/to/mlxcel
BIN=${1:?usage: inspect_kernels.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL inspect --kernels: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
has() { grep -q -- "$2" "$T/out" || fail "$1: no line matching '$2' in: $(cat "$T/out")"; }
# count WHAT N REGEX: exactly N lines of stdout match
count() { n=$(grep -c -- "$3" "$T/out"); [ "$n" -eq "$2" ] || fail "$1: $n lines match '$3', expected $2: $(cat "$T/out")"; }
flat() { tr -d ' \t\n\r' <"$T/out" >"$T/flat"; }
jhas() { grep -q -- "$2" "$T/flat" || fail "$1: JSON lacks '$2': $(cat "$T/flat")"; }

run "$BIN" inspect --help
has "help" '--kernels'

# without the flag: no plans, no backend
run "$BIN" inspect -m models/llama-tiny
expect_rc 0 "inspect"
grep -q '^kernels' "$T/out" && fail "plans printed without --kernels"

# scalar: the reference matvec at every count; 4 layers x 7 products + the head
MLXCEL_ISA=scalar run "$BIN" inspect -m models/llama-tiny --kernels
expect_rc 0 "scalar"
has "scalar header" '^kernels  *cpu-scalar, [0-9]* threads'
count "scalar plans" 29 ' BF16  *stored 1+ ref_matvec$'
has "a q projection" '^  model\.layers\.0\.self_attn\.q_proj\.weight  *256x256 '

MLXCEL_ISA=scalar run "$BIN" inspect -m models/llama-tiny --kernels --json
expect_rc 0 "scalar --json"
flat
jhas "backend" '"kernels":{"weights":\[{'
jhas "backend name" '"backend":"cpu-scalar"'
jhas "a plan" '"layout":"stored","fast":false,"buckets":\[{"from_tok":1,"path":"matvec","kernel":"ref_matvec"}\]'

if grep -qw avx2 /proc/cpuinfo; then
    MLXCEL_ISA=avx2 run "$BIN" inspect -m models/llama-tiny --kernels
    expect_rc 0 "avx2"
    count "avx2 float" 29 ' stored 1 avx2\.mv_row 2-15 avx2\.mv_block_t 16+ gemm_rows$'
    MLXCEL_ISA=avx2 run "$BIN" inspect -m tests/fixtures/golden/phixtral_mlx_q4 --kernels --fast
    expect_rc 0 "avx2 4-bit --fast"
    has "avx2 4-bit" ' affine 4-bit g64  *stored 1+ avx2\.qi_block (fast)$'
fi

if grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo; then
    MLXCEL_ISA=avx512 run "$BIN" inspect -m tests/fixtures/golden/phixtral_mlx_q4 --kernels
    expect_rc 0 "vnni"
    has "vnni QG16" ' affine 4-bit g64  *qg16  *1-3 vnni\.qg_rows16n 4-7 vnni\.qg_rows16_4n 8-31 vnni\.qg_rows16 32+ vnni\.qg_panels3$'
    grep -q ' stored ' "$T/out" && fail "vnni: a 4-bit weight left in the stored layout: $(cat "$T/out")"
    MLXCEL_REPACK=0 MLXCEL_ISA=avx512 run "$BIN" inspect -m tests/fixtures/golden/phixtral_mlx_q4 --kernels
    expect_rc 0 "vnni, repacking off"
    has "vnni stored" ' affine 4-bit g64  *stored 1-3 vnni\.qv_block 4+ vnni\.qg_rows$'
    MLXCEL_ISA=avx512 run "$BIN" inspect -m models/llama-tiny --kernels --json
    expect_rc 0 "vnni --json"
    flat
    jhas "fpan buckets" '"layout":"fpan","fast":false,"buckets":\[{"from_tok":1,"path":"fpan_linear","kernel":"avx512.fpan_rows8"},{"from_tok":12,"path":"fpan_linear","kernel":"avx512.fpan_rows6"}\]'
fi
[ -s "$T/err" ] && fail "wrote to stderr: $(cat "$T/err")"
echo "ok inspect --kernels"
