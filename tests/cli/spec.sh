#!/bin/sh
# `generate --spec ngram` (prompt lookup, ADR 0079): the same greedy ids as plain decoding
# on a prompt that repeats itself (drafts accepted) and on one that does not, at a
# context that ends mid-draft; --stats reports the drafts; a sliding-window model drafts too,
# and so do recurrent and hybrid ones (ADR 0112: their states checkpointed and restored, with
# a hybrid as its own draft model too), while one whose rope follows the length says it
# cannot, and all give the plain ids; `--model-draft` (the model itself: all accepted;
# another checkpoint; another vocabulary refused); `--spec mtp` (the checkpoint's own
# multi-token-prediction layer, ADR 0108: a random one added to goldens deepseek_v3 and
# glm4_moe, and Qwen3-Next's mtp.* module to goldens qwen3_next and qwen3_5_text (ADR 0135), by
# make_mtp_checkpoint.py gives the plain ids; checkpoints without one are refused naming why);
# past the clock gate's first rounds (ADR 0148) the ids stay plain; bad values of the flags are
# usage errors.
# Usage (from the repo root): sh tests/cli/spec.sh path/to/mlxcel
BIN=${1:?usage: spec.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL spec: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
M=models/llama-tiny
REP=$(for i in 1 2 3 4; do seq 100 120; done | paste -sd, -)   # 84 ids, a phrase 4 times
ONCE=$(seq 300 340 | paste -sd, -)

same() {  # prompt ids, extra flags: plain vs --spec ngram
    run "$BIN" generate -m $M --prompt-ids "$1" -n 40 --temp 0 --output-ids $2
    expect_rc 0 "plain $2"
    cp "$T/out" "$T/plain"
    run "$BIN" generate -m $M --prompt-ids "$1" -n 40 --temp 0 --output-ids --spec ngram --stats $2
    expect_rc 0 "--spec ngram $2"
    cmp -s "$T/out" "$T/plain" || fail "--spec ngram $2: $(cat "$T/out"), plain $(cat "$T/plain")"
}
same "$REP" ""
grep -q "^speculative: [1-9][0-9]* tokens drafted, [1-9][0-9]* accepted" "$T/err" ||
    fail "no accepted drafts reported: $(cat "$T/err")"
same "$ONCE" ""
same "$REP" "--ctx 100 --draft-max 7"          # the context ends 16 tokens on
same "$REP" "--draft-max 2 --draft-min 2"
same "$REP" "--spec-gate off"
# past the gate's first rounds (ADR 0148: 48 drafting tokens, 16 plain, then a hold), whichever
# mode the clock picks: the plain ids
run "$BIN" generate -m $M --prompt-ids "$REP" -n 160 --temp 0 --ignore-eos --output-ids
expect_rc 0 "plain, 160 tokens"
cp "$T/out" "$T/plain"
run "$BIN" generate -m $M --prompt-ids "$REP" -n 160 --temp 0 --ignore-eos --output-ids --spec ngram
expect_rc 0 "--spec ngram, 160 tokens"
cmp -s "$T/out" "$T/plain" || fail "--spec ngram past the gate's rounds: $(cat "$T/out"), plain $(cat "$T/plain")"
# sampling with a seed gives plain sampling's ids (a draft is accepted when the plain draw is
# it: one uniform per output token, ADR 0116), whatever the draft length
run "$BIN" generate -m $M --prompt-ids "$REP" -n 20 --temp 0.8 --top-p 0.9 --seed 4 --output-ids
cp "$T/out" "$T/plain"
for D in 1 3 8; do
    run "$BIN" generate -m $M --prompt-ids "$REP" -n 20 --temp 0.8 --top-p 0.9 --seed 4 --spec ngram --draft-max $D \
        --output-ids
    expect_rc 0 "--spec ngram sampled"
    cmp -s "$T/out" "$T/plain" || fail "--spec ngram --draft-max $D sampled: $(cat "$T/out"), plain $(cat "$T/plain")"
done

# a sliding-window model speculates too (its cache keeps --draft-max positions of slack), so do
# recurrent and hybrid ones (checkpoints, ADR 0112), and one whose rope follows the length
# decodes plainly, saying why; all give the plain ids
for G in tests/fixtures/golden/mistral_swa tests/fixtures/golden/mamba tests/fixtures/golden/falcon_h1 \
    tests/fixtures/golden/qwen3_next tests/fixtures/golden/llama_dynamic; do
    [ -f $G/config.json ] || continue
    run "$BIN" generate -m $G --prompt-ids 5,6,7,5,6,7,5,6,7,5,6 -n 12 --temp 0 --output-ids
    cp "$T/out" "$T/plain"
    run "$BIN" generate -m $G --prompt-ids 5,6,7,5,6,7,5,6,7,5,6 -n 12 --temp 0 --output-ids --spec ngram --stats
    expect_rc 0 "--spec on $G"
    cmp -s "$T/out" "$T/plain" || fail "$G: $(cat "$T/out"), plain $(cat "$T/plain")"
    case $G in
    *llama_dynamic) grep -q "decodes without speculation" "$T/err" || fail "no note for $G: $(cat "$T/err")" ;;
    *falcon_h1 | *qwen3_next) ! grep -q "decodes without speculation" "$T/err" || fail "$G: $(cat "$T/err")" ;;
    *) grep -q "^speculative: [1-9][0-9]* tokens drafted" "$T/err" || fail "$G drafted nothing: $(cat "$T/err")" ;;
    esac
    # a hybrid as its own draft model: its cache checkpointed too, every draft accepted
    case $G in
    *falcon_h1 | *qwen3_next)
        run "$BIN" generate -m $G --prompt-ids 5,6,7,5,6,7,5,6,7,5,6 -n 12 --temp 0 --output-ids --model-draft $G --stats
        expect_rc 0 "--model-draft $G"
        cmp -s "$T/out" "$T/plain" || fail "$G as its own draft: $(cat "$T/out"), plain $(cat "$T/plain")"
        grep -q "^speculative: \([1-9][0-9]*\) tokens drafted, \1 accepted" "$T/err" ||
            fail "$G as its own draft model: not all accepted: $(cat "$T/err")" ;;
    esac
