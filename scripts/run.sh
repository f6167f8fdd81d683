#!/usr/bin/env bash
# Installs, builds and runs the main job on its built-in default: `linearize demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${LINEARIZE_BUILD_DIR:-build}/linearize" demo "$@"
