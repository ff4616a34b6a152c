#!/usr/bin/env bash
# The flagship step's shapes on one GPU through the real binary (run by bench/device.sh):
#   S0  the 27B dimensions cut to 4 layers (3 Gated DeltaNet + 1 attention), packed 8,192 tokens
#   S1  the 27B dimensions cut to 8 layers (6 + 2), packed 8,192 tokens (needs an H200: about
#       6 B parameters with bf16 weights and gradients and fp32 AdamW state)
#   S2  the full Qwen3.5-2B configuration, packed 16,384 tokens
# each with every fused backend (recipes/qwen27b_packed.yaml on one GPU: no sharding, bf16
# parameters without fp32 masters, one micro-batch a step), once without activation checkpointing
# and once with it on every layer ("+ac"), on the chat-like length mix of `qrun bench --synthetic
# chat`, with the step profile (--profile). SHAPES picks a subset (default: "S0 S0+ac S2 S2+ac";
# S1 and S1+ac when the GPU has more than 100 GB); a "+lt" suffix runs the shape with LibTorch's
# fused AdamW and _foreach_norm instead of the fused ops' adamw_step and square_sum (S0+lt: the
# optimizer kernels' A/B in one call). Usage: bench/flagship.sh OUT_DIR
set -uo pipefail
OUT=${1:?OUT_DIR}; mkdir -p "$OUT"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
qrun=${QRUN_BIN:-build/bin/qrun}
mem_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
mem_gib=$(( ${mem_gib:-0} / 1024 ))
default="S0 S0+ac S2 S2+ac"
(( mem_gib > 100 )) && default="S1 S1+ac S0 S2 S2+ac"
for shape in ${SHAPES:-$default}; do
  base=${shape%+lt}; base=${base%+ac}
  args=(--set sharding=none --set precision.master_weights=false --set train.grad_accum=1)
  [[ $shape == *+lt ]] && args+=(--set 'kernels.ops.exclude=[adamw_step, square_sum]')
  case $base in
    S0) args+=(--set model.num_layers=4) ;;
    S1) args+=(--set model.num_layers=8) ;;
    S2) args+=(--set model.preset=2b --set data.collator.tokens_per_batch=16384) ;;
    *) echo "unknown shape $shape"; continue ;;
  esac
  if [[ $shape == *+ac* ]]; then args+=(--set model.activation_checkpointing=full)
  else args+=(--set model.activation_checkpointing=none); fi
  t0=$(date +%s)
  timeout ${SHAPE_TIMEOUT:-200} "$qrun" bench recipes/qwen27b_packed.yaml "${args[@]}" \
    --set run.dir=/tmp/qrun-flagship-$shape --synthetic chat --steps ${STEPS:-8} --warmup 3 --profile \
    --label "$shape" --json "$OUT/flagship_$shape.json" > "$OUT/flagship_$shape.log" 2>&1
  echo "$shape: rc=$? in $(( $(date +%s) - t0 )) s"
  grep -E "real tokens/s|MFU|step time median|out of memory|error" "$OUT/flagship_$shape.log" | head -5
done
