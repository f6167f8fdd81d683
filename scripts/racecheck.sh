#!/usr/bin/env bash
# The CUDA kernels' race check without a GPU: builds the tests in build-racecheck/ with the kernels on the
# CPU emulator under ThreadSanitizer (-DLINEARIZE_RACECHECK=ON, see src/ops/cuda/emulation/simt.cpp) and
# runs the kernel tests; TSan stops at the first data race it sees (two threads' accesses to one address,
# one a write, that no __syncthreads or warp collective orders) and prints both stacks. Needs the packages
# of scripts/setup.sh. The first build takes about as long as setup.sh's.
#   scripts/racecheck.sh                      every kernel test
#   scripts/racecheck.sh 'CudaOps.FusedDeltaWalk*'   a gtest filter of your own
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${LINEARIZE_RACECHECK_DIR:-build-racecheck}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLINEARIZE_RACECHECK=ON >/dev/null
cmake --build "$dir" -j"$(nproc)" --target linearize_tests
filter=${1:-'CudaOps.*:CudaMixers.DecodeMatchesForwardAndCpu:CudaOpsGolden.*:Simt.*'}
OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" "$dir/linearize_tests" --gtest_filter="$filter"
