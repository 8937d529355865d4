#!/bin/sh
# `mlxcel serve` driven from outside: the node:test suites in tests/server
# (*.test.mjs) start the server on an ephemeral port of 127.0.0.1 and check the
# OpenAI-compatible API through the official `openai` npm client and raw
# HTTP: response shapes, streaming, stop strings, sampling, logprobs, errors
# and their JSON shape, limits (--max-body, --max-queue, --api-key),
# concurrency, aborts, shutdown, a bounded hostile-request fuzzer, and the chat
# page (GET /) in headless chromium (playwright-core; MLXCEL_SKIP_BROWSER=1
# skips that part). Every server must exit 0 on SIGTERM with no sanitizer
# report on its stderr.
# The clients are pinned in tests/server/package-lock.json; `npm ci` runs when
# tests/server/node_modules is missing or older than the lock (a stamp file).
# Env: MLXCEL_FUZZ_REQUESTS (default 1500), MLXCEL_FUZZ_SEED (replay a run).
# Usage (from the repo root): sh tests/cli/server.sh path/to/mlxcel
BIN=${1:?usage: server.sh path/to/mlxcel}
fail() { echo "FAIL server: $*" >&2; exit 1; }
[ -x "$BIN" ] || fail "$BIN is not executable"
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN ;; esac
[ -f tests/server/package-lock.json ] || fail "run from the repo root (no tests/server/package-lock.json)"
command -v node >/dev/null 2>&1 || fail "node is not installed (Node >= 20 is needed for tests/server)"
command -v npm >/dev/null 2>&1 || fail "npm is not installed (needed to install tests/server's pinned openai client)"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || fail "cannot run node"
[ "$major" -ge 20 ] 2>/dev/null || fail "node $(node --version) is too old (Node >= 20 is needed)"

"$BIN" serve --help 2>&1 | grep -q "unknown command 'serve'" &&
    fail "$BIN has no \`serve\` command (a build from before the server?)"

STAMP=tests/server/node_modules/.mlxcel-npm-ci.stamp
if [ ! -f "$STAMP" ] || [ -n "$(find tests/server/package-lock.json tests/server/package.json -newer "$STAMP" 2>/dev/null)" ]; then
    echo "server: npm ci in tests/server" >&2
    (cd tests/server && npm ci --no-audit --no-fund >&2) ||
        fail "npm ci in tests/server failed (is the npm registry reachable?)"
    touch "$STAMP" || fail "cannot write $STAMP"
fi

MLXCEL_BIN=$BIN node --test --test-concurrency=1 tests/server/*.test.mjs || fail "node --test tests/server/*.test.mjs"
echo "ok server"
