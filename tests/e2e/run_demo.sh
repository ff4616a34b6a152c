#!/usr/bin/env bash
# The embedded default recipe, shortened for CI: it trains, the loss falls, the checkpoint it
# saves loads in transformers and generates text.
# Usage: run_demo.sh QRUN_BIN SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
qrun=$1 src=$2 work=$3 py=$4
rm -rf "$work" && mkdir -p "$work"
cd "$src"
# The whole log goes to a file; on failure the exit status and the log's end are printed. (No
# pipes into head or grep -q under pipefail: their early exit can kill the writer with SIGPIPE,
# which ended this script without a word once in a CI run; measured here: 5 of 3,000
# `echo | head -n 1` pipelines failed so on a loaded machine.)
rc=0
"$qrun" recipes/demo.yaml --set run.dir="$work/run" --set train.max_steps=10 \
  --set checkpoint.every_steps=0 > "$work/train.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "qrun exited with status $rc; the end of its log:"; tail -n 40 "$work/train.log"; exit 1
fi
tail -n 5 "$work/train.log"
# First and last steps that had loss tokens.
losses=$(grep -o '"loss": [0-9.]*' "$work/run/metrics.jsonl" | cut -d' ' -f2) || {
  echo "no step losses in $work/run/metrics.jsonl:"; cat "$work/run/metrics.jsonl"; exit 1; }
first=$(sed -n 1p <<< "$losses")
last=$(sed -n '$p' <<< "$losses")
echo "loss: first step $first, last step $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || { echo "the loss did not fall"; exit 1; }
# Each later step must exit 0 (set -e) and print what it promises; the output goes to files and is
# checked there (no pipes, see above).
"$py" "$src/tests/e2e/generate_hf.py" "$work/run/checkpoints/step-00000010/model" \
  "$src/data/tokenizers/qwen3" > "$work/generate.log" 2>&1 || {
  echo "generate_hf.py exited with status $?:"; cat "$work/generate.log"; exit 1; }
cat "$work/generate.log"
grep -q '^generated: ' "$work/generate.log" || { echo "generate_hf.py printed no text"; exit 1; }
"$qrun" eval recipes/demo.yaml --set run.dir="$work/run" \
  --set model.path="$work/run/checkpoints/step-00000010/model" --set model.preset=none \
  --set data.collator.tokens_per_batch=2048 > "$work/eval.log" 2>&1 || {
  echo "qrun eval exited with status $?:"; tail -n 40 "$work/eval.log"; exit 1; }
cat "$work/eval.log"
grep -Eq 'perplexity[^0-9]*[0-9]' "$work/eval.log" || { echo "qrun eval reported no perplexity"; exit 1; }
echo "e2e: passed"