done

# a draft model: the model itself drafts what it will say (all accepted); another checkpoint
# of the same vocabulary drafts worse; both give the plain ids
run "$BIN" generate -m $M --prompt-ids "$ONCE" -n 40 --temp 0 --output-ids
cp "$T/out" "$T/plain"
for D in $M models/phixtral-tiny-4bit; do
    run "$BIN" generate -m $M --prompt-ids "$ONCE" -n 40 --temp 0 --output-ids --model-draft $D --stats
    expect_rc 0 "--model-draft $D"
    cmp -s "$T/out" "$T/plain" || fail "--model-draft $D: $(cat "$T/out"), plain $(cat "$T/plain")"
done
grep -q "^speculative: [1-9][0-9]* tokens drafted" "$T/err" || fail "--model-draft: no drafts: $(cat "$T/err")"
run "$BIN" generate -m $M --prompt-ids "$ONCE" -n 40 --temp 0 --output-ids --model-draft $M --stats
grep -q "^speculative: \([0-9]*\) tokens drafted, \1 accepted" "$T/err" ||
    fail "the model as its own draft: not all accepted: $(cat "$T/err")"
# a draft model of another vocabulary is refused, naming both sizes
G=tests/fixtures/golden/llama
if [ -f $G/config.json ]; then
    run "$BIN" generate -m $M --prompt-ids 1,2,3 -n 4 --model-draft $G
    expect_rc 1 "--model-draft of another vocabulary"
    grep -q "vocabulary has" "$T/err" || fail "another vocabulary: $(cat "$T/err")"
fi

