#!/bin/sh
# Installs the Debian 12 packages mlxcel needs to build and test.
# Idempotent: packages already present are skipped without touching apt.
set -eu
PKGS="build-essential cmake pkg-config xz-utils clang libclang-rt-14-dev \
libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcmocka-dev libcurl4-openssl-dev \
libjpeg62-turbo-dev libpng-dev libwebp-dev libgif-dev nodejs chromium"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install-deps: installing$missing" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
# shellcheck disable=SC2086
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
