#!/bin/sh
# scripts/fixtures.sh's splice recipes (a derived fixture made of committed parts and byte
# ranges of another fixture), in a scratch copy of the layout: a good recipe makes the file
# with its recorded SHA-256; a range that is not two decimal byte counts (missing, not digits,
# a leading zero the shell would read as octal) or that runs past its source fails with a
# message and leaves no file; a wrong SHA-256 fails.
# Usage (from the repo root): sh tests/cli/fixtures_splice.sh path/to/mlxcel (unused: a splice
# runs no binary)
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
fail() { echo "FAIL fixtures_splice: $*" >&2; exit 1; }

mkdir -p "$T/scripts" "$T/tests/fixtures/src" "$T/tests/fixtures/case" || exit 1
cp scripts/fixtures.sh "$T/scripts/" || exit 1
printf 0123456789 >"$T/tests/fixtures/src/w.bin"
printf HEAD >"$T/tests/fixtures/case/head.bin"
want=$(printf HEAD2345 | sha256sum | cut -d' ' -f1)

# recipe RANGE-ARGS SHA256
recipe() {
    printf 'via splice\nfrom tests/fixtures/src\nfile out.bin\nsha256 %s\npart head.bin\nrange w.bin %s\n' \
        "$2" "$1" >"$T/tests/fixtures/case.derive"
    rm -f "$T/tests/fixtures/case/out.bin"
}
run() { timeout 20 sh "$T/scripts/fixtures.sh" derive /bin/false >"$T/out" 2>"$T/err" </dev/null; rc=$?; }

recipe "2 4" "$want"
run
[ "$rc" -eq 0 ] || fail "a good recipe: exit $rc: $(cat "$T/err")"
[ "$(cat "$T/tests/fixtures/case/out.bin")" = HEAD2345 ] || fail "a good recipe made '$(cat "$T/tests/fixtures/case/out.bin")'"

for bad in "2" "x 4" "2 4x" "02 4" "2 04" "-1 4"; do
    recipe "$bad" "$want"
    run
    [ "$rc" -ne 0 ] || fail "range '$bad' was accepted"
    grep -q "not byte counts" "$T/err" || fail "range '$bad': $(cat "$T/err")"
    [ -e "$T/tests/fixtures/case/out.bin" ] && fail "range '$bad' left a file"
done

recipe "8 4" "$want"
run
[ "$rc" -ne 0 ] || fail "a range past its source was accepted"
grep -q "has 10 bytes, not 8 + 4" "$T/err" || fail "a range past its source: $(cat "$T/err")"

recipe "2 4" "$(printf other | sha256sum | cut -d' ' -f1)"
run
[ "$rc" -ne 0 ] || fail "a wrong SHA-256 was accepted"
grep -q "has SHA-256" "$T/err" || fail "a wrong SHA-256: $(cat "$T/err")"
[ -e "$T/tests/fixtures/case/out.bin" ] && fail "a wrong SHA-256 left a file"
echo "fixtures_splice: ok"
