#!/bin/sh
# `mlxcel embed` and `mlxcel rerank` (issue 44): --help lists every flag; the golden BERT
# (tests/fixtures/golden/bert_st, sentence-transformers folder, mean + Normalize) gives the
# float64 reference vectors for its token ids (--ids-file), --json and plain output agree,
# --no-normalize / --normalize / --dimensions change the norms as documented; texts (a BERT
# from `mlxcel synth` with the llama-tiny tokenizer) equal their ids; the cross-encoder
# golden's scores; stdout holds only results and stderr stays quiet in a pipe; wrong model
# kinds, missing input and bad flags fail with one line (exit 1, usage exit 2).
# Usage (from the repo root): sh tests/cli/embed.sh path/to/mlxcel
BIN=${1:?usage: embed.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL embed: $*" >&2; exit 1; }
run() { timeout 120 "$@" >"$T/out" 2>"$T/err" </dev/null; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
err_has() { grep -qF -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"; }
G=tests/fixtures/golden/bert_st
CE=tests/fixtures/golden/bert_ce
[ -f "$G/embed.json" ] || fail "$G/embed.json is missing (cmake unpacks the golden archives)"

# ---- --help lists every long option of the command's table ----
for cmd in embed rerank; do
    run "$BIN" $cmd --help
    expect_rc 0 "$cmd --help"
    sed -n "/^int cmd_$cmd(/,/{0, 0, 0, 0}/p" src/cli/cmd_embed.c | grep -o '{"[a-z-]*"' | tr -d '{"' >"$T/flags"
    [ -s "$T/flags" ] || fail "no option table found for $cmd"
    while read -r f; do
        [ "$f" = help ] || grep -q -- "--$f\b" "$T/out" || fail "$cmd --help does not list --$f"
    done <"$T/flags"
done

# ---- the golden: ids in, reference vectors out ----
python3 - "$G/embed.json" "$T" <<'PY' || fail "cannot read the reference"
import json, sys
ref = json.load(open(sys.argv[1]))
with open(sys.argv[2] + "/ids.txt", "w") as f:
    for t in ref["texts"]:
        f.write(json.dumps(t["ids"]) + "\n")
with open(sys.argv[2] + "/ref.txt", "w") as f:
    for t in ref["texts"]:
        f.write(" ".join(repr(x) for x in t["embedding_batched"]) + "\n")
PY
cmp_vecs() {  # $1 got, $2 want, $3 what: every row within 1e-4 of max |want|
    python3 - "$1" "$2" "$3" <<'PY' || exit 1
import sys
got = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
want = [list(map(float, l.split())) for l in open(sys.argv[2]) if l.strip()]
if len(got) != len(want):
    sys.exit("FAIL embed: %s: %d rows, want %d" % (sys.argv[3], len(got), len(want)))
for i, (g, w) in enumerate(zip(got, want)):
    m = max(abs(x) for x in w)
    d = max(abs(a - b) for a, b in zip(g, w)) if len(g) == len(w) else float("inf")
    if d > 1e-4 * m:
        sys.exit("FAIL embed: %s: row %d differs by %g (max %g)" % (sys.argv[3], i, d, m))
PY
}
run "$BIN" embed -m "$G" --ids-file "$T/ids.txt"
expect_rc 0 "embed --ids-file"
[ -s "$T/err" ] && fail "stderr is not quiet in a pipe: $(cat "$T/err")"
cp "$T/out" "$T/plain"
cmp_vecs "$T/plain" "$T/ref.txt" "plain output" || exit 1
run "$BIN" embed -m "$G" --ids-file "$T/ids.txt" --json
expect_rc 0 "embed --json"
python3 -c "
import json,sys
d=json.load(open('$T/out'))
rows=[' '.join(repr(x) for x in e['embedding']) for e in d['data']]
assert [e['index'] for e in d['data']]==list(range(len(rows))) and d['dim']==64
open('$T/json.txt','w').write('\n'.join(rows)+'\n')" || fail "--json shape: $(head -c 300 "$T/out")"
cmp_vecs "$T/json.txt" "$T/ref.txt" "--json" || exit 1
norms() { python3 -c "
import sys,math
for l in open('$1'):
    print('%.4f' % math.sqrt(sum(float(x)**2 for x in l.split())))" | sort -u; }
[ "$(norms "$T/plain")" = "1.0000" ] || fail "Normalize: norms $(norms "$T/plain")"
run "$BIN" embed -m "$G" --ids-file "$T/ids.txt" --no-normalize
expect_rc 0 "--no-normalize"
[ "$(norms "$T/out" | head -1)" != "1.0000" ] || fail "--no-normalize left unit vectors"
run "$BIN" embed -m "$G" --ids-file "$T/ids.txt" --dimensions 8
expect_rc 0 "--dimensions"
[ "$(awk '{print NF}' "$T/out" | sort -u)" = 8 ] || fail "--dimensions 8: $(head -1 "$T/out")"
[ "$(norms "$T/out")" = "1.0000" ] || fail "--dimensions 8 not renormalized"

# ---- MLX-quantized (mlxcel convert -q, 8 bits; the sentence-transformers files copied beside):
# every vector within cosine 0.999 of the float64 reference (measured worst 0.99974) ----
run "$BIN" convert -m "$G" -o "$T/q8" -q --q-bits 8
expect_rc 0 "convert -q"
err_has "convert of a sentence-transformers folder" "copy modules.json"
cp "$G/modules.json" "$T/q8/" && cp -r "$G"/1_* "$G"/2_* "$T/q8/" 2>/dev/null
cp "$G"/config_sentence_transformers.json "$G"/sentence_bert_config.json "$T/q8/" 2>/dev/null
grep -q '"quantization"' "$T/q8/config.json" || fail "convert -q wrote no quantization"
run "$BIN" embed -m "$T/q8" --ids-file "$T/ids.txt"
expect_rc 0 "embed on the 8-bit model"
python3 - "$T/out" "$T/ref.txt" <<'PY' || exit 1
import math, sys
for i, (g, w) in enumerate(zip(open(sys.argv[1]), open(sys.argv[2]))):
    g, w = list(map(float, g.split())), list(map(float, w.split()))
    c = sum(a * b for a, b in zip(g, w)) / math.sqrt(sum(a * a for a in g) * sum(b * b for b in w))
    if c < 0.999:
        sys.exit("FAIL embed: 8-bit row %d: cosine %.6f" % (i, c))
PY

# ---- texts equal their ids (synth BERT with the llama-tiny tokenizer) ----
cat >"$T/cfg.json" <<'J'
{"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 2048, "hidden_size": 64,
 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
 "max_position_embeddings": 64, "type_vocab_size": 2}
J
run "$BIN" synth -c "$T/cfg.json" -o "$T/bert" --seed 5 --tokenizer models/llama-tiny
expect_rc 0 "synth"
printf 'ROMEO: hello\nx\nJULIET: and the night?\n' >"$T/lines.txt"
: >"$T/tids.txt"
while IFS= read -r line; do
    "$BIN" tokenize -m "$T/bert" -p "$line" --special | tr -d ' ' >>"$T/tids.txt" || fail "tokenize"
done <"$T/lines.txt"
run "$BIN" embed -m "$T/bert" -f "$T/lines.txt"
expect_rc 0 "embed -f"
[ "$(wc -l <"$T/out")" -eq 3 ] || fail "one vector per line: $(wc -l <"$T/out")"
cp "$T/out" "$T/bytext"
run "$BIN" embed -m "$T/bert" --ids-file "$T/tids.txt"
expect_rc 0 "embed ids of the texts"
cmp_vecs "$T/bytext" "$T/out" "texts vs their ids" || exit 1
printf 'a\n\nb\n' >"$T/empty.txt"   # llama-tiny's template adds no BOS: the empty line has no token
run "$BIN" embed -m "$T/bert" -f "$T/empty.txt"
expect_rc 1 "an empty line that gives no token"
err_has "an empty line" "line 2: the text gives no tokens"
run "$BIN" embed -m "$T/bert" -f - 
expect_rc 1 "empty standard input"
err_has "no input" "no input lines"

# ---- NaN-producing weights: a clear error, exit 1 ----
cp -r "$T/bert" "$T/nan"
python3 - "$T/nan/model.safetensors" <<'PY' || fail "cannot patch the checkpoint"
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = [k for k in h if k.endswith("embeddings.LayerNorm.weight")][0]
assert h[name]["dtype"] == "BF16"
a = 8 + n + h[name]["data_offsets"][0]
b[a:a + 2] = struct.pack("<H", 0x7fc0)
open(p, "wb").write(b)
PY
run "$BIN" embed -m "$T/nan" -f "$T/lines.txt"
expect_rc 1 "NaN weights"
err_has "NaN weights" "non-finite"

# ---- rerank: the cross-encoder golden's scores from its pair ids ----
python3 - "$CE/embed.json" "$T" <<'PY' || fail "cannot read the rerank reference"
import json, sys
ref = json.load(open(sys.argv[1]))
with open(sys.argv[2] + "/pairs.txt", "w") as f:
    for ids, tt in zip(ref["ids"], ref["token_type_ids"]):
        f.write(json.dumps({"ids": ids, "token_type_ids": tt}) + "\n")
json.dump(ref["scores"], open(sys.argv[2] + "/scores.json", "w"))
PY
run "$BIN" rerank -m "$CE" --ids-file "$T/pairs.txt" --json
expect_rc 0 "rerank --ids-file"
python3 - "$T/out" "$T/scores.json" <<'PY' || fail "rerank scores: $(cat "$T/out")"
import json, sys
got = json.load(open(sys.argv[1]))["results"]
want = json.load(open(sys.argv[2]))
order = sorted(range(len(want)), key=lambda i: (-want[i], i))
assert [r["index"] for r in got] == order, (got, want)
for r in got:
    assert abs(r["relevance_score"] - want[r["index"]]) <= 1e-4 * max(abs(want[r["index"]]), 1e-3), r
PY
run "$BIN" rerank -m "$CE" --ids-file "$T/pairs.txt" --top-n 2
expect_rc 0 "rerank --top-n"
[ "$(wc -l <"$T/out")" -eq 2 ] || fail "--top-n 2: $(cat "$T/out")"

# ---- a cross-encoder of 3 labels (NLI-style) does not rerank ----
cat >"$T/ce3.json" <<'J'
{"architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": 120,
 "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128,
 "max_position_embeddings": 64, "id2label": {"0": "a", "1": "b", "2": "c"}}
J
run "$BIN" synth -c "$T/ce3.json" -o "$T/ce3" --seed 2
expect_rc 0 "synth ce3"
echo '[2, 5, 3, 7, 3]' >"$T/p3.txt"
run "$BIN" rerank -m "$T/ce3" --ids-file "$T/p3.txt"
expect_rc 1 "rerank with 3 labels"
err_has "rerank with 3 labels" "one label"

# ---- wrong kinds and bad input ----
run "$BIN" embed -m "$CE" --ids-file "$T/pairs.txt"
expect_rc 1 "embed on a cross-encoder"
err_has "embed on a cross-encoder" "mlxcel rerank"
run "$BIN" rerank -m "$G" --ids-file "$T/ids.txt"
expect_rc 1 "rerank on an embedder"
run "$BIN" embed -m models/llama-tiny -f "$T/lines.txt"
expect_rc 1 "embed on a generating model"
err_has "embed on llama-tiny" "not an encoder"
run "$BIN" generate -m "$T/bert" -p hi -n 2 --no-chat
expect_rc 1 "generate on an encoder"
err_has "generate on an encoder" "is an encoder"
echo '[1, 2, 999999]' >"$T/bad.txt"
run "$BIN" embed -m "$G" --ids-file "$T/bad.txt"
expect_rc 1 "id out of range"
err_has "id out of range" "vocabulary"
echo '[1, "x"]' >"$T/bad.txt"
run "$BIN" embed -m "$G" --ids-file "$T/bad.txt"
expect_rc 1 "not an integer"
python3 -c "print([5]*300)" >"$T/long.txt"
run "$BIN" embed -m "$G" --ids-file "$T/long.txt" --no-truncate
expect_rc 1 "--no-truncate"
err_has "--no-truncate" "more than the model"
run "$BIN" embed -m "$G" --ids-file "$T/long.txt"
expect_rc 0 "too long is truncated"
run "$BIN" embed -m "$G"
expect_rc 2 "no input"
run "$BIN" embed -m "$G" --ids-file "$T/ids.txt" --dimensions 65
expect_rc 1 "--dimensions past the model's"
run "$BIN" rerank -m "$CE" -f "$T/lines.txt"
expect_rc 2 "rerank without -q"
run "$BIN" embed -m "$G" --ids-file "$T/missing.txt"
expect_rc 1 "missing file"
echo "ok embed"
