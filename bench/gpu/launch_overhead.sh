#!/usr/bin/env bash
# Issue 8's GPU check: one GPU through `linearize launch --nproc-per-node 1` (NCCL process group,
# bucketed gradient all-reduce hooks, rank-0 checkpointing) against a plain run, same job:
# pretraining a SmolLM2-135M-shape teacher, batch 16 x 512, bf16 autocast. Runs alternate
# plain/launch/plain/launch; throughput is taken between step 10 and the last step, so start-up and
# the first steps do not count.
#   bench/gpu/launch_overhead.sh BUILD_DIR TOKENIZER TEXT WORK_DIR [STEPS]
set -euo pipefail
BUILD=$1 TOK=$2 DATA=$3 WORK=$4 STEPS=${5:-100}
BIN=$BUILD/linearize
JOB=(pretrain --tokenizer "$TOK" --data "$DATA" --hidden 576 --layers 30 --heads 9 --kv-heads 3
     --intermediate 1536 --seq-len 512 --batch 16 --steps "$STEPS" --device cuda --log-every 20)
mkdir -p "$WORK"
# Tokenize once so both runs read the same shard.
"$BIN" tokenize --tokenizer "$TOK" --input "$DATA" --output "$WORK/data.u32" >/dev/null
JOB[4]="$WORK/data.u32"
rate() {  # tokens/s between step 10 and the last step of a metrics.jsonl
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
a = next(r for r in rows if r["step"] == 10); b = rows[-1]
print((b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"]))
PY
}
for round in 1 2; do
  rm -rf "$WORK/plain" "$WORK/launch"
  "$BIN" "${JOB[@]}" --out "$WORK/plain" 2>"$WORK/plain.log"
  "$BIN" launch --nproc-per-node 1 -- "${JOB[@]}" --out "$WORK/launch" 2>"$WORK/launch.log"
  p=$(rate "$WORK/plain/metrics.jsonl"); l=$(rate "$WORK/launch/metrics.jsonl")
  echo "round $round: plain $p tok/s, launch $l tok/s, launch/plain $(python3 -c "print(round($l/$p,4))")"
done
grep -h "data parallel" "$WORK/launch.log" || true
