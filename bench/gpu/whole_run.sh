#!/usr/bin/env bash
# Whole-run throughput: what a user pays for a distillation against pretraining the same teacher.
# For each shape, a teacher of that shape is pretrained for a few steps (the baseline tokens/s), then
# `linearize distill` runs all three stages on real text with the teacher in bf16; one Markdown row each:
# tokens, seconds of the whole command (loading and saving included), tokens/s of the command and of its
# training loops, and the ratio to pretraining. With GRAPH=1 each run is repeated with --cuda-graph.
#
#   L=build-gpu/linearize TEXT=corpus.txt bash bench/gpu/whole_run.sh > whole.md
#   SHAPES="135m 1.7b" MIXER=gated_deltanet TOKENS_135M=8000000 TOKENS_1_7B=2000000 GRAPH=1 DEVICE=cuda
#   SHAPES=tiny DEVICE=cpu  (a check that it runs)
#
# The tokenizer is a BPE of VOCAB (default 8192) tokens trained on TEXT, so the shapes are SmolLM2's but
# for the vocabulary (49152 there), which makes the embedding and LM head smaller.
set -euo pipefail
L=${L:-build-gpu/linearize}
TEXT=${TEXT:?give TEXT=a .txt file of real text}
DEVICE=${DEVICE:-cuda}
SHAPES=${SHAPES:-135m 1.7b}
MIXER=${MIXER:-gated_deltanet}
VOCAB=${VOCAB:-8192}
WORK=${WORK:-/tmp/whole_run}
mkdir -p "$WORK"

# hidden layers heads kv-heads intermediate batch seq-len pretrain-steps distill-tokens
shape_args() {
  case $1 in
    135m) echo "576 30 9 3 1536 16 512 100 ${TOKENS_135M:-8000000}" ;;
    1.7b) echo "2048 24 32 32 8192 8 512 30 ${TOKENS_1_7B:-2000000}" ;;
    tiny) echo "64 2 4 2 128 4 64 20 40000" ;;
    *) echo "unknown shape $1 (135m, 1.7b or tiny)" >&2; exit 2 ;;
  esac
}

# tokens, training seconds (the loops' own elapsed time, summed over stages) of a run folder's metrics.jsonl
loop_figures() {
  python3 - "$1" <<'EOF'
import json, sys
last = {}
for line in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(line)
    last[r["stage"]] = r
print(sum(r["tokens"] for r in last.values()), sum(r["elapsed_s"] for r in last.values()))
EOF
}

[ -f "$WORK/tok/tokenizer.json" ] || $L tokenizer train --input "$TEXT" --vocab "$VOCAB" --out "$WORK/tok" --quiet
echo "| shape | run | tokens | seconds | tokens/s (command) | tokens/s (training loops) | ratio to pretraining |"
echo "|---|---|---:|---:|---:|---:|---:|"
for shape in $SHAPES; do
  read -r hidden layers heads kv inter batch seq steps tokens <<< "$(shape_args "$shape")"
  flags=("")
  [ "${GRAPH:-0}" = 1 ] && flags+=("--cuda-graph")
  for flag in "${flags[@]}"; do
    tag=${flag:+ $flag}
    teacher="$WORK/teacher-$shape${flag:+-graph}"
    rm -rf "$teacher"
    t0=$(date +%s.%N)
    $L pretrain --tokenizer "$WORK/tok" --data "$TEXT" --out "$teacher" --hidden "$hidden" --layers "$layers" \
      --heads "$heads" --kv-heads "$kv" --intermediate "$inter" --batch "$batch" --seq-len "$seq" --steps "$steps" \
      --device "$DEVICE" --quiet $flag
    t1=$(date +%s.%N)
    read -r p_tokens p_loop <<< "$(loop_figures "$teacher")"
    p_rate=$(python3 -c "print($p_tokens / $p_loop)")
    python3 -c "print(f'| $shape | pretrain$tag | {$p_tokens} | {$t1 - $t0:.1f} | {$p_tokens / ($t1 - $t0):.0f} | {$p_rate:.0f} | 1.00 |')"
    student="$WORK/student-$shape${flag:+-graph}"
    rm -rf "$student"
    t0=$(date +%s.%N)
    $L distill --teacher "$teacher" --mixer "$MIXER" --data "$TEXT" --out "$student" --tokens "$tokens" \
      --batch "$batch" --seq-len "$seq" --device "$DEVICE" --quiet $flag
    t1=$(date +%s.%N)
    read -r d_tokens d_loop <<< "$(loop_figures "$student")"
    python3 -c "print(f'| $shape | distill $MIXER$tag | {$d_tokens} | {$t1 - $t0:.1f} | {$d_tokens / ($t1 - $t0):.0f} | {$d_tokens / $d_loop:.0f} | {($d_tokens / $d_loop) / $p_rate:.2f} |')"
  done
done
