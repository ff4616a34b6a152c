#!/usr/bin/env bash
# The seed's three stages through the real binary and the Hugging Face anchor, in one GPU call,
# on the same chat-like length mix (log-normal, median 900, sigma 0.75, capped at 8,192):
#   baseline  recipes/qwen27b_baseline.yaml  reference kernels, padded
#   fused     recipes/qwen27b_fused.yaml     every fused backend, padded
#   packed    recipes/qwen27b_packed.yaml    every fused backend, packed (one GPU: no sharding, no
#             activation checkpointing, as the other two)
#   anchor    ../shared/bench/hf_anchor.py   transformers, torch fallbacks, padded, gradient
#             checkpointing (its default); the GPU machine does not get ../shared: bench/device.sh
#             --pack copies it to build-dev/anchor/ (ANCHOR=path overrides)
# each cut to LAYERS (default 4: 3 Gated DeltaNet + 1 attention) of the 27B dimensions, and prints
# the rows of the performance page. Usage: bench/seed_stages.sh OUT_DIR
set -uo pipefail
OUT=${1:?OUT_DIR}; mkdir -p "$OUT"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
qrun=${QRUN_BIN:-build/bin/qrun}
L=${LAYERS:-4}
anchor=${ANCHOR:-build-dev/anchor/hf_anchor.py}
for stage in baseline fused packed; do
  t0=$(date +%s)
  # The packed recipe is the multi-GPU one (fsdp2, checkpointed layers, fp32 masters, 8 micro-batches
  # a step); on one GPU the stages differ only in kernels and packing.
  extra=()
  [[ $stage == packed ]] && extra=(--set sharding=none --set model.activation_checkpointing=none
                                   --set precision.master_weights=false --set train.grad_accum=1)
  timeout ${STAGE_TIMEOUT:-240} "$qrun" bench recipes/qwen27b_$stage.yaml --set model.num_layers=$L "${extra[@]}" \
    --set run.dir=/tmp/qrun-stage-$stage --synthetic chat --steps ${STEPS:-10} --warmup 3 \
    $([[ $stage == packed ]] && echo --profile) --label "$stage" --json "$OUT/stage_$stage.json" > "$OUT/stage_$stage.log" 2>&1
  echo "$stage: rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "real tokens/s|MFU|step time median|error" "$OUT/stage_$stage.log" | head -4
done
if [[ -f "$anchor" ]]; then
  t0=$(date +%s)
  timeout ${ANCHOR_TIMEOUT:-200} python3 "$anchor" --cfg 27b$L --kernels torch --collate padded \
    --seconds ${ANCHOR_SECONDS:-40} > "$OUT/anchor.json" 2> "$OUT/anchor.log"
  echo "anchor: rc=$? in $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/anchor.log"
else
  echo "anchor: $anchor not found (bench/device.sh --pack copies ../shared/bench/hf_anchor.py)"
fi
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(p):
    try:
        with open(os.path.join(out, p)) as f:
            return json.loads(f.read().strip().splitlines()[-1]) if p.endswith("anchor.json") else json.load(f)
    except Exception as e:
        return None
st = {s: load(f"stage_{s}.json") for s in ["baseline", "fused", "packed"]}
an = load("anchor.json")
dev = next((b["device"]["name"] for b in st.values() if b), "?")
commit = next((b["qrun"]["commit"] for b in st.values() if b), "?")
fpt = next((b["summary"]["train_flops_per_token"] for b in st.values() if b), None)
peak = next((b["device"]["peak_tflops"] for b in st.values() if b and b["device"]["peak_tflops"]), None)
f = lambda v, spec: "n/a" if v is None else format(v, spec)
print(f"device {dev}, commit {commit}")
print("| stage | real tokens/s | MFU | step (s) | kernels/step | CPU ops/step | GPU busy | peak GiB | launch to step 1 (s) | speed-up (seed) |")
print("|---|---|---|---|---|---|---|---|---|---|")
prev = None
seed = {"fused": "3.7x", "packed": "1.6x"}
for s, b in st.items():
    if not b:
        print(f"| {s} | failed | | | | | | | | |"); prev = None; continue
    m = b["summary"]
    tps = m["tokens_per_s"]
    up = f"{tps / prev:.2f}x ({seed[s]})" if prev and s in seed else "-"
    gib = None if m["peak_gpu_allocated_mib"] is None else m["peak_gpu_allocated_mib"] / 1024
    print(f"| qrun {s} | {f(tps, ',.0f')} | {f(m['mfu'], '.3f')} | {f(m['step_time_median_s'], '.3f')} | "
          f"{f(m['gpu_kernels_per_step'], '.0f')} | {f(m['cpu_ops_per_step'], '.0f')} | {f(m['gpu_busy'], '.3f')} | "
          f"{f(gib, '.1f')} | {f(m['first_step_s'], '.1f')} | {up} |")
    prev = tps
if an:
    mfu = an["tokens_per_s"] * fpt / (peak * 1e12) if fpt and peak else None
    print(f"| HF anchor (torch, padded, ckpt) | {an['tokens_per_s']:,.0f} | {f(mfu, '.3f')} | {an['step_s']:.3f} | "
          f"{an['kernels_per_step']} | {an['cpu_events_per_step']} (events) | n/a | {an['peak_gib']} | n/a | - |")
PY
