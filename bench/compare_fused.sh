#!/usr/bin/env bash
# The fused backends against the reference kernels through the real binary (run by
# bench/device.sh on the GPU machine): recipes/qwen27b_packed.yaml cut to 4 layers (3 Gated
# DeltaNet + 1 attention), once with every kernel the reference (A) and once fused (B), on one
# repeated packed batch of two synthetic samples, 20 AdamW steps each from the same weights:
# `qrun compare` prints both side by side, the per-step loss difference and the gradient-norm
# difference, and exits 3 when they diverge beyond its tolerances. Then the same fused recipe with
# sharding none (A) and fsdp2 at world size 1 through NCCL (B): the sharded path's numerics.
# Usage: bench/compare_fused.sh OUT_DIR   (QRUN_BIN: the qrun binary, default build/bin/qrun)
set -uo pipefail
OUT=${1:?OUT_DIR}; mkdir -p "$OUT"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
qrun=${QRUN_BIN:-build/bin/qrun}
"$qrun" compare recipes/qwen27b_packed.yaml --set model.num_layers=4 --set run.dir=/tmp/qrun-compare \
  --set sharding=none --set model.activation_checkpointing=none --set train.grad_accum=1 --set precision.master_weights=false \
  --set train.epochs=1000 --set optimizer.lr=3.0e-4 --set schedule.name=constant --set schedule.warmup_steps=0 \
  --synthetic lengths=fixed,median=4000,count=2 --steps 20 --warmup 0 \
  --set-a kernels.attention=sdpa --set-a kernels.linear_attention=gdn-reference \
  --set-a kernels.conv1d=conv-reference --set-a kernels.ops=reference \
  --json "$OUT/compare_fused.json"
rc=$?
"$qrun" compare recipes/qwen27b_packed.yaml --set model.num_layers=4 --set run.dir=/tmp/qrun-compare-fsdp \
  --set model.activation_checkpointing=none --set train.grad_accum=1 --set precision.master_weights=false \
  --set train.epochs=1000 --set optimizer.lr=3.0e-4 --set schedule.name=constant --set schedule.warmup_steps=0 \
  --synthetic lengths=fixed,median=4000,count=2 --steps 8 --warmup 0 \
  --set-a sharding=none --set-b sharding=fsdp2 --json "$OUT/compare_fsdp2.json"
rc2=$?
echo "compare fused vs reference rc=$rc, fsdp2 vs none rc=$rc2"
exit $(( rc != 0 ? rc : rc2 ))
