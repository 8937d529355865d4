#!/bin/sh
# `mlxcel embed` / `mlxcel rerank` on decoder embedding models and the LM reranker (issue 44,
# ADR 0097 / 0098), against tests/fixtures/gen/gen_embed_dec.py's float64 references: the texts
# of qwen3_emb (Qwen3-Embedding's shape) and embgemma (EmbeddingGemma's) give
# SentenceTransformer.encode's vectors, also with --prompt-name query / document; qwen3_rr with
# --reranker qwen3 gives the model card's P(yes) (and its second instruction with
# --instruction); qwen3_rr converted to Qwen3ForSequenceClassification (make_seqcls_checkpoint.py,
# as vLLM's convert_model_to_seq_cls.py; ADR 0136) gives the same scores without a flag; an
# embedding model does not generate, a wrong --reranker kind fails with one line (exit 1); serve
# refuses --reranker in router mode.
# Usage (from the repo root): sh tests/cli/embed_dec.sh path/to/mlxcel
BIN=${1:?usage: embed_dec.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL embed_dec: $*" >&2; exit 1; }
run() { timeout 120 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
G=tests/fixtures/golden

cmp_vecs() {  # $1 got, $2 want, $3 what: every row within 1e-4 of max |want|
    python3 - "$1" "$2" "$3" <<'PY' || exit 1
import sys
got = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
want = [list(map(float, l.split())) for l in open(sys.argv[2]) if l.strip()]
if len(got) != len(want):
    sys.exit("FAIL embed_dec: %s: %d rows, want %d" % (sys.argv[3], len(got), len(want)))
for i, (g, w) in enumerate(zip(got, want)):
    m = max(abs(x) for x in w)
    d = max(abs(a - b) for a, b in zip(g, w)) if len(g) == len(w) else float("inf")
    if d > 1e-4 * m:
        sys.exit("FAIL embed_dec: %s: row %d differs by %g (max %g)" % (sys.argv[3], i, d, m))
PY
}

for c in qwen3_emb embgemma; do
    [ -f "$G/$c/embed.json" ] || fail "$G/$c/embed.json is missing (cmake unpacks the golden archives)"
    python3 - "$G/$c/embed.json" "$T" <<'PY' || fail "cannot read the reference of $c"
import json, sys
ref = json.load(open(sys.argv[1]))
d = sys.argv[2]
open(d + "/texts.txt", "w").write("".join(t["text"] + "\n" for t in ref["texts"]))
open(d + "/ref.txt", "w").write("".join(" ".join(repr(x) for x in t["embedding"]) + "\n" for t in ref["texts"]))
for p in ref["prompts"]:   # the texts whose reference is not null
    keep = [i for i, v in enumerate(p["embedding"]) if v]
    assert keep, p["name"]
    open(d + "/p_%s.txt" % p["name"], "w").write("".join(p["texts"][i] + "\n" for i in keep))
    open(d + "/pref_%s.txt" % p["name"], "w").write("".join(" ".join(repr(x) for x in p["embedding"][i]) + "\n" for i in keep))
PY
    run "$BIN" embed -m "$G/$c" -f "$T/texts.txt"
    expect_rc 0 "$c embed -f"
    [ -s "$T/err" ] && fail "$c: stderr is not quiet in a pipe: $(cat "$T/err")"
    cmp_vecs "$T/out" "$T/ref.txt" "$c texts" || exit 1
    for p in query document; do
        run "$BIN" embed -m "$G/$c" -f "$T/p_$p.txt" --prompt-name $p
        expect_rc 0 "$c --prompt-name $p"
        cmp_vecs "$T/out" "$T/pref_$p.txt" "$c prompt $p" || exit 1
    done
    run "$BIN" generate -m "$G/$c" -p hello -n 2
    expect_rc 1 "$c generate"
    err_has "$c generate" "does not generate text"
done

# ---- the LM reranker ----
R=$G/qwen3_rr
[ -f "$R/embed.json" ] || fail "$R/embed.json is missing"
python3 - "$R/embed.json" "$T" <<'PY' || fail "cannot read the reranker reference"
import json, sys
ref = json.load(open(sys.argv[1]))
d = sys.argv[2]
# every pair of the first query (and, with the second instruction, those with a reference)
q = ref["pairs"][0][0]
idx = [i for i, p in enumerate(ref["pairs"]) if p[0] == q]
open(d + "/q.txt", "w").write(q)
open(d + "/docs.txt", "w").write("".join(ref["pairs"][i][1] + "\n" for i in idx))
open(d + "/scores.txt", "w").write(" ".join(repr(ref["scores"][i]) for i in idx) + "\n")
# the second instruction: the pairs with a reference (null: none)
k = [i for i, v in enumerate(ref["scores_instruction2"]) if v is not None]
assert k
open(d + "/q2.txt", "w").write(ref["pairs"][k[0]][0])
open(d + "/docs2.txt", "w").write(ref["pairs"][k[0]][1] + "\n")
open(d + "/scores2.txt", "w").write(repr(ref["scores_instruction2"][k[0]]) + "\n")
open(d + "/instr2.txt", "w").write(ref["instruction2"])
PY
cmp_scores() {  # $1 rerank --json output, $2 reference scores in document order, $3 what
    python3 - "$1" "$2" "$3" <<'PY' || exit 1
import json, sys
res = json.load(open(sys.argv[1]))["results"]
want = list(map(float, open(sys.argv[2]).read().split()))
if sorted(r["index"] for r in res) != list(range(len(want))):
    sys.exit("FAIL embed_dec: %s: indices %r" % (sys.argv[3], [r["index"] for r in res]))
for r in res:
    w = want[r["index"]]
    if abs(r["relevance_score"] - w) > 1e-4 * abs(w):
        sys.exit("FAIL embed_dec: %s: document %d scores %r, want %r" % (sys.argv[3], r["index"], r["relevance_score"], w))
PY
}
run "$BIN" rerank -m "$R" --reranker qwen3 -q "$(cat "$T/q.txt")" -f "$T/docs.txt" --json
expect_rc 0 "rerank --reranker qwen3"
cmp_scores "$T/out" "$T/scores.txt" "rerank" || exit 1
run "$BIN" rerank -m "$R" --reranker qwen3 --instruction "$(cat "$T/instr2.txt")" -q "$(cat "$T/q2.txt")" -f "$T/docs2.txt" --json
expect_rc 0 "rerank --instruction"
cmp_scores "$T/out" "$T/scores2.txt" "rerank --instruction" || exit 1
# the converted reranker: no flag needed, the same scores (sigmoid of the score head's logit)
python3 tests/cli/make_seqcls_checkpoint.py "$R" "$T/seqcls" || fail "cannot convert qwen3_rr"
run "$BIN" rerank -m "$T/seqcls" -q "$(cat "$T/q.txt")" -f "$T/docs.txt" --json
expect_rc 0 "rerank of a converted Qwen3ForSequenceClassification"
cmp_scores "$T/out" "$T/scores.txt" "rerank (converted)" || exit 1
run "$BIN" rerank -m "$T/seqcls" --instruction "$(cat "$T/instr2.txt")" -q "$(cat "$T/q2.txt")" -f "$T/docs2.txt" --json
expect_rc 0 "rerank --instruction (converted)"
cmp_scores "$T/out" "$T/scores2.txt" "rerank --instruction (converted)" || exit 1
run "$BIN" generate -m "$T/seqcls" -p hello -n 2
expect_rc 1 "generate with a converted reranker"
run "$BIN" rerank -m "$R" -q x -f "$T/docs.txt"
expect_rc 1 "rerank of a causal LM without --reranker"
err_has "no flag" "--reranker qwen3"
run "$BIN" rerank -m "$R" --reranker qwen4 -q x -f "$T/docs.txt"
expect_rc 1 "--reranker qwen4"
err_has "--reranker qwen4" "qwen4"
[ "$(wc -l <"$T/err")" -eq 1 ] || fail "--reranker qwen4: more than one line: $(cat "$T/err")"
run "$BIN" rerank -m "$G/qwen3_emb" --reranker qwen3 -q x -f "$T/docs.txt"
expect_rc 1 "--reranker on an embedding model"
run "$BIN" embed -m "$R" --reranker qwen3 -f "$T/docs.txt"
expect_rc 2 "embed takes no --reranker"
# router mode (several -m): --reranker would name every model's kind; refused before listening
run "$BIN" serve --port 0 -m "$R" -m "$G/qwen3_emb" --reranker qwen3
expect_rc 2 "serve --reranker in router mode"
err_has "serve --reranker in router mode" "classifier_from_token"
echo "ok embed_dec"
