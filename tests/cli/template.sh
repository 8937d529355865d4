#!/bin/sh
# `mlxcel template`: renders checkpoints' chat templates byte for byte as
# transformers does (expected texts from tests/fixtures/tokenizers/*/golden.json),
# with --add-generation-prompt, --var and --chat-template-file; one-line errors.
# `mlxcel generate` applies the template: the ids of `generate -p X --chat` are
# those of `template` output encoded without special tokens.
# Usage (from the repo root): sh tests/cli/template.sh path/to/mlxcel
BIN=${1:?usage: template.sh path/to/mlxcel}
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable" >&2; exit 1; }
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
FX=tests/fixtures/tokenizers
# gpt2 (no chat template): the committed fixture is xz-compressed
mkdir "$T/gpt2" && xz -dc "$FX/gpt2/tokenizer.json.xz" > "$T/gpt2/tokenizer.json" &&
    cp "$FX/gpt2/tokenizer_config.json" "$T/gpt2/" || exit 1

fail() { echo "FAIL template: $*" >&2; exit 1; }
run() { "$@" >"$T/out" 2>"$T/err"; rc=$?; }
expect_rc() { [ "$rc" -eq "$1" ] || fail "$2: exit $rc, expected $1; stderr: $(cat "$T/err")"; }
# the output must be exactly the bytes printf makes of $1 (no trailing newline added)
expect_out() { printf "$1" >"$T/want"; cmp -s "$T/out" "$T/want" || fail "$2: got '$(cat "$T/out")'"; }
one_line_error() {
    [ "$(wc -l <"$T/err")" -eq 1 ] || fail "$1: error is not one line: $(cat "$T/err")"
    grep -q "$2" "$T/err" || fail "$1: error does not mention '$2': $(cat "$T/err")"
}

printf '[{"role": "user", "content": "Hello!"}]' >"$T/hello.json"
printf '[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}]' >"$T/sys.json"

# ---- golden renders ----
run "$BIN" template -m $FX/qwen3 --messages "$T/hello.json" --add-generation-prompt
expect_rc 0 "qwen3"
expect_out '<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n' "qwen3 generation prompt"
run "$BIN" template -m $FX/qwen3 --messages "$T/hello.json"
expect_rc 0 "qwen3 no prompt"
expect_out '<|im_start|>user\nHello!<|im_end|>\n' "qwen3 without generation prompt"
run "$BIN" template -m $FX/qwen3 --messages "$T/sys.json" --add-generation-prompt --var enable_thinking=false
expect_rc 0 "qwen3 enable_thinking"
expect_out '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' "qwen3 enable_thinking=false"
run "$BIN" template -m $FX/llama3_1 --messages "$T/sys.json" --add-generation-prompt
expect_rc 0 "llama3_1"
expect_out '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n' "llama3_1"
run "$BIN" template -m $FX/qwen3 --messages "$T/hello.json" --var 'tools=[{"type": "function", "function": {"name": "f", "description": "ü"}}]'
expect_rc 0 "qwen3 tools"
grep -q '^{"type": "function", "function": {"name": "f", "description": "ü"}}$' "$T/out" || fail "tools not rendered by tojson: $(cat "$T/out")"

# ---- --chat-template-file, --help ----
printf '{%% for m in messages %%}[{{ m.role }}:{{ m.content|upper }}]{%% endfor %%}{{ x + 1 }}\n' >"$T/t.jinja"
run "$BIN" template -m $T/gpt2 --messages "$T/hello.json" --chat-template-file "$T/t.jinja" --var x=41
expect_rc 0 "--chat-template-file"
expect_out '[user:HELLO!]42' "--chat-template-file"
run "$BIN" template --help
expect_rc 0 "--help"
grep -q -- "--messages" "$T/out" || fail "--help does not document --messages"

# ---- errors: one line, exit 1 ----
run "$BIN" template -m $T/gpt2 --messages "$T/hello.json"
expect_rc 1 "no template"
one_line_error "no template" "no chat template"
printf '{%% if true %%}\n{{ raise_exception("roles must\nalternate") }}{%% endif %%}' >"$T/raise.jinja"
run "$BIN" template -m $T/gpt2 --messages "$T/hello.json" --chat-template-file "$T/raise.jinja"
expect_rc 1 "raise_exception"
one_line_error "raise_exception" "line 2: roles must alternate"
printf 'ok\n{%% for x in %%}' >"$T/bad.jinja"
run "$BIN" template -m $T/gpt2 --messages "$T/hello.json" --chat-template-file "$T/bad.jinja"
expect_rc 1 "syntax error"
one_line_error "syntax error" "line 2"
printf '{%% macro f() %%}{{ f() }}{%% endmacro %%}{{ f() }}' >"$T/rec.jinja"
run "$BIN" template -m $T/gpt2 --messages "$T/hello.json" --chat-template-file "$T/rec.jinja"
expect_rc 1 "recursion"
one_line_error "recursion" "nesting deeper"
printf '[{"role": "user"' >"$T/trunc.json"
run "$BIN" template -m $FX/qwen3 --messages "$T/trunc.json"
expect_rc 1 "bad messages"
one_line_error "bad messages" "JSON array"
run "$BIN" template -m $FX/qwen3 --messages "$T/hello.json" --var 'x={'
expect_rc 1 "bad --var"
one_line_error "bad --var" "not valid JSON"
run "$BIN" template -m $FX/qwen3
[ "$rc" -ne 0 ] || fail "missing --messages accepted"