# --spec mtp: a random MTP layer added to golden checkpoints drafts (badly): the plain ids,
# also at a context that ends mid-draft and with short drafts; the goldens themselves have
# no such layer and are refused, naming what is missing
for G in deepseek_v3 glm4_moe qwen3_next qwen3_5_text; do
    [ -f tests/fixtures/golden/$G/config.json ] || continue
    python3 tests/cli/make_mtp_checkpoint.py tests/fixtures/golden/$G "$T/$G" || fail "cannot make $G's MTP checkpoint"
    P=$(seq 10 30 | paste -sd, -)
    for f in "" "--ctx 40" "--draft-max 2"; do
        # shellcheck disable=SC2086
        run "$BIN" generate -m "$T/$G" --prompt-ids "$P" -n 16 --temp 0 --ignore-eos --output-ids $f
        expect_rc 0 "$G plain $f"
        cp "$T/out" "$T/plain"
        # shellcheck disable=SC2086
        run "$BIN" generate -m "$T/$G" --prompt-ids "$P" -n 16 --temp 0 --ignore-eos --output-ids --spec mtp --stats $f
        expect_rc 0 "$G --spec mtp $f"
        cmp -s "$T/out" "$T/plain" || fail "$G --spec mtp $f: $(cat "$T/out"), plain $(cat "$T/plain")"
        grep -q "^speculative: [1-9][0-9]* tokens drafted" "$T/err" || fail "$G --spec mtp drafted nothing: $(cat "$T/err")"
    done
    run "$BIN" generate -m tests/fixtures/golden/$G --prompt-ids 1,2 -n 2 --output-ids --spec mtp
    expect_rc 1 "--spec mtp on golden $G"
    case $G in
    deepseek_v3) grep -q "'num_nextn_predict_layers' is absent" "$T/err" || fail "golden $G: $(cat "$T/err")" ;;
    qwen3*) grep -q "tensor 'mtp.fc.weight' is missing" "$T/err" || fail "golden $G: $(cat "$T/err")" ;;
    *) grep -q "eh_proj.weight' is missing" "$T/err" || fail "golden $G: $(cat "$T/err")" ;;
    esac
done
run "$BIN" generate -m $M --prompt-ids 1,2 -n 2 --output-ids --spec mtp
expect_rc 1 "--spec mtp on llama"
grep -q "the llama family has no multi-token-prediction layers" "$T/err" || fail "--spec mtp on llama: $(cat "$T/err")"
"$BIN" generate --help | grep -q "mtp (the" || fail "--help lacks --spec mtp"
"$BIN" serve --help | grep -q "mtp (the" || fail "serve --help lacks --spec mtp"

# usage errors
for bad in "--spec lookahead" "--draft-max 0" "--draft-max 65" "--draft-min -1" "--spec ngram --draft-max 3 --draft-min 4" \
    "--spec draft" "--spec ngram --model-draft $M" "--spec mtp --model-draft $M" "--spec ngram --spec-gate maybe"; do
    # shellcheck disable=SC2086
    run "$BIN" generate -m $M --prompt-ids 1,2 -n 2 $bad
    expect_rc 2 "$bad"
    [ -s "$T/err" ] || fail "$bad: no message"
done
"$BIN" generate --help | grep -q -- "--draft-min" || fail "--help lacks --draft-min"
"$BIN" generate --help | grep -q -- "--spec-gate" || fail "--help lacks --spec-gate"
# the server: --spec draft needs its model, and a draft model goes with no other mode
run "$BIN" serve --spec draft
expect_rc 2 "serve --spec draft"
grep -q "needs a draft model" "$T/err" || fail "serve --spec draft: $(cat "$T/err")"
run "$BIN" serve --spec ngram --model-draft $M
expect_rc 2 "serve --spec ngram --model-draft"
run "$BIN" serve --draft-max 0
expect_rc 2 "serve --draft-max 0"
run "$BIN" serve --spec mtp --model-draft $M
expect_rc 2 "serve --spec mtp --model-draft"
run "$BIN" serve --spec ngram --spec-gate sometimes
expect_rc 2 "serve --spec-gate sometimes"
grep -q "spec-gate" "$T/err" || fail "serve --spec-gate sometimes: $(cat "$T/err")"
"$BIN" serve --help | grep -q -- "--spec-gate" || fail "serve --help lacks --spec-gate"
echo "spec: ok"
