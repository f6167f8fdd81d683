#!/usr/bin/env bash
# Installs, builds and runs the test suite (ctest). Tests that need ../shared skip with a message
# when it is absent. Extra arguments go to ctest (e.g. -R Llama, -L cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${LINEARIZE_BUILD_DIR:-build}
# The official `openai` npm client for the serve tests (ServeHttp.OfficialOpenAiNodeClient): Node from
# Debian, the package (no dependencies of its own) from npm into $BUILD_DIR/npm. Without them that test skips.
if [ "${LINEARIZE_SKIP_APT:-0}" != 1 ] && ! { command -v node && command -v npm; } >/dev/null; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  echo "== installing nodejs and npm (the serve tests' OpenAI client)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null || true
fi
if command -v npm >/dev/null && [ ! -f "$BUILD_DIR/npm/node_modules/openai/package.json" ]; then
  echo "== installing the openai npm package into $BUILD_DIR/npm"
  mkdir -p "$BUILD_DIR/npm"
  (cd "$BUILD_DIR/npm" && npm install --no-audit --no-fund --no-save --prefix . openai@5.23.2 >/dev/null 2>&1) ||
    echo "   (npm install failed: ServeHttp.OfficialOpenAiNodeClient will skip)"
fi
cd "$BUILD_DIR"
ctest --output-on-failure -j"$(nproc)" --timeout 1500 "$@"
