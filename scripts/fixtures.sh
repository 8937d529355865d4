#!/bin/sh
# Test fixtures are committed as one .tar.xz per folder (tests/fixtures/golden/<case>.tar.xz,
# tests/fixtures/models/<name>.tar.xz, tests/fixtures/tokenizers/<name>.tar.xz, models/<name>.tar.xz,
# and tests/fixtures/images.tar.xz and gen.tar.xz: the test images and the golden generators,
# many small files that took a 4 KiB block each) to keep the tracked tree small;
# the build unpacks each beside its archive (the folders are ignored by git), so every path the
# tests name stays the same.
#
#   scripts/fixtures.sh unpack          unpack every archive whose folder is missing or older
#   scripts/fixtures.sh pack DIR...     replace folder DIR by DIR.tar.xz (reproducible: sorted
#                                       names, fixed owner and time) and unpack it again
#   scripts/fixtures.sh recompress      re-compress every archive as pack does (same contents)
#   scripts/fixtures.sh derive MLXCEL   make the files that DIR.derive recipes describe with the
#                                       built mlxcel and check each against its recorded SHA-256
#
# A recipe DIR.derive names one file of the unpacked DIR that is not committed because it is
# made byte for byte from another fixture (lines "via convert|copy|splice", "from FOLDER",
# "args CONVERT-ARGS", "file NAME", "sha256 HEX"): via convert, `mlxcel convert -m FOLDER -o TMP
# ARGS` must give TMP/NAME (so the conversion's byte-exactness is checked on every build); via
# copy, FOLDER/NAME is the same file (a golden case on another case's checkpoint); via splice,
# the file is the concatenation, in the recipe's order, of "part FILE" lines (a committed file
# of DIR, e.g. a checkpoint's header and the tensors only it has) and "range NAME OFFSET LENGTH"
# lines (bytes of FOLDER/NAME: the tensors it shares with another case's checkpoint). Either
# way the result must have exactly that SHA-256, else the build fails. Splices are made first,
# so a copy may take a spliced file.
set -eu
cd "$(dirname "$0")/.."
ROOTS="tests/fixtures tests/fixtures/golden tests/fixtures/models tests/fixtures/quant tests/fixtures/tokenizers models"

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

# xz -9e of $1 into $2, with the LZMA2 literal/position settings that suit bf16 / f32 weights
# (2-byte aligned data: lp=1 pb=1, 5-6 % smaller) when they make it smaller than the default.
xz_smallest() {
    xz -9e -T1 -c "$1" >"$2"
    for o in preset=9e,lc=1,lp=1,pb=1 preset=9e,lc=2,lp=1,pb=1; do
        xz --lzma2=$o -T1 -c "$1" >"$2.try"
        if [ "$(wc -c <"$2.try")" -lt "$(wc -c <"$2")" ]; then mv "$2.try" "$2"; else rm -f "$2.try"; fi
    done
}

