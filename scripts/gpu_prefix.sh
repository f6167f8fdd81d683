#!/usr/bin/env bash
# Makes .device/ (git-ignored) for a GPU machine that lacks Debian's -dev packages and ../shared
# (DEVELOPERS.md, "GPU box"): the packages a GPU build needs, unpacked into .device/prefix, and the data
# the GPU tests, benches and studies read, copied into .device/shared. Run on a Debian 12 machine from
# anywhere in the checkout; about 50 MiB. LINEARIZE_SHARED: where ../shared is (default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${LINEARIZE_SHARED:-../shared}
[ -d "$SHARED/data" ] || { echo "gpu_prefix: no $SHARED/data (set LINEARIZE_SHARED)"; exit 1; }
debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
(cd "$debs" && apt-get download -qq nlohmann-json3-dev libpcre2-dev libpcre2-8-0 libgtest-dev libgmock-dev \
  libsentencepiece-dev libsentencepiece0 libbenchmark-dev libbenchmark1debian libbz2-dev libbz2-1.0 \
  libutf8proc-dev libutf8proc2 zlib1g-dev libzstd-dev libzstd1 \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1)
mkdir -p .device/prefix
for f in "$debs"/*.deb; do dpkg -x "$f" .device/prefix; done
# What the build neither links nor reads: static archives of the shared libraries, documentation.
lib=.device/prefix/usr/lib/x86_64-linux-gnu
rm -f "$lib"/libcrypto.a "$lib"/libssl.a "$lib"/libpcre2-*.a "$lib"/libzstd.a "$lib"/libz.a "$lib"/libbz2.a \
  "$lib"/libutf8proc.a "$lib"/libsentencepiece*.a "$lib"/libbrotli*.a
rm -rf .device/prefix/usr/share/doc .device/prefix/usr/share/man
mkdir -p .device/shared/data/models
cp -r "$SHARED/golden" .device/shared/
cp -r "$SHARED/data/corpus" "$SHARED/data/heldout" "$SHARED/data/tokenizers" .device/shared/data/
cp -r "$SHARED/data/models/stories260K" .device/shared/data/models/
du -sh .device
