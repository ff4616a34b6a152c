#!/usr/bin/env bash
# The GPU smoke test of the real host (run by bench/device.sh on the GPU machine):
# recipes/qwen27b_packed.yaml (the 27B preset, every fused backend, bf16, packed) on one GPU without
# sharding or checkpointed layers, cut to 4 layers (3 Gated DeltaNet + 1 attention), one
# micro-batch a step, on one repeated packed batch of two synthetic samples:
#   1. 10 steps through the trainer and AdamW on CUDA, with step-stats and torch-profiler in one
#      recipe: exit 0, finite losses that fall, a checkpoint at step 5;
#   2. --resume from that checkpoint to step 6: the same step-6 loss as the uninterrupted run;
#   3. `qrun bench --synthetic chat --profile` of the same recipe (the JSON goes to OUT_DIR;
#      SMOKE_BENCH=0 leaves it out, e.g. when bench/seed_stages.sh runs in the same call).
# Usage: bench/smoke_gpu.sh OUT_DIR   (QRUN_BIN: the qrun binary, default build/bin/qrun)
set -uo pipefail
OUT=${1:?OUT_DIR}; mkdir -p "$OUT"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
qrun=${QRUN_BIN:-build/bin/qrun}
W=${SMOKE_WORK:-/tmp/qrun-smoke}; rm -rf "$W"; mkdir -p "$W"
common=(recipes/qwen27b_packed.yaml --set model.num_layers=4 --set run.dir="$W/run" --set train.grad_accum=1
  --set sharding=none --set model.activation_checkpointing=none --set precision.master_weights=false
  --set 'data.dataset={plugin: synthetic, lengths: fixed, median: 4000, count: 2}'
  --set train.epochs=1000 --set optimizer.lr=3.0e-4 --set schedule.name=constant
  --set schedule.warmup_steps=0 --set train.log_every=1 --set train.tensorboard=false
  --set checkpoint.every_steps=5 --set checkpoint.keep=1 --set checkpoint.save_final=false)
fail=0
t0=$(date +%s)
"$qrun" "${common[@]}" --set train.max_steps=10 \
  --set 'profiler=[step-stats, {plugin: torch-profiler, wait: 7, warmup: 1, active: 1, print_table: false}]' \
  > "$OUT/smoke_train.log" 2>&1
rc=$?; echo "train: rc=$rc in $(( $(date +%s) - t0 )) s"; grep -E "model:|step 10/|done|error|step-stats over" "$OUT/smoke_train.log" | head
[[ $rc == 0 ]] || { tail -30 "$OUT/smoke_train.log"; fail=1; }
cp "$W/run/metrics.jsonl" "$OUT/smoke_metrics_run1.jsonl" 2>/dev/null
t0=$(date +%s)
"$qrun" "${common[@]}" --set train.max_steps=6 --set 'profiler=[]' --resume > "$OUT/smoke_resume.log" 2>&1
rc=$?; echo "resume: rc=$rc in $(( $(date +%s) - t0 )) s"; grep -E "resumed|step 6/|error" "$OUT/smoke_resume.log" | head
[[ $rc == 0 ]] || { tail -30 "$OUT/smoke_resume.log"; fail=1; }
python3 - "$W/run/metrics.jsonl" <<'PY' || fail=1
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and '"eval_loss"' not in l]
first = [r for r in rows[:10]]
assert [r["step"] for r in first] == list(range(1, 11)), [r["step"] for r in first]
losses = [r["loss"] for r in first]
print("losses run 1:", " ".join(f"{x:.4f}" for x in losses))
print("kernels, cpu ops, busy per step:", [(r.get("gpu_kernels"), r.get("cpu_ops"), r.get("gpu_busy")) for r in first][:3])
assert all(math.isfinite(x) for x in losses), "non-finite loss"
assert losses[-1] < losses[0], "the loss did not fall on the repeated batch"
resumed = rows[10:]
assert resumed and resumed[0]["step"] == 6, [r["step"] for r in resumed]
a, b = first[5]["loss"], resumed[0]["loss"]
print(f"step 6: uninterrupted {a:.6f}, resumed {b:.6f}, difference {abs(a-b):.3g}")
assert abs(a - b) <= 1e-3 * abs(a), "the resumed run's step 6 loss differs"
print("smoke: losses finite and falling, resume reproduces step 6")
PY
ls "$W/run/profiler" > /dev/null 2>&1 && echo "torch-profiler trace: $(ls "$W/run/profiler" | tr '\n' ' ')"
[[ "${SMOKE_BENCH:-1}" == 0 ]] && { rm -rf "$W"; exit $fail; }
t0=$(date +%s)
"$qrun" bench recipes/qwen27b_packed.yaml --set model.num_layers=4 --set run.dir="$W/bench" \
  --synthetic chat --steps ${BENCH_STEPS:-10} --warmup 3 --profile --label "27b x4 packed (fla-gated-delta)" \
  --json "$OUT/bench_smoke.json" > "$OUT/smoke_bench.log" 2>&1
rc=$?; echo "bench: rc=$rc in $(( $(date +%s) - t0 )) s"; grep -vE "^\[.*\] \[(info|warning)\]" "$OUT/smoke_bench.log" | head -60
[[ $rc == 0 ]] || { tail -30 "$OUT/smoke_bench.log"; fail=1; }
rm -rf "$W"
exit $fail
