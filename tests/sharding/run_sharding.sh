#!/usr/bin/env bash
# Runs of several ranks on one CPU machine: the qwen `tiny` preset (reference kernels) on test-zoo
# data, ranks launched by `qrun --nproc-per-node N`, collectives over the test-store transport.
#   equal    ddp and fsdp2 on 2 and 4 ranks against one process on the same global batches
#            (grad_accum 4, clipping on): every step's loss within 1e-6 (relative) over 6 steps,
#            the parameters within 1e-6 (norm-wise) after 3 steps. Beyond that Adam's
#            normalisation of near-zero gradient elements magnifies the ranks' fp32 summation order
#            (measured: 2e-6 to 5e-6 after 6 steps), as it does for any data-parallel run.
#   resume   fsdp2 checkpoints written by 4 ranks resume on 2 and on 1 with the uninterrupted run's
#            losses; a ddp checkpoint of 2 ranks resumes on 1; a rank killed while writing its
#            shard leaves the previous checkpoint the newest, and the run resumes from it.
#   faults   a rank that dies mid-step: the launcher names it and stops the others within 30 s;
#            ranks started without the launcher (torchrun-style) fail with a message naming the
#            rank that did not join, within their dist_timeout_s.
#   launch   bad launches exit 2 with their message: WORLD_SIZE without RANK, a rendezvous port in
#            use, several ranks with sharding none, grad_accum not a multiple of the ranks, no
#            transport for CPU ranks (the test one not installed).
# Usage: run_sharding.sh CASE QRUN_BIN SOURCE_DIR TEST_PLUGIN_DIR WORK_DIR PYTHON
set -uo pipefail
case_=$1 qrun=$2 src=$3 plugins=$4 work=$5 py=${6:-python3}
rm -rf "$work" && mkdir -p "$work" && cd "$src"
export QRUN_PLUGIN_PATH=$plugins
# One OpenMP thread everywhere, as the launcher gives each rank: the CPU kernels' reduction order
# then depends on the sharding alone, which is what the comparisons measure.
export OMP_NUM_THREADS=1
fail=0
check() { if "$@"; then :; else echo "FAILED: $*"; fail=1; fi; }
common=(tests/trainer/tiny_qwen.yaml --set 'profiler=[]' --set train.grad_accum=4 --set train.clip_grad_norm=0.5
        --set data.dataset.count=200 --set train.tensorboard=false)
run() {  # run NAME NPROC [args...]: a run into $work/NAME; its output in $work/NAME.log
  local name=$1 n=$2; shift 2
  local t0=$(date +%s)
  "$qrun" --nproc-per-node "$n" "${common[@]}" --set run.dir="$work/$name" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "$name ($n ranks): exit $rc in $(( $(date +%s) - t0 )) s"
  return $rc
}
compare_losses() {  # compare_losses A B [from_step]: B's logged losses equal A's for B's steps
  "$py" - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "${3:-1}" <<'PY'
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
b = [r for r in map(json.loads, open(sys.argv[2])) if "loss" in r and r["step"] >= int(sys.argv[3])]
assert b, "no steps to compare"
worst = max(abs(a[r["step"]]["loss"] - r["loss"]) / abs(a[r["step"]]["loss"]) for r in b)
print(f"  losses of steps {[r['step'] for r in b]}: worst relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
}
compare_params() {  # compare_params A B: the final checkpoints' model/ tensors, norm-wise
  "$py" - "$work/$1" "$work/$2" <<'PY'
import glob, sys
import numpy as np
from safetensors.numpy import load_file
def load(d):
    out = {}
    for f in glob.glob(d + "/checkpoints/step-*/model/*.safetensors"): out.update(load_file(f))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a and a.keys() == b.keys(), (sorted(a)[:3], sorted(b)[:3])
num = sum(float(((a[k].astype(np.float64) - b[k].astype(np.float64)) ** 2).sum()) for k in a)
den = sum(float((a[k].astype(np.float64) ** 2).sum()) for k in a)
rel = (num / den) ** 0.5
print(f"  parameters ({len(a)} tensors): norm-wise relative difference {rel:.2e}")
sys.exit(0 if rel <= 1e-6 else 1)
PY
}
expect_fail() {  # expect_fail NAME CODE REGEX: the run's exit code and a line of its output
  local rc=$1; shift
  local code=$1 re=$2
  if [[ $rc != "$code" ]] || ! grep -Eq -- "$re" "$work/$NAME.log"; then
    echo "FAILED: $NAME: exit $rc (expected $code) or no line matching /$re/:"; tail -5 "$work/$NAME.log"; fail=1
  else
    echo "  $NAME: exit $rc, $(grep -Eo -- "$re" "$work/$NAME.log" | head -1)"
  fi
}

case $case_ in
equal)
  check run single 1 --set train.max_steps=6 --set checkpoint.every_steps=0 --set checkpoint.save_final=false
  check run single3 1 --set train.max_steps=3 --set checkpoint.every_steps=0
  for sh in ddp fsdp2; do
    for n in 2 4; do
      check run $sh$n $n --set sharding=$sh --set train.max_steps=6 --set checkpoint.every_steps=0 --set checkpoint.save_final=false
      check compare_losses single $sh$n
      check run ${sh}${n}_3 $n --set sharding=$sh --set train.max_steps=3 --set checkpoint.every_steps=0
      check compare_params single3 ${sh}${n}_3
    done
  done ;;
