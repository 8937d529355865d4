#!/bin/sh
# Builds emul_rec (the CUDA recurrent kernels on host threads, cuda_impl.h) and runs it.
# Usage, from the repository root after `cmake --build build`: dev/kernels/cuda_emul/run.sh [ssd|gdn]
set -eu
D=$(dirname "$0")
W=${TMPDIR:-/tmp}/cuda_emul.$$
mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
cp "$D/cuda_impl.h" "$W/"
for f in rec ssm gdn; do
  sed -e 's/extern __shared__/extern/' -e 's/__shared__/static/' "src/kernels/cuda/$f.cu" > "$W/$f.cc"
done
g++ -std=c++17 -O2 -Wall -Wno-unused-function -Wno-unknown-pragmas -I src -I "$W" -o "$W/emul_rec" "$D/emul_rec.cc" \
  "$D/emul_rt.cc" "$W/rec.cc" "$W/ssm.cc" "$W/gdn.cc" build/libmlxcel_lib.a -lpthread -lm \
  $(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd libcurl libjpeg libpng libwebp 2>/dev/null) -lgif -ldl
"$W/emul_rec" "$@"
