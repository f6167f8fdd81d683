#!/usr/bin/env bash
# Crash consistency of training runs: kill -9 a small `distill` at random moments, resume it each time,
# and check that the finished student is bit-identical to an uninterrupted run, that metrics.jsonl has one
# row per step, and that no command ever accepts a half-written folder.
#   bash scripts/kill_resume.sh [KILLS]        (default 20; LINEARIZE=path/to/linearize, WORK=folder)
# Each kill lands 0.2-2.5 s into a (re)started run, which checkpoints every step, so kills fall inside
# checkpoint writes as well as between them. Exit status 0 only when every check passed.
set -euo pipefail
KILLS=${1:-20}
L=${LINEARIZE:-build/linearize}
WORK=${WORK:-$(mktemp -d /tmp/linearize_kill.XXXXXX)}
[ -x "$L" ] || { echo "no $L: build first (bash scripts/test.sh)"; exit 1; }
mkdir -p "$WORK"
log() { echo "[kill-resume] $*"; }

# A tiny teacher and its data, made once.
if [ ! -f "$WORK/teacher/model.safetensors" ]; then
  python3 - "$WORK/corpus.txt" <<'EOF' 2> /dev/null || for i in $(seq 1 3000); do echo "the cat $i sat on the mat and the dog $((i * 7 % 100)) ran to the log."; done > "$WORK/corpus.txt"
import sys
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        f.write(f"the cat {i} sat on the mat and the dog {i * 7 % 100} ran to the log.\n")
EOF
  "$L" tokenizer train --input "$WORK/corpus.txt" --vocab 300 --out "$WORK/tok" > /dev/null 2>&1
  "$L" pretrain --tokenizer "$WORK/tok" --data "$WORK/corpus.txt" --out "$WORK/teacher" --hidden 32 --layers 2 \
    --heads 2 --kv-heads 1 --seq-len 64 --batch 4 --steps 30 --quiet > /dev/null 2>&1
fi
ARGS=(distill --teacher "$WORK/teacher" --mixer gated_deltanet --data "$WORK/corpus.txt" --seq-len 64 --batch 4
      --tokens 200000 --checkpoint-every 1 --quiet)

log "reference run (uninterrupted)"
rm -rf "$WORK/ref"
start=$(date +%s.%N)
"$L" "${ARGS[@]}" --out "$WORK/ref" > /dev/null 2>&1
ref_seconds=$(echo "$(date +%s.%N) - $start" | bc)
log "reference took ${ref_seconds}s"

rm -rf "$WORK/run"
kills=0 resumes=0 refused_partial=0 accepted_partial=0
first=1
while :; do
  extra=()
  [ "$first" = 1 ] || extra=(--resume)
  "$L" "${ARGS[@]}" --out "$WORK/run" "${extra[@]}" > "$WORK/last.log" 2>&1 &
  pid=$!
  if [ "$kills" -lt "$KILLS" ]; then
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.2 + rand() * 2.3 }')"
    if kill -9 "$pid" 2> /dev/null; then
      wait "$pid" 2> /dev/null || true
      kills=$((kills + 1))
      first=0
      # The killed folder is either a finished model or refused by a reader, never loaded half-written.
      if out=$("$L" info --model "$WORK/run" 2>&1); then
        if [ -f "$WORK/run/model.safetensors" ] && [ -f "$WORK/run/config.json" ]; then :; else accepted_partial=$((accepted_partial + 1)); log "info accepted a partial folder: $out"; fi
      else
        refused_partial=$((refused_partial + 1))
      fi
      continue
    fi
  fi
  wait "$pid" || { log "run failed:"; tail -5 "$WORK/last.log"; exit 1; }
  resumes=$((resumes + 1))
  break
done
log "$kills kills, then a run to the end; a reader refused the killed folder $refused_partial times"

fail=0
if cmp -s "$WORK/ref/model.safetensors" "$WORK/run/model.safetensors"; then
  log "model.safetensors: bit-identical to the uninterrupted run"
else
  log "model.safetensors DIFFERS from the uninterrupted run"; fail=1
fi
if cmp -s "$WORK/ref/config.json" "$WORK/run/config.json"; then log "config.json: identical"; else log "config.json DIFFERS"; fail=1; fi
rows_ref=$(wc -l < "$WORK/ref/metrics.jsonl")
rows_run=$(wc -l < "$WORK/run/metrics.jsonl")
dups=$(python3 -c "
import json,sys,collections
c=collections.Counter((r['stage'],r['step']) for r in map(json.loads, open(sys.argv[1])))
print(sum(1 for v in c.values() if v>1))" "$WORK/run/metrics.jsonl" 2> /dev/null || echo "?")
log "metrics.jsonl: $rows_run rows (reference $rows_ref), $dups duplicated steps"
[ "$rows_ref" = "$rows_run" ] && [ "$dups" = 0 ] || fail=1
left=$(find "$WORK/run" -name '*.tmp*' -o -name '*.partial' | wc -l)
log "temporary files left in the run folder: $left"
[ "$left" = 0 ] || fail=1
[ "$accepted_partial" = 0 ] || fail=1
[ "$fail" = 0 ] && log "PASS" || log "FAIL"
exit "$fail"
