#!/usr/bin/env bash
# Usage: run_bench_tests.sh QRUN_BIN SOURCE_DIR WORK_DIR PYTHON ZOO_PLUGIN_DIR
set -euo pipefail
qrun=$1 src=$2 work=$3 py=$4 zoo=$5
rm -rf "$work" && mkdir -p "$work"
cd "$src"
small=(--set run.dir="$work/run" --set data.collator.tokens_per_batch=512 --steps 3 --warmup 1)
check() { "$py" "$src/tests/bench/check_reports.py" "$@"; }
expect_rc() {  # expect_rc RC LOG CMD...
  local want=$1 log=$2; shift 2
  local rc=0; "$@" > "$log" 2>&1 || rc=$?
  if [[ $rc != "$want" ]]; then echo "exit status $rc (want $want): $*"; tail -n 40 "$log"; exit 1; fi
}
# 1. bench on the recipe's data, with --profile (no GPU: the profile is null with its reason)
expect_rc 0 "$work/bench.log" "$qrun" bench recipes/demo.yaml "${small[@]}" --profile --json "$work/bench.json"
check bench "$work/bench.json" "$work/bench.png"
# 2. bench on synthetic data (no data set read): the lengths come from the synthetic plugin
expect_rc 0 "$work/bench_syn.log" "$qrun" bench recipes/demo.yaml "${small[@]}" --synthetic chat --json "$work/syn.json"
check synthetic "$work/syn.json"
# 3. compare of the demo with itself: identical numerics, ratios near 1
expect_rc 0 "$work/self.log" "$qrun" compare recipes/demo.yaml "${small[@]}" --json "$work/self.json"
check same "$work/self.json" "$work/self.png"
# 4. against a backend that changes the numbers on purpose: reported, exit code 3
export QRUN_PLUGIN_PATH="$zoo"
expect_rc 3 "$work/perturbed.log" "$qrun" compare recipes/demo.yaml "${small[@]}" \
  --set-b 'kernels.ops={plugin: zoo-scaled-ops, swiglu_scale: 1.5}' --json "$work/perturbed.json"
grep -q "numerics: DIVERGED" "$work/perturbed.log" || { echo "no DIVERGED verdict:"; tail -20 "$work/perturbed.log"; exit 1; }
check diverged "$work/perturbed.json"
# ... and the same backend at scale 1 agrees with the reference within tolerance
expect_rc 0 "$work/unperturbed.log" "$qrun" compare recipes/demo.yaml "${small[@]}" \
  --set-b 'kernels.ops={plugin: zoo-scaled-ops, swiglu_scale: 1.0}' --json "$work/unperturbed.json"
# 5. bad input: exit code 2 with the option named
expect_rc 2 "$work/bad.log" "$qrun" bench recipes/demo.yaml --steps 0
grep -q -- "--steps must be an integer >= 1" "$work/bad.log"
expect_rc 2 "$work/bad2.log" "$qrun" bench recipes/demo.yaml --synthetic median900
grep -q "is not key=value" "$work/bad2.log"
echo "bench tests: passed"
