#!/usr/bin/env bash
# One GPU-box session (see DEVELOPERS.md, "GPU box"): build against the box's PyTorch with the
# carried prefix of Debian -dev packages (.device/prefix), then run the steps named on the command
# line, each logging to $OUT/<step>.log:
#   tests        ctest -L cuda (the Cuda* suites) and the CPU/CUDA golden suites
#   bench-ops | bench-train | bench-decode | bench-quick   build-gpu/linearize_gpu_bench
#   bench-serve  build-gpu/linearize_serve_bench at the 135M shape (SERVE_ARGS replaces its load options)
#   whole-run    bench/gpu/whole_run.sh: `distill` (three stages) against `pretrain` of the same teacher, whole
#                commands, on WHOLE_TEXT (default the corpus's web_bible.txt); SHAPES, MIXER, GRAPH=1 pass through
#   profile-ops  per-kernel times (ncu) of `ops --quick ${OPS_ARGS}`, summed by kernel (bench/gpu/kernel_times.py)
#   profile-detail  ncu's throughput, occupancy and warp-state sections for the first four fused kernels
#                of `ops --quick ${OPS_ARGS}` (one forward+backward), with the headline lines printed
#   profile-source  ncu's warp-stall samples per CUDA source line for the kernels matching SOURCE_KERNELS
#                (default "ut_|delta_") in `ops --quick ${OPS_ARGS}`, summed by bench/gpu/source_hotspots.py
#   launch       bench/gpu/launch_overhead.sh (issue 8: launch with one GPU vs a plain run)
#   study        `linearize study ${STUDY_ARGS}` (default: --preset gpu on .device/shared/data, out
#                runs/study-gpu, --max-minutes ${STUDY_MINUTES:-8}); its results, teacher evaluations and
#                report packed into $OUT/study.tar.gz (run the step again to continue the study; on a new
#                machine, STUDY_RESUME=that tar.gz puts its results and teacher evaluations back first)
#   variants     kernel changes not yet on main, timed against the build they patch: for each patch in
#                ${VARIANTS:-.device/variants}/*.patch (made by scripts/export_variants.sh), apply it, rebuild,
#                run the tests of VARIANT_TESTS (a gtest filter, default the fused ops' Cuda tests; none: no
#                tests) and `ops ${OPS_ARGS}` (with VARIANT_PROFILE=1 also profile-ops; VARIANT_BENCH=train or
#                decode runs that bench instead, with its ARGS), then take it back out; the
#                unpatched build runs the same bench first (not with VARIANT_BASE=0). VARIANT_NAMES="a b" picks
#                some of the patches (one call has 10 minutes). Logs and tables in $OUT/variants/<name>.*; the
#                unpatched build is rebuilt at the end only when another step follows
# BUILD_TARGETS: what to build (default all; e.g. "linearize" when only the command line tool runs).
# e.g. scripts/gpu_session.sh tests bench-quick   (OPS_LIMIT, TRAIN_LIMIT, DECODE_LIMIT: seconds per bench;
# OPS_ARGS, TRAIN_ARGS, DECODE_ARGS: extra arguments of the ops, train and decode benches, e.g.
# OPS_ARGS="--head-dim 64 --only retnet+", TRAIN_ARGS="--shapes 1.7b --only linear_attention,retnet")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
P=$PWD/.device/prefix/usr
export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} TORCH_CUDA_ARCH_LIST=9.0a NCCL_NVLS_ENABLE=0
export LINEARIZE_SHARED=$PWD/.device/shared
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
start=$(date +%s)
if [ -f build-gpu/variant-files.txt ]; then
  sort -u build-gpu/variant-files.txt | while read -r f; do [ ! -e "$f" ] || touch "$f"; done
  rm -f build-gpu/variant-files.txt
fi
if ! { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
         -DCMAKE_CUDA_ARCHITECTURES=90a \
         -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)');$P" &&
       cmake --build build-gpu -j"$(nproc)" --target ${BUILD_TARGETS:-all}; } > "$OUT/build.log" 2>&1; then
  echo "build failed:"; grep -E "error|Error" "$OUT/build.log" | head -40; exit 1
fi
echo "built in $(( $(date +%s) - start )) s"

