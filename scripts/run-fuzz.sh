#!/bin/sh
# run-fuzz.sh BUILD_DIR SECONDS
#
# Runs every BUILD_DIR/fuzz_* libFuzzer binary for SECONDS each, starting from
# a seed corpus generated into a temporary folder:
#   fuzz_safetensors  the committed fixture headers (files cut to 4 KiB) plus a
#                     few small complete files written here, with a dictionary
#                     of the format's keys and dtype names
#   fuzz_config       every config.json under tests/fixtures, plus fuzz/seeds/config/
#                     (oversized and negative dimensions; the unit test
#                     config/oversized_dims runs them under UBSan in make test)
#   fuzz_tokenizer    the tokenizer.json fixtures under 256 KiB plus small
#                     hand-written ones using every component type, and
#                     fuzz/seeds/tokenizer/ (WordPiece + BERT pipeline, Unigram
#                     with a Precompiled charsmap, WordLevel + Roberta)
#   fuzz_template     the chat templates in fuzz/seeds/template/ (the fixtures'
#                     own plus one exercising most constructs)
#   fuzz_encode       texts (mixed scripts, added tokens, invalid UTF-8) and
#                     id lists for the llama2 and shakespeare fixtures
#   fuzz_oai_request  the request bodies in fuzz/seeds/oai_request/ (chat and
#                     completions, stop, logit_bias, stream_options, token
#                     ids), with a dictionary of the fields and role names
#   fuzz_responses    the Responses bodies in fuzz/seeds/responses/ (string and
#                     item input, function_call / function_call_output,
#                     instructions, tools, tool_choice, text.format, refused
#                     stateful fields), with a dictionary of the fields and types
#   fuzz_anthropic    the Messages bodies in fuzz/seeds/anthropic/ (system
#                     blocks, tool_use / tool_result, tools, tool_choice,
#                     thinking, count_tokens, refused blocks), with a dictionary
#                     of the fields and block types
#   fuzz_hub_listing  the Hub listings in fuzz/seeds/hub_listing/ (well-formed
#                     and hostile: ../ and absolute names, huge sizes)
#   fuzz_outparse     the model outputs in fuzz/seeds/outparse/ (an options byte
#                     and a split seed, then the text: Hermes, Llama 3 and
#                     Mistral calls, reasoning, malformed blocks), with a
#                     dictionary of the markers and JSON pieces
#   fuzz_grammar      the JSON schemas in fuzz/seeds/grammar/ (nested objects,
#                     enums, anyOf, recursive and cyclic $ref, bounds,
#                     unsupported keywords), with a dictionary of the keywords;
#                     a schema that compiles is walked with llama-tiny
#   fuzz_image        the test images (tests/fixtures/images: every format, the
#                     hostile ones too), with a dictionary of the formats' markers
#   fuzz_preprocess   the image processor configs in fuzz/seeds/preprocess/ (3 bytes of
#                     image size and backend, then a preprocessor_config.json)
#   anything else     an empty corpus
# A persistent corpus in fuzz/corpus-<name>/ (git-ignored) is read as well
# when it exists. Crash inputs are kept in BUILD_DIR/fuzz-artifacts/.
# Exits non-zero if any target crashes, leaks, times out, or if there is no
# target at all.
set -eu

usage() { echo "usage: $0 BUILD_DIR SECONDS" >&2; exit 2; }
[ $# -eq 2 ] || usage
BUILD=$1
SECS=$2
case $SECS in '' | *[!0-9]*) usage ;; esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mlxcel-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM
ARTIFACTS=$BUILD/fuzz-artifacts
mkdir -p "$ARTIFACTS"
# the seed corpora travel as one archive (fuzz/seeds.tar.xz: 60 small files took 4 KiB of disk
# each); fuzz/seeds/config stays a folder, test_config reads it
SEEDS=$WORK/seeds
mkdir -p "$SEEDS"
xz -dc "$ROOT/fuzz/seeds.tar.xz" | tar -xf - -C "$SEEDS"
cp -r "$ROOT/fuzz/seeds/config" "$SEEDS/"

# le64 N: N as 8 little-endian bytes (N < 2^32 is all we need here).
le64() {
    n=$1
    for _ in 1 2 3 4 5 6 7 8; do
        printf "\\$(printf '%03o' $((n % 256)))"
        n=$((n / 256))
    done
}

