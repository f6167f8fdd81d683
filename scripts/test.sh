#!/usr/bin/env bash
# Installs, builds and runs the test suite (ctest). Tests that need ../shared skip with a message
# when it is absent. Extra arguments go to ctest (e.g. -R Llama, -L cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd "${LINEARIZE_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" --timeout 1500 "$@"
