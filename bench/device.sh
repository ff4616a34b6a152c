#!/usr/bin/env bash
# The real qrun on the GPU machine in one call. The GPU image has LibTorch (the torch wheel), but
# not the Debian libraries qrun links (yaml-cpp, Boost.Filesystem, spdlog, fmt, PCRE2, utf8proc):
# `--pack` gathers on the dev machine the stripped host, its plugins and those libraries into
# build-dev/host (about 10 MB; the device tool carries it), and the run mode uses the GPU
# image's own LibTorch and pyarrow (Arrow C++, for the chat-data plugin).
#
#   bash bench/device.sh --pack [BUILD_DIR]        on the dev machine (default BUILD_DIR: build)
#   bash bench/device.sh OUT_DIR [STEP ...]         on the GPU machine; logs go to OUT_DIR
# Steps (default: env smoke):
#   env     the GPU, driver, torch, pyarrow, matplotlib; `qrun --version` and `plugins list`
#   smoke   the GPU smoke test of the real host (bench/smoke_gpu.sh)
#   gdn     the gated delta kernels' conformance grid and one benchmark round, for every build in
#           build-dev/gdn/* (e.g. old/ and new/: the same call compares them)
#   checks  the fused backends (flash-varlen, causal-conv1d, fused ops) against their references
#           (`qrun check`, the GPU grids with the 27B shapes; CHECK_TARGETS picks others), the conv
#           kernels' own test and compute-sanitizer memcheck on the kernels written here (small
#           shapes; CHECK_SANITIZE=0 leaves the test and the sanitizer out, =ops runs only the
#           fused ops' memcheck; CHECK_ARGS adds arguments to the check, e.g. --dtype bf16)
#   kbench  `qrun check --bench` of each fused backend against its reference at the 27B shapes
#   compare the fused stage against the reference kernels on one repeated batch, 20 AdamW steps
#           (bench/compare_fused.sh)
#   stages  the seed's three stages and the Hugging Face anchor (bench/seed_stages.sh)
#   flagship the flagship step's shapes S0, S1, S2 with their step profiles (bench/flagship.sh)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == "--pack" ]]; then
  B=${2:-build}; D="$root/build-dev/host"
  rm -rf "$D"; mkdir -p "$D/bin" "$D/lib/qrun/plugins" "$D/deb"
  strip --strip-debug -o "$D/bin/qrun" "$B/bin/qrun"
  for p in "$B"/lib/qrun/plugins/*.so; do strip --strip-debug -o "$D/lib/qrun/plugins/$(basename "$p")" "$p"; done
  for t in test_causal_conv1d bench_causal_conv1d; do
    [[ -f "$B/bin/$t" ]] && strip --strip-debug -o "$D/bin/$t" "$B/bin/$t"
  done
  for f in "$D/bin/qrun" "$D"/lib/qrun/plugins/*.so; do ldd "$f"; done |
    awk '/=> \/(usr\/)?lib\/x86_64-linux-gnu\/lib(yaml-cpp|boost_|spdlog|fmt|pcre2|utf8proc)/ {print $3}' |
    sort -u | while read -r so; do cp -L "$so" "$D/deb/"; done
  # Arrow C++ as the chat-data plugin was linked with (pyarrow's soname), compressed (about 15 MB):
  # used on the GPU machine only when its own pyarrow has another soname.
  arrow=$(ldd "$D/lib/qrun/plugins/libqrun-chat-data.so" | awk '/libarrow\.so/ {print $3}')
  if [[ -n "$arrow" && ! -f "$root/build-dev/arrow.tar.xz" ]]; then
    tar -C "$(dirname "$arrow")" -cf - "$(basename "$arrow")" "$(basename "$arrow" | sed 's/arrow/parquet/')" |
      xz -T0 -6 > "$root/build-dev/arrow.tar.xz"
  fi
  # The Hugging Face anchor lives in ../shared, which does not travel to the GPU machine.
  if [[ -f "$root/../shared/bench/hf_anchor.py" ]]; then
    mkdir -p "$root/build-dev/anchor" && cp "$root/../shared/bench/hf_anchor.py" "$root/build-dev/anchor/"
  fi
  # The device tool carries at most 64 MiB: the host travels compressed (about a third).
  tar -C "$root/build-dev" -cf - host | xz -T0 -6 > "$root/build-dev/host.tar.xz"
  du -sh "$D" "$root/build-dev/host.tar.xz"; ls "$D/deb"; exit 0
fi
OUT=${1:?usage: bench/device.sh OUT_DIR [STEP ...]}; shift
steps=${*:-env smoke}
has() { [[ " $steps " == *" $1 "* ]]; }
# The device tool brings back at most 8 files: DEVICE_TAR=1 writes the logs elsewhere and folds
# them into OUT_DIR/device.tgz after every step (so a call cut short still brings back the rest).
final_out=$OUT
if [[ -n "${DEVICE_TAR:-}" ]]; then OUT=/tmp/qrun-device-out; rm -rf "$OUT"; fi
mkdir -p "$OUT" "$final_out"
fold() { [[ -n "${DEVICE_TAR:-}" ]] && tar -C "$OUT" -czf "$final_out/device.tgz" . ; true; }
H="$root/build-dev/host"
if [[ -f "$root/build-dev/host.tar.xz" && ! -x "$H/bin/qrun" ]]; then xz -dc "$root/build-dev/host.tar.xz" | tar -x -C "$root/build-dev"; fi
TORCH_DIR=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
ARROW_DIR=$(python3 -c 'import pyarrow;print(pyarrow.get_library_dirs()[0])' 2>/dev/null || true)
want=$(ls "$H/../arrow.tar.xz" >/dev/null 2>&1 && xz -dc "$H/../arrow.tar.xz" | tar -t | grep libarrow)
if [[ -n "$want" && ! -f "$ARROW_DIR/$want" ]]; then  # the image's pyarrow has another Arrow soname
  mkdir -p /tmp/qrun-arrow && xz -dc "$H/../arrow.tar.xz" | tar -x -C /tmp/qrun-arrow && ARROW_DIR=/tmp/qrun-arrow
fi
export LD_LIBRARY_PATH="$H/deb:$TORCH_DIR/lib:$(dirname "$TORCH_DIR")/nvidia/cu13/lib:${ARROW_DIR}:${LD_LIBRARY_PATH:-}"
export QRUN_BIN="$H/bin/qrun"
if has env; then
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)'
    python3 -c 'import pyarrow;print("pyarrow", pyarrow.__version__, pyarrow.get_library_dirs()[0])' 2>&1 | tail -1
    python3 -c 'import matplotlib;print("matplotlib", matplotlib.__version__)' 2>&1 | tail -1
    python3 -c 'import transformers;print("transformers", transformers.__version__)' 2>&1 | tail -1
    python3 -c 'import fla;print("fla", fla.__version__)' 2>&1 | tail -1
    ls "$ARROW_DIR" 2>/dev/null | grep -E "^lib(arrow|parquet)\.so" | tr '\n' ' '; echo
    "$QRUN_BIN" --version; "$QRUN_BIN" plugins list; } > "$OUT/env.txt" 2>&1
  echo "env rc=$?"; cat "$OUT/env.txt"
fi
fold
if has smoke; then bash "$root/bench/smoke_gpu.sh" "$OUT" > "$OUT/smoke.log" 2>&1; echo "smoke rc=$?"; tail -40 "$OUT/smoke.log"; fi
fold
if has checks; then
  ( timeout ${CHECK_TIMEOUT:-360} "$QRUN_BIN" check ${CHECK_TARGETS:-attention/flash-varlen conv1d/causal-conv1d ops/fused} --seed random ${CHECK_ARGS:-}
    echo "qrun check rc=$?"
    [[ "${CHECK_SANITIZE:-1}" == 0 ]] && exit 0
    if [[ "${CHECK_SANITIZE:-1}" != ops ]]; then
      timeout 300 "$H/bin/test_causal_conv1d"; echo "causal_conv1d kernel test rc=$?"
      QRUN_CC1D_SMALL=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$H/bin/test_causal_conv1d" | tail -4
      echo "causal_conv1d memcheck rc=${PIPESTATUS[0]}"
    fi
    QRUN_CHECK_SMALL=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$QRUN_BIN" check ops/fused --device cuda --dtype bf16 | tail -4
    echo "fused ops memcheck rc=${PIPESTATUS[0]}" ) > "$OUT/checks.log" 2>&1
  echo "checks done"; grep -E "passed;|FAIL|rc=|ERROR SUMMARY|all passed" "$OUT/checks.log"
fi
fold
if has kbench; then
  for b in attention/flash-varlen conv1d/causal-conv1d ops/fused; do timeout 150 "$QRUN_BIN" check --bench $b; done > "$OUT/kbench.log" 2>&1
  echo "kbench done"; cat "$OUT/kbench.log"
fi
fold
if has compare; then bash "$root/bench/compare_fused.sh" "$OUT" > "$OUT/compare.log" 2>&1; echo "compare rc=$?"; tail -40 "$OUT/compare.log"; fi
fold
if has stages; then bash "$root/bench/seed_stages.sh" "$OUT" > "$OUT/stages.log" 2>&1; echo "stages rc=$?"; tail -40 "$OUT/stages.log"; fi
fold
if has flagship; then bash "$root/bench/flagship.sh" "$OUT" > "$OUT/flagship.log" 2>&1; echo "flagship rc=$?"; cat "$OUT/flagship.log"; fi
fold
if has gdn; then
  for d in "$root"/build-dev/gdn/*/; do
    v=$(basename "$d")
    timeout ${GDN_TIMEOUT:-150} "$d/test_gated_delta" > "$OUT/gdn_$v.log" 2>&1; echo "gdn $v conformance rc=$?"
    grep -E "passed|FAIL" "$OUT/gdn_$v.log" | tail -3
    timeout ${GDN_BENCH_TIMEOUT:-60} "$d/bench" > "$OUT/gdn_bench_$v.log" 2>&1; echo "gdn $v bench rc=$?"; cat "$OUT/gdn_bench_$v.log"
    fold
  done
fi