# ---- generate applies the template ----
M=tests/fixtures/models/phixtral-tiny
run "$BIN" template -m $M --messages "$T/hello.json" --add-generation-prompt
expect_rc 0 "template of $M"
cp "$T/out" "$T/rendered.txt"
run "$BIN" tokenize -m $M -f "$T/rendered.txt" --no-special
expect_rc 0 "tokenize rendered"
ids=$(cat "$T/out")
run "$BIN" generate -m $M --prompt-ids "$ids" -n 4 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generate from template ids"
cp "$T/out" "$T/want_ids"
for flag in --chat ""; do
    run "$BIN" generate -m $M -p 'Hello!' $flag -n 4 --temp 0 --ignore-eos --output-ids
    expect_rc 0 "generate $flag"
    cmp -s "$T/out" "$T/want_ids" || fail "generate $flag: $(cat "$T/out"), via template: $(cat "$T/want_ids")"
done
run "$BIN" generate -m $M -p 'Hello!' --no-chat -n 4 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generate --no-chat"
cmp -s "$T/out" "$T/want_ids" && fail "--no-chat still applied the template"
run "$BIN" generate -m $M -p 'Hello!' --system 'Be brief.' -n 4 --temp 0 --ignore-eos --output-ids
expect_rc 0 "generate --system"
cmp -s "$T/out" "$T/want_ids" && fail "--system did not change the prompt"
run "$BIN" generate -m $T/gpt2 -p 'Hello!' --chat -n 1
expect_rc 1 "generate --chat without a template"
one_line_error "generate --chat without a template" "no chat template"
run "$BIN" generate -m $M -p 'Hello!' --no-chat --system x -n 1
expect_rc 2 "--no-chat with --system"

# ---- template sources, in transformers' precedence ----
# chat_template.jinja wins over tokenizer_config.json's chat_template (it was the other way)
S="$T/src"
mkdir -p "$S"
printf '{"chat_template": "config:{{ messages[0].content }}"}' >"$S/tokenizer_config.json"
printf 'file:{{ messages[0].content }}' >"$S/chat_template.jinja"
run "$BIN" template -m "$S" --messages "$T/hello.json"
expect_rc 0 "jinja beside tokenizer_config.json"
expect_out 'file:Hello!' "chat_template.jinja must win over tokenizer_config.json"
# additional_chat_templates/tool_use.jinja renders when tools are given
mkdir "$S/additional_chat_templates"
printf 'tools:{{ tools | length }}' >"$S/additional_chat_templates/tool_use.jinja"
run "$BIN" template -m "$S" --messages "$T/hello.json"
expect_out 'file:Hello!' "default template without tools"
run "$BIN" template -m "$S" --messages "$T/hello.json" --var 'tools=[{"type": "function"}]'
expect_rc 0 "tool_use template"
expect_out 'tools:1' "additional_chat_templates/tool_use.jinja with tools"
# in a Hugging Face cache snapshot the subfolder's files link into blobs/: followed; a link
# out of the repository is refused
R="$T/hub/models--a--b"
mkdir -p "$R/blobs" "$R/snapshots/0a1b/additional_chat_templates"
printf 'blob-tool' >"$R/blobs/0123"
cp "$S/chat_template.jinja" "$R/snapshots/0a1b/"
ln -s ../../../blobs/0123 "$R/snapshots/0a1b/additional_chat_templates/tool_use.jinja"
run "$BIN" template -m "$R/snapshots/0a1b" --messages "$T/hello.json" --var 'tools=[]'
expect_rc 0 "snapshot subfolder link into blobs"
expect_out 'blob-tool' "snapshot's additional template"
printf 'secret' >"$T/outside.jinja"
ln -s "$T/outside.jinja" "$R/snapshots/0a1b/additional_chat_templates/rag.jinja"
run "$BIN" template -m "$R/snapshots/0a1b" --messages "$T/hello.json"
expect_rc 1 "link out of the repository"
one_line_error "link out of the repository" "rag.jinja"
echo "template: ok"