# Re-compress every archive's tar stream as pack would (the contents byte for byte the same).
recompress_all() {
    for r in $ROOTS; do
        for a in "$r"/*.tar.xz; do
            [ -e "$a" ] || continue
            xz -dc "$a" >"$a.tar"
            xz_smallest "$a.tar" "$a.new"
            rm -f "$a.tar"
            if [ "$(wc -c <"$a.new")" -lt "$(wc -c <"$a")" ]; then
                touch -r "$a" "$a.new"   # the same contents: the unpacked folder stays current
                mv "$a.new" "$a"
            else
                rm -f "$a.new"
            fi
        done
    done
}

sha256_of() { sha256sum <"$1" | cut -d' ' -f1; }

# splice DIR FROM SEGMENTS: the "part FILE" and "range NAME OFFSET LENGTH" lines of SEGMENTS in
# order, to standard output
splice() {
    printf '%s\n' "$3" | while read -r kind a b c; do
        case $kind in
        '') ;;
        part) cat "$1/$a" || exit 1 ;;
        range)
            # each a decimal count (no leading zero: the shell's arithmetic would read it as octal)
            for v in "$b" "$c"; do
                case $v in '' | *[!0-9]* | 0?*) echo "fixtures: range $a '$b' '$c': not byte counts" >&2; exit 1 ;; esac
            done
            n=$(wc -c <"$2/$a") || exit 1
            [ "$((b + c))" -le "$n" ] || { echo "fixtures: $2/$a has $n bytes, not $b + $c" >&2; exit 1; }
            tail -c +"$((b + 1))" "$2/$a" | head -c "$c"
            ;;
        esac
    done
}

# derive_one RECIPE MLXCEL [PASS]: PASS splice makes splices only, other skips them
derive_one() {
    r=$1 bin=$2 pass=${3:-}
    d=${r%.derive}
    via= from= args= file= sum= segs=
    while read -r k v; do
        case $k in
        via) via=$v ;; from) from=$v ;; args) args=$v ;; file) file=$v ;; sha256) sum=$v ;;
        part | range) segs="$segs
$k $v" ;;
        '' | '#'*) ;;
        *) echo "fixtures: $r: unknown key '$k'" >&2; return 1 ;;
        esac
    done <"$r"
    case $via in
    convert | copy | splice) ;;
    *) echo "fixtures: $r lacks a via line (convert, copy or splice)" >&2; return 1 ;;
    esac
    if [ -z "$from" ] || [ -z "$file" ] || [ -z "$sum" ] || { [ "$via" = splice ] && [ -z "$segs" ]; }; then
        echo "fixtures: $r lacks a from, file or sha256 line (or, via splice, part / range lines)" >&2
        return 1
    fi
    { [ "$pass" = splice ] && [ "$via" = splice ]; } || { [ "$pass" != splice ] && [ "$via" != splice ]; } || return 0
    [ -d "$d" ] || { echo "fixtures: $d is missing (scripts/fixtures.sh unpack first)" >&2; return 1; }
    if [ -f "$d/$file" ] && [ "$(sha256_of "$d/$file")" = "$sum" ]; then
        return 0
    fi
    t="$d.derive.$$"
    rm -rf "$t"
    if [ "$via" = copy ]; then
        mkdir -p "$t" && cp "$from/$file" "$t/$file" ||
            { rm -rf "$t"; echo "fixtures: cannot copy $from/$file" >&2; return 1; }
    elif [ "$via" = splice ]; then
        mkdir -p "$t" && splice "$d" "$from" "$segs" >"$t/$file" ||
            { rm -rf "$t"; echo "fixtures: cannot splice $file from $d's parts and $from" >&2; return 1; }
    # shellcheck disable=SC2086 # args is a list of convert flags
    elif ! "$bin" convert -m "$from" -o "$t" $args >/dev/null; then
        rm -rf "$t"
        echo "fixtures: $bin convert -m $from $args failed" >&2
        return 1
    fi
    got=$(sha256_of "$t/$file")
    if [ "$got" != "$sum" ]; then
        rm -rf "$t"
        echo "fixtures: $file made by $via from $from has SHA-256 $got, not $sum (the recorded" \
            "file's): for convert, the conversion is no longer byte-exact" >&2
        return 1
    fi
    mv "$t/$file" "$d/$file"
    rm -rf "$t"
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
        # a file a recipe derives is not packed (the build makes it)
        skip=
        [ -f "$d.derive" ] && skip=$(sed -n 's/^file[[:space:]]*//p' "$d.derive")
        (cd "$parent" && find "$base" -type f | { if [ -n "$skip" ]; then grep -vxF "$base/$skip"; else cat; fi; } |
            LC_ALL=C sort |
            tar --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=a+rX,u+w,go-w \
                -cf - --no-recursion -T - >"$base.tar.tmp")
        xz_smallest "$parent/$base.tar.tmp" "$parent/$base.tar.xz.tmp"
        rm -f "$parent/$base.tar.tmp"
        mv "$parent/$base.tar.xz.tmp" "$d.tar.xz"
        touch "$d/.unpacked"
        echo "fixtures: $d.tar.xz ($(wc -c <"$d.tar.xz") bytes)"
    done
    ;;
recompress)
    recompress_all
    ;;
derive)
    bin=${2:?usage: scripts/fixtures.sh derive path/to/mlxcel}
    for pass in splice other; do
        for r in $ROOTS; do
            for f in "$r"/*.derive; do
                [ -e "$f" ] || continue
                derive_one "$f" "$bin" "$pass"
            done
        done
    done
    ;;
*)
    echo "usage: scripts/fixtures.sh unpack | pack DIR... | derive MLXCEL | recompress" >&2
    exit 2
    ;;
esac
