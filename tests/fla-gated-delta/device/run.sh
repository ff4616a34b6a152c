#!/usr/bin/env bash
# One GPU-machine call for the fla-gated-delta plugin: the GPU test (unit checks, `qrun check
# linear_attention/fla-gated-delta` on the bf16 grid with a fresh seed, once more
# with `--set backward_operands=` the reverse pass that auto does not take, the qwen model packed ==
# one-by-one == padded and vs gdn-reference, 8 AdamW steps with each backend) and the layer
# benchmark at the 27B head config (SKIP_BENCH=1 leaves it out). Logs go to $OUT.
#   bash tests/fla-gated-delta/device/run.sh [dev-dir]
# dev-dir (default build-fla/dev) holds bin/fla_gdn_test, plugins/*.so and include/nlohmann, made
# on the dev machine by `bash tests/fla-gated-delta/device/run.sh --pack <build dir>`. If those
# binaries do not run here, the fallback CMake project beside this script builds them (-j16).
# QRUN_FLA_CHECK_SEED=<n> makes the GPU test replay that seed of `qrun check` (default: a fresh one).
# PLUGINS=<dir> picks another plugin folder (e.g. the plugin linked against another kernels
# commit); ALT_PLUGINS=<dir>: when the GPU test fails, run it again with those plugins (a kernels
# version known to be good) to tell a binding bug from a kernel bug.
set -u
if [[ "${1:-}" == "--pack" ]]; then
  B=${2:?build dir}; D=$B/dev
  rm -rf "$D"; mkdir -p "$D/bin" "$D/plugins" "$D/include"
  strip --strip-debug -o "$D/bin/fla_gdn_test" "$B/bin/fla_gdn_test"
  for p in fla-gated-delta reference-kernels qwen; do
    strip --strip-debug -o "$D/plugins/libqrun-$p.so" "$B/lib/qrun/plugins/libqrun-$p.so"
  done
  cp -r /usr/include/nlohmann "$D/include/"
  du -sh "$D"; exit 0
fi
D=${1:-build-fla/dev}
OUT=${OUT:-/tmp/fla-out}; mkdir -p "$OUT"
TORCH_DIR=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH=$TORCH_DIR/lib:$(dirname "$TORCH_DIR")/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch;print("torch", torch.__version__)' >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
BIN=$D/bin/fla_gdn_test; PLUG=${PLUGINS:-$D/plugins}; ALT=${ALT_PLUGINS:-}
if ! "$BIN" cpu "$PLUG" > "$OUT/cpu.log" 2>&1; then
  echo "carried binaries do not run here:"; tail -5 "$OUT/cpu.log"
  echo "fallback: building on this machine"
  t0=$(date +%s)
  { cmake -S tests/fla-gated-delta/device -B /tmp/fla-dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
      -DQRUN_JSON_INCLUDE="$(pwd)/$D/include" && cmake --build /tmp/fla-dev -j16; } > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  BIN=/tmp/fla-dev/fla_gdn_test; PLUG=/tmp/fla-dev/plugins; ALT=
  "$BIN" cpu "$PLUG" > "$OUT/cpu.log" 2>&1; echo "cpu rc=$?"
fi
tail -3 "$OUT/cpu.log"
t0=$(date +%s)
timeout ${GPU_TIMEOUT:-420} "$BIN" gpu "$PLUG" > "$OUT/gpu_test.log" 2>&1
rc=$?
echo "gpu test ($PLUG) rc=$rc in $(( $(date +%s) - t0 )) s"
summary() { grep -E "^\s+\[(ok|FAIL)\]|passed;|FAIL|error:|loss|step|worst|qrun check:|supported|Note|exception" "$1" | head -${2:-60}; }
summary "$OUT/gpu_test.log" 70
if [[ $rc != 0 && -n "$ALT" ]]; then
  t0=$(date +%s)
  timeout ${ALT_TIMEOUT:-200} "$BIN" gpu "$ALT" > "$OUT/gpu_test_alt.log" 2>&1
  echo "gpu test with ALT_PLUGINS ($ALT) rc=$? in $(( $(date +%s) - t0 )) s"
  summary "$OUT/gpu_test_alt.log" 40
fi
if [[ -z "${SKIP_BENCH:-}" ]]; then
  timeout ${BENCH_TIMEOUT:-120} "$BIN" bench "$PLUG" > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
  cat "$OUT/bench.log"
fi