# The ops bench into $1.md (its progress into $1.log), and ncu's per-kernel times of one quick run into
# $1.csv, summed by kernel into $1.md (log appended to $2): the bench-ops and profile-ops steps, and each
# variant's.
ops_bench() {
  timeout ${OPS_LIMIT:-600} build-gpu/linearize_gpu_bench ops ${OPS_ARGS:-} > "$1.md" 2> "$1.log"; cat "$1.md"
}
train_bench() {
  timeout ${TRAIN_LIMIT:-600} build-gpu/linearize_gpu_bench train ${TRAIN_ARGS:-} > "$1.md" 2> "$1.log"; cat "$1.md"
}
decode_bench() {
  timeout ${DECODE_LIMIT:-600} build-gpu/linearize_gpu_bench decode ${DECODE_ARGS:-} > "$1.md" 2> "$1.log"; cat "$1.md"
}
ops_profile() {
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    build-gpu/linearize_gpu_bench ops --quick ${OPS_ARGS:-} > "$1.csv" 2>> "$2"
  python3 bench/gpu/kernel_times.py "$1.csv" > "$1.md"; cat "$1.md"
}

# One variant (or the base, with no patch): tests, the ops bench and optionally its profile, into $OUT/variants.
bench_variant() {
  local name=$1 dir=$OUT/variants
  mkdir -p "$dir"
  if [ "${VARIANT_TESTS:-}" != none ]; then
    build-gpu/linearize_tests --gtest_filter="${VARIANT_TESTS:-CudaOps.Fused*:CudaMixers.*}" \
      > "$dir/$name.tests.log" 2>&1
    echo "-- $name: $(grep -E '^\[  (PASSED|FAILED)  \]' "$dir/$name.tests.log" | tr '\n' ' ')"
  fi
  case ${VARIANT_BENCH:-ops} in
    ops) ops_bench "$dir/$name"
         [ "${VARIANT_PROFILE:-0}" != 1 ] || ops_profile "$dir/$name.profile" "$dir/$name.log" ;;
    train) train_bench "$dir/$name" ;;
    decode) decode_bench "$dir/$name" ;;
    *) echo "VARIANT_BENCH: expected ops, train or decode, got ${VARIANT_BENCH}"; return 1 ;;
  esac
}

# apply_patch check|apply|revert FILE on the working tree: git apply where git is, else patch.
apply_patch() {
  local -A git=([check]="--check" [apply]="" [revert]="-R") plain=([check]="--dry-run" [apply]="" [revert]="-R")
  if command -v git > /dev/null; then git apply ${git[$1]} "$2"; else patch -p1 -s ${plain[$1]} < "$2"; fi
}

