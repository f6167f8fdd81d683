#!/usr/bin/env bash
# Installs every Debian package linearize needs and builds it (CPU build, Debian 12's libtorch 1.13).
# Safe to run again: apt skips what is installed, the build is incremental.
#   LINEARIZE_BUILD_DIR   build folder (default: build)
#   LINEARIZE_SKIP_APT=1  skip the package step (for machines set up by hand)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libtorch-dev libopenblas-dev       # libtorch 1.13 (CPU); OpenBLAS or matrix products run 30x slower
  nlohmann-json3-dev libpcre2-dev libsentencepiece-dev
  libutf8proc-dev                    # Unicode NFC (tokenizers with an NFC normalizer, e.g. Qwen's)
  libbz2-dev                         # reading the HellaSwag .txt.bz2 evaluation file
  zlib1g-dev libzstd-dev             # .gz and .zst corpora (linearize tokenize)
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev                        # c10d's Gloo process group (data-parallel training on CPU)
  libcpp-httplib-dev                 # linearize serve (HTTP)
)

if [ "${LINEARIZE_SKIP_APT:-0}" != 1 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  echo "== installing Debian packages: ${PACKAGES[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi

BUILD_DIR=${LINEARIZE_BUILD_DIR:-build}
echo "== configuring ${BUILD_DIR}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
echo "== building (libtorch headers make the first build take several minutes on 2 cores)"
cmake --build "$BUILD_DIR" -j"$(nproc)"
echo "== built $BUILD_DIR/linearize"