# write_st FILE JSON DATA_BYTES: a safetensors file whose header is JSON padded
# with spaces to a multiple of 8, followed by DATA_BYTES bytes of 0x3f.
write_st() {
    len=${#2}
    pad=$(( (8 - len % 8) % 8 ))
    {
        le64 $((len + pad))
        printf '%s' "$2"
        printf '%*s' "$pad" ''
        head -c "$3" /dev/zero | tr '\0' '?'
    } > "$1"
}

seed_safetensors() {
    dir=$1
    for f in "$ROOT"/tests/fixtures/*/*/*.safetensors "$ROOT"/tests/fixtures/*/*.safetensors; do
        [ -f "$f" ] || continue
        case=$(basename "$(dirname "$f")")
        head -c 4096 "$f" > "$dir/$case-$(basename "$f")"
    done
    write_st "$dir/f32" '{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' 16
    write_st "$dir/meta" '{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}' 8
    write_st "$dir/empty" '{"z":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]},"s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}' 4
    write_st "$dir/five" '{"q":{"dtype":"U32","shape":[1,1,1,1,2],"data_offsets":[0,8]},"x":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}}' 16
    write_st "$dir/pair" '{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}}' 8
    write_st "$dir/none" '{}' 0
}

dict_safetensors() {
    for w in '"dtype"' '"shape"' '"data_offsets"' '"__metadata__"' '"format"' '"pt"' \
        '"F32"' '"F16"' '"BF16"' '"F64"' '"U8"' '"I8"' '"U16"' '"I16"' '"U32"' '"I32"' \
        '"I64"' '"BOOL"' '"F8_E4M3"' ':' ',' '[' ']' '{' '}' '[0,0]' '9007199254740992' \
        '1099511627776' '-1' '1.5' '1e999'; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

dict_oai_request() {
    for w in '"model"' '"messages"' '"role"' '"content"' '"type"' '"text"' '"image_url"' \
        '"system"' '"developer"' '"user"' '"assistant"' '"tool"' '"prompt"' '"echo"' '"suffix"' \
        '"logprobs"' '"top_logprobs"' '"max_tokens"' '"max_completion_tokens"' '"temperature"' \
        '"top_p"' '"top_k"' '"min_p"' '"repetition_penalty"' '"presence_penalty"' \
        '"frequency_penalty"' '"seed"' '"stop"' '"n"' '"logit_bias"' '"stream"' \
        '"stream_options"' '"include_usage"' 'null' 'true' 'false' '\u0000' '\ud83d\ude00' \
        '1e300' '-1' '1.5' '2047' '2048' '9223372036854775808'; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

dict_responses() {
    for w in '"model"' '"input"' '"instructions"' '"type"' '"message"' '"role"' '"content"' \
        '"user"' '"assistant"' '"system"' '"developer"' '"input_text"' '"output_text"' '"text"' \
        '"refusal"' '"function_call"' '"function_call_output"' '"reasoning"' '"item_reference"' \
        '"call_id"' '"name"' '"arguments"' '"output"' '"tools"' '"function"' '"description"' \
        '"parameters"' '"strict"' '"tool_choice"' '"auto"' '"none"' '"required"' '"format"' \
        '"json_object"' '"json_schema"' '"schema"' '"max_output_tokens"' '"previous_response_id"' \
        '"conversation"' '"prompt"' '"background"' '"store"' '"parallel_tool_calls"' '"metadata"' \
        '"truncation"' '"temperature"' '"top_p"' '"stream"' '"seed"' '"top_k"' '"stop"' \
        '"chat_template_kwargs"' 'null' 'true' 'false' '{}' '[]' '\u0000' '1e300' '-1' '2048'; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

dict_anthropic() {
    for w in '"model"' '"max_tokens"' '"system"' '"messages"' '"role"' '"content"' '"user"' \
        '"assistant"' '"type"' '"text"' '"image"' '"document"' '"thinking"' '"redacted_thinking"' \
        '"signature"' '"tool_use"' '"id"' '"name"' '"input"' '"tool_result"' '"tool_use_id"' \
        '"is_error"' '"tools"' '"description"' '"input_schema"' '"custom"' '"tool_choice"' '"auto"' \
        '"any"' '"tool"' '"none"' '"enabled"' '"disabled"' '"budget_tokens"' '"stop_sequences"' \
        '"temperature"' '"top_p"' '"top_k"' '"stream"' '"metadata"' '"cache_control"' 'null' 'true' \
        'false' '{}' '[]' '\u0000' '1e300' '-1' '2048'; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

dict_outparse() {
    for w in '<think>' '</think>' '<tool_call>' '</tool_call>' '<|python_tag|>' '[TOOL_CALLS]' \
        '[ARGS]' '{"name": "f", "arguments": {}}' '{"name": "search", "parameters": {"q": 1}}' \
        '"name"' '"arguments"' '"parameters"' '"type": "function"' '"get_weather"' '; ' '\"' \
        '{' '}' '[' ']' ':' ','; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

seed_config() {
    dir=$1
    i=0
    for f in "$ROOT"/tests/fixtures/*/*/config.json "$ROOT"/tests/fixtures/*/config.json; do
        [ -f "$f" ] || continue
        i=$((i + 1))
        cp "$f" "$dir/config-$i.json"
    done
    cp "$SEEDS"/config/*.json "$dir"/
}

seed_tokenizer() {
    dir=$1
    i=0
    for f in "$ROOT"/tests/fixtures/*/*/tokenizer.json; do
        [ -f "$f" ] || continue
        [ "$(wc -c < "$f")" -le 262144 ] || continue
        i=$((i + 1))
        cp "$f" "$dir/tokenizer-$i.json"
    done
    cp "$SEEDS"/tokenizer/*.json "$dir"/
}

# seed_tokenizer_small DIR: one tiny tokenizer.json per component family.
seed_tokenizer_small() {
    v='"model":{"type":"BPE","unk_token":"<unk>","fuse_unk":true,"byte_fallback":true,"vocab":{"<unk>":0,"a":1,"b":2,"ab":3,"\u2581":4,"\u2581a":5,"<0x41>":6,"<0xC3>":7,"<0xA9>":8},"merges":["a b",["\u2581","a"]]}'
    printf '{%s,"normalizer":{"type":"Sequence","normalizers":[{"type":"NFKC"},{"type":"Lowercase"},{"type":"Strip","strip_left":true,"strip_right":true},{"type":"Prepend","prepend":"\u2581"},{"type":"Replace","pattern":{"Regex":" +"},"content":"\u2581"}]},"decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}}' "$v" > "$1/small-norm.json"
    printf '{%s,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":true},{"type":"Digits","individual_digits":true},{"type":"Punctuation","behavior":"Contiguous"},{"type":"Split","pattern":{"String":"b"},"behavior":"MergedWithPrevious","invert":true}]},"decoder":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first"}}' "$v" > "$1/small-meta.json"
    printf '{"added_tokens":[{"id":9,"content":"<s>","special":true,"lstrip":true,"rstrip":true,"single_word":false,"normalized":false},{"id":10,"content":"ab","special":false,"single_word":true,"normalized":true}],%s,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[9],"tokens":["<s>"]}}},"decoder":{"type":"ByteLevel"}}' "$v" > "$1/small-added.json"
}

# seed_encode DIR: inputs for fuzz_encode (first byte: bit 0 picks the
# tokenizer, bit 1 text mode; else 16-bit ids).
seed_encode() {
    printf '\003Hello world! It'"'"'s 2026.' > "$1/text-bl"
    printf '\002 caf\303\251 \346\227\245\346\234\254 \360\237\221\213 <s>[INST] hi [/INST]</s>' > "$1/text-spm"
    printf '\002\342\202\254 \t\n  x' > "$1/text-spm-ws"
    printf '\003<|endoftext|>a\377b' > "$1/text-invalid"
    printf '\000\001\000\355\000\242\000\202\000\254\000' > "$1/ids-spm"
    printf '\001\000\001\020\000\377\377' > "$1/ids-bl"
}

dict_grammar() {
    for w in '"type"' '"object"' '"array"' '"string"' '"integer"' '"number"' '"boolean"' \
        '"null"' '"properties"' '"required"' '"additionalProperties"' '"items"' '"prefixItems"' \
        '"minItems"' '"maxItems"' '"enum"' '"const"' '"minLength"' '"maxLength"' '"minimum"' \
        '"maximum"' '"exclusiveMinimum"' '"exclusiveMaximum"' '"anyOf"' '"oneOf"' '"allOf"' \
        '"$ref"' '"$defs"' '"definitions"' '"#/$defs/a"' '"#"' 'true' 'false' 'null' '1e308' '-0' '0.5'; do
        printf 'kw="%s"\n' "$(printf '%s' "$w" | sed 's/\\/\\\\/g; s/"/\\"/g')"
    done
}

found=0
failed=""
for bin in "$BUILD"/fuzz_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    name=$(basename "$bin")
    short=${name#fuzz_}
    corpus=$WORK/corpus-$short
    mkdir -p "$corpus"
    set --
    case $short in
    safetensors)
        seed_safetensors "$corpus"
        dict_safetensors > "$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict" -max_len=65536
        ;;
    config)
        seed_config "$corpus"
        ;;
    tokenizer)
        seed_tokenizer "$corpus"
        seed_tokenizer_small "$corpus"
        ;;
    encode)
        seed_encode "$corpus"
        ;;
    template)
        cp "$SEEDS"/template/*.jinja "$corpus"/
        ;;
    hub_listing)
        cp "$SEEDS"/hub_listing/*.json "$corpus"/
        ;;
    outparse)
        cp "$SEEDS"/outparse/*.txt "$corpus"/
        dict_outparse > "$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict"
        ;;
    image)
        cp "$ROOT"/tests/fixtures/images/*.jpg "$ROOT"/tests/fixtures/images/*.png \
            "$ROOT"/tests/fixtures/images/*.webp "$ROOT"/tests/fixtures/images/*.gif "$corpus"/
        printf '%s\n' 'kw="\xff\xd8\xff"' 'kw="\xff\xda"' 'kw="\xff\xc2"' 'kw="Exif\x00\x00"' \
            'kw="IHDR"' 'kw="IDAT"' 'kw="PLTE"' 'kw="tRNS"' 'kw="eXIf"' 'kw="IEND"' 'kw="RIFF"' \
            'kw="WEBP"' 'kw="VP8X"' 'kw="VP8L"' 'kw="ANMF"' 'kw="EXIF"' 'kw="GIF89a"' 'kw="NETSCAPE2.0"' \
            >"$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict" -max_len=16384
        ;;
    preprocess)
        cp "$SEEDS"/preprocess/* "$corpus"/
        ;;
    grammar)
        cp "$SEEDS"/grammar/* "$corpus"/
        dict_grammar > "$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict"
        ;;
    oai_request)
        cp "$SEEDS"/oai_request/*.json "$corpus"/
        dict_oai_request > "$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict"
        ;;
    responses | anthropic)
        cp "$SEEDS"/"$short"/*.json "$corpus"/
        "dict_$short" > "$WORK/$short.dict"
        set -- -dict="$WORK/$short.dict"
        ;;
    esac
    extra=""
    [ -d "$ROOT/fuzz/corpus-$short" ] && extra=$ROOT/fuzz/corpus-$short
    found=$((found + 1))
    echo "== $name: ${SECS}s, $(ls "$corpus" | wc -l) seeds"
    if ! MLXCEL_SOURCE_DIR=$ROOT ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
        "$bin" "$@" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
            -print_final_stats=1 -artifact_prefix="$ARTIFACTS/$name-" \
            "$corpus" $extra > "$WORK/$name.log" 2>&1; then
        tail -n 60 "$WORK/$name.log" >&2
        echo "== $name: FAILED (inputs in $ARTIFACTS/)" >&2
        failed="$failed $name"
    else
        grep -E '^(stat::number_of_executed_units|stat::new_units_added)' "$WORK/$name.log" || true
        echo "== $name: ok"
    fi
done

if [ "$found" -eq 0 ]; then
    echo "run-fuzz: no fuzz_* binaries in $BUILD" >&2
    exit 1
fi
if [ -n "$failed" ]; then
    echo "run-fuzz: crashes in:$failed" >&2
    exit 1
fi
