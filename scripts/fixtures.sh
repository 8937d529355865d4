#!/bin/sh
# Test fixtures are committed as one .tar.xz per folder (tests/fixtures/golden/<case>.tar.xz,
# tests/fixtures/models/<name>.tar.xz, models/<name>.tar.xz) to keep the tracked tree small;
# the build unpacks each beside its archive (the folders are ignored by git), so every path the
# tests name stays the same.
#
#   scripts/fixtures.sh unpack          unpack every archive whose folder is missing or older
#   scripts/fixtures.sh pack DIR...     replace folder DIR by DIR.tar.xz (reproducible: sorted
#                                       names, fixed owner and time) and unpack it again
set -eu
cd "$(dirname "$0")/.."
ROOTS="tests/fixtures/golden tests/fixtures/models models"

unpack_one() {
    a=$1
    d=${a%.tar.xz}
    stamp="$d/.unpacked"
    if [ -f "$stamp" ] && [ ! "$a" -nt "$stamp" ]; then
        return 0
    fi
    rm -rf "$d" "$d.tmp"
    mkdir -p "$d.tmp"
    if ! tar -C "$d.tmp" -xmJf "$a"; then
        rm -rf "$d.tmp"
        echo "fixtures: cannot unpack $a" >&2
        return 1
    fi
    base=$(basename "$d")
    if [ ! -d "$d.tmp/$base" ]; then
        rm -rf "$d.tmp"
        echo "fixtures: $a does not hold a folder named $base" >&2
        return 1
    fi
    mv "$d.tmp/$base" "$d"
    rm -rf "$d.tmp"
    touch "$stamp"
}

case "${1:-}" in
unpack)
    for r in $ROOTS; do
        for a in "$r"/*.tar.xz; do
            [ -e "$a" ] || continue
            unpack_one "$a"
        done
    done
    ;;
pack)
    shift
    [ $# -gt 0 ] || { echo "usage: scripts/fixtures.sh pack DIR..." >&2; exit 2; }
    for d in "$@"; do
        d=${d%/}
        [ -d "$d" ] || { echo "fixtures: $d is not a folder" >&2; exit 1; }
        rm -f "$d/.unpacked"
        parent=$(dirname "$d")
        base=$(basename "$d")
        (cd "$parent" && find "$base" -type f | LC_ALL=C sort |
            tar --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=a+rX,u+w,go-w \
                -cf - --no-recursion -T - | xz -9e -T1 -c >"$base.tar.xz.tmp")
        mv "$parent/$base.tar.xz.tmp" "$d.tar.xz"
        touch "$d/.unpacked"
        echo "fixtures: $d.tar.xz ($(wc -c <"$d.tar.xz") bytes)"
    done
    ;;
*)
    echo "usage: scripts/fixtures.sh unpack | pack DIR..." >&2
    exit 2
    ;;
esac
