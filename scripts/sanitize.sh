#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer: builds build-sanitize/ with
# -DLINEARIZE_SANITIZE=ON and runs ctest there (the CUDA-labelled tests skip without a GPU). Any heap
# error, leak of our own code or undefined behaviour stops the test that hit it with both stacks. Needs
# the packages of scripts/setup.sh; the first build takes about as long as setup.sh's, the tests about
# three times their plain run.
#   scripts/sanitize.sh                 every CPU test
#   scripts/sanitize.sh -R 'Tokenizer|Data'   ctest arguments of your own
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${LINEARIZE_SANITIZE_DIR:-build-sanitize}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLINEARIZE_SANITIZE=ON > /dev/null
cmake --build "$dir" -j"$(nproc)" --target linearize linearize_tests
# libtorch is not instrumented: its own allocations are not ours to report (detect_leaks stays on for the
# rest); the CLI tests run the instrumented build/linearize of that folder.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:${LSAN_OPTIONS:-}"
cd "$dir"
[ $# -gt 0 ] || set -- --timeout 3000
ctest -LE cuda --output-on-failure -j"$(nproc)" "$@"
