#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input with libFuzzer (Debian's clang) under ASan + UBSan: safetensors
# files and shard indexes, config.json, tokenizer.json, jsonl/SFT records, ChatML
# text, token datasets (index.json + shard) and study files. Seeds come from ../shared/golden and
# ../shared/data (LINEARIZE_SHARED elsewhere) plus small hand-made files; findings land in
# build-fuzz/findings/<target>/ (copy each into tests/fuzz_regressions/<target>/ once fixed: the normal
# tests replay that folder).
#   scripts/fuzz.sh [RUNS] [TARGETS...]   default: 1000000 executions of every target
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-1000000}
shift || true
dir=${LINEARIZE_FUZZ_DIR:-build-fuzz}
shared=${LINEARIZE_SHARED:-../shared}
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DLINEARIZE_FUZZ=ON > /dev/null
cmake --build "$dir" -j"$(nproc)" > "$dir/build.log" || { tail -20 "$dir/build.log"; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors weights_index config tokenizer_json jsonl chatml token_dataset study)

seed() {  # seed DIR FILES...: copies the files that exist, small ones only (libFuzzer's -max_len)
  local d=$1; shift; mkdir -p "$d"
  for f in "$@"; do [ -f "$f" ] && [ "$(stat -c %s "$f")" -le 262144 ] && cp "$f" "$d/$(echo "$f" | tr '/' '_')" || true; done
}
corpus=$dir/corpus
seed "$corpus/safetensors" $(find "$shared/golden" "$shared/data" -name '*.safetensors' 2> /dev/null | head -20)
seed "$corpus/weights_index" $(find "$shared" -name 'model.safetensors.index.json' 2> /dev/null | head -5)
echo '{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}' > "$corpus/weights_index/hand.json"
seed "$corpus/config" $(find "$shared/golden" "$shared/data" -name 'config.json' 2> /dev/null | head -20)
seed "$corpus/tokenizer_json" $(find "$shared/golden" "$shared/data" -name 'tokenizer.json' 2> /dev/null | head -10)
seed "$corpus/jsonl" $(find "$shared/data" -name '*.jsonl' -size -256k 2> /dev/null | head -10)
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}' \
  '{"instruction": "add", "input": "1 2", "output": "3"}' > "$corpus/jsonl/hand.jsonl"
mkdir -p "$corpus/chatml" "$corpus/token_dataset" "$corpus/study"
printf '<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n' \
  > "$corpus/chatml/hand.txt"
python3 - "$corpus/token_dataset/hand.bin" <<'PY'
import json, struct, sys
index = json.dumps({"format": "linearize-tokens", "version": 1, "dtype": "u32",
                    "shards": [{"file": "shard-00000.u32", "tokens": 4}], "tokens": 4}).encode()
index = index + b" " * (-len(index) % 4)
open(sys.argv[1], "wb").write(bytes([len(index) // 4]) + index + struct.pack("<4I", 1, 2, 3, 0))
PY
build/linearize study --preset mini --write "$corpus/study/mini.json" > /dev/null 2>&1 ||
  echo '{"name": "s", "teachers": [{"name": "t", "pretrain": {"hidden": 32}}], "mixers": ["gla"], "budgets": [1000]}' \
    > "$corpus/study/hand.json"

status=0
for t in "${targets[@]}"; do
  mkdir -p "$corpus/$t" "$dir/findings/$t"
  echo "== fuzz_$t: $RUNS runs"
  if ! "$dir/fuzz/fuzz_$t" "$corpus/$t" -runs="$RUNS" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
       -artifact_prefix="$dir/findings/$t/" -print_final_stats=1 > "$dir/fuzz_$t.log" 2>&1; then
    status=1
    echo "   FINDING (see $dir/fuzz_$t.log and $dir/findings/$t/):"; grep -E "ERROR|SUMMARY|==.*==" "$dir/fuzz_$t.log" | head -5
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$dir/fuzz_$t.log" | tr '\n' ' '; echo
done
exit $status
