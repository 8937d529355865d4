#!/bin/sh
# `mlxcel synth`: for the config.json of every family (the tiny golden
# configs), float and -q checkpoints load with no unused tensor and generate;
# output is deterministic in the seed; `synth -q` is byte-identical to
# `convert -q` of the float synth of the same seed; --tokenizer copies the
# tokenizer; image-text wrappers get their vision tower and projector (float under -q);
# hostile arguments are one-line errors with exit 1.
# Usage (from the repo root): sh tests/cli/synth.sh path/to/mlxcel
BIN=${1:?usage: synth.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM

fail() { echo "FAIL synth: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
expect_error() {
    expect_rc 1 "$1"
    [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: stderr is not one line: $(cat "$T/err")"
    grep -q -- "$2" "$T/err" || fail "$1: stderr lacks '$2': $(cat "$T/err")"
    return 0
}
# n_ids DIR: how many ids `generate -n 4` produced
n_ids() { "$BIN" generate -m "$1" --prompt-ids 1,2,3 -n 4 --temp 0 --output-ids 2>"$T/gen.err" |
    tr ',' '\n' | grep -c '[0-9]'; }
unused() { "$BIN" inspect -m "$1" --json | tr -d ' \t\n' | grep -o '"unused_tensors":\[[^]]*\]'; }

G=tests/fixtures/golden
for f in llama qwen2 qwen3 phi phi3 mixtral phimoe phixtral deepseek_v2 deepseek_v3 qwen3_moe gpt_oss dots1 glm4_moe minimax_m2 hunyuan_v1_moe llama4_text mamba jamba \
         ernie4_5_moe glm4_moe_lite; do
    for q in "" "-q"; do
        d="$T/$f$q"
        run "$BIN" synth --config $G/$f/config.json -o "$d" $q --seed 7
        expect_rc 0 "synth $f $q"
        [ -s "$T/err" ] && fail "synth $f $q wrote to stderr in a pipe: $(cat "$T/err")"
        [ "$(n_ids "$d")" -eq 4 ] || fail "synth $f $q: generate failed: $(cat "$T/gen.err")"
        [ "$(unused "$d")" = '"unused_tensors":[]' ] || fail "synth $f $q: $(unused "$d")"
    done
    # the loader's view of the synthesized model has the golden model's dimensions
    "$BIN" inspect -m "$T/$f" --json | tr -d ' \t\n' | sed 's/"path":"[^"]*",//;s/"weight_bytes":[0-9]*,//;s/"dtypes":{[^}]*},//' >"$T/a"
    "$BIN" inspect -m $G/$f --json | tr -d ' \t\n' | sed 's/"path":"[^"]*",//;s/"weight_bytes":[0-9]*,//;s/"dtypes":{[^}]*},//;s/"files":[0-9]*/"files":1/' >"$T/b"
    cmp -s "$T/a" "$T/b" || fail "synth $f: inspect differs from the golden model: $(cat "$T/a") vs $(cat "$T/b")"
done
grep -q 'gate_up_proj' "$T/phi3/model.safetensors" || fail "phi3 synth lacks the published fused gate_up_proj"
grep -q 'switch_mlp' "$T/mixtral-q/model.safetensors" || fail "mixtral -q is not stacked"
# mlx-lm's layout for the MoE families: gpt-oss's experts split and stacked, routers at 8 bits
grep -q 'mlp.experts.gate_proj.scales' "$T/gpt_oss-q/model.safetensors" || fail "gpt_oss -q experts are not mlx-lm's"
grep -q 'experts.gate_up_proj' "$T/gpt_oss-q/model.safetensors" && fail "gpt_oss -q keeps transformers' experts"
grep -q '"model.layers.0.mlp.router":[[:space:]]*{' "$T/gpt_oss-q/config.json" || fail "gpt_oss -q: no 8-bit router entry"
grep -q '"model.layers.1.mlp.gate":[[:space:]]*{' "$T/qwen3_moe-q/config.json" || fail "qwen3_moe -q: no 8-bit router entry"
grep -q 'self_attn.unembed_out.weight' "$T/deepseek_v3-q/model.safetensors" || fail "deepseek_v3 -q keeps kv_b_proj"
grep -q 'self_attn.unembed_out.weight' "$T/glm4_moe_lite-q/model.safetensors" || fail "glm4_moe_lite -q keeps kv_b_proj"
grep -q 'switch_mlp' "$T/ernie4_5_moe-q/model.safetensors" || fail "ernie4_5_moe -q is not stacked"
# mlx-lm's layout for the Mamba families: conv1d [d_inner, d_conv, 1], Jamba's experts stacked and router at 8 bits
grep -aq '"backbone.layers.0.mixer.conv1d.weight":{"dtype":"BF16","shape":\[128,4,1\]' "$T/mamba-q/model.safetensors" ||
    fail "mamba -q: conv1d is not [d_inner, d_conv, 1]"
grep -q 'feed_forward.switch_mlp' "$T/jamba-q/model.safetensors" || fail "jamba -q is not stacked"
grep -q '"model.layers.1.feed_forward.router":[[:space:]]*{' "$T/jamba-q/config.json" || fail "jamba -q: no 8-bit router entry"

# ---- deterministic in the seed; -q equals convert -q of the float output ----
run "$BIN" synth --config $G/phixtral/config.json -o "$T/again" --seed 7
cmp -s "$T/again/model.safetensors" "$T/phixtral/model.safetensors" || fail "same seed, different bytes"
run "$BIN" synth --config $G/phixtral/config.json -o "$T/seed8" --seed 8
cmp -s "$T/seed8/model.safetensors" "$T/phixtral/model.safetensors" && fail "seed 8 gives seed 7's bytes"
for f in phixtral mixtral gpt_oss qwen3_moe deepseek_v3 dots1 glm4_moe minimax_m2 hunyuan_v1_moe llama4_text jamba \
         ernie4_5_moe glm4_moe_lite; do
    run "$BIN" convert -m "$T/$f" -o "$T/$f-conv" -q
    expect_rc 0 "convert -q of synth $f"
    cmp -s "$T/$f-conv/model.safetensors" "$T/$f-q/model.safetensors" || fail "$f: synth -q != convert -q of synth"
done

# ---- -t: the same bytes on any number of threads ----
# The embedding (24000 x 192 = 4.6M elements) spans 71 generator blocks of 65536 and two 8 MiB
# reads; -q reads it by rows (21845 of them first), so the second read starts inside a block.
cat >"$T/wide.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 24000,
 "hidden_size": 192, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 3,
 "num_key_value_heads": 1, "head_dim": 64, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
 "max_position_embeddings": 512,
 "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 0}
JSON
for q in "" "-q"; do
    for t in 1 2 3; do
        run "$BIN" synth --config "$T/wide.json" -o "$T/wide$q-t$t" $q -t $t --seed 5
        expect_rc 0 "synth wide $q -t $t"
    done
    run "$BIN" synth --config "$T/wide.json" -o "$T/wide$q-tdef" $q --seed 5
    expect_rc 0 "synth wide $q (default threads)"
    for t in 2 3 def; do
        cmp -s "$T/wide$q-t1/model.safetensors" "$T/wide$q-t$t/model.safetensors" ||
            fail "synth wide $q: -t $t differs from -t 1"
    done
    [ "$(n_ids "$T/wide$q-t2")" -eq 4 ] || fail "synth wide $q -t 2: generate failed: $(cat "$T/gen.err")"
    [ "$(unused "$T/wide$q-t2")" = '"unused_tensors":[]' ] || fail "synth wide $q: $(unused "$T/wide$q-t2")"
done
# a range read from the middle of a block (-q) holds the values the aligned reads wrote
run "$BIN" convert -m "$T/wide-t2" -o "$T/wide-conv" -q
expect_rc 0 "convert -q of synth wide"
cmp -s "$T/wide-conv/model.safetensors" "$T/wide-q-t1/model.safetensors" || fail "wide: synth -q != convert -q of synth"
cmp -s "$T/wide-t1/model.safetensors" "$T/wide-q-t1/model.safetensors" && fail "wide: -q wrote the float bytes"
rm -rf "$T"/wide*
for t in 0 -1 x 1025; do
    run "$BIN" synth --config $G/llama/config.json -o "$T/xt" -t "$t"
    expect_error "-t $t" "threads"
done

# ---- dtype, quantization flags, tokenizer, --json ----
# the tokenizer's 2048 ids need a vocabulary that large
sed 's/"vocab_size": *384/"vocab_size": 2048/' $G/llama/config.json >"$T/v2048.json"
run "$BIN" synth --config "$T/v2048.json" -o "$T/q8" -q --q-bits 8 --q-group-size 32 --dtype f16 \
    --tokenizer tests/fixtures/models/phixtral-tiny --json
expect_rc 0 "synth -q 8-bit g32 f16"
tr -d ' \t\n' <"$T/out" >"$T/flat"
grep -q '"family":"llama"' "$T/flat" && grep -q '"dtype":"F16"' "$T/flat" && grep -q '"bits":8' "$T/flat" ||
    fail "--json: $(cat "$T/flat")"
cmp -s "$T/q8/tokenizer.json" tests/fixtures/models/phixtral-tiny/tokenizer.json || fail "--tokenizer"
"$BIN" generate -m "$T/q8" -p "ROMEO:" -n 4 >/dev/null 2>"$T/err" || fail "generate from text: $(cat "$T/err")"
tr -d ' \t\n' <"$T/q8/config.json" | grep -q '"torch_dtype":"float16"' || fail "config torch_dtype"

# ---- fp modes: stacked experts with U8 scales load and generate ----
for m in mxfp4 mxfp8 nvfp4; do
    run "$BIN" synth --config $G/mixtral/config.json -o "$T/mix-$m" -q --q-mode $m
    expect_rc 0 "synth --q-mode $m"
    [ "$(n_ids "$T/mix-$m")" -eq 4 ] || fail "synth mixtral $m: generate failed: $(cat "$T/gen.err")"
done

# ---- hostile arguments ----
# image-text wrappers (issue 43's benchmark shapes): the text model and the vision tower and
# projector, in transformers 5's layout; -q quantizes the language model only (the tower stays
# float, as mlx-vlm converts), so the image's rows are the same bytes in both
for f in gemma3_vision qwen2_vl qwen2_5_vl qwen3_vl; do
    [ -f $G/$f/config.json ] || fail "no golden $f (cmake unpacks tests/fixtures/golden/*.tar.xz)"
    for q in "" "-q"; do
        d="$T/$f$q"
        run "$BIN" synth --config $G/$f/config.json -o "$d" $q --seed 7
        expect_rc 0 "synth $f $q"
        [ "$(unused "$d")" = '"unused_tensors":[]' ] || fail "synth $f $q: $(unused "$d")"
        "$BIN" inspect -m "$d" | grep -q "^vision  *$f\|^vision  *gemma3" || fail "synth $f $q: no tower: $("$BIN" inspect -m "$d")"
        python3 - "$d/model.safetensors" "$q" <<'PY' || fail "synth $f $q: tensor names or dtypes"
import json, struct, sys
b = open(sys.argv[1], "rb").read(8); n = struct.unpack("<Q", b)[0]
h = json.loads(open(sys.argv[1], "rb").read(8 + n)[8:]); h.pop("__metadata__", None)
tower = [k for k in h if k.startswith(("model.vision_tower.", "model.visual.", "model.multi_modal_projector."))]
text = [k for k in h if k.startswith("model.language_model.")]
assert tower and text and all(k in tower or k in text or k.startswith("lm_head.") for k in h), sorted(h)[:5]
assert all(h[k]["dtype"] == "BF16" for k in tower), [k for k in tower if h[k]["dtype"] != "BF16"]
if sys.argv[2] == "-q":
    assert any(h[k]["dtype"] == "U32" for k in text), "the language model is not quantized"
PY
        if [ $f = gemma3_vision ]; then
            run "$BIN" generate -m "$d" --prompt-ids 2,297,5 --pixel-values $G/$f/golden.safetensors -n 2 --temp 0 \
                --output-ids --image-embd-out "$T/emb$q"
        else
            for x in tokenizer.json tokenizer_config.json chat_template.jinja preprocessor_config.json processor_config.json; do
                [ -f $G/$f/$x ] && cp $G/$f/$x "$d/"
            done
            run "$BIN" generate -m "$d" --image tests/fixtures/images/vis_photo.jpg -p "w" -n 2 --temp 0 \
                --output-ids --image-embd-out "$T/emb$q"
        fi
        expect_rc 0 "synth $f $q: generate with an image"
    done
    cmp -s "$T/emb" "$T/emb-q" || fail "synth $f: the -q tower's image rows differ from the float one's"
done

# a wrapper whose tower synth cannot record: an error, not a text-only checkpoint
run "$BIN" synth --config $G/idefics3/config.json -o "$T/x0"
expect_error "idefics3" "vision tower yet"
[ -e "$T/x0/config.json" ] && fail "idefics3 left a checkpoint"

run "$BIN" synth --config "$T/none.json" -o "$T/x1"
expect_error "missing config" "none.json"
printf '{"model_type": "gpt9"}' >"$T/bad.json"
run "$BIN" synth --config "$T/bad.json" -o "$T/x2"
expect_error "unknown model_type" "gpt9"
run "$BIN" synth --config $G/llama/config.json -o "$T/x3" -q --q-bits 7
expect_error "--q-bits 7" "bits = 7"
run "$BIN" synth --config $G/llama/config.json -o /proc/mlxcel-no/such
expect_error "unwritable dst" "cannot create"
run "$BIN" synth --config $G/llama/config.json -o "$T/x4" --seed -1
expect_error "negative seed" "seed"
sed 's/"hidden_size": *64/"hidden_size": -64/' $G/llama/config.json >"$T/neg.json"
run "$BIN" synth --config "$T/neg.json" -o "$T/x5"
expect_rc 1 "negative hidden_size"
for d in x1 x2 x3 x4 x5; do [ -e "$T/$d/config.json" ] && fail "failed synth left $d/config.json"; done
run "$BIN" synth -o "$T/x6"
expect_rc 2 "no --config"
run "$BIN" synth --help
expect_rc 0 "--help"
grep -q "image-text config" "$T/out" || fail "--help does not say what synth does with image-text configs"
exit 0
