#!/usr/bin/env bash
# One device-machine call: build (sm_90), run the CPU reference test, the GPU conformance test,
# compute-sanitizer on the quick grid, and the benchmark. Logs go to $OUT (or /tmp/gdn-out).
# Usage (repo root): bash kernels/gated_delta/run_device.sh [steps...]
#   steps: build ref gpu quick san race prof phases bench ncu lines (default: build ref gpu san bench)
#   lines: warp-stall samples of one kernel (LINES_KERNEL, default bwd_chunk) by source line
#          (tools/ncu_lines.py; the CSV stays in $OUT for another look at home)
set -u
OUT=${OUT:-/tmp/gdn-out}; mkdir -p "$OUT"
B=/tmp/gdn-dev-build
steps=${*:-build ref gpu san bench}
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
if has build; then
  { cmake -S kernels/gated_delta -B $B -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release && \
    cmake --build $B -j16; } > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
  echo "build ok"
fi
if has ref; then timeout 120 $B/test_gated_delta_reference > "$OUT/ref.log" 2>&1; echo "ref rc=$?"; tail -1 "$OUT/ref.log"; fi
if has gpu; then timeout 300 $B/test_gated_delta > "$OUT/gpu_test.log" 2>&1; echo "gpu test rc=$?"; cat "$OUT/gpu_test.log"; fi
if has quick; then QRUN_GDN_QUICK=1 timeout 120 $B/test_gated_delta > "$OUT/gpu_quick.log" 2>&1; echo "gpu quick test rc=$?"; tail -3 "$OUT/gpu_quick.log"; fi
if has san; then
  QRUN_GDN_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_gated_delta > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -4 "$OUT/memcheck.log"
fi
if has race; then
  QRUN_GDN_QUICK=1 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $B/test_gated_delta > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"; tail -4 "$OUT/racecheck.log"
fi
if has prof; then QRUN_GDN_PROFILE=1 timeout 60 $B/bench 1 > "$OUT/prof.log" 2>&1; echo "prof rc=$?"; fi
if has phases; then  # per-phase cycle shares inside the kernels (-DQRUN_GDN_PHASES build, 1x8192)
  { cmake -S kernels/gated_delta -B $B-phases -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_FLAGS=-DQRUN_GDN_PHASES && cmake --build $B-phases -j16 --target bench_gated_delta; } > "$OUT/build-phases.log" 2>&1 \
    || { tail -30 "$OUT/build-phases.log"; exit 1; }
  QRUN_GDN_BENCH_CFG=0 timeout 60 $B-phases/bench 3 > "$OUT/phases.log" 2>&1; echo "phases rc=$?"; grep phases "$OUT/phases.log"
fi
if has ncu; then  # hardware counters of the sequential kernels and bwd_chunk (first launch of each)
  QRUN_GDN_BENCH_CFG=0 QRUN_GDN_BENCH_WARM=0 timeout 300 ncu --clock-control none \
    --kernel-name regex:"${NCU_KERNELS:-gdn_(state|dh|bwd_chunk)_kernel}" --launch-count ${NCU_COUNT:-4} \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --print-details all $B/bench 1 > "$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"
fi
if has lines; then
  k=${LINES_KERNEL:-bwd_chunk}
  QRUN_GDN_BENCH_CFG=0 QRUN_GDN_BENCH_WARM=0 timeout 300 ncu --clock-control none --set full --import-source yes \
    --kernel-name regex:"$k" --launch-count 1 -o "$OUT/lines" $B/bench 1 > "$OUT/lines_ncu.log" 2>&1
  echo "lines ncu rc=$?"
  ncu -i "$OUT/lines.ncu-rep" --page source --csv --print-source sass > "$OUT/lines_sass.csv" 2>> "$OUT/lines_ncu.log"
  rm -f "$OUT/lines.ncu-rep"
  python3 kernels/gated_delta/tools/ncu_lines.py "$OUT/lines_sass.csv" $B/bench --kernel "$k" --top 40 | tee "$OUT/lines.txt"
fi
if has bench; then timeout 120 $B/bench 20 > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; cat "$OUT/bench.log"; fi