resume)
  ck=(--set train.max_steps=6 --set checkpoint.every_steps=3 --set checkpoint.keep=5)
  check run fsdp4 4 --set sharding=fsdp2 "${ck[@]}"
  check test -f "$work/fsdp4/checkpoints/step-00000003/shards/rank-3-of-4.pt"
  for n in 2 1; do
    mkdir -p "$work/fsdp_on$n" && cp -r "$work/fsdp4/checkpoints" "$work/fsdp_on$n/"
    rm -rf "$work/fsdp_on$n/checkpoints/step-00000006"
    check run fsdp_on$n $n --set sharding=fsdp2 "${ck[@]}" --resume
    check grep -q "resumed from .*step-00000003" "$work/fsdp_on$n.log"
    check compare_losses fsdp4 fsdp_on$n 4
  done
  check run ddp2 2 --set sharding=ddp "${ck[@]}"
  mkdir -p "$work/ddp_on1" && cp -r "$work/ddp2/checkpoints" "$work/ddp_on1/"
  rm -rf "$work/ddp_on1/checkpoints/step-00000006"
  check run ddp_on1 1 --set sharding=ddp "${ck[@]}" --resume
  check compare_losses ddp2 ddp_on1 4
  # Rank 1 dies while writing its shard of step 6: step 3 stays the newest checkpoint.
  NAME=killed_in_write
  QRUN_FAULT_EXIT=1:checkpoint:6 run $NAME 2 --set sharding=fsdp2 "${ck[@]}"
  expect_fail $? 17 "rank 1 of 2 failed first"
  check test -d "$work/$NAME/checkpoints/step-00000003"
  check test ! -e "$work/$NAME/checkpoints/step-00000006"
  check run $NAME.resumed 2 --set sharding=fsdp2 "${ck[@]}" --set run.dir="$work/$NAME" --resume
  check grep -q "resumed from .*step-00000003" "$work/$NAME.resumed.log" ;;
faults)
  NAME=dies_mid_step
  t0=$(date +%s)
  QRUN_FAULT_EXIT=2:step:3 run $NAME 4 --set sharding=ddp --set train.max_steps=6 --set checkpoint.every_steps=0
  expect_fail $? 17 "rank 2 of 4 failed first"
  check test $(( $(date +%s) - t0 )) -le 60
  # Without the launcher: two ranks started as torchrun would; rank 1 dies, rank 0 waits at most
  # dist_timeout_s (5 s) in the next collective, then stops naming rank 1.
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  NAME=torchrun_style
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      QRUN_FAULT_EXIT=1:step:2 "$qrun" "${common[@]}" --set run.dir="$work/$NAME" --set sharding=ddp \
      --set train.max_steps=4 --set run.dist_timeout_s=5 > "$work/$NAME.$r.log" 2>&1 &
  done
  t0=$(date +%s)
  wait %1; rc0=$?
  wait %2
  cp "$work/$NAME.0.log" "$work/$NAME.log"
  expect_fail $rc0 2 "rank 1 did not join collective"
  check test $(( $(date +%s) - t0 )) -le 60 ;;
launch)
  NAME=world_without_rank
  WORLD_SIZE=2 "$qrun" "${common[@]}" --set run.dir="$work/$NAME" > "$work/$NAME.log" 2>&1
  expect_fail $? 2 "WORLD_SIZE=2 is set but RANK is not"
  NAME=port_in_use
  "$py" -c 'import socket,time,sys; s=socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' > "$work/port" &
  holder=$!
  for _ in $(seq 50); do [[ -s "$work/port" ]] && break; sleep 0.1; done
  MASTER_PORT=$(cat "$work/port") run $NAME 2 --set sharding=ddp --set train.max_steps=2
  expect_fail $? 2 "rendezvous at 127.0.0.1:[0-9]+ failed"
  kill $holder
  NAME=ranks_without_sharding
  run $NAME 2 --set train.max_steps=2
  expect_fail $? 2 "this run has 2 ranks .* but the recipe names no sharding"
  NAME=grad_accum_not_multiple
  run $NAME 4 --set sharding=ddp --set train.grad_accum=6 --set train.max_steps=2
  expect_fail $? 2 "train.grad_accum 6 .* is not a multiple of the 4 ranks"
  NAME=no_cpu_transport
  QRUN_PLUGIN_PATH= run $NAME 2 --set sharding=ddp --set train.max_steps=2 --set 'data.tokenizer=zoo-bytes'
  expect_fail $? 2 "no installed transport connects cpu ranks|unknown tokenizer" ;;
esac
exit $fail
