#!/usr/bin/env bash
# Usage: run_example.sh BUILD_DIR SOURCE_DIR WORK_DIR TORCH_PREFIX ZOO_PLUGIN [NVCC]
# With NVCC (qrun built with CUDA), also builds the CUDA kernel plugin of examples/custom-kernel
# against the installed package, checks that it got sm_90a code, and runs `qrun check` on it.
set -euo pipefail
build=$1 src=$2 work=$3 torch_prefix=$4 zoo=$5 nvcc=${6:-}
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
# The three commands of examples/hello-collator/README.md, with QRUN_PREFIX=$prefix.
cmake -S "$src/examples/hello-collator" -B "$work/hello" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$work/hello" >/dev/null
export QRUN_PLUGIN_PATH="$work/hello:$zoo"
# (Outputs are captured before grep -q: in a pipe, grep -q's early exit can kill the writer with
# SIGPIPE, which pipefail turns into a spurious failure.)
explain=$("$prefix/bin/qrun" plugins explain collator/hello-collator)
grep -q "samples_per_batch" <<< "$explain"
# The installed qrun finds the installed in-tree plugins and the example; run a recipe with it.
cd "$work"
out=$("$prefix/bin/qrun" "$src/tests/example/hello.yaml" 2>&1)
echo "$out"
grep -q "data: 10 samples -> 4 batches (hello-collator)" <<< "$out"

if [[ -n "$nvcc" ]]; then
  # examples/custom-kernel as its README builds it: a CUDA kernel plugin (an ops backend that
  # provides SwiGLU from its own kernel) against the installed package.
  cmake -S "$src/examples/custom-kernel" -B "$work/kernel" -G Ninja -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" > "$work/kernel-configure.log" 2>&1 || {
    cat "$work/kernel-configure.log"; exit 1; }
  cmake --build "$work/kernel" > "$work/kernel-build.log" 2>&1 || { cat "$work/kernel-build.log"; exit 1; }
  # The kernel's compile command (cuobjdump is not in every toolkit install; the command is what
  # qrun_add_plugin decides).
  cmd=$(ninja -C "$work/kernel" -t commands | grep "swiglu_kernel.cu")
  for flag in "code=\[sm_90a\]" "-std=c++20"; do
    grep -q -- "$flag" <<< "$cmd" || { echo "custom-kernel: '$flag' missing from: $cmd"; exit 1; }
  done
  if grep -q "arch=compute_90,code=sm_90" <<< "$cmd"; then
    echo "custom-kernel: LibTorch's plain sm_90 -gencode flag was not dropped: $cmd"; exit 1
  fi
  explain=$(QRUN_PLUGIN_PATH="$work/kernel" "$prefix/bin/qrun" plugins explain ops/example-swiglu)
  grep -q "operations it provides: swiglu" <<< "$explain" || { echo "$explain"; exit 1; }
  # qrun check judges its SwiGLU on a GPU; on a machine without one it refuses with its message.
  set +e
  check=$(QRUN_PLUGIN_PATH="$work/kernel" "$prefix/bin/qrun" check ops/example-swiglu 2>&1); rc=$?
  set -e
  echo "$check" | tail -3
  if [[ $rc == 0 ]]; then grep -q "left to the reference" <<< "$check"
  else [[ $rc == 2 ]] && grep -q "runs on CUDA only" <<< "$check"; fi
  echo "custom-kernel: built out of tree for sm_90a only, with C++20, loaded and checked"
fi