run_variants() {
  local patches=(${VARIANTS:-.device/variants}/*.patch)
  [ -e "${patches[0]}" ] || { echo "no patches in ${VARIANTS:-.device/variants}"; return; }
  [ "${VARIANT_BASE:-1}" = 0 ] || bench_variant base
  for p in "${patches[@]}"; do
    local name
    name=$(basename "$p" .patch)
    if [ -n "${VARIANT_NAMES:-}" ] && [[ " ${VARIANT_NAMES//,/ } " != *" $name "* ]]; then continue; fi
    if ! apply_patch check "$p" 2> "$OUT/variant-$name.apply.log"; then
      echo "-- $name: does not apply"; cat "$OUT/variant-$name.apply.log"; continue
    fi
    apply_patch apply "$p"
    if cmake --build build-gpu -j"$(nproc)" > "$OUT/variant-$name.build.log" 2>&1; then
      bench_variant "$name"
    else
      echo "-- $name: build failed"; grep -E "error" "$OUT/variant-$name.build.log" | head -20
    fi
    apply_patch revert "$p"
    patch_files "$p" >> build-gpu/variant-files.txt
  done
}

# The files a patch changes. After a variant, build-gpu holds objects built from them as patched; the next
# call's copy of the working tree gives them back their older times, so the start of the script touches
# them (variant-files.txt) or the build would keep the variant's objects.
patch_files() { grep -E '^(\+\+\+|---) [ab]/' "$1" | sed -E 's#^(\+\+\+|---) [ab]/##' | sort -u; }
left=$#  # steps still to run, counting the current one
for step in "$@"; do
  t0=$(date +%s)
  left=$((left - 1))
  case $step in
    tests) (cd build-gpu && ctest -L cuda --output-on-failure -V) > "$OUT/tests.log" 2>&1
           build-gpu/linearize_tests --gtest_filter='OpsGolden.*:MixerGolden.*:LlamaGolden.*:Llama.*:Cuda*' \
             >> "$OUT/tests.log" 2>&1
           grep -E "^\[(cuda|golden|grouped)|tests passed|FAILED|PASSED|Failure|Expected|Which is" "$OUT/tests.log" |
             head -80 ;;
    bench-ops) ops_bench "$OUT/bench-ops" ;;
    bench-train) train_bench "$OUT/bench-train" ;;
    bench-decode) decode_bench "$OUT/bench-decode" ;;
    whole-run) L=build-gpu/linearize TEXT=${WHOLE_TEXT:-.device/shared/data/corpus/web_bible.txt} \
                 timeout ${WHOLE_LIMIT:-570} bash bench/gpu/whole_run.sh > "$OUT/whole-run.md" 2> "$OUT/whole-run.log"
               cat "$OUT/whole-run.md"; tail -3 "$OUT/whole-run.log" ;;
    bench-serve)
      timeout ${SERVE_LIMIT:-540} build-gpu/linearize_serve_bench --device cuda --shape 135m \
        ${SERVE_ARGS:---clients 1,16,64,256 --prompt-tokens 1024 --max-tokens 128 --requests 1 --memory-gib 64} \
        > "$OUT/bench-serve.md" 2> "$OUT/bench-serve.log"; cat "$OUT/bench-serve.md"; tail -3 "$OUT/bench-serve.log" ;;
    profile-ops) : > "$OUT/profile-ops.log"; ops_profile "$OUT/profile-ops" "$OUT/profile-ops.log" ;;
    profile-detail) ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
                      --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
                      --section ComputeWorkloadAnalysis -k regex:"vector_|delta_|ut_|chunk_" --launch-count 4 \
                      build-gpu/linearize_gpu_bench ops --quick ${OPS_ARGS:-} > "$OUT/profile-detail.txt" 2>&1
                    grep -E "^  void|Duration|DRAM Throughput  |L1/TEX Cache Throughput|Issue Slots Busy|Achieved Occupancy" \
                      "$OUT/profile-detail.txt" | sed -E 's/\(const T1.*//' ;;
    profile-source) ncu --clock-control none --section SourceCounters --section WarpStateStats --import-source yes \
                      -k regex:"${SOURCE_KERNELS:-ut_|delta_}" --launch-count ${SOURCE_LAUNCHES:-4} -f -o "$OUT/source" \
                      build-gpu/linearize_gpu_bench ops --quick ${OPS_ARGS:-} > "$OUT/profile-source.log" 2>&1
                    python3 bench/gpu/source_hotspots.py "$OUT/source.ncu-rep" > "$OUT/profile-source.md"; cat "$OUT/profile-source.md" ;;
    bench-quick) build-gpu/linearize_gpu_bench all --quick > "$OUT/bench-quick.md" 2> "$OUT/bench-quick.log"; cat "$OUT/bench-quick.md"; tail -5 "$OUT/bench-quick.log" ;;
    study) if [ -n "${STUDY_RESUME:-}" ] && [ ! -d runs/study-gpu/results ]; then  # results of an earlier machine
             mkdir -p runs/study-gpu && tar xzf "$STUDY_RESUME" -C runs/study-gpu results teachers; fi
           build-gpu/linearize study ${STUDY_ARGS:---preset gpu --base .device/shared/data --device cuda} \
             --out runs/study-gpu --max-minutes ${STUDY_MINUTES:-8} > "$OUT/study.log" 2>&1
           (cd runs/study-gpu && tar czf "$OUT/study.tar.gz" study.json $(ls -d results report teachers/*.eval.json 2> /dev/null))
           grep -E "^\[study\]|error" "$OUT/study.log" | tail -30 ;;
    launch) bench/gpu/launch_overhead.sh build-gpu .device/shared/data/tokenizers/smollm2-tokenizer.json \
              .device/shared/data/corpus/tinystories_val.txt /tmp/launch_work > "$OUT/launch.log" 2>&1; cat "$OUT/launch.log" | tail -8 ;;
    variants) run_variants  # then the unpatched build again, for the steps after it only (a call's time is short)
              [ "$left" = 0 ] || { cmake --build build-gpu -j"$(nproc)" > "$OUT/variants-rebuild.log" 2>&1 &&
                                  rm -f build-gpu/variant-files.txt; } ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
