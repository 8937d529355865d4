#!/bin/sh
# The library's includes point down the layers only (issue 40):
#  - no file under src/ includes one from tests/ (the family self-tests' temporary folders
#    come from src/models/selftest.c, their calls into the engine from tests/stest_engine.c);
#  - a file under src/<layer>/ includes nothing from a higher layer, nor from a layer beside
#    its own. The order is docs/architecture.md's "cli → server → engine → models → loading
#    → kernels → core", with tokenizer, template and image beside models (needing only core), grammar
#    (tokenizer and the engine's constraint interface) under server, hub (core) under cli.
#    A folder of src/ missing from the table below fails, so a new layer gets placed.
# Usage (from the repo root): sh tests/cli/src_includes.sh [path/to/mlxcel, unused]
bad=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*/)?tests/' src)
[ -z "$bad" ] || { echo "FAIL src_includes: src/ includes from tests/:" >&2; echo "$bad" >&2; exit 1; }

# rank of each layer: a file may include its own layer's headers and a lower rank's only
layers="core:0 kernels:1 loading:2 models:3 tokenizer:3 template:3 image:3 engine:4 grammar:5 hub:5 server:6 cli:7"
bad=$(find src -type f | sort | while IFS= read -r f; do
        grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | sed "s|^|$f:|"
    done | awk -v layers="$layers" '
    BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) { split(l[i], kv, ":"); rank[kv[1]] = kv[2] } }
    {
        # file:line:#include "path"  ->  the include resolved against the file'"'"'s folder
        split($0, part, ":"); file = part[1]; line = part[2]
        inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
        nf = split(file, fc, "/"); from = fc[2]
        if (!(from in rank)) { print file ": src/" from " is not in the layer table"; next }
        path = ""; for (i = 1; i < nf; i++) path = path fc[i] "/"
        np = split(path inc, pc, "/"); k = 0
        for (i = 1; i <= np; i++) {
            if (pc[i] == "" || pc[i] == ".") continue
            if (pc[i] == "..") { if (k > 0) k--; continue }
            out[++k] = pc[i]
        }
        if (k < 3 || out[1] != "src" || !(out[2] in rank)) next   # a system or vendored header
        to = out[2]
        if (to != from && rank[to] >= rank[from])
            print file ":" line ": " from " includes " inc " (" to " is not below " from ")"
    }')
[ -z "$bad" ] || { echo "FAIL src_includes: an include runs up the layers (docs/architecture.md):" >&2
                   echo "$bad" >&2; exit 1; }
echo "ok src_includes"
