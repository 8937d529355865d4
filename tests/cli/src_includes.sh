#!/bin/sh
# The library does not depend on the tests: no file under src/ includes one from tests/
# (issue 40; the family self-tests' temporary folders come from src/models/selftest.c).
# Usage (from the repo root): sh tests/cli/src_includes.sh [path/to/mlxcel, unused]
bad=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*/)?tests/' src)
[ -z "$bad" ] || { echo "FAIL src_includes: src/ includes from tests/:" >&2; echo "$bad" >&2; exit 1; }
echo "ok src_includes"
